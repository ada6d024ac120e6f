//! The helper's answers to the plugin's requests during a restore ([`answer`]
//! dispatches them; a dump's request is refused): device files recreated, buffers
//! attached to the transfer engine's restorer, tasks resumed.

use std::fs::File;
use std::os::fd::OwnedFd;

use gpucr_abi::proto::{
    request, BuffersReady, Reply, RestoreFile, ResumeDevices, ResumeFailed, ResumeTree,
    ResumeTreeThreads,
};

use super::fault::{self, FaultStep};
use super::reply::{ok, refuse, unexpected};
use super::resume::{resume, resume_ahead, resume_tree};
use super::shared::{lock, running, Answering, RestoreSide};
use super::HelperError;
use crate::gpu::DeviceRole;
use crate::transfer::BufferKey;

/// A restore's request of the plugin (from host pid `peer`), answered with `restore`'s
/// state; any other (a dump's) is refused.
pub(super) fn answer(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    kind: request::Kind,
    fds: Vec<OwnedFd>,
    peer: i32,
) -> Result<Reply, HelperError> {
    match kind {
        request::Kind::RestoreFile(r) => restore_file(shared, restore, r, peer),
        request::Kind::BuffersReady(r) => buffers_ready(shared, restore, r, fds),
        request::Kind::ResumeDevices(r) => resume_devices(shared, restore, r),
        request::Kind::ResumeTreeThreads(r) => resume_tree_threads(shared, restore, r),
        request::Kind::ResumeTree(r) => resume_whole_tree(shared, restore, r),
        request::Kind::ResumeFailed(r) => resume_failed(shared, restore, r),
        other => Ok(unexpected(&other)),
    }
}

/// `outcome` of a step of task `index` before its resume; a failure (not a request
/// refused for the task's stage) marks the task failed.
fn recorded<T>(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    index: usize,
    outcome: Result<T, HelperError>,
) -> Result<T, HelperError> {
    if let Err(e) = &outcome {
        if !matches!(e, HelperError::Lifecycle(_)) {
            let _ = shared.live(|| lock(&restore.tasks).recreate_failed(index));
        }
    }
    outcome
}

/// RESTORE_EXT_FILE: what to reopen for a device file gpucr carried.
pub(super) fn restore_file(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    r: RestoreFile,
    peer: i32,
) -> Result<Reply, HelperError> {
    let devices = &restore.devices;
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
    let spec = (|| {
        shared.check()?;
        let spec = shared.backend.restore_spec(task)?;
        // Checked before CRIU started too; the plugin confines every path again.
        crate::gpu::check_confined(&spec)
            .map_err(|e| HelperError::Failed(format!("task {}: {e}", task.ns_pid)))?;
        Ok(spec)
    })();
    let spec = recorded(shared, restore, index, spec)?;
    shared.live(|| lock(&restore.tasks).recreating(index, peer))??;
    fault::check(FaultStep::RestoreFile)?;
    Ok(Reply {
        ok: true,
        device: Some(spec),
        ..Default::default()
    })
}

/// A restored task's buffers exist: their fds become sinks of the restorer, filled
/// before the answer when [`RestoreSide::fill_before_answer`] (no parallel restore, or
/// engine mode). A task whose buffers could not be handed over or filled is failed.
pub(super) fn buffers_ready(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    r: BuffersReady,
    fds: Vec<OwnedFd>,
) -> Result<Reply, HelperError> {
    let Some(index) = restore.devices.iter().position(|t| t.has_file(r.id)) else {
        return Ok(refuse("BuffersReady for a file gpucr does not carry"));
    };
    let filled = fill(shared, restore, index, r.first_index as usize, fds);
    recorded(shared, restore, index, filled)?;
    Ok(ok())
}

/// [`buffers_ready`]'s work for task `index`: `fds`, its buffers from `first`, handed to
/// the restorer (and filled, when the answer waits for that).
fn fill(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    index: usize,
    first: usize,
    fds: Vec<OwnedFd>,
) -> Result<(), HelperError> {
    let task = &restore.devices[index];
    let count = fds.len();
    let guard = restore.restorer.read().unwrap_or_else(|e| e.into_inner());
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
        lock(&restore.tasks).attach(index, first, count)?;
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
    if restore.fill_before_answer() {
        restorer.wait_or_cancel(&keys, shared.cancel)?;
    }
    Ok(())
}

/// RESUME_DEVICES_LATE for one task: its buffers written, its device back.
pub(super) fn resume_devices(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    r: ResumeDevices,
) -> Result<Reply, HelperError> {
    let ns_pid = crate::gpu::ns_pid(r.pid).ok();
    let Some(index) = shared.live(|| lock(&restore.tasks).resuming(r.pid, ns_pid))?? else {
        return Ok(ok());
    };
    let resumed = resume(shared, restore, r.pid, &restore.devices[index]);
    // Recorded however it went: a task whose resume failed is no longer being resumed.
    let recorded = shared.live(|| lock(&restore.tasks).resumed(index, resumed.is_ok()));
    resumed?;
    recorded??;
    Ok(ok())
}

/// The threads CRIU must let run for the whole tree's resume.
pub(super) fn resume_tree_threads(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    r: ResumeTreeThreads,
) -> Result<Reply, HelperError> {
    let pids = resume_ahead(shared, restore, r.root);
    let mut run_threads = Vec::new();
    for &pid in &pids {
        shared.check()?;
        run_threads.extend(shared.backend.restore_thread(pid, shared.cancel)?);
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
    restore: &RestoreSide,
    r: ResumeTree,
) -> Result<Reply, HelperError> {
    let pids = resume_tree(shared, restore, &r.pids)?;
    Ok(Reply {
        ok: true,
        pids,
        ..Default::default()
    })
}

/// The plugin half failed a task's resume.
pub(super) fn resume_failed(
    shared: &Answering<'_>,
    restore: &RestoreSide,
    r: ResumeFailed,
) -> Result<Reply, HelperError> {
    shared.live(|| lock(&restore.tasks).resume_failed(r.pid))?;
    Err(HelperError::Device(format!(
        "RESUME_DEVICES_LATE for pid {} failed in the plugin: {}",
        r.pid, r.error
    )))
}
