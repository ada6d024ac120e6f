//! Times the GPU mapping search on 8->8 and 16->16 topologies, including cases built to
//! make a backtracking search work hardest.
//!
//! Run: `cargo run --release -p gpucr-topology --example bench_mapping`
//!
//! For each case it prints the search time (`find_mapping`: the count rule and the
//! search, what a restore runs before it starts) and the full report time (`check`: the
//! search plus, when there is no mapping, the explanation, which searches again once per
//! check to list the checks whose removal would help), as the median and the maximum over
//! repeated runs, and the number of search steps.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpucr_topology::{
    check, find_mapping, read_local, Checks, IoLink, KfdNode, LinkType, MemBank, Properties,
    Topology,
};

/// A KFD machine: `cpus` CPU nodes, GPUs given as (fw_version, cpu, hive), hives fully
/// meshed with XGMI, every GPU linked both ways to its CPU node by PCIe.
fn machine(cpus: u32, gpus: &[(u64, u32, Option<u32>)]) -> Topology {
    let mut nodes: Vec<KfdNode> = (0..cpus)
        .map(|c| KfdNode {
            node: c,
            properties: Properties::from([("cpu_cores_count", 64)]),
            ..KfdNode::default()
        })
        .collect();
    for (i, &(fw, cpu, _)) in gpus.iter().enumerate() {
        let node = cpus + i as u32;
        nodes.push(KfdNode {
            node,
            gpu_id: 1000 + node,
            name: "ip discovery".to_owned(),
            properties: Properties::from([
                ("vendor_id", 0x1002),
                ("device_id", 0x74a1),
                ("simd_count", 1216),
                ("fw_version", fw),
            ]),
            mem_banks: vec![MemBank {
                properties: Properties::from([("heap_type", 1), ("size_in_bytes", 192 << 30)]),
            }],
            io_links: vec![IoLink::new(LinkType::Pcie, node, cpu)],
            ..KfdNode::default()
        });
        nodes[cpu as usize]
            .io_links
            .push(IoLink::new(LinkType::Pcie, cpu, node));
    }
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i != j && a.2.is_some() && a.2 == b.2 {
                let (from, to) = (cpus + i as u32, cpus + j as u32);
                nodes[from as usize]
                    .io_links
                    .push(IoLink::new(LinkType::Xgmi, from, to));
            }
        }
    }
    Topology {
        kfd_nodes: nodes,
        nvidia_gpus: Vec::new(),
    }
}

/// `n` GPUs, firmware `fw(i)`, CPU node `cpu(i)`, hive `hive(i)`.
fn gpus(
    n: usize,
    fw: impl Fn(usize) -> u64,
    cpu: impl Fn(usize) -> u32,
    hive: impl Fn(usize) -> Option<u32>,
) -> Vec<(u64, u32, Option<u32>)> {
    (0..n).map(|i| (fw(i), cpu(i), hive(i))).collect()
}

struct Case {
    name: String,
    saved: Topology,
    local: Topology,
}

fn fixture(name: &str) -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/topology")
        .join(name);
    read_local(Some(&root)).expect("fixture")
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |name: &str, saved: Topology, local: Topology| {
        cases.push(Case {
            name: name.to_owned(),
            saved,
            local,
        })
    };
    let mi300x = fixture("mi300x-8x");
    add("8->8 MI300X fixture onto itself", mi300x.clone(), mi300x);
    let mi250x = fixture("mi250x-8gcd");
    add(
        "8->8 MI250X GCD fixture onto itself",
        mi250x.clone(),
        mi250x,
    );

    // 8 -> 8, worst cases.
    add(
        "8->8 pigeonhole: 7 GPUs fit only 6 (no mapping)",
        machine(1, &gpus(8, |i| if i < 7 { 2 } else { 1 }, |_| 0, |_| None)),
        machine(1, &gpus(8, |i| if i < 6 { 2 } else { 1 }, |_| 0, |_| None)),
    );
    add(
        "8->8 NUMA 4+4 onto 5+3 (no mapping)",
        machine(2, &gpus(8, |_| 1, |i| (i / 4) as u32, |_| None)),
        machine(2, &gpus(8, |_| 1, |i| u32::from(i >= 5), |_| None)),
    );
    add(
        "8->8 firmware staircase, reversed (one mapping)",
        machine(1, &gpus(8, |i| i as u64, |_| 0, |_| None)),
        machine(1, &gpus(8, |i| 7 - i as u64, |_| 0, |_| None)),
    );

    // 16 -> 16.
    let four_hives = |fw: &dyn Fn(usize) -> u64| {
        machine(
            2,
            &gpus(16, fw, |i| (i / 8) as u32, |i| Some((i / 4) as u32)),
        )
    };
    add(
        "16->16 four XGMI hives of 4, two sockets, onto itself",
        four_hives(&|_| 1),
        four_hives(&|_| 1),
    );
    add(
        "16->16 four hives, hive order reversed by firmware (one mapping)",
        four_hives(&|i| (i / 4) as u64),
        four_hives(&|i| 3 - (i / 4) as u64),
    );
    add(
        "16->16 four hives, one local GPU too old (no mapping)",
        four_hives(&|i| 1 + i as u64),
        four_hives(&|i| if i == 13 { 0 } else { 1 + i as u64 }),
    );
    add(
        "16->16 pigeonhole: 15 GPUs fit only 14 (no mapping)",
        machine(
            1,
            &gpus(16, |i| if i < 15 { 2 } else { 1 }, |_| 0, |_| None),
        ),
        machine(
            1,
            &gpus(16, |i| if i < 14 { 2 } else { 1 }, |_| 0, |_| None),
        ),
    );
    add(
        "16->16 NUMA 8+8 onto 9+7 (no mapping)",
        machine(2, &gpus(16, |_| 1, |i| (i / 8) as u32, |_| None)),
        machine(2, &gpus(16, |_| 1, |i| u32::from(i >= 9), |_| None)),
    );
    add(
        "16->16 NUMA 8+8 onto 9+7, every firmware distinct (no mapping)",
        machine(2, &gpus(16, |i| i as u64, |i| (i / 8) as u32, |_| None)),
        machine(
            2,
            &gpus(16, |i| 16 + i as u64, |i| u32::from(i >= 9), |_| None),
        ),
    );
    add(
        "16->16 four hives of 2 onto two hives of 4, distinct firmware (no mapping)",
        machine(
            2,
            &gpus(
                16,
                |i| i as u64,
                |i| (i / 8) as u32,
                |i| (i < 8).then_some((i / 2) as u32),
            ),
        ),
        machine(
            2,
            &gpus(
                16,
                |i| 16 + i as u64,
                |i| (i / 8) as u32,
                |i| (i < 8).then_some((i / 4) as u32),
            ),
        ),
    );
    add(
        "16->16 two hives of 4 onto four hives of 2, NUMA, distinct firmware (no mapping)",
        machine(
            2,
            &gpus(
                16,
                |i| i as u64,
                |i| (i / 8) as u32,
                |i| (i < 8).then_some((i / 4) as u32),
            ),
        ),
        machine(
            2,
            &gpus(
                16,
                |i| 16 + i as u64,
                |i| (i / 8) as u32,
                |i| (i < 8).then_some((i / 2) as u32),
            ),
        ),
    );
    add(
        "16->16 firmware staircase, reversed, 4 NUMA nodes (one mapping)",
        machine(4, &gpus(16, |i| i as u64, |i| (i % 4) as u32, |_| None)),
        machine(
            4,
            &gpus(16, |i| 15 - i as u64, |i| (3 - i % 4) as u32, |_| None),
        ),
    );
    cases
}

/// Runs `f` repeatedly (at least 20 times, until 0.3 s or 2000 runs) and returns the
/// median and the 95th percentile.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration) {
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 20
        || (start.elapsed() < Duration::from_millis(300) && samples.len() < 2000)
    {
        let t = Instant::now();
        std::hint::black_box(f());
        samples.push(t.elapsed());
    }
    samples.sort();
    (
        samples[samples.len() / 2],
        samples[samples.len() * 95 / 100],
    )
}

/// SplitMix64, seeded: the random cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// A random machine of `n` GPUs: firmware 0-3, 2 or 4 CPU nodes, hives of 2, 4 or 8.
fn random_machine(rng: &mut Rng, n: usize) -> Topology {
    let cpus = [2, 4][rng.below(2) as usize];
    let hive_size = [1, 2, 4, 8][rng.below(4) as usize];
    let list = gpus(
        n,
        |_| 0,
        |_| 0,
        |i| (hive_size > 1).then_some((i / hive_size) as u32),
    );
    let list: Vec<_> = list
        .into_iter()
        .map(|(_, _, hive)| (rng.below(4), rng.below(cpus as u64) as u32, hive))
        .collect();
    machine(cpus, &list)
}

/// Of many random `n`->`n` cases: how many have a mapping, and the case whose search
/// took the most steps, timed like the others (median and 95th percentile).
fn random_worst(n: usize, count: usize) -> (usize, u64, Duration, Duration) {
    let checks = Checks::all();
    let mut rng = Rng(0x6770_7563_7200_0016);
    let mut found = 0;
    let mut worst: Option<(u64, Topology, Topology)> = None;
    for _ in 0..count {
        let saved = random_machine(&mut rng, n);
        let local = random_machine(&mut rng, n);
        let report = check(&saved, &local, &checks);
        found += usize::from(report.compatible);
        if worst.as_ref().is_none_or(|w| report.search_steps > w.0) {
            worst = Some((report.search_steps, saved, local));
        }
    }
    let (steps, saved, local) = worst.expect("at least one case");
    let (median, p95) = time(|| find_mapping(&saved, &local, &checks));
    (found, steps, median, p95)
}

fn main() {
    let checks = Checks::all();
    println!(
        "| case | mapping | search median | search p95 | report median | report p95 | search steps |"
    );
    println!("|---|---|---|---|---|---|---|");
    for case in cases() {
        let report = check(&case.saved, &case.local, &checks);
        let found = find_mapping(&case.saved, &case.local, &checks);
        assert_eq!(found.is_some(), report.compatible, "{}", case.name);
        let (search_median, search_max) = time(|| find_mapping(&case.saved, &case.local, &checks));
        let (report_median, report_max) = time(|| check(&case.saved, &case.local, &checks));
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            case.name,
            if report.compatible { "found" } else { "none" },
            us(search_median),
            us(search_max),
            us(report_median),
            us(report_max),
            report.search_steps
        );
    }
    println!();
    println!("| random cases | with a mapping | most search steps | that search median | p95 |");
    println!("|---|---|---|---|---|");
    for n in [8, 16] {
        let count = 2000;
        let (found, steps, median, p95) = random_worst(n, count);
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {count} random {n}->{n} | {found} | {steps} | {} | {} |",
            us(median),
            us(p95)
        );
    }
}
