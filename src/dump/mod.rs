//! `gpucr dump`: validate, run CRIU's DUMP, checksum the image, write the manifest last.
//!
//! [`complete`] checksums the image and writes its manifest (also for engine mode's
//! helper), [`error`] says why a dump failed; this module runs CRIU and the GPU helper
//! side by side and answers CRIU's notifications.

use std::path::{Path, PathBuf};

use crate::criu::{
    criu_log_level, start_criu, CommonOptions, ConfigHandover, CriuConfig, DumpRequest, NetworkLock,
};
use crate::gpu;
use crate::helper::{GpuDump, HelperError, Session};
use crate::image::dir;
use crate::image::manifest::{self, Manifest};
use crate::image::room::{self, ManifestRoom};
use crate::image::{self, DUMP_LOG};
use crate::interrupt;
use crate::progress::{describe_notify, Progress};
use crate::target;
use crate::transfer::TransferConfig;

mod complete;
mod error;
mod tree_pages;

pub use complete::{
    gpu_section_bytes, is_gpu_data_file, is_pages_file, write_manifest, ImageFacts,
};
pub use error::DumpError;
use tree_pages::{TreePages, TreePagesOutcome};

/// What to dump and how.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub pid: i32,
    pub dir: PathBuf,
    pub leave_running: bool,
    pub tcp_established: bool,
    pub shell_job: bool,
    pub ext_unix_sk: bool,
    pub file_locks: bool,
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
}

/// A finished dump.
#[derive(Debug, Clone)]
pub struct DumpOutcome {
    pub manifest: Manifest,
    /// Bytes of all image files.
    pub image_bytes: u64,
    /// Bytes of CPU memory pages (pages-*.img).
    pub pages_bytes: u64,
}

/// Checkpoint `opts.pid` into `opts.dir`.
pub fn dump(opts: &DumpOptions, progress: &mut Progress) -> Result<DumpOutcome, DumpError> {
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
    let env = session.as_ref().map(Session::criu_env).unwrap_or_default();
    let handover = criu_config.as_ref().map(CriuConfig::handover).transpose()?;
    let inherit = session
        .as_ref()
        .map(Session::criu_inherit)
        .unwrap_or_default();
    let (mut swrk, version) = start_criu(
        opts.criu.as_deref(),
        &env,
        &inherit,
        handover.as_ref(),
        progress,
    )
    .map_err(|e| DumpError::CriuSetup(Box::new(e)))?;
    let dir_fd = dir::prepare_for_dump(&opts.dir, opts.force)?;
    let gpu = match (backend, session) {
        (Some(backend), Some(session)) => {
            progress.event(
                "helper-started",
                &format!("GPU backend {}: helper started", backend.name()),
            );
            let started = GpuDump::start(
                session,
                &opts.dir,
                backend,
                opts.transfer.clone(),
                progress.gpu_events(),
                opts.leave_running,
                opts.device_timeout,
            );
            Some(started.map_err(|e| DumpError::HelperSetup(Box::new(e)))?)
        }
        _ => None,
    };
    let network_lock = opts
        .network_lock
        .unwrap_or_else(|| NetworkLock::default_for(opts.pid, opts.tcp_established));
    let own_mount_namespace = crate::criu::has_own_mount_namespace(opts.pid);
    let request = DumpRequest {
        pid: opts.pid,
        images_dir: std::os::fd::AsFd::as_fd(&*dir_fd),
        log_file: DUMP_LOG,
        leave_running: opts.leave_running,
        timeout: opts.timeout,
        config_file: handover.as_ref().map(ConfigHandover::criu_path),
        config_origin: opts.criu_config.as_deref(),
        common: CommonOptions {
            tcp_established: opts.tcp_established,
            shell_job: opts.shell_job,
            ext_unix_sk: opts.ext_unix_sk,
            file_locks: opts.file_locks,
            network_lock,
            log_level: criu_log_level(opts.verbose, gpu.is_some()),
            own_mount_namespace,
        },
    };
    let log = opts.dir.join(DUMP_LOG);
    // The memory pages are digested from the tree while CRIU writes them (see
    // `tree_pages`), laid out at post-dump.
    let mut tree_pages =
        (!opts.no_page_checksums).then(|| TreePages::start(opts.pid, opts.dir.clone()));
    let mut page_digests = TreePagesOutcome::default();
    let mut gpu_manifest = None;
    let mut gpu_error = None;
    let mut manifest_room = None;
    let mut room_error = None;
    // A signal cancels the GPU copy at once; the next notification fails the dump.
    let _cancel_on_interrupt = gpu.as_ref().map(|g| {
        let canceller = g.canceller();
        interrupt::on_interrupt(move || canceller.cancel("gpucr was interrupted"))
    });
    let result = swrk.dump(&request, &log, &mut |n| {
        progress.event(&n.script, &describe_notify(&n.script));
        if let Some(signal) = interrupt::requested() {
            return Err(format!("interrupted by {}", interrupt::name(signal)));
        }
        // post-dump comes before CRIU lets the tree go: the device memory must be in the
        // image by then, or the dump fails and the tree keeps running.
        if let (Some(gpu), "post-dump") = (&gpu, n.script.as_str()) {
            match gpu.finish() {
                Ok(m) => {
                    // The tasks' device state goes into the image while the tree is
                    // still held, like the memory: a failure fails the dump.
                    if let Err(source) = image::gpu::write_states(&opts.dir, &m) {
                        let e = HelperError::Io {
                            path: opts.dir.join(image::gpu::STATE_DIR),
                            source,
                        };
                        let text = e.to_string();
                        gpu_error = Some(e);
                        return Err(text);
                    }
                    progress.event("gpu-done", "GPU memory written");
                    gpu.keep();
                    gpu_manifest = Some(m);
                }
                Err(e) => {
                    let text = e.to_string();
                    gpu_error = Some(e);
                    return Err(text);
                }
            }
        }
        // The pages' digests are laid out while the tree is held: what was not read
        // from it yet still can be.
        if n.script == "post-dump" {
            if let Some(pages) = tree_pages.take() {
                page_digests = pages.finish(&opts.dir);
                progress.event(
                    "pages-digested",
                    &format!(
                        "memory pages digested: {} from the tree, {} read back",
                        crate::units::size(page_digests.from_tree),
                        crate::units::size(page_digests.from_files)
                    ),
                );
            }
        }
        // The tree is let go after post-dump (killed, unless --leave-running): the
        // manifest's room is taken while it is held, so that a full file system fails
        // the dump and leaves the tree running instead of losing both.
        if n.script == "post-dump" {
            let gpu_bytes = gpu_manifest.as_ref().map_or(0, gpu_section_bytes);
            match ManifestRoom::take(&opts.dir, room::needed(&opts.dir, gpu_bytes)) {
                Ok(taken) => manifest_room = Some(taken),
                Err(e) => {
                    let text = e.to_string();
                    room_error = Some(e);
                    return Err(text);
                }
            }
        }
        Ok(())
    });
    // Where the tree lives on and the end of the dump could not give it every device
    // back, the user must hear it whatever else failed.
    let running = || {
        let alive = liveness(opts.pid);
        match gpu.as_ref().and_then(GpuDump::give_back_failure) {
            Some(e) => format!("{alive}, but a task may not have its device back: {e}"),
            None => alive,
        }
    };
    if let (Some(signal), true) = (
        interrupt::requested(),
        result.is_err() || gpu_error.is_some(),
    ) {
        let signal = interrupt::name(signal);
        let _ = dir::mark_incomplete(&opts.dir, &format!("interrupted by {signal}"));
        drop(swrk);
        return Err(DumpError::Interrupted {
            signal,
            dir: opts.dir.clone(),
            running: running(),
        });
    }
    if let Some(error) = gpu_error {
        let _ = dir::mark_incomplete(&opts.dir, &error.to_string());
        drop(swrk);
        return Err(DumpError::Helper {
            error: Box::new(error),
            dir: opts.dir.clone(),
            running: running(),
        });
    }
    if let Some(error) = room_error {
        let _ = dir::mark_incomplete(&opts.dir, &error.to_string());
        drop(swrk);
        return Err(DumpError::ManifestRoom {
            error: Box::new(error),
            dir: opts.dir.clone(),
            running: running(),
        });
    }
    // CRIU lets a dump succeed whose action script failed at network-unlock (scripts
    // come only from --criu-config): the user must hear of it.
    let lenient_script = match (&result, &opts.criu_config) {
        (Ok(()), Some(config)) => swrk.script_failure(&log, Some(config)),
        _ => None,
    };
    if let Err(error) = result.and_then(|()| swrk.finish()) {
        let _ = dir::mark_incomplete(&opts.dir, &error.to_string());
        // The helper's own failure (or, when CRIU stopped first, the writer's) explains
        // more than CRIU's.
        let helper_failure = gpu
            .as_ref()
            .and_then(|g| g.take_failure().or_else(|| g.finish().err()));
        if let Some(helper_error) = helper_failure {
            // CRIU gave up because the plugin passed the helper's refusal on: nothing
            // more to say. Any other CRIU failure is shown too.
            let relayed = error
                .plugin_failure()
                .is_some_and(|f| f.contains(&helper_error.to_string()));
            let running = if relayed {
                running()
            } else {
                format!("{}; CRIU then failed too:\n{error}", running())
            };
            return Err(DumpError::Helper {
                error: Box::new(helper_error),
                dir: opts.dir.clone(),
                running,
            });
        }
        let running = match disk_full_hint(&opts.dir)
            .or_else(|| crate::criu::advice_for(&error.to_string()))
        {
            Some(hint) => format!("{}; {hint}", running()),
            None => running(),
        };
        return Err(DumpError::Criu {
            error: Box::new(error),
            dir: opts.dir.clone(),
            running,
        });
    }
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
        tcp_established: opts.tcp_established,
        shell_job: opts.shell_job,
        ext_unix_sk: opts.ext_unix_sk,
        file_locks: opts.file_locks,
        network_lock: network_lock.as_str().into(),
        mount_namespace: own_mount_namespace,
        criu_config: criu_config.map(|c| manifest::CriuConfigRecord {
            file: c.path.display().to_string(),
            options: c.options.iter().map(|o| o.to_line()).collect(),
        }),
        set_by_engine: false,
        no_page_checksums: opts.no_page_checksums,
    };
    let gpu_facts = match (topology.take(), &gpu_manifest) {
        (Some(topology), Some(g)) => Some((topology, g)),
        _ => None,
    };
    let written = write_manifest(
        &opts.dir,
        &page_digests.prefixes,
        ImageFacts {
            target,
            criu_version: version.to_string(),
            options,
            gpu: gpu_facts,
            room: manifest_room,
            still_written: Vec::new(),
        },
        progress,
    )?;
    // The end of the dump ran in CRIU's exit hook, after the image was complete: the
    // gpucr half gave a tree that lives on its devices back, or let go of what it held.
    if let Some(error) = gpu.as_ref().and_then(GpuDump::take_failure) {
        if opts.leave_running {
            return Err(DumpError::GiveBack {
                error: Box::new(error),
                dir: opts.dir.clone(),
                running: liveness(opts.pid),
            });
        }
        progress.warn(&format!("after the dump, the tree killed: {error}"));
    }
    Ok(written)
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
