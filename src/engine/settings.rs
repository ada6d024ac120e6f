//! Engine mode's settings, from the helper's environment (CRIU's own, completed by the
//! plugin from `gpucr_plugin.conf`): the same knobs `gpucr dump` and `gpucr restore`
//! take as flags, and the variables the plugin and the backends read.

use std::time::Duration;

use gpucr_abi::env::{engine_reads, engine_settings_text};
use gpucr_topology::{CheckName, Checks};

use crate::gpu::{amdgpu, sim};
use crate::transfer::{Compression, TransferConfig};

pub use gpucr_abi::engine::{ENV_COMPRESS, ENV_DEVICE_TIMEOUT, ENV_JOBS, ENV_NO_PAGE_CHECKSUMS};
/// The NVIDIA GPUs a restore may map onto, with CUDA's rules.
pub use gpucr_topology::nvidia::visible::VARIABLE as ENV_CUDA_VISIBLE_DEVICES;

/// A setting engine mode cannot use.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value the variable's reader refuses.
    #[error("{variable}={value:?}: {detail}")]
    Value {
        variable: &'static str,
        value: String,
        detail: String,
    },
    /// A `GPUCR_*` or `KFD_*` name nothing in engine mode reads (a misspelt one would
    /// otherwise leave its default in force without a word).
    #[error(
        "{name}: not a setting engine mode reads{}; the GPUCR_* settings are {} \
         (gpucr(1) says what each sets); the KFD_* ones are {}",
        resembling(name).map(|like| format!(" (did you mean {like}?)")).unwrap_or_default(),
        engine_settings_text(),
        CheckName::env_vars().collect::<Vec<_>>().join(", ")
    )]
    Unknown { name: String },
}

/// The setting whose name is closest to `name`, if one is close.
fn resembling(name: &str) -> Option<&'static str> {
    if name.starts_with("KFD_") {
        gpucr_abi::env::closest_of(name, "KFD_", CheckName::env_vars())
    } else {
        gpucr_abi::env::closest_of(
            name,
            gpucr_abi::env::PREFIX,
            gpucr_abi::env::engine_settings()
                .filter(|v| !v.is_family())
                .map(|v| v.name),
        )
    }
}

/// What engine mode runs with.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub transfer: TransferConfig,
    pub device_timeout: Duration,
    pub cuda_visible_devices: Option<String>,
    /// A dump records the memory pages files by size only (`--no-page-checksums`).
    pub no_page_checksums: bool,
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
        let no_page_checksums = match lookup(ENV_NO_PAGE_CHECKSUMS) {
            None => false,
            Some(text) => parse_switch(ENV_NO_PAGE_CHECKSUMS, &text)?,
        };
        Ok(EngineSettings {
            transfer,
            device_timeout,
            cuda_visible_devices: lookup(ENV_CUDA_VISIBLE_DEVICES),
            no_page_checksums,
        })
    }
}

/// Check the setting `name` as engine mode will read it (`gpucr install-plugin
/// --setting`): the knobs of `gpucr dump` and `gpucr restore` with the rules of their
/// flags, the backends' variables with the backends' own parsers, and CRIU's
/// `KFD_*_CHECK` switches. A `GPUCR_*` name engine mode does not read is refused; the
/// values of the other known names (paths, `GPUCR_ENGINE`, `CUDA_VISIBLE_DEVICES`) pass
/// unchecked.
pub fn check_setting(name: &str, value: &str) -> Result<(), SettingsError> {
    match name {
        ENV_COMPRESS => parse_compress(value).map(drop),
        ENV_JOBS => parse_jobs(value).map(drop),
        ENV_DEVICE_TIMEOUT => parse_device_timeout(value).map(drop),
        ENV_NO_PAGE_CHECKSUMS => parse_switch(ENV_NO_PAGE_CHECKSUMS, value).map(drop),
        amdgpu::ENV_FENCE_TIMEOUT => check_with(
            amdgpu::ENV_FENCE_TIMEOUT,
            value,
            amdgpu::parse_fence_timeout,
        ),
        amdgpu::ENV_RINGS => check_with(amdgpu::ENV_RINGS, value, amdgpu::parse_rings),
        sim::ENV_COPY_BW => check_with(sim::ENV_COPY_BW, value, sim::parse_bandwidth),
        sim::nv_driver::ENV_DRIVER_TIMEOUT => check_with(
            sim::nv_driver::ENV_DRIVER_TIMEOUT,
            value,
            sim::nv_driver::parse_timeout,
        ),
        _ if name.starts_with("GPUCR_") => {
            if engine_reads(name) {
                Ok(())
            } else {
                Err(SettingsError::Unknown {
                    name: name.to_owned(),
                })
            }
        }
        _ => check_topology_switch(name, value),
    }
}

/// `value` read by `parse`, the parser the variable's reader uses at run time.
fn check_with<T>(
    variable: &'static str,
    value: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<(), SettingsError> {
    parse(value)
        .map(drop)
        .map_err(|detail| bad(variable, value, detail))
}

/// A `KFD_*_CHECK` switch, read as the topology check reads it (1/YES on, 0/NO off);
/// another `KFD_*` name is one nothing in gpucr reads. (Names of other kinds are the
/// caller's to refuse; `CUDA_VISIBLE_DEVICES` passes.)
fn check_topology_switch(name: &str, value: &str) -> Result<(), SettingsError> {
    let Some(variable) = CheckName::env_vars().find(|&variable| variable == name) else {
        return if name.starts_with("KFD_") {
            Err(SettingsError::Unknown {
                name: name.to_owned(),
            })
        } else {
            Ok(())
        };
    };
    let checks = Checks::from_lookup(|wanted| (wanted == variable).then(|| value.to_owned()), &[]);
    match checks.warnings().first() {
        None => Ok(()),
        Some(_) => Err(bad(variable, value, "expected YES/NO or 1/0".into())),
    }
}

fn bad(variable: &'static str, value: &str, detail: String) -> SettingsError {
    SettingsError::Value {
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

/// A yes/no setting, read by the parser `gpucr dump` reads the switch's flag with from
/// the environment (clap's `BoolishValueParser`).
fn parse_switch(variable: &'static str, text: &str) -> Result<bool, SettingsError> {
    use clap::builder::{BoolishValueParser, TypedValueParser};
    BoolishValueParser::new()
        .parse_ref(
            &clap::Command::new(variable),
            None,
            std::ffi::OsStr::new(text.trim()),
        )
        .map_err(|_| {
            bad(
                variable,
                text,
                "not yes or no (y, yes, t, true, on, 1 / n, no, f, false, off, 0)".into(),
            )
        })
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

    fn variable_of(e: &SettingsError) -> &str {
        match e {
            SettingsError::Value { variable, .. } => variable,
            SettingsError::Unknown { name } => name,
        }
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
        assert!(!s.no_page_checksums);
    }

    /// `GPUCR_NO_PAGE_CHECKSUMS` takes the words `gpucr dump` takes for it from the
    /// environment, and no others.
    #[test]
    fn the_page_checksums_switch_reads_as_the_flag_does() {
        use clap::builder::TypedValueParser;
        let clap_reads = |word: &str| {
            clap::builder::BoolishValueParser::new()
                .parse_ref(
                    &clap::Command::new("gpucr"),
                    None,
                    std::ffi::OsStr::new(word),
                )
                .ok()
        };
        for word in [
            "y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0", "YES", "Off",
            "2", "maybe", "",
        ] {
            let ours = parse_switch(ENV_NO_PAGE_CHECKSUMS, word).ok();
            assert_eq!(ours, clap_reads(word), "{word:?}");
        }
        assert!(
            settings(&[(ENV_NO_PAGE_CHECKSUMS, "yes")])
                .unwrap()
                .no_page_checksums
        );
        assert!(
            !settings(&[(ENV_NO_PAGE_CHECKSUMS, "0")])
                .unwrap()
                .no_page_checksums
        );
        let e = settings(&[(ENV_NO_PAGE_CHECKSUMS, "sometimes")]).unwrap_err();
        assert_eq!(variable_of(&e), ENV_NO_PAGE_CHECKSUMS);
        assert!(check_setting(ENV_NO_PAGE_CHECKSUMS, "sometimes").is_err());
        assert!(check_setting(ENV_NO_PAGE_CHECKSUMS, "on").is_ok());
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
            assert_eq!(variable_of(&e), var);
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
            assert_eq!(variable_of(&e), name);
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

    /// The backends' variables are checked by the parsers their readers use when a dump
    /// or a restore runs, and a refusal names the variable and the value as the backend
    /// would.
    #[test]
    fn install_checks_the_backends_variables_with_their_parsers() {
        for (name, value) in [
            (amdgpu::ENV_FENCE_TIMEOUT, "45s"),
            (amdgpu::ENV_FENCE_TIMEOUT, "2min"),
            (amdgpu::ENV_RINGS, "0"),
            (amdgpu::ENV_RINGS, " 0, 1 "),
            (sim::ENV_COPY_BW, "1.6GB/s"),
            (sim::ENV_COPY_BW, "20MiB"),
            (sim::nv_driver::ENV_DRIVER_TIMEOUT, "10"),
            (sim::nv_driver::ENV_DRIVER_TIMEOUT, "0.5"),
        ] {
            check_setting(name, value).unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
        for (name, value, detail) in [
            (
                amdgpu::ENV_FENCE_TIMEOUT,
                "soon",
                "expected number at 0 (a duration such as 30s or 2min)",
            ),
            (amdgpu::ENV_FENCE_TIMEOUT, "30", "time unit needed"),
            (
                amdgpu::ENV_RINGS,
                "x",
                "\"x\" is not an SDMA ring number (0-31)",
            ),
            (
                amdgpu::ENV_RINGS,
                "0,32",
                "\"32\" is not an SDMA ring number (0-31)",
            ),
            (sim::ENV_COPY_BW, "fast", "\"fast\" is not a bandwidth"),
            (sim::ENV_COPY_BW, "1PB/s", "unknown unit \"PB\""),
            (sim::ENV_COPY_BW, "0MB/s", "must be a positive bandwidth"),
            (
                sim::nv_driver::ENV_DRIVER_TIMEOUT,
                "0",
                "not a positive number of seconds",
            ),
            (
                sim::nv_driver::ENV_DRIVER_TIMEOUT,
                "ten",
                "not a positive number of seconds",
            ),
            (
                sim::nv_driver::ENV_DRIVER_TIMEOUT,
                "1e30",
                "not a positive number of seconds",
            ),
        ] {
            let e = check_setting(name, value).unwrap_err();
            assert_eq!(variable_of(&e), name);
            let text = e.to_string();
            assert!(text.starts_with(&format!("{name}={value:?}: ")), "{text}");
            assert!(text.contains(detail), "{text}");
        }
    }

    /// A `GPUCR_*` name engine mode does not read is refused, naming the ones it reads;
    /// every name it does read, and the fake CUDA driver's, pass.
    #[test]
    fn install_refuses_a_gpucr_name_engine_mode_does_not_read() {
        for name in [
            ENV_COMPRESS,
            "GPUCR_BIN",
            "GPUCR_ENGINE",
            "GPUCR_ENGINE_LOG",
            "GPUCR_CUDA_LIBRARY",
            "GPUCR_SIM_ROOT",
            "GPUCR_SIM_DEVICE",
            "GPUCR_FAULT",
            "GPUCR_FAKE_CUDA_DIR",
            "GPUCR_FAKE_CUDA_STEP_MS",
        ] {
            let value = if name == ENV_COMPRESS { "zstd" } else { "/x" };
            check_setting(name, value).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for name in [
            "GPUCR_COMPRES",
            "GPUCR_HELPER_FD",
            "GPUCR_BACKEND",
            "GPUCR_",
            "GPUCR_FAKE_CUDA_",
            "KFD_NUMA_CHEK",
            "KFD_MAX_BUFFER_SIZE",
        ] {
            let e = check_setting(name, "zstd").unwrap_err();
            assert!(matches!(&e, SettingsError::Unknown { name: n } if n == name));
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("{name}: not a setting engine mode reads")),
                "{text}"
            );
            for known in gpucr_abi::env::engine_settings() {
                assert!(text.contains(known.name), "{}: {text}", known.name);
            }
            assert!(text.contains("GPUCR_FAKE_CUDA_*"), "{text}");
            assert!(text.contains("KFD_NUMA_CHECK"), "{text}");
        }
        // A close name is suggested; none for a name close to nothing.
        for (name, like) in [
            ("GPUCR_COMPRES", Some("GPUCR_COMPRESS")),
            ("KFD_NUMA_CHEK", Some("KFD_NUMA_CHECK")),
            ("GPUCR_HELPER_FD", None),
            ("KFD_MAX_BUFFER_SIZE", None),
        ] {
            let text = check_setting(name, "1").unwrap_err().to_string();
            match like {
                Some(like) => assert!(
                    text.contains(&format!("reads (did you mean {like}?);")),
                    "{text}"
                ),
                None => assert!(!text.contains("did you mean"), "{text}"),
            }
        }
    }

    /// The variables engine mode reads, by the list the plugin reads a settings file
    /// with (gpucr-abi's `env`): every one gpucr's own readers define, and the fake
    /// CUDA driver's family.
    #[test]
    fn the_shared_list_is_the_readers_variables() {
        let readers = [
            gpucr_abi::engine::ENV_BIN,
            gpucr_abi::engine::ENV_ENGINE,
            gpucr_abi::engine::ENV_ENGINE_LOG,
            ENV_COMPRESS,
            ENV_JOBS,
            ENV_DEVICE_TIMEOUT,
            ENV_NO_PAGE_CHECKSUMS,
            gpucr_cuda_driver::ENV_LIBRARY,
            amdgpu::ENV_FENCE_TIMEOUT,
            amdgpu::ENV_RINGS,
            sim::ENV_ROOT,
            sim::ENV_DEVICE,
            sim::ENV_COPY_BW,
            sim::nv_driver::ENV_DRIVER_TIMEOUT,
            gpucr_abi::fault::ENV_FAULT,
            gpucr_abi::engine::FAKE_CUDA_PREFIX,
        ];
        let mut readers = readers.to_vec();
        let mut listed: Vec<&str> = gpucr_abi::env::engine_settings().map(|v| v.name).collect();
        readers.sort_unstable();
        listed.sort_unstable();
        assert_eq!(readers, listed);
    }
}
