//! Killing a restored tree whose memory will not all come: every task gpucr knows, and
//! every descendant of theirs (a task forked after the restore is known to the server
//! only by its userfaultfd).

use std::collections::BTreeSet;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The pids of `roots` and of all their descendants, read from
/// `/proc/PID/task/*/children`.
pub fn descendants(roots: &[i32]) -> BTreeSet<i32> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<i32> = roots.iter().copied().filter(|p| *p > 0).collect();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    seen
}

/// SIGSTOP `roots` and their descendants (a tree CRIU still holds: it is killed once
/// CRIU has let go, [`kill_tree`]).
pub fn stop_tree(roots: &[i32]) -> BTreeSet<i32> {
    let all = descendants(roots);
    for pid in &all {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGSTOP);
    }
    all
}

/// SIGKILL `roots` and their descendants. Stopping them first keeps a task from forking
/// a child the walk would miss.
pub fn kill_tree(roots: &[i32]) -> usize {
    let first = stop_tree(roots);
    let all = descendants(&first.iter().copied().collect::<Vec<_>>());
    for pid in &all {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_tree_is_killed_with_its_grandchildren() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while descendants(&[pid]).len() < 3 {
            assert!(std::time::Instant::now() < deadline, "sleeps never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let grandchildren: Vec<i32> = descendants(&[pid])
            .into_iter()
            .filter(|p| *p != pid)
            .collect();
        assert_eq!(kill_tree(&[pid]), 3);
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        for g in grandchildren {
            // Gone, or a zombie until its new parent reaps it: never running.
            let dead = || {
                let state = std::fs::read_to_string(format!("/proc/{g}/stat")).unwrap_or_default();
                state.is_empty() || state.contains(") Z") || state.contains(") X")
            };
            while !dead() {
                assert!(std::time::Instant::now() < deadline, "{g} survived");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}
