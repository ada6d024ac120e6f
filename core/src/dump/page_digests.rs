//! What the dump learns of the memory pages while CRIU dumps them, whether it reads
//! the tree beside CRIU's pages files (`tree_pages`) or takes the pages itself
//! (`page_server`): the pages files' leading block digests, the pieces left in the
//! stopped tree, and the two facts of the tree both need (which of its mappings stay
//! as CRIU dumped them, and where its threads' restartable-sequences areas are).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use gpucr_abi::procfs;

use crate::image::checksum::PAGE_PIECE;
use crate::image::follow::Prefixes;

/// What the dump learnt of the memory pages while CRIU dumped them, from a
/// [`TreePages`](super::tree_pages::TreePages) or a [`PageServer`](super::page_server::PageServer).
#[derive(Debug, Default)]
pub struct PageDigests {
    /// The leading full blocks of each pages file it could account for.
    pub prefixes: Prefixes,
    /// Bytes of those blocks digested from the tree's memory.
    pub from_tree: u64,
    /// Bytes of those blocks read back from the files.
    pub from_files: u64,
    /// Pieces of the pages files left out of them, and where they are in the stopped
    /// tree, by pages file ([`PageServer`](super::page_server::PageServer) only: a
    /// `TreePages` reads the tree while CRIU writes every byte into the files).
    pub in_tree: HashMap<String, InTree>,
}

/// The mappings of a `/proc/PID/maps` text whose pages CRIU may dump from memory and
/// that can be read now: private, readable, not executable, not a kernel area and not
/// a device's (its pages are the device's business: reading a GPU's through its
/// aperture would be slow, and CRIU leaves device mappings to its plugins).
pub fn readable_private_mappings(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let m = procfs::parse_mapping(line)?;
            let perms = m.perms.as_bytes();
            let private = perms.get(3) == Some(&b'p');
            let readable = perms.first() == Some(&b'r');
            let executable = perms.get(2) == Some(&b'x');
            // The kernel's own areas have no path, only a name: `[vvar]`, `[vdso]`.
            let kernel_area = line.ends_with(']') && line.contains(" [v");
            let device = m.path.as_ref().is_some_and(|p| p.starts_with("/dev/"));
            (private && readable && !executable && !kernel_area && !device)
                .then_some((m.start, m.end))
        })
        .collect()
}

/// The pieces (their addresses) that hold a thread's restartable sequences area, in
/// any process of the image: the `rseq_entry` of every `core-TID.img` among
/// `entries`. None when a core image cannot be read.
pub fn rseq_pieces(
    dir: &Path,
    entries: &[std::fs::DirEntry],
    page_size: u64,
) -> Option<HashSet<u64>> {
    let images = gpucr_criu_image::ImageDir::new(dir, page_size);
    let mut pieces = HashSet::new();
    for entry in entries {
        let name = entry.file_name();
        let Some(tid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("core-")?.strip_suffix(".img")?.parse().ok())
        else {
            continue;
        };
        let core = images.core(tid).ok()?;
        let Some(rseq) = core.thread_core.and_then(|t| t.rseq_entry) else {
            continue;
        };
        let first = rseq.rseq_abi_pointer - rseq.rseq_abi_pointer % PAGE_PIECE as u64;
        let last = rseq
            .rseq_abi_pointer
            .saturating_add(u64::from(rseq.rseq_abi_size).max(1) - 1);
        pieces.extend((first..=last).step_by(PAGE_PIECE));
    }
    Some(pieces)
}

/// The pieces the page server left out of one pages file, and where they are in the
/// tree: while the tree stays stopped, those bytes of the file are the process's bytes
/// at those addresses (post-copy's source serves them from there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InTree {
    /// The process, as this machine's pid.
    pub pid: i32,
    /// Runs of the file, in file order, not overlapping.
    pub runs: Vec<TreeRun>,
}

/// `len` bytes of a pages file from `offset` on: the process's memory from `addr` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRun {
    pub offset: u64,
    pub addr: u64,
    pub len: u64,
}

impl InTree {
    /// Add the piece at `offset` of the file, at `addr`, to the runs.
    pub(super) fn add_piece(&mut self, offset: u64, addr: u64) {
        let piece = PAGE_PIECE as u64;
        match self.runs.last_mut() {
            Some(run) if run.offset + run.len == offset && run.addr + run.len == addr => {
                run.len += piece
            }
            _ => self.runs.push(TreeRun {
                offset,
                addr,
                len: piece,
            }),
        }
    }

    /// Bytes of the file in the tree.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_readable_data_mappings_are_read() {
        let maps = "\
55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1234   /usr/bin/prog
55d0c0001000-55d0c0002000 r-xp 00001000 fd:01 1234   /usr/bin/prog
55d0c0003000-55d0c0005000 rw-p 00003000 fd:01 1234   /usr/bin/prog
7f0000000000-7f0040000000 rw-p 00000000 00:00 0
7f0040000000-7f0040001000 ---p 00000000 00:00 0
7f0048000000-7f0048010000 rw-p 00000000 00:05 88     /dev/zero
7f0049000000-7f0049010000 rw-p 00000000 00:05 89     /dev/dri/renderD128
7f0050000000-7f0050001000 rw-s 00000000 00:01 77     /memfd:CRIUMFD (deleted)
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0      [stack]
7ffc00100000-7ffc00104000 r--p 00000000 00:00 0      [vvar]
7ffc00104000-7ffc00106000 r-xp 00000000 00:00 0      [vdso]
";
        assert_eq!(
            readable_private_mappings(maps),
            vec![
                (0x55d0c0000000, 0x55d0c0001000),
                (0x55d0c0003000, 0x55d0c0005000),
                (0x7f0000000000, 0x7f0040000000),
                (0x7ffc00000000, 0x7ffc00021000),
            ]
        );
    }
}
