//! The state of one dump or restore that every answer to the plugin shares ([`Shared`]),
//! each side's own ([`DumpSide`], [`RestoreSide`]), and the small steps they all take
//! with it: a lock, the writer or restorer still running, a backend call timed on the
//! helper's clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::lifecycle::{DumpTasks, RestoreTasks};
use super::operation::ProcessMemory;
use super::timeline::Timeline;
use super::HelperError;
use crate::cancel::Cancel;
use crate::gpu::{Backend, Operation, TaskDevice};
use crate::transfer::{DumpWriter, Restorer};

/// One operation's state as the control plane serves it: what both sides share and the
/// state of its own side ([`DumpSide`] or [`RestoreSide`]).
pub(super) struct Served<S> {
    pub(super) shared: Shared,
    pub(super) side: S,
}

/// The state of a dump's helper.
pub struct DumpSide {
    pub(super) writer: RwLock<Option<DumpWriter>>,
    /// The devices of the tasks the gpucr half took over, by host pid.
    pub(super) devices: Mutex<BTreeMap<i32, TaskDevice>>,
    /// Every task of the tree and where it is, and where the tree is as a whole.
    pub(super) tasks: Mutex<DumpTasks>,
    /// Whether the tree lives on after a successful dump.
    pub(super) leave_running: bool,
    /// Whether a tree that lives on after a successful dump keeps its devices as the
    /// dump left them until asked (`Helper::defer_give_back`).
    pub(super) defer_give_back: std::sync::atomic::AtomicBool,
    /// Where the writer writes and how: a tree that lives on after its device memory
    /// left the GPUs gets it back from there.
    pub(super) image: (std::path::PathBuf, crate::transfer::TransferConfig),
}

impl DumpSide {
    /// A dump through `writer` into `image`; with `leave_running` the tree lives on.
    pub(super) fn new(
        writer: DumpWriter,
        image: (std::path::PathBuf, crate::transfer::TransferConfig),
        leave_running: bool,
    ) -> DumpSide {
        DumpSide {
            writer: RwLock::new(Some(writer)),
            devices: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(DumpTasks::default()),
            leave_running,
            defer_give_back: std::sync::atomic::AtomicBool::new(false),
            image,
        }
    }
}

/// The state of a restore's helper.
pub struct RestoreSide {
    pub(super) restorer: RwLock<Option<Restorer>>,
    pub(super) devices: Vec<TaskDevice>,
    /// Where each task is.
    pub(super) tasks: Mutex<RestoreTasks>,
    pub(super) parallel: bool,
    /// Engine mode: a task's buffers are filled before its RESTORE_EXT_FILE returns
    /// (the last hook whose failure CRIU honours), though streamed from the start.
    pub(super) fill_at_hand_over: bool,
    /// On-demand restore: brings a task's own memory in before a resume that reads it.
    pub(super) process_memory: Option<ProcessMemory>,
}

impl RestoreSide {
    /// A restore of `devices` from `restorer`.
    pub(super) fn new(
        restorer: Restorer,
        devices: Vec<TaskDevice>,
        parallel: bool,
        fill_at_hand_over: bool,
        process_memory: Option<ProcessMemory>,
    ) -> RestoreSide {
        // A task without device files gets its buffers at RESUME_DEVICES_LATE
        // ([`Backend::resume_sinks`]), none through BuffersReady.
        let tasks = RestoreTasks::new(devices.iter().map(|t| {
            let fileless = t.device_files.is_empty();
            let attached_early = if fileless { 0 } else { t.buffers.len() };
            (t.ns_pid, attached_early, fileless)
        }));
        RestoreSide {
            restorer: RwLock::new(Some(restorer)),
            devices,
            tasks: Mutex::new(tasks),
            parallel,
            fill_at_hand_over,
            process_memory,
        }
    }

    /// A task's buffers are filled before its BuffersReady is answered (no parallel
    /// restore, or engine mode).
    pub(super) fn fill_before_answer(&self) -> bool {
        !self.parallel || self.fill_at_hand_over
    }
}

/// An engine step (engine mode only) for the engine helper's main thread, which answers
/// it on `reply`: Ok, or the error the plugin fails its hook with.
#[derive(Debug)]
pub struct EngineCall {
    pub step: gpucr_abi::proto::engine_step::Step,
    /// CRIU's result (DUMP_DONE).
    pub ret: i32,
    pub reply: std::sync::mpsc::Sender<Result<(), String>>,
}

/// One request of the plugin being answered: the operation's state ([`Shared`], which
/// it derefs to) and the request's cancellation token. Every change an answer makes to
/// the operation's state goes through [`Answering::live`], and every backend call
/// starts with [`Answering::check`]: once the request is given up, its answer changes
/// nothing and calls nothing more.
pub(super) struct Answering<'a> {
    pub(super) shared: &'a Shared,
    pub(super) cancel: &'a Cancel,
}

impl std::ops::Deref for Answering<'_> {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        self.shared
    }
}

impl Answering<'_> {
    /// Run `change` of the operation's state unless the request was given up.
    pub(super) fn live<T>(&self, change: impl FnOnce() -> T) -> Result<T, HelperError> {
        Ok(self.cancel.live(change)?)
    }

    /// Ok unless the request was given up.
    pub(super) fn check(&self) -> Result<(), HelperError> {
        Ok(self.cancel.check()?)
    }
}

pub(super) struct Shared {
    /// Engine mode: where engine steps go (see [`super::Helper::engine_steps`]).
    pub(super) engine: Mutex<Option<std::sync::mpsc::Sender<EngineCall>>>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) timeline: Arc<Mutex<Timeline>>,
    /// How long one device step (a driver call, a task taken over) may take.
    pub(super) device_timeout: Duration,
    /// The first failure, reported again when the command asks for the outcome.
    pub(super) failure: Mutex<Option<HelperError>>,
    /// The operation's token, from the command: the requests that carry the operation
    /// forward are answered under children of it ([`Shared::token_for`]).
    pub(super) operation: Cancel,
}

impl Shared {
    pub(super) fn new(
        backend: Arc<dyn Backend>,
        timeline: Arc<Mutex<Timeline>>,
        device_timeout: Duration,
        operation: Cancel,
    ) -> Shared {
        Shared {
            engine: Mutex::new(None),
            backend,
            timeline,
            device_timeout,
            failure: Mutex::new(None),
            operation,
        }
    }

    /// The token `req` is answered under. The steps that carry the operation forward
    /// (pausing, checkpointing and taking over tasks, their files and buffers; a
    /// restore's files and buffers) end when the operation is cancelled. The steps that
    /// give a task its device back, or come once the restored tree is whole
    /// (RESUME_DEVICES_LATE comes after post-restore, when a signal is for the restored
    /// tree), the end of a dump, engine steps and logs, are cancelled only by the
    /// control plane: a Ctrl-C must not leave a job without its GPU.
    pub(super) fn token_for(&self, req: &gpucr_abi::proto::Request) -> Cancel {
        use gpucr_abi::proto::request::Kind;
        match &req.kind {
            Some(
                Kind::PauseDevices(_)
                | Kind::CheckpointDevices(_)
                | Kind::DumpBuffers(_)
                | Kind::DumpFile(_)
                | Kind::TreeThreads(_)
                | Kind::CheckpointTree(_)
                | Kind::RestoreFile(_)
                | Kind::BuffersReady(_),
            ) => self.operation.child(),
            Some(
                Kind::DumpFinished(_)
                | Kind::ResumeDevices(_)
                | Kind::ResumeFailed(_)
                | Kind::RestoreThread(_)
                | Kind::ResumeTreeThreads(_)
                | Kind::ResumeTree(_)
                | Kind::EngineStep(_)
                | Kind::Log(_)
                | Kind::Connect(_),
            )
            | None => Cancel::new(),
        }
    }

    /// Keep `e` unless an earlier failure is kept already.
    pub(super) fn fail(&self, e: HelperError) {
        lock(&self.failure).get_or_insert(e);
    }
}

/// The writer or restorer a slot holds until its dump or restore (`what`) is finished,
/// or the error of a request that comes after.
pub(super) fn running<'a, T>(slot: &'a Option<T>, what: &str) -> Result<&'a T, HelperError> {
    slot.as_ref()
        .ok_or_else(|| HelperError::Failed(format!("{what} already finished")))
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run one backend operation, timed on the helper's clock; its log entry when it
/// succeeded (a failed one fails the dump, which keeps no log).
pub(super) fn timed<T>(
    shared: &Answering<'_>,
    name: &str,
    operation: impl FnOnce() -> Result<T, crate::gpu::GpuError>,
) -> Result<(T, Operation), HelperError> {
    shared.check()?;
    let start_ms = lock(&shared.timeline).ms();
    let started = Instant::now();
    let value = operation()?;
    Ok((
        value,
        Operation {
            name: name.into(),
            start_ms,
            duration_ms: started.elapsed().as_secs_f64() * 1e3,
            result: "ok".into(),
        },
    ))
}
