//! The helper of one dump ([`DumpHelper`]) or one restore ([`RestoreHelper`]) and the
//! dispatch of the plugin's requests: the requests every helper answers here, the rest
//! to its side's answers (`dump_answers::answer`, `restore_answers::answer`), which
//! refuse the other side's. Each answer moves a task through its lifecycle
//! (`lifecycle`), calls the backend and feeds the transfer engine.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpucr_abi::proto::{request, Reply, Request};

use super::control::{Abandoned, ControlPlane, Handler};
use super::lifecycle::DumpStage;
use super::operation::ProcessMemory;
use super::reply::{ok, refuse};
use super::resume::task_keys;
use super::shared::{lock, running, Answering, DumpSide, EngineCall, RestoreSide, Served, Shared};
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

impl Handler for Served<DumpSide> {
    fn answer(&self, req: Request, fds: Vec<OwnedFd>, _peer: i32, cancel: &Cancel) -> Reply {
        answer(&self.shared, cancel, req, |shared, kind| {
            dump_answers::answer(shared, &self.side, kind, fds)
        })
    }

    fn progress(&self) -> u64 {
        progress(&self.shared)
    }

    fn time_limit(&self, req: &Request) -> Option<Duration> {
        time_limit(&self.shared, req)
    }

    fn abandoned(&self, peer: i32, what: &'static str, why: Abandoned, cancel: &Cancel) {
        abandoned(&self.shared, peer, what, why, cancel);
    }

    fn token_for(&self, req: &Request) -> Cancel {
        self.shared.token_for(req)
    }
}

impl Handler for Served<RestoreSide> {
    fn answer(&self, req: Request, fds: Vec<OwnedFd>, peer: i32, cancel: &Cancel) -> Reply {
        answer(&self.shared, cancel, req, |shared, kind| {
            restore_answers::answer(shared, &self.side, kind, fds, peer)
        })
    }

    fn progress(&self) -> u64 {
        progress(&self.shared)
    }

    fn time_limit(&self, req: &Request) -> Option<Duration> {
        match &req.kind {
            // Filled before the answer: bounded by the copies' own failures.
            Some(request::Kind::BuffersReady(_)) => (self.side.parallel
                && !self.side.fill_at_hand_over)
                .then_some(self.shared.device_timeout),
            _ => time_limit(&self.shared, req),
        }
    }

    fn abandoned(&self, peer: i32, what: &'static str, why: Abandoned, cancel: &Cancel) {
        abandoned(&self.shared, peer, what, why, cancel);
    }

    fn token_for(&self, req: &Request) -> Cancel {
        self.shared.token_for(req)
    }
}

/// Answer `req`: the requests every helper answers here, the others by `side` (the
/// answers of the helper's side). A failure is kept and refuses the request.
fn answer(
    shared: &Shared,
    cancel: &Cancel,
    req: Request,
    side: impl FnOnce(&Answering<'_>, request::Kind) -> Result<Reply, HelperError>,
) -> Reply {
    let answering = Answering { shared, cancel };
    let answered = match req.kind {
        None => Ok(refuse("empty request")),
        Some(request::Kind::EngineStep(step)) => engine_step(&answering, step),
        Some(request::Kind::RestoreThread(r)) => restore_thread(&answering, r.pid),
        Some(request::Kind::Log(_)) => Ok(ok()),
        Some(kind) => side(&answering, kind),
    };
    match answered {
        Ok(reply) => reply,
        Err(e) => {
            let text = e.to_string();
            shared.fail(e);
            refuse(&text)
        }
    }
}

fn progress(shared: &Shared) -> u64 {
    lock(&shared.timeline).moved.load(Ordering::Relaxed)
}

/// The time limit of a request, but a restore's BuffersReady.
fn time_limit(shared: &Shared, req: &Request) -> Option<Duration> {
    match &req.kind {
        // Wait for the copy engines: bounded by their own failures and the
        // operation's end, not by a device step's time.
        Some(request::Kind::ResumeDevices(_) | request::Kind::ResumeTree(_)) => None,
        // Waits for every copy (FINISH_COPY) or checksums the image (DUMP_DONE).
        Some(request::Kind::EngineStep(_)) => None,
        _ => Some(shared.device_timeout),
    }
}

fn abandoned(shared: &Shared, peer: i32, what: &'static str, why: Abandoned, cancel: &Cancel) {
    // Recorded first: the answer left running fails with "given up" once the token
    // is cancelled, and only the first failure is kept.
    shared.fail(match why {
        Abandoned::PeerGone => HelperError::PluginGone { what, peer },
        Abandoned::TimedOut(_) => {
            HelperError::Failed(format!("{what} (plugin in pid {peer}): {why}"))
        }
    });
    cancel.cancel(why.to_string());
}

/// How a helper's steps are bounded: how long one device step may take, and the
/// operation's token (the command's, or a child of it), under which the requests that
/// carry the operation forward are answered.
#[derive(Debug, Clone)]
pub struct StepControl {
    pub device_timeout: Duration,
    pub operation: Cancel,
}

/// A running helper of one side ([`DumpSide`] or [`RestoreSide`]): it answers only
/// that side's requests, and has only that side's methods.
pub struct Helper<S> {
    served: Arc<Served<S>>,
    /// Serves the plugins; stopped (every connection closed) when the helper is dropped.
    control: ControlPlane,
}

/// The helper of a dump.
pub type DumpHelper = Helper<DumpSide>;

/// The helper of a restore.
pub type RestoreHelper = Helper<RestoreSide>;

impl<S> std::fmt::Debug for Helper<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper").finish_non_exhaustive()
    }
}

/// Serve the plugins that connect through `connector` (the helper's end of the
/// socketpair whose other end CRIU inherited).
fn start<S>(connector: OwnedFd, served: Served<S>) -> Result<Helper<S>, HelperError>
where
    Served<S>: Handler,
{
    let io_err = |source: std::io::Error| HelperError::Io {
        path: "the helper connector".into(),
        source,
    };
    let served = Arc::new(served);
    let control = ControlPlane::start(connector, served.clone()).map_err(io_err)?;
    Ok(Helper { served, control })
}

impl Helper<DumpSide> {
    /// Serve a dump: buffers found by CHECKPOINT_DEVICES go to `writer`.
    pub fn start_dump(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        writer: DumpWriter,
        image: (std::path::PathBuf, crate::transfer::TransferConfig),
        timeline: Arc<Mutex<Timeline>>,
        leave_running: bool,
        steps: StepControl,
    ) -> Result<DumpHelper, HelperError> {
        let served = Served {
            shared: Shared::new(backend, timeline, steps.device_timeout, steps.operation),
            side: DumpSide::new(writer, image, leave_running),
        };
        start(connector, served)
    }

    /// Wait until every buffer handed over is in the image, then finish the image's GPU
    /// part. Called at CRIU's post-dump, before the tree is let go.
    pub fn finish_dump(&self) -> Result<DumpOutcome, HelperError> {
        self.check_failure()?;
        let DumpSide {
            writer,
            devices,
            tasks,
            ..
        } = &self.served.side;
        {
            let tasks = lock(tasks);
            let unfinished = tasks
                .pids()
                .into_iter()
                .find_map(|pid| match tasks.stage(pid) {
                    // A zombie of the tree: CRIU pauses it but dumps it without
                    // CHECKPOINT_DEVICES (it has no memory, and no device).
                    Some(DumpStage::PausedAhead | DumpStage::Paused { .. })
                        if !crate::target::is_running(pid) =>
                    {
                        None
                    }
                    Some(
                        stage @ (DumpStage::PausedAhead
                        | DumpStage::Paused { .. }
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

    /// The device files recorded so far, by task (namespace pid). DUMP_EXT_FILE goes on
    /// after [`Helper::finish_dump`] when that runs before CRIU has dumped every task's
    /// files (engine mode).
    pub fn device_files(&self) -> BTreeMap<u32, Vec<DeviceFile>> {
        lock(&self.served.side.devices)
            .values()
            .map(|t| (t.ns_pid, t.device_files.clone()))
            .collect()
    }

    /// The image is complete (post-dump went through, the device state is written), so
    /// at DumpFinished, unless the tree is left running, what the backend still holds
    /// of the device memory is let go instead of given back.
    pub fn keep_dump(&self) {
        lock(&self.served.side.tasks).keep();
    }

    /// A dump that succeeded and leaves its tree living on (stopped, `gpucr migrate
    /// --post-copy`) leaves the tree's devices as it made them: the backend's give-back
    /// would write into memory the image leaves in the tree. [`Helper::give_back_deferred`]
    /// gives them back should the tree run on here; a tree killed needs none. Asked
    /// before the dump ends.
    pub fn defer_give_back(&self) {
        self.served
            .side
            .defer_give_back
            .store(true, Ordering::SeqCst);
    }

    /// The give-back the dump deferred, for a tree that runs again: every task the
    /// backend touched gets its device and memory back (a Ctrl-C does not stop it: a
    /// job must not be left without its GPU). Ok(false) when none was deferred.
    pub fn give_back_deferred(&self) -> Result<bool, HelperError> {
        let cancel = Cancel::new();
        let shared = Answering {
            shared: &self.served.shared,
            cancel: &cancel,
        };
        dump_answers::give_back_deferred(&shared, &self.served.side)
    }

    /// Why the tree, which lives on, may not have all its devices back, if the end of
    /// the dump failed (a driver's restore or unlock, AMD's UNPAUSE). Kept apart from
    /// [`Helper::take_failure`], which holds the dump's first failure.
    pub fn give_back_failure(&self) -> Option<String> {
        lock(&self.served.side.tasks)
            .give_back_failure()
            .map(str::to_owned)
    }
}

impl Helper<RestoreSide> {
    /// Serve a restore of `devices` from `restorer`. Without `parallel`, a task's buffers
    /// are filled before RESTORE_EXT_FILE returns (the CRIU 4.1 way).
    pub fn start_restore(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        restorer: Restorer,
        devices: Vec<TaskDevice>,
        (parallel, fill_at_hand_over, process_memory): (bool, bool, Option<ProcessMemory>),
        timeline: Arc<Mutex<Timeline>>,
        steps: StepControl,
    ) -> Result<RestoreHelper, HelperError> {
        let served = Served {
            shared: Shared::new(backend, timeline, steps.device_timeout, steps.operation),
            side: RestoreSide::new(
                restorer,
                devices,
                parallel,
                fill_at_hand_over,
                process_memory,
            ),
        };
        start(connector, served)
    }

    /// Wait until every buffer of every task is written. Called at CRIU's post-restore,
    /// before any restored task runs.
    pub fn wait_restored(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        let RestoreSide {
            restorer, devices, ..
        } = &self.served.side;
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

    /// Every task's device is back (RESUME_DEVICES_LATE went through for each); asked at
    /// CRIU's pre-resume, while the tasks are still stopped.
    pub fn check_resumed(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        match lock(&self.served.side.tasks).first_not_resumed() {
            None => Ok(()),
            Some((ns_pid, stage)) => Err(HelperError::Device(format!(
                "task {ns_pid} was not brought back on its device: it is {} \
                 (RESUME_DEVICES_LATE did not go through for it)",
                stage.name()
            ))),
        }
    }

    /// Close the image and return the transfer statistics.
    pub fn finish_restore(&self) -> Result<GpuStats, HelperError> {
        let restorer = self
            .served
            .side
            .restorer
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| HelperError::Failed("restore already finished".into()))?;
        Ok(restorer.finish()?)
    }
}

impl<S> Helper<S> {
    /// Engine mode: the engine steps the plugin asks for, in order (before this is
    /// called, the helper refuses them).
    pub fn engine_steps(&self) -> std::sync::mpsc::Receiver<EngineCall> {
        let (tx, rx) = std::sync::mpsc::channel();
        *lock(&self.served.shared.engine) = Some(tx);
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
        let t = lock(&self.served.shared.timeline);
        t.tasks.values().map(|(timing, _)| timing.clone()).collect()
    }

    fn check_failure(&self) -> Result<(), HelperError> {
        match self.take_failure() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// The first error the helper answered the plugin with, if any (taken: asked once).
    pub fn take_failure(&self) -> Option<HelperError> {
        lock(&self.served.shared.failure).take()
    }
}

/// RESTORE_THREAD: the backend's restore thread of `pid`, which CRIU must let run.
fn restore_thread(shared: &Answering<'_>, pid: i32) -> Result<Reply, HelperError> {
    shared.check()?;
    let tid = shared.backend.restore_thread(pid, shared.cancel)?;
    Ok(Reply {
        ok: true,
        run_thread: tid.unwrap_or(0),
        ..Default::default()
    })
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
