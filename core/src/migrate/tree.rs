//! A stopped tree, on either side of a migration: the source's, stopped as its dump
//! let it go, the destination's, left stopped by CRIU's restore (`leave_stopped`). It is let
//! run (SIGCONT to every task) or killed once the migration knows which copy lives.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::lazy::kill::{descendants, kill_tree};

/// How long the tasks of a tree may take to stop.
const STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a tree could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("pid {pid}: task {task} did not stop within {} s of SIGSTOP", STOP_LIMIT.as_secs())]
    NotStopped { pid: i32, task: i32 },
}

/// A stopped tree, by its root's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoppedTree {
    pub root: i32,
}

impl StoppedTree {
    /// Stop every task of the tree rooted at `root` (SIGSTOP), walking it again until
    /// no task was missed (one forked while it was walked), and wait until each is
    /// stopped. On failure the tree is let run again.
    pub fn stop(root: i32) -> Result<StoppedTree, StopError> {
        let tree = StoppedTree { root };
        let deadline = std::time::Instant::now() + STOP_LIMIT;
        let mut stopped = std::collections::BTreeSet::new();
        loop {
            let all = descendants(&[root]);
            for pid in all.difference(&stopped) {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGSTOP);
            }
            for pid in &all {
                while !gpucr_abi::procfs::is_stopped(*pid) && crate::target::is_running(*pid) {
                    if std::time::Instant::now() > deadline {
                        tree.resume();
                        return Err(StopError::NotStopped {
                            pid: root,
                            task: *pid,
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            if all == stopped {
                return Ok(tree);
            }
            stopped = all;
        }
    }

    /// Let every task of the tree run again; how many were sent SIGCONT.
    pub fn resume(&self) -> usize {
        let all = descendants(&[self.root]);
        for pid in &all {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
        }
        all.len()
    }

    /// Kill every task of the tree; how many were sent SIGKILL.
    pub fn kill(&self) -> usize {
        kill_tree(&[self.root])
    }

    /// Whether the root still exists (and is not a zombie).
    pub fn alive(&self) -> bool {
        crate::target::is_running(self.root)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;

    fn state(pid: i32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .and_then(|s| s.trim_start().chars().next())
            .unwrap_or('?')
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_stopped_tree_runs_again_then_dies() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        until("the sleep to start", || descendants(&[root]).len() == 2);
        let tree = StoppedTree::stop(root).unwrap();
        assert!(descendants(&[root]).iter().all(|p| state(*p) == 'T'));
        assert_eq!(tree.resume(), 2);
        until("the tree to run", || {
            descendants(&[root]).iter().all(|p| state(*p) != 'T')
        });
        assert!(tree.alive());
        assert_eq!(tree.kill(), 2);
        child.wait().unwrap();
    }
}
