//! The state of one dump or restore that every answer to the plugin shares ([`Shared`],
//! [`Mode`]), and the small steps they all take with it: a lock, the writer or restorer
//! still running, a backend call timed on the helper's clock.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::lifecycle::{DumpTasks, RestoreTasks};
use super::timeline::Timeline;
use super::HelperError;
use crate::cancel::Cancel;
use crate::gpu::{Backend, Operation, TaskDevice};
use crate::transfer::{DumpWriter, Restorer};

pub(super) enum Mode {
    Dump {
        writer: RwLock<Option<DumpWriter>>,
        /// The devices of the tasks the gpucr half took over, by host pid.
        devices: Mutex<BTreeMap<i32, TaskDevice>>,
        /// Every task of the tree and where it is.
        tasks: Mutex<DumpTasks>,
        /// Whether the tree lives on after a successful dump.
        leave_running: bool,
        /// Whether the whole tree was paused at the first PAUSE_DEVICES.
        tree_paused: AtomicBool,
        /// The image is complete (post-dump went through): CRIU kills the tree unless
        /// it is left running. CRIU's DumpFinished comes after post-dump, and its
        /// result does not tell a post-dump that failed.
        kept: AtomicBool,
        /// Where the writer writes and how: a tree that lives on after its device
        /// memory left the GPUs gets it back from there.
        image: (std::path::PathBuf, crate::transfer::TransferConfig),
    },
    Restore {
        restorer: RwLock<Option<Restorer>>,
        devices: Vec<TaskDevice>,
        /// Where each task is.
        tasks: Mutex<RestoreTasks>,
        parallel: bool,
        /// Engine mode: a task's buffers are filled before its RESTORE_EXT_FILE returns
        /// (the last hook whose failure CRIU honours), though streamed from the start.
        fill_at_hand_over: bool,
    },
}

impl Mode {
    /// A dump through `writer` into `image`; with `leave_running` the tree lives on.
    pub(super) fn dump(
        writer: DumpWriter,
        image: (std::path::PathBuf, crate::transfer::TransferConfig),
        leave_running: bool,
    ) -> Mode {
        Mode::Dump {
            writer: RwLock::new(Some(writer)),
            devices: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(DumpTasks::default()),
            leave_running,
            tree_paused: AtomicBool::new(false),
            kept: AtomicBool::new(false),
            image,
        }
    }

    /// A restore of `devices` from `restorer`.
    pub(super) fn restore(
        restorer: Restorer,
        devices: Vec<TaskDevice>,
        parallel: bool,
        fill_at_hand_over: bool,
    ) -> Mode {
        // A task without device files gets its buffers at RESUME_DEVICES_LATE
        // ([`Backend::resume_sinks`]), none through BuffersReady.
        let tasks = RestoreTasks::new(devices.iter().map(|t| {
            let fileless = t.device_files.is_empty();
            let attached_early = if fileless { 0 } else { t.buffers.len() };
            (t.ns_pid, attached_early, fileless)
        }));
        Mode::Restore {
            restorer: RwLock::new(Some(restorer)),
            devices,
            tasks: Mutex::new(tasks),
            parallel,
            fill_at_hand_over,
        }
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
    pub(super) mode: Mode,
    pub(super) timeline: Arc<Mutex<Timeline>>,
    /// How long one device step (a driver call, a task taken over) may take.
    pub(super) device_timeout: Duration,
    /// The first failure, reported again when the command asks for the outcome.
    pub(super) failure: Mutex<Option<HelperError>>,
    /// Dump: why a tree that lives on may not have all its devices back (the first
    /// failure of the end of the dump), whatever failed before it.
    pub(super) give_back_failure: Mutex<Option<String>>,
}

impl Shared {
    pub(super) fn new(
        backend: Arc<dyn Backend>,
        mode: Mode,
        timeline: Arc<Mutex<Timeline>>,
        device_timeout: Duration,
    ) -> Shared {
        Shared {
            engine: Mutex::new(None),
            backend,
            mode,
            timeline,
            device_timeout,
            failure: Mutex::new(None),
            give_back_failure: Mutex::new(None),
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
