//! The topology snapshot: what `gpucr dump` stores in the manifest and what a restore is
//! compared against.
//!
//! The model keeps what the readers found, not conclusions drawn from it: KFD nodes with
//! their raw `properties`, memory banks, io links and caches, and NVIDIA GPUs as NVML or
//! the driver's procfs describe them. Link validity, bi-directionality and XGMI hives are
//! worked out when two topologies are compared ([`crate::check`]), so a snapshot stays
//! meaningful when the rules change.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// KFD memory heap type of VRAM the host can map (large BAR): `HSA_MEM_HEAP_TYPE_FB_PUBLIC`.
pub const HEAP_TYPE_FB_PUBLIC: u64 = 1;
/// KFD memory heap type of VRAM the host cannot map: `HSA_MEM_HEAP_TYPE_FB_PRIVATE`.
pub const HEAP_TYPE_FB_PRIVATE: u64 = 2;
/// KFD io link type of a PCIe link (`CRAT_IOLINK_TYPE_PCIEXPRESS`).
pub const IOLINK_TYPE_PCIE: u64 = 2;
/// KFD io link type of an XGMI (Infinity Fabric) link (`CRAT_IOLINK_TYPE_XGMI`).
pub const IOLINK_TYPE_XGMI: u64 = 11;
/// PCI vendor id of AMD.
pub const AMD_VENDOR_ID: u64 = 0x1002;
/// PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR_ID: u64 = 0x10de;

/// The GPUs (and, for KFD, the CPU nodes they hang off) of one machine, or of the part of
/// it a checkpointed process tree used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// KFD nodes (CPU nodes and AMD or simulated GPUs), in node-number order.
    #[serde(default)]
    pub kfd_nodes: Vec<KfdNode>,
    /// NVIDIA GPUs, in PCI bus order.
    #[serde(default)]
    pub nvidia_gpus: Vec<NvidiaGpu>,
}

impl Topology {
    /// The identities of every GPU, KFD GPUs first.
    pub fn gpus(&self) -> Vec<GpuId> {
        let kfd = self
            .kfd_nodes
            .iter()
            .filter(|n| n.is_gpu())
            .map(KfdNode::id);
        let nvidia = self.nvidia_gpus.iter().map(NvidiaGpu::id);
        kfd.flatten().chain(nvidia).collect()
    }

    /// How many GPUs the topology holds.
    pub fn gpu_count(&self) -> usize {
        self.kfd_nodes.iter().filter(|n| n.is_gpu()).count() + self.nvidia_gpus.len()
    }

    /// Whether the topology holds any GPU.
    pub fn has_gpus(&self) -> bool {
        self.gpu_count() > 0
    }

    /// A copy that keeps only the GPUs for which `keep` is true (and every CPU node).
    ///
    /// Links to a GPU that was dropped stay in the snapshot and count as invalid, the way
    /// KFD shows a GPU that a device cgroup hides. `gpucr dump` uses this to store only the
    /// GPUs a process tree can reach.
    pub fn retain_gpus(&self, mut keep: impl FnMut(&GpuId) -> bool) -> Topology {
        let kfd_nodes = self
            .kfd_nodes
            .iter()
            .filter(|n| n.id().is_none_or(|id| keep(&id)))
            .cloned()
            .collect();
        let nvidia_gpus = self
            .nvidia_gpus
            .iter()
            .filter(|g| keep(&g.id()))
            .cloned()
            .collect();
        Topology {
            kfd_nodes,
            nvidia_gpus,
        }
    }
}

/// The `NAME VALUE` pairs of one KFD `properties` file. A key the file does not list reads
/// as 0, as in CRIU's amdgpu plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Properties(pub BTreeMap<String, u64>);

impl Properties {
    /// The value of `key`, if the file listed it.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.0.get(key).copied()
    }

    /// The value of `key`, or 0 when the file did not list it.
    pub fn value(&self, key: &str) -> u64 {
        self.get(key).unwrap_or(0)
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: u64) {
        self.0.insert(key.to_owned(), value);
    }
}

impl<const N: usize> From<[(&str, u64); N]> for Properties {
    fn from(pairs: [(&str, u64); N]) -> Self {
        Properties(pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
    }
}

/// One node of `/sys/class/kfd/kfd/topology/nodes/N`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KfdNode {
    /// The directory number N.
    pub node: u32,
    /// `gpu_id`; 0 for a CPU node.
    pub gpu_id: u32,
    /// `name` (the lower-case ASIC name, "ip discovery" on newer parts; empty for CPUs).
    #[serde(default)]
    pub name: String,
    /// `properties`.
    #[serde(default)]
    pub properties: Properties,
    /// `mem_banks/*/properties`, in bank order.
    #[serde(default)]
    pub mem_banks: Vec<MemBank>,
    /// `io_links/*/properties`, in link order.
    #[serde(default)]
    pub io_links: Vec<IoLink>,
    /// `caches/*/properties`, identical caches counted together.
    #[serde(default)]
    pub caches: Vec<CacheGroup>,
}

impl KfdNode {
    /// Whether this is a GPU node (`gpu_id` not 0).
    pub fn is_gpu(&self) -> bool {
        self.gpu_id != 0
    }

    /// The identity of a GPU node; `None` for a CPU node.
    pub fn id(&self) -> Option<GpuId> {
        self.is_gpu().then_some(GpuId::Kfd {
            node: self.node,
            gpu_id: self.gpu_id,
        })
    }

    /// A property, 0 when absent.
    pub fn prop(&self, key: &str) -> u64 {
        self.properties.value(key)
    }

    /// The VRAM bank CRIU's plugin uses: the first memory bank whose heap type is public or
    /// private frame buffer.
    pub fn vram(&self) -> Option<Vram> {
        self.mem_banks.iter().find_map(|bank| {
            let heap = bank.heap_type();
            (heap == HEAP_TYPE_FB_PUBLIC || heap == HEAP_TYPE_FB_PRIVATE).then(|| Vram {
                public: heap == HEAP_TYPE_FB_PUBLIC,
                size: bank.size_in_bytes(),
            })
        })
    }

    /// Compute units (`simd_count / simd_per_cu`), when both are known.
    pub fn compute_units(&self) -> Option<u64> {
        let per_cu = self.prop("simd_per_cu");
        (per_cu != 0).then(|| self.prop("simd_count") / per_cu)
    }

    /// The LLVM target name (`gfx942`) from `gfx_target_version` (90402), when listed.
    pub fn gfx_target(&self) -> Option<String> {
        let v = self
            .properties
            .get("gfx_target_version")
            .filter(|v| *v != 0)?;
        Some(format!(
            "gfx{}{:x}{:x}",
            v / 10000,
            (v / 100) % 100,
            v % 100
        ))
    }

    /// A short human name: the gfx target and the KFD name ("gfx906 vega20"), without the
    /// uninformative "ip discovery".
    pub fn display_name(&self) -> String {
        let name = self.name.trim();
        let asic = (!name.is_empty() && name != "ip discovery").then_some(name);
        match (self.gfx_target(), asic) {
            (Some(gfx), Some(asic)) => format!("{gfx} {asic}"),
            (Some(gfx), None) => gfx,
            (None, Some(asic)) => asic.to_owned(),
            (None, None) if self.is_gpu() => "gpu".to_owned(),
            (None, None) => "cpu".to_owned(),
        }
    }
}

/// The VRAM of a KFD GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Vram {
    /// Whether the host can map all of it (heap type public).
    pub public: bool,
    /// Size in bytes.
    pub size: u64,
}

/// One `mem_banks/N/properties`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemBank {
    /// The file's `NAME VALUE` pairs.
    pub properties: Properties,
}

impl MemBank {
    /// `heap_type`.
    pub fn heap_type(&self) -> u64 {
        self.properties.value("heap_type")
    }

    /// `size_in_bytes`.
    pub fn size_in_bytes(&self) -> u64 {
        self.properties.value("size_in_bytes")
    }
}

/// One `io_links/N/properties`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IoLink {
    /// The file's `NAME VALUE` pairs.
    pub properties: Properties,
}

impl IoLink {
    /// A link of `kind` from node `from` to node `to`, as the tests and tools build them.
    pub fn new(kind: LinkType, from: u32, to: u32) -> Self {
        IoLink {
            properties: Properties::from([
                ("type", kind.raw()),
                ("node_from", u64::from(from)),
                ("node_to", u64::from(to)),
            ]),
        }
    }

    /// `type`.
    pub fn link_type(&self) -> LinkType {
        LinkType::from_raw(self.properties.value("type"))
    }

    /// `node_to`, or `None` when it does not fit a node number.
    pub fn node_to(&self) -> Option<u32> {
        u32::try_from(self.properties.get("node_to")?).ok()
    }
}

/// The kind of a KFD io link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkType {
    /// PCIe (type 2).
    Pcie,
    /// XGMI / Infinity Fabric (type 11).
    Xgmi,
    /// Any other CRAT link type; CRIU ignores these, and so does gpucr.
    Other(u64),
}

impl LinkType {
    /// From the `type` property.
    pub fn from_raw(raw: u64) -> Self {
        match raw {
            IOLINK_TYPE_PCIE => LinkType::Pcie,
            IOLINK_TYPE_XGMI => LinkType::Xgmi,
            other => LinkType::Other(other),
        }
    }

    /// The `type` property value.
    pub fn raw(self) -> u64 {
        match self {
            LinkType::Pcie => IOLINK_TYPE_PCIE,
            LinkType::Xgmi => IOLINK_TYPE_XGMI,
            LinkType::Other(raw) => raw,
        }
    }

    /// A lower-case name: "pcie", "xgmi", "type N".
    pub fn name(self) -> String {
        match self {
            LinkType::Pcie => "pcie".to_owned(),
            LinkType::Xgmi => "xgmi".to_owned(),
            LinkType::Other(raw) => format!("type {raw}"),
        }
    }
}

/// Caches of one node that are alike, counted together (`caches/*/properties` lists one
/// directory per cache instance, often hundreds per GPU).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheGroup {
    /// `level` (1, 2, 3).
    pub level: u64,
    /// `size` in KiB.
    pub size_kib: u64,
    /// `cache_line_size` in bytes.
    pub cache_line_size: u64,
    /// `type` (a bit mask: 1 data, 2 instruction, 4 CPU, 8 HSA compute unit).
    pub cache_type: u64,
    /// How many caches of this kind the node lists.
    pub count: u64,
}

/// Where the facts about an NVIDIA GPU came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NvidiaSource {
    /// libnvidia-ml.so.1.
    Nvml,
    /// `/proc/driver/nvidia/gpus/*/information` and the PCI device in sysfs (no memory size).
    Procfs,
}

/// One NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaGpu {
    /// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": the identity CUDA restores by.
    pub uuid: String,
    /// The model ("NVIDIA H100 80GB HBM3").
    pub name: String,
    /// PCI address, `dddd:bb:dd.f` in lower case.
    pub bus_id: String,
    /// The `/dev/nvidiaN` minor number.
    #[serde(default)]
    pub minor: Option<u32>,
    /// PCI device id (the chip and board, e.g. 0x2330).
    #[serde(default)]
    pub device_id: Option<u32>,
    /// Total memory in bytes (NVML only).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// CUDA compute capability, "9.0" (NVML only).
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// Video BIOS version.
    #[serde(default)]
    pub vbios: Option<String>,
    /// NUMA node of the PCI device.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// Active NVLinks (NVML only; `None` where NVLink is not supported or unknown).
    #[serde(default)]
    pub nvlinks: Option<u32>,
    /// Where these facts came from.
    pub source: NvidiaSource,
}

impl NvidiaGpu {
    /// The GPU's identity.
    pub fn id(&self) -> GpuId {
        GpuId::Nvidia {
            uuid: self.uuid.clone(),
        }
    }
}

/// The identity of a GPU: what the plugin and the helper translate on restore.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GpuId {
    /// A KFD GPU (AMD, or the simulator): node number and `gpu_id`. KFD restores by
    /// `gpu_id`; the node number is for people.
    Kfd {
        /// KFD node number.
        node: u32,
        /// KFD `gpu_id`.
        gpu_id: u32,
    },
    /// An NVIDIA GPU, by UUID.
    Nvidia {
        /// "GPU-…" UUID.
        uuid: String,
    },
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuId::Kfd { node, gpu_id } => write!(f, "node {node} gpu_id {gpu_id}"),
            GpuId::Nvidia { uuid } => f.write_str(uuid),
        }
    }
}
