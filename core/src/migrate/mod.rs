//! Live migration: `gpucr migrate PID HOST[:PORT]` on the source ([`source`]), `gpucr
//! receive` on the destination ([`receiver`]); stop-and-copy, or post-copy, where the
//! destination runs the job before its memory is there and pulls it ([`postcopy`]).
//!
//! The two sides talk over mutual TLS with pinned certificates ([`tls`], keys from
//! [`identity`]), in framed messages of bounded size with a time limit on every read
//! and write ([`link`], [`message`]). The image crosses as checksummed chunks into a
//! fresh, confined directory on the destination ([`files`]); the memory pages and the
//! GPU data on several connections in parallel as they are dumped ([`lanes`],
//! [`stream`], [`parts`]). Both sides keep their copy
//! of the job stopped until one of them may run ([`tree`]), the source's guarded from a
//! gpucr killed outright ([`guard`]); post-copy's source serves the pages from its
//! stopped copy ([`tree_blocks`]). docs/migration.md has the
//! protocol, the failures and what each side does about them.

use std::time::Duration;

pub mod files;
pub mod guard;
pub mod identity;
pub mod lanes;
pub mod link;
pub mod message;
pub mod parts;
pub mod postcopy;
pub mod receiver;
pub mod source;
pub mod stream;
pub mod tls;
pub mod tree;
pub mod tree_blocks;

pub use identity::{keygen, IdentityError, IdentityFiles, KeyFiles};
pub use receiver::{receive, ReceiveError, ReceiveOptions, ReceiveOutcome};
pub use source::{migrate, MigrateError, MigrateOptions, MigrateOutcome};

/// The port `gpucr receive` listens on, and `gpucr migrate` connects to, by default.
pub const DEFAULT_PORT: u16 = 7431;

/// How often a side that works (dumps, restores) tells its peer it still does.
pub const BEAT: Duration = Duration::from_secs(2);

/// The peer broke the protocol: a message out of turn, or another version.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the peer sent '{got}' where '{expected}' was due")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    #[error("the peer speaks protocol {theirs} (gpucr {gpucr}); this side speaks {ours}")]
    Version {
        theirs: u32,
        ours: u32,
        gpucr: String,
    },
    #[error(transparent)]
    Link(#[from] link::LinkError),
}

impl ProtocolError {
    pub fn unexpected(expected: &'static str, got: &message::Control) -> ProtocolError {
        ProtocolError::Unexpected {
            expected,
            got: got.name(),
        }
    }
}

/// Why a connection the receiver accepted did not become a link: its time limits could
/// not be set, its TLS handshake failed (a peer without the pinned key), or its Hello.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("{peer}: cannot set the connection's time limits: {source}")]
    Limit {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("{peer}: {source}")]
    Hello {
        peer: String,
        #[source]
        source: ProtocolError,
    },
}

/// The receiver's side of every connection, the control one and each lane: the time
/// limits set, the mutual TLS handshake (nothing is read of an unauthenticated peer),
/// then the Hellos: the link, each read and write within `timeout`.
pub fn accept(
    tcp: std::net::TcpStream,
    identity: &identity::Identity,
    timeout: Duration,
) -> Result<link::Link, AcceptError> {
    let peer = tls::peer_name(&tcp);
    tls::limit(&tcp, timeout).map_err(|source| AcceptError::Limit {
        peer: peer.clone(),
        source,
    })?;
    let stream = tls::accept(tcp, identity)?;
    let mut link = link::Link::new(Box::new(stream), peer.clone(), timeout);
    hello(&mut link).map_err(|source| AcceptError::Hello { peer, source })?;
    Ok(link)
}

/// Exchange Hellos (each side sends its own first) and check the versions match.
pub fn hello(link: &mut link::Link) -> Result<(), ProtocolError> {
    link.send(&source::own_hello())?;
    match link.receive_control()? {
        message::Control::Hello { protocol, .. } if protocol == message::PROTOCOL_VERSION => Ok(()),
        message::Control::Hello { protocol, gpucr } => Err(ProtocolError::Version {
            theirs: protocol,
            ours: message::PROTOCOL_VERSION,
            gpucr,
        }),
        other => Err(ProtocolError::unexpected("hello", &other)),
    }
}
