//! The GPU side of one dump or restore: the private session directory with the plugin,
//! the helper serving it, and the transfer engine behind the helper. `dump/` and
//! `restore/` drive it; what it produces and reads is the manifest's
//! [`GpuManifest`] (`crate::gpu`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{timeline_events, DumpHelper, HelperError, RestoreHelper, Session, StepControl};
use crate::cancel::Cancel;
use crate::gpu::{Backend, GpuManifest, TaskDevice, TaskTiming};
use crate::transfer::{
    BufferKey, Canceller, DumpWriter, EventSink, GpuStats, Restorer, TransferConfig,
};

/// Cancel the transfer behind `canceller` when `operation` is cancelled, with its
/// reason.
fn cancels(operation: &Cancel, canceller: Canceller) {
    operation.when_cancelled(move |why| canceller.cancel(&why.0));
}

/// The GPU side of a dump.
#[derive(Debug)]
pub struct GpuDump {
    helper: DumpHelper,
    _session: Session,
    backend: &'static str,
}

impl GpuDump {
    /// Start the helper of `session` for a dump into `dir` (its `gpu/` part); with
    /// `leave_running` the tree lives on after the dump. `operation`, the command's
    /// token, cancels the copy and the helper's steps that carry the dump forward.
    pub fn start(
        mut session: Session,
        dir: &Path,
        backend: Arc<dyn Backend>,
        config: TransferConfig,
        progress: EventSink,
        leave_running: bool,
        steps: StepControl,
    ) -> Result<GpuDump, HelperError> {
        let operation = &steps.operation;
        let (events, timeline) = timeline_events(progress);
        let writer = DumpWriter::start(dir, config.clone(), events)?;
        cancels(operation, writer.canceller());
        let name = backend.name();
        let helper = DumpHelper::start_dump(
            session.take_helper_end()?,
            backend,
            writer,
            (dir.to_path_buf(), config),
            timeline,
            leave_running,
            steps.clone(),
        )?;
        Ok(GpuDump {
            _session: session,
            helper,
            backend: name,
        })
    }

    /// What went wrong in the helper, if anything did (e.g. the disk filled up while it
    /// wrote): a better explanation than CRIU's own failure that followed.
    pub fn take_failure(&self) -> Option<HelperError> {
        self.helper.take_failure()
    }

    /// Why the tree, which lives on, may not have all its devices back (see
    /// [`DumpHelper::give_back_failure`]).
    pub fn give_back_failure(&self) -> Option<String> {
        self.helper.give_back_failure()
    }

    /// Leave the tree's devices as the dump made them once it succeeds, until
    /// [`GpuDump::give_back_deferred`] (see [`DumpHelper::defer_give_back`]).
    pub fn defer_give_back(&self) {
        self.helper.defer_give_back();
    }

    /// The give-back the dump deferred, for a tree that runs again (see
    /// [`DumpHelper::give_back_deferred`]).
    pub fn give_back_deferred(&self) -> Result<bool, HelperError> {
        self.helper.give_back_deferred()
    }

    /// Engine mode: the engine steps the plugin asks for.
    pub fn engine_steps(&self) -> std::sync::mpsc::Receiver<super::EngineCall> {
        self.helper.engine_steps()
    }

    /// Engine mode: wait (at most `limit`) until the answer to the plugin's last step
    /// has been sent (see [`super::Helper::drain_replies`]).
    pub fn drain_replies(&self, limit: std::time::Duration) -> bool {
        self.helper.drain_replies(limit)
    }

    /// `manifest` (from [`GpuDump::finish`]) with every device file CRIU has dumped
    /// since.
    pub fn with_late_files(&self, mut manifest: GpuManifest) -> GpuManifest {
        let files = self.helper.device_files();
        for task in &mut manifest.tasks {
            if let Some(f) = files.get(&task.ns_pid) {
                task.device_files = f.clone();
            }
        }
        manifest
    }

    /// The image is complete: the tree may lose its device memory (see
    /// [`DumpHelper::keep_dump`]).
    pub fn keep(&self) {
        self.helper.keep_dump();
    }

    /// Wait for every copy and close the image's GPU part (at CRIU's post-dump, before
    /// the tree is let go).
    pub fn finish(&self) -> Result<GpuManifest, HelperError> {
        let outcome = self.helper.finish_dump()?;
        Ok(GpuManifest {
            backend: self.backend.to_owned(),
            tasks: outcome.tasks,
            stats: outcome.stats,
            timings: self.helper.timings(),
        })
    }
}

/// The GPU side of a restore.
#[derive(Debug)]
pub struct GpuRestore {
    helper: RestoreHelper,
    _session: Session,
    operation: Cancel,
}

/// How the GPU side of a restore runs.
#[derive(Debug, Clone)]
pub struct RestoreSettings {
    pub transfer: TransferConfig,
    /// The engine starts reading, verifying and decompressing at once, before any
    /// buffer exists, and fills each buffer while CRIU restores the rest.
    pub parallel: bool,
    /// How long one device step may take.
    pub device_timeout: Duration,
    /// Engine mode: each task's buffers are filled before its RESTORE_EXT_FILE returns.
    pub fill_at_hand_over: bool,
    /// On-demand restore (`--lazy`): what brings a task's own memory in before a
    /// resume that reads it ([`crate::gpu::Backend::resume_reads_process_memory`]).
    pub process_memory: Option<ProcessMemory>,
}

/// Brings a restored task's own CPU memory in, and waits until it is, given the task's
/// pid in the image: on-demand restore's (`crate::lazy`), called at RESUME_DEVICES_LATE
/// before the backend's resume of a task whose device memory was staged in it. Its
/// error says why the memory could not be brought in.
#[derive(Clone)]
pub struct ProcessMemory(pub Arc<FillTask>);

/// [`ProcessMemory`]'s function: the task's pid in the image, the step's cancellation.
pub type FillTask = dyn Fn(u32, &Cancel) -> Result<(), String> + Send + Sync;

impl std::fmt::Debug for ProcessMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessMemory")
    }
}

impl GpuRestore {
    /// Open the image's GPU part and start the helper. `operation`, the command's token
    /// (or a child of it the restore detaches once the tree is whole), cancels the
    /// copies and the helper's steps that carry the restore forward.
    pub fn start(
        mut session: Session,
        dir: &Path,
        manifest: &GpuManifest,
        backend: Arc<dyn Backend>,
        settings: RestoreSettings,
        progress: EventSink,
        operation: &Cancel,
    ) -> Result<GpuRestore, HelperError> {
        let RestoreSettings {
            transfer: config,
            parallel,
            device_timeout,
            fill_at_hand_over,
            process_memory,
        } = settings;
        let (events, timeline) = timeline_events(progress);
        let restorer = Restorer::open(dir, config, parallel, events)?;
        check_buffers_match(&restorer, &manifest.tasks)?;
        cancels(operation, restorer.canceller());
        let helper = RestoreHelper::start_restore(
            session.take_helper_end()?,
            backend,
            restorer,
            manifest.tasks.clone(),
            (parallel, fill_at_hand_over, process_memory),
            timeline,
            StepControl {
                device_timeout,
                operation: operation.clone(),
            },
        )?;
        Ok(GpuRestore {
            _session: session,
            helper,
            operation: operation.clone(),
        })
    }

    /// The restored tree is whole and verified (post-restore was answered): from now
    /// on a cancellation of the command (a signal, which is now for the restored tree)
    /// no longer reaches the restore's copies, when `operation` was a child of the
    /// command's token.
    pub fn tree_whole(&self) {
        self.operation.detach();
    }

    /// What went wrong in the helper, if anything did (a damaged chunk found while a task
    /// handed over its buffers makes RESTORE_EXT_FILE, and so CRIU, fail).
    pub fn take_failure(&self) -> Option<HelperError> {
        self.helper.take_failure()
    }

    /// Engine mode: the engine steps the plugin asks for.
    pub fn engine_steps(&self) -> std::sync::mpsc::Receiver<super::EngineCall> {
        self.helper.engine_steps()
    }

    /// Engine mode: wait (at most `limit`) until the answer to the plugin's last step
    /// has been sent (see [`super::Helper::drain_replies`]).
    pub fn drain_replies(&self, limit: std::time::Duration) -> bool {
        self.helper.drain_replies(limit)
    }

    /// Every task's device is back (at CRIU's pre-resume, tasks still stopped).
    pub fn check_resumed(&self) -> Result<(), HelperError> {
        self.helper.check_resumed()
    }

    /// Wait until every buffer is restored (at CRIU's post-restore, before any restored
    /// task runs).
    pub fn wait_restored(&self) -> Result<(), HelperError> {
        self.helper.wait_restored()
    }

    /// Close the image; the transfer statistics and per-task timings.
    pub fn finish(&self) -> Result<(GpuStats, Vec<TaskTiming>), HelperError> {
        let stats = self.helper.finish_restore()?;
        Ok((stats, self.helper.timings()))
    }
}

/// The manifest's buffer table and the GPU index must describe the same buffers.
fn check_buffers_match(restorer: &Restorer, tasks: &[TaskDevice]) -> Result<(), HelperError> {
    let in_index: std::collections::BTreeMap<BufferKey, u64> =
        restorer.buffers().into_iter().collect();
    for task in tasks {
        for (i, b) in task.buffers.iter().enumerate() {
            let key = BufferKey::new(task.ns_pid, i as u32);
            match in_index.get(&key) {
                Some(&len) if len == b.size => {}
                Some(&len) => {
                    return Err(HelperError::Failed(format!(
                        "buffer {key} is {} bytes in gpucr.json but {len} in gpu/index",
                        b.size
                    )))
                }
                None => {
                    return Err(HelperError::Failed(format!(
                        "buffer {key} of gpucr.json is missing from gpu/index"
                    )))
                }
            }
        }
    }
    Ok(())
}
