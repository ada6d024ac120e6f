//! Why a transfer failed, and what is wrong with a damaged chunk.
//!
//! Errors are `Clone` (I/O errors are shared through an `Arc`) because one failure is
//! reported to every thread that waits on the transfer.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use super::source::BufferKey;
use crate::exit_code::{self, ExitCode};

/// What is wrong with one stored chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum ProblemKind {
    /// The stored bytes do not hash to the index's checksum.
    ChecksumMismatch,
    /// The stored bytes hash correctly but do not decompress.
    Undecodable(String),
    /// The chunk decompressed to bytes that do not hash to the index's checksum.
    ContentMismatch,
    /// The data file ends before the chunk does.
    Truncated,
    /// The data file cannot be read.
    Unreadable(String),
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProblemKind::ChecksumMismatch => f.write_str("checksum mismatch"),
            ProblemKind::Undecodable(why) => write!(f, "does not decompress: {why}"),
            ProblemKind::ContentMismatch => {
                f.write_str("checksum mismatch of the decompressed bytes")
            }
            ProblemKind::Truncated => f.write_str("past the end of the file"),
            ProblemKind::Unreadable(why) => write!(f, "unreadable: {why}"),
        }
    }
}

/// One damaged chunk, named the way a person looks for it: data file, offset in it,
/// chunk number in the index, and which bytes of which buffer it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkProblem {
    /// Data file name inside `gpu/`.
    pub file: String,
    /// Byte offset of the chunk's stored bytes in that file.
    pub file_offset: u64,
    /// The chunk's number in the index (0-based, over all buffers).
    pub chunk: u64,
    pub buffer: BufferKey,
    /// Bytes of the buffer the chunk holds.
    pub range: Range<u64>,
    pub kind: ProblemKind,
}

impl fmt::Display for ChunkProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu/{}: chunk {} (buffer {}, bytes {}..{} of the buffer) at offset {}: {}",
            self.file,
            self.chunk,
            self.buffer,
            self.range.start,
            self.range.end,
            self.file_offset,
            self.kind
        )
    }
}

/// Why a transfer failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TransferError {
    /// The configuration cannot be used.
    #[error("invalid transfer configuration: {what}")]
    Config { what: String },
    /// A file of the image could not be created, written, read or synced.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    /// The image has no GPU index (no `gpu/index`).
    #[error("{} is missing: the image has no GPU memory, or its dump did not finish", path.display())]
    IndexMissing { path: PathBuf },
    /// The index is damaged or not an index at all.
    #[error("{} is damaged at offset {offset}: {what}", path.display())]
    Index {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A data file does not match what the index says about it.
    #[error("{} is damaged at offset {offset}: {what}", path.display())]
    DataFile {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A stored chunk is damaged.
    #[error("{0}")]
    Chunk(Box<ChunkProblem>),
    /// Reading a buffer from the device failed (dump).
    #[error("cannot read buffer {key} at offset {offset}: {source}")]
    Source {
        key: BufferKey,
        offset: u64,
        #[source]
        source: Arc<io::Error>,
    },
    /// Writing a buffer to the device failed (restore).
    #[error("cannot write buffer {key} at offset {offset}: {source}")]
    Sink {
        key: BufferKey,
        offset: u64,
        #[source]
        source: Arc<io::Error>,
    },
    /// The device buffer handed over for restore has another size than the image's.
    #[error("buffer {key} holds {actual} bytes, but the image has {expected}")]
    SinkLength {
        key: BufferKey,
        expected: u64,
        actual: u64,
    },
    /// The same buffer was added to a dump twice.
    #[error("buffer {key} was added twice")]
    DuplicateBuffer { key: BufferKey },
    /// A buffer the image does not hold.
    #[error("the image has no buffer {key}")]
    UnknownBuffer { key: BufferKey },
    /// The same buffer was handed over twice for restore.
    #[error("buffer {key} was handed over twice")]
    AlreadyAttached { key: BufferKey },
    /// The restore finished with buffers that were never handed over.
    #[error("{} buffer(s) of the image were never handed over for restore: {}", keys.len(), list_keys(keys))]
    NotAttached { keys: Vec<BufferKey> },
    /// A worker thread could not be started or died.
    #[error("transfer thread failed: {what}")]
    Thread { what: String },
    /// The transfer was cancelled (gpucr was interrupted).
    #[error("GPU memory transfer cancelled: {reason}")]
    Cancelled { reason: String },
}

/// Cancels a running transfer from another thread: every copy stops at its next chunk
/// and every waiter returns [`TransferError::Cancelled`].
#[derive(Clone)]
pub struct Canceller(Arc<dyn Fn(TransferError) + Send + Sync>);

impl Canceller {
    pub(crate) fn new(fail: impl Fn(TransferError) + Send + Sync + 'static) -> Canceller {
        Canceller(Arc::new(fail))
    }

    pub fn cancel(&self, reason: &str) {
        (self.0)(TransferError::Cancelled {
            reason: reason.to_owned(),
        });
    }
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Canceller")
    }
}

fn list_keys(keys: &[BufferKey]) -> String {
    const SHOWN: usize = 8;
    let mut text: Vec<String> = keys.iter().take(SHOWN).map(|k| k.to_string()).collect();
    if keys.len() > SHOWN {
        text.push(format!("and {} more", keys.len() - SHOWN));
    }
    text.join(", ")
}

impl TransferError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        TransferError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn index(path: impl Into<PathBuf>, offset: u64, what: impl Into<String>) -> Self {
        TransferError::Index {
            path: path.into(),
            offset,
            what: what.into(),
        }
    }

    /// True when the image itself is damaged (as opposed to the machine or the device
    /// failing): a bad chunk, index or data file.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            TransferError::IndexMissing { .. }
                | TransferError::Index { .. }
                | TransferError::DataFile { .. }
                | TransferError::Chunk(_)
                | TransferError::UnknownBuffer { .. }
        )
    }
}

impl ExitCode for TransferError {
    /// The process exit code this error should end `gpucr` with.
    fn exit_code(&self) -> u8 {
        if self.is_damage() {
            exit_code::IMAGE_DAMAGED
        } else if matches!(
            self,
            TransferError::Source { .. }
                | TransferError::Sink { .. }
                | TransferError::SinkLength { .. }
        ) {
            // The device's memory could not be read (dump) or written (restore).
            exit_code::DEVICE_FAILED
        } else if matches!(self, TransferError::Cancelled { .. }) {
            exit_code::INTERRUPTED
        } else {
            exit_code::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_problem_names_everything() {
        let p = ChunkProblem {
            file: "data-0001".into(),
            file_offset: 4096,
            chunk: 17,
            buffer: BufferKey::new(12, 3),
            range: 8388608..12582912,
            kind: ProblemKind::ChecksumMismatch,
        };
        assert_eq!(
            p.to_string(),
            "gpu/data-0001: chunk 17 (buffer 12/3, bytes 8388608..12582912 of the buffer) \
             at offset 4096: checksum mismatch"
        );
        let e = TransferError::Chunk(Box::new(p));
        assert_eq!(e.exit_code(), exit_code::IMAGE_DAMAGED);
        let io = TransferError::io("write", "/x", io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(io.exit_code(), exit_code::FAILURE);
    }

    #[test]
    fn lists_a_few_unattached_keys() {
        let keys: Vec<_> = (0..10).map(|i| BufferKey::new(1, i)).collect();
        let e = TransferError::NotAttached { keys };
        assert_eq!(
            e.to_string(),
            "10 buffer(s) of the image were never handed over for restore: \
             1/0, 1/1, 1/2, 1/3, 1/4, 1/5, 1/6, 1/7, and 2 more"
        );
    }
}
