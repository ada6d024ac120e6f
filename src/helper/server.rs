//! The helper's socket server and its per-task bookkeeping.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use gpucr_abi::proto::{request, Reply, Request};
use gpucr_abi::PLUGIN_NAME;

use super::HelperError;
use crate::gpu::{Backend, DeviceFile, DeviceRole, Operation, TaskDevice, TaskTiming};
use crate::transfer::{BufferKey, DumpWriter, Event, EventSink, GpuStats, Restorer};

/// What a dump's helper collected.
#[derive(Debug)]
pub struct DumpOutcome {
    pub tasks: Vec<TaskDevice>,
    pub stats: GpuStats,
}

/// Per-task progress, fed by the transfer engine's events.
#[derive(Debug, Default)]
pub struct Timeline {
    started: Option<Instant>,
    tasks: BTreeMap<u32, (TaskTiming, usize)>,
}

impl Timeline {
    fn ms(&self) -> f64 {
        self.started
            .map(|s| s.elapsed().as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    }

    fn begin(&mut self, ns_pid: u32, buffers: usize, bytes: u64) {
        let at = self.ms();
        let entry = self.tasks.entry(ns_pid).or_insert_with(|| {
            (
                TaskTiming {
                    ns_pid,
                    ..Default::default()
                },
                0,
            )
        });
        entry.0.start_ms.get_or_insert(at);
        entry.0.bytes += bytes;
        entry.1 += buffers;
        if entry.1 == 0 {
            entry.0.end_ms.get_or_insert(at);
        }
    }

    fn buffer_done(&mut self, key: BufferKey) {
        let at = self.ms();
        if let Some((timing, remaining)) = self.tasks.get_mut(&key.task) {
            *remaining = remaining.saturating_sub(1);
            if *remaining == 0 {
                timing.end_ms = Some(at);
            }
        }
    }
}

enum Mode {
    Dump {
        writer: RwLock<Option<DumpWriter>>,
        /// Devices found by CHECKPOINT_DEVICES, by host pid.
        tasks: Mutex<BTreeMap<i32, TaskDevice>>,
        /// Every pid CHECKPOINT_DEVICES was called for (the tree).
        tree: Mutex<Vec<i32>>,
        /// What the plugin half sent for a task that is not adopted yet, by host pid.
        pending: Mutex<HashMap<i32, Pending>>,
        /// Whether the tree lives on after a successful dump.
        leave_running: bool,
    },
    Restore {
        restorer: RwLock<Option<Restorer>>,
        tasks: Vec<TaskDevice>,
        /// Host pid of each restored task that asked for its device (SO_PEERCRED).
        peers: Mutex<HashMap<i32, usize>>,
        /// The tasks whose device is back (RESUME_DEVICES_LATE done).
        resumed: Mutex<std::collections::HashSet<usize>>,
        parallel: bool,
    },
}

struct Shared {
    backend: Arc<dyn Backend>,
    mode: Mode,
    timeline: Arc<Mutex<Timeline>>,
    /// The first failure, reported again when the command asks for the outcome.
    failure: Mutex<Option<HelperError>>,
}

/// A running helper.
pub struct Helper {
    shared: Arc<Shared>,
    /// Serves the plugins; stopped (every connection closed) when the helper is dropped.
    _control: super::control::ControlPlane,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper").finish_non_exhaustive()
    }
}

/// The event sink that keeps a timeline, plus an extra consumer (progress display).
pub fn timeline_events(extra: EventSink) -> (EventSink, Arc<Mutex<Timeline>>) {
    let timeline = Arc::new(Mutex::new(Timeline {
        started: Some(Instant::now()),
        ..Default::default()
    }));
    let t = timeline.clone();
    let sink: EventSink = Arc::new(move |event| {
        if let Event::BufferDone(key) = event {
            t.lock().unwrap_or_else(|e| e.into_inner()).buffer_done(key);
        }
        extra(event);
    });
    (sink, timeline)
}

impl Helper {
    /// Serve a dump: buffers found by CHECKPOINT_DEVICES go to `writer`.
    pub fn start_dump(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        writer: DumpWriter,
        timeline: Arc<Mutex<Timeline>>,
        leave_running: bool,
    ) -> Result<Helper, HelperError> {
        let mode = Mode::Dump {
            writer: RwLock::new(Some(writer)),
            tasks: Mutex::new(BTreeMap::new()),
            tree: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            leave_running,
        };
        Self::start(connector, backend, mode, timeline)
    }

    /// Serve a restore of `tasks` from `restorer`. Without `parallel`, a task's buffers
    /// are filled before RESTORE_EXT_FILE returns (the CRIU 4.1 way).
    pub fn start_restore(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        restorer: Restorer,
        tasks: Vec<TaskDevice>,
        parallel: bool,
        timeline: Arc<Mutex<Timeline>>,
    ) -> Result<Helper, HelperError> {
        let mode = Mode::Restore {
            restorer: RwLock::new(Some(restorer)),
            tasks,
            peers: Mutex::new(HashMap::new()),
            resumed: Mutex::new(std::collections::HashSet::new()),
            parallel,
        };
        Self::start(connector, backend, mode, timeline)
    }

    /// Serve the plugins that connect through `connector` (the helper's end of the
    /// socketpair whose other end CRIU inherited).
    fn start(
        connector: OwnedFd,
        backend: Arc<dyn Backend>,
        mode: Mode,
        timeline: Arc<Mutex<Timeline>>,
    ) -> Result<Helper, HelperError> {
        let io_err = |source: std::io::Error| HelperError::Io {
            path: "the helper connector".into(),
            source,
        };
        let shared = Arc::new(Shared {
            backend,
            mode,
            timeline,
            failure: Mutex::new(None),
        });
        let s = shared.clone();
        let handler: super::control::Handler =
            Arc::new(move |req, fds, peer| answer(&s, req, fds, peer));
        let control = super::control::ControlPlane::start(connector, handler).map_err(io_err)?;
        Ok(Helper {
            shared,
            _control: control,
        })
    }

    /// Dump: wait until every buffer handed over is in the image, then finish the
    /// image's GPU part. Called at CRIU's post-dump, before the tree is let go.
    pub fn finish_dump(&self) -> Result<DumpOutcome, HelperError> {
        self.check_failure()?;
        let Mode::Dump { writer, tasks, .. } = &self.shared.mode else {
            return Err(HelperError::Failed(
                "finish_dump on a restore helper".into(),
            ));
        };
        let writer = writer
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| HelperError::Failed("the dump was already finished".into()))?;
        let stats = writer.finish()?;
        let timings = self.timings();
        let tasks = tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .map(|mut task| {
                if let Some(t) = timings.iter().find(|t| t.ns_pid == task.ns_pid) {
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
        Ok(DumpOutcome { tasks, stats })
    }

    /// Restore: wait until every buffer of every task is written. Called at CRIU's
    /// post-restore, before any restored task runs.
    pub fn wait_restored(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        let Mode::Restore {
            restorer, tasks, ..
        } = &self.shared.mode
        else {
            return Err(HelperError::Failed("wait_restored on a dump helper".into()));
        };
        let keys: Vec<BufferKey> = tasks.iter().flat_map(task_keys).collect();
        let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
        let restorer = guard
            .as_ref()
            .ok_or_else(|| HelperError::Failed("restore already finished".into()))?;
        restorer.wait(&keys)?;
        Ok(())
    }

    /// Restore: every task's device is back (RESUME_DEVICES_LATE went through for each);
    /// asked at CRIU's pre-resume, while the tasks are still stopped.
    pub fn check_resumed(&self) -> Result<(), HelperError> {
        self.check_failure()?;
        let Mode::Restore { tasks, resumed, .. } = &self.shared.mode else {
            return Err(HelperError::Failed("check_resumed on a dump helper".into()));
        };
        let resumed = resumed.lock().unwrap_or_else(|e| e.into_inner());
        match (0..tasks.len()).find(|i| !resumed.contains(i)) {
            None => Ok(()),
            Some(i) => Err(HelperError::Failed(format!(
                "task {} was not brought back on its device (RESUME_DEVICES_LATE did not \
                 go through for it)",
                tasks[i].ns_pid
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

    /// When each task's device memory moved.
    pub fn timings(&self) -> Vec<TaskTiming> {
        let t = self
            .shared
            .timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
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
        self.shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// Run one backend operation, timed on the helper's clock; its log entry when it
/// succeeded (a failed one fails the dump, which keeps no log).
fn timed<T>(
    shared: &Shared,
    name: &str,
    operation: impl FnOnce() -> Result<T, crate::gpu::GpuError>,
) -> Result<(T, Operation), crate::gpu::GpuError> {
    let start_ms = shared
        .timeline
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ms();
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

/// Add `pid` to the dump's tree (once).
fn remember(tree: &Mutex<Vec<i32>>, pid: i32) {
    let mut tree = tree.lock().unwrap_or_else(|e| e.into_inner());
    if !tree.contains(&pid) {
        tree.push(pid);
    }
}

/// A task's state and buffer fds as they arrive from the plugin half, and the
/// operations done for it before it was adopted.
#[derive(Default)]
struct Pending {
    /// format, state, how many buffer fds follow.
    collected: Option<(String, Vec<u8>, usize)>,
    fds: Vec<OwnedFd>,
    operations: Vec<Operation>,
}

impl Pending {
    fn complete(&self) -> bool {
        self.collected
            .as_ref()
            .is_some_and(|(_, _, count)| self.fds.len() >= *count)
    }
}

/// Every fd of `pid`'s buffers is in: the gpucr half takes the task over and its
/// buffers start moving into the image.
fn adopt(shared: &Shared, pid: i32) -> Result<(), HelperError> {
    let Mode::Dump {
        writer,
        tasks,
        pending,
        ..
    } = &shared.mode
    else {
        return Err(HelperError::Failed("adopt on a restore helper".into()));
    };
    let Some(task) = pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&pid)
    else {
        return Ok(());
    };
    let Some((format, state, count)) = task.collected else {
        return Ok(());
    };
    if task.fds.len() != count {
        return Err(HelperError::Failed(format!(
            "pid {pid}: {count} buffer fds announced, {} received",
            task.fds.len()
        )));
    }
    let (found, checkpoint) = timed(shared, "checkpoint", || {
        shared.backend.adopt_task(pid, &format, &state, task.fds)
    })?;
    let Some(found) = found else {
        return Ok(());
    };
    let mut device = found.device;
    device.operations = task.operations;
    device.operations.push(checkpoint);
    let bytes = device.buffers.iter().map(|b| b.size).sum();
    shared
        .timeline
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .begin(device.ns_pid, device.buffers.len(), bytes);
    {
        let guard = writer.read().unwrap_or_else(|e| e.into_inner());
        let writer = guard
            .as_ref()
            .ok_or_else(|| HelperError::Failed("dump already finished".into()))?;
        for (i, source) in found.sources.into_iter().enumerate() {
            writer.add(BufferKey::new(device.ns_pid, i as u32), source)?;
        }
    }
    tasks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid, device);
    Ok(())
}

fn task_keys(task: &TaskDevice) -> impl Iterator<Item = BufferKey> + '_ {
    (0..task.buffers.len()).map(move |i| BufferKey::new(task.ns_pid, i as u32))
}

/// Answer one request; the first error is kept for the command to report.
fn answer(shared: &Shared, req: Request, fds: Vec<OwnedFd>, peer: i32) -> Reply {
    match handle(shared, req, fds, peer) {
        Ok(reply) => reply,
        Err(e) => {
            let text = e.to_string();
            shared
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
            refuse(&text)
        }
    }
}

fn ok() -> Reply {
    Reply {
        ok: true,
        ..Default::default()
    }
}

fn refuse(error: &str) -> Reply {
    Reply {
        ok: false,
        error: error.to_owned(),
        ..Default::default()
    }
}

fn handle(
    shared: &Shared,
    req: Request,
    fds: Vec<OwnedFd>,
    peer: i32,
) -> Result<Reply, HelperError> {
    let Some(kind) = req.kind else {
        return Ok(refuse("empty request"));
    };
    match (&shared.mode, kind) {
        (Mode::Dump { pending, tree, .. }, request::Kind::PauseDevices(r)) => {
            remember(tree, r.pid);
            let ((), pause) = timed(shared, "pause", || shared.backend.pre_freeze(r.pid))?;
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.entry(r.pid).or_default().operations.push(pause);
            Ok(ok())
        }
        (Mode::Dump { tree, pending, .. }, request::Kind::CheckpointDevices(r)) => {
            remember(tree, r.pid);
            let ready = {
                let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
                let task = pending.entry(r.pid).or_default();
                if task.collected.is_some() {
                    return Ok(refuse("CheckpointDevices twice for one task"));
                }
                task.collected = Some((r.format, r.state, r.buffer_count as usize));
                task.fds.extend(fds);
                task.complete()
            };
            if ready {
                adopt(shared, r.pid)?;
            }
            Ok(ok())
        }
        (Mode::Dump { pending, .. }, request::Kind::DumpBuffers(r)) => {
            let ready = {
                let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
                let Some(task) = pending.get_mut(&r.pid) else {
                    return Ok(refuse("DumpBuffers before CheckpointDevices"));
                };
                if r.first_index as usize != task.fds.len() {
                    return Ok(refuse("DumpBuffers out of order"));
                }
                task.fds.extend(fds);
                task.complete()
            };
            if ready {
                adopt(shared, r.pid)?;
            }
            Ok(ok())
        }
        (Mode::Dump { tasks, tree, .. }, request::Kind::DumpFile(r)) => {
            let Some(fd) = fds.first() else {
                return Ok(refuse("DumpFile without its fd"));
            };
            let candidates = tree.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let Some(owner) = shared.backend.file_owner(fd.as_fd(), &candidates)? else {
                return Ok(Reply {
                    ok: true,
                    owned: false,
                    ..Default::default()
                });
            };
            let mut tasks = tasks.lock().unwrap_or_else(|e| e.into_inner());
            let Some(task) = tasks.get_mut(&owner) else {
                return Ok(Reply {
                    ok: true,
                    owned: false,
                    ..Default::default()
                });
            };
            let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            task.device_files.push(DeviceFile {
                id: r.id,
                role: DeviceRole::Device,
                path,
            });
            Ok(Reply {
                ok: true,
                owned: true,
                plugin_name: PLUGIN_NAME.into(),
                ..Default::default()
            })
        }
        (Mode::Restore { tasks, peers, .. }, request::Kind::RestoreFile(r)) => {
            let Some(index) = tasks.iter().position(|t| t.has_file(r.id)) else {
                // Not a device gpucr carried: let other plugins have it.
                return Ok(refuse(""));
            };
            let spec = shared.backend.restore_spec(&tasks[index])?;
            // Checked before CRIU started too; the plugin confines every path again.
            crate::gpu::check_confined(&spec)
                .map_err(|e| HelperError::Failed(format!("task {}: {e}", tasks[index].ns_pid)))?;
            peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(peer, index);
            Ok(Reply {
                ok: true,
                device: Some(spec),
                ..Default::default()
            })
        }
        (
            Mode::Restore {
                restorer,
                tasks,
                parallel,
                ..
            },
            request::Kind::BuffersReady(r),
        ) => {
            let Some(index) = tasks.iter().position(|t| t.has_file(r.id)) else {
                return Ok(refuse("BuffersReady for a file gpucr does not carry"));
            };
            let task = &tasks[index];
            let first = r.first_index as usize;
            if first + fds.len() > task.buffers.len() {
                return Ok(refuse("more buffers than the task has"));
            }
            let bytes = task.buffers[first..first + fds.len()]
                .iter()
                .map(|b| b.size)
                .sum();
            shared
                .timeline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .begin(task.ns_pid, fds.len(), bytes);
            let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
            let restorer = guard
                .as_ref()
                .ok_or_else(|| HelperError::Failed("restore already finished".into()))?;
            let mut keys = Vec::with_capacity(fds.len());
            for (j, fd) in fds.into_iter().enumerate() {
                let key = BufferKey::new(task.ns_pid, (first + j) as u32);
                restorer.attach(
                    key,
                    shared.backend.buffer_sink(task, first + j, File::from(fd)),
                )?;
                keys.push(key);
            }
            if !parallel {
                restorer.wait(&keys)?;
            }
            Ok(ok())
        }
        (
            Mode::Restore {
                restorer,
                tasks,
                peers,
                resumed,
                ..
            },
            request::Kind::ResumeDevices(r),
        ) => {
            let index = peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&r.pid)
                .copied();
            let Some(index) = index else { return Ok(ok()) };
            let keys: Vec<BufferKey> = task_keys(&tasks[index]).collect();
            {
                let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
                if let Some(restorer) = guard.as_ref() {
                    restorer.wait(&keys)?;
                }
            }
            shared.backend.resume_task(r.pid, &tasks[index])?;
            resumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(index);
            Ok(ok())
        }
        (
            Mode::Dump {
                tree,
                leave_running,
                ..
            },
            request::Kind::DumpFinished(r),
        ) => {
            if !*leave_running && r.ret == 0 {
                return Ok(ok());
            }
            // The tree lives on: every task gets its device back, even if one fails.
            let pids = tree.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut first_error = None;
            for pid in pids {
                if let Err(e) = shared.backend.after_dump(pid) {
                    first_error.get_or_insert(e);
                }
            }
            match first_error {
                Some(e) => Err(e.into()),
                None => Ok(ok()),
            }
        }
        (_, request::Kind::Log(_)) => Ok(ok()),
        (_, other) => Ok(refuse(&format!(
            "unexpected request {other:?} in this phase"
        ))),
    }
}
