//! `gpucr dump`: validate, run CRIU's DUMP, checksum the image, write the manifest last.
//!
//! [`gate`] answers CRIU's notifications and gives the verdict (which failure the user
//! hears of), [`post_dump`] is the work done while CRIU still holds the tree (shared
//! with engine mode), [`complete`] checksums the image and writes its manifest (also
//! for engine mode's helper), [`error`] says why a dump failed; this module runs CRIU
//! and the GPU helper side by side, phase by phase.

use std::path::{Path, PathBuf};

use crate::criu::{
    criu_log_level, start_criu, CommonOptions, ConfigHandover, CriuConfig, CriuFlags, DumpRequest,
    NetworkLock,
};
use crate::gpu;
use crate::helper::{GpuDump, Session};
use crate::image::dir;
use crate::image::manifest::{self, Manifest};
use crate::image::DUMP_LOG;
use crate::interrupt;
use crate::progress::Progress;
use crate::target;
use crate::transfer::TransferConfig;

mod complete;
mod deferred;
mod error;
mod gate;
mod page_digests;
pub mod page_server;
mod post_dump;
mod tree_pages;

pub use complete::{
    gpu_section_bytes, is_gpu_data_file, is_pages_file, write_manifest, ImageFacts,
};
pub use deferred::DeferredGiveBack;
pub use error::DumpError;
use gate::{Gate, PageSource, Verdict};
pub use page_digests::{InTree, TreeRun};
pub use post_dump::{DumpDevices, PostDump, PostDumpError};
use tree_pages::TreePages;

/// What to dump and how.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub pid: i32,
    pub dir: PathBuf,
    pub leave_running: bool,
    pub flags: CriuFlags,
    /// None: what the machine has ([`NetworkLock::detect`]).
    pub network_lock: Option<NetworkLock>,
    pub timeout: Option<u32>,
    pub force: bool,
    /// None: look for criu on PATH.
    pub criu: Option<PathBuf>,
    pub verbose: bool,
    /// How GPU memory is moved (threads, compression).
    pub transfer: TransferConfig,
    /// How long one device step may take (`--device-timeout`).
    pub device_timeout: std::time::Duration,
    /// How CUDA device memory is moved (`--cuda-staging`; None: chosen by the driver).
    pub cuda_staging: Option<crate::gpu::cuda::Staging>,
    /// A file of further CRIU options (`--criu-config`), checked before anything else.
    pub criu_config: Option<PathBuf>,
    /// Record the memory pages files by size only (`--no-page-checksums`): nothing
    /// reads the pages a second time while the tree is frozen.
    pub no_page_checksums: bool,
    /// With `leave_running`: stop the tree (SIGSTOP to every process) as CRIU lets it go
    /// after a dump that succeeded, so that it never runs between its image and the
    /// stop (`gpucr migrate`'s freeze is the dump's own). gpucr's plugin stops it after
    /// the devices are given back (or deferred, [`dump_deferring`]); without a GPU
    /// backend, gpucr does at post-dump.
    pub stop_after: bool,
    /// Post-copy's dump, with `stop_after`: CRIU sends the memory pages to gpucr's
    /// [`page_server`], which writes into the pages files only what the stopped tree
    /// cannot give back ([`DumpOutcome::in_tree`] says where the rest is). The image is
    /// complete only while the tree stays stopped, and only with the tree's memory read
    /// into it (`migrate::tree_blocks`). Where the GPU backend writes into the tree's
    /// memory as it gives it its devices back (`Backend::gives_back_into_memory`), the
    /// give-back is deferred to the caller ([`DumpOutcome::deferred`]).
    pub pages_in_tree: bool,
    /// The command's token, cancelled at Ctrl-C (`interrupt::cancels`): it stops the
    /// GPU copy and the helper's steps that carry the dump forward at once (the next
    /// CRIU notification is then refused, and CRIU lets the tree go).
    pub cancel: crate::cancel::Cancel,
}

/// A finished dump.
#[derive(Debug, Clone)]
pub struct DumpOutcome {
    pub manifest: Manifest,
    /// Bytes of all image files.
    pub image_bytes: u64,
    /// Bytes of CPU memory pages (pages-*.img).
    pub pages_bytes: u64,
    /// The pieces of each pages file left out of it by the page server
    /// ([`DumpOptions::pages_in_tree`]), and where they are in the stopped tree (empty
    /// without the page server).
    pub in_tree: std::collections::HashMap<String, InTree>,
}

/// Checkpoint `opts.pid` into `opts.dir`, phase by phase: check the target and start
/// the GPU side, run CRIU's dump with the [`gate`] answering its notifications, tell
/// the user the [`gate::verdict`], write the manifest.
pub fn dump(opts: &DumpOptions, progress: &mut Progress) -> Result<DumpOutcome, DumpError> {
    dump_deferring(opts, progress, &mut None)
}

/// [`dump`] for post-copy ([`DumpOptions::pages_in_tree`]): where the GPU backend's
/// give-back would write into the tree's memory, `deferred` gets that give-back, not
/// yet done, whether the dump succeeds or fails (one that fails once CRIU is done, at
/// the manifest say, leaves the devices as it made them too). The tree stays stopped
/// holding its devices; should it run on, the caller lets it run, then
/// [`DeferredGiveBack::give_back`] (a no-op where the end of the dump gave them back).
pub fn dump_deferring(
    opts: &DumpOptions,
    progress: &mut Progress,
    deferred: &mut Option<DeferredGiveBack>,
) -> Result<DumpOutcome, DumpError> {
    progress.event("start", "checking the target");
    let criu_config = opts
        .criu_config
        .as_deref()
        .map(CriuConfig::read)
        .transpose()?;
    let target = target::validate(opts.pid)?;
    target::check_untraced(opts.pid)?;
    let setup = gpu::DumpSetup {
        freeze_timeout: opts
            .timeout
            .map(|s| std::time::Duration::from_secs(s.into())),
        cuda_staging: opts.cuda_staging,
        images_dir: Some(opts.dir.clone()),
    };
    let backend = gpu::detect(opts.pid, &setup)?;
    let mut topology = backend.as_deref().map(gpu::LocalTopology::start);
    let session = match &backend {
        Some(b) => {
            Some(Session::create(b.name()).map_err(|e| DumpError::HelperSetup(Box::new(e)))?)
        }
        None => None,
    };
    let mut env = session.as_ref().map(Session::criu_env).unwrap_or_default();
    // With a GPU backend the plugin stops the tree, once the devices are given back
    // (a restore thread let run to give one back would take the stop with it); without
    // one, the gate does at post-dump.
    let stop_at_post_dump = match (opts.stop_after, &session) {
        (true, Some(_)) => {
            env.push((
                gpucr_abi::ENV_STOP_AFTER_DUMP.into(),
                opts.pid.to_string().into(),
            ));
            None
        }
        (true, None) => Some(opts.pid),
        (false, _) => None,
    };
    let handover = criu_config.as_ref().map(CriuConfig::handover).transpose()?;
    // A GPU backend gives the tree its device state back as the dump ends, and may
    // write into its memory doing so: where the pages stay in the tree, that give-back
    // waits for the caller.
    let defer_give_back = opts.pages_in_tree
        && backend
            .as_deref()
            .is_some_and(|b| b.gives_back_into_memory(&gpucr_abi::procfs::tree_pids(opts.pid)));
    if defer_give_back && session.is_some() {
        env.push((gpucr_abi::ENV_DEFER_GIVE_BACK.into(), "1".into()));
    }
    let page_socket = match opts.pages_in_tree {
        true => Some(page_server::Socket::new().map_err(DumpError::pages(&opts.dir))?),
        false => None,
    };
    let mut inherit = session
        .as_ref()
        .map(Session::criu_inherit)
        .unwrap_or_default();
    inherit.extend(page_socket.as_ref().map(page_server::Socket::criu_end));
    let page_server_fd = page_socket
        .as_ref()
        .map(|s| std::os::fd::AsRawFd::as_raw_fd(&s.criu_end()));
    let (mut swrk, version) = start_criu(
        opts.criu.as_deref(),
        &env,
        &inherit,
        handover.as_ref(),
        progress,
    )
    .map_err(|e| DumpError::CriuSetup(Box::new(e)))?;
    let own_mount_namespace = crate::criu::has_own_mount_namespace(opts.pid);
    if own_mount_namespace {
        crate::criu::check_file_mounts(swrk.path(), version, opts.pid)
            .map_err(|e| DumpError::CriuSetup(Box::new(e)))?;
    }
    let dir_fd = dir::prepare_for_dump(&opts.dir, opts.force)?;
    let page_server = page_socket
        .map(|socket| socket.serve(page_server::Layout::of(version), opts.pid, opts.dir.clone()));
    let gpu = start_gpu(opts, backend, session, progress)?.map(std::sync::Arc::new);
    if let (true, Some(gpu)) = (defer_give_back, &gpu) {
        gpu.defer_give_back();
        *deferred = Some(DeferredGiveBack::new(gpu.clone()));
    }
    let network_lock = opts
        .network_lock
        .unwrap_or_else(|| NetworkLock::default_for(opts.pid, opts.flags.tcp_established));
    let request = DumpRequest {
        pid: opts.pid,
        images_dir: std::os::fd::AsFd::as_fd(&*dir_fd),
        log_file: DUMP_LOG,
        leave_running: opts.leave_running,
        timeout: opts.timeout,
        config_file: handover.as_ref().map(ConfigHandover::criu_path),
        config_origin: opts.criu_config.as_deref(),
        page_server_fd,
        common: CommonOptions {
            flags: opts.flags,
            network_lock,
            log_level: criu_log_level(opts.verbose, gpu.is_some()),
            own_mount_namespace,
        },
    };
    let log = opts.dir.join(DUMP_LOG);
    let devices = gpu.as_deref().map(|g| g as &dyn DumpDevices);
    // The memory pages are digested from the tree while CRIU writes them (see
    // `tree_pages`), or by the page server as it gets them; laid out at post-dump.
    let pages = match page_server {
        Some(server) => Some(PageSource::Server(server)),
        None => (!opts.no_page_checksums)
            .then(|| PageSource::Tree(TreePages::start(opts.pid, opts.dir.clone()))),
    };
    let mut gate = Gate::new(&opts.dir, devices, pages).stopping(stop_at_post_dump);
    // A signal cancels the command's token, which stops the GPU copy at once; the next
    // notification fails the dump.
    let answered = swrk.dump(&request, &log, &mut |n| gate.notify(n, progress));
    let mut gathered = gate.gathered();
    // CRIU only says that its connection broke when the page server failed.
    let refused = answered
        .refused
        .or_else(|| gathered.pages_failure.take().map(gate::Refusal::Pages));
    // CRIU lets a dump succeed whose action script failed at network-unlock (scripts
    // come only from --criu-config): the user must hear of it.
    let lenient_script = match (&answered.criu, &opts.criu_config) {
        (Ok(()), Some(config)) => swrk.script_failure(&log, Some(config)),
        _ => None,
    };
    let criu = match answered.criu {
        Ok(()) => swrk.finish(),
        Err(e) => {
            drop(swrk);
            Err(e)
        }
    };
    let verdict = gate::verdict(
        interrupt::requested().map(interrupt::name),
        refused,
        criu,
        devices,
        gathered.copy_finished,
    );
    fail_on(verdict, opts, devices)?;
    if let Some(failure) = lenient_script {
        progress.warn(&format!(
            "{}; CRIU does not fail a dump for it: see {}",
            failure.describe(),
            log.display()
        ));
    }
    progress.event("criu-done", "checksumming the image");
    let options = manifest::DumpOptions {
        leave_running: opts.leave_running,
        flags: opts.flags,
        network_lock: network_lock.as_str().into(),
        mount_namespace: own_mount_namespace,
        criu_config: criu_config.map(|c| manifest::CriuConfigRecord {
            file: c.path.display().to_string(),
            options: c.options.iter().map(|o| o.to_line()).collect(),
        }),
        set_by_engine: false,
        no_page_checksums: opts.no_page_checksums,
    };
    let gpu_facts = match (topology.take(), &gathered.gpu) {
        (Some(topology), Some(g)) => Some((topology, g)),
        _ => None,
    };
    let mut written = write_manifest(
        &opts.dir,
        &gathered.page_digests.prefixes,
        ImageFacts {
            target,
            criu_version: version.to_string(),
            options,
            gpu: gpu_facts,
            room: gathered.room,
            still_written: Vec::new(),
        },
        progress,
    )?;
    // The end of the dump ran in CRIU's exit hook, after the image was complete: the
    // gpucr half gave a tree that lives on its devices back, or let go of what it held.
    if let Some(error) = devices.and_then(DumpDevices::take_failure) {
        if opts.leave_running {
            return Err(DumpError::GiveBack {
                error: Box::new(error),
                dir: opts.dir.clone(),
                running: liveness(opts.pid),
            });
        }
        progress.warn(&format!("after the dump, the tree killed: {error}"));
    }
    written.in_tree = gathered.page_digests.in_tree;
    Ok(written)
}

/// Start the GPU side of the dump when the tree uses a GPU.
fn start_gpu(
    opts: &DumpOptions,
    backend: Option<std::sync::Arc<dyn gpu::Backend>>,
    session: Option<Session>,
    progress: &mut Progress,
) -> Result<Option<GpuDump>, DumpError> {
    let (Some(backend), Some(session)) = (backend, session) else {
        return Ok(None);
    };
    progress.event(
        "helper-started",
        &format!("GPU backend {}: helper started", backend.name()),
    );
    GpuDump::start(
        session,
        &opts.dir,
        backend,
        opts.transfer.clone(),
        progress.gpu_events(),
        opts.leave_running,
        crate::helper::StepControl {
            device_timeout: opts.device_timeout,
            operation: opts.cancel.clone(),
        },
    )
    .map(Some)
    .map_err(|e| DumpError::HelperSetup(Box::new(e)))
}

/// The dump's failure for `verdict`, with the image marked incomplete and what became
/// of the tree; Ok when the image is written.
fn fail_on(
    verdict: Verdict,
    opts: &DumpOptions,
    devices: Option<&dyn DumpDevices>,
) -> Result<(), DumpError> {
    // Where the tree lives on and the end of the dump could not give it every device
    // back, the user must hear it whatever else failed.
    let running = || {
        let alive = liveness(opts.pid);
        match devices.and_then(DumpDevices::give_back_failure) {
            Some(e) => format!("{alive}, but a task may not have its device back: {e}"),
            None => alive,
        }
    };
    let dir = opts.dir.clone();
    let incomplete = |why: &str| {
        let _ = dir::mark_incomplete(&opts.dir, why);
    };
    match verdict {
        Verdict::Written => Ok(()),
        Verdict::Interrupted(signal) => {
            incomplete(&format!("interrupted by {signal}"));
            Err(DumpError::Interrupted {
                signal,
                dir,
                running: running(),
            })
        }
        Verdict::Helper { error, criu_too } => {
            incomplete(&error.to_string());
            let running = match criu_too {
                Some(criu) => format!("{}; CRIU then failed too:\n{criu}", running()),
                None => running(),
            };
            Err(DumpError::Helper {
                error: Box::new(error),
                dir,
                running,
            })
        }
        Verdict::Pages(error) => {
            incomplete(&error.to_string());
            Err(DumpError::Pages {
                error: Box::new(error),
                dir,
                running: running(),
            })
        }
        Verdict::Room(error) => {
            incomplete(&error.to_string());
            Err(DumpError::ManifestRoom {
                error: Box::new(error),
                dir,
                running: running(),
            })
        }
        Verdict::Criu(error) => {
            incomplete(&error.to_string());
            let running = match disk_full_hint(&opts.dir)
                .or_else(|| crate::criu::advice_for(&error.to_string()))
            {
                Some(hint) => format!("{}; {hint}", running()),
                None => running(),
            };
            Err(DumpError::Criu {
                error: Box::new(error),
                dir,
                running,
            })
        }
    }
}

/// Whether `pid` still runs, for the messages of a dump.
fn liveness(pid: i32) -> String {
    if target::is_running(pid) {
        format!("pid {pid} is still running")
    } else {
        format!("pid {pid} is no longer running")
    }
}

/// "No space left on device" when the file system holding `dir` is (nearly) full: CRIU
/// cannot say so itself once its log cannot be written either.
fn disk_full_hint(dir: &Path) -> Option<String> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    (free < 1 << 20).then(|| {
        format!(
            "the file system holding {} is full (No space left on device)",
            dir.display()
        )
    })
}
