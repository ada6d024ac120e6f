//! The raw C types and function signatures of the driver entry points this crate uses,
//! and the CUDA version at which each is requested through `cuGetProcAddress`.
//!
//! Signatures follow `cuda.h` (CUDA 12.8 to 13.5); each function pointer type carries its
//! parameters' `cuda.h` spelling ([`Signature`]), and `tests/cuda_headers.rs` checks it
//! against the `PFN_<name>_v<version>` typedef of `cudaTypedefs.h` at the version the
//! function is requested at. The checkpoint functions take their
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

/// One parameter of a driver function: its C spelling in `cuda.h` and what the Rust
/// type of gpucr's declaration is, so the two can be compared (`tests/cuda_headers.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The parameter's type as `cuda.h` spells it (`CUdeviceptr *`).
    pub c_type: &'static str,
    /// The Rust type's size in bytes.
    pub size: usize,
    /// `Some(signed)` for an integer, `None` for a pointer.
    pub signed: Option<bool>,
    /// For a pointer: the size of what it points to, `None` where gpucr passes it as
    /// `void *` (an argument struct whose layout depends on the driver's version).
    pub pointee_size: Option<usize>,
}

/// A function pointer type of this module, with its parameters spelled as in `cuda.h`.
/// Every function returns `CUresult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    /// The Rust type's name (`PfnMemAlloc`).
    pub rust: &'static str,
    /// The parameters, in order.
    pub params: &'static [Param],
}

impl Signature {
    /// The C function pointer type: `CUresult (CUDAAPI *)(CUdeviceptr *, size_t)`.
    pub fn c_pointer_type(&self) -> String {
        let params: Vec<&str> = self.params.iter().map(|p| p.c_type).collect();
        let params = if params.is_empty() {
            "void".to_string()
        } else {
            params.join(", ")
        };
        format!("CUresult (CUDAAPI *)({params})")
    }
}

/// How a Rust parameter type of a driver function looks in C: size, signedness,
/// pointee.
pub trait CParam {
    /// The type's size in bytes.
    const SIZE: usize;
    /// `Some(signed)` for an integer, `None` for a pointer.
    const SIGNED: Option<bool>;
    /// For a pointer: the pointee's size (`None`: `void`).
    const POINTEE_SIZE: Option<usize>;
}

/// What a pointer parameter points to, as far as C sees it.
pub trait CPointee {
    /// Its size, `None` for `void`.
    const SIZE: Option<usize>;
}

macro_rules! c_ints {
    ($($t:ty),*) => {$(
        impl CParam for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const SIGNED: Option<bool> = Some(<$t>::MIN != 0);
            const POINTEE_SIZE: Option<usize> = None;
        }
        impl CPointee for $t {
            const SIZE: Option<usize> = Some(std::mem::size_of::<$t>());
        }
    )*};
}
c_ints!(i8, i32, u32, u64, usize);

impl CPointee for c_void {
    const SIZE: Option<usize> = None;
}
impl CPointee for CUuuid {
    const SIZE: Option<usize> = Some(std::mem::size_of::<CUuuid>());
}
impl<T> CPointee for *mut T {
    const SIZE: Option<usize> = Some(std::mem::size_of::<*mut T>());
}
impl<T> CPointee for *const T {
    const SIZE: Option<usize> = Some(std::mem::size_of::<*const T>());
}
impl<T: CPointee> CParam for *mut T {
    const SIZE: usize = std::mem::size_of::<*mut T>();
    const SIGNED: Option<bool> = None;
    const POINTEE_SIZE: Option<usize> = T::SIZE;
}
impl<T: CPointee> CParam for *const T {
    const SIZE: usize = std::mem::size_of::<*const T>();
    const SIGNED: Option<bool> = None;
    const POINTEE_SIZE: Option<usize> = T::SIZE;
}

macro_rules! pfns {
    ($(
        $(#[$doc:meta])*
        $pfn:ident = fn($($arg:ident: $rty:ty => $cty:literal),* $(,)?);
    )*) => {
        $(
            $(#[$doc])*
            pub type $pfn = unsafe extern "C" fn($($arg: $rty),*) -> CUresult;
        )*

        /// Each function pointer type's [`Signature`], named as the type.
        #[allow(non_upper_case_globals)]
        pub mod signature {
            use super::*;

            $(
                #[doc = concat!("The signature of [`", stringify!($pfn), "`](super::", stringify!($pfn), ").")]
                pub const $pfn: Signature = Signature {
                    rust: stringify!($pfn),
                    params: &[$(Param {
                        c_type: $cty,
                        size: <$rty as CParam>::SIZE,
                        signed: <$rty as CParam>::SIGNED,
                        pointee_size: <$rty as CParam>::POINTEE_SIZE,
                    }),*],
                };
            )*
        }
    };
}

pfns! {
    /// `cuGetProcAddress_v2` (CUDA 12.0+): `(symbol, pfn, cudaVersion, flags, symbolStatus)`.
    PfnGetProcAddressV2 = fn(
        symbol: *const c_char => "const char *",
        pfn: *mut *mut c_void => "void **",
        cuda_version: c_int => "int",
        flags: u64 => "cuuint64_t",
        symbol_status: *mut c_int => "CUdriverProcAddressQueryResult *",
    );
    /// `cuGetProcAddress` (CUDA 11.3 to 11.8 ABI, still exported): without `symbolStatus`.
    PfnGetProcAddress = fn(
        symbol: *const c_char => "const char *",
        pfn: *mut *mut c_void => "void **",
        cuda_version: c_int => "int",
        flags: u64 => "cuuint64_t",
    );
    /// `cuInit(unsigned int Flags)`.
    PfnInit = fn(flags: c_uint => "unsigned int");
    /// `cuDriverGetVersion(int *driverVersion)`.
    PfnDriverGetVersion = fn(version: *mut c_int => "int *");
    /// `cuGetErrorName(CUresult error, const char **pStr)`.
    PfnGetErrorName = fn(error: CUresult => "CUresult", name: *mut *const c_char => "const char **");
    /// `cuDeviceGetCount(int *count)`.
    PfnDeviceGetCount = fn(count: *mut c_int => "int *");
    /// `cuDeviceGet(CUdevice *device, int ordinal)`.
    PfnDeviceGet = fn(device: *mut CUdevice => "CUdevice *", ordinal: c_int => "int");
    /// `cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)`.
    PfnDeviceGetUuid = fn(uuid: *mut CUuuid => "CUuuid *", dev: CUdevice => "CUdevice");
    /// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
    PfnDevicePrimaryCtxRetain = fn(ctx: *mut CUcontext => "CUcontext *", dev: CUdevice => "CUdevice");
    /// `cuCtxSetCurrent(CUcontext ctx)`.
    PfnCtxSetCurrent = fn(ctx: CUcontext => "CUcontext");
    /// `cuCtxSynchronize(void)` (the version without a context argument).
    PfnCtxSynchronize = fn();
    /// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
    PfnMemAlloc = fn(dptr: *mut CUdeviceptr => "CUdeviceptr *", bytes: usize => "size_t");
    /// `cuMemFree_v2(CUdeviceptr dptr)`.
    PfnMemFree = fn(dptr: CUdeviceptr => "CUdeviceptr");
    /// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)`.
    PfnMemcpyHtoD = fn(
        dst: CUdeviceptr => "CUdeviceptr",
        src: *const c_void => "const void *",
        bytes: usize => "size_t",
    );
    /// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)`.
    PfnMemcpyDtoH = fn(
        dst: *mut c_void => "void *",
        src: CUdeviceptr => "CUdeviceptr",
        bytes: usize => "size_t",
    );
    /// `cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)`.
    PfnCheckpointProcessLock = fn(pid: c_int => "int", args: *mut c_void => "CUcheckpointLockArgs *");
    /// `cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)`.
    PfnCheckpointProcessCheckpoint =
        fn(pid: c_int => "int", args: *mut c_void => "CUcheckpointCheckpointArgs *");
    /// `cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)`.
    PfnCheckpointProcessRestore =
        fn(pid: c_int => "int", args: *mut c_void => "CUcheckpointRestoreArgs *");
    /// `cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)`.
    PfnCheckpointProcessUnlock =
        fn(pid: c_int => "int", args: *mut c_void => "CUcheckpointUnlockArgs *");
    /// `cuCheckpointProcessGetState(int pid, CUprocessState *state)`.
    PfnCheckpointProcessGetState =
        fn(pid: c_int => "int", state: *mut CUprocessState => "CUprocessState *");
    /// `cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)`.
    PfnCheckpointProcessGetRestoreThreadId = fn(pid: c_int => "int", tid: *mut c_int => "int *");
    /// `cuCheckpointOperationComplete(CUcheckpointOperationHandle handle)` (CUDA 13.4).
    PfnCheckpointOperationComplete =
        fn(handle: CUcheckpointOperationHandle => "CUcheckpointOperationHandle");
}

/// A driver symbol and the CUDA version it is requested at through `cuGetProcAddress`.
/// The driver answers with the symbol's newest ABI not newer than that version: e.g.
/// `cuMemAlloc` at 3020 is `cuMemAlloc_v2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// The base name, as passed to `cuGetProcAddress`.
    pub name: &'static str,
    /// The CUDA version requested (`1000 * major + 10 * minor`).
    pub version: c_int,
    /// The signature gpucr calls it with (`signature::PfnMemAlloc`).
    pub signature: Signature,
}

macro_rules! symbols {
    ($($konst:ident = $name:literal @ $version:literal => $pfn:ident;)*) => {
        $(
            #[doc = concat!("`", $name, "` requested at CUDA version ", stringify!($version), ", called as [`", stringify!($pfn), "`](super::", stringify!($pfn), ").")]
            pub const $konst: Symbol = Symbol {
                name: $name,
                version: $version,
                signature: super::signature::$pfn,
            };
        )*
        /// Every symbol this crate resolves.
        pub const ALL: &[Symbol] = &[$($konst),*];
    };
}

/// The symbols this crate resolves through `cuGetProcAddress`.
pub mod symbol {
    use super::Symbol;

    symbols! {
        INIT = "cuInit" @ 2000 => PfnInit;
        DRIVER_GET_VERSION = "cuDriverGetVersion" @ 2020 => PfnDriverGetVersion;
        GET_ERROR_NAME = "cuGetErrorName" @ 6000 => PfnGetErrorName;
        DEVICE_GET_COUNT = "cuDeviceGetCount" @ 2000 => PfnDeviceGetCount;
        DEVICE_GET = "cuDeviceGet" @ 2000 => PfnDeviceGet;
        DEVICE_GET_UUID = "cuDeviceGetUuid" @ 11040 => PfnDeviceGetUuid;
        DEVICE_PRIMARY_CTX_RETAIN = "cuDevicePrimaryCtxRetain" @ 7000 => PfnDevicePrimaryCtxRetain;
        CTX_SET_CURRENT = "cuCtxSetCurrent" @ 4000 => PfnCtxSetCurrent;
        CTX_SYNCHRONIZE = "cuCtxSynchronize" @ 2000 => PfnCtxSynchronize;
        MEM_ALLOC = "cuMemAlloc" @ 3020 => PfnMemAlloc;
        MEM_FREE = "cuMemFree" @ 3020 => PfnMemFree;
        MEMCPY_HTOD = "cuMemcpyHtoD" @ 3020 => PfnMemcpyHtoD;
        MEMCPY_DTOH = "cuMemcpyDtoH" @ 3020 => PfnMemcpyDtoH;
        CHECKPOINT_LOCK = "cuCheckpointProcessLock" @ 12080 => PfnCheckpointProcessLock;
        CHECKPOINT_CHECKPOINT = "cuCheckpointProcessCheckpoint" @ 12080 => PfnCheckpointProcessCheckpoint;
        CHECKPOINT_RESTORE = "cuCheckpointProcessRestore" @ 12080 => PfnCheckpointProcessRestore;
        CHECKPOINT_UNLOCK = "cuCheckpointProcessUnlock" @ 12080 => PfnCheckpointProcessUnlock;
        CHECKPOINT_GET_STATE = "cuCheckpointProcessGetState" @ 12080 => PfnCheckpointProcessGetState;
        CHECKPOINT_GET_RESTORE_THREAD_ID = "cuCheckpointProcessGetRestoreThreadId" @ 12080 => PfnCheckpointProcessGetRestoreThreadId;
        CHECKPOINT_OPERATION_COMPLETE = "cuCheckpointOperationComplete" @ 13040 => PfnCheckpointOperationComplete;
    }
}
