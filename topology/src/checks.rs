//! The named compatibility checks and which of them apply.
//!
//! Every rule has a name (the KFD property it compares, where there is one). Seven can be
//! switched off with the environment variables of CRIU's amdgpu plugin, with the same
//! meaning and default (on): `0` or `NO` (any case) switches a check off, `1` or `YES`
//! leaves it on, anything else is ignored with a warning. Any check can be switched off by
//! name (`--skip-check NAME`), which wins over the environment.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// How a check compares the checkpointed value with the local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Requirement {
    /// The values must be equal.
    Equal,
    /// The local value must be at least the checkpointed one.
    AtLeast,
    /// A rule about links, hives or NUMA nodes.
    Topology,
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Requirement::Equal => "must be equal",
            Requirement::AtLeast => "local must be at least the checkpointed value",
            Requirement::Topology => "links must match",
        })
    }
}

macro_rules! checks {
    ($($variant:ident = $name:literal, $req:ident, $env:expr, $doc:literal;)*) => {
        /// A named compatibility check.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum CheckName {
            $(#[doc = $doc] $variant,)*
        }

        impl CheckName {
            /// Every check, in the order reports list them.
            pub const ALL: &'static [CheckName] = &[$(CheckName::$variant,)*];

            /// The name used by `--skip-check`, in reports and in JSON.
            pub fn as_str(self) -> &'static str {
                match self { $(CheckName::$variant => $name,)* }
            }

            /// How the check compares values.
            pub fn requirement(self) -> Requirement {
                match self { $(CheckName::$variant => Requirement::$req,)* }
            }

            /// The CRIU environment variable that switches it, if any.
            pub fn env_var(self) -> Option<&'static str> {
                match self { $(CheckName::$variant => $env,)* }
            }

            /// Every check's switch (`KFD_*_CHECK`), in [`CheckName::ALL`]'s order.
            pub fn env_vars() -> impl Iterator<Item = &'static str> {
                CheckName::ALL.iter().filter_map(|check| check.env_var())
            }

            /// One line saying what the check requires.
            pub fn description(self) -> &'static str {
                match self { $(CheckName::$variant => $doc,)* }
            }
        }
    };
}

checks! {
    SimdCount = "simd_count", Equal, None, "KFD property simd_count equal";
    MemBanksCount = "mem_banks_count", Equal, None, "KFD property mem_banks_count equal";
    MaxWavesPerSimd = "max_waves_per_simd", Equal, None, "KFD property max_waves_per_simd equal";
    LdsSizeInKb = "lds_size_in_kb", Equal, None, "KFD property lds_size_in_kb equal";
    WaveFrontSize = "wave_front_size", Equal, None, "KFD property wave_front_size equal";
    ArrayCount = "array_count", Equal, None, "KFD property array_count equal";
    SimdArraysPerEngine = "simd_arrays_per_engine", Equal, None, "KFD property simd_arrays_per_engine equal";
    CuPerSimdArray = "cu_per_simd_array", Equal, None, "KFD property cu_per_simd_array equal";
    SimdPerCu = "simd_per_cu", Equal, None, "KFD property simd_per_cu equal";
    MaxSlotsScratchCu = "max_slots_scratch_cu", Equal, None, "KFD property max_slots_scratch_cu equal";
    VendorId = "vendor_id", Equal, None, "PCI vendor id equal";
    DeviceId = "device_id", Equal, None, "PCI device id equal (the same chip and board; NVIDIA: the model name when the id is unknown)";
    NumSdmaEngines = "num_sdma_engines", Equal, None, "KFD property num_sdma_engines equal";
    NumSdmaXgmiEngines = "num_sdma_xgmi_engines", Equal, None, "KFD property num_sdma_xgmi_engines equal";
    NumSdmaQueuesPerEngine = "num_sdma_queues_per_engine", Equal, None, "KFD property num_sdma_queues_per_engine equal";
    NumCpQueues = "num_cp_queues", Equal, None, "KFD property num_cp_queues equal";
    VramPublic = "vram_public", Equal, None, "VRAM host-visible (large BAR) on both or on neither";
    IoLinksCount = "io_links_count", AtLeast, None, "the local GPU has at least as many valid PCIe/XGMI io links";
    Capability = "capability", Equal, Some("KFD_CAPABILITY_CHECK"), "KFD property capability equal";
    VramSize = "vram_size", AtLeast, Some("KFD_VRAM_SIZE_CHECK"), "local VRAM at least the checkpointed size";
    NumGws = "num_gws", AtLeast, Some("KFD_NUM_GWS_CHECK"), "local num_gws at least the checkpointed one";
    CachesCount = "caches_count", AtLeast, Some("KFD_CACHES_COUNT_CHECK"), "local caches_count at least the checkpointed one";
    FwVersion = "fw_version", AtLeast, Some("KFD_FW_VER_CHECK"), "local MEC firmware at least the checkpointed version";
    SdmaFwVersion = "sdma_fw_version", AtLeast, Some("KFD_SDMA_FW_VER_CHECK"), "local SDMA firmware at least the checkpointed version";
    CpuLinks = "cpu_links", Topology, None, "every link to a CPU has a local counterpart (XGMI needs XGMI, bi-directional needs bi-directional)";
    Numa = "numa", Topology, Some("KFD_NUMA_CHECK"), "GPUs that shared a NUMA node share one locally (each CPU node maps to one local CPU node)";
    XgmiHive = "xgmi_hive", Topology, None, "each XGMI hive maps into its own local hive";
    GpuCount = "gpu_count", Topology, None, "KFD: as many local GPUs as checkpointed ones (NVIDIA: at least as many)";
}

impl fmt::Display for CheckName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CheckName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A name that is not a check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown topology check {0:?} (known: {known})", known = known_names())]
pub struct UnknownCheck(pub String);

fn known_names() -> String {
    CheckName::ALL
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for CheckName {
    type Err = UnknownCheck;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CheckName::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCheck(s.to_owned()))
    }
}

/// Why a check is off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Disabled {
    /// Its CRIU environment variable says so.
    Env {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// `--skip-check NAME`.
    Flag,
}

impl fmt::Display for Disabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disabled::Env { variable, value } => write!(f, "{variable}={value}"),
            Disabled::Flag => f.write_str("--skip-check"),
        }
    }
}

/// Which checks apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks {
    disabled: BTreeMap<CheckName, Disabled>,
    warnings: Vec<String>,
}

impl Checks {
    /// Every check on.
    pub fn all() -> Self {
        Checks::default()
    }

    /// The checks as the environment (`KFD_*_CHECK`) and `--skip-check NAME`s set them.
    pub fn from_env_and_skips(skips: &[CheckName]) -> Self {
        Checks::from_lookup(
            |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()),
            skips,
        )
    }

    /// As [`Checks::from_env_and_skips`], with the environment given by `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, skips: &[CheckName]) -> Self {
        let mut checks = Checks::all();
        for &check in CheckName::ALL {
            let Some(variable) = check.env_var() else {
                continue;
            };
            let Some(value) = lookup(variable) else {
                continue;
            };
            match parse_bool(&value) {
                Some(true) => {}
                Some(false) => {
                    checks
                        .disabled
                        .insert(check, Disabled::Env { variable, value });
                }
                None => checks.warnings.push(format!(
                    "ignoring invalid value for {variable}={value:?}, expecting YES/NO or 1/0"
                )),
            }
        }
        for &check in skips {
            checks.disabled.insert(check, Disabled::Flag);
        }
        checks
    }

    /// The same checks with `check` switched off (as by `--skip-check`).
    pub fn without(mut self, check: CheckName) -> Self {
        self.disabled.insert(check, Disabled::Flag);
        self
    }

    /// Whether `check` applies.
    pub fn enabled(&self, check: CheckName) -> bool {
        !self.disabled.contains_key(&check)
    }

    /// The checks that are off, and why.
    pub fn disabled(&self) -> impl Iterator<Item = (CheckName, &Disabled)> {
        self.disabled.iter().map(|(c, d)| (*c, d))
    }

    /// Environment values that were ignored.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

/// CRIU's `getenv_bool`: "0" or "NO" (any case) is false, "1" or "YES" (any case) is true.
fn parse_bool(value: &str) -> Option<bool> {
    if value == "0" || value.eq_ignore_ascii_case("no") {
        Some(false)
    } else if value == "1" || value.eq_ignore_ascii_case("yes") {
        Some(true)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn names_round_trip_and_are_unique() {
        for &check in CheckName::ALL {
            assert_eq!(check.as_str().parse::<CheckName>(), Ok(check));
        }
        let mut names: Vec<_> = CheckName::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CheckName::ALL.len());
        let err = "fw".parse::<CheckName>().unwrap_err().to_string();
        assert!(
            err.contains("\"fw\"") && err.contains("fw_version"),
            "{err}"
        );
    }

    #[test]
    fn seven_checks_have_criu_variables() {
        let vars: Vec<_> = CheckName::env_vars().collect();
        assert_eq!(
            vars,
            [
                "KFD_CAPABILITY_CHECK",
                "KFD_VRAM_SIZE_CHECK",
                "KFD_NUM_GWS_CHECK",
                "KFD_CACHES_COUNT_CHECK",
                "KFD_FW_VER_CHECK",
                "KFD_SDMA_FW_VER_CHECK",
                "KFD_NUMA_CHECK",
            ]
        );
    }

    #[test]
    fn environment_values_follow_criu() {
        let pairs = [
            ("KFD_FW_VER_CHECK", "0"),
            ("KFD_SDMA_FW_VER_CHECK", "no"),
            ("KFD_NUMA_CHECK", "No"),
            ("KFD_VRAM_SIZE_CHECK", "1"),
            ("KFD_CAPABILITY_CHECK", "yes"),
            ("KFD_NUM_GWS_CHECK", "off"),
            ("KFD_CACHES_COUNT_CHECK", " 0"),
        ];
        let checks = Checks::from_lookup(env(&pairs), &[]);
        assert!(!checks.enabled(CheckName::FwVersion));
        assert!(!checks.enabled(CheckName::SdmaFwVersion));
        assert!(!checks.enabled(CheckName::Numa));
        assert!(checks.enabled(CheckName::VramSize));
        assert!(checks.enabled(CheckName::Capability));
        // Invalid values keep the default (on) and are reported.
        assert!(checks.enabled(CheckName::NumGws));
        assert!(checks.enabled(CheckName::CachesCount));
        assert_eq!(checks.warnings().len(), 2);
        assert!(checks.warnings()[0].contains("KFD_NUM_GWS_CHECK"));
    }

    #[test]
    fn defaults_are_on_and_flags_win() {
        let checks = Checks::from_lookup(env(&[]), &[]);
        assert!(CheckName::ALL.iter().all(|c| checks.enabled(*c)));
        let checks = Checks::from_lookup(
            env(&[("KFD_FW_VER_CHECK", "YES")]),
            &[CheckName::FwVersion, CheckName::DeviceId],
        );
        assert!(!checks.enabled(CheckName::FwVersion));
        assert!(!checks.enabled(CheckName::DeviceId));
        assert_eq!(
            checks.disabled().map(|(c, _)| c).collect::<Vec<_>>(),
            [CheckName::DeviceId, CheckName::FwVersion]
        );
        let checks = Checks::from_lookup(env(&[("KFD_NUMA_CHECK", "0")]), &[CheckName::Numa]);
        assert_eq!(
            checks.disabled().next(),
            Some((CheckName::Numa, &Disabled::Flag))
        );
    }
}
