//! Dump: buffers in, `gpu/` out.
//!
//! Two stages of `jobs` threads each, joined by bounded queues:
//!
//! ```text
//!  add() ─> chunk queue ─> copy threads ──(filled)──> pack threads ─> data-NNNN
//!   (lazy: one cursor     read_at through      zero check, zstd, xxh3,
//!    per buffer)          the copy engine      append to the thread's own file
//!                 ^                                   │
//!                 └──────── free chunk buffers <──────┘   (2 × jobs buffers in all)
//! ```
//!
//! Copying one chunk overlaps with packing others, memory is bounded by the pool of
//! chunk buffers, and pack threads never share a file. Each appended chunk's writeback
//! is started at once, so the disk works during the dump rather than in the final
//! fsync. The index is written by [`DumpWriter::finish`], after the data files are
//! synced.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::chunk::Packer;
use super::config::{Compression, TransferConfig};
use super::error::TransferError;
use super::format::{self, data_file_name, DATA_HEADER_LEN, INDEX_FILE, INDEX_TEMP_FILE};
use super::index::{BufferEntry, ChunkEntry, DataFileEntry, Encoding, GpuIndex};
use super::queue::Queue;
use super::source::{BufferKey, BufferSource};
use super::stats::GpuStats;
use super::{Event, EventSink, GPU_DIR};
use crate::cancel::Cancel;

/// Chunk buffers in flight per copy thread: one being filled, one being packed.
const BUFFERS_PER_JOB: usize = 2;

/// Writes buffers into an image's `gpu/` directory. See the module documentation.
pub struct DumpWriter {
    shared: Arc<Shared>,
    copiers: Vec<JoinHandle<()>>,
    packers: Vec<JoinHandle<Option<DataFile>>>,
    gpu_dir: PathBuf,
    compression: Compression,
    chunk_size: usize,
    started: Instant,
}

struct Shared {
    chunk_size: u64,
    state: Mutex<State>,
    /// Copy threads wait here for chunks to claim.
    work: Condvar,
    /// `wait_idle` waits here.
    idle: Condvar,
    free: Queue<Vec<u8>>,
    filled: Queue<Filled>,
    on_event: EventSink,
    /// Handed to every read of a source, cancelled by the first failure (a
    /// [`super::Canceller`]'s too): a read waiting for its device ends then.
    cancel: Cancel,
}

#[derive(Default)]
struct State {
    buffers: Vec<Buffer>,
    by_key: HashMap<BufferKey, usize>,
    /// Buffers with chunks not yet claimed by a copy thread, oldest first.
    queue: VecDeque<usize>,
    /// Chunks added but not yet recorded (queued, copying or packing).
    in_flight: u64,
    done_bytes: u64,
    total_bytes: u64,
    error: Option<TransferError>,
    closing: bool,
}

struct Buffer {
    key: BufferKey,
    len: u64,
    /// Dropped once the buffer is fully copied, so the device fd behind it can close.
    source: Option<Arc<dyn BufferSource>>,
    next_chunk: u64,
    chunks: Vec<Option<ChunkEntry>>,
    remaining: u64,
}

/// A chunk a copy thread is to read.
struct Claim {
    buffer: usize,
    chunk: u64,
    offset: u64,
    len: usize,
    source: Arc<dyn BufferSource>,
}

/// A chunk read from the device, on its way to a pack thread.
struct Filled {
    buffer: usize,
    chunk: u64,
    offset: u64,
    data: Vec<u8>,
}

/// A pack thread's data file, once it is done.
struct DataFile {
    file: File,
    path: PathBuf,
    size: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record the first error; stop handing out work; wake everyone, and end the
    /// reads waiting for their devices.
    fn fail(&self, error: TransferError) {
        let mut state = self.lock();
        if state.error.is_none() {
            state.error = Some(error);
        }
        state.queue.clear();
        let reason = state.error.as_ref().map(ToString::to_string);
        drop(state);
        self.work.notify_all();
        self.idle.notify_all();
        // Without the state's lock: a waker the token runs may take it.
        self.cancel.cancel(reason.unwrap_or_default());
    }

    fn failed(&self) -> bool {
        self.lock().error.is_some()
    }

    /// Claim the next chunk to copy, or `None` when the writer is closing or has failed.
    fn claim(&self) -> Option<Claim> {
        let mut state = self.lock();
        loop {
            if state.error.is_some() {
                return None;
            }
            if let Some(&b) = state.queue.front() {
                let buffer = &mut state.buffers[b];
                let chunk = buffer.next_chunk;
                buffer.next_chunk += 1;
                let offset = chunk * self.chunk_size;
                let claim = Claim {
                    buffer: b,
                    chunk,
                    offset,
                    len: (buffer.len - offset).min(self.chunk_size) as usize,
                    source: Arc::clone(buffer.source.as_ref().expect("queued buffer has a source")),
                };
                if buffer.next_chunk == buffer.chunks.len() as u64 {
                    state.queue.pop_front();
                }
                return Some(claim);
            }
            if state.closing {
                return None;
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Store a packed chunk's index entry and report progress.
    fn record(&self, buffer: usize, chunk: u64, entry: ChunkEntry) {
        let mut state = self.lock();
        let b = &mut state.buffers[buffer];
        b.chunks[chunk as usize] = Some(entry);
        b.remaining -= 1;
        let finished = (b.remaining == 0).then(|| (b.key, b.source.take()));
        state.done_bytes += u64::from(entry.raw_len);
        state.in_flight -= 1;
        let progress = Event::Bytes {
            done: state.done_bytes,
            total: state.total_bytes,
        };
        let idle = state.in_flight == 0;
        drop(state);
        if idle {
            self.idle.notify_all();
        }
        (self.on_event)(progress);
        if let Some((key, source)) = finished {
            drop(source);
            (self.on_event)(Event::BufferDone(key));
        }
    }
}

impl DumpWriter {
    /// Create `dir/gpu/` (or clear a previous dump's files from it), one data file per
    /// job, and start the threads.
    pub fn start(
        dir: &Path,
        cfg: TransferConfig,
        on_event: EventSink,
    ) -> Result<DumpWriter, TransferError> {
        cfg.validate()?;
        let gpu_dir = dir.join(GPU_DIR);
        prepare_dir(&gpu_dir)?;
        let mut files = Vec::with_capacity(cfg.jobs);
        for n in 0..cfg.jobs {
            let path = gpu_dir.join(data_file_name(n));
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| TransferError::io("create", &path, e))?;
            file.write_all(&format::data_header(n as u32))
                .map_err(|e| TransferError::io("write", &path, e))?;
            files.push((file, path));
        }
        let pool = cfg.jobs * BUFFERS_PER_JOB;
        let shared = Arc::new(Shared {
            chunk_size: cfg.chunk_size as u64,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            free: Queue::new(pool),
            filled: Queue::new(pool),
            on_event,
            // Its own token: the dump's failures and its Canceller cancel it.
            cancel: Cancel::new(),
        });
        for _ in 0..pool {
            // Allocated by the copy threads on first use, so small dumps stay small.
            let _ = shared.free.push(Vec::new());
        }
        let mut writer = DumpWriter {
            shared: Arc::clone(&shared),
            copiers: Vec::new(),
            packers: Vec::new(),
            gpu_dir,
            compression: cfg.compression,
            chunk_size: cfg.chunk_size,
            started: Instant::now(),
        };
        for (n, (file, path)) in files.into_iter().enumerate() {
            let packer = Packer::new(cfg.compression)
                .map_err(|e| TransferError::io("set up zstd for", &path, e))?;
            let shared = Arc::clone(&shared);
            let handle = thread::Builder::new()
                .name(format!("gpucr-pack-{n}"))
                .spawn(move || {
                    let run = || pack_thread(&shared, packer, n as u16, file, path);
                    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| {
                        shared.fail(panicked());
                        None
                    })
                })
                .map_err(|e| TransferError::Thread {
                    what: e.to_string(),
                })?;
            writer.packers.push(handle);
        }
        for n in 0..cfg.jobs {
            let shared = Arc::clone(&shared);
            let handle = thread::Builder::new()
                .name(format!("gpucr-copy-{n}"))
                .spawn(move || {
                    if catch_unwind(AssertUnwindSafe(|| copy_thread(&shared))).is_err() {
                        shared.fail(panicked());
                    }
                })
                .map_err(|e| TransferError::Thread {
                    what: e.to_string(),
                })?;
            writer.copiers.push(handle);
        }
        Ok(writer)
    }

    /// Queue a buffer for copying; returns at once. Callable from any thread, at any
    /// time before [`DumpWriter::finish`]. Fails if the key was added before, or if the
    /// dump has already failed (with that failure).
    pub fn add(&self, key: BufferKey, source: Box<dyn BufferSource>) -> Result<(), TransferError> {
        let len = source.len();
        let chunks = len.div_ceil(self.shared.chunk_size);
        let mut state = self.shared.lock();
        if let Some(e) = &state.error {
            return Err(e.clone());
        }
        if state.by_key.contains_key(&key) {
            return Err(TransferError::DuplicateBuffer { key });
        }
        let id = state.buffers.len();
        state.by_key.insert(key, id);
        state.buffers.push(Buffer {
            key,
            len,
            source: (chunks > 0).then(|| Arc::from(source)),
            next_chunk: 0,
            chunks: vec![None; chunks as usize],
            remaining: chunks,
        });
        state.total_bytes += len;
        state.in_flight += chunks;
        if chunks > 0 {
            state.queue.push_back(id);
        }
        let progress = Event::Bytes {
            done: state.done_bytes,
            total: state.total_bytes,
        };
        drop(state);
        self.shared.work.notify_all();
        (self.shared.on_event)(progress);
        if chunks == 0 {
            (self.shared.on_event)(Event::BufferDone(key));
        }
        Ok(())
    }

    /// Block until every buffer added so far is written to the data files (not yet
    /// synced). Returns the first error of the dump, as soon as there is one.
    pub fn wait_idle(&self) -> Result<(), TransferError> {
        let mut state = self.shared.lock();
        loop {
            if let Some(e) = &state.error {
                return Err(e.clone());
            }
            if state.in_flight == 0 {
                return Ok(());
            }
            state = self
                .shared
                .idle
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A handle that cancels this writer from another thread.
    pub fn canceller(&self) -> super::Canceller {
        let shared = self.shared.clone();
        super::Canceller::new(move |error| shared.fail(error))
    }

    /// Wait for every buffer, sync the data files, write `gpu/index` (through a
    /// temporary file and a rename, then sync the directory) and return the totals.
    /// On error the directory holds no index: the image is incomplete.
    pub fn finish(mut self) -> Result<GpuStats, TransferError> {
        let idle = self.wait_idle();
        let files = self.stop();
        idle?;
        let files = files?;
        sync_all(&files)?;
        let index = self.build_index(&files);
        self.write_index(&index)?;
        Ok(GpuStats::of_index(
            &index,
            self.started.elapsed().as_secs_f64(),
        ))
    }

    /// Stop and join every thread; the data files of the pack threads, or the first
    /// error.
    fn stop(&mut self) -> Result<Vec<DataFile>, TransferError> {
        {
            let mut state = self.shared.lock();
            state.closing = true;
            state.queue.clear();
        }
        self.shared.work.notify_all();
        // Copy threads wait for a free buffer or for a chunk to claim: closing the pool
        // and the claim list releases both.
        self.shared.free.close();
        let mut died = false;
        for handle in self.copiers.drain(..) {
            died |= handle.join().is_err();
        }
        self.shared.filled.close();
        let mut files = Vec::new();
        for handle in self.packers.drain(..) {
            match handle.join() {
                Ok(Some(file)) => files.push(file),
                Ok(None) => {}
                Err(_) => died = true,
            }
        }
        if died {
            self.shared.fail(panicked());
        }
        match &self.shared.lock().error {
            Some(e) => Err(e.clone()),
            None => Ok(files),
        }
    }

    fn build_index(&self, files: &[DataFile]) -> GpuIndex {
        let state = self.shared.lock();
        let mut order: Vec<usize> = (0..state.buffers.len()).collect();
        order.sort_by_key(|&b| state.buffers[b].key);
        let mut chunks = Vec::new();
        let mut buffers = Vec::with_capacity(order.len());
        for b in order {
            let buffer = &state.buffers[b];
            let first = chunks.len();
            chunks.extend(
                buffer
                    .chunks
                    .iter()
                    .map(|c| c.expect("every chunk is recorded once the writer is idle")),
            );
            buffers.push(BufferEntry::new(
                buffer.key,
                buffer.len,
                first as u64,
                &chunks[first..],
            ));
        }
        GpuIndex {
            version: format::VERSION,
            chunk_size: self.chunk_size as u64,
            compression: self.compression,
            files: files
                .iter()
                .enumerate()
                .map(|(n, f)| DataFileEntry {
                    name: data_file_name(n),
                    size: f.size,
                })
                .collect(),
            buffers,
            chunks,
        }
    }

    fn write_index(&self, index: &GpuIndex) -> Result<(), TransferError> {
        let temp = self.gpu_dir.join(INDEX_TEMP_FILE);
        let path = self.gpu_dir.join(INDEX_FILE);
        let bytes = index.to_bytes();
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| TransferError::io("create", &temp, e))?;
        file.write_all(&bytes)
            .map_err(|e| TransferError::io("write", &temp, e))?;
        file.sync_all()
            .map_err(|e| TransferError::io("sync", &temp, e))?;
        fs::rename(&temp, &path).map_err(|e| TransferError::io("rename", &temp, e))?;
        File::open(&self.gpu_dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| TransferError::io("sync", &self.gpu_dir, e))
    }
}

impl Drop for DumpWriter {
    /// A writer dropped without `finish` stops its threads; the image has no index.
    fn drop(&mut self) {
        if !self.copiers.is_empty() || !self.packers.is_empty() {
            self.shared.fail(TransferError::Thread {
                what: "the dump was abandoned".into(),
            });
            let _ = self.stop();
        }
    }
}

fn panicked() -> TransferError {
    TransferError::Thread {
        what: "a transfer thread panicked".into(),
    }
}

/// Make `gpu/` (mode 0700) and remove what an earlier dump left in it, the index first,
/// so that no index can ever describe these new data files.
fn prepare_dir(gpu_dir: &Path) -> Result<(), TransferError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(gpu_dir)
        .map_err(|e| TransferError::io("create", gpu_dir, e))?;
    for name in [INDEX_FILE, INDEX_TEMP_FILE] {
        let path = gpu_dir.join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(TransferError::io("remove", &path, e))
            }
            _ => {}
        }
    }
    let entries = fs::read_dir(gpu_dir).map_err(|e| TransferError::io("list", gpu_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| TransferError::io("list", gpu_dir, e))?;
        if entry.file_name().to_string_lossy().starts_with("data-") {
            let path = entry.path();
            fs::remove_file(&path).map_err(|e| TransferError::io("remove", &path, e))?;
        }
    }
    Ok(())
}

fn sync_all(files: &[DataFile]) -> Result<(), TransferError> {
    thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|f| {
                s.spawn(move || {
                    f.file
                        .sync_all()
                        .map_err(|e| TransferError::io("sync", &f.path, e))
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| {
                Err(TransferError::Thread {
                    what: "sync thread panicked".into(),
                })
            })
        })
    })
}

/// Ask the kernel to start writing `len` bytes at `offset` of `file` to the disk now,
/// without waiting for them. Left alone, the kernel starts only once a tenth of memory is
/// dirty, and the final fsync then waits for gigabytes; started early, the disk works
/// while the rest is compressed. Advisory: an error here shows again at the fsync.
fn start_writeback(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range takes no pointers: only the fd, which `file` keeps open for
    // the duration of the call, a byte range the kernel checks, and a valid flag.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Copy stage: claim a chunk, read it from the device into a free buffer, pass it on.
fn copy_thread(shared: &Shared) {
    while let Some(mut data) = shared.free.pop() {
        let Some(claim) = shared.claim() else {
            return;
        };
        data.resize(claim.len, 0);
        if let Err(e) = claim
            .source
            .read_at(claim.offset, &mut data, &shared.cancel)
        {
            let error = match shared.cancel.check() {
                // The read ended at the cancellation: the transfer's failure says why.
                Err(c) => TransferError::Cancelled { reason: c.0 },
                Ok(()) => TransferError::Source {
                    key: shared.lock().buffers[claim.buffer].key,
                    offset: claim.offset,
                    source: Arc::new(e),
                },
            };
            shared.fail(error);
            return;
        }
        let filled = Filled {
            buffer: claim.buffer,
            chunk: claim.chunk,
            offset: claim.offset,
            data,
        };
        if shared.filled.push(filled).is_err() {
            return;
        }
    }
}

/// Pack stage: zero check, compress, checksum, append to this thread's data file.
/// Returns the file, or `None` if writing it failed (the error is recorded).
fn pack_thread(
    shared: &Shared,
    mut packer: Packer,
    file_number: u16,
    mut file: File,
    path: PathBuf,
) -> Option<DataFile> {
    let mut size = DATA_HEADER_LEN;
    let mut broken = false;
    while let Some(filled) = shared.filled.pop() {
        if broken || shared.failed() {
            let _ = shared.free.push(filled.data);
            continue;
        }
        let packed = packer.pack(&filled.data);
        let stored_len = packed.stored.len() as u64;
        let entry = ChunkEntry {
            offset: filled.offset,
            raw_len: filled.data.len() as u32,
            stored_len: stored_len as u32,
            encoding: packed.encoding,
            file: if packed.encoding == Encoding::Zero {
                0
            } else {
                file_number
            },
            file_offset: if packed.encoding == Encoding::Zero {
                0
            } else {
                size
            },
            stored_xxh3: packed.stored_xxh3,
            raw_xxh3: packed.raw_xxh3,
        };
        if stored_len > 0 {
            if let Err(e) = file.write_all(packed.stored) {
                broken = true;
                shared.fail(TransferError::io("write", &path, e));
                let _ = shared.free.push(filled.data);
                continue;
            }
            start_writeback(&file, size, stored_len);
            size += stored_len;
        }
        let _ = shared.free.push(filled.data);
        shared.record(filled.buffer, filled.chunk, entry);
    }
    (!broken).then_some(DataFile { file, path, size })
}
