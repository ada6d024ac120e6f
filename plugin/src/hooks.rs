//! The C entry points: trampolines that catch panics and turn results into the return
//! values CRIU expects (>= 0 success, negative errno failure, -ENOTSUP "not mine").
//!
//! Each hook does the plugin half's part ([`crate::half`]) and hands the rest to gpucr's
//! helper. When CRIU was not started by gpucr (no helper), every hook says "not mine".

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use gpucr_abi::fault::FaultStep;
use gpucr_abi::plugin_abi::stage;
use gpucr_abi::procfs;
use gpucr_abi::proto::{
    request, BuffersReady, CheckpointDevices, DumpBuffers, DumpFile, PauseDevices, ResumeDevices,
    ResumeFailed,
};
use gpucr_abi::wire::MAX_FDS;
use gpucr_abi::{PluginFailureKind, PLUGIN_EXIT_STEP, PLUGIN_NAME};

use crate::half::{self, HalfError, PluginHalf};
use crate::helper::{self, HelperError};
use crate::thread::RunGuard;
use crate::{criu, descriptor, device, engine, unresumed, NOT_OURS};

/// Whether this dump already named the plugin in CRIU's inventory.
static REGISTERED: AtomicBool = AtomicBool::new(false);
/// Whether this dump's first CHECKPOINT_DEVICES did the whole tree's step.
static TREE_CHECKPOINTED: AtomicBool = AtomicBool::new(false);
/// Whether this restore's first RESUME_DEVICES_LATE did the whole tree's step.
static TREE_RESUMED: AtomicBool = AtomicBool::new(false);
/// The tasks that step brought back: their own RESUME_DEVICES_LATE skip the helper.
static RESUMED_AHEAD: std::sync::Mutex<Vec<c_int>> = std::sync::Mutex::new(Vec::new());
/// Every task of this dump (PAUSE_DEVICES), for the step after it.
static DUMPED: std::sync::Mutex<Vec<c_int>> = std::sync::Mutex::new(Vec::new());
/// The tasks whose CHECKPOINT_DEVICES went through, for [`tree_checkpointed`].
static CHECKPOINTED: std::sync::Mutex<Vec<c_int>> = std::sync::Mutex::new(Vec::new());

/// Why a hook failed: the message for CRIU's log and the errno CRIU gets back (the
/// cause's own errno where there is one, so CRIU's log and exit say what happened).
#[derive(Debug)]
pub struct HookFailure {
    pub errno: i32,
    pub kind: PluginFailureKind,
    pub message: String,
}

/// Fail with an injected fault when `GPUCR_FAULT` names `step` (tests of the failure
/// paths; see `gpucr_abi::fault`): a device failure, as a driver error or a broken
/// device there would be.
fn fault(step: FaultStep) -> Result<(), HookFailure> {
    if step.injected() {
        return Err(HookFailure {
            errno: libc::EIO,
            kind: PluginFailureKind::Device,
            message: step.message(),
        });
    }
    Ok(())
}

/// The helper's connection broke, or the helper refused (its own failure is what gpucr
/// reports then): the plugin's part.
impl From<HelperError> for HookFailure {
    fn from(e: HelperError) -> Self {
        HookFailure {
            errno: e.errno(),
            kind: PluginFailureKind::Plugin,
            message: e.to_string(),
        }
    }
}

impl From<device::DeviceError> for HookFailure {
    fn from(e: device::DeviceError) -> Self {
        HookFailure {
            errno: e.errno(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl From<&HalfError> for HookFailure {
    fn from(e: &HalfError) -> Self {
        HookFailure {
            errno: e.errno,
            kind: e.kind,
            message: e.message.clone(),
        }
    }
}

impl From<HalfError> for HookFailure {
    fn from(e: HalfError) -> Self {
        HookFailure::from(&e)
    }
}

/// Run `f` and map its outcome to a C return value: a failure becomes its negative
/// errno, a panic -EIO.
fn guard(name: &str, f: impl FnOnce() -> Result<c_int, HookFailure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(ret)) => ret,
        Ok(Err(failure)) => {
            criu::failure(failure.kind, &format!("{name}: {}", failure.message));
            -failure.errno.max(1)
        }
        Err(_) => {
            criu::error(&format!("{name}: internal error (panic)"));
            -libc::EIO
        }
    }
}

/// The backend's plugin half, chosen once per process from `GPUCR_BACKEND`; None when
/// CRIU was not started by gpucr.
fn plugin_half() -> Result<Option<&'static dyn PluginHalf>, HookFailure> {
    static HALF: OnceLock<Result<Option<Box<dyn PluginHalf>>, HalfError>> = OnceLock::new();
    if !helper::configured() {
        return Ok(None);
    }
    match HALF.get_or_init(half::for_env) {
        Ok(h) => Ok(h.as_deref()),
        Err(e) => Err(e.into()),
    }
}

pub unsafe extern "C" fn init(stage: c_int) -> c_int {
    guard("init", || {
        let stage_name = match stage {
            stage::DUMP => "dump",
            stage::PRE_DUMP => "pre-dump",
            stage::RESTORE => "restore",
            _ => "unknown stage",
        };
        if stage == stage::RESTORE {
            // Claim our inventory entry (present when the image holds gpucr device
            // state) so CRIU does not refuse the restore.
            // Claim every entry: images may name the plugin more than once.
            let mut claimed = false;
            while criu::check_and_remove_inventory_plugin(PLUGIN_NAME) {
                claimed = true;
                if criu::inventory_is_legacy() {
                    break;
                }
            }
            criu::info(&format!(
                "plugin loaded ({stage_name}; image needs gpucr: {claimed}; {})",
                abi_line()
            ));
            if claimed && descriptor::abi().is_err() {
                return Err(unknown_abi_failure());
            }
            if claimed && !helper::configured() {
                // A CRIU gpucr did not start (a container engine's): engine mode.
                engine::load_settings();
                engine::start_restore()?;
            }
        } else {
            criu::info(&format!("plugin loaded ({stage_name}; {})", abi_line()));
            if !helper::configured() {
                engine::set_stage(stage);
                engine::load_settings();
            }
        }
        if let Some(half) = plugin_half()? {
            criu::info(&format!("backend {} (plugin half)", half.name()));
        }
        Ok(0)
    })
}

/// The hook ABI the descriptor was fitted to, for CRIU's log.
fn abi_line() -> String {
    match descriptor::abi() {
        Ok(abi) => format!("hook ABI of {}, {} hooks", abi.releases(), abi.max_hooks()),
        Err(why) => format!("hook ABI unknown: {why}"),
    }
}

pub unsafe extern "C" fn exit(stage: c_int, ret: c_int) {
    guard("exit", || {
        if let Ok(Some(half)) = plugin_half() {
            exit_with(half, stage, ret);
        }
        engine::finish(stage, ret);
        criu::info(&format!("plugin finished (stage {stage}, result {ret})"));
        Ok(0)
    });
}

/// The plugin half's and the helper's part of the `exit` hook.
pub fn exit_with(half: &dyn PluginHalf, stage: c_int, ret: c_int) {
    // The plugin half first (AMD's queues run again), then the gpucr half; what the
    // plugin half could not undo goes to the helper, which reports it.
    let plugin_errors = half.finish(stage, ret);
    if stage == stage::RESTORE {
        unresumed::finish();
    }
    if stage != stage::DUMP {
        return;
    }
    // The tree is still stopped (CRIU lets it go after this hook): where it lives on,
    // the gpucr half gives every task its device back, with each task's restore thread
    // (if its backend has one) let run meanwhile.
    let pids = DUMPED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut running = Vec::new();
    for tid in pids.iter().filter_map(|&pid| half.restore_thread(pid)) {
        match RunGuard::start(tid) {
            Ok(guard) => running.extend(guard),
            Err(e) => criu::error(&format!("{PLUGIN_EXIT_STEP}{e}")),
        }
    }
    let kind = request::Kind::DumpFinished(gpucr_abi::proto::DumpFinished { ret, plugin_errors });
    if let Err(e) = helper::call(kind, &[]) {
        criu::error(&format!("{PLUGIN_EXIT_STEP}{e}"));
    }
    drop(running);
}

pub unsafe extern "C" fn pause_devices(pid: c_int) -> c_int {
    guard("PAUSE_DEVICES", || match plugin_half()? {
        Some(half) => pause_devices_with(half, pid),
        // A CRIU gpucr did not start: engine mode, when the tree holds a GPU.
        None if engine::start_dump(pid)? => match plugin_half()? {
            Some(half) => pause_devices_with(half, pid),
            None => Ok(NOT_OURS),
        },
        None => Ok(NOT_OURS),
    })
}

/// PAUSE_DEVICES with `half`.
pub fn pause_devices_with(half: &dyn PluginHalf, pid: c_int) -> Result<c_int, HookFailure> {
    DUMPED.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    half.pause(pid)?;
    fault(FaultStep::PluginPause)?;
    helper::call(request::Kind::PauseDevices(PauseDevices { pid }), &[])?;
    criu::info(&format!("PAUSE_DEVICES pid {pid}"));
    Ok(0)
}

pub unsafe extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    guard("CHECKPOINT_DEVICES", || match plugin_half()? {
        Some(half) => checkpoint_devices_with(half, pid),
        None => Ok(NOT_OURS),
    })
}

/// CHECKPOINT_DEVICES with `half`.
pub fn checkpoint_devices_with(half: &dyn PluginHalf, pid: c_int) -> Result<c_int, HookFailure> {
    criu::info(&format!("CHECKPOINT_DEVICES pid {pid}"));
    if !TREE_CHECKPOINTED.swap(true, Ordering::SeqCst) {
        half.checkpoint_tree()?;
        // The image holds GPU state even when no device file is dumped (a CUDA
        // process's driver releases its device files at the checkpoint): the restore,
        // in an engine's CRIU too, must know it needs gpucr.
        register_in_inventory();
    }
    let collected = half.checkpoint(pid)?;
    let (format, state, buffers, run_thread) = match collected {
        Some(c) => (c.format, c.state, c.buffers, c.run_thread),
        None => (String::new(), Vec::new(), Vec::new(), None),
    };
    fault(FaultStep::PluginCheckpoint)?;
    // Held until the gpucr half has taken the task over.
    let _running = run_thread.map(RunGuard::start).transpose()?.flatten();
    let fds = device::raw_fds_of(&buffers);
    let mut batches = fds.chunks(MAX_FDS);
    let kind = request::Kind::CheckpointDevices(CheckpointDevices {
        pid,
        format,
        state,
        buffer_count: fds.len() as u32,
    });
    helper::call(kind, batches.next().unwrap_or(&[]))?;
    for (n, batch) in batches.enumerate() {
        let kind = request::Kind::DumpBuffers(DumpBuffers {
            pid,
            first_index: ((n + 1) * MAX_FDS) as u32,
        });
        helper::call(kind, batch)?;
    }
    if !fds.is_empty() {
        criu::info(&format!(
            "CHECKPOINT_DEVICES pid {pid}: {} buffers handed to the helper",
            fds.len()
        ));
    }
    // The helper holds its own references; ours close here.
    drop(buffers);
    // Engine mode finishes the copy at the first device file CRIU dumps, the last hook
    // whose failure CRIU honours. A backend whose tasks keep no device file (a CUDA
    // process's driver releases them at the checkpoint) gets no such hook: the copy is
    // finished and the manifest's room taken once every task is checkpointed, before
    // CRIU dumps any memory, so that a full disk fails the dump and the tree runs on.
    // (Under gpucr's own CRIU the copy is finished at post-dump: nothing to count.)
    if engine::active() && !half.dumps_device_files() && tree_checkpointed(pid) {
        engine::finish_copy_early()?;
    }
    Ok(0)
}

/// Record `pid` as checkpointed; true once every task PAUSE_DEVICES saw is, but those
/// that have exited since (CRIU calls CHECKPOINT_DEVICES only for live tasks).
fn tree_checkpointed(pid: c_int) -> bool {
    let mut checkpointed = CHECKPOINTED.lock().unwrap_or_else(|e| e.into_inner());
    checkpointed.push(pid);
    DUMPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .all(|&paused| checkpointed.contains(&paused) || procfs::has_exited(paused))
}

pub unsafe extern "C" fn dump_ext_file(fd: c_int, id: c_int) -> c_int {
    guard("DUMP_EXT_FILE", || {
        if plugin_half()?.is_none() {
            return Ok(NOT_OURS);
        }
        dump_ext_file_with(fd, id)
    })
}

/// DUMP_EXT_FILE: ask the helper whether the file behind `fd` is a device it carries.
pub fn dump_ext_file_with(fd: c_int, id: c_int) -> Result<c_int, HookFailure> {
    let kind = request::Kind::DumpFile(DumpFile { id: id as u32 });
    let reply = helper::call(kind, &[fd])?;
    if !reply.owned {
        return Ok(NOT_OURS);
    }
    register_in_inventory();
    criu::info(&format!(
        "DUMP_EXT_FILE id {id:#x}: device carried by gpucr"
    ));
    engine::finish_copy_early()?;
    Ok(0)
}

/// Name gpucr in CRIU's inventory, so that a restore (in any CRIU) knows the image
/// needs this plugin. CRIU keeps every name it is given: once per dump.
fn register_in_inventory() {
    if !REGISTERED.swap(true, Ordering::SeqCst) {
        criu::add_inventory_plugin(PLUGIN_NAME);
    }
}

/// HANDLE_DEVICE_VMA(fd, stat): 0 when the mapping is one of the backend's device
/// mappings (CRIU then leaves its contents to the plugin), else "not mine".
pub unsafe extern "C" fn handle_device_vma(_fd: c_int, stat: *const libc::stat) -> c_int {
    guard("HANDLE_DEVICE_VMA", || {
        let Some(half) = plugin_half()? else {
            return Ok(NOT_OURS);
        };
        if stat.is_null() {
            return Ok(NOT_OURS);
        }
        // SAFETY: CRIU passes a pointer to a `struct stat` it filled, valid for the call.
        let stat = unsafe { &*stat };
        Ok(if half.owns_vma(stat) { 0 } else { NOT_OURS })
    })
}

/// UPDATE_VMA_MAP(path, addr, old_pgoff, &new_pgoff, &plugin_fd): 1 with the new offset
/// and fd of a device mapping the plugin half recreated, else "not mine".
pub unsafe extern "C" fn update_vma_map(
    path: *const c_char,
    addr: u64,
    old_pgoff: u64,
    new_pgoff: *mut u64,
    plugin_fd: *mut c_int,
) -> c_int {
    guard("UPDATE_VMA_MAP", || {
        let Some(half) = plugin_half()? else {
            return Ok(NOT_OURS);
        };
        if path.is_null() || new_pgoff.is_null() || plugin_fd.is_null() {
            return Ok(NOT_OURS);
        }
        // SAFETY: CRIU passes the mapping's NUL-terminated file name, valid for the call.
        let path = unsafe { CStr::from_ptr(path) };
        let Some((pgoff, fd)) = half.update_vma(path, addr, old_pgoff) else {
            return Ok(NOT_OURS);
        };
        // SAFETY: both out-pointers were checked non-null and point to CRIU's locals.
        unsafe {
            *new_pgoff = pgoff;
            *plugin_fd = fd;
        }
        Ok(1)
    })
}

/// RESTORE_EXT_FILE(id), CRIU 4.1 and 4.2.
pub unsafe extern "C" fn restore_ext_file(id: c_int) -> c_int {
    restore_ext_file_guarded(id)
}

fn restore_ext_file_guarded(id: c_int) -> c_int {
    guard("RESTORE_EXT_FILE", || match plugin_half()? {
        Some(half) => restore_ext_file_with(half, id),
        None => Ok(NOT_OURS),
    })
}

/// RESTORE_EXT_FILE(id, &retry_needed), CRIU 4.3 and criu-dev: gpucr restores a device
/// file in one call, so it never asks CRIU to call again. CRIU reads `*retry_needed`
/// whenever a plugin returns a descriptor, and leaves it uninitialised itself.
pub unsafe extern "C" fn restore_ext_file_retry(id: c_int, retry_needed: *mut bool) -> c_int {
    let ret = restore_ext_file_guarded(id);
    if !retry_needed.is_null() {
        // SAFETY: CRIU passes the address of its own `bool` local, valid for the call.
        unsafe { *retry_needed = false };
    }
    ret
}

/// RESTORE_EXT_FILE for a CRIU whose hook ABI could not be told: what CRIU passes beyond
/// `id` is unknown, so a device of gpucr's is refused (a failure CRIU reads nothing
/// more of); `init` has already failed such a restore, saying why.
pub unsafe extern "C" fn restore_ext_file_unknown_abi(_id: c_int) -> c_int {
    guard("RESTORE_EXT_FILE", || match plugin_half()? {
        Some(_) => Err(unknown_abi_failure()),
        None => Ok(NOT_OURS),
    })
}

/// The failure of a restore that needs gpucr in a CRIU whose hook ABI is unknown.
fn unknown_abi_failure() -> HookFailure {
    let why = descriptor::abi().err().unwrap_or("no reason recorded");
    HookFailure {
        errno: libc::EPROTO,
        kind: PluginFailureKind::Plugin,
        message: format!(
            "cannot tell this CRIU's plugin hook ABI, so gpucr cannot restore devices with \
             it ({why}); gpucr supports CRIU 4.1, 4.2, 4.3 and criu-dev"
        ),
    }
}

/// DUMP_DEVICES_LATE(pid), CRIU 4.3 and criu-dev: once every task of the tree rooted at
/// `pid` is dumped, the last point at which a failure still fails the dump. Engine mode
/// finishes the GPU copy and takes the manifest's room here (under `gpucr dump` that is
/// post-dump's work, which gpucr is told of).
pub unsafe extern "C" fn dump_devices_late(pid: c_int) -> c_int {
    guard("DUMP_DEVICES_LATE", || {
        if !engine::active() {
            return Ok(NOT_OURS);
        }
        engine::finish_copy()?;
        criu::info(&format!("DUMP_DEVICES_LATE pid {pid}: GPU copy finished"));
        Ok(0)
    })
}

/// RESTORE_EXT_FILE with `half`: the device fd for CRIU.
pub fn restore_ext_file_with(half: &dyn PluginHalf, id: c_int) -> Result<c_int, HookFailure> {
    let id = id as u32;
    let reply = match helper::call(
        request::Kind::RestoreFile(gpucr_abi::proto::RestoreFile { id }),
        &[],
    ) {
        Ok(reply) => reply,
        Err(HelperError::Refused(e)) if e.is_empty() => return Ok(NOT_OURS),
        Err(e) => return Err(e.into()),
    };
    let Some(spec) = reply.device else {
        return Ok(NOT_OURS);
    };
    let recreated = half.recreate(&spec)?;
    fault(FaultStep::PluginRecreate)?;
    let fds = device::raw_fds(&recreated.buffers);
    for (batch, chunk) in fds.chunks(MAX_FDS).enumerate() {
        let kind = request::Kind::BuffersReady(BuffersReady {
            id,
            first_index: (batch * MAX_FDS) as u32,
        });
        helper::call(kind, chunk)?;
    }
    // The helper holds its own references; ours close here.
    drop(recreated.buffers);
    criu::info(&format!(
        "RESTORE_EXT_FILE id {id:#x}: {} buffers handed to the helper, device fd {}",
        fds.len(),
        recreated.device_fd
    ));
    Ok(recreated.device_fd)
}

pub unsafe extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    guard("RESUME_DEVICES_LATE", || match plugin_half()? {
        Some(half) => resume_devices_late_with(half, pid),
        None => Ok(NOT_OURS),
    })
}

/// RESUME_DEVICES_LATE with `half`. A task whose device does not come back is stopped
/// with the whole tree, and killed at the `exit` hook ([`unresumed`]).
pub fn resume_devices_late_with(half: &dyn PluginHalf, pid: c_int) -> Result<c_int, HookFailure> {
    if !unresumed::begin(pid) {
        return Err(HookFailure {
            errno: libc::ECANCELED,
            kind: PluginFailureKind::Device,
            message: format!(
                "pid {pid} not resumed: another task of the tree did not get its device back"
            ),
        });
    }
    let resumed = resume_one(half, pid);
    if resumed.is_err() {
        unresumed::failed(pid);
    }
    resumed
}

/// RESUME_DEVICES_LATE for `pid`, which the tree's state allows.
fn resume_one(half: &dyn PluginHalf, pid: c_int) -> Result<c_int, HookFailure> {
    if !TREE_RESUMED.swap(true, Ordering::SeqCst) {
        // CRIU calls this hook once every task is restored and stopped: a backend
        // that brings the whole tree back at once does it now.
        let done = half.resume_tree(pid)?;
        RESUMED_AHEAD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(done);
    }
    let ahead = RESUMED_AHEAD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&pid);
    if !ahead {
        let kind = request::Kind::ResumeDevices(ResumeDevices { pid });
        // The task's restore thread (if its backend has one) runs while the gpucr
        // half brings the device back.
        let _running = half
            .restore_thread(pid)
            .map(RunGuard::start)
            .transpose()?
            .flatten();
        helper::call(kind, &[])?;
    }
    let resumed = half
        .resume(pid)
        .map_err(HookFailure::from)
        .and_then(|()| fault(FaultStep::PluginResume));
    if let Err(e) = resumed {
        // CRIU goes on after this hook fails: the helper must know, so that the
        // task never runs without its device.
        let kind = request::Kind::ResumeFailed(ResumeFailed {
            pid,
            error: e.message.clone(),
        });
        if let Err(told) = helper::call(kind, &[]) {
            criu::error(&format!(
                "RESUME_DEVICES_LATE pid {pid}: cannot tell the helper this failed: {told}"
            ));
        }
        return Err(e);
    }
    criu::info(&format!(
        "RESUME_DEVICES_LATE pid {pid}: device memory restored"
    ));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_without_gpucr_say_not_ours() {
        assert!(
            !helper::configured(),
            "{} is set in the tests' environment: unset it, these hooks are tested \
             without gpucr",
            gpucr_abi::ENV_HELPER_FD
        );
        // SAFETY: the hooks take plain integers and null pointers, which they check;
        // fd -1 is never used when unconfigured.
        unsafe {
            assert_eq!(pause_devices(1), NOT_OURS);
            assert_eq!(checkpoint_devices(1), NOT_OURS);
            assert_eq!(dump_ext_file(-1, 1), NOT_OURS);
            assert_eq!(handle_device_vma(-1, std::ptr::null()), NOT_OURS);
            assert_eq!(
                update_vma_map(
                    std::ptr::null(),
                    0,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                NOT_OURS
            );
            assert_eq!(restore_ext_file(1), NOT_OURS);
            assert_eq!(restore_ext_file_unknown_abi(1), NOT_OURS);
            assert_eq!(dump_devices_late(1), NOT_OURS);
            let mut retry = true;
            assert_eq!(restore_ext_file_retry(1, &mut retry), NOT_OURS);
            assert!(!retry, "retry_needed is always answered");
            assert_eq!(resume_devices_late(1), NOT_OURS);
        }
    }

    #[test]
    fn errors_keep_their_errno_and_panics_become_eio() {
        let failure = |errno| HookFailure {
            errno,
            kind: PluginFailureKind::Device,
            message: "boom".into(),
        };
        assert_eq!(guard("t", || Err(failure(libc::ENOSPC))), -libc::ENOSPC);
        assert_eq!(
            guard("t", || Err(
                HelperError::Connect(nix::Error::ECONNREFUSED).into()
            )),
            -libc::ECONNREFUSED
        );
        assert_eq!(
            guard("t", || Err(HalfError::new(libc::EPERM, "no").into())),
            -libc::EPERM
        );
        assert_eq!(guard("t", || panic!("boom")), -libc::EIO);
        assert_eq!(guard("t", || Ok(5)), 5);
    }
}
