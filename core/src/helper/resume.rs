//! Restored tasks brought back on their devices once their buffers are written: one
//! task at its RESUME_DEVICES_LATE ([`resume`]), or the whole tree at once, each task on
//! a thread of its own, for backends that handle the whole tree ([`resume_tree`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::fault::{self, FaultStep};
use super::parallel::in_parallel;
use super::shared::{lock, running, Answering, RestoreSide};
use super::HelperError;
use crate::gpu::TaskDevice;
use crate::transfer::BufferKey;

/// Bring restored task `task` (host pid `pid`) back on its device once its buffers
/// are written.
pub(super) fn resume(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    pid: i32,
    task: &TaskDevice,
) -> Result<(), HelperError> {
    let keys: Vec<BufferKey> = task_keys(task).collect();
    shared.check()?;
    let sinks = shared.backend.resume_sinks(pid, task, shared.cancel)?;
    {
        let guard = restore.restorer.read().unwrap_or_else(|e| e.into_inner());
        let restorer = running(&guard, "restore")?;
        if !task.device_files.is_empty() && !sinks.is_empty()
            || task.device_files.is_empty() && sinks.len() != keys.len()
        {
            return Err(HelperError::Failed(format!(
                "task {}: the backend gave {} buffers to fill at RESUME_DEVICES_LATE, \
                 the image has {} for it",
                task.ns_pid,
                sinks.len(),
                keys.len()
            )));
        }
        shared.live(|| {
            if !sinks.is_empty() {
                let bytes = sinks.iter().map(|s| s.len()).sum();
                lock(&shared.timeline).begin(task.ns_pid, sinks.len(), bytes);
            }
            keys.iter()
                .zip(sinks)
                .try_for_each(|(key, sink)| restorer.attach(*key, fault::sink(sink)))
        })??;
        restorer.wait_or_cancel(&keys, shared.cancel)?;
    }
    shared.check()?;
    // On-demand restore: the device's restore reads the task's own memory (device
    // memory staged there), which comes in first, ahead of the rest of the tree's.
    if let Some(memory) = restore
        .process_memory
        .as_ref()
        .filter(|_| shared.backend.resume_reads_process_memory(task))
    {
        (memory.0)(task.ns_pid, shared.cancel).map_err(HelperError::Device)?;
        shared.check()?;
    }
    shared.backend.resume_task(pid, task, shared.cancel)?;
    fault::check(FaultStep::Resume)
}

/// The keys of `task`'s buffers in the image.
pub(super) fn task_keys(task: &TaskDevice) -> impl Iterator<Item = BufferKey> + '_ {
    (0..task.buffers.len()).map(move |i| BufferKey::new(task.ns_pid, i as u32))
}

/// The first RESUME_DEVICES_LATE of a restore of a [`Backend::whole_tree`] backend,
/// every task restored and stopped: the tasks of the tree rooted at `root` (host pids)
/// that the helper brings back at once, ahead of their own hooks (those without device
/// files, still waiting). None for other backends.
pub(super) fn resume_ahead(shared: &Answering<'_>, restore: &RestoreSide, root: i32) -> Vec<i32> {
    if !shared.backend.whole_tree() {
        return Vec::new();
    }
    let tasks = lock(&restore.tasks);
    crate::gpu::tree_pids(root)
        .into_iter()
        .filter(|&pid| {
            crate::gpu::ns_pid(pid).is_ok_and(|ns| tasks.awaits_resume_without_files(pid, ns))
        })
        .collect()
}

/// [`resume_ahead`]'s tasks, as the plugin names them back, brought back on their
/// devices in parallel (the plugin lets their restore threads run meanwhile); the pids
/// done. A task that fails is marked so (the restore then fails before any task runs);
/// the first failure is returned. A task refused for its stage fails the request, and
/// the tasks taken before it are marked failed, none brought back.
pub(super) fn resume_tree(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    pids: &[i32],
) -> Result<Vec<i32>, HelperError> {
    let tasks = &restore.tasks;
    let mut taken = BTreeMap::new();
    for &pid in pids {
        let ns_pid = crate::gpu::ns_pid(pid).ok();
        match shared.live(|| lock(tasks).resuming(pid, ns_pid))? {
            Ok(Some(index)) => {
                taken.insert(pid, index);
            }
            Ok(None) => {}
            Err(refused) => {
                shared.live(|| {
                    let mut tasks = lock(tasks);
                    taken
                        .values()
                        .try_for_each(|&index| tasks.resumed(index, false))
                })??;
                return Err(refused.into());
            }
        }
    }
    let pids: Vec<i32> = taken.keys().copied().collect();
    // The failure that came first in time is the cause; the others may only echo it.
    let first_failure = Mutex::new(None);
    in_parallel(&pids, |pid| {
        let index = taken[&pid];
        let resumed = resume(shared, restore, pid, &restore.devices[index]);
        let recorded = shared.live(|| lock(tasks).resumed(index, resumed.is_ok()));
        let failed = match (resumed, recorded) {
            (Err(e), _) => Some(e),
            (Ok(()), Ok(Err(refused))) => Some(refused.into()),
            (Ok(()), _) => None,
        };
        if let Some(e) = failed {
            lock(&first_failure).get_or_insert(e);
        }
    });
    match first_failure
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
    {
        Some(e) => Err(e),
        None => Ok(pids),
    }
}
