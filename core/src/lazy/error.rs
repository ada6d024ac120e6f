//! What can stop a lazy restore.

use std::io;
use std::path::PathBuf;

use crate::exit_code::{self, ExitCode};

/// An error of the lazy-pages server. Every one that happens while tasks wait on their
/// memory kills the tree first (`server`), so no task waits for ever.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error("{path}: lazy-pages socket: {source}")]
    Socket { path: PathBuf, source: io::Error },
    #[error(
        "{path}: another restore of this image is still serving its memory (gpucr restore \
         --lazy); wait until it is done"
    )]
    Busy { path: PathBuf },
    #[error("lazy-pages protocol: {0}")]
    Protocol(String),
    #[error("CRIU closed the lazy-pages connection before every task was restored")]
    Hangup,
    #[error("task {pid}: cannot read its memory image: {source}")]
    Image {
        pid: i32,
        #[source]
        source: Box<gpucr_criu_image::ImageError>,
    },
    #[error("task {pid}: {file}: {reason}")]
    Unverifiable {
        pid: i32,
        file: PathBuf,
        reason: String,
    },
    #[error(
        "task {pid}: {file}: bytes {offset}..{end} differ from the manifest's checksum: \
         damaged memory pages, none of them placed"
    )]
    Damaged {
        pid: i32,
        file: PathBuf,
        offset: u64,
        end: u64,
    },
    #[error("task {pid}: {file}: cannot read bytes {offset}..{end}: {source}")]
    Read {
        pid: i32,
        file: PathBuf,
        offset: u64,
        end: u64,
        source: io::Error,
    },
    #[error("task {pid}: userfaultfd {op} at {addr:#x}: {source}")]
    Uffd {
        pid: i32,
        op: &'static str,
        addr: u64,
        source: io::Error,
    },
    #[error("task {pid}: unexpected userfaultfd event {event:#x}")]
    UnknownEvent { pid: i32, event: u8 },
    #[error(
        "task {pid}: its memory could not be brought in before its device's restore: {reason}"
    )]
    NotIn { pid: i32, reason: String },
    #[error("lazy restore stopped: {0}")]
    Cancelled(String),
    #[error(transparent)]
    Guard(#[from] super::guard::GuardError),
    #[error("cannot start a lazy-pages thread: {0}")]
    Thread(io::Error),
    #[error("task {pid}: {file}: block {block} did not come from the source: {reason}")]
    Remote {
        pid: i32,
        file: PathBuf,
        block: u64,
        reason: String,
    },
    #[error("{variable}={value:?}: expected {expected}")]
    Setting {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl ExitCode for LazyError {
    fn exit_code(&self) -> u8 {
        match self {
            LazyError::Damaged { .. }
            | LazyError::Unverifiable { .. }
            | LazyError::Image { .. } => exit_code::IMAGE_DAMAGED,
            LazyError::Cancelled(_) => exit_code::INTERRUPTED,
            LazyError::Busy { .. } => exit_code::IMAGE_DIR,
            LazyError::Setting { .. } => exit_code::USAGE,
            _ => exit_code::FAILURE,
        }
    }
}
