//! [`Driver`]: the loaded library, its version and argument layout, and every function
//! this crate calls.

use std::ffi::{c_int, CStr};
use std::path::Path;

use crate::error::{CudaError, Error};
use crate::layout::ArgsLayout;
use crate::loader::Loader;
use crate::result;
use crate::sys::{self, symbol, CUresult};

/// The driver's functions, resolved at the versions in [`sys::symbol`].
pub(crate) struct Api {
    pub(crate) device_get_count: sys::PfnDeviceGetCount,
    pub(crate) device_get: sys::PfnDeviceGet,
    pub(crate) device_get_uuid: sys::PfnDeviceGetUuid,
    pub(crate) primary_ctx_retain: sys::PfnDevicePrimaryCtxRetain,
    pub(crate) ctx_set_current: sys::PfnCtxSetCurrent,
    pub(crate) ctx_synchronize: sys::PfnCtxSynchronize,
    pub(crate) mem_alloc: sys::PfnMemAlloc,
    pub(crate) mem_free: sys::PfnMemFree,
    pub(crate) memcpy_htod: sys::PfnMemcpyHtoD,
    pub(crate) memcpy_dtoh: sys::PfnMemcpyDtoH,
    pub(crate) lock: sys::PfnCheckpointProcessLock,
    pub(crate) checkpoint: sys::PfnCheckpointProcessCheckpoint,
    pub(crate) restore: sys::PfnCheckpointProcessRestore,
    pub(crate) unlock: sys::PfnCheckpointProcessUnlock,
    pub(crate) get_state: sys::PfnCheckpointProcessGetState,
    pub(crate) get_restore_tid: sys::PfnCheckpointProcessGetRestoreThreadId,
    /// `cuCheckpointOperationComplete`, from CUDA 13.4.
    pub(crate) operation_complete: Option<sys::PfnCheckpointOperationComplete>,
}

/// A loaded and initialised CUDA driver.
///
/// Creating one loads the library (`GPUCR_CUDA_LIBRARY`, else `libcuda.so.1`), checks
/// that the driver is r570 (CUDA 12.8) or newer, chooses the argument layout of its
/// version and calls `cuInit(0)`. The caller creates one before it freezes anything.
pub struct Driver {
    loader: Loader,
    version: i32,
    layout: ArgsLayout,
    get_error_name: Option<sys::PfnGetErrorName>,
    pub(crate) api: Api,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.loader.path())
            .field("version", &self.version)
            .field("layout", &self.layout)
            .field("custom_storage", &self.has_custom_storage())
            .finish()
    }
}

impl Driver {
    /// Loads the library named by `GPUCR_CUDA_LIBRARY`, else `libcuda.so.1`.
    pub fn load() -> Result<Self, Error> {
        Self::load_from(&Loader::library_path())
    }

    /// Loads the driver library at `path`.
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        let loader = Loader::open(path)?;
        // SAFETY: (for every `get` below) each type is the C signature of its symbol at
        // the version `sys::symbol` requests it at (see `sys`).
        let get_error_name =
            unsafe { loader.get::<sys::PfnGetErrorName>(symbol::GET_ERROR_NAME) }.ok();
        // SAFETY: as above.
        let driver_get_version =
            unsafe { loader.get::<sys::PfnDriverGetVersion>(symbol::DRIVER_GET_VERSION) }?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a writable int.
        let code = unsafe { driver_get_version(&mut version) };
        let name_of = |code| name_with(get_error_name, code);
        if code != result::SUCCESS {
            return Err(CudaError {
                code,
                name: name_of(code),
                function: "cuDriverGetVersion",
                pid: None,
            }
            .into());
        }
        let layout = ArgsLayout::from_driver_version(version)?;
        // SAFETY: as above.
        let init = unsafe { loader.get::<sys::PfnInit>(symbol::INIT) }?;
        // SAFETY: cuInit takes flags by value; 0 is the only valid value.
        let code = unsafe { init(0) };
        if code != result::SUCCESS {
            return Err(CudaError {
                code,
                name: name_of(code),
                function: "cuInit",
                pid: None,
            }
            .into());
        }
        // SAFETY: as above, for each field.
        let api = unsafe {
            Api {
                device_get_count: loader.get(symbol::DEVICE_GET_COUNT)?,
                device_get: loader.get(symbol::DEVICE_GET)?,
                device_get_uuid: loader.get(symbol::DEVICE_GET_UUID)?,
                primary_ctx_retain: loader.get(symbol::DEVICE_PRIMARY_CTX_RETAIN)?,
                ctx_set_current: loader.get(symbol::CTX_SET_CURRENT)?,
                ctx_synchronize: loader.get(symbol::CTX_SYNCHRONIZE)?,
                mem_alloc: loader.get(symbol::MEM_ALLOC)?,
                mem_free: loader.get(symbol::MEM_FREE)?,
                memcpy_htod: loader.get(symbol::MEMCPY_HTOD)?,
                memcpy_dtoh: loader.get(symbol::MEMCPY_DTOH)?,
                lock: loader.get(symbol::CHECKPOINT_LOCK)?,
                checkpoint: loader.get(symbol::CHECKPOINT_CHECKPOINT)?,
                restore: loader.get(symbol::CHECKPOINT_RESTORE)?,
                unlock: loader.get(symbol::CHECKPOINT_UNLOCK)?,
                get_state: loader.get(symbol::CHECKPOINT_GET_STATE)?,
                get_restore_tid: loader.get(symbol::CHECKPOINT_GET_RESTORE_THREAD_ID)?,
                operation_complete: if layout.has_custom_storage() {
                    loader.get(symbol::CHECKPOINT_OPERATION_COMPLETE).ok()
                } else {
                    None
                },
            }
        };
        Ok(Self {
            loader,
            version,
            layout,
            get_error_name,
            api,
        })
    }

    /// The library loaded.
    pub fn path(&self) -> &Path {
        self.loader.path()
    }

    /// What `cuDriverGetVersion` reported (`1000 * major + 10 * minor`).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The argument layout of that version.
    pub fn layout(&self) -> ArgsLayout {
        self.layout
    }

    /// Whether checkpoint and restore can use custom storage (CUDA 13.4 and
    /// `cuCheckpointOperationComplete` present).
    pub fn has_custom_storage(&self) -> bool {
        self.layout.has_custom_storage() && self.api.operation_complete.is_some()
    }

    /// The name of `code`: the driver's `cuGetErrorName` when it has one, else this
    /// crate's table, else `CUresult <code>`.
    pub fn error_name(&self, code: CUresult) -> String {
        name_with(self.get_error_name, code)
    }

    /// `Ok` for `CUDA_SUCCESS`, else the [`CudaError`] of `function` for `pid`.
    pub(crate) fn check(
        &self,
        code: CUresult,
        function: &'static str,
        pid: Option<i32>,
    ) -> Result<(), CudaError> {
        if code == result::SUCCESS {
            return Ok(());
        }
        Err(CudaError {
            code,
            name: self.error_name(code),
            function,
            pid,
        })
    }
}

fn name_with(get_error_name: Option<sys::PfnGetErrorName>, code: CUresult) -> String {
    if let Some(f) = get_error_name {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `name` is a writable pointer; the driver stores a static string in it.
        if unsafe { f(code, &mut name) } == result::SUCCESS && !name.is_null() {
            // SAFETY: the driver returned a NUL-terminated string that lives as long as
            // the library, which outlives this call.
            return unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
        }
    }
    result::name(code)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("CUresult {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_path_and_variable() {
        let err = Driver::load_from(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
        assert!(matches!(err, Error::LibraryMissing { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/libcuda.so.1"), "{msg}");
        assert!(msg.contains("GPUCR_CUDA_LIBRARY"), "{msg}");
    }

    #[test]
    fn error_names_fall_back_to_the_table() {
        assert_eq!(name_with(None, 401), "CUDA_ERROR_ILLEGAL_STATE");
        assert_eq!(name_with(None, 4242), "CUresult 4242");
    }
}
