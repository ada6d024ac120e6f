//! The transfer engine: moves device memory between GPU buffers and the image's `gpu/`
//! directory, chunked, pipelined and in parallel.
//!
//! Dump ([`DumpWriter`]): buffers are added as the plugin hands them over; copy threads
//! read fixed-size chunks through the device's copy engine ([`BufferSource`]) into a
//! fixed pool of chunk buffers, and pack threads elide all-zero chunks, compress the rest
//! (zstd, or store them raw when compression does not pay), checksum them and append
//! them to one data file per pack thread. [`DumpWriter::finish`] writes the index last.
//!
//! Restore ([`Restorer`]): the index is validated and the data files mapped when the
//! image is opened; with prefetch, reader threads at once stage chunks (decompressed and
//! checked, or raw ones read ahead) within a bound, before the buffers exist; a buffer
//! handed over with [`Restorer::attach`] is filled from staging and straight from the
//! image by one writer thread per copy queue. A damaged chunk aborts the whole restore
//! with an error that names it.
//!
//! The on-disk format is documented byte by byte in `docs/gpu-image-format.md`.

mod chunk;
mod config;
mod error;
mod format;
mod index;
mod mapped;
mod queue;
mod restorer;
mod source;
mod staging;
mod stats;
mod verify;
mod writer;

#[cfg(test)]
mod tests;

pub use config::{Compression, ParseCompressionError, TransferConfig};
pub use error::{Canceller, ChunkProblem, ProblemKind, TransferError};
pub use format::{data_file_name, is_data_file_name, INDEX_FILE};
pub use index::{read_index, BufferEntry, ChunkEntry, DataFileEntry, Encoding, GpuIndex};
pub use restorer::{Restorer, QUEUE_DEPTH};
pub use source::{BufferKey, BufferSink, BufferSource, FileRange};
pub use stats::GpuStats;
pub use verify::{verify_image, verify_image_until, DataStreamVerifier};
pub use writer::DumpWriter;

use std::sync::Arc;

/// The name of the GPU memory directory inside an image directory.
pub const GPU_DIR: &str = "gpu";

/// A progress event, delivered on the engine's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `done` of `total` buffer bytes are transferred. On dump, `total` grows as buffers
    /// are added; on restore it is the size of every buffer in the image.
    Bytes { done: u64, total: u64 },
    /// Every byte of this buffer is written (to the image on dump, to the device on
    /// restore).
    BufferDone(BufferKey),
}

/// The progress callback: called from the engine's threads, so it must be quick.
pub type EventSink = Arc<dyn Fn(Event) + Send + Sync>;

/// A callback that ignores every event.
pub fn no_events() -> EventSink {
    Arc::new(|_| {})
}
