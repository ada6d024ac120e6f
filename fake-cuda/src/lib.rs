//! A fake `libcuda.so.1` for gpucr's tests on machines without a GPU: the CUDA checkpoint
//! API, and the small application side of `gpucr-cuda-driver`, on files.
//!
//! # Model
//!
//! * **Application processes** ([`app`]): `cuInit` creates a context directory under the
//!   shared `GPUCR_FAKE_CUDA_DIR`, maps its control file `MAP_SHARED` (so a controlling
//!   process finds it in `/proc/PID/maps`) and starts a restore thread named
//!   `cuda-restore`. Device memory is one file per GPU in the context directory; device
//!   pointers are opaque handles ([`devptr`]); the allocation table is in the process's
//!   heap. While the process is not RUNNING its own CUDA calls block, as the driver's do.
//! * **Controlling processes** ([`control`]): the checkpoint functions find the target's
//!   context through `/proc/PID/maps`, write a request into its mailbox ([`mailbox`]) and
//!   wait for the answer its restore thread writes. While the target is frozen (by CRIU,
//!   or SIGSTOP) the call waits, and fails with `CUDA_ERROR_TIMEOUT` after
//!   `GPUCR_FAKE_CUDA_TIMEOUT` seconds instead of hanging.
//! * **Checkpoint** copies each GPU's memory file into the target's private anonymous
//!   memory and deletes the file (so CRIU dumps the memory with the process); **restore**
//!   writes it back, onto the GPUs the UUID pairs name. With **custom storage**
//!   (reported version 13040 or more and `customStorageInfo_out`), the controlling
//!   process maps the target's memory files itself, and `cuCheckpointOperationComplete`
//!   lets the target drop (checkpoint) or keep (restore) them without host staging.
//! * The argument structs are read ([`args`]) by the layouts of NVIDIA's `cuda.h` of
//!   the reported version (`GPUCR_FAKE_CUDA_VERSION`): [`cuda_h`] is generated from the
//!   real headers of CUDA 12.8 to 13.5 (`tests/cuda_h.rs` checks it), so the fake does
//!   not share gpucr's own declarations, which it tests. The exported functions' types
//!   and the ABI versions `cuGetProcAddress` answers come from the same headers.
//! * **Failure injection** (`GPUCR_FAKE_CUDA_FAIL`, [`fail`]) and **call recording**
//!   (`GPUCR_FAKE_CUDA_LOG`, [`calllog`]).
//!
//! The environment variables are in [`config`]; `docs/cuda.md` describes them all.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]

pub mod app;
pub mod args;
pub mod calllog;
pub mod config;
pub mod control;
pub mod cuda_h;
pub mod devptr;
pub mod exports;
pub mod fail;
pub mod mailbox;
pub mod mapping;

/// The file name cargo gives the built library.
pub const LIBRARY_FILE: &str = "libgpucr_fake_cuda.so";
