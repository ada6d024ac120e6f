//! A stopped tree, on either side of a migration: the source's, stopped as its dump
//! let it go, the destination's, left stopped by CRIU's restore (`leave_stopped`). It is let
//! run (SIGCONT to every task) or killed once the migration knows which copy lives.

use std::collections::BTreeSet;
use std::path::Path;

use gpucr_criu_image::explore::{ProcessTree, TaskState};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedTree {
    pub root: i32,
    /// Tasks that were stopped before gpucr stopped the tree (job control, their
    /// owner's SIGSTOP): [`StoppedTree::resume`] leaves them stopped.
    stopped_before: BTreeSet<i32>,
}

impl StoppedTree {
    /// The tree rooted at `root` before gpucr freezes it: which of its tasks are already
    /// stopped, so that a failure lets run only what gpucr stopped.
    pub fn before_freeze(root: i32) -> StoppedTree {
        let stopped_before = descendants(&[root])
            .into_iter()
            .filter(|pid| gpucr_abi::procfs::is_stopped(*pid))
            .collect();
        StoppedTree {
            root,
            stopped_before,
        }
    }

    /// A tree a restore left stopped (`leave_stopped`), from the image in `dir`: the
    /// tasks the image records as stopped (their owner had stopped them on the source,
    /// and CRIU restores them stopped) stay stopped on resume; every other task runs.
    /// An image whose process tree cannot be read lets every task run, as before.
    pub fn restored(root: i32, dir: &Path, page_size: u64) -> StoppedTree {
        let images = gpucr_criu_image::ImageDir::new(dir, page_size);
        let stopped_in_image: BTreeSet<u32> = match ProcessTree::load(&images) {
            Ok(tree) => tree
                .processes()
                .iter()
                .filter(|p| p.state == TaskState::Stopped)
                .map(|p| p.pid)
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        StoppedTree::restored_keeping(root, &stopped_in_image)
    }

    /// A restored tree whose tasks with these pids (as the image, the tree's innermost
    /// PID namespace, numbers them) stay stopped on resume.
    fn restored_keeping(root: i32, stopped_in_image: &BTreeSet<u32>) -> StoppedTree {
        let stopped_before = if stopped_in_image.is_empty() {
            BTreeSet::new()
        } else {
            descendants(&[root])
                .into_iter()
                .filter(|pid| {
                    crate::gpu::ns_pid(*pid).is_ok_and(|ns| stopped_in_image.contains(&ns))
                })
                .collect()
        };
        StoppedTree {
            root,
            stopped_before,
        }
    }

    /// Stop every task of the tree (SIGSTOP), walking it again until no task was
    /// missed (one forked while it was walked), and wait until each is stopped. On
    /// failure the tree is let run again.
    pub fn stop(self) -> Result<StoppedTree, StopError> {
        let tree = self;
        let root = tree.root;
        let deadline = std::time::Instant::now() + STOP_LIMIT;
        let mut stopped = BTreeSet::new();
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

    /// The tasks [`StoppedTree::resume`] lets run: every task of the tree now but those
    /// stopped before gpucr stopped it.
    pub fn resumable(&self) -> BTreeSet<i32> {
        let all = descendants(&[self.root]);
        all.difference(&self.stopped_before).copied().collect()
    }

    /// Let every task of the tree run again, but those stopped before gpucr stopped
    /// it; how many were sent SIGCONT.
    pub fn resume(&self) -> usize {
        let resumable = self.resumable();
        for pid in &resumable {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
        }
        resumable.len()
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
        let tree = StoppedTree::before_freeze(root).stop().unwrap();
        assert!(descendants(&[root]).iter().all(|p| state(*p) == 'T'));
        assert_eq!(tree.resume(), 2);
        until("the tree to run", || {
            descendants(&[root]).iter().all(|p| state(*p) != 'T')
        });
        assert!(tree.alive());
        assert_eq!(tree.kill(), 2);
        child.wait().unwrap();
    }

    /// A shell with two sleeps, running: the shell, its pid, and one of the sleeps.
    fn two_sleeps() -> (std::process::Child, i32, i32) {
        let child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        until("the sleeps to start", || descendants(&[root]).len() == 3);
        let held = *descendants(&[root]).iter().find(|p| **p != root).unwrap();
        (child, root, held)
    }

    /// `tree` (the shell of [`two_sleeps`], every task stopped) resumed: all but `held`
    /// run, `held` stays stopped; then the tree is killed.
    fn resumes_all_but(tree: StoppedTree, mut child: std::process::Child, held: i32) {
        let root = tree.root;
        assert_eq!(tree.resume(), 2);
        until("the others to run", || {
            descendants(&[root])
                .iter()
                .all(|p| *p == held || state(*p) != 'T')
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(state(held), 'T', "task {held}, stopped before, was let run");
        assert_eq!(tree.kill(), 3);
        child.wait().unwrap();
    }

    #[test]
    fn a_task_stopped_before_the_freeze_stays_stopped_on_resume() {
        let (child, root, held) = two_sleeps();
        kill(Pid::from_raw(held), Signal::SIGSTOP).unwrap();
        until("the first sleep to stop", || state(held) == 'T');
        let tree = StoppedTree::before_freeze(root).stop().unwrap();
        resumes_all_but(tree, child, held);
    }

    #[test]
    fn a_restored_task_the_image_records_stopped_stays_stopped_on_resume() {
        let (child, root, held) = two_sleeps();
        // As a restore leaves it: every task stopped.
        for pid in descendants(&[root]) {
            kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        }
        until("the tree to stop", || {
            descendants(&[root]).iter().all(|p| state(*p) == 'T')
        });
        let in_image = BTreeSet::from([crate::gpu::ns_pid(held).unwrap()]);
        resumes_all_but(StoppedTree::restored_keeping(root, &in_image), child, held);
    }
}
