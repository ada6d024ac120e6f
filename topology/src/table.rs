//! The table of a machine's GPUs that `gpucr check-topology` prints without an image.

use std::fmt;

use serde::Serialize;

use crate::model::{GpuId, Topology};
use crate::rules::format_bytes;
use crate::system::{Device, System};

/// One link of a KFD GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinkRow {
    /// KFD node it points to.
    pub to_node: u32,
    /// "pcie" or "xgmi".
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether the other node links back.
    pub bidirectional: bool,
}

/// One GPU row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuRow {
    /// Identity (KFD node and gpu_id, or NVIDIA UUID).
    #[serde(flatten)]
    pub id: GpuId,
    /// Human name.
    pub name: String,
    /// PCI device id.
    pub device_id: Option<u64>,
    /// VRAM in bytes, when known.
    pub vram_bytes: Option<u64>,
    /// Compute units (KFD), when known.
    pub compute_units: Option<u64>,
    /// Firmware: KFD "mec N sdma M", NVIDIA the VBIOS version.
    pub firmware: Option<String>,
    /// NUMA (KFD CPU) nodes the GPU links to, or the PCI device's NUMA node.
    pub numa_nodes: Vec<u32>,
    /// XGMI hive number (KFD), counted from 0 in node order.
    pub hive: Option<usize>,
    /// Valid PCIe/XGMI links (KFD).
    pub links: Vec<LinkRow>,
    /// Active NVLinks (NVIDIA with NVML).
    pub nvlinks: Option<u32>,
}

/// The GPUs of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuTable {
    /// One row per GPU.
    pub gpus: Vec<GpuRow>,
    /// KFD CPU node numbers.
    pub cpu_nodes: Vec<u32>,
}

impl GpuTable {
    /// Summarizes `topology`.
    pub fn new(topology: &Topology) -> Self {
        let system = System::new(topology);
        let gpus = system
            .gpus
            .iter()
            .map(|gpu| match gpu.device {
                Device::Kfd(node) => {
                    let links =
                        node.io_links
                            .iter()
                            .filter_map(|link| {
                                let to = link.node_to()?;
                                let target = topology.kfd_nodes.iter().find(|n| n.node == to)?;
                                let kind = link.link_type();
                                let back = target.io_links.iter().any(|l| {
                                    l.link_type() == kind && l.node_to() == Some(node.node)
                                });
                                matches!(kind, crate::LinkType::Pcie | crate::LinkType::Xgmi).then(
                                    || LinkRow {
                                        to_node: to,
                                        kind: kind.name(),
                                        bidirectional: back,
                                    },
                                )
                            })
                            .collect();
                    let mut numa_nodes: Vec<u32> =
                        gpu.cpu_links.iter().map(|l| system.cpus[l.cpu]).collect();
                    numa_nodes.dedup();
                    GpuRow {
                        id: gpu.id.clone(),
                        name: gpu.name.clone(),
                        device_id: node.properties.get("device_id"),
                        vram_bytes: gpu.vram.map(|v| v.size),
                        compute_units: node.compute_units(),
                        firmware: Some(format!(
                            "mec {} sdma {}",
                            node.prop("fw_version"),
                            node.prop("sdma_fw_version")
                        )),
                        numa_nodes,
                        hive: gpu.hive,
                        links,
                        nvlinks: None,
                    }
                }
                Device::Nvidia(nv) => GpuRow {
                    id: gpu.id.clone(),
                    name: gpu.name.clone(),
                    device_id: nv.device_id.map(u64::from),
                    vram_bytes: nv.memory_bytes,
                    compute_units: None,
                    firmware: nv.vbios.clone(),
                    numa_nodes: nv.numa_node.into_iter().collect(),
                    hive: None,
                    links: Vec::new(),
                    nvlinks: nv.nvlinks,
                },
            })
            .collect();
        GpuTable {
            gpus,
            cpu_nodes: system.cpus.clone(),
        }
    }
}

/// "3-9" style list of node numbers.
fn ranges(nodes: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut j = i;
        while j + 1 < nodes.len() && nodes[j + 1] == nodes[j] + 1 {
            j += 1;
        }
        parts.push(if j > i + 1 {
            format!("{}-{}", nodes[i], nodes[j])
        } else if j == i + 1 {
            format!("{},{}", nodes[i], nodes[j])
        } else {
            nodes[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

impl GpuRow {
    fn links_text(&self) -> String {
        if let Some(n) = self.nvlinks {
            return format!("nvlink x{n}");
        }
        let mut parts = Vec::new();
        for kind in ["pcie", "xgmi"] {
            let mut to: Vec<u32> = self
                .links
                .iter()
                .filter(|l| l.kind == kind)
                .map(|l| l.to_node)
                .collect();
            to.sort_unstable();
            if !to.is_empty() {
                parts.push(format!("{kind}:{}", ranges(&to)));
            }
        }
        if let Some(hive) = self.hive {
            parts.push(format!("(hive {hive})"));
        }
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

impl fmt::Display for GpuTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.gpus.is_empty() {
            writeln!(
                f,
                "no GPUs (KFD CPU nodes: {})",
                if self.cpu_nodes.is_empty() {
                    "none".to_owned()
                } else {
                    ranges(&self.cpu_nodes)
                }
            )?;
            return Ok(());
        }
        let header = [
            "NODE", "GPU", "NAME", "VRAM", "CUS", "FIRMWARE", "NUMA", "LINKS",
        ];
        let rows: Vec<[String; 8]> = self
            .gpus
            .iter()
            .map(|row| {
                let (node, gpu) = match &row.id {
                    GpuId::Kfd { node, gpu_id } => (node.to_string(), gpu_id.to_string()),
                    GpuId::Nvidia { uuid } => ("-".to_owned(), uuid.clone()),
                };
                let dash = || "-".to_owned();
                [
                    node,
                    gpu,
                    row.name.clone(),
                    row.vram_bytes.map(format_bytes).unwrap_or_else(dash),
                    row.compute_units
                        .map(|c| c.to_string())
                        .unwrap_or_else(dash),
                    row.firmware.clone().unwrap_or_else(dash),
                    if row.numa_nodes.is_empty() {
                        dash()
                    } else {
                        ranges(&row.numa_nodes)
                    },
                    row.links_text(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        };
        writeln!(f, "{}", line(&header.map(str::to_owned)))?;
        for row in &rows {
            writeln!(f, "{}", line(row))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn node_ranges() {
        assert_eq!(ranges(&[0]), "0");
        assert_eq!(ranges(&[2, 3]), "2,3");
        assert_eq!(ranges(&[3, 4, 5, 6, 7, 8, 9]), "3-9");
        assert_eq!(ranges(&[0, 2, 3, 4, 7]), "0,2-4,7");
    }
}
