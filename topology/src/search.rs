//! The mapping search: an assignment of every checkpointed GPU to its own local GPU (and of
//! the CPU nodes they link to, for the NUMA rule) that satisfies every enabled check.
//!
//! It is a backtracking search like CRIU's `set_restore_gpu_maps`, XGMI hives first, but
//! complete: it finds a mapping whenever one exists. The differences:
//!
//! * one search over hives and the remaining GPUs together, so a choice made for a hive can
//!   be undone when the other GPUs cannot be placed (CRIU never revisits a matched hive,
//!   and keeps the GPU mappings of a hive it backed out of);
//! * CPU node choices for the NUMA rule are branched on, not taken greedily;
//! * a hive only goes to a local hive at least as large (CRIU's size test never fires);
//! * pruning that keeps it fast without losing solutions: at every step, bipartite
//!   matching tests (remaining GPUs onto distinct candidates, unplaced hives onto distinct
//!   local hives that can hold them, unmapped CPU nodes onto distinct reachable local CPU
//!   nodes); the most constrained GPU first; and only one of a set of interchangeable local
//!   GPUs tried at each step.
//!
//! What makes a mapping valid, exactly:
//! 1. each checkpointed GPU gets a distinct local GPU of the same kind that passes every
//!    enabled pairwise check ([`crate::rules`]);
//! 2. `xgmi_hive`: the GPUs of each checkpointed hive land in one local hive, and different
//!    hives in different local hives;
//! 3. `numa`: each checkpointed CPU node linked to a GPU maps to a distinct local CPU node,
//!    and every GPU link to a CPU node has a counterpart from the mapped GPU to the mapped
//!    CPU node (matching as `cpu_links` requires, when that check is on).

use std::collections::HashMap;

use crate::bitset::BitSet;
use crate::checks::{CheckName, Checks};
use crate::matching;
use crate::rules::{self, cpu_link_matches};
use crate::system::System;

/// A complete mapping, by index into the two systems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// Local GPU of each checkpointed GPU.
    pub gpus: Vec<usize>,
    /// Local CPU node of each checkpointed CPU node (NUMA rule only).
    pub cpus: Vec<Option<usize>>,
}

/// The search's answer and how much work it did.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub assignment: Option<Assignment>,
    /// Search nodes visited.
    pub steps: u64,
}

/// What makes local GPUs interchangeable: which checkpointed GPUs may use it, its hive,
/// and the CPU nodes each link of each checkpointed GPU could map to through it.
type Signature = (Vec<bool>, Option<usize>, Vec<BitSet>);

/// The fixed data of one search.
struct Instance {
    n_local: usize,
    n_local_cpus: usize,
    /// Pairwise candidates of each checkpointed GPU.
    compat: Vec<BitSet>,
    hives_on: bool,
    numa_on: bool,
    saved_hive: Vec<Option<usize>>,
    /// Checkpointed GPUs of each checkpointed hive.
    saved_hives: Vec<Vec<usize>>,
    /// For each checkpointed hive, the local hives large enough to hold it.
    eligible_hives: Vec<Vec<usize>>,
    local_hive_members: Vec<BitSet>,
    local_hive_of: Vec<Option<usize>>,
    /// Checkpointed CPU node index of each CPU link of each checkpointed GPU.
    saved_links: Vec<Vec<usize>>,
    /// For each checkpointed CPU node, the (GPU, link) pairs that point to it.
    links_to_cpu: Vec<Vec<(usize, usize)>>,
    /// `options[s][d][k]`: local CPU nodes that link `k` of `s` may map to through `d`.
    options: Vec<Vec<Vec<BitSet>>>,
    /// Interchangeable local GPUs share a class.
    class: Vec<usize>,
    /// The local GPU with the same identity, tried first (a restore on the machine it was
    /// dumped on keeps every GPU).
    same_id: Vec<Option<usize>>,
}

impl Instance {
    fn new(saved: &System, local: &System, checks: &Checks) -> Instance {
        let n_local = local.gpus.len();
        let n_local_cpus = local.cpus.len();
        let hives_on = checks.enabled(CheckName::XgmiHive);
        let numa_on = checks.enabled(CheckName::Numa);
        let links_on = checks.enabled(CheckName::CpuLinks);

        let options: Vec<Vec<Vec<BitSet>>> = saved
            .gpus
            .iter()
            .map(|s| {
                local
                    .gpus
                    .iter()
                    .map(|d| {
                        s.cpu_links
                            .iter()
                            .map(|sl| {
                                let mut set = BitSet::new(n_local_cpus);
                                for dl in &d.cpu_links {
                                    if !links_on || cpu_link_matches(sl, dl) {
                                        set.insert(dl.cpu);
                                    }
                                }
                                set
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();

        let compat = saved
            .gpus
            .iter()
            .enumerate()
            .map(|(si, s)| {
                let mut set = BitSet::new(n_local);
                for (di, d) in local.gpus.iter().enumerate() {
                    let ok = s.kind() == d.kind()
                        && rules::compare(saved, s, local, d, checks).is_empty()
                        && (!numa_on || options[si][di].iter().all(|o| !o.is_empty()));
                    if ok {
                        set.insert(di);
                    }
                }
                set
            })
            .collect();

        let local_hive_members = local
            .hives
            .iter()
            .map(|members| {
                let mut set = BitSet::new(n_local);
                for &m in members {
                    set.insert(m);
                }
                set
            })
            .collect();
        let eligible_hives = saved
            .hives
            .iter()
            .map(|h| {
                (0..local.hives.len())
                    .filter(|&lh| local.hives[lh].len() >= h.len())
                    .collect()
            })
            .collect();

        let saved_links = saved
            .gpus
            .iter()
            .map(|g| g.cpu_links.iter().map(|l| l.cpu).collect())
            .collect();

        // Interchangeable local GPUs: same candidates column, same hive, same CPU options.
        let mut class_of_signature: HashMap<Signature, usize> = HashMap::new();
        let compat_ref: &Vec<BitSet> = &compat;
        let class = (0..n_local)
            .map(|d| {
                let column = compat_ref.iter().map(|c| c.contains(d)).collect();
                let opts = options
                    .iter()
                    .flat_map(|per_local| per_local[d].iter().cloned())
                    .collect();
                let next = class_of_signature.len();
                *class_of_signature
                    .entry((column, local.gpus[d].hive, opts))
                    .or_insert(next)
            })
            .collect();

        Instance {
            n_local,
            n_local_cpus,
            compat,
            hives_on,
            numa_on,
            saved_hive: saved.gpus.iter().map(|g| g.hive).collect(),
            saved_hives: saved.hives.clone(),
            links_to_cpu: (0..saved.cpus.len())
                .map(|x| {
                    saved
                        .gpus
                        .iter()
                        .enumerate()
                        .flat_map(|(s, g)| {
                            g.cpu_links
                                .iter()
                                .enumerate()
                                .filter(move |(_, l)| l.cpu == x)
                                .map(move |(k, _)| (s, k))
                        })
                        .collect()
                })
                .collect(),
            eligible_hives,
            local_hive_members,
            local_hive_of: local.gpus.iter().map(|g| g.hive).collect(),
            saved_links,
            options,
            class,
            same_id: saved
                .gpus
                .iter()
                .map(|s| local.gpus.iter().position(|d| d.id == s.id))
                .collect(),
        }
    }
}

/// The partial mapping being extended.
struct State {
    gpu: Vec<Option<usize>>,
    used: BitSet,
    hive_map: Vec<Option<usize>>,
    hive_used: Vec<bool>,
    cpu_map: Vec<Option<usize>>,
    cpu_used: BitSet,
    steps: u64,
}

/// Searches for a mapping of `saved`'s GPUs onto `local`'s. The caller has applied the
/// `gpu_count` rule.
pub(crate) fn search(saved: &System, local: &System, checks: &Checks) -> Outcome {
    let inst = Instance::new(saved, local, checks);
    let mut state = State {
        gpu: vec![None; saved.gpus.len()],
        used: BitSet::new(inst.n_local),
        hive_map: vec![None; saved.hives.len()],
        hive_used: vec![false; local.hives.len()],
        cpu_map: vec![None; saved.cpus.len()],
        cpu_used: BitSet::new(inst.n_local_cpus),
        steps: 0,
    };
    let assignment = if extend(&inst, &mut state) {
        // Complete: every checkpointed GPU has its local GPU.
        state
            .gpu
            .iter()
            .copied()
            .collect::<Option<Vec<usize>>>()
            .map(|gpus| Assignment {
                gpus,
                cpus: state.cpu_map.clone(),
            })
    } else {
        None
    };
    Outcome {
        assignment,
        steps: state.steps,
    }
}

/// The local GPUs `s` may take next, given the partial mapping.
fn candidates(inst: &Instance, st: &State, s: usize) -> BitSet {
    let mut cand = inst.compat[s].clone();
    cand.subtract(&st.used);
    if inst.hives_on {
        if let Some(h) = inst.saved_hive[s] {
            match st.hive_map[h] {
                Some(lh) => cand.intersect(&inst.local_hive_members[lh]),
                None => {
                    let mut allowed = BitSet::new(inst.n_local);
                    for &lh in &inst.eligible_hives[h] {
                        if !st.hive_used[lh] {
                            allowed.union(&inst.local_hive_members[lh]);
                        }
                    }
                    cand.intersect(&allowed);
                }
            }
        }
    }
    if inst.numa_on && !inst.saved_links[s].is_empty() {
        for d in cand.clone().iter() {
            let ok = inst.saved_links[s].iter().enumerate().all(|(k, &x)| {
                let opts = &inst.options[s][d][k];
                match st.cpu_map[x] {
                    Some(y) => opts.contains(y),
                    None => {
                        let mut free = opts.clone();
                        free.subtract(&st.cpu_used);
                        !free.is_empty()
                    }
                }
            });
            if !ok {
                cand.remove(d);
            }
        }
    }
    cand
}

/// The ways to map the not yet mapped CPU nodes that `s` links to, when `s` goes to `d`.
fn cpu_choices(inst: &Instance, st: &State, s: usize, d: usize) -> Vec<Vec<(usize, usize)>> {
    if !inst.numa_on {
        return vec![Vec::new()];
    }
    // For each unmapped checkpointed CPU node, the local nodes every link to it allows.
    let mut pending: Vec<(usize, BitSet)> = Vec::new();
    for (k, &x) in inst.saved_links[s].iter().enumerate() {
        let opts = &inst.options[s][d][k];
        if let Some(y) = st.cpu_map[x] {
            if !opts.contains(y) {
                return Vec::new();
            }
            continue;
        }
        match pending.iter_mut().find(|(px, _)| *px == x) {
            Some((_, allowed)) => allowed.intersect(opts),
            None => {
                let mut allowed = opts.clone();
                allowed.subtract(&st.cpu_used);
                pending.push((x, allowed));
            }
        }
    }
    let mut combos: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
    for (x, allowed) in pending {
        combos = combos
            .into_iter()
            .flat_map(|combo| {
                allowed
                    .iter()
                    .filter(|y| !combo.iter().any(|&(_, taken)| taken == *y))
                    .map(|y| {
                        let mut next = combo.clone();
                        next.push((x, y));
                        next
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    combos
}

/// Whether the CPU nodes not mapped yet can each get their own free local CPU node that
/// every GPU linked to them can reach through one of its candidates.
fn cpus_can_map(inst: &Instance, st: &State, cand_of: &[Option<&BitSet>]) -> bool {
    if !inst.numa_on {
        return true;
    }
    let mut rows = Vec::new();
    for (x, links) in inst.links_to_cpu.iter().enumerate() {
        if st.cpu_map[x].is_some() || links.is_empty() {
            continue;
        }
        let mut allowed = BitSet::new(inst.n_local_cpus);
        for y in 0..inst.n_local_cpus {
            if !st.cpu_used.contains(y) {
                allowed.insert(y);
            }
        }
        for &(s, k) in links {
            // A GPU linked to an unmapped CPU node is itself unmapped.
            let Some(cand) = cand_of[s] else { continue };
            let mut reach = BitSet::new(inst.n_local_cpus);
            for d in cand.iter() {
                reach.union(&inst.options[s][d][k]);
            }
            allowed.intersect(&reach);
        }
        rows.push(allowed);
    }
    matching::is_complete(&rows, inst.n_local_cpus)
}

/// Whether the hives not placed yet can each get their own unused local hive that holds
/// all of their GPUs.
fn hives_can_map(inst: &Instance, st: &State, cand_of: &[Option<&BitSet>]) -> bool {
    if !inst.hives_on {
        return true;
    }
    let n_hives = inst.local_hive_members.len();
    let mut rows = Vec::new();
    for (h, members) in inst.saved_hives.iter().enumerate() {
        if st.hive_map[h].is_some() {
            continue;
        }
        let mut fits = BitSet::new(n_hives);
        for &lh in &inst.eligible_hives[h] {
            if st.hive_used[lh] {
                continue;
            }
            let gpu_rows: Vec<BitSet> = members
                .iter()
                .map(|&s| {
                    let mut row = cand_of[s]
                        .cloned()
                        .unwrap_or_else(|| BitSet::new(inst.n_local));
                    row.intersect(&inst.local_hive_members[lh]);
                    row
                })
                .collect();
            if matching::is_complete(&gpu_rows, inst.n_local) {
                fits.insert(lh);
            }
        }
        rows.push(fits);
    }
    matching::is_complete(&rows, n_hives)
}

fn extend(inst: &Instance, st: &mut State) -> bool {
    st.steps += 1;
    let open: Vec<usize> = (0..st.gpu.len()).filter(|&s| st.gpu[s].is_none()).collect();
    if open.is_empty() {
        return true;
    }
    let cands: Vec<BitSet> = open.iter().map(|&s| candidates(inst, st, s)).collect();
    if cands.iter().any(BitSet::is_empty) || !matching::is_complete(&cands, inst.n_local) {
        return false;
    }
    let mut cand_of: Vec<Option<&BitSet>> = vec![None; st.gpu.len()];
    for (i, &s) in open.iter().enumerate() {
        cand_of[s] = Some(&cands[i]);
    }
    if !cpus_can_map(inst, st, &cand_of) || !hives_can_map(inst, st, &cand_of) {
        return false;
    }
    // Hives first, then the most constrained GPU.
    let in_hive = |i: usize| inst.hives_on && inst.saved_hive[open[i]].is_some();
    let any_hive = (0..open.len()).any(in_hive);
    let pick = (0..open.len())
        .filter(|&i| !any_hive || in_hive(i))
        .min_by_key(|&i| cands[i].len())
        .unwrap_or(0);
    let s = open[pick];

    let preferred = inst.same_id[s].filter(|&d| cands[pick].contains(d));
    let order = preferred
        .into_iter()
        .chain(cands[pick].iter().filter(|&d| Some(d) != preferred));
    let mut tried_classes: Vec<usize> = Vec::new();
    for d in order {
        if tried_classes.contains(&inst.class[d]) {
            continue;
        }
        tried_classes.push(inst.class[d]);
        for combo in cpu_choices(inst, st, s, d) {
            // Apply.
            st.gpu[s] = Some(d);
            st.used.insert(d);
            let mut claimed_hive = None;
            if inst.hives_on {
                if let (Some(h), Some(lh)) = (inst.saved_hive[s], inst.local_hive_of[d]) {
                    if st.hive_map[h].is_none() {
                        st.hive_map[h] = Some(lh);
                        st.hive_used[lh] = true;
                        claimed_hive = Some((h, lh));
                    }
                }
            }
            for &(x, y) in &combo {
                st.cpu_map[x] = Some(y);
                st.cpu_used.insert(y);
            }
            if extend(inst, st) {
                return true;
            }
            // Undo.
            for &(x, y) in &combo {
                st.cpu_map[x] = None;
                st.cpu_used.remove(y);
            }
            if let Some((h, lh)) = claimed_hive {
                st.hive_map[h] = None;
                st.hive_used[lh] = false;
            }
            st.used.remove(d);
            st.gpu[s] = None;
        }
    }
    false
}
