//! End-to-end tests of the engine: dump in-memory buffers into a temporary image, read
//! them back, and damage the image in every way a disk can.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::cancel::Cancel;
use crate::exit_code::ExitCode;

const CS: usize = 64 << 10;

// ---- buffers in memory ----

struct MemSource(Arc<Vec<u8>>);

impl BufferSource for MemSource {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8], _: &Cancel) -> io::Result<()> {
        let start = offset as usize;
        buf.copy_from_slice(&self.0[start..start + buf.len()]);
        Ok(())
    }
}

/// A source whose copy engine fails at one offset.
struct FailingSource {
    len: u64,
    fail_at: u64,
}

impl BufferSource for FailingSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8], _: &Cancel) -> io::Result<()> {
        if offset == self.fail_at {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        buf.fill(7);
        Ok(())
    }
}

#[derive(Clone)]
struct MemSink {
    data: Arc<Mutex<Vec<u8>>>,
    zeroed: bool,
    writes: Arc<AtomicU64>,
    fail: bool,
}

impl MemSink {
    /// A sink full of 0xAA, so that unwritten bytes show.
    fn dirty(len: usize) -> MemSink {
        MemSink {
            data: Arc::new(Mutex::new(vec![0xAA; len])),
            zeroed: false,
            writes: Arc::new(AtomicU64::new(0)),
            fail: false,
        }
    }

    fn zeroed(len: usize) -> MemSink {
        MemSink {
            data: Arc::new(Mutex::new(vec![0; len])),
            zeroed: true,
            ..MemSink::dirty(0)
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }
}

impl BufferSink for MemSink {
    fn len(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn write_at(&self, offset: u64, data: &[u8], _: &Cancel) -> io::Result<()> {
        if self.fail {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn starts_zeroed(&self) -> bool {
        self.zeroed
    }
}

// ---- contents ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &["tensor ", "weight ", "grad ", "0.125 ", "layer\n", "42 "];
    let mut rng = Rng(seed | 1);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(WORDS[(rng.next() % WORDS.len() as u64) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

/// Zeros, random and text chunks in turn, each `piece` bytes.
fn mixed(len: usize, piece: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut k = 0u64;
    while v.len() < len {
        let n = piece.min(len - v.len());
        match k % 3 {
            0 => v.extend(std::iter::repeat_n(0, n)),
            1 => v.extend(random(n, seed + k)),
            _ => v.extend(text(n, seed + k)),
        }
        k += 1;
    }
    v
}

/// Buffers of every shape the brief names: empty, one byte, 4 KiB, around the chunk
/// size, a non-multiple, all zeros, all random, mixed.
fn sample_buffers(big: usize) -> Vec<(BufferKey, Vec<u8>)> {
    vec![
        (BufferKey::new(1, 0), Vec::new()),
        (BufferKey::new(1, 1), vec![9]),
        (BufferKey::new(1, 2), text(4096, 1)),
        (BufferKey::new(1, 3), random(CS - 1, 2)),
        (BufferKey::new(1, 4), vec![0; CS]),
        (BufferKey::new(2, 0), text(CS + 1, 3)),
        (BufferKey::new(2, 1), mixed(7 * CS + 17, CS, 4)),
        (BufferKey::new(3, 7), mixed(big, CS, 5)),
        (BufferKey::new(9, 1), random(3 * CS, 6)),
    ]
}

fn cfg(compression: Compression) -> TransferConfig {
    TransferConfig {
        jobs: 3,
        chunk_size: CS,
        compression,
        max_staging: 1 << 30,
    }
}

type Events = Arc<Mutex<Vec<Event>>>;

fn recorder() -> (Events, EventSink) {
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    (events, Arc::new(move |e| sink.lock().unwrap().push(e)))
}

fn dump(dir: &Path, cfg: TransferConfig, buffers: &[(BufferKey, Vec<u8>)]) -> GpuStats {
    let writer = DumpWriter::start(dir, cfg, no_events()).unwrap();
    for (key, data) in buffers {
        writer
            .add(*key, Box::new(MemSource(Arc::new(data.clone()))))
            .unwrap();
    }
    writer.finish().unwrap()
}

/// Restore every buffer, attaching them in `order`; the sinks' contents.
fn restore(
    dir: &Path,
    cfg: TransferConfig,
    prefetch: bool,
    order: &[BufferKey],
) -> BTreeMap<BufferKey, Vec<u8>> {
    let restorer = Restorer::open(dir, cfg, prefetch, no_events()).unwrap();
    let lens: HashMap<_, _> = restorer.buffers().into_iter().collect();
    let mut sinks = BTreeMap::new();
    for key in order {
        let sink = MemSink::dirty(lens[key] as usize);
        restorer.attach(*key, Box::new(sink.clone())).unwrap();
        sinks.insert(*key, sink);
    }
    restorer.wait(order).unwrap();
    restorer.finish().unwrap();
    sinks.into_iter().map(|(k, s)| (k, s.bytes())).collect()
}

fn keys(buffers: &[(BufferKey, Vec<u8>)]) -> Vec<BufferKey> {
    buffers.iter().map(|(k, _)| *k).collect()
}

fn assert_same(buffers: &[(BufferKey, Vec<u8>)], got: &BTreeMap<BufferKey, Vec<u8>>) {
    assert_eq!(got.len(), buffers.len());
    for (key, data) in buffers {
        let restored = &got[key];
        assert_eq!(restored.len(), data.len(), "length of {key}");
        if let Some(at) = restored.iter().zip(data).position(|(a, b)| a != b) {
            panic!("buffer {key} differs at byte {at}");
        }
    }
}

/// Wait (without asserting anything about time) until `cond` holds.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

fn non_zero_chunks(index: &GpuIndex, from: usize, to: usize) -> u64 {
    index.chunks[from..to]
        .iter()
        .filter(|c| c.encoding != Encoding::Zero)
        .count() as u64
}

// ---- round trips ----

#[test]
fn round_trip_every_compression_with_and_without_prefetch() {
    let buffers = sample_buffers(5 * CS + 3);
    for compression in [
        Compression::None,
        Compression::Zstd(1),
        Compression::Zstd(-5),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let stats = dump(dir.path(), cfg(compression), &buffers);
        assert_eq!(stats.buffers, buffers.len());
        let raw: u64 = buffers.iter().map(|(_, d)| d.len() as u64).sum();
        assert_eq!(stats.raw_bytes, raw);
        assert!(stats.zero_chunks >= 3, "{stats:?}");
        assert!(stats.raw_chunks >= 3, "{stats:?}");
        match compression {
            Compression::None => assert_eq!(stats.compressed_chunks, 0),
            Compression::Zstd(_) => {
                assert!(stats.compressed_chunks >= 3, "{stats:?}");
                assert!(stats.stored_bytes < raw);
            }
        }
        let index = read_index(dir.path()).unwrap();
        assert_eq!(GpuStats::of_index(&index, stats.seconds), stats);
        assert!(verify_image(dir.path(), 2).unwrap().is_empty());
        let order = keys(&buffers);
        for prefetch in [false, true] {
            let got = restore(dir.path(), cfg(compression), prefetch, &order);
            assert_same(&buffers, &got);
        }
    }
}

#[test]
fn round_trip_of_a_64_mib_buffer() {
    let big = mixed(64 << 20, 1 << 20, 11);
    let buffers = vec![(BufferKey::new(5, 5), big)];
    let dir = tempfile::tempdir().unwrap();
    let cfg = TransferConfig {
        chunk_size: 4 << 20,
        ..cfg(Compression::Zstd(1))
    };
    let stats = dump(dir.path(), cfg.clone(), &buffers);
    assert_eq!(
        stats.zero_chunks + stats.raw_chunks + stats.compressed_chunks,
        16
    );
    let got = restore(dir.path(), cfg, true, &keys(&buffers));
    assert_same(&buffers, &got);
}

#[test]
fn events_report_every_byte_and_buffer_once() {
    let buffers = sample_buffers(2 * CS);
    let dir = tempfile::tempdir().unwrap();
    let total: u64 = buffers.iter().map(|(_, d)| d.len() as u64).sum();
    let (events, on_event) = recorder();
    let writer = DumpWriter::start(dir.path(), cfg(Compression::Zstd(1)), on_event).unwrap();
    for (key, data) in &buffers {
        writer
            .add(*key, Box::new(MemSource(Arc::new(data.clone()))))
            .unwrap();
    }
    writer.finish().unwrap();
    check_events(&events.lock().unwrap(), &buffers, total);

    let (events, on_event) = recorder();
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, on_event).unwrap();
    for (key, data) in &buffers {
        restorer
            .attach(*key, Box::new(MemSink::dirty(data.len())))
            .unwrap();
    }
    restorer.finish().unwrap();
    check_events(&events.lock().unwrap(), &buffers, total);
}

fn check_events(events: &[Event], buffers: &[(BufferKey, Vec<u8>)], total: u64) {
    let mut done: Vec<BufferKey> = events
        .iter()
        .filter_map(|e| match e {
            Event::BufferDone(k) => Some(*k),
            _ => None,
        })
        .collect();
    done.sort();
    let mut want = keys(buffers);
    want.sort();
    assert_eq!(done, want);
    let max = events
        .iter()
        .filter_map(|e| match e {
            Event::Bytes { done, total } => {
                assert!(done <= total);
                Some(*done)
            }
            _ => None,
        })
        .max();
    assert_eq!(max, Some(total));
}

#[test]
fn parallel_adds_while_copying() {
    let dir = tempfile::tempdir().unwrap();
    let writer =
        Arc::new(DumpWriter::start(dir.path(), cfg(Compression::Zstd(1)), no_events()).unwrap());
    let all: Vec<(BufferKey, Vec<u8>)> = (0..4u32)
        .flat_map(|t| {
            (0..5u32).map(move |b| {
                (
                    BufferKey::new(t, b),
                    mixed(3 * CS + b as usize * 999, CS / 2, u64::from(t * 10 + b)),
                )
            })
        })
        .collect();
    thread::scope(|s| {
        for t in 0..4u32 {
            let writer = Arc::clone(&writer);
            let mine: Vec<_> = all.iter().filter(|(k, _)| k.task == t).cloned().collect();
            s.spawn(move || {
                for (i, (key, data)) in mine.into_iter().enumerate() {
                    writer
                        .add(key, Box::new(MemSource(Arc::new(data))))
                        .unwrap();
                    if i == 2 {
                        writer.wait_idle().unwrap();
                    }
                }
            });
        }
    });
    let writer = Arc::into_inner(writer).unwrap();
    let stats = writer.finish().unwrap();
    assert_eq!(stats.buffers, 20);
    let got = restore(dir.path(), cfg(Compression::None), true, &keys(&all));
    assert_same(&all, &got);
}

#[test]
fn dumping_again_replaces_the_previous_dump() {
    let dir = tempfile::tempdir().unwrap();
    let first = vec![(BufferKey::new(1, 1), random(5 * CS, 1))];
    dump(
        dir.path(),
        TransferConfig {
            jobs: 4,
            ..cfg(Compression::None)
        },
        &first,
    );
    let second = vec![(BufferKey::new(2, 2), text(2 * CS, 2))];
    dump(
        dir.path(),
        TransferConfig {
            jobs: 1,
            ..cfg(Compression::Zstd(1))
        },
        &second,
    );
    let names: Vec<String> = fs::read_dir(dir.path().join(GPU_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["data-0000", "index"]);
    let got = restore(dir.path(), cfg(Compression::None), true, &keys(&second));
    assert_same(&second, &got);
}

#[test]
fn file_ranges_as_sources_and_sinks() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let data = mixed(10 * CS + 5, CS, 21);
    fs::write(&input, &data).unwrap();
    let image = dir.path().join("image");
    let writer = DumpWriter::start(&image, cfg(Compression::Zstd(1)), no_events()).unwrap();
    let half = data.len() as u64 / 2;
    for (b, (start, len)) in [(0, half), (half, data.len() as u64 - half)]
        .into_iter()
        .enumerate()
    {
        let range = FileRange::new(fs::File::open(&input).unwrap(), start, len);
        writer
            .add(BufferKey::new(1, b as u32), Box::new(range))
            .unwrap();
    }
    writer.finish().unwrap();

    let output = dir.path().join("output");
    let file = fs::File::create(&output).unwrap();
    file.set_len(data.len() as u64).unwrap();
    let restorer = Restorer::open(&image, cfg(Compression::None), true, no_events()).unwrap();
    for (key, len) in restorer.buffers() {
        let start = u64::from(key.buffer) * half;
        let range = FileRange::new(file.try_clone().unwrap(), start, len).starting_zeroed();
        assert_eq!(range.len(), len);
        restorer.attach(key, Box::new(range)).unwrap();
    }
    restorer.finish().unwrap();
    assert!(fs::read(&output).unwrap() == data);

    let short = FileRange::new(fs::File::open(&input).unwrap(), 0, 10);
    let mut buf = [0u8; 11];
    assert!(BufferSource::read_at(&short, 0, &mut buf, &Cancel::new()).is_err());
}

// ---- restore scheduling ----

#[test]
fn without_prefetch_nothing_is_read_before_a_buffer_is_handed_over() {
    let buffers = sample_buffers(4 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), false, no_events()).unwrap();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(restorer.chunks_read(), 0);
    assert_eq!(restorer.staging_peak(), 0);
    let key = BufferKey::new(2, 1);
    let b = restorer
        .buffers()
        .iter()
        .position(|(k, _)| *k == key)
        .unwrap();
    let entry = restorer.index().buffers[b].clone();
    let sink = MemSink::dirty(entry.len as usize);
    restorer.attach(key, Box::new(sink.clone())).unwrap();
    restorer.wait(&[key]).unwrap();
    let first = entry.first_chunk as usize;
    let own = non_zero_chunks(restorer.index(), first, first + entry.chunk_count as usize);
    assert_eq!(restorer.chunks_read(), own);
    assert_eq!(restorer.staging_peak(), 0);
    assert_eq!(
        sink.bytes(),
        buffers.iter().find(|(k, _)| *k == key).unwrap().1
    );
    let e = restorer.finish().unwrap_err();
    assert!(
        matches!(e, TransferError::NotAttached { ref keys } if keys.len() == buffers.len() - 1),
        "{e}"
    );
}

/// A restore of some buffers only (the refill of a dump's tasks whose memory left
/// their GPUs): `finish_attached` accepts what `finish` refuses.
#[test]
fn a_partial_restore_finishes_with_finish_attached() {
    let buffers = sample_buffers(4 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), false, no_events()).unwrap();
    let (key, bytes) = &buffers[0];
    let sink = MemSink::dirty(bytes.len());
    restorer.attach(*key, Box::new(sink.clone())).unwrap();
    restorer.wait(&[*key]).unwrap();
    restorer.finish_attached().unwrap();
    assert_eq!(&sink.bytes(), bytes);
}

#[test]
fn prefetch_stages_everything_before_any_buffer_arrives() {
    let buffers = sample_buffers(6 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, no_events()).unwrap();
    let all = non_zero_chunks(restorer.index(), 0, restorer.index().chunks.len());
    eventually("the prefetch", || restorer.chunks_read() == all);
    assert!(restorer.staging_bytes() > 0);
    // Handed over in reverse image order, each buffer comes from staging.
    let mut order = keys(&buffers);
    order.reverse();
    let mut sinks = Vec::new();
    for key in &order {
        let len = restorer.buffers().iter().find(|(k, _)| k == key).unwrap().1;
        let sink = MemSink::dirty(len as usize);
        restorer.attach(*key, Box::new(sink.clone())).unwrap();
        sinks.push((*key, sink));
    }
    restorer.wait(&order).unwrap();
    assert_eq!(restorer.chunks_read(), all, "a chunk was read twice");
    assert_eq!(restorer.staging_bytes(), 0);
    restorer.finish().unwrap();
    let got = sinks.into_iter().map(|(k, s)| (k, s.bytes())).collect();
    assert_same(&buffers, &got);
}

#[test]
fn staging_bound_holds_and_handed_over_buffers_bypass_a_full_staging() {
    // Random data: every chunk stored raw, all of them CS bytes.
    let buffers: Vec<_> = (0..6u32)
        .map(|b| (BufferKey::new(1, b), random(4 * CS, u64::from(b) + 100)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let bound = 3 * CS as u64;
    let rcfg = TransferConfig {
        max_staging: bound,
        ..cfg(Compression::None)
    };
    let restorer = Restorer::open(dir.path(), rcfg, true, no_events()).unwrap();
    eventually("staging to fill", || restorer.chunks_read() == 3);
    assert_eq!(restorer.staging_bytes(), bound);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(restorer.chunks_read(), 3, "read past the staging bound");
    // The staged chunks belong to the first buffer; the last one must still fill.
    let mut sinks = Vec::new();
    for (key, data) in buffers.iter().rev() {
        let sink = MemSink::dirty(data.len());
        restorer.attach(*key, Box::new(sink.clone())).unwrap();
        restorer.wait(&[*key]).unwrap();
        assert_eq!(&sink.bytes(), data, "{key}");
        assert!(restorer.staging_peak() <= bound);
        sinks.push(sink);
    }
    assert_eq!(restorer.staging_peak(), bound);
    restorer.finish().unwrap();
}

#[test]
fn zero_staging_still_restores() {
    let buffers = sample_buffers(3 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let rcfg = TransferConfig {
        max_staging: 0,
        jobs: 1,
        ..cfg(Compression::None)
    };
    let got = restore(dir.path(), rcfg, true, &keys(&buffers));
    assert_same(&buffers, &got);
}

#[test]
fn zero_chunks_are_written_only_to_buffers_that_need_them() {
    let key = BufferKey::new(4, 4);
    let buffers = vec![(key, vec![0u8; 5 * CS + 1])];
    let dir = tempfile::tempdir().unwrap();
    let stats = dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    assert_eq!(stats.zero_chunks, 6);
    assert_eq!(stats.stored_bytes, 0);

    let got = restore(dir.path(), cfg(Compression::None), true, &[key]);
    assert_same(&buffers, &got);

    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, no_events()).unwrap();
    let sink = MemSink::zeroed(5 * CS + 1);
    restorer.attach(key, Box::new(sink.clone())).unwrap();
    restorer.finish().unwrap();
    assert_eq!(sink.writes.load(Ordering::Relaxed), 0);
}

/// `count` buffers of task `task`, `len` random bytes each.
fn random_buffers(task: u32, count: u32, len: usize) -> Vec<(BufferKey, Vec<u8>)> {
    (0..count)
        .map(|b| {
            let seed = u64::from(task) << 32 | u64::from(b);
            (BufferKey::new(task, b), random(len, seed))
        })
        .collect()
}

/// A sink on a copy queue that records how many writes run at once on each queue, and
/// which nice value the writing thread had; writes wait while `gate` is closed.
#[derive(Clone)]
struct QueueSink {
    inner: MemSink,
    queue: u32,
    busy: Arc<Mutex<HashMap<u32, (usize, usize)>>>,
    nice: Arc<Mutex<Vec<i32>>>,
    gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl QueueSink {
    fn new(len: usize, queue: u32, gate: &Arc<(Mutex<bool>, std::sync::Condvar)>) -> QueueSink {
        QueueSink {
            inner: MemSink::dirty(len),
            queue,
            busy: Arc::default(),
            nice: Arc::default(),
            gate: Arc::clone(gate),
        }
    }
}

impl BufferSink for QueueSink {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn write_at(&self, offset: u64, data: &[u8], _: &Cancel) -> io::Result<()> {
        let (lock, open) = &*self.gate;
        drop(open.wait_while(lock.lock().unwrap(), |o| !*o).unwrap());
        self.nice
            .lock()
            .unwrap()
            .push(crate::niceness::current_nice().unwrap());
        {
            let mut busy = self.busy.lock().unwrap();
            let (now, most) = busy.entry(self.queue).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
        thread::sleep(Duration::from_micros(200));
        let result = self.inner.write_at(offset, data, &Cancel::new());
        self.busy.lock().unwrap().get_mut(&self.queue).unwrap().0 -= 1;
        result
    }
    fn queue(&self) -> u32 {
        self.queue
    }
}

#[test]
fn each_queue_writes_one_chunk_at_a_time_in_its_own_thread() {
    let buffers = random_buffers(1, 6, 6 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, no_events()).unwrap();
    let busy = Arc::new(Mutex::new(HashMap::new()));
    let nice = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new((Mutex::new(true), std::sync::Condvar::new()));
    let mut sinks = Vec::new();
    for (key, data) in &buffers {
        let sink = QueueSink {
            busy: Arc::clone(&busy),
            nice: Arc::clone(&nice),
            ..QueueSink::new(data.len(), key.buffer % 3, &gate)
        };
        restorer.attach(*key, Box::new(sink.clone())).unwrap();
        sinks.push(sink);
    }
    restorer.finish().unwrap();
    for ((key, data), sink) in buffers.iter().zip(&sinks) {
        assert!(sink.inner.bytes() == *data, "buffer {key}");
    }
    let busy = busy.lock().unwrap();
    assert_eq!(busy.len(), 3, "three queues wrote");
    for (queue, (now, most)) in busy.iter() {
        assert_eq!(
            (*now, *most),
            (0, 1),
            "queue {queue} wrote one chunk at a time"
        );
    }
    // Writers feed copy engines: raised priority where the process may raise it
    // (CAP_SYS_NICE), else left as it was.
    let (may_raise, before) = thread::spawn(|| {
        let before = crate::niceness::current_nice().unwrap();
        (crate::niceness::run_as_feeder().is_ok(), before)
    })
    .join()
    .unwrap();
    let want = if may_raise {
        crate::niceness::FEEDER_NICE.min(before)
    } else {
        before
    };
    let nice = nice.lock().unwrap();
    assert!(nice.iter().all(|&n| n == want), "{nice:?}, want {want}");
}

#[test]
fn readers_go_on_checking_while_a_queue_is_stalled() {
    let buffers = random_buffers(2, 4, 4 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::None), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, no_events()).unwrap();
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let (first, data) = &buffers[0];
    let stalled = QueueSink::new(data.len(), 0, &gate);
    restorer.attach(*first, Box::new(stalled.clone())).unwrap();
    // The device does not take a byte, yet every chunk of the image gets checked:
    // those of the attached buffer for its queue, the others into staging.
    let total = restorer.index().chunks.len() as u64;
    eventually("every chunk checked", || restorer.chunks_read() == total);
    let (lock, open) = &*gate;
    *lock.lock().unwrap() = true;
    open.notify_all();
    restorer.wait(&[*first]).unwrap();
    assert!(stalled.inner.bytes() == *data);
    for (key, data) in &buffers[1..] {
        let sink = MemSink::dirty(data.len());
        restorer.attach(*key, Box::new(sink.clone())).unwrap();
        restorer.wait(&[*key]).unwrap();
        assert!(sink.bytes() == *data, "buffer {key}");
    }
    assert_eq!(
        restorer.chunks_read(),
        total,
        "staged chunks are not read again"
    );
    restorer.finish().unwrap();
}

#[test]
fn attach_and_wait_reject_wrong_requests() {
    let buffers = sample_buffers(CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), false, no_events()).unwrap();
    let want: Vec<_> = buffers.iter().map(|(k, d)| (*k, d.len() as u64)).collect();
    assert_eq!(restorer.buffers(), want);
    let unknown = BufferKey::new(77, 0);
    assert!(matches!(
        restorer.attach(unknown, Box::new(MemSink::dirty(1))),
        Err(TransferError::UnknownBuffer { .. })
    ));
    assert!(matches!(
        restorer.wait(&[unknown]),
        Err(TransferError::UnknownBuffer { .. })
    ));
    let key = BufferKey::new(1, 1);
    assert!(matches!(
        restorer.attach(key, Box::new(MemSink::dirty(2))),
        Err(TransferError::SinkLength {
            expected: 1,
            actual: 2,
            ..
        })
    ));
    restorer.attach(key, Box::new(MemSink::dirty(1))).unwrap();
    assert!(matches!(
        restorer.attach(key, Box::new(MemSink::dirty(1))),
        Err(TransferError::AlreadyAttached { .. })
    ));
    restorer.wait(&[key]).unwrap();
}

#[test]
fn a_buffer_added_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let writer = DumpWriter::start(dir.path(), cfg(Compression::None), no_events()).unwrap();
    let key = BufferKey::new(1, 1);
    writer
        .add(key, Box::new(MemSource(Arc::new(vec![1; 10]))))
        .unwrap();
    let e = writer
        .add(key, Box::new(MemSource(Arc::new(vec![1; 10]))))
        .unwrap_err();
    assert!(matches!(e, TransferError::DuplicateBuffer { .. }), "{e}");
    writer.finish().unwrap();
}

// ---- failures ----

#[test]
fn a_failing_copy_engine_fails_the_dump_and_leaves_no_index() {
    let dir = tempfile::tempdir().unwrap();
    let writer = DumpWriter::start(dir.path(), cfg(Compression::Zstd(1)), no_events()).unwrap();
    writer
        .add(
            BufferKey::new(1, 0),
            Box::new(MemSource(Arc::new(random(8 * CS, 3)))),
        )
        .unwrap();
    let bad = BufferKey::new(1, 1);
    let fail_at = 2 * CS as u64;
    writer
        .add(
            bad,
            Box::new(FailingSource {
                len: 6 * CS as u64,
                fail_at,
            }),
        )
        .unwrap();
    let e = writer.wait_idle().unwrap_err();
    match &e {
        TransferError::Source { key, offset, .. } => {
            assert_eq!((*key, *offset), (bad, fail_at));
        }
        other => panic!("unexpected {other}"),
    }
    // The device's memory could not be read: a device failure, not gpucr's.
    assert_eq!(e.exit_code(), crate::exit_code::DEVICE_FAILED);
    let again = writer
        .add(BufferKey::new(2, 0), Box::new(MemSource(Arc::new(vec![1]))))
        .unwrap_err();
    assert!(matches!(again, TransferError::Source { .. }), "{again}");
    assert!(matches!(writer.finish(), Err(TransferError::Source { .. })));
    assert!(!dir.path().join("gpu/index").exists());
    assert!(matches!(
        read_index(dir.path()),
        Err(TransferError::IndexMissing { .. })
    ));
}

#[test]
fn a_failing_device_write_fails_the_restore() {
    let buffers = sample_buffers(2 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), true, no_events()).unwrap();
    let key = BufferKey::new(9, 1);
    let mut sink = MemSink::dirty(3 * CS);
    sink.fail = true;
    restorer.attach(key, Box::new(sink)).unwrap();
    let e = restorer.wait(&[key]).unwrap_err();
    assert!(
        matches!(e, TransferError::Sink { key: k, .. } if k == key),
        "{e}"
    );
    assert!(e.to_string().contains("No space left on device"), "{e}");
    assert!(matches!(restorer.finish(), Err(TransferError::Sink { .. })));
}

/// A device whose every copy waits a minute unless the transfer's token ends it.
struct HungDevice(u64);

impl BufferSource for HungDevice {
    fn len(&self) -> u64 {
        self.0
    }
    fn read_at(&self, _: u64, _: &mut [u8], cancel: &Cancel) -> io::Result<()> {
        cancel.sleep(Duration::from_secs(60))?;
        Ok(())
    }
}

impl BufferSink for HungDevice {
    fn len(&self) -> u64 {
        self.0
    }
    fn write_at(&self, _: u64, _: &[u8], cancel: &Cancel) -> io::Result<()> {
        cancel.sleep(Duration::from_secs(60))?;
        Ok(())
    }
}

/// A read waiting for its device ends at the dump's first failure (another buffer's
/// failed read) and at its Canceller: the transfer's token reaches the sources.
#[test]
fn a_failure_or_a_cancellation_ends_the_reads_waiting_for_their_devices() {
    for cancelled in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let writer = DumpWriter::start(dir.path(), cfg(Compression::None), no_events()).unwrap();
        writer
            .add(BufferKey::new(1, 0), Box::new(HungDevice(CS as u64)))
            .unwrap();
        thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        if cancelled {
            writer.canceller().cancel("SIGINT");
        } else {
            let failing = FailingSource {
                len: CS as u64,
                fail_at: 0,
            };
            writer.add(BufferKey::new(1, 1), Box::new(failing)).unwrap();
        }
        let e = writer.finish().unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{cancelled}: the hung read held the dump for {:?}",
            started.elapsed()
        );
        match (cancelled, &e) {
            (true, TransferError::Cancelled { reason }) => assert_eq!(reason, "SIGINT"),
            (false, TransferError::Source { key, .. }) => assert_eq!(*key, BufferKey::new(1, 1)),
            _ => panic!("{cancelled}: unexpected {e}"),
        }
    }
}

/// A write waiting for its device ends at the restore's Canceller.
#[test]
fn a_cancellation_ends_the_writes_waiting_for_their_devices() {
    let buffers = random_buffers(1, 1, CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::None), &buffers);
    let restorer = Restorer::open(dir.path(), cfg(Compression::None), false, no_events()).unwrap();
    restorer
        .attach(buffers[0].0, Box::new(HungDevice(CS as u64)))
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    restorer.canceller().cancel("SIGTERM");
    let e = restorer.finish().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the hung write held the restore for {:?}",
        started.elapsed()
    );
    assert!(
        matches!(&e, TransferError::Cancelled { reason } if reason == "SIGTERM"),
        "{e}"
    );
}

/// Dump `buffers`, then flip one byte in the middle of the stored bytes of chunk `c`.
fn damage_chunk(dir: &Path, c: usize) -> (GpuIndex, ChunkEntry) {
    let index = read_index(dir).unwrap();
    let entry = index.chunks[c];
    assert_ne!(entry.encoding, Encoding::Zero);
    let path = index.data_path(dir, usize::from(entry.file));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let at = entry.file_offset + u64::from(entry.stored_len) / 2;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
    (index, entry)
}

#[test]
fn a_flipped_byte_aborts_the_restore_and_names_the_chunk() {
    let buffers = sample_buffers(4 * CS);
    for compression in [Compression::None, Compression::Zstd(1)] {
        let dir = tempfile::tempdir().unwrap();
        dump(dir.path(), cfg(compression), &buffers);
        // The second stored chunk of buffer 2/1 (bytes CS..2CS: random).
        let before = read_index(dir.path()).unwrap();
        let b = before
            .buffers
            .iter()
            .position(|e| e.key == BufferKey::new(2, 1))
            .unwrap();
        let c = before.buffers[b].first_chunk as usize + 1;
        let (index, entry) = damage_chunk(dir.path(), c);
        let file = index.files[usize::from(entry.file)].name.clone();
        let want = format!(
            "gpu/{file}: chunk {c} (buffer 2/1, bytes {}..{} of the buffer) at offset {}: checksum mismatch",
            CS,
            2 * CS,
            entry.file_offset
        );

        let problems = verify_image(dir.path(), 3).unwrap();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].to_string(), want);

        for prefetch in [false, true] {
            let restorer =
                Restorer::open(dir.path(), cfg(Compression::None), prefetch, no_events()).unwrap();
            let restorer = Arc::new(restorer);
            // Waiters on other buffers get the same error.
            let waiters: Vec<_> = buffers
                .iter()
                .take(3)
                .map(|(key, _)| {
                    let restorer = Arc::clone(&restorer);
                    let key = *key;
                    thread::spawn(move || restorer.wait(&[key, BufferKey::new(2, 1)]))
                })
                .collect();
            for (key, data) in buffers.iter().rev() {
                match restorer.attach(*key, Box::new(MemSink::dirty(data.len()))) {
                    Ok(()) | Err(TransferError::Chunk(_)) => {}
                    Err(other) => panic!("unexpected {other}"),
                }
            }
            let e = restorer.wait(&keys(&buffers)).unwrap_err();
            assert_eq!(e.to_string(), want);
            assert_eq!(e.exit_code(), crate::exit_code::IMAGE_DAMAGED);
            for w in waiters {
                assert_eq!(w.join().unwrap().unwrap_err().to_string(), want);
            }
            let restorer = Arc::into_inner(restorer).unwrap();
            assert_eq!(restorer.finish().unwrap_err().to_string(), want);
        }
    }
}

#[test]
fn a_truncated_data_file_is_named_at_open() {
    let buffers = sample_buffers(4 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::None), &buffers);
    let index = read_index(dir.path()).unwrap();
    let n = index.files.iter().position(|f| f.size > 1000).unwrap();
    let path = index.data_path(dir.path(), n);
    let size = index.files[n].size;
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(size - 100)
        .unwrap();
    let e = Restorer::open(dir.path(), cfg(Compression::None), true, no_events())
        .err()
        .unwrap();
    let want = format!(
        "{} is damaged at offset {}: the file is {} bytes, the index says {size}",
        path.display(),
        size - 100,
        size - 100
    );
    assert_eq!(e.to_string(), want);
    assert!(e.is_damage());
    assert_eq!(verify_image(dir.path(), 2).unwrap_err().to_string(), want);

    fs::remove_file(&path).unwrap();
    let e = Restorer::open(dir.path(), cfg(Compression::None), true, no_events())
        .err()
        .unwrap();
    assert!(e.to_string().contains(&index.files[n].name), "{e}");
}

#[test]
fn a_damaged_index_is_named_at_open() {
    let buffers = sample_buffers(2 * CS);
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::Zstd(1)), &buffers);
    let path = dir.path().join("gpu/index");
    let mut bytes = fs::read(&path).unwrap();
    bytes[100] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let e = Restorer::open(dir.path(), cfg(Compression::None), true, no_events())
        .err()
        .unwrap();
    assert!(matches!(e, TransferError::Index { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("{} is damaged at offset", path.display())),
        "{e}"
    );
    assert_eq!(e.exit_code(), crate::exit_code::IMAGE_DAMAGED);
    assert!(verify_image(dir.path(), 1).is_err());
}

#[test]
fn a_data_file_with_a_bad_header_is_named() {
    let dir = tempfile::tempdir().unwrap();
    dump(dir.path(), cfg(Compression::None), &sample_buffers(CS));
    let path = dir.path().join("gpu/data-0001");
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"X", 0).unwrap();
    let e = verify_image(dir.path(), 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{} is damaged at offset 0: not a gpucr data file (bad magic)",
            path.display()
        )
    );
}

// ---- property ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Any set of buffers (any sizes, zero runs, random or repetitive bytes), any
    /// number of jobs, any attach order: the restore gives back exactly what was dumped.
    #[test]
    fn any_buffers_round_trip(
        shapes in proptest::collection::vec((0usize..5 * 4096 + 100, 0u8..3), 0..8),
        jobs in 1usize..5,
        zstd in any::<bool>(),
        prefetch in any::<bool>(),
        staging_chunks in 0u64..4,
        seed in any::<u64>(),
    ) {
        let cs = 4096;
        let buffers: Vec<(BufferKey, Vec<u8>)> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(len, kind))| {
                let s = seed.wrapping_add(i as u64);
                let data = match kind {
                    0 => mixed(len, 1500, s),
                    1 => random(len, s),
                    _ => text(len, s),
                };
                (BufferKey::new((s % 3) as u32, i as u32), data)
            })
            .collect();
        let cfg = TransferConfig {
            jobs,
            chunk_size: cs,
            compression: if zstd { Compression::Zstd(1) } else { Compression::None },
            max_staging: staging_chunks * cs as u64,
        };
        let dir = tempfile::tempdir().unwrap();
        dump(dir.path(), cfg.clone(), &buffers);
        prop_assert!(verify_image(dir.path(), jobs).unwrap().is_empty());
        let mut order = keys(&buffers);
        order.sort_by_key(|k| (seed.rotate_left(k.buffer) ^ u64::from(k.task)) & 0xff);
        let got = restore(dir.path(), cfg, prefetch, &order);
        assert_same(&buffers, &got);
    }
}
