//! NVIDIA GPUs from the driver's procfs (`/proc/driver/nvidia/gpus/<bus>/information`) and
//! the PCI device in sysfs (`/sys/bus/pci/devices/<bus>/{device,numa_node}`).
//!
//! This is the fallback when NVML cannot be used, and the only source under an alternative
//! root. It gives the model, UUID, VBIOS, bus and minor, the PCI device id and the NUMA
//! node, but not the memory size.

use std::fs;
use std::io;
use std::path::Path;

use super::{normalize_bus_id, NvidiaError};
use crate::model::{NvidiaGpu, NvidiaSource};

/// Where the driver lists its GPUs, relative to the filesystem root.
pub const GPUS_DIR: &str = "proc/driver/nvidia/gpus";
/// Where sysfs lists PCI devices, relative to the filesystem root.
pub const PCI_DEVICES_DIR: &str = "sys/bus/pci/devices";

/// The fields of one `information` file that gpucr uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Information {
    pub model: String,
    pub uuid: String,
    pub vbios: Option<String>,
    pub bus_location: Option<String>,
    pub minor: Option<u32>,
}

/// Parses an `information` file ("Key:<tabs> value" lines).
pub(crate) fn parse_information(text: &str, path: &Path) -> Result<Information, NvidiaError> {
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let malformed = |reason: &str| NvidiaError::Malformed {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let model = field("Model")
        .filter(|m| !m.is_empty())
        .ok_or_else(|| malformed("no `Model:` line"))?;
    let uuid = match field("GPU UUID") {
        Some(uuid) if uuid.starts_with("GPU-") && !uuid.contains('?') => uuid,
        Some(_) => {
            return Err(NvidiaError::UuidHidden {
                path: path.to_owned(),
            })
        }
        None => return Err(malformed("no `GPU UUID:` line")),
    };
    let minor = match field("Device Minor") {
        Some(m) => Some(
            m.parse::<u32>()
                .map_err(|_| malformed("`Device Minor:` is not a number"))?,
        ),
        None => None,
    };
    let vbios = field("Video BIOS").filter(|v| !v.contains('?') && !v.is_empty());
    Ok(Information {
        model,
        uuid,
        vbios,
        bus_location: field("Bus Location"),
        minor,
    })
}

/// Reads every GPU the driver lists under `root`.
pub(crate) fn read(root: &Path) -> Result<Vec<NvidiaGpu>, NvidiaError> {
    let gpus_dir = root.join(GPUS_DIR);
    let entries = fs::read_dir(&gpus_dir).map_err(|e| NvidiaError::io(&gpus_dir, e))?;
    let mut gpus = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| NvidiaError::io(&gpus_dir, e))?;
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path().join("information");
        let text = fs::read_to_string(&path).map_err(|e| NvidiaError::io(&path, e))?;
        let info = parse_information(&text, &path)?;
        let bus_source = info.bus_location.as_deref().unwrap_or(&dir_name);
        let bus_id = normalize_bus_id(bus_source).ok_or_else(|| NvidiaError::Malformed {
            path: path.clone(),
            reason: format!("bad PCI bus location {bus_source:?}"),
        })?;
        let pci = root.join(PCI_DEVICES_DIR).join(&bus_id);
        gpus.push(NvidiaGpu {
            uuid: info.uuid,
            name: info.model,
            minor: info.minor,
            device_id: read_pci_device_id(&pci)?,
            memory_bytes: None,
            compute_capability: None,
            vbios: info.vbios,
            numa_node: read_numa_node(&pci)?,
            nvlinks: None,
            source: NvidiaSource::Procfs,
            bus_id,
        });
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(gpus)
}

/// Reads an optional one-line sysfs file; `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, NvidiaError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(NvidiaError::io(path, err)),
    }
}

/// The PCI device id from `<pci>/device` ("0x2330").
pub(crate) fn read_pci_device_id(pci: &Path) -> Result<Option<u32>, NvidiaError> {
    let path = pci.join("device");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    let digits = text.strip_prefix("0x").unwrap_or(&text);
    u32::from_str_radix(digits, 16)
        .map(Some)
        .map_err(|_| NvidiaError::Malformed {
            path,
            reason: format!("expected a hex PCI device id, found {text:?}"),
        })
}

/// The NUMA node from `<pci>/numa_node` (-1 means none).
pub(crate) fn read_numa_node(pci: &Path) -> Result<Option<u32>, NvidiaError> {
    let path = pci.join("numa_node");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    match text.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => Ok(u32::try_from(n).ok()),
        Err(_) => Err(NvidiaError::Malformed {
            path,
            reason: format!("expected a NUMA node number, found {text:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: &str = "Model: \t\t NVIDIA H100 80GB HBM3\n\
        IRQ:   \t\t 10\n\
        GPU UUID: \t GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b\n\
        Video BIOS: \t 96.00.99.00.01\n\
        Bus Type: \t PCIe\n\
        DMA Size: \t 52 bits\n\
        DMA Mask: \t 0xfffffffffffff\n\
        Bus Location: \t 0000:62:00.0\n\
        Device Minor: \t 5\n\
        GPU Firmware: \t 535.129.03\n\
        GPU Excluded:\t No\n";

    #[test]
    fn information_fields() {
        let info = parse_information(H100, Path::new("i")).unwrap();
        assert_eq!(info.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(info.uuid, "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b");
        assert_eq!(info.vbios.as_deref(), Some("96.00.99.00.01"));
        assert_eq!(info.bus_location.as_deref(), Some("0000:62:00.0"));
        assert_eq!(info.minor, Some(5));
    }

    #[test]
    fn information_errors_name_the_file() {
        let path = Path::new("/proc/driver/nvidia/gpus/0000:62:00.0/information");
        let no_model = H100.replace("Model:", "Modell:");
        let err = parse_information(&no_model, path).unwrap_err().to_string();
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains("Model"),
            "{err}"
        );

        let hidden = H100.replace(
            "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b",
            "GPU-????????-????-????-????-????????????",
        );
        let err = parse_information(&hidden, path).unwrap_err().to_string();
        assert!(err.contains("UUID") && err.contains("root"), "{err}");

        let bad_minor = H100.replace("Device Minor: \t 5", "Device Minor: \t five");
        let err = parse_information(&bad_minor, path).unwrap_err().to_string();
        assert!(err.contains("Device Minor"), "{err}");
    }
}
