//! Room for the manifest, taken before a dump lets its tree go.
//!
//! The manifest is written last, once CRIU is done, and a dump that kills its tree
//! has killed it by then. On a file system that CRIU's image filled, the manifest
//! could not be written: the tree was gone and its image incomplete. The dump takes
//! the manifest's room at CRIU's post-dump, while the tree is still frozen; where
//! there is none, the dump fails there and the tree keeps running.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gpucr_abi::procfs;
use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags};

use super::atomic::{put_in_place, temporary_path};
use super::checksum::block_count;
use super::dir::image_files;
use super::MANIFEST_FILE;

/// What the manifest needs besides its per-file records: the header, the target, the
/// options, the topology and the timeline.
const FIXED_ROOM: u64 = 64 << 10;
/// A file's record without its block digests, its path aside (pretty JSON).
const FILE_RECORD_ROOM: u64 = 256;
/// One block digest in a file's record (pretty JSON: indentation, quotes, 16 digits).
const BLOCK_DIGEST_ROOM: u64 = 48;
/// The files CRIU writes for a process besides one `core-TID.img` per thread (`mm`,
/// `pagemap`, `pages`, `fdinfo`, `ids`, `fs`, ...), with room to spare.
const FILES_PER_PROCESS: u64 = 16;
/// The name of a task's image file (`pagemap-4194304.img`), with room to spare.
const TASK_FILE_NAME: u64 = 32;

/// The manifest's room was not there.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: no room for the manifest ({bytes} bytes): the image cannot be completed \
     on this file system"
)]
pub struct RoomError {
    pub path: PathBuf,
    pub bytes: u64,
    #[source]
    pub source: io::Error,
}

/// Room for the manifest, taken in its temporary file; given back (the file removed)
/// when it is dropped unused.
#[derive(Debug)]
pub struct ManifestRoom {
    file: File,
    path: PathBuf,
    used: bool,
}

/// How much room the manifest of the image CRIU has written into `dir` may need, at
/// most, with a GPU section of `gpu_bytes` as JSON: twice an estimate from the files
/// and their sizes.
pub fn needed(dir: &Path, gpu_bytes: u64) -> u64 {
    let files = image_files(dir).unwrap_or_default();
    let records: u64 = files
        .iter()
        .map(|name| {
            let size = fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0);
            FILE_RECORD_ROOM + name.len() as u64 + BLOCK_DIGEST_ROOM * block_count(size) as u64
        })
        .sum();
    2 * (FIXED_ROOM + records + gpu_bytes)
}

/// [`needed`], taken before CRIU has written every task's memory (engine mode, where
/// the last hook whose failure CRIU honours comes before it dumps the tasks' pages):
/// besides the files already in `dir`, each process of the frozen tree rooted at
/// `root` counts with its files, one per thread, and a pages file as large as its
/// resident and swapped memory (more than CRIU writes of it).
pub fn needed_for_tree(dir: &Path, gpu_bytes: u64, root: i32) -> u64 {
    let ahead: u64 = procfs::tree_pids(root)
        .into_iter()
        .map(|pid| {
            let files = FILES_PER_PROCESS + procfs::threads(pid).len() as u64;
            files * (FILE_RECORD_ROOM + TASK_FILE_NAME)
                + BLOCK_DIGEST_ROOM * block_count(memory_bytes(pid)) as u64
        })
        .sum();
    needed(dir, gpu_bytes) + 2 * ahead
}

/// The resident and swapped memory of `pid` (`VmRSS` and `VmSwap` of
/// `/proc/PID/status`), 0 where it cannot be read (a kernel thread has none).
fn memory_bytes(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status")).map_or(0, |status| {
        ["VmRSS", "VmSwap"]
            .iter()
            .filter_map(|name| status_kib(&status, name))
            .sum::<u64>()
            .saturating_mul(1024)
    })
}

/// A `NAME: N kB` field of a `/proc/PID/status` text, in KiB.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    procfs::status_value(status, name)?
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

impl ManifestRoom {
    /// Take `bytes` of room in `dir` for its manifest.
    pub fn take(dir: &Path, bytes: u64) -> Result<ManifestRoom, RoomError> {
        let path = temporary_path(&dir.join(MANIFEST_FILE));
        let err = |source| RoomError {
            path: path.clone(),
            bytes,
            source,
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(err)?;
        if let Err(source) = allocate(&file, bytes) {
            let _ = fs::remove_file(&path);
            return Err(err(source));
        }
        Ok(ManifestRoom {
            file,
            path,
            used: false,
        })
    }

    /// Write `text` into the room, cut the rest off, fsync it, rename it to `path` and
    /// fsync the directory: the manifest is in place, atomically.
    pub fn write(mut self, path: &Path, text: &[u8]) -> io::Result<()> {
        self.used = true;
        self.file.write_all_at(text, 0)?;
        self.file.set_len(text.len() as u64)?;
        put_in_place(&self.file, &self.path, path)
    }
}

impl Drop for ManifestRoom {
    fn drop(&mut self) {
        if !self.used {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Allocate `bytes` for `file`: `fallocate` where the file system has it, else zeros
/// written out.
fn allocate(file: &File, bytes: u64) -> io::Result<()> {
    let len = i64::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    match fallocate(file.as_fd(), FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(Errno::EOPNOTSUPP) => {
            let zeros = vec![0u8; 64 << 10];
            let mut at = 0u64;
            while at < bytes {
                let n = (bytes - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.sync_data()
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn the_room_becomes_the_manifest_and_an_unused_one_goes() {
        let dir = tempfile::tempdir().unwrap();
        let room = ManifestRoom::take(dir.path(), 100_000).unwrap();
        let tmp = temporary_path(&dir.path().join(MANIFEST_FILE));
        assert_eq!(fs::metadata(&tmp).unwrap().len(), 100_000);
        let path = dir.path().join(MANIFEST_FILE);
        room.write(&path, b"{}\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{}\n");
        assert!(!tmp.exists());
        drop(ManifestRoom::take(dir.path(), 4096).unwrap());
        assert!(!tmp.exists(), "an unused room is given back");
    }

    #[test]
    fn the_estimate_grows_with_the_files_and_their_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let empty = needed(dir.path(), 0);
        assert_eq!(empty, 2 * FIXED_ROOM);
        let pages = File::create(dir.path().join("pages-1.img")).unwrap();
        pages.set_len(10 * (4 << 20)).unwrap();
        let with_pages = needed(dir.path(), 1000);
        assert_eq!(
            with_pages,
            2 * (FIXED_ROOM
                + FILE_RECORD_ROOM
                + "pages-1.img".len() as u64
                + 10 * BLOCK_DIGEST_ROOM
                + 1000)
        );
    }

    /// Before CRIU has dumped the tree, its processes stand in for the files to come,
    /// each with its threads and its memory.
    #[test]
    fn the_estimate_ahead_of_the_pages_counts_the_tree() {
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t   1234 kB\nVmSwap:\t0 kB\n", "VmRSS"),
            Some(1234)
        );
        assert_eq!(status_kib("Name:\tx\n", "VmSwap"), None);
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let memory = memory_bytes(me);
        assert!(memory > 0);
        let threads = procfs::threads(me).len() as u64;
        let tree = needed_for_tree(dir.path(), 0, me);
        let own = (FILES_PER_PROCESS + threads) * (FILE_RECORD_ROOM + TASK_FILE_NAME)
            + BLOCK_DIGEST_ROOM * block_count(memory) as u64;
        // This process's memory and threads may change between the two readings.
        assert!(tree > needed(dir.path(), 0) + own, "{tree}");
    }

    /// On a full file system the room is refused and nothing is left behind.
    #[test]
    fn no_room_on_a_full_file_system_leaves_nothing() {
        let mount = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(mount.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            // Not root: the unit can still be shown on a size nothing can hold.
            let err = ManifestRoom::take(mount.path(), u64::MAX / 2).unwrap_err();
            assert!(
                err.to_string().contains("no room for the manifest"),
                "{err}"
            );
            return;
        }
        let err = ManifestRoom::take(mount.path(), 1 << 20).unwrap_err();
        let _ = Command::new("umount").arg(mount.path()).status();
        assert_eq!(err.source.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert!(err.to_string().contains(".gpucr.json.tmp"), "{err}");
    }
}
