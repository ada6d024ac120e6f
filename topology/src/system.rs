//! The analysed view of a [`Topology`]: which links are valid, which are bi-directional,
//! and which GPUs form XGMI hives (CRIU's `topology_determine_iolinks`).
//!
//! * Only PCIe and XGMI links count (CRIU keeps no other type).
//! * A link is valid when the node it points to is in the topology; a link to a node a
//!   device cgroup hides (or that `retain_gpus` dropped) is not.
//! * A link is bi-directional when the node it points to has a link of the same type back.
//! * A hive is a set of two or more GPUs connected by bi-directional XGMI links (the
//!   connected components; CRIU builds the same groups for fully connected hives).

use std::collections::HashMap;

use crate::model::{KfdNode, LinkType, NvidiaGpu, Topology, Vram};
use crate::GpuId;

/// The two kinds of GPU: they are never candidates for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Kfd,
    Nvidia,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Kfd => "KFD (AMD)",
            Kind::Nvidia => "NVIDIA",
        }
    }
}

/// The device behind a GPU.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Device<'t> {
    Kfd(&'t KfdNode),
    Nvidia(&'t NvidiaGpu),
}

/// A valid link from a GPU to a CPU node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CpuLink {
    /// Index into [`System::cpus`].
    pub cpu: usize,
    pub kind: LinkType,
    pub bidirectional: bool,
}

/// One GPU and what its links say.
#[derive(Debug, Clone)]
pub(crate) struct Gpu<'t> {
    pub id: GpuId,
    pub name: String,
    pub device: Device<'t>,
    pub vram: Option<Vram>,
    /// The compared KFD properties ([`crate::properties::property_values`]); empty for NVIDIA.
    pub properties: Vec<u64>,
    /// Valid PCIe and XGMI links (CRIU's `num_valid_iolinks`).
    pub valid_links: u64,
    /// Valid links to CPU nodes, in link order.
    pub cpu_links: Vec<CpuLink>,
    /// Index into [`System::hives`].
    pub hive: Option<usize>,
}

impl Gpu<'_> {
    pub(crate) fn kind(&self) -> Kind {
        match self.device {
            Device::Kfd(_) => Kind::Kfd,
            Device::Nvidia(_) => Kind::Nvidia,
        }
    }
}

/// The analysed topology.
#[derive(Debug, Clone)]
pub(crate) struct System<'t> {
    pub gpus: Vec<Gpu<'t>>,
    /// KFD node numbers of the CPU nodes.
    pub cpus: Vec<u32>,
    /// GPU indices of each hive, in order.
    pub hives: Vec<Vec<usize>>,
}

impl<'t> System<'t> {
    pub(crate) fn new(topology: &'t Topology) -> Self {
        let nodes = &topology.kfd_nodes;
        let index: HashMap<u32, usize> =
            nodes.iter().enumerate().map(|(i, n)| (n.node, i)).collect();
        // Kept links of each node: (kind, target node index) for valid PCIe/XGMI links.
        let links: Vec<Vec<(LinkType, usize)>> = nodes
            .iter()
            .map(|node| {
                node.io_links
                    .iter()
                    .filter(|l| matches!(l.link_type(), LinkType::Pcie | LinkType::Xgmi))
                    .filter_map(|l| Some((l.link_type(), *index.get(&l.node_to()?)?)))
                    .collect()
            })
            .collect();
        let has_link_back = |from: usize, kind: LinkType, to: usize| {
            links[to]
                .iter()
                .any(|&(k, target)| k == kind && target == from)
        };

        let cpus: Vec<u32> = nodes
            .iter()
            .filter(|n| !n.is_gpu())
            .map(|n| n.node)
            .collect();
        let cpu_index: HashMap<u32, usize> =
            cpus.iter().enumerate().map(|(i, &n)| (n, i)).collect();

        let mut gpus = Vec::new();
        let mut gpu_of_node: HashMap<usize, usize> = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let Some(id) = node.id() else { continue };
            let cpu_links = links[i]
                .iter()
                .filter_map(|&(kind, target)| {
                    let cpu = *cpu_index.get(&nodes[target].node)?;
                    (!nodes[target].is_gpu()).then_some(CpuLink {
                        cpu,
                        kind,
                        bidirectional: has_link_back(i, kind, target),
                    })
                })
                .collect();
            gpu_of_node.insert(i, gpus.len());
            gpus.push(Gpu {
                id,
                name: node.display_name(),
                device: Device::Kfd(node),
                vram: node.vram(),
                properties: crate::properties::property_values(node),
                valid_links: links[i].len() as u64,
                cpu_links,
                hive: None,
            });
        }

        // Hives: connected components of bi-directional GPU-GPU XGMI links.
        let mut parent: Vec<usize> = (0..gpus.len()).collect();
        fn root(parent: &mut [usize], mut x: usize) -> usize {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        }
        for (i, node_links) in links.iter().enumerate() {
            let Some(&a) = gpu_of_node.get(&i) else {
                continue;
            };
            for &(kind, target) in node_links {
                let Some(&b) = gpu_of_node.get(&target) else {
                    continue;
                };
                if kind == LinkType::Xgmi && has_link_back(i, kind, target) {
                    let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                    parent[ra.max(rb)] = ra.min(rb);
                }
            }
        }
        let mut hives: Vec<Vec<usize>> = Vec::new();
        let mut hive_of_root: HashMap<usize, usize> = HashMap::new();
        let roots: Vec<usize> = (0..gpus.len()).map(|g| root(&mut parent, g)).collect();
        let mut component_size: HashMap<usize, usize> = HashMap::new();
        for &r in &roots {
            *component_size.entry(r).or_default() += 1;
        }
        for g in 0..gpus.len() {
            if component_size[&roots[g]] < 2 {
                continue;
            }
            let hive = *hive_of_root.entry(roots[g]).or_insert_with(|| {
                hives.push(Vec::new());
                hives.len() - 1
            });
            hives[hive].push(g);
            gpus[g].hive = Some(hive);
        }

        for gpu in &topology.nvidia_gpus {
            gpus.push(Gpu {
                id: gpu.id(),
                name: gpu.name.clone(),
                device: Device::Nvidia(gpu),
                vram: gpu.memory_bytes.map(|size| Vram { public: true, size }),
                properties: Vec::new(),
                valid_links: 0,
                cpu_links: Vec::new(),
                hive: None,
            });
        }
        System { gpus, cpus, hives }
    }

    /// How many GPUs of `kind`.
    pub(crate) fn count(&self, kind: Kind) -> usize {
        self.gpus.iter().filter(|g| g.kind() == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IoLink;

    fn node(number: u32, gpu_id: u32, links: &[(LinkType, u32)]) -> KfdNode {
        KfdNode {
            node: number,
            gpu_id,
            io_links: links
                .iter()
                .map(|&(kind, to)| IoLink::new(kind, number, to))
                .collect(),
            ..KfdNode::default()
        }
    }

    #[test]
    fn links_hives_and_directions() {
        use LinkType::{Pcie, Xgmi};
        let topology = Topology {
            kfd_nodes: vec![
                node(0, 0, &[(Pcie, 1), (Pcie, 2)]),
                node(1, 11, &[(Pcie, 0), (Xgmi, 2), (Xgmi, 9)]),
                node(2, 22, &[(Pcie, 0), (Xgmi, 1)]),
                node(3, 33, &[(Pcie, 0), (Xgmi, 1)]),
            ],
            nvidia_gpus: Vec::new(),
        };
        let sys = System::new(&topology);
        assert_eq!(sys.cpus, vec![0]);
        assert_eq!(sys.gpus.len(), 3);
        // Node 1: the link to node 9 is invalid (hidden node).
        assert_eq!(sys.gpus[0].valid_links, 2);
        assert!(sys.gpus[0].cpu_links[0].bidirectional);
        // Node 3: the CPU has no link back, and node 1 no XGMI link back.
        assert!(!sys.gpus[2].cpu_links[0].bidirectional);
        assert_eq!(sys.hives, vec![vec![0, 1]]);
        assert_eq!(sys.gpus[2].hive, None);
    }
}
