//! Restored tasks brought back on their devices once their buffers are written: one
//! task at its RESUME_DEVICES_LATE ([`resume`]), or the whole tree at once, each task on
//! a thread of its own, for backends that handle the whole tree ([`resume_tree`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};

use super::fault::{self, FaultStep};
use super::lifecycle::RestoreTasks;
use super::parallel::in_parallel;
use super::shared::{lock, running, Answering};
use super::HelperError;
use crate::gpu::TaskDevice;
use crate::transfer::{BufferKey, Restorer};

/// Bring restored task `task` (host pid `pid`) back on its device once its buffers
/// are written.
pub(super) fn resume(
    shared: &Answering<'_>,
    restorer: &RwLock<Option<Restorer>>,
    pid: i32,
    task: &TaskDevice,
) -> Result<(), HelperError> {
    let keys: Vec<BufferKey> = task_keys(task).collect();
    shared.check()?;
    let sinks = shared.backend.resume_sinks(pid, task)?;
    {
        let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
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
    shared.backend.resume_task(pid, task)?;
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
pub(super) fn resume_ahead(
    shared: &Answering<'_>,
    tasks: &Mutex<RestoreTasks>,
    root: i32,
) -> Vec<i32> {
    if !shared.backend.whole_tree() {
        return Vec::new();
    }
    let tasks = lock(tasks);
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
/// the first failure is returned.
pub(super) fn resume_tree(
    shared: &Answering<'_>,
    restorer: &RwLock<Option<Restorer>>,
    devices: &[TaskDevice],
    tasks: &Mutex<RestoreTasks>,
    pids: &[i32],
) -> Result<Vec<i32>, HelperError> {
    let mut taken = BTreeMap::new();
    for &pid in pids {
        let ns_pid = crate::gpu::ns_pid(pid).ok();
        if let Some(index) = shared.live(|| lock(tasks).resuming(pid, ns_pid))?? {
            taken.insert(pid, index);
        }
    }
    let pids: Vec<i32> = taken.keys().copied().collect();
    // The failure that came first in time is the cause; the others may only echo it.
    let first_failure = Mutex::new(None);
    in_parallel(&pids, |pid| {
        let index = taken[&pid];
        let resumed = resume(shared, restorer, pid, &devices[index]);
        let _ = shared.live(|| lock(tasks).resumed(index, resumed.is_ok()));
        if let Err(e) = resumed {
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
