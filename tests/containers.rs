//! Containers checkpointed and restored by a real container engine (podman, runc and the
//! machine's CRIU), with gpucr's plugin installed where that CRIU loads plugins, and
//! their archives read by `gpucr inspect` and `gpucr check-topology`.
//!
//! The plugin goes into a directory of the test's own, named to CRIU by the container's
//! `org.criu.config` annotation (a CRIU configuration file with `libdir`): runc hands
//! that file to its CRIU at checkpoint and at restore, so nothing is installed into
//! /usr/lib/criu and no other test's CRIU loads it.
//!
//! The container image is made here, offline: a root holding only /bin/sh, bash, sleep
//! and their libraries, imported with `podman import`. `scripts/setup.sh` installs podman
//! and runc; without podman on PATH the tests fail, unless `GPUCR_TESTS_MAY_SKIP` lists
//! `podman` (then they are reported as not run).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::{assert_success, gpucr, names_in, stderr, stdout, wait_for};
use serde_json::Value;

const IMAGE: &str = "localhost/gpucr-test-counter:latest";
/// podman's default rlimits are refused on these machines.
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// Whether the test may go on: podman is installed, or the run allows its absence
/// (`GPUCR_TESTS_MAY_SKIP=podman`) and the test is recorded as not run.
fn have_podman() -> bool {
    let found = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    gpucr_abi::testing::require(
        "podman",
        found,
        "containers are checkpointed by podman (scripts/setup.sh installs it)",
    )
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("run podman")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed\nstdout: {}\nstderr: {}{}",
        stdout(&out),
        stderr(&out),
        criu_errors_of(args)
    );
    stdout(&out)
}

/// For a failed `podman container checkpoint|restore ... NAME`: CRIU's errors and
/// gpucr's lines in the container's log of it (podman names the log only by path).
fn criu_errors_of(args: &[&str]) -> String {
    let which = match args {
        ["container", "checkpoint", ..] => "dump",
        ["container", "restore", ..] => "restore",
        _ => return String::new(),
    };
    let Some(name) = args.last().filter(|_| !args.contains(&"--import")) else {
        return String::new();
    };
    let out = podman(&["inspect", "--format", "{{.Id}}", name]);
    format!(
        "\nCRIU's {which}.log (errors and gpucr's lines):\n{}",
        log_lines_of(stdout(&out).trim(), which)
    )
}

/// The test's files: the image root, the plugin directory and CRIU's configuration
/// naming it, below the target's tmp directory (replaced on the next run).
struct Setup {
    dir: PathBuf,
    criu_conf: PathBuf,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("containers");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // The plugin, installed by the documented command.
        let libs = dir.join("criu-libs");
        let out = gpucr(&["install-plugin", "--criu-libdir", libs.to_str().unwrap()]);
        assert_success(&out);
        assert!(libs.join("gpucr_plugin.so").is_file());
        let criu_conf = dir.join("criu.conf");
        fs::write(&criu_conf, format!("libdir {}\n", libs.display())).unwrap();
        // The image: /bin/sh, bash and sleep with their libraries.
        let root = dir.join("root");
        for d in ["bin", "tmp", "proc", "sys", "dev", "etc", "state"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for bin in ["/bin/sh", "/bin/bash", "/bin/sleep"] {
            copy_with_libraries(Path::new(bin), &root);
        }
        // The simulator's GPU workload, for the GPU containers.
        let sim_workload = common::gpucr_bin()
            .parent()
            .unwrap()
            .join("examples/sim_workload");
        copy_with_libraries(&sim_workload, &root);
        fs::copy(&sim_workload, root.join("bin/sim_workload")).unwrap();
        // The CUDA workload, and the libraries the fake CUDA driver needs (the fake
        // itself is mounted at its own path, where gpucr's helper loads it too).
        let examples = common::gpucr_bin().parent().unwrap().join("examples");
        let cuda_workload = examples.join("cuda_workload");
        copy_with_libraries(&cuda_workload, &root);
        fs::copy(&cuda_workload, root.join("bin/cuda_workload")).unwrap();
        copy_with_libraries(&fake_cuda_library(), &root);
        let tar = dir.join("rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        podman_ok(&["import", tar.to_str().unwrap(), IMAGE]);
        Setup { dir, criu_conf }
    })
}

/// Copy `bin` and the libraries `ldd` names into `root`, at the same paths.
fn copy_with_libraries(bin: &Path, root: &Path) {
    let out = Command::new("ldd").arg(bin).output().unwrap();
    let mut files = vec![bin.to_path_buf()];
    for word in stdout(&out).split_whitespace() {
        if word.starts_with('/') {
            files.push(PathBuf::from(word));
        }
    }
    for f in files {
        let dest = root.join(f.strip_prefix("/").unwrap());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(&f, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", f.display()));
    }
}

/// A running container whose shell counts up in `state/counter`; removed when dropped.
///
/// The shell ticks with `read -t` on a pipe that never carries anything, not with a
/// `sleep` each tick: CRIU (its seizing code is the same in 4.1, 4.2 and 4.3) waits its
/// whole timeout and fails the dump ("Unseizable non-zombie N found, state D", then
/// "Unable to detach from N: No such process") when a task of the container exits
/// while CRIU seizes it. With a `sleep` forked each tick that happened to 1 checkpoint
/// in 15 under CRIU 4.1.1; with `read -t`, to none of 40 (2026-12-01).
struct Counter {
    name: String,
    state: PathBuf,
}

impl Counter {
    fn start(tag: &str) -> Counter {
        Counter::start_with_criu_conf(tag, &setup().criu_conf)
    }

    /// A counter whose CRIU reads `criu_conf` (its plugin directory).
    fn start_with_criu_conf(tag: &str, criu_conf: &Path) -> Counter {
        let s = setup();
        let name = format!("gpucr-test-{}-{tag}", std::process::id());
        let state = s.dir.join(format!("state-{tag}"));
        let _ = fs::remove_dir_all(&state);
        fs::create_dir_all(&state).unwrap();
        let _ = podman(&["rm", "-f", "-t", "0", &name]);
        let annotation = format!("org.criu.config={}", criu_conf.display());
        let volume = format!("{}:/state", state.display());
        let mut args = vec!["run", "-d", "--name", &name, "--annotation", &annotation];
        args.extend(ULIMITS);
        args.extend([
            "-v",
            &volume,
            IMAGE,
            "/bin/bash",
            "-c",
            "exec 3< <(exec sleep infinity); i=0; \
             while :; do i=$((i+1)); echo $i > /state/counter; read -t 0.1 -u 3; done",
        ]);
        podman_ok(&args);
        let c = Counter { name, state };
        c.wait_past(c.count());
        c
    }

    fn count(&self) -> u64 {
        fs::read_to_string(self.state.join("counter"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Wait until the counter is past `n`.
    fn wait_past(&self, n: u64) -> u64 {
        wait_for(Duration::from_secs(30), "the counter to go on", || {
            let now = self.count();
            (now > n).then_some(now)
        })
    }

    fn criu_log(&self, which: &str) -> String {
        criu_log(&self.name, which)
    }

    fn running(&self) -> bool {
        is_running(&self.name)
    }
}

/// Container `name`'s id.
fn container_id(name: &str) -> String {
    podman_ok(&["inspect", "--format", "{{.Id}}", name])
        .trim()
        .to_string()
}

/// CRIU's log of container `name`'s last checkpoint (`dump`) or restore (`restore`),
/// kept by podman's `--keep`.
fn criu_log(name: &str, which: &str) -> String {
    let path = format!(
        "/var/lib/containers/storage/overlay-containers/{}/userdata/{which}.log",
        container_id(name)
    );
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Whether container `name` exists and runs.
fn is_running(name: &str) -> bool {
    podman(&["inspect", "--format", "{{.State.Running}}", name])
        .status
        .success()
        && podman_ok(&["inspect", "--format", "{{.State.Running}}", name]).trim() == "true"
}

impl Drop for Counter {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// A plugin directory of a test's own, installed by the documented command with engine
/// mode's settings, and the CRIU configuration file naming it (the container's
/// `org.criu.config` annotation).
struct PluginDir {
    criu_conf: PathBuf,
    engine_log: PathBuf,
}

impl PluginDir {
    fn install(tag: &str, settings: &[&str]) -> PluginDir {
        let dir = setup().dir.join(format!("plugin-{tag}"));
        let _ = fs::remove_dir_all(&dir);
        // The engine log's directory must be there: install-plugin checks it.
        fs::create_dir_all(&dir).unwrap();
        let libs = dir.join("criu-libs");
        let engine_log = dir.join("engine.log");
        let log_setting = format!("GPUCR_ENGINE_LOG={}", engine_log.display());
        let mut args = vec!["install-plugin", "--criu-libdir", libs.to_str().unwrap()];
        for s in settings.iter().copied().chain([log_setting.as_str()]) {
            args.extend(["--setting", s]);
        }
        assert_success(&gpucr(&args));
        let criu_conf = dir.join("criu.conf");
        fs::write(&criu_conf, format!("libdir {}\n", libs.display())).unwrap();
        PluginDir {
            criu_conf,
            engine_log,
        }
    }

    fn engine_log(&self) -> String {
        fs::read_to_string(&self.engine_log).unwrap_or_default()
    }
}

/// The fake CUDA driver library (`gpucr-fake-cuda`).
fn fake_cuda_library() -> PathBuf {
    common::gpucr_bin()
        .parent()
        .unwrap()
        .join("libgpucr_fake_cuda.so")
}

/// What a GPU container runs: the simulator's workload with one of its driver models
/// (`kfd`: gpucr copies device memory; `nvidia`: the process's own simulated driver
/// moves it, and must be let run at RESUME_DEVICES_LATE), or the CUDA workload on the
/// fake CUDA driver (gpucr's cuda backend, as on an NVIDIA GPU).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    Sim(&'static str),
    FakeCuda,
}

/// A container running a GPU workload (a parent and a child process, each with device
/// memory on two GPUs): the simulator's, its device passed with `--device` and its sim
/// root mounted at the same path, or the CUDA workload, the fake driver's library and
/// directory mounted at their own paths; removed when dropped.
struct GpuContainer {
    name: String,
    sim: common::SimRoot,
    /// The fake CUDA driver's directory (device memory files), for [`Workload::FakeCuda`].
    fake_cuda: Option<PathBuf>,
    state: PathBuf,
    plugin: PluginDir,
}

impl GpuContainer {
    fn start(tag: &str, extra_settings: &[&str]) -> GpuContainer {
        GpuContainer::start_with_driver(tag, extra_settings, "kfd")
    }

    /// A container whose sim workload uses `driver`'s model.
    fn start_with_driver(tag: &str, extra_settings: &[&str], driver: &str) -> GpuContainer {
        let driver = if driver == "nvidia" { "nvidia" } else { "kfd" };
        GpuContainer::start_workload(tag, extra_settings, Workload::Sim(driver))
    }

    fn start_workload(tag: &str, extra_settings: &[&str], workload: Workload) -> GpuContainer {
        let s = setup();
        let sim = common::SimRoot::new(&format!("ctr-{tag}"));
        fs::create_dir_all(&sim.0).unwrap();
        let sim_path = sim.0.to_str().unwrap().to_owned();
        let fake_cuda = (workload == Workload::FakeCuda).then(|| {
            let dir = s.dir.join(format!("fake-cuda-{tag}"));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            dir
        });
        // The fake driver's environment, for the workload and gpucr's helper alike.
        let cuda_env: Vec<String> = match &fake_cuda {
            Some(dir) => vec![
                format!("GPUCR_CUDA_LIBRARY={}", fake_cuda_library().display()),
                format!("GPUCR_FAKE_CUDA_DIR={}", dir.display()),
                "GPUCR_FAKE_CUDA_GPUS=2".to_owned(),
            ],
            None => Vec::new(),
        };
        // gpucr's helper looks for the simulator first, where it is set up. The extra
        // settings go to the helper, and with the fake CUDA driver to the workload too
        // (they configure the fake on both sides).
        let mut settings = match workload {
            Workload::Sim(_) => vec![format!("GPUCR_SIM_ROOT={sim_path}")],
            Workload::FakeCuda => cuda_env.clone(),
        };
        settings.extend(extra_settings.iter().map(|s| s.to_string()));
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let plugin = PluginDir::install(tag, &settings);
        let name = format!("gpucr-test-{}-{tag}", std::process::id());
        let state = s.dir.join(format!("state-{tag}"));
        let _ = fs::remove_dir_all(&state);
        fs::create_dir_all(&state).unwrap();
        let _ = podman(&["rm", "-f", "-t", "0", &name]);
        let annotation = format!("org.criu.config={}", plugin.criu_conf.display());
        let state_volume = format!("{}:/state", state.display());
        let sim_volume = format!("{sim_path}:{sim_path}");
        let sim_env = format!("GPUCR_SIM_ROOT={sim_path}");
        let mut args = vec!["run", "-d", "--name", &name, "--annotation", &annotation];
        args.extend(ULIMITS);
        args.extend([
            // No network: nothing to restore there, and no address for a container
            // started meanwhile by another test to take.
            "--network",
            "none",
            "-v",
            &state_volume,
        ]);
        let library_dir = fake_cuda_library().parent().unwrap().display().to_string();
        let library_volume = format!("{library_dir}:{library_dir}:ro");
        let fake_volume = fake_cuda
            .as_ref()
            .map(|d| format!("{}:{}", d.display(), d.display()));
        match (workload, &fake_volume) {
            (Workload::Sim(driver), _) => args.extend([
                "--device",
                "/dev/fuse",
                "-v",
                &sim_volume,
                "-e",
                &sim_env,
                IMAGE,
                "/bin/sim_workload",
                "--state",
                "/state",
                "--gpus",
                "2",
                "--parent-mib",
                "48",
                "--child-mib",
                "24",
                "--driver",
                driver,
            ]),
            (Workload::FakeCuda, Some(fake_volume)) => {
                args.extend(["-v", &library_volume, "-v", fake_volume]);
                for e in cuda_env
                    .iter()
                    .map(String::as_str)
                    .chain(extra_settings.iter().copied())
                {
                    args.extend(["-e", e]);
                }
                args.extend([
                    IMAGE,
                    "/bin/cuda_workload",
                    "--state",
                    "/state",
                    "--procs",
                    "2",
                    "--mib",
                    "24",
                ]);
            }
            (Workload::FakeCuda, None) => unreachable!("a fake CUDA container has its directory"),
        }
        podman_ok(&args);
        let c = GpuContainer {
            name,
            sim,
            fake_cuda,
            state,
            plugin,
        };
        wait_for(
            Duration::from_secs(60),
            "the GPU workload to be ready",
            || {
                ["parent", "child"]
                    .iter()
                    .all(|r| c.state.join(format!("ready-{r}")).exists())
                    .then_some(())
            },
        );
        c.wait_ticks(2);
        c
    }

    fn steps(&self) -> u64 {
        ["parent", "child"]
            .iter()
            .map(|r| {
                common::read_journal(&self.state, r)
                    .pop()
                    .map_or(0, |l| l.num("steps"))
            })
            .sum()
    }

    fn wait_ticks(&self, n: usize) {
        let start: Vec<usize> = ["parent", "child"]
            .iter()
            .map(|r| common::read_journal(&self.state, r).len())
            .collect();
        wait_for(Duration::from_secs(60), "the GPU workload to tick", || {
            ["parent", "child"]
                .iter()
                .zip(&start)
                .all(|(r, s)| common::read_journal(&self.state, r).len() >= s + n)
                .then_some(())
        });
    }

    /// Every byte of every buffer of both processes checked by the workload itself.
    fn verify(&self, request: u64) -> bool {
        fs::write(self.state.join("verify"), request.to_string()).unwrap();
        wait_for(
            Duration::from_secs(120),
            "the buffers to be verified",
            || {
                let lines: Vec<common::JournalLine> = ["parent", "child"]
                    .iter()
                    .filter_map(|r| common::read_journal(&self.state, r).pop())
                    .collect();
                if lines.iter().any(|l| l.num("bad") != 0) {
                    return Some(false);
                }
                (lines.len() == 2 && lines.iter().all(|l| l.num("verified") >= request))
                    .then_some(true)
            },
        )
    }

    /// Delete the workload's device memory, as a dead process's is on a real GPU.
    fn wipe_device_memory(&self) {
        let _ = fs::remove_dir_all(self.sim.0.join("contexts"));
        let contexts = self.fake_cuda.iter().filter_map(|d| fs::read_dir(d).ok());
        for file in contexts
            .flatten()
            .flatten()
            .filter_map(|c| fs::read_dir(c.path()).ok())
        {
            for f in file.flatten() {
                if f.file_name().to_string_lossy().starts_with("mem-") {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
    }

    fn id(&self) -> String {
        container_id(&self.name)
    }

    fn criu_log(&self, which: &str) -> String {
        criu_log(&self.name, which)
    }

    /// CRIU's errors and gpucr's lines in the log of the last checkpoint or restore.
    fn log_lines(&self, which: &str) -> String {
        let out = podman(&["inspect", "--format", "{{.Id}}", &self.name]);
        log_lines_of(stdout(&out).trim(), which)
    }

    fn running(&self) -> bool {
        is_running(&self.name)
    }

    fn checkpoint(&self, archive: &Path, extra: &[&str]) -> Output {
        let _ = fs::remove_file(archive);
        let mut args = vec!["container", "checkpoint", "--keep"];
        args.extend_from_slice(extra);
        args.extend(["--export", archive.to_str().unwrap(), &self.name]);
        let _lock = common::criu_lock();
        podman(&args)
    }

    fn restore(&self, archive: &Path) -> Output {
        let _lock = common::criu_lock();
        podman(&[
            "container",
            "restore",
            "--keep",
            "--import",
            archive.to_str().unwrap(),
        ])
    }
}

impl Drop for GpuContainer {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// CRIU's errors and gpucr's lines in the log of container `id`'s last checkpoint or
/// restore (kept by podman's `--keep`).
fn log_lines_of(id: &str, which: &str) -> String {
    let path = format!("/var/lib/containers/storage/overlay-containers/{id}/userdata/{which}.log");
    fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("gpucr") || l.contains("rror"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn member_names(report: &Value) -> Vec<String> {
    report["archive"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Engine mode end to end: a container running the simulator's GPU workload is
/// checkpointed by podman with `--export` (runc's CRIU loads gpucr's plugin, which
/// starts gpucr's helper itself), removed, its device memory wiped, and restored with
/// `--import`; every byte of every buffer is verified by the workload and its kernels go
/// on. The archive carries gpucr's manifest and GPU memory under `checkpoint/`, and
/// `gpucr inspect --verify` says intact.
#[test]
fn gpu_container_round_trip_in_engine_mode() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start("gpu", &[]);
    let archive = setup().dir.join("gpu.tar.zst");
    let out = c.checkpoint(&archive, &[]);
    assert!(
        out.status.success(),
        "checkpoint failed: {}\nengine log: {}",
        stderr(&out),
        c.plugin.engine_log()
    );
    let log = c.criu_log("dump");
    assert!(
        log.contains("gpucr: engine mode: helper ready (sim)"),
        "{log}"
    );
    assert!(
        log.contains("gpucr: engine mode: GPU memory is in the image"),
        "{log}"
    );
    // The exit hook's step was answered (the helper did not end before its answer
    // reached the plugin).
    assert!(log.contains("gpucr: engine mode: DumpDone done"), "{log}");
    let steps = c.steps();
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    c.wipe_device_memory();

    let report = inspect_json(&archive, &[]);
    let members = member_names(&report);
    assert!(
        members.iter().any(|m| m == "checkpoint/gpucr.json"),
        "{members:?}"
    );
    assert!(
        members.iter().any(|m| m == "checkpoint/gpu/index"),
        "{members:?}"
    );
    assert_eq!(report["gpu"]["recorded"], true, "{}", report["gpu"]);
    // podman chose CRIU's options; the manifest does not pretend to record them.
    assert_eq!(report["image"]["options"]["set_by_engine"], true);
    let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
    assert_success(&out);
    assert!(stdout(&out).contains("intact"), "{}", stdout(&out));
    let out = gpucr(&["inspect", archive.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("Options: the container engine's"),
        "{}",
        stdout(&out)
    );

    let out = c.restore(&archive);
    assert!(
        out.status.success(),
        "restore failed: {}\nengine log: {}\nCRIU: {}",
        stderr(&out),
        c.plugin.engine_log(),
        c.log_lines("restore")
    );
    let log = c.criu_log("restore");
    assert!(
        log.contains("gpucr: engine mode: helper ready (sim)"),
        "{log}"
    );
    assert!(
        log.contains("gpucr: engine mode: RestoreDone done"),
        "{log}"
    );
    assert!(c.verify(1), "a buffer differs after the restore");
    c.wait_ticks(2);
    assert!(c.steps() > steps, "the kernels did not go on");
}

fn inspect_json(archive: &Path, args: &[&str]) -> Value {
    let mut all = vec!["inspect", "--json"];
    all.extend_from_slice(args);
    all.push(archive.to_str().unwrap());
    let out = gpucr(&all);
    assert_success(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A container that holds no device: checkpointed with `--export`, removed and restored
/// with `--import` with gpucr's plugin loaded by CRIU both times; the plugin stays out
/// of the way (no helper, nothing in the image) and the counter goes on. Then the
/// archive podman wrote: `gpucr inspect` shows the container, its processes with their
/// argv, and verifies it; `check-topology` finds no GPU state.
#[test]
fn plain_container_round_trip_with_the_plugin_installed() {
    if !have_podman() {
        return;
    }
    let c = Counter::start("plain");
    let archive = setup().dir.join("plain.tar.zst");
    let _ = fs::remove_file(&archive);
    {
        let _lock = common::criu_lock();
        podman_ok(&[
            "container",
            "checkpoint",
            "--keep",
            "--export",
            archive.to_str().unwrap(),
            &c.name,
        ]);
    }
    let log = c.criu_log("dump");
    assert!(
        log.contains("gpucr: plugin loaded (dump; hook ABI of CRIU "),
        "{log}"
    );
    assert!(!log.contains("gpucr: backend"), "{log}");
    let before = c.count();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.count(), before, "the checkpointed container stopped");
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    {
        let _lock = common::criu_lock();
        // A new address: a container another test started meanwhile may hold the old.
        podman_ok(&[
            "container",
            "restore",
            "--keep",
            "--ignore-static-ip",
            "--import",
            archive.to_str().unwrap(),
        ]);
    }
    let log = c.criu_log("restore");
    assert!(
        log.contains("gpucr: plugin loaded (restore; image needs gpucr: false; hook ABI of CRIU "),
        "{log}"
    );
    c.wait_past(before);

    // The archive podman wrote (listed by gpucr: the zstd tool is not installed).
    let report = inspect_json(&archive, &["--ps-tree-cmd"]);
    let listing = names_in(&report["archive"]["members"]);
    assert!(listing.contains(&"checkpoint/pstree.img"), "{listing:?}");
    assert!(!listing.contains(&"checkpoint/gpucr.json"), "{listing:?}");
    let container = &report["container"];
    assert_eq!(container["container_name"], c.name.as_str());
    assert_eq!(container["engine"], "Podman");
    assert_eq!(container["runtime"], "runc");
    assert_eq!(container["image"], IMAGE);
    assert_eq!(report["archive"]["compression"], "zstd");
    assert_eq!(report["image"]["complete"], true, "{}", report["image"]);
    let argv: Vec<String> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["cmdline"].as_array())
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert!(
        argv.iter().any(|a| a.contains("/state/counter")),
        "{argv:?}"
    );
    assert_eq!(report["gpu"]["recorded"], false);
    let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
    assert_success(&out);
    assert!(stdout(&out).contains("intact"), "{}", stdout(&out));
    let out = gpucr(&["check-topology", archive.to_str().unwrap()]);
    assert_success(&out);
    assert!(
        stdout(&out).contains("holds no GPU state"),
        "{}",
        stdout(&out)
    );
}

/// `--leave-running`: the container goes on while its checkpoint is written, with the
/// plugin loaded, and the archive is whole.
#[test]
fn leave_running_keeps_the_container_going() {
    if !have_podman() {
        return;
    }
    let c = Counter::start("leave");
    let archive = setup().dir.join("leave.tar.gz");
    let _ = fs::remove_file(&archive);
    {
        let _lock = common::criu_lock();
        podman_ok(&[
            "container",
            "checkpoint",
            "--leave-running",
            "--compress",
            "gzip",
            "--export",
            archive.to_str().unwrap(),
            &c.name,
        ]);
    }
    assert!(c.running());
    c.wait_past(c.count());
    let report = inspect_json(&archive, &[]);
    assert_eq!(report["archive"]["compression"], "gzip");
    assert_eq!(report["container"]["container_name"], c.name.as_str());
    let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
    assert_success(&out);
}

/// Whether the container's processes are gone (no half-restored container): podman
/// knows no running process of it.
fn assert_nothing_running(name: &str) {
    let out = podman(&[
        "inspect",
        "--format",
        "{{.State.Running}} {{.State.Pid}}",
        name,
    ]);
    if out.status.success() {
        let state = stdout(&out);
        assert!(
            state.trim() == "false 0",
            "{name} is left with processes: {state}"
        );
    }
}

/// A container of CUDA processes (the CUDA workload on the fake CUDA driver, which the
/// plugin recognises by the driver library `GPUCR_CUDA_LIBRARY` names): runc's CRIU,
/// which freezes the container with its cgroup, gets gpucr's cuda backend in engine
/// mode; the whole tree is locked before the freeze and checkpointed by the driver
/// through each process's restore thread. A first restore whose driver restore fails
/// (CUDA out of memory) fails in podman too and leaves no process; the archive then
/// restores with every byte, the processes unlocked.
#[test]
fn cuda_container_round_trip_in_engine_mode() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start_workload("cuda", &[], Workload::FakeCuda);
    let archive = setup().dir.join("cuda.tar.zst");
    let out = c.checkpoint(&archive, &[]);
    assert!(
        out.status.success(),
        "checkpoint failed: {}\nengine log: {}\nCRIU: {}",
        stderr(&out),
        c.plugin.engine_log(),
        c.log_lines("dump")
    );
    let log = c.criu_log("dump");
    assert!(
        log.contains("gpucr: engine mode: helper ready (cuda)"),
        "{log}"
    );
    let steps = c.steps();
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    c.wipe_device_memory();
    let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
    assert_success(&out);

    let settings = c
        .plugin
        .criu_conf
        .with_file_name("criu-libs/gpucr_plugin.conf");
    let good = fs::read_to_string(&settings).unwrap();
    fs::write(
        &settings,
        format!("{good}GPUCR_FAKE_CUDA_FAIL=cuCheckpointProcessRestore:OUT_OF_MEMORY\n"),
    )
    .unwrap();
    let out = c.restore(&archive);
    fs::write(&settings, &good).unwrap();
    assert!(
        !out.status.success(),
        "restored without the driver's restore"
    );
    let log = c.log_lines("restore");
    assert!(log.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{log}");
    assert_nothing_running(&c.name);
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);

    let out = c.restore(&archive);
    assert!(
        out.status.success(),
        "restore failed: {}\nengine log: {}\nCRIU: {}",
        stderr(&out),
        c.plugin.engine_log(),
        c.log_lines("restore")
    );
    let log = c.criu_log("restore");
    // Nothing but the CUDA processes' memory says the image needs gpucr (no device
    // file was dumped): the dump named gpucr in CRIU's inventory all the same.
    assert!(
        log.contains("gpucr: plugin loaded (restore; image needs gpucr: true; hook ABI of CRIU ")
            && log.contains("gpucr: RESUME_DEVICES_LATE: 2 CUDA processes brought back at once"),
        "{log}"
    );
    assert!(c.verify(1), "a buffer differs after the restore");
    c.wait_ticks(2);
    assert!(c.steps() > steps, "the processes were not unlocked");
}

/// The engine's helper killed while it checkpoints a CUDA container (each driver step
/// taking 1.5 s in the fake): the checkpoint fails, and the CUDA give-back guard the
/// helper started restores and unlocks both processes once CRIU has let them go, so
/// the container runs on with every byte.
#[test]
fn cuda_container_checkpoint_survives_a_killed_helper() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start_workload(
        "cuda-kill",
        &["GPUCR_FAKE_CUDA_STEP_MS=1500"],
        Workload::FakeCuda,
    );
    let archive = setup().dir.join("cuda-kill.tar.zst");
    // In the middle of the dump: once a process is locked (every driver step taking
    // 1.5 s, the other process's lock or the checkpoint is still to come).
    let fake_cuda = c.fake_cuda.clone().unwrap();
    let killer = kill_dump_helper_when(&c, move |_| a_cuda_process_is_locked(&fake_cuda));
    let out = c.checkpoint(&archive, &[]);
    killer.join().unwrap();
    assert_given_back_after_failed_checkpoint(&c, &out, "the guard to unlock the processes");
}

/// A checkpoint that failed: the container runs on, its kernels step again within a
/// minute (`what` waited for) and every buffer verifies.
fn assert_given_back_after_failed_checkpoint(c: &GpuContainer, out: &Output, what: &str) {
    assert!(!out.status.success(), "the checkpoint succeeded");
    assert!(c.running(), "the container stopped");
    let steps = c.steps();
    wait_for(Duration::from_secs(60), what, || {
        (c.steps() > steps + 10).then_some(())
    });
    assert!(c.verify(1), "a buffer differs after the failed checkpoint");
}

/// A plugin directory that also holds one of CRIU's own GPU plugins (here another
/// shared library under that name, which CRIU loads as a plugin without hooks): CRIU
/// stops at the first plugin that answers a hook, so gpucr's plugin names it in CRIU's
/// log; the container is checkpointed all the same.
#[test]
fn criu_gpu_plugin_beside_gpucr_is_named_in_criu_log() {
    if !have_podman() {
        return;
    }
    let plugin = PluginDir::install("beside", &[]);
    let libs = plugin.criu_conf.with_file_name("criu-libs");
    let stand_in = common::gpucr_bin()
        .parent()
        .unwrap()
        .join("libgpucr_fake_cuda.so");
    fs::copy(&stand_in, libs.join("cuda_plugin.so")).unwrap();
    let c = Counter::start_with_criu_conf("beside", &plugin.criu_conf);
    {
        let _lock = common::criu_lock();
        podman_ok(&[
            "container",
            "checkpoint",
            "--keep",
            "--leave-running",
            "--export",
            setup().dir.join("beside.tar.zst").to_str().unwrap(),
            &c.name,
        ]);
    }
    let log = c.criu_log("dump");
    assert!(
        log.contains("gpucr: warning: CRIU also loads")
            && log.contains(&libs.join("cuda_plugin.so").display().to_string()),
        "{log}"
    );
    assert!(c.running());
}

/// `--leave-running` in engine mode, for both simulator models: the GPU container goes
/// on while its checkpoint is written (the NVIDIA model's tasks given their device back
/// by the driver), its buffers intact, and the archive is whole.
#[test]
fn gpu_container_leave_running() {
    if !have_podman() {
        return;
    }
    for driver in ["kfd", "nvidia"] {
        let c = GpuContainer::start_with_driver(&format!("gpu-leave-{driver}"), &[], driver);
        let archive = setup().dir.join(format!("gpu-leave-{driver}.tar.zst"));
        let out = c.checkpoint(&archive, &["--leave-running"]);
        assert!(
            out.status.success(),
            "{driver}: {}\nCRIU: {}",
            stderr(&out),
            c.log_lines("dump")
        );
        assert!(c.running(), "{driver}: the container stopped");
        let steps = c.steps();
        c.wait_ticks(2);
        assert!(c.steps() > steps, "{driver}: the kernels stopped");
        assert!(
            c.verify(1),
            "{driver}: a buffer differs after the checkpoint"
        );
        let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
        assert_success(&out);
    }
}

/// Whether the helper whose images directory is `images` is copying device memory:
/// a data file of the GPU image has bytes, and more are to come.
fn copying_device_memory(images: &Path) -> bool {
    fs::read_dir(images.join("gpu")).is_ok_and(|dir| {
        dir.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with("data-")
                && e.metadata().is_ok_and(|m| m.len() > 0)
        })
    })
}

/// Whether a process of the fake CUDA driver's directory `dir` is locked: its context's
/// control file (fake-cuda's `gpucr-fake-cuda.control`) holds the state LOCKED, a
/// native-endian u32 at offset 8.
fn a_cuda_process_is_locked(dir: &Path) -> bool {
    let locked = gpucr_cuda_driver::ProcessState::Locked.to_raw() as u32;
    fs::read_dir(dir).is_ok_and(|dir| {
        dir.flatten().any(|e| {
            fs::read(e.path().join("gpucr-fake-cuda.control")).is_ok_and(|control| {
                control
                    .get(8..12)
                    .is_some_and(|w| u32::from_ne_bytes(w.try_into().unwrap()) == locked)
            })
        })
    })
}

/// A thread that waits for the engine helper of `c`'s next checkpoint to start, then
/// for `ready` (given the helper's images directory; polled every millisecond, for up
/// to 30 s, failing the test when it never is), and kills it with SIGKILL.
fn kill_dump_helper_when(
    c: &GpuContainer,
    mut ready: impl FnMut(&Path) -> bool + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let pattern = format!("engine-helper dump --images-dir .*{}", c.id());
    std::thread::spawn(move || {
        let images = wait_for(Duration::from_secs(20), "the engine helper", || {
            let out = Command::new("pgrep")
                .args(["-f", &pattern])
                .output()
                .unwrap();
            let pid = stdout(&out).split_whitespace().next()?.to_owned();
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let at = args.iter().position(|a| *a == b"--images-dir")?;
            Some(PathBuf::from(
                String::from_utf8_lossy(args.get(at + 1)?).into_owned(),
            ))
        });
        wait_for(
            Duration::from_secs(30),
            "the moment to kill the helper",
            || {
                ready(&images).then_some(()).or_else(|| {
                    std::thread::sleep(Duration::from_millis(1));
                    None
                })
            },
        );
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &pattern])
            .status();
    })
}

/// The helper killed while it copies GPU memory: the checkpoint fails, the reason is in
/// CRIU's log, and the container runs on with its buffers intact.
#[test]
fn gpu_container_checkpoint_survives_a_killed_helper() {
    if !have_podman() {
        return;
    }
    // A slow simulated copy engine, so that the helper is caught mid-copy.
    let c = GpuContainer::start("gpu-kill", &["GPUCR_SIM_COPY_BW=20MiB"]);
    let archive = setup().dir.join("gpu-kill.tar.zst");
    let killer = kill_dump_helper_when(&c, copying_device_memory);
    let out = c.checkpoint(&archive, &[]);
    killer.join().unwrap();
    assert!(!out.status.success(), "the checkpoint succeeded");
    let log = c.log_lines("dump");
    assert!(log.contains("gpucr"), "{log}");
    assert!(c.running(), "the container stopped");
    let steps = c.steps();
    c.wait_ticks(2);
    assert!(c.steps() > steps);
    assert!(c.verify(1), "a buffer differs after the failed checkpoint");
}

/// The helper killed once the NVIDIA model's driver has locked both processes of a
/// container: the checkpoint fails, and the give-back guard the helper started asks
/// each driver to resume once CRIU has let the tree go, so the container runs on with
/// every byte.
#[test]
fn nvidia_model_container_checkpoint_survives_a_killed_helper() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start_with_driver("nv-kill", &[], "nvidia");
    let archive = setup().dir.join("nv-kill.tar.zst");
    let contexts = common::sim_contexts(&c.sim.0);
    assert_eq!(contexts.len(), 2, "one context per process");
    let killer = kill_dump_helper_when(&c, move |_| common::sim_drivers_hold(&contexts));
    let out = c.checkpoint(&archive, &[]);
    killer.join().unwrap();
    assert_given_back_after_failed_checkpoint(&c, &out, "the guard to resume the processes");
}

/// A restore onto GPUs that cannot hold the image is refused before CRIU restores
/// anything (the helper's topology check in the plugin's init): the reason is in CRIU's
/// log and no process of the container is left. With the GPUs back, the same archive
/// restores.
#[test]
fn gpu_container_restore_refused_on_incompatible_gpus() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start("gpu-topo", &[]);
    let archive = setup().dir.join("gpu-topo.tar.zst");
    let out = c.checkpoint(&archive, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.wipe_device_memory();
    let topology = c.sim.0.join("sys");
    let aside = c.sim.0.with_extension("sys-aside");
    fs::rename(&topology, &aside).unwrap();
    let id = c.id();
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    let out = c.restore(&archive);
    assert!(!out.status.success(), "restored onto no GPUs");
    let log = log_lines_of(&id, "restore");
    assert!(
        log.contains("the GPUs of this machine cannot hold the image"),
        "{log}\npodman: {}",
        stderr(&out)
    );
    assert_nothing_running(&c.name);
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    fs::rename(&aside, &topology).unwrap();
    let out = c.restore(&archive);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(c.verify(1));
}

/// Where `member`'s data starts in a plain tar, and its size.
fn tar_member(tar: &[u8], wanted: impl Fn(&str) -> bool) -> Option<(String, usize, usize)> {
    let mut at = 0;
    while at + 512 <= tar.len() {
        let header = &tar[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            return None;
        }
        let name_end = header[..100].iter().position(|&b| b == 0).unwrap_or(100);
        let name = String::from_utf8_lossy(&header[..name_end]).into_owned();
        let size_text = String::from_utf8_lossy(&header[124..136]);
        let size =
            usize::from_str_radix(size_text.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                .unwrap_or(0);
        if wanted(&name) && size > 0 {
            return Some((name, at + 512, size));
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    None
}

/// One flipped byte in the GPU memory inside the archive: the restore fails at the
/// task's device file (CRIU then kills what it restored), the damaged file is named in
/// CRIU's log, and no process of the container is left.
#[test]
fn gpu_container_restore_fails_cleanly_on_a_bad_chunk() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start("gpu-chunk", &["GPUCR_COMPRESS=none"]);
    let archive = setup().dir.join("gpu-chunk.tar");
    let out = c.checkpoint(&archive, &["--compress", "none"]);
    assert!(out.status.success(), "{}", stderr(&out));
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    c.wipe_device_memory();
    let mut tar = fs::read(&archive).unwrap();
    let (member, start, size) = tar_member(&tar, |n| {
        n.starts_with("checkpoint/gpu/") && n != "checkpoint/gpu/index" && !n.contains("state")
    })
    .expect("a GPU data file in the archive");
    tar[start + size / 2] ^= 0x40;
    fs::write(&archive, &tar).unwrap();
    let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stdout(&out).contains(&member) || stderr(&out).contains(&member));
    let out = c.restore(&archive);
    assert!(!out.status.success(), "restored a damaged image");
    let log = c.log_lines("restore");
    assert!(log.contains("gpucr"), "{log}");
    assert_nothing_running(&c.name);
}

/// The NVIDIA model in a container, whose device does not come back at
/// RESUME_DEVICES_LATE (the simulated driver's resume fails): CRIU goes on after that
/// hook fails, but no process of the container runs on without its device, the restore
/// fails in the engine too, and CRIU's log says why. With the driver fixed, the same
/// archive restores, every byte verified.
#[test]
fn gpu_container_whose_device_does_not_come_back_is_not_left_running() {
    if !have_podman() {
        return;
    }
    let c = GpuContainer::start_with_driver("gpu-resume", &[], "nvidia");
    let archive = setup().dir.join("gpu-resume.tar.zst");
    let out = c.checkpoint(&archive, &[]);
    assert!(
        out.status.success(),
        "{}\nCRIU: {}",
        stderr(&out),
        c.log_lines("dump")
    );
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    c.wipe_device_memory();
    let fail = c.sim.0.join("driver-fail");
    fs::write(&fail, "resume").unwrap();
    let out = c.restore(&archive);
    let _ = fs::remove_file(&fail);
    let log = c.log_lines("restore");
    assert!(log.contains("resume failed (injected)"), "{log}");
    assert!(
        log.contains("killed the restored tasks"),
        "the tree was not killed: {log}"
    );
    wait_for(
        Duration::from_secs(20),
        "no process of the container to be left",
        || (!c.running()).then_some(()),
    );
    assert_nothing_running(&c.name);
    // The plugin let go of the stopped tasks, so CRIU's own detach failed the restore:
    // the engine says so, and names CRIU's log.
    assert!(
        !out.status.success(),
        "podman reported a restore that failed as done"
    );
    assert!(stderr(&out).contains("restore.log"), "{}", stderr(&out));
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    c.wipe_device_memory();
    let out = c.restore(&archive);
    assert!(
        out.status.success(),
        "{}\nCRIU: {}",
        stderr(&out),
        c.log_lines("restore")
    );
    assert!(c.verify(1), "a buffer differs after the restore");
}

/// Two GPU containers checkpointed at the same time and restored at the same time
/// (a node checkpointing several pods): each CRIU starts its own helper, each archive
/// holds its own container's GPU memory, and both come back verified.
#[test]
fn two_gpu_containers_at_once() {
    if !have_podman() {
        return;
    }
    let a = GpuContainer::start("gpu-two-a", &[]);
    let b = GpuContainer::start("gpu-two-b", &[]);
    let archives = [
        setup().dir.join("gpu-two-a.tar.zst"),
        setup().dir.join("gpu-two-b.tar.zst"),
    ];
    let run_both = |args: [Vec<String>; 2]| {
        let _lock = common::criu_lock();
        let handles: Vec<_> = args
            .into_iter()
            .map(|a| std::thread::spawn(move || Command::new("podman").args(a).output().unwrap()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<Output>>()
    };
    let checkpoint = |c: &GpuContainer, archive: &Path| {
        let _ = fs::remove_file(archive);
        ["container", "checkpoint", "--keep", "--export"]
            .iter()
            .map(|s| s.to_string())
            .chain([archive.display().to_string(), c.name.clone()])
            .collect::<Vec<String>>()
    };
    for out in run_both([checkpoint(&a, &archives[0]), checkpoint(&b, &archives[1])]) {
        assert!(out.status.success(), "{}", stderr(&out));
    }
    for (c, archive) in [(&a, &archives[0]), (&b, &archives[1])] {
        let report = inspect_json(archive, &[]);
        assert_eq!(report["container"]["container_name"], c.name.as_str());
        let out = gpucr(&["inspect", "--verify", archive.to_str().unwrap()]);
        assert_success(&out);
        podman_ok(&["rm", "-f", "-t", "0", &c.name]);
        c.wipe_device_memory();
    }
    let restore = |archive: &Path| {
        ["container", "restore", "--keep", "--import"]
            .iter()
            .map(|s| s.to_string())
            .chain([archive.display().to_string()])
            .collect::<Vec<String>>()
    };
    for out in run_both([restore(&archives[0]), restore(&archives[1])]) {
        assert!(out.status.success(), "{}", stderr(&out));
    }
    for c in [&a, &b] {
        assert!(c.verify(1), "{}: a buffer differs", c.name);
        c.wait_ticks(1);
    }
    // No helper outlives its CRIU.
    let out = Command::new("pgrep")
        .args(["-f", "engine-helper"])
        .output()
        .unwrap();
    assert!(
        stdout(&out).trim().is_empty(),
        "helpers left: {}",
        stdout(&out)
    );
}
