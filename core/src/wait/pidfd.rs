//! A process's exit, waited for through a pidfd (`pidfd_open(2)`, Linux 5.3): the fd
//! turns readable once the process has exited, whether or not it was reaped and whose
//! child it is, so a wait sleeps until then instead of reading `/proc` again and again.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A pidfd: a reference to one process that does not pass to a later process reusing
/// its pid, and turns readable when the process exits.
#[derive(Debug)]
pub struct PidFd(OwnedFd);

impl PidFd {
    /// A pidfd of `pid` (a process, not a thread), close-on-exec. `ESRCH` if there is
    /// no such process (a zombie still is one).
    pub fn open(pid: i32) -> io::Result<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1;
        // no memory is shared with the kernel.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: `fd` was just returned by pidfd_open: open, and owned by nothing else.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wait until the process has exited (a zombie has), for at most `timeout`: whether
    /// it has.
    pub fn exited_within(&self, timeout: Duration) -> io::Result<bool> {
        Ok(super::readable([self.0.as_fd()], Some(timeout))?.is_some())
    }
}

impl AsFd for PidFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Wait until `pid` has exited (a zombie has, one already gone has), for at most
/// `timeout`: whether it has.
pub fn exited_within(pid: i32, timeout: Duration) -> io::Result<bool> {
    match PidFd::open(pid) {
        Ok(fd) => fd.exited_within(timeout),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(true),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_child_is_seen_to_exit_before_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let fd = PidFd::open(pid).unwrap();
        assert!(!fd.exited_within(Duration::ZERO).unwrap());
        let started = Instant::now();
        assert!(fd.exited_within(Duration::from_secs(30)).unwrap());
        assert!(started.elapsed() < Duration::from_secs(20));
        // A zombie now: exited, and its pidfd says so at once.
        assert!(exited_within(pid, Duration::ZERO).unwrap());
        child.wait().unwrap();
        // Reaped: no such process.
        assert!(exited_within(pid, Duration::ZERO).unwrap());
    }

    #[test]
    fn a_running_process_outlasts_a_short_wait() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!exited_within(pid, Duration::from_millis(20)).unwrap());
        child.kill().unwrap();
        assert!(exited_within(pid, Duration::from_secs(30)).unwrap());
        child.wait().unwrap();
    }
}
