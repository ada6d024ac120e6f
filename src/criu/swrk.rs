//! One `criu swrk` child and the request/notify/response loop over its socket.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use prost::Message;

use super::request::{request, DumpRequest, RestoreRequest};
use super::rpc::{self, CriuReqType};
use super::{log_tail, plugin_failure, CriuError, CriuVersion};

/// How many lines of CRIU's log a failure shows.
const LOG_TAIL_LINES: usize = 12;
/// Responses larger than this are a protocol error (CRIU's are a few hundred bytes).
const MAX_RESPONSE: usize = 1 << 20;

/// A notification CRIU sent during a request ("pre-dump", "post-restore", ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    pub script: String,
    /// Set for "setup-namespaces" and "post-restore" (the restored root pid).
    pub pid: Option<i32>,
}

/// A running `criu swrk` process and gpucr's end of its socket.
pub struct Swrk {
    child: Option<Child>,
    sock: OwnedFd,
    path: PathBuf,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Swrk {
    /// Start `criu swrk <fd>` with extra environment variables and `inherit`ed
    /// descriptors (at the same numbers), both for the swrk child only.
    pub fn spawn(
        path: &Path,
        envs: &[(OsString, OsString)],
        inherit: &[BorrowedFd<'_>],
    ) -> Result<Swrk, CriuError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| CriuError::Socket(e.into()))?;
        // CRIU's end must survive exec; ours must not leak into CRIU.
        fcntl(&theirs, FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| CriuError::Socket(e.into()))?;
        let mut cmd = Command::new(path);
        // A process group of its own: a terminal's Ctrl-C reaches gpucr, which makes
        // CRIU roll back cleanly (crate::interrupt), and never CRIU half-way through.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // CRIU's own config files are not read: every option CRIU gets comes from
        // gpucr's request, checked (`--criu-config`; see `criu::config`).
        cmd.arg("swrk")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--no-default-config")
            .env_remove(super::config::CRIU_CONFIG_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let set_cloexec = |fd: &BorrowedFd<'_>, flags: FdFlag| {
            fcntl(fd, FcntlArg::F_SETFD(flags)).map_err(|e| CriuError::Socket(e.into()))
        };
        for fd in inherit {
            set_cloexec(fd, FdFlag::empty())?;
        }
        let spawned = cmd.spawn();
        drop(theirs);
        // Only the swrk child gets them: later children of gpucr must not.
        for fd in inherit {
            set_cloexec(fd, FdFlag::FD_CLOEXEC)?;
        }
        let mut child = spawned.map_err(|source| CriuError::Spawn {
            path: path.to_path_buf(),
            source,
        })?;
        let stderr = child.stderr.take().map(|mut pipe| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = pipe.read_to_end(&mut out);
                out
            })
        });
        Ok(Swrk {
            child: Some(child),
            sock: ours,
            path: path.to_path_buf(),
            stderr,
        })
    }

    /// The binary this client runs.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ask for CRIU's version, keeping the session open for the next request.
    pub fn version(&mut self) -> Result<CriuVersion, CriuError> {
        let mut req = request(CriuReqType::Version, None);
        req.keep_open = Some(true);
        let resp = self.call(req, "version", None, &mut |_| Ok(()))?;
        let version = resp.version.ok_or_else(|| CriuError::Protocol {
            detail: "VERSION answer without a version".into(),
        })?;
        Ok(CriuVersion::from_rpc(&version))
    }

    /// Ask CRIU to check the kernel's support (`criu check`). gpucr never gates on the
    /// answer: on some kernels CRIU reports "Does not look good" (e.g. a read-only
    /// ns_last_pid) while dump and restore work. Returns whether CRIU was satisfied.
    pub fn check(&mut self) -> Result<bool, CriuError> {
        let req = request(
            CriuReqType::Check,
            Some(rpc::CriuOpts {
                images_dir_fd: -1,
                ..Default::default()
            }),
        );
        match self.call(req, "check", None, &mut |_| Ok(())) {
            Ok(_) => Ok(true),
            Err(CriuError::Failed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Dump a tree. `log` is the log's full path, shown on failure.
    pub fn dump(
        &mut self,
        req: &DumpRequest<'_>,
        log: &Path,
        on_notify: &mut dyn FnMut(&Notify) -> Result<(), String>,
    ) -> Result<(), CriuError> {
        self.call(req.to_rpc(), "dump", Some(log), on_notify)
            .map(|_| ())
    }

    /// Restore a tree; returns the restored root's pid (a child of this process).
    pub fn restore(
        &mut self,
        req: &RestoreRequest<'_>,
        log: &Path,
        on_notify: &mut dyn FnMut(&Notify) -> Result<(), String>,
    ) -> Result<i32, CriuError> {
        let resp = self.call(req.to_rpc(), "restore", Some(log), on_notify)?;
        resp.restore
            .map(|r| r.pid)
            .ok_or_else(|| CriuError::Protocol {
                detail: "RESTORE answer without the restored pid".into(),
            })
    }

    /// Wait for the swrk child to exit after its last answer.
    pub fn finish(mut self) -> Result<(), CriuError> {
        if let Some(mut child) = self.child.take() {
            child.wait().map_err(CriuError::Socket)?;
        }
        Ok(())
    }

    /// Send a request and answer notifications until the final response arrives.
    fn call(
        &mut self,
        req: rpc::CriuReq,
        name: &'static str,
        log: Option<&Path>,
        on_notify: &mut dyn FnMut(&Notify) -> Result<(), String>,
    ) -> Result<rpc::CriuResp, CriuError> {
        let kind = req.r#type;
        self.send(&req)?;
        loop {
            let resp = self.recv()?;
            if resp.r#type == CriuReqType::Notify as i32 {
                let notify = resp.notify.unwrap_or_default();
                let notify = Notify {
                    script: notify.script.unwrap_or_default(),
                    pid: notify.pid,
                };
                let ok = on_notify(&notify).is_ok();
                let mut ack = request(CriuReqType::Notify, None);
                ack.notify_success = Some(ok);
                self.send(&ack)?;
                continue;
            }
            if resp.r#type != kind {
                return Err(self.protocol_error(format!(
                    "answer of type {} to a request of type {kind}",
                    resp.r#type
                )));
            }
            if !resp.success {
                return Err(CriuError::Failed {
                    request: name,
                    errno: resp.cr_errno,
                    errmsg: resp.cr_errmsg,
                    plugin_failure: log.and_then(plugin_failure).map(Box::new),
                    log: log.map(Path::to_path_buf),
                    log_tail: log.map(|l| log_tail(l, LOG_TAIL_LINES)).unwrap_or_default(),
                });
            }
            return Ok(resp);
        }
    }

    fn send(&mut self, req: &rpc::CriuReq) -> Result<(), CriuError> {
        let bytes = req.encode_to_vec();
        loop {
            match send(self.sock.as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    return Err(
                        self.protocol_error(format!("short send: {n} of {} bytes", bytes.len()))
                    )
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    return Err(self.died())
                }
                Err(e) => return Err(CriuError::Socket(e.into())),
            }
        }
    }

    fn recv(&mut self) -> Result<rpc::CriuResp, CriuError> {
        let fd = self.sock.as_fd().as_raw_fd();
        let len = loop {
            match recv(fd, &mut [], MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECONNRESET) => return Err(self.died()),
                Err(e) => return Err(CriuError::Socket(e.into())),
            }
        };
        if len == 0 {
            return Err(self.died());
        }
        if len > MAX_RESPONSE {
            return Err(self.protocol_error(format!("a {len}-byte message")));
        }
        let mut buf = vec![0u8; len];
        let got = loop {
            match recv(fd, &mut buf, MsgFlags::empty()) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(CriuError::Socket(e.into())),
            }
        };
        rpc::CriuResp::decode(&buf[..got])
            .map_err(|e| self.protocol_error(format!("undecodable answer: {e}")))
    }

    /// CRIU closed the socket: reap it and say how it ended.
    fn died(&mut self) -> CriuError {
        let status = match self.child.take().map(|mut c| c.wait()) {
            Some(Ok(status)) => status.to_string(),
            Some(Err(e)) => format!("cannot wait for it: {e}"),
            None => "already reaped".into(),
        };
        let stderr = self.stderr_text();
        let status = if stderr.is_empty() {
            status
        } else {
            format!("{status}; stderr: {stderr}")
        };
        CriuError::Died { status }
    }

    /// A protocol violation: kill CRIU, it cannot be trusted to go on.
    fn protocol_error(&mut self, detail: String) -> CriuError {
        self.kill();
        CriuError::Protocol { detail }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What CRIU wrote to stderr, once it has exited and its pipe drained (waits at most
    /// half a second: a restored task could still hold the pipe open).
    fn stderr_text(&mut self) -> String {
        for _ in 0..50 {
            if self.stderr.as_ref().is_none_or(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        match self.stderr.take() {
            Some(handle) if handle.is_finished() => {
                let bytes = handle.join().unwrap_or_default();
                String::from_utf8_lossy(&bytes).trim().to_string()
            }
            other => {
                self.stderr = other;
                String::new()
            }
        }
    }
}

impl Drop for Swrk {
    fn drop(&mut self) {
        // A session dropped before `finish` ended in an error: do not leave CRIU behind.
        self.kill();
    }
}

impl std::fmt::Debug for Swrk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swrk")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// `io::Error` for tests and callers that need one.
impl From<CriuError> for io::Error {
    fn from(e: CriuError) -> io::Error {
        io::Error::other(e.to_string())
    }
}
