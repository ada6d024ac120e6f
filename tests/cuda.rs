//! The cuda backend end to end with real CRIU and the fake CUDA driver
//! (`gpucr-fake-cuda`, loaded through `GPUCR_CUDA_LIBRARY` by the workload and by
//! gpucr alike): a tree of CUDA processes is locked before the freeze, checkpointed by
//! the driver through each process's restore thread (which gpucr's plugin lets run),
//! dumped, killed, its device memory wiped, restored, and every byte verified.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;

/// A temporary fake-driver directory and the environment that points at it.
struct FakeCuda {
    dir: tempfile::TempDir,
    library: PathBuf,
}

impl FakeCuda {
    fn new() -> FakeCuda {
        let library = gpucr_bin().parent().unwrap().join("libgpucr_fake_cuda.so");
        assert!(
            library.exists(),
            "{} is missing: run `cargo build --workspace --lib`",
            library.display()
        );
        FakeCuda {
            dir: tempfile::tempdir().unwrap(),
            library,
        }
    }

    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("GPUCR_CUDA_LIBRARY", self.library.to_str().unwrap()),
            ("GPUCR_FAKE_CUDA_DIR", self.dir.path().to_str().unwrap()),
            ("GPUCR_FAKE_CUDA_GPUS", "2"),
        ]
    }

    /// Every process's device-memory files (`CTX/mem-<uuid>`).
    fn device_memory_files(&self) -> Vec<PathBuf> {
        fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter_map(|ctx| fs::read_dir(ctx.path()).ok())
            .flat_map(|files| files.flatten())
            .filter(|f| f.file_name().to_string_lossy().starts_with("mem-"))
            .map(|f| f.path())
            .collect()
    }

    /// Delete every process's device memory, as a dead process's is on a real GPU.
    fn wipe_device_memory(&self) -> usize {
        let files = self.device_memory_files();
        for file in &files {
            fs::remove_file(file).unwrap();
        }
        files.len()
    }
}

fn start(fake: &FakeCuda, state: &Path, procs: usize) -> SimTree {
    start_with(fake, state, procs, &[])
}

/// [`start`] with more environment for the workload's driver (the targets' own fake).
fn start_with(fake: &FakeCuda, state: &Path, procs: usize, extra: &[(&str, &str)]) -> SimTree {
    let bin = gpucr_bin().parent().unwrap().join("examples/cuda_workload");
    let roles = ["parent", "child", "child2", "child3"][..procs].to_vec();
    let procs = procs.to_string();
    let mut env = fake.env();
    env.extend_from_slice(extra);
    SimTree::start_program(
        &bin,
        state,
        fake.dir.path(),
        &["--procs", &procs, "--mib", "24"],
        &env,
        roles,
    )
}

/// One driver call of the fake's call log (`GPUCR_FAKE_CUDA_LOG`).
#[derive(Debug, Clone)]
struct Call {
    caller: i32,
    function: String,
    target: Option<i32>,
    result: String,
    start_ns: u64,
    end_ns: u64,
}

fn read_calls(log: &Path) -> Vec<Call> {
    let text = fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            };
            Call {
                caller: field("pid").parse().unwrap(),
                function: field("fn").to_owned(),
                target: field("target").parse().ok(),
                result: field("result").to_owned(),
                start_ns: field("start_ns").parse().unwrap(),
                end_ns: field("end_ns").parse().unwrap(),
            }
        })
        .collect()
}

/// The successful calls of `function`, one per target.
fn calls_of<'a>(calls: &'a [Call], function: &str) -> Vec<&'a Call> {
    calls
        .iter()
        .filter(|c| c.function == function && c.result == "CUDA_SUCCESS")
        .collect()
}

/// Whether every call of `calls` was running at one same moment.
fn all_overlap(calls: &[&Call]) -> bool {
    let latest_start = calls.iter().map(|c| c.start_ns).max().unwrap_or(0);
    let earliest_end = calls.iter().map(|c| c.end_ns).min().unwrap_or(0);
    latest_start < earliest_end
}

/// A 4-process tree, each driver step taking 300 ms in the target: gpucr locks all four
/// at once before the freeze and checkpoints all four at once when the tree is frozen
/// (the call log shows the four locks, and the four checkpoints, in flight together),
/// and the image restores with every byte.
#[test]
fn cuda_tree_is_locked_and_checkpointed_in_parallel() {
    let _lock = criu_lock();
    let fake = FakeCuda::new();
    let tmp = tempfile::tempdir().unwrap();
    let tree = start_with(
        &fake,
        &tmp.path().join("state"),
        4,
        &[("GPUCR_FAKE_CUDA_STEP_MS", "300")],
    );
    let log = tmp.path().join("calls.log");
    let image = tmp.path().join("image");
    let mut env = fake.env();
    env.push(("GPUCR_FAKE_CUDA_LOG", log.to_str().unwrap()));
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
    );
    assert_success(&out);
    let calls = read_calls(&log);
    let mut targets: Vec<i32> = calls_of(&calls, "cuCheckpointProcessLock")
        .iter()
        .filter_map(|c| c.target)
        .collect();
    targets.sort_unstable();
    targets.dedup();
    assert_eq!(targets.len(), 4, "four CUDA processes: {calls:#?}");
    for function in ["cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint"] {
        let made = calls_of(&calls, function);
        assert_eq!(made.len(), 4, "{function} once per process: {made:#?}");
        assert!(
            made.iter().all(|c| c.caller == made[0].caller),
            "all from gpucr's helper"
        );
        assert!(
            all_overlap(&made),
            "the four {function} calls overlap: {made:#?}"
        );
    }
    let locks = calls_of(&calls, "cuCheckpointProcessLock");
    let checkpoints = calls_of(&calls, "cuCheckpointProcessCheckpoint");
    let last_lock = locks.iter().map(|c| c.end_ns).max().unwrap();
    assert!(
        checkpoints.iter().all(|c| c.start_ns > last_lock),
        "every process is locked before any is checkpointed"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(image.join("gpucr.json")).unwrap()).unwrap();
    for task in manifest["gpu"]["tasks"].as_array().unwrap() {
        let ops: Vec<&str> = task["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert_eq!(ops, ["pause", "checkpoint", "copy"], "{task}");
        let checkpoint = &task["operations"][1];
        assert!(
            checkpoint["duration_ms"].as_f64().unwrap() >= 300.0,
            "the checkpoint's own time is logged: {task}"
        );
    }
    kill_and_wait(tree.pid);
    assert_eq!(fake.wipe_device_memory(), 0);
    let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &fake.env());
    assert_success(&out);
    let _restored = Restored(stdout(&out).trim().parse().unwrap());
    assert!(tree.verify(2), "every byte is back on the device");
}

/// Three CUDA processes: dumped (the driver checkpoints each through its restore
/// thread), killed, their device memory wiped, restored (restore onto the same GPUs by
/// UUID, then unlock); every byte verifies and the kernels go on.
#[test]
fn cuda_tree_survives_dump_wipe_and_restore() {
    let _lock = criu_lock();
    let fake = FakeCuda::new();
    let tmp = tempfile::tempdir().unwrap();
    let tree = start(&fake, &tmp.path().join("state"), 3);
    assert!(tree.verify(1));
    assert!(
        !fake.device_memory_files().is_empty(),
        "the processes hold device memory"
    );
    let image = tmp.path().join("image");
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &fake.env(),
    );
    assert_success(&out);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(image.join("gpucr.json")).unwrap()).unwrap();
    assert_eq!(manifest["gpu"]["backend"], "cuda");
    let tasks = manifest["gpu"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    for task in tasks {
        assert_eq!(task["gpus"].as_array().unwrap().len(), 2, "{task}");
        let ops: Vec<&str> = task["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert_eq!(ops, ["pause", "checkpoint", "copy"], "{task}");
    }
    kill_and_wait(tree.pid);
    let steps_at_dump = tree.steps();
    assert_eq!(
        fake.wipe_device_memory(),
        0,
        "the driver moved the device memory into the processes, and CRIU dumped it"
    );
    let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &fake.env());
    assert_success(&out);
    let _restored = Restored(stdout(&out).trim().parse().unwrap());
    assert!(tree.verify(2), "every byte is back on the device");
    tree.wait_ticks(3);
    assert!(tree.steps() > steps_at_dump, "the kernels go on");
}

/// --leave-running: after the dump the driver restores and unlocks each process, so
/// the job runs on with every byte.
#[test]
fn cuda_leave_running_keeps_the_job_going() {
    let _lock = criu_lock();
    let fake = FakeCuda::new();
    let tmp = tempfile::tempdir().unwrap();
    let tree = start(&fake, &tmp.path().join("state"), 2);
    let steps_before = tree.steps();
    let image = tmp.path().join("image");
    let out = gpucr_env(
        &[
            "dump",
            "--leave-running",
            &tree.pid.to_string(),
            image.to_str().unwrap(),
        ],
        &fake.env(),
    );
    assert_success(&out);
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(tree.verify(1), "the memory is back on the device");
    assert!(
        tree.steps() > steps_before,
        "and the processes were unlocked"
    );
}

/// A driver that fails the checkpoint: the dump fails, and the processes that were
/// locked get unlocked, so the tree runs on with every byte.
#[test]
fn cuda_checkpoint_failure_leaves_the_tree_running() {
    let _lock = criu_lock();
    let fake = FakeCuda::new();
    let tmp = tempfile::tempdir().unwrap();
    let tree = start(&fake, &tmp.path().join("state"), 2);
    let steps_before = tree.steps();
    let image = tmp.path().join("image");
    let mut env = fake.env();
    env.push(("GPUCR_FAKE_CUDA_FAIL", "cuCheckpointProcessCheckpoint"));
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
    );
    assert!(!out.status.success());
    let log = fs::read_to_string(image.join("dump.log")).unwrap_or_default();
    assert!(
        format!("{}{log}", stderr(&out)).contains("cuCheckpointProcessCheckpoint"),
        "{}\n{log}",
        stderr(&out)
    );
    assert!(image.join("gpucr-incomplete.json").exists());
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(tree.verify(1));
    assert!(tree.steps() > steps_before, "unlocked again");
}
