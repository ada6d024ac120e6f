//! The reference the mapping search is tested against: try every injective assignment of
//! checkpointed GPUs to local GPUs (and every CPU node mapping), and test each against the
//! rules as written in `search.rs`'s documentation. Exponential, for small topologies only.

use crate::checks::{CheckName, Checks};
use crate::model::{IoLink, KfdNode, LinkType, MemBank, Properties, Topology};
use crate::rules::{self, cpu_link_matches};
use crate::search;
use crate::system::{Kind, System};

/// Whether the GPU counts allow a mapping at all.
fn counts_ok(saved: &System, local: &System, checks: &Checks) -> bool {
    [Kind::Kfd, Kind::Nvidia].iter().all(|&kind| {
        let (ns, nl) = (saved.count(kind), local.count(kind));
        ns <= nl
            && (kind != Kind::Kfd || ns == 0 || ns == nl || !checks.enabled(CheckName::GpuCount))
    })
}

/// Whether the GPU assignment `gpus` (checkpointed index -> local index) satisfies every
/// enabled rule, for some CPU node mapping.
pub(crate) fn valid(saved: &System, local: &System, checks: &Checks, gpus: &[usize]) -> bool {
    if gpus.len() != saved.gpus.len() || gpus.iter().any(|&d| d >= local.gpus.len()) {
        return false;
    }
    let mut seen = gpus.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != gpus.len() || !counts_ok(saved, local, checks) {
        return false;
    }
    for (s, &d) in gpus.iter().enumerate() {
        let (sg, dg) = (&saved.gpus[s], &local.gpus[d]);
        if sg.kind() != dg.kind() || !rules::compare(saved, sg, local, dg, checks).is_empty() {
            return false;
        }
    }
    if checks.enabled(CheckName::XgmiHive) {
        let mut used = Vec::new();
        for hive in &saved.hives {
            let targets: Vec<Option<usize>> =
                hive.iter().map(|&s| local.gpus[gpus[s]].hive).collect();
            let Some(first) = targets[0] else {
                return false;
            };
            if targets.iter().any(|t| *t != Some(first)) || used.contains(&first) {
                return false;
            }
            used.push(first);
        }
    }
    if checks.enabled(CheckName::Numa) {
        let mut cpus: Vec<usize> = saved
            .gpus
            .iter()
            .flat_map(|g| g.cpu_links.iter().map(|l| l.cpu))
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        let links_on = checks.enabled(CheckName::CpuLinks);
        let fits = |cpu_map: &[usize]| {
            saved.gpus.iter().enumerate().all(|(s, sg)| {
                sg.cpu_links.iter().all(|sl| {
                    let want = cpu_map[cpus.iter().position(|&c| c == sl.cpu).unwrap_or(0)];
                    local.gpus[gpus[s]]
                        .cpu_links
                        .iter()
                        .any(|dl| dl.cpu == want && (!links_on || cpu_link_matches(sl, dl)))
                })
            })
        };
        if !injections(cpus.len(), local.cpus.len())
            .iter()
            .any(|m| fits(m))
        {
            return false;
        }
    }
    true
}

/// Every injective map from `0..n` into `0..m`.
fn injections(n: usize, m: usize) -> Vec<Vec<usize>> {
    fn grow(prefix: &mut Vec<usize>, n: usize, m: usize, out: &mut Vec<Vec<usize>>) {
        if prefix.len() == n {
            out.push(prefix.clone());
            return;
        }
        for next in 0..m {
            if !prefix.contains(&next) {
                prefix.push(next);
                grow(prefix, n, m, out);
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    grow(&mut Vec::new(), n, m, &mut out);
    out
}

/// Whether any mapping exists, by trying them all.
pub(crate) fn exists(saved: &System, local: &System, checks: &Checks) -> bool {
    injections(saved.gpus.len(), local.gpus.len())
        .iter()
        .any(|gpus| valid(saved, local, checks, gpus))
}

/// SplitMix64: a small seeded generator, so every run tests the same topologies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A GPU's traits in a generated machine.
#[derive(Clone)]
struct GenGpu {
    device_id: u64,
    fw: u64,
    vram_gib: u64,
    hive: usize,
    cpus: Vec<(usize, LinkType, bool)>,
}

fn random_gpus(rng: &mut Rng, n: usize, cpus: usize) -> Vec<GenGpu> {
    let mut hive = 0;
    (0..n)
        .map(|i| {
            if i > 0 && !rng.chance(40) {
                hive += 1;
            }
            GenGpu {
                device_id: 0xd000 + rng.below(2),
                fw: 1 + rng.below(3),
                vram_gib: 16 << rng.below(2),
                hive,
                cpus: random_cpu_links(rng, cpus),
            }
        })
        .collect()
}

/// Usually one link to a CPU node, sometimes none or two.
fn random_cpu_links(rng: &mut Rng, cpus: usize) -> Vec<(usize, LinkType, bool)> {
    let count = match rng.below(100) {
        0..=9 => 0,
        10..=84 => 1,
        _ => 2,
    };
    let mut links: Vec<(usize, LinkType, bool)> = Vec::new();
    for _ in 0..count {
        let cpu = rng.below(cpus as u64) as usize;
        if links.iter().any(|l| l.0 == cpu) {
            continue;
        }
        let kind = if rng.chance(15) {
            LinkType::Xgmi
        } else {
            LinkType::Pcie
        };
        links.push((cpu, kind, rng.chance(70)));
    }
    links
}

/// Builds the KFD tree of `cpus` CPU nodes and `gpus`: hives fully meshed with XGMI
/// (sometimes a direction missing), a few PCIe peer links, CPU links as generated.
fn build(rng: &mut Rng, cpus: usize, gpus: &[GenGpu]) -> Topology {
    let mut nodes: Vec<KfdNode> = (0..cpus)
        .map(|c| KfdNode {
            node: c as u32,
            properties: Properties::from([("cpu_cores_count", 16)]),
            ..KfdNode::default()
        })
        .collect();
    for (i, g) in gpus.iter().enumerate() {
        nodes.push(KfdNode {
            node: (cpus + i) as u32,
            gpu_id: 0x1000 + i as u32,
            name: "gen".to_owned(),
            properties: Properties::from([
                ("device_id", g.device_id),
                ("vendor_id", 0x1002),
                ("fw_version", g.fw),
            ]),
            mem_banks: vec![MemBank {
                properties: Properties::from([
                    ("heap_type", 1),
                    ("size_in_bytes", g.vram_gib << 30),
                ]),
            }],
            ..KfdNode::default()
        });
    }
    for (i, g) in gpus.iter().enumerate() {
        let me = cpus + i;
        for &(cpu, kind, back) in &g.cpus {
            nodes[me]
                .io_links
                .push(IoLink::new(kind, me as u32, cpu as u32));
            if back {
                nodes[cpu]
                    .io_links
                    .push(IoLink::new(kind, cpu as u32, me as u32));
            }
        }
        for (j, h) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            let other = (cpus + j) as u32;
            if g.hive == h.hive {
                if !rng.chance(8) {
                    nodes[me]
                        .io_links
                        .push(IoLink::new(LinkType::Xgmi, me as u32, other));
                }
            } else if rng.chance(15) {
                nodes[me]
                    .io_links
                    .push(IoLink::new(LinkType::Pcie, me as u32, other));
            }
        }
    }
    Topology {
        kfd_nodes: nodes,
        nvidia_gpus: Vec::new(),
    }
}

/// A local machine made from the checkpointed one: GPUs shuffled, some traits changed.
fn perturb(rng: &mut Rng, gpus: &[GenGpu], cpus: usize, extra: usize) -> Vec<GenGpu> {
    let mut out = gpus.to_vec();
    for g in &mut out {
        for link in &mut g.cpus {
            link.0 %= cpus;
        }
        g.cpus.dedup_by_key(|l| l.0);
    }
    for i in (1..out.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        out.swap(i, j);
    }
    for g in &mut out {
        if rng.chance(12) {
            g.device_id ^= 1;
        }
        if rng.chance(20) {
            g.fw = 1 + rng.below(3);
        }
        if rng.chance(15) {
            g.vram_gib = 16 << rng.below(2);
        }
        if rng.chance(15) {
            g.cpus = random_cpu_links(rng, cpus);
        }
        if rng.chance(10) {
            g.hive = 100 + rng.below(3) as usize;
        }
    }
    if rng.chance(10) {
        // One large hive where the checkpointed machine had several.
        for g in &mut out {
            g.hive = 0;
        }
    }
    out.extend(random_gpus(rng, extra, cpus));
    out
}

#[test]
fn search_agrees_with_exhaustive_search_on_random_topologies() {
    let mut rng = Rng(0x6770_7563_7200_0004);
    let (mut found, mut none) = (0, 0);
    for case in 0..3000 {
        let n = 1 + rng.below(if case % 10 == 0 { 6 } else { 5 }) as usize;
        let (saved_cpus, local_cpus) = (1 + rng.below(2) as usize, 1 + rng.below(3) as usize);
        let mut checks = Checks::all();
        for check in [
            CheckName::Numa,
            CheckName::XgmiHive,
            CheckName::CpuLinks,
            CheckName::IoLinksCount,
            CheckName::FwVersion,
            CheckName::GpuCount,
        ] {
            if rng.chance(25) {
                checks = checks.without(check);
            }
        }
        let extra = if checks.enabled(CheckName::GpuCount) {
            0
        } else {
            rng.below(2) as usize
        };
        let saved_gpus = random_gpus(&mut rng, n, saved_cpus);
        let local_gpus = if rng.chance(75) {
            perturb(&mut rng, &saved_gpus, local_cpus, extra)
        } else {
            random_gpus(&mut rng, n + extra, local_cpus)
        };
        let saved = build(&mut rng, saved_cpus, &saved_gpus);
        let local = build(&mut rng, local_cpus, &local_gpus);
        let (saved_sys, local_sys) = (System::new(&saved), System::new(&local));

        let expected = exists(&saved_sys, &local_sys, &checks);
        let outcome = if counts_ok(&saved_sys, &local_sys, &checks) {
            search::search(&saved_sys, &local_sys, &checks).assignment
        } else {
            None
        };
        assert_eq!(
            outcome.is_some(),
            expected,
            "case {case}: search and exhaustive search disagree\nsaved: {saved:#?}\nlocal: {local:#?}\nchecks: {checks:?}"
        );
        if let Some(assignment) = &outcome {
            assert!(
                valid(&saved_sys, &local_sys, &checks, &assignment.gpus),
                "case {case}: the search returned an invalid mapping {assignment:?}"
            );
            found += 1;
        } else {
            none += 1;
        }
        // The public entry point agrees.
        assert_eq!(crate::check(&saved, &local, &checks).compatible, expected);
    }
    // Both outcomes must be well represented, or the comparison proves little.
    assert!(found > 600 && none > 600, "found {found}, none {none}");
}

#[test]
fn injections_are_complete() {
    assert_eq!(injections(2, 3).len(), 6);
    assert_eq!(injections(3, 3).len(), 6);
    assert_eq!(injections(0, 2), vec![Vec::<usize>::new()]);
    assert!(injections(3, 2).is_empty());
}
