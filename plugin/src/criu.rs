//! The functions CRIU exports to plugins (the criu binary is linked with -rdynamic).
//!
//! They are looked up at run time with `dlsym(RTLD_DEFAULT, ...)` rather than linked, so
//! the library also loads outside CRIU (in tests), where they are simply absent.

use std::ffi::{c_char, c_int, c_uint, CString};

use gpucr_abi::plugin_abi::log_level;
use gpucr_abi::PluginFailureKind;

type AddInventoryPlugin = unsafe extern "C" fn(name: *const c_char) -> c_int;
type CheckAndRemove = unsafe extern "C" fn(name: *const c_char, len: c_int) -> bool;
type PrintOnLevel = unsafe extern "C" fn(level: c_uint, fmt: *const c_char, ...);
type InheritFdLookupId = unsafe extern "C" fn(id: *mut c_char) -> c_int;

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

/// At restore: a new descriptor for the file gpucr handed CRIU as `inherit_fd` under
/// `key` (CRIU keeps it in its fdstore, reachable from criu and from every restored
/// task). None outside a restore, or when CRIU has no such key.
pub fn inherited_fd(key: &str) -> Option<std::os::fd::OwnedFd> {
    let ptr = lookup(c"inherit_fd_lookup_id")?;
    let key = CString::new(key).ok()?;
    // SAFETY: the symbol is CRIU's `int inherit_fd_lookup_id(char *id)`, which only reads
    // the string (it compares it with each key).
    let f: InheritFdLookupId = unsafe { std::mem::transmute(ptr) };
    // SAFETY: see above; `key` outlives the call.
    let fd = unsafe { f(key.as_ptr().cast_mut()) };
    // SAFETY: a non-negative answer is a new descriptor (fdstore_get dups it) that
    // nothing else owns.
    (fd >= 0).then(|| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// CRIU's `find_unused_fd_pid(pid)`: the lowest fd number above every fd the restored
/// task `pid` (its pid in its namespace) will have; None outside CRIU.
pub fn unused_fd_floor(pid: u32) -> Option<i32> {
    let ptr = lookup(c"find_unused_fd_pid")?;
    type FindUnusedFdPid = unsafe extern "C" fn(libc::pid_t) -> libc::c_int;
    // SAFETY: the symbol is CRIU's `int find_unused_fd_pid(pid_t pid)`.
    let f: FindUnusedFdPid = unsafe { std::mem::transmute(ptr) };
    // SAFETY: see above; it takes a plain pid and reads CRIU's own tables.
    let fd = unsafe { f(pid as libc::pid_t) };
    (fd >= 0).then_some(fd)
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
    // Every NUL is replaced, so the conversion cannot fail; an empty line would be the
    // answer if it did.
    let line = CString::new(format!("{}: {text}\n", gpucr_abi::PLUGIN_NAME).replace('\0', " "))
        .unwrap_or_default();
    match lookup(c"print_on_level") {
        Some(ptr) => {
            // SAFETY: the symbol is CRIU's variadic
            // `void print_on_level(unsigned int loglevel, const char *format, ...)`.
            let f: PrintOnLevel = unsafe { std::mem::transmute(ptr) };
            // SAFETY: the format is "%s" with one C string argument that outlives the call.
            unsafe { f(level, c"%s".as_ptr(), line.as_ptr()) }
        }
        // Outside CRIU (tests): a closed stderr loses the line, never the hook.
        None => {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }
}

/// A line about what the plugin does, at CRIU's INFO level (gpucr runs CRIU at debug
/// level whenever its plugin is in use, so the logs show every hook call).
pub fn info(text: &str) {
    log(log_level::INFO, text);
}

/// Something the user should know, at CRIU's WARN level.
pub fn warn(text: &str) {
    log(log_level::WARN, &format!("warning: {text}"));
}

/// A failure of the plugin's own part, at CRIU's ERROR level, marked so that gpucr finds
/// it in the log: "gpucr: error: HOOK: what failed".
pub fn error(text: &str) {
    failure(PluginFailureKind::Plugin, text);
}

/// A failure of `kind`, at CRIU's ERROR level, marked so that gpucr finds it in the log
/// and knows its kind: "gpucr: device error: HOOK: what failed" (see
/// `gpucr_abi::PluginFailureKind::mark`).
pub fn failure(kind: PluginFailureKind, text: &str) {
    log(log_level::ERROR, &format!("{}{text}", kind.mark()));
}

/// CRIU's `criu_get_image_dir()`: the image directory's fd in CRIU's table; None outside
/// CRIU.
pub fn image_dir_fd() -> Option<i32> {
    let ptr = lookup(c"criu_get_image_dir")?;
    type GetImageDir = unsafe extern "C" fn() -> c_int;
    // SAFETY: the symbol is CRIU's `int criu_get_image_dir(void)`.
    let f: GetImageDir = unsafe { std::mem::transmute(ptr) };
    // SAFETY: see above; it takes nothing and returns a number.
    let fd = unsafe { f() };
    (fd >= 0).then_some(fd)
}

/// At restore, from the plugin's init hook: hand `fd` to CRIU as an `inherit_fd` under
/// `key`, as `criu restore --inherit-fd` would (CRIU takes the fd over and moves it into
/// its fdstore, reachable from every restored task). False outside CRIU.
pub fn add_inherit_fd(fd: std::os::fd::OwnedFd, key: &str) -> bool {
    use std::os::fd::IntoRawFd;
    let Some(ptr) = lookup(c"inherit_fd_add") else {
        return false;
    };
    let Ok(key) = CString::new(key) else {
        return false;
    };
    type InheritFdAdd = unsafe extern "C" fn(fd: c_int, key: *mut c_char) -> c_int;
    // SAFETY: the symbol is CRIU's `int inherit_fd_add(int fd, char *key)`, which
    // copies the key and keeps the fd.
    let f: InheritFdAdd = unsafe { std::mem::transmute(ptr) };
    let raw = fd.into_raw_fd();
    // SAFETY: see above; `key` outlives the call; CRIU owns `raw` from here on.
    let ok = unsafe { f(raw, key.as_ptr().cast_mut()) } == 0;
    if !ok {
        // SAFETY: CRIU refused it, so `raw` is still ours (and only ours) to close.
        unsafe { libc::close(raw) };
    }
    ok
}
