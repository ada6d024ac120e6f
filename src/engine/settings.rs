//! Engine mode's settings, from the helper's environment (CRIU's own, completed by the
//! plugin from `gpucr_plugin.conf`): the same knobs `gpucr dump` and `gpucr restore`
//! take as flags.

use std::time::Duration;

use gpucr_topology::{CheckName, Checks};

use crate::transfer::{Compression, TransferConfig};

/// `--compress` of `gpucr dump` (default zstd).
pub const ENV_COMPRESS: &str = "GPUCR_COMPRESS";
/// `--jobs` (default: the number of CPU cores).
pub const ENV_JOBS: &str = "GPUCR_JOBS";
/// `--device-timeout` in seconds (default 120).
pub const ENV_DEVICE_TIMEOUT: &str = "GPUCR_DEVICE_TIMEOUT";
/// The NVIDIA GPUs a restore may map onto, with CUDA's rules.
pub const ENV_CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// A setting with a value engine mode cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{variable}={value:?}: {detail}")]
pub struct SettingsError {
    pub variable: &'static str,
    pub value: String,
    pub detail: String,
}

/// What engine mode runs with.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub transfer: TransferConfig,
    pub device_timeout: Duration,
    pub cuda_visible_devices: Option<String>,
}

impl EngineSettings {
    /// The settings in the environment.
    pub fn from_env() -> Result<EngineSettings, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The settings `lookup` gives.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<EngineSettings, SettingsError> {
        let mut transfer = TransferConfig::default();
        if let Some(text) = lookup(ENV_COMPRESS) {
            transfer.compression = parse_compress(&text)?;
        }
        if let Some(text) = lookup(ENV_JOBS) {
            transfer.jobs = parse_jobs(&text)?;
        }
        let device_timeout = match lookup(ENV_DEVICE_TIMEOUT) {
            None => Duration::from_secs(120),
            Some(text) => parse_device_timeout(&text)?,
        };
        Ok(EngineSettings {
            transfer,
            device_timeout,
            cuda_visible_devices: lookup(ENV_CUDA_VISIBLE_DEVICES),
        })
    }
}

/// Check the value of the setting `name` as engine mode will read it (`gpucr
/// install-plugin --setting`): the knobs of `gpucr dump` and `gpucr restore` with the
/// rules of their flags, and CRIU's `KFD_*_CHECK` switches. Other names pass unchecked.
pub fn check_setting(name: &str, value: &str) -> Result<(), SettingsError> {
    match name {
        ENV_COMPRESS => parse_compress(value).map(drop),
        ENV_JOBS => parse_jobs(value).map(drop),
        ENV_DEVICE_TIMEOUT => parse_device_timeout(value).map(drop),
        _ => check_topology_switch(name, value),
    }
}

/// A `KFD_*_CHECK` switch, read as the topology check reads it (1/YES on, 0/NO off).
fn check_topology_switch(name: &str, value: &str) -> Result<(), SettingsError> {
    let Some(variable) = CheckName::ALL
        .iter()
        .filter_map(|check| check.env_var())
        .find(|&variable| variable == name)
    else {
        return Ok(());
    };
    let checks = Checks::from_lookup(|wanted| (wanted == variable).then(|| value.to_owned()), &[]);
    match checks.warnings().first() {
        None => Ok(()),
        Some(_) => Err(bad(variable, value, "expected YES/NO or 1/0".into())),
    }
}

fn bad(variable: &'static str, value: &str, detail: String) -> SettingsError {
    SettingsError {
        variable,
        value: value.to_owned(),
        detail,
    }
}

/// `GPUCR_COMPRESS`, as `--compress` reads it.
fn parse_compress(text: &str) -> Result<Compression, SettingsError> {
    text.trim()
        .parse::<Compression>()
        .map_err(|e| bad(ENV_COMPRESS, text, e.to_string()))
}

/// `GPUCR_JOBS`, as `--jobs` reads it.
fn parse_jobs(text: &str) -> Result<usize, SettingsError> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(bad(ENV_JOBS, text, "not a number from 1 to 1024".into())),
    }
}

/// `GPUCR_DEVICE_TIMEOUT`, as `--device-timeout` reads it.
fn parse_device_timeout(text: &str) -> Result<Duration, SettingsError> {
    match text.trim().parse::<u64>() {
        Ok(s) if (1..=86400).contains(&s) => Ok(Duration::from_secs(s)),
        _ => Err(bad(
            ENV_DEVICE_TIMEOUT,
            text,
            "not a number of seconds from 1 to 86400".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<EngineSettings, SettingsError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EngineSettings::from_lookup(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_are_those_of_the_commands() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.device_timeout, Duration::from_secs(120));
        assert_eq!(s.transfer.jobs, TransferConfig::default().jobs);
        assert_eq!(
            s.transfer.compression.to_string(),
            TransferConfig::default().compression.to_string()
        );
        assert!(s.cuda_visible_devices.is_none());
    }

    #[test]
    fn values_are_read_and_bad_ones_named() {
        let s = settings(&[
            (ENV_COMPRESS, "none"),
            (ENV_JOBS, "3"),
            (ENV_DEVICE_TIMEOUT, "7"),
            (ENV_CUDA_VISIBLE_DEVICES, "1,0"),
        ])
        .unwrap();
        assert_eq!(s.transfer.jobs, 3);
        assert_eq!(s.transfer.compression.to_string(), "none");
        assert_eq!(s.device_timeout, Duration::from_secs(7));
        assert_eq!(s.cuda_visible_devices.as_deref(), Some("1,0"));
        for (var, value) in [
            (ENV_COMPRESS, "lzma"),
            (ENV_JOBS, "0"),
            (ENV_JOBS, "many"),
            (ENV_DEVICE_TIMEOUT, "0"),
        ] {
            let e = settings(&[(var, value)]).unwrap_err();
            assert_eq!(e.variable, var);
            assert!(e.to_string().starts_with(&format!("{var}=")), "{e}");
        }
    }

    #[test]
    fn install_checks_a_setting_as_engine_mode_reads_it() {
        for (name, value) in [
            (ENV_COMPRESS, "zstd:3"),
            (ENV_JOBS, "8"),
            (ENV_DEVICE_TIMEOUT, "600"),
            ("KFD_NUMA_CHECK", "no"),
            (ENV_CUDA_VISIBLE_DEVICES, "GPU-x,1"),
            ("GPUCR_SIM_ROOT", "/anything"),
        ] {
            check_setting(name, value).unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
        for (name, value) in [
            (ENV_COMPRESS, "zstd:99"),
            (ENV_JOBS, "abc"),
            (ENV_JOBS, "0"),
            (ENV_DEVICE_TIMEOUT, "-1"),
            ("KFD_FW_VER_CHECK", "maybe"),
        ] {
            let e = check_setting(name, value).unwrap_err();
            assert_eq!(e.variable, name);
            assert!(e.to_string().starts_with(&format!("{name}=")), "{e}");
        }
        // What install refuses is what engine mode would refuse.
        let err = settings(&[(ENV_COMPRESS, "zstd:99")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            check_setting(ENV_COMPRESS, "zstd:99")
                .unwrap_err()
                .to_string()
        );
    }
}
