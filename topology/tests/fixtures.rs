//! The fixture machines read as `--sysfs-root` reads them, and the readers' errors.

mod common;

use std::fs;
use std::path::Path;

use common::{assert_maps_all, check_all, fixture, fixture_root, json_fixture};
use gpucr_topology::{
    read_local, GpuId, GpuTable, KfdError, NvidiaError, NvidiaSource, Topology, TopologyError,
};

struct Expect {
    name: &'static str,
    gpus: usize,
    cpus: usize,
    device_id: u64,
    vram_gib: Option<u64>,
    compute_units: Option<u64>,
    hives: usize,
    numa: &'static [u32],
}

const MACHINES: &[Expect] = &[
    Expect {
        name: "mi50-2x",
        gpus: 2,
        cpus: 1,
        device_id: 0x66a1,
        vram_gib: Some(32),
        compute_units: Some(60),
        hives: 0,
        numa: &[0, 0],
    },
    Expect {
        name: "mi100-4x-xgmi",
        gpus: 4,
        cpus: 2,
        device_id: 0x738c,
        vram_gib: Some(32),
        compute_units: Some(120),
        hives: 1,
        numa: &[0, 0, 1, 1],
    },
    Expect {
        name: "mi250x-8gcd",
        gpus: 8,
        cpus: 2,
        device_id: 0x740c,
        vram_gib: Some(64),
        compute_units: Some(110),
        hives: 1,
        numa: &[0, 0, 0, 0, 1, 1, 1, 1],
    },
    Expect {
        name: "mi300x-8x",
        gpus: 8,
        cpus: 2,
        device_id: 0x74a1,
        vram_gib: Some(192),
        compute_units: Some(304),
        hives: 1,
        numa: &[0, 0, 0, 0, 1, 1, 1, 1],
    },
    Expect {
        name: "radeon-workstation",
        gpus: 2,
        cpus: 1,
        device_id: 0x744c,
        vram_gib: Some(24),
        compute_units: Some(96),
        hives: 0,
        numa: &[0, 0],
    },
    Expect {
        name: "h100-1x",
        gpus: 1,
        cpus: 0,
        device_id: 0x2330,
        vram_gib: None,
        compute_units: None,
        hives: 0,
        numa: &[0],
    },
    Expect {
        name: "h100-8x",
        gpus: 8,
        cpus: 0,
        device_id: 0x2330,
        vram_gib: None,
        compute_units: None,
        hives: 0,
        numa: &[0, 0, 0, 0, 1, 1, 1, 1],
    },
];

#[test]
fn every_machine_reads_as_described() {
    for m in MACHINES {
        let topology = fixture(m.name);
        let table = GpuTable::new(&topology);
        assert_eq!(table.gpus.len(), m.gpus, "{}", m.name);
        assert_eq!(table.cpu_nodes.len(), m.cpus, "{}", m.name);
        let first = &table.gpus[0];
        assert_eq!(first.device_id, Some(m.device_id), "{}", m.name);
        assert_eq!(first.vram_bytes, m.vram_gib.map(|g| g << 30), "{}", m.name);
        assert_eq!(first.compute_units, m.compute_units, "{}", m.name);
        let numa: Vec<u32> = table
            .gpus
            .iter()
            .flat_map(|g| g.numa_nodes.clone())
            .collect();
        assert_eq!(numa, m.numa, "{}", m.name);
        let mut hives: Vec<usize> = table.gpus.iter().filter_map(|g| g.hive).collect();
        hives.dedup();
        assert_eq!(hives.len(), m.hives, "{}", m.name);
        if m.hives > 0 {
            assert!(table.gpus.iter().all(|g| g.hive.is_some()), "{}", m.name);
        }
    }
}

#[test]
fn kfd_details() {
    let mi300x = fixture("mi300x-8x");
    let gpu = &mi300x.kfd_nodes[2];
    assert_eq!(gpu.node, 2);
    assert_eq!(gpu.gpu_id, 28851);
    assert_eq!(gpu.name, "ip discovery");
    assert_eq!(gpu.display_name(), "gfx942");
    assert_eq!(gpu.prop("hive_id"), 0xFBC9_ADE3_D4E4_FC2A);
    assert_eq!(gpu.prop("num_sdma_xgmi_engines"), 14);
    assert!(gpu.vram().unwrap().public);
    assert_eq!(gpu.caches.len(), 4);
    assert_eq!(
        gpu.caches.iter().map(|c| c.count).sum::<u64>(),
        gpu.prop("caches_count")
    );
    // Eight io links: one PCIe link to its CPU and XGMI to the seven others. CPU-CPU
    // HyperTransport links are read but play no part in the rules.
    assert_eq!(gpu.io_links.len(), 8);
    let cpu = &mi300x.kfd_nodes[0];
    assert!(!cpu.is_gpu());
    assert_eq!(cpu.name, "");
    assert_eq!(cpu.prop("cpu_cores_count"), 96);
    assert_eq!(cpu.io_links.len(), 5);

    let workstation = fixture("radeon-workstation");
    let names: Vec<String> = workstation
        .kfd_nodes
        .iter()
        .map(|n| n.display_name())
        .collect();
    assert_eq!(names, ["cpu", "gfx1100", "gfx1030 sienna_cichlid"]);
    assert_eq!(workstation.kfd_nodes[1].prop("wave_front_size"), 32);
    assert_eq!(
        fixture("mi50-2x").kfd_nodes[1].display_name(),
        "gfx906 vega20"
    );
}

#[test]
fn nvidia_details() {
    let procfs = fixture("h100-8x");
    let nvml = json_fixture("h100-8x");
    assert_eq!(procfs.nvidia_gpus.len(), 8);
    for (p, n) in procfs.nvidia_gpus.iter().zip(&nvml.nvidia_gpus) {
        assert_eq!(p.uuid, n.uuid);
        assert_eq!(p.bus_id, n.bus_id);
        assert_eq!(p.minor, n.minor);
        assert_eq!(p.device_id, n.device_id);
        assert_eq!(p.numa_node, n.numa_node);
        assert_eq!(p.source, NvidiaSource::Procfs);
        assert_eq!(n.source, NvidiaSource::Nvml);
        assert_eq!(p.memory_bytes, None);
        assert_eq!(n.memory_bytes, Some(85_520_809_984));
    }
    assert_eq!(procfs.nvidia_gpus[0].bus_id, "0000:1b:00.0");
    assert_eq!(procfs.nvidia_gpus[7].minor, Some(7));
    assert_eq!(
        procfs.nvidia_gpus[0].vbios.as_deref(),
        Some("96.00.74.00.01")
    );
}

#[test]
fn a_root_without_drivers_has_no_gpus() {
    let topology = fixture("cpu-only");
    assert!(!topology.has_gpus());
    assert_eq!(topology.kfd_nodes.len(), 2);
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(read_local(Some(empty.path())).unwrap(), Topology::default());
    assert_eq!(
        GpuTable::new(&topology).to_string(),
        "no GPUs (KFD CPU nodes: 0,1)\n"
    );
}

#[test]
fn every_machine_restores_onto_itself_keeping_every_gpu() {
    for m in MACHINES {
        let topology = fixture(m.name);
        let report = check_all(&topology, &topology);
        assert_maps_all(&report, &topology);
        for pair in &report.mapping.as_ref().unwrap().gpus {
            assert_eq!(pair.saved.id, pair.local.id, "{}: {report}", m.name);
        }
    }
}

#[test]
fn the_snapshot_round_trips_through_json_and_a_manifest() {
    #[derive(serde::Deserialize)]
    struct Manifest {
        topology: Option<Topology>,
    }
    for name in ["mi250x-8gcd", "radeon-workstation", "h100-8x"] {
        let topology = fixture(name);
        let json = serde_json::to_string(&topology).unwrap();
        assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), topology);
        let manifest = format!(r#"{{"version": 1, "topology": {json}, "gpu": {{"x": []}}}}"#);
        let read: Manifest = serde_json::from_str(&manifest).unwrap();
        assert_eq!(read.topology.as_ref(), Some(&topology));
    }
    let none: Manifest = serde_json::from_str(r#"{"topology": null}"#).unwrap();
    assert!(none.topology.is_none());
}

#[test]
fn retain_gpus_keeps_cpus_and_invalidates_links_to_dropped_gpus() {
    let full = fixture("mi300x-8x");
    let kept: Vec<GpuId> = full.gpus().into_iter().take(4).collect();
    let half = full.retain_gpus(|id| kept.contains(id));
    assert_eq!(half.gpu_count(), 4);
    assert_eq!(half.kfd_nodes.len(), 6);
    let table = GpuTable::new(&half);
    // The four left form a hive of four; links to the others are not listed.
    assert!(table.gpus.iter().all(|g| g.hive == Some(0)));
    assert!(table.gpus.iter().all(|g| g.links.len() == 4));
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A writable copy of a fixture, and the path of its KFD nodes.
fn copy_fixture(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_root(name), dir.path());
    let nodes = dir.path().join("sys/class/kfd/kfd/topology/nodes");
    (dir, nodes)
}

fn read_error(root: &Path) -> String {
    let err = read_local(Some(root)).unwrap_err();
    // The file is named in the error's source chain, which is what gets printed.
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[test]
fn missing_files_are_named() {
    let (dir, nodes) = copy_fixture("mi50-2x");
    fs::remove_file(nodes.join("1/properties")).unwrap();
    let err = read_error(dir.path());
    assert!(err.contains("nodes/1/properties is missing"), "{err}");

    let (dir, nodes) = copy_fixture("mi50-2x");
    fs::remove_file(nodes.join("2/name")).unwrap();
    assert!(read_error(dir.path()).contains("nodes/2/name is missing"));

    let (dir, nodes) = copy_fixture("mi50-2x");
    fs::remove_dir_all(nodes.join("2/io_links")).unwrap();
    assert!(read_error(dir.path()).contains("nodes/2/io_links is missing"));

    let (dir, nodes) = copy_fixture("mi50-2x");
    fs::remove_file(nodes.join("1/mem_banks/0/properties")).unwrap();
    assert!(read_error(dir.path()).contains("nodes/1/mem_banks/0/properties is missing"));

    let (dir, nodes) = copy_fixture("mi50-2x");
    fs::remove_file(nodes.join("1/gpu_id")).unwrap();
    let err = read_local(Some(dir.path())).unwrap_err();
    assert!(
        matches!(err, TopologyError::Kfd(KfdError::Missing { .. })),
        "{err:?}"
    );
}

#[test]
fn malformed_files_are_named() {
    let (dir, nodes) = copy_fixture("mi100-4x-xgmi");
    fs::write(nodes.join("3/gpu_id"), "27830x\n").unwrap();
    let err = read_error(dir.path());
    assert!(
        err.contains("nodes/3/gpu_id: expected an unsigned integer"),
        "{err}"
    );

    let (dir, nodes) = copy_fixture("mi100-4x-xgmi");
    let path = nodes.join("4/properties");
    let text = fs::read_to_string(&path)
        .unwrap()
        .replace("simd_count 480", "simd_count many");
    fs::write(&path, text).unwrap();
    let err = read_error(dir.path());
    assert!(
        err.contains("nodes/4/properties:2: malformed line \"simd_count many\""),
        "{err}"
    );

    let (dir, nodes) = copy_fixture("mi100-4x-xgmi");
    fs::write(nodes.join("2/io_links/1/properties"), "type 11\nnode_to\n").unwrap();
    let err = read_error(dir.path());
    assert!(err.contains("nodes/2/io_links/1/properties:2"), "{err}");

    let (dir, nodes) = copy_fixture("mi100-4x-xgmi");
    fs::write(nodes.join("5/caches/0/properties"), "level one\n").unwrap();
    assert!(read_error(dir.path()).contains("nodes/5/caches/0/properties:1"));

    let (dir, nodes) = copy_fixture("mi100-4x-xgmi");
    fs::write(
        nodes.join("2/mem_banks/0/properties"),
        "heap_type 0\nsize_in_bytes 1\n",
    )
    .unwrap();
    let err = read_error(dir.path());
    assert!(
        err.contains("nodes/2/mem_banks: GPU node has no VRAM bank"),
        "{err}"
    );
}

#[test]
fn nvidia_files_are_named() {
    let copy = |name: &str| {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&fixture_root(name), dir.path());
        dir
    };
    let bus = "0000:04:00.0";

    let dir = copy("h100-1x");
    let info = dir
        .path()
        .join("proc/driver/nvidia/gpus")
        .join(bus)
        .join("information");
    let text = fs::read_to_string(&info).unwrap();
    fs::write(&info, text.replace("GPU UUID", "GPU ID")).unwrap();
    let err = read_error(dir.path());
    assert!(
        err.contains(&format!("{bus}/information: no `GPU UUID:` line")),
        "{err}"
    );

    let dir = copy("h100-1x");
    let device = dir
        .path()
        .join("sys/bus/pci/devices")
        .join(bus)
        .join("device");
    fs::write(&device, "H100\n").unwrap();
    let err = read_local(Some(dir.path())).unwrap_err();
    assert!(
        matches!(&err, TopologyError::Nvidia(NvidiaError::Malformed { path, .. }) if path == &device),
        "{err:?}"
    );

    let dir = copy("h100-1x");
    fs::remove_file(
        dir.path()
            .join("proc/driver/nvidia/gpus")
            .join(bus)
            .join("information"),
    )
    .unwrap();
    assert!(read_error(dir.path()).contains(&format!("{bus}/information is missing")));

    // The PCI sysfs files are optional: without them the id and NUMA node are unknown.
    let dir = copy("h100-1x");
    fs::remove_dir_all(dir.path().join("sys")).unwrap();
    let topology = read_local(Some(dir.path())).unwrap();
    assert_eq!(topology.nvidia_gpus[0].device_id, None);
    assert_eq!(topology.nvidia_gpus[0].numa_node, None);
}
