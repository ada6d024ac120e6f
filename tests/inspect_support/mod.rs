//! Helpers of tests/inspect.rs: the test workload (workload.c, compiled at test time),
//! one real dump of it shared by the tests, and parsers for `crit`'s output.

#![allow(dead_code)]

pub mod crit;

/// The lock of every test that runs CRIU (the other end-to-end tests' own).
pub use crate::common::criu_lock;

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The gpucr binary under test.
pub fn gpucr_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpucr"))
}

/// Run gpucr with `args`.
pub fn gpucr(args: &[&str]) -> Output {
    Command::new(gpucr_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run gpucr")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Assert `out` exited with `code`, printing both streams if not.
pub fn assert_code(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit code {code}\nstdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

/// `gpucr inspect --json ARGS DIR` parsed.
pub fn inspect_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["inspect", "--json"];
    all.extend_from_slice(args);
    all.push(dir.to_str().unwrap());
    let out = gpucr(&all);
    assert_code(&out, 0);
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

/// The test workload, compiled once per `cargo test` run from workload.c.
pub fn workload_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspect_support/workload.c");
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpucr-inspect-workload");
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-pthread", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .expect("run cc (the C compiler builds the test workload)");
        assert!(
            out.status.success(),
            "cc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// A dump of the workload tree, made once and shared (read-only) by the tests.
#[derive(Debug)]
pub struct Dumped {
    /// The image directory.
    pub dir: PathBuf,
    /// The root's private anonymous region filled with a pattern: its address and
    /// length.
    pub region: (u64, u64),
    /// The TCP port the workload's root listened on.
    pub port: u16,
    /// The file the root held open at offset 1234.
    pub file: PathBuf,
    /// The workload binary (argv[0] of the root).
    pub bin: PathBuf,
}

/// The shared dump (made on first use).
pub fn dumped() -> &'static Dumped {
    static DUMP: OnceLock<Dumped> = OnceLock::new();
    DUMP.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspect-shared");
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        dump_workload(&base)
    })
}

/// Start the workload in its own PID namespace, dump it with `gpucr dump` (which kills
/// it) into `base/image`.
pub fn dump_workload(base: &Path) -> Dumped {
    let _lock = criu_lock();
    let port = free_port();
    let file = base.join("held-file");
    let ready = base.join("ready");
    let log = File::create(base.join("workload.log")).unwrap();
    let bin = workload_bin().to_path_buf();
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "setsid"])
        .arg(&bin)
        .arg("root")
        .arg(port.to_string())
        .arg(&file)
        .arg(&ready)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("GPUCR_INSPECT_MARK", "root")
        .current_dir(base)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn unshare");
    let guard = Running {
        unshare: &mut unshare,
        pid: 0,
    };
    let children = format!("/proc/{0}/task/{0}/children", guard.unshare.id());
    let pid = wait_for("the workload root", || {
        fs::read_to_string(&children)
            .ok()?
            .split_whitespace()
            .next()?
            .parse::<i32>()
            .ok()
    });
    let mut guard = guard;
    guard.pid = pid;
    let region = wait_for("the workload to be ready", || {
        let text = fs::read_to_string(&ready).ok()?;
        let (addr, len) = text.trim().split_once(' ')?;
        Some((u64::from_str_radix(addr, 16).ok()?, len.parse().ok()?))
    });
    let dir = base.join("image");
    let out = gpucr(&[
        "dump",
        "--tcp-established",
        &pid.to_string(),
        dir.to_str().unwrap(),
    ]);
    assert_code(&out, 0);
    drop(guard);
    Dumped {
        dir,
        region,
        port,
        file,
        bin,
    }
}

/// Kills the workload (if the dump did not) and reaps unshare.
struct Running<'a> {
    unshare: &'a mut Child,
    pid: i32,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.pid > 0 {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().unwrap().port()
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private copy of the shared image, to damage.
pub fn copy_image(to: &Path) -> PathBuf {
    let dir = to.join("image");
    fs::create_dir_all(&dir).unwrap();
    for entry in fs::read_dir(&dumped().dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    dir
}
