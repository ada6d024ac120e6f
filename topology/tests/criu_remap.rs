//! CRIU's nine GPU remap cases (`plugins/amdgpu/tests/test_topology_remap.c`), built
//! link by link as the C test builds them, with CRIU's expected outcomes:
//! 0 ok, 1 ok, 2 fail, 3 ok, 4 fail, 5 ok, 6 ok, 7 ok, 8 ok.
//! Plus the cases where CRIU's own search is wrong and gpucr's is not.

mod common;

use common::{assert_maps_all, check_all, failed_checks, mapped_gpu_id, Builder};
use gpucr_topology::LinkType::{Pcie, Xgmi};
use gpucr_topology::{CheckName, Topology};

const D000: u64 = 0xD000;
const D001: u64 = 0xD001;

/// Tests 0-2: two hives of four with XGMI inside, CPU links alternating between two CPUs.
/// `devs` are the device ids of the two hives; `partial` gives hive 1's GPUs 6 and 7
/// one-way CPU links and only two PCIe peers for hive 0 (tests 1 and 2).
fn two_hives(letter: u32, devs: [u64; 2], partial: bool) -> Topology {
    let mut b = Builder::default();
    b.cpu(0).cpu(1);
    for i in 0..4u32 {
        b.gpu(i + 2, letter + i, devs[0]);
        b.link(i + 2, Pcie, i & 1).link(i & 1, Pcie, i + 2);
    }
    for i in 0..4u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 2);
        }
        for j in 6..if partial { 8 } else { 10 } {
            b.link(i + 2, Pcie, j);
        }
    }
    for i in 4..8u32 {
        b.gpu(i + 2, letter + 0x10 + i, devs[1]);
        b.link(i + 2, Pcie, i & 1);
        if !partial || i < 6 {
            b.link(i & 1, Pcie, i + 2);
        }
    }
    for i in 4..8u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 6);
        }
        for j in 2..6 {
            b.link(i + 2, Pcie, j);
        }
    }
    b.build()
}

const A: u32 = 0xA000;
const B: u32 = 0xB000;

#[test]
fn case_0_hives_swap_to_match_device_ids() {
    let src = two_hives(A, [D000, D001], false);
    let dest = two_hives(B, [D001, D000], false);
    let report = check_all(&src, &dest);
    assert_maps_all(&report, &src);
    // Source hive 0 (D000) lands on destination hive 1 (D000) and the other way round.
    for i in 0..4 {
        let to = mapped_gpu_id(&report, A + i).unwrap();
        assert!((B + 0x14..=B + 0x17).contains(&to), "A00{i} -> {to:#x}");
    }
    for i in 4..8 {
        let to = mapped_gpu_id(&report, A + 0x10 + i).unwrap();
        assert!((B..=B + 3).contains(&to), "A01{i} -> {to:#x}");
    }
}

#[test]
fn case_1_partial_peer_links_same_devices() {
    let src = two_hives(A, [D000, D000], true);
    let dest = two_hives(B, [D000, D000], true);
    assert_maps_all(&check_all(&src, &dest), &src);
}

#[test]
fn case_2_bidirectional_cpu_links_cannot_go_to_one_way_links() {
    let src = two_hives(A, [D000, D001], true);
    let dest = two_hives(B, [D001, D000], true);
    let report = check_all(&src, &dest);
    assert!(!report.compatible, "{report}");
    // The D000 hive needs four bi-directional CPU links; its only possible destination
    // hive has two.
    assert!(
        failed_checks(&report).contains(&CheckName::CpuLinks),
        "{report}"
    );
    assert!(report.to_string().contains("one-way"), "{report}");
}

/// Tests 3-4: two hives of four, no peer PCIe; only one GPU per hive has a CPU that links
/// back to it. `back` are the GPU nodes CPU 0 and CPU 1 link back to.
fn sparse_cpu_links(letter: u32, back: [u32; 2]) -> Topology {
    let mut b = Builder::default();
    b.cpu(0).cpu(1);
    for i in 0..4u32 {
        b.gpu(i + 2, letter + i, D000);
        b.link(i + 2, Pcie, i & 1);
    }
    for i in 0..4u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 2);
        }
    }
    for i in 4..8u32 {
        b.gpu(i + 2, letter + 0x10 + i, D001);
        b.link(i + 2, Pcie, i & 1);
    }
    for i in 4..8u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 6);
        }
    }
    b.link(0, Pcie, back[0]).link(1, Pcie, back[1]);
    b.build()
}

#[test]
fn case_3_the_only_bidirectional_gpus_map_to_each_other() {
    let src = sparse_cpu_links(A, [4, 9]);
    let dest = sparse_cpu_links(B, [2, 7]);
    let report = check_all(&src, &dest);
    assert_maps_all(&report, &src);
    assert_eq!(mapped_gpu_id(&report, 0xA002), Some(0xB000));
    assert_eq!(mapped_gpu_id(&report, 0xA017), Some(0xB015));
}

#[test]
fn case_4_no_bidirectional_gpu_in_the_d001_hive() {
    let src = sparse_cpu_links(A, [4, 9]);
    let dest = sparse_cpu_links(B, [2, 6]);
    let report = check_all(&src, &dest);
    assert!(!report.compatible, "{report}");
    assert!(
        failed_checks(&report).contains(&CheckName::CpuLinks),
        "{report}"
    );
}

/// Test 5: one hive of four plus four GPUs linked by PCIe; all on two CPUs.
fn hive_and_pcie(letter: u32) -> Topology {
    let mut b = Builder::default();
    b.cpu(0).cpu(1);
    for i in 0..4u32 {
        b.gpu(i + 2, letter + i, D000);
        b.link(i + 2, Pcie, i & 1).link(i & 1, Pcie, i + 2);
    }
    for i in 0..4u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 2);
        }
        for j in 6..10 {
            b.link(i + 2, Pcie, j);
        }
    }
    for i in 4..8u32 {
        b.gpu(i + 2, letter + 0x10 + i, D000);
        b.link(i + 2, Pcie, i & 1).link(i & 1, Pcie, i + 2);
    }
    for i in 4..8u32 {
        for j in 1..4 {
            b.link(i + 2, Pcie, ((i + j) % 4) + 6);
        }
        for j in 2..6 {
            b.link(i + 2, Pcie, j);
        }
    }
    b.build()
}

#[test]
fn case_5_hive_plus_pcie_gpus() {
    let src = hive_and_pcie(A);
    let dest = hive_and_pcie(B);
    assert_maps_all(&check_all(&src, &dest), &src);
}

/// Tests 6 and 8: one CPU, five GPUs with bi-directional CPU links; `peers[i]` are the
/// nodes GPU i links to.
fn five_gpus(letter: u32, devs: [u64; 5], peers: [&[u32]; 5]) -> Topology {
    let mut b = Builder::default();
    b.cpu(0);
    for i in 0..5u32 {
        b.gpu(i + 1, letter + i, devs[i as usize]);
        b.link(i + 1, Pcie, 0).link(0, Pcie, i + 1);
    }
    for (i, to) in peers.iter().enumerate() {
        for &n in *to {
            b.link(i as u32 + 1, Pcie, n);
        }
    }
    b.build()
}

#[test]
fn case_6_needs_backtracking() {
    let peers: [&[u32]; 5] = [
        &[2, 3, 4],
        &[1, 3, 4],
        &[1, 2, 4],
        &[1, 2, 3],
        &[1, 2, 3, 4],
    ];
    let src = five_gpus(A, [D000, D000, D001, D000, D001], peers);
    let dest = five_gpus(B, [D000, D001, D000, D000, D001], peers);
    let report = check_all(&src, &dest);
    assert_maps_all(&report, &src);
    // Device ids are kept: the two D001 GPUs A002 and A004 take B001 and B004.
    let mut d001: Vec<u32> = [0xA002, 0xA004]
        .iter()
        .filter_map(|&a| mapped_gpu_id(&report, a))
        .collect();
    d001.sort_unstable();
    assert_eq!(d001, vec![0xB001, 0xB004]);
}

/// Test 7: the destination has a second hive where the source has four unlinked GPUs.
fn extra_hive(letter: u32, second_hive: bool) -> Topology {
    let mut b = Builder::default();
    b.cpu(0).cpu(1);
    for i in 0..4u32 {
        b.gpu(i + 2, letter + i, D000);
        b.link(i + 2, Pcie, i & 1);
    }
    for i in 0..4u32 {
        for j in 1..4 {
            b.link(i + 2, Xgmi, ((i + j) % 4) + 2);
        }
    }
    for i in 4..8u32 {
        b.gpu(i + 2, letter + 0x10 + i, D000);
    }
    if second_hive {
        for i in 4..8u32 {
            for j in 1..4 {
                b.link(i + 2, Xgmi, ((i + j) % 4) + 6);
            }
        }
    }
    b.build()
}

#[test]
fn case_7_a_more_capable_destination_is_accepted() {
    let src = extra_hive(A, false);
    let dest = extra_hive(B, true);
    assert_maps_all(&check_all(&src, &dest), &src);
}

#[test]
fn case_7_with_real_io_links_counts() {
    // On real sysfs `io_links_count` is the raw count: 0 on the source's unlinked GPUs, 3
    // on the destination's second hive. CRIU compares it for equality and refuses; gpucr
    // requires at least as many valid links and accepts.
    let mut src = extra_hive(A, false);
    let mut dest = extra_hive(B, true);
    for topology in [&mut src, &mut dest] {
        for node in &mut topology.kfd_nodes {
            let count = node.io_links.len() as u64;
            node.properties.set("io_links_count", count);
        }
    }
    assert_maps_all(&check_all(&src, &dest), &src);
}

#[test]
fn case_8_more_peer_links_on_the_destination() {
    let src = five_gpus(
        A,
        [D000; 5],
        [&[2, 3], &[1, 3], &[1, 2], &[1, 2, 3], &[1, 2, 3]],
    );
    let dest = five_gpus(
        B,
        [D000; 5],
        [
            &[2, 3, 4],
            &[1, 3, 4],
            &[1, 2, 4],
            &[1, 2, 3],
            &[1, 2, 3, 4],
        ],
    );
    assert_maps_all(&check_all(&src, &dest), &src);
}

#[test]
fn a_hive_choice_is_revisited_when_the_other_gpus_do_not_fit() {
    // Checkpointed: a hive of two GPUs with firmware 1, and a lone GPU with firmware 2.
    // Local: one hive of three whose first GPU has firmware 2. Mapping the hive first-fit
    // (as CRIU does) takes the firmware-2 GPU and leaves the lone GPU nowhere to go; CRIU
    // never revisits a matched hive and fails. A mapping exists.
    let mut src = Builder::default();
    src.cpu(0);
    for (node, fw) in [(1, 1), (2, 1), (3, 2)] {
        src.gpu(node, A + node, D000).set(node, "fw_version", fw);
        src.link(node, Pcie, 0).link(0, Pcie, node);
    }
    src.link(1, Xgmi, 2).link(2, Xgmi, 1);
    let mut dest = Builder::default();
    dest.cpu(0);
    for (node, fw) in [(1, 2), (2, 1), (3, 1)] {
        dest.gpu(node, B + node, D000).set(node, "fw_version", fw);
        dest.link(node, Pcie, 0).link(0, Pcie, node);
    }
    for (a, b) in [(1, 2), (1, 3), (2, 3)] {
        dest.link(a, Xgmi, b).link(b, Xgmi, a);
    }
    // The lone GPU needs as many links as the hive GPUs have on the destination.
    src.link(3, Pcie, 1).link(3, Pcie, 2);
    let (src, dest) = (src.build(), dest.build());
    let report = check_all(&src, &dest);
    assert_maps_all(&report, &src);
    assert_eq!(mapped_gpu_id(&report, A + 3), Some(B + 1));
}

#[test]
fn a_hive_never_goes_to_a_smaller_hive() {
    // CRIU's hive-size pre-check never fires (num_nodes is never counted). A hive of four
    // cannot be spread over two local hives of two.
    let mut src = Builder::default();
    src.cpu(0);
    for n in 1..=4 {
        src.gpu(n, A + n, D000).link(n, Pcie, 0).link(0, Pcie, n);
    }
    for a in 1..=4 {
        for b in 1..=4 {
            if a != b {
                src.link(a, Xgmi, b);
            }
        }
    }
    let mut dest = Builder::default();
    dest.cpu(0);
    for n in 1..=4 {
        dest.gpu(n, B + n, D000).link(n, Pcie, 0).link(0, Pcie, n);
    }
    for (a, b) in [(1, 2), (3, 4)] {
        dest.link(a, Xgmi, b).link(b, Xgmi, a);
    }
    // PCIe peers across the two hives keep the link counts equal, so only the hive rule
    // decides.
    for (a, b) in [(1, 3), (1, 4), (2, 3), (2, 4)] {
        dest.link(a, Pcie, b).link(b, Pcie, a);
    }
    let (src, dest) = (src.build(), dest.build());
    let report = check_all(&src, &dest);
    assert!(!report.compatible, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("xgmi_hive: the XGMI hive of 4 GPUs"),
        "{text}"
    );
    assert_eq!(
        report.would_map_without,
        vec![CheckName::XgmiHive],
        "{text}"
    );
}
