//! Engine mode's dump: the helper `gpucr dump` runs, driven by the plugin's engine
//! steps instead of CRIU's notifications (which go to the engine, not to gpucr).
//!
//! * CHECKPOINT_DEVICES (every task, tree frozen): the copy of each task's device memory
//!   starts, as under `gpucr dump`.
//! * FINISH_COPY, at the first device file CRIU dumps (for a backend whose tasks keep
//!   no device file, CUDA's, at the last task's CHECKPOINT_DEVICES): every copy is
//!   waited for, the device state written, and the manifest's room taken: what `gpucr
//!   dump` does at post-dump, which an engine's CRIU does not tell gpucr of, through
//!   the same [`PostDump`]. A failure
//!   fails that hook, so CRIU's dump fails and the tree runs on. (CRIU ignores what its
//!   plugins' exit hook returns: neither can be left to the end.)
//! * DUMP_DONE, from the plugin's exit hook: the image's files are checksummed and the
//!   manifest written into its room, which completes the image; after a failed dump the
//!   image is marked incomplete instead.
//!
//! The tree always gets its devices back after the dump (CRIU does not tell its plugins
//! whether it will kill the tree or leave it running).

use std::os::fd::OwnedFd;
use std::path::Path;

use gpucr_abi::proto::engine_step::Step;

use super::events::{events, Event};
use super::{criu_version, log_step, EngineError, EngineSettings, StatusPipe, LAST_REPLY_LIMIT};
use crate::dump::{is_pages_file, write_manifest, DumpDevices, ImageFacts, PostDump};
use crate::gpu;
use crate::helper::{EngineCall, GpuDump, Session};
use crate::image::room;
use crate::image::{dir, follow::Follower, manifest};
use crate::progress::Progress;

/// Serve the dump of the tree rooted at `args.pid` into `args.images_dir`.
pub fn serve(
    args: &super::EngineRun,
    connector: OwnedFd,
    status: &mut StatusPipe,
) -> Result<(), EngineError> {
    let settings = EngineSettings::from_env()?;
    let pid = args.pid.unwrap_or(0);
    let dir = args.images_dir.as_path();
    let setup = gpu::DumpSetup {
        freeze_timeout: None,
        cuda_staging: None,
        images_dir: Some(dir.to_path_buf()),
    };
    let Some(backend) = gpu::detect(pid, &setup)? else {
        status.none();
        return Ok(());
    };
    let target = crate::target::validate(pid).map_err(crate::dump::DumpError::from)?;
    let mut topology = Some(gpu::LocalTopology::start(backend.as_ref()));
    let mut progress = Progress::silent();
    let gpu = GpuDump::start(
        Session::engine(connector, backend.name()),
        dir,
        backend.clone(),
        settings.transfer.clone(),
        progress.gpu_events(),
        true,
        crate::helper::StepControl {
            device_timeout: settings.device_timeout,
            // Nothing cancels an engine run from outside: CRIU's end stops the helper,
            // and with it every request (the control plane cancels them).
            operation: crate::cancel::Cancel::new(),
        },
    )?;
    let steps = events(gpu.engine_steps(), args.criu_pid);
    let mut follower =
        (!settings.no_page_checksums).then(|| Follower::start(dir.to_path_buf(), is_pages_file));
    let criu_version = criu_version(args.criu_pid);
    status.ready(backend.name());

    let mut post = PostDump::new(dir, Some(&gpu as &dyn DumpDevices));
    loop {
        let call = match steps.recv() {
            Ok(Event::Step(call)) => call,
            Ok(Event::CriuGone) | Err(_) => {
                // CRIU went away without the plugin's last step.
                let _ = dir::mark_incomplete(dir, "CRIU stopped before the dump finished");
                return Ok(());
            }
        };
        let EngineCall { step, ret, reply } = call;
        let started = std::time::Instant::now();
        match step {
            Step::FinishCopy => {
                // CRIU has not written every task's memory yet: the tree's processes
                // stand in for it ([`room::needed_for_tree`]).
                let answer = post
                    .finish_copy()
                    .and_then(|()| {
                        post.take_room(|gpu_bytes| room::needed_for_tree(dir, gpu_bytes, pid))
                    })
                    .map_err(|e| e.to_string());
                if let Err(e) = &answer {
                    let _ = dir::mark_incomplete(dir, e);
                }
                log_step(step, started, &answer);
                let _ = reply.send(answer);
            }
            Step::DumpDone => {
                let answer = if ret != 0 {
                    let _ = dir::mark_incomplete(dir, &format!("CRIU's dump failed ({ret})"));
                    Ok(())
                } else {
                    post.finish_copy()
                        .map_err(|e| e.to_string())
                        .and_then(|()| {
                            // Every task's device files: CRIU dumped the later tasks' files
                            // after FINISH_COPY.
                            let (finished, room) = post.take_parts();
                            let finished = finished.map(|m| gpu.with_late_files(m));
                            let still_written = written_by_criu(args.criu_pid, dir);
                            if !still_written.is_empty() {
                                crate::errln!(
                                    "gpucr engine-helper: left out of the manifest, as CRIU \
                                 still writes them: {}",
                                    still_written.join(", ")
                                );
                            }
                            let facts = ImageFacts {
                                target: target.clone(),
                                criu_version: criu_version.clone(),
                                options: engine_options(settings.no_page_checksums),
                                gpu: finished.as_ref().zip(topology.take()).map(|(m, t)| (t, m)),
                                room,
                                still_written,
                            };
                            let known = follower.take().map(Follower::finish).unwrap_or_default();
                            write_manifest(dir, &known, facts, &mut progress)
                                .map(|_| ())
                                .map_err(|e| e.to_string())
                        })
                };
                if let Err(e) = &answer {
                    let _ = dir::mark_incomplete(dir, e);
                }
                log_step(step, started, &answer);
                let _ = reply.send(answer);
                gpu.drain_replies(LAST_REPLY_LIMIT);
                return Ok(());
            }
            Step::RestoreDone => {
                let _ = reply.send(Err("RESTORE_DONE during a dump".into()));
            }
        }
    }
}

/// The files of the image directory `dir` CRIU (`criu_pid`) has open for writing while
/// its plugin's exit hook runs, as paths relative to `dir`: its log, when CRIU keeps it
/// there (CRIU's default work directory is the image directory), which CRIU goes on
/// writing after the hook; it has closed its images by then.
fn written_by_criu(criu_pid: i32, dir: &Path) -> Vec<String> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    gpucr_abi::procfs::files_open_for_writing(criu_pid)
        .into_iter()
        .filter_map(|file| {
            file.strip_prefix(&dir)
                .ok()
                .map(|rel| rel.to_string_lossy().into_owned())
        })
        .collect()
}

/// The dump options the manifest records: the engine's CRIU was configured by the
/// engine, and restores with its own options; these are CRIU's defaults.
fn engine_options(no_page_checksums: bool) -> manifest::DumpOptions {
    manifest::DumpOptions {
        leave_running: false,
        flags: crate::criu::CriuFlags::default(),
        network_lock: "iptables".into(),
        mount_namespace: true,
        criu_config: None,
        set_by_engine: true,
        no_page_checksums,
    }
}
