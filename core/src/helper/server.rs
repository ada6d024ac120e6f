//! The helper of one dump or restore ([`Helper`]) and the dispatch of the plugin's
//! requests to their answers (`dump_answers`, `restore_answers`): each moves a task
//! through its lifecycle (`lifecycle`), calls the backend and feeds the transfer engine.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpucr_abi::proto::{request, Reply, Request};

use super::control::{Abandoned, ControlPlane, Handler};
use super::lifecycle::DumpStage;
use super::reply::{ok, refuse};
use super::resume::task_keys;
use super::shared::{lock, running, Answering, EngineCall, Mode, Shared};
use super::timeline::Timeline;
use super::{dump_answers, restore_answers, HelperError};
use crate::cancel::Cancel;
use crate::gpu::{Backend, DeviceFile, Operation, TaskDevice, TaskTiming};
use crate::transfer::{BufferKey, DumpWriter, GpuStats, Restorer};

/// What a dump's helper collected.
#[derive(Debug)]
pub struct DumpOutcome {
    pub tasks: Vec<TaskDevice>,
    pub stats: GpuStats,
}

impl Handler for Shared {
    fn answer(&self, req: Request, fds: Vec<OwnedFd>, peer: i32, cancel: &Cancel) -> Reply {
        let answering = Answering {
            shared: self,
            cancel,
        };
        match handle(&answering, req, fds, peer) {
            Ok(reply) => reply,
            Err(e) => {
                let text = e.to_string();
                self.fail(e);
                refuse(&text)
            }
        }
    }

    fn progress(&self) -> u64 {
        lock(&self.timeline).moved.load(Ordering::Relaxed)
    }

    fn time_limit(&self, req: &Request) -> Option<Duration> {
        match (&self.mode, &req.kind) {
            // Wait for the copy engines: bounded by their own failures and the
            // operation's end, not by a device step's time.
            (_, Some(request::Kind::ResumeDevices(_) | request::Kind::ResumeTree(_))) => None,
            // Waits for every copy (FINISH_COPY) or checksums the image (DUMP_DONE).
            (_, Some(request::Kind::EngineStep(_))) => None,
            (
                Mode::Restore {
                    parallel,
                    fill_at_hand_over,
                    ..
                },
                Some(request::Kind::BuffersReady(_)),
            ) => (*parallel && !*fill_at_hand_over).then_some(self.device_timeout),
            _ => Some(self.device_timeout),
        }
    }

    fn abandoned(&self, peer: i32, what: &'static str, why: Abandoned, cancel: &Cancel) {
        // Recorded first: the answer left running fails with "given up" once the token
        // is cancelled, and only the first failure is kept.
        self.fail(HelperError::Failed(format!(
            "{what} (plugin in pid {peer}): {why}"
        )));
        cancel.cancel(why.to_string());
    }
}

/// A running helper.
pub struct Helper {
    shared: Arc<Shared>,
    /// Serves the plugins; stopped (every connection closed) when the helper is dropped.
    control: ControlPlane,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper").finish_non_exhaustive()
    }
}

impl Helper {
    /// Serve a dump: buffers found by CHECKPOINT_DEVICES go to `writer`.
    pub fn start_dump(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        writer: DumpWriter,
        image: (std::path::PathBuf, crate::transfer::TransferConfig),
        timeline: Arc<Mutex<Timeline>>,
        leave_running: bool,
        device_timeout: Duration,
    ) -> Result<Helper, HelperError> {
        let mode = Mode::dump(writer, image, leave_running);
        Self::start(connector, backend, mode, timeline, device_timeout)
    }

    /// Serve a restore of `devices` from `restorer`. Without `parallel`, a task's buffers
    /// are filled before RESTORE_EXT_FILE returns (the CRIU 4.1 way).
    pub fn start_restore(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        restorer: Restorer,
        devices: Vec<TaskDevice>,
        (parallel, fill_at_hand_over): (bool, bool),
        timeline: Arc<Mutex<Timeline>>,
        device_timeout: Duration,
    ) -> Result<Helper, HelperError> {
        let mode = Mode::restore(restorer, devices, parallel, fill_at_hand_over);
        Self::start(connector, backend, mode, timeline, device_timeout)
    }

    /// Serve the plugins that connect through `connector` (the helper's end of the
    /// socketpair whose other end CRIU inherited).
    fn start(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        mode: Mode,
        timeline: Arc<Mutex<Timeline>>,
        device_timeout: Duration,
    ) -> Result<Helper, HelperError> {
        let io_err = |source: std::io::Error| HelperError::Io {
            path: "the helper connector".into(),
            source,
        };
        let shared = Arc::new(Shared::new(backend, mode, timeline, device_timeout));
        let control = ControlPlane::start(connector, shared.clone()).map_err(io_err)?;
        Ok(Helper { shared, control })
    }

    /// Dump: wait until every buffer handed over is in the image, then finish the
    /// image's GPU part. Called at CRIU's post-dump, before the tree is let go.
    pub fn finish_dump(&self) -> Result<DumpOutcome, HelperError> {
        self.check_failure()?;
        let Mode::Dump {
            writer,
            devices,
            tasks,
            ..
        } = &self.shared.mode
        else {
            return Err(HelperError::Failed(
                "finish_dump on a restore helper".into(),
            ));
        };
        {
            let tasks = lock(tasks);
            let unfinished = tasks
                .pids()
                .into_iter()
                .find_map(|pid| match tasks.stage(pid) {
                    // A zombie of the tree: CRIU pauses it but dumps it without
                    // CHECKPOINT_DEVICES (it has no memory, and no device).
                    Some(DumpStage::Paused) if !crate::target::is_running(pid) => None,
                    Some(
                        stage @ (DumpStage::Paused
                        | DumpStage::Collecting { .. }
                        | DumpStage::Adopting),
                    ) => Some((pid, stage.name())),
                    _ => None,
                });
            if let Some((pid, stage)) = unfinished {
                return Err(HelperError::Failed(format!(
                    "pid {pid} is still {stage} at the end of the dump"
                )));
            }
        }
        let writer = writer
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| HelperError::Failed("the dump was already finished".into()))?;
        let stats = writer.finish()?;
        let timings = self.timings();
        let devices = lock(devices)
            .values()
            .cloned()
            .map(|mut task| {
                let logged = task.operations.iter().any(|o| o.name == "copy");
                if let Some(t) = timings
                    .iter()
                    .find(|t| t.ns_pid == task.ns_pid)
                    .filter(|_| !logged)
                {
                    let start_ms = t.start_ms.unwrap_or(0.0);
                    task.operations.push(Operation {
                        name: "copy".into(),
                        start_ms,
                        duration_ms: t.end_ms.unwrap_or(start_ms) - start_ms,
                        result: "ok".into(),
                    });
                }
                task
            })
            .collect();
        Ok(DumpOutcome {
            tasks: devices,
            stats,
        })
    }

    /// Dump: the device files recorded so far, by task (namespace pid). DUMP_EXT_FILE
    /// goes on after [`Helper::finish_dump`] when that runs before CRIU has dumped
    /// every task's files (engine mode).
    pub fn device_files(&self) -> BTreeMap<u32, Vec<DeviceFile>> {
        let Mode::Dump { devices, .. } = &self.shared.mode else {
            return BTreeMap::new();
        };
        lock(devices)
            .values()
            .map(|t| (t.ns_pid, t.device_files.clone()))
            .collect()
    }

    /// Dump: the image is complete (post-dump went through, the device state is
    /// written), so at DumpFinished, unless the tree is left running, what the backend
    /// still holds of the device memory is let go instead of given back.
    pub fn keep_dump(&self) {
        if let Mode::Dump { kept, .. } = &self.shared.mode {
            kept.store(true, Ordering::SeqCst);
        }
    }

    /// Restore: wait until every buffer of every task is written. Called at CRIU's
    /// post-restore, before any restored task runs.
    pub fn wait_restored(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        let Mode::Restore {
            restorer, devices, ..
        } = &self.shared.mode
        else {
            return Err(HelperError::Failed("wait_restored on a dump helper".into()));
        };
        // The buffers of tasks without device files only exist at RESUME_DEVICES_LATE,
        // after post-restore: each is waited for there.
        let keys: Vec<BufferKey> = devices
            .iter()
            .filter(|t| !t.device_files.is_empty())
            .flat_map(task_keys)
            .collect();
        let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
        running(&guard, "restore")?.wait(&keys)?;
        Ok(())
    }

    /// Restore: every task's device is back (RESUME_DEVICES_LATE went through for each);
    /// asked at CRIU's pre-resume, while the tasks are still stopped.
    pub fn check_resumed(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        let Mode::Restore { tasks, .. } = &self.shared.mode else {
            return Err(HelperError::Failed("check_resumed on a dump helper".into()));
        };
        match lock(tasks).first_not_resumed() {
            None => Ok(()),
            Some((ns_pid, stage)) => Err(HelperError::Device(format!(
                "task {ns_pid} was not brought back on its device: it is {} \
                 (RESUME_DEVICES_LATE did not go through for it)",
                stage.name()
            ))),
        }
    }

    /// Restore: close the image and return the transfer statistics.
    pub fn finish_restore(&self) -> Result<GpuStats, HelperError> {
        let Mode::Restore { restorer, .. } = &self.shared.mode else {
            return Err(HelperError::Failed(
                "finish_restore on a dump helper".into(),
            ));
        };
        let restorer = restorer
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| HelperError::Failed("restore already finished".into()))?;
        Ok(restorer.finish()?)
    }

    /// Engine mode: the engine steps the plugin asks for, in order (before this is
    /// called, the helper refuses them).
    pub fn engine_steps(&self) -> std::sync::mpsc::Receiver<EngineCall> {
        let (tx, rx) = std::sync::mpsc::channel();
        *lock(&self.shared.engine) = Some(tx);
        rx
    }

    /// Wait (at most `limit`) until every request received so far has been answered
    /// and the answer sent: engine mode's last step is answered after the engine
    /// helper decided to end, which must not cut that answer off.
    pub fn drain_replies(&self, limit: Duration) -> bool {
        self.control.drain(limit)
    }

    /// When each task's device memory moved.
    pub fn timings(&self) -> Vec<TaskTiming> {
        let t = lock(&self.shared.timeline);
        t.tasks.values().map(|(timing, _)| timing.clone()).collect()
    }

    fn check_failure(&self) -> Result<(), HelperError> {
        match self.take_failure() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Dump: why the tree, which lives on, may not have all its devices back, if the end
    /// of the dump failed (a driver's restore or unlock, AMD's UNPAUSE). Kept apart from
    /// [`Helper::take_failure`], which holds the dump's first failure.
    pub fn give_back_failure(&self) -> Option<String> {
        lock(&self.shared.give_back_failure).clone()
    }

    /// The first error the helper answered the plugin with, if any (taken: asked once).
    pub fn take_failure(&self) -> Option<HelperError> {
        lock(&self.shared.failure).take()
    }
}

/// Hand an engine step to the engine helper's main thread and wait for its answer.
fn engine_step(
    shared: &Answering<'_>,
    step: gpucr_abi::proto::EngineStep,
) -> Result<Reply, HelperError> {
    shared.check()?;
    let Some(engine) = lock(&shared.engine).clone() else {
        return Ok(refuse("engine step outside engine mode"));
    };
    let (reply, answer) = std::sync::mpsc::channel();
    let call = EngineCall {
        step: step.step(),
        ret: step.ret,
        reply,
    };
    engine
        .send(call)
        .map_err(|_| HelperError::Failed("the engine helper has stopped".into()))?;
    match answer.recv() {
        Ok(Ok(())) => Ok(ok()),
        Ok(Err(text)) => Err(HelperError::Failed(text)),
        Err(_) => Err(HelperError::Failed(
            "the engine helper stopped before it answered".into(),
        )),
    }
}

fn handle(
    shared: &Answering<'_>,
    req: Request,
    fds: Vec<OwnedFd>,
    peer: i32,
) -> Result<Reply, HelperError> {
    let Some(kind) = req.kind else {
        return Ok(refuse("empty request"));
    };
    if let request::Kind::EngineStep(step) = kind {
        return engine_step(shared, step);
    }
    match (&shared.mode, kind) {
        (
            Mode::Dump {
                tasks, tree_paused, ..
            },
            request::Kind::PauseDevices(r),
        ) => dump_answers::pause_devices(shared, tasks, tree_paused, r.pid),
        (Mode::Dump { tasks, .. }, request::Kind::TreeThreads(_)) => {
            dump_answers::tree_threads(shared, tasks)
        }
        (Mode::Dump { tasks, .. }, request::Kind::CheckpointTree(_)) => {
            dump_answers::checkpoint_tree(shared, tasks)
        }
        (Mode::Dump { tasks, .. }, request::Kind::CheckpointDevices(r)) => {
            dump_answers::checkpoint_devices(shared, tasks, r, fds)
        }
        (Mode::Dump { tasks, .. }, request::Kind::DumpBuffers(r)) => {
            dump_answers::dump_buffers(shared, tasks, r, fds)
        }
        (Mode::Dump { devices, tasks, .. }, request::Kind::DumpFile(r)) => {
            dump_answers::dump_file(shared, devices, tasks, r, fds)
        }
        (Mode::Restore { devices, tasks, .. }, request::Kind::RestoreFile(r)) => {
            restore_answers::restore_file(shared, devices, tasks, r, peer)
        }
        (
            Mode::Restore {
                restorer,
                devices,
                tasks,
                parallel,
                fill_at_hand_over,
            },
            request::Kind::BuffersReady(r),
        ) => restore_answers::buffers_ready(
            shared,
            restorer,
            devices,
            tasks,
            !*parallel || *fill_at_hand_over,
            r,
            fds,
        ),
        (
            Mode::Restore {
                restorer,
                devices,
                tasks,
                ..
            },
            request::Kind::ResumeDevices(r),
        ) => restore_answers::resume_devices(shared, restorer, devices, tasks, r),
        (Mode::Restore { tasks, .. }, request::Kind::ResumeTreeThreads(r)) => {
            restore_answers::resume_tree_threads(shared, tasks, r)
        }
        (
            Mode::Restore {
                restorer,
                devices,
                tasks,
                ..
            },
            request::Kind::ResumeTree(r),
        ) => restore_answers::resume_whole_tree(shared, restorer, devices, tasks, r),
        (Mode::Restore { tasks, .. }, request::Kind::ResumeFailed(r)) => {
            restore_answers::resume_failed(shared, tasks, r)
        }
        (
            Mode::Dump {
                writer,
                tasks,
                leave_running,
                kept,
                image,
                ..
            },
            request::Kind::DumpFinished(r),
        ) => dump_answers::dump_finished(shared, writer, tasks, *leave_running, kept, image, r),
        (_, request::Kind::RestoreThread(r)) => {
            shared.check()?;
            let tid = shared.backend.restore_thread(r.pid)?;
            Ok(Reply {
                ok: true,
                run_thread: tid.unwrap_or(0),
                ..Default::default()
            })
        }
        (_, request::Kind::Log(_)) => Ok(ok()),
        (_, other) => Ok(refuse(&format!(
            "unexpected request {other:?} in this phase"
        ))),
    }
}
