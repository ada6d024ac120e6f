//! What the engine reads from and writes to: buffers named by [`BufferKey`], accessed
//! through the device's copy engine.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

use crate::cancel::Cancel;

/// Identifies a buffer in the image: which process (its pid in the checkpointed tree's
/// own PID namespace, stable across restore) and which buffer of that process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferKey {
    pub task: u32,
    pub buffer: u32,
}

impl BufferKey {
    pub fn new(task: u32, buffer: u32) -> BufferKey {
        BufferKey { task, buffer }
    }
}

impl fmt::Display for BufferKey {
    /// `task/buffer`, as in error messages and `gpucr inspect`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.task, self.buffer)
    }
}

/// Device memory being dumped, read through the device's copy engine.
///
/// `read_at` is called from several threads at once, for different ranges; it may be
/// slow (a throttled copy engine), which the engine hides by reading other chunks and
/// compressing in the meantime.
///
/// Every read gets the transfer's cancellation token, cancelled when the transfer
/// fails or is cancelled ([`super::Canceller`]): a read that waits for a device (a
/// fence, a modelled engine, a driver call) ends soon after it, with an error of kind
/// [`io::ErrorKind::Interrupted`] (`io::Error::from(Cancelled)`).
pub trait BufferSource: Send + Sync {
    /// Bytes in the buffer.
    fn len(&self) -> u64;
    /// True when the buffer holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fill `buf` with the bytes at `offset..offset + buf.len()`; a wait for the device
    /// ends at `cancel`.
    fn read_at(&self, offset: u64, buf: &mut [u8], cancel: &Cancel) -> io::Result<()>;
}

/// Device memory being restored, written through the device's copy engine.
///
/// Writes to buffers of one copy queue ([`BufferSink::queue`]) are issued one at a time,
/// in order, by the queue's own thread; writes to different queues run in parallel. As
/// with [`BufferSource::read_at`], a write's wait for the device ends at the transfer's
/// cancellation.
pub trait BufferSink: Send + Sync {
    /// Bytes in the buffer.
    fn len(&self) -> u64;
    /// True when the buffer holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Write `data` at `offset..offset + data.len()`; a wait for the device ends at
    /// `cancel`.
    fn write_at(&self, offset: u64, data: &[u8], cancel: &Cancel) -> io::Result<()>;
    /// True when the buffer is known to read as zeros before anything is written (a
    /// freshly created file, memory the driver clears on allocation): the engine then
    /// skips the image's all-zero chunks instead of writing zeros.
    fn starts_zeroed(&self) -> bool {
        false
    }
    /// The copy queue the buffer is written through: for a GPU, its copy engine, shared
    /// by every buffer on that GPU. Each queue gets one writer thread.
    fn queue(&self) -> u32 {
        0
    }
}

/// A byte range of a file used as a buffer: the simulator's buffers (one tmpfs file per
/// buffer) and the benchmark's sources.
#[derive(Debug)]
pub struct FileRange {
    file: File,
    base: u64,
    len: u64,
    zeroed: bool,
    queue: u32,
}

impl FileRange {
    /// Bytes `base..base + len` of `file`.
    pub fn new(file: File, base: u64, len: u64) -> FileRange {
        FileRange {
            file,
            base,
            len,
            zeroed: false,
            queue: 0,
        }
    }

    /// The whole file, at its current size.
    pub fn whole(file: File) -> io::Result<FileRange> {
        let len = file.metadata()?.len();
        Ok(FileRange::new(file, 0, len))
    }

    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the range holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Declare that the range reads as zeros until written (see
    /// [`BufferSink::starts_zeroed`]).
    pub fn starting_zeroed(mut self) -> FileRange {
        self.zeroed = true;
        self
    }

    /// Write the range through copy queue `queue` (see [`BufferSink::queue`]).
    pub fn on_queue(mut self, queue: u32) -> FileRange {
        self.queue = queue;
        self
    }

    fn check(&self, offset: u64, n: usize) -> io::Result<u64> {
        match offset.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok(self.base + offset),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {offset}..+{n} are outside the buffer ({} bytes)",
                    self.len
                ),
            )),
        }
    }
}

impl BufferSource for FileRange {
    fn len(&self) -> u64 {
        FileRange::len(self)
    }

    /// A file read: nothing to wait for but the page cache, so `cancel` is not looked at.
    fn read_at(&self, offset: u64, buf: &mut [u8], _cancel: &Cancel) -> io::Result<()> {
        let at = self.check(offset, buf.len())?;
        self.file.read_exact_at(buf, at)
    }
}

impl BufferSink for FileRange {
    fn len(&self) -> u64 {
        FileRange::len(self)
    }

    /// A file write: nothing to wait for but the page cache, so `cancel` is not looked at.
    fn write_at(&self, offset: u64, data: &[u8], _cancel: &Cancel) -> io::Result<()> {
        let at = self.check(offset, data.len())?;
        self.file.write_all_at(data, at)
    }

    fn starts_zeroed(&self) -> bool {
        self.zeroed
    }

    fn queue(&self) -> u32 {
        self.queue
    }
}
