//! Engine mode's start-up contract between gpucr's plugin and the helper it starts
//! (`gpucr engine-helper`) when CRIU was started by a container engine, not by gpucr.
//!
//! The plugin runs `GPUCR_BIN engine-helper dump|restore --images-dir DIR --criu-pid
//! PID [--pid ROOT]` with the helper's end of a socketpair at [`CONNECTOR_FD`] and the
//! write end of a pipe at [`STATUS_FD`]; the helper writes one status line there
//! ([`Status`]) and closes it.

/// The connector's number in the helper's fd table.
pub const CONNECTOR_FD: i32 = 3;
/// The status pipe's number in the helper's fd table.
pub const STATUS_FD: i32 = 4;
/// The settings file beside the installed plugin: `NAME=VALUE` lines (`#` comments)
/// for the `GPUCR_*` variables and `CUDA_VISIBLE_DEVICES`, used where CRIU's own
/// environment does not set them (engines do not pass their caller's environment on).
pub const SETTINGS_FILE: &str = "gpucr_plugin.conf";
/// The gpucr binary the plugin runs as the helper.
pub const ENV_BIN: &str = "GPUCR_BIN";
/// Set to `0` to keep the plugin out of a CRIU that gpucr did not start.
pub const ENV_ENGINE: &str = "GPUCR_ENGINE";
/// A file the engine helper appends its stderr to (default: none).
pub const ENV_ENGINE_LOG: &str = "GPUCR_ENGINE_LOG";
/// `--compress` of `gpucr dump` (default zstd).
pub const ENV_COMPRESS: &str = "GPUCR_COMPRESS";
/// `--jobs` (default: the number of CPU cores).
pub const ENV_JOBS: &str = "GPUCR_JOBS";
/// `--device-timeout` in seconds (default 120).
pub const ENV_DEVICE_TIMEOUT: &str = "GPUCR_DEVICE_TIMEOUT";
/// `--no-page-checksums` of `gpucr dump`: yes/no (default no).
pub const ENV_NO_PAGE_CHECKSUMS: &str = "GPUCR_NO_PAGE_CHECKSUMS";

/// The variables of the fake CUDA driver library (`gpucr-fake-cuda`, docs/cuda.md),
/// which the helper loads when `GPUCR_CUDA_LIBRARY` names it.
pub const FAKE_CUDA_PREFIX: &str = "GPUCR_FAKE_CUDA_";

/// CRIU's own GPU plugins, as `make install` and distributions put them in CRIU's plugin
/// directory. CRIU calls each hook on its plugins in directory order and stops at the
/// first one that answers, so beside gpucr's plugin either may take a GPU process and
/// the other never sees it.
pub const CRIU_GPU_PLUGINS: [&str; 2] = ["cuda_plugin.so", "amdgpu_plugin.so"];

/// CRIU's own GPU plugins present in the plugin directory `dir`.
pub fn criu_gpu_plugins_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    CRIU_GPU_PLUGINS
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .collect()
}

/// What the helper says on the status pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Serving the named backend.
    Ready(String),
    /// The tree holds no device gpucr handles: the plugin stays out of the way.
    None,
    /// Setting up failed: the reason, for CRIU's log and the engine's error.
    Error(String),
}

impl Status {
    /// The line the helper writes.
    pub fn line(&self) -> String {
        match self {
            Status::Ready(backend) => format!("ready {backend}\n"),
            Status::None => "none\n".into(),
            Status::Error(message) => format!("error {message}\n"),
        }
    }

    /// Parse what the helper wrote before the pipe closed.
    pub fn parse(text: &str) -> Status {
        let text = text.trim_end();
        if let Some(backend) = text.strip_prefix("ready ") {
            Status::Ready(backend.to_owned())
        } else if text == "none" {
            Status::None
        } else if let Some(message) = text.strip_prefix("error ") {
            Status::Error(message.to_owned())
        } else if text.is_empty() {
            Status::Error("the gpucr helper exited before it was ready".into())
        } else {
            Status::Error(format!("the gpucr helper said {text:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back() {
        for s in [
            Status::Ready("sim".into()),
            Status::None,
            Status::Error("GPU 1 is missing\n  here".into()),
        ] {
            assert_eq!(Status::parse(&s.line()), s);
        }
        assert!(matches!(Status::parse(""), Status::Error(_)));
        assert!(matches!(Status::parse("what"), Status::Error(m) if m.contains("what")));
    }
}
