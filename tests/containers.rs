//! Containers checkpointed and restored by a real container engine (podman, runc and the
//! machine's CRIU), with gpucr's plugin installed where that CRIU loads plugins, and
//! their archives read by `gpucr inspect` and `gpucr check-topology`.
//!
//! The plugin goes into a directory of the test's own, named to CRIU by the container's
//! `org.criu.config` annotation (a CRIU configuration file with `libdir`): runc hands
//! that file to its CRIU at checkpoint and at restore, so nothing is installed into
//! /usr/lib/criu and no other test's CRIU loads it.
//!
//! The container image is made here, offline: a root holding only /bin/sh, sleep and
//! their libraries, imported with `podman import`. `scripts/setup.sh` installs podman
//! and runc; without podman on PATH the tests say so and pass.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::{assert_success, gpucr, stderr, stdout, wait_for};
use serde_json::Value;

const IMAGE: &str = "localhost/gpucr-test-counter:latest";
/// podman's default rlimits are refused on these machines.
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// Whether podman is installed; if not, say why the test does nothing.
fn have_podman() -> bool {
    let found = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!(
            "podman is not installed (scripts/setup.sh installs it): container tests skipped"
        );
    }
    found
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
        "podman {args:?} failed\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
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
        // The image: /bin/sh and sleep with their libraries.
        let root = dir.join("root");
        for d in ["bin", "tmp", "proc", "sys", "dev", "etc", "state"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for bin in ["/bin/sh", "/bin/sleep"] {
            copy_with_libraries(Path::new(bin), &root);
        }
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
struct Counter {
    name: String,
    state: PathBuf,
}

impl Counter {
    fn start(tag: &str) -> Counter {
        let s = setup();
        let name = format!("gpucr-test-{}-{tag}", std::process::id());
        let state = s.dir.join(format!("state-{tag}"));
        let _ = fs::remove_dir_all(&state);
        fs::create_dir_all(&state).unwrap();
        let _ = podman(&["rm", "-f", "-t", "0", &name]);
        let annotation = format!("org.criu.config={}", s.criu_conf.display());
        let volume = format!("{}:/state", state.display());
        let mut args = vec!["run", "-d", "--name", &name, "--annotation", &annotation];
        args.extend(ULIMITS);
        args.extend([
            "-v",
            &volume,
            IMAGE,
            "/bin/sh",
            "-c",
            "i=0; while :; do i=$((i+1)); echo $i > /state/counter; sleep 0.1; done",
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

    fn id(&self) -> String {
        podman_ok(&["inspect", "--format", "{{.Id}}", &self.name])
            .trim()
            .to_string()
    }

    /// CRIU's log of the last checkpoint (`dump`) or restore (`restore`), kept by
    /// podman's `--keep`.
    fn criu_log(&self, which: &str) -> String {
        let path = format!(
            "/var/lib/containers/storage/overlay-containers/{}/userdata/{which}.log",
            self.id()
        );
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn running(&self) -> bool {
        podman_ok(&["inspect", "--format", "{{.State.Running}}", &self.name]).trim() == "true"
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
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
    assert!(log.contains("gpucr: plugin loaded (dump)"), "{log}");
    assert!(!log.contains("gpucr: backend"), "{log}");
    let before = c.count();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.count(), before, "the checkpointed container stopped");
    podman_ok(&["rm", "-f", "-t", "0", &c.name]);
    {
        let _lock = common::criu_lock();
        podman_ok(&[
            "container",
            "restore",
            "--keep",
            "--import",
            archive.to_str().unwrap(),
        ]);
    }
    let log = c.criu_log("restore");
    assert!(
        log.contains("gpucr: plugin loaded (restore; image needs gpucr: false)"),
        "{log}"
    );
    c.wait_past(before);

    // The archive podman wrote (listed by gpucr: the zstd tool is not installed).
    let report = inspect_json(&archive, &["--ps-tree-cmd"]);
    let listing: Vec<&str> = report["archive"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
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
