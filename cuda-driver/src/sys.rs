//! The raw C types and function signatures of the driver entry points this crate uses,
//! and the CUDA version at which each is requested through `cuGetProcAddress`.
//!
//! Signatures follow `cuda.h` (CUDA 12.8 to 13.4). The checkpoint functions take their
//! argument struct as `*mut c_void` because its layout depends on the driver's version
//! (see [`crate::layout`]); the caller passes a struct of the layout it selected.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult`: an `enum cudaError_enum`, int-sized.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`CUdeviceptr_v2`, `unsigned long long` on LP64).
pub type CUdeviceptr = u64;
/// `CUcontext`: an opaque context handle.
pub type CUcontext = *mut c_void;
/// `CUstream`: an opaque stream handle.
pub type CUstream = *mut c_void;
/// `CUprocessState`: an int-sized enum (see [`crate::ProcessState`]).
pub type CUprocessState = c_int;
/// `CUcheckpointOperationHandle` (CUDA 13.4): an opaque pointer.
pub type CUcheckpointOperationHandle = *mut c_void;

/// `CUuuid`: 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUuuid {
    /// The UUID's bytes, in order.
    pub bytes: [u8; 16],
}

const _: () = {
    assert!(std::mem::size_of::<CUuuid>() == 16);
    assert!(std::mem::align_of::<CUuuid>() == 1);
    assert!(std::mem::offset_of!(CUuuid, bytes) == 0);
};

/// `CU_GET_PROC_ADDRESS_DEFAULT`, the `flags` of `cuGetProcAddress`.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
/// `CUdriverProcAddressQueryResult`: the symbol was found.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
/// `CUdriverProcAddressQueryResult`: no such symbol.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
/// `CUdriverProcAddressQueryResult`: the symbol exists only at a newer CUDA version.
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// `cuGetProcAddress_v2` (CUDA 12.0+): `(symbol, pfn, cudaVersion, flags, symbolStatus)`.
pub type PfnGetProcAddressV2 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult;
/// `cuGetProcAddress` (CUDA 11.3 to 11.8 ABI, still exported): without `symbolStatus`.
pub type PfnGetProcAddress = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult;
/// `cuInit(unsigned int Flags)`.
pub type PfnInit = unsafe extern "C" fn(flags: c_uint) -> CUresult;
/// `cuDriverGetVersion(int *driverVersion)`.
pub type PfnDriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> CUresult;
/// `cuGetErrorName(CUresult error, const char **pStr)`.
pub type PfnGetErrorName =
    unsafe extern "C" fn(error: CUresult, name: *mut *const c_char) -> CUresult;
/// `cuDeviceGetCount(int *count)`.
pub type PfnDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CUresult;
/// `cuDeviceGet(CUdevice *device, int ordinal)`.
pub type PfnDeviceGet = unsafe extern "C" fn(device: *mut CUdevice, ordinal: c_int) -> CUresult;
/// `cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)`.
pub type PfnDeviceGetUuid = unsafe extern "C" fn(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
/// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
pub type PfnDevicePrimaryCtxRetain =
    unsafe extern "C" fn(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
/// `cuCtxSetCurrent(CUcontext ctx)`.
pub type PfnCtxSetCurrent = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
/// `cuCtxSynchronize(void)` (the version without a context argument).
pub type PfnCtxSynchronize = unsafe extern "C" fn() -> CUresult;
/// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
pub type PfnMemAlloc = unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
/// `cuMemFree_v2(CUdeviceptr dptr)`.
pub type PfnMemFree = unsafe extern "C" fn(dptr: CUdeviceptr) -> CUresult;
/// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)`.
pub type PfnMemcpyHtoD =
    unsafe extern "C" fn(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult;
/// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)`.
pub type PfnMemcpyDtoH =
    unsafe extern "C" fn(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult;
/// `cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)`.
pub type PfnCheckpointProcessLock = unsafe extern "C" fn(pid: c_int, args: *mut c_void) -> CUresult;
/// `cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)`.
pub type PfnCheckpointProcessCheckpoint =
    unsafe extern "C" fn(pid: c_int, args: *mut c_void) -> CUresult;
/// `cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)`.
pub type PfnCheckpointProcessRestore =
    unsafe extern "C" fn(pid: c_int, args: *mut c_void) -> CUresult;
/// `cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)`.
pub type PfnCheckpointProcessUnlock =
    unsafe extern "C" fn(pid: c_int, args: *mut c_void) -> CUresult;
/// `cuCheckpointProcessGetState(int pid, CUprocessState *state)`.
pub type PfnCheckpointProcessGetState =
    unsafe extern "C" fn(pid: c_int, state: *mut CUprocessState) -> CUresult;
/// `cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)`.
pub type PfnCheckpointProcessGetRestoreThreadId =
    unsafe extern "C" fn(pid: c_int, tid: *mut c_int) -> CUresult;
/// `cuCheckpointOperationComplete(CUcheckpointOperationHandle handle)` (CUDA 13.4).
pub type PfnCheckpointOperationComplete =
    unsafe extern "C" fn(handle: CUcheckpointOperationHandle) -> CUresult;

/// A driver symbol and the CUDA version it is requested at through `cuGetProcAddress`.
/// The driver answers with the symbol's newest ABI not newer than that version: e.g.
/// `cuMemAlloc` at 3020 is `cuMemAlloc_v2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// The base name, as passed to `cuGetProcAddress`.
    pub name: &'static str,
    /// The CUDA version requested (`1000 * major + 10 * minor`).
    pub version: c_int,
}

macro_rules! symbols {
    ($($konst:ident = $name:literal @ $version:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` requested at CUDA version ", stringify!($version), ".")]
            pub const $konst: Symbol = Symbol { name: $name, version: $version };
        )*
        /// Every symbol this crate resolves.
        pub const ALL: &[Symbol] = &[$($konst),*];
    };
}

/// The symbols this crate resolves through `cuGetProcAddress`.
pub mod symbol {
    use super::Symbol;

    symbols! {
        INIT = "cuInit" @ 2000;
        DRIVER_GET_VERSION = "cuDriverGetVersion" @ 2020;
        GET_ERROR_NAME = "cuGetErrorName" @ 6000;
        DEVICE_GET_COUNT = "cuDeviceGetCount" @ 2000;
        DEVICE_GET = "cuDeviceGet" @ 2000;
        DEVICE_GET_UUID = "cuDeviceGetUuid" @ 11040;
        DEVICE_PRIMARY_CTX_RETAIN = "cuDevicePrimaryCtxRetain" @ 7000;
        CTX_SET_CURRENT = "cuCtxSetCurrent" @ 4000;
        CTX_SYNCHRONIZE = "cuCtxSynchronize" @ 2000;
        MEM_ALLOC = "cuMemAlloc" @ 3020;
        MEM_FREE = "cuMemFree" @ 3020;
        MEMCPY_HTOD = "cuMemcpyHtoD" @ 3020;
        MEMCPY_DTOH = "cuMemcpyDtoH" @ 3020;
        CHECKPOINT_LOCK = "cuCheckpointProcessLock" @ 12080;
        CHECKPOINT_CHECKPOINT = "cuCheckpointProcessCheckpoint" @ 12080;
        CHECKPOINT_RESTORE = "cuCheckpointProcessRestore" @ 12080;
        CHECKPOINT_UNLOCK = "cuCheckpointProcessUnlock" @ 12080;
        CHECKPOINT_GET_STATE = "cuCheckpointProcessGetState" @ 12080;
        CHECKPOINT_GET_RESTORE_THREAD_ID = "cuCheckpointProcessGetRestoreThreadId" @ 12080;
        CHECKPOINT_OPERATION_COMPLETE = "cuCheckpointOperationComplete" @ 13040;
    }
}
