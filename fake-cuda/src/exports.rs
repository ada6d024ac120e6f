//! The exported C functions, and `cuGetProcAddress`'s table of them.
//!
//! Every function goes through [`call`]: failure injection first (an injected failure
//! does nothing else), then the body with panics caught (`CUDA_ERROR_UNKNOWN`), then the
//! call log.
//!
//! The functions' types, the ABI versions `cuGetProcAddress` knows and the argument
//! structs' layouts are those of NVIDIA's headers ([`crate::cuda_h`], [`crate::args`]),
//! for the version the fake reports.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Duration;

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::Uuid;

use crate::app;
use crate::args::{self, ArgsError};
use crate::calllog;
use crate::config::{self, Config};
use crate::control;
use crate::cuda_h::{self as h, CUresult, CUuuid, Header};
use crate::devptr::DevPtr;
use crate::fail::Injector;
use crate::mailbox::Op;

static INJECTOR: OnceLock<Injector> = OnceLock::new();

thread_local! {
    /// The calling thread's current context: a GPU ordinal.
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Contexts handed out are this plus the ordinal (never 0, never dereferenced).
const CONTEXT_BASE: usize = 0xc7c0_0000;

fn call(
    function: &str,
    target: Option<i32>,
    args: impl FnOnce() -> String,
    body: impl FnOnce(&'static Config) -> Result<(), CUresult>,
) -> CUresult {
    let config = match config::get() {
        Ok(c) => c,
        Err(_) => return result::INVALID_VALUE,
    };
    let start_ns = calllog::now_ns();
    let injected = INJECTOR
        .get_or_init(Injector::default)
        .check(&config.fail, function);
    let code = match injected {
        Some(code) => code,
        None => match catch_unwind(AssertUnwindSafe(|| body(config))) {
            Ok(Ok(())) => result::SUCCESS,
            Ok(Err(code)) => code,
            Err(_) => result::UNKNOWN,
        },
    };
    if let Some(log) = &config.log {
        calllog::record(log, function, target, &args(), code, start_ns);
    }
    code
}

type CUcontext = *mut c_void;
type CUdevice = c_int;
type CUdeviceptr = u64;

/// `cuGetProcAddress`'s answers (`CUdriverProcAddressQueryResult`).
const PROC_ADDRESS_SUCCESS: c_int = 0;
const PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The header of the reported version, whose structs the checkpoint functions read.
fn header_of(config: &Config) -> Result<&'static Header, CUresult> {
    args::header(config.version).map_err(|_| result::NOT_SUPPORTED)
}

/// Decodes arguments with the reported version's header (`None`: no configuration or
/// no header), for call-log summaries computed outside [`call`]'s body.
fn decoded<T>(
    f: impl FnOnce(&'static Header) -> Result<T, ArgsError>,
) -> Option<Result<T, ArgsError>> {
    let config = config::get().ok()?;
    args::header(config.version).ok().map(f)
}

fn current() -> Result<usize, CUresult> {
    CURRENT.with(|c| c.get()).ok_or(result::INVALID_CONTEXT)
}

/// `cuInit`.
#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call(
        "cuInit",
        None,
        || format!("flags={flags}"),
        |config| {
            if flags != 0 {
                return Err(result::INVALID_VALUE);
            }
            app::init(config).map(|_| ())
        },
    )
}

/// `cuDriverGetVersion`.
///
/// # Safety
/// `version` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    call("cuDriverGetVersion", None, String::new, |config| {
        if version.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: non-null and writable per the contract.
        unsafe { *version = config.version };
        Ok(())
    })
}

/// `cuGetErrorName`: the names of `gpucr_cuda_driver::result`'s table.
///
/// # Safety
/// `name` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult {
    call(
        "cuGetErrorName",
        None,
        || format!("error={error}"),
        |_| {
            if name.is_null() {
                return Err(result::INVALID_VALUE);
            }
            let found = result::name_cstr(error);
            // SAFETY: non-null and writable per the contract; the names are static.
            unsafe { *name = found.map_or(std::ptr::null(), CStr::as_ptr) };
            found.map(|_| ()).ok_or(result::INVALID_VALUE)
        },
    )
}

/// One exported function, as `cuGetProcAddress` finds it.
struct Entry {
    name: &'static str,
    /// The CUDA version that introduced this ABI of it.
    since: c_int,
    pfn: *mut c_void,
}

fn table() -> Vec<Entry> {
    macro_rules! entry {
        ($name:literal, $since:literal, $f:expr, $ty:ty) => {
            Entry {
                name: $name,
                since: $since,
                // The cast through the header's `PFN_` type checks the signature.
                pfn: ($f as $ty) as *mut c_void,
            }
        };
    }
    vec![
        entry!("cuInit", 2000, cuInit, h::PFN_cuInit_v2000),
        entry!(
            "cuDriverGetVersion",
            2020,
            cuDriverGetVersion,
            h::PFN_cuDriverGetVersion_v2020
        ),
        entry!(
            "cuGetErrorName",
            6000,
            cuGetErrorName,
            h::PFN_cuGetErrorName_v6000
        ),
        entry!(
            "cuGetProcAddress",
            11030,
            cuGetProcAddress,
            h::PFN_cuGetProcAddress_v11030
        ),
        entry!(
            "cuGetProcAddress",
            12000,
            cuGetProcAddress_v2,
            h::PFN_cuGetProcAddress_v12000
        ),
        entry!(
            "cuDeviceGetCount",
            2000,
            cuDeviceGetCount,
            h::PFN_cuDeviceGetCount_v2000
        ),
        entry!("cuDeviceGet", 2000, cuDeviceGet, h::PFN_cuDeviceGet_v2000),
        entry!(
            "cuDeviceGetUuid",
            9020,
            cuDeviceGetUuid,
            h::PFN_cuDeviceGetUuid_v9020
        ),
        entry!(
            "cuDeviceGetUuid",
            11040,
            cuDeviceGetUuid_v2,
            h::PFN_cuDeviceGetUuid_v11040
        ),
        entry!(
            "cuDevicePrimaryCtxRetain",
            7000,
            cuDevicePrimaryCtxRetain,
            h::PFN_cuDevicePrimaryCtxRetain_v7000
        ),
        entry!(
            "cuCtxSetCurrent",
            4000,
            cuCtxSetCurrent,
            h::PFN_cuCtxSetCurrent_v4000
        ),
        entry!(
            "cuCtxSynchronize",
            2000,
            cuCtxSynchronize,
            h::PFN_cuCtxSynchronize_v2000
        ),
        entry!("cuMemAlloc", 3020, cuMemAlloc_v2, h::PFN_cuMemAlloc_v3020),
        entry!("cuMemFree", 3020, cuMemFree_v2, h::PFN_cuMemFree_v3020),
        entry!(
            "cuMemcpyHtoD",
            3020,
            cuMemcpyHtoD_v2,
            h::PFN_cuMemcpyHtoD_v3020
        ),
        entry!(
            "cuMemcpyDtoH",
            3020,
            cuMemcpyDtoH_v2,
            h::PFN_cuMemcpyDtoH_v3020
        ),
        entry!(
            "cuCheckpointProcessLock",
            12080,
            cuCheckpointProcessLock,
            h::PFN_cuCheckpointProcessLock_v12080
        ),
        entry!(
            "cuCheckpointProcessCheckpoint",
            12080,
            cuCheckpointProcessCheckpoint,
            h::PFN_cuCheckpointProcessCheckpoint_v12080
        ),
        entry!(
            "cuCheckpointProcessRestore",
            12080,
            cuCheckpointProcessRestore,
            h::PFN_cuCheckpointProcessRestore_v12080
        ),
        entry!(
            "cuCheckpointProcessUnlock",
            12080,
            cuCheckpointProcessUnlock,
            h::PFN_cuCheckpointProcessUnlock_v12080
        ),
        entry!(
            "cuCheckpointProcessGetState",
            12080,
            cuCheckpointProcessGetState,
            h::PFN_cuCheckpointProcessGetState_v12080
        ),
        entry!(
            "cuCheckpointProcessGetRestoreThreadId",
            12080,
            cuCheckpointProcessGetRestoreThreadId,
            h::PFN_cuCheckpointProcessGetRestoreThreadId_v12080
        ),
        entry!(
            "cuCheckpointOperationComplete",
            13040,
            cuCheckpointOperationComplete,
            h::PFN_cuCheckpointOperationComplete_v13040
        ),
    ]
}

/// Looks `symbol` up at `version` as a driver of the configured version does: the
/// newest ABI of it that the driver's header declares, not newer than the driver nor
/// than `version`. A driver older than every header answers as the oldest one, less the
/// functions newer than itself. The fake implements the ABIs of its table only: an older
/// one is `VERSION_NOT_SUFFICIENT` (`cuMemAlloc` below 3020), a newer one
/// `SYMBOL_NOT_FOUND` (`cuCtxSynchronize` at 13000, which takes a context).
fn lookup(config: &Config, symbol: &str, version: c_int) -> Result<*mut c_void, c_int> {
    let header = args::header(config.version).unwrap_or(&h::HEADERS[0]);
    let abis: Vec<i32> = header
        .functions
        .iter()
        .find(|f| f.name == symbol)
        .map(|f| {
            f.versions
                .iter()
                .copied()
                .filter(|v| *v <= config.version)
                .collect()
        })
        .unwrap_or_default();
    if abis.is_empty() {
        return Err(PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    let abi = abis
        .into_iter()
        .filter(|v| *v <= version)
        .max()
        .ok_or(PROC_ADDRESS_VERSION_NOT_SUFFICIENT)?;
    let implemented: Vec<Entry> = table().into_iter().filter(|e| e.name == symbol).collect();
    match implemented.iter().find(|e| e.since == abi) {
        Some(e) => Ok(e.pfn),
        None if implemented.iter().all(|e| e.since > abi) => {
            Err(PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        }
        None => Err(PROC_ADDRESS_SYMBOL_NOT_FOUND),
    }
}

/// `cuGetProcAddress_v2`.
///
/// # Safety
/// `symbol` is a NUL-terminated string; `pfn` and `status` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let name = if symbol.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string per the contract.
        unsafe { CStr::from_ptr(symbol) }
            .to_string_lossy()
            .into_owned()
    };
    call(
        "cuGetProcAddress",
        None,
        || format!("symbol={name} version={cuda_version} flags={flags}"),
        |config| {
            if pfn.is_null() || name.is_empty() {
                return Err(result::INVALID_VALUE);
            }
            let found = lookup(config, &name, cuda_version);
            // SAFETY: `pfn` is non-null and writable, `status` null or writable, per
            // the contract.
            unsafe {
                *pfn = *found.as_ref().unwrap_or(&std::ptr::null_mut());
                if !status.is_null() {
                    *status = found.err().unwrap_or(PROC_ADDRESS_SUCCESS);
                }
            }
            found.map(|_| ()).map_err(|_| result::NOT_FOUND)
        },
    )
}

/// `cuGetProcAddress` (the four-argument ABI).
///
/// # Safety
/// As [`cuGetProcAddress_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract, without a status.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

fn uuid_of(uuid: &CUuuid) -> Uuid {
    Uuid::from_cu(gpucr_cuda_driver::sys::CUuuid { bytes: uuid.bytes })
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// `count` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    call("cuDeviceGetCount", None, String::new, |_| {
        let app = app::get()?;
        if count.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: non-null and writable per the contract.
        unsafe { *count = app.device_count() as c_int };
        Ok(())
    })
}

/// `cuDeviceGet`.
///
/// # Safety
/// `device` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    call(
        "cuDeviceGet",
        None,
        || format!("ordinal={ordinal}"),
        |_| {
            let app = app::get()?;
            if device.is_null() || ordinal < 0 || ordinal as usize >= app.device_count() {
                return Err(result::INVALID_DEVICE);
            }
            // SAFETY: non-null and writable per the contract.
            unsafe { *device = ordinal };
            Ok(())
        },
    )
}

fn device_uuid(function: &str, uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    call(
        function,
        None,
        || format!("device={dev}"),
        |_| {
            let app = app::get()?;
            let found = usize::try_from(dev)
                .ok()
                .and_then(|d| app.uuid(d))
                .ok_or(result::INVALID_DEVICE)?;
            if uuid.is_null() {
                return Err(result::INVALID_VALUE);
            }
            // SAFETY: non-null and writable per the contract of the callers.
            unsafe {
                *uuid = CUuuid {
                    bytes: found.to_cu().bytes,
                }
            };
            Ok(())
        },
    )
}

/// `cuDeviceGetUuid`.
///
/// # Safety
/// `uuid` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    device_uuid("cuDeviceGetUuid", uuid, dev)
}

/// `cuDeviceGetUuid_v2`.
///
/// # Safety
/// `uuid` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    device_uuid("cuDeviceGetUuid", uuid, dev)
}

/// `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// `ctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(
        "cuDevicePrimaryCtxRetain",
        None,
        || format!("device={dev}"),
        |_| {
            let app = app::get()?;
            let ordinal = usize::try_from(dev)
                .ok()
                .filter(|d| *d < app.device_count())
                .ok_or(result::INVALID_DEVICE)?;
            if ctx.is_null() {
                return Err(result::INVALID_VALUE);
            }
            // SAFETY: non-null and writable per the contract.
            unsafe { *ctx = (CONTEXT_BASE + ordinal) as CUcontext };
            Ok(())
        },
    )
}

/// `cuCtxSetCurrent`.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    call(
        "cuCtxSetCurrent",
        None,
        || format!("ctx={ctx:p}"),
        |_| {
            let app = app::get()?;
            let ordinal = if ctx.is_null() {
                None
            } else {
                let ordinal = (ctx as usize).wrapping_sub(CONTEXT_BASE);
                if ordinal >= app.device_count() {
                    return Err(result::INVALID_CONTEXT);
                }
                Some(ordinal)
            };
            CURRENT.with(|c| c.set(ordinal));
            Ok(())
        },
    )
}

/// `cuCtxSynchronize`.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    call("cuCtxSynchronize", None, String::new, |_| {
        let app = app::get()?;
        current()?;
        app.synchronize();
        Ok(())
    })
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    call(
        "cuMemAlloc",
        None,
        || format!("bytes={bytes}"),
        |_| {
            let app = app::get()?;
            if dptr.is_null() {
                return Err(result::INVALID_VALUE);
            }
            let ptr = app.alloc(current()?, bytes)?;
            // SAFETY: non-null and writable per the contract.
            unsafe { *dptr = ptr };
            Ok(())
        },
    )
}

/// `cuMemFree_v2`.
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    call(
        "cuMemFree",
        None,
        || format!("ptr={dptr:#x}"),
        |_| app::get()?.free(dptr),
    )
}

/// `cuMemcpyHtoD_v2`.
///
/// # Safety
/// `src` points to `bytes` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    call(
        "cuMemcpyHtoD",
        None,
        || format!("dst={dst:#x} bytes={bytes}"),
        |config| {
            app::get()?;
            current()?;
            if src.is_null() && bytes > 0 {
                return Err(result::INVALID_VALUE);
            }
            let src: &[u8] = if bytes == 0 {
                &[]
            } else {
                // SAFETY: `bytes` readable bytes at `src` per the contract.
                unsafe { std::slice::from_raw_parts(src.cast(), bytes) }
            };
            match DevPtr::decode(dst).ok_or(result::INVALID_VALUE)? {
                DevPtr::App { .. } => app::get()?.write(dst, src),
                DevPtr::Mapped { slot, offset } => {
                    control::write_mapped(slot, offset, src)?;
                    control::copy_time(config, src.len());
                    Ok(())
                }
            }
        },
    )
}

/// `cuMemcpyDtoH_v2`.
///
/// # Safety
/// `dst` points to `bytes` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    call(
        "cuMemcpyDtoH",
        None,
        || format!("src={src:#x} bytes={bytes}"),
        |config| {
            app::get()?;
            current()?;
            if dst.is_null() && bytes > 0 {
                return Err(result::INVALID_VALUE);
            }
            let dst: &mut [u8] = if bytes == 0 {
                &mut []
            } else {
                // SAFETY: `bytes` writable bytes at `dst` per the contract.
                unsafe { std::slice::from_raw_parts_mut(dst.cast(), bytes) }
            };
            match DevPtr::decode(src).ok_or(result::INVALID_VALUE)? {
                DevPtr::App { .. } => app::get()?.read(src, dst),
                DevPtr::Mapped { slot, offset } => {
                    control::read_mapped(slot, offset, dst)?;
                    control::copy_time(config, dst.len());
                    Ok(())
                }
            }
        },
    )
}

/// `cuCheckpointProcessLock`.
///
/// # Safety
/// `args` is null or points to 64 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *mut c_void) -> CUresult {
    // SAFETY: null or a struct of the version's layout per the contract.
    let timeout = decoded(|h| unsafe { args::lock(h, args) });
    let summary = format!(
        "timeout_ms={}",
        match &timeout {
            Some(Ok(t)) => i64::from(*t),
            _ => -1,
        }
    );
    call(
        "cuCheckpointProcessLock",
        Some(pid),
        move || summary,
        |config| {
            header_of(config)?;
            let timeout_ms = match timeout {
                Some(Ok(t)) => t,
                _ => return Err(result::INVALID_VALUE),
            };
            let extra = Duration::from_millis(u64::from(timeout_ms));
            control::request(config, pid, Op::Lock { timeout_ms }, extra).map(|_| ())
        },
    )
}

/// `cuCheckpointProcessCheckpoint`.
///
/// # Safety
/// `args` is null or points to 64 readable bytes of the configured version's layout.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut c_void) -> CUresult {
    call(
        "cuCheckpointProcessCheckpoint",
        Some(pid),
        || {
            // SAFETY: null or a struct of the version's layout per the contract.
            let custom = decoded(|h| unsafe { args::checkpoint(h, args) });
            format!(
                "custom={}",
                matches!(custom, Some(Ok(out)) if !out.is_null())
            )
        },
        |config| {
            let header = header_of(config)?;
            // SAFETY: null or a struct of the version's layout per the contract.
            let out =
                unsafe { args::checkpoint(header, args) }.map_err(|_| result::INVALID_VALUE)?;
            if out.is_null() {
                return control::request(config, pid, Op::Checkpoint, Duration::ZERO).map(|_| ());
            }
            // SAFETY: the caller's out pointer is writable per the API's contract.
            unsafe { control::begin_custom(config, header, pid, false, Vec::new(), out) }
        },
    )
}

/// `cuCheckpointProcessRestore`.
///
/// # Safety
/// `args` is null or points to 64 readable bytes of the configured version's layout,
/// whose pairs pointer (if any) points to `gpuPairsCount` pairs.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args: *mut c_void) -> CUresult {
    // SAFETY: as the contract says.
    let decoded = decoded(|h| unsafe { args::restore(h, args) });
    let pairs: Vec<(Uuid, Uuid)> = match &decoded {
        Some(Ok(d)) => d
            .pairs
            .iter()
            .map(|(old, new)| (uuid_of(old), uuid_of(new)))
            .collect(),
        _ => Vec::new(),
    };
    let out: *mut *mut c_void = match &decoded {
        Some(Ok(d)) => d.custom_storage_info_out,
        _ => std::ptr::null_mut(),
    };
    call(
        "cuCheckpointProcessRestore",
        Some(pid),
        || {
            let mut s = format!("custom={}", !out.is_null());
            for (old, new) in &pairs {
                s.push_str(&format!(",pair={old}:{new}"));
            }
            s
        },
        |config| {
            match decoded {
                None => return Err(result::NOT_SUPPORTED),
                Some(Err(_)) => return Err(result::INVALID_VALUE),
                Some(Ok(_)) => {}
            }
            control::check_pairs(config, &pairs)?;
            if out.is_null() {
                let op = Op::Restore {
                    pairs: pairs.clone(),
                };
                return control::request(config, pid, op, Duration::ZERO).map(|_| ());
            }
            let header = header_of(config)?;
            // SAFETY: the caller's out pointer is writable per the API's contract.
            unsafe { control::begin_custom(config, header, pid, true, pairs.clone(), out) }
        },
    )
}

/// `cuCheckpointProcessUnlock`.
///
/// # Safety
/// `args` is null or points to 64 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(pid: c_int, args: *mut c_void) -> CUresult {
    // SAFETY: null or a struct of the version's layout per the contract.
    let checked = decoded(|h| unsafe { args::unlock(h, args) });
    call(
        "cuCheckpointProcessUnlock",
        Some(pid),
        String::new,
        |config| {
            header_of(config)?;
            if !matches!(checked, Some(Ok(()))) {
                return Err(result::INVALID_VALUE);
            }
            control::request(config, pid, Op::Unlock, Duration::ZERO).map(|_| ())
        },
    )
}

/// `cuCheckpointProcessGetState`.
///
/// # Safety
/// `state` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_int) -> CUresult {
    let seen = std::cell::Cell::new(-1);
    call(
        "cuCheckpointProcessGetState",
        Some(pid),
        || format!("state={}", seen.get()),
        |config| {
            header_of(config)?;
            if state.is_null() {
                return Err(result::INVALID_VALUE);
            }
            let s = control::state(pid)?;
            seen.set(s);
            // SAFETY: non-null and writable per the contract.
            unsafe { *state = s };
            Ok(())
        },
    )
}

/// `cuCheckpointProcessGetRestoreThreadId`.
///
/// # Safety
/// `tid` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    call(
        "cuCheckpointProcessGetRestoreThreadId",
        Some(pid),
        String::new,
        |config| {
            header_of(config)?;
            if tid.is_null() {
                return Err(result::INVALID_VALUE);
            }
            let t = control::restore_tid(pid)?;
            // SAFETY: non-null and writable per the contract.
            unsafe { *tid = t };
            Ok(())
        },
    )
}

/// `cuCheckpointOperationComplete` (CUDA 13.4).
#[no_mangle]
pub extern "C" fn cuCheckpointOperationComplete(handle: *mut c_void) -> CUresult {
    call(
        "cuCheckpointOperationComplete",
        None,
        || format!("handle={handle:p}"),
        |config| {
            let header = header_of(config)?;
            if !header
                .functions
                .iter()
                .any(|f| f.name == "cuCheckpointOperationComplete")
            {
                return Err(result::NOT_SUPPORTED);
            }
            control::complete(config, handle as usize)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(version: i32) -> Config {
        Config {
            dir: None,
            gpus: Vec::new(),
            version,
            timeout: Duration::from_secs(1),
            fail: Vec::new(),
            log: None,
            sync: Duration::ZERO,
            step: Duration::ZERO,
            copy_rate: None,
            staged_resident: false,
        }
    }

    #[test]
    fn proc_address_versions() {
        let c = config(13000);
        assert_eq!(
            lookup(&c, "cuMemAlloc", 3020).unwrap(),
            (cuMemAlloc_v2 as h::PFN_cuMemAlloc_v3020) as *mut c_void
        );
        // The header's 2000 ABI, which the fake does not implement.
        assert_eq!(
            lookup(&c, "cuMemAlloc", 3010),
            Err(PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            lookup(&c, "cuDeviceGetUuid", 11040).unwrap(),
            (cuDeviceGetUuid_v2 as h::PFN_cuDeviceGetUuid_v11040) as *mut c_void
        );
        assert_eq!(
            lookup(&c, "cuDeviceGetUuid", 11030).unwrap(),
            (cuDeviceGetUuid as h::PFN_cuDeviceGetUuid_v9020) as *mut c_void
        );
        assert_eq!(
            lookup(&c, "cuGetProcAddress", 11080).unwrap(),
            (cuGetProcAddress as h::PFN_cuGetProcAddress_v11030) as *mut c_void
        );
        // 13.0's cuCtxSynchronize takes a context: not the fake's.
        assert_eq!(
            lookup(&c, "cuCtxSynchronize", 13000),
            Err(PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        assert!(lookup(&c, "cuCtxSynchronize", 2000).is_ok());
        assert_eq!(
            lookup(&c, "cuCheckpointOperationComplete", 13040),
            Err(PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        assert!(lookup(&config(13040), "cuCheckpointOperationComplete", 13040).is_ok());
        assert!(lookup(&config(13050), "cuCheckpointOperationComplete", 13040).is_ok());
        assert_eq!(
            lookup(&c, "cuNoSuchThing", 13000),
            Err(PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        // A driver older than every header: the oldest header, less what is newer.
        let old = config(12040);
        assert!(lookup(&old, "cuDriverGetVersion", 2020).is_ok());
        assert_eq!(
            lookup(&old, "cuCheckpointProcessLock", 12080),
            Err(PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        // Every symbol gpucr asks for is there at its version, for every header.
        for header in h::HEADERS {
            let v = header.cuda_version.max(13040);
            for s in gpucr_cuda_driver::sys::symbol::ALL {
                assert!(lookup(&config(v), s.name, s.version).is_ok(), "{s:?} {v}");
            }
        }
    }

    #[test]
    fn every_export_is_an_abi_of_the_newest_header() {
        let newest = h::HEADERS.last().unwrap();
        for e in table() {
            let f = newest.functions.iter().find(|f| f.name == e.name);
            assert!(
                f.is_some_and(|f| f.versions.contains(&e.since)),
                "{} v{}",
                e.name,
                e.since
            );
        }
    }
}
