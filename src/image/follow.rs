//! Hash image files while CRIU is still writing them.
//!
//! CRIU writes `pages-N.img` sequentially, from start to end. A [`Follower`] thread
//! watches the image directory and hashes every complete 4 MiB block as soon as it lands,
//! so when CRIU finishes only each file's tail is left to hash. While a file grows the
//! follower looks again every millisecond, staying a block or two behind CRIU, and being
//! told to stop wakes it at once: against looking every 10 ms and sleeping out the last
//! wait, that took 10-40 ms off a 1 GiB dump on 2 cores (docs/benchmarks.md). Should
//! CRIU ever rewrite a block already hashed, the file's checksum would not match on
//! restore and the image would be refused: a wrong assumption here cannot pass bad data,
//! only fail safe.
//!
//! A complete block is hashed through a mapping of it, not copied out with `pread`
//! first: on 2 cores the follower competes with CRIU for the CPU, and the copy was most
//! of its cost (a median 10-20 ms off a 1 GiB dump, docs/benchmarks.md). CRIU only ever
//! appends to a pages file, and `gpucr dump` holds the image directory's lock
//! (`dir::prepare_for_dump`), so no second dump truncates a file under the mapping.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::checksum::{hash_block_mapped, BLOCK_SIZE};

/// How long the follower sleeps when no new block has landed while CRIU is writing
/// memory pages: the next block lands within milliseconds.
const POLL_WRITING: Duration = Duration::from_millis(1);
/// How long the follower sleeps once no file has grown for [`WRITING_PAUSE`] (CRIU is
/// freezing the tree, or dumping something other than memory).
const POLL_IDLE: Duration = Duration::from_millis(10);
/// How long no file may grow before the follower takes CRIU to have stopped writing
/// pages: CRIU writes a task's memory in bursts, a batch of its mappings at a time.
const WRITING_PAUSE: Duration = Duration::from_millis(50);

/// Leading block digests per file name.
pub type Prefixes = HashMap<String, Vec<u64>>;

/// A background thread hashing the selected files of a directory as they grow.
#[derive(Debug)]
pub struct Follower {
    stop: Arc<AtomicBool>,
    /// Dropped to wake the thread from its sleep at once when it is told to stop.
    wake: Option<Sender<()>>,
    hashed: Arc<AtomicUsize>,
    handle: Option<JoinHandle<Prefixes>>,
}

struct Followed {
    file: File,
    blocks: Vec<u64>,
    /// The file's size when the follower last looked.
    size: u64,
}

impl Follower {
    /// Follow the files of `dir` whose names satisfy `select`.
    pub fn start(dir: PathBuf, select: fn(&str) -> bool) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let hashed = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), hashed.clone());
        let (wake, woken) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("gpucr-follow".into())
            .spawn(move || follow(&dir, select, &flag, &count, &woken))
            .ok();
        Follower {
            stop,
            wake: Some(wake),
            hashed,
            handle,
        }
    }

    /// How many blocks have been hashed so far, over all files.
    pub fn hashed_blocks(&self) -> usize {
        self.hashed.load(Ordering::SeqCst)
    }

    /// Stop following; returns the complete leading blocks hashed so far per file name
    /// (empty if the thread could not be started).
    pub fn finish(mut self) -> Prefixes {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.take();
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.take();
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
    woken: &Receiver<()>,
) -> Prefixes {
    let mut files: HashMap<String, Followed> = HashMap::new();
    let mut last_growth: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let mut progressed = false;
        let mut grew = false;
        if let Ok(entries) = fs::read_dir(dir) {
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
                            blocks: Vec::new(),
                            size: 0,
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
            let next = followed.blocks.len();
            if (next as u64 + 1) * BLOCK_SIZE > size || stop.load(Ordering::SeqCst) {
                continue;
            }
            match hash_block_mapped(&followed.file, size, next) {
                Ok(digest) => {
                    followed.blocks.push(digest);
                    hashed.fetch_add(1, Ordering::SeqCst);
                    progressed = true;
                }
                // The final pass recomputes whatever the follower could not read.
                Err(_) => continue,
            }
        }
        if grew || progressed {
            last_growth = Some(Instant::now());
        }
        if !progressed {
            let writing = last_growth.is_some_and(|at| at.elapsed() < WRITING_PAUSE);
            // Returns at once when the follower is told to stop (its sender dropped).
            let _ = woken.recv_timeout(if writing { POLL_WRITING } else { POLL_IDLE });
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
}
