//! What a task's lazy memory is, from its image: the lazy runs of `pagemap-<pid>.img`,
//! split at the mappings of `mm-<pid>.img` (one UFFDIO_COPY fills one mapping), and the
//! bytes of `pages-<id>.img`, read one checksummed block at a time and checked against
//! the manifest's digest of that block before any byte of it is handed out.
//!
//! The manifest's finest digests are those of the 4 MiB blocks of each file
//! (`image::checksum`): a block is read whole, digested, compared, and only then placed.
//! A pages file recorded by size only (`--no-page-checksums`) is served unchecked, as the
//! eager restore does with it.
//!
//! Blocks are read into a buffer the caller keeps (one per thread: no allocation and no
//! fresh pages per block), and the background stream asks the kernel to read the blocks
//! ahead of it (`read_ahead`), so that a cold page cache is read at the disk's pace while
//! earlier blocks are checked and placed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use gpucr_criu_image::pagemap::{self, PE_LAZY, PE_PRESENT};
use gpucr_criu_image::ImageDir;

use super::error::LazyError;
use super::ranges::{RangeSet, Segment};
use crate::image::checksum::{self, Algorithm, FileDigest, BLOCK_SIZE};
use crate::image::manifest::Manifest;

/// The memory of one task still to be served, from the image.
#[derive(Debug)]
pub struct TaskMemory {
    /// The pages file's name in the image directory.
    pub pages_file: String,
    pub ranges: RangeSet,
}

/// The lazy ranges of task `pid` (as named in the image).
pub fn task_memory(dir: &Path, pid: i32, page_size: u64) -> Result<TaskMemory, LazyError> {
    let image_error = |source| LazyError::Image {
        pid,
        source: Box::new(source),
    };
    let images = ImageDir::new(dir, page_size);
    let pagemap = images.pagemap(pid as u32).map_err(image_error)?;
    let mm = images.mm(pid as u32).map_err(image_error)?;
    let mut vmas: Vec<(u64, u64)> = mm.vmas.iter().map(|v| (v.start, v.end)).collect();
    vmas.sort_unstable();
    let mut ranges = RangeSet::new();
    for run in pagemap.runs() {
        if run.flags & PE_LAZY == 0 {
            continue;
        }
        let offset = match (run.flags & PE_PRESENT != 0, run.file_offset) {
            (true, Some(offset)) => offset,
            _ => {
                return Err(LazyError::Unverifiable {
                    pid,
                    file: pagemap.path().to_path_buf(),
                    reason: format!(
                        "lazy pages at {:#x} are not in the image (dumped for a page server?)",
                        run.vaddr
                    ),
                })
            }
        };
        let end = run.vaddr + run.nr_pages * page_size;
        let mut start = run.vaddr;
        for &(lo, hi) in vmas.iter().filter(|(lo, hi)| *hi > run.vaddr && *lo < end) {
            let s = start.max(lo);
            let e = end.min(hi);
            if e > s {
                ranges.insert(Segment {
                    start: s,
                    end: e,
                    offset: offset + (s - run.vaddr),
                });
                start = e;
            }
        }
    }
    Ok(TaskMemory {
        pages_file: pagemap.pages_file_name(),
        ranges,
    })
}

/// The blocks CRIU itself will read (pages not lazy: stacks, shared memory, whatever
/// the dump did not mark lazy), by pages file: the task it belongs to (for errors) and
/// the block indices.
pub fn eager_blocks(
    dir: &Path,
    page_size: u64,
) -> Result<BTreeMap<String, (i32, BTreeSet<u64>)>, LazyError> {
    let images = ImageDir::new(dir, page_size);
    let mut need: BTreeMap<String, (i32, BTreeSet<u64>)> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|source| LazyError::Read {
        pid: 0,
        file: dir.to_path_buf(),
        offset: 0,
        end: 0,
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("pagemap-") || !name.ends_with(".img") {
            continue;
        }
        let pid = pagemap::process_of(&name).map_or(0, |p| p as i32);
        let map = images
            .pagemap_named(&name)
            .map_err(|source| LazyError::Image {
                pid,
                source: Box::new(source),
            })?;
        let (_, blocks) = need
            .entry(map.pages_file_name())
            .or_insert_with(|| (pid, BTreeSet::new()));
        for run in map.runs().iter().filter(|r| r.flags & PE_LAZY == 0) {
            if let (Some(offset), true) = (run.file_offset, run.nr_pages > 0) {
                let end = offset + run.nr_pages * page_size;
                blocks.extend(offset / BLOCK_SIZE..=(end - 1) / BLOCK_SIZE);
            }
        }
    }
    need.retain(|_, (_, blocks)| !blocks.is_empty());
    Ok(need)
}

/// Check, before CRIU starts, every block that holds pages CRIU itself will read
/// ([`eager_blocks`]): the server checks the rest as it places them.
pub fn verify_eager(dir: &Path, manifest: &Manifest, page_size: u64) -> Result<(), LazyError> {
    for (file, (pid, blocks)) in eager_blocks(dir, page_size)? {
        let pages = PagesFile::open(dir, &file, manifest, pid)?;
        let mut buffer = Vec::new();
        for k in blocks {
            pages.read_block(k, pid, &mut buffer)?;
        }
    }
    Ok(())
}

/// The blocks `from..to` to ask for ahead of a reader at block `k` of `blocks`, when
/// those up to `advised` were asked for last: what the window after `k` adds to them;
/// all of it when the reader jumped (past them, or back by more than a window); nothing
/// (`from == to`) for a reader a little behind another.
fn window_ahead(advised: u64, k: u64, blocks: u64) -> (u64, u64) {
    let to = (k + 1 + READ_AHEAD_BLOCKS).min(blocks);
    if advised <= k || advised > to + READ_AHEAD_BLOCKS {
        (k + 1, to)
    } else {
        (advised.min(to), to)
    }
}

/// What the manifest says a pages file's blocks are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    /// One digest per block.
    Blocks(Vec<u64>),
    /// A file of one block: its digest is known through the file's checksum.
    OneBlock(String),
    /// Recorded by size only.
    SizeOnly,
}

/// One pages file, opened, with its expected digests.
#[derive(Debug)]
pub struct PagesFile {
    path: PathBuf,
    file: File,
    size: u64,
    algorithm: Algorithm,
    expected: Expected,
    /// The end (a block index) of the last range asked of the kernel ahead of a reader.
    advised: Mutex<u64>,
}

/// How many blocks past the one it reads the background stream asks the kernel for.
pub const READ_AHEAD_BLOCKS: u64 = 4;

impl PagesFile {
    /// Open `name` of the image in `dir`, for task `pid` (for errors).
    pub fn open(
        dir: &Path,
        name: &str,
        manifest: &Manifest,
        pid: i32,
    ) -> Result<PagesFile, LazyError> {
        let path = dir.join(name);
        let unverifiable = |reason: String| LazyError::Unverifiable {
            pid,
            file: path.clone(),
            reason,
        };
        let algorithm = Algorithm::from_name(&manifest.checksum_algorithm).ok_or_else(|| {
            unverifiable(format!(
                "unknown checksum algorithm {:?}",
                manifest.checksum_algorithm
            ))
        })?;
        let record = manifest
            .files
            .iter()
            .find(|f| f.path == name)
            .ok_or_else(|| unverifiable("not listed in the manifest".into()))?;
        let expected = if record.checksum == checksum::SIZE_ONLY {
            Expected::SizeOnly
        } else if !record.blocks.is_empty() {
            let blocks = record
                .blocks
                .iter()
                .map(|h| u64::from_str_radix(h, 16))
                .collect::<Result<Vec<u64>, _>>()
                .map_err(|_| unverifiable("the manifest's block digests are not hex".into()))?;
            if blocks.len() != checksum::block_count(record.size) {
                return Err(unverifiable(format!(
                    "the manifest has {} block digests for {} bytes",
                    blocks.len(),
                    record.size
                )));
            }
            Expected::Blocks(blocks)
        } else if checksum::block_count(record.size) == 1 {
            Expected::OneBlock(record.checksum.clone())
        } else {
            return Err(unverifiable(
                "the manifest has no block digests of it".into(),
            ));
        };
        let file = File::open(&path).map_err(|source| LazyError::Read {
            pid,
            file: path.clone(),
            offset: 0,
            end: 0,
            source,
        })?;
        let size = file
            .metadata()
            .map_err(|source| LazyError::Read {
                pid,
                file: path.clone(),
                offset: 0,
                end: 0,
                source,
            })?
            .len();
        if size != record.size {
            return Err(LazyError::Damaged {
                pid,
                file: path,
                offset: size.min(record.size),
                end: size.max(record.size),
            });
        }
        Ok(PagesFile {
            path,
            file,
            size,
            algorithm,
            expected,
            advised: Mutex::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its name in the image directory.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// File bytes `lo..hi` of block `k`.
    pub fn block_bounds(&self, k: u64) -> (u64, u64) {
        let lo = k * BLOCK_SIZE;
        (lo, (lo + BLOCK_SIZE).min(self.size))
    }

    /// Ask the kernel to start reading the [`READ_AHEAD_BLOCKS`] blocks after block `k`
    /// (those not asked for yet): they come from the disk while this one is checked and
    /// placed. A reader that jumped back (a fault's block, a task brought in first) has
    /// its window asked for afresh.
    pub fn read_ahead(&self, k: u64) {
        let blocks = checksum::block_count(self.size) as u64;
        let (from, want) = {
            let mut advised = self.advised.lock().unwrap_or_else(|e| e.into_inner());
            let (from, to) = window_ahead(*advised, k, blocks);
            if from < to {
                *advised = to;
            }
            (from, to)
        };
        if from >= want {
            return;
        }
        let (lo, _) = self.block_bounds(from);
        let (_, hi) = self.block_bounds(want - 1);
        // Advice only: a kernel that ignores it reads the blocks when they are read.
        let _ = posix_fadvise(
            &self.file,
            lo as i64,
            (hi - lo) as i64,
            PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        );
    }

    /// Block `k`, read whole into `buffer` (its room kept from block to block) and
    /// checked; `pid` names the task asking (for errors). On an error `buffer` holds
    /// nothing that may be placed.
    pub fn read_block<'b>(
        &self,
        k: u64,
        pid: i32,
        buffer: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], LazyError> {
        let (lo, hi) = self.block_bounds(k);
        // Only the first block of a buffer's life zero-fills it; read_exact_at overwrites
        // every byte of it.
        buffer.resize((hi - lo) as usize, 0);
        let bytes = &mut buffer[..];
        self.file
            .read_exact_at(bytes, lo)
            .map_err(|source| LazyError::Read {
                pid,
                file: self.path.clone(),
                offset: lo,
                end: hi,
                source,
            })?;
        let good = match &self.expected {
            Expected::SizeOnly => true,
            Expected::Blocks(blocks) => {
                blocks.get(k as usize) == Some(&checksum::block_digest(self.algorithm, bytes))
            }
            Expected::OneBlock(sum) => {
                let digest = FileDigest {
                    size: self.size,
                    blocks: vec![checksum::block_digest(self.algorithm, bytes)],
                };
                k == 0 && digest.checksum() == *sum
            }
        };
        if !good {
            return Err(LazyError::Damaged {
                pid,
                file: self.path.clone(),
                offset: lo,
                end: hi,
            });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::manifest::FileRecord;

    fn manifest_for(dir: &Path, name: &str) -> Manifest {
        let digest = checksum::digest_file(&dir.join(name)).unwrap();
        let mut manifest: Manifest = serde_json::from_value(serde_json::json!({
            "format": "gpucr-image", "format_version": 2, "gpucr_version": "t",
            "criu_version": "4.2.1", "created": "now",
            "host": {"hostname": "h", "kernel": "k", "arch": "x86_64"},
            "backend": "none",
            "target": {"pid": 1, "comm": "c", "cmdline": []},
            "options": {"leave_running": false, "tcp_established": false, "shell_job": false,
                        "ext_unix_sk": false, "file_locks": false, "network_lock": "skip"},
            "checksum_algorithm": checksum::ALGORITHM,
            "files": [],
            "timings": {"total_ms": 0.0, "events": []}
        }))
        .unwrap();
        manifest.files.push(FileRecord {
            path: name.into(),
            size: digest.size,
            checksum: digest.checksum(),
            blocks: if digest.blocks.len() > 1 {
                digest.block_hex()
            } else {
                vec![]
            },
        });
        manifest
    }

    #[test]
    fn blocks_are_checked_one_by_one_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes: Vec<u8> = (0..(BLOCK_SIZE as usize * 2 + 8192))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(dir.path().join("pages-1.img"), &bytes).unwrap();
        let manifest = manifest_for(dir.path(), "pages-1.img");
        bytes[BLOCK_SIZE as usize + 7] ^= 1;
        std::fs::write(dir.path().join("pages-1.img"), &bytes).unwrap();
        let pages = PagesFile::open(dir.path(), "pages-1.img", &manifest, 5).unwrap();
        let mut buffer = Vec::new();
        assert_eq!(
            pages.read_block(0, 5, &mut buffer).unwrap(),
            &bytes[..BLOCK_SIZE as usize]
        );
        assert_eq!(
            pages.read_block(2, 5, &mut buffer).unwrap(),
            &bytes[2 * BLOCK_SIZE as usize..]
        );
        // A buffer that held a shorter block reads a whole one again.
        assert_eq!(
            pages.read_block(0, 5, &mut buffer).unwrap(),
            &bytes[..BLOCK_SIZE as usize]
        );
        match pages.read_block(1, 5, &mut buffer) {
            Err(LazyError::Damaged {
                pid: 5,
                offset,
                end,
                file,
            }) => {
                assert_eq!((offset, end), (BLOCK_SIZE, 2 * BLOCK_SIZE));
                assert!(file.ends_with("pages-1.img"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_read_ahead_window_moves_with_the_reader_and_follows_its_jumps() {
        let w = READ_AHEAD_BLOCKS;
        // The first block: the whole window after it.
        assert_eq!(window_ahead(0, 0, 1000), (1, 1 + w));
        // The next block: only the one block the window grew by.
        assert_eq!(window_ahead(1 + w, 1, 1000), (1 + w, 2 + w));
        // A reader a little behind another: nothing to ask for.
        assert_eq!(window_ahead(2 + w, 0, 1000), (1 + w, 1 + w));
        // A jump ahead, past the window: the whole window after the new block.
        assert_eq!(window_ahead(1 + w, 500, 1000), (501, 501 + w));
        // A jump back by more than a window: the whole window after it again.
        assert_eq!(window_ahead(501 + w, 10, 1000), (11, 11 + w));
        // The end of the file bounds it, and nothing is left to ask for at the last block.
        assert_eq!(window_ahead(0, 995, 1000), (996, 1000));
        assert_eq!(window_ahead(1000, 999, 1000), (1000, 1000));
    }

    #[test]
    fn a_one_block_file_is_checked_through_its_checksum() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-2.img"), vec![7u8; 16384]).unwrap();
        let manifest = manifest_for(dir.path(), "pages-2.img");
        let pages = PagesFile::open(dir.path(), "pages-2.img", &manifest, 1).unwrap();
        let mut buffer = Vec::new();
        assert!(pages.read_block(0, 1, &mut buffer).is_ok());
        let mut bad = vec![7u8; 16384];
        bad[100] = 0;
        std::fs::write(dir.path().join("pages-2.img"), bad).unwrap();
        assert!(matches!(
            pages.read_block(0, 1, &mut buffer),
            Err(LazyError::Damaged { .. })
        ));
    }

    #[test]
    fn a_file_of_another_size_or_unlisted_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-3.img"), vec![1u8; 8192]).unwrap();
        let manifest = manifest_for(dir.path(), "pages-3.img");
        std::fs::write(dir.path().join("pages-3.img"), vec![1u8; 4096]).unwrap();
        assert!(matches!(
            PagesFile::open(dir.path(), "pages-3.img", &manifest, 1),
            Err(LazyError::Damaged { .. })
        ));
        assert!(matches!(
            PagesFile::open(dir.path(), "pages-4.img", &manifest, 1),
            Err(LazyError::Unverifiable { .. })
        ));
    }
}
