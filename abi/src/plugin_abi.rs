//! CRIU's plugin ABI (criu/include/criu-plugin.h, CRIU 4.0 to 4.3 and criu-dev).
//!
//! CRIU dlopens every `*.so` in its plugin directory and looks up the data symbol
//! `CR_PLUGIN_DESC`. It refuses a descriptor whose `max_hooks` exceeds its own
//! `CR_PLUGIN_HOOK__MAX`: 12 in CRIU 4.0 and 4.1, 13 in 4.2 (POST_FORKING), 15 in 4.3
//! and criu-dev since November 2025 (RESTORE_INIT, DUMP_DEVICES_LATE), which also gave
//! RESTORE_EXT_FILE a second argument without changing `CRIU_PLUGIN_VERSION`. Which of
//! these the CRIU that loaded the plugin has is [`HookAbi`], told from CRIU's own
//! binary ([`crate::criu_hook_abi`]). CRIU frees descriptors of version 0x100, so a
//! static descriptor must never claim it.

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
    /// CRIU 4.2 on.
    pub const POST_FORKING: usize = 12;
    /// CRIU 4.3 and criu-dev on: run at the start of a restore, right after the plugins'
    /// `init`.
    pub const RESTORE_INIT: usize = 13;
    /// CRIU 4.3 and criu-dev on: `(int pid)`, once, after every task of the tree is
    /// dumped; a failure fails the dump.
    pub const DUMP_DEVICES_LATE: usize = 14;
    /// The length of gpucr's hook array: the largest `CR_PLUGIN_HOOK__MAX` it knows.
    /// The descriptor's `max_hooks` says how many of them the CRIU at hand reads.
    pub const MAX_KNOWN: usize = 15;
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

/// `cr_plugin_desc_t` with the longest hook array gpucr knows ([`hook::MAX_KNOWN`]
/// entries). CRIU reads `max_hooks` of them, so the array may be longer than the one
/// CRIU's own header declares.
#[repr(C)]
pub struct CrPluginDesc {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(stage: c_int) -> c_int>,
    pub exit: Option<unsafe extern "C" fn(stage: c_int, ret: c_int)>,
    pub version: c_uint,
    pub max_hooks: c_uint,
    pub hooks: [*const c_void; hook::MAX_KNOWN],
}

// Layout of cr_plugin_desc_t on LP64, as criu/include/criu-plugin.h of CRIU 4.1 to
// criu-dev declares it (a name pointer, two function pointers, two unsigned ints, then
// the hook array). Checked here at compile time and against each CRIU's header by
// tests/criu_plugin_header.rs; CRIU loading the plugin ("version 512 hooks N" in its
// log) is checked by the end-to-end tests.
const _: () = {
    assert!(size_of::<CrPluginDesc>() == 32 + 8 * hook::MAX_KNOWN);
    assert!(offset_of!(CrPluginDesc, name) == 0);
    assert!(offset_of!(CrPluginDesc, init) == 8);
    assert!(offset_of!(CrPluginDesc, exit) == 16);
    assert!(offset_of!(CrPluginDesc, version) == 24);
    assert!(offset_of!(CrPluginDesc, max_hooks) == 28);
    assert!(offset_of!(CrPluginDesc, hooks) == 32);
};

/// Hook signatures.
pub type DumpExtFileFn = unsafe extern "C" fn(fd: c_int, id: c_int) -> c_int;
/// RESTORE_EXT_FILE up to CRIU 4.2.
pub type RestoreExtFileFn = unsafe extern "C" fn(id: c_int) -> c_int;
/// RESTORE_EXT_FILE from CRIU 4.3 (criu-dev fb02dbf68): the plugin sets
/// `*retry_needed` to ask CRIU to call it again for the same file later.
pub type RestoreExtFileRetryFn = unsafe extern "C" fn(id: c_int, retry_needed: *mut bool) -> c_int;
pub type PidHookFn = unsafe extern "C" fn(pid: c_int) -> c_int;
pub type HandleDeviceVmaFn = unsafe extern "C" fn(fd: c_int, stat: *const libc::stat) -> c_int;
pub type UpdateVmaMapFn = unsafe extern "C" fn(
    path: *const c_char,
    addr: u64,
    old_pgoff: u64,
    new_pgoff: *mut u64,
    plugin_fd: *mut c_int,
) -> c_int;

/// Which hook ABI a CRIU build has: how many hooks it reads from a descriptor, and the
/// arguments it passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAbi {
    /// CRIU 4.0 and 4.1: hooks 0 to 11.
    Criu41,
    /// CRIU 4.2: adds POST_FORKING (12).
    Criu42,
    /// CRIU 4.3 and criu-dev from November 2025: RESTORE_EXT_FILE(id, &retry_needed),
    /// RESTORE_INIT (13) and DUMP_DEVICES_LATE (14).
    Criu43,
}

/// A hook gpucr's plugin registers: its number, the name CRIU's header gives it, and
/// the C type of gpucr's function (as `DECLARE_PLUGIN_HOOK_ARGS` would declare it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookSignature {
    pub number: usize,
    pub c_name: &'static str,
    pub c_type: &'static str,
}

const fn sig(number: usize, c_name: &'static str, c_type: &'static str) -> HookSignature {
    HookSignature {
        number,
        c_name,
        c_type,
    }
}

/// The hooks registered under every ABI, with the signatures all of them share.
const COMMON_HOOKS: [HookSignature; 6] = [
    sig(
        hook::DUMP_EXT_FILE,
        "CR_PLUGIN_HOOK__DUMP_EXT_FILE",
        "int (int, int)",
    ),
    sig(
        hook::HANDLE_DEVICE_VMA,
        "CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA",
        "int (int, const struct stat *)",
    ),
    sig(
        hook::UPDATE_VMA_MAP,
        "CR_PLUGIN_HOOK__UPDATE_VMA_MAP",
        "int (const char *, const uint64_t, const uint64_t, uint64_t *, int *)",
    ),
    sig(
        hook::RESUME_DEVICES_LATE,
        "CR_PLUGIN_HOOK__RESUME_DEVICES_LATE",
        "int (int)",
    ),
    sig(
        hook::PAUSE_DEVICES,
        "CR_PLUGIN_HOOK__PAUSE_DEVICES",
        "int (int)",
    ),
    sig(
        hook::CHECKPOINT_DEVICES,
        "CR_PLUGIN_HOOK__CHECKPOINT_DEVICES",
        "int (int)",
    ),
];
const RESTORE_EXT_FILE_ID: HookSignature = sig(
    hook::RESTORE_EXT_FILE,
    "CR_PLUGIN_HOOK__RESTORE_EXT_FILE",
    "int (int)",
);
const RESTORE_EXT_FILE_RETRY: HookSignature = sig(
    hook::RESTORE_EXT_FILE,
    "CR_PLUGIN_HOOK__RESTORE_EXT_FILE",
    "int (int, bool *)",
);
const DUMP_DEVICES_LATE: HookSignature = sig(
    hook::DUMP_DEVICES_LATE,
    "CR_PLUGIN_HOOK__DUMP_DEVICES_LATE",
    "int (int)",
);

const fn with<const N: usize, const M: usize>(extra: [HookSignature; M]) -> [HookSignature; N] {
    let mut all = [RESTORE_EXT_FILE_ID; N];
    let mut i = 0;
    while i < COMMON_HOOKS.len() {
        all[i] = COMMON_HOOKS[i];
        i += 1;
    }
    let mut j = 0;
    while j < M {
        all[i + j] = extra[j];
        j += 1;
    }
    all
}

static HOOKS_UP_TO_42: [HookSignature; 7] = with([RESTORE_EXT_FILE_ID]);
static HOOKS_43: [HookSignature; 8] = with([RESTORE_EXT_FILE_RETRY, DUMP_DEVICES_LATE]);

impl HookAbi {
    pub const ALL: [HookAbi; 3] = [HookAbi::Criu41, HookAbi::Criu42, HookAbi::Criu43];

    /// CRIU's `CR_PLUGIN_HOOK__MAX`: the `max_hooks` gpucr's descriptor declares.
    pub const fn max_hooks(self) -> usize {
        match self {
            HookAbi::Criu41 => 12,
            HookAbi::Criu42 => 13,
            HookAbi::Criu43 => 15,
        }
    }

    /// Whether RESTORE_EXT_FILE gets `bool *retry_needed`, which the plugin must set.
    pub const fn restore_ext_file_retry(self) -> bool {
        matches!(self, HookAbi::Criu43)
    }

    /// Whether CRIU calls DUMP_DEVICES_LATE.
    pub const fn dump_devices_late(self) -> bool {
        matches!(self, HookAbi::Criu43)
    }

    /// The hooks gpucr's plugin registers under this ABI, with their C types.
    pub fn registered(self) -> &'static [HookSignature] {
        match self {
            HookAbi::Criu41 | HookAbi::Criu42 => &HOOKS_UP_TO_42,
            HookAbi::Criu43 => &HOOKS_43,
        }
    }

    /// The CRIU releases with this ABI, for messages and logs.
    pub const fn releases(self) -> &'static str {
        match self {
            HookAbi::Criu41 => "CRIU 4.0/4.1",
            HookAbi::Criu42 => "CRIU 4.2",
            HookAbi::Criu43 => "CRIU 4.3/criu-dev",
        }
    }
}
