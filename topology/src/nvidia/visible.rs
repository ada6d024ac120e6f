//! `CUDA_VISIBLE_DEVICES`: the subset of this machine's NVIDIA GPUs a restore may use.
//!
//! CUDA's rules, applied to the GPUs gpucr reads (which are in PCI bus order):
//! - unset: every GPU; set but empty: none;
//! - a comma-separated list of entries, each a device index (in PCI bus order, as with
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID` and as `nvidia-smi` numbers them) or a GPU UUID
//!   (`GPU-…`, whole or a prefix that names one GPU);
//! - the first entry that names no GPU (out of range, negative, unknown, ambiguous, or
//!   a GPU named twice) ends the list: the GPUs before it are visible, the rest ignored.
//!
//! MIG instances (`MIG-…`) cannot be restored onto: they are refused with an error
//! rather than ignored, since ignoring them would restore onto other GPUs.

use crate::model::NvidiaGpu;

/// The environment variable.
pub const VARIABLE: &str = "CUDA_VISIBLE_DEVICES";

/// Why a `CUDA_VISIBLE_DEVICES` value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VisibleError {
    /// A MIG instance was named.
    #[error(
        "{VARIABLE}={value:?} names the MIG instance {entry:?}: gpucr restores onto whole \
         GPUs only (name them by index or GPU-UUID)"
    )]
    Mig {
        /// The whole value.
        value: String,
        /// The MIG entry.
        entry: String,
    },
}

/// The GPUs a `CUDA_VISIBLE_DEVICES` value leaves, in the order it names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Visible {
    /// The visible GPUs.
    pub gpus: Vec<NvidiaGpu>,
    /// What was said about the value, for the report.
    pub note: String,
}

/// Why an entry ends the list.
fn unusable(entry: &str, gpus: &[NvidiaGpu], chosen: &[usize]) -> Result<usize, String> {
    let index = if let Ok(n) = entry.parse::<i64>() {
        match usize::try_from(n) {
            Ok(i) if i < gpus.len() => i,
            _ => {
                return Err(format!(
                    "index {n} is not one of this machine's {} NVIDIA GPUs",
                    gpus.len()
                ))
            }
        }
    } else if entry.starts_with("GPU-") {
        let wanted = entry.to_ascii_lowercase();
        let matches: Vec<usize> = (0..gpus.len())
            .filter(|&i| gpus[i].uuid.to_ascii_lowercase().starts_with(&wanted))
            .collect();
        match matches.as_slice() {
            [one] => *one,
            [] => return Err("no GPU of this machine has that UUID".to_owned()),
            _ => return Err(format!("the UUID prefix names {} GPUs", matches.len())),
        }
    } else {
        return Err("it is neither a device index nor a GPU UUID".to_owned());
    };
    if chosen.contains(&index) {
        return Err(format!("it names {} a second time", gpus[index].uuid));
    }
    Ok(index)
}

/// The GPUs of `gpus` (this machine's, in PCI bus order) that `value` leaves visible.
pub fn select(gpus: &[NvidiaGpu], value: &str) -> Result<Visible, VisibleError> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut stopped = None;
    let entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
    for entry in entries {
        if entry.starts_with("MIG-") {
            return Err(VisibleError::Mig {
                value: value.to_owned(),
                entry: entry.to_owned(),
            });
        }
        match unusable(entry, gpus, &chosen) {
            Ok(index) => chosen.push(index),
            Err(reason) => {
                stopped = Some(format!("{entry:?} and what follows are ignored: {reason}"));
                break;
            }
        }
    }
    let visible: Vec<NvidiaGpu> = chosen.iter().map(|&i| gpus[i].clone()).collect();
    let names: Vec<&str> = visible.iter().map(|g| g.uuid.as_str()).collect();
    let mut note = format!(
        "{VARIABLE}={value:?}: restoring onto {} of this machine's {} NVIDIA GPUs{}{}",
        visible.len(),
        gpus.len(),
        if names.is_empty() { "" } else { ": " },
        names.join(", ")
    );
    if let Some(stopped) = stopped {
        note.push_str(&format!(" ({stopped})"));
    }
    Ok(Visible {
        gpus: visible,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NvidiaSource;

    fn gpus(n: usize) -> Vec<NvidiaGpu> {
        (0..n)
            .map(|i| NvidiaGpu {
                uuid: format!("GPU-{i:08x}-aaaa-bbbb-cccc-{:012x}", 0x100 + i),
                name: "NVIDIA H100 80GB HBM3".into(),
                bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
                minor: Some(i as u32),
                device_id: Some(0x2330),
                memory_bytes: None,
                compute_capability: None,
                vbios: None,
                numa_node: None,
                nvlinks: None,
                source: NvidiaSource::Procfs,
            })
            .collect()
    }

    fn uuids(v: &Visible) -> Vec<&str> {
        v.gpus.iter().map(|g| &g.uuid[4..12]).collect()
    }

    #[test]
    fn indices_select_in_the_order_given() {
        let v = select(&gpus(8), "3,1").unwrap();
        assert_eq!(uuids(&v), ["00000003", "00000001"]);
        assert!(
            v.note.contains("restoring onto 2 of this machine's 8"),
            "{}",
            v.note
        );
    }

    #[test]
    fn uuids_and_unique_prefixes_select() {
        let all = gpus(4);
        let v = select(&all, &format!("{},GPU-00000002", all[3].uuid)).unwrap();
        assert_eq!(uuids(&v), ["00000003", "00000002"]);
        // "GPU-0000000" is a prefix of all four: ambiguous, so the list ends there.
        let v = select(&all, "1,GPU-0000000,2").unwrap();
        assert_eq!(uuids(&v), ["00000001"]);
        assert!(v.note.contains("names 4 GPUs"), "{}", v.note);
    }

    #[test]
    fn the_first_bad_entry_ends_the_list() {
        for (value, left, why) in [
            ("0,1,-1,2", 2, "index -1"),
            ("0,8,1", 1, "index 8"),
            ("2,2,3", 1, "a second time"),
            ("0,GPU-ffffffff", 1, "no GPU of this machine"),
            ("1,cuda0", 1, "neither a device index"),
        ] {
            let v = select(&gpus(8), value).unwrap();
            assert_eq!(v.gpus.len(), left, "{value}");
            assert!(v.note.contains(why), "{value}: {}", v.note);
        }
    }

    #[test]
    fn empty_means_none_and_mig_is_refused() {
        assert!(select(&gpus(2), "").unwrap().gpus.is_empty());
        let err = select(&gpus(2), "0,MIG-5f3e1c2d-aaaa-bbbb-cccc-000000000001").unwrap_err();
        assert!(err.to_string().contains("MIG instance"), "{err}");
    }
}
