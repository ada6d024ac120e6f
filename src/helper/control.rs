//! The helper's control plane, on tokio: one task takes the private connections plugins
//! send over the connector, one task per connection reads its requests and answers
//! them. A request's work (a backend call, a wait for the copy engines) runs on a
//! blocking thread, handed off with `spawn_blocking`; the data path (copy engines,
//! compression, checksums) stays on its own threads.
//!
//! Nothing here can hang a dump or a restore: stopping the helper (the operation ended,
//! CRIU failed, gpucr was interrupted) ends every task at once through one watch
//! channel, a plugin that vanishes ends its own task (its socket reads EOF), and a
//! request that takes longer than the operation allows is cut off by CRIU's side of
//! the protocol, whose hook then fails.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use gpucr_abi::proto::{request, Reply, Request};
use gpucr_abi::wire::{self, WireError};
use nix::sys::socket::{getsockopt, sockopt};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

/// What answers one request: the blocking work of the helper (its `handle`).
pub type Handler = Arc<dyn Fn(Request, Vec<OwnedFd>, i32) -> Reply + Send + Sync>;

/// The running control plane.
pub struct ControlPlane {
    runtime: Option<tokio::runtime::Runtime>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Serve the connections plugins send over `connector` with `handler`.
    pub fn start(connector: OwnedFd, handler: Handler) -> std::io::Result<ControlPlane> {
        set_nonblocking(&connector)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gpucr-helper")
            .enable_io()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let connector = {
            let _entered = runtime.enter();
            register(connector, Interest::READABLE)?
        };
        runtime.spawn(accept_connections(connector, handler, stopped));
        Ok(ControlPlane {
            runtime: Some(runtime),
            stop,
        })
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            // Blocking work still running (a wait the operation no longer needs) is not
            // waited for: the transfer it waits on is being torn down too.
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
    handler: Handler,
    mut stopped: watch::Receiver<bool>,
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
        tokio::spawn(serve(conn, handler.clone(), stopped.clone()));
    }
}

/// Answer requests on one connection until the plugin closes it or the helper stops.
async fn serve(conn: AsyncFd<OwnedFd>, handler: Handler, mut stopped: watch::Receiver<bool>) {
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
        let work = handler.clone();
        let answer = tokio::task::spawn_blocking(move || work(req, fds, peer));
        let reply = tokio::select! {
            _ = stopped.changed() => return,
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

fn refuse(error: &str) -> Reply {
    Reply {
        ok: false,
        error: error.to_owned(),
        ..Default::default()
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

    #[test]
    fn connections_are_served_and_a_stop_ends_a_stuck_request() {
        let (helper_end, plugin_end) = pair();
        let handler: Handler = Arc::new(|req: Request, _fds, _peer| match req.kind {
            Some(request::Kind::Log(l)) if l.text == "stuck" => {
                std::thread::sleep(Duration::from_secs(3600));
                Reply::default()
            }
            Some(request::Kind::Log(l)) => Reply {
                ok: true,
                error: l.text,
                ..Default::default()
            },
            _ => refuse("unexpected"),
        });
        let plane = ControlPlane::start(helper_end, handler).unwrap();
        // A connection sent over the connector is served.
        let (mine, theirs) = pair();
        let connect = Request {
            kind: Some(request::Kind::Connect(gpucr_abi::proto::Connect {})),
        };
        wire::send(plugin_end.as_fd(), &connect, &[theirs.as_raw_fd()]).unwrap();
        drop(theirs);
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
    }
}
