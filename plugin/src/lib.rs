//! gpucr's CRIU plugin.
//!
//! CRIU loads it from the directory gpucr names in `CRIU_LIBS_DIR` (set on the `criu
//! swrk` child only). It does only what must happen inside CRIU's process or inside a
//! restored task, and hands everything else to gpucr's helper over private connections
//! opened through the connector CRIU inherited from gpucr (`GPUCR_HELPER_FD` at dump,
//! CRIU's fdstore under the inherit_fd key "gpucr-helper" at restore; see `helper.rs`):
//!
//! * CHECKPOINT_DEVICES(pid), criu main, tree frozen: the helper starts copying the
//!   task's device memory while CRIU dumps CPU pages.
//! * DUMP_EXT_FILE(fd, id), criu main: the helper says whether the fd is a device it
//!   carries; if so the plugin registers itself in the image inventory.
//! * RESTORE_EXT_FILE(id), inside the restored task: recreate the device state the
//!   helper describes (directories, files, sized buffers), hand the buffers to the helper
//!   to fill, return the reopened device fd to CRIU at once.
//! * RESUME_DEVICES_LATE(pid), criu main, before the task runs: wait until the helper
//!   has filled the task's buffers.
//! * DUMP_DEVICES_LATE(pid), criu main, CRIU 4.3 on, once every task is dumped: engine
//!   mode finishes the GPU copy and takes the manifest's room there.
//!
//! The descriptor is fitted to the hook ABI of the CRIU that loads the plugin
//! ([`descriptor`]). Everything the plugin holds of one CRIU run, from `init` to `exit`,
//! is in one [`flow::PluginRun`] (`run.rs`), with the settings read at `init`.
//!
//! Every hook answers `-ENOTSUP` for what it does not own (so other plugins get their
//! turn), and every entry point catches panics at the C boundary.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod criu;
mod descriptor;
mod device;
mod engine;
mod half;
mod helper;
mod hooks;
mod run;
mod settings;
mod thread;
mod unresumed;

use std::ffi::c_int;

pub use descriptor::{Descriptor, CR_PLUGIN_DESC};

/// The errno a hook returns for files and devices that are not gpucr's.
pub const NOT_OURS: c_int = -libc::ENOTSUP;

/// One CRIU run with explicit settings and plugin half, for tests that drive a backend's
/// whole sequence through the helper protocol without CRIU (with a fake kernel behind
/// the half). CRIU's hooks call exactly these methods on the run its `init` starts.
pub mod flow {
    pub use crate::half::amdgpu::AmdgpuHalf;
    pub use crate::half::{Collected, HalfError, PluginHalf, Recreated};
    pub use crate::run::{HookFailure, PluginRun};
    pub use crate::settings::Settings;
}
