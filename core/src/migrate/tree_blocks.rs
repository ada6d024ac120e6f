//! Post-copy's source serves the memory pages from its stopped copy of the job, not
//! from a copy of them on its disk.
//!
//! The dump takes CRIU's pages through gpucr's page server (`dump::page_server`),
//! which leaves out of each pages file the pieces that equal the stopped tree's memory
//! at their address, and says where those are ([`InTree`]). Nothing writes into a
//! stopped tree, so until it is killed those bytes of the file are the process's bytes
//! at those addresses: [`TreeBlocks`] puts them into each block it serves, read with
//! `process_vm_readv`, over the hole the file holds there. What the page server wrote
//! (a thread's restartable sequences area, which the kernel rewrites, an executable
//! mapping, a file's last partial block) is served from the file. The destination
//! checks every block against the manifest's digest, as ever.

use std::collections::HashMap;
use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use crate::dump::InTree;

/// Why a block could not be served from the tree.
#[derive(Debug, thiserror::Error)]
pub enum TreeBlocksError {
    #[error(
        "{file}: cannot read {len} bytes at {addr:#x} of pid {pid}, the stopped job \
         ({got}): the job was killed or changed under gpucr"
    )]
    Read {
        file: String,
        pid: i32,
        addr: u64,
        len: u64,
        got: String,
    },
}

/// The pages files whose pieces are served from the stopped tree.
#[derive(Debug, Default)]
pub struct TreeBlocks {
    files: HashMap<String, InTree>,
}

impl TreeBlocks {
    /// Serve the files named in `pulled` from the tree where the dump says their
    /// pieces are (`in_tree`).
    pub fn new(pulled: &[String], mut in_tree: HashMap<String, InTree>) -> TreeBlocks {
        let files = pulled
            .iter()
            .filter_map(|name| Some((name.clone(), in_tree.remove(name)?)))
            .collect();
        TreeBlocks { files }
    }

    /// Bytes of the files served from the tree.
    pub fn bytes(&self) -> u64 {
        self.files.values().map(InTree::bytes).sum()
    }

    /// Put into `buf`, which holds `buf.len()` bytes of the file `name` from `at` on
    /// (read from the staging image, holes where the tree holds them), what the tree
    /// holds for them.
    pub fn fill(&self, name: &str, at: u64, buf: &mut [u8]) -> Result<(), TreeBlocksError> {
        let Some(pieces) = self.files.get(name) else {
            return Ok(());
        };
        let end = at + buf.len() as u64;
        // The runs are in file order: start at the last one that begins before `at`.
        let first = pieces.runs.partition_point(|r| r.offset + r.len <= at);
        for run in pieces.runs[first..].iter().take_while(|r| r.offset < end) {
            let lo = run.offset.max(at);
            let hi = (run.offset + run.len).min(end);
            let addr = run.addr + (lo - run.offset);
            let into = &mut buf[(lo - at) as usize..(hi - at) as usize];
            let want = into.len();
            let remote = [RemoteIoVec {
                base: addr as usize,
                len: want,
            }];
            let read = process_vm_readv(
                Pid::from_raw(pieces.pid),
                &mut [IoSliceMut::new(into)],
                &remote,
            );
            match read {
                Ok(got) if got == want => {}
                other => {
                    return Err(TreeBlocksError::Read {
                        file: name.to_owned(),
                        pid: pieces.pid,
                        addr,
                        len: want as u64,
                        got: match other {
                            Ok(got) => format!("{got} bytes read"),
                            Err(e) => e.to_string(),
                        },
                    })
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::dump::TreeRun;

    const PIECE: u64 = 4096;

    /// A pages file of 8 pieces, its pieces 1-2 and 5-6 (run by run) this process's
    /// `memory` (4 pieces, aligned), and holes on the disk, as the page server leaves
    /// them; the file as CRIU sent it.
    fn image_of_own_memory(memory: &[u8]) -> (tempfile::TempDir, Vec<u8>, InTree) {
        let dir = tempfile::tempdir().unwrap();
        let mut file = vec![0u8; 8 * PIECE as usize];
        for (i, b) in file.iter_mut().enumerate() {
            *b = (i % 253) as u8;
        }
        let p = PIECE as usize;
        file[p..3 * p].copy_from_slice(&memory[..2 * p]);
        file[5 * p..7 * p].copy_from_slice(&memory[2 * p..]);
        let mut on_disk = file.clone();
        on_disk[p..3 * p].fill(0);
        on_disk[5 * p..7 * p].fill(0);
        std::fs::write(dir.path().join("pages-1.img"), &on_disk).unwrap();
        let base = memory.as_ptr() as u64;
        let in_tree = InTree {
            pid: std::process::id() as i32,
            runs: vec![
                TreeRun {
                    offset: PIECE,
                    addr: base,
                    len: 2 * PIECE,
                },
                TreeRun {
                    offset: 5 * PIECE,
                    addr: base + 2 * PIECE,
                    len: 2 * PIECE,
                },
            ],
        };
        (dir, file, in_tree)
    }

    fn own_memory() -> Vec<u8> {
        (0..4 * PIECE as usize)
            .map(|i| (i * 7 % 251) as u8)
            .collect()
    }

    #[test]
    fn pieces_in_the_tree_come_back_in_every_block() {
        let memory = own_memory();
        let (dir, file, in_tree) = image_of_own_memory(&memory);
        let path = dir.path().join("pages-1.img");
        let names = vec!["pages-1.img".to_owned(), "pages-2.img".to_owned()];
        let in_tree = HashMap::from([("pages-1.img".to_owned(), in_tree)]);
        let blocks = TreeBlocks::new(&names, in_tree);
        assert_eq!(blocks.bytes(), 4 * PIECE);
        // Read back in pieces of every size and place: the file's bytes where it has
        // them, the tree's over its holes.
        let on_disk = File::open(&path).unwrap();
        for (at, len) in [(0, 8 * PIECE), (PIECE + 100, 5 * PIECE), (6 * PIECE, 10)] {
            let mut buf = vec![0u8; len as usize];
            on_disk.read_exact_at(&mut buf, at).unwrap();
            blocks.fill("pages-1.img", at, &mut buf).unwrap();
            assert!(
                buf == file[at as usize..(at + len) as usize],
                "{len} bytes at {at}"
            );
        }
        // A file not pulled is not served from the tree.
        let not_pulled = HashMap::from([("pages-1.img".to_owned(), InTree::default())]);
        assert_eq!(TreeBlocks::new(&[], not_pulled).bytes(), 0);
        // A file without pieces in the tree is served from its file alone.
        let mut untouched = vec![9u8; 16];
        blocks.fill("pages-2.img", 0, &mut untouched).unwrap();
        assert_eq!(untouched, [9u8; 16]);
    }

    #[test]
    fn a_tree_that_is_gone_is_named() {
        let memory = own_memory();
        let (_dir, _, mut in_tree) = image_of_own_memory(&memory);
        // A pid no process has: the kernel's limit is below it.
        in_tree.pid = i32::MAX;
        let names = vec!["pages-1.img".to_owned()];
        let in_tree = HashMap::from([("pages-1.img".to_owned(), in_tree)]);
        let blocks = TreeBlocks::new(&names, in_tree);
        let mut buf = vec![0u8; 8 * PIECE as usize];
        let e = blocks.fill("pages-1.img", 0, &mut buf).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("pages-1.img: cannot read 8192 bytes at ")
                && text.contains(&format!("of pid {}", i32::MAX)),
            "{text}"
        );
    }
}
