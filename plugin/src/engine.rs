//! Engine mode: the plugin inside a CRIU that a container engine started (podman,
//! CRI-O, containerd through runc), where no gpucr process is there to serve it.
//!
//! * At init the plugin completes its settings from the settings file beside it
//!   ([`SETTINGS_FILE`]: the engines pass CRIU no environment of their caller's).
//! * At a dump's PAUSE_DEVICES it looks, cheaply, whether the tree holds a device gpucr
//!   handles. Only then does it start gpucr's helper (`GPUCR_BIN engine-helper dump`)
//!   over a socketpair it makes; a tree without one is dumped as without the plugin.
//!   A tree with one, one of whose tasks another process traces, is refused there
//!   with the tracer named, before anything is paused (CRIU would fail to seize the
//!   task afterwards, naming no tracer).
//! * At a restore's init, for an image that names gpucr in CRIU's inventory, it starts
//!   `engine-helper restore`, which verifies the image and checks the topology before
//!   CRIU restores anything, and hands the connector to CRIU as an inherit_fd, so that
//!   restored tasks reach the helper too.
//!
//! The helper gets CRIU's environment and the settings file's lines CRIU's environment
//! lacks. From there every hook runs as under `gpucr dump`/`gpucr restore` (the run
//! holds the connector and the backend the helper named, as it holds those gpucr hands
//! its own CRIU), plus the engine steps that replace CRIU's notifications to gpucr
//! ([`EngineMode::finish_copy`], [`EngineMode::finish`]).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpucr_abi::engine::{
    criu_gpu_plugins_in, Status, CONNECTOR_FD, ENV_BIN, ENV_ENGINE, SETTINGS_FILE, STATUS_FD,
};
use gpucr_abi::plugin_abi::stage;
use gpucr_abi::procfs::tree_pids;
use gpucr_abi::proto::engine_step::Step;
use gpucr_abi::proto::{request, EngineStep};
use gpucr_abi::sim::CONTEXTS_DIR;
use gpucr_abi::HELPER_INHERIT_KEY;
use gpucr_topology::nvidia::visible::VARIABLE as CUDA_VISIBLE_DEVICES;
use gpucr_topology::CheckName;
use nix::fcntl::OFlag;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use crate::criu;
use crate::helper::{Connector, HelperError};
use crate::settings::Settings;

/// Why a step of engine mode failed (each the plugin's own failure).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Traced(String),
    #[error("the image needs gpucr's helper, and {ENV_ENGINE}=0 keeps it out")]
    Disabled,
    #[error(
        "gpucr's helper is needed but no gpucr binary was found: set {ENV_BIN} in \
         {SETTINGS_FILE} beside the plugin (gpucr install-plugin writes it)"
    )]
    NoBinary,
    #[error("CRIU has no image directory")]
    NoImageDir,
    #[error("CRIU's image directory: {0}")]
    ImageDir(std::io::Error),
    #[error("cannot make the helper's connector: {0}")]
    Connector(nix::Error),
    #[error("cannot make the status pipe: {0}")]
    StatusPipe(nix::Error),
    #[error("cannot start {}: {source}", bin.display())]
    Start {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("gpucr's helper: {0}")]
    Helper(String),
    #[error("cannot copy the connector: {0}")]
    CopyConnector(std::io::Error),
    #[error("this CRIU does not let plugins add an inherit_fd")]
    NoInheritFd,
    #[error(transparent)]
    Step(#[from] HelperError),
}

impl EngineError {
    /// The errno CRIU gets for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            EngineError::Traced(_) => libc::EPERM,
            EngineError::Disabled | EngineError::NoImageDir | EngineError::NoInheritFd => {
                libc::ENOTSUP
            }
            EngineError::NoBinary => libc::ENOENT,
            EngineError::ImageDir(_) => libc::EBADF,
            EngineError::Connector(e) | EngineError::StatusPipe(e) => *e as i32,
            EngineError::Start { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            EngineError::Helper(_) => libc::EIO,
            EngineError::CopyConnector(_) => libc::EMFILE,
            EngineError::Step(e) => e.errno(),
        }
    }
}

/// The helper engine mode started: the connector to it and the backend it serves.
#[derive(Debug)]
pub struct Started {
    pub connector: Connector,
    pub backend: String,
}

/// Engine mode's part of one CRIU run.
#[derive(Debug, Default)]
pub struct EngineMode {
    /// The helper this plugin started: engine mode is on for this CRIU run.
    helper: Option<Connector>,
    /// CRIU's init said this run is a dump (not a pre-dump, whose images hold memory
    /// only and which never calls CHECKPOINT_DEVICES).
    dumping: bool,
    /// The dump's first PAUSE_DEVICES looked at the tree (once per dump).
    probed: bool,
    /// FINISH_COPY went through.
    copy_finished: bool,
    /// The CRIU calls DUMP_DEVICES_LATE (its hook ABI says so), where FINISH_COPY goes.
    late_hook: bool,
}

impl EngineMode {
    /// Engine mode for a run of `stage`, in a CRIU that calls DUMP_DEVICES_LATE or not.
    pub fn new(stage: i32, late_hook: bool) -> EngineMode {
        EngineMode {
            dumping: stage == stage::DUMP,
            late_hook,
            ..EngineMode::default()
        }
    }

    /// Whether this CRIU run is in engine mode.
    pub fn active(&self) -> bool {
        self.helper.is_some()
    }

    /// The dump's first PAUSE_DEVICES, in a CRIU gpucr did not start: when the tree
    /// holds a device gpucr handles, start the helper. Some when the plugin now serves
    /// the dump.
    pub fn start_dump(
        &mut self,
        root: i32,
        settings: &Settings,
    ) -> Result<Option<Started>, EngineError> {
        if !self.dumping || std::mem::replace(&mut self.probed, true) || settings.engine_off {
            return Ok(None);
        }
        let Some(backend) = probe(root, settings) else {
            return Ok(None);
        };
        // CRIU seizes the tasks after this hook: a task another process traces makes it
        // fail with "Unseizable non-zombie", which names no tracer, once the helper has
        // paused the tree. Refused here instead, before anything is touched, as `gpucr
        // dump` refuses it.
        if let Some(traced) = gpucr_abi::procfs::traced_task(root) {
            return Err(EngineError::Traced(traced.to_string()));
        }
        criu::info(&format!(
            "engine mode: pid {root}'s tree holds a {backend} device; starting gpucr's helper"
        ));
        self.start("dump", Some(root), settings)
    }

    /// A restore's init, for an image that needs gpucr, in a CRIU gpucr did not start.
    pub fn start_restore(&mut self, settings: &Settings) -> Result<Option<Started>, EngineError> {
        if settings.engine_off {
            return Err(EngineError::Disabled);
        }
        criu::info("engine mode: the image holds GPU state; starting gpucr's helper");
        self.start("restore", None, settings)
    }

    /// FINISH_COPY where a CRIU without DUMP_DEVICES_LATE last honours a failure (the
    /// first device file, or a CUDA tree's last CHECKPOINT_DEVICES). A CRIU with that
    /// hook gets it there instead: every task's memory is dumped by then, so the GPU
    /// copy has run beside CRIU's and the manifest's room is taken after CRIU's pages
    /// are written.
    pub fn finish_copy_early(&mut self) -> Result<(), EngineError> {
        if self.late_hook {
            return Ok(());
        }
        self.finish_copy()
    }

    /// FINISH_COPY: every task's device memory in the image and the manifest's room
    /// taken while CRIU can still fail the dump (a failure fails it; the tree runs on).
    pub fn finish_copy(&mut self) -> Result<(), EngineError> {
        let Some(helper) = &self.helper else {
            return Ok(());
        };
        if std::mem::replace(&mut self.copy_finished, true) {
            return Ok(());
        }
        step(helper, Step::FinishCopy, 0)?;
        criu::info("engine mode: GPU memory is in the image");
        Ok(())
    }

    /// The exit hook: write the manifest (dump) or close the image (restore). CRIU
    /// ignores the exit hook's result: a failure is logged, and a dump's image is then
    /// marked incomplete by the helper.
    pub fn finish(&self, stage: i32, ret: i32) {
        let Some(helper) = &self.helper else {
            return;
        };
        let which = if stage == stage::RESTORE {
            Step::RestoreDone
        } else {
            Step::DumpDone
        };
        match step(helper, which, ret) {
            Ok(()) => criu::info(&format!("engine mode: {which:?} done")),
            Err(e) => criu::error(&format!("engine mode: {which:?}: {e}")),
        }
    }

    /// Start `gpucr engine-helper STAGE`; on `ready` the helper serves the run.
    fn start(
        &mut self,
        stage: &str,
        root: Option<i32>,
        settings: &Settings,
    ) -> Result<Option<Started>, EngineError> {
        let started = start(stage, root, settings)?;
        if let Some(started) = &started {
            self.helper = Some(started.connector.clone());
        }
        Ok(started)
    }
}

/// The run's settings in engine mode: CRIU's environment completed by the settings file
/// beside the plugin, with a warning for each name CRIU's environment has that nothing
/// of gpucr's reads, each line of the file left out, and each of CRIU's own GPU plugins
/// beside this one. Called from init.
pub fn load_settings() -> Settings {
    // CRIU's own environment first: a misspelt name there would leave its default in
    // force without a word, as a bad line of the settings file would.
    for unknown in gpucr_abi::env::unknown_in_environment() {
        criu::warn(&format!("CRIU's environment: {unknown}"));
    }
    let Some(dir) = own_directory() else {
        return Settings::from_environment();
    };
    warn_about_criu_gpu_plugins(&dir);
    let path = dir.join(SETTINGS_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Settings::from_environment();
    };
    let (lines, left_out) = parse_settings(&text);
    // `gpucr install-plugin` writes only settings it checked: these come from a hand
    // edit, which would otherwise leave a default in force without a word.
    for why in left_out {
        criu::warn(&format!("{}: {why}", path.display()));
    }
    let any = !lines.is_empty();
    let settings = Settings::from_environment_and_file(lines);
    if any {
        criu::info(&format!("settings from {}", path.display()));
    }
    settings
}

/// CRIU's own GPU plugins beside this one: CRIU calls each hook on the first plugin
/// that answers it, so one of them may take a GPU process and gpucr never see it (the
/// image then holds no gpucr manifest), or the reverse. Said in CRIU's log, where a
/// user looks when a container's GPU state went elsewhere.
fn warn_about_criu_gpu_plugins(dir: &Path) {
    for other in criu_gpu_plugins_in(dir) {
        criu::warn(&format!(
            "CRIU also loads {} from the same directory: for a GPU process, whichever \
             plugin answers a hook first takes it (gpucr's plugin belongs in a directory \
             of its own, see docs/containers.md)",
            other.display()
        ));
    }
}

/// The settings in a settings file's text, last line of a name winning, and why each
/// other line (not blank, not a `#` comment) was left out, with its number.
fn parse_settings(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut settings: Vec<(String, String)> = Vec::new();
    let mut left_out = Vec::new();
    for (number, line) in (1..).zip(text.lines().map(str::trim)) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            left_out.push(format!(
                "line {number}: {line:?} is not NAME=VALUE; left out"
            ));
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if !is_setting(name) {
            left_out.push(format!(
                "line {number}: {name} is not a setting gpucr reads (the GPUCR_* \
                 variables `gpucr install-plugin --help` lists, the topology checks' \
                 KFD_*_CHECK switches and {CUDA_VISIBLE_DEVICES}); left out"
            ));
            continue;
        }
        if value.is_empty() {
            left_out.push(format!(
                "line {number}: {name} has no value; left out (its default applies)"
            ));
            continue;
        }
        settings.retain(|(n, _)| n != name);
        settings.push((name.to_owned(), value.to_owned()));
    }
    (settings, left_out)
}

/// The names a settings file may set: the `GPUCR_*` variables engine mode reads,
/// CUDA's device list, and the topology checks' `KFD_*_CHECK` switches.
fn is_setting(name: &str) -> bool {
    gpucr_abi::env::engine_reads(name)
        || name == CUDA_VISIBLE_DEVICES
        || CheckName::env_vars().any(|variable| variable == name)
}

/// The directory the plugin was loaded from.
fn own_directory() -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // Any address inside the library: this function's own.
    let addr = own_directory as fn() -> Option<PathBuf> as *const libc::c_void;
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is filled.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(Path::to_path_buf)
}

/// Which backend's device the tree rooted at `root` holds, looked up cheaply (its
/// processes' open files and mappings), without loading any driver.
fn probe(root: i32, settings: &Settings) -> Option<&'static str> {
    let tree = tree_pids(root);
    let sim_contexts = settings.sim_root.as_ref().map(|r| r.join(CONTEXTS_DIR));
    if let Some(contexts) = &sim_contexts {
        if tree.iter().any(|&p| maps(p, |f| f.starts_with(contexts))) {
            return Some("sim");
        }
    }
    if tree
        .iter()
        .any(|&p| holds_fd(p, |t| t == Path::new("/dev/kfd")))
    {
        return Some("amdgpu");
    }
    let nvidia = |t: &Path| {
        t.to_str()
            .is_some_and(|s| s.starts_with("/dev/nvidia") && !s.starts_with("/dev/nvidia-caps"))
    };
    // A driver library named by GPUCR_CUDA_LIBRARY (a driver installed elsewhere, or the
    // fake of the tests, which opens no device file) is recognised by its mapping.
    let library = settings.cuda_library.as_ref();
    let maps_library = |p: i32| library.is_some_and(|l| maps(p, |f| f == l));
    if tree.iter().any(|&p| holds_fd(p, nvidia) || maps_library(p)) {
        return Some("cuda");
    }
    None
}

/// Whether `pid` maps a file whose path `matches`.
fn maps(pid: i32, matches: impl Fn(&Path) -> bool) -> bool {
    gpucr_abi::procfs::mapped_files(pid).is_ok_and(|files| files.iter().any(|f| matches(f)))
}

/// Whether `pid` has a file open whose path `matches`.
fn holds_fd(pid: i32, matches: impl Fn(&Path) -> bool) -> bool {
    gpucr_abi::procfs::open_files(pid).any(|(_, target)| matches(&target))
}

/// The gpucr binary to run as the helper: `GPUCR_BIN`, else the usual places.
fn gpucr_bin(settings: &Settings) -> Result<PathBuf, EngineError> {
    if let Some(bin) = &settings.bin {
        return Ok(bin.clone());
    }
    ["/usr/local/bin/gpucr", "/usr/bin/gpucr"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or(EngineError::NoBinary)
}

/// Start `gpucr engine-helper STAGE` and wait for its status line: on `ready` the
/// helper that serves the run, on `none` nothing.
fn start(
    stage: &str,
    root: Option<i32>,
    settings: &Settings,
) -> Result<Option<Started>, EngineError> {
    let bin = gpucr_bin(settings)?;
    let image_fd = criu::image_dir_fd().ok_or(EngineError::NoImageDir)?;
    let images_dir =
        std::fs::read_link(format!("/proc/self/fd/{image_fd}")).map_err(EngineError::ImageDir)?;
    let (mine, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(EngineError::Connector)?;
    let (status_read, status_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(EngineError::StatusPipe)?;
    let mut command = Command::new(&bin);
    command
        .arg("engine-helper")
        .arg(stage)
        .arg("--images-dir")
        .arg(&images_dir)
        .arg("--criu-pid")
        .arg(std::process::id().to_string());
    if let Some(root) = root {
        command.arg("--pid").arg(root.to_string());
    }
    // The settings file's lines CRIU's environment lacks, for the helper.
    command.envs(settings.from_file.iter().map(|(name, value)| (name, value)));
    let stderr = match &settings.engine_log {
        Some(log) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null()),
        None => Stdio::null(),
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let (connector, status) = (theirs.as_raw_fd(), status_write.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (fcntl, dup2, close_range).
    unsafe {
        command.pre_exec(move || place_fds(connector, status));
    }
    let mut child = command
        .spawn()
        .map_err(|source| EngineError::Start { bin, source })?;
    drop(theirs);
    drop(status_write);
    // The helper detaches at once: this reaps the process CRIU would otherwise see.
    let _ = child.wait();
    let mut said = String::new();
    let _ = File::from(status_read).read_to_string(&mut said);
    match Status::parse(&said) {
        Status::Ready(backend) => {
            let connector = served_connector(mine, stage == "restore")?;
            criu::info(&format!("engine mode: helper ready ({backend})"));
            Ok(Some(Started { connector, backend }))
        }
        Status::None => {
            criu::info("engine mode: the helper found no device of gpucr's; staying out");
            Ok(None)
        }
        Status::Error(message) => Err(EngineError::Helper(message)),
    }
}

/// In the child, before exec: the connector at fd 3, the status pipe at fd 4, every
/// other fd of CRIU's closed on exec.
fn place_fds(connector: i32, status: i32) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // Above both targets first, so that neither dup2 overwrites the other's source.
    // SAFETY: plain fd syscalls on fds this process owns.
    let c = check(unsafe { libc::fcntl(connector, libc::F_DUPFD_CLOEXEC, 10) })?;
    // SAFETY: as above.
    let s = check(unsafe { libc::fcntl(status, libc::F_DUPFD_CLOEXEC, 10) })?;
    // SAFETY: as above; dup2 leaves the new fd without FD_CLOEXEC.
    check(unsafe { libc::dup2(c, CONNECTOR_FD) })?;
    // SAFETY: as above.
    check(unsafe { libc::dup2(s, STATUS_FD) })?;
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: marks fds 5.. close-on-exec; std's own exec-error pipe stays usable.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            (STATUS_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        ) as libc::c_int
    })?;
    Ok(())
}

/// The connector the hooks use, as gpucr's is for its own CRIU: at restore also in
/// CRIU's inherit_fds, where restored tasks find it.
fn served_connector(connector: OwnedFd, restore: bool) -> Result<Connector, EngineError> {
    if restore {
        let copy = connector.try_clone().map_err(EngineError::CopyConnector)?;
        if !criu::add_inherit_fd(copy, HELPER_INHERIT_KEY) {
            return Err(EngineError::NoInheritFd);
        }
    }
    // Kept open for the rest of the run (close-on-exec).
    Ok(Connector::owned(connector))
}

fn step(helper: &Connector, step: Step, ret: i32) -> Result<(), EngineError> {
    let kind = request::Kind::EngineStep(EngineStep {
        step: step as i32,
        ret,
    });
    helper.call(kind, &[])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_lines_last_wins_and_only_gpucr_names() {
        let text = "# comment\nGPUCR_BIN=/a\n\nPATH=/evil\nKFD_NUMA_CHECK=0\nGPUCR_SIM_ROOT = /sim \nGPUCR_BIN=/b\nCUDA_VISIBLE_DEVICES=1\nnot a line\nGPUCR_FAKE_CUDA_DIR=/f\n";
        let (settings, left_out) = parse_settings(text);
        assert_eq!(
            settings,
            vec![
                ("KFD_NUMA_CHECK".to_string(), "0".to_string()),
                ("GPUCR_SIM_ROOT".to_string(), "/sim".to_string()),
                ("GPUCR_BIN".to_string(), "/b".to_string()),
                ("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()),
                ("GPUCR_FAKE_CUDA_DIR".to_string(), "/f".to_string()),
            ]
        );
        assert_eq!(left_out.len(), 2, "{left_out:?}");
        assert!(left_out[0].starts_with("line 4: PATH is not a setting gpucr reads"));
        assert_eq!(
            left_out[1],
            "line 9: \"not a line\" is not NAME=VALUE; left out"
        );
    }

    /// A hand-edited settings file: a misspelt or unknown name, and a name without a
    /// value, are left out with a warning instead of taking effect or passing silently.
    #[test]
    fn misspelt_unknown_and_empty_settings_are_left_out_and_said() {
        let text = "GPUCR_COMPRES=none\nKFD_NUMA_CHEK=0\nKFD_MAX_BUFFER_SIZE=1\nGPUCR_JOBS=\nGPUCR_HELPER_FD=9\nGPUCR_JOBS=2\n";
        let (settings, left_out) = parse_settings(text);
        assert_eq!(settings, vec![("GPUCR_JOBS".to_string(), "2".to_string())]);
        let said: Vec<&str> = left_out
            .iter()
            .map(|w| w.split(" is not").next().unwrap())
            .collect();
        assert_eq!(
            said,
            [
                "line 1: GPUCR_COMPRES",
                "line 2: KFD_NUMA_CHEK",
                "line 3: KFD_MAX_BUFFER_SIZE",
                "line 4: GPUCR_JOBS has no value; left out (its default applies)",
                "line 5: GPUCR_HELPER_FD",
            ]
        );
    }

    #[test]
    fn a_tree_without_devices_is_not_probed_as_a_gpu_tree() {
        let me = std::process::id() as i32;
        assert!(tree_pids(me).contains(&me));
        assert_eq!(probe(me, &Settings::default()), None);
    }

    #[test]
    fn the_plugin_knows_its_directory() {
        // In tests the "plugin" is the test binary, loaded from target/.
        assert!(own_directory().is_some_and(|d| d.is_dir()));
    }
}
