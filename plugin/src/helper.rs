//! The plugin's side of the helper protocol: one connection per hook call.

use std::env;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use gpucr_abi::proto::{request, Reply, Request};
use gpucr_abi::wire::{self, WireError};
use gpucr_abi::ENV_HELPER_SOCK;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

/// Why a call to the helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("{ENV_HELPER_SOCK} is not set: this criu was not started by gpucr")]
    NoSocket,
    #[error("cannot connect to the gpucr helper at {path}: {source}")]
    Connect { path: String, source: nix::Error },
    #[error("gpucr helper: {0}")]
    Wire(#[from] WireError),
    #[error("gpucr helper refused: {0}")]
    Refused(String),
}

/// Whether this CRIU runs under gpucr at all.
pub fn configured() -> bool {
    env::var_os(ENV_HELPER_SOCK).is_some()
}

/// Send one request (with `fds`) and return the reply; a reply with `ok == false` is an
/// error carrying the helper's message.
pub fn call(kind: request::Kind, fds: &[RawFd]) -> Result<Reply, HelperError> {
    let sock = connect_helper()?;
    wire::send(sock.as_fd(), &Request { kind: Some(kind) }, fds)?;
    let (reply, _fds): (Reply, Vec<OwnedFd>) = wire::recv_msg(sock.as_fd())?;
    if reply.ok {
        Ok(reply)
    } else {
        Err(HelperError::Refused(reply.error))
    }
}

fn connect_helper() -> Result<OwnedFd, HelperError> {
    let path = env::var(ENV_HELPER_SOCK).map_err(|_| HelperError::NoSocket)?;
    let connect_err = |source| HelperError::Connect {
        path: path.clone(),
        source,
    };
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(connect_err)?;
    let addr = UnixAddr::new(path.as_str()).map_err(connect_err)?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&sock), &addr).map_err(connect_err)?;
    Ok(sock)
}
