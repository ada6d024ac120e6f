//! NVIDIA GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time so that gpucr runs on
//! machines without the NVIDIA driver).
//!
//! Declarations follow `nvml.h`: `nvmlReturn_t` is an `int` enum (0 = success),
//! `nvmlDevice_t` an opaque pointer, and the buffer sizes are the header's
//! `NVML_DEVICE_NAME_V2_BUFFER_SIZE` (96), `NVML_DEVICE_UUID_V2_BUFFER_SIZE` (96) and
//! `NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE` (32).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, OsStr};
use std::path::Path;

use libloading::Library;

use super::{normalize_bus_id, procfs};
use crate::model::{NvidiaGpu, NvidiaSource};

/// The library gpucr loads.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_FEATURE_ENABLED: c_int = 1;
const NVML_NVLINK_MAX_LINKS: c_uint = 18;
const NAME_BUFFER_SIZE: usize = 96;
const UUID_BUFFER_SIZE: usize = 96;
const VBIOS_BUFFER_SIZE: usize = 32;

type Device = *mut c_void;

/// `nvmlPciInfo_t` (the `_v3` layout).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [u8; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [u8; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

const _: () = {
    assert!(std::mem::size_of::<PciInfo>() == 68);
    assert!(std::mem::offset_of!(PciInfo, pci_device_id) == 28);
    assert!(std::mem::offset_of!(PciInfo, bus_id) == 36);
    assert!(std::mem::size_of::<Memory>() == 24);
};

/// Why NVML could not be used or answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded (no NVIDIA driver, or not on the library path).
    #[error("cannot load {LIBRARY}: {source}")]
    Load {
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// A required function is missing from the library.
    #[error("{LIBRARY} has no {name}: {source}")]
    Symbol {
        /// The function.
        name: &'static str,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// A call returned an error code.
    #[error("{function} failed: {message} (nvmlReturn_t {code})")]
    Call {
        /// The function.
        function: &'static str,
        /// The `nvmlReturn_t`.
        code: c_int,
        /// `nvmlErrorString` of it.
        message: String,
    },
    /// A string NVML returned is not NUL-terminated UTF-8.
    #[error("{function} returned a malformed string")]
    BadString {
        /// The function.
        function: &'static str,
    },
}

type InitFn = unsafe extern "C" fn() -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type StringFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type PciFn = unsafe extern "C" fn(Device, *mut PciInfo) -> c_int;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> c_int;
type UintFn = unsafe extern "C" fn(Device, *mut c_uint) -> c_int;
type CapabilityFn = unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int;
type NvLinkStateFn = unsafe extern "C" fn(Device, c_uint, *mut c_int) -> c_int;

/// The resolved functions. The pointers stay valid while `_library` is loaded.
struct Functions {
    init: InitFn,
    shutdown: InitFn,
    error_string: ErrorStringFn,
    device_count: CountFn,
    handle_by_index: HandleFn,
    name: StringFn,
    uuid: StringFn,
    vbios: Option<StringFn>,
    pci_info: PciFn,
    memory: MemoryFn,
    minor: Option<UintFn>,
    compute_capability: Option<CapabilityFn>,
    nvlink_state: Option<NvLinkStateFn>,
    _library: Library,
}

/// An initialised NVML: `Drop` calls `nvmlShutdown` (before the library is unloaded).
struct Nvml(Functions);

/// Looks up `name` in `library` as a function of type `T`.
///
/// # Safety
/// `T` must be the function pointer type that matches the C declaration of `name`.
unsafe fn symbol<T: Copy>(library: &Library, name: &'static str) -> Result<T, NvmlError> {
    let bytes = format!("{name}\0");
    // SAFETY: the caller guarantees that `T` matches the symbol's C type; the pointer is
    // copied out and only used while `library` stays loaded (it is kept in `Nvml`).
    let found = unsafe { library.get::<T>(bytes.as_bytes()) };
    found
        .map(|sym| *sym)
        .map_err(|source| NvmlError::Symbol { name, source })
}

impl Functions {
    /// Loads `library` (a name the dynamic loader looks up, or a path) and resolves the
    /// functions gpucr calls.
    fn load(library: &OsStr) -> Result<Functions, NvmlError> {
        // SAFETY: loading libnvidia-ml runs its initialisers, which only set up the
        // library's own state; gpucr loads no other copy of it.
        let library =
            unsafe { Library::new(library) }.map_err(|source| NvmlError::Load { source })?;
        // SAFETY: for every `symbol` call, the type alias matches the nvml.h declaration
        // of the named function.
        unsafe {
            Ok(Functions {
                init: symbol(&library, "nvmlInit_v2")?,
                shutdown: symbol(&library, "nvmlShutdown")?,
                error_string: symbol(&library, "nvmlErrorString")?,
                device_count: symbol(&library, "nvmlDeviceGetCount_v2")?,
                handle_by_index: symbol(&library, "nvmlDeviceGetHandleByIndex_v2")?,
                name: symbol(&library, "nvmlDeviceGetName")?,
                uuid: symbol(&library, "nvmlDeviceGetUUID")?,
                vbios: symbol(&library, "nvmlDeviceGetVbiosVersion").ok(),
                pci_info: symbol(&library, "nvmlDeviceGetPciInfo_v3")?,
                memory: symbol(&library, "nvmlDeviceGetMemoryInfo")?,
                minor: symbol(&library, "nvmlDeviceGetMinorNumber").ok(),
                compute_capability: symbol(&library, "nvmlDeviceGetCudaComputeCapability").ok(),
                nvlink_state: symbol(&library, "nvmlDeviceGetNvLinkState").ok(),
                _library: library,
            })
        }
    }

    fn call_error(&self, function: &'static str, code: c_int) -> NvmlError {
        // SAFETY: nvmlErrorString accepts any code and returns a pointer to a static string
        // (or null).
        let ptr = unsafe { (self.error_string)(code) };
        let message = if ptr.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: a non-null result is a NUL-terminated static string owned by NVML.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        };
        NvmlError::Call {
            function,
            code,
            message,
        }
    }
}

impl Nvml {
    /// Loads the library and calls `nvmlInit_v2`.
    fn open(library: &OsStr) -> Result<Nvml, NvmlError> {
        let functions = Functions::load(library)?;
        // SAFETY: nvmlInit_v2 takes no arguments; the library is loaded.
        let ret = unsafe { (functions.init)() };
        if ret != NVML_SUCCESS {
            // Not initialised: the library is unloaded without nvmlShutdown.
            return Err(functions.call_error("nvmlInit_v2", ret));
        }
        Ok(Nvml(functions))
    }

    fn check(&self, function: &'static str, code: c_int) -> Result<(), NvmlError> {
        if code == NVML_SUCCESS {
            Ok(())
        } else {
            Err(self.0.call_error(function, code))
        }
    }

    fn device_count(&self) -> Result<u32, NvmlError> {
        let mut count: c_uint = 0;
        // SAFETY: the pointer is to a live c_uint.
        let ret = unsafe { (self.0.device_count)(&mut count) };
        self.check("nvmlDeviceGetCount_v2", ret)?;
        Ok(count)
    }

    fn handle(&self, index: u32) -> Result<Device, NvmlError> {
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: the pointer is to a live handle slot; NVML checks the index.
        let ret = unsafe { (self.0.handle_by_index)(index, &mut device) };
        self.check("nvmlDeviceGetHandleByIndex_v2", ret)?;
        Ok(device)
    }

    fn string<const N: usize>(
        &self,
        function: &'static str,
        f: StringFn,
        device: Device,
    ) -> Result<String, NvmlError> {
        let mut buf = [0u8; N];
        // SAFETY: `device` came from nvmlDeviceGetHandleByIndex_v2; the buffer holds N
        // bytes and NVML is told so (N is at most 96, well within c_uint).
        let ret = unsafe { f(device, buf.as_mut_ptr().cast::<c_char>(), N as c_uint) };
        self.check(function, ret)?;
        CStr::from_bytes_until_nul(&buf)
            .ok()
            .and_then(|s| s.to_str().ok())
            .map(str::to_owned)
            .ok_or(NvmlError::BadString { function })
    }

    fn gpu(&self, device: Device, root: &Path) -> Result<NvidiaGpu, NvmlError> {
        let name = self.string::<NAME_BUFFER_SIZE>("nvmlDeviceGetName", self.0.name, device)?;
        let uuid = self.string::<UUID_BUFFER_SIZE>("nvmlDeviceGetUUID", self.0.uuid, device)?;
        let vbios = self.0.vbios.and_then(|f| {
            self.string::<VBIOS_BUFFER_SIZE>("nvmlDeviceGetVbiosVersion", f, device)
                .ok()
        });

        let mut pci = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        // SAFETY: valid handle; `pci` is a live nvmlPciInfo_t (layout asserted above).
        let ret = unsafe { (self.0.pci_info)(device, &mut pci) };
        self.check("nvmlDeviceGetPciInfo_v3", ret)?;
        let bus_text = CStr::from_bytes_until_nul(&pci.bus_id)
            .ok()
            .and_then(|s| s.to_str().ok())
            .ok_or(NvmlError::BadString {
                function: "nvmlDeviceGetPciInfo_v3",
            })?;
        let bus_id = normalize_bus_id(bus_text).ok_or(NvmlError::BadString {
            function: "nvmlDeviceGetPciInfo_v3",
        })?;

        let mut memory = Memory {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: valid handle; `memory` is a live nvmlMemory_t.
        let ret = unsafe { (self.0.memory)(device, &mut memory) };
        self.check("nvmlDeviceGetMemoryInfo", ret)?;

        let minor = self.0.minor.and_then(|f| {
            let mut minor: c_uint = 0;
            // SAFETY: valid handle; pointer to a live c_uint.
            let ret = unsafe { f(device, &mut minor) };
            (ret == NVML_SUCCESS).then_some(minor)
        });
        let compute_capability = self.0.compute_capability.and_then(|f| {
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // SAFETY: valid handle; pointers to live c_ints.
            let ret = unsafe { f(device, &mut major, &mut minor) };
            (ret == NVML_SUCCESS).then(|| format!("{major}.{minor}"))
        });
        let nvlinks = self.0.nvlink_state.and_then(|f| {
            let mut active = 0;
            for link in 0..NVML_NVLINK_MAX_LINKS {
                let mut state: c_int = 0;
                // SAFETY: valid handle; pointer to a live nvmlEnableState_t (an int enum);
                // NVML rejects link numbers the GPU does not have.
                let ret = unsafe { f(device, link, &mut state) };
                match ret {
                    NVML_SUCCESS if state == NVML_FEATURE_ENABLED => active += 1,
                    NVML_SUCCESS => {}
                    NVML_ERROR_NOT_SUPPORTED if link == 0 => return None,
                    _ => break,
                }
            }
            Some(active)
        });
        let pci_dir = root.join(procfs::PCI_DEVICES_DIR).join(&bus_id);
        Ok(NvidiaGpu {
            uuid,
            name,
            minor,
            device_id: Some(pci.pci_device_id >> 16),
            memory_bytes: Some(memory.total),
            compute_capability,
            vbios,
            numa_node: procfs::read_numa_node(&pci_dir).ok().flatten(),
            nvlinks,
            source: NvidiaSource::Nvml,
            bus_id,
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised by `open`; shutdown takes no arguments and the
        // library is still loaded (it is dropped after this, with the fields).
        unsafe {
            (self.0.shutdown)();
        }
    }
}

/// Reads every GPU NVML lists. `root` is where the PCI devices' sysfs files are read
/// (for the NUMA node).
pub(crate) fn read(root: &Path) -> Result<Vec<NvidiaGpu>, NvmlError> {
    read_from(OsStr::new(LIBRARY), root)
}

/// As [`read`], with the library given by name or path.
fn read_from(library: &OsStr, root: &Path) -> Result<Vec<NvidiaGpu>, NvmlError> {
    let nvml = Nvml::open(library)?;
    let mut gpus = Vec::new();
    for index in 0..nvml.device_count()? {
        let device = nvml.handle(index)?;
        gpus.push(nvml.gpu(device, root)?);
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    /// Builds `tests/support/fake_nvml.c` into `dir` as a shared library.
    fn fake_library(dir: &Path, defines: &[&str]) -> PathBuf {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_nvml.c");
        let out = dir.join("libnvidia-ml.so.1");
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&out)
            .arg(&source)
            .args(defines)
            .status()
            .expect("run cc (the NVML tests build a stand-in library with it)");
        assert!(status.success(), "cc failed on {}", source.display());
        out
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/topology")
            .join(name)
    }

    #[test]
    fn reads_every_gpu_through_the_library() {
        let dir = tempfile::tempdir().unwrap();
        let library = fake_library(dir.path(), &[]);
        let gpus = read_from(library.as_os_str(), &fixture("h100-8x")).unwrap();
        assert_eq!(gpus.len(), 2);
        // Sorted by PCI address; NVML's "00000000:1B:00.0" normalized.
        assert_eq!(gpus[0].bus_id, "0000:1b:00.0");
        assert_eq!(gpus[1].bus_id, "0000:43:00.0");
        let first = &gpus[0];
        assert_eq!(first.uuid, "GPU-1f708b32-4c6d-4e8f-9a01-b2c3d4e5f601");
        assert_eq!(first.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(first.device_id, Some(0x2330));
        assert_eq!(first.memory_bytes, Some(85_520_809_984));
        assert_eq!(first.compute_capability.as_deref(), Some("9.0"));
        assert_eq!(first.vbios.as_deref(), Some("96.00.74.00.01"));
        assert_eq!(first.minor, Some(1));
        assert_eq!(first.numa_node, Some(0));
        assert_eq!(first.source, NvidiaSource::Nvml);
        // The second device in NVML's order has no NVLink; the first has 18 active.
        assert_eq!(first.nvlinks, None);
        assert_eq!(gpus[1].nvlinks, Some(18));
    }

    #[test]
    fn a_failed_init_is_an_error_naming_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let library = fake_library(dir.path(), &["-DINIT_FAILS"]);
        let err = read_from(library.as_os_str(), Path::new("/")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "nvmlInit_v2 failed: Driver/library version mismatch (nvmlReturn_t 18)"
        );
    }

    #[test]
    fn a_missing_library_is_a_load_error() {
        let err =
            read_from(OsStr::new("/nonexistent/libnvidia-ml.so.1"), Path::new("/")).unwrap_err();
        assert!(matches!(err, NvmlError::Load { .. }), "{err}");
        assert!(err.to_string().starts_with("cannot load libnvidia-ml.so.1"));
    }
}
