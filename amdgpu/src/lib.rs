//! gpucr's access to the amdgpu kernel interfaces, behind two traits:
//!
//! * [`Kfd`]: `/dev/kfd` and the KFD CRIU operations (PROCESS_INFO, CHECKPOINT, UNPAUSE,
//!   RESTORE, RESUME), used by the plugin half (as CRIU's tracer, or inside a restored
//!   task);
//! * [`Drm`] / [`RenderNode`]: a render node of gpucr's own (PRIME import, userptr, GTT
//!   buffers, GPU VA, BO lists, contexts, command submission, fence waits), used by the
//!   gpucr half in the helper to copy buffers with the SDMA engines.
//!
//! [`real`] issues the ioctls declared in `gpucr_abi::{kfd, amdgpu_drm}`. The `fake`
//! feature adds [`fake`], a recording model of KFD and DRM state (buffers on memfds,
//! dmabuf fds, queues paused or running, SDMA rings that execute the copy packets they
//! are given, a dispatch on resumed queues), so every sequence runs in tests without an
//! AMD GPU. [`state`] holds what the two halves exchange.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "fake")]
pub mod fake;
pub mod kernel;
pub mod real;
pub mod state;

pub use kernel::{
    DeviceKind, DeviceMapping, Drm, KernelError, Kfd, KfdCheckpoint, NodeInfo, ProcessInfo,
    RenderNode, RestoreRequest,
};
