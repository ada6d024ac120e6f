//! The functions CRIU exports to plugins (the criu binary is linked with -rdynamic).
//!
//! They are looked up at run time with `dlsym(RTLD_DEFAULT, ...)` rather than linked, so
//! the library also loads outside CRIU (in tests), where they are simply absent.

use std::ffi::{c_char, c_int, c_uint, CString};

use gpucr_abi::plugin_abi::log_level;

type AddInventoryPlugin = unsafe extern "C" fn(name: *const c_char) -> c_int;
type CheckAndRemove = unsafe extern "C" fn(name: *const c_char, len: c_int) -> bool;
type PrintOnLevel = unsafe extern "C" fn(level: c_uint, fmt: *const c_char, ...);

fn lookup(symbol: &std::ffi::CStr) -> Option<*mut libc::c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

/// Record in the image inventory that restoring it needs this plugin.
pub fn add_inventory_plugin(name: &str) -> bool {
    let Some(ptr) = lookup(c"add_inventory_plugin") else {
        return false;
    };
    let Ok(name) = CString::new(name) else {
        return false;
    };
    // SAFETY: the symbol is CRIU's `int add_inventory_plugin(const char *name)`; CRIU
    // copies the name.
    let f: AddInventoryPlugin = unsafe { std::mem::transmute(ptr) };
    // SAFETY: see above; `name` outlives the call.
    unsafe { f(name.as_ptr()) == 0 }
}

/// At restore: claim this plugin's inventory entry so CRIU does not fail with "Missing
/// required plugin". False when the image was dumped without the plugin.
pub fn check_and_remove_inventory_plugin(name: &str) -> bool {
    let Some(ptr) = lookup(c"check_and_remove_inventory_plugin") else {
        return false;
    };
    let Ok(cname) = CString::new(name) else {
        return false;
    };
    // SAFETY: the symbol is CRIU's
    // `bool check_and_remove_inventory_plugin(const char *name, int len)`.
    let f: CheckAndRemove = unsafe { std::mem::transmute(ptr) };
    // SAFETY: see above; `cname` outlives the call and `len` is its length.
    unsafe { f(cname.as_ptr(), name.len() as c_int) }
}

/// True for images older than the inventory's plugin list, where CRIU answers every
/// `check_and_remove_inventory_plugin` with true (so a loop must stop after one).
pub fn inventory_is_legacy() -> bool {
    // Two different made-up names both "found" only happens in that mode.
    check_and_remove_inventory_plugin("gpucr-probe-a\u{1}")
        && check_and_remove_inventory_plugin("gpucr-probe-b\u{1}")
}

/// Write a line to CRIU's log at `level`, prefixed "gpucr: "; stderr outside CRIU.
pub fn log(level: u32, text: &str) {
    let line = CString::new(format!("gpucr: {text}\n").replace('\0', " ")).expect("no NUL left");
    match lookup(c"print_on_level") {
        Some(ptr) => {
            // SAFETY: the symbol is CRIU's variadic
            // `void print_on_level(unsigned int loglevel, const char *format, ...)`.
            let f: PrintOnLevel = unsafe { std::mem::transmute(ptr) };
            // SAFETY: the format is "%s" with one C string argument that outlives the call.
            unsafe { f(level, c"%s".as_ptr(), line.as_ptr()) }
        }
        None => eprint!("{}", line.to_string_lossy()),
    }
}

/// A line about what the plugin does, at CRIU's INFO level (gpucr runs CRIU at debug
/// level whenever its plugin is in use, so the logs show every hook call).
pub fn info(text: &str) {
    log(log_level::INFO, text);
}

pub fn error(text: &str) {
    log(log_level::ERROR, text);
}
