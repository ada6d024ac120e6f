//! CRIU's plugin ABI (criu/include/criu-plugin.h, CRIU 4.0 to 4.2).
//!
//! CRIU dlopens every `*.so` in its plugin directory and looks up the data symbol
//! `CR_PLUGIN_DESC`. A descriptor with `version = 0x200` and `max_hooks = 12` loads in
//! CRIU 4.1 (hooks 0..11) and 4.2 (which adds hook 12, POST_FORKING, and accepts any
//! `max_hooks <= 13`). CRIU frees descriptors of version 0x100, so a static descriptor
//! must never claim it.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// `CRIU_PLUGIN_GEN_VERSION(a, b, c)`.
pub const fn gen_version(major: u32, minor: u32, sublevel: u32) -> u32 {
    (major << 16) + (minor << 8) + sublevel
}

/// The plugin ABI version gpucr implements: 0.2.0.
pub const CRIU_PLUGIN_VERSION: u32 = gen_version(0, 2, 0);
/// Reserved for descriptors CRIU builds itself for legacy plugins; never use it.
pub const CRIU_PLUGIN_VERSION_OLD: u32 = gen_version(0, 1, 0);

/// Hook numbers (`CR_PLUGIN_HOOK__*`).
pub mod hook {
    pub const DUMP_UNIX_SK: usize = 0;
    pub const RESTORE_UNIX_SK: usize = 1;
    pub const DUMP_EXT_FILE: usize = 2;
    pub const RESTORE_EXT_FILE: usize = 3;
    pub const DUMP_EXT_MOUNT: usize = 4;
    pub const RESTORE_EXT_MOUNT: usize = 5;
    pub const DUMP_EXT_LINK: usize = 6;
    pub const HANDLE_DEVICE_VMA: usize = 7;
    pub const UPDATE_VMA_MAP: usize = 8;
    pub const RESUME_DEVICES_LATE: usize = 9;
    pub const PAUSE_DEVICES: usize = 10;
    pub const CHECKPOINT_DEVICES: usize = 11;
    /// CRIU 4.2 only.
    pub const POST_FORKING: usize = 12;
    /// The hooks gpucr's descriptor declares (CRIU 4.1's CR_PLUGIN_HOOK__MAX).
    pub const COUNT: usize = 12;
}

/// Stages passed to `init` and `exit` (`CR_PLUGIN_STAGE__*`).
pub mod stage {
    pub const DUMP: i32 = 0;
    pub const PRE_DUMP: i32 = 1;
    pub const RESTORE: i32 = 2;
}

/// CRIU's log levels for `print_on_level`.
pub mod log_level {
    pub const MSG: u32 = 0;
    pub const ERROR: u32 = 1;
    pub const WARN: u32 = 2;
    pub const INFO: u32 = 3;
    pub const DEBUG: u32 = 4;
}

/// `cr_plugin_desc_t` with CRIU 4.1's hook array (12 entries).
#[repr(C)]
pub struct CrPluginDesc {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(stage: c_int) -> c_int>,
    pub exit: Option<unsafe extern "C" fn(stage: c_int, ret: c_int)>,
    pub version: c_uint,
    pub max_hooks: c_uint,
    pub hooks: [*const c_void; hook::COUNT],
}

// Layout of cr_plugin_desc_t on LP64, as criu/include/criu-plugin.h of CRIU 4.1 and 4.2
// declares it (a name pointer, two function pointers, two unsigned ints, then the hook
// array). Checked here at compile time; CRIU loading the plugin ("version 512 hooks 12"
// in its log) is checked by the end-to-end tests.
const _: () = {
    assert!(size_of::<CrPluginDesc>() == 128);
    assert!(offset_of!(CrPluginDesc, name) == 0);
    assert!(offset_of!(CrPluginDesc, init) == 8);
    assert!(offset_of!(CrPluginDesc, exit) == 16);
    assert!(offset_of!(CrPluginDesc, version) == 24);
    assert!(offset_of!(CrPluginDesc, max_hooks) == 28);
    assert!(offset_of!(CrPluginDesc, hooks) == 32);
};

/// Hook signatures.
pub type DumpExtFileFn = unsafe extern "C" fn(fd: c_int, id: c_int) -> c_int;
pub type RestoreExtFileFn = unsafe extern "C" fn(id: c_int) -> c_int;
pub type PidHookFn = unsafe extern "C" fn(pid: c_int) -> c_int;
