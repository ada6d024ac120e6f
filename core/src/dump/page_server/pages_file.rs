//! One pages file as the page server writes it: each piece CRIU sends is compared
//! with the stopped tree's memory at its address, and written only where the tree
//! cannot give the same bytes back.

use std::fs::{File, OpenOptions};
use std::io::IoSliceMut;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use super::PageServerError;
use crate::dump::page_digests::InTree;
use crate::image::checksum::{piece_digest, BLOCK_SIZE, PAGE_PIECE};

/// Where a pages file's pieces may come from instead of the disk: a process of the
/// stopped tree, and the ranges of its memory whose bytes stay as CRIU dumped them
/// while it stays stopped (private, readable, not executable: CRIU pokes its system
/// calls into an executable page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TreeSource {
    /// This machine's pid.
    pub pid: i32,
    /// Sorted, not overlapping.
    pub stable: Vec<(u64, u64)>,
}

impl TreeSource {
    fn holds(&self, addr: u64) -> bool {
        let end = addr + PAGE_PIECE as u64;
        let i = self.stable.partition_point(|&(start, _)| start <= addr);
        i > 0 && self.stable[i - 1].1 >= end
    }
}

/// A pages file being written.
#[derive(Debug)]
pub(super) struct PagesFile {
    name: String,
    path: PathBuf,
    file: File,
    tree: Option<TreeSource>,
    /// Bytes CRIU has sent for it.
    len: u64,
    /// The digest of every piece CRIU sent, in file order.
    digests: Vec<u64>,
    /// The pieces of the unfinished last block left to the tree, with their bytes:
    /// they are written should the file end inside that block (the final pass reads
    /// a file's last partial block from the disk).
    pending: Vec<(u64, u64)>,
    pending_bytes: Vec<u8>,
    /// The pieces of finished blocks left to the tree.
    in_tree: InTree,
    /// Bytes written to the disk.
    written: u64,
    /// The tree's bytes, read for comparison.
    tree_buf: Vec<u8>,
}

/// A pages file CRIU has finished.
#[derive(Debug)]
pub(super) struct Closed {
    pub name: String,
    pub path: PathBuf,
    pub len: u64,
    pub digests: Vec<u64>,
    /// Its pieces left to the tree (`pid` 0 when it has no tree source).
    pub in_tree: InTree,
    pub written: u64,
}

impl PagesFile {
    /// Create `name` in `dir` (it must not exist), taking what it can from `tree`.
    pub fn create(
        dir: &Path,
        name: String,
        tree: Option<TreeSource>,
    ) -> Result<PagesFile, PageServerError> {
        let path = dir.join(&name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| PageServerError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(PagesFile {
            name,
            path,
            file,
            in_tree: InTree {
                pid: tree.as_ref().map_or(0, |t| t.pid),
                runs: Vec::new(),
            },
            tree,
            len: 0,
            digests: Vec::new(),
            pending: Vec::new(),
            pending_bytes: Vec::new(),
            written: 0,
            tree_buf: Vec::new(),
        })
    }

    /// The next `data` of the file, the process's memory from `addr` on: a whole
    /// number of pieces.
    pub fn take(&mut self, addr: u64, data: &[u8]) -> Result<(), PageServerError> {
        debug_assert_eq!(data.len() % PAGE_PIECE, 0);
        let mut tree_buf = std::mem::take(&mut self.tree_buf);
        let same = self.tree.as_ref().map(|tree| {
            let got = read_tree(tree, addr, data.len(), &mut tree_buf);
            &tree_buf[..got]
        });
        let piece = PAGE_PIECE as u64;
        // The run of pieces to write next: from `data[run_from..]` at `run_at`.
        let mut run: Option<(usize, u64)> = None;
        for (i, bytes) in data.chunks_exact(PAGE_PIECE).enumerate() {
            let at = self.len + i as u64 * piece;
            let piece_addr = addr + i as u64 * piece;
            self.digests.push(piece_digest(bytes));
            let from = i * PAGE_PIECE;
            let in_tree = same
                .as_ref()
                .and_then(|tree| tree.get(from..from + PAGE_PIECE))
                .is_some_and(|theirs| theirs == bytes)
                && self.tree.as_ref().is_some_and(|t| t.holds(piece_addr));
            if in_tree {
                if let Some((run_from, run_at)) = run.take() {
                    self.write(run_at, &data[run_from..from])?;
                }
                self.pending.push((at, piece_addr));
                self.pending_bytes.extend_from_slice(bytes);
            } else if run.is_none() {
                run = Some((from, at));
            }
            if (at + piece) % BLOCK_SIZE == 0 {
                if let Some((run_from, run_at)) = run.take() {
                    self.write(run_at, &data[run_from..from + PAGE_PIECE])?;
                }
                for (offset, addr) in self.pending.drain(..) {
                    self.in_tree.add_piece(offset, addr);
                }
                self.pending_bytes.clear();
            }
        }
        if let Some((run_from, run_at)) = run {
            self.write(run_at, &data[run_from..])?;
        }
        self.len += data.len() as u64;
        self.tree_buf = tree_buf;
        Ok(())
    }

    fn write(&mut self, at: u64, bytes: &[u8]) -> Result<(), PageServerError> {
        self.file
            .write_all_at(bytes, at)
            .map_err(|source| PageServerError::Write {
                path: self.path.clone(),
                source,
            })?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// CRIU is done with the file: the pieces of its last, partial block are written
    /// whatever the tree holds, and the file gets its whole length.
    pub fn close(mut self) -> Result<Closed, PageServerError> {
        let pending = std::mem::take(&mut self.pending);
        let bytes = std::mem::take(&mut self.pending_bytes);
        for (&(at, _), piece) in pending.iter().zip(bytes.chunks_exact(PAGE_PIECE)) {
            self.write(at, piece)?;
        }
        self.file
            .set_len(self.len)
            .map_err(|source| PageServerError::Write {
                path: self.path.clone(),
                source,
            })?;
        Ok(Closed {
            name: self.name,
            path: self.path,
            len: self.len,
            digests: self.digests,
            in_tree: self.in_tree,
            written: self.written,
        })
    }
}

/// Read the tree's `len` bytes from `addr` into `buf`: how many could be read (a part
/// that cannot be read is written from what CRIU sent).
fn read_tree(tree: &TreeSource, addr: u64, len: usize, buf: &mut Vec<u8>) -> usize {
    buf.resize(len, 0);
    let Ok(base) = usize::try_from(addr) else {
        return 0;
    };
    let remote = [RemoteIoVec { base, len }];
    process_vm_readv(
        Pid::from_raw(tree.pid),
        &mut [IoSliceMut::new(buf)],
        &remote,
    )
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::own_memory;
    use super::*;

    fn source(addr: u64, len: u64) -> TreeSource {
        TreeSource {
            pid: std::process::id() as i32,
            stable: vec![(addr, addr + len)],
        }
    }

    #[test]
    fn pieces_the_tree_holds_are_left_out_but_a_partial_last_block_is_written() {
        let per_block = BLOCK_SIZE as usize / PAGE_PIECE;
        let (backing, skip) = own_memory(per_block + 3);
        let memory = &backing[skip..];
        let addr = memory.as_ptr() as u64;
        let dir = tempfile::tempdir().unwrap();
        let mut file = PagesFile::create(
            dir.path(),
            "pages-1.img".into(),
            Some(source(addr, memory.len() as u64)),
        )
        .unwrap();
        // What CRIU sends differs from the tree in piece 2 (a thread's area the
        // kernel rewrote, say), in two takes.
        let mut sent = memory.to_vec();
        sent[2 * PAGE_PIECE] ^= 0xff;
        let cut = 5 * PAGE_PIECE;
        file.take(addr, &sent[..cut]).unwrap();
        file.take(addr + cut as u64, &sent[cut..]).unwrap();
        let closed = file.close().unwrap();
        assert_eq!(closed.len, sent.len() as u64);
        assert_eq!(closed.digests.len(), per_block + 3);
        assert_eq!(
            closed.digests[2],
            piece_digest(&sent[2 * PAGE_PIECE..][..PAGE_PIECE])
        );
        // The first block but piece 2 is the tree's; the 3 pieces after it are on disk.
        let piece = PAGE_PIECE as u64;
        assert_eq!(
            closed.in_tree.runs,
            vec![
                crate::dump::page_digests::TreeRun {
                    offset: 0,
                    addr,
                    len: 2 * piece
                },
                crate::dump::page_digests::TreeRun {
                    offset: 3 * piece,
                    addr: addr + 3 * piece,
                    len: BLOCK_SIZE - 3 * piece
                },
            ]
        );
        assert_eq!(closed.written, 4 * piece);
        let on_disk = std::fs::read(dir.path().join("pages-1.img")).unwrap();
        assert_eq!(on_disk.len(), sent.len());
        assert_eq!(
            on_disk[2 * PAGE_PIECE..3 * PAGE_PIECE],
            sent[2 * PAGE_PIECE..3 * PAGE_PIECE]
        );
        assert_eq!(on_disk[BLOCK_SIZE as usize..], sent[BLOCK_SIZE as usize..]);
        assert!(on_disk[..PAGE_PIECE].iter().all(|&b| b == 0), "a hole");
        let meta = std::fs::metadata(dir.path().join("pages-1.img")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 2 * BLOCK_SIZE / 4,
            "sparse: {} blocks",
            meta.blocks()
        );
    }

    #[test]
    fn without_a_tree_or_outside_its_stable_memory_everything_is_written() {
        let (backing, skip) = own_memory(4);
        let memory = &backing[skip..];
        let addr = memory.as_ptr() as u64;
        let dir = tempfile::tempdir().unwrap();
        let mut plain = PagesFile::create(dir.path(), "pages-1.img".into(), None).unwrap();
        plain.take(addr, memory).unwrap();
        let plain = plain.close().unwrap();
        assert_eq!(plain.written, memory.len() as u64);
        assert!(plain.in_tree.runs.is_empty());
        // Only the first two pieces are in a stable range (the rest would be
        // executable, say).
        let mut half = PagesFile::create(
            dir.path(),
            "pages-2.img".into(),
            Some(source(addr, 2 * PAGE_PIECE as u64)),
        )
        .unwrap();
        half.take(addr, memory).unwrap();
        let half = half.close().unwrap();
        assert_eq!(half.written, memory.len() as u64, "no block was finished");
        assert_eq!(std::fs::read(&half.path).unwrap(), memory);
    }

    #[test]
    fn a_file_that_exists_already_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"").unwrap();
        let error = PagesFile::create(dir.path(), "pages-1.img".into(), None).unwrap_err();
        assert!(error.to_string().contains("pages-1.img"), "{error}");
    }
}
