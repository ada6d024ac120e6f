//! Digest the memory pages files from the frozen tree itself, not from the files.
//!
//! CRIU writes each process's memory into `pages-N.img`: the pages its pagemap lists,
//! back to back. Reading those files again while CRIU writes them (the way
//! [`Follower`](crate::image::follow::Follower) does) slows CRIU's own copy into them by
//! 4-8% of a dump on 2 cores, however the reading is ordered; reading the same pages
//! from the tree's memory, which CRIU only reads, costs it nothing measurable
//! (docs/benchmarks.md, "Digesting the pages from the tree"). So a [`TreePages`] thread
//! reads each process's private memory with `process_vm_readv` while CRIU dumps, and
//! keeps a digest of every 4 KiB piece; at post-dump, while CRIU still holds the tree,
//! [`TreePages::finish`] lays the digests out in the order of each pagemap CRIU wrote
//! and folds them into the pages file's block digests
//! ([`Algorithm::Pages4m`](crate::image::checksum::Algorithm)). A piece CRIU dumped
//! that was not read from the tree (an executable mapping, a task read too late) is
//! read from the file then; a pages file whose pagemap does not account for every
//! byte of it is left to the final pass, which hashes files whole.
//!
//! The tree's memory is what CRIU writes only where nothing changes it any more. The
//! tree is frozen from before CRIU's first parasite until CRIU has its post-dump
//! answer, but three things still write into it:
//!
//! * CRIU, while it infects a task with its parasite: it clears each thread's
//!   `rseq_cs`, and pokes a system call into the first executable mapping. A task is
//!   read only once its parasite is mapped (`/memfd:CRIUMFD`, after the last of those
//!   data writes).
//! * CRIU, into that executable page again whenever it runs a system call there: the
//!   executable mappings are never read from the tree.
//! * The kernel, into a thread's restartable sequences area (its CPU number) each time
//!   the thread returns to user space, as it does to run CRIU's parasite code, before,
//!   during and after CRIU copies the page: the pieces holding a thread's area (from
//!   its `core-TID.img`) are always read from the file.
//!
//! Should a page still change unseen, the pages file's checksum would not match on
//! restore and the image would be refused, naming the file: an error here cannot let
//! bad data through.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use gpucr_abi::procfs;
use gpucr_criu_image::pagemap::Pagemap;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use super::page_digests::{readable_private_mappings, rseq_pieces, PageDigests};
use crate::image::checksum::{
    is_pages_file, piece_digest, BlockHasher, BLOCK_SIZE, PAGE_PIECE, READ_PIECE,
};
use crate::wait::dir::DirWatch;

/// How often the thread looks whether a task it has not read yet carries CRIU's
/// parasite (nothing reports the mapping: `/proc/PID/maps` is read again).
const POLL: Duration = Duration::from_millis(1);
/// How long the wait for CRIU's first pages file, which inotify reports, sleeps at most
/// before it lists the directory anyway.
const CREATE_FALLBACK: Duration = Duration::from_millis(10);
/// The name of the file behind CRIU's parasite mapping (compel's `MEMFD_FNAME`).
const PARASITE_MAPPING: &str = "/memfd:CRIUMFD";
/// Pagemap entries read from `/proc/PID/pagemap` at a time.
const PAGEMAP_BATCH: usize = 4096;
/// `/proc/PID/pagemap`: the page is present in memory.
const PM_PRESENT: u64 = 1 << 63;
/// `/proc/PID/pagemap`: the page is swapped out.
const PM_SWAP: u64 = 1 << 62;
/// `/proc/PID/pagemap`: the page is a file's (or shared anonymous) page, not a
/// private copy: CRIU does not dump it from a private file mapping.
const PM_FILE: u64 = 1 << 61;
const PIECES_PER_BLOCK: usize = BLOCK_SIZE as usize / PAGE_PIECE;

/// The digests of one process's memory (keyed by its pid in the tree's own
/// namespace, as CRIU names its images): runs of consecutive pieces.
#[derive(Debug, Default)]
struct TaskDigests {
    /// (address of the first piece, the digests of the pieces from there), in address
    /// order, not overlapping.
    runs: Vec<(u64, Vec<u64>)>,
}

impl TaskDigests {
    /// The digest of the piece at `addr`, if it was read.
    fn lookup(&self, addr: u64) -> Option<u64> {
        let i = self.runs.partition_point(|(start, _)| *start <= addr);
        let (start, digests) = self.runs.get(i.checked_sub(1)?)?;
        let index = (addr - start) / PAGE_PIECE as u64;
        digests.get(usize::try_from(index).ok()?).copied()
    }

    #[cfg(test)]
    fn pieces(&self) -> u64 {
        self.runs.iter().map(|(_, d)| d.len() as u64).sum()
    }
}

/// A thread reading the tree's memory while CRIU dumps it.
#[derive(Debug)]
pub struct TreePages {
    stop: Arc<AtomicBool>,
    /// Set at post-dump: CRIU is done with every task, so those not read yet can be
    /// read at once, parasite or not.
    criu_done: Arc<AtomicBool>,
    /// Written when `stop` or `criu_done` is set: it ends the thread's waits at once.
    wake: Option<Arc<EventFd>>,
    handle: Option<JoinHandle<HashMap<u32, TaskDigests>>>,
}

impl TreePages {
    /// Start reading the tree rooted at `root` once CRIU begins writing memory into
    /// `dir`.
    pub fn start(root: i32, dir: PathBuf) -> TreePages {
        let stop = Arc::new(AtomicBool::new(false));
        let criu_done = Arc::new(AtomicBool::new(false));
        let (flag, done) = (stop.clone(), criu_done.clone());
        let wake = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .ok()
            .map(Arc::new);
        let woken = wake.clone();
        // Without an eventfd no thread: every piece is read from the files at post-dump.
        let handle = woken.and_then(|woken| {
            std::thread::Builder::new()
                .name("gpucr-tree-pages".into())
                // Not in the background, unlike the follower: reading the tree does not
                // slow CRIU, and what is left at post-dump is read while CRIU waits.
                .spawn(move || read_tree(root, &dir, &flag, &done, &woken))
                .ok()
        });
        TreePages {
            stop,
            criu_done,
            wake,
            handle,
        }
    }

    /// Wake the thread from its wait (`stop` or `criu_done` was set).
    fn wake(&self) {
        if let Some(wake) = &self.wake {
            let _ = wake.write(1);
        }
    }

    /// CRIU is at post-dump (it has written every pagemap and pages file, and still
    /// holds the tree): finish reading the tree and lay the digests out in each pages
    /// file's order.
    pub fn finish(mut self, dir: &Path) -> PageDigests {
        self.criu_done.store(true, Ordering::SeqCst);
        self.wake();
        let digests = self
            .handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        assemble(dir, &digests, crate::units::host_page_size())
    }
}

impl Drop for TreePages {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The thread: wait for CRIU's first pages file (the whole tree is seized by then),
/// then read each process once its parasite is mapped, or once `criu_done` is set;
/// until all are read or `stop`.
fn read_tree(
    root: i32,
    dir: &Path,
    stop: &AtomicBool,
    criu_done: &AtomicBool,
    wake: &EventFd,
) -> HashMap<u32, TaskDigests> {
    let mut read = HashMap::new();
    // CRIU creates each pages file (O_CREAT), which inotify reports: sleep until then.
    // The watch is made before the directory is first listed, so that no file goes
    // unreported; without one, the wait is a sleep of CREATE_FALLBACK.
    let watch = DirWatch::new(dir, is_pages_file).ok();
    while !has_pages_file(dir) && !criu_done.load(Ordering::SeqCst) {
        if stop.load(Ordering::SeqCst) {
            return read;
        }
        let _ = match &watch {
            Some(watch) => watch.wait(CREATE_FALLBACK, Some(wake.as_fd())).map(drop),
            None => crate::wait::readable([wake.as_fd()], Some(CREATE_FALLBACK)).map(drop),
        };
    }
    drop(watch);
    let page_size = crate::units::host_page_size();
    let mut buf = vec![0u8; READ_PIECE];
    let mut left: Vec<(i32, u32)> = procfs::tree_pids(root)
        .into_iter()
        .filter_map(|pid| Some((pid, crate::gpu::ns_pid(pid).ok()?)))
        .collect();
    while !left.is_empty() && !stop.load(Ordering::SeqCst) {
        let before = left.len();
        let pass = std::time::Instant::now();
        left.retain(|&(pid, vpid)| {
            let Ok(maps) = std::fs::read_to_string(procfs::maps_path(pid)) else {
                // Gone: nothing to read, now or later.
                return false;
            };
            let infected = || maps.lines().any(|l| l.contains(PARASITE_MAPPING));
            if !criu_done.load(Ordering::SeqCst) && !infected() {
                return true;
            }
            read.insert(vpid, read_task(pid, &maps, page_size, &mut buf, stop));
            false
        });
        if left.len() == before && !criu_done.load(Ordering::SeqCst) {
            // Polled: no fd reports a parasite being mapped into a task. Every POLL, or
            // at most half the time as a large tree's maps take a while to read; post-dump
            // and stop end the wait at once.
            let _ = crate::wait::readable([wake.as_fd()], Some(POLL.max(pass.elapsed())));
        }
    }
    read
}

fn has_pages_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| is_pages_file(&e.file_name().to_string_lossy()))
    })
}

/// Read and digest the pages of `pid` CRIU may dump: present or swapped, and not a
/// file's own page.
fn read_task(
    pid: i32,
    maps: &str,
    page_size: u64,
    buf: &mut [u8],
    stop: &AtomicBool,
) -> TaskDigests {
    let mut digests = TaskDigests::default();
    let Ok(pagemap) = File::open(format!("/proc/{pid}/pagemap")) else {
        return digests;
    };
    for (start, end) in readable_private_mappings(maps) {
        for (run_start, run_end) in dumped_runs(&pagemap, start, end, page_size) {
            if stop.load(Ordering::SeqCst) {
                return digests;
            }
            read_run(pid, run_start, run_end, buf, &mut digests, stop);
        }
    }
    digests
}

/// The runs of pages in `start..end` that `/proc/PID/pagemap` shows CRIU would dump.
fn dumped_runs(pagemap: &File, start: u64, end: u64, page_size: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut entries = vec![0u8; PAGEMAP_BATCH * 8];
    let mut addr = start;
    while addr < end {
        let pages = (((end - addr) / page_size) as usize).min(PAGEMAP_BATCH);
        let Ok(n) = pagemap.read_at(&mut entries[..pages * 8], addr / page_size * 8) else {
            break;
        };
        if n < 8 {
            break;
        }
        for entry in entries[..n - n % 8].chunks_exact(8) {
            let bits = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
            if bits & (PM_PRESENT | PM_SWAP) != 0 && bits & PM_FILE == 0 {
                match runs.last_mut() {
                    Some((_, run_end)) if *run_end == addr => *run_end += page_size,
                    _ => runs.push((addr, addr + page_size)),
                }
            }
            addr += page_size;
        }
    }
    runs
}

/// Read `start..end` of `pid`'s memory a buffer at a time and digest its pieces. What
/// cannot be read is left out (it is read from the file at post-dump).
fn read_run(
    pid: i32,
    start: u64,
    end: u64,
    buf: &mut [u8],
    digests: &mut TaskDigests,
    stop: &AtomicBool,
) {
    let mut addr = start;
    while addr < end && !stop.load(Ordering::Relaxed) {
        let len = ((end - addr) as usize).min(buf.len());
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        let got = process_vm_readv(
            Pid::from_raw(pid),
            &mut [IoSliceMut::new(&mut buf[..len])],
            &remote,
        )
        .unwrap_or(0);
        let whole = got - got % PAGE_PIECE;
        if whole == 0 {
            return;
        }
        let pieces = buf[..whole].chunks_exact(PAGE_PIECE).map(piece_digest);
        match digests.runs.last_mut() {
            Some((run_start, run)) if *run_start + (run.len() * PAGE_PIECE) as u64 == addr => {
                run.extend(pieces)
            }
            _ => digests.runs.push((addr, pieces.collect())),
        }
        if whole < len {
            return;
        }
        addr += whole as u64;
    }
}

/// Lay each task's digests out in the order of its pagemap in `dir` and fold them into
/// its pages file's leading full blocks.
fn assemble(dir: &Path, tasks: &HashMap<u32, TaskDigests>, page_size: u64) -> PageDigests {
    let mut outcome = PageDigests::default();
    let mut claimed = HashSet::new();
    let Ok(entries) = std::fs::read_dir(dir).and_then(|e| e.collect::<Result<Vec<_>, _>>()) else {
        return outcome;
    };
    // Without every thread's rseq area known, no piece of the tree can be trusted.
    let Some(changing) = rseq_pieces(dir, &entries, page_size) else {
        return outcome;
    };
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(vpid) = gpucr_criu_image::pagemap::process_of(&name) else {
            continue;
        };
        let Some(task) = tasks.get(&vpid) else {
            continue;
        };
        let Ok(pagemap) = Pagemap::read(&entry.path(), page_size) else {
            continue;
        };
        let pages_name = pagemap.pages_file_name();
        if !claimed.insert(pages_name.clone()) {
            // Two pagemaps naming one pages file: not what CRIU writes for tasks.
            outcome.prefixes.remove(&pages_name);
            continue;
        }
        let pages = dir.join(&pages_name);
        if let Some(blocks) = lay_out(&pagemap, &pages, task, &changing, &mut outcome) {
            outcome.prefixes.insert(pages_name, blocks);
        }
    }
    outcome
}

/// The leading full block digests of the pages file `pages`, which holds the data of
/// `pagemap`'s present runs back to back, each piece's digest taken from `task` or,
/// where it was not read, from the file (the last, partial block is left to the final
/// pass). None when the pagemap does not account for the whole file, or when the first
/// piece of a block taken from the tree differs from the file's: a check on one piece
/// in 1024 that the tree's digests are laid out where CRIU put those pages.
fn lay_out(
    pagemap: &Pagemap,
    pages: &Path,
    task: &TaskDigests,
    changing: &HashSet<u64>,
    outcome: &mut PageDigests,
) -> Option<Vec<u64>> {
    let file = File::open(pages).ok()?;
    let size = file.metadata().ok()?.len();
    let mut present: Vec<_> = pagemap.runs().iter().filter(|r| r.is_present()).collect();
    present.sort_by_key(|r| r.file_offset);
    // (address, offset in the file, bytes) of each run, back to back from 0 to `size`.
    let mut runs = Vec::with_capacity(present.len());
    let mut offset = 0u64;
    for run in present {
        if run.file_offset != Some(offset) {
            return None;
        }
        let bytes = run.nr_pages.checked_mul(pagemap.page_size())?;
        runs.push((run.vaddr, offset, bytes));
        offset = offset.checked_add(bytes)?;
    }
    if offset != size {
        return None;
    }
    let full = size - size % BLOCK_SIZE;
    let mut blocks = Vec::new();
    let mut hasher = BlockHasher::default();
    let mut in_block = 0;
    let mut piece = vec![0u8; PAGE_PIECE];
    let (mut from_tree, mut from_files) = (0u64, 0u64);
    let mut checked_block = None;
    for (vaddr, start, bytes) in runs {
        let mut at = 0;
        while at < bytes && start + at < full {
            let known = (!changing.contains(&(vaddr + at)))
                .then(|| task.lookup(vaddr + at))
                .flatten();
            let digest = match known {
                Some(digest) => {
                    let block = (start + at) / BLOCK_SIZE;
                    if checked_block != Some(block) {
                        checked_block = Some(block);
                        file.read_exact_at(&mut piece, start + at).ok()?;
                        if piece_digest(&piece) != digest {
                            return None;
                        }
                    }
                    from_tree += PAGE_PIECE as u64;
                    digest
                }
                None => {
                    file.read_exact_at(&mut piece, start + at).ok()?;
                    from_files += PAGE_PIECE as u64;
                    piece_digest(&piece)
                }
            };
            hasher.add_piece_digest(digest);
            in_block += 1;
            if in_block == PIECES_PER_BLOCK {
                blocks.push(std::mem::take(&mut hasher).finish());
                in_block = 0;
            }
            at += PAGE_PIECE as u64;
        }
    }
    outcome.from_tree += from_tree;
    outcome.from_files += from_files;
    Some(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_found_in_its_run_only() {
        let task = TaskDigests {
            runs: vec![(0x1000, vec![1, 2]), (0x8000, vec![3])],
        };
        assert_eq!(task.lookup(0x1000), Some(1));
        assert_eq!(task.lookup(0x2000), Some(2));
        assert_eq!(task.lookup(0x3000), None);
        assert_eq!(task.lookup(0x0), None);
        assert_eq!(task.lookup(0x8000), Some(3));
        assert_eq!(task.lookup(0x9000), None);
        assert_eq!(task.pieces(), 3);
    }

    fn pagemap_in(dir: &Path, vpid: u32, pages_id: u32, runs: &[(u64, u64, u32)]) {
        use gpucr_criu_image::encode::{image_bytes, push_entry};
        use gpucr_criu_image::framing::Head;
        use gpucr_criu_image::magic;
        use gpucr_criu_image::proto::{PagemapEntry, PagemapHead};
        let mut bytes = image_bytes(Head::Common, magic::PAGEMAP, &[PagemapHead { pages_id }]);
        for &(vaddr, nr_pages, flags) in runs {
            push_entry(
                &mut bytes,
                &PagemapEntry {
                    vaddr,
                    compat_nr_pages: 0,
                    in_parent: None,
                    flags: Some(flags),
                    nr_pages: Some(nr_pages),
                },
            );
        }
        std::fs::write(dir.join(format!("pagemap-{vpid}.img")), bytes).unwrap();
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i + seed) * 131 % 251) as u8).collect()
    }

    /// The digests of `bytes` as read from memory at `addr`, one run.
    fn read_from_tree(addr: u64, bytes: &[u8]) -> (u64, Vec<u64>) {
        (addr, bytes.chunks(PAGE_PIECE).map(piece_digest).collect())
    }

    #[test]
    fn pieces_laid_out_by_the_pagemap_fold_into_the_files_blocks() {
        use gpucr_criu_image::pagemap::{PE_PARENT, PE_PRESENT};
        let dir = tempfile::tempdir().unwrap();
        // Two present runs around one in a parent image; 1032 pieces: one full block.
        let first = pattern(8 * PAGE_PIECE, 1);
        let second = pattern(1024 * PAGE_PIECE, 2);
        pagemap_in(
            dir.path(),
            7,
            3,
            &[
                (0x10000, 8, PE_PRESENT),
                (0x20000, 4, PE_PARENT),
                (0x400000, 1024, PE_PRESENT),
            ],
        );
        let pages = dir.path().join("pages-3.img");
        std::fs::write(&pages, [first.clone(), second.clone()].concat()).unwrap();
        // Read from the tree: the first run and part of the second; the rest is read
        // back from the file.
        let task = TaskDigests {
            runs: vec![
                read_from_tree(0x10000, &first),
                read_from_tree(0x400000, &second[..600 * PAGE_PIECE]),
            ],
        };
        let tasks = HashMap::from([(7, task)]);
        let outcome = assemble(dir.path(), &tasks, 4096);
        let whole = crate::image::checksum::digest_file(&pages).unwrap();
        assert_eq!(outcome.prefixes["pages-3.img"], whole.blocks[..1]);
        // Of the full block's 1024 pieces: 8 + 600 from the tree, the rest from the file.
        assert_eq!(outcome.from_tree, 608 * PAGE_PIECE as u64);
        assert_eq!(outcome.from_files, 416 * PAGE_PIECE as u64);

        // What the tree held is what counts: a piece that differs in the file gives a
        // block that does not match the file's own digest (the restore refuses it).
        let mut changed = second.clone();
        changed[5] ^= 1;
        std::fs::write(&pages, [first.clone(), changed].concat()).unwrap();
        let outcome = assemble(dir.path(), &tasks, 4096);
        let whole = crate::image::checksum::digest_file(&pages).unwrap();
        assert_ne!(outcome.prefixes["pages-3.img"], whole.blocks[..1]);
    }

    #[test]
    fn a_threads_rseq_area_is_read_from_the_file() {
        use gpucr_criu_image::encode::image_bytes;
        use gpucr_criu_image::framing::Head;
        use gpucr_criu_image::magic;
        use gpucr_criu_image::pagemap::PE_PRESENT;
        use gpucr_criu_image::proto::{CoreEntry, RseqEntry, ThreadCoreEntry};
        let dir = tempfile::tempdir().unwrap();
        let data = pattern(1024 * PAGE_PIECE, 4);
        pagemap_in(dir.path(), 5, 2, &[(0x800000, 1024, PE_PRESENT)]);
        let pages = dir.path().join("pages-2.img");
        std::fs::write(&pages, &data).unwrap();
        // The kernel wrote thread 6's CPU number into its area (straddling two pieces)
        // after CRIU copied the page: the tree's digests of those pieces are stale.
        let mut tree = data.clone();
        let area = 3 * PAGE_PIECE - 8;
        tree[area..area + 32].fill(0xee);
        let core = CoreEntry {
            thread_core: Some(ThreadCoreEntry {
                rseq_entry: Some(RseqEntry {
                    rseq_abi_pointer: 0x800000 + area as u64,
                    rseq_abi_size: 32,
                    signature: 0x53053053,
                    rseq_cs_pointer: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        std::fs::write(
            dir.path().join("core-6.img"),
            image_bytes(Head::Common, magic::CORE, &[core]),
        )
        .unwrap();
        let tasks = HashMap::from([(
            5,
            TaskDigests {
                runs: vec![read_from_tree(0x800000, &tree)],
            },
        )]);
        let outcome = assemble(dir.path(), &tasks, 4096);
        let whole = crate::image::checksum::digest_file(&pages).unwrap();
        assert_eq!(outcome.prefixes["pages-2.img"], whole.blocks);
        assert_eq!(outcome.from_files, 2 * PAGE_PIECE as u64);

        // A core image that cannot be read leaves every pages file to the final pass.
        std::fs::write(dir.path().join("core-7.img"), b"not an image").unwrap();
        assert!(assemble(dir.path(), &tasks, 4096).prefixes.is_empty());
    }

    #[test]
    fn a_pages_file_the_pagemap_does_not_account_for_is_left_to_the_final_pass() {
        use gpucr_criu_image::pagemap::PE_PRESENT;
        let dir = tempfile::tempdir().unwrap();
        let data = pattern(4 * PAGE_PIECE, 3);
        pagemap_in(dir.path(), 1, 1, &[(0x10000, 4, PE_PRESENT)]);
        // One piece more than the pagemap lists.
        std::fs::write(
            dir.path().join("pages-1.img"),
            [data.clone(), vec![0; PAGE_PIECE]].concat(),
        )
        .unwrap();
        // Digests laid out where the file holds other pages (another task's, had the
        // tree's pids been mapped wrongly) are caught by the check of a block's first
        // piece.
        let big = pattern(1024 * PAGE_PIECE, 5);
        pagemap_in(dir.path(), 2, 2, &[(0x10000, 1024, PE_PRESENT)]);
        std::fs::write(dir.path().join("pages-2.img"), &big).unwrap();
        let other = pattern(big.len(), 6);
        // A task without a pagemap is passed over.
        let tasks = HashMap::from([
            (
                1,
                TaskDigests {
                    runs: vec![read_from_tree(0x10000, &data)],
                },
            ),
            (
                2,
                TaskDigests {
                    runs: vec![read_from_tree(0x10000, &other)],
                },
            ),
            (
                9,
                TaskDigests {
                    runs: vec![read_from_tree(0x10000, &data)],
                },
            ),
        ]);
        let outcome = assemble(dir.path(), &tasks, 4096);
        assert!(outcome.prefixes.is_empty(), "{:?}", outcome.prefixes);
        assert_eq!(outcome.from_tree + outcome.from_files, 0);
    }

    /// This process's own memory, read through `read_task`, digests like the bytes.
    #[test]
    fn own_memory_reads_back_as_its_bytes() {
        let data: Vec<u8> = (0..64 * PAGE_PIECE).map(|i| (i * 31 % 251) as u8).collect();
        // Aligned to a piece, as a mapping's pages are.
        let mut region = vec![0u8; data.len() + PAGE_PIECE];
        let at = region.as_ptr().align_offset(PAGE_PIECE);
        region[at..at + data.len()].copy_from_slice(&data);
        let start = region[at..].as_ptr() as u64;
        let pid = std::process::id() as i32;
        let mut digests = TaskDigests::default();
        let mut buf = vec![0u8; 3 * PAGE_PIECE];
        let go = AtomicBool::new(false);
        read_run(
            pid,
            start,
            start + data.len() as u64,
            &mut buf,
            &mut digests,
            &go,
        );
        assert_eq!(digests.runs.len(), 1, "one run, read in several buffers");
        for (i, piece) in data.chunks(PAGE_PIECE).enumerate() {
            let addr = start + (i * PAGE_PIECE) as u64;
            assert_eq!(digests.lookup(addr), Some(piece_digest(piece)), "piece {i}");
        }
        let maps = std::fs::read_to_string(procfs::maps_path(pid)).unwrap();
        let page_size = crate::units::host_page_size();
        let whole = read_task(pid, &maps, page_size, &mut buf, &go);
        assert!(whole.pieces() >= 64);
        assert_eq!(whole.lookup(start), Some(piece_digest(&data[..PAGE_PIECE])));
    }
}
