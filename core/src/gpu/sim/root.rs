//! The simulator's root directory (`GPUCR_SIM_ROOT`, on tmpfs):
//!
//! ```text
//! ROOT/sys/class/kfd/kfd/topology/nodes/N/{gpu_id,name,properties,mem_banks/0/properties,
//!     io_links/K/properties}   a KFD-format topology (node 0 the CPU, 1..=N the GPUs), so
//!                              ROOT is what `--sysfs-root` takes
//! ROOT/contexts/CTX/context.json   one device context (one process's open device)
//! ROOT/contexts/CTX/BUFFER         one file per device buffer, mapped MAP_SHARED
//! ```
//!
//! CRIU does not dump the contents of shared file mappings, exactly as it does not dump
//! device memory: gpucr carries the buffers, or a restored process sees the wrong data.

use std::fs;
use std::path::{Path, PathBuf};

use crate::gpu::GpuError;

pub use gpucr_abi::sim::{Context, ContextBuffer, CONTEXT_FILE, ENV_ROOT};
/// The device node a sim process holds open (a character device CRIU cannot dump).
pub const ENV_DEVICE: &str = "GPUCR_SIM_DEVICE";
/// The copy-engine bandwidth to model, e.g. "1.6GB/s" (unset: unthrottled).
pub const ENV_COPY_BW: &str = "GPUCR_SIM_COPY_BW";
/// The default sim device: /dev/fuse (misc 10:229), which CRIU hands to plugins.
pub const DEFAULT_DEVICE: &str = "/dev/fuse";

/// VRAM each simulated GPU reports.
const SIM_VRAM_BYTES: u64 = 64 << 30;

/// A sim root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRoot {
    pub root: PathBuf,
}

impl SimRoot {
    pub fn new(root: impl Into<PathBuf>) -> SimRoot {
        SimRoot { root: root.into() }
    }

    /// The root named by `GPUCR_SIM_ROOT`, if set.
    pub fn from_env() -> Option<SimRoot> {
        std::env::var_os(ENV_ROOT)
            .filter(|v| !v.is_empty())
            .map(SimRoot::new)
    }

    /// The KFD topology directory (`--sysfs-root ROOT` reads it).
    pub fn topology_dir(&self) -> PathBuf {
        self.root.join("sys/class/kfd/kfd/topology")
    }

    pub fn contexts_dir(&self) -> PathBuf {
        self.root.join(gpucr_abi::sim::CONTEXTS_DIR)
    }

    /// True when `path` lies inside a context directory of this root.
    pub fn context_of(&self, path: &Path) -> Option<PathBuf> {
        let rel = path.strip_prefix(self.contexts_dir()).ok()?;
        let ctx = rel.components().next()?;
        Some(self.contexts_dir().join(ctx))
    }

    /// Create a topology of `gpus` simulated GPUs unless one exists; returns the GPU ids.
    pub fn ensure_topology(&self, gpus: usize) -> Result<Vec<u32>, GpuError> {
        let nodes = self.topology_dir().join("nodes");
        if !nodes.exists() {
            write_topology(&nodes, gpus)?;
        }
        self.gpu_ids()
    }

    /// The GPU ids of the topology, in node order.
    pub fn gpu_ids(&self) -> Result<Vec<u32>, GpuError> {
        let nodes = self.topology_dir().join("nodes");
        let mut found = Vec::new();
        for entry in fs::read_dir(&nodes).map_err(GpuError::io(&nodes))? {
            let entry = entry.map_err(GpuError::io(&nodes))?;
            let Ok(node) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let path = entry.path().join("gpu_id");
            let text = fs::read_to_string(&path).map_err(GpuError::io(&path))?;
            let id: u32 = text.trim().parse().map_err(|_| GpuError::Malformed {
                path: path.clone(),
                detail: format!("gpu_id {:?} is not a number", text.trim()),
            })?;
            if id != 0 {
                found.push((node, id));
            }
        }
        found.sort();
        Ok(found.into_iter().map(|(_, id)| id).collect())
    }
}

/// Read `CTX/context.json`.
pub fn read_context(ctx_dir: &Path) -> Result<Context, GpuError> {
    let path = ctx_dir.join(CONTEXT_FILE);
    let text = fs::read(&path).map_err(GpuError::io(&path))?;
    serde_json::from_slice(&text).map_err(|e| GpuError::Malformed {
        path,
        detail: e.to_string(),
    })
}

/// The GPU id of simulated GPU `index` (KFD derives ids from a hash; any stable non-zero
/// value serves).
pub fn sim_gpu_id(index: usize) -> u32 {
    0x1000 + 0x111 * index as u32
}

fn write_topology(nodes: &Path, gpus: usize) -> Result<(), GpuError> {
    let write = |path: PathBuf, text: String| -> Result<(), GpuError> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(GpuError::io(parent))?;
        }
        fs::write(&path, text).map_err(GpuError::io(&path))
    };
    // Node 0: the CPU, linked to every GPU over PCIe.
    let cpu = nodes.join("0");
    write(cpu.join("gpu_id"), "0\n".into())?;
    write(cpu.join("name"), "\n".into())?;
    write(cpu.join("properties"), format!("cpu_cores_count 2\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\nio_links_count {gpus}\nvendor_id 0\ndevice_id 0\nhive_id 0\n"))?;
    write(
        cpu.join("mem_banks/0/properties"),
        "heap_type 0\nsize_in_bytes 25769803776\n".into(),
    )?;
    for g in 0..gpus {
        write(
            cpu.join(format!("io_links/{g}/properties")),
            format!("type 2\nnode_from 0\nnode_to {}\n", g + 1),
        )?;
    }
    for g in 0..gpus {
        let node = nodes.join((g + 1).to_string());
        write(node.join("gpu_id"), format!("{}\n", sim_gpu_id(g)))?;
        write(node.join("name"), "gpucr-sim\n".into())?;
        write(node.join("properties"), sim_gpu_properties(g + 1))?;
        write(
            node.join("mem_banks/0/properties"),
            format!("heap_type 1\nsize_in_bytes {SIM_VRAM_BYTES}\nwidth 4096\nmem_clk_max 1600\n"),
        )?;
        write(
            node.join("io_links/0/properties"),
            format!("type 2\nnode_from {}\nnode_to 0\n", g + 1),
        )?;
    }
    Ok(())
}

fn sim_gpu_properties(node: usize) -> String {
    let props: [(&str, u64); 27] = [
        ("cpu_cores_count", 0),
        ("simd_count", 240),
        ("mem_banks_count", 1),
        ("caches_count", 10),
        ("io_links_count", 1),
        ("cpu_core_id_base", 0),
        ("simd_id_base", 2147487744 + 240 * node as u64),
        ("max_waves_per_simd", 10),
        ("lds_size_in_kb", 64),
        ("gds_size_in_kb", 0),
        ("num_gws", 64),
        ("wave_front_size", 64),
        ("array_count", 8),
        ("simd_arrays_per_engine", 1),
        ("cu_per_simd_array", 15),
        ("simd_per_cu", 4),
        ("max_slots_scratch_cu", 32),
        ("vendor_id", 4098),
        ("device_id", 29580),
        ("location_id", 256 * node as u64),
        ("domain", 0),
        ("drm_render_minor", 127 + node as u64),
        ("hive_id", 0),
        ("num_sdma_engines", 2),
        ("num_sdma_xgmi_engines", 0),
        ("num_sdma_queues_per_engine", 8),
        ("num_cp_queues", 24),
    ];
    let mut text: String = props.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    text.push_str("fw_version 100\ncapability 671588992\nsdma_fw_version 50\n");
    text
}

/// Parse a bandwidth: "1.6GB/s", "800MB/s", "2GiB/s" or plain bytes per second.
pub fn parse_bandwidth(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a bandwidth"))?;
    let scale = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    if value > 0.0 && value.is_finite() {
        Ok(value * scale)
    } else {
        Err(format!("{text:?} must be a positive bandwidth"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_is_created_once_with_n_gpus() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SimRoot::new(tmp.path());
        let ids = root.ensure_topology(3).unwrap();
        assert_eq!(ids, vec![sim_gpu_id(0), sim_gpu_id(1), sim_gpu_id(2)]);
        assert_eq!(
            root.ensure_topology(5).unwrap().len(),
            3,
            "an existing topology is kept"
        );
        let props = fs::read_to_string(
            tmp.path()
                .join("sys/class/kfd/kfd/topology/nodes/2/properties"),
        )
        .unwrap();
        assert!(props.contains("simd_count 240\n"));
        assert!(props.contains("sdma_fw_version 50\n"));
    }

    #[test]
    fn bandwidths_parse() {
        assert_eq!(parse_bandwidth("1.6GB/s").unwrap(), 1.6e9);
        assert_eq!(parse_bandwidth("800MB/s").unwrap(), 800e6);
        assert_eq!(parse_bandwidth("1GiB/s").unwrap(), 1073741824.0);
        assert_eq!(parse_bandwidth("1000").unwrap(), 1000.0);
        assert!(parse_bandwidth("fast").is_err());
        assert!(parse_bandwidth("-1GB/s").is_err());
        assert!(parse_bandwidth("1PB/s").is_err());
    }

    #[test]
    fn context_of_finds_the_context_dir() {
        let root = SimRoot::new("/r");
        assert_eq!(
            root.context_of(Path::new("/r/contexts/c1/b0")),
            Some(PathBuf::from("/r/contexts/c1"))
        );
        assert_eq!(root.context_of(Path::new("/other/b0")), None);
    }
}
