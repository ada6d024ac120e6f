//! Hash image files while CRIU is still writing them.
//!
//! CRIU writes `pages-N.img` sequentially, from start to end. A [`Follower`] thread
//! watches the image directory and hashes every complete 4 MiB block as soon as it lands
//! (from the page cache, while it is still hot), so when CRIU finishes only each file's
//! tail is left to hash. Should CRIU ever rewrite a block already hashed, the file's
//! checksum would not match on restore and the image would be refused: a wrong
//! assumption here cannot pass bad data, only fail safe.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::checksum::{hash_block, BLOCK_SIZE, READ_PIECE};

/// How long the follower sleeps when no new block has landed.
const POLL: Duration = Duration::from_millis(10);

/// Leading block digests per file name.
pub type Prefixes = HashMap<String, Vec<u64>>;

/// A background thread hashing the selected files of a directory as they grow.
#[derive(Debug)]
pub struct Follower {
    stop: Arc<AtomicBool>,
    hashed: Arc<AtomicUsize>,
    handle: Option<JoinHandle<Prefixes>>,
}

struct Followed {
    file: File,
    blocks: Vec<u64>,
}

impl Follower {
    /// Follow the files of `dir` whose names satisfy `select`.
    pub fn start(dir: PathBuf, select: fn(&str) -> bool) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let hashed = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), hashed.clone());
        let handle = std::thread::Builder::new()
            .name("gpucr-follow".into())
            .spawn(move || follow(&dir, select, &flag, &count))
            .ok();
        Follower {
            stop,
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
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
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
) -> Prefixes {
    let mut files: HashMap<String, Followed> = HashMap::new();
    let mut buf = vec![0u8; READ_PIECE];
    while !stop.load(Ordering::SeqCst) {
        let mut progressed = false;
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !select(&name) || files.contains_key(&name) {
                    continue;
                }
                if let Ok(file) = File::open(entry.path()) {
                    files.insert(
                        name,
                        Followed {
                            file,
                            blocks: Vec::new(),
                        },
                    );
                }
            }
        }
        for followed in files.values_mut() {
            let Ok(size) = followed.file.metadata().map(|m| m.len()) else {
                continue;
            };
            let next = followed.blocks.len();
            if (next as u64 + 1) * BLOCK_SIZE > size || stop.load(Ordering::SeqCst) {
                continue;
            }
            match hash_block(&followed.file, size, next, &mut buf) {
                Ok(digest) => {
                    followed.blocks.push(digest);
                    hashed.fetch_add(1, Ordering::SeqCst);
                    progressed = true;
                }
                // The final pass recomputes whatever the follower could not read.
                Err(_) => continue,
            }
        }
        if !progressed {
            std::thread::sleep(POLL);
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
