//! Every rule, on and off: a difference in exactly what the rule looks at makes the
//! restore incompatible with the rule on, names the rule with both values, and is
//! accepted with the rule off (by `--skip-check NAME`, and by its `KFD_*_CHECK` variable
//! where CRIU has one).

mod common;

use common::{assert_maps_all, check_all, failed_checks, fixture, gpus_mut, json_fixture, set_all};
use gpucr_topology::{
    check, CheckName, Checks, IoLink, LinkType, Report, Requirement, Topology, Value,
};

/// Asserts that `local` fails exactly `rule` against `saved` with every check on, and
/// passes with that rule off.
fn assert_rule(saved: &Topology, local: &Topology, rule: CheckName) -> Report {
    let report = check_all(saved, local);
    assert!(
        !report.compatible,
        "{rule}: expected incompatible\n{report}"
    );
    let failed = failed_checks(&report);
    let topology_wide: Vec<CheckName> = report.problems.iter().filter_map(|p| p.check).collect();
    assert!(
        failed == [rule] || (failed.is_empty() && topology_wide.contains(&rule)),
        "{rule}: failed {failed:?}, problems {topology_wide:?}\n{report}"
    );
    assert!(report.would_map_without.contains(&rule), "{rule}\n{report}");

    let skipped = check(saved, local, &Checks::from_lookup(|_| None, &[rule]));
    assert_maps_all(&skipped, saved);
    assert_eq!(skipped.disabled_checks.len(), 1);
    assert_eq!(skipped.disabled_checks[0].check, rule);
    assert!(skipped
        .to_string()
        .contains(&format!("checks not applied: {rule} (--skip-check)")));

    if let Some(var) = rule.env_var() {
        for off in ["0", "NO", "no"] {
            let env = Checks::from_lookup(|name| (name == var).then(|| off.to_owned()), &[]);
            assert_maps_all(&check(saved, local, &env), saved);
        }
        for on in ["1", "YES", "Yes"] {
            let env = Checks::from_lookup(|name| (name == var).then(|| on.to_owned()), &[]);
            assert!(!check(saved, local, &env).compatible, "{var}={on}");
        }
    }
    report
}

/// The first failed check of the first candidate.
fn first_mismatch(report: &Report) -> &gpucr_topology::Mismatch {
    &report.gpus[0].candidates[0].failed[0]
}

const EQUAL: &[CheckName] = &[
    CheckName::SimdCount,
    CheckName::MemBanksCount,
    CheckName::MaxWavesPerSimd,
    CheckName::LdsSizeInKb,
    CheckName::WaveFrontSize,
    CheckName::ArrayCount,
    CheckName::SimdArraysPerEngine,
    CheckName::CuPerSimdArray,
    CheckName::SimdPerCu,
    CheckName::MaxSlotsScratchCu,
    CheckName::VendorId,
    CheckName::DeviceId,
    CheckName::NumSdmaEngines,
    CheckName::NumSdmaXgmiEngines,
    CheckName::NumSdmaQueuesPerEngine,
    CheckName::NumCpQueues,
    CheckName::Capability,
];

#[test]
fn properties_that_must_be_equal() {
    let saved = fixture("mi50-2x");
    for &rule in EQUAL {
        for delta in [1, u64::MAX] {
            let mut local = saved.clone();
            let value = saved.kfd_nodes[1].prop(rule.as_str()).wrapping_add(delta);
            set_all(&mut local, rule.as_str(), value);
            let report = assert_rule(&saved, &local, rule);
            let m = first_mismatch(&report);
            assert_eq!(m.requirement, Requirement::Equal);
            assert_eq!(
                m.saved,
                Value::Number(saved.kfd_nodes[1].prop(rule.as_str()))
            );
            assert_eq!(m.local, Value::Number(value));
        }
    }
}

#[test]
fn properties_where_local_must_be_at_least_checkpointed() {
    let saved = fixture("mi100-4x-xgmi");
    for rule in [
        CheckName::NumGws,
        CheckName::CachesCount,
        CheckName::FwVersion,
        CheckName::SdmaFwVersion,
    ] {
        let old = saved.kfd_nodes[2].prop(rule.as_str());
        let mut lower = saved.clone();
        set_all(&mut lower, rule.as_str(), old - 1);
        let report = assert_rule(&saved, &lower, rule);
        let m = first_mismatch(&report);
        assert_eq!(m.requirement, Requirement::AtLeast);
        assert_eq!(
            (&m.saved, &m.local),
            (&Value::Number(old), &Value::Number(old - 1))
        );

        let mut higher = saved.clone();
        set_all(&mut higher, rule.as_str(), old + 1);
        assert_maps_all(&check_all(&saved, &higher), &saved);
    }
}

#[test]
fn vram_size_and_visibility() {
    let saved = fixture("mi250x-8gcd");
    let mut smaller = saved.clone();
    for node in gpus_mut(&mut smaller) {
        node.mem_banks[0].properties.set("size_in_bytes", 32 << 30);
    }
    let report = assert_rule(&saved, &smaller, CheckName::VramSize);
    assert!(report.to_string().contains(
        "vram_size: checkpointed 64.0 GiB, local 32.0 GiB (local must be at least the checkpointed value)"
    ));
    let mut larger = saved.clone();
    for node in gpus_mut(&mut larger) {
        node.mem_banks[0].properties.set("size_in_bytes", 128 << 30);
    }
    assert_maps_all(&check_all(&saved, &larger), &saved);

    let mut private = saved.clone();
    for node in gpus_mut(&mut private) {
        node.mem_banks[0].properties.set("heap_type", 2);
    }
    let report = assert_rule(&saved, &private, CheckName::VramPublic);
    assert_eq!(first_mismatch(&report).saved, Value::Flag(true));
    assert_eq!(first_mismatch(&report).local, Value::Flag(false));
}

#[test]
fn io_links_count_local_needs_at_least_as_many_valid_links() {
    // The checkpointed GPUs had a PCIe peer link each; the local ones do not.
    let local = fixture("mi50-2x");
    let mut saved = local.clone();
    saved.kfd_nodes[1]
        .io_links
        .push(IoLink::new(LinkType::Pcie, 1, 2));
    saved.kfd_nodes[2]
        .io_links
        .push(IoLink::new(LinkType::Pcie, 2, 1));
    let report = assert_rule(&saved, &local, CheckName::IoLinksCount);
    assert_eq!(first_mismatch(&report).saved, Value::Number(2));
    assert_eq!(first_mismatch(&report).local, Value::Number(1));
    // More links locally is fine, and the raw io_links_count property is not compared.
    assert_maps_all(&check_all(&local, &saved), &local);
}

#[test]
fn cpu_links_bidirectional_needs_bidirectional() {
    let saved = fixture("mi50-2x");
    let mut local = saved.clone();
    // The CPU no longer links back to the GPUs: their CPU links become one-way.
    local.kfd_nodes[0].io_links.clear();
    let report = assert_rule(&saved, &local, CheckName::CpuLinks);
    let m = first_mismatch(&report);
    assert_eq!(
        (&m.saved, &m.local),
        (
            &Value::Text("pcie to CPU node 0 (bi-directional)".to_owned()),
            &Value::Text("pcie to CPU node 0 (one-way)".to_owned())
        )
    );
    // A one-way link can be restored onto a bi-directional one.
    assert_maps_all(&check_all(&local, &saved), &local);
}

#[test]
fn cpu_links_xgmi_needs_xgmi() {
    let mut saved = fixture("mi50-2x");
    for node in &mut saved.kfd_nodes {
        for link in &mut node.io_links {
            link.properties.set("type", 11);
        }
    }
    let local = fixture("mi50-2x");
    assert_rule(&saved, &local, CheckName::CpuLinks);
    // PCIe can become XGMI.
    assert_maps_all(&check_all(&local, &saved), &local);
}

/// mi100-4x-xgmi with GPU node 4 moved from CPU node 1 to CPU node 0.
fn three_on_one_socket() -> Topology {
    let mut local = fixture("mi100-4x-xgmi");
    for node in &mut local.kfd_nodes {
        for link in &mut node.io_links {
            let (from, to) = (
                link.properties.value("node_from"),
                link.properties.value("node_to"),
            );
            if (from, to) == (4, 1) {
                link.properties.set("node_to", 0);
            }
            if (from, to) == (1, 4) {
                link.properties.set("node_from", 0);
            }
        }
    }
    let moved = local.kfd_nodes[1]
        .io_links
        .iter()
        .position(|l| l.properties.value("node_to") == 4)
        .unwrap();
    let link = local.kfd_nodes[1].io_links.remove(moved);
    local.kfd_nodes[0].io_links.push(link);
    local
}

#[test]
fn numa_gpus_of_one_cpu_node_stay_together() {
    let saved = fixture("mi100-4x-xgmi");
    let local = three_on_one_socket();
    let report = assert_rule(&saved, &local, CheckName::Numa);
    let text = report.to_string();
    assert!(
        text.contains("numa: no mapping keeps the GPUs of each checkpointed CPU node together")
            && text.contains("checkpointed: CPU node 0: 2 GPU(s), CPU node 1: 2 GPU(s)")
            && text.contains("local: CPU node 0: 3 GPU(s), CPU node 1: 1 GPU(s)"),
        "{text}"
    );
    // Every pair passes on its own: the report says so.
    assert!(report
        .gpus
        .iter()
        .all(|g| g.candidates.iter().all(|c| c.failed.is_empty())));
}

#[test]
fn numa_cpu_nodes_may_be_renumbered() {
    // Both sockets swap their GPUs: CPU node 0 maps to 1 and 1 to 0.
    let saved = fixture("mi100-4x-xgmi");
    let mut local = saved.clone();
    for node in &mut local.kfd_nodes {
        for link in &mut node.io_links {
            for key in ["node_from", "node_to"] {
                let v = link.properties.value(key);
                if v < 2 {
                    link.properties.set(key, 1 - v);
                }
            }
        }
    }
    local.kfd_nodes.swap(0, 1);
    local.kfd_nodes[0].node = 0;
    local.kfd_nodes[1].node = 1;
    let report = check_all(&saved, &local);
    assert_maps_all(&report, &saved);
    let cpus = &report.mapping.as_ref().unwrap().cpu_nodes;
    assert_eq!(
        cpus.iter().map(|c| (c.saved, c.local)).collect::<Vec<_>>(),
        [(0, 1), (1, 0)]
    );
}

#[test]
fn xgmi_hive_maps_onto_one_local_hive() {
    // Local: the XGMI links between the two GPU pairs became PCIe: two hives of two.
    let saved = fixture("mi100-4x-xgmi");
    let mut local = saved.clone();
    for node in &mut local.kfd_nodes {
        for link in &mut node.io_links {
            let (from, to) = (
                link.properties.value("node_from"),
                link.properties.value("node_to"),
            );
            if from >= 2 && to >= 2 && (from < 4) != (to < 4) {
                link.properties.set("type", 2);
            }
        }
    }
    let report = assert_rule(&saved, &local, CheckName::XgmiHive);
    let text = report.to_string();
    assert!(
        text.contains("xgmi_hive: the image has 1 XGMI hive(s)")
            || text.contains("xgmi_hive: the XGMI hive of 4 GPUs"),
        "{text}"
    );
    assert!(text.contains("local hive sizes: 2, 2"), "{text}");
}

#[test]
fn gpu_count_kfd_needs_equal_counts() {
    let saved = fixture("mi50-2x");
    let mut local = saved.clone();
    // Two more MI50s on the same CPU.
    for (node, gpu_id) in [(3, 777), (4, 778)] {
        let mut gpu = local.kfd_nodes[1].clone();
        gpu.node = node;
        gpu.gpu_id = gpu_id;
        gpu.io_links = vec![IoLink::new(LinkType::Pcie, node, 0)];
        local.kfd_nodes.push(gpu);
        local.kfd_nodes[0]
            .io_links
            .push(IoLink::new(LinkType::Pcie, 0, node));
    }
    let report = assert_rule(&saved, &local, CheckName::GpuCount);
    assert!(report.to_string().contains(
        "gpu_count: the image has 2 KFD (AMD) GPU(s), this machine 4: KFD restores a process onto every GPU"
    ));
    // Fewer local GPUs can never work, even without the check.
    let report = check(&local, &saved, &Checks::all().without(CheckName::GpuCount));
    assert!(!report.compatible);
    assert!(report
        .to_string()
        .contains("every checkpointed GPU needs its own"));
}

#[test]
fn nvidia_same_chip_and_enough_memory() {
    let saved = json_fixture("h100-8x");
    let mut other_chip = saved.clone();
    for gpu in &mut other_chip.nvidia_gpus {
        gpu.device_id = Some(0x2331);
        gpu.name = "NVIDIA H100 PCIe".to_owned();
    }
    let report = assert_rule(&saved, &other_chip, CheckName::DeviceId);
    assert!(report
        .to_string()
        .contains("device_id: checkpointed 0x2330, local 0x2331 (must be equal)"));

    let mut smaller = saved.clone();
    for gpu in &mut smaller.nvidia_gpus {
        gpu.memory_bytes = Some(40 << 30);
    }
    assert_rule(&saved, &smaller, CheckName::VramSize);

    // Without a PCI device id on one side, the model names are compared.
    let mut unnamed = other_chip.clone();
    for gpu in &mut unnamed.nvidia_gpus {
        gpu.device_id = None;
    }
    let report = assert_rule(&saved, &unnamed, CheckName::DeviceId);
    assert_eq!(
        first_mismatch(&report).local,
        Value::Text("NVIDIA H100 PCIe".to_owned())
    );
}

#[test]
fn amd_and_nvidia_gpus_are_never_candidates_for_each_other() {
    let report = check_all(&fixture("mi50-2x"), &json_fixture("h100-8x"));
    assert!(!report.compatible);
    assert!(report.gpus.iter().all(|g| g.candidates.is_empty()));
    assert!(report
        .to_string()
        .contains("has no local KFD (AMD) GPU to go to"));
}
