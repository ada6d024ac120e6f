//! The fake's configuration, read from the environment once per process.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use gpucr_cuda_driver::Uuid;

use crate::fail::{self, FailRule};

/// Shared directory of the fake's contexts (required by `cuInit`).
pub const ENV_DIR: &str = "GPUCR_FAKE_CUDA_DIR";
/// The fake GPUs: a count (default 2) or a comma list of UUIDs.
pub const ENV_GPUS: &str = "GPUCR_FAKE_CUDA_GPUS";
/// The version `cuDriverGetVersion` reports (default 13000).
pub const ENV_VERSION: &str = "GPUCR_FAKE_CUDA_VERSION";
/// Seconds a controlling call waits for the target's restore thread (default 10).
pub const ENV_TIMEOUT: &str = "GPUCR_FAKE_CUDA_TIMEOUT";
/// Failure injection: `<function>[:<CUresult name or number>][@<nth call>]`, comma list.
pub const ENV_FAIL: &str = "GPUCR_FAKE_CUDA_FAIL";
/// Call recording: a file that gets one line per call.
pub const ENV_LOG: &str = "GPUCR_FAKE_CUDA_LOG";
/// Milliseconds `cuCtxSynchronize` takes (default 0): outstanding work a lock waits for.
pub const ENV_SYNC_MS: &str = "GPUCR_FAKE_CUDA_SYNC_MS";
/// Milliseconds the target's own work takes in each lock, checkpoint, restore and unlock
/// (default 0): the driver draining and moving device memory.
pub const ENV_STEP_MS: &str = "GPUCR_FAKE_CUDA_STEP_MS";
/// MiB per second each copy to or from a region mapped for custom storage moves at
/// (default: unlimited): a slow device, for tests of copies that take long but move.
pub const ENV_COPY_MIBPS: &str = "GPUCR_FAKE_CUDA_COPY_MIBPS";
/// `1`: a host-staged restore fails (`CUDA_ERROR_ILLEGAL_STATE`) when a page of the
/// staged memory is not resident as it begins (`mincore`): a driver that does not cope
/// with memory still to come through a userfaultfd (on-demand restore, `--lazy`).
pub const ENV_STAGED_RESIDENT: &str = "GPUCR_FAKE_CUDA_STAGED_RESIDENT";

/// The default number of fake GPUs.
pub const DEFAULT_GPUS: usize = 2;
/// The default reported version.
pub const DEFAULT_VERSION: i32 = 13000;
/// The default wait for a target, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 10.0;

/// A configuration value that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {message}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// The fake's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// [`ENV_DIR`].
    pub dir: Option<PathBuf>,
    /// [`ENV_GPUS`], as UUIDs by ordinal.
    pub gpus: Vec<Uuid>,
    /// [`ENV_VERSION`].
    pub version: i32,
    /// [`ENV_TIMEOUT`].
    pub timeout: Duration,
    /// [`ENV_FAIL`].
    pub fail: Vec<FailRule>,
    /// [`ENV_LOG`].
    pub log: Option<PathBuf>,
    /// [`ENV_SYNC_MS`].
    pub sync: Duration,
    /// [`ENV_STEP_MS`].
    pub step: Duration,
    /// [`ENV_COPY_MIBPS`], in bytes per second; None: unlimited.
    pub copy_rate: Option<u64>,
    /// [`ENV_STAGED_RESIDENT`].
    pub staged_resident: bool,
}

/// The UUID of fake GPU `index` when only a count is given: `GPU-fa6ec0da-0000-4000-8000-`
/// followed by the index in 12 hex digits.
pub fn gpu_uuid(index: usize) -> Uuid {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&[0xfa, 0x6e, 0xc0, 0xda]);
    b[6] = 0x40;
    b[8] = 0x80;
    b[10..].copy_from_slice(&(index as u64).to_be_bytes()[2..]);
    Uuid(b)
}

/// [`ENV_GPUS`]'s value as UUIDs.
pub fn parse_gpus(text: &str) -> Result<Vec<Uuid>, ConfigError> {
    let err = |message: String| ConfigError {
        var: ENV_GPUS,
        message,
    };
    let text = text.trim();
    if let Ok(n) = text.parse::<usize>() {
        if n > 64 {
            return Err(err(format!("{n} GPUs: at most 64")));
        }
        return Ok((0..n).map(gpu_uuid).collect());
    }
    let gpus = text
        .split(',')
        .map(|u| u.trim().parse::<Uuid>().map_err(|e| err(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, u) in gpus.iter().enumerate() {
        if gpus[..i].contains(u) {
            return Err(err(format!("{u} is listed twice")));
        }
    }
    Ok(gpus)
}

impl Config {
    /// From the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let gpus = match var(ENV_GPUS) {
            Some(v) => parse_gpus(&v)?,
            None => (0..DEFAULT_GPUS).map(gpu_uuid).collect(),
        };
        let version = match var(ENV_VERSION) {
            Some(v) => v.trim().parse().map_err(|_| ConfigError {
                var: ENV_VERSION,
                message: format!("{v:?} is not a number"),
            })?,
            None => DEFAULT_VERSION,
        };
        let seconds = |name: &'static str, default: f64| match var(name) {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or(ConfigError {
                    var: name,
                    message: format!("{v:?} is not a number of seconds"),
                }),
            None => Ok(Duration::from_secs_f64(default)),
        };
        let timeout = seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)?;
        let millis = |name: &'static str| match var(name) {
            Some(v) => v
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| ConfigError {
                    var: name,
                    message: format!("{v:?} is not a number of milliseconds"),
                }),
            None => Ok(Duration::ZERO),
        };
        let sync = millis(ENV_SYNC_MS)?;
        let step = millis(ENV_STEP_MS)?;
        let copy_rate = match var(ENV_COPY_MIBPS) {
            Some(v) => Some(
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&mibps| mibps > 0)
                    .map(|mibps| mibps << 20)
                    .ok_or(ConfigError {
                        var: ENV_COPY_MIBPS,
                        message: format!("{v:?} is not a positive number of MiB per second"),
                    })?,
            ),
            None => None,
        };
        let fail = match var(ENV_FAIL) {
            Some(v) => fail::parse(&v).map_err(|message| ConfigError {
                var: ENV_FAIL,
                message,
            })?,
            None => Vec::new(),
        };
        Ok(Self {
            dir: var(ENV_DIR).map(PathBuf::from),
            gpus,
            version,
            timeout,
            fail,
            log: var(ENV_LOG).map(PathBuf::from),
            sync,
            step,
            copy_rate,
            staged_resident: var(ENV_STAGED_RESIDENT).is_some_and(|v| v.trim() == "1"),
        })
    }
}

/// This process's configuration (read at the first call).
pub fn get() -> Result<&'static Config, &'static ConfigError> {
    static CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let c = Config::from_env();
            if let Err(e) = &c {
                eprintln!("gpucr-fake-cuda: {e}");
            }
            c
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_by_count_or_list() {
        let two = parse_gpus("2").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(
            two[1].to_string(),
            "GPU-fa6ec0da-0000-4000-8000-000000000001"
        );
        assert_ne!(two[0], two[1]);
        let list = parse_gpus(
            "GPU-fa6ec0da-0000-4000-8000-000000000007, GPU-00000000-0000-0000-0000-000000000001",
        )
        .unwrap();
        assert_eq!(list[0], gpu_uuid(7));
        assert!(parse_gpus("GPU-zz").is_err());
        assert!(parse_gpus(&format!("{},{}", gpu_uuid(1), gpu_uuid(1))).is_err());
    }
}
