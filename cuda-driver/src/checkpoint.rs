//! The checkpoint API: a CUDA process's state, its restore thread, and lock, checkpoint,
//! restore and unlock, with host staging (the driver moves device memory into the
//! process) or custom storage (CUDA 13.4: the driver maps the process's device memory
//! into the caller, which copies it, then completes the operation).

use std::ffi::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::time::Duration;

use crate::app::DevicePtr;
use crate::driver::Driver;
use crate::error::Error;
use crate::layout::{CustomStorageInfo, GpuPair, LayoutError};
use crate::result;
use crate::uuid::Uuid;

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING` (0).
    Running,
    /// `CU_PROCESS_STATE_LOCKED` (1): no new CUDA calls run.
    Locked,
    /// `CU_PROCESS_STATE_CHECKPOINTED` (2): device memory is out of the GPUs.
    Checkpointed,
    /// `CU_PROCESS_STATE_FAILED` (3): unrecoverable.
    Failed,
    /// `CU_PROCESS_STATE_CHECKPOINTING` (4, newer drivers): a checkpoint in progress.
    Checkpointing,
    /// `CU_PROCESS_STATE_RESTORING` (5, newer drivers): a restore in progress.
    Restoring,
}

impl ProcessState {
    /// From the driver's number.
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::Running,
            1 => Self::Locked,
            2 => Self::Checkpointed,
            3 => Self::Failed,
            4 => Self::Checkpointing,
            5 => Self::Restoring,
            _ => return None,
        })
    }

    /// The driver's number.
    pub fn to_raw(self) -> i32 {
        self as i32
    }

    /// The state's name in lower case ("running", "locked", "checkpointed", ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Locked => "locked",
            Self::Checkpointed => "checkpointed",
            Self::Failed => "failed",
            Self::Checkpointing => "checkpointing",
            Self::Restoring => "restoring",
        }
    }
}

/// The handle of a custom-storage operation, for [`Driver::operation_complete`]. Not
/// `Clone`: one owner completes the operation, and may keep the handle when that
/// fails (the regions are then still mapped).
#[derive(Debug, PartialEq, Eq)]
pub struct OperationHandle(NonNull<c_void>);

// SAFETY: the handle is an opaque token the driver hands out; it is only passed back to
// the driver, from whichever thread.
unsafe impl Send for OperationHandle {}
// SAFETY: as above; `&OperationHandle` gives no access to anything.
unsafe impl Sync for OperationHandle {}

impl OperationHandle {
    /// The raw handle.
    pub fn as_ptr(&self) -> *mut c_void {
        self.0.as_ptr()
    }
}

/// One GPU's memory of a custom-storage operation, mapped into this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRegion {
    /// The memory (copy it with [`Driver::memcpy_dtoh`] / [`Driver::memcpy_htod`] with
    /// a context of that GPU current).
    pub dev_ptr: DevicePtr,
    /// Its length in bytes.
    pub size: usize,
    /// The driver's stream for it (`CUstream`, as an address).
    pub stream: usize,
}

/// What a custom-storage checkpoint or restore hands the caller.
#[derive(Debug)]
pub struct CustomStorage {
    /// Complete the operation with this.
    pub handle: OperationHandle,
    /// One region per GPU of the process.
    pub devices: Vec<DeviceRegion>,
}

impl Driver {
    /// `cuCheckpointProcessGetState`.
    pub fn process_state(&self, pid: i32) -> Result<ProcessState, Error> {
        let mut raw: c_int = -1;
        // SAFETY: `raw` is a writable int.
        let code = unsafe { (self.api.get_state)(pid, &mut raw) };
        self.check(code, "cuCheckpointProcessGetState", Some(pid))?;
        ProcessState::from_raw(raw).ok_or(Error::UnknownState { state: raw, pid })
    }

    /// `cuCheckpointProcessGetRestoreThreadId`: the tid of the process's CUDA restore
    /// thread, or `None` when the process does not use CUDA (the driver answers
    /// `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_NOT_INITIALIZED`, as CRIU's cuda plugin
    /// reads it).
    pub fn restore_thread_id(&self, pid: i32) -> Result<Option<i32>, Error> {
        let mut tid: c_int = 0;
        // SAFETY: `tid` is a writable int.
        let code = unsafe { (self.api.get_restore_tid)(pid, &mut tid) };
        if code == result::INVALID_VALUE || code == result::NOT_INITIALIZED {
            return Ok(None);
        }
        self.check(code, "cuCheckpointProcessGetRestoreThreadId", Some(pid))?;
        Ok(Some(tid))
    }

    /// `cuCheckpointProcessLock`: RUNNING to LOCKED, waiting at most `timeout` (`None`:
    /// no limit) for the work already submitted.
    pub fn lock(&self, pid: i32, timeout: Option<Duration>) -> Result<(), Error> {
        let timeout_ms = match timeout {
            None => 0,
            Some(t) => u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1),
        };
        let mut args = crate::layout::LockArgs {
            timeout_ms,
            ..Default::default()
        };
        // SAFETY: `args` is a 64-byte CUcheckpointLockArgs, the same in every layout.
        let code =
            unsafe { (self.api.lock)(pid, (&mut args as *mut crate::layout::LockArgs).cast()) };
        Ok(self.check(code, "cuCheckpointProcessLock", Some(pid))?)
    }

    /// `cuCheckpointProcessCheckpoint` with host staging: LOCKED to CHECKPOINTED, device
    /// memory moved into the process's own memory.
    pub fn checkpoint(&self, pid: i32) -> Result<(), Error> {
        let mut args = self.layout().checkpoint_args(None)?;
        // SAFETY: `args` is a 64-byte struct of the driver's layout.
        let code = unsafe { (self.api.checkpoint)(pid, args.as_mut_ptr()) };
        Ok(self.check(code, "cuCheckpointProcessCheckpoint", Some(pid))?)
    }

    /// `cuCheckpointProcessCheckpoint` with custom storage (CUDA 13.4): the process's
    /// device memory mapped into this process; copy it out, then
    /// [`operation_complete`](Self::operation_complete) moves the process to
    /// CHECKPOINTED.
    pub fn checkpoint_custom(&self, pid: i32) -> Result<CustomStorage, Error> {
        self.require_custom_storage()?;
        let mut out: *mut CustomStorageInfo = ptr::null_mut();
        let mut args = self.layout().checkpoint_args(Some(&mut out))?;
        // SAFETY: `args` is a 64-byte struct of the driver's layout; its out pointer
        // points to `out`, which lives across the call.
        let code = unsafe { (self.api.checkpoint)(pid, args.as_mut_ptr()) };
        self.check(code, "cuCheckpointProcessCheckpoint", Some(pid))?;
        // SAFETY: on success the driver stored in `out` a pointer to its information,
        // valid until the operation completes.
        unsafe { read_custom_storage(out, "Checkpoint", pid) }
    }

    /// `cuCheckpointProcessRestore` from host staging: CHECKPOINTED to LOCKED, each GPU
    /// of `pairs` (old UUID, new UUID) restored onto its new one (empty: the same GPUs).
    pub fn restore(&self, pid: i32, pairs: &[(Uuid, Uuid)]) -> Result<(), Error> {
        let pairs = gpu_pairs(pairs);
        let mut args = self.layout().restore_args(&pairs, None)?;
        // SAFETY: `args` is a 64-byte struct of the driver's layout; its pairs point to
        // `pairs`, which lives across the call.
        let code = unsafe { (self.api.restore)(pid, args.as_mut_ptr()) };
        Ok(self.check(code, "cuCheckpointProcessRestore", Some(pid))?)
    }

    /// `cuCheckpointProcessRestore` with custom storage (CUDA 13.4): the process's
    /// device memory, recreated empty, mapped into this process; copy it in, then
    /// [`operation_complete`](Self::operation_complete) moves the process to LOCKED.
    pub fn restore_custom(&self, pid: i32, pairs: &[(Uuid, Uuid)]) -> Result<CustomStorage, Error> {
        self.require_custom_storage()?;
        let pairs = gpu_pairs(pairs);
        let mut out: *mut CustomStorageInfo = ptr::null_mut();
        let mut args = self.layout().restore_args(&pairs, Some(&mut out))?;
        // SAFETY: `args` is a 64-byte struct of the driver's layout; its pointers point
        // to `pairs` and `out`, which live across the call.
        let code = unsafe { (self.api.restore)(pid, args.as_mut_ptr()) };
        self.check(code, "cuCheckpointProcessRestore", Some(pid))?;
        // SAFETY: on success the driver stored in `out` a pointer to its information,
        // valid until the operation completes.
        unsafe { read_custom_storage(out, "Restore", pid) }
    }

    /// `cuCheckpointProcessUnlock`: LOCKED to RUNNING.
    pub fn unlock(&self, pid: i32) -> Result<(), Error> {
        let mut args = crate::layout::UnlockArgs::default();
        // SAFETY: `args` is a 64-byte CUcheckpointUnlockArgs, the same in every layout.
        let code =
            unsafe { (self.api.unlock)(pid, (&mut args as *mut crate::layout::UnlockArgs).cast()) };
        Ok(self.check(code, "cuCheckpointProcessUnlock", Some(pid))?)
    }

    /// `cuCheckpointOperationComplete` (CUDA 13.4): ends a custom-storage checkpoint or
    /// restore; its regions are unmapped. Borrowed: after a failure the operation is
    /// still open, its regions mapped, and the caller may copy them again or retry; a
    /// handle completed twice is the driver's error.
    pub fn operation_complete(&self, handle: &OperationHandle) -> Result<(), Error> {
        let Some(complete) = self.api.operation_complete else {
            return Err(LayoutError::CustomStorageUnsupported(self.layout()).into());
        };
        // SAFETY: `handle` came from the driver's custom-storage information; a handle
        // the driver no longer knows is answered with an error, not dereferenced.
        let code = unsafe { complete(handle.as_ptr()) };
        Ok(self.check(code, "cuCheckpointOperationComplete", None)?)
    }

    fn require_custom_storage(&self) -> Result<(), Error> {
        if self.has_custom_storage() {
            Ok(())
        } else {
            Err(LayoutError::CustomStorageUnsupported(self.layout()).into())
        }
    }
}

fn gpu_pairs(pairs: &[(Uuid, Uuid)]) -> Vec<GpuPair> {
    pairs
        .iter()
        .map(|(old, new)| GpuPair {
            old_uuid: old.to_cu(),
            new_uuid: new.to_cu(),
        })
        .collect()
}

/// Copies the driver's custom-storage information.
///
/// # Safety
/// `info` is null or points to a `CUcheckpointCustomStorageInfo` whose `perDeviceData`
/// holds `deviceCount` entries.
unsafe fn read_custom_storage(
    info: *mut CustomStorageInfo,
    operation: &'static str,
    pid: i32,
) -> Result<CustomStorage, Error> {
    let missing = || Error::NoCustomStorage { operation, pid };
    if info.is_null() {
        return Err(missing());
    }
    // SAFETY: the caller guarantees `info` points to the driver's information.
    let info = unsafe { ptr::read(info) };
    let handle = NonNull::new(info.handle).ok_or_else(missing)?;
    let entries = if info.device_count == 0 {
        &[][..]
    } else if info.per_device_data.is_null() {
        return Err(missing());
    } else {
        // SAFETY: the caller guarantees `deviceCount` entries at `perDeviceData`.
        unsafe { std::slice::from_raw_parts(info.per_device_data, info.device_count as usize) }
    };
    Ok(CustomStorage {
        handle: OperationHandle(handle),
        devices: entries
            .iter()
            .map(|d| DeviceRegion {
                dev_ptr: DevicePtr(d.dev_ptr),
                size: d.size,
                stream: d.stream as usize,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_have_the_drivers_numbers() {
        for (raw, state) in [
            (0, ProcessState::Running),
            (1, ProcessState::Locked),
            (2, ProcessState::Checkpointed),
            (3, ProcessState::Failed),
        ] {
            assert_eq!(ProcessState::from_raw(raw), Some(state));
            assert_eq!(state.to_raw(), raw);
        }
        assert_eq!(ProcessState::from_raw(9), None);
    }
}
