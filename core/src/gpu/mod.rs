//! GPU backends: what a task's device state is, how to find and copy its buffers, and
//! how to recreate it on restore.
//!
//! One trait, one implementation per device family. The plugin, the helper protocol,
//! the transfer engine and the image format are shared. This module has the `sim`
//! backend, which runs every part except a kernel driver for real (docs/architecture.md §4).
//!
//! Dependencies run one way: the helper (`crate::helper`) uses this module (it calls
//! backends through [`Backend`], collects their [`TaskDevice`]s, and fills in the
//! [`GpuManifest`] with its [`TaskTiming`]s), and this module imports nothing from the
//! helper. It describes device state and how to copy it; the plugin protocol, the
//! session directory and the lifetime of one dump or restore (`helper::GpuDump`,
//! `helper::GpuRestore`) belong to the helper. The manifest types live here, not with
//! the helper that fills them in, because the image's manifest, restore and inspect
//! read them where no helper runs.

pub mod amdgpu;
pub mod cuda;
pub mod devices_open;
pub mod give_back;
mod local_topology;
pub mod manifest;
pub mod sim;

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use gpucr_abi::proto::{BufferSpec, DeviceSpec};

pub use local_topology::LocalTopology;
pub use manifest::{GpuManifest, TaskTiming};

use crate::cancel::Cancel;
use crate::transfer::{BufferSink, BufferSource};

/// Errors of the GPU backends.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: malformed device state: {detail}")]
    Malformed { path: PathBuf, detail: String },
    #[error("pid {pid}: {detail}")]
    Task { pid: i32, detail: String },
    /// A process whose driver must lock it through a thread of its own (CUDA's restore
    /// thread) is stopped by a signal, so that thread cannot run.
    #[error(
        "pid {pid} is stopped (SIGSTOP or job control): its GPU driver locks it through \
         a thread of the process's own, which cannot run while it is stopped; continue it \
         (kill -CONT {pid}) and dump again"
    )]
    Stopped { pid: i32 },
    /// The driver itself failed (its initialisation answered an error).
    #[error("the GPU driver failed: {detail}")]
    Driver { detail: String },
    #[error("{variable}={value:?}: {detail}")]
    Config {
        variable: &'static str,
        value: String,
        detail: String,
    },
    /// The step's token was cancelled (its request given up, the helper stopped): the
    /// backend made no further driver call, and undid what a call that completed late
    /// had changed.
    #[error("cancelled: {0}")]
    Cancelled(#[from] crate::cancel::Cancelled),
}

impl crate::exit_code::ExitCode for GpuError {
    /// A task's device or driver failing is [`crate::exit_code::DEVICE_FAILED`], a
    /// stopped process the target's ([`crate::exit_code::TARGET`]); the rest (files,
    /// settings, device state that does not parse) is the caller's to judge,
    /// [`crate::exit_code::FAILURE`] here.
    fn exit_code(&self) -> u8 {
        match self {
            GpuError::Stopped { .. } => crate::exit_code::TARGET,
            GpuError::Task { .. } | GpuError::Driver { .. } => crate::exit_code::DEVICE_FAILED,
            GpuError::Io { .. }
            | GpuError::Malformed { .. }
            | GpuError::Config { .. }
            | GpuError::Cancelled(_) => crate::exit_code::FAILURE,
        }
    }
}

impl GpuError {
    /// [`GpuError::Stopped`] when `pid` is stopped by a signal: for the step before the
    /// freeze of a driver that locks a process through a thread of its own.
    pub(crate) fn refuse_stopped(pid: i32) -> Result<(), GpuError> {
        if gpucr_abi::procfs::is_stopped(pid) {
            return Err(GpuError::Stopped { pid });
        }
        Ok(())
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> GpuError {
        let path = path.into();
        move |source| GpuError::Io { path, source }
    }
}

/// A GPU as the backends name it: a KFD `gpu_id` (AMD, the simulator) or an NVIDIA
/// UUID. Written `kfd:<gpu_id>` / `nvidia:<UUID>` in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuRef {
    Kfd(u32),
    Nvidia(String),
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRef::Kfd(id) => write!(f, "kfd:{id}"),
            GpuRef::Nvidia(uuid) => write!(f, "nvidia:{uuid}"),
        }
    }
}

impl std::str::FromStr for GpuRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("kfd", id)) => id
                .parse()
                .map(GpuRef::Kfd)
                .map_err(|_| format!("{id:?} is not a KFD gpu_id")),
            Some(("nvidia", uuid)) if !uuid.is_empty() => Ok(GpuRef::Nvidia(uuid.to_owned())),
            _ => Err("expected kfd:<gpu_id> or nvidia:<UUID>".into()),
        }
    }
}

impl GpuRef {
    /// The topology's id for this GPU, if `id` is it.
    pub fn matches(&self, id: &gpucr_topology::GpuId) -> bool {
        match (self, id) {
            (GpuRef::Kfd(a), gpucr_topology::GpuId::Kfd { gpu_id, .. }) => a == gpu_id,
            (GpuRef::Nvidia(a), gpucr_topology::GpuId::Nvidia { uuid }) => a == uuid,
            _ => false,
        }
    }
}

/// What a task's device file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRole {
    /// The node the device state hangs on (/dev/kfd, /dev/nvidiactl, the simulator's).
    Device,
    /// A DRM render node (/dev/dri/renderD*).
    Render,
    /// A per-GPU node (/dev/nvidiaN).
    Gpu,
}

impl DeviceRole {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceRole::Device => "device",
            DeviceRole::Render => "render",
            DeviceRole::Gpu => "gpu",
        }
    }

    /// The role a manifest names; an unknown name is read as the main device node.
    pub fn parse(text: &str) -> DeviceRole {
        match text {
            "render" => DeviceRole::Render,
            "gpu" => DeviceRole::Gpu,
            _ => DeviceRole::Device,
        }
    }
}

/// One of a task's device files, by CRIU file id (DUMP_EXT_FILE / RESTORE_EXT_FILE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFile {
    pub id: u32,
    pub role: DeviceRole,
    /// The path the task had open (for people: the backend's state says what to open).
    pub path: String,
}

/// One timed backend operation of a task (a driver call, a state change, a copy).
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub name: String,
    /// Milliseconds since the helper started.
    pub start_ms: f64,
    pub duration_ms: f64,
    /// "ok", or the error.
    pub result: String,
}

/// The device state of one checkpointed task: the backend's private state (opaque to
/// everything but the backend, versioned by it), the GPUs and device files it uses, and
/// the table of its buffers. Stored in the manifest as `image::gpu::TaskRecord`.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskDevice {
    /// The task's pid in the checkpointed tree's own PID namespace (stable on restore).
    pub ns_pid: u32,
    /// The task's pid on the dumping host.
    pub host_pid: i32,
    /// The GPUs the task uses, as the backend names them.
    pub gpus: Vec<GpuRef>,
    /// The task's device files, with their roles.
    pub device_files: Vec<DeviceFile>,
    /// The encoding of `state`: the backend's name and version ("sim/1").
    pub state_format: String,
    /// The backend's private state of the task (written to `gpu/state/`).
    pub state: Vec<u8>,
    /// The device buffers, in `BufferKey::buffer` order.
    pub buffers: Vec<BufferInfo>,
    /// What the backend did for the task, in order.
    pub operations: Vec<Operation>,
}

/// One device buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferInfo {
    /// Where the buffer lives (for the simulator, its file).
    pub path: String,
    pub size: u64,
    /// The GPU (KFD gpu_id, or copy queue) holding it.
    pub gpu_id: u32,
    /// "vram", "gtt", ...
    pub kind: String,
    /// Permission bits of the buffer's file (the simulator's; 0 for real devices).
    pub mode: u32,
}

impl TaskDevice {
    /// Whether CRIU file `id` is one of this task's device files.
    pub fn has_file(&self, id: u32) -> bool {
        self.device_files.iter().any(|f| f.id == id)
    }
}

/// How messages name a task's state: "task <ns_pid>'s device state".
pub fn state_name(task: &TaskDevice) -> String {
    format!("task {}'s device state", task.ns_pid)
}

/// Decode `task`'s state blob, JSON of encoding `format`, which the backend `reader`
/// ("simulator", "cuda backend") reads; another encoding or undecodable bytes are a
/// malformed state naming the task.
pub(crate) fn decode_state<T: serde::de::DeserializeOwned>(
    task: &TaskDevice,
    format: &str,
    reader: &str,
) -> Result<T, GpuError> {
    let malformed = |detail: String| GpuError::Malformed {
        path: PathBuf::from(state_name(task)),
        detail,
    };
    if task.state_format != format {
        return Err(malformed(format!(
            "state format {:?}, this gpucr's {reader} reads {format:?}",
            task.state_format
        )));
    }
    serde_json::from_slice(&task.state).map_err(|e| malformed(e.to_string()))
}

/// Where device nodes live: the only place a restore spec's `device_path` may name.
pub const DEVICE_DIR: &str = "/dev";

/// A path of a restore spec that would reach outside where its backend keeps state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {path:?} is not beneath {root}")]
pub struct OutsideRoot {
    /// The field of the task's device state, e.g. `buffers[3].path`.
    pub field: String,
    pub path: String,
    pub root: String,
}

/// True when `path` is absolute, lies strictly beneath `root` and has only normal
/// components (no `.`, no `..`): a lexical check, done before anything is touched; the
/// plugin also opens every path with openat2(RESOLVE_BENEATH) from the root.
pub fn is_beneath(path: &std::path::Path, root: &std::path::Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path.strip_prefix(root).is_ok_and(|rel| {
            !rel.as_os_str().is_empty()
                && rel.components().all(|c| matches!(c, Component::Normal(_)))
        })
}

/// Check every path a restore spec would create or open: state directories, files and
/// buffers beneath `spec.root` (empty: the backend keeps no files, so there may be
/// none), the device node beneath `/dev`.
pub fn check_confined(spec: &DeviceSpec) -> Result<(), OutsideRoot> {
    let root = std::path::Path::new(&spec.root);
    let outside = |field: String, path: &str, root: &std::path::Path| OutsideRoot {
        field,
        path: path.to_owned(),
        root: if root.as_os_str().is_empty() {
            "any root (this backend keeps no files)".to_owned()
        } else {
            root.display().to_string()
        },
    };
    let paths = spec
        .directories
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("directories[{i}]"), d))
        .chain(
            spec.files
                .iter()
                .enumerate()
                .map(|(i, f)| (format!("files[{i}].path"), &f.path)),
        )
        .chain(
            spec.buffers
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("buffers[{i}].path"), &b.path)),
        );
    for (field, path) in paths {
        if spec.root.is_empty() || !is_beneath(std::path::Path::new(path), root) {
            return Err(outside(field, path, root));
        }
    }
    let dev = std::path::Path::new(DEVICE_DIR);
    // An empty device path: the task has no device node to reopen (its driver keeps
    // the device state, as CUDA's does).
    let no_device = spec.device_path.is_empty() && spec.device_flags == 0;
    if !no_device && !is_beneath(std::path::Path::new(&spec.device_path), dev) {
        return Err(outside("device_path".into(), &spec.device_path, dev));
    }
    Ok(())
}

/// The buffer part of a restore spec: every buffer of `task`, at its size and mode.
pub fn buffer_specs(task: &TaskDevice) -> Vec<BufferSpec> {
    task.buffers
        .iter()
        .map(|b| BufferSpec {
            path: b.path.clone(),
            size: b.size,
            mode: b.mode,
        })
        .collect()
}

/// A task's device state and a copy-engine source for each of its buffers.
pub struct Checkpointed {
    pub device: TaskDevice,
    pub sources: Vec<Box<dyn BufferSource>>,
}

/// One GPU device family.
///
/// Every method that may call the driver or wait for a device takes the cancellation
/// token of the work it is part of (the plugin request the helper answers): the
/// backend checks it before each driver call or step and returns
/// [`GpuError::Cancelled`] once it is cancelled, a wait it makes (for a simulated
/// driver, a copy engine's fence) ends soon after the cancellation, and a driver call
/// that cannot be interrupted but completed after the cancellation is undone where it
/// changed the process (a lock, a checkpoint), so that a request given up leaves
/// nothing changed. A give-back ([`Backend::after_dump`], [`Backend::release_held`]
/// without `copied`) is not begun once cancelled, but once begun runs whole: stopped
/// half-way it would leave the job locked with nothing left to unlock it.
pub trait Backend: Send + Sync {
    /// "sim", "amdgpu", "cuda".
    fn name(&self) -> &'static str;

    /// Whether `pid` holds a device of this backend (before anything is frozen).
    fn holds_device(&self, pid: i32) -> bool;

    /// The GPUs of `local` (this machine's topology) that the running tasks `pids`
    /// use, told before anything is frozen (a migration offers the destination only
    /// those; the restore checks the image's own GPUs again). None when the backend
    /// cannot tell: then the whole machine is offered. Default: None.
    fn gpus_in_use(&self, _pids: &[i32], _local: &gpucr_topology::Topology) -> Option<Vec<GpuRef>> {
        None
    }

    /// PAUSE_DEVICES: the gpucr half's step before `pid` is frozen (a driver lock,
    /// moving memory out of the device, ...), taken for every task of the tree at the
    /// root's PAUSE_DEVICES, while they all still run; a task that CRIU meets later
    /// (forked meanwhile) gets it at its own PAUSE_DEVICES.
    fn pre_freeze(&self, _pid: i32, _cancel: &Cancel) -> Result<(), GpuError> {
        Ok(())
    }

    /// Whether the helper checkpoints the whole tree at once: [`Backend::checkpoint_ahead`]
    /// for every frozen task, in parallel, at the first CHECKPOINT_DEVICES, and the whole
    /// tree brought back at the first RESUME_DEVICES_LATE. Default: no, one task at a
    /// time as CRIU calls the hooks. ([`Backend::pre_freeze`] runs for the whole tree at
    /// the first PAUSE_DEVICES whatever the backend, while every task still runs.)
    fn whole_tree(&self) -> bool {
        false
    }

    /// The tree is frozen ([`Backend::whole_tree`] backends): the driver's checkpoint of
    /// `pid`, made for every task at once before each task's
    /// [`Backend::adopt_task`], with the task's restore thread let run. Whether it did
    /// anything (a task holding no device of the backend, or one already checkpointed,
    /// is left alone). Default: nothing.
    fn checkpoint_ahead(&self, _pid: i32, _cancel: &Cancel) -> Result<bool, GpuError> {
        Ok(false)
    }

    /// The thread of `pid` the plugin must let run while a driver call is made on the
    /// frozen task (a CUDA process's restore thread); None when the backend needs none.
    fn restore_thread(&self, _pid: i32, _cancel: &Cancel) -> Result<Option<i32>, GpuError> {
        Ok(None)
    }

    /// After the dump, when the tree lives on (`--leave-running`, or the dump failed):
    /// undo what [`Backend::pre_freeze`] and [`Backend::adopt_task`] did to `pid`, so the
    /// job runs on (a driver restore and unlock). Default: nothing.
    fn after_dump(&self, _pid: i32, _cancel: &Cancel) -> Result<(), GpuError> {
        Ok(())
    }

    /// The tree is frozen, `pid` checkpointed, its restore thread let run: copy
    /// sources of device memory the driver holds mapped into gpucr until it is copied
    /// (CUDA's custom storage), in buffer order. The helper copies them into the image
    /// at once, then calls [`Backend::release_held`], all before CRIU dumps the task
    /// (whose state must be the completed checkpoint's). [`Backend::adopt_task`] then
    /// describes these buffers without sources. Default: none.
    fn held_sources(
        &self,
        _pid: i32,
        _cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSource>>, GpuError> {
        Ok(Vec::new())
    }

    /// End what the backend holds of `pid`'s device memory
    /// ([`Backend::held_sources`]): `copied`, every buffer is in the image, so the
    /// driver may drop the memory; otherwise (the copy failed, the tree lives on) the
    /// memory goes back to the task. Whether it held anything of `pid`. Default:
    /// nothing.
    fn release_held(&self, _pid: i32, _copied: bool, _cancel: &Cancel) -> Result<bool, GpuError> {
        Ok(false)
    }

    /// DumpFinished, the tree living on, the task's restore thread let run: for a task
    /// whose device memory left the device into the image ([`Backend::release_held`]
    /// with `copied`), sinks in buffer order to write it back from there; the helper
    /// fills them, then [`Backend::after_dump`] finishes giving the task its device
    /// back. Default: none.
    fn refill_sinks(
        &self,
        _pid: i32,
        _cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSink>>, GpuError> {
        Ok(Vec::new())
    }

    /// RESUME_DEVICES_LATE, restore, for a task without device files: sinks for its
    /// buffers, which only exist now (the driver recreates the memory, as CUDA's
    /// custom storage does), in buffer order; the helper fills them from the image
    /// before [`Backend::resume_task`]. Default: none (the buffers came with the
    /// task's device file, or it has none).
    fn resume_sinks(
        &self,
        _pid: i32,
        _task: &TaskDevice,
        _cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSink>>, GpuError> {
        Ok(Vec::new())
    }

    /// Whether giving the processes `pids` their devices back after a dump that leaves
    /// them alive ([`Backend::after_dump`], [`Backend::refill_sinks`]) may write into
    /// their CPU memory (CUDA's checkpoint keeps the device memory in the process's
    /// own): their pages are then no longer as CRIU dumped them, so post-copy, which
    /// serves them from the stopped tree, defers that give-back until the move is
    /// decided (`dump::DeferredGiveBack`). Asked before anything is frozen. Default:
    /// yes.
    fn gives_back_into_memory(&self, _pids: &[i32]) -> bool {
        true
    }

    /// Restore: whether [`Backend::resume_task`] reads the task's own CPU memory (device
    /// memory the driver staged there at the dump) other than through the task's own
    /// faults, so that an on-demand restore (`--lazy`) brings that memory in first.
    /// Default: no.
    fn resume_reads_process_memory(&self, _task: &TaskDevice) -> bool {
        false
    }

    /// RESUME_DEVICES_LATE, restore: bring `task` (now host pid `pid`) back on its
    /// device before it runs, after its buffers are filled (a driver restore and
    /// unlock); the plugin half lets the task's restore thread run meanwhile when the
    /// backend has one. Default: nothing.
    fn resume_task(&self, _pid: i32, _task: &TaskDevice, _cancel: &Cancel) -> Result<(), GpuError> {
        Ok(())
    }

    /// CHECKPOINT_DEVICES (tree frozen): take over what the plugin half collected for
    /// `pid` (its `state` in `format`, one fd per device buffer) as the task's device
    /// state and a copy source per buffer built from the fds. None when the plugin half
    /// found no device of this backend in the task (empty `state`).
    fn adopt_task(
        &self,
        pid: i32,
        format: &str,
        state: &[u8],
        buffers: Vec<std::os::fd::OwnedFd>,
        cancel: &Cancel,
    ) -> Result<Option<Checkpointed>, GpuError>;

    /// DUMP_EXT_FILE: if `fd` is a device of this backend, which of `tasks` has it open.
    fn file_owner(&self, fd: BorrowedFd<'_>, tasks: &[i32]) -> Result<Option<i32>, GpuError>;

    /// DUMP_EXT_FILE of a file [`Backend::file_owner`] claimed: its role, and the path to
    /// record for it (None: the path the fd links to).
    fn file_role(&self, _fd: BorrowedFd<'_>) -> (DeviceRole, Option<String>) {
        (DeviceRole::Device, None)
    }

    /// RESTORE_EXT_FILE of one of `task`'s files that is not its main device node (a
    /// render node): what the restored task reopens. Backends with such files implement
    /// it; the default refuses.
    fn file_spec(&self, task: &TaskDevice, file: &DeviceFile) -> Result<DeviceSpec, GpuError> {
        Err(GpuError::Task {
            pid: task.host_pid,
            detail: format!(
                "task {}: the {} backend cannot restore {} file {}",
                task.ns_pid,
                self.name(),
                file.role.as_str(),
                file.path
            ),
        })
    }

    /// What the restored task recreates (sent to the plugin in RESTORE_EXT_FILE), from
    /// the task's state: every path beneath [`Backend::state_root`] (checked with
    /// [`check_confined`] before CRIU starts, and by the plugin as it creates them).
    fn restore_spec(&self, task: &TaskDevice) -> Result<DeviceSpec, GpuError>;

    /// A copy-engine sink writing buffer `index` of `task` through `file`, the buffer
    /// the restored task created and handed over (an error when the fd is not what the
    /// task's buffer table says: another size, a handle the device refuses).
    fn buffer_sink(
        &self,
        task: &TaskDevice,
        index: usize,
        file: File,
    ) -> Result<Box<dyn BufferSink>, GpuError>;

    /// Where this backend's GPU topology is read: None for the machine's own `/`, or a
    /// root directory (the simulator's).
    fn sysfs_root(&self) -> Option<PathBuf>;

    /// The directory every device-state file and buffer of a restore must lie beneath
    /// (paths from an image are confined to it); None when the backend keeps no files.
    fn state_root(&self) -> Option<PathBuf>;

    /// Move a task's device state onto other GPUs: `map` pairs each checkpointed GPU
    /// with the local one the topology check chose.
    fn remap_gpus(&self, task: &mut TaskDevice, map: &[(GpuRef, GpuRef)]) -> Result<(), GpuError>;
}

/// kcmp(KCMP_FILE): do our `fd` and `pid`'s `theirs` refer to one open file description?
pub(crate) fn same_open_file(me: i32, fd: i32, pid: i32, theirs: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects named by pids and fd numbers; it reads
    // no memory of ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            me as libc::c_long,
            pid as libc::c_long,
            KCMP_FILE,
            fd as libc::c_long,
            theirs as libc::c_long,
        )
    };
    ret == 0
}

/// Which of `tasks` has the open file behind our `fd` in its fd table.
pub(crate) fn owner_of(fd: BorrowedFd<'_>, tasks: &[i32]) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let me = std::process::id() as i32;
    tasks.iter().copied().find(|&pid| {
        gpucr_abi::procfs::fd_numbers(pid)
            .any(|theirs| same_open_file(me, fd.as_raw_fd(), pid, theirs))
    })
}

/// How a dump's backend is set up.
#[derive(Debug, Clone, Default)]
pub struct DumpSetup {
    /// The dump's freeze timeout (`--timeout`; None: CRIU's default): how long a driver
    /// lock before the freeze may wait for the work in flight.
    pub freeze_timeout: Option<std::time::Duration>,
    /// How CUDA device memory is moved (`--cuda-staging`; None: custom storage where
    /// the driver offers it, else host staging).
    pub cuda_staging: Option<cuda::Staging>,
    /// The dump's image directory: with it, a CUDA dump starts a give-back guard
    /// (`cuda::guard`), which marks the image incomplete should gpucr die during the
    /// dump.
    pub images_dir: Option<PathBuf>,
}

/// The backend whose devices the tree rooted at `pid` holds, if any: the simulator when
/// `GPUCR_SIM_ROOT` is set and a task maps its buffers; else amdgpu when a task of the
/// tree has /dev/kfd open; else
/// cuda when a task of the tree has an NVIDIA device open
/// or `GPUCR_CUDA_LIBRARY` names a driver (the driver is loaded and initialised only
/// then, so a CPU-only tree pays nothing).
pub fn detect(
    pid: i32,
    setup: &DumpSetup,
) -> Result<Option<std::sync::Arc<dyn Backend>>, GpuError> {
    let tree = tree_pids(pid);
    // The simulator where it is set up and the tree holds its devices; a tree that
    // holds none of them may still hold a real device.
    if let Some(mut sim) = sim::SimBackend::from_env()? {
        if tree.iter().any(|&p| sim.holds_device(p)) {
            if let Some(dir) = setup
                .images_dir
                .as_ref()
                .filter(|_| tree.iter().any(|&p| sim.is_nvidia_task(p)))
            {
                match sim::guard::Guard::start(dir) {
                    Ok(guard) => sim.set_guard(guard),
                    Err(e) => {
                        crate::errln!(
                            "gpucr: warning: cannot start the simulator's give-back guard: {e}"
                        )
                    }
                }
            }
            return Ok(Some(std::sync::Arc::new(sim)));
        }
    }
    if tree.iter().any(|&p| amdgpu::holds_kfd(p)) {
        let amd = amdgpu::AmdgpuBackend::load()?;
        return Ok(Some(std::sync::Arc::new(amd)));
    }
    if !cuda::CudaBackend::wanted(&tree) {
        return Ok(None);
    }
    let mut cuda = cuda::CudaBackend::load()?;
    if let Some(timeout) = setup.freeze_timeout {
        cuda.set_lock_timeout(timeout);
    }
    cuda.set_staging(setup.cuda_staging)?;
    if !tree.iter().any(|&p| cuda.holds_device(p)) {
        return Ok(None);
    }
    if let Some(dir) = &setup.images_dir {
        // Without a guard the dump still runs; only a gpucr killed outright would then
        // leave the job locked.
        match cuda::guard::Guard::start(dir, cuda.staging()) {
            Ok(guard) => cuda.set_guard(guard),
            Err(e) => crate::errln!("gpucr: warning: cannot start the CUDA give-back guard: {e}"),
        }
    }
    Ok(Some(std::sync::Arc::new(cuda)))
}

/// The backend named in a manifest, configured from the environment.
pub fn backend_named(name: &str) -> Result<std::sync::Arc<dyn Backend>, GpuError> {
    match name {
        "sim" => match sim::SimBackend::from_env()? {
            Some(sim) => Ok(std::sync::Arc::new(sim)),
            None => Err(GpuError::Config {
                variable: sim::ENV_ROOT,
                value: String::new(),
                detail: "the image holds simulated GPU state: set GPUCR_SIM_ROOT to the sim root to restore into".into(),
            }),
        },
        cuda::NAME => Ok(std::sync::Arc::new(cuda::CudaBackend::load()?)),
        amdgpu::NAME => Ok(std::sync::Arc::new(amdgpu::AmdgpuBackend::load()?)),
        other => Err(GpuError::Config {
            variable: "backend",
            value: other.to_owned(),
            detail: "this gpucr has no such GPU backend".into(),
        }),
    }
}

/// Where the backend `name` reads this machine's GPU topology when no `--sysfs-root` is
/// given, found without loading its driver (`Backend::sysfs_root` of the backend a
/// restore would load): the sim root (`GPUCR_SIM_ROOT`) for the simulator, `/` (None)
/// for real devices.
pub fn topology_root(name: &str) -> Option<PathBuf> {
    match name {
        "sim" => sim::SimRoot::from_env().map(|root| root.root),
        _ => None,
    }
}

pub use gpucr_abi::procfs::tree_pids;

/// The task's pid in its innermost PID namespace (the last NSpid field).
pub fn ns_pid(pid: i32) -> Result<u32, GpuError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path).map_err(GpuError::io(&path))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .ok_or_else(|| GpuError::Malformed {
            path,
            detail: "no NSpid line".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ns_pid_is_found() {
        let me = std::process::id() as i32;
        assert!(ns_pid(me).unwrap() > 0);
        assert!(ns_pid(-1).is_err());
    }

    #[test]
    fn gpu_refs_round_trip_and_reject_junk() {
        for text in [
            "kfd:4096",
            "nvidia:GPU-8f1c2d3e-0000-1111-2222-333344445555",
        ] {
            assert_eq!(text.parse::<GpuRef>().unwrap().to_string(), text);
        }
        for bad in ["kfd:x", "nvidia:", "pci:0000:01:00.0", "4096"] {
            assert!(bad.parse::<GpuRef>().is_err(), "{bad}");
        }
        let kfd = gpucr_topology::GpuId::Kfd {
            node: 1,
            gpu_id: 4096,
        };
        assert!(GpuRef::Kfd(4096).matches(&kfd));
        assert!(!GpuRef::Nvidia("GPU-1".into()).matches(&kfd));
        assert!(
            GpuRef::Nvidia("GPU-1".into()).matches(&gpucr_topology::GpuId::Nvidia {
                uuid: "GPU-1".into()
            })
        );
    }

    #[test]
    fn specs_are_confined_to_the_root_and_dev() {
        let spec = |root: &str, buffer: &str, device: &str| DeviceSpec {
            root: root.into(),
            device_path: device.into(),
            buffers: vec![BufferSpec {
                path: buffer.into(),
                size: 1,
                mode: 0,
            }],
            ..Default::default()
        };
        assert!(check_confined(&spec("/r", "/r/c/b0", "/dev/fuse")).is_ok());
        for (root, buffer, device) in [
            ("/r", "/etc/passwd", "/dev/fuse"),
            ("/r", "/r/../etc/passwd", "/dev/fuse"),
            ("/r", "/r", "/dev/fuse"),
            ("", "/r/c/b0", "/dev/fuse"),
            ("/r", "/r/c/b0", "/etc/shadow"),
            ("/r", "/r/c/b0", "/dev/../etc/shadow"),
        ] {
            let err = check_confined(&spec(root, buffer, device)).unwrap_err();
            assert!(err.to_string().contains("is not beneath"), "{err}");
        }
    }
}
