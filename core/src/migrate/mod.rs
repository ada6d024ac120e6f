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
//! of the job stopped until one of them may run ([`tree`]). docs/migration.md has the
//! protocol, the failures and what each side does about them.

use std::time::Duration;

pub mod files;
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
