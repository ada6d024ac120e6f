//! `gpucr restore`: refuse a bad image before CRIU starts, then run CRIU's RESTORE.
//!
//! [`load`] reads and verifies the image, [`gpu_state`] checks its GPU state against this
//! machine's GPUs, [`error`] says why a restore failed; this module runs CRIU and the
//! GPU helper side by side and answers CRIU's notifications.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::criu::{
    criu_log_level, start_criu, CommonOptions, ConfigHandover, CriuConfig, NetworkLock,
    RestoreRequest,
};
use crate::gpu::TaskTiming;
use crate::helper::{GpuRestore, ProcessMemory, RestoreSettings, Session};
use crate::image::dir;
use crate::image::manifest::Manifest;
use crate::image::verify::{self, Scope};
use crate::image::workdir::{self, WorkDir};
use crate::image::RESTORE_LOG;
use crate::interrupt;
use crate::progress::Progress;
use crate::restore_guard::RestoreGuard;
use crate::transfer::{GpuStats, TransferConfig};

mod error;
mod gate;
mod gpu_state;
mod load;

pub use error::RestoreError;
use error::{advise, interrupted, pid_taken};
use gate::{Gate, Verdict};
use gpu_state::unchecked_gpus;
pub use gpu_state::{prepare_gpu, PreparedGpu};
use load::{load_checked, verify_gpu_first};
pub use load::{load_verified, Loaded};

/// What to restore and how. The boolean flags force an option on; the others come from
/// the manifest.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    pub dir: PathBuf,
    pub flags: crate::criu::CriuFlags,
    pub criu: Option<PathBuf>,
    pub verbose: bool,
    /// Hash every file and check every GPU chunk before CRIU starts, instead of while
    /// CRIU restores (the tree is never resumed before they are verified either way).
    pub verify_first: bool,
    /// How GPU memory is moved (threads, staging memory).
    pub transfer: TransferConfig,
    /// Read the GPU image only once each task's buffers exist, and fill them inside
    /// RESTORE_EXT_FILE (CRIU 4.1's way), instead of streaming from the start.
    pub no_parallel_restore: bool,
    /// Where to read this machine's GPU topology (default: the backend's own).
    pub sysfs_root: Option<PathBuf>,
    /// Topology checks not to apply.
    pub skip_checks: Vec<gpucr_topology::CheckName>,
    /// How long one device step may take (`--device-timeout`).
    pub device_timeout: std::time::Duration,
    /// `CUDA_VISIBLE_DEVICES`: the local NVIDIA GPUs a restore may map onto.
    pub cuda_visible_devices: Option<String>,
    /// A file of further CRIU options (`--criu-config`), checked before anything else.
    pub criu_config: Option<PathBuf>,
    /// On-demand restore (`--lazy`): CRIU leaves the tasks' private memory to gpucr's
    /// lazy-pages server (`crate::lazy`), which serves it after the tree resumes.
    pub lazy: bool,
    /// With `lazy`: where the blocks of pages files not yet in `dir` come from (a
    /// post-copy migration's destination).
    pub lazy_remote: Option<Arc<dyn crate::lazy::RemoteBlocks>>,
    /// Leave the restored tree stopped (SIGSTOP) when CRIU lets it go: a migration's
    /// destination lets it run (SIGCONT) only once the source has given its copy up.
    pub leave_stopped: bool,
    /// The command's token, cancelled at Ctrl-C (`interrupt::cancels`): until the tree
    /// is whole it stops the image's verification, the GPU copies and the helper's
    /// steps that carry the restore forward.
    pub cancel: crate::cancel::Cancel,
}

/// A restored tree.
#[derive(Debug, Clone)]
pub struct RestoreOutcome {
    /// The restored root, a child of this process.
    pub pid: i32,
    pub manifest: Manifest,
    /// What moved GPU memory, and when each task's buffers were filled (milliseconds
    /// since the restore started, the clock of the progress events).
    pub gpu: Option<(GpuStats, Vec<TaskTiming>)>,
    /// With `lazy`: the server still filling the tree's memory; wait for it
    /// (`Serving::wait`) to know when every page is in.
    pub lazy: Option<crate::lazy::Serving>,
}

/// The CRIU binary a restore with `opts` would run: found, or why not (before anything
/// is asked of a restore that would find out only then).
pub fn locate_criu(opts: &RestoreOptions) -> Result<PathBuf, RestoreError> {
    Ok(crate::criu::locate(opts.criu.as_deref())?)
}

/// Restore the image in `opts.dir`. The root of the restored tree is a child of this
/// process: wait for it with [`wait_for_tree`], or leave it running.
///
/// Every file's size and every small file's checksum are verified before CRIU starts.
/// The memory pages (files of [`verify::BULK_THRESHOLD`] and more) are hashed on a
/// second thread while CRIU restores, and CRIU's post-restore notification, which comes
/// before any restored task runs, is answered only once they are verified: a damaged
/// pages file makes CRIU abort and kill the half-made tree. With `verify_first`,
/// everything is hashed before CRIU starts, and every GPU chunk is checked against the
/// GPU index too (otherwise each is checked as it is read, while CRIU restores).
///
/// When the image directory is not writable, CRIU's log and statistics go to a private
/// directory (`image::workdir`): removed when the restore succeeds, kept and named in
/// the error ([`RestoreError::LogKept`]) when it fails.
pub fn restore(
    opts: &RestoreOptions,
    progress: &mut Progress,
) -> Result<RestoreOutcome, RestoreError> {
    let mut work = None;
    let result = restore_in(opts, progress, &mut work);
    let Some(work) = work.filter(WorkDir::is_private) else {
        return result;
    };
    match result {
        Ok(outcome) => {
            let path = work.path.clone();
            if let Err(e) = work.remove() {
                progress.warn(&format!(
                    "cannot remove CRIU's work directory {}: {e}",
                    path.display()
                ));
            }
            Ok(outcome)
        }
        Err(error) => Err(match work.keep_for_failure() {
            Some(dir) => RestoreError::LogKept {
                error: Box::new(error),
                dir,
            },
            None => error,
        }),
    }
}

/// [`restore`], with CRIU's work directory put into `work` once it is made.
fn restore_in(
    opts: &RestoreOptions,
    progress: &mut Progress,
    work: &mut Option<WorkDir>,
) -> Result<RestoreOutcome, RestoreError> {
    progress.event("start", "verifying the image");
    let criu_config = opts
        .criu_config
        .as_deref()
        .map(CriuConfig::read)
        .transpose()?;
    // Hashing a large image takes a while: the command's cancellation (a signal) stops
    // it at once, not at CRIU's first notification.
    let stop_verifying = Arc::new(AtomicBool::new(false));
    {
        let stop = stop_verifying.clone();
        opts.cancel
            .on_cancel(move || stop.store(true, Ordering::SeqCst));
    }
    let scope = if opts.verify_first {
        Scope::All
    } else {
        Scope::SmallFiles
    };
    let Loaded { manifest, topology } = load_checked(
        &opts.dir,
        scope,
        &stop_verifying,
        opts.sysfs_root.as_deref(),
    )?;
    // Held until this restore ends (an on-demand one: until its last page is served),
    // before anything in the directory is removed or mapped (`dir::lock_for_restore`).
    let image_lock = dir::lock_for_restore(&opts.dir, opts.lazy)?;
    if opts.verify_first {
        verify_gpu_first(&opts.dir, &manifest, &stop_verifying)?;
    }
    if opts.lazy {
        // What CRIU reads itself is checked now; the server checks the rest block by
        // block before it places it, so nothing waits for the whole files' hashes.
        crate::lazy::pages::verify_eager(&opts.dir, &manifest, manifest.host.page_size_or_here())?;
    }
    let staging = match opts.lazy {
        true => lazy_staging()?,
        false => LazyStaging::Fill,
    };
    progress.event(
        "verified",
        if manifest.options.no_page_checksums {
            "image verified (its memory pages files by size only: dumped with \
             --no-page-checksums)"
        } else {
            "image verified"
        },
    );
    let bulk = (!opts.verify_first && !opts.lazy).then(|| {
        let (dir, manifest) = (opts.dir.clone(), manifest.clone());
        let threads = verify::default_threads().saturating_sub(1).max(1);
        let stop = stop_verifying.clone();
        std::thread::spawn(move || {
            // Slack until post-restore: it takes the cycles CRIU leaves (`niceness`).
            let _ = crate::niceness::run_in_background();
            verify::verify_files_until(&dir, &manifest, threads, Scope::BulkFiles, &stop)
        })
    });
    // CRIU restores with the method recorded in the image's inventory whatever it is
    // told; it is passed on as the manifest has it, and checked so that a damaged
    // manifest is named.
    let dumped = &manifest.options;
    let network_lock: NetworkLock =
        dumped
            .network_lock
            .parse()
            .map_err(|_| RestoreError::BadOption {
                manifest: Manifest::path_in(&opts.dir),
                field: "options.network_lock",
                value: dumped.network_lock.clone(),
            })?;
    let gpu_setup = match prepare_gpu(opts, &manifest, topology)? {
        Some((gpu, backend)) => {
            match unchecked_gpus(&manifest) {
                Some(warning) => {
                    progress.warn(&warning);
                    progress.event("topology-checked", "no GPU topology to check");
                }
                None => progress.event("topology-checked", "GPU topology compatible"),
            }
            let session =
                Session::create(&gpu.backend).map_err(|e| RestoreError::Helper(Box::new(e)))?;
            Some((gpu, backend, session))
        }
        None => None,
    };
    let env = gpu_setup
        .as_ref()
        .map(|(_, _, s)| s.criu_env())
        .unwrap_or_default();
    let handover = criu_config.as_ref().map(CriuConfig::handover).transpose()?;
    let inherit = gpu_setup
        .as_ref()
        .map(|(_, _, s)| s.criu_inherit())
        .unwrap_or_default();
    // CRIU's log and statistics: into the image directory (the last restore's removed,
    // so that a failure never shows its log), or a private directory when it is
    // read-only (those earlier restores of the image left removed).
    let work = work.insert(workdir::for_restore(&opts.dir)?);
    for unremoved in &work.unremoved {
        progress.warn(&format!(
            "cannot remove the work directory of an earlier restore: {unremoved}"
        ));
    }
    if work.is_private() {
        progress.note(&format!(
            "{} is not writable: CRIU's log and statistics go to {} (removed once the \
             restore succeeds)",
            opts.dir.display(),
            work.path.display()
        ));
    }
    // The lazy-pages socket exists before CRIU looks for it, and the guard that keeps
    // the tasks' userfaultfds open should gpucr die before the first one comes.
    let lazy_log = crate::lazy::guard::log_path(&work.path, work.is_private());
    let mut lazy = opts
        .lazy
        .then(|| -> Result<_, crate::lazy::LazyError> {
            // This restore has the image to itself (`image_lock`): an earlier one's log
            // goes before the guard opens it.
            let _ = std::fs::remove_file(&lazy_log);
            let guard = crate::lazy::LazyGuard::start(&lazy_log)?;
            let server = crate::lazy::LazyServer::start(
                &work.path,
                Arc::new(manifest.clone()),
                crate::lazy::ServeOptions {
                    image_dir: opts.dir.clone(),
                    threads: opts.transfer.jobs.max(1),
                    guard: Some(Arc::new(guard)),
                    quiet: crate::lazy::hold::quiet_for(&opts.dir)?,
                    remote: opts.lazy_remote.clone(),
                },
                &opts.cancel,
            )?;
            server.criu_running();
            Ok(server)
        })
        .transpose()?;
    let (mut swrk, _) = start_criu(
        opts.criu.as_deref(),
        &env,
        &inherit,
        handover.as_ref(),
        progress,
    )?;
    drop(inherit);
    if let (Some(server), Some(pid)) = (&lazy, swrk.pid()) {
        server.criu_started(pid);
    }
    let inherit_fds: Vec<(String, i32)> = gpu_setup
        .as_ref()
        .map(|(_, _, s)| vec![s.criu_inherit_fd()])
        .unwrap_or_default();
    // The helper times each task's fill from its own start; this puts it on our clock.
    let helper_clock_ms = progress.elapsed_ms();
    // A device restore that reads the tasks' own memory (CUDA's host staging) gets that
    // memory in first, unless GPUCR_LAZY_STAGING=lazy leaves it to the driver's faults
    // (to measure whether a driver copes with it).
    let process_memory = match (&lazy, staging) {
        (Some(server), LazyStaging::Fill) => {
            let memory = server.memory();
            Some(ProcessMemory(Arc::new(
                move |pid: u32, cancel: &crate::cancel::Cancel| {
                    let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
                    memory.fill_task(pid, cancel).map_err(|e| e.to_string())
                },
            )))
        }
        _ => None,
    };
    let gpu = match gpu_setup {
        Some((gpu, backend, session)) => {
            let started = GpuRestore::start(
                session,
                &opts.dir,
                &gpu,
                backend,
                RestoreSettings {
                    transfer: opts.transfer.clone(),
                    parallel: !opts.no_parallel_restore,
                    device_timeout: opts.device_timeout,
                    fill_at_hand_over: false,
                    process_memory,
                },
                progress.gpu_events(),
                &opts.cancel.child(),
            );
            progress.event("helper-started", "GPU helper started");
            Some(started.map_err(|e| RestoreError::Helper(Box::new(e)))?)
        }
        None => None,
    };
    let dir_fd = dir::open_dir(&opts.dir)?;
    let request = RestoreRequest {
        images_dir: std::os::fd::AsFd::as_fd(&dir_fd),
        work_dir: work.fd(),
        log_file: RESTORE_LOG,
        common: CommonOptions {
            flags: opts.flags.or(dumped.flags),
            network_lock,
            log_level: criu_log_level(opts.verbose, gpu.is_some()),
            own_mount_namespace: dumped.mount_namespace,
        },
        inherit: inherit_fds,
        config_file: handover.as_ref().map(ConfigHandover::criu_path),
        config_origin: opts.criu_config.as_deref(),
        lazy_pages: lazy.is_some(),
    };
    let log = work.path.join(RESTORE_LOG);
    // A signal cancels the command's token, and with it the GPU copies at once; until
    // post-restore has been answered, the next notification fails the restore and CRIU
    // kills what it had begun. Past it the tree is whole and verified: the gate detaches
    // the GPU side from the token, and a later signal is for the restored tree.
    // From post-restore until the devices are back, CRIU would resume a half-restored
    // tree should gpucr die: the guard kills it then (`restore_guard`). Dropped at
    // the end of this function, whatever the outcome, it ends without a word.
    let guard = gpu.as_ref().and_then(|_| match RestoreGuard::start() {
        Ok(guard) => Some(guard),
        Err(e) => {
            progress.warn(&format!("cannot start the restore guard: {e}"));
            None
        }
    });
    let mut gate =
        Gate::new(gpu.as_ref(), guard.as_ref(), bulk).leaving_stopped(opts.leave_stopped);
    // The gate keeps why it refused a notification, for its verdict.
    let result = swrk
        .restore(&request, &log, &mut |n| gate.notify(n, progress))
        .criu;
    if let Some(server) = &lazy {
        server.criu_done();
    }
    if let (Some(_), true) = (interrupt::requested(), result.is_err()) {
        drop(swrk);
        return Err(interrupted());
    }
    // Serving failed while CRIU held the tree: CRIU was killed for it, and the reason is
    // the server's.
    if let (Err(criu), true) = (
        &result,
        lazy.as_ref().is_some_and(crate::lazy::LazyServer::failed),
    ) {
        let criu = criu.to_string();
        drop(swrk);
        return Err(match lazy.take().map(crate::lazy::LazyServer::wait) {
            Some(Err(error)) => RestoreError::Lazy(error),
            _ => RestoreError::Lazy(crate::lazy::LazyError::Protocol(criu)),
        });
    }
    let plugin_named_a_cause = result
        .as_ref()
        .err()
        .is_some_and(|e| e.plugin_failure().is_some());
    match gate.verdict(result.is_err(), plugin_named_a_cause) {
        Verdict::Criu => {}
        Verdict::Damaged(problems) => {
            return Err(RestoreError::Damaged {
                dir: opts.dir.clone(),
                problems,
            })
        }
        Verdict::Gpu(error) => return Err(RestoreError::Helper(Box::new(error))),
        Verdict::Unresumed { root, error } => {
            // CRIU has let go of the (stopped) tree once it has answered.
            let _ = swrk.finish();
            gate::kill_unresumed(root);
            return Err(RestoreError::Helper(Box::new(error)));
        }
    }
    let pid = result.map_err(|error| match pid_taken(error) {
        RestoreError::Criu(error) => advise(error, &manifest, opts.criu_config.is_some()),
        other => other,
    })?;
    // CRIU lets a restore succeed whose action script failed at pre-resume or
    // post-resume (scripts come only from --criu-config): the user must hear of it.
    let failed_script = opts
        .criu_config
        .as_deref()
        .and_then(|config| swrk.script_failure(&log, Some(config)));
    if let Some(failure) = failed_script {
        let mut text = format!(
            "{}; CRIU does not fail a restore for it and resumed the tree",
            failure.describe()
        );
        if !work.is_private() {
            text.push_str(&format!(": see {}", log.display()));
        }
        progress.warn(&text);
    }
    swrk.finish()?;
    progress.event("criu-done", "restored");
    let gpu = match gpu {
        Some(gpu) => {
            let (stats, mut timings) = gpu
                .finish()
                .map_err(|e| RestoreError::Helper(Box::new(e)))?;
            for t in &mut timings {
                t.start_ms = t.start_ms.map(|ms| ms + helper_clock_ms);
                t.end_ms = t.end_ms.map(|ms| ms + helper_clock_ms);
            }
            Some((stats, timings))
        }
        None => None,
    };
    if lazy.is_some() {
        progress.event("lazy-serving", "memory served on demand");
    }
    Ok(RestoreOutcome {
        pid,
        manifest,
        gpu,
        lazy: lazy.map(|server| crate::lazy::Serving::new(server, lazy_log, image_lock)),
    })
}

/// `GPUCR_LAZY_STAGING`: with `--lazy`, whether a device restore that reads the
/// processes' own memory (CUDA's host staging) has that memory brought in first
/// (`fill`, the default) or reads it as it comes (`lazy`: faults served by gpucr,
/// for measuring whether a driver copes with memory registered with a userfaultfd).
pub const ENV_LAZY_STAGING: &str = "GPUCR_LAZY_STAGING";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LazyStaging {
    Fill,
    Lazy,
}

fn lazy_staging() -> Result<LazyStaging, RestoreError> {
    match std::env::var(ENV_LAZY_STAGING) {
        Err(_) => Ok(LazyStaging::Fill),
        Ok(v) => match v.trim() {
            "" | "fill" => Ok(LazyStaging::Fill),
            "lazy" => Ok(LazyStaging::Lazy),
            _ => Err(RestoreError::LazyStaging { value: v }),
        },
    }
}

/// Wait for the restored root (a child of this process) and return the exit code a
/// shell would show for it: its status, or 128 + the signal that killed it.
pub fn wait_for_tree(pid: i32) -> std::io::Result<u8> {
    let tree = Pid::from_raw(pid);
    // SIGINT/SIGTERM that reach gpucr while it waits are the tree's: passed on as they
    // come, from the signal thread, while this one blocks in waitpid. SIGHUP is not: a
    // lost terminal must not end a job restored in the foreground (its own session does
    // not get the terminal's SIGHUP either).
    let _forward = interrupt::on_each_signal(move |signal| {
        if signal == libc::SIGHUP {
            return;
        }
        if let Ok(signal) = nix::sys::signal::Signal::try_from(signal) {
            let _ = nix::sys::signal::kill(tree, signal);
        }
    });
    loop {
        match waitpid(tree, None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code as u8),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(128u8.wrapping_add(signal as u8)),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
