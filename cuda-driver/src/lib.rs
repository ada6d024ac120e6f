//! gpucr's binding of the CUDA driver: the checkpoint API its cuda backend drives, and a
//! small application side for test workloads.
//!
//! # Design
//!
//! * **Loading.** [`Driver::load`] opens `libcuda.so.1` at run time (or the library named
//!   by `GPUCR_CUDA_LIBRARY`, e.g. the fake of `gpucr-fake-cuda`), so gpucr builds and
//!   runs on machines without the driver. Only `cuGetProcAddress_v2` (else
//!   `cuGetProcAddress`) is found by `dlsym`; every other symbol is asked of it at an
//!   explicit CUDA version ([`sys::symbol`]), because `dlsym` returns the oldest ABI of
//!   a versioned symbol.
//! * **Versions.** `cuDriverGetVersion` must say 12080 (CUDA 12.8, driver r570) or more;
//!   it chooses the [`ArgsLayout`] of the 64-byte argument structs (12.9, 13.0–13.2,
//!   13.3, 13.4+). Each layout is a `#[repr(C)]` struct in [`layout`] with compile-time
//!   size and offset assertions. `tests/cuda_headers.rs` compiles the real `cuda.h` of
//!   every supported CUDA version (12.8 to 13.5) and checks every struct, field, enum
//!   value and function signature of [`header_facts`] against it.
//! * **Initialisation.** Creating a [`Driver`] calls `cuInit(0)`; the caller creates one
//!   before it freezes anything.
//! * **Checkpoint API** ([`checkpoint`]): state, restore thread, lock (with timeout),
//!   checkpoint and restore (with host staging, or with CUDA 13.4's custom storage that
//!   maps the target's device memory into the caller), GPU UUID pairs, unlock, and
//!   `cuCheckpointOperationComplete`.
//! * **Errors** ([`error`]): a failed call is a [`CudaError`] with the `CUresult`, its
//!   name (`cuGetErrorName`, else [`result`]'s table), the function and the pid; a
//!   missing library names the path tried and `GPUCR_CUDA_LIBRARY`; an old driver says
//!   which version it has and which is needed.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod app;
pub mod checkpoint;
mod driver;
pub mod error;
pub mod header_facts;
pub mod layout;
mod loader;
pub mod result;
pub mod sys;
pub mod uuid;

pub use app::{Context, Device, DevicePtr};
pub use checkpoint::{CustomStorage, DeviceRegion, OperationHandle, ProcessState};
pub use driver::Driver;
pub use error::{CudaError, Error};
pub use layout::ArgsLayout;
pub use loader::{DEFAULT_LIBRARY, ENV_LIBRARY};
pub use uuid::Uuid;
