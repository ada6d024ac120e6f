//! The source's guard of a migration (`gpucr migrate-guard`, hidden; see `crate::guard`).
//!
//! From its dump on, the job at the source is stopped (`stop_after`), and gpucr lets it
//! run again on any failure before it sends Commit ([`super::source`]). A gpucr killed
//! outright (SIGKILL, the OOM killer) cannot: the destination, its link gone, keeps
//! nothing running, and the job would stay stopped here for ever.
//!
//! So `gpucr migrate` starts this guard before the freeze and tells it every task it
//! would let run (`task PID START`: the tasks their owner had not stopped, the start
//! time telling each from a later process with the same pid), `commit` just before it
//! sends Commit, and `done` once the migration is over, whatever its outcome. Input that
//! ends without `done`:
//!
//! * before `commit`: the guard waits until CRIU has let the tasks go, then sends
//!   SIGCONT to each that is still the same process: the job runs on here, as after any
//!   other failure before the Commit. Its devices, where a post-copy dump deferred their
//!   give-back, are given back by the dump's own give-back guard (`gpu::cuda::guard`,
//!   `gpu::sim::guard`), which waits for the tree to run;
//! * after it: the destination may run the job, so this copy stays stopped, as gpucr
//!   itself keeps it when the link is lost after the Commit, and the guard says so.

use std::io;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::tree::StoppedTree;
use crate::guard::{GuardProcess, Recorded};

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "migrate-guard";

/// The record that says Commit is about to be sent.
const COMMIT: &str = "commit";

/// How long the guard keeps sending SIGCONT to a task that is stopped again (a SIGSTOP
/// of the dump's that CRIU let through as it detached).
const RESUME_SETTLE: Duration = Duration::from_secs(2);

/// gpucr's end of a running migrate guard.
#[derive(Debug)]
pub struct SourceGuard(GuardProcess);

impl SourceGuard {
    /// Start `gpucr migrate-guard`.
    pub fn start() -> io::Result<SourceGuard> {
        GuardProcess::start([SUBCOMMAND]).map(SourceGuard)
    }

    /// Tell the guard every task of `tree` that a failure would let run.
    pub fn tasks(&self, tree: &StoppedTree) {
        for task in tree.resumable().into_iter().filter_map(Task::now) {
            self.0.send(&task.line(TASK));
        }
    }

    /// Tell the guard that Commit is about to be sent: from here on the job may run at
    /// the destination.
    pub fn commit(&self) {
        self.0.send(COMMIT);
    }
}

/// One task gpucr would let run, as it recorded it.
pub type Task = Recorded;

/// The record's word for a task: `task PID START`.
const TASK: &str = "task";

/// What the records say: the tasks (each once), and whether Commit was to be sent.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Guarded {
    pub tasks: Vec<Task>,
    pub committed: bool,
}

/// Read the records; lines that are neither are skipped.
pub fn guarded(lines: &[String]) -> Guarded {
    let mut guarded = Guarded::default();
    for line in lines {
        if line.trim() == COMMIT {
            guarded.committed = true;
        } else if let Some(task) = Task::parse(TASK, line) {
            if !guarded.tasks.iter().any(|t| t.pid == task.pid) {
                guarded.tasks.push(task);
            }
        }
    }
    guarded
}

/// What the guard did with the job gpucr left.
#[derive(Debug, PartialEq, Eq)]
pub enum Left {
    /// Before the Commit: these tasks were let run.
    Resumed(Vec<i32>),
    /// After it: these tasks are kept stopped.
    KeptStopped(Vec<i32>),
}

/// Undo what gpucr left: before the Commit, wait until CRIU has let the tasks go (up to
/// `wait`) and let run each that is still the same process; after it, leave them
/// stopped. Tasks that are gone are left out.
pub fn undo(guarded: &Guarded, wait: Duration) -> Left {
    let live = || -> Vec<Task> {
        guarded
            .tasks
            .iter()
            .copied()
            .filter(Task::is_alive)
            .collect()
    };
    if guarded.committed {
        return Left::KeptStopped(live().iter().map(|t| t.pid).collect());
    }
    crate::guard::until_untraced(wait, Duration::from_millis(10), || {
        live().iter().map(|t| t.pid).collect()
    });
    let resumed: Vec<i32> = live().iter().map(|t| t.pid).collect();
    let deadline = Instant::now() + RESUME_SETTLE;
    loop {
        let stopped: Vec<Task> = live()
            .into_iter()
            .filter(|t| gpucr_abi::procfs::is_stopped(t.pid))
            .collect();
        if stopped.is_empty() || Instant::now() >= deadline {
            break;
        }
        for task in stopped {
            let _ = kill(Pid::from_raw(task.pid), Signal::SIGCONT);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Left::Resumed(resumed)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn records_read_back_and_commit_is_seen() {
        let task = Task { pid: 42, start: 7 };
        assert_eq!(Task::parse(TASK, &task.line(TASK)), Some(task));
        assert_eq!(Task::parse(TASK, "task 42"), None);
        assert_eq!(Task::parse(TASK, "task 42 7 8"), None);
        assert_eq!(Task::parse(TASK, "root 42 7"), None);
        let lines: Vec<String> = ["task 1 2", "noise", "task 3 4", "task 1 2"]
            .map(String::from)
            .to_vec();
        let before = guarded(&lines);
        assert!(!before.committed);
        assert_eq!(
            before.tasks,
            [Task { pid: 1, start: 2 }, Task { pid: 3, start: 4 }]
        );
        let mut lines = lines;
        lines.push(COMMIT.into());
        assert!(guarded(&lines).committed);
    }

    /// A stopped `sleep`, as a migration leaves its job: `undo` before the Commit lets
    /// it run, after it keeps it stopped; a task that is gone, or another process with
    /// its pid, is left alone.
    #[test]
    fn undo_lets_the_job_run_before_the_commit_and_keeps_it_stopped_after() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        let stopped = || gpucr_abi::procfs::is_stopped(pid);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(Instant::now() < deadline, "sleep did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        let task = Task {
            pid,
            start: crate::target::start_time(pid).unwrap(),
        };
        let other = Task {
            pid,
            start: task.start + 1,
        };
        let committed = Guarded {
            tasks: vec![task, other],
            committed: true,
        };
        assert_eq!(
            undo(&committed, Duration::from_secs(1)),
            Left::KeptStopped(vec![pid])
        );
        assert!(stopped());
        let before = Guarded {
            tasks: vec![other],
            committed: false,
        };
        assert_eq!(undo(&before, Duration::from_secs(1)), Left::Resumed(vec![]));
        assert!(stopped(), "a process with another start time was let run");
        let before = Guarded {
            tasks: vec![task],
            committed: false,
        };
        assert_eq!(
            undo(&before, Duration::from_secs(1)),
            Left::Resumed(vec![pid])
        );
        assert!(!stopped());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
