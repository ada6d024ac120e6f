//! Helpers shared by the topology tests: fixture loading and hand-built topologies.

#![allow(dead_code)]

use std::path::PathBuf;

use gpucr_topology::{
    check, read_local, CheckName, Checks, GpuId, IoLink, KfdNode, LinkType, Properties, Report,
    Topology,
};

/// `tests/fixtures/topology/NAME` at the workspace root.
pub fn fixture_root(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/topology")
        .join(name)
}

/// Reads a fixture machine as `--sysfs-root` would.
pub fn fixture(name: &str) -> Topology {
    read_local(Some(&fixture_root(name)))
        .unwrap_or_else(|err| panic!("fixture {name}: {err} ({:?})", err))
}

/// A `Topology` JSON fixture (`nvml/NAME.json`).
pub fn json_fixture(name: &str) -> Topology {
    let path = fixture_root("nvml").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The GPU nodes of a topology, mutably.
pub fn gpus_mut(topology: &mut Topology) -> impl Iterator<Item = &mut KfdNode> {
    topology.kfd_nodes.iter_mut().filter(|n| n.is_gpu())
}

/// Sets a property on every GPU node.
pub fn set_all(topology: &mut Topology, key: &str, value: u64) {
    for node in gpus_mut(topology) {
        node.properties.set(key, value);
    }
}

/// Runs the check with every rule on.
pub fn check_all(saved: &Topology, local: &Topology) -> Report {
    check(saved, local, &Checks::all())
}

/// The checks every candidate of every checkpointed GPU fails, deduplicated.
pub fn failed_checks(report: &Report) -> Vec<CheckName> {
    let mut names: Vec<CheckName> = report
        .gpus
        .iter()
        .flat_map(|g| g.candidates.iter())
        .flat_map(|c| c.failed.iter().map(|m| m.check))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Asserts the report holds a mapping of every checkpointed GPU to a distinct local GPU.
pub fn assert_maps_all(report: &Report, saved: &Topology) {
    assert!(report.compatible, "expected a mapping:\n{report}");
    let mapping = report.mapping.as_ref().expect("mapping");
    assert_eq!(mapping.gpus.len(), saved.gpu_count(), "{report}");
    let mut locals: Vec<&GpuId> = mapping.gpus.iter().map(|p| &p.local.id).collect();
    locals.sort();
    locals.dedup();
    assert_eq!(
        locals.len(),
        saved.gpu_count(),
        "local GPUs reused:\n{report}"
    );
}

/// Builds KFD topologies the way CRIU's `test_topology_remap.c` does: nodes with only
/// `device_id` set, links added one direction at a time.
#[derive(Default)]
pub struct Builder {
    nodes: Vec<KfdNode>,
}

impl Builder {
    /// `sys_add_node(sys, id, 0)` with `cpu_cores_count = 1`.
    pub fn cpu(&mut self, id: u32) -> &mut Self {
        self.nodes.push(KfdNode {
            node: id,
            properties: Properties::from([("cpu_cores_count", 1)]),
            ..KfdNode::default()
        });
        self
    }

    /// `sys_add_node(sys, id, gpu_id)` with `device_id` set.
    pub fn gpu(&mut self, id: u32, gpu_id: u32, device_id: u64) -> &mut Self {
        self.nodes.push(KfdNode {
            node: id,
            gpu_id,
            properties: Properties::from([("device_id", device_id)]),
            ..KfdNode::default()
        });
        self
    }

    /// `node_add_iolink(node(from), type, to)`.
    pub fn link(&mut self, from: u32, kind: LinkType, to: u32) -> &mut Self {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.node == from)
            .expect("link from a node that exists");
        node.io_links.push(IoLink::new(kind, from, to));
        self
    }

    /// Sets a property of node `id`.
    pub fn set(&mut self, id: u32, key: &str, value: u64) -> &mut Self {
        let node = self.nodes.iter_mut().find(|n| n.node == id).expect("node");
        node.properties.set(key, value);
        self
    }

    pub fn build(&self) -> Topology {
        Topology {
            kfd_nodes: self.nodes.clone(),
            nvidia_gpus: Vec::new(),
        }
    }
}

/// The local GPU id a checkpointed KFD gpu_id maps to.
pub fn mapped_gpu_id(report: &Report, saved_gpu_id: u32) -> Option<u32> {
    report
        .mapping
        .as_ref()?
        .kfd_gpu_ids()
        .into_iter()
        .find(|(s, _)| *s == saved_gpu_id)
        .map(|(_, l)| l)
}
