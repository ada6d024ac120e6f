//! Loading `libcuda.so.1` and resolving its symbols: `cuGetProcAddress_v2` (or
//! `cuGetProcAddress`) by `dlsym`, every other symbol through it at an explicit CUDA
//! version, because `dlsym` returns the oldest ABI of a versioned symbol (e.g. the
//! 32-bit `cuMemAlloc`, where version 3020 gives `cuMemAlloc_v2`).

use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};

use crate::error::{CudaError, Error};
use crate::result;
use crate::sys::{self, Symbol};

/// Environment variable naming the driver library to load instead of `libcuda.so.1`.
pub const ENV_LIBRARY: &str = "GPUCR_CUDA_LIBRARY";
/// The library loaded when [`ENV_LIBRARY`] is not set.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

enum ProcAddress {
    V2(sys::PfnGetProcAddressV2),
    V1(sys::PfnGetProcAddress),
}

/// An open driver library and its `cuGetProcAddress`.
pub(crate) struct Loader {
    path: PathBuf,
    // Kept open for as long as the resolved functions are used.
    _library: libloading::Library,
    proc_address: ProcAddress,
}

impl Loader {
    /// The library named by [`ENV_LIBRARY`], or `libcuda.so.1`.
    pub(crate) fn library_path() -> PathBuf {
        std::env::var_os(ENV_LIBRARY)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_LIBRARY))
    }

    /// Opens `path` (`RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE`: once `cuInit` has run the
    /// driver has threads of its own, which must not lose their code) and finds its
    /// `cuGetProcAddress`.
    pub(crate) fn open(path: &Path) -> Result<Self, Error> {
        let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE;
        // SAFETY: loading a shared library runs its initialisers; libcuda's (and the
        // fake's) have no preconditions on the loading process.
        let library = unsafe { libloading::os::unix::Library::open(Some(path), flags) }.map_err(
            |source| Error::LibraryMissing {
                path: path.to_owned(),
                env: ENV_LIBRARY,
                source,
            },
        )?;
        let library = libloading::Library::from(library);
        // SAFETY: `cuGetProcAddress_v2` has this signature in every driver that exports it
        // (cuda.h 12.0+).
        let v2 = unsafe { library.get::<sys::PfnGetProcAddressV2>(b"cuGetProcAddress_v2\0") };
        let proc_address = match v2 {
            Ok(f) => ProcAddress::V2(*f),
            Err(_) => {
                // SAFETY: the unversioned `cuGetProcAddress` export keeps the 11.3 ABI of
                // four arguments.
                let v1 = unsafe { library.get::<sys::PfnGetProcAddress>(b"cuGetProcAddress\0") };
                match v1 {
                    Ok(f) => ProcAddress::V1(*f),
                    Err(_) => {
                        return Err(Error::NoProcAddress {
                            path: path.to_owned(),
                        })
                    }
                }
            }
        };
        Ok(Self {
            path: path.to_owned(),
            _library: library,
            proc_address,
        })
    }

    /// The library's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The address of `symbol` at its version, or the `CUresult` the driver gave.
    pub(crate) fn raw(&self, symbol: Symbol) -> Result<*mut c_void, CudaError> {
        let name = CString::new(symbol.name).expect("symbol names have no NUL");
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = sys::CU_GET_PROC_ADDRESS_SUCCESS;
        let code = match self.proc_address {
            // SAFETY: `name` is a NUL-terminated string and `pfn`, `status` are writable
            // locals, as cuGetProcAddress_v2 requires.
            ProcAddress::V2(f) => unsafe {
                f(
                    name.as_ptr(),
                    &mut pfn,
                    symbol.version,
                    sys::CU_GET_PROC_ADDRESS_DEFAULT,
                    &mut status,
                )
            },
            // SAFETY: as above, without the status argument.
            ProcAddress::V1(f) => unsafe {
                f(
                    name.as_ptr(),
                    &mut pfn,
                    symbol.version,
                    sys::CU_GET_PROC_ADDRESS_DEFAULT,
                )
            },
        };
        let code = match (code, status) {
            (result::SUCCESS, sys::CU_GET_PROC_ADDRESS_SUCCESS) if !pfn.is_null() => {
                return Ok(pfn)
            }
            (result::SUCCESS, _) => result::NOT_FOUND,
            (code, _) => code,
        };
        Err(CudaError {
            code,
            name: result::name(code)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("CUresult {code}")),
            function: "cuGetProcAddress",
            pid: None,
        })
    }

    /// `symbol` as a function of type `F`, or [`Error::SymbolMissing`].
    ///
    /// # Safety
    /// `F` is the C signature of `symbol` at `symbol.version`.
    pub(crate) unsafe fn get<F: Copy>(&self, symbol: Symbol) -> Result<F, Error> {
        let raw = self.raw(symbol).map_err(|source| Error::SymbolMissing {
            path: self.path.clone(),
            symbol: symbol.name,
            version: symbol.version,
            source,
        })?;
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: `raw` is a non-null function address and the caller guarantees that
        // `F` is that function's pointer type, which has the size of a pointer (checked).
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&raw) })
    }
}
