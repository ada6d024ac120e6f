//! Readers of NVIDIA GPUs: NVML when it can be loaded, else the driver's procfs.

pub mod nvml;
pub mod procfs;
pub mod visible;

use std::io;
use std::path::{Path, PathBuf};

use crate::model::NvidiaGpu;

pub use nvml::NvmlError;
pub use visible::{Visible, VisibleError};

/// Why the NVIDIA GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NvidiaError {
    /// A file the driver should provide is missing.
    #[error("{path} is missing")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A file does not have the expected content.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The driver hides the GPU UUID from this user ("GPU-????…").
    #[error("{path}: the GPU UUID is hidden from this user (run as root, or make NVML usable)")]
    UuidHidden {
        /// The `information` file.
        path: PathBuf,
    },
}

impl NvidiaError {
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            NvidiaError::Missing {
                path: path.to_owned(),
            }
        } else {
            NvidiaError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// Reads the NVIDIA GPUs of the machine whose filesystem root is `root` (`/` for this
/// machine).
///
/// Without the driver (`<root>/proc/driver/nvidia/gpus` absent) there are none. On this
/// machine (`use_nvml`), NVML is tried first, for the memory size, compute capability and
/// NVLinks; when it cannot be used (not loadable, not initialised, or a query fails), the
/// procfs files are read instead. Under an alternative root only the files are read.
pub fn read(root: &Path, use_nvml: bool) -> Result<Vec<NvidiaGpu>, NvidiaError> {
    if !root.join(procfs::GPUS_DIR).is_dir() {
        return Ok(Vec::new());
    }
    if use_nvml {
        if let Ok(gpus) = nvml::read(root) {
            return Ok(gpus);
        }
    }
    procfs::read(root)
}

/// Normalizes a PCI address to `dddd:bb:dd.f` in lower case ("00000000:3B:00.0" from NVML
/// becomes "0000:3b:00.0"); `None` when it is not one.
pub fn normalize_bus_id(text: &str) -> Option<String> {
    let text = text.trim();
    let (domain, rest) = text.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    (domain <= 0xffff && device < 32 && function < 8)
        .then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// The 16 bytes of a GPU UUID ("GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"), as CUDA's
/// `CUuuid` holds them; `None` when the text is not one.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized() {
        assert_eq!(
            normalize_bus_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_bus_id("0000:62:00.0").as_deref(),
            Some("0000:62:00.0")
        );
        assert_eq!(normalize_bus_id("62:00.0"), None);
        assert_eq!(normalize_bus_id("0000:62:40.0"), None);
    }

    #[test]
    fn uuids_parse_to_bytes() {
        let bytes = parse_uuid("GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b").unwrap();
        assert_eq!(bytes[0], 0x92);
        assert_eq!(bytes[15], 0x3b);
        assert_eq!(parse_uuid("9221d5d1-b60b-a624-bf14-0a1819cfda3b"), None);
        assert_eq!(parse_uuid("GPU-9221d5d1"), None);
        assert_eq!(parse_uuid("GPU-????????-????-????-????-????????????"), None);
    }

    /// This machine's NVML: without the library, a load error; with it but without the
    /// NVIDIA driver, nvmlInit_v2 fails; with both, one GPU per entry of the driver's
    /// /proc/driver/nvidia/gpus. Never a panic.
    #[test]
    fn nvml_of_this_machine_answers_as_its_driver_and_library_say() {
        // SAFETY: loading libnvidia-ml runs only its own initialisers; nothing of it is
        // called here and it is unloaded at once.
        let loadable = unsafe { libloading::Library::new(nvml::LIBRARY) }.is_ok();
        let gpus_dir = Path::new("/").join(procfs::GPUS_DIR);
        let driver = gpus_dir.is_dir();
        match (loadable, driver, nvml::read(Path::new("/"))) {
            (false, _, Err(err)) => assert!(matches!(err, NvmlError::Load { .. }), "{err}"),
            (true, false, Err(err)) => assert!(
                matches!(
                    err,
                    NvmlError::Call {
                        function: "nvmlInit_v2",
                        ..
                    }
                ),
                "{err}"
            ),
            (true, true, Ok(gpus)) => {
                let listed = std::fs::read_dir(&gpus_dir).unwrap().count();
                assert_eq!(gpus.len(), listed, "{gpus:?}");
                assert!(gpus.iter().all(|g| g.uuid.starts_with("GPU-")), "{gpus:?}");
            }
            (loadable, driver, answer) => panic!(
                "NVML library loadable: {loadable}, NVIDIA driver: {driver}, yet NVML \
                 answered {answer:?}"
            ),
        }
    }
}
