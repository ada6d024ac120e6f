//! Hash image files while CRIU is still writing them (engine mode, where gpucr cannot
//! hold CRIU at post-dump to digest the pages from the tree as `gpucr dump` does:
//! `dump::tree_pages`).
//!
//! CRIU writes `pages-N.img` sequentially, from start to end. A [`Follower`] thread
//! watches the image directory and hashes whatever CRIU has appended since it last
//! looked, so when CRIU finishes only each file's tail is left to hash. It sleeps in an
//! inotify wait ([`DirWatch`]) that each of CRIU's writes into a followed file ends, as
//! does a new file or being told to stop. A kernel that does not report what
//! `splice(2)` writes (CRIU's pages) gives no event for the growth: seen to grow
//! unannounced, the follower looks again every 100 µs while the files grow, as it did
//! before it waited on inotify (against looking every 10 ms and sleeping out the last
//! wait, that took 10-40 ms off a 1 GiB dump on 2 cores: docs/benchmarks.md).
//!
//! The follower reads the bytes a fraction of a millisecond after CRIU wrote them
//! (typically 0.5 MiB behind it), while they are still in the CPU's cache, instead of
//! waiting for a whole 4 MiB block to land and reading it back from memory: CRIU's copy
//! of the pages into the file is bound by memory bandwidth, and a follower that reads
//! from memory slows it. In interleaved 1 GiB dumps on 2 cores, CRIU's own
//! `memdump_time` grew 22 ms beside a block-at-a-time follower, 15-30 ms beside one
//! looking every millisecond (1.5-2 MiB behind) and 5-15 ms less than that beside this
//! one.
//!
//! Should CRIU ever rewrite bytes already hashed, the file's checksum would not match on
//! restore and the image would be refused: a wrong assumption here cannot pass bad data,
//! only fail safe.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::checksum::{BlockHasher, BLOCK_SIZE, READ_PIECE};
use crate::wait::dir::{DirWatch, Woken};

/// How long the follower sleeps when nothing new has landed while CRIU is writing
/// memory pages and its writes raise no inotify event: CRIU appends about 0.3 MiB in
/// that time, which the follower then reads from the cache rather than from memory.
const POLL_WRITING: Duration = Duration::from_micros(100);
/// How long the follower sleeps at most otherwise (a change inotify reports ends the
/// sleep at once): the time limit of its waits, after which it looks for what no event
/// reported, and how often it lists the directory without inotify.
const POLL_IDLE: Duration = Duration::from_millis(10);
/// How long no file may grow before the follower takes CRIU to have stopped writing
/// pages: CRIU writes a task's memory in bursts, a batch of its mappings at a time.
const WRITING_PAUSE: Duration = Duration::from_millis(50);

/// How much of a followed file one mapping covers: a whole number of blocks, so that a
/// block never spans two mappings.
const WINDOW: u64 = 16 * BLOCK_SIZE;

/// Leading block digests per file name.
pub type Prefixes = HashMap<String, Vec<u64>>;

/// A background thread hashing the selected files of a directory as they grow.
#[derive(Debug)]
pub struct Follower {
    stop: Arc<AtomicBool>,
    /// Written to wake the thread from its sleep at once when it is told to stop.
    wake: Option<Arc<EventFd>>,
    hashed: Arc<AtomicUsize>,
    handle: Option<JoinHandle<Prefixes>>,
}

struct Followed {
    file: File,
    /// A read-only mapping of [`WINDOW`] bytes of the file from the offset given, which
    /// reaches past its end while CRIU writes it; `None` before the first use.
    window: Option<(u64, Mmap)>,
    /// Set when the file cannot be mapped: its bytes are read into a buffer instead.
    read_only: bool,
    blocks: Vec<u64>,
    /// The file's size when the follower last looked.
    size: u64,
    /// The block being hashed, as far as it has been read.
    hasher: BlockHasher,
    /// Bytes of that block hashed so far.
    in_block: u64,
}

impl Followed {
    /// Hash what CRIU has written since the last look, up to the end of the current
    /// block, one piece at a time; true if there was anything.
    fn catch_up(&mut self, buf: &mut [u8]) -> bool {
        let start = self.blocks.len() as u64 * BLOCK_SIZE;
        let end = self.size.min(start + BLOCK_SIZE);
        let mut progressed = false;
        while start + self.in_block < end {
            let at = start + self.in_block;
            if !self.read_only {
                match self.hash_mapped(at, end) {
                    Ok(()) => {
                        self.in_block = end - start;
                        progressed = true;
                        continue;
                    }
                    Err(_) => self.read_only = true,
                }
            }
            let want = ((end - at) as usize).min(buf.len());
            match self.file.read_at(&mut buf[..want], at) {
                // The final pass recomputes whatever the follower could not read.
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.hasher.write(&buf[..n]);
                    self.in_block += n as u64;
                    progressed = true;
                }
            }
        }
        if self.in_block == BLOCK_SIZE {
            self.blocks.push(std::mem::take(&mut self.hasher).finish());
            self.in_block = 0;
        }
        progressed
    }

    /// Hash bytes `at..end` of the file (within one block) through the window that maps
    /// them: the bytes CRIU has just written are hashed where they lie in the page
    /// cache, without being copied into a buffer first (about half the CPU of reading
    /// them, which on a machine with few cores is taken from CRIU).
    fn hash_mapped(&mut self, at: u64, end: u64) -> std::io::Result<()> {
        let window_start = at - at % WINDOW;
        if self
            .window
            .as_ref()
            .is_none_or(|(from, _)| *from != window_start)
        {
            self.window = None;
            // SAFETY: a read-only private mapping of a file this thread opened, of which
            // only bytes below the file's size as last seen are read. CRIU appends to a
            // pages image and never truncates it; another process truncating it while
            // it is hashed would raise SIGBUS, as for any mapped file (the restore's
            // `digest_image_files` takes the same stance).
            let map = unsafe {
                MmapOptions::new()
                    .offset(window_start)
                    .len(WINDOW as usize)
                    .map(&self.file)?
            };
            self.window = Some((window_start, map));
        }
        let (_, map) = self.window.as_ref().expect("set above");
        let from = (at - window_start) as usize;
        self.hasher.write(&map[from..from + (end - at) as usize]);
        Ok(())
    }
}

impl Follower {
    /// Follow the files of `dir` whose names satisfy `select`.
    pub fn start(dir: PathBuf, select: fn(&str) -> bool) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let hashed = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), hashed.clone());
        let Ok(wake) = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK) else {
            // No thread then: the final pass hashes the files whole.
            return Follower {
                stop,
                wake: None,
                hashed,
                handle: None,
            };
        };
        let wake = Arc::new(wake);
        let woken = wake.clone();
        let handle = std::thread::Builder::new()
            .name("gpucr-follow".into())
            .spawn(move || {
                // Hashing behind CRIU has slack until CRIU is done: on a machine with
                // few cores it takes the cycles CRIU leaves (see `niceness`).
                let _ = crate::niceness::run_in_background();
                follow(&dir, select, &flag, &count, &woken)
            })
            .ok();
        Follower {
            stop,
            wake: Some(wake),
            hashed,
            handle,
        }
    }

    /// Tell the thread to stop, waking it.
    fn tell_stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(wake) = self.wake.take() {
            let _ = wake.write(1);
        }
    }

    /// How many blocks have been hashed so far, over all files.
    pub fn hashed_blocks(&self) -> usize {
        self.hashed.load(Ordering::SeqCst)
    }

    /// Stop following; returns the complete leading blocks hashed so far per file name
    /// (empty if the thread could not be started).
    pub fn finish(mut self) -> Prefixes {
        self.tell_stop();
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.tell_stop();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

fn follow(
    dir: &std::path::Path,
    select: fn(&str) -> bool,
    stop: &AtomicBool,
    hashed: &AtomicUsize,
    wake: &EventFd,
) -> Prefixes {
    // Made before the first listing, so that no file created after it goes unreported.
    // Without it (no inotify instance left), the follower looks as it did before.
    let watch = DirWatch::new(dir, select).ok();
    let mut files: HashMap<String, Followed> = HashMap::new();
    let mut buf = vec![0u8; READ_PIECE];
    let mut last_growth: Option<Instant> = None;
    let mut last_scan: Option<Instant> = None;
    // Whether CRIU's writes into the followed files raise inotify events (a kernel that
    // does not report splice(2) leaves only creation and closing): until an event says
    // so, and again once a file is seen to have grown while no event came, the follower
    // looks every POLL_WRITING while they grow.
    let mut writes_reported = false;
    // How the last wait ended, if the last round ended in one.
    let mut woken: Option<Woken> = None;
    while !stop.load(Ordering::SeqCst) {
        let mut progressed = false;
        let mut grew = false;
        // The directory is listed when a selected file was created (or events were
        // lost), and otherwise at most every POLL_IDLE when no event came: a new file
        // only appears when CRIU moves on to the next task, and its first bytes wait in
        // the page cache.
        let scan_due = match woken {
            Some(Woken::Changed(c)) => c.created || c.lost,
            _ => last_scan.is_none_or(|at| at.elapsed() >= POLL_IDLE),
        };
        if scan_due {
            last_scan = Some(Instant::now());
        }
        if let Some(entries) = scan_due.then(|| fs::read_dir(dir).ok()).flatten() {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !select(&name) || files.contains_key(&name) {
                    continue;
                }
                if let Ok(file) = gpucr_criu_image::store::open_regular(&entry.path()) {
                    files.insert(
                        name,
                        Followed {
                            file,
                            window: None,
                            read_only: false,
                            blocks: Vec::new(),
                            size: 0,
                            hasher: BlockHasher::default(),
                            in_block: 0,
                        },
                    );
                }
            }
        }
        for followed in files.values_mut() {
            let Ok(size) = followed.file.metadata().map(|m| m.len()) else {
                continue;
            };
            grew |= size != followed.size;
            followed.size = size;
            if stop.load(Ordering::SeqCst) {
                continue;
            }
            let before = followed.blocks.len();
            progressed |= followed.catch_up(&mut buf);
            hashed.fetch_add(followed.blocks.len() - before, Ordering::SeqCst);
        }
        if grew || progressed {
            last_growth = Some(Instant::now());
        }
        if grew && woken == Some(Woken::TimedOut) {
            // A file grew during a wait that no event ended.
            writes_reported = false;
        }
        woken = None;
        if !progressed {
            let writing = last_growth.is_some_and(|at| at.elapsed() < WRITING_PAUSE);
            let limit = if writing && !writes_reported {
                POLL_WRITING
            } else {
                POLL_IDLE
            };
            // Either wait returns at once when the follower is told to stop.
            woken = match &watch {
                Some(watch) => watch.wait(limit, Some(wake.as_fd())).ok(),
                None => {
                    // Without inotify nothing tells of a change: sleep out the limit.
                    let _ = crate::wait::readable([wake.as_fd()], Some(limit));
                    None
                }
            };
            if let Some(Woken::Changed(c)) = woken {
                writes_reported |= c.written;
            }
        }
    }
    files
        .into_iter()
        .map(|(name, f)| (name, f.blocks))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::image::checksum::{digest_file, digest_files_resuming};

    #[test]
    fn follows_a_growing_file_and_resumes_to_the_same_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages-1.img");
        let follower = Follower::start(dir.path().to_path_buf(), |n| n.starts_with("pages-"));
        let mut f = File::create(&path).unwrap();
        let block: Vec<u8> = (0..BLOCK_SIZE as usize).map(|i| (i % 253) as u8).collect();
        for _ in 0..3 {
            f.write_all(&block).unwrap();
        }
        f.write_all(b"tail").unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"not followed").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while follower.hashed_blocks() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let prefixes = follower.finish();
        let known = prefixes.get("pages-1.img").cloned().unwrap_or_default();
        assert_eq!(known.len(), 3, "every full block was hashed while written");
        assert!(!prefixes.contains_key("core-1.img"));
        let resumed = digest_files_resuming(&[path.as_path()], &[known], 1)
            .pop()
            .unwrap()
            .unwrap();
        assert_eq!(resumed, digest_file(&path).unwrap());
    }

    #[test]
    fn blocks_written_in_odd_pieces_hash_as_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages-2.img");
        let follower = Follower::start(dir.path().to_path_buf(), |n| n.starts_with("pages-"));
        let mut f = File::create(&path).unwrap();
        let data: Vec<u8> = (0..3 * BLOCK_SIZE as usize + 12_345)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // Pieces that straddle block boundaries, with pauses so that the follower sees
        // the blocks part-written.
        for piece in data.chunks(777_777) {
            f.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while follower.hashed_blocks() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let known = follower.finish().remove("pages-2.img").unwrap_or_default();
        assert_eq!(known.len(), 3);
        assert_eq!(known, digest_file(&path).unwrap().blocks[..3]);
    }
}
