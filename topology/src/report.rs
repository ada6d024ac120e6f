//! The result of comparing a checkpointed topology with the local one: the mapping found,
//! or, when there is none, every check that failed and why.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bitset::BitSet;
use crate::checks::{CheckName, Checks, Disabled};
use crate::matching::{self, Matching};
use crate::model::{GpuId, Topology};
use crate::rules::{self, Mismatch};
use crate::search::{self, Assignment};
use crate::system::{Kind, System};

/// A GPU as reports name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRef {
    /// Its identity.
    #[serde(flatten)]
    pub id: GpuId,
    /// A short human name ("gfx942", "NVIDIA H100 80GB HBM3").
    pub name: String,
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.id, self.name)
    }
}

/// One checkpointed GPU and the local GPU it restores onto.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPair {
    /// The GPU in the image.
    pub saved: GpuRef,
    /// The GPU on this machine.
    pub local: GpuRef,
}

/// One checkpointed KFD CPU node and the local CPU node it maps to (NUMA rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPair {
    /// Node number in the image.
    pub saved: u32,
    /// Node number on this machine.
    pub local: u32,
}

/// Old GPU -> new GPU: what the plugin and the helper translate on restore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    /// Every checkpointed GPU, in the image's order.
    pub gpus: Vec<GpuPair>,
    /// CPU nodes, when the NUMA rule applied.
    #[serde(default)]
    pub cpu_nodes: Vec<CpuPair>,
}

impl Mapping {
    /// The local GPU for a checkpointed one.
    pub fn local_for(&self, saved: &GpuId) -> Option<&GpuId> {
        self.gpus
            .iter()
            .find(|p| &p.saved.id == saved)
            .map(|p| &p.local.id)
    }

    /// KFD `gpu_id` pairs (checkpointed, local), for KFD's restore.
    pub fn kfd_gpu_ids(&self) -> Vec<(u32, u32)> {
        self.gpus
            .iter()
            .filter_map(|p| match (&p.saved.id, &p.local.id) {
                (GpuId::Kfd { gpu_id: a, .. }, GpuId::Kfd { gpu_id: b, .. }) => Some((*a, *b)),
                _ => None,
            })
            .collect()
    }

    /// NVIDIA UUID pairs (checkpointed, local), for CUDA's restore.
    pub fn nvidia_uuids(&self) -> Vec<(String, String)> {
        self.gpus
            .iter()
            .filter_map(|p| match (&p.saved.id, &p.local.id) {
                (GpuId::Nvidia { uuid: a }, GpuId::Nvidia { uuid: b }) => {
                    Some((a.clone(), b.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

/// A check that was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DisabledCheck {
    /// The check.
    pub check: CheckName,
    /// Why.
    #[serde(flatten)]
    pub by: Disabled,
}

/// A reason no mapping exists that concerns the topology as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The check it is about, when one is.
    pub check: Option<CheckName>,
    /// What is wrong.
    pub message: String,
}

/// A local GPU of the same kind as a checkpointed one, and the checks the pair fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The local GPU.
    pub local: GpuRef,
    /// Failed checks (empty: the pair is compatible on its own).
    pub failed: Vec<Mismatch>,
}

/// A checkpointed GPU and how each local candidate compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuReport {
    /// The checkpointed GPU.
    pub saved: GpuRef,
    /// Local GPUs of the same kind.
    pub candidates: Vec<Candidate>,
}

/// The answer to "can this image's GPUs be restored here, and onto which GPUs?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Whether a mapping exists.
    pub compatible: bool,
    /// The mapping, when one exists.
    pub mapping: Option<Mapping>,
    /// Checks that were switched off.
    pub disabled_checks: Vec<DisabledCheck>,
    /// Topology-wide reasons (incompatible only).
    pub problems: Vec<Problem>,
    /// Each checkpointed GPU against each local candidate (incompatible only).
    pub gpus: Vec<GpuReport>,
    /// Checks whose removal alone would let a mapping exist (incompatible only).
    pub would_map_without: Vec<CheckName>,
    /// Things worth knowing that do not block the restore.
    pub notes: Vec<String>,
    /// How many steps the mapping search took (for benchmarks).
    #[serde(skip)]
    pub search_steps: u64,
}

fn gpu_ref(system: &System, index: usize) -> GpuRef {
    let gpu = &system.gpus[index];
    GpuRef {
        id: gpu.id.clone(),
        name: gpu.name.clone(),
    }
}

/// The `gpu_count` rule: reasons the GPU counts alone rule out a mapping.
fn count_problems(saved: &System, local: &System, checks: &Checks) -> Vec<Problem> {
    let mut problems = Vec::new();
    for kind in [Kind::Kfd, Kind::Nvidia] {
        let (ns, nl) = (saved.count(kind), local.count(kind));
        if ns == 0 {
            continue;
        }
        let message = if ns > nl {
            format!(
                "the image has {ns} {} GPU(s), this machine {nl}: every checkpointed GPU needs its own",
                kind.name()
            )
        } else if kind == Kind::Kfd && ns != nl && checks.enabled(CheckName::GpuCount) {
            format!(
                "the image has {ns} {} GPU(s), this machine {nl}: KFD restores a process onto \
                 every GPU it can see, so the counts must be equal (hide the others with a \
                 device cgroup, or skip this check)",
                kind.name()
            )
        } else {
            continue;
        };
        problems.push(Problem {
            check: Some(CheckName::GpuCount),
            message,
        });
    }
    problems
}

/// Count rule plus search: the mapping, if any.
fn solve(saved: &System, local: &System, checks: &Checks) -> (Option<Assignment>, u64) {
    if !count_problems(saved, local, checks).is_empty() {
        return (None, 0);
    }
    let outcome = search::search(saved, local, checks);
    (outcome.assignment, outcome.steps)
}

/// Only the mapping search, without the report: the mapping when one exists. [`check`]
/// finds the same mapping and explains a failure.
pub fn find_mapping(saved: &Topology, local: &Topology, checks: &Checks) -> Option<Mapping> {
    let saved_sys = System::new(saved);
    let local_sys = System::new(local);
    let (assignment, _) = solve(&saved_sys, &local_sys, checks);
    assignment.map(|a| mapping(&saved_sys, &local_sys, &a))
}

/// Compares the checkpointed topology with the local one.
pub fn check(saved: &Topology, local: &Topology, checks: &Checks) -> Report {
    let saved_sys = System::new(saved);
    let local_sys = System::new(local);
    let (assignment, steps) = solve(&saved_sys, &local_sys, checks);
    let mut report = Report {
        compatible: assignment.is_some(),
        mapping: assignment.map(|a| mapping(&saved_sys, &local_sys, &a)),
        disabled_checks: checks
            .disabled()
            .map(|(check, by)| DisabledCheck {
                check,
                by: by.clone(),
            })
            .collect(),
        problems: Vec::new(),
        gpus: Vec::new(),
        would_map_without: Vec::new(),
        notes: notes(&saved_sys, &local_sys, checks),
        search_steps: steps,
    };
    if !report.compatible {
        diagnose(&saved_sys, &local_sys, checks, &mut report);
    }
    report
}

fn mapping(saved: &System, local: &System, assignment: &Assignment) -> Mapping {
    Mapping {
        gpus: assignment
            .gpus
            .iter()
            .enumerate()
            .map(|(s, &d)| GpuPair {
                saved: gpu_ref(saved, s),
                local: gpu_ref(local, d),
            })
            .collect(),
        cpu_nodes: assignment
            .cpus
            .iter()
            .enumerate()
            .filter_map(|(x, y)| {
                Some(CpuPair {
                    saved: saved.cpus[x],
                    local: local.cpus[(*y)?],
                })
            })
            .collect(),
    }
}

fn notes(saved: &System, local: &System, checks: &Checks) -> Vec<String> {
    let mut notes: Vec<String> = checks.warnings().to_vec();
    let unknown = |system: &System| {
        system
            .gpus
            .iter()
            .any(|g| g.kind() == Kind::Nvidia && g.vram.is_none())
    };
    if checks.enabled(CheckName::VramSize)
        && saved.count(Kind::Nvidia) > 0
        && (unknown(saved) || unknown(local))
    {
        notes.push(
            "vram_size was not compared for NVIDIA GPUs whose memory size is unknown \
             (read without NVML)"
                .to_owned(),
        );
    }
    notes
}

/// Fills in why no mapping exists.
fn diagnose(saved: &System, local: &System, checks: &Checks, report: &mut Report) {
    report.problems = count_problems(saved, local, checks);

    // Pairwise comparison of every checkpointed GPU with every local one of its kind.
    let mut compat: Vec<BitSet> = Vec::new();
    for (s, sg) in saved.gpus.iter().enumerate() {
        let mut set = BitSet::new(local.gpus.len());
        let mut candidates = Vec::new();
        for (d, dg) in local.gpus.iter().enumerate() {
            if sg.kind() != dg.kind() {
                continue;
            }
            let failed = rules::compare(saved, sg, local, dg, checks);
            if failed.is_empty() {
                set.insert(d);
            }
            candidates.push(Candidate {
                local: gpu_ref(local, d),
                failed,
            });
        }
        if set.is_empty() {
            let message = if candidates.is_empty() {
                format!(
                    "checkpointed GPU {} has no local {} GPU to go to",
                    gpu_ref(saved, s),
                    sg.kind().name()
                )
            } else {
                format!(
                    "checkpointed GPU {} fails at least one check against every local GPU",
                    gpu_ref(saved, s)
                )
            };
            report.problems.push(Problem {
                check: None,
                message,
            });
        }
        report.gpus.push(GpuReport {
            saved: gpu_ref(saved, s),
            candidates,
        });
        compat.push(set);
    }
    let every_gpu_has_a_candidate = compat.iter().all(|c| !c.is_empty());

    if every_gpu_has_a_candidate {
        if let Matching::Deficient { rows, columns } =
            matching::match_rows(&compat, local.gpus.len())
        {
            if report.problems.is_empty() {
                let names = |sys: &System, idx: &[usize]| {
                    idx.iter()
                        .map(|&i| sys.gpus[i].id.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                report.problems.push(Problem {
                    check: None,
                    message: format!(
                        "{} checkpointed GPUs ({}) pass the checks only against {} local GPU(s) \
                         between them ({})",
                        rows.len(),
                        names(saved, &rows),
                        columns.len(),
                        names(local, &columns)
                    ),
                });
            }
        }
    }

    if checks.enabled(CheckName::XgmiHive) {
        report.problems.extend(hive_problems(saved, local, &compat));
    }

    // A pairwise check that no pair fails cannot be what blocks the mapping; only the
    // others are worth a search without them.
    let failing: Vec<CheckName> = report
        .gpus
        .iter()
        .flat_map(|g| g.candidates.iter())
        .flat_map(|c| c.failed.iter().map(|m| m.check))
        .collect();
    let global = [
        CheckName::CpuLinks,
        CheckName::Numa,
        CheckName::XgmiHive,
        CheckName::GpuCount,
    ];
    report.would_map_without = CheckName::ALL
        .iter()
        .copied()
        .filter(|&c| checks.enabled(c) && (global.contains(&c) || failing.contains(&c)))
        .filter(|&c| solve(saved, local, &checks.clone().without(c)).0.is_some())
        .collect();

    if report.problems.is_empty() && checks.enabled(CheckName::Numa) {
        let without = checks.clone().without(CheckName::Numa);
        if solve(saved, local, &without).0.is_some() {
            report.problems.push(Problem {
                check: Some(CheckName::Numa),
                message: format!(
                    "no mapping keeps the GPUs of each checkpointed CPU node together on one \
                     local CPU node (checkpointed: {}; local: {})",
                    numa_groups(saved),
                    numa_groups(local)
                ),
            });
        }
    }
    if report.problems.is_empty() {
        report.problems.push(Problem {
            check: None,
            message: "every checkpointed GPU has compatible local GPUs on its own, but no \
                      assignment satisfies all the checks together"
                .to_owned(),
        });
    }
}

/// "CPU node 0: 4 GPUs, CPU node 1: 4 GPUs".
fn numa_groups(system: &System) -> String {
    let groups: Vec<String> = system
        .cpus
        .iter()
        .enumerate()
        .map(|(c, node)| {
            let n = system
                .gpus
                .iter()
                .filter(|g| g.cpu_links.iter().any(|l| l.cpu == c))
                .count();
            format!("CPU node {node}: {n} GPU(s)")
        })
        .collect();
    if groups.is_empty() {
        "no CPU nodes".to_owned()
    } else {
        groups.join(", ")
    }
}

/// Hives that no local hive can hold on its own.
fn hive_problems(saved: &System, local: &System, compat: &[BitSet]) -> Vec<Problem> {
    let mut problems = Vec::new();
    if saved.hives.len() > local.hives.len() {
        problems.push(Problem {
            check: Some(CheckName::XgmiHive),
            message: format!(
                "the image has {} XGMI hive(s), this machine {}",
                saved.hives.len(),
                local.hives.len()
            ),
        });
    }
    for hive in &saved.hives {
        let fits = local.hives.iter().any(|members| {
            let rows: Vec<BitSet> = hive
                .iter()
                .map(|&s| {
                    let mut row = BitSet::new(local.gpus.len());
                    for &m in members {
                        if compat[s].contains(m) {
                            row.insert(m);
                        }
                    }
                    row
                })
                .collect();
            members.len() >= hive.len() && matching::is_complete(&rows, local.gpus.len())
        });
        if !fits {
            let sizes: Vec<String> = local.hives.iter().map(|h| h.len().to_string()).collect();
            let ids: Vec<String> = hive.iter().map(|&g| saved.gpus[g].id.to_string()).collect();
            problems.push(Problem {
                check: Some(CheckName::XgmiHive),
                message: format!(
                    "the XGMI hive of {} GPUs ({}) fits in no local hive (local hive sizes: {}) \
                     whose GPUs pass the device checks",
                    hive.len(),
                    ids.join(", "),
                    if sizes.is_empty() {
                        "none".to_owned()
                    } else {
                        sizes.join(", ")
                    }
                ),
            });
        }
    }
    problems
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mapping {
            Some(mapping) if self.compatible => {
                writeln!(
                    f,
                    "compatible: the image's {} GPU(s) can be restored on this machine",
                    mapping.gpus.len()
                )?;
                let width = mapping
                    .gpus
                    .iter()
                    .map(|p| p.saved.to_string().len())
                    .max()
                    .unwrap_or(0);
                for pair in &mapping.gpus {
                    writeln!(f, "  {:width$} -> {}", pair.saved.to_string(), pair.local)?;
                }
                for cpu in &mapping.cpu_nodes {
                    writeln!(f, "  CPU node {} -> CPU node {}", cpu.saved, cpu.local)?;
                }
            }
            _ => {
                writeln!(
                    f,
                    "incompatible: the image's GPUs cannot be mapped onto this machine's GPUs"
                )?;
                for problem in &self.problems {
                    match problem.check {
                        Some(check) => writeln!(f, "  {check}: {}", problem.message)?,
                        None => writeln!(f, "  {}", problem.message)?,
                    }
                }
                for gpu in &self.gpus {
                    writeln!(f, "checkpointed GPU {}:", gpu.saved)?;
                    if gpu.candidates.is_empty() {
                        writeln!(f, "  no local GPU of its kind")?;
                    }
                    for candidate in &gpu.candidates {
                        if candidate.failed.is_empty() {
                            writeln!(f, "  vs local {}: passes every check", candidate.local)?;
                            continue;
                        }
                        writeln!(f, "  vs local {}:", candidate.local)?;
                        for mismatch in &candidate.failed {
                            writeln!(f, "    {mismatch}")?;
                        }
                    }
                }
                if !self.would_map_without.is_empty() {
                    let hints: Vec<String> = self
                        .would_map_without
                        .iter()
                        .map(|c| match c.env_var() {
                            Some(var) => format!("{c} (--skip-check {c} or {var}=0)"),
                            None => format!("{c} (--skip-check {c})"),
                        })
                        .collect();
                    writeln!(
                        f,
                        "a mapping would exist without the check: {}",
                        hints.join(", ")
                    )?;
                }
            }
        }
        if !self.disabled_checks.is_empty() {
            let off: Vec<String> = self
                .disabled_checks
                .iter()
                .map(|d| format!("{} ({})", d.check, d.by))
                .collect();
            writeln!(f, "checks not applied: {}", off.join(", "))?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}
