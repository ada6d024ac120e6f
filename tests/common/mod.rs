//! Shared test harness: the gpucr binary, the sample workload in its own PID namespace,
//! and its journals.
//!
//! Every workload runs as `unshare --pid --fork setsid workload ...` so restored pids
//! never collide with anything (docs/architecture.md §8). Tests that run CRIU take a
//! machine-wide lock so they never checkpoint concurrently, whichever runner runs them.

#![allow(dead_code)]

pub mod fake_cuda;
pub mod hosts;
mod lock;

pub use lock::criu_lock;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The gpucr binary under test.
pub fn gpucr_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpucr"))
}

/// The sample workload (built by `cargo test` with the other examples).
pub fn workload_bin() -> PathBuf {
    let bin = gpucr_bin();
    let path = bin.parent().expect("target dir").join("examples/workload");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --examples`",
        path.display()
    );
    path
}

/// Run gpucr with `args`; never reads stdin.
pub fn gpucr(args: &[&str]) -> Output {
    gpucr_env(args, &[])
}

/// Start gpucr with `args` and `env` in the background, its output piped (collect it
/// with `wait_with_output`), to signal it while it works ([`signal_child`]).
pub fn spawn_gpucr(args: &[&str], env: &[(&str, &str)]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(gpucr_bin());
    // As from a terminal, whatever the test runner was started with (`nohup` leaves
    // SIGHUP ignored, and gpucr keeps an ignored SIGHUP ignored): the tests signal it.
    // SAFETY: signal(2) is async-signal-safe, and nothing else runs in the child
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGHUP,
                nix::sys::signal::SigHandler::SigDfl,
            )
            .map(drop)
            .map_err(std::io::Error::from)
        });
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpucr")
}

/// Send `signal` to `child`.
pub fn signal_child(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal gpucr");
}

pub fn gpucr_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(gpucr_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run gpucr")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Assert the exit code and that stderr contains `needle`, with a useful failure text.
pub fn assert_fails_with(out: &Output, code: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit code {code}, got {:?}\nstdout: {}\nstderr: {err}",
        out.status.code(),
        stdout(out)
    );
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
}

/// `out` failed because of `why` (its `needle` is the cause's text): the cause is in
/// gpucr's error line, whichever side failed (a plugin hook's failure outranks what
/// CRIU logs after it), and undoing the failed step raised no error of its own in
/// CRIU's log at `log`.
pub fn assert_failed_because(out: &Output, log: &Path, why: &dyn std::fmt::Debug, needle: &str) {
    let log = fs::read_to_string(log).unwrap_or_default();
    assert!(!out.status.success(), "{why:?}: succeeded\n{log}");
    let message = stderr(out);
    let headline = message
        .lines()
        .find(|l| l.starts_with("gpucr: error:"))
        .unwrap_or("");
    assert!(
        headline.contains(needle),
        "{why:?}: {needle:?} not in the error's first line:\n{message}\n{log}"
    );
    assert!(
        !log.contains("gpucr: error: after the dump"),
        "{why:?}: the plugin's exit steps failed:\n{log}"
    );
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "gpucr failed with {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

/// Start `bin --state STATE EXTRA...` as the init of a new PID namespace
/// (`unshare --pid --fork setsid`, docs/architecture.md §8); returns the unshare process and
/// the workload's pid in gpucr's namespace.
fn start_in_pid_namespace(
    bin: &Path,
    state: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, i32) {
    start_in_namespaces(bin, state, extra, env, OwnNamespaces::PidOnly)
}

/// What a test tree has of its own besides its PID namespace.
#[derive(Debug, Clone, Copy)]
pub enum OwnNamespaces<'a> {
    /// Nothing more.
    PidOnly,
    /// A mount namespace, where a tmpfs hides the directory given (as a container's own
    /// /tmp hides the host's). The workload inherits no descriptor but its standard
    /// ones, and those are opened again inside the namespace: CRIU refuses a file on a
    /// mount the tree's namespace does not have.
    HidingDir(&'a Path),
    /// A network namespace, its loopback up (CRIU then locks and unlocks the tree's
    /// network itself, and runs the network-lock and network-unlock action scripts).
    Network,
}

/// [`start_in_pid_namespace`], in the namespaces `own` names too.
fn start_in_namespaces(
    bin: &Path,
    state: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    own: OwnNamespaces,
) -> (Child, i32) {
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --examples`",
        bin.display()
    );
    fs::create_dir_all(state).unwrap();
    if matches!(own, OwnNamespaces::Network) {
        assert!(
            Command::new("ip").arg("-V").output().is_ok(),
            "iproute2's `ip` is missing (scripts/setup.sh installs it)"
        );
    }
    let mut cmd = Command::new("unshare");
    match own {
        OwnNamespaces::PidOnly => cmd.args(["--pid", "--fork", "setsid"]),
        OwnNamespaces::HidingDir(dir) => cmd
            .args(["--pid", "--mount", "--propagation", "private", "--fork", "setsid"])
            .args(["sh", "-c", r#"mount -t tmpfs -o size=1m gpucr-hidden "$0" && exec "$@" </dev/null >/dev/null 2>&1"#])
            .arg(dir),
        OwnNamespaces::Network => cmd
            .args(["--pid", "--net", "--fork", "setsid"])
            .args(["sh", "-c", r#"ip link set lo up && exec "$@" </dev/null >/dev/null 2>&1"#, "sh"]),
    };
    inherit_no_fds(&mut cmd);
    let unshare = cmd
        .arg(bin)
        .arg("--state")
        .arg(state)
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn unshare");
    let pid = first_child(unshare.id(), "the workload's root process");
    (unshare, pid)
}

/// The first child of `parent` (an `unshare --fork`: the tree's root in its new PID
/// namespace), waited for up to 20 s; `what` names it if it never comes.
pub fn first_child(parent: u32, what: &str) -> i32 {
    let children = format!("/proc/{parent}/task/{parent}/children");
    wait_for(Duration::from_secs(20), what, || {
        fs::read_to_string(&children)
            .ok()?
            .split_whitespace()
            .next()?
            .parse::<i32>()
            .ok()
    })
}

/// One line of a workload journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalLine(pub BTreeMap<String, String>);

impl JournalLine {
    pub fn num(&self, key: &str) -> u64 {
        self.0
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }
    pub fn healthy(&self) -> bool {
        ["mem", "memfd", "other"]
            .iter()
            .all(|k| self.0.get(*k).map(String::as_str) == Some("ok"))
    }
}

/// The sample workload tree, started in its own PID namespace.
pub struct Tree {
    pub state: PathBuf,
    unshare: Child,
    /// The root's pid in gpucr's (the initial) PID namespace.
    pub pid: i32,
}

pub const ROLES: [&str; 3] = ["parent", "tcp", "pipe"];

impl Tree {
    /// Start the workload with extra arguments; returns once it is set up.
    pub fn start(state: &Path, extra: &[&str]) -> Tree {
        Tree::start_in(state, extra, OwnNamespaces::PidOnly)
    }

    /// [`Tree::start`], with the namespaces `own` names of the tree's own.
    pub fn start_in(state: &Path, extra: &[&str], own: OwnNamespaces) -> Tree {
        let (unshare, pid) = start_in_namespaces(&workload_bin(), state, extra, &[], own);
        let tree = Tree {
            state: state.to_path_buf(),
            unshare,
            pid,
        };
        wait_for(Duration::from_secs(30), "the workload to be ready", || {
            state.join("ready").exists().then_some(())
        });
        tree.wait_ticks(2);
        tree
    }

    /// Every line of a role's journal.
    pub fn journal(&self, role: &str) -> Vec<JournalLine> {
        read_journal(&self.state, role)
    }

    pub fn last(&self, role: &str) -> JournalLine {
        self.journal(role)
            .pop()
            .unwrap_or_else(|| panic!("journal-{role} is empty"))
    }

    /// Wait until every role has written `n` more lines than now.
    pub fn wait_ticks(&self, n: u64) {
        let start: Vec<u64> = ROLES.iter().map(|r| self.journal(r).len() as u64).collect();
        wait_for(Duration::from_secs(30), "the workload to tick", || {
            ROLES
                .iter()
                .zip(&start)
                .all(|(r, s)| self.journal(r).len() as u64 >= s + n)
                .then_some(())
        });
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        kill_and_wait(self.pid);
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

pub fn read_journal(state: &Path, role: &str) -> Vec<JournalLine> {
    let text = fs::read_to_string(state.join(format!("journal-{role}"))).unwrap_or_default();
    text.lines()
        .filter(|l| l.ends_with(|c: char| c.is_ascii_alphanumeric()))
        .map(|l| {
            JournalLine(
                l.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            )
        })
        .collect()
}

/// Assert a journal is one unbroken run tick=1,2,3,... with growing counters and every
/// health flag ok: nothing was lost or overwritten across checkpoints.
pub fn assert_journal_continuous(state: &Path, role: &str) {
    let lines = read_journal(state, role);
    assert!(!lines.is_empty(), "journal-{role} is empty");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            line.num("tick"),
            i as u64 + 1,
            "journal-{role} line {}: {line:?}",
            i + 1
        );
        assert!(line.healthy(), "journal-{role} line {}: {line:?}", i + 1);
    }
    for key in ["pipe", "tcp", "unix", "passes"] {
        for w in lines.windows(2) {
            assert!(
                w[1].num(key) >= w[0].num(key),
                "journal-{role}: {key} went back: {w:?}"
            );
        }
    }
}

/// SIGKILL a process and wait until it is gone from /proc.
pub fn kill_and_wait(pid: i32) {
    if pid <= 0 {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let _ = wait_for_opt(Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
}

/// A restored tree (detached from gpucr), killed when dropped.
pub struct Restored(pub i32);

impl Restored {
    /// The tree `gpucr restore --detach` restored: its output must be a success, with
    /// the root's pid on stdout.
    pub fn from_output(out: &Output) -> Restored {
        assert_success(out);
        let text = stdout(out);
        Restored(
            text.trim()
                .parse()
                .unwrap_or_else(|_| panic!("not a pid: {text:?}")),
        )
    }
}

/// The manifest (`gpucr.json`) of the image at `image`, as JSON.
pub fn manifest_json(image: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(image.join("gpucr.json")).unwrap()).unwrap()
}

/// The `name` of each element of a JSON array (a manifest's timeline events, an
/// archive's members), in order.
pub fn names_in(array: &serde_json::Value) -> Vec<&str> {
    array
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect()
}

/// The names of a manifest task's operations (`gpu.tasks[].operations`), in order.
pub fn operation_names(task: &serde_json::Value) -> Vec<&str> {
    names_in(&task["operations"])
}

impl Drop for Restored {
    fn drop(&mut self) {
        kill_and_wait(self.0);
    }
}

pub fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// The lines a child writes on a pipe (its stderr), read as they come by a thread of
/// their own.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    pub fn of(stream: impl std::io::Read + Send + 'static) -> Lines {
        use std::io::BufRead;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Wait up to `timeout` for a line holding `needle` (returned); fails the test
    /// naming it, with the lines seen, when none comes.
    pub fn wait_for_line(&mut self, timeout: Duration, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {needle:?} within {timeout:?} ({e}); lines:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Every line, once the writer has closed the pipe (its process ended).
    pub fn all(mut self) -> String {
        self.seen.extend(self.rx.iter());
        self.seen.iter().map(|l| format!("{l}\n")).collect()
    }
}

pub fn wait_for<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_opt(timeout, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

fn wait_for_opt<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The context directories of the simulator's processes under `sim_root`, one per
/// process holding its device.
pub fn sim_contexts(sim_root: &Path) -> Vec<PathBuf> {
    fs::read_dir(sim_root.join("contexts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// True once the NVIDIA model's driver of every context in `contexts` has answered a
/// request and none says it runs: each process is locked or checkpointed.
pub fn sim_drivers_hold(contexts: &[PathBuf]) -> bool {
    contexts.iter().all(|c| {
        fs::read_to_string(c.join(gpucr_abi::sim::DRIVER_STATE_FILE))
            .is_ok_and(|s| !s.contains("running"))
    })
}

/// Copy every regular file of `from` into `to` (a snapshot of the workload's state).
pub fn copy_files(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// The simulator workload (`examples/sim_workload.rs`) in its own PID namespace, with its
/// own sim root on tmpfs.
pub struct SimTree {
    pub state: PathBuf,
    pub sim_root: PathBuf,
    unshare: Child,
    pub pid: i32,
    /// "parent", and "child" unless started with `--child-mib 0`.
    pub roles: Vec<&'static str>,
}

impl SimTree {
    pub fn start(state: &Path, sim_root: &Path, extra: &[&str]) -> SimTree {
        Self::start_hiding(state, sim_root, extra, None)
    }

    /// Another GPU workload with the sim workload's journal and verify protocol (the
    /// cuda workload): `bin` with `env`, its processes named `roles`.
    pub fn start_program(
        bin: &Path,
        state: &Path,
        root: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        roles: Vec<&'static str>,
    ) -> SimTree {
        let (unshare, pid) = start_in_namespaces(bin, state, extra, env, OwnNamespaces::PidOnly);
        let tree = SimTree {
            state: state.to_path_buf(),
            sim_root: root.to_path_buf(),
            unshare,
            pid,
            roles,
        };
        wait_for(Duration::from_secs(120), "the workload to be ready", || {
            tree.roles
                .iter()
                .all(|r| state.join(format!("ready-{r}")).exists())
                .then_some(())
        });
        tree.wait_ticks(2);
        tree
    }

    /// [`SimTree::start`] in a mount namespace of the tree's own, with `hide` hidden
    /// under a tmpfs there.
    pub fn start_hiding(
        state: &Path,
        sim_root: &Path,
        extra: &[&str],
        hide: Option<&Path>,
    ) -> SimTree {
        let bin = gpucr_bin().parent().unwrap().join("examples/sim_workload");
        let env = [("GPUCR_SIM_ROOT", sim_root.to_str().unwrap())];
        let own = hide.map_or(OwnNamespaces::PidOnly, OwnNamespaces::HidingDir);
        let (unshare, pid) = start_in_namespaces(&bin, state, extra, &env, own);
        let no_child = extra.windows(2).any(|w| w == ["--child-mib", "0"]);
        let roles = if no_child {
            vec!["parent"]
        } else {
            vec!["parent", "child"]
        };
        let tree = SimTree {
            state: state.to_path_buf(),
            sim_root: sim_root.to_path_buf(),
            unshare,
            pid,
            roles,
        };
        wait_for(
            Duration::from_secs(120),
            "the sim workload to be ready",
            || {
                tree.roles
                    .iter()
                    .all(|r| state.join(format!("ready-{r}")).exists())
                    .then_some(())
            },
        );
        tree.wait_ticks(2);
        tree
    }

    pub fn last(&self, role: &str) -> JournalLine {
        read_journal(&self.state, role)
            .pop()
            .unwrap_or_else(|| panic!("journal-{role} is empty"))
    }

    pub fn wait_ticks(&self, n: usize) {
        let start: Vec<usize> = self
            .roles
            .iter()
            .map(|r| read_journal(&self.state, r).len())
            .collect();
        wait_for(Duration::from_secs(60), "the sim workload to tick", || {
            self.roles
                .iter()
                .zip(&start)
                .all(|(r, s)| read_journal(&self.state, r).len() >= s + n)
                .then_some(())
        });
    }

    /// Ask every process to check every byte of its buffers and wait for the answer:
    /// true when all of them match, false as soon as one reports a mismatch.
    pub fn verify(&self, request: u64) -> bool {
        fs::write(self.state.join("verify"), request.to_string()).unwrap();
        wait_for(
            Duration::from_secs(120),
            "the buffers to be verified",
            || {
                let lines: Vec<JournalLine> = self.roles.iter().map(|r| self.last(r)).collect();
                if lines.iter().any(|l| l.num("bad") != 0) {
                    return Some(false);
                }
                lines
                    .iter()
                    .all(|l| l.num("verified") >= request)
                    .then_some(true)
            },
        )
    }

    /// Delete every device context of the sim root, as on a new machine.
    pub fn wipe_device_memory(&self) {
        let _ = fs::remove_dir_all(self.sim_root.join("contexts"));
    }

    pub fn steps(&self) -> u64 {
        self.roles.iter().map(|r| self.last(r).num("steps")).sum()
    }
}

impl Drop for SimTree {
    fn drop(&mut self) {
        kill_and_wait(self.pid);
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// A fresh sim root on tmpfs, removed when dropped.
pub struct SimRoot(pub PathBuf);

impl SimRoot {
    pub fn new(name: &str) -> SimRoot {
        let path = PathBuf::from(format!("/dev/shm/gpucr-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        SimRoot(path)
    }
    pub fn env(&self) -> [(&str, &str); 1] {
        [("GPUCR_SIM_ROOT", self.0.to_str().unwrap())]
    }
}

impl Drop for SimRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A thread of the test process that has seized `pid` with ptrace (without stopping
/// it), as a debugger or `strace -p` would; the kernel lets the tracee go when the
/// thread ends (when this is dropped).
pub struct Tracer {
    /// The tracing thread's id, which `/proc/PID/status` shows as `TracerPid`; its
    /// name is `test-tracer`.
    pub tid: i32,
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tracer {
    pub fn seize(pid: i32) -> Tracer {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("test-tracer".into())
            .spawn(move || {
                // SAFETY: PTRACE_SEIZE takes a pid and no memory of ours and does not
                // stop the tracee; the kernel lets it go when this thread exits.
                let rc = unsafe {
                    libc::ptrace(
                        libc::PTRACE_SEIZE,
                        pid,
                        std::ptr::null_mut::<libc::c_void>(),
                        0,
                    )
                };
                tx.send((
                    rc,
                    std::io::Error::last_os_error(),
                    nix::unistd::gettid().as_raw(),
                ))
                .unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        let (rc, error, tid) = rx.recv().unwrap();
        assert_eq!(rc, 0, "PTRACE_SEIZE: {error}");
        Tracer {
            tid,
            done: Some(done),
            thread: Some(thread),
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `gpucr install-plugin` into `dir/criu-libs` (returned) with `settings` (`NAME=VALUE`),
/// for CRIU runs in engine mode.
pub fn install_plugin_with(dir: &Path, settings: &[&str]) -> PathBuf {
    let libs = dir.join("criu-libs");
    let mut args = vec!["install-plugin", "--criu-libdir", libs.to_str().unwrap()];
    for setting in settings {
        args.extend(["--setting", setting]);
    }
    assert_success(&gpucr(&args));
    libs
}

/// Engine mode without a container engine: the machine's CRIU, run directly with the
/// plugins of `libs` (`--libdir`), dumps `pid` into `images` (made here), its log
/// (returned) in a work directory of its own beside it, so a full image directory
/// does not lose it.
pub fn criu_dump_with_plugin(
    libs: &Path,
    pid: i32,
    images: &Path,
    extra: &[&str],
) -> (std::process::Output, String) {
    criu_dump_with_plugin_env(libs, pid, images, extra, &[])
}

/// [`criu_dump_with_plugin`] with `envs` added to CRIU's environment.
pub fn criu_dump_with_plugin_env(
    libs: &Path,
    pid: i32,
    images: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (std::process::Output, String) {
    fs::create_dir_all(images).unwrap();
    let work = images.with_extension("work");
    fs::create_dir_all(&work).unwrap();
    let out = Command::new("criu")
        .args([
            "dump",
            "-t",
            &pid.to_string(),
            "-D",
            images.to_str().unwrap(),
        ])
        .args(["-W", work.to_str().unwrap(), "-o", "dump.log", "-v3"])
        .args(["-L", libs.to_str().unwrap()])
        .args(extra)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = fs::read_to_string(work.join("dump.log")).unwrap_or_default();
    (out, log)
}

/// A tmpfs mounted for a test; unmounted when dropped, also when the test fails
/// before it unmounts it (a killed test run leaves it: `scripts/test.sh` sweeps those).
#[must_use = "the tmpfs is unmounted when this is dropped"]
pub struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        umount(&self.0);
    }
}

/// A tmpfs of `bytes` at `dir` (made here), mounted until the returned guard is dropped.
pub fn mount_tmpfs(dir: &Path, bytes: u64) -> Tmpfs {
    fs::create_dir_all(dir).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "mount a tmpfs (root needed)");
    Tmpfs(dir.to_path_buf())
}

/// Unmount `dir`, waiting up to 5 s for whatever still uses it (an engine helper that
/// outlives its CRIU by a moment), then detaching it lazily.
fn umount(dir: &Path) {
    let quiet = |args: &[&str]| {
        Command::new("umount")
            .args(args)
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    for _ in 0..50 {
        if quiet(&[]) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = quiet(&["-l"]);
}

/// Space used on the file system holding `path`, in bytes.
pub fn used_bytes(path: &Path) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    (stat.blocks() - stat.blocks_free()) as u64 * stat.fragment_size() as u64
}

/// An action script for CRIU (`action-script` of a --criu-config file) in `dir` that
/// logs every stage and exits `status` at `stage`, and the config file that names it.
pub fn failing_script(dir: &Path, stage: &str, status: u8) -> (PathBuf, PathBuf) {
    let script = dir.join(format!("fail-at-{stage}.sh"));
    gpucr_abi::testing::write_script(
        &script,
        &format!(
            "#!/bin/sh\necho \"hook: $CRTOOLS_SCRIPT_ACTION\"\n\
             [ \"$CRTOOLS_SCRIPT_ACTION\" != {stage} ] || exit {status}\n"
        ),
    );
    let config = dir.join(format!("fail-at-{stage}.conf"));
    fs::write(&config, format!("action-script {}\n", script.display())).unwrap();
    (script, config)
}

/// An action script for CRIU in a directory that hangs at one stage (it starts a long
/// `sleep` and waits for it), with the config file that names it.
pub struct HangingScript {
    pub script: PathBuf,
    pub config: PathBuf,
    /// Where the script writes its `sleep`'s pid once it hangs.
    started: PathBuf,
}

impl HangingScript {
    pub fn new(dir: &Path, stage: &str) -> HangingScript {
        let started = dir.join(format!("hangs-at-{stage}.started"));
        let script = dir.join(format!("hangs-at-{stage}.sh"));
        gpucr_abi::testing::write_script(
            &script,
            &format!(
                "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = {stage} ] || exit 0\n\
                 sleep 120 &\necho $! > {}\nwait\n",
                started.display()
            ),
        );
        let config = dir.join(format!("hangs-at-{stage}.conf"));
        fs::write(&config, format!("action-script {}\n", script.display())).unwrap();
        HangingScript {
            script,
            config,
            started,
        }
    }

    /// Interrupt `gpucr` (a dump or restore, `request`, whose CRIU runs this script)
    /// once the script hangs, and again after gpucr has said what it waits for: the
    /// script ends with what it started, gpucr exits 130 having said both. Returns its
    /// stderr.
    pub fn interrupt_twice(&self, mut gpucr: Child, request: &str) -> String {
        let mut lines = Lines::of(gpucr.stderr.take().expect("gpucr's stderr is piped"));
        let sleeper: i32 = wait_for(Duration::from_secs(20), "the action script to hang", || {
            fs::read_to_string(&self.started).ok()?.trim().parse().ok()
        });
        signal_child(&gpucr, Signal::SIGINT);
        // gpucr speaks up after 3 s without a word from CRIU.
        lines.wait_for_line(
            Duration::from_secs(20),
            &format!("gpucr: SIGINT received during the {request}: waiting for CRIU (pid "),
        );
        assert!(alive(sleeper), "the script ends only on the second signal");
        signal_child(&gpucr, Signal::SIGINT);
        let out = gpucr.wait_with_output().unwrap();
        let said = lines.all();
        assert_eq!(out.status.code(), Some(130), "{said}");
        let command = format!("`/bin/sh {}` (pid ", self.script.display());
        assert!(
            said.contains(&format!(
                "gpucr: SIGINT received during the {request}: waiting for CRIU (pid "
            )) && said.contains(&format!("; it runs the action script {command}"))
                && said.contains(&format!(
                    "another signal ends it, and CRIU then rolls the {request} back"
                ))
                && said.contains(&format!("gpucr: ended the action script {command}"))
                && said.contains(&format!(
                    "that CRIU waited for; CRIU now rolls the {request} back"
                )),
            "{said}"
        );
        wait_for(
            Duration::from_secs(10),
            "the script's own child to be ended",
            || gpucr_abi::procfs::has_exited(sleeper).then_some(()),
        );
        said
    }
}

pub use gpucr_abi::procfs::children;

/// How many children of `pid` have exited and are not reaped (zombies).
pub fn zombie_children(pid: i32) -> usize {
    children(pid)
        .into_iter()
        .filter(|&child| gpucr_abi::procfs::has_exited(child))
        .count()
}

/// Stop `pid` with SIGSTOP and wait until it is stopped.
pub fn stop(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    wait_for(Duration::from_secs(10), "the process to stop", || {
        gpucr_abi::procfs::is_stopped(pid).then_some(())
    });
}

/// Let `pid`, stopped, continue (SIGCONT).
pub fn continue_process(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGCONT).unwrap();
}

/// Whether the plugin, by its `init` line in CRIU's `log`, was loaded by a CRIU that
/// calls DUMP_DEVICES_LATE (CRIU 4.3), where engine mode finishes its copy.
pub fn criu_calls_dump_devices_late(log: &str) -> bool {
    gpucr_abi::plugin_abi::HookAbi::ALL
        .into_iter()
        .filter(|abi| abi.dump_devices_late())
        .any(|abi| log.contains(&format!("hook ABI of {},", abi.releases())))
}

/// `cmd`'s child inherits no descriptor but its standard ones.
pub fn inherit_no_fds(cmd: &mut Command) {
    // SAFETY: close_range is async-signal-safe and touches only the child's own table.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
}
