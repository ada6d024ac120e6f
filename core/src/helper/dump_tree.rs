//! The steps of a dump the helper takes for many tasks at once, each task on a thread of
//! its own: the whole tree's lock before the freeze and its checkpoint once frozen
//! (backends that handle the whole tree, as CUDA's), the copy of memory the driver holds
//! mapped, and the refill of a tree that lives on.

use std::sync::Mutex;

use super::fault;
use super::lifecycle::DumpTasks;
use super::parallel::in_parallel;
use super::shared::{lock, timed, Answering, DumpSide};
use super::timeline::counting;
use super::HelperError;
use crate::gpu::Operation;
use crate::transfer::{no_events, BufferKey, Restorer};

/// The first PAUSE_DEVICES of a dump, with the tree still running: the backend's step
/// before the freeze for every task of the tree rooted at `root`, in parallel (CRIU
/// then freezes the tasks one by one, or has frozen them all with their cgroup, and
/// each one's PAUSE_DEVICES finds it done). A task that fails is given back after the
/// dump like the others; the first failure fails this PAUSE_DEVICES, so CRIU gives up
/// at once. A task that exited meanwhile is no failure: CRIU will not dump it. Every
/// task is recorded, whatever failed before it.
pub(super) fn pause_tree(
    shared: &Answering<'_>,
    tasks: &Mutex<DumpTasks>,
    root: i32,
) -> Result<(), HelperError> {
    let pids = crate::gpu::tree_pids(root);
    let outcomes = in_parallel(&pids, |pid| {
        timed(shared, "pause", || {
            shared.backend.pre_freeze(pid, shared.cancel)
        })
    });
    shared.live(|| {
        let mut first_error: Option<HelperError> = None;
        let mut tasks = lock(tasks);
        for (pid, outcome) in pids.into_iter().zip(outcomes) {
            match outcome {
                Ok(((), pause)) => {
                    if let Err(e) = tasks.paused_ahead(pid, pause) {
                        first_error.get_or_insert(e.into());
                    }
                }
                Err(_) if !crate::target::is_running(pid) => {}
                Err(e) => {
                    tasks.pause_failed(pid);
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })?
}

/// The tree is frozen (the first CHECKPOINT_DEVICES, the threads the backend needs let
/// run by the plugin): the backend's checkpoint of every paused task at once. The first
/// failure fails the request, so CRIU gives up; every task is given back after the dump.
pub(super) fn checkpoint_tree(shared: &Answering<'_>, dump: &DumpSide) -> Result<(), HelperError> {
    let tasks = &dump.tasks;
    let pids = lock(tasks).to_checkpoint_ahead();
    let outcomes = in_parallel(&pids, |pid| {
        timed(shared, "checkpoint", || {
            shared.backend.checkpoint_ahead(pid, shared.cancel)
        })
    });
    let mut first_error: Option<HelperError> = None;
    let mut checkpointed = Vec::new();
    shared.live(|| {
        let mut tasks = lock(tasks);
        for (pid, outcome) in pids.into_iter().zip(outcomes) {
            match outcome {
                Ok((made, checkpoint)) => {
                    tasks.checkpointed_ahead(pid, Ok(made.then_some(checkpoint)));
                    checkpointed.push(pid);
                }
                Err(e) => {
                    tasks.checkpointed_ahead(pid, Err(()));
                    first_error.get_or_insert(e);
                }
            }
        }
    })?;
    // With the restore threads still running: memory the driver mapped here (custom
    // storage) is copied into the image and let go, before CRIU dumps the tasks.
    match copy_held(shared, dump, &checkpointed) {
        Ok(logged) => shared.live(|| {
            let mut tasks = lock(tasks);
            for (pid, operations) in logged {
                for operation in operations {
                    tasks.log(pid, operation);
                }
            }
        })?,
        Err(e) => {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Copy the device memory the backend holds mapped for `pids` ([`Backend::held_sources`])
/// into the image, all at once, and wait for it; then let the driver go of it (each
/// such task's "copy" and "complete" operations are returned), or, when the copy
/// failed, give it back to the tasks and fail.
pub(super) fn copy_held(
    shared: &Answering<'_>,
    dump: &DumpSide,
    pids: &[i32],
) -> Result<Vec<(i32, Vec<Operation>)>, HelperError> {
    let mut held = Vec::new();
    let started = lock(&shared.timeline).ms();
    let copied = (|| {
        let guard = dump.writer.read().unwrap_or_else(|e| e.into_inner());
        let writer = guard
            .as_ref()
            .ok_or_else(|| HelperError::Failed("dump already finished".into()))?;
        for &pid in pids {
            shared.check()?;
            let sources = shared.backend.held_sources(pid, shared.cancel)?;
            if sources.is_empty() {
                continue;
            }
            held.push(pid);
            let ns_pid = crate::gpu::ns_pid(pid)?;
            shared.live(|| {
                let bytes = sources.iter().map(|s| s.len()).sum();
                lock(&shared.timeline).begin(ns_pid, sources.len(), bytes);
                sources.into_iter().enumerate().try_for_each(|(i, source)| {
                    writer.add(BufferKey::new(ns_pid, i as u32), fault::source(source))
                })
            })??;
        }
        if !held.is_empty() {
            writer.wait_idle()?;
        }
        Ok::<(), HelperError>(())
    })();
    let copy = Operation {
        name: "copy".into(),
        start_ms: started,
        duration_ms: lock(&shared.timeline).ms() - started,
        result: "ok".into(),
    };
    let keep = copied.is_ok();
    let released = in_parallel(&held, |pid| {
        timed(shared, if keep { "complete" } else { "give back" }, || {
            shared.backend.release_held(pid, keep, shared.cancel)
        })
    });
    let mut first_error = copied.err();
    let mut logged = Vec::new();
    for (&pid, outcome) in held.iter().zip(released) {
        match outcome {
            Ok((_, operation)) => logged.push((pid, vec![copy.clone(), operation])),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(logged),
    }
}

/// DumpFinished, the tree living on: the device memory that left the GPUs
/// ([`Backend::refill_sinks`]) is written back from the image. The writer is finished
/// first if it is not yet (an index written, though the image stays incomplete) and
/// `gpu/` read back with a restorer.
pub(super) fn refill_from_image(
    shared: &Answering<'_>,
    dump: &DumpSide,
    pids: &[i32],
) -> Result<(), HelperError> {
    let mut refills = Vec::new();
    for &pid in pids {
        shared.check()?;
        let sinks = shared.backend.refill_sinks(pid, shared.cancel)?;
        if !sinks.is_empty() {
            refills.push((pid, sinks));
        }
    }
    if refills.is_empty() {
        return Ok(());
    }
    if let Some(writer) = dump
        .writer
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        writer.finish()?;
    }
    let (dir, config) = &dump.image;
    let moved = lock(&shared.timeline).moved.clone();
    // Only the tasks whose memory left their GPUs are written back (another task's
    // failed copy gave it back its own): the chunks are read as their buffers attach.
    let restorer = Restorer::open(dir, config.clone(), false, counting(moved, no_events()))?;
    let mut keys = Vec::new();
    for (pid, sinks) in refills {
        let ns_pid = crate::gpu::ns_pid(pid)?;
        for (i, sink) in sinks.into_iter().enumerate() {
            let key = BufferKey::new(ns_pid, i as u32);
            restorer.attach(key, sink)?;
            keys.push(key);
        }
    }
    restorer.wait_or_cancel(&keys, shared.cancel)?;
    restorer.finish_attached()?;
    Ok(())
}
