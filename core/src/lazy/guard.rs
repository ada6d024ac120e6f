//! The lazy restore's guard (`gpucr lazy-guard LOG`, hidden; see `crate::guard`).
//!
//! A task's userfaultfd is the only thing between it and zeros: once the last
//! descriptor of it closes, the kernel fills every page still missing with zeros and the
//! task runs on with its data gone. The server's descriptors die with gpucr, so a gpucr
//! killed outright (SIGKILL, the OOM killer) would leave the tree corrupted without a
//! word.
//!
//! So a lazy restore starts this guard before CRIU starts, and the server passes it a
//! duplicate of every userfaultfd as it arrives, forks' new ones included (over a
//! SOCK_SEQPACKET socket, its standard input, with SCM_RIGHTS), before any task they
//! serve can run. Each record is one packet: `task PID START` (a task's pid here and its
//! start time, with its userfaultfd), `fork` (a forked child's userfaultfd) and `done`
//! (serving is over: every page is in, or gpucr killed the tree itself). When the link
//! ends without `done`, gpucr died: the guard stops and kills every task it was told of
//! and all their descendants (faulting tasks wait on the userfaultfds it still holds,
//! they never see a zero page), writes why to the restore's log, and only then closes
//! the userfaultfds.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

use crate::target;

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "lazy-guard";

/// Why the guard could not be started or told.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot start the lazy-pages guard: {0}")]
    Start(io::Error),
    #[error("{}: cannot open the lazy restore's log for its guard: {source}", .path.display())]
    Log { path: PathBuf, source: io::Error },
    #[error(
        "the lazy-pages guard is gone: cannot hand it a userfaultfd, and the tree would \
         lose its memory should gpucr die ({0})"
    )]
    Lost(io::Error),
}

/// gpucr's end of a running lazy-pages guard.
#[derive(Debug)]
pub struct LazyGuard {
    link: Mutex<Option<OwnedFd>>,
    child: Mutex<Option<Child>>,
}

impl LazyGuard {
    /// Start `gpucr lazy-guard LOG` (this binary); it writes to `log` if gpucr dies.
    pub fn start(log: &Path) -> Result<LazyGuard, GuardError> {
        LazyGuard::start_program(&std::env::current_exe().map_err(GuardError::Start)?, log)
    }

    /// [`LazyGuard::start`] with another gpucr binary (tests).
    pub fn start_program(program: &Path, log: &Path) -> Result<LazyGuard, GuardError> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| GuardError::Start(e.into()))?;
        // Not gpucr's standard error: the guard lives until every page is in, and a
        // caller reading the command's output (`$(gpucr restore --lazy --detach ...)`)
        // would wait for it until then. What it might say goes to the log.
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| GuardError::Log {
                path: log.to_path_buf(),
                source,
            })?;
        let child = Command::new(program)
            .arg(SUBCOMMAND)
            .arg(log)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            // Its own group: a terminal's Ctrl-C is for gpucr, not for it.
            .process_group(0)
            .spawn()
            .map_err(GuardError::Start)?;
        Ok(LazyGuard {
            link: Mutex::new(Some(ours)),
            child: Mutex::new(Some(child)),
        })
    }

    fn send(&self, record: &str, fd: Option<BorrowedFd<'_>>) -> Result<(), GuardError> {
        let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        let Some(link) = link.as_ref() else {
            return Err(GuardError::Lost(io::Error::from(
                io::ErrorKind::NotConnected,
            )));
        };
        let fds = fd.map(|f| [f.as_raw_fd()]);
        let cmsgs: Vec<ControlMessage<'_>> = fds
            .as_ref()
            .map(|f| vec![ControlMessage::ScmRights(f)])
            .unwrap_or_default();
        sendmsg::<()>(
            link.as_raw_fd(),
            &[IoSlice::new(record.as_bytes())],
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map(|_| ())
        .map_err(|e| GuardError::Lost(e.into()))
    }

    /// Hand over a task's userfaultfd; `host_pid` is the task here, when known.
    pub fn task(&self, host_pid: Option<i32>, uffd: BorrowedFd<'_>) -> Result<(), GuardError> {
        let (pid, start) = host_pid
            .and_then(|pid| Some((pid, target::start_time(pid)?)))
            .unwrap_or((0, 0));
        self.send(&format!("task {pid} {start}"), Some(uffd))
    }

    /// Hand over a forked child's userfaultfd.
    pub fn fork(&self, uffd: BorrowedFd<'_>) -> Result<(), GuardError> {
        self.send("fork", Some(uffd))
    }

    /// Serving is over (every page in, or the tree killed by gpucr): the guard closes
    /// its descriptors and ends.
    pub fn done(&self) {
        let _ = self.send(crate::guard::DONE, None);
        drop(self.link.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = child.wait();
        }
    }
}

impl Drop for LazyGuard {
    fn drop(&mut self) {
        self.done();
    }
}

/// What the guard was told.
#[derive(Debug, Default)]
pub struct Held {
    /// The tasks (pid, start time) whose trees it kills should gpucr die.
    pub tasks: Vec<(i32, u64)>,
    /// The userfaultfds it holds open.
    pub uffds: Vec<OwnedFd>,
    /// gpucr said serving was over.
    pub done: bool,
}

/// In the guard: read the records from `link` until `done` or the end of the link.
pub fn hold(link: BorrowedFd<'_>) -> Held {
    let mut held = Held::default();
    loop {
        let mut buf = [0u8; 256];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            link.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        };
        let len = msg.bytes;
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: SCM_RIGHTS installed this descriptor in our table for
                        // this message; nothing else owns it.
                        held.uffds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                    }
                }
            }
        }
        if len == 0 {
            break;
        }
        let record = String::from_utf8_lossy(&buf[..len]);
        let mut words = record.split_whitespace();
        match words.next() {
            Some(crate::guard::DONE) => {
                held.done = true;
                break;
            }
            Some("task") => {
                let pid = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let start = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                if pid > 0 {
                    held.tasks.push((pid, start));
                }
            }
            _ => {}
        }
    }
    held
}

/// In the guard, once gpucr is gone without `done`: kill every task still the one gpucr
/// named, with its descendants; the number of processes signalled. The userfaultfds are
/// closed by the caller only after this.
pub fn kill_held(held: &Held) -> usize {
    let roots: Vec<i32> = held
        .tasks
        .iter()
        .filter(|(pid, start)| target::start_time(*pid) == Some(*start))
        .map(|(pid, _)| *pid)
        .collect();
    super::kill::kill_tree(&roots)
}

/// The guard's whole run: hold the userfaultfds, and if gpucr dies, kill the tree and
/// say why in `log`. Whether it killed.
pub fn run(link: BorrowedFd<'_>, log: &Path) -> bool {
    let held = hold(link);
    if held.done {
        return false;
    }
    let killed = kill_held(&held);
    let why = format!(
        "gpucr lazy-guard: gpucr ended while serving the restored tree's memory; the tree \
         was killed before any of its missing pages could read as zeros ({killed} \
         processes)"
    );
    append_log(log, &why);
    drop(held);
    true
}

/// Append one line, with the time, to the lazy restore's log.
pub fn append_log(log: &Path, line: &str) {
    use std::io::Write;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(file, "{stamp:.3} {line}");
    }
}

/// The log a lazy restore names: `lazy-pages.log` in its work directory (the image
/// directory), or `gpucr-lazy-PID.log` in the system's temporary directory when the
/// work directory is private (it is removed once CRIU's restore succeeds).
pub fn log_path(work_dir: &Path, private: bool) -> PathBuf {
    if private {
        std::env::temp_dir().join(format!("gpucr-lazy-{}.log", std::process::id()))
    } else {
        work_dir.join(LOG_NAME)
    }
}

/// The log's name in the work directory.
pub const LOG_NAME: &str = "lazy-pages.log";

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn records_and_descriptors_reach_the_guard_and_done_ends_it() {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let guard = LazyGuard {
            link: Mutex::new(Some(ours)),
            child: Mutex::new(None),
        };
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = std::process::id() as i32;
        guard.task(Some(me), a.as_fd()).unwrap();
        guard.fork(a.as_fd()).unwrap();
        guard.done();
        let held = hold(theirs.as_fd());
        assert!(held.done);
        assert_eq!(held.uffds.len(), 2);
        assert_eq!(held.tasks, [(me, target::start_time(me).unwrap())]);
        assert!(matches!(guard.fork(a.as_fd()), Err(GuardError::Lost(_))));
    }

    #[test]
    fn a_link_that_ends_without_done_kills_the_named_tasks() {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let guard = LazyGuard {
            link: Mutex::new(Some(ours)),
            child: Mutex::new(None),
        };
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        guard.task(Some(pid), a.as_fd()).unwrap();
        // gpucr dies: the link ends without `done`.
        drop(guard.link.lock().unwrap().take());
        drop(guard);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(LOG_NAME);
        assert!(run(theirs.as_fd(), &log));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("gpucr ended while serving"), "{text}");
    }
}
