//! The helper's answers as the plugin reads them: a request done, refused, or a device
//! file that is not gpucr's.

use gpucr_abi::proto::Reply;

/// A request done.
pub(super) fn ok() -> Reply {
    Reply {
        ok: true,
        ..Default::default()
    }
}

/// A request refused, saying why (empty: not gpucr's, let other plugins have it).
pub(super) fn refuse(error: &str) -> Reply {
    Reply {
        ok: false,
        error: error.to_owned(),
        ..Default::default()
    }
}

/// A device file that is not one gpucr's backend owns.
pub(super) fn not_owned() -> Reply {
    Reply {
        ok: true,
        owned: false,
        ..Default::default()
    }
}

/// A request this helper does not answer (another side's, or out of place), named.
pub(super) fn unexpected(kind: &gpucr_abi::proto::request::Kind) -> Reply {
    refuse(&format!("unexpected request {kind:?} in this phase"))
}
