//! `CR_PLUGIN_DESC`, fitted to the CRIU that loads the plugin.
//!
//! CRIU refuses a descriptor whose `max_hooks` exceeds its own hook count (12 in CRIU
//! 4.1, 13 in 4.2, 15 in 4.3 and criu-dev), and criu-dev/4.3 passes RESTORE_EXT_FILE a
//! second argument that 4.1 and 4.2 do not. So the descriptor cannot be one constant:
//! a constructor (`.init_array`), which the dynamic loader runs inside `dlopen`, before
//! CRIU can look `CR_PLUGIN_DESC` up, tells CRIU's hook ABI from CRIU's own binary
//! ([`gpucr_abi::criu_hook_abi`]) and fills the descriptor in for it: the hook count that
//! CRIU accepts, the RESTORE_EXT_FILE entry with the arguments that CRIU passes, and
//! DUMP_DEVICES_LATE where CRIU calls it. Each entry point is a function of exactly the
//! C type CRIU calls it with; none reads an argument CRIU did not pass.
//!
//! Where the ABI cannot be told (the plugin loaded outside CRIU, an unknown CRIU), the
//! descriptor is CRIU 4.1's, with a RESTORE_EXT_FILE entry that refuses gpucr's devices
//! (so CRIU never reads an answer the plugin did not give), and a restore of an image
//! that needs gpucr fails at `init`, saying why ([`abi`]).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::panic::catch_unwind;
use std::ptr;
use std::sync::OnceLock;

use gpucr_abi::criu_hook_abi;
use gpucr_abi::plugin_abi::{
    hook, CrPluginDesc, DumpExtFileFn, HandleDeviceVmaFn, HookAbi, PidHookFn, RestoreExtFileFn,
    RestoreExtFileRetryFn, UpdateVmaMapFn, CRIU_PLUGIN_VERSION,
};

use crate::hooks;

/// `CR_PLUGIN_DESC`: written once by [`fit_to_criu`] inside `dlopen`, read by CRIU after.
#[repr(transparent)]
pub struct Descriptor(UnsafeCell<CrPluginDesc>);

// SAFETY: the descriptor is written only by the constructor, which the dynamic loader
// runs before `dlopen` returns, so before any other code can reach the library's
// symbols; from then on it is only read. Its pointers are to a static string and to
// functions, valid for the life of the library.
unsafe impl Sync for Descriptor {}

impl Descriptor {
    /// The descriptor as CRIU reads it.
    pub fn get(&self) -> &CrPluginDesc {
        // SAFETY: see `Sync`: no write happens once code outside the constructor runs.
        unsafe { &*self.0.get() }
    }
}

/// The descriptor CRIU looks up with `dlsym(h, "CR_PLUGIN_DESC")`.
#[unsafe(no_mangle)]
pub static CR_PLUGIN_DESC: Descriptor = Descriptor(UnsafeCell::new(descriptor_for(None)));

/// The descriptor for a CRIU with hook ABI `abi`, or for one whose ABI is unknown.
pub const fn descriptor_for(abi: Option<HookAbi>) -> CrPluginDesc {
    let mut hooks = [ptr::null(); hook::MAX_KNOWN];
    hooks[hook::DUMP_EXT_FILE] = hooks::dump_ext_file as DumpExtFileFn as *const c_void;
    hooks[hook::HANDLE_DEVICE_VMA] = hooks::handle_device_vma as HandleDeviceVmaFn as *const c_void;
    hooks[hook::UPDATE_VMA_MAP] = hooks::update_vma_map as UpdateVmaMapFn as *const c_void;
    hooks[hook::RESUME_DEVICES_LATE] = hooks::resume_devices_late as PidHookFn as *const c_void;
    hooks[hook::PAUSE_DEVICES] = hooks::pause_devices as PidHookFn as *const c_void;
    hooks[hook::CHECKPOINT_DEVICES] = hooks::checkpoint_devices as PidHookFn as *const c_void;
    let max_hooks = match abi {
        Some(abi) => {
            hooks[hook::RESTORE_EXT_FILE] = if abi.restore_ext_file_retry() {
                hooks::restore_ext_file_retry as RestoreExtFileRetryFn as *const c_void
            } else {
                hooks::restore_ext_file as RestoreExtFileFn as *const c_void
            };
            if abi.dump_devices_late() {
                hooks[hook::DUMP_DEVICES_LATE] =
                    hooks::dump_devices_late as PidHookFn as *const c_void;
            }
            abi.max_hooks()
        }
        None => {
            hooks[hook::RESTORE_EXT_FILE] =
                hooks::restore_ext_file_unknown_abi as RestoreExtFileFn as *const c_void;
            HookAbi::Criu41.max_hooks()
        }
    };
    CrPluginDesc {
        name: c"gpucr".as_ptr(),
        init: Some(init),
        exit: Some(hooks::exit),
        version: CRIU_PLUGIN_VERSION,
        max_hooks: max_hooks as u32,
        hooks,
    }
}

/// The hook ABI of the CRIU that loaded the plugin, or why it could not be told.
pub fn abi() -> Result<HookAbi, &'static str> {
    static ABI: OnceLock<Result<HookAbi, String>> = OnceLock::new();
    ABI.get_or_init(|| criu_hook_abi::of_running_criu().map_err(|e| e.to_string()))
        .as_ref()
        .copied()
        .map_err(String::as_str)
}

/// CRIU's `init` hook: the run starts with the hook ABI the descriptor was fitted to.
unsafe extern "C" fn init(stage: c_int) -> c_int {
    hooks::init(stage, abi())
}

/// Runs inside `dlopen` (`.init_array`), before CRIU looks the descriptor up.
extern "C" fn fit_to_criu() {
    // A panic must not unwind into the dynamic loader: the descriptor stays CRIU 4.1's.
    let Ok(fitted) = catch_unwind(|| descriptor_for(abi().ok())) else {
        return;
    };
    // SAFETY: the dynamic loader runs this before `dlopen` returns, so nothing reads the
    // descriptor yet and nothing else writes it (see `Sync` above).
    unsafe { *CR_PLUGIN_DESC.0.get() = fitted };
}

#[used]
#[unsafe(link_section = ".init_array")]
static FIT_TO_CRIU: extern "C" fn() = fit_to_criu;

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use gpucr_abi::PLUGIN_NAME;

    use super::*;

    fn registered(d: &CrPluginDesc) -> Vec<usize> {
        (0..d.max_hooks as usize)
            .filter(|&i| !d.hooks[i].is_null())
            .collect()
    }

    #[test]
    fn each_abi_gets_the_hooks_and_count_it_declares() {
        for abi in HookAbi::ALL {
            let d = descriptor_for(Some(abi));
            assert_eq!(d.version, 0x200);
            assert_eq!(d.max_hooks as usize, abi.max_hooks(), "{abi:?}");
            let mut expected: Vec<usize> = abi.registered().iter().map(|h| h.number).collect();
            expected.sort();
            assert_eq!(registered(&d), expected, "{abi:?}");
            // Nothing past what CRIU reads.
            assert!(
                d.hooks[d.max_hooks as usize..].iter().all(|h| h.is_null()),
                "{abi:?}"
            );
            // SAFETY: the name is a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(d.name) };
            assert_eq!(name.to_str().unwrap(), PLUGIN_NAME);
        }
    }

    #[test]
    fn restore_ext_file_takes_the_arguments_each_criu_passes() {
        let entry = |abi| descriptor_for(abi).hooks[hook::RESTORE_EXT_FILE];
        let one_arg = hooks::restore_ext_file as RestoreExtFileFn as *const c_void;
        let retry = hooks::restore_ext_file_retry as RestoreExtFileRetryFn as *const c_void;
        let refusing = hooks::restore_ext_file_unknown_abi as RestoreExtFileFn as *const c_void;
        assert_eq!(entry(Some(HookAbi::Criu41)), one_arg);
        assert_eq!(entry(Some(HookAbi::Criu42)), one_arg);
        assert_eq!(entry(Some(HookAbi::Criu43)), retry);
        assert_eq!(entry(None), refusing);
        let late = descriptor_for(Some(HookAbi::Criu43)).hooks[hook::DUMP_DEVICES_LATE];
        assert_eq!(late, hooks::dump_devices_late as PidHookFn as *const c_void);
    }

    #[test]
    fn outside_criu_the_descriptor_is_criu_4_1_s_that_refuses_devices() {
        // The test binary is no CRIU: the constructor ran and found that out.
        let err = abi().unwrap_err();
        assert!(err.contains("is not a CRIU binary gpucr knows"), "{err}");
        let d = CR_PLUGIN_DESC.get();
        assert_eq!(d.max_hooks, 12);
        assert_eq!(
            d.hooks[hook::RESTORE_EXT_FILE],
            hooks::restore_ext_file_unknown_abi as RestoreExtFileFn as *const c_void
        );
    }
}
