//! The process tree to checkpoint: does it exist, may we dump it, what is it.

use std::fs;
use std::io;
use std::path::PathBuf;

use crate::exit_code::{self, ExitCode};

/// The kernel's PF_KTHREAD flag in /proc/PID/stat.
const PF_KTHREAD: u64 = 0x0020_0000;
/// CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE: either lets CRIU checkpoint.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// Why a pid cannot be checkpointed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("pid {pid}: not a valid process id")]
    InvalidPid { pid: i32 },
    #[error("pid {pid}: no such process")]
    NotFound { pid: i32 },
    #[error("pid {pid}: {comm} is a kernel thread; only user processes can be checkpointed")]
    KernelThread { pid: i32, comm: String },
    #[error(
        "pid {pid}: {comm} has exited (a zombie its parent has not reaped): there is \
         nothing to checkpoint"
    )]
    Exited { pid: i32, comm: String },
    #[error("pid {pid} is a thread of process {process} ({comm}), not a process; dump {process}")]
    Thread {
        pid: i32,
        process: i32,
        comm: String,
    },
    #[error("pid {pid}: that is gpucr itself")]
    Itself { pid: i32 },
    #[error(
        "pid {pid}: {comm} is an ancestor of gpucr; the dump would freeze gpucr too \
         (run gpucr from outside the tree)"
    )]
    Ancestor { pid: i32, comm: String },
    #[error(
        "pid {pid}: not permitted: checkpointing needs root or CAP_CHECKPOINT_RESTORE \
         (run gpucr with sudo)"
    )]
    NotPermitted { pid: i32 },
    #[error(transparent)]
    Traced(#[from] gpucr_abi::procfs::Traced),
    #[error("pid {pid}: cannot read {path}")]
    Proc {
        pid: i32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ExitCode for TargetError {
    fn exit_code(&self) -> u8 {
        exit_code::TARGET
    }
}

/// What gpucr records about the tree's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    pub pid: i32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// Check that `pid` is a user process this gpucr may checkpoint, and describe it.
pub fn validate(pid: i32) -> Result<TargetInfo, TargetError> {
    if pid <= 0 {
        return Err(TargetError::InvalidPid { pid });
    }
    let stat = read_proc(pid, "stat")?;
    let (comm, fields) = parse_stat(&stat).ok_or_else(|| TargetError::Proc {
        pid,
        path: proc_path(pid, "stat"),
        source: io::Error::new(io::ErrorKind::InvalidData, "unexpected format"),
    })?;
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        return Err(TargetError::KernelThread { pid, comm });
    }
    if fields
        .first()
        .and_then(|state| state.chars().next())
        .is_some_and(gpucr_abi::procfs::is_exited_state)
    {
        return Err(TargetError::Exited { pid, comm });
    }
    // /proc/TID answers for any thread too; CRIU needs the thread-group leader.
    let process = thread_group(pid)?;
    let me = std::process::id() as i32;
    if pid == me || process == me {
        return Err(TargetError::Itself { pid });
    }
    if ancestors_of(me).contains(&process) {
        return Err(TargetError::Ancestor { pid, comm });
    }
    if process != pid {
        let comm = read_proc(process, "stat")
            .ok()
            .and_then(|stat| parse_stat(&stat).map(|(comm, _)| comm))
            .unwrap_or(comm);
        return Err(TargetError::Thread { pid, process, comm });
    }
    if !may_checkpoint() {
        return Err(TargetError::NotPermitted { pid });
    }
    let cmdline = read_proc(pid, "cmdline")
        .map(|raw| {
            raw.split('\0')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    Ok(TargetInfo { pid, comm, cmdline })
}

/// True while `pid` exists and has not exited (a zombie has).
pub fn is_running(pid: i32) -> bool {
    pid > 0 && !gpucr_abi::procfs::has_exited(pid)
}

/// When `pid` started, in clock ticks after boot (`/proc/PID/stat` field 22): with the
/// pid, it names one process, not a later one that reuses the number. None once the
/// process is gone.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = read_proc(pid, "stat").ok()?;
    let (_, fields) = parse_stat(&stat)?;
    // fields[0] is field 3 (state), so field 22 is fields[19].
    fields.get(19)?.parse().ok()
}

/// The process tracing `pid` (`TracerPid` in `/proc/PID/status`; CRIU traces a tree
/// while it dumps it), None when no one does or `pid` is gone.
pub fn tracer(pid: i32) -> Option<i32> {
    gpucr_abi::procfs::parse_tracer(&read_proc(pid, "status").ok()?)
}

/// Check that no task of the tree rooted at `root` (every thread of every process) is
/// traced: CRIU must trace each of them itself, and a task has one tracer (a debugger,
/// `strace -p`). Refused up front, the tree untouched, rather than left to CRIU, which
/// fails halfway with a message about detaching.
pub fn check_untraced(root: i32) -> Result<(), TargetError> {
    match gpucr_abi::procfs::traced_task(root) {
        Some(traced) => Err(traced.into()),
        None => Ok(()),
    }
}

/// The thread group (process) `pid` belongs to (`Tgid` in `/proc/PID/status`): `pid`
/// itself for a process, its process for any other thread.
fn thread_group(pid: i32) -> Result<i32, TargetError> {
    let status = read_proc(pid, "status")?;
    parse_tgid(&status).ok_or_else(|| TargetError::Proc {
        pid,
        path: proc_path(pid, "status"),
        source: io::Error::new(io::ErrorKind::InvalidData, "no Tgid line"),
    })
}

/// The `Tgid:` of a `/proc/PID/status` text.
fn parse_tgid(status: &str) -> Option<i32> {
    gpucr_abi::procfs::status_value(status, "Tgid")?
        .parse()
        .ok()
}

fn proc_path(pid: i32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

fn read_proc(pid: i32, name: &str) -> Result<String, TargetError> {
    let path = proc_path(pid, name);
    match fs::read(&path) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(TargetError::NotFound { pid }),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(TargetError::NotFound { pid }),
        Err(source) => Err(TargetError::Proc { pid, path, source }),
    }
}

/// Split /proc/PID/stat into comm and the fields after it (state is fields[0]).
fn parse_stat(stat: &str) -> Option<(String, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let fields = stat.get(close + 1..)?.split_whitespace().collect();
    Some((comm, fields))
}

/// The pids from `pid`'s parent up to init.
fn ancestors_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut current = pid;
    while let Ok(stat) = fs::read_to_string(proc_path(current, "stat")) {
        let Some(ppid) = parse_stat(&stat).and_then(|(_, f)| f.get(1)?.parse::<i32>().ok()) else {
            break;
        };
        if ppid <= 0 || out.contains(&ppid) {
            break;
        }
        out.push(ppid);
        current = ppid;
    }
    out
}

/// Root, or holding CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the effective set.
fn may_checkpoint() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    [CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE]
        .iter()
        .any(|cap| cap_eff & (1 << cap) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parens_in_comm() {
        let (comm, fields) = parse_stat("12 (a (b) c) S 1 12 12 0 -1 4194560 5").unwrap();
        assert_eq!(comm, "a (b) c");
        assert_eq!(fields[0], "S");
        assert_eq!(fields[1], "1");
        assert_eq!(fields[6], "4194560");
    }

    #[test]
    fn start_time_names_one_process_and_tracer_is_none_untraced() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let started = start_time(pid).expect("a live process has a start time");
        let own = start_time(std::process::id() as i32).unwrap();
        assert!(
            started >= own,
            "the child started after the test: {started} < {own}"
        );
        assert_eq!(tracer(pid), None);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(start_time(pid), None);
        assert_eq!(tracer(pid), None);
    }

    #[test]
    fn invalid_and_missing_pids() {
        assert!(matches!(
            validate(0),
            Err(TargetError::InvalidPid { pid: 0 })
        ));
        assert!(matches!(validate(-5), Err(TargetError::InvalidPid { .. })));
        // pid_max is at most 2^22.
        assert!(matches!(
            validate(99_999_999),
            Err(TargetError::NotFound { .. })
        ));
    }

    #[test]
    fn gpucr_itself_and_its_ancestors_are_refused() {
        let me = std::process::id() as i32;
        assert!(matches!(validate(me), Err(TargetError::Itself { .. })));
        // Every ancestor in this PID namespace, the parent included (the test runner
        // has one: its own parent at least).
        let ancestors = ancestors_of(me);
        assert_eq!(ancestors.first(), Some(&nix::unistd::getppid().as_raw()));
        for ancestor in ancestors {
            assert!(
                matches!(validate(ancestor), Err(TargetError::Ancestor { .. })),
                "{ancestor}: {:?}",
                validate(ancestor)
            );
        }
    }

    #[test]
    fn a_zombie_has_exited_and_is_refused() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Exited, not reaped: a zombie.
        let _ = crate::wait::pidfd::exited_within(pid, std::time::Duration::from_secs(10));
        assert!(
            proc_path(pid, "").exists() && !is_running(pid),
            "a zombie exists but does not run"
        );
        assert!(matches!(validate(pid), Err(TargetError::Exited { .. })));
        child.wait().unwrap();
        assert!(!is_running(pid));
        assert!(is_running(std::process::id() as i32));
    }

    #[test]
    fn tgid_is_read_from_status() {
        assert_eq!(parse_tgid("Name:\tx\nTgid:\t412\nPid:\t415\n"), Some(412));
        assert_eq!(parse_tgid("Name:\tx\n"), None);
        let me = std::process::id() as i32;
        assert_eq!(thread_group(me).unwrap(), me);
    }

    /// A thread id names no process: refused with its process named (here gpucr's own
    /// thread, so as gpucr itself), before CRIU would abort on it.
    #[test]
    fn a_thread_of_gpucr_is_gpucr_itself() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let me = std::process::id() as i32;
        assert_ne!(tid, me);
        assert_eq!(thread_group(tid).unwrap(), me);
        assert!(matches!(validate(tid), Err(TargetError::Itself { pid }) if pid == tid));
        done_tx.send(()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn kthreadd_is_a_kernel_thread() {
        // pid 2 is kthreadd in the initial PID namespace; no other shows kernel threads.
        let stat = fs::read_to_string("/proc/2/stat").unwrap_or_default();
        if !gpucr_abi::testing::require(
            "kthreadd",
            stat.contains("(kthreadd)"),
            "kernel threads are seen only in the initial PID namespace (pid 2 is kthreadd)",
        ) {
            return;
        }
        assert!(matches!(validate(2), Err(TargetError::KernelThread { .. })));
    }
}
