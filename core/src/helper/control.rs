//! The helper's control plane, on tokio: one task takes the private connections plugins
//! send over the connector, one task per connection reads its requests and answers
//! them. A request's work (a backend call, a wait for the copy engines) runs on a
//! blocking thread, handed off with `spawn_blocking`; the data path (copy engines,
//! compression, checksums) stays on its own threads.
//!
//! Nothing here can hang a dump or a restore. While a request is worked on, its task
//! also waits for three things, as futures: the helper being stopped (the operation
//! ended, CRIU failed, gpucr was interrupted: one watch channel ends every task at
//! once), the plugin going away (its connection reads EOF: the task it served died),
//! and the request's time limit ([`Handler::time_limit`]), which starts again as long
//! as the operation's copies move bytes ([`Handler::progress`]). The last two are reported
//! to the handler ([`Handler::abandoned`]), which fails the operation; the plugin gets
//! a refusal, or nothing when it is gone.
//!
//! Each request has a cancellation token ([`Cancel`]), handed to the handler with it.
//! A request given up (or still running when the helper stops) has its token
//! cancelled before anything else happens, and the handler changes the operation's
//! state only through the token ([`Cancel::live`]): the work left running on its
//! blocking thread changes nothing afterwards, and its waits end
//! ([`Cancel::on_cancel`]).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gpucr_abi::proto::{request, Reply, Request};
use gpucr_abi::wire::{self, WireError};

use crate::cancel::Cancel;
use nix::sys::socket::{getsockopt, sockopt};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

use super::reply::refuse;

/// What answers the plugins' requests: the helper.
pub trait Handler: Send + Sync + 'static {
    /// Answer `req` (with the fds it carried) from the plugin in host pid `peer`. Runs
    /// on a blocking thread; `cancel` is cancelled when the request is given up, after
    /// which the answer must change nothing.
    fn answer(&self, req: Request, fds: Vec<OwnedFd>, peer: i32, cancel: &Cancel) -> Reply;

    /// How long answering `req` may take without progress; None when only the
    /// operation's end bounds it (a wait for the copy engines, which fail on their own).
    fn time_limit(&self, req: &Request) -> Option<Duration>;

    /// A count that grows while the operation moves data (bytes copied): a request
    /// whose count moved within its time limit gets the limit again, so a long copy
    /// inside one request (CUDA's custom storage) is bounded by a stall, not by its
    /// size. Default: no progress is ever made.
    fn progress(&self) -> u64 {
        0
    }

    /// The request `what` from `peer` was given up before it was answered: record it,
    /// then cancel its token `cancel` (the control plane cancels it afterwards if the
    /// handler did not).
    fn abandoned(&self, peer: i32, what: &'static str, why: Abandoned, cancel: &Cancel);

    /// The token `req` is answered under: by default one of its own, which only the
    /// control plane cancels (time-out, vanished plugin, the helper stopping). A handler
    /// makes the requests that carry the operation forward children of the operation's
    /// token, so that the command's cancellation (Ctrl-C) reaches them too.
    fn token_for(&self, _req: &Request) -> Cancel {
        Cancel::new()
    }
}

/// Why a request was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// The plugin closed its connection (the process it ran in died).
    PeerGone,
    /// The request ran past its time limit.
    TimedOut(Duration),
}

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abandoned::PeerGone => write!(f, "the plugin went away before it was answered"),
            Abandoned::TimedOut(limit) => write!(
                f,
                "not done within {:.1} s, nothing copied meanwhile (--device-timeout)",
                limit.as_secs_f64()
            ),
        }
    }
}

/// The hook a request serves, for messages.
pub fn request_name(req: &Request) -> &'static str {
    match &req.kind {
        Some(request::Kind::PauseDevices(_)) => "PAUSE_DEVICES",
        Some(request::Kind::CheckpointDevices(_)) => "CHECKPOINT_DEVICES",
        Some(request::Kind::DumpBuffers(_)) => "CHECKPOINT_DEVICES (more buffers)",
        Some(request::Kind::DumpFile(_)) => "DUMP_EXT_FILE",
        Some(request::Kind::DumpFinished(_)) => "the end of the dump",
        Some(request::Kind::RestoreFile(_)) => "RESTORE_EXT_FILE",
        Some(request::Kind::BuffersReady(_)) => "RESTORE_EXT_FILE (buffers)",
        Some(request::Kind::ResumeDevices(_)) => "RESUME_DEVICES_LATE",
        Some(request::Kind::ResumeFailed(_)) => "RESUME_DEVICES_LATE (failed in the plugin)",
        Some(request::Kind::RestoreThread(_)) => "a restore thread lookup",
        Some(request::Kind::TreeThreads(_)) => "CHECKPOINT_DEVICES (the tree's restore threads)",
        Some(request::Kind::CheckpointTree(_)) => "CHECKPOINT_DEVICES (the whole tree)",
        Some(request::Kind::ResumeTreeThreads(_)) => {
            "RESUME_DEVICES_LATE (the tree's restore threads)"
        }
        Some(request::Kind::ResumeTree(_)) => "RESUME_DEVICES_LATE (the whole tree)",
        Some(request::Kind::EngineStep(_)) => "an engine step",
        Some(request::Kind::Log(_)) => "a log line",
        Some(request::Kind::Connect(_)) => "a connection",
        None => "an empty request",
    }
}

/// The running control plane.
pub struct ControlPlane {
    runtime: Option<tokio::runtime::Runtime>,
    stop: watch::Sender<bool>,
    in_flight: Arc<InFlight>,
}

/// The requests being answered (received, their reply not yet sent), with their
/// tokens.
#[derive(Debug, Default)]
struct InFlight {
    requests: Mutex<Requests>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct Requests {
    next: u64,
    tokens: std::collections::BTreeMap<u64, Cancel>,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, Requests> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count one request, with its token, until the returned guard is dropped.
    fn enter(self: &Arc<Self>, cancel: &Cancel) -> InFlightGuard {
        let mut requests = self.lock();
        let id = requests.next;
        requests.next += 1;
        requests.tokens.insert(id, cancel.clone());
        InFlightGuard(self.clone(), id)
    }

    /// Cancel every request being answered.
    fn cancel_all(&self, reason: &str) {
        let tokens: Vec<Cancel> = self.lock().tokens.values().cloned().collect();
        for token in tokens {
            token.cancel(reason);
        }
    }
}

/// One request being answered (see [`InFlight`]).
struct InFlightGuard(Arc<InFlight>, u64);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut requests = self.0.lock();
        requests.tokens.remove(&self.1);
        if requests.tokens.is_empty() {
            self.0.idle.notify_all();
        }
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Serve the connections plugins send over `connector` with `handler`.
    pub fn start(connector: OwnedFd, handler: Arc<dyn Handler>) -> std::io::Result<ControlPlane> {
        set_nonblocking(&connector)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gpucr-helper")
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let connector = {
            let _entered = runtime.enter();
            register(connector, Interest::READABLE)?
        };
        let in_flight = Arc::new(InFlight::default());
        runtime.spawn(accept_connections(
            connector,
            handler,
            stopped,
            in_flight.clone(),
        ));
        Ok(ControlPlane {
            runtime: Some(runtime),
            stop,
            in_flight,
        })
    }

    /// Wait (at most `limit`) until every request received so far has been answered
    /// and its reply sent. Before the control plane is dropped, so that the answer to a
    /// plugin's last request (engine mode's exit hook) reaches it rather than a closed
    /// connection. Returns whether it got there.
    pub fn drain(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut count = self.in_flight.lock();
        while !count.tokens.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = self
                .in_flight
                .idle
                .wait_timeout(count, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        // Work still running on a blocking thread changes nothing from here on, and
        // its waits end.
        self.in_flight.cancel_all("the helper stopped");
        if let Some(runtime) = self.runtime.take() {
            // Blocking work still running is not waited for: it was cancelled above.
            runtime.shutdown_background();
        }
    }
}

/// Hand `fd` to the reactor for `interest`.
fn register(fd: OwnedFd, interest: Interest) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd always returns the descriptor it owns, which stays open until
    // the AsyncFd (its only owner from here on) is dropped.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(std::io::Error::from)
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd, FcntlArg::F_GETFL)?;
    fcntl(
        fd,
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )?;
    Ok(())
}

fn would_block(e: &WireError) -> bool {
    matches!(e, WireError::Socket(nix::errno::Errno::EAGAIN))
}

/// Take each private connection sent over the connector (a `Connect` request with one
/// fd) and serve it in a task of its own, until stopped or until every holder of the
/// connector's other end is gone.
async fn accept_connections(
    connector: AsyncFd<OwnedFd>,
    handler: Arc<dyn Handler>,
    mut stopped: watch::Receiver<bool>,
    in_flight: Arc<InFlight>,
) {
    loop {
        let mut ready = tokio::select! {
            _ = stopped.changed() => return,
            ready = connector.readable() => match ready {
                Ok(ready) => ready,
                Err(_) => return,
            },
        };
        let conn = match wire::recv_msg::<Request>(connector.get_ref().as_fd()) {
            Ok((
                Request {
                    kind: Some(request::Kind::Connect(_)),
                },
                mut fds,
            )) if fds.len() == 1 => fds.remove(0),
            // Anything else on the connector is dropped: it is never answered.
            Ok(_) => continue,
            Err(e) if would_block(&e) => {
                ready.clear_ready();
                continue;
            }
            Err(WireError::Closed) => return,
            Err(_) => continue,
        };
        let Ok(()) = set_nonblocking(&conn) else {
            continue;
        };
        let Ok(conn) = register(conn, Interest::READABLE | Interest::WRITABLE) else {
            continue;
        };
        tokio::spawn(serve(
            conn,
            handler.clone(),
            stopped.clone(),
            in_flight.clone(),
        ));
    }
}

/// Answer requests on one connection until the plugin closes it or the helper stops.
async fn serve(
    conn: AsyncFd<OwnedFd>,
    handler: Arc<dyn Handler>,
    mut stopped: watch::Receiver<bool>,
    in_flight: Arc<InFlight>,
) {
    let peer = getsockopt(conn.get_ref(), sockopt::PeerCredentials)
        .map(|c| c.pid())
        .unwrap_or(0);
    loop {
        let mut ready = tokio::select! {
            _ = stopped.changed() => return,
            ready = conn.readable() => match ready {
                Ok(ready) => ready,
                Err(_) => return,
            },
        };
        let (req, fds): (Request, Vec<OwnedFd>) = match wire::recv_msg(conn.get_ref().as_fd()) {
            Ok(msg) => msg,
            Err(e) if would_block(&e) => {
                ready.clear_ready();
                continue;
            }
            Err(WireError::Closed) => return,
            Err(e) => {
                let reply = refuse(&format!("bad request: {e}"));
                let _ = send(&conn, &reply).await;
                return;
            }
        };
        drop(ready);
        // Counted until its reply is sent, or the request given up.
        let cancel = handler.token_for(&req);
        let _answering = in_flight.enter(&cancel);
        let what = request_name(&req);
        let limit = handler.time_limit(&req);
        let work = handler.clone();
        let token = cancel.clone();
        let answer = tokio::task::spawn_blocking(move || work.answer(req, fds, peer, &token));
        let watched = handler.clone();
        let deadline = async move {
            let Some(limit) = limit else {
                return std::future::pending().await;
            };
            let mut seen = watched.progress();
            loop {
                tokio::time::sleep(limit).await;
                let now = watched.progress();
                if now == seen {
                    return;
                }
                seen = now;
            }
        };
        let reply = tokio::select! {
            // The stop first: the helper stops before it cancels the work in flight, so
            // an answer that the cancellation ended is never sent after the stop.
            biased;
            _ = stopped.changed() => {
                cancel.cancel("the helper stopped");
                return;
            }
            () = peer_closed(&conn) => {
                handler.abandoned(peer, what, Abandoned::PeerGone, &cancel);
                cancel.cancel(Abandoned::PeerGone.to_string());
                return;
            }
            () = deadline => {
                let why = Abandoned::TimedOut(limit.unwrap_or_default());
                handler.abandoned(peer, what, why, &cancel);
                cancel.cancel(why.to_string());
                refuse(&format!("{what}: {why}"))
            }
            reply = answer => match reply {
                Ok(reply) => reply,
                Err(e) => refuse(&format!("internal error: {e}")),
            },
        };
        if send(&conn, &reply).await.is_err() {
            return;
        }
    }
}

/// Resolves when the plugin has closed `conn`. A plugin sends one request at a time
/// and waits for its answer, so while a request is worked on, its connection turning
/// readable means end of file; anything else it might send waits for its turn.
async fn peer_closed(conn: &AsyncFd<OwnedFd>) {
    use nix::sys::socket::{recv, MsgFlags};
    loop {
        let Ok(mut ready) = conn.readable().await else {
            return;
        };
        let mut byte = [0u8; 1];
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match recv(conn.get_ref().as_raw_fd(), &mut byte, flags) {
            Ok(0) => return,
            Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
            Err(_) => return,
            // A message before the answer: not this future's business.
            Ok(_) => std::future::pending::<()>().await,
        }
    }
}

/// Send `reply`, waiting for room in the socket when it has none.
async fn send(conn: &AsyncFd<OwnedFd>, reply: &Reply) -> Result<(), WireError> {
    loop {
        match wire::send(conn.get_ref().as_fd(), reply, &[]) {
            Err(e) if would_block(&e) => {
                let mut ready = conn.writable().await.map_err(|e| {
                    WireError::Socket(nix::errno::Errno::from_raw(
                        e.raw_os_error().unwrap_or(libc::EIO),
                    ))
                })?;
                ready.clear_ready();
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn log(text: &str) -> Request {
        Request {
            kind: Some(request::Kind::Log(gpucr_abi::proto::PluginLog {
                text: text.into(),
            })),
        }
    }

    /// Echoes log lines; "stuck" never finishes; "slow" has a 200 ms limit; "late" is
    /// answered after 150 ms; "copying" has a 400 ms limit and takes 1 s, making
    /// progress every 20 ms.
    ///
    /// "stuck" and "slow" wait until their token is cancelled and then count it in
    /// `ended`; "late-change" has a 100 ms limit, takes 400 ms and then tries to change
    /// `changes` through its token.
    #[derive(Default)]
    struct Echo {
        abandoned: std::sync::Mutex<Vec<(&'static str, Abandoned)>>,
        copied: std::sync::atomic::AtomicU64,
        ended: std::sync::atomic::AtomicU64,
        changes: std::sync::Mutex<Vec<&'static str>>,
    }

    impl Handler for Echo {
        fn answer(&self, req: Request, _fds: Vec<OwnedFd>, _peer: i32, cancel: &Cancel) -> Reply {
            match req.kind {
                Some(request::Kind::Log(l)) if l.text == "stuck" || l.text == "slow" => {
                    if cancel.sleep(Duration::from_secs(3600)).is_err() {
                        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Reply::default()
                }
                Some(request::Kind::Log(l)) if l.text == "late-change" => {
                    std::thread::sleep(Duration::from_millis(400));
                    let changed = cancel.live(|| self.changes.lock().unwrap().push("late"));
                    if changed.is_err() {
                        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Reply {
                        ok: true,
                        ..Default::default()
                    }
                }
                Some(request::Kind::Log(l)) if l.text == "copying" => {
                    for _ in 0..50 {
                        std::thread::sleep(Duration::from_millis(20));
                        self.copied
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Reply {
                        ok: true,
                        error: l.text,
                        ..Default::default()
                    }
                }
                Some(request::Kind::Log(l)) if l.text == "late" => {
                    std::thread::sleep(Duration::from_millis(150));
                    Reply {
                        ok: true,
                        error: l.text,
                        ..Default::default()
                    }
                }
                Some(request::Kind::Log(l)) => Reply {
                    ok: true,
                    error: l.text,
                    ..Default::default()
                },
                _ => refuse("unexpected"),
            }
        }

        fn time_limit(&self, req: &Request) -> Option<Duration> {
            match &req.kind {
                Some(request::Kind::Log(l)) if l.text == "slow" => Some(Duration::from_millis(200)),
                Some(request::Kind::Log(l)) if l.text == "late-change" => {
                    Some(Duration::from_millis(100))
                }
                Some(request::Kind::Log(l)) if l.text == "copying" => {
                    Some(Duration::from_millis(400))
                }
                _ => None,
            }
        }

        fn progress(&self) -> u64 {
            self.copied.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn abandoned(&self, _peer: i32, what: &'static str, why: Abandoned, _cancel: &Cancel) {
            self.abandoned.lock().unwrap().push((what, why));
        }
    }

    /// A new private connection sent over `connector`, as the plugin opens one.
    fn connect(connector: &OwnedFd) -> OwnedFd {
        let (mine, theirs) = pair();
        let connect = Request {
            kind: Some(request::Kind::Connect(gpucr_abi::proto::Connect {})),
        };
        wire::send(connector.as_fd(), &connect, &[theirs.as_raw_fd()]).unwrap();
        mine
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_request_past_its_time_limit_is_refused_and_reported() {
        let (helper_end, plugin_end) = pair();
        let echo = Arc::new(Echo::default());
        let _plane = ControlPlane::start(helper_end, echo.clone()).unwrap();
        let conn = connect(&plugin_end);
        let started = std::time::Instant::now();
        wire::send(conn.as_fd(), &log("slow"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(!reply.ok);
        assert!(
            reply.error.contains("not done within 0.2 s"),
            "{}",
            reply.error
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let abandoned = echo.abandoned.lock().unwrap().clone();
        assert_eq!(
            abandoned,
            [(
                "a log line",
                Abandoned::TimedOut(Duration::from_millis(200))
            )]
        );
    }

    /// A request past its time limit is refused; the work left running on its blocking
    /// thread, when it completes late, changes nothing (its token was cancelled), and
    /// a wait of it ends at the cancellation instead of running on.
    #[test]
    fn a_request_that_times_out_changes_nothing_when_it_completes_late() {
        let (helper_end, plugin_end) = pair();
        let echo = Arc::new(Echo::default());
        let _plane = ControlPlane::start(helper_end, echo.clone()).unwrap();
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("late-change"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(!reply.ok);
        assert!(
            reply.error.contains("not done within 0.1 s"),
            "{}",
            reply.error
        );
        wait_until("the late completion", || {
            echo.ended.load(std::sync::atomic::Ordering::SeqCst) == 1
        });
        assert!(echo.changes.lock().unwrap().is_empty(), "a late change ran");
        // A timed-out wait ends at once.
        wire::send(conn.as_fd(), &log("slow"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(!reply.ok);
        wait_until("the slow request's wait to end", || {
            echo.ended.load(std::sync::atomic::Ordering::SeqCst) == 2
        });
    }

    #[test]
    fn a_request_that_keeps_copying_outlives_its_time_limit() {
        let (helper_end, plugin_end) = pair();
        let echo = Arc::new(Echo::default());
        let _plane = ControlPlane::start(helper_end, echo.clone()).unwrap();
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("copying"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(reply.ok, "{}", reply.error);
        assert_eq!(reply.error, "copying");
        assert!(echo.abandoned.lock().unwrap().is_empty());
    }

    #[test]
    fn a_plugin_that_goes_away_mid_request_is_reported() {
        let (helper_end, plugin_end) = pair();
        let echo = Arc::new(Echo::default());
        let _plane = ControlPlane::start(helper_end, echo.clone()).unwrap();
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("stuck"), &[]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(conn);
        wait_until("the vanished plugin to be reported", || {
            !echo.abandoned.lock().unwrap().is_empty()
        });
        let abandoned = echo.abandoned.lock().unwrap().clone();
        assert_eq!(abandoned, [("a log line", Abandoned::PeerGone)]);
        wait_until("the stuck work to be cancelled", || {
            echo.ended.load(std::sync::atomic::Ordering::SeqCst) == 1
        });
        // Other connections are still served.
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("echo"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(reply.ok);
    }

    #[test]
    fn connections_are_served_and_a_stop_ends_a_stuck_request() {
        let (helper_end, plugin_end) = pair();
        let echo = Arc::new(Echo::default());
        let plane = ControlPlane::start(helper_end, echo.clone()).unwrap();
        // A connection sent over the connector is served.
        let mine = connect(&plugin_end);
        wire::send(mine.as_fd(), &log("echo"), &[]).unwrap();
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(mine.as_fd()).unwrap();
        assert!(reply.ok);
        assert_eq!(reply.error, "echo");
        // A request whose work never ends does not keep the helper: stopping it closes
        // the connection at once.
        wire::send(mine.as_fd(), &log("stuck"), &[]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let started = std::time::Instant::now();
        drop(plane);
        let err = wire::recv_msg::<Reply>(mine.as_fd()).unwrap_err();
        assert!(matches!(err, WireError::Closed), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // The work itself was cancelled, not left running.
        wait_until("the stuck work to be cancelled", || {
            echo.ended.load(std::sync::atomic::Ordering::SeqCst) == 1
        });
    }

    #[test]
    fn drain_lets_the_last_answer_reach_the_plugin_before_the_plane_stops() {
        let (helper_end, plugin_end) = pair();
        let plane = ControlPlane::start(helper_end, Arc::new(Echo::default())).unwrap();
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("late"), &[]).unwrap();
        wait_until("the request to be taken", || {
            plane.in_flight.lock().tokens.len() == 1
        });
        assert!(plane.drain(Duration::from_secs(5)));
        drop(plane);
        let (reply, _): (Reply, Vec<OwnedFd>) = wire::recv_msg(conn.as_fd()).unwrap();
        assert!(reply.ok);
        assert_eq!(reply.error, "late");
    }

    #[test]
    fn drain_gives_up_on_a_stuck_request_at_its_limit() {
        let (helper_end, plugin_end) = pair();
        let plane = ControlPlane::start(helper_end, Arc::new(Echo::default())).unwrap();
        assert!(plane.drain(Duration::from_millis(10)), "nothing in flight");
        let conn = connect(&plugin_end);
        wire::send(conn.as_fd(), &log("stuck"), &[]).unwrap();
        wait_until("the request to be taken", || {
            plane.in_flight.lock().tokens.len() == 1
        });
        let started = std::time::Instant::now();
        assert!(!plane.drain(Duration::from_millis(200)));
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
