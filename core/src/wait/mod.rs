//! Blocking waits on file descriptors, so that a thread waiting for something sleeps
//! until it happens instead of looking again and again: [`readable`] (`ppoll(2)` with a
//! deadline that may be shorter than a millisecond), a process's exit through a pidfd
//! ([`pidfd`]), the files of a directory being created or written through inotify
//! ([`dir`]).
//!
//! This module is a leaf: it imports nothing of gpucr.

pub mod dir;
pub mod pidfd;

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;

/// Wait until one of `fds` is readable (or hung up, or in error: a read then tells),
/// for at most `timeout` (`None`: for as long as it takes). The index of the first of
/// them that is, `None` when the time ran out. A signal does not end the wait.
pub fn readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Option<Duration>,
) -> io::Result<Option<usize>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut polled = fds.map(|fd| PollFd::new(fd, PollFlags::POLLIN));
    loop {
        let left =
            deadline.map(|d| TimeSpec::from_duration(d.saturating_duration_since(Instant::now())));
        match ppoll(&mut polled, left, None) {
            Ok(0) => return Ok(None),
            Ok(_) => {
                return Ok(polled
                    .iter()
                    .position(|p| p.revents().is_some_and(|r| !r.is_empty())))
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::sys::eventfd::{EfdFlags, EventFd};

    use super::*;

    #[test]
    fn the_first_readable_fd_is_named_or_the_time_runs_out() {
        let a = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap();
        let b = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap();
        let started = Instant::now();
        let none = readable([a.as_fd(), b.as_fd()], Some(Duration::from_micros(300)));
        assert_eq!(none.unwrap(), None);
        assert!(started.elapsed() < Duration::from_secs(5));
        b.write(1).unwrap();
        assert_eq!(readable([a.as_fd(), b.as_fd()], None).unwrap(), Some(1));
        a.write(1).unwrap();
        assert_eq!(
            readable([a.as_fd(), b.as_fd()], Some(Duration::ZERO)).unwrap(),
            Some(0)
        );
    }

    #[test]
    fn a_write_from_another_thread_ends_an_unbounded_wait() {
        let fd = std::sync::Arc::new(EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap());
        let writer = fd.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            writer.write(1).unwrap();
        });
        assert_eq!(readable([fd.as_fd()], None).unwrap(), Some(0));
        t.join().unwrap();
    }
}
