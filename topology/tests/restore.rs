//! Restoring onto other machines: bigger ones, ones with a different GPU count, a part of
//! a machine, and the report a refused restore prints.

mod common;

use common::{assert_maps_all, check_all, fixture, gpus_mut, json_fixture, set_all};
use gpucr_topology::{check, CheckName, Checks, GpuId, Topology};

#[test]
fn newer_firmware_more_vram_and_caches_are_accepted() {
    let saved = fixture("mi50-2x");
    let mut local = saved.clone();
    set_all(&mut local, "fw_version", 500);
    set_all(&mut local, "sdma_fw_version", 150);
    set_all(&mut local, "caches_count", 9);
    set_all(&mut local, "num_gws", 128);
    for node in gpus_mut(&mut local) {
        node.mem_banks[0].properties.set("size_in_bytes", 64 << 30);
    }
    assert_maps_all(&check_all(&saved, &local), &saved);
    // And not the other way round.
    let report = check_all(&local, &saved);
    assert!(!report.compatible);
    let text = report.to_string();
    for name in [
        "fw_version",
        "sdma_fw_version",
        "caches_count",
        "num_gws",
        "vram_size",
    ] {
        assert!(
            text.contains(&format!("{name}: checkpointed")),
            "{name}\n{text}"
        );
    }
}

#[test]
fn an_extra_local_hive_is_accepted() {
    // Checkpointed on mi250x-8gcd where the XGMI links of four GCDs were down; restored on
    // the intact machine (CRIU's test 7 on real sysfs data).
    let local = fixture("mi250x-8gcd");
    let mut saved = local.clone();
    for node in &mut saved.kfd_nodes {
        if node.node >= 6 {
            node.io_links.retain(|l| l.properties.value("type") != 11);
        }
        node.io_links
            .retain(|l| !(l.properties.value("type") == 11 && l.properties.value("node_to") >= 6));
    }
    let report = check_all(&saved, &local);
    assert_maps_all(&report, &saved);
}

#[test]
fn more_local_gpus_need_gpu_count_skipped_on_kfd() {
    // A process that saw four MI300X (a device cgroup hid the others) restored on a
    // machine where it sees all eight.
    let full = fixture("mi300x-8x");
    let first_four: Vec<GpuId> = full.gpus().into_iter().take(4).collect();
    let saved = full.retain_gpus(|id| first_four.contains(id));
    let report = check_all(&saved, &full);
    assert!(!report.compatible);
    assert_eq!(report.would_map_without, [CheckName::GpuCount]);
    let report = check(&saved, &full, &Checks::all().without(CheckName::GpuCount));
    assert_maps_all(&report, &saved);
    // Same machine, same GPUs kept.
    for pair in &report.mapping.as_ref().unwrap().gpus {
        assert_eq!(pair.saved.id, pair.local.id);
    }
}

#[test]
fn four_gpus_of_one_socket_restore_onto_four_of_the_other() {
    let full = fixture("mi300x-8x");
    let gpus = full.gpus();
    let saved = full.retain_gpus(|id| gpus[..4].contains(id));
    let local = full.retain_gpus(|id| gpus[4..].contains(id));
    let report = check_all(&saved, &local);
    assert_maps_all(&report, &saved);
    let mapping = report.mapping.as_ref().unwrap();
    assert_eq!(
        mapping
            .cpu_nodes
            .iter()
            .map(|c| (c.saved, c.local))
            .collect::<Vec<_>>(),
        [(0, 1)]
    );
    // Half on each socket cannot go onto four GPUs of one socket.
    let mixed =
        full.retain_gpus(|id| id == &gpus[0] || id == &gpus[1] || id == &gpus[4] || id == &gpus[5]);
    let report = check_all(&mixed, &local);
    assert!(!report.compatible);
    assert_eq!(report.would_map_without, [CheckName::Numa]);
}

#[test]
fn fewer_local_gpus_are_refused() {
    let report = check_all(&fixture("mi300x-8x"), &fixture("mi100-4x-xgmi"));
    assert!(!report.compatible);
    let text = report.to_string();
    assert!(
        text.contains("gpu_count: the image has 8 KFD (AMD) GPU(s), this machine 4: every checkpointed GPU needs its own"),
        "{text}"
    );
    // Every pair is explained too: different chips.
    assert!(text.contains("device_id: checkpointed 0x74a1, local 0x738c (must be equal)"));
    assert!(report.would_map_without.is_empty());

    let report = check_all(&fixture("mi50-2x"), &fixture("cpu-only"));
    assert!(!report.compatible);
    assert!(report.to_string().contains("this machine 0"));
}

#[test]
fn a_cpu_only_image_restores_anywhere() {
    for machine in ["cpu-only", "mi50-2x", "h100-1x"] {
        let report = check_all(&fixture("cpu-only"), &fixture(machine));
        assert!(report.compatible, "{machine}: {report}");
        assert!(report.mapping.as_ref().unwrap().gpus.is_empty());
    }
    assert!(check_all(&Topology::default(), &fixture("mi50-2x")).compatible);
}

#[test]
fn different_radeon_cards_only_map_to_their_own_kind() {
    let workstation = fixture("radeon-workstation");
    // Swap the cards' slots: the mapping follows the device ids, not the node numbers.
    let mut swapped = workstation.clone();
    let (a, b) = (swapped.kfd_nodes[1].clone(), swapped.kfd_nodes[2].clone());
    swapped.kfd_nodes[1] = renumber(b, 1);
    swapped.kfd_nodes[2] = renumber(a, 2);
    let report = check_all(&workstation, &swapped);
    assert_maps_all(&report, &workstation);
    assert_eq!(
        report.mapping.as_ref().unwrap().kfd_gpu_ids(),
        [(48197, 48197), (12454, 12454)]
    );
    // A single-GPU image from the 7900 XTX cannot use the 6800 XT.
    let xtx_only = workstation.retain_gpus(|id| matches!(id, GpuId::Kfd { gpu_id: 48197, .. }));
    let r6800_only = workstation.retain_gpus(|id| matches!(id, GpuId::Kfd { gpu_id: 12454, .. }));
    let report = check_all(&xtx_only, &r6800_only);
    assert!(!report.compatible);
    let text = report.to_string();
    for line in [
        "device_id: checkpointed 0x744c, local 0x73bf (must be equal)",
        "simd_count: checkpointed 192, local 144 (must be equal)",
        "vram_size: checkpointed 24.0 GiB, local 16.0 GiB",
        "fw_version: checkpointed 2150, local 115",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// Moves a KFD node to another node number (its links follow).
fn renumber(mut node: gpucr_topology::KfdNode, number: u32) -> gpucr_topology::KfdNode {
    node.node = number;
    for link in &mut node.io_links {
        link.properties.set("node_from", u64::from(number));
    }
    node
}

#[test]
fn nvidia_one_gpu_onto_eight() {
    let saved = json_fixture("h100-1x");
    let local = json_fixture("h100-8x");
    let report = check_all(&saved, &local);
    assert_maps_all(&report, &saved);
    let pairs = report.mapping.as_ref().unwrap().nvidia_uuids();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].0, "GPU-5b9d0a3e-7c41-4f2e-9a8b-1d2c3e4f5a61");
    assert!(pairs[0].1.starts_with("GPU-"));
    // No count rule for NVIDIA beyond "every GPU mapped".
    assert!(report.disabled_checks.is_empty());
}

#[test]
fn nvidia_eight_gpus_onto_one_is_refused() {
    let report = check_all(&json_fixture("h100-8x"), &json_fixture("h100-1x"));
    assert!(!report.compatible);
    assert!(report
        .to_string()
        .contains("gpu_count: the image has 8 NVIDIA GPU(s), this machine 1"));
}

#[test]
fn nvidia_memory_unknown_without_nvml_is_noted() {
    // Checkpointed with NVML, restored where only procfs can be read.
    let report = check_all(&json_fixture("h100-8x"), &fixture("h100-8x"));
    assert_maps_all(&report, &json_fixture("h100-8x"));
    for pair in &report.mapping.as_ref().unwrap().gpus {
        assert_eq!(pair.saved.id, pair.local.id);
    }
    assert_eq!(report.notes.len(), 1, "{report}");
    assert!(report
        .to_string()
        .contains("note: vram_size was not compared"));
}

#[test]
fn json_report_shape() {
    let saved = fixture("mi100-4x-xgmi");
    let report = check(
        &saved,
        &saved,
        &Checks::from_lookup(|v| (v == "KFD_FW_VER_CHECK").then(|| "0".to_owned()), &[]),
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["compatible"], true);
    assert_eq!(json["mapping"]["gpus"][0]["saved"]["kind"], "kfd");
    assert_eq!(json["mapping"]["gpus"][0]["saved"]["gpu_id"], 3213);
    assert_eq!(json["mapping"]["gpus"][0]["local"]["node"], 2);
    assert_eq!(json["mapping"]["cpu_nodes"][1]["local"], 1);
    assert_eq!(json["disabled_checks"][0]["check"], "fw_version");
    assert_eq!(json["disabled_checks"][0]["by"], "env");
    assert_eq!(json["disabled_checks"][0]["variable"], "KFD_FW_VER_CHECK");
    assert_eq!(json["problems"], serde_json::json!([]));

    let mut local = saved.clone();
    set_all(&mut local, "device_id", 0x738e);
    let json = serde_json::to_value(check_all(&saved, &local)).unwrap();
    assert_eq!(json["compatible"], false);
    assert_eq!(json["mapping"], serde_json::Value::Null);
    let failed = &json["gpus"][0]["candidates"][0]["failed"][0];
    assert_eq!(failed["check"], "device_id");
    assert_eq!(failed["requirement"], "equal");
    assert_eq!(failed["saved"], 0x738c);
    assert_eq!(failed["local"], 0x738e);
    assert_eq!(json["would_map_without"][0], "device_id");
}

#[test]
fn the_mapping_round_trips_for_the_helper() {
    let saved = fixture("mi250x-8gcd");
    let report = check_all(&saved, &saved);
    let mapping = report.mapping.unwrap();
    let json = serde_json::to_string(&mapping).unwrap();
    let back: gpucr_topology::Mapping = serde_json::from_str(&json).unwrap();
    assert_eq!(back, mapping);
    let first = &saved.gpus()[0];
    assert_eq!(back.local_for(first), Some(first));
    assert_eq!(back.kfd_gpu_ids().len(), 8);
}
