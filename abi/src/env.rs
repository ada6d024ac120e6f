//! Every `GPUCR_*` environment variable: those gpucr's commands read, those engine mode
//! reads (gpucr's plugin in a CRIU a container engine started, and the helper it
//! starts), the simulator's, and the project's own test hooks and scripts'.
//!
//! One list, so that a name nothing reads is named instead of leaving a default in
//! force without a word (`GPUCR_COMPRES=none` for `GPUCR_COMPRESS`), so that engine
//! mode's settings file takes exactly the names engine mode reads, and so that gpucr(1)
//! lists them all. The gpucr crate's tests check the list against every `GPUCR_*` name
//! in the project's sources.

use std::fmt;

/// What every name of the list begins with.
pub const PREFIX: &str = "GPUCR_";

/// Who a variable is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// Users: gpucr's settings.
    User,
    /// The GPU simulator (docs/architecture.md), which stands in for a GPU in tests
    /// and demonstrations.
    Simulator,
    /// The project's tests, benchmarks and scripts, and the fault injection they use.
    Testing,
    /// Set by gpucr itself for the plugin in the CRIU it starts.
    Internal,
}

/// One `GPUCR_*` variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// The name, or for a family (the fake CUDA driver's) the prefix its names share,
    /// ending in `_`.
    pub name: &'static str,
    /// Read in engine mode, so that `gpucr_plugin.conf` may set it.
    pub engine: bool,
    pub audience: Audience,
    /// What it sets, in a line.
    pub meaning: &'static str,
}

impl Variable {
    /// Whether this entry names a family of variables by their prefix.
    pub fn is_family(&self) -> bool {
        self.name.ends_with('_')
    }

    /// The name as messages and gpucr(1) write it: a family as `PREFIX*`.
    pub fn shown(&self) -> String {
        if self.is_family() {
            format!("{}*", self.name)
        } else {
            self.name.to_owned()
        }
    }

    /// Whether `name` is this variable, or one of this family (a name past the prefix).
    pub fn matches(&self, name: &str) -> bool {
        if self.is_family() {
            name.strip_prefix(self.name)
                .is_some_and(|rest| !rest.is_empty())
        } else {
            name == self.name
        }
    }
}

const fn variable(
    name: &'static str,
    engine: bool,
    audience: Audience,
    meaning: &'static str,
) -> Variable {
    Variable {
        name,
        engine,
        audience,
        meaning,
    }
}

use Audience::{Internal, Simulator, Testing, User};

/// Every `GPUCR_*` variable, users' first.
pub const VARIABLES: &[Variable] = &[
    variable(
        "GPUCR_CRIU",
        false,
        User,
        "the CRIU binary gpucr runs (--criu)",
    ),
    variable(
        "GPUCR_CRIU_CONFIG",
        false,
        User,
        "a CRIU configuration file whose options gpucr checks and passes on (--criu-config)",
    ),
    variable(
        "GPUCR_PLUGIN",
        false,
        User,
        "gpucr's CRIU plugin (gpucr_plugin.so) for the CRIU gpucr runs; default: beside \
         the gpucr binary, else PREFIX/lib/gpucr/ of an installed gpucr",
    ),
    variable(
        crate::engine::ENV_COMPRESS,
        true,
        User,
        "how GPU memory is stored: none, zstd or zstd:LEVEL (--compress)",
    ),
    variable(
        crate::engine::ENV_JOBS,
        true,
        User,
        "threads moving GPU memory (--jobs)",
    ),
    variable(
        crate::engine::ENV_DEVICE_TIMEOUT,
        true,
        User,
        "seconds a device step may take before it is given up (--device-timeout)",
    ),
    variable(
        crate::engine::ENV_NO_PAGE_CHECKSUMS,
        true,
        User,
        "yes: a dump records CRIU's memory pages files by size only, not their checksums \
         (--no-page-checksums)",
    ),
    variable(
        "GPUCR_SYSFS_ROOT",
        false,
        User,
        "the sysfs tree check-topology reads instead of /sys (--sysfs-root)",
    ),
    variable(
        "GPUCR_CUDA_LIBRARY",
        true,
        User,
        "the CUDA driver library to load instead of libcuda.so.1",
    ),
    variable(
        "GPUCR_AMDGPU_FENCE_TIMEOUT",
        true,
        User,
        "how long an SDMA copy may take before it fails, e.g. 30s (the default) or 2min",
    ),
    variable(
        "GPUCR_AMDGPU_RINGS",
        true,
        User,
        "the SDMA rings copies may use, e.g. 0 or 0,1 (default: all)",
    ),
    variable(
        crate::engine::ENV_BIN,
        true,
        User,
        "engine mode: the gpucr binary the plugin starts as its helper",
    ),
    variable(
        crate::engine::ENV_ENGINE,
        true,
        User,
        "engine mode: 0 keeps gpucr's plugin out of a CRIU that gpucr did not start",
    ),
    variable(
        crate::engine::ENV_ENGINE_LOG,
        true,
        User,
        "engine mode: a file the helper appends its messages to",
    ),
    variable(
        crate::sim::ENV_ROOT,
        true,
        Simulator,
        "the simulator's root directory (on tmpfs); set, it makes the simulator a backend",
    ),
    variable(
        "GPUCR_SIM_DEVICE",
        true,
        Simulator,
        "the device node a simulated GPU process holds open (default /dev/fuse)",
    ),
    variable(
        "GPUCR_SIM_COPY_BW",
        true,
        Simulator,
        "the simulated copy engines' bandwidth, e.g. 1.6GB/s (default: unthrottled)",
    ),
    variable(
        "GPUCR_SIM_DRIVER_TIMEOUT",
        true,
        Simulator,
        "seconds a request to the simulated NVIDIA driver may take",
    ),
    variable(
        crate::fault::ENV_FAULT,
        true,
        Testing,
        "the step of a dump or restore to fail, to test that nothing is lost",
    ),
    variable(
        crate::engine::FAKE_CUDA_PREFIX,
        true,
        Testing,
        "the fake CUDA driver library's settings (docs/cuda.md)",
    ),
    variable(
        "GPUCR_FAKE_CUDA_LIB",
        false,
        Testing,
        "the fake CUDA driver library its own tests load",
    ),
    variable(
        "GPUCR_TEST_HELPER_FD",
        false,
        Testing,
        "a value handed to the plugin as its helper's fd instead of the real one",
    ),
    variable(
        "GPUCR_TEST_NO_THREAD_RUN",
        false,
        Testing,
        "the plugin does not let a process's driver thread run, to test that the \
         restore fails instead of hanging",
    ),
    variable(
        "GPUCR_CRIU_ABI",
        false,
        Testing,
        "the plugin hook ABI (4.1, 4.2 or 4.3) that abi/tests/criu_binary_abi.rs must \
         detect in the CRIU under test, for a CRIU whose version does not say it \
         (criu-dev calls itself 4.2)",
    ),
    variable(
        "GPUCR_CUDA_HEADERS_DIR",
        false,
        Testing,
        "where scripts/fetch-cuda-headers.sh caches CUDA's own headers, which the CUDA \
         layout tests compile against (default /var/cache/gpucr/cuda-headers)",
    ),
    variable(
        "GPUCR_WRITE_CUDA_H",
        false,
        Testing,
        "fake-cuda's header test rewrites fake-cuda/src/cuda_h.rs from the cached headers",
    ),
    variable(
        "GPUCR_BLESS",
        false,
        Testing,
        "the tests rewrite the generated man pages and completions",
    ),
    variable(
        "GPUCR_TESTS_MAY_SKIP",
        false,
        Testing,
        "the requirements (comma-separated: podman, root, ...) a test run may lack; \
         the tests that need them are listed as not run instead of failing",
    ),
    variable(
        "GPUCR_TEST_CUDA_TARGET",
        false,
        Testing,
        "set by the cuda tests for a test process of their own: the pid of the fake-driver \
         job whose cancelled cuda steps it makes (tests/cuda.rs)",
    ),
    variable(
        "GPUCR_TEST_LOCK_TIMEOUT",
        false,
        Testing,
        "seconds a test that runs CRIU waits for the tests' machine-wide lock before it \
         fails naming the holder (default 1800)",
    ),
    variable(
        "GPUCR_LAZY_QUIET_MS",
        false,
        User,
        "with restore --lazy: for up to 1 s after the tree is restored, the background \
         stream starts a block only once the tree has made no fault for this many \
         milliseconds, so that its first faults and reads have the disk (default 100, or 0 \
         when the image's pages are in the page cache; 0: stream at once; at most 10000)",
    ),
    variable(
        "GPUCR_LAZY_STAGING",
        false,
        Testing,
        "with restore --lazy of a CUDA image staged in host memory: `fill` (default) brings \
         each task's memory in before the driver's restore reads it, `lazy` leaves it to \
         the driver's faults (to measure whether a driver copes with userfaultfd)",
    ),
    variable(
        "GPUCR_TEST_LAZY_THROTTLE_MS",
        false,
        Testing,
        "milliseconds gpucr's lazy-pages server waits before each block it serves (on \
         fault or in the background), so that tests can act while a lazy restore serves",
    ),
    variable(
        "GPUCR_TEST_LAZY_GATE",
        false,
        Testing,
        "a file: until it exists, gpucr's lazy-pages server copies nothing in the background, \
         and serves no fault once CRIU's restore is over, so that a test sees a lazy restore \
         before its memory is in, whatever the machine's pace",
    ),
    variable(
        "GPUCR_TEST_MIGRATE_THROTTLE_MS",
        false,
        Testing,
        "milliseconds `gpucr migrate` waits after each chunk of the image it sends, so \
         that tests can cut the link while the image crosses",
    ),
    variable(
        "GPUCR_TEST_MIGRATE_NO_RESUMED",
        false,
        Testing,
        "set: `gpucr receive` closes the link after the source's commit without answering \
         Resumed, so that tests see the source keep its copy stopped (exit 13)",
    ),
    variable(
        "GPUCR_TEST_MIGRATE_HOLD_RESTORED_MS",
        false,
        Testing,
        "milliseconds `gpucr receive` holds the tree it restored, stopped, before it tells \
         the source, so that tests can kill the receiver in that window",
    ),
    variable(
        "GPUCR_BENCH_SESSION",
        false,
        Testing,
        "set by the benchmark scripts once they run in a session of their own",
    ),
    variable(
        "GPUCR_FRESH_CACHE",
        false,
        Testing,
        "where scripts/check-fresh.sh keeps its fresh Debian root",
    ),
    variable(
        "GPUCR_INSPECT_",
        false,
        Testing,
        "the settings of the inspect tests' workload",
    ),
    variable(
        "GPUCR_LAZY_HELPER",
        false,
        Internal,
        "set by `gpucr restore --lazy --detach` for the helper it starts, which restores \
         the tree and serves its memory after the command returned",
    ),
    variable(
        crate::ENV_HELPER_FD,
        false,
        Internal,
        "set by gpucr for its plugin: the helper's fd in CRIU",
    ),
    variable(
        crate::ENV_BACKEND,
        false,
        Internal,
        "set by gpucr for its plugin: the backend the plugin serves",
    ),
    variable(
        crate::ENV_STOP_AFTER_DUMP,
        false,
        Internal,
        "set by `gpucr migrate` for its plugin: the root of the tree the plugin stops at \
         the end of the dump, once its devices are given back",
    ),
    variable(
        crate::ENV_DEFER_GIVE_BACK,
        false,
        Internal,
        "set to 1 by `gpucr migrate --post-copy` for its plugin: the devices are given          back only once the move is decided, so no restore thread runs at the end of a          dump that succeeded",
    ),
];

/// The entry for `name`: the variable of that name, else the family it belongs to.
pub fn find(name: &str) -> Option<&'static Variable> {
    VARIABLES
        .iter()
        .find(|v| v.name == name && !v.is_family())
        .or_else(|| VARIABLES.iter().find(|v| v.matches(name)))
}

/// The milliseconds the test hook `name` (a listed pause or hold, `GPUCR_TEST_*_MS`)
/// asks for: None when it is unset or not a whole number.
pub fn test_millis(name: &str) -> Option<std::time::Duration> {
    debug_assert!(
        find(name).is_some_and(|v| v.audience == Audience::Testing),
        "{name} is not a listed test hook"
    );
    let millis = std::env::var(name).ok()?.parse().ok()?;
    Some(std::time::Duration::from_millis(millis))
}

/// The `GPUCR_*` names engine mode reads, which a settings file may set (families as
/// their prefix followed by `*`).
pub fn engine_settings() -> impl Iterator<Item = &'static Variable> {
    VARIABLES.iter().filter(|v| v.engine)
}

/// The `GPUCR_*` variables engine mode reads, for messages: names, and a family as
/// `PREFIX*`.
pub fn engine_settings_text() -> String {
    engine_settings()
        .map(|v| v.shown())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `name` is a `GPUCR_*` variable engine mode reads.
pub fn engine_reads(name: &str) -> bool {
    find(name).is_some_and(|v| v.engine)
}

/// A `GPUCR_*` name nothing of gpucr's reads, set in an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    pub name: String,
    /// The variable whose name is closest to it, if one is close.
    pub like: Option<&'static str>,
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is set, but nothing of gpucr's reads it", self.name)?;
        match self.like {
            Some(like) => write!(f, " (did you mean {like}?)"),
            None => write!(f, " (gpucr(1) lists the GPUCR_* variables)"),
        }
    }
}

/// The `GPUCR_*` names among `names` that no entry of the list is, each with the
/// closest variable's name where one is within a few edits.
pub fn unknown<I, S>(names: I) -> Vec<Unknown>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    names
        .into_iter()
        .filter_map(|name| {
            let name = name.as_ref();
            (name.starts_with(PREFIX) && find(name).is_none()).then(|| Unknown {
                name: name.to_owned(),
                like: closest(name),
            })
        })
        .collect()
}

/// The unknown `GPUCR_*` names of this process's environment.
pub fn unknown_in_environment() -> Vec<Unknown> {
    unknown(
        std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .collect::<Vec<_>>(),
    )
}

/// The variable (not a family) whose name is closest to `name` ([`closest_of`]).
fn closest(name: &str) -> Option<&'static str> {
    closest_of(
        name,
        PREFIX,
        VARIABLES.iter().filter(|v| !v.is_family()).map(|v| v.name),
    )
}

/// The name of `candidates` closest to `name`, if one is close: within 3 edits of the
/// part after `prefix`, and within a third of that part's length (no `GPUCR_BIN` for a
/// bare `GPUCR_`).
pub fn closest_of<'a>(
    name: &str,
    prefix: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    const MOST_EDITS: usize = 3;
    let rest = name.strip_prefix(prefix).unwrap_or(name);
    candidates
        .into_iter()
        .filter_map(|candidate| {
            let known = candidate.strip_prefix(prefix).unwrap_or(candidate);
            let edits = strsim::damerau_levenshtein(rest, known);
            (edits <= MOST_EDITS && edits * 3 <= known.len()).then_some((edits, candidate))
        })
        .min_by_key(|&(edits, _)| edits)
        .map(|(_, known)| known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_a_gpucr_name_listed_once() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        for name in &names {
            assert!(
                name.starts_with(PREFIX) && name.len() > PREFIX.len(),
                "{name}"
            );
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "a name listed twice");
    }

    #[test]
    fn families_take_the_names_past_their_prefix() {
        assert_eq!(
            find("GPUCR_FAKE_CUDA_DIR").unwrap().name,
            "GPUCR_FAKE_CUDA_"
        );
        assert!(find("GPUCR_FAKE_CUDA_").is_none());
        // A name of its own beats the family it would also belong to.
        assert_eq!(
            find("GPUCR_FAKE_CUDA_LIB").unwrap().name,
            "GPUCR_FAKE_CUDA_LIB"
        );
        assert!(engine_reads("GPUCR_FAKE_CUDA_STEP_MS"));
        assert!(!engine_reads("GPUCR_FAKE_CUDA_LIB"));
    }

    #[test]
    fn a_misspelt_name_is_unknown_and_the_close_one_suggested() {
        let found = unknown([
            "GPUCR_COMPRES",
            "GPUCR_COMPRESS",
            "PATH",
            "GPUCR_SIM_ROT",
            "GPUCR_SOMETHING_ELSE_ENTIRELY",
            "GPUCR_",
        ]);
        assert_eq!(
            found,
            vec![
                Unknown {
                    name: "GPUCR_COMPRES".into(),
                    like: Some("GPUCR_COMPRESS")
                },
                Unknown {
                    name: "GPUCR_SIM_ROT".into(),
                    like: Some("GPUCR_SIM_ROOT")
                },
                Unknown {
                    name: "GPUCR_SOMETHING_ELSE_ENTIRELY".into(),
                    like: None
                },
                Unknown {
                    name: "GPUCR_".into(),
                    like: None
                },
            ]
        );
        assert_eq!(
            found[0].to_string(),
            "GPUCR_COMPRES is set, but nothing of gpucr's reads it (did you mean \
             GPUCR_COMPRESS?)"
        );
        assert!(found[2]
            .to_string()
            .ends_with("(gpucr(1) lists the GPUCR_* variables)"));
    }

    #[test]
    fn engine_mode_reads_its_own_settings_and_not_what_gpucr_sets_for_its_plugin() {
        for name in [
            "GPUCR_BIN",
            "GPUCR_COMPRESS",
            "GPUCR_SIM_ROOT",
            "GPUCR_FAULT",
        ] {
            assert!(engine_reads(name), "{name}");
        }
        for name in [
            "GPUCR_HELPER_FD",
            "GPUCR_BACKEND",
            "GPUCR_CRIU",
            "GPUCR_BLESS",
        ] {
            assert!(!engine_reads(name), "{name}");
        }
    }
}
