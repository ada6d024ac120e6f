//! Restore: `gpu/` in, device buffers out, with optional prefetch into bounded staging.
//!
//! Two kinds of threads share one work list. `jobs` reader threads take chunks from the
//! image: a compressed chunk is decompressed and checked (both checksums); a raw chunk
//! is only located, and read ahead into the page cache when staged. One writer thread
//! per copy queue ([`BufferSink::queue`], a GPU's copy engine) writes chunks to the
//! device in the order they were queued, checking each raw chunk right before writing
//! it: its bytes then pass through the CPU cache once, not twice. A reader takes, in
//! this order:
//!
//! 1. the next unread chunk of a handed-over buffer whose queue has room (at most
//!    [`QUEUE_DEPTH`] chunks read this way wait per queue), and queues it;
//! 2. with prefetch, the next unread chunk (in image order) of a buffer not handed over
//!    yet, if its bytes fit under the staging bound, and stages it;
//!
//! and waits otherwise. When a buffer is handed over, its staged chunks join its queue
//! at once. Readers never wait for the device, and writers never wait for a
//! decompression.
//!
//! The data files are mapped ([`MappedFiles`]): a raw chunk goes from the page cache to
//! the device without a copy in between, and staging it costs no memory of gpucr's own;
//! compressed chunks are decompressed into buffers that are reused. Memory held is at
//! most the staging bound, plus [`QUEUE_DEPTH`] chunks per queue and one per reader.
//!
//! Readers run at a lower CPU priority and writers at a higher one than the rest of the
//! machine (see [`crate::niceness`]). Without prefetch, nothing is read before its
//! buffer is handed over. The first error (a damaged chunk, a failed device write)
//! stops every thread and is returned to every waiter.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::chunk::{check_raw, Unpacked, Unpacker};
use super::config::TransferConfig;
use super::error::{ProblemKind, TransferError};
use super::index::{read_index, Encoding, GpuIndex};
use super::mapped::{Access, MappedFiles};
use super::source::{BufferKey, BufferSink};
use super::staging::Staging;
use super::stats::GpuStats;
use super::{Event, EventSink};
use crate::cancel::Cancel;

/// Chunks read for handed-over buffers (not from staging) that may wait for one queue.
pub const QUEUE_DEPTH: usize = 4;

/// Fills device buffers from an image's `gpu/` directory. See the module documentation.
pub struct Restorer {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    started: Instant,
}

struct Shared {
    index: GpuIndex,
    files: MappedFiles,
    /// The buffer (position in `index.buffers`) of each chunk.
    owner: Vec<usize>,
    by_key: HashMap<BufferKey, usize>,
    prefetch: bool,
    /// At most this many spare decompression buffers are kept.
    spare_max: usize,
    total_bytes: u64,
    chunks_read: AtomicU64,
    /// Zeros for all-zero chunks of buffers that do not start zeroed.
    zeros: OnceLock<Vec<u8>>,
    state: Mutex<State>,
    /// Readers wait here for work.
    work: Condvar,
    /// Writers wait here for queued chunks.
    queued: Condvar,
    /// `wait` and `finish` wait here for buffers to complete.
    done: Condvar,
    /// The writer threads, one per queue, started as queues appear.
    writers: Mutex<Vec<JoinHandle<()>>>,
    on_event: EventSink,
    /// Handed to every write of a sink, cancelled by the first failure (a
    /// [`super::Canceller`]'s too) and when the restore is dropped unfinished: a write
    /// waiting for its device ends then.
    cancel: Cancel,
}

struct State {
    buffers: Vec<Buffer>,
    chunks: Vec<Slot>,
    queues: Vec<Queue>,
    /// Position in `queues` of each queue id seen so far.
    queue_of_id: HashMap<u32, usize>,
    /// Handed-over buffers that may still have unread chunks.
    attached: VecDeque<usize>,
    /// The next chunk to consider for prefetch.
    prefetch_next: usize,
    staging: Staging,
    /// Decompression buffers of chunks already written, for the next compressed chunks:
    /// reusing them spares the allocator's mmap, page faults and zeroing for every chunk.
    spare: Vec<Vec<u8>>,
    done_bytes: u64,
    error: Option<TransferError>,
    shutdown: bool,
}

struct Buffer {
    sink: Option<Arc<dyn BufferSink>>,
    /// Position in `State::queues` of the buffer's queue, once handed over.
    queue: usize,
    /// The next chunk (index position) that may still be unread.
    cursor: usize,
    remaining: u64,
    complete: bool,
}

/// One copy queue: chunks checked and waiting for the device, in order.
#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    /// Chunks read for handed-over buffers that are queued or being read.
    direct: usize,
}

struct Pending {
    chunk: usize,
    data: ChunkData,
    /// Whether its bytes count against the staging bound (else against the queue).
    staged: bool,
}

/// A chunk's raw bytes, ready for the device.
enum ChunkData {
    /// All zeros.
    Zero,
    /// The stored bytes of a raw chunk in the mapped data file, checked by the writer.
    Mapped,
    /// Decompressed bytes.
    Owned(Vec<u8>),
}

enum Slot {
    Unread,
    /// A reader is checking it, or it is queued or being written.
    Busy,
    Staged(ChunkData),
    Done,
}

enum ReadJob {
    /// Check a chunk of a handed-over buffer and queue it.
    Direct(usize),
    /// Check a chunk into staging.
    Prefetch(usize),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, error: TransferError) {
        let mut state = self.lock();
        if state.error.is_none() {
            state.error = Some(error);
        }
        let reason = state.error.as_ref().map(ToString::to_string);
        drop(state);
        self.work.notify_all();
        self.queued.notify_all();
        self.done.notify_all();
        // Without the state's lock: a waker the token runs may take it.
        self.cancel.cancel(reason.unwrap_or_default());
    }

    /// The next chunk to read, waiting for one; `None` when the restore is over or failed.
    fn next_read(&self) -> Option<ReadJob> {
        let mut state = self.lock();
        loop {
            if state.error.is_some() || state.shutdown {
                return None;
            }
            if let Some(c) = self.next_attached(&mut state) {
                return Some(ReadJob::Direct(c));
            }
            if self.prefetch {
                if let Some(c) = self.next_prefetch(&mut state) {
                    return Some(ReadJob::Prefetch(c));
                }
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Claim the next unread chunk of a handed-over buffer whose queue has room.
    fn next_attached(&self, state: &mut State) -> Option<usize> {
        let mut i = 0;
        while i < state.attached.len() {
            let b = state.attached[i];
            let entry = &self.index.buffers[b];
            let end = (entry.first_chunk + entry.chunk_count) as usize;
            let mut c = state.buffers[b].cursor;
            while c < end && !matches!(state.chunks[c], Slot::Unread) {
                c += 1;
            }
            state.buffers[b].cursor = c;
            if c >= end {
                state.attached.remove(i);
                continue;
            }
            let q = state.buffers[b].queue;
            if state.queues[q].direct >= QUEUE_DEPTH {
                i += 1;
                continue;
            }
            state.queues[q].direct += 1;
            state.buffers[b].cursor = c + 1;
            state.chunks[c] = Slot::Busy;
            return Some(c);
        }
        None
    }

    /// Claim the next chunk to stage, if it fits under the staging bound.
    fn next_prefetch(&self, state: &mut State) -> Option<usize> {
        while state.prefetch_next < self.index.chunks.len() {
            let c = state.prefetch_next;
            let entry = &self.index.chunks[c];
            let skip = !matches!(state.chunks[c], Slot::Unread)
                || entry.encoding == Encoding::Zero
                || state.buffers[self.owner[c]].sink.is_some();
            if skip {
                state.prefetch_next += 1;
                continue;
            }
            if !state.staging.try_reserve(u64::from(entry.raw_len)) {
                return None;
            }
            state.prefetch_next += 1;
            state.chunks[c] = Slot::Busy;
            return Some(c);
        }
        None
    }

    /// Take chunk `c` from the data files: a compressed chunk is decompressed and
    /// checked now; a raw chunk is only located (and, when it is `staged` ahead of its
    /// buffer, read ahead into the page cache): its writer checks it right before
    /// writing it, so that its bytes pass through the CPU cache once, not twice.
    fn read_chunk(
        &self,
        unpacker: &mut Unpacker,
        c: usize,
        staged: bool,
    ) -> Result<ChunkData, TransferError> {
        let entry = &self.index.chunks[c];
        if entry.encoding == Encoding::Zero {
            return Ok(ChunkData::Zero);
        }
        self.chunks_read.fetch_add(1, Ordering::Relaxed);
        let stored = self
            .files
            .stored(entry)
            .map_err(|kind| self.damaged(c, kind))?;
        if entry.encoding == Encoding::Raw {
            if staged {
                self.files.will_need(entry);
            }
            return Ok(ChunkData::Mapped);
        }
        let mut out = self.lock().spare.pop().unwrap_or_default();
        match unpacker
            .unpack_stored(stored, entry, &mut out)
            .map_err(|kind| self.damaged(c, kind))?
        {
            Unpacked::Zero => Ok(ChunkData::Zero),
            Unpacked::Stored => Ok(ChunkData::Mapped),
            Unpacked::Decompressed => Ok(ChunkData::Owned(out)),
        }
    }

    /// The error for damaged chunk `c`.
    fn damaged(&self, c: usize, kind: ProblemKind) -> TransferError {
        TransferError::Chunk(Box::new(self.index.problem(c, self.owner[c], kind)))
    }

    /// Put a checked chunk where it belongs: in its buffer's queue if the buffer has been
    /// handed over, else in staging.
    fn place(&self, c: usize, data: ChunkData, staged: bool) {
        let mut state = self.lock();
        let buffer = &state.buffers[self.owner[c]];
        if buffer.sink.is_some() {
            let q = buffer.queue;
            state.queues[q].pending.push_back(Pending {
                chunk: c,
                data,
                staged,
            });
            drop(state);
            self.queued.notify_all();
        } else {
            state.chunks[c] = Slot::Staged(data);
        }
    }

    /// The next chunk for queue `q` to write, waiting for one; `None` when the restore
    /// is over or failed.
    fn next_write(&self, q: usize) -> Option<(Pending, Arc<dyn BufferSink>)> {
        let mut state = self.lock();
        loop {
            if state.error.is_some() || state.shutdown {
                return None;
            }
            if let Some(p) = state.queues[q].pending.pop_front() {
                let sink = state.buffers[self.owner[p.chunk]].sink.as_ref();
                let sink = Arc::clone(sink.expect("queued chunks belong to handed-over buffers"));
                return Some((p, sink));
            }
            state = self.queued.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Write a checked chunk to its device buffer.
    fn write_chunk(&self, sink: &dyn BufferSink, p: &Pending) -> Result<(), TransferError> {
        let entry = &self.index.chunks[p.chunk];
        let cancel = &self.cancel;
        let result = match &p.data {
            ChunkData::Zero if sink.starts_zeroed() => Ok(()),
            ChunkData::Zero => {
                let zeros = self
                    .zeros
                    .get_or_init(|| vec![0; self.index.chunk_size as usize]);
                sink.write_at(entry.offset, &zeros[..entry.raw_len as usize], cancel)
            }
            ChunkData::Mapped => {
                let stored = self
                    .files
                    .stored(entry)
                    .and_then(|stored| check_raw(stored, entry).map(|()| stored))
                    .map_err(|kind| self.damaged(p.chunk, kind))?;
                sink.write_at(entry.offset, stored, cancel)
            }
            ChunkData::Owned(bytes) => sink.write_at(entry.offset, bytes, cancel),
        };
        result.map_err(|e| match cancel.check() {
            // The write ended at the cancellation: the restore's failure says why.
            Err(c) => TransferError::Cancelled { reason: c.0 },
            Ok(()) => TransferError::Sink {
                key: self.index.buffers[self.owner[p.chunk]].key,
                offset: entry.offset,
                source: Arc::new(e),
            },
        })
    }

    /// Mark a chunk of queue `q` written; report progress and a completed buffer.
    fn complete(&self, q: usize, p: Pending) {
        let raw_len = u64::from(self.index.chunks[p.chunk].raw_len);
        let mut state = self.lock();
        state.chunks[p.chunk] = Slot::Done;
        if p.staged {
            state.staging.release(raw_len);
        } else {
            state.queues[q].direct -= 1;
        }
        if let ChunkData::Owned(bytes) = p.data {
            if state.spare.len() < self.spare_max {
                state.spare.push(bytes);
            }
        }
        state.done_bytes += raw_len;
        let b = self.owner[p.chunk];
        let finished = self.chunk_done(&mut state, b);
        let progress = Event::Bytes {
            done: state.done_bytes,
            total: self.total_bytes,
        };
        drop(state);
        // Room in the queue or in staging: readers can go on.
        self.work.notify_all();
        (self.on_event)(progress);
        if finished {
            self.done.notify_all();
            (self.on_event)(Event::BufferDone(self.index.buffers[b].key));
        }
    }

    /// Count one more chunk of buffer `b` done; true when that completed the buffer.
    fn chunk_done(&self, state: &mut State, b: usize) -> bool {
        let buffer = &mut state.buffers[b];
        buffer.remaining -= 1;
        if buffer.remaining == 0 {
            buffer.complete = true;
        }
        buffer.complete
    }
}

fn reader(shared: &Shared) {
    // Staging runs ahead of need: it must not slow CRIU down.
    let _ = crate::niceness::run_in_background();
    let mut unpacker = Unpacker::new();
    while let Some(job) = shared.next_read() {
        let (c, staged) = match job {
            ReadJob::Direct(c) => (c, false),
            ReadJob::Prefetch(c) => (c, true),
        };
        match shared.read_chunk(&mut unpacker, c, staged) {
            Ok(data) => shared.place(c, data, staged),
            Err(e) => {
                shared.fail(e);
                return;
            }
        }
    }
}

fn writer(shared: &Shared, q: usize) {
    // Keeping the copy engine busy comes first: see `niceness::run_as_feeder`.
    let _ = crate::niceness::run_as_feeder();
    while let Some((pending, sink)) = shared.next_write(q) {
        if let Err(e) = shared.write_chunk(&*sink, &pending) {
            shared.fail(e);
            return;
        }
        shared.complete(q, pending);
    }
}

/// Run `body` on a new thread named `name`; a panic in it fails the restore.
fn spawn(
    shared: &Arc<Shared>,
    name: String,
    body: impl FnOnce(&Shared) + Send + 'static,
) -> Result<JoinHandle<()>, TransferError> {
    let shared = Arc::clone(shared);
    thread::Builder::new()
        .name(name)
        .spawn(move || {
            if catch_unwind(AssertUnwindSafe(|| body(&shared))).is_err() {
                shared.fail(TransferError::Thread {
                    what: "a restore thread panicked".into(),
                });
            }
        })
        .map_err(|e| TransferError::Thread {
            what: e.to_string(),
        })
}

impl Restorer {
    /// Open the image in `dir`: validate `gpu/index`, check every data file's header and
    /// size, and start `cfg.jobs` reader threads. With `prefetch`, they start checking
    /// chunks into staging (at most `cfg.max_staging` bytes) at once.
    pub fn open(
        dir: &Path,
        cfg: TransferConfig,
        prefetch: bool,
        on_event: EventSink,
    ) -> Result<Restorer, TransferError> {
        cfg.validate()?;
        let started = Instant::now();
        let index = read_index(dir)?;
        let access = if prefetch {
            Access::Soon
        } else {
            Access::WhenNeeded
        };
        let files = MappedFiles::open(dir, &index, access)?;
        let owner = index.chunk_owners();
        let by_key = index
            .buffers
            .iter()
            .enumerate()
            .map(|(b, e)| (e.key, b))
            .collect();
        let buffers = index
            .buffers
            .iter()
            .map(|e| Buffer {
                sink: None,
                queue: 0,
                cursor: e.first_chunk as usize,
                remaining: e.chunk_count,
                complete: false,
            })
            .collect();
        let chunks = index.chunks.iter().map(|_| Slot::Unread).collect();
        let total_bytes = index.raw_bytes();
        let shared = Arc::new(Shared {
            index,
            files,
            owner,
            by_key,
            prefetch,
            spare_max: 2 * cfg.jobs + QUEUE_DEPTH,
            total_bytes,
            chunks_read: AtomicU64::new(0),
            zeros: OnceLock::new(),
            state: Mutex::new(State {
                buffers,
                chunks,
                queues: Vec::new(),
                queue_of_id: HashMap::new(),
                attached: VecDeque::new(),
                prefetch_next: 0,
                staging: Staging::new(cfg.max_staging),
                spare: Vec::new(),
                done_bytes: 0,
                error: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            queued: Condvar::new(),
            done: Condvar::new(),
            writers: Mutex::new(Vec::new()),
            on_event,
            // Its own token: the restore's failures and its Canceller cancel it.
            cancel: Cancel::new(),
        });
        let mut restorer = Restorer {
            shared: Arc::clone(&shared),
            readers: Vec::with_capacity(cfg.jobs),
            started,
        };
        for n in 0..cfg.jobs {
            let handle = spawn(&shared, format!("gpucr-check-{n}"), reader)?;
            restorer.readers.push(handle);
        }
        Ok(restorer)
    }

    /// Every buffer of the image with its size, sorted by key.
    pub fn buffers(&self) -> Vec<(BufferKey, u64)> {
        self.shared
            .index
            .buffers
            .iter()
            .map(|b| (b.key, b.len))
            .collect()
    }

    /// The image's index.
    pub fn index(&self) -> &GpuIndex {
        &self.shared.index
    }

    /// Hand over the device buffer for `key`; returns at once, the threads fill it.
    /// Fails for a key the image does not hold, a buffer handed over twice, a sink of
    /// the wrong size, or a restore that has already failed (with that failure).
    pub fn attach(&self, key: BufferKey, sink: Box<dyn BufferSink>) -> Result<(), TransferError> {
        let shared = &self.shared;
        let b = *shared
            .by_key
            .get(&key)
            .ok_or(TransferError::UnknownBuffer { key })?;
        let entry = &shared.index.buffers[b];
        if sink.len() != entry.len {
            return Err(TransferError::SinkLength {
                key,
                expected: entry.len,
                actual: sink.len(),
            });
        }
        let mut state = shared.lock();
        if let Some(e) = &state.error {
            return Err(e.clone());
        }
        if state.buffers[b].sink.is_some() {
            return Err(TransferError::AlreadyAttached { key });
        }
        let q = match state.queue_of_id.get(&sink.queue()) {
            Some(&q) => q,
            None => {
                let q = state.queues.len();
                let handle = spawn(shared, format!("gpucr-write-{}", sink.queue()), move |s| {
                    writer(s, q)
                })?;
                shared
                    .writers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(handle);
                state.queues.push(Queue::default());
                state.queue_of_id.insert(sink.queue(), q);
                q
            }
        };
        let zeroed = sink.starts_zeroed();
        state.buffers[b].sink = Some(Arc::from(sink));
        state.buffers[b].queue = q;
        let first = entry.first_chunk as usize;
        let end = first + entry.chunk_count as usize;
        let mut skipped = 0;
        for c in first..end {
            match std::mem::replace(&mut state.chunks[c], Slot::Busy) {
                Slot::Staged(data) => state.queues[q].pending.push_back(Pending {
                    chunk: c,
                    data,
                    staged: true,
                }),
                // A buffer that starts zeroed needs nothing for its zero chunks.
                Slot::Unread if zeroed && shared.index.chunks[c].encoding == Encoding::Zero => {
                    state.chunks[c] = Slot::Done;
                    state.done_bytes += u64::from(shared.index.chunks[c].raw_len);
                    skipped += 1;
                }
                other => state.chunks[c] = other,
            }
        }
        let mut finished = entry.chunk_count == 0;
        for _ in 0..skipped {
            finished = shared.chunk_done(&mut state, b);
        }
        if finished {
            state.buffers[b].complete = true;
        } else {
            state.attached.push_back(b);
        }
        let progress = Event::Bytes {
            done: state.done_bytes,
            total: shared.total_bytes,
        };
        drop(state);
        shared.queued.notify_all();
        shared.work.notify_all();
        if skipped > 0 {
            (shared.on_event)(progress);
        }
        if finished {
            shared.done.notify_all();
            (shared.on_event)(Event::BufferDone(key));
        }
        Ok(())
    }

    /// Block until every buffer in `keys` is completely written, or the restore fails
    /// (then the error names the damaged chunk or the failed write). Waiting for a
    /// buffer that is not handed over yet waits for that too.
    pub fn wait(&self, keys: &[BufferKey]) -> Result<(), TransferError> {
        self.wait_unless(keys, &AtomicBool::new(false)).map(drop)
    }

    /// [`Restorer::wait`], given up when `cancel` is: the wait ends at once then (the
    /// cancellation notifies the restore's condition variable) with
    /// [`TransferError::Cancelled`]; the restore itself goes on.
    pub fn wait_or_cancel(
        &self,
        keys: &[BufferKey],
        cancel: &crate::cancel::Cancel,
    ) -> Result<(), TransferError> {
        let given_up = Arc::new(AtomicBool::new(false));
        {
            let (given_up, shared) = (given_up.clone(), self.shared.clone());
            cancel.on_cancel(move || {
                given_up.store(true, Ordering::SeqCst);
                let _state = shared.lock();
                shared.done.notify_all();
            });
        }
        if self.wait_unless(keys, &given_up)? {
            return Ok(());
        }
        // The reason is read without the restore's lock held.
        let reason = cancel.check().err().map_or_else(String::new, |c| c.0);
        Err(TransferError::Cancelled { reason })
    }

    /// The wait of [`Restorer::wait`], ended early (Ok(false)) once `given_up` is set
    /// and the condition variable notified; Ok(true) when every buffer is written.
    fn wait_unless(
        &self,
        keys: &[BufferKey],
        given_up: &AtomicBool,
    ) -> Result<bool, TransferError> {
        let shared = &self.shared;
        let ids = keys
            .iter()
            .map(|&key| {
                shared
                    .by_key
                    .get(&key)
                    .copied()
                    .ok_or(TransferError::UnknownBuffer { key })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut state = shared.lock();
        loop {
            if let Some(e) = &state.error {
                return Err(e.clone());
            }
            if ids.iter().all(|&b| state.buffers[b].complete) {
                return Ok(true);
            }
            if given_up.load(Ordering::SeqCst) {
                return Ok(false);
            }
            state = shared.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A handle that cancels this restore from another thread.
    pub fn canceller(&self) -> super::Canceller {
        let shared = self.shared.clone();
        super::Canceller::new(move |error| shared.fail(error))
    }

    /// Bytes of staging held (or reserved) right now.
    pub fn staging_bytes(&self) -> u64 {
        self.shared.lock().staging.used()
    }

    /// The most bytes staging ever held at once.
    pub fn staging_peak(&self) -> u64 {
        self.shared.lock().staging.peak()
    }

    /// Chunks read from the data files so far (zero chunks are never read).
    pub fn chunks_read(&self) -> u64 {
        self.shared.chunks_read.load(Ordering::Relaxed)
    }

    /// Wait for every handed-over buffer, stop the threads, and return the totals. Fails
    /// with the restore's first error, or if some buffers were never handed over.
    pub fn finish(self) -> Result<GpuStats, TransferError> {
        self.finish_with(true)
    }

    /// Like [`Restorer::finish`], for a restore of some of the image's buffers only
    /// (device memory written back to the tasks of a dump that lives on, whose other
    /// tasks still have theirs): buffers never handed over are no error.
    pub fn finish_attached(self) -> Result<GpuStats, TransferError> {
        self.finish_with(false)
    }

    fn finish_with(mut self, every_buffer: bool) -> Result<GpuStats, TransferError> {
        let shared = Arc::clone(&self.shared);
        let mut state = shared.lock();
        while state.error.is_none()
            && state
                .buffers
                .iter()
                .any(|b| b.sink.is_some() && !b.complete)
        {
            state = shared.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let unattached: Vec<BufferKey> = state
            .buffers
            .iter()
            .zip(&shared.index.buffers)
            .filter(|(b, _)| b.sink.is_none())
            .map(|(_, e)| e.key)
            .collect();
        drop(state);
        self.stop();
        if let Some(e) = &shared.lock().error {
            return Err(e.clone());
        }
        if every_buffer && !unattached.is_empty() {
            return Err(TransferError::NotAttached { keys: unattached });
        }
        Ok(GpuStats::of_index(
            &shared.index,
            self.started.elapsed().as_secs_f64(),
        ))
    }

    fn stop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        self.shared.queued.notify_all();
        self.shared.done.notify_all();
        let writers = std::mem::take(
            &mut *self
                .shared
                .writers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let mut panicked = false;
        for handle in self.readers.drain(..).chain(writers) {
            panicked |= handle.join().is_err();
        }
        if panicked {
            self.shared.fail(TransferError::Thread {
                what: "a restore thread panicked".into(),
            });
        }
    }
}

impl Drop for Restorer {
    /// A restore dropped unfinished stops its threads; a write still waiting for its
    /// device ends at once (after [`Restorer::finish`] every thread is joined already).
    fn drop(&mut self) {
        self.shared.cancel.cancel("the restore was abandoned");
        self.stop();
    }
}
