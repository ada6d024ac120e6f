//! The helper: gpucr's side of the plugin protocol. A socket server (a thread per
//! connection) that receives device files and buffers from the plugin, feeds them to the
//! transfer engine, and answers the plugin's "is this task's memory done" questions.
//!
//! A [`DumpHelper`] serves one dump, a [`RestoreHelper`] one restore (a [`Helper`] of
//! one side, [`DumpSide`] or [`RestoreSide`]: each answers only its side's requests
//! and has only its side's methods); [`Session`] is its private directory;
//! [`GpuDump`] and [`GpuRestore`] bundle both with the transfer engine for `dump/` and
//! `restore/`.
//!
//! The helper depends on `crate::gpu` (the [`Backend`](crate::gpu::Backend) trait, the
//! device state it collects and the manifest types it fills in), never the other way:
//! the backends know nothing of the helper, the plugin protocol or the session.

mod control;
mod dump_answers;
mod dump_tree;
mod fault;
mod lifecycle;
mod operation;
mod parallel;
mod reply;
mod restore_answers;
mod resume;
mod server;
mod session;
mod shared;
mod timeline;

use std::io;
use std::path::PathBuf;

pub use operation::{GpuDump, GpuRestore, ProcessMemory, RestoreSettings};
pub use server::{DumpHelper, DumpOutcome, Helper, RestoreHelper, StepControl};
pub use session::{locate_plugin, Session, ENV_PLUGIN};
pub use shared::EngineCall;
pub use shared::{DumpSide, RestoreSide};
pub use timeline::{timeline_events, Timeline};

use crate::gpu::GpuError;
use crate::transfer::TransferError;

/// Errors of the helper.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error(
        "gpucr's CRIU plugin was not found (looked for {}); build it with `cargo build \
         --workspace` or name it with GPUCR_PLUGIN",
        .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoPlugin { searched: Vec<PathBuf> },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("helper socket {path}: {source}")]
    Socket { path: PathBuf, source: nix::Error },
    #[error(transparent)]
    Gpu(GpuError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error("device state: {0}")]
    Failed(String),
    /// The task a plugin ran in died while its request `what` was being answered. In a
    /// restore that CRIU failed for a reason of its own this is a consequence (CRIU kills
    /// the tasks it made), not the cause: see [`HelperError::is_a_task_gone`].
    #[error(
        "device state: {what} (plugin in pid {peer}): {}",
        crate::helper::control::Abandoned::PeerGone
    )]
    PluginGone { what: &'static str, peer: i32 },
    /// A task's device did not come back, or the plugin's part of a device step failed.
    #[error("{0}")]
    Device(String),
    #[error(transparent)]
    Lifecycle(#[from] lifecycle::LifecycleError),
    /// The request was given up (timed out, its plugin gone, the helper stopped).
    #[error("given up: {0}")]
    Abandoned(#[from] crate::cancel::Cancelled),
}

impl From<GpuError> for HelperError {
    /// A backend step that ended at its request's cancellation is the request given
    /// up, like the helper's own checks of the token.
    fn from(e: GpuError) -> HelperError {
        match e {
            GpuError::Cancelled(c) => HelperError::Abandoned(c),
            e => HelperError::Gpu(e),
        }
    }
}

impl HelperError {
    /// Whether this is only a plugin's task gone mid-request: what follows when CRIU
    /// gives up a restore and kills the tasks it made, so a cause CRIU names explains
    /// the failure better.
    pub fn is_a_task_gone(&self) -> bool {
        matches!(self, HelperError::PluginGone { .. })
    }
}

impl crate::exit_code::ExitCode for HelperError {
    /// A device or driver failure is [`crate::exit_code::DEVICE_FAILED`], damage found
    /// while moving device memory is the transfer's own code; anything else is
    /// [`crate::exit_code::FAILURE`].
    fn exit_code(&self) -> u8 {
        match self {
            HelperError::Gpu(e) => e.exit_code(),
            HelperError::Transfer(e) => e.exit_code(),
            HelperError::Device(_) => crate::exit_code::DEVICE_FAILED,
            HelperError::NoPlugin { .. }
            | HelperError::Io { .. }
            | HelperError::Socket { .. }
            | HelperError::Failed(_)
            | HelperError::PluginGone { .. }
            | HelperError::Lifecycle(_)
            | HelperError::Abandoned(_) => crate::exit_code::FAILURE,
        }
    }
}
