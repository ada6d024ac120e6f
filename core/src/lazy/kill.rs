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

/// SIGKILL the process of `pidfd` (no other process that took its pid since), and wait
/// at most `limit` for it to exit: whether it has.
pub fn kill_process(pidfd: &crate::wait::pidfd::PidFd, limit: std::time::Duration) -> bool {
    use std::os::fd::{AsFd, AsRawFd};
    // SAFETY: pidfd_send_signal takes an open pidfd, a signal number, a null siginfo and
    // flags 0 by value; no memory is shared with the kernel.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_fd().as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    (sent == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
        && pidfd.exited_within(limit).unwrap_or(false)
}

/// SIGSTOP `roots` and their descendants (before [`kill_tree`] kills them, so that none
/// forks a child the walk would miss).
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
    fn a_killed_process_has_exited_when_kill_process_returns() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pidfd = crate::wait::pidfd::PidFd::open(child.id() as i32).unwrap();
        assert!(kill_process(&pidfd, std::time::Duration::from_secs(10)));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        // Once reaped, there is nothing left to kill: not an error.
        assert!(kill_process(&pidfd, std::time::Duration::from_secs(1)));
    }

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
