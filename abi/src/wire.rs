//! Framing of the helper protocol: one SOCK_SEQPACKET datagram per message, a version
//! byte followed by the prost encoding, with optional file descriptors as SCM_RIGHTS.
//! The version byte also keeps every datagram non-empty, so a zero-length read always
//! means the peer closed the socket.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recv, recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use prost::Message;

/// The most descriptors one message may carry (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;
/// The first byte of every datagram.
pub const WIRE_VERSION: u8 = 1;
/// The largest message either side accepts.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Errors of the wire layer.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("socket error: {0}")]
    Socket(#[from] nix::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("a {0}-byte message is larger than the {MAX_MESSAGE}-byte limit")]
    TooLarge(usize),
    #[error("{0} descriptors in one message (at most {MAX_FDS})")]
    TooManyFds(usize),
    #[error("message of wire version {0}, expected {WIRE_VERSION}")]
    Version(u8),
    #[error("undecodable message: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Send one message with `fds` attached.
pub fn send<M: Message>(sock: BorrowedFd<'_>, msg: &M, fds: &[RawFd]) -> Result<(), WireError> {
    if fds.len() > MAX_FDS {
        return Err(WireError::TooManyFds(fds.len()));
    }
    let mut bytes = Vec::with_capacity(1 + msg.encoded_len());
    bytes.push(WIRE_VERSION);
    msg.encode(&mut bytes).expect("a Vec grows as needed");
    let iov = [IoSlice::new(&bytes)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsgs };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                return Err(WireError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receive one message and the descriptors attached to it.
pub fn recv_msg<M: Message + Default>(
    sock: BorrowedFd<'_>,
) -> Result<(M, Vec<OwnedFd>), WireError> {
    let len = loop {
        match recv(
            sock.as_raw_fd(),
            &mut [],
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ECONNRESET) => return Err(WireError::Closed),
            Err(e) => return Err(e.into()),
        }
    };
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let mut buf = vec![0u8; len];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (got, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel just installed these descriptors in our table
                        // for this message; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    match buf[..got].split_first() {
        None => Err(WireError::Closed),
        Some((&WIRE_VERSION, body)) => Ok((M::decode(body)?, fds)),
        Some((&other, _)) => Err(WireError::Version(other)),
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    use super::*;
    use crate::proto::{request, DumpFile, Reply, Request};

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn message_and_fds_round_trip() {
        let (a, b) = pair();
        let mut file = tempfile_with(b"hello");
        let req = Request {
            kind: Some(request::Kind::DumpFile(DumpFile { id: 7 })),
        };
        send(a.as_fd(), &req, &[file.as_raw_fd()]).unwrap();
        let (got, fds): (Request, _) = recv_msg(b.as_fd()).unwrap();
        assert_eq!(got, req);
        assert_eq!(fds.len(), 1);
        let mut received = File::from(fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
        file.rewind().unwrap();
    }

    #[test]
    fn empty_message_is_not_a_close() {
        let (a, b) = pair();
        send(a.as_fd(), &Reply::default(), &[]).unwrap();
        let (got, fds): (Reply, _) = recv_msg(b.as_fd()).unwrap();
        assert_eq!(got, Reply::default());
        assert!(fds.is_empty());
    }

    #[test]
    fn closed_peer_is_reported() {
        let (a, b) = pair();
        drop(a);
        assert!(matches!(
            recv_msg::<Reply>(b.as_fd()),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn too_many_fds_are_refused() {
        let (a, _b) = pair();
        let fds = vec![0; MAX_FDS + 1];
        assert!(matches!(
            send(a.as_fd(), &Reply::default(), &fds),
            Err(WireError::TooManyFds(_))
        ));
    }

    fn tempfile_with(bytes: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!("gpucr-wire-{}", std::process::id()));
        let mut f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(bytes).unwrap();
        f
    }
}
