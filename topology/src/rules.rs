//! The checks that compare one checkpointed GPU with one local GPU (CRIU's
//! `device_properties_match` and the CPU-link part of `map_device`).
//!
//! Differences from CRIU, on purpose:
//! * `io_links_count` is not compared for equality (the raw count includes links a
//!   "more capable" machine has in addition); the local GPU must have at least as many
//!   valid PCIe/XGMI links, which is CRIU's own second test.
//! * every failing check is listed with both values, not just "no match".

use std::fmt;

use serde::Serialize;

use crate::checks::{CheckName, Checks, Requirement};
use crate::model::LinkType;
use crate::properties::{AT_LEAST_PROPERTIES, EQUAL_PROPERTIES};
use crate::system::{CpuLink, Device, Gpu, System};

/// A value a check compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Value {
    /// A number (a property, a size in bytes, a count).
    Number(u64),
    /// A yes/no property.
    Flag(bool),
    /// A description (links, names).
    Text(String),
}

/// One check that a checkpointed GPU fails against one local GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The check.
    pub check: CheckName,
    /// How it compares.
    pub requirement: Requirement,
    /// The checkpointed GPU's value.
    pub saved: Value,
    /// The local GPU's value.
    pub local: Value,
}

impl Mismatch {
    fn new(check: CheckName, saved: Value, local: Value) -> Self {
        Mismatch {
            check,
            requirement: check.requirement(),
            saved,
            local,
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: checkpointed {}, local {} ({})",
            self.check,
            format_value(self.check, &self.saved),
            format_value(self.check, &self.local),
            self.requirement
        )
    }
}

/// How a value reads in the human report.
pub(crate) fn format_value(check: CheckName, value: &Value) -> String {
    match (check, value) {
        (CheckName::VendorId | CheckName::DeviceId | CheckName::Capability, Value::Number(n)) => {
            format!("{n:#06x}")
        }
        (CheckName::VramSize, Value::Number(n)) => format_bytes(*n),
        (_, Value::Number(n)) => n.to_string(),
        (_, Value::Flag(b)) => if *b { "yes" } else { "no" }.to_owned(),
        (_, Value::Text(t)) => t.clone(),
    }
}

/// "64.0 GiB", "512 MiB".
pub(crate) fn format_bytes(n: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / GIB)
    } else {
        format!("{} MiB", n >> 20)
    }
}

/// Whether a local CPU link can stand in for a checkpointed one (CRIU's `iolink_match`,
/// for links that are valid and both point to CPUs): XGMI needs XGMI (PCIe may become
/// XGMI), and a bi-directional link needs a bi-directional one.
pub(crate) fn cpu_link_matches(saved: &CpuLink, local: &CpuLink) -> bool {
    let kind_ok = saved.kind != LinkType::Xgmi || local.kind == LinkType::Xgmi;
    let direction_ok = !saved.bidirectional || local.bidirectional;
    kind_ok && direction_ok
}

fn describe_cpu_link(system: &System, link: &CpuLink) -> String {
    format!(
        "{} to CPU node {} ({})",
        link.kind.name(),
        system.cpus[link.cpu],
        if link.bidirectional {
            "bi-directional"
        } else {
            "one-way"
        }
    )
}

fn describe_cpu_links(system: &System, links: &[CpuLink]) -> String {
    if links.is_empty() {
        return "no link to a CPU node".to_owned();
    }
    links
        .iter()
        .map(|l| describe_cpu_link(system, l))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every enabled check that `saved` fails against `local`. Both must be of the same kind.
pub(crate) fn compare(
    saved_sys: &System,
    saved: &Gpu,
    local_sys: &System,
    local: &Gpu,
    checks: &Checks,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut push = |check: CheckName, saved: Value, local: Value| {
        if checks.enabled(check) {
            out.push(Mismatch::new(check, saved, local));
        }
    };
    match (saved.device, local.device) {
        (Device::Kfd(_), Device::Kfd(_)) => {
            let (sv, lv) = (&saved.properties, &local.properties);
            for (i, &(check, _)) in EQUAL_PROPERTIES.iter().enumerate() {
                let (a, b) = (sv[i], lv[i]);
                if a != b {
                    push(check, Value::Number(a), Value::Number(b));
                }
            }
            let (s_vram, l_vram) = (
                saved.vram.unwrap_or_default(),
                local.vram.unwrap_or_default(),
            );
            if s_vram.public != l_vram.public {
                push(
                    CheckName::VramPublic,
                    Value::Flag(s_vram.public),
                    Value::Flag(l_vram.public),
                );
            }
            if s_vram.size > l_vram.size {
                push(
                    CheckName::VramSize,
                    Value::Number(s_vram.size),
                    Value::Number(l_vram.size),
                );
            }
            for (i, &(check, _)) in AT_LEAST_PROPERTIES.iter().enumerate() {
                let at = EQUAL_PROPERTIES.len() + i;
                let (a, b) = (sv[at], lv[at]);
                if a > b {
                    push(check, Value::Number(a), Value::Number(b));
                }
            }
            if saved.valid_links > local.valid_links {
                push(
                    CheckName::IoLinksCount,
                    Value::Number(saved.valid_links),
                    Value::Number(local.valid_links),
                );
            }
            let unmatched = saved
                .cpu_links
                .iter()
                .find(|s| !local.cpu_links.iter().any(|l| cpu_link_matches(s, l)));
            if let Some(link) = unmatched {
                push(
                    CheckName::CpuLinks,
                    Value::Text(describe_cpu_link(saved_sys, link)),
                    Value::Text(describe_cpu_links(local_sys, &local.cpu_links)),
                );
            }
        }
        (Device::Nvidia(s), Device::Nvidia(l)) => {
            match (s.device_id, l.device_id) {
                (Some(a), Some(b)) if a != b => push(
                    CheckName::DeviceId,
                    Value::Number(a.into()),
                    Value::Number(b.into()),
                ),
                (Some(_), Some(_)) => {}
                _ if s.name != l.name => push(
                    CheckName::DeviceId,
                    Value::Text(s.name.clone()),
                    Value::Text(l.name.clone()),
                ),
                _ => {}
            }
            if let (Some(a), Some(b)) = (s.memory_bytes, l.memory_bytes) {
                if a > b {
                    push(CheckName::VramSize, Value::Number(a), Value::Number(b));
                }
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_well() {
        let m = Mismatch::new(
            CheckName::VramSize,
            Value::Number(64 << 30),
            Value::Number(32 << 30),
        );
        assert_eq!(
            m.to_string(),
            "vram_size: checkpointed 64.0 GiB, local 32.0 GiB \
             (local must be at least the checkpointed value)"
        );
        let m = Mismatch::new(
            CheckName::DeviceId,
            Value::Number(0x740c),
            Value::Number(0x74a1),
        );
        assert_eq!(
            m.to_string(),
            "device_id: checkpointed 0x740c, local 0x74a1 (must be equal)"
        );
        assert_eq!(format_bytes(512 << 20), "512 MiB");
    }

    #[test]
    fn link_matching_follows_criu() {
        let link = |kind, bidirectional| CpuLink {
            cpu: 0,
            kind,
            bidirectional,
        };
        use LinkType::{Pcie, Xgmi};
        assert!(cpu_link_matches(&link(Pcie, false), &link(Xgmi, true)));
        assert!(cpu_link_matches(&link(Pcie, true), &link(Pcie, true)));
        assert!(!cpu_link_matches(&link(Xgmi, false), &link(Pcie, false)));
        assert!(!cpu_link_matches(&link(Pcie, true), &link(Pcie, false)));
        assert!(cpu_link_matches(&link(Pcie, false), &link(Pcie, true)));
    }
}
