//! What can go wrong loading and calling the driver.

use std::path::PathBuf;

use crate::layout::LayoutError;
use crate::sys::CUresult;

/// A driver call that returned something other than `CUDA_SUCCESS`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{function}{} failed: {name} ({code})", pid.map(|p| format!(" for pid {p}")).unwrap_or_default())]
pub struct CudaError {
    /// The `CUresult`.
    pub code: CUresult,
    /// Its name (`CUDA_ERROR_ILLEGAL_STATE`), from the driver's `cuGetErrorName` when it
    /// has one, else from this crate's table, else `CUresult <code>`.
    pub name: String,
    /// The driver function called (`cuCheckpointProcessLock`).
    pub function: &'static str,
    /// The process the call was about, for the checkpoint API.
    pub pid: Option<i32>,
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver library could not be loaded.
    #[error("cannot load the CUDA driver library {}: {source} (set {env} to its path)", path.display())]
    LibraryMissing {
        /// The path or name tried.
        path: PathBuf,
        /// The environment variable that overrides it.
        env: &'static str,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// The library has neither `cuGetProcAddress_v2` nor `cuGetProcAddress`.
    #[error("{} has neither cuGetProcAddress_v2 nor cuGetProcAddress: not a CUDA driver of 11.3 or newer", path.display())]
    NoProcAddress {
        /// The library.
        path: PathBuf,
    },
    /// A symbol the driver should have was not found.
    #[error("the CUDA driver {} has no {symbol} at CUDA version {version}: {source}", path.display())]
    SymbolMissing {
        /// The library.
        path: PathBuf,
        /// The symbol.
        symbol: &'static str,
        /// The version requested.
        version: i32,
        /// What `cuGetProcAddress` returned.
        #[source]
        source: CudaError,
    },
    /// The driver is too old, or the request cannot be expressed in its argument layout.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A driver call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A custom-storage operation returned nothing usable.
    #[error("cuCheckpointProcess{operation} for pid {pid} returned no custom-storage information")]
    NoCustomStorage {
        /// `Checkpoint` or `Restore`.
        operation: &'static str,
        /// The target.
        pid: i32,
    },
    /// The driver reported a process state this crate does not know.
    #[error("unknown CUDA process state {state} for pid {pid}")]
    UnknownState {
        /// The raw state.
        state: i32,
        /// The process.
        pid: i32,
    },
}

impl Error {
    /// The `CUresult` of a failed driver call, if that is what this is.
    pub fn cuda_code(&self) -> Option<CUresult> {
        match self {
            Self::Cuda(e) | Self::SymbolMissing { source: e, .. } => Some(e.code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_function_code_and_pid() {
        let e = CudaError {
            code: 401,
            name: "CUDA_ERROR_ILLEGAL_STATE".into(),
            function: "cuCheckpointProcessCheckpoint",
            pid: Some(42),
        };
        assert_eq!(
            e.to_string(),
            "cuCheckpointProcessCheckpoint for pid 42 failed: CUDA_ERROR_ILLEGAL_STATE (401)"
        );
        let e = CudaError { pid: None, ..e };
        assert_eq!(
            e.to_string(),
            "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_ILLEGAL_STATE (401)"
        );
        assert_eq!(Error::from(e).cuda_code(), Some(401));
    }
}
