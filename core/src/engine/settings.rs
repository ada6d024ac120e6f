//! Engine mode's settings, from the helper's environment (CRIU's own, completed by the
//! plugin from `gpucr_plugin.conf`): the same knobs `gpucr dump` and `gpucr restore`
//! take as flags, and the variables the plugin and the backends read.

use std::time::Duration;

use gpucr_abi::engine::{ENV_BIN, ENV_ENGINE, ENV_ENGINE_LOG};
use gpucr_abi::env::{engine_reads, engine_settings_text};
use gpucr_abi::fault::{FaultStep, ENV_FAULT};
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
/// flags, the backends' variables with the backends' own parsers, the paths the plugin,
/// the helper and the backends open ([`check_path`]), `GPUCR_ENGINE` and `GPUCR_FAULT`
/// by the values their readers know, and CRIU's `KFD_*_CHECK` switches. A `GPUCR_*`
/// name engine mode does not read is refused; the values of `CUDA_VISIBLE_DEVICES` and
/// of the fake CUDA driver's `GPUCR_FAKE_CUDA_*` (tests) pass unchecked.
pub fn check_setting(name: &str, value: &str) -> Result<(), SettingsError> {
    if let Some(path) = path_kind(name) {
        return check_path(value, path);
    }
    match name {
        ENV_ENGINE => check_engine_switch(value),
        ENV_FAULT => check_fault_step(value),
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

/// What a path setting must name when engine mode reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKind {
    /// A program the plugin runs (`GPUCR_BIN`).
    Program,
    /// A shared library the helper loads, which the plugin also looks for among a
    /// process's mappings (`GPUCR_CUDA_LIBRARY`).
    Library,
    /// A file the plugin creates or appends to, in a directory that must be there
    /// (`GPUCR_ENGINE_LOG`).
    LogFile,
    /// A directory (`GPUCR_SIM_ROOT`).
    Directory,
    /// A character device (`GPUCR_SIM_DEVICE`).
    CharDevice,
}

/// The path settings, with what each must name.
fn path_kind(name: &str) -> Option<(&'static str, PathKind)> {
    [
        (ENV_BIN, PathKind::Program),
        (gpucr_cuda_driver::ENV_LIBRARY, PathKind::Library),
        (ENV_ENGINE_LOG, PathKind::LogFile),
        (sim::ENV_ROOT, PathKind::Directory),
        (sim::ENV_DEVICE, PathKind::CharDevice),
    ]
    .into_iter()
    .find(|(variable, _)| *variable == name)
}

/// A path setting (`kind` of `variable`): an absolute path, since CRIU runs in a
/// directory of the container engine's choosing (and the plugin finds the CUDA library
/// among a process's mappings by its path), naming what the reader opens: a program
/// that may be run, a regular file to load, a file whose directory exists, a
/// directory, a character device. The plugin trims a value as it reads it; so does
/// this check.
fn check_path(
    value: &str,
    (variable, kind): (&'static str, PathKind),
) -> Result<(), SettingsError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = std::path::Path::new(value.trim());
    if !path.is_absolute() {
        let why = match kind {
            PathKind::Library => {
                "not an absolute path (the plugin recognises a CUDA process by this \
                 path among its mappings)"
            }
            _ => "not an absolute path (CRIU runs in a directory of the container engine's)",
        };
        return Err(bad(variable, value, why.into()));
    }
    let looked_at = |path: &std::path::Path| {
        std::fs::metadata(path).map_err(|e| {
            let detail = match e.kind() {
                std::io::ErrorKind::NotFound => format!("{} does not exist", path.display()),
                _ => format!("cannot look at {}: {e}", path.display()),
            };
            bad(variable, value, detail)
        })
    };
    if kind == PathKind::LogFile {
        let dir = path.parent().unwrap_or(path);
        if !looked_at(dir)?.is_dir() {
            return Err(bad(
                variable,
                value,
                format!("{} is not a directory", dir.display()),
            ));
        }
        return match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                Err(bad(variable, value, "a directory, not a file".into()))
            }
            _ => Ok(()),
        };
    }
    let meta = looked_at(path)?;
    let file_type = meta.file_type();
    let detail = match kind {
        PathKind::Program | PathKind::Library if !file_type.is_file() => "not a regular file",
        PathKind::Program if meta.permissions().mode() & 0o111 == 0 => "not executable",
        PathKind::Directory if !file_type.is_dir() => "not a directory",
        PathKind::CharDevice if !file_type.is_char_device() => "not a character device",
        _ => return Ok(()),
    };
    Err(bad(variable, value, detail.into()))
}

/// `GPUCR_ENGINE`: the plugin stays out of a CRIU gpucr did not start for `0` and
/// takes part for anything else, so a word meant as "off" (`no`, `off`) would leave it
/// in: only `0` and `1` are taken.
fn check_engine_switch(value: &str) -> Result<(), SettingsError> {
    match value.trim() {
        "0" | "1" => Ok(()),
        _ => Err(bad(
            ENV_ENGINE,
            value,
            "not 0 (the plugin stays out of a CRIU gpucr did not start) or 1 (it takes \
             part, the default); engine mode reads any value but 0 as 1"
                .into(),
        )),
    }
}

/// `GPUCR_FAULT`: the name of a step where a fault can be injected.
fn check_fault_step(value: &str) -> Result<(), SettingsError> {
    let wanted = value.trim();
    if FaultStep::ALL.iter().any(|step| step.name() == wanted) {
        return Ok(());
    }
    let names: Vec<&str> = FaultStep::ALL.iter().map(|step| step.name()).collect();
    Err(bad(
        ENV_FAULT,
        value,
        format!("not a step of a dump or a restore ({})", names.join(", ")),
    ))
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

/// A yes/no setting, read with the words `gpucr dump` reads the switch's flag with from
/// the environment (clap's `BoolishValueParser`, which a test checks these against).
fn parse_switch(variable: &'static str, text: &str) -> Result<bool, SettingsError> {
    const YES: [&str; 6] = ["y", "yes", "t", "true", "on", "1"];
    const NO: [&str; 6] = ["n", "no", "f", "false", "off", "0"];
    let word = text.trim();
    let is = |words: &[&str]| words.iter().any(|w| w.eq_ignore_ascii_case(word));
    (if is(&YES) {
        Ok(true)
    } else if is(&NO) {
        Ok(false)
    } else {
        Err(())
    })
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
            ("GPUCR_SIM_ROOT", "/"),
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
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        for (name, value) in [
            (ENV_COMPRESS, "zstd"),
            ("GPUCR_BIN", exe),
            ("GPUCR_ENGINE", "0"),
            ("GPUCR_ENGINE_LOG", "/tmp/engine.log"),
            ("GPUCR_CUDA_LIBRARY", exe),
            ("GPUCR_SIM_ROOT", "/tmp"),
            ("GPUCR_SIM_DEVICE", "/dev/null"),
            ("GPUCR_FAULT", "copy"),
            ("GPUCR_FAKE_CUDA_DIR", "/x"),
            ("GPUCR_FAKE_CUDA_STEP_MS", "/x"),
        ] {
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

    /// The paths engine mode reads are checked for what their readers open: absolute
    /// (CRIU's working directory is the engine's), and naming a program that can run,
    /// a library file, a log file whose directory exists, a directory or a character
    /// device; a refusal names the variable, the value and what is wrong. The plugin's
    /// trimming of a value is this check's too.
    #[test]
    fn install_checks_paths_for_what_their_readers_open() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap().to_owned();
        let program = tmp.path().join("gpucr");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = program.to_str().unwrap().to_owned();
        let data = tmp.path().join("data");
        std::fs::write(&data, "").unwrap();
        let data = data.to_str().unwrap().to_owned();
        let missing = format!("{dir}/missing");
        let log = format!("{dir}/engine.log");
        let padded = format!(" {program} ");
        for (name, value) in [
            (ENV_BIN, program.as_str()),
            (ENV_BIN, padded.as_str()),
            (gpucr_cuda_driver::ENV_LIBRARY, data.as_str()),
            (ENV_ENGINE_LOG, log.as_str()),
            (ENV_ENGINE_LOG, data.as_str()),
            (sim::ENV_ROOT, dir.as_str()),
            (sim::ENV_DEVICE, "/dev/null"),
        ] {
            check_setting(name, value).unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
        let missing_dir_log = format!("{missing}/engine.log");
        let below_a_file = format!("{data}/engine.log");
        for (name, value, detail) in [
            (
                ENV_BIN,
                "gpucr",
                "not an absolute path (CRIU runs in a directory of the container engine's)"
                    .to_owned(),
            ),
            (
                ENV_BIN,
                missing.as_str(),
                format!("{missing} does not exist"),
            ),
            (ENV_BIN, dir.as_str(), "not a regular file".to_owned()),
            (ENV_BIN, data.as_str(), "not executable".to_owned()),
            (
                gpucr_cuda_driver::ENV_LIBRARY,
                "libcuda.so.1",
                "not an absolute path (the plugin recognises a CUDA process by this path \
                 among its mappings)"
                    .to_owned(),
            ),
            (
                gpucr_cuda_driver::ENV_LIBRARY,
                missing.as_str(),
                format!("{missing} does not exist"),
            ),
            (
                gpucr_cuda_driver::ENV_LIBRARY,
                "/dev/null",
                "not a regular file".to_owned(),
            ),
            (
                ENV_ENGINE_LOG,
                "engine.log",
                "not an absolute path (CRIU runs in a directory of the container engine's)"
                    .to_owned(),
            ),
            (
                ENV_ENGINE_LOG,
                missing_dir_log.as_str(),
                format!("{missing} does not exist"),
            ),
            (
                ENV_ENGINE_LOG,
                below_a_file.as_str(),
                format!("{data} is not a directory"),
            ),
            (
                ENV_ENGINE_LOG,
                dir.as_str(),
                "a directory, not a file".to_owned(),
            ),
            (
                sim::ENV_ROOT,
                missing.as_str(),
                format!("{missing} does not exist"),
            ),
            (sim::ENV_ROOT, data.as_str(), "not a directory".to_owned()),
            (
                sim::ENV_DEVICE,
                data.as_str(),
                "not a character device".to_owned(),
            ),
        ] {
            let e = check_setting(name, value).unwrap_err();
            assert_eq!(variable_of(&e), name);
            assert_eq!(e.to_string(), format!("{name}={value:?}: {detail}"));
        }
    }

    /// `GPUCR_ENGINE` is 0 or 1 (engine mode reads any other value as 1, so `no` would
    /// leave the plugin in), and `GPUCR_FAULT` one of the steps fault injection knows.
    #[test]
    fn install_checks_the_engine_switch_and_the_fault_step() {
        for (name, value) in [
            (ENV_ENGINE, "0"),
            (ENV_ENGINE, " 1"),
            (ENV_FAULT, "pause"),
            (ENV_FAULT, "plugin-resume"),
        ] {
            check_setting(name, value).unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
        for (name, value, detail) in [
            (ENV_ENGINE, "no", "engine mode reads any value but 0 as 1"),
            (ENV_ENGINE, "off", "engine mode reads any value but 0 as 1"),
            (
                ENV_FAULT,
                "dump",
                "not a step of a dump or a restore (plugin-pause, pause,",
            ),
        ] {
            let e = check_setting(name, value).unwrap_err();
            assert_eq!(variable_of(&e), name);
            let text = e.to_string();
            assert!(text.starts_with(&format!("{name}={value:?}: ")), "{text}");
            assert!(text.contains(detail), "{text}");
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
