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
//!
//! Every hook answers `-ENOTSUP` for what it does not own (so other plugins get their
//! turn), and every entry point catches panics at the C boundary.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod criu;
mod device;
mod engine;
mod half;
mod helper;
mod hooks;
mod thread;
mod unresumed;

use std::ffi::{c_int, c_void};
use std::ptr;

use gpucr_abi::plugin_abi::{hook, CrPluginDesc, CRIU_PLUGIN_VERSION};

/// `CR_PLUGIN_DESC` holds raw pointers, which are not `Sync`; CRIU only reads it.
#[repr(transparent)]
pub struct Descriptor(CrPluginDesc);

// SAFETY: the descriptor is immutable; its pointers are to a static string and to
// functions, valid for the life of the library, and CRIU never writes through them.
unsafe impl Sync for Descriptor {}

const fn hooks() -> [*const c_void; hook::COUNT] {
    let mut hooks = [ptr::null(); hook::COUNT];
    hooks[hook::DUMP_EXT_FILE] = hooks::dump_ext_file as *const c_void;
    hooks[hook::RESTORE_EXT_FILE] = hooks::restore_ext_file as *const c_void;
    hooks[hook::HANDLE_DEVICE_VMA] = hooks::handle_device_vma as *const c_void;
    hooks[hook::UPDATE_VMA_MAP] = hooks::update_vma_map as *const c_void;
    hooks[hook::RESUME_DEVICES_LATE] = hooks::resume_devices_late as *const c_void;
    hooks[hook::PAUSE_DEVICES] = hooks::pause_devices as *const c_void;
    hooks[hook::CHECKPOINT_DEVICES] = hooks::checkpoint_devices as *const c_void;
    hooks
}

/// The descriptor CRIU looks up with `dlsym(h, "CR_PLUGIN_DESC")`.
#[unsafe(no_mangle)]
pub static CR_PLUGIN_DESC: Descriptor = Descriptor(CrPluginDesc {
    name: c"gpucr".as_ptr(),
    init: Some(hooks::init),
    exit: Some(hooks::exit),
    version: CRIU_PLUGIN_VERSION,
    max_hooks: hook::COUNT as u32,
    hooks: hooks(),
});

/// The errno a hook returns for files and devices that are not gpucr's.
pub const NOT_OURS: c_int = -libc::ENOTSUP;

/// The hook steps with an explicit plugin half, and the halves, for tests that drive a
/// backend's whole sequence through the helper protocol without CRIU (with a fake
/// kernel behind the half). CRIU's hooks run exactly these steps.
pub mod flow {
    pub use crate::half::amdgpu::AmdgpuHalf;
    pub use crate::half::{Collected, HalfError, PluginHalf, Recreated};
    pub use crate::hooks::{
        checkpoint_devices_with, dump_ext_file_with, exit_with, pause_devices_with,
        restore_ext_file_with, resume_devices_late_with, HookFailure,
    };
}

#[cfg(test)]
mod tests {
    use gpucr_abi::PLUGIN_NAME;

    use super::*;

    #[test]
    fn descriptor_is_what_criu_expects() {
        let d = &CR_PLUGIN_DESC.0;
        assert_eq!(d.version, 0x200);
        assert_eq!(d.max_hooks, 12);
        // SAFETY: the name is a static NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(d.name) };
        assert_eq!(name.to_str().unwrap(), PLUGIN_NAME);
        for (i, h) in d.hooks.iter().enumerate() {
            let expected = matches!(
                i,
                hook::DUMP_EXT_FILE
                    | hook::RESTORE_EXT_FILE
                    | hook::HANDLE_DEVICE_VMA
                    | hook::UPDATE_VMA_MAP
                    | hook::RESUME_DEVICES_LATE
                    | hook::PAUSE_DEVICES
                    | hook::CHECKPOINT_DEVICES
            );
            assert_eq!(!h.is_null(), expected, "hook {i}");
        }
    }
}
