//! The plugin's side of the helper protocol: one private connection per hook call,
//! opened through the connector gpucr handed CRIU (never through a path, so it works
//! from a restored task with a mount namespace of its own).
//!
//! The connector is found in CRIU's fdstore under [`HELPER_INHERIT_KEY`] at restore (in
//! criu and in every restored task), else at the fd number in [`ENV_HELPER_FD`] (criu at
//! dump; the run's settings hold the value), or it is the one engine mode made
//! ([`Connector`]). To connect, the plugin makes a socketpair, sends one end over the connector
//! in a `Connect` request and talks over the other.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use gpucr_abi::proto::{request, Connect, Reply, Request};
use gpucr_abi::wire::{self, WireError};
use gpucr_abi::{ENV_HELPER_FD, HELPER_INHERIT_KEY};
use nix::sys::socket::{getsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};

use crate::criu;

/// Why a call to the helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("{ENV_HELPER_FD}={value:?}: {detail}")]
    BadConnector { value: String, detail: String },
    #[error("cannot connect to the gpucr helper: {0}")]
    Connect(nix::Error),
    #[error("gpucr helper: {0}")]
    Wire(#[from] WireError),
    #[error("gpucr helper refused: {0}")]
    Refused(String),
}

impl HelperError {
    /// The errno CRIU gets for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            HelperError::BadConnector { .. } => libc::EBADF,
            HelperError::Connect(e) | HelperError::Wire(WireError::Socket(e)) => *e as i32,
            HelperError::Wire(WireError::Closed) => libc::ECONNRESET,
            HelperError::Wire(_) => libc::EPROTO,
            HelperError::Refused(_) => libc::EIO,
        }
    }
}

/// Where the connector to gpucr's helper is, for one CRIU run.
#[derive(Debug, Clone)]
pub struct Connector {
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    /// The value of `GPUCR_HELPER_FD` CRIU was started with: the fd gpucr handed it
    /// (checked to be a SOCK_SEQPACKET socket at each call).
    Named(String),
    /// The connector engine mode made, owned by the run (closed when its last holder
    /// is dropped, at the run's end).
    Owned(Arc<OwnedFd>),
}

impl Connector {
    /// The connector at the fd number `value` names (`GPUCR_HELPER_FD`'s value).
    pub fn named(value: impl Into<String>) -> Connector {
        Connector {
            source: Source::Named(value.into()),
        }
    }

    /// A connector this plugin made (engine mode).
    pub fn owned(fd: OwnedFd) -> Connector {
        Connector {
            source: Source::Owned(Arc::new(fd)),
        }
    }

    /// Send one request (with `fds`) and return the reply; a reply with `ok == false`
    /// is an error carrying the helper's message.
    pub fn call(&self, kind: request::Kind, fds: &[RawFd]) -> Result<Reply, HelperError> {
        let sock = self.connect()?;
        wire::send(sock.as_fd(), &Request { kind: Some(kind) }, fds)?;
        let (reply, _fds): (Reply, Vec<OwnedFd>) = wire::recv_msg(sock.as_fd())?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(HelperError::Refused(reply.error))
        }
    }

    /// A new private connection to the helper: over CRIU's fdstore copy at restore (in
    /// criu and in every restored task), else over this connector.
    fn connect(&self) -> Result<OwnedFd, HelperError> {
        if let Some(fd) = criu::inherited_fd(HELPER_INHERIT_KEY) {
            return open_connection(fd.as_fd());
        }
        match &self.source {
            Source::Named(value) => open_connection(named_fd(value)?.as_fd()),
            Source::Owned(fd) => open_connection(fd.as_fd()),
        }
    }
}

/// Open a private connection over `connector`.
pub fn open_connection(connector: BorrowedFd<'_>) -> Result<OwnedFd, HelperError> {
    let (mine, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(HelperError::Connect)?;
    let connect = Request {
        kind: Some(request::Kind::Connect(Connect {})),
    };
    wire::send(connector, &connect, &[theirs.as_raw_fd()])?;
    Ok(mine)
}

/// The inherited fd `value` (`GPUCR_HELPER_FD`'s value) names, checked to be a
/// SOCK_SEQPACKET socket before it is used.
fn named_fd(value: &str) -> Result<OwnedFd, HelperError> {
    let bad = |detail: String| HelperError::BadConnector {
        value: value.to_owned(),
        detail,
    };
    let fd: RawFd = value
        .parse()
        .map_err(|_| bad("not a file descriptor number".into()))?;
    if fd < 0 {
        return Err(bad("not a file descriptor number".into()));
    }
    // SAFETY: only borrowed for the checks and the dup below; fcntl(F_GETFD) first makes
    // sure the number is an open descriptor.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(bad(format!("{}", std::io::Error::last_os_error())));
    }
    // SAFETY: `fd` is open (checked above) and stays open for this borrow.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    match getsockopt(&borrowed, sockopt::SockType) {
        Ok(SockType::SeqPacket) => {}
        Ok(other) => return Err(bad(format!("a {other:?} socket, not SOCK_SEQPACKET"))),
        Err(e) => return Err(bad(format!("not a socket ({e})"))),
    }
    borrowed
        .try_clone_to_owned()
        .map_err(|e| bad(format!("cannot duplicate it: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_end_arrives_over_the_connector() {
        let (plugin_end, helper_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mine = open_connection(plugin_end.as_fd()).unwrap();
        let (req, fds): (Request, Vec<OwnedFd>) = wire::recv_msg(helper_end.as_fd()).unwrap();
        assert!(matches!(req.kind, Some(request::Kind::Connect(_))));
        assert_eq!(fds.len(), 1);
        // The two ends of the private connection talk.
        let log = Request {
            kind: Some(request::Kind::Log(gpucr_abi::proto::PluginLog {
                text: "hello".into(),
            })),
        };
        wire::send(mine.as_fd(), &log, &[]).unwrap();
        let (got, _): (Request, Vec<OwnedFd>) = wire::recv_msg(fds[0].as_fd()).unwrap();
        assert_eq!(got, log);
    }

    #[test]
    fn errno_is_kept() {
        assert_eq!(
            HelperError::Connect(nix::Error::EMFILE).errno(),
            libc::EMFILE
        );
        assert_eq!(HelperError::Refused("x".into()).errno(), libc::EIO);
        assert_eq!(
            HelperError::Wire(WireError::Closed).errno(),
            libc::ECONNRESET
        );
    }
}
