//! The CRIU client: `criu swrk <fd>` driven over a SOCK_SEQPACKET socketpair.
//!
//! gpucr never builds a CRIU command line or parses CRIU's output: every request is a
//! protobuf `criu_req`, every answer a `criu_resp`, and every notification CRIU sends
//! (a [`Notification`]) is answered by an ack after a handler has seen it; the handler's
//! refusal comes back typed beside CRIU's own result ([`Answered`]).
//!
//! [`start_criu`] and [`criu_log_level`] are the parts the dump and the restore share.

pub mod action_script;
mod binary;
mod config;
mod error;
mod file_mounts;
mod log_tail;
mod notification;
mod options;
mod request;
mod start;
mod structured;
mod swrk;
mod version;

pub use binary::locate;
pub use config::{
    advice_for, default_config_files, unread_config_note, ConfigHandover, CriuConfig,
    CriuConfigError, CriuOption,
};
pub use error::CriuError;
pub use file_mounts::{check_file_mounts, FILE_MOUNTS_OK_VERSION};
pub use log_tail::{
    log_tail, plugin_failure, script_failure, LogStamp, PluginFailure, ScriptFailure,
};
pub use notification::Notification;
pub use request::{
    has_own_mount_namespace, CommonOptions, CriuFlags, DumpRequest, NetworkLock, RestoreRequest,
};
pub use start::{criu_log_level, start_criu};
pub use swrk::{Answered, Swrk, START_TIMEOUT};
pub use version::{check_supported, CriuVersion, MIN_VERSION, SOCKETS_OK_VERSION};

/// The protobuf messages of CRIU's RPC protocol (`proto/criu/rpc.proto`).
#[allow(missing_docs, clippy::all)]
pub mod rpc {
    include!(concat!(env!("OUT_DIR"), "/criu.rpc.rs"));
}
