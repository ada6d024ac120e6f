//! The receiver's files that arrive in parts: the memory pages and the GPU data, each
//! part a chunk at an offset, on any lane, in any order.
//!
//! Each part is checked against its xxh3 before it is written where it says. A file
//! keeps the ranges it has received, merged as they meet; a part that overlaps one is
//! refused, and so is a file scattered into more than [`MAX_RANGES`] ranges (a peer
//! cannot make the receiver's memory grow). At Whole, the ranges must be exactly
//! `0..size`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::files::{create_confined, FilesError};
use super::link::Link;

/// The most separate ranges one file may have received before its gaps are filled.
pub const MAX_RANGES: usize = 4096;

/// Writes the parts of files beneath a directory the receiver made; shared by the
/// lanes' readers.
#[derive(Debug)]
pub struct PartsWriter {
    root: PathBuf,
    files: Mutex<BTreeMap<String, Arc<PartFile>>>,
    bytes: AtomicU64,
    whole: AtomicU64,
    /// The files made whole, to be put on disk.
    unsynced: Mutex<Vec<(PathBuf, File)>>,
}

/// A file being received in parts: where it is, and the ranges received (start to end).
#[derive(Debug)]
struct PartFile {
    path: PathBuf,
    file: File,
    ranges: Mutex<BTreeMap<u64, u64>>,
}

impl PartsWriter {
    /// A writer into `root`, a fresh directory of the receiver's.
    pub fn new(root: &std::path::Path) -> PartsWriter {
        PartsWriter {
            root: root.to_path_buf(),
            files: Mutex::new(BTreeMap::new()),
            bytes: AtomicU64::new(0),
            whole: AtomicU64::new(0),
            unsynced: Mutex::new(Vec::new()),
        }
    }

    /// The files made whole, and the bytes written, so far.
    pub fn written(&self) -> (u64, u64) {
        (
            self.whole.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    fn files(&self) -> MutexGuard<'_, BTreeMap<String, Arc<PartFile>>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write `data`, which came with `digest`, at `offset` of the file `name` (made at
    /// its first part).
    pub fn write(
        &self,
        name: &str,
        offset: u64,
        digest: u64,
        data: &[u8],
    ) -> Result<(), FilesError> {
        let part = {
            let mut files = self.files();
            match files.get(name) {
                Some(part) => part.clone(),
                None => {
                    let (path, file) = create_confined(&self.root, name)?;
                    let part = Arc::new(PartFile {
                        path,
                        file,
                        ranges: Mutex::new(BTreeMap::new()),
                    });
                    files.insert(name.to_owned(), part.clone());
                    part
                }
            }
        };
        if !Link::chunk_intact(digest, data) {
            return Err(FilesError::Corrupt {
                path: part.path.clone(),
                offset,
            });
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| FilesError::Overlap {
                path: part.path.clone(),
                offset,
            })?;
        part.claim(offset, end)?;
        part.file
            .write_all_at(data, offset)
            .map_err(|source| FilesError::Write {
                path: part.path.clone(),
                source,
            })?;
        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The file `name`, received in parts, is whole at `size` bytes: checked (and put
    /// among the files to put on disk). An empty file has no parts, and is made here.
    pub fn whole(&self, name: &str, size: u64) -> Result<(), FilesError> {
        let part = self.files().remove(name);
        let part = match part {
            Some(part) => part,
            None if size == 0 => {
                create_confined(&self.root, name)?;
                self.whole.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            None => return Err(FilesError::NoParts { path: name.into() }),
        };
        let ranges = part.ranges.lock().unwrap_or_else(|e| e.into_inner());
        let got: u64 = ranges.iter().map(|(start, end)| end - start).sum();
        let complete = ranges.len() == 1 && ranges.get(&0) == Some(&size);
        if !complete {
            return Err(FilesError::WrongSize {
                path: part.path.clone(),
                announced: size,
                got,
            });
        }
        let file = part.file.try_clone().map_err(|source| FilesError::Write {
            path: part.path.clone(),
            source,
        })?;
        self.unsynced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((part.path.clone(), file));
        self.whole.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The files made whole so far, to be put on disk ([`super::files::Unsynced`]).
    pub fn take_unsynced(&self) -> Vec<(PathBuf, File)> {
        std::mem::take(&mut *self.unsynced.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A file some parts of which came but that was never said whole.
    pub fn unfinished(&self) -> Option<String> {
        self.files().keys().next().cloned()
    }
}

impl PartFile {
    /// Record `start..end` as received: refused when it overlaps a range received, or
    /// when the file would hold more than [`MAX_RANGES`] separate ranges.
    fn claim(&self, start: u64, end: u64) -> Result<(), FilesError> {
        let mut ranges = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        let overlap = || FilesError::Overlap {
            path: self.path.clone(),
            offset: start,
        };
        let before = ranges.range(..=start).next_back().map(|(s, e)| (*s, *e));
        let after = ranges.range(start..).next().map(|(s, e)| (*s, *e));
        if before.is_some_and(|(_, e)| e > start) || after.is_some_and(|(s, _)| s < end) {
            return Err(overlap());
        }
        let (mut from, mut to) = (start, end);
        if let Some((s, _)) = before.filter(|(_, e)| *e == start) {
            ranges.remove(&s);
            from = s;
        }
        if let Some((s, e)) = after.filter(|(s, _)| *s == end) {
            ranges.remove(&s);
            to = e;
        }
        if ranges.len() >= MAX_RANGES {
            return Err(FilesError::Scattered {
                path: self.path.clone(),
                most: MAX_RANGES,
            });
        }
        ranges.insert(from, to);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(data: &[u8]) -> u64 {
        twox_hash::XxHash3_64::oneshot(data)
    }

    #[test]
    fn parts_in_any_order_make_the_file_whole() {
        let root = tempfile::tempdir().unwrap();
        let writer = PartsWriter::new(root.path());
        let content: Vec<u8> = (0..100u8).collect();
        for (start, end) in [(60, 100), (0, 20), (40, 60), (20, 40)] {
            let data = &content[start..end];
            writer
                .write("gpu/data-0000", start as u64, digest(data), data)
                .unwrap();
        }
        assert_eq!(writer.unfinished().as_deref(), Some("gpu/data-0000"));
        writer.whole("gpu/data-0000", 100).unwrap();
        writer.whole("pages-9.img", 0).unwrap();
        assert_eq!(writer.unfinished(), None);
        assert_eq!(writer.written(), (2, 100));
        assert_eq!(
            std::fs::read(root.path().join("gpu/data-0000")).unwrap(),
            content
        );
        assert_eq!(std::fs::read(root.path().join("pages-9.img")).unwrap(), b"");
    }

    #[test]
    fn overlaps_gaps_damage_and_escapes_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let writer = PartsWriter::new(root.path());
        writer
            .write("pages-1.img", 10, digest(b"abcd"), b"abcd")
            .unwrap();
        for offset in [8, 12] {
            let err = writer
                .write("pages-1.img", offset, digest(b"abcd"), b"abcd")
                .unwrap_err();
            assert!(matches!(err, FilesError::Overlap { .. }), "{err}");
        }
        let err = writer.write("pages-1.img", 0, 0, b"abcd").unwrap_err();
        assert!(
            matches!(err, FilesError::Corrupt { offset: 0, .. }),
            "{err}"
        );
        let err = writer.whole("pages-1.img", 14).unwrap_err();
        assert!(
            matches!(err, FilesError::WrongSize { got: 4, .. }),
            "a gap at 0..10 passed: {err}"
        );
        let err = writer.whole("pages-2.img", 4).unwrap_err();
        assert!(matches!(err, FilesError::NoParts { .. }), "{err}");
        let err = writer
            .write("../escape", 0, digest(b"x"), b"x")
            .unwrap_err();
        assert!(matches!(err, FilesError::Unconfined { .. }), "{err}");
        assert!(!root.path().join("../escape").exists());
    }

    #[test]
    fn a_file_scattered_past_the_bound_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let writer = PartsWriter::new(root.path());
        let one = digest(b"x");
        for k in 0..MAX_RANGES as u64 {
            writer.write("pages-1.img", 2 * k, one, b"x").unwrap();
        }
        let err = writer
            .write("pages-1.img", 2 * MAX_RANGES as u64, one, b"x")
            .unwrap_err();
        assert!(matches!(err, FilesError::Scattered { .. }), "{err}");
        // A part that fills a gap merges two ranges into one, and is taken.
        writer.write("pages-1.img", 1, one, b"x").unwrap();
    }
}
