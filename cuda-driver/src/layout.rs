//! The checkpoint API's argument structs, one `#[repr(C)]` type per layout, and the
//! choice of layout from `cuDriverGetVersion`.
//!
//! Every argument struct is 64 bytes and its reserved bytes must be zero. The layouts,
//! and where each was read:
//!
//! | struct | 12.8–12.9 | 13.0–13.2 | 13.3 | 13.4+ |
//! |---|---|---|---|---|
//! | `CUcheckpointLockArgs` | `timeoutMs; reserved0; reserved1[7]` | same | same | same |
//! | `CUcheckpointCheckpointArgs` | `reserved[8]` (u64) | same | same | `customStorageInfo_out; reserved[56]` |
//! | `CUcheckpointRestoreArgs` | `reserved[8]` (u64) | `gpuPairs; gpuPairsCount; reserved[44]; reserved1` | `gpuPairs; gpuPairsCount; reserved[52]` | `gpuPairs; gpuPairsCount; padding0; customStorageInfo_out; reserved[40]` |
//! | `CUcheckpointUnlockArgs` | `reserved[8]` (u64) | same | same | same |
//!
//! Checked against NVIDIA's own `cuda.h` of CUDA 12.8, 12.9, 13.0, 13.1, 13.2, 13.3, 13.4
//! and 13.5 (the runtime wheels on PyPI, `scripts/fetch-cuda-headers.sh`) by
//! `tests/cuda_headers.rs`: for each version, the layout [`ArgsLayout::from_driver_version`]
//! picks for its `CUDA_VERSION` must have the header's fields, in order, at the header's
//! offsets and sizes ([`crate::header_facts`]). In those headers:
//! * 12.8–12.9: all four structs are reserved words apart from `timeoutMs`.
//! * 13.0–13.2: `CUcheckpointGpuPair *gpuPairs; unsigned int gpuPairsCount;
//!   char reserved[52 - sizeof(CUcheckpointGpuPair *)]; cuuint64_t reserved1`.
//! * 13.3: `gpuPairs; gpuPairsCount; char reserved[64 - sizeof(void *) - sizeof(unsigned int)]`.
//! * 13.4 and 13.5: `CUcheckpointRestoreArgs` has `padding0`, `customStorageInfo_out`,
//!   `reserved[64 - 8 - 2 * 4 - 8]`; `CUcheckpointCheckpointArgs` has
//!   `customStorageInfo_out; reserved[64 - 8]`; `CUcheckpointCustomStorageInfo` and
//!   `CUcheckpointCustomStoragePerDeviceData` appear.
//!
//! 12.8 and 12.9 share a layout; so do 13.0, 13.1 and 13.2, and 13.4 and 13.5.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::ptr;

use crate::sys::{CUcheckpointOperationHandle, CUdeviceptr, CUstream, CUuuid};

/// The oldest driver this crate drives: r570, CUDA 12.8, where the checkpoint API is
/// documented and lock, checkpoint, restore and unlock are separate calls.
pub const MIN_DRIVER_VERSION: i32 = 12080;
/// The first version with GPU UUID pairs in `CUcheckpointRestoreArgs` (r580).
pub const GPU_PAIRS_VERSION: i32 = 13000;
/// The first version with the 13.3 restore layout.
pub const V13_3: i32 = 13030;
/// The first version with custom storage (`customStorageInfo_out`,
/// `cuCheckpointOperationComplete`).
pub const CUSTOM_STORAGE_VERSION: i32 = 13040;

/// Which argument layouts a driver takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ArgsLayout {
    /// CUDA 12.8 and 12.9: every field but `timeoutMs` reserved.
    Cuda12_9,
    /// CUDA 13.0 to 13.2: GPU pairs in the restore arguments.
    Cuda13_0,
    /// CUDA 13.3: the restore arguments' reserved tail changed.
    Cuda13_3,
    /// CUDA 13.4 and newer (13.5 has the same structs): custom storage.
    Cuda13_4,
}

/// Layouts that cannot express a request, and argument structs that break the rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The driver is older than this crate supports.
    #[error(
        "CUDA driver version {} ({found}) is too old: the checkpoint API needs {} ({needed}, driver r570) or newer",
        version_text(*found),
        version_text(*needed)
    )]
    DriverTooOld {
        /// What `cuDriverGetVersion` reported.
        found: i32,
        /// The oldest version supported.
        needed: i32,
    },
    /// GPU UUID pairs need CUDA 13.0.
    #[error("restoring onto other GPUs needs CUDA 13.0 (driver r580) or newer; the driver has the {0:?} layout")]
    GpuPairsUnsupported(ArgsLayout),
    /// Custom storage needs CUDA 13.4.
    #[error("custom storage needs CUDA 13.4 or newer; the driver has the {0:?} layout")]
    CustomStorageUnsupported(ArgsLayout),
    /// More pairs than `gpuPairsCount` holds.
    #[error("{0} GPU pairs do not fit in gpuPairsCount")]
    TooManyPairs(usize),
    /// A reserved field was not zero.
    #[error("{0}: reserved bytes are not zero")]
    ReservedNotZero(&'static str),
}

/// `12080` as `12.8`.
pub fn version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

impl ArgsLayout {
    /// The layout of a driver reporting `version` from `cuDriverGetVersion`.
    pub fn from_driver_version(version: i32) -> Result<Self, LayoutError> {
        Ok(match version {
            v if v < MIN_DRIVER_VERSION => {
                return Err(LayoutError::DriverTooOld {
                    found: v,
                    needed: MIN_DRIVER_VERSION,
                })
            }
            v if v < GPU_PAIRS_VERSION => Self::Cuda12_9,
            v if v < V13_3 => Self::Cuda13_0,
            v if v < CUSTOM_STORAGE_VERSION => Self::Cuda13_3,
            _ => Self::Cuda13_4,
        })
    }

    /// Whether restore arguments carry GPU UUID pairs.
    pub fn has_gpu_pairs(self) -> bool {
        self >= Self::Cuda13_0
    }

    /// Whether checkpoint and restore arguments carry `customStorageInfo_out`.
    pub fn has_custom_storage(self) -> bool {
        self >= Self::Cuda13_4
    }

    /// Checkpoint arguments, with `customStorageInfo_out` set to `out` when given.
    pub fn checkpoint_args<'a>(
        self,
        out: Option<&'a mut *mut CustomStorageInfo>,
    ) -> Result<CheckpointArgs<'a>, LayoutError> {
        Ok(match out {
            None => CheckpointArgs::Reserved(CheckpointArgsReserved::default(), PhantomData),
            Some(out) if self.has_custom_storage() => {
                let args = CheckpointArgs13_4 {
                    custom_storage_info_out: out,
                    ..Default::default()
                };
                CheckpointArgs::Custom(args, PhantomData)
            }
            Some(_) => return Err(LayoutError::CustomStorageUnsupported(self)),
        })
    }

    /// Restore arguments for `pairs`, with `customStorageInfo_out` set to `out` when
    /// given.
    pub fn restore_args<'a>(
        self,
        pairs: &'a [GpuPair],
        out: Option<&'a mut *mut CustomStorageInfo>,
    ) -> Result<RestoreArgs<'a>, LayoutError> {
        let count =
            u32::try_from(pairs.len()).map_err(|_| LayoutError::TooManyPairs(pairs.len()))?;
        let pairs_ptr = if pairs.is_empty() {
            ptr::null_mut()
        } else {
            pairs.as_ptr().cast_mut()
        };
        if !pairs.is_empty() && !self.has_gpu_pairs() {
            return Err(LayoutError::GpuPairsUnsupported(self));
        }
        if out.is_some() && !self.has_custom_storage() {
            return Err(LayoutError::CustomStorageUnsupported(self));
        }
        let raw = match self {
            Self::Cuda12_9 => RawRestoreArgs::V12_9(RestoreArgs12_9::default()),
            Self::Cuda13_0 => RawRestoreArgs::V13_0(RestoreArgs13_0 {
                gpu_pairs: pairs_ptr,
                gpu_pairs_count: count,
                ..Default::default()
            }),
            Self::Cuda13_3 => RawRestoreArgs::V13_3(RestoreArgs13_3 {
                gpu_pairs: pairs_ptr,
                gpu_pairs_count: count,
                ..Default::default()
            }),
            Self::Cuda13_4 => RawRestoreArgs::V13_4(RestoreArgs13_4 {
                gpu_pairs: pairs_ptr,
                gpu_pairs_count: count,
                custom_storage_info_out: out.map_or(ptr::null_mut(), |o| o as *mut _),
                ..Default::default()
            }),
        };
        Ok(RestoreArgs(raw, PhantomData))
    }

    /// Reads checkpoint arguments a caller passed (null: none).
    ///
    /// # Safety
    /// `args` is null or points to 64 readable bytes.
    pub unsafe fn decode_checkpoint(
        self,
        args: *const c_void,
    ) -> Result<DecodedCheckpoint, LayoutError> {
        if args.is_null() {
            return Ok(DecodedCheckpoint {
                custom_storage_info_out: ptr::null_mut(),
            });
        }
        if self.has_custom_storage() {
            // SAFETY: the caller guarantees 64 readable bytes; read_unaligned needs no
            // alignment.
            let a = unsafe { ptr::read_unaligned(args.cast::<CheckpointArgs13_4>()) };
            zero(&a.reserved, "CUcheckpointCheckpointArgs.reserved")?;
            Ok(DecodedCheckpoint {
                custom_storage_info_out: a.custom_storage_info_out,
            })
        } else {
            // SAFETY: as above.
            let a = unsafe { ptr::read_unaligned(args.cast::<CheckpointArgsReserved>()) };
            zero(&a.reserved, "CUcheckpointCheckpointArgs.reserved")?;
            Ok(DecodedCheckpoint {
                custom_storage_info_out: ptr::null_mut(),
            })
        }
    }

    /// Reads restore arguments a caller passed (null: none), copying its GPU pairs.
    ///
    /// # Safety
    /// `args` is null or points to 64 readable bytes, whose `gpuPairs` (when the layout
    /// has it and the count is not zero) points to `gpuPairsCount` readable pairs.
    pub unsafe fn decode_restore(self, args: *const c_void) -> Result<DecodedRestore, LayoutError> {
        let mut out = DecodedRestore {
            pairs: Vec::new(),
            custom_storage_info_out: ptr::null_mut(),
        };
        if args.is_null() {
            return Ok(out);
        }
        const WHAT: &str = "CUcheckpointRestoreArgs.reserved";
        let (pairs, count) = match self {
            Self::Cuda12_9 => {
                // SAFETY: the caller guarantees 64 readable bytes.
                let a = unsafe { ptr::read_unaligned(args.cast::<RestoreArgs12_9>()) };
                zero(&a.reserved, WHAT)?;
                (ptr::null(), 0)
            }
            Self::Cuda13_0 => {
                // SAFETY: as above.
                let a = unsafe { ptr::read_unaligned(args.cast::<RestoreArgs13_0>()) };
                zero(&a.reserved, WHAT)?;
                zero(&[a.reserved1], WHAT)?;
                (a.gpu_pairs.cast_const(), a.gpu_pairs_count)
            }
            Self::Cuda13_3 => {
                // SAFETY: as above.
                let a = unsafe { ptr::read_unaligned(args.cast::<RestoreArgs13_3>()) };
                zero(&a.reserved, WHAT)?;
                (a.gpu_pairs.cast_const(), a.gpu_pairs_count)
            }
            Self::Cuda13_4 => {
                // SAFETY: as above.
                let a = unsafe { ptr::read_unaligned(args.cast::<RestoreArgs13_4>()) };
                zero(&a.reserved, WHAT)?;
                zero(&[a.padding0], "CUcheckpointRestoreArgs.padding0")?;
                out.custom_storage_info_out = a.custom_storage_info_out;
                (a.gpu_pairs.cast_const(), a.gpu_pairs_count)
            }
        };
        if count > 0 && !pairs.is_null() {
            // SAFETY: the caller guarantees `count` readable pairs at `pairs`.
            let slice = unsafe { std::slice::from_raw_parts(pairs, count as usize) };
            out.pairs = slice.to_vec();
        }
        Ok(out)
    }
}

/// Decoded lock arguments: the timeout in milliseconds (0: none).
///
/// # Safety
/// `args` is null or points to 64 readable bytes.
pub unsafe fn decode_lock(args: *const c_void) -> Result<u32, LayoutError> {
    if args.is_null() {
        return Ok(0);
    }
    // SAFETY: the caller guarantees 64 readable bytes.
    let a = unsafe { ptr::read_unaligned(args.cast::<LockArgs>()) };
    zero(&[a.reserved0], "CUcheckpointLockArgs.reserved0")?;
    zero(&a.reserved1, "CUcheckpointLockArgs.reserved1")?;
    Ok(a.timeout_ms)
}

/// Checks unlock arguments.
///
/// # Safety
/// `args` is null or points to 64 readable bytes.
pub unsafe fn decode_unlock(args: *const c_void) -> Result<(), LayoutError> {
    if args.is_null() {
        return Ok(());
    }
    // SAFETY: the caller guarantees 64 readable bytes.
    let a = unsafe { ptr::read_unaligned(args.cast::<UnlockArgs>()) };
    zero(&a.reserved, "CUcheckpointUnlockArgs.reserved")
}

fn zero<T: Copy + Default + PartialEq>(v: &[T], what: &'static str) -> Result<(), LayoutError> {
    if v.iter().all(|x| *x == T::default()) {
        Ok(())
    } else {
        Err(LayoutError::ReservedNotZero(what))
    }
}

/// What checkpoint arguments asked for.
#[derive(Debug)]
pub struct DecodedCheckpoint {
    /// `customStorageInfo_out` (null: checkpoint into the process's host memory).
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
}

/// What restore arguments asked for.
#[derive(Debug)]
pub struct DecodedRestore {
    /// The GPU pairs (empty: the same GPUs).
    pub pairs: Vec<GpuPair>,
    /// `customStorageInfo_out` (null: restore from the process's host memory).
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
}

/// `CUcheckpointLockArgs` (every version).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LockArgs {
    /// `timeoutMs`: how long to wait for the lock, 0 for no limit.
    pub timeout_ms: u32,
    /// `reserved0`.
    pub reserved0: u32,
    /// `reserved1[7]`.
    pub reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs` up to 13.3: `cuuint64_t reserved[8]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointArgsReserved {
    /// `reserved[8]`.
    pub reserved: [u64; 8],
}

/// `CUcheckpointCheckpointArgs` from 13.4.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CheckpointArgs13_4 {
    /// `CUcheckpointCustomStorageInfo **customStorageInfo_out` (null: host staging).
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    /// `char reserved[64 - sizeof(void *)]`.
    pub reserved: [u8; 56],
}

impl Default for CheckpointArgs13_4 {
    fn default() -> Self {
        Self {
            custom_storage_info_out: ptr::null_mut(),
            reserved: [0; 56],
        }
    }
}

/// `CUcheckpointGpuPair`: restore the memory of `old_uuid` onto `new_uuid`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuPair {
    /// `oldUuid`: the GPU that was checkpointed.
    pub old_uuid: CUuuid,
    /// `newUuid`: the GPU to restore onto.
    pub new_uuid: CUuuid,
}

/// `CUcheckpointRestoreArgs` in 12.8 and 12.9: `cuuint64_t reserved[8]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreArgs12_9 {
    /// `reserved[8]`.
    pub reserved: [u64; 8],
}

/// `CUcheckpointRestoreArgs` in 13.0 to 13.2.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RestoreArgs13_0 {
    /// `gpuPairs`.
    pub gpu_pairs: *mut GpuPair,
    /// `gpuPairsCount`.
    pub gpu_pairs_count: u32,
    /// `char reserved[52 - sizeof(CUcheckpointGpuPair *)]`.
    pub reserved: [u8; 44],
    /// `cuuint64_t reserved1`.
    pub reserved1: u64,
}

/// `CUcheckpointRestoreArgs` in 13.3.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RestoreArgs13_3 {
    /// `gpuPairs`.
    pub gpu_pairs: *mut GpuPair,
    /// `gpuPairsCount`.
    pub gpu_pairs_count: u32,
    /// `char reserved[64 - sizeof(void *) - sizeof(unsigned int)]`.
    pub reserved: [u8; 52],
}

/// `CUcheckpointRestoreArgs` from 13.4.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RestoreArgs13_4 {
    /// `gpuPairs`.
    pub gpu_pairs: *mut GpuPair,
    /// `gpuPairsCount`.
    pub gpu_pairs_count: u32,
    /// `padding0`.
    pub padding0: u32,
    /// `CUcheckpointCustomStorageInfo **customStorageInfo_out` (null: from host memory).
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    /// `char reserved[64 - 8 - 2 * 4 - 8]`.
    pub reserved: [u8; 40],
}

/// `CUcheckpointUnlockArgs` (every version).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UnlockArgs {
    /// `reserved[8]`.
    pub reserved: [u64; 8],
}

/// `CUcheckpointCustomStoragePerDeviceData` (13.4): one GPU's memory, mapped into the
/// caller.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CustomStoragePerDeviceData {
    /// `devPtr`: the mapped memory, contiguous.
    pub dev_ptr: CUdeviceptr,
    /// `size`: its length in bytes.
    pub size: usize,
    /// `stream`: a stream in that GPU's primary context.
    pub stream: CUstream,
}

/// `CUcheckpointCustomStorageInfo` (13.4): what a custom-storage checkpoint or restore
/// returns through `customStorageInfo_out`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CustomStorageInfo {
    /// `handle`, for `cuCheckpointOperationComplete`.
    pub handle: CUcheckpointOperationHandle,
    /// `perDeviceData`: `deviceCount` entries.
    pub per_device_data: *mut CustomStoragePerDeviceData,
    /// `deviceCount`.
    pub device_count: u32,
}

macro_rules! impl_zeroed_default {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: every field is an integer, a byte array or a raw pointer, for
                // which all-zero bytes are a valid value (null for the pointers).
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
impl_zeroed_default!(RestoreArgs13_0, RestoreArgs13_3, RestoreArgs13_4);

const _: () = {
    assert!(size_of::<LockArgs>() == 64);
    assert!(offset_of!(LockArgs, timeout_ms) == 0);
    assert!(offset_of!(LockArgs, reserved0) == 4);
    assert!(offset_of!(LockArgs, reserved1) == 8);

    assert!(size_of::<CheckpointArgsReserved>() == 64);
    assert!(offset_of!(CheckpointArgsReserved, reserved) == 0);
    assert!(size_of::<CheckpointArgs13_4>() == 64);
    assert!(offset_of!(CheckpointArgs13_4, custom_storage_info_out) == 0);
    assert!(offset_of!(CheckpointArgs13_4, reserved) == 8);

    assert!(size_of::<GpuPair>() == 32);
    assert!(offset_of!(GpuPair, old_uuid) == 0);
    assert!(offset_of!(GpuPair, new_uuid) == 16);

    assert!(size_of::<RestoreArgs12_9>() == 64);
    assert!(offset_of!(RestoreArgs12_9, reserved) == 0);
    assert!(size_of::<RestoreArgs13_0>() == 64);
    assert!(offset_of!(RestoreArgs13_0, gpu_pairs) == 0);
    assert!(offset_of!(RestoreArgs13_0, gpu_pairs_count) == 8);
    assert!(offset_of!(RestoreArgs13_0, reserved) == 12);
    assert!(offset_of!(RestoreArgs13_0, reserved1) == 56);
    assert!(size_of::<RestoreArgs13_3>() == 64);
    assert!(offset_of!(RestoreArgs13_3, gpu_pairs) == 0);
    assert!(offset_of!(RestoreArgs13_3, gpu_pairs_count) == 8);
    assert!(offset_of!(RestoreArgs13_3, reserved) == 12);
    assert!(size_of::<RestoreArgs13_4>() == 64);
    assert!(offset_of!(RestoreArgs13_4, gpu_pairs) == 0);
    assert!(offset_of!(RestoreArgs13_4, gpu_pairs_count) == 8);
    assert!(offset_of!(RestoreArgs13_4, padding0) == 12);
    assert!(offset_of!(RestoreArgs13_4, custom_storage_info_out) == 16);
    assert!(offset_of!(RestoreArgs13_4, reserved) == 24);

    assert!(size_of::<UnlockArgs>() == 64);
    assert!(offset_of!(UnlockArgs, reserved) == 0);

    assert!(size_of::<CustomStoragePerDeviceData>() == 24);
    assert!(offset_of!(CustomStoragePerDeviceData, dev_ptr) == 0);
    assert!(offset_of!(CustomStoragePerDeviceData, size) == 8);
    assert!(offset_of!(CustomStoragePerDeviceData, stream) == 16);
    assert!(size_of::<CustomStorageInfo>() == 24);
    assert!(offset_of!(CustomStorageInfo, handle) == 0);
    assert!(offset_of!(CustomStorageInfo, per_device_data) == 8);
    assert!(offset_of!(CustomStorageInfo, device_count) == 16);
};

/// Checkpoint arguments of the layout a driver takes, borrowing the out pointer they name.
#[derive(Debug)]
pub enum CheckpointArgs<'a> {
    /// No custom storage (any layout: the 13.4 struct with a null pointer is all zeroes
    /// too).
    Reserved(CheckpointArgsReserved, PhantomData<&'a mut ()>),
    /// 13.4 with `customStorageInfo_out` set.
    Custom(CheckpointArgs13_4, PhantomData<&'a mut ()>),
}

impl CheckpointArgs<'_> {
    /// The pointer to pass to `cuCheckpointProcessCheckpoint`.
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        match self {
            Self::Reserved(a, _) => (a as *mut CheckpointArgsReserved).cast(),
            Self::Custom(a, _) => (a as *mut CheckpointArgs13_4).cast(),
        }
    }
}

#[derive(Debug)]
enum RawRestoreArgs {
    V12_9(RestoreArgs12_9),
    V13_0(RestoreArgs13_0),
    V13_3(RestoreArgs13_3),
    V13_4(RestoreArgs13_4),
}

/// Restore arguments of the layout a driver takes, borrowing the pairs and the out
/// pointer they point to.
#[derive(Debug)]
pub struct RestoreArgs<'a>(RawRestoreArgs, PhantomData<&'a mut ()>);

impl RestoreArgs<'_> {
    /// The pointer to pass to `cuCheckpointProcessRestore`.
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        match &mut self.0 {
            RawRestoreArgs::V12_9(a) => (a as *mut RestoreArgs12_9).cast(),
            RawRestoreArgs::V13_0(a) => (a as *mut RestoreArgs13_0).cast(),
            RawRestoreArgs::V13_3(a) => (a as *mut RestoreArgs13_3).cast(),
            RawRestoreArgs::V13_4(a) => (a as *mut RestoreArgs13_4).cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(p: *mut c_void) -> [u8; 64] {
        // SAFETY: every argument struct is 64 bytes (asserted above) and `p` points to one.
        unsafe { ptr::read_unaligned(p.cast::<[u8; 64]>()) }
    }

    #[test]
    fn versions_choose_layouts() {
        assert_eq!(
            ArgsLayout::from_driver_version(12070),
            Err(LayoutError::DriverTooOld {
                found: 12070,
                needed: 12080
            })
        );
        assert_eq!(
            ArgsLayout::from_driver_version(12080),
            Ok(ArgsLayout::Cuda12_9)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(12090),
            Ok(ArgsLayout::Cuda12_9)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(13000),
            Ok(ArgsLayout::Cuda13_0)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(13020),
            Ok(ArgsLayout::Cuda13_0)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(13030),
            Ok(ArgsLayout::Cuda13_3)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(13040),
            Ok(ArgsLayout::Cuda13_4)
        );
        assert_eq!(
            ArgsLayout::from_driver_version(14000),
            Ok(ArgsLayout::Cuda13_4)
        );
        let msg = ArgsLayout::from_driver_version(12040)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("12.4 (12040)") && msg.contains("12.8 (12080"),
            "{msg}"
        );
    }

    #[test]
    fn restore_args_round_trip_in_every_layout() {
        let pairs = [GpuPair {
            old_uuid: CUuuid { bytes: [1; 16] },
            new_uuid: CUuuid { bytes: [2; 16] },
        }];
        for layout in [
            ArgsLayout::Cuda13_0,
            ArgsLayout::Cuda13_3,
            ArgsLayout::Cuda13_4,
        ] {
            let mut args = layout.restore_args(&pairs, None).unwrap();
            let raw = bytes(args.as_mut_ptr());
            assert_eq!(&raw[..8], &(pairs.as_ptr() as u64).to_ne_bytes());
            assert_eq!(&raw[8..12], &1u32.to_ne_bytes());
            assert!(raw[12..].iter().all(|b| *b == 0), "{layout:?}");
            // SAFETY: `args` is a live 64-byte struct whose pairs point to `pairs`.
            let decoded = unsafe { layout.decode_restore(args.as_mut_ptr()) }.unwrap();
            assert_eq!(decoded.pairs, pairs);
            assert!(decoded.custom_storage_info_out.is_null());
        }
        assert_eq!(
            ArgsLayout::Cuda12_9.restore_args(&pairs, None).unwrap_err(),
            LayoutError::GpuPairsUnsupported(ArgsLayout::Cuda12_9)
        );
        let mut args = ArgsLayout::Cuda12_9.restore_args(&[], None).unwrap();
        assert_eq!(bytes(args.as_mut_ptr()), [0; 64]);
    }

    #[test]
    fn custom_storage_only_from_13_4() {
        let mut out: *mut CustomStorageInfo = ptr::null_mut();
        let expected = (&mut out as *mut *mut CustomStorageInfo) as u64;
        let mut args = ArgsLayout::Cuda13_4
            .checkpoint_args(Some(&mut out))
            .unwrap();
        let raw = bytes(args.as_mut_ptr());
        assert_eq!(&raw[..8], &expected.to_ne_bytes());
        assert!(raw[8..].iter().all(|b| *b == 0));
        // SAFETY: `args` is a live 64-byte struct.
        let decoded = unsafe { ArgsLayout::Cuda13_4.decode_checkpoint(args.as_mut_ptr()) };
        assert_eq!(decoded.unwrap().custom_storage_info_out as u64, expected);

        let mut out2: *mut CustomStorageInfo = ptr::null_mut();
        let mut args = ArgsLayout::Cuda13_4
            .restore_args(&[], Some(&mut out2))
            .unwrap();
        let raw = bytes(args.as_mut_ptr());
        let expected = (&mut out2 as *mut *mut CustomStorageInfo) as u64;
        assert_eq!(&raw[16..24], &expected.to_ne_bytes());
        for layout in [
            ArgsLayout::Cuda12_9,
            ArgsLayout::Cuda13_0,
            ArgsLayout::Cuda13_3,
        ] {
            let mut out: *mut CustomStorageInfo = ptr::null_mut();
            assert_eq!(
                layout.checkpoint_args(Some(&mut out)).unwrap_err(),
                LayoutError::CustomStorageUnsupported(layout)
            );
            let mut out: *mut CustomStorageInfo = ptr::null_mut();
            assert!(layout.restore_args(&[], Some(&mut out)).is_err());
        }
    }

    #[test]
    fn nonzero_reserved_bytes_are_refused() {
        let mut raw = [0u64; 8];
        raw[7] = 1;
        let p = raw.as_mut_ptr().cast::<c_void>();
        // SAFETY: `raw` is 64 readable bytes.
        unsafe {
            assert!(decode_lock(p).is_err());
            assert!(decode_unlock(p).is_err());
            for layout in [
                ArgsLayout::Cuda12_9,
                ArgsLayout::Cuda13_0,
                ArgsLayout::Cuda13_3,
                ArgsLayout::Cuda13_4,
            ] {
                assert!(layout.decode_checkpoint(p).is_err(), "{layout:?}");
                assert!(layout.decode_restore(p).is_err(), "{layout:?}");
            }
        }
        let mut lock = LockArgs {
            timeout_ms: 2500,
            ..Default::default()
        };
        // SAFETY: `lock` is 64 readable bytes.
        let timeout = unsafe { decode_lock((&mut lock as *mut LockArgs).cast()) };
        assert_eq!(timeout, Ok(2500));
    }
}
