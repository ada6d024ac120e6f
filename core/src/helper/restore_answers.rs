//! The helper's answers to the plugin's requests during a restore: device files
//! recreated, buffers attached to the transfer engine's restorer, tasks resumed.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, RwLock};

use gpucr_abi::proto::{
    BuffersReady, Reply, RestoreFile, ResumeDevices, ResumeFailed, ResumeTree, ResumeTreeThreads,
};

use super::fault::{self, FaultStep};
use super::lifecycle::RestoreTasks;
use super::reply::{ok, refuse};
use super::resume::{resume, resume_ahead, resume_tree};
use super::shared::{lock, running, Answering};
use super::HelperError;
use crate::gpu::{DeviceRole, TaskDevice};
use crate::transfer::{BufferKey, Restorer};

/// RESTORE_EXT_FILE: what to reopen for a device file gpucr carried.
pub(super) fn restore_file(
    shared: &Answering<'_>,
    devices: &[TaskDevice],
    tasks: &Mutex<RestoreTasks>,
    r: RestoreFile,
    peer: i32,
) -> Result<Reply, HelperError> {
    let Some(index) = devices.iter().position(|t| t.has_file(r.id)) else {
        // Not a device gpucr carried: let other plugins have it.
        return Ok(refuse(""));
    };
    let task = &devices[index];
    let file = task.device_files.iter().find(|f| f.id == r.id);
    if let Some(file) = file.filter(|f| f.role != DeviceRole::Device) {
        // A further file of the task (a render node): reopened beside its
        // device, which alone moves the task through its lifecycle.
        shared.check()?;
        let spec = shared.backend.file_spec(task, file)?;
        crate::gpu::check_confined(&spec)
            .map_err(|e| HelperError::Failed(format!("task {}: {e}", task.ns_pid)))?;
        return Ok(Reply {
            ok: true,
            device: Some(spec),
            ..Default::default()
        });
    }
    shared.check()?;
    let spec = shared.backend.restore_spec(task)?;
    // Checked before CRIU started too; the plugin confines every path again.
    crate::gpu::check_confined(&spec)
        .map_err(|e| HelperError::Failed(format!("task {}: {e}", task.ns_pid)))?;
    shared.live(|| lock(tasks).recreating(index, peer))??;
    fault::check(FaultStep::RestoreFile)?;
    Ok(Reply {
        ok: true,
        device: Some(spec),
        ..Default::default()
    })
}

/// A restored task's buffers exist: their fds become sinks of the restorer, filled
/// before the answer with `fill_before_answer` (no parallel restore, or engine mode).
pub(super) fn buffers_ready(
    shared: &Answering<'_>,
    restorer: &RwLock<Option<Restorer>>,
    devices: &[TaskDevice],
    tasks: &Mutex<RestoreTasks>,
    fill_before_answer: bool,
    r: BuffersReady,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    let Some(index) = devices.iter().position(|t| t.has_file(r.id)) else {
        return Ok(refuse("BuffersReady for a file gpucr does not carry"));
    };
    let task = &devices[index];
    let first = r.first_index as usize;
    let count = fds.len();
    let guard = restorer.read().unwrap_or_else(|e| e.into_inner());
    let restorer = running(&guard, "restore")?;
    let mut sinks = Vec::with_capacity(count);
    for (j, fd) in fds.into_iter().enumerate() {
        shared.check()?;
        let key = BufferKey::new(task.ns_pid, (first + j) as u32);
        let sink = shared
            .backend
            .buffer_sink(task, first + j, File::from(fd))?;
        sinks.push((key, sink));
    }
    let keys: Vec<BufferKey> = sinks.iter().map(|(key, _)| *key).collect();
    shared.live(|| {
        lock(tasks).attach(index, first, count)?;
        if count > 0 {
            let bytes = task.buffers[first..first + count]
                .iter()
                .map(|b| b.size)
                .sum();
            lock(&shared.timeline).begin(task.ns_pid, count, bytes);
        }
        for (key, sink) in sinks {
            restorer.attach(key, fault::sink(sink))?;
        }
        Ok::<(), HelperError>(())
    })??;
    if fill_before_answer {
        restorer.wait_or_cancel(&keys, shared.cancel)?;
    }
    Ok(ok())
}

/// RESUME_DEVICES_LATE for one task: its buffers written, its device back.
pub(super) fn resume_devices(
    shared: &Answering<'_>,
    restorer: &RwLock<Option<Restorer>>,
    devices: &[TaskDevice],
    tasks: &Mutex<RestoreTasks>,
    r: ResumeDevices,
) -> Result<Reply, HelperError> {
    let ns_pid = crate::gpu::ns_pid(r.pid).ok();
    let Some(index) = shared.live(|| lock(tasks).resuming(r.pid, ns_pid))?? else {
        return Ok(ok());
    };
    let resumed = resume(shared, restorer, r.pid, &devices[index]);
    shared.live(|| lock(tasks).resumed(index, resumed.is_ok()))?;
    resumed?;
    Ok(ok())
}

/// The threads CRIU must let run for the whole tree's resume.
pub(super) fn resume_tree_threads(
    shared: &Answering<'_>,
    tasks: &Mutex<RestoreTasks>,
    r: ResumeTreeThreads,
) -> Result<Reply, HelperError> {
    let pids = resume_ahead(shared, tasks, r.root);
    let mut run_threads = Vec::new();
    for &pid in &pids {
        shared.check()?;
        run_threads.extend(shared.backend.restore_thread(pid)?);
    }
    Ok(Reply {
        ok: true,
        run_threads,
        pids,
        ..Default::default()
    })
}

/// The whole tree resumed at once.
pub(super) fn resume_whole_tree(
    shared: &Answering<'_>,
    restorer: &RwLock<Option<Restorer>>,
    devices: &[TaskDevice],
    tasks: &Mutex<RestoreTasks>,
    r: ResumeTree,
) -> Result<Reply, HelperError> {
    let pids = resume_tree(shared, restorer, devices, tasks, &r.pids)?;
    Ok(Reply {
        ok: true,
        pids,
        ..Default::default()
    })
}

/// The plugin half failed a task's resume.
pub(super) fn resume_failed(
    shared: &Answering<'_>,
    tasks: &Mutex<RestoreTasks>,
    r: ResumeFailed,
) -> Result<Reply, HelperError> {
    shared.live(|| lock(tasks).resume_failed(r.pid))?;
    Err(HelperError::Device(format!(
        "RESUME_DEVICES_LATE for pid {} failed in the plugin: {}",
        r.pid, r.error
    )))
}
