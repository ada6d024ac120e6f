//! The restoring CRIU's side of the lazy-pages protocol: CRIU connects to
//! `lazy-pages.socket` in its working directory and, for each task it restores, sends the
//! task's pid (a native int; negative for a zombie, which has no memory) and then, in a
//! message of its own, the task's userfaultfd (SCM_RIGHTS). When every task is restored
//! it sends 0x52535446 ("RSTF") and closes the connection.
//!
//! The listening socket passes credentials (SO_PASSCRED), so each pid message also says
//! which process sent it: CRIU sends from inside the restored task itself, so that is the
//! task's pid in this process's namespace, the one a kill needs.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};

use super::error::LazyError;
use crate::cancel::Cancel;

/// The socket's name in CRIU's working directory (LAZY_PAGES_SOCK_NAME).
pub const SOCKET_NAME: &str = "lazy-pages.socket";
/// What CRIU sends once every task is restored (LAZY_PAGES_RESTORE_FINISHED).
pub const RESTORE_FINISHED: u32 = 0x5253_5446;

/// One thing CRIU said.
#[derive(Debug)]
pub enum Announcement {
    /// A task and its userfaultfd. `pid` is the task's pid in the image; `host_pid` the
    /// sender's pid here, when the kernel said.
    Task {
        pid: i32,
        host_pid: Option<i32>,
        uffd: OwnedFd,
    },
    /// A zombie (no memory to serve).
    Zombie { pid: i32 },
    /// Every task is restored.
    Finished,
}

/// The listening socket, bound before CRIU starts.
#[derive(Debug)]
pub struct LazySocket {
    listener: UnixListener,
    path: PathBuf,
}

impl LazySocket {
    /// Listen on `dir/lazy-pages.socket`. A socket someone still answers on means another
    /// restore serves from this directory: refused. A stale one is replaced.
    pub fn bind(dir: &Path) -> Result<LazySocket, LazyError> {
        let path = dir.join(SOCKET_NAME);
        let socket_error = |source| LazyError::Socket {
            path: path.clone(),
            source,
        };
        if path.symlink_metadata().is_ok() {
            if UnixStream::connect(&path).is_ok() {
                return Err(LazyError::Busy { path });
            }
            std::fs::remove_file(&path).map_err(socket_error)?;
        }
        let listener = UnixListener::bind(&path).map_err(socket_error)?;
        setsockopt(&listener, sockopt::PassCred, &true)
            .map_err(|e| socket_error(io::Error::from(e)))?;
        listener.set_nonblocking(true).map_err(socket_error)?;
        Ok(LazySocket { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wait for CRIU's connection, polling `cancel`.
    pub fn accept(&self, cancel: &Cancel) -> Result<Announcements, LazyError> {
        let socket_error = |source| LazyError::Socket {
            path: self.path.clone(),
            source,
        };
        loop {
            if let Err(c) = cancel.check() {
                return Err(LazyError::Cancelled(c.0));
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    setsockopt(&stream, sockopt::PassCred, &true)
                        .map_err(|e| socket_error(io::Error::from(e)))?;
                    stream.set_nonblocking(false).map_err(socket_error)?;
                    return Ok(Announcements {
                        stream,
                        path: self.path.clone(),
                        done: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_readable(&self.listener, Duration::from_millis(50));
                }
                Err(e) => return Err(socket_error(e)),
            }
        }
    }
}

impl Drop for LazySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn wait_readable(fd: &impl AsFd, timeout: Duration) {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let _ = poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE),
    );
}

/// One message's bytes, its sender's pid and the fd it carried.
type Received = (Vec<u8>, Option<i32>, Option<OwnedFd>);

/// CRIU's connection, read as a stream of [`Announcement`]s; it ends after
/// [`Announcement::Finished`].
#[derive(Debug)]
pub struct Announcements {
    stream: UnixStream,
    path: PathBuf,
    done: bool,
}

impl Announcements {
    /// From a connected stream (tests).
    pub fn from_stream(stream: UnixStream, path: PathBuf) -> io::Result<Announcements> {
        setsockopt(&stream, sockopt::PassCred, &true).map_err(io::Error::from)?;
        Ok(Announcements {
            stream,
            path,
            done: false,
        })
    }

    /// Whether a message waits, after at most `timeout`.
    pub fn readable(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        matches!(poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE)), Ok(n) if n > 0)
    }

    /// The next announcement, None after Finished. An end of the connection before it is
    /// [`LazyError::Hangup`]: CRIU's restore failed.
    pub fn next_announcement(&mut self) -> Result<Option<Announcement>, LazyError> {
        if self.done {
            return Ok(None);
        }
        let (word, host_pid, _) = self.receive(4, false)?;
        let value = i32::from_ne_bytes(word[..4].try_into().expect("four bytes"));
        if value as u32 == RESTORE_FINISHED {
            self.done = true;
            return Ok(Some(Announcement::Finished));
        }
        if value < 0 {
            return Ok(Some(Announcement::Zombie { pid: -value }));
        }
        if value == 0 {
            return Err(LazyError::Protocol(format!(
                "{}: CRIU announced pid 0",
                self.path.display()
            )));
        }
        let (_, _, fd) = self.receive(1, true)?;
        let uffd = fd.ok_or_else(|| {
            LazyError::Protocol(format!(
                "{}: task {value}: no userfaultfd came with its announcement",
                self.path.display()
            ))
        })?;
        Ok(Some(Announcement::Task {
            pid: value,
            host_pid,
            uffd,
        }))
    }

    /// Read exactly `len` bytes (one message's worth), with the sender's pid and any fd.
    fn receive(&mut self, len: usize, want_fd: bool) -> Result<Received, LazyError> {
        let mut bytes = vec![0u8; len];
        let mut got = 0;
        let mut sender = None;
        let mut fd = None;
        while got < len {
            let mut space = nix::cmsg_space!(libc::ucred, [std::os::fd::RawFd; 4]);
            let mut iov = [IoSliceMut::new(&mut bytes[got..])];
            let msg = recvmsg::<()>(
                self.stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| LazyError::Socket {
                path: self.path.clone(),
                source: io::Error::from(e),
            })?;
            if msg.bytes == 0 {
                return Err(LazyError::Hangup);
            }
            got += msg.bytes;
            for cmsg in msg.cmsgs().map_err(|e| LazyError::Socket {
                path: self.path.clone(),
                source: io::Error::from(e),
            })? {
                match cmsg {
                    ControlMessageOwned::ScmCredentials(creds) => sender = Some(creds.pid()),
                    ControlMessageOwned::ScmRights(fds) => {
                        for raw in fds {
                            // SAFETY: SCM_RIGHTS installed this descriptor in our table
                            // for this message; nothing else owns it.
                            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                            if want_fd && fd.is_none() {
                                fd = Some(owned);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok((bytes, sender, fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, ControlMessage};
    use std::io::{IoSlice, Write};

    fn send_task(criu: &mut UnixStream, pid: i32, fd: &impl AsRawFd) {
        criu.write_all(&pid.to_ne_bytes()).unwrap();
        let fds = [fd.as_raw_fd()];
        sendmsg::<()>(
            criu.as_raw_fd(),
            &[IoSlice::new(&[0])],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    #[test]
    fn tasks_zombies_and_the_end_arrive_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let socket = LazySocket::bind(dir.path()).unwrap();
        let mut criu = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        let mut stream = socket.accept(&Cancel::new()).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        send_task(&mut criu, 17, &a);
        criu.write_all(&(-18i32).to_ne_bytes()).unwrap();
        send_task(&mut criu, 19, &a);
        criu.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        match stream.next_announcement().unwrap() {
            Some(Announcement::Task { pid, host_pid, .. }) => {
                assert_eq!(pid, 17);
                assert_eq!(host_pid, Some(std::process::id() as i32));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            stream.next_announcement().unwrap(),
            Some(Announcement::Zombie { pid: 18 })
        ));
        assert!(matches!(
            stream.next_announcement().unwrap(),
            Some(Announcement::Task { pid: 19, .. })
        ));
        assert!(matches!(
            stream.next_announcement().unwrap(),
            Some(Announcement::Finished)
        ));
        assert!(stream.next_announcement().unwrap().is_none());
    }

    #[test]
    fn a_hangup_before_the_end_is_an_error_and_a_task_needs_its_fd() {
        let dir = tempfile::tempdir().unwrap();
        let socket = LazySocket::bind(dir.path()).unwrap();
        let mut criu = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        let mut stream = socket.accept(&Cancel::new()).unwrap();
        criu.write_all(&5i32.to_ne_bytes()).unwrap();
        criu.write_all(&[0]).unwrap();
        assert!(matches!(
            stream.next_announcement(),
            Err(LazyError::Protocol(_))
        ));
        drop(criu);
        assert!(matches!(stream.next_announcement(), Err(LazyError::Hangup)));
    }

    #[test]
    fn a_live_socket_is_refused_and_a_stale_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let socket = LazySocket::bind(dir.path()).unwrap();
        assert!(matches!(
            LazySocket::bind(dir.path()),
            Err(LazyError::Busy { .. })
        ));
        drop(socket);
        // A socket file nobody listens on any more.
        drop(UnixListener::bind(dir.path().join(SOCKET_NAME)).unwrap());
        assert!(dir.path().join(SOCKET_NAME).exists());
        LazySocket::bind(dir.path()).unwrap();
    }

    #[test]
    fn accept_ends_when_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let socket = LazySocket::bind(dir.path()).unwrap();
        let cancel = Cancel::new();
        cancel.cancel("stop");
        assert!(matches!(
            socket.accept(&cancel),
            Err(LazyError::Cancelled(_))
        ));
    }
}
