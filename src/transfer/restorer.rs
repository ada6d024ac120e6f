//! Restore: `gpu/` in, device buffers out, with optional prefetch into bounded staging.
//!
//! `jobs` worker threads share one work list. Each takes, in this order:
//!
//! 1. a staged chunk whose buffer has been handed over: write it to the device;
//! 2. an unread chunk of a handed-over buffer: read, verify, decompress, write it to the
//!    device directly (no staging, so handed-over buffers always make progress);
//! 3. with prefetch, the next unread chunk (in image order) of a buffer not handed over
//!    yet, if its bytes fit under the staging bound: read, verify, decompress, stage.
//!
//! A worker with nothing to do waits. Without prefetch, rule 3 never applies, so
//! nothing is read before a buffer is handed over. The first error (a damaged chunk, a
//! failed device write) stops every worker and is returned to every waiter.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::chunk::Unpacker;
use super::config::TransferConfig;
use super::error::TransferError;
use super::format::check_data_file;
use super::index::{read_index, Encoding, GpuIndex};
use super::source::{BufferKey, BufferSink};
use super::staging::Staging;
use super::stats::GpuStats;
use super::{Event, EventSink};

/// Fills device buffers from an image's `gpu/` directory. See the module documentation.
pub struct Restorer {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    started: Instant,
}

struct Shared {
    index: GpuIndex,
    files: Vec<File>,
    /// The buffer (position in `index.buffers`) of each chunk.
    owner: Vec<usize>,
    by_key: HashMap<BufferKey, usize>,
    prefetch: bool,
    /// At most this many spare staging buffers are kept.
    spare_max: usize,
    total_bytes: u64,
    /// Zeros for all-zero chunks of buffers that do not start zeroed.
    zeros: OnceLock<Vec<u8>>,
    state: Mutex<State>,
    /// Workers wait here for work.
    work: Condvar,
    /// `wait` and `finish` wait here for buffers to complete.
    done: Condvar,
    on_event: EventSink,
}

struct State {
    buffers: Vec<Buffer>,
    chunks: Vec<Slot>,
    /// Staged chunks whose buffer has been handed over.
    ready: VecDeque<usize>,
    /// Handed-over buffers that may still have unread chunks.
    attached: VecDeque<usize>,
    /// The next chunk to consider for prefetch.
    prefetch_next: usize,
    staging: Staging,
    /// Staging memory of chunks already written, for the next chunks to stage: reusing
    /// it spares the allocator's mmap, page faults and zeroing for every chunk.
    spare: Vec<Vec<u8>>,
    done_bytes: u64,
    chunks_read: u64,
    error: Option<TransferError>,
    shutdown: bool,
}

struct Buffer {
    sink: Option<Arc<dyn BufferSink>>,
    /// The next chunk (index position) that may still be unread.
    cursor: usize,
    remaining: u64,
    complete: bool,
}

enum Slot {
    Unread,
    /// A worker is reading, writing or staging it.
    Busy,
    Staged(Vec<u8>),
    Done,
}

enum Job {
    /// Write a staged chunk to its buffer.
    Staged(usize, Vec<u8>, Arc<dyn BufferSink>),
    /// Read a chunk and write it to its buffer.
    Direct(usize, Arc<dyn BufferSink>),
    /// Read a chunk into staging.
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
        drop(state);
        self.work.notify_all();
        self.done.notify_all();
    }

    /// The next job, waiting for one; `None` when the restore is over or failed.
    fn next_job(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.error.is_some() || state.shutdown {
                return None;
            }
            if let Some(c) = state.ready.pop_front() {
                let slot = std::mem::replace(&mut state.chunks[c], Slot::Busy);
                let Slot::Staged(data) = slot else {
                    unreachable!("only staged chunks are ready");
                };
                let sink = self.sink_of(&state, c);
                return Some(Job::Staged(c, data, sink));
            }
            if let Some(job) = self.next_attached(&mut state) {
                return Some(job);
            }
            if self.prefetch {
                if let Some(c) = self.next_prefetch(&mut state) {
                    return Some(Job::Prefetch(c));
                }
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn sink_of(&self, state: &State, c: usize) -> Arc<dyn BufferSink> {
        let sink = state.buffers[self.owner[c]].sink.as_ref();
        Arc::clone(sink.expect("the chunk's buffer is handed over"))
    }

    /// Claim the next unread chunk of a handed-over buffer.
    fn next_attached(&self, state: &mut State) -> Option<Job> {
        while let Some(&b) = state.attached.front() {
            let entry = &self.index.buffers[b];
            let end = (entry.first_chunk + entry.chunk_count) as usize;
            let mut c = state.buffers[b].cursor;
            while c < end && !matches!(state.chunks[c], Slot::Unread) {
                c += 1;
            }
            state.buffers[b].cursor = c + 1;
            if c >= end {
                state.attached.pop_front();
                continue;
            }
            state.chunks[c] = Slot::Busy;
            return Some(Job::Direct(c, self.sink_of(state, c)));
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

    /// Mark chunk `c` written, directly or from `staged` memory (kept for reuse);
    /// report progress and a completed buffer.
    fn complete(&self, c: usize, staged: Option<Vec<u8>>) {
        let raw_len = u64::from(self.index.chunks[c].raw_len);
        let mut state = self.lock();
        state.chunks[c] = Slot::Done;
        let staged = match staged {
            Some(data) => {
                state.staging.release(raw_len);
                if state.spare.len() < self.spare_max {
                    state.spare.push(data);
                }
                true
            }
            None => false,
        };
        state.done_bytes += raw_len;
        let b = self.owner[c];
        let buffer = &mut state.buffers[b];
        buffer.remaining -= 1;
        let finished = buffer.remaining == 0;
        if finished {
            buffer.complete = true;
        }
        let progress = Event::Bytes {
            done: state.done_bytes,
            total: self.total_bytes,
        };
        drop(state);
        if staged {
            // Room in staging: prefetch can go on.
            self.work.notify_all();
        }
        (self.on_event)(progress);
        if finished {
            self.done.notify_all();
            (self.on_event)(Event::BufferDone(self.index.buffers[b].key));
        }
    }

    /// Read, verify and decompress chunk `c` into `out`.
    fn read_chunk(
        &self,
        unpacker: &mut Unpacker,
        c: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), TransferError> {
        let entry = &self.index.chunks[c];
        if entry.encoding != Encoding::Zero {
            self.lock().chunks_read += 1;
        }
        let file = &self.files[usize::from(entry.file)];
        unpacker.unpack(file, entry, out).map_err(|kind| {
            TransferError::Chunk(Box::new(self.index.problem(c, self.owner[c], kind)))
        })
    }

    /// Write chunk `c`'s bytes to its device buffer.
    fn write_chunk(
        &self,
        c: usize,
        sink: &dyn BufferSink,
        data: &[u8],
    ) -> Result<(), TransferError> {
        let offset = self.index.chunks[c].offset;
        sink.write_at(offset, data)
            .map_err(|e| TransferError::Sink {
                key: self.index.buffers[self.owner[c]].key,
                offset,
                source: Arc::new(e),
            })
    }

    /// Write chunk `c` to its device buffer: zeros without reading, or its bytes.
    fn direct(
        &self,
        unpacker: &mut Unpacker,
        c: usize,
        sink: &dyn BufferSink,
        scratch: &mut Vec<u8>,
    ) -> Result<(), TransferError> {
        let entry = &self.index.chunks[c];
        if entry.encoding == Encoding::Zero {
            if !sink.starts_zeroed() {
                let zeros = self
                    .zeros
                    .get_or_init(|| vec![0; self.index.chunk_size as usize]);
                self.write_chunk(c, sink, &zeros[..entry.raw_len as usize])?;
            }
            return Ok(());
        }
        self.read_chunk(unpacker, c, scratch)?;
        self.write_chunk(c, sink, scratch)
    }

    /// Read chunk `c` into staging; hand it on at once if its buffer arrived meanwhile.
    fn stage(&self, unpacker: &mut Unpacker, c: usize) -> Result<(), TransferError> {
        let mut data = self.lock().spare.pop().unwrap_or_default();
        self.read_chunk(unpacker, c, &mut data)?;
        let mut state = self.lock();
        state.chunks[c] = Slot::Staged(data);
        if state.buffers[self.owner[c]].sink.is_some() {
            state.ready.push_back(c);
            drop(state);
            self.work.notify_one();
        }
        Ok(())
    }
}

fn worker(shared: &Shared) {
    let mut unpacker = Unpacker::new();
    let mut scratch = Vec::new();
    while let Some(job) = shared.next_job() {
        let result = match job {
            Job::Staged(c, data, sink) => shared
                .write_chunk(c, &*sink, &data)
                .map(|()| shared.complete(c, Some(data))),
            Job::Direct(c, sink) => shared
                .direct(&mut unpacker, c, &*sink, &mut scratch)
                .map(|()| shared.complete(c, None)),
            Job::Prefetch(c) => shared.stage(&mut unpacker, c),
        };
        if let Err(e) = result {
            shared.fail(e);
            return;
        }
    }
}

impl Restorer {
    /// Open the image in `dir`: validate `gpu/index`, check every data file's header and
    /// size, and start `cfg.jobs` workers. With `prefetch`, they start reading into
    /// staging (at most `cfg.max_staging` bytes) at once.
    pub fn open(
        dir: &Path,
        cfg: TransferConfig,
        prefetch: bool,
        on_event: EventSink,
    ) -> Result<Restorer, TransferError> {
        cfg.validate()?;
        let started = Instant::now();
        let index = read_index(dir)?;
        let mut files = Vec::with_capacity(index.files.len());
        for n in 0..index.files.len() {
            let path = index.data_path(dir, n);
            let file = File::open(&path).map_err(|e| TransferError::io("open", &path, e))?;
            check_data_file(&file, &path, n, index.files[n].size)?;
            files.push(file);
        }
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
            spare_max: 2 * cfg.jobs,
            total_bytes,
            zeros: OnceLock::new(),
            state: Mutex::new(State {
                buffers,
                chunks,
                ready: VecDeque::new(),
                attached: VecDeque::new(),
                prefetch_next: 0,
                staging: Staging::new(cfg.max_staging),
                spare: Vec::new(),
                done_bytes: 0,
                chunks_read: 0,
                error: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            on_event,
        });
        let mut restorer = Restorer {
            shared: Arc::clone(&shared),
            workers: Vec::with_capacity(cfg.jobs),
            started,
        };
        for n in 0..cfg.jobs {
            let shared = Arc::clone(&shared);
            let handle = thread::Builder::new()
                .name(format!("gpucr-restore-{n}"))
                .spawn(move || {
                    if catch_unwind(AssertUnwindSafe(|| worker(&shared))).is_err() {
                        shared.fail(TransferError::Thread {
                            what: "a restore thread panicked".into(),
                        });
                    }
                })
                .map_err(|e| TransferError::Thread {
                    what: e.to_string(),
                })?;
            restorer.workers.push(handle);
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

    /// Hand over the device buffer for `key`; returns at once, the workers fill it.
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
        state.buffers[b].sink = Some(Arc::from(sink));
        let first = entry.first_chunk as usize;
        let end = first + entry.chunk_count as usize;
        for c in first..end {
            if matches!(state.chunks[c], Slot::Staged(_)) {
                state.ready.push_back(c);
            }
        }
        let empty = entry.chunk_count == 0;
        if empty {
            state.buffers[b].complete = true;
        } else {
            state.attached.push_back(b);
        }
        drop(state);
        shared.work.notify_all();
        if empty {
            shared.done.notify_all();
            (shared.on_event)(Event::BufferDone(key));
        }
        Ok(())
    }

    /// Block until every buffer in `keys` is completely written, or the restore fails
    /// (then the error names the damaged chunk or the failed write). Waiting for a
    /// buffer that is not handed over yet waits for that too.
    pub fn wait(&self, keys: &[BufferKey]) -> Result<(), TransferError> {
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
                return Ok(());
            }
            state = shared.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Bytes of staging memory held (or reserved) right now.
    pub fn staging_bytes(&self) -> u64 {
        self.shared.lock().staging.used()
    }

    /// The most bytes staging ever held at once.
    pub fn staging_peak(&self) -> u64 {
        self.shared.lock().staging.peak()
    }

    /// Chunks read from the data files so far (zero chunks are never read).
    pub fn chunks_read(&self) -> u64 {
        self.shared.lock().chunks_read
    }

    /// Wait for every handed-over buffer, stop the workers, and return the totals. Fails
    /// with the restore's first error, or if some buffers were never handed over.
    pub fn finish(mut self) -> Result<GpuStats, TransferError> {
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
        if !unattached.is_empty() {
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
        self.shared.done.notify_all();
        let mut panicked = false;
        for handle in self.workers.drain(..) {
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
    fn drop(&mut self) {
        self.stop();
    }
}
