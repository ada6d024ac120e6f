//! One `criu swrk` child and the request/notify/response loop over its socket.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use prost::Message;

use super::action_script;
use super::notification::Notification;
use super::request::{request, DumpRequest, RestoreRequest};
use super::rpc::{self, CriuReqType};
use super::{
    log_tail, plugin_failure, script_failure, CriuError, CriuVersion, LogStamp, ScriptFailure,
};

/// How many lines of CRIU's log a failure shows.
const LOG_TAIL_LINES: usize = 12;
/// Responses larger than this are a protocol error (CRIU's are a few hundred bytes).
const MAX_RESPONSE: usize = 1 << 20;
/// How long `criu swrk` may take to answer its first request (VERSION), which CRIU
/// answers in milliseconds: a binary that does not is hung, or no CRIU.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the wait for CRIU's first answer looks for an interrupt.
const START_POLL: Duration = Duration::from_millis(50);
/// How long a failure waits for CRIU's stderr pipe to be drained once CRIU has exited:
/// a restored task could still hold the pipe open.
const STDERR_WAIT: Duration = Duration::from_millis(500);
/// How long after a signal CRIU may go without a word before gpucr says what it waits
/// for (a hung action script, a slow freeze).
const INTERRUPTED_NOTICE: Duration = Duration::from_secs(3);

/// A further signal while CRIU, interrupted, does not report back: end the action
/// scripts `criu` waits for, so that it fails their stage and rolls the request `name`
/// back; say what was done, or that there was no script to end.
fn end_action_scripts(criu: i32, name: &str) {
    let scripts = action_script::running(criu);
    if scripts.is_empty() {
        crate::errln!(
            "gpucr: CRIU (pid {criu}) runs no action script now: still waiting for it to \
             roll the {name} back"
        );
    }
    for script in scripts {
        action_script::end(&script);
        crate::errln!(
            "gpucr: ended the action script `{}` (pid {}, at {}) that CRIU waited for; \
             CRIU now rolls the {name} back",
            script.command,
            script.pid,
            script.action
        );
    }
}

/// CRIU's answer to a request whose notifications a handler answered: CRIU's own
/// result, and the first refusal of the handler (CRIU then fails the stage, and the
/// request unless CRIU only logs that stage's failures), typed as the handler gave it.
#[derive(Debug)]
pub struct Answered<T, E> {
    pub criu: Result<T, CriuError>,
    pub refused: Option<E>,
}

/// Whether a notification was accepted, keeping the handler's first refusal.
fn first_refusal<E>(answer: Result<(), E>, refused: &mut Option<E>) -> bool {
    match answer {
        Ok(()) => true,
        Err(e) => {
            refused.get_or_insert(e);
            false
        }
    }
}

/// A running `criu swrk` process and gpucr's end of its socket.
pub struct Swrk {
    child: Option<Child>,
    sock: OwnedFd,
    path: PathBuf,
    /// What CRIU writes to stderr, sent once its pipe is drained (a thread reads it).
    stderr: Option<Receiver<Vec<u8>>>,
    /// The notifications CRIU sent during the last request, each with the length of
    /// the request's log when it came (to tell which stage a line of it belongs to).
    stages: Vec<(u64, String)>,
    /// The signal that asked gpucr to stop, if one did ([`Swrk::watch_interrupts`]).
    interrupted: fn() -> Option<i32>,
    /// How many signals have arrived so far: one after the first ends the action
    /// scripts CRIU waits for.
    signals: fn() -> u64,
    /// Readable at each signal: the waits for CRIU poll it beside the socket, so that
    /// a signal ends them at once (none: only CRIU's socket ends them).
    wake: Option<crate::interrupt::WakeFd>,
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
            let (sent, received) = mpsc::sync_channel(1);
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = pipe.read_to_end(&mut out);
                let _ = sent.send(out);
            });
            received
        });
        Ok(Swrk {
            child: Some(child),
            sock: ours,
            path: path.to_path_buf(),
            stderr,
            stages: Vec::new(),
            interrupted: || None,
            signals: || 0,
            wake: None,
        })
    }

    /// Ask `interrupted` while a request waits for CRIU: once it names a signal, gpucr
    /// answers CRIU's next notification with a failure, and should CRIU then go
    /// [`INTERRUPTED_NOTICE`] without a word, gpucr says once what it waits for. Each
    /// further signal (`signals` counts them all) ends the action scripts CRIU is
    /// waiting for ([`action_script`](super::action_script)).
    pub fn watch_interrupts(&mut self, interrupted: fn() -> Option<i32>, signals: fn() -> u64) {
        self.interrupted = interrupted;
        self.signals = signals;
    }

    /// Poll `wake` beside CRIU's socket in every wait for CRIU: a signal (which makes it
    /// readable) ends the wait at once, to read the flags of [`Swrk::watch_interrupts`]
    /// or [`Swrk::version_within`].
    pub fn wake_on(&mut self, wake: crate::interrupt::WakeFd) {
        self.wake = Some(wake);
    }

    /// Poll CRIU's socket and the wake fd for at most `limit` (None: no limit): whether
    /// the socket is readable. A wake-up from the wake fd clears it and answers false.
    fn poll_socket(&self, limit: Option<Duration>) -> Result<bool, CriuError> {
        let timeout = match limit {
            None => PollTimeout::NONE,
            // Rounded up, so that a wait never ends before its time is out.
            Some(limit) => {
                PollTimeout::try_from(limit.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = vec![PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        if let Some(wake) = &self.wake {
            fds.push(PollFd::new(wake.fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(false),
            Ok(_) => {
                let socket = fds[0].revents().is_some_and(|r| !r.is_empty());
                if fds
                    .get(1)
                    .and_then(PollFd::revents)
                    .is_some_and(|r| !r.is_empty())
                {
                    if let Some(wake) = &self.wake {
                        wake.clear();
                    }
                }
                Ok(socket)
            }
            Err(e) => Err(CriuError::Socket(e.into())),
        }
    }

    /// The binary this client runs.
    /// CRIU's pid, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ask for CRIU's version, keeping the session open for the next request; CRIU
    /// must answer within [`START_TIMEOUT`].
    pub fn version(&mut self) -> Result<CriuVersion, CriuError> {
        self.version_within(START_TIMEOUT, &|| None)
    }

    /// Ask for CRIU's version, the first request of a session: a CRIU that has not
    /// answered within `timeout` is killed ([`CriuError::StartTimeout`]), and so is one
    /// whose answer is still awaited when `interrupted` (asked every 50 ms) names a
    /// signal ([`CriuError::Interrupted`]).
    pub fn version_within(
        &mut self,
        timeout: Duration,
        interrupted: &dyn Fn() -> Option<i32>,
    ) -> Result<CriuVersion, CriuError> {
        let mut req = request(CriuReqType::Version, None);
        req.keep_open = Some(true);
        self.send(&req)?;
        self.wait_for_answer(timeout, interrupted)?;
        let resp = self.recv()?;
        let resp = self.final_answer(resp, req.r#type, "version", None, None, None)?;
        let version = resp.version.ok_or_else(|| CriuError::Protocol {
            detail: "VERSION answer without a version".into(),
        })?;
        Ok(CriuVersion::from_rpc(&version))
    }

    /// Wait until CRIU's socket has something to read (an answer, or CRIU gone), for at
    /// most `timeout`, giving up at once when `interrupted` names a signal. Giving up
    /// kills CRIU and whatever it started (its process group, of its own).
    fn wait_for_answer(
        &mut self,
        timeout: Duration,
        interrupted: &dyn Fn() -> Option<i32>,
    ) -> Result<(), CriuError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(signal) = interrupted() {
                self.kill_group();
                return Err(CriuError::Interrupted {
                    path: self.path.clone(),
                    signal: crate::interrupt::name(signal),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.kill_group();
                return Err(CriuError::StartTimeout {
                    path: self.path.clone(),
                    seconds: timeout.as_secs_f64(),
                });
            }
            // With a wake fd ([`Swrk::wake_on`]) a signal ends the wait at once;
            // without one `interrupted` is read every START_POLL.
            let slice = if self.wake.is_some() {
                left
            } else {
                left.min(START_POLL)
            };
            if self.poll_socket(Some(slice))? {
                return Ok(());
            }
        }
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
        match self.call(req, "check", None, None, &mut |_| true) {
            Ok(_) => Ok(true),
            Err(CriuError::Failed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Dump a tree. `log` is the log's full path, shown on failure.
    pub fn dump<E>(
        &mut self,
        req: &DumpRequest<'_>,
        log: &Path,
        on_notify: &mut dyn FnMut(&Notification) -> Result<(), E>,
    ) -> Answered<(), E> {
        let mut refused = None;
        let criu = self
            .call(
                req.to_rpc(),
                "dump",
                Some(log),
                req.config_origin,
                &mut |n| first_refusal(on_notify(n), &mut refused),
            )
            .map(|_| ());
        Answered { criu, refused }
    }

    /// Restore a tree; returns the restored root's pid (a child of this process).
    pub fn restore<E>(
        &mut self,
        req: &RestoreRequest<'_>,
        log: &Path,
        on_notify: &mut dyn FnMut(&Notification) -> Result<(), E>,
    ) -> Answered<i32, E> {
        let mut refused = None;
        let criu = self
            .call(
                req.to_rpc(),
                "restore",
                Some(log),
                req.config_origin,
                &mut |n| first_refusal(on_notify(n), &mut refused),
            )
            .and_then(|resp| {
                resp.restore
                    .map(|r| r.pid)
                    .ok_or_else(|| CriuError::Protocol {
                        detail: "RESTORE answer without the restored pid".into(),
                    })
            });
        Answered { criu, refused }
    }

    /// Wait for the swrk child to exit after its last answer.
    pub fn finish(mut self) -> Result<(), CriuError> {
        if let Some(mut child) = self.child.take() {
            child.wait().map_err(CriuError::Socket)?;
        }
        Ok(())
    }

    /// Send a request and answer notifications until the final response arrives. A
    /// failure shows the end of `log` if this request wrote it; if it did not, CRIU
    /// refused the request before opening it, and the failure names `config` (the
    /// `--criu-config` file whose options the request carried) and CRIU's stderr.
    fn call(
        &mut self,
        req: rpc::CriuReq,
        name: &'static str,
        log: Option<&Path>,
        config: Option<&Path>,
        on_notify: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<rpc::CriuResp, CriuError> {
        let kind = req.r#type;
        // A log left by an earlier run is never shown as this one's.
        let log_before = log.and_then(LogStamp::of);
        self.stages.clear();
        self.send(&req)?;
        loop {
            self.await_message(name, log)?;
            let resp = self.recv()?;
            if resp.r#type == CriuReqType::Notify as i32 {
                let notify = resp.notify.unwrap_or_default();
                let notify =
                    Notification::from_wire(notify.script.as_deref().unwrap_or(""), notify.pid);
                // CRIU waits for the answer before it logs more, and runs this stage's
                // action scripts right after it.
                let length = log
                    .and_then(|l| std::fs::metadata(l).ok())
                    .map_or(0, |m| m.len());
                self.stages.push((length, notify.name().to_owned()));
                let ok = on_notify(&notify);
                let mut ack = request(CriuReqType::Notify, None);
                ack.notify_success = Some(ok);
                self.send(&ack)?;
                continue;
            }
            return self.final_answer(resp, kind, name, log, log_before, config);
        }
    }

    /// CRIU's final answer `resp` to the request `name` of type `kind`, or why it
    /// failed: the end of `log` if this request wrote it (`log_before` is its state
    /// before); if it did not, CRIU refused the request before opening it, and the
    /// failure names `config` and CRIU's stderr.
    fn final_answer(
        &mut self,
        resp: rpc::CriuResp,
        kind: i32,
        name: &'static str,
        log: Option<&Path>,
        log_before: Option<LogStamp>,
        config: Option<&Path>,
    ) -> Result<rpc::CriuResp, CriuError> {
        if resp.r#type != kind {
            return Err(self.protocol_error(format!(
                "answer of type {} to a request of type {kind}",
                resp.r#type
            )));
        }
        if resp.success {
            return Ok(resp);
        }
        if let Some(log) = log.filter(|l| !LogStamp::written_since(l, log_before)) {
            return Err(CriuError::Refused {
                request: name,
                errno: resp.cr_errno,
                log: log.to_path_buf(),
                config: config.map(Path::to_path_buf),
                stderr: self.stderr_text(),
            });
        }
        Err(CriuError::Failed {
            request: name,
            errno: resp.cr_errno,
            errmsg: resp.cr_errmsg,
            plugin_failure: log.and_then(plugin_failure).map(Box::new),
            script_failure: log
                .and_then(|l| self.script_failure(l, config))
                .map(Box::new),
            log: log.map(Path::to_path_buf),
            log_tail: log.map(|l| log_tail(l, LOG_TAIL_LINES)).unwrap_or_default(),
        })
    }

    /// The first of the user's action scripts (`action-script` of `--criu-config`) that
    /// failed during the last request, as its log `log` tells, with the stage it failed
    /// at and the config file `config` that named it. CRIU fails a request for most
    /// stages, not for pre-resume, post-resume and network-unlock: after a request that
    /// succeeded this says what it let pass.
    pub fn script_failure(&self, log: &Path, config: Option<&Path>) -> Option<ScriptFailure> {
        Some(ScriptFailure {
            config: config.map(Path::to_path_buf),
            ..script_failure(log, &self.stages)?
        })
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

    /// Wait until CRIU's next message of the request `name` is there (or CRIU is gone).
    /// Once a signal has asked gpucr to stop, CRIU rolls the request back when it next
    /// reports; while it has not for [`INTERRUPTED_NOTICE`] (an action script that
    /// hangs, a freeze that takes long), say once what gpucr waits for: the stage CRIU
    /// last reported, and its `log`, so that an interrupted gpucr never waits without a
    /// word.
    fn await_message(&mut self, name: &str, log: Option<&Path>) -> Result<(), CriuError> {
        let mut interrupted_at: Option<(i32, Instant)> = None;
        let mut signals_seen = 0;
        let mut said = false;
        loop {
            // The interrupt flags (`interrupted`, `signals`) are read at each signal
            // (the wake fd) or, without one, every 200 ms; once interrupted, the wait
            // also ends when the notice is due.
            let limit = match (&self.wake, interrupted_at) {
                (None, _) => Some(Duration::from_millis(200)),
                (Some(_), None) => None,
                (Some(_), Some(_)) if said => None,
                (Some(_), Some((_, at))) => Some(
                    INTERRUPTED_NOTICE
                        .saturating_sub(at.elapsed())
                        .max(Duration::from_millis(1)),
                ),
            };
            if self.poll_socket(limit)? {
                return Ok(());
            }
            if interrupted_at.is_none() {
                interrupted_at = (self.interrupted)().map(|signal| (signal, Instant::now()));
                signals_seen = (self.signals)();
            }
            let Some((signal, at)) = interrupted_at else {
                continue;
            };
            let criu = self.child.as_ref().map_or(0, |c| c.id() as i32);
            let signals = (self.signals)();
            if signals > signals_seen {
                signals_seen = signals;
                end_action_scripts(criu, name);
                continue;
            }
            if !said && at.elapsed() >= INTERRUPTED_NOTICE {
                said = true;
                let since = self.stages.last().map_or_else(String::new, |(_, stage)| {
                    format!(
                        " since it reported {stage} (after which it runs the stage's \
                         action scripts)"
                    )
                });
                let scripts: String = action_script::running(criu)
                    .iter()
                    .map(|s| {
                        format!(
                            "; it runs the action script `{}` (pid {}, at {}): another \
                             signal ends it, and CRIU then rolls the {name} back",
                            s.command, s.pid, s.action
                        )
                    })
                    .collect();
                let log = log
                    .map(|log| format!("; its log: {}", log.display()))
                    .unwrap_or_default();
                crate::errln!(
                    "gpucr: {} received during the {name}: waiting for CRIU (pid {criu}) to \
                     report back; nothing from it for {} s{since}{scripts}{log}",
                    crate::interrupt::name(signal),
                    at.elapsed().as_secs()
                );
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
        CriuError::Died {
            path: self.path.clone(),
            status,
        }
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

    /// Kill CRIU and every process of its process group (a wrapper script's children
    /// too), before it restored anything: only at its start.
    fn kill_group(&mut self) {
        if let Some(child) = &self.child {
            if let Ok(pid) = i32::try_from(child.id()) {
                // CRIU leads a process group of its own (`spawn`), whose id is its pid.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        self.kill();
    }

    /// What CRIU wrote to stderr, once it has exited and its pipe drained (waits at most
    /// half a second: a restored task could still hold the pipe open).
    fn stderr_text(&mut self) -> String {
        let Some(received) = self.stderr.take() else {
            return String::new();
        };
        match received.recv_timeout(STDERR_WAIT) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
            Err(RecvTimeoutError::Timeout) => {
                self.stderr = Some(received);
                String::new()
            }
            Err(RecvTimeoutError::Disconnected) => String::new(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit_code::{self, ExitCode};

    /// A script standing in for criu that never answers: it starts a child of its own,
    /// writes both pids to `pids`, and sleeps.
    fn hung_criu(dir: &Path) -> (PathBuf, PathBuf) {
        let script = dir.join("hung-criu");
        let pids = dir.join("pids");
        gpucr_abi::testing::write_script(
            &script,
            &format!(
                "#!/bin/sh\nsleep 30 &\necho $! $$ > {}.tmp\nmv {0}.tmp {0}\nexec sleep 31\n",
                pids.display()
            ),
        );
        (script, pids)
    }

    fn wait_for_pids(pids: &Path) -> Vec<i32> {
        for _ in 0..500 {
            if let Ok(text) = std::fs::read_to_string(pids) {
                return text
                    .split_whitespace()
                    .map(|p| p.parse().unwrap())
                    .collect();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the script did not start");
    }

    /// Reaped, or a zombie of a parent that is gone (the background child's parent was
    /// the script, whose pid exec'd into sleep and was reaped).
    fn gone(pid: i32) -> bool {
        gpucr_abi::procfs::has_exited(pid)
    }

    #[test]
    fn a_criu_that_does_not_answer_in_time_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let (script, pids) = hung_criu(dir.path());
        let mut swrk = Swrk::spawn(&script, &[], &[]).unwrap();
        let pids = wait_for_pids(&pids);
        let started = Instant::now();
        let e = swrk
            .version_within(Duration::from_millis(300), &|| None)
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(e, CriuError::StartTimeout { .. }), "{e:?}");
        assert!(
            e.to_string().contains(&format!(
                "criu ({}) did not answer its first request within 0.3 s",
                script.display()
            )),
            "{e}"
        );
        assert_eq!(e.exit_code(), exit_code::CRIU_UNAVAILABLE);
        for &pid in &pids {
            let _ = crate::wait::pidfd::exited_within(pid, Duration::from_secs(2));
        }
        assert!(pids.iter().all(|&p| gone(p)), "{pids:?} still run");
    }

    #[test]
    fn an_interrupt_ends_the_wait_for_criu_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (script, pids) = hung_criu(dir.path());
        let mut swrk = Swrk::spawn(&script, &[], &[]).unwrap();
        let pids = wait_for_pids(&pids);
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let started = Instant::now();
        let e = swrk
            .version_within(Duration::from_secs(60), &|| {
                // The signal comes while CRIU is awaited.
                (asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 3)
                    .then_some(libc::SIGTERM)
            })
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            e.to_string(),
            format!(
                "interrupted by SIGTERM while criu ({}) was starting: it was killed; \
                 nothing was done",
                script.display()
            )
        );
        assert_eq!(e.exit_code(), exit_code::INTERRUPTED);
        for &pid in &pids {
            let _ = crate::wait::pidfd::exited_within(pid, Duration::from_secs(2));
        }
        assert!(pids.iter().all(|&p| gone(p)), "{pids:?} still run");
    }

    #[test]
    fn a_binary_that_exits_at_once_is_named() {
        let mut swrk = Swrk::spawn(Path::new("/bin/true"), &[], &[]).unwrap();
        let e = swrk.version().unwrap_err();
        assert_eq!(
            e.to_string(),
            "criu (/bin/true) exited before answering (exit status: 0)"
        );
        assert_eq!(e.exit_code(), exit_code::CRIU_UNAVAILABLE);
    }
}
