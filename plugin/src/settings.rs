//! What configures one CRIU run of the plugin, read once, at `init`, into the run
//! ([`crate::run::PluginRun`]): from the environment CRIU was given (where gpucr puts
//! the connector's number and the backend on the `criu swrk` child), completed in
//! engine mode by the settings file beside the plugin ([`crate::engine`]). Nothing of
//! the plugin reads its configuration from the environment after that, or sets any.

use std::ffi::OsString;
use std::path::PathBuf;

use gpucr_abi::engine::{ENV_BIN, ENV_ENGINE, ENV_ENGINE_LOG};
use gpucr_abi::fault::{FaultStep, ENV_FAULT};
use gpucr_abi::sim::ENV_ROOT as ENV_SIM_ROOT;
use gpucr_abi::{ENV_BACKEND, ENV_DEFER_GIVE_BACK, ENV_HELPER_FD, ENV_STOP_AFTER_DUMP};
use gpucr_cuda_driver::ENV_LIBRARY as ENV_CUDA_LIBRARY;

/// One CRIU run's settings. `Default` is a CRIU gpucr did not start, with nothing set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `GPUCR_HELPER_FD`: the connector's number in CRIU's table, set when gpucr
    /// started CRIU (None: engine mode, or no gpucr at all).
    pub helper_fd: Option<String>,
    /// `GPUCR_BACKEND`: the backend whose plugin half serves the run.
    pub backend: Option<OsString>,
    /// `GPUCR_SIM_ROOT`: the simulator's root (not empty).
    pub sim_root: Option<PathBuf>,
    /// `GPUCR_FAULT`: the step at which a test injects a failure.
    pub fault: Option<OsString>,
    /// `GPUCR_ENGINE=0`: engine mode keeps out of every CRIU gpucr did not start.
    pub engine_off: bool,
    /// `GPUCR_BIN`: the gpucr binary engine mode starts as the helper (not empty).
    pub bin: Option<PathBuf>,
    /// `GPUCR_ENGINE_LOG`: the file that helper's stderr is appended to (not empty).
    pub engine_log: Option<PathBuf>,
    /// `GPUCR_CUDA_LIBRARY`: a CUDA driver library engine mode recognises a CUDA
    /// process by (not empty).
    pub cuda_library: Option<PathBuf>,
    /// `GPUCR_STOP_AFTER_DUMP`: the root of the tree to stop at the end of a dump that
    /// succeeded (a pid; anything else is no pid).
    pub stop_after_dump: Option<i32>,
    /// `GPUCR_DEFER_GIVE_BACK=1`: a dump that succeeds leaves the devices as it made
    /// them, so no restore thread runs at its exit hook.
    pub defer_give_back: bool,
    /// The settings file's lines whose names CRIU's environment does not have, in
    /// order: the environment engine mode adds for the helper it starts.
    pub from_file: Vec<(String, String)>,
}

impl Settings {
    /// The settings in CRIU's environment.
    pub fn from_environment() -> Settings {
        Settings::from_sources(|name| std::env::var_os(name), Vec::new())
    }

    /// The settings in CRIU's environment, completed by a settings file's `lines`
    /// (name, value; the last of a name wins).
    pub fn from_environment_and_file(lines: Vec<(String, String)>) -> Settings {
        Settings::from_sources(|name| std::env::var_os(name), lines)
    }

    /// The settings in `environment`, completed by the settings file's `lines`: a line
    /// counts where the environment lacks its name.
    fn from_sources(
        environment: impl Fn(&str) -> Option<OsString>,
        lines: Vec<(String, String)>,
    ) -> Settings {
        let from_file: Vec<(String, String)> = lines
            .into_iter()
            .filter(|(name, _)| environment(name).is_none())
            .collect();
        let lookup = |name: &str| {
            environment(name).or_else(|| {
                from_file
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, value)| value.into())
            })
        };
        let settings = Settings::read(lookup);
        Settings {
            from_file,
            ..settings
        }
    }

    /// The settings `lookup` gives each name.
    fn read(lookup: impl Fn(&str) -> Option<OsString>) -> Settings {
        let not_empty = |name: &str| lookup(name).filter(|v| !v.is_empty());
        Settings {
            helper_fd: lookup(ENV_HELPER_FD).map(|v| v.to_string_lossy().into_owned()),
            backend: lookup(ENV_BACKEND),
            sim_root: not_empty(ENV_SIM_ROOT).map(PathBuf::from),
            fault: lookup(ENV_FAULT),
            engine_off: lookup(ENV_ENGINE)
                .and_then(|v| v.into_string().ok())
                .is_some_and(|v| v.trim() == "0"),
            bin: not_empty(ENV_BIN).map(PathBuf::from),
            engine_log: not_empty(ENV_ENGINE_LOG).map(PathBuf::from),
            cuda_library: not_empty(ENV_CUDA_LIBRARY).map(PathBuf::from),
            stop_after_dump: lookup(ENV_STOP_AFTER_DUMP)
                .and_then(|v| v.to_str()?.trim().parse().ok())
                .filter(|pid: &i32| *pid > 0),
            defer_give_back: lookup(ENV_DEFER_GIVE_BACK).is_some_and(|v| v == "1"),
            from_file: Vec::new(),
        }
    }

    /// Whether `GPUCR_FAULT` names `step`.
    pub fn injects(&self, step: FaultStep) -> bool {
        self.fault.as_deref().is_some_and(|f| f == step.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn each_setting_is_read_and_empty_paths_are_unset() {
        let s = Settings::read(vars(&[
            (ENV_HELPER_FD, "7"),
            (ENV_BACKEND, "sim"),
            (ENV_SIM_ROOT, ""),
            (ENV_FAULT, "plugin-pause"),
            (ENV_ENGINE, " 0 "),
            (ENV_BIN, "/g"),
            (ENV_STOP_AFTER_DUMP, " 42"),
            (ENV_DEFER_GIVE_BACK, "1"),
        ]));
        assert_eq!(s.stop_after_dump, Some(42));
        assert!(s.defer_give_back);
        assert!(!Settings::read(vars(&[(ENV_DEFER_GIVE_BACK, "0")])).defer_give_back);
        assert_eq!(s.helper_fd.as_deref(), Some("7"));
        assert_eq!(s.backend, Some("sim".into()));
        assert_eq!(s.sim_root, None);
        assert!(s.engine_off);
        assert_eq!(s.bin, Some("/g".into()));
        assert!(s.injects(FaultStep::PluginPause));
        assert!(!s.injects(FaultStep::PluginCheckpoint));
        assert_eq!(Settings::read(vars(&[])), Settings::default());
        assert!(!Settings::read(vars(&[(ENV_ENGINE, "1")])).engine_off);
        for not_a_pid in ["", "0", "-1", "x"] {
            let s = Settings::read(vars(&[(ENV_STOP_AFTER_DUMP, not_a_pid)]));
            assert_eq!(s.stop_after_dump, None, "{not_a_pid:?}");
        }
    }

    #[test]
    fn the_settings_file_fills_in_only_what_the_environment_lacks() {
        let environment = vars(&[(ENV_BIN, "/env/gpucr"), ("GPUCR_JOBS", "4")]);
        let settings = Settings::from_sources(
            environment,
            vec![
                (ENV_BIN.into(), "/file/gpucr".into()),
                ("GPUCR_JOBS".into(), "2".into()),
                (ENV_SIM_ROOT.into(), "/sim".into()),
                ("GPUCR_COMPRESS".into(), "none".into()),
            ],
        );
        assert_eq!(settings.bin, Some("/env/gpucr".into()));
        assert_eq!(settings.sim_root, Some("/sim".into()));
        assert_eq!(
            settings.from_file,
            [
                (ENV_SIM_ROOT.to_string(), "/sim".to_string()),
                ("GPUCR_COMPRESS".to_string(), "none".to_string()),
            ]
        );
    }
}
