//! The helper's answers to the plugin's requests during a dump ([`answer`] dispatches
//! them; a restore's request is refused): each moves a task through its lifecycle
//! (`lifecycle`), calls the backend and hands buffers to the transfer engine's writer.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use gpucr_abi::proto::{request, CheckpointDevices, DumpBuffers, DumpFile, DumpFinished, Reply};

use super::dump_tree::{self, copy_held, pause_tree, refill_from_image};
use super::fault::{self, FaultStep};
use super::lifecycle::{Adopt, AdoptOutcome};
use super::parallel::in_parallel;
use super::reply::{not_owned, ok, refuse, unexpected};
use super::shared::{lock, running, timed, Answering, DumpSide};
use super::HelperError;
use crate::gpu::{DeviceFile, TaskDevice};
use crate::transfer::BufferKey;

/// A dump's request of the plugin, answered with `dump`'s state; any other (a
/// restore's) is refused.
pub(super) fn answer(
    shared: &Answering<'_>,
    dump: &DumpSide,
    kind: request::Kind,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    match kind {
        request::Kind::PauseDevices(r) => pause_devices(shared, dump, r.pid),
        request::Kind::TreeThreads(_) => tree_threads(shared, dump),
        request::Kind::CheckpointTree(_) => checkpoint_tree(shared, dump),
        request::Kind::CheckpointDevices(r) => checkpoint_devices(shared, dump, r, fds),
        request::Kind::DumpBuffers(r) => dump_buffers(shared, dump, r, fds),
        request::Kind::DumpFile(r) => dump_file(shared, dump, r, fds),
        request::Kind::DumpFinished(r) => dump_finished(shared, dump, r),
        other => Ok(unexpected(&other)),
    }
}

/// PAUSE_DEVICES for `pid`: the step before the freeze (the whole tree's, at the
/// first one).
pub(super) fn pause_devices(
    shared: &Answering<'_>,
    dump: &DumpSide,
    pid: i32,
) -> Result<Reply, HelperError> {
    let tasks = &dump.tasks;
    if shared.live(|| lock(tasks).pause_tree())? {
        // CRIU pauses the root first, with the tree still running: every task's
        // step before the freeze is taken now. Under `--freeze-cgroup` (runc's
        // CRIU) the other tasks are already frozen by their own PAUSE_DEVICES,
        // and a step that needs the task to run (a driver lock) would time out.
        pause_tree(shared, tasks, pid)?;
    }
    if shared.live(|| lock(tasks).confirm_ahead(pid))? {
        fault::check(FaultStep::Pause)?;
        return Ok(ok());
    }
    let paused = timed(shared, "pause", || {
        shared.backend.pre_freeze(pid, shared.cancel)
    });
    let ((), pause) = paused.inspect_err(|_| {
        let _ = shared.live(|| lock(tasks).pause_failed(pid));
    })?;
    shared.live(|| lock(tasks).paused(pid, pause))??;
    fault::check(FaultStep::Pause)?;
    Ok(ok())
}

/// The threads CRIU must let run for the whole tree's checkpoint (the backend's
/// restore threads of the tasks paused ahead).
pub(super) fn tree_threads(shared: &Answering<'_>, dump: &DumpSide) -> Result<Reply, HelperError> {
    let mut run_threads = Vec::new();
    if shared.backend.whole_tree() {
        for pid in lock(&dump.tasks).to_checkpoint_ahead() {
            shared.check()?;
            run_threads.extend(shared.backend.restore_thread(pid, shared.cancel)?);
        }
    }
    Ok(Reply {
        ok: true,
        run_threads,
        ..Default::default()
    })
}

/// The first CHECKPOINT_DEVICES of a dump, the tree frozen: the backend's checkpoint of
/// every paused task at once.
pub(super) fn checkpoint_tree(
    shared: &Answering<'_>,
    dump: &DumpSide,
) -> Result<Reply, HelperError> {
    dump_tree::checkpoint_tree(shared, dump)?;
    Ok(ok())
}

/// CHECKPOINT_DEVICES: a task's state and its first buffer fds.
pub(super) fn checkpoint_devices(
    shared: &Answering<'_>,
    dump: &DumpSide,
    r: CheckpointDevices,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    let count = r.buffer_count as usize;
    let ready =
        shared.live(|| lock(&dump.tasks).checkpoint(r.pid, r.format, r.state, count, fds))??;
    if let Some(task) = ready {
        adopt(shared, dump, r.pid, task)?;
    }
    Ok(ok())
}

/// More buffer fds of a task than one message carries.
pub(super) fn dump_buffers(
    shared: &Answering<'_>,
    dump: &DumpSide,
    r: DumpBuffers,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    let ready = shared.live(|| lock(&dump.tasks).buffers(r.pid, r.first_index as usize, fds))??;
    if let Some(task) = ready {
        adopt(shared, dump, r.pid, task)?;
    }
    Ok(ok())
}

/// DUMP_EXT_FILE: a device file of a task, recorded with its role if the backend
/// owns it.
pub(super) fn dump_file(
    shared: &Answering<'_>,
    dump: &DumpSide,
    r: DumpFile,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    let Some(fd) = fds.first() else {
        return Ok(refuse("DumpFile without its fd"));
    };
    let candidates = lock(&dump.tasks).pids();
    shared.check()?;
    let Some(owner) = shared.backend.file_owner(fd.as_fd(), &candidates)? else {
        return Ok(not_owned());
    };
    let mut devices = lock(&dump.devices);
    let Some(task) = devices.get_mut(&owner) else {
        return Ok(not_owned());
    };
    let (role, path) = shared.backend.file_role(fd.as_fd());
    let path = path.unwrap_or_else(|| {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    });
    shared.live(|| {
        task.device_files.push(DeviceFile {
            id: r.id,
            role,
            path,
        })
    })?;
    fault::check(FaultStep::DumpFile)?;
    Ok(Reply {
        ok: true,
        owned: true,
        ..Default::default()
    })
}

/// CRIU's `exit(DUMP)`: memory the driver still holds let go, and a tree that lives
/// on given its devices (and memory) back, unless the give-back is deferred
/// ([`super::Helper::defer_give_back`]): then a dump that succeeded leaves the tree's
/// devices as it made them, until [`give_back_deferred`].
pub(super) fn dump_finished(
    shared: &Answering<'_>,
    dump: &DumpSide,
    r: DumpFinished,
) -> Result<Reply, HelperError> {
    let tasks = &dump.tasks;
    // The image is complete and CRIU kills the tree (CRIU's result does not say
    // whether post-dump went through: `kept` does).
    let kept = lock(tasks).kept();
    let lives_on = dump.leave_running || r.ret != 0 || !kept;
    shared.check()?;
    let deferred = dump.leave_running
        && r.ret == 0
        && kept
        && dump
            .defer_give_back
            .load(std::sync::atomic::Ordering::SeqCst);
    let mut failures = if deferred {
        // Tasks paused ahead that CRIU never reached are not part of the dump: they
        // get their devices back now.
        let unconfirmed = shared.live(|| lock(tasks).release_unconfirmed())?;
        shared.live(|| lock(tasks).defer_give_back())?;
        give_back_each(shared, &unconfirmed)
    } else {
        end_of_dump(shared, dump, lives_on)?
    };
    // The plugin half undid its own steps first (AMD's UNPAUSE).
    failures.extend(r.plugin_errors.iter().map(|e| {
        HelperError::Failed(format!(
            "the plugin could not give a task its device back: {e}"
        ))
    }));
    first_failure(shared, dump, failures, lives_on).map(|()| ok())
}

/// The give-back a dump deferred ([`dump_finished`]), once the tree runs again: every
/// task the backend touched gets its device and memory back. Ok(false) when none was
/// deferred (or it was already done).
pub(super) fn give_back_deferred(
    shared: &Answering<'_>,
    dump: &DumpSide,
) -> Result<bool, HelperError> {
    if !lock(&dump.tasks).take_deferred() {
        return Ok(false);
    }
    let failures = end_of_dump(shared, dump, true)?;
    first_failure(shared, dump, failures, true).map(|()| true)
}

/// The first of `failures`, if any; where the tree `lives_on`, it is also kept as why
/// the tree may not have every device back.
fn first_failure(
    shared: &Answering<'_>,
    dump: &DumpSide,
    failures: Vec<HelperError>,
    lives_on: bool,
) -> Result<(), HelperError> {
    match failures.into_iter().next() {
        Some(e) => {
            if lives_on {
                let _ = shared.live(|| lock(&dump.tasks).give_back_failed(e.to_string()));
            }
            Err(e)
        }
        None => Ok(()),
    }
}

/// [`Backend::after_dump`](crate::gpu::Backend::after_dump) for each of `pids` at
/// once: the failures.
fn give_back_each(shared: &Answering<'_>, pids: &[i32]) -> Vec<HelperError> {
    in_parallel(pids, |pid| shared.backend.after_dump(pid, shared.cancel))
        .into_iter()
        .filter_map(Result::err)
        .map(Into::into)
        .collect()
}

/// The gpucr half's end of a dump: memory the driver still holds let go once copied
/// (the tree dies), else given back; where the tree `lives_on`, every task the
/// backend touched gets its device back, even if one fails. The failures, in order.
fn end_of_dump(
    shared: &Answering<'_>,
    dump: &DumpSide,
    lives_on: bool,
) -> Result<Vec<HelperError>, HelperError> {
    let tasks = &dump.tasks;
    let dumped = lock(tasks).pids();
    // Memory the driver still holds mapped (a copy that failed before the
    // operation was completed) is let go once copied, else given back.
    let held = in_parallel(&dumped, |pid| {
        shared
            .backend
            .release_held(pid, !lives_on, shared.cancel)
            .map(|_| ())
    });
    let mut failures: Vec<HelperError> = held
        .into_iter()
        .filter_map(Result::err)
        .map(Into::into)
        .collect();
    if lives_on {
        // Memory that already left the GPUs comes back from the image.
        if let Err(e) = refill_from_image(shared, dump, &dumped) {
            failures.push(e);
        }
    }
    // Tasks paused ahead that CRIU never reached are not part of the dump.
    let mut pids = shared.live(|| lock(tasks).release_unconfirmed())?;
    if lives_on {
        // The tree lives on: every task the backend touched gets its device
        // back, even if one fails.
        pids.extend(shared.live(|| lock(tasks).release())?);
    }
    failures.extend(give_back_each(shared, &pids));
    if lives_on && !pids.is_empty() {
        if let Err(e) = fault::check(FaultStep::GiveBack) {
            failures.push(e);
        }
    }
    Ok(failures)
}

/// Every fd of `pid`'s buffers is in: the gpucr half takes the task over and its
/// buffers start moving into the image.
fn adopt(
    shared: &Answering<'_>,
    dump: &DumpSide,
    pid: i32,
    task: Adopt,
) -> Result<(), HelperError> {
    let adopted = adopt_device(shared, dump, pid, task).and_then(|device| {
        let Some(mut device) = device else {
            return Ok(None);
        };
        // A task the whole tree's checkpoint did not reach: memory the driver mapped
        // here is copied now, with the task's restore thread let run.
        for (_, operations) in copy_held(shared, dump, &[pid])? {
            device.operations.extend(operations);
        }
        Ok(Some(device))
    });
    // Recorded however it went: a task whose takeover failed is no longer being taken
    // over.
    let outcome = match &adopted {
        Ok(Some(_)) => AdoptOutcome::Adopted,
        Ok(None) => AdoptOutcome::NoDevice,
        Err(_) => AdoptOutcome::Failed,
    };
    let recorded = shared.live(|| lock(&dump.tasks).adopted(pid, outcome));
    let device = adopted?;
    recorded??;
    if let Some(device) = device {
        shared.live(|| lock(&dump.devices).insert(pid, device))?;
    }
    fault::check(FaultStep::Checkpoint)
}

/// The backend's part of [`adopt`]: the task's device, its buffers handed to `writer`.
fn adopt_device(
    shared: &Answering<'_>,
    dump: &DumpSide,
    pid: i32,
    task: Adopt,
) -> Result<Option<TaskDevice>, HelperError> {
    let (found, checkpoint) = timed(shared, "checkpoint", || {
        shared
            .backend
            .adopt_task(pid, &task.format, &task.state, task.fds, shared.cancel)
    })?;
    let Some(found) = found else {
        return Ok(None);
    };
    let mut device = found.device;
    device.operations = task.operations;
    if !task.checkpointed_ahead {
        // Else the checkpoint with the whole tree is in the log already.
        device.operations.push(checkpoint);
    }
    // Buffers copied with the whole tree already have no source here, and a task whose
    // device memory its driver staged in its own memory has none at all: nothing moves,
    // so nothing is timed (and no "copy" is logged for it).
    let guard = dump.writer.read().unwrap_or_else(|e| e.into_inner());
    let writer = running(&guard, "dump")?;
    shared.live(|| {
        if !found.sources.is_empty() {
            let bytes = found.sources.iter().map(|s| s.len()).sum();
            lock(&shared.timeline).begin(device.ns_pid, found.sources.len(), bytes);
        }
        found
            .sources
            .into_iter()
            .enumerate()
            .try_for_each(|(i, source)| {
                writer.add(
                    BufferKey::new(device.ns_pid, i as u32),
                    fault::source(source),
                )
            })
    })??;
    Ok(Some(device))
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::BorrowedFd;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use gpucr_abi::proto::DeviceSpec;

    use super::*;
    use crate::cancel::Cancel;
    use crate::gpu::{Backend, Checkpointed, GpuError, GpuRef};
    use crate::helper::lifecycle::DumpStage;
    use crate::helper::shared::{Served, Shared};
    use crate::transfer::{no_events, BufferSink, BufferSource, DumpWriter, TransferConfig};

    /// Where taking a task over fails.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Failure {
        /// The backend's takeover itself.
        Adopt,
        /// The copy of the memory the driver holds mapped for the task.
        HeldCopy,
        /// Nowhere: the task is taken over.
        None,
    }

    /// The pids `Takeover::after_dump` gave back, in order (each test uses pids of its
    /// own).
    static GIVEN_BACK: Mutex<Vec<i32>> = Mutex::new(Vec::new());

    fn given_back(pid: i32) -> usize {
        GIVEN_BACK
            .lock()
            .unwrap()
            .iter()
            .filter(|&&p| p == pid)
            .count()
    }

    /// A backend whose takeover of a task fails where it is told to; with a gate, the
    /// takeover waits until the gate is opened (a message, or its sender dropped).
    struct Takeover(Failure, Option<Mutex<std::sync::mpsc::Receiver<()>>>);

    impl Backend for Takeover {
        fn name(&self) -> &'static str {
            "takeover"
        }

        fn holds_device(&self, _pid: i32) -> bool {
            true
        }

        fn held_sources(
            &self,
            pid: i32,
            _cancel: &Cancel,
        ) -> Result<Vec<Box<dyn BufferSource>>, GpuError> {
            match self.0 {
                Failure::HeldCopy => Err(GpuError::Task {
                    pid,
                    detail: "the driver's mapped memory is gone".into(),
                }),
                _ => Ok(Vec::new()),
            }
        }

        fn adopt_task(
            &self,
            pid: i32,
            format: &str,
            state: &[u8],
            _buffers: Vec<OwnedFd>,
            // Not looked at: the test of a late completion needs one.
            _cancel: &Cancel,
        ) -> Result<Option<Checkpointed>, GpuError> {
            if let Some(gate) = &self.1 {
                let _ = gate.lock().unwrap().recv();
            }
            if self.0 == Failure::Adopt {
                return Err(GpuError::Task {
                    pid,
                    detail: "the driver refused the checkpoint".into(),
                });
            }
            let device = TaskDevice {
                ns_pid: 1,
                host_pid: pid,
                gpus: Vec::new(),
                device_files: Vec::new(),
                state_format: format.into(),
                state: state.to_vec(),
                buffers: Vec::new(),
                operations: Vec::new(),
            };
            Ok(Some(Checkpointed {
                device,
                sources: Vec::new(),
            }))
        }

        fn after_dump(&self, pid: i32, _cancel: &Cancel) -> Result<(), GpuError> {
            GIVEN_BACK.lock().unwrap().push(pid);
            Ok(())
        }

        fn file_owner(&self, _fd: BorrowedFd<'_>, _: &[i32]) -> Result<Option<i32>, GpuError> {
            Ok(None)
        }

        fn restore_spec(&self, _task: &TaskDevice) -> Result<DeviceSpec, GpuError> {
            unreachable!("a dump restores nothing")
        }

        fn buffer_sink(
            &self,
            _task: &TaskDevice,
            _index: usize,
            _file: File,
        ) -> Result<Box<dyn BufferSink>, GpuError> {
            unreachable!("a dump restores nothing")
        }

        fn sysfs_root(&self) -> Option<PathBuf> {
            None
        }

        fn state_root(&self) -> Option<PathBuf> {
            None
        }

        fn remap_gpus(&self, _: &mut TaskDevice, _: &[(GpuRef, GpuRef)]) -> Result<(), GpuError> {
            Ok(())
        }
    }

    /// The state of a dump into `image` with `backend`.
    fn dump(backend: Takeover, image: &Path) -> Served<DumpSide> {
        dump_under(backend, image, Cancel::new())
    }

    /// The state of a dump into `image` with `backend`, under the command's token
    /// `operation`.
    fn dump_under(backend: Takeover, image: &Path, operation: Cancel) -> Served<DumpSide> {
        dump_of(backend, image, operation, false)
    }

    /// The state of a dump into `image` with `backend`, under `operation`; with
    /// `leave_running` the tree lives on.
    fn dump_of(
        backend: Takeover,
        image: &Path,
        operation: Cancel,
        leave_running: bool,
    ) -> Served<DumpSide> {
        let config = TransferConfig::default();
        let writer = DumpWriter::start(image, config.clone(), no_events()).unwrap();
        let side = DumpSide::new(writer, (image.to_path_buf(), config), leave_running);
        let shared = Shared::new(
            Arc::new(backend),
            Default::default(),
            Duration::from_secs(10),
            operation,
        );
        Served { shared, side }
    }

    /// CHECKPOINT_DEVICES for `pid`, every buffer in (it has none): the task is taken
    /// over at once.
    fn checkpoint(served: &Served<DumpSide>, pid: i32) -> Result<Reply, HelperError> {
        let request = CheckpointDevices {
            pid,
            format: "takeover/1".into(),
            state: vec![1],
            buffer_count: 0,
        };
        let cancel = Cancel::new();
        let answering = Answering {
            shared: &served.shared,
            cancel: &cancel,
        };
        checkpoint_devices(&answering, &served.side, request, Vec::new())
    }

    /// `pid`'s stage, by name, and whether its device is recorded.
    fn recorded(served: &Served<DumpSide>, pid: i32) -> (Option<&'static str>, bool) {
        let stage = lock(&served.side.tasks).stage(pid).map(DumpStage::name);
        (stage, lock(&served.side.devices).contains_key(&pid))
    }

    /// Post-copy's dump defers the give-back: the end of a dump that succeeded, its
    /// tree living on, gives no task back; asked later, every task taken over is given
    /// back, once. A dump that failed gives its tasks back at once, deferred or not.
    #[test]
    fn a_deferred_give_back_waits_until_asked_and_runs_once() {
        for (ret, pid) in [(0, 4201), (1, 4202)] {
            let image = tempfile::tempdir().unwrap();
            let served = dump_of(
                Takeover(Failure::None, None),
                image.path(),
                Cancel::new(),
                true,
            );
            served
                .side
                .defer_give_back
                .store(true, std::sync::atomic::Ordering::SeqCst);
            checkpoint(&served, pid).unwrap();
            lock(&served.side.tasks).keep();
            let cancel = Cancel::new();
            let answering = Answering {
                shared: &served.shared,
                cancel: &cancel,
            };
            let finished = DumpFinished {
                ret,
                plugin_errors: Vec::new(),
            };
            assert!(
                dump_finished(&answering, &served.side, finished)
                    .unwrap()
                    .ok
            );
            if ret == 0 {
                assert_eq!(given_back(pid), 0, "given back before it was asked");
                assert_eq!(recorded(&served, pid), (Some("taken over"), true));
                assert!(give_back_deferred(&answering, &served.side).unwrap());
            }
            assert_eq!(given_back(pid), 1, "ret {ret}");
            assert_eq!(recorded(&served, pid).0, Some("released"), "ret {ret}");
            assert!(!give_back_deferred(&answering, &served.side).unwrap());
            assert_eq!(given_back(pid), 1, "ret {ret}: given back twice");
        }
    }

    /// A dump's helper has no answer for a restore's request: it is refused, naming it,
    /// and nothing is recorded.
    #[test]
    fn a_restore_request_to_a_dump_helper_is_refused() {
        let image = tempfile::tempdir().unwrap();
        let served = dump(Takeover(Failure::None, None), image.path());
        let cancel = Cancel::new();
        let answering = Answering {
            shared: &served.shared,
            cancel: &cancel,
        };
        let kind = request::Kind::ResumeFailed(gpucr_abi::proto::ResumeFailed {
            pid: 10,
            error: String::new(),
        });
        let reply = answer(&answering, &served.side, kind, Vec::new()).unwrap();
        assert!(!reply.ok);
        assert!(
            reply.error.starts_with("unexpected request ResumeFailed("),
            "{}",
            reply.error
        );
        assert_eq!(recorded(&served, 10), (None, false));
    }

    #[test]
    fn a_task_taken_over_is_recorded_with_its_device() {
        let image = tempfile::tempdir().unwrap();
        let shared = dump(Takeover(Failure::None, None), image.path());
        checkpoint(&shared, 10).unwrap();
        assert_eq!(recorded(&shared, 10), (Some("taken over"), true));
    }

    #[test]
    fn a_task_whose_takeover_fails_is_recorded_failed() {
        for (failure, why) in [
            (Failure::Adopt, "the driver refused the checkpoint"),
            (Failure::HeldCopy, "the driver's mapped memory is gone"),
        ] {
            let image = tempfile::tempdir().unwrap();
            let shared = dump(Takeover(failure, None), image.path());
            let err = checkpoint(&shared, 10).unwrap_err();
            assert!(err.to_string().contains(why), "{failure:?}: {err}");
            assert_eq!(
                recorded(&shared, 10),
                (Some("failed"), false),
                "{failure:?}: the task is no longer being taken over"
            );
        }
    }

    /// A request given up while the backend takes the task over (its time limit
    /// passed): when the takeover completes late, the answer records nothing (the task
    /// is still being taken over, no device is kept, no buffer goes to the writer) and
    /// the operation's failure is the abandonment, not the late answer's.
    #[test]
    fn a_takeover_completing_after_its_request_was_given_up_changes_nothing() {
        use crate::helper::control::{Abandoned, Handler};
        let image = tempfile::tempdir().unwrap();
        let (open, gate) = std::sync::mpsc::channel();
        let shared = Arc::new(dump(
            Takeover(Failure::None, Some(Mutex::new(gate))),
            image.path(),
        ));
        let cancel = Cancel::new();
        let late = {
            let (shared, cancel) = (shared.clone(), cancel.clone());
            std::thread::spawn(move || {
                let request = CheckpointDevices {
                    pid: 10,
                    format: "takeover/1".into(),
                    state: vec![1],
                    buffer_count: 0,
                };
                let answering = Answering {
                    shared: &shared.shared,
                    cancel: &cancel,
                };
                checkpoint_devices(&answering, &shared.side, request, Vec::new())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(recorded(&shared, 10), (Some("being taken over"), false));
        let why = Abandoned::TimedOut(Duration::from_millis(50));
        shared.abandoned(4242, "CHECKPOINT_DEVICES", why, &cancel);
        open.send(()).unwrap();
        let answer = late.join().unwrap();
        let err = answer.unwrap_err();
        assert!(err.to_string().starts_with("given up"), "{err}");
        assert_eq!(
            recorded(&shared, 10),
            (Some("being taken over"), false),
            "the late takeover changed the task's state"
        );
        let failure = lock(&shared.shared.failure).take().unwrap().to_string();
        assert!(
            failure.contains("CHECKPOINT_DEVICES (plugin in pid 4242)"),
            "{failure}"
        );
    }

    /// The command's token (Ctrl-C) reaches a takeover in progress through its
    /// request's token: the late takeover records nothing. The end of the dump, which
    /// gives the tree its devices back, is not stopped by it.
    #[test]
    fn the_command_s_cancellation_reaches_the_steps_that_carry_the_dump_forward() {
        use gpucr_abi::proto::{DumpFinished, Request};
        let image = tempfile::tempdir().unwrap();
        let (open, gate) = std::sync::mpsc::channel();
        let command = Cancel::new();
        let shared = Arc::new(dump_under(
            Takeover(Failure::None, Some(Mutex::new(gate))),
            image.path(),
            command.clone(),
        ));
        let request = CheckpointDevices {
            pid: 10,
            format: "takeover/1".into(),
            state: vec![1],
            buffer_count: 0,
        };
        let forward = shared.shared.token_for(&Request {
            kind: Some(request::Kind::CheckpointDevices(request.clone())),
        });
        let finish = shared.shared.token_for(&Request {
            kind: Some(request::Kind::DumpFinished(DumpFinished::default())),
        });
        let late = {
            let (shared, cancel) = (shared.clone(), forward.clone());
            std::thread::spawn(move || {
                let answering = Answering {
                    shared: &shared.shared,
                    cancel: &cancel,
                };
                checkpoint_devices(&answering, &shared.side, request, Vec::new())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        command.cancel("gpucr was interrupted by SIGINT");
        open.send(()).unwrap();
        let err = late.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("SIGINT"), "{err}");
        assert_eq!(
            recorded(&shared, 10),
            (Some("being taken over"), false),
            "the late takeover changed the task's state"
        );
        assert!(
            !finish.is_cancelled(),
            "the end of the dump was stopped too"
        );
    }
}
