//! The image's files on the wire: listed and sent by the source, written by the
//! receiver into its fresh directory, each path confined beneath it.
//!
//! A path is relative and made of plain components only (no `..`, no `.`, no root, no
//! empty part). The receiver creates every directory and file itself, in a directory
//! it made (0700) and nobody else writes: directories with `mkdir` (0700), files with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` (0600), so no path can lead through a link or onto
//! a file it did not create. Every chunk's xxh3 is checked before it is written, and a
//! file must end at the size announced. The files are put on disk ([`Unsynced`]) on a
//! thread of their own while the restore reads them from the page cache.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::link::{Link, LinkError, CHUNK_SIZE};
use super::message::Control;

/// The longest path accepted, in bytes.
const MAX_PATH: usize = 1024;
/// How deep a path may go.
const MAX_DEPTH: usize = 8;

/// Why a file could not be sent or written.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{path:?}: not a confined image path ({why})")]
    Unconfined { path: String, why: &'static str },
    #[error("{path}: not a regular file or directory; an image holds no other kind")]
    NotRegular { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: the chunk at offset {offset} does not match its checksum")]
    Corrupt { path: PathBuf, offset: u64 },
    #[error("{path}: {got} bytes where {announced} were announced")]
    WrongSize {
        path: PathBuf,
        announced: u64,
        got: u64,
    },
    #[error("a chunk with no file announced before it")]
    StrayChunk,
    #[error("{path}: a part at offset {offset} overlaps one received")]
    Overlap { path: PathBuf, offset: u64 },
    #[error("{path}: parts scattered into more than {most} ranges")]
    Scattered { path: PathBuf, most: usize },
    #[error("{path:?}: said whole, but no part of it was sent")]
    NoParts { path: String },
    #[error("{path:?}: sent in parts, but never said whole")]
    NotWhole { path: String },
    #[error("the receiver refused: {reason}")]
    Refused { reason: String },
    #[error("{message} while a file was being received")]
    Unexpected { message: &'static str },
    #[error(transparent)]
    Link(#[from] LinkError),
}

impl FilesError {
    /// Whether the destination's file system is full.
    pub fn disk_full(&self) -> bool {
        matches!(self, FilesError::Write { source, .. }
            if source.raw_os_error() == Some(libc::ENOSPC)
                || source.raw_os_error() == Some(libc::EDQUOT))
    }
}

/// Check that `path` is a confined image path; the path, as a relative `PathBuf`.
pub fn confined(path: &str) -> Result<PathBuf, FilesError> {
    let refuse = |why| FilesError::Unconfined {
        path: path.to_owned(),
        why,
    };
    if path.is_empty() || path.len() > MAX_PATH {
        return Err(refuse("empty or too long"));
    }
    if path.contains('\0') {
        return Err(refuse("a NUL byte"));
    }
    let mut depth = 0;
    for part in path.split('/') {
        match Path::new(part).components().next() {
            _ if part.is_empty() => return Err(refuse("an empty component or a root")),
            Some(Component::Normal(_)) if part != "." && part != ".." => depth += 1,
            _ => return Err(refuse("a '.' or '..' component")),
        }
    }
    if depth > MAX_DEPTH {
        return Err(refuse("too deep"));
    }
    Ok(PathBuf::from(path))
}

/// The files of the image at `dir`, relative, sorted, the manifest (`last`) last.
pub fn list(dir: &Path, last: &str) -> Result<Vec<(String, u64)>, FilesError> {
    let mut found = Vec::new();
    walk(dir, Path::new(""), &mut found)?;
    found.sort_by(|(a, _), (b, _)| (a == last).cmp(&(b == last)).then(a.cmp(b)));
    Ok(found)
}

fn walk(root: &Path, below: &Path, found: &mut Vec<(String, u64)>) -> Result<(), FilesError> {
    let here = root.join(below);
    let read = |source| FilesError::Read {
        path: here.clone(),
        source,
    };
    for entry in std::fs::read_dir(&here).map_err(read)? {
        let entry = entry.map_err(read)?;
        let relative = below.join(entry.file_name());
        let kind = entry.file_type().map_err(read)?;
        if kind.is_dir() {
            walk(root, &relative, found)?;
        } else if kind.is_file() {
            let size = entry.metadata().map_err(read)?.len();
            let name = relative.to_str().ok_or_else(|| FilesError::Unconfined {
                path: relative.to_string_lossy().into_owned(),
                why: "not UTF-8",
            })?;
            found.push((name.to_owned(), size));
        } else {
            return Err(FilesError::NotRegular {
                path: root.join(relative),
            });
        }
    }
    Ok(())
}

/// Send the file `name` of `dir` over `link`: File, its chunks, FileEnd. `sent` is
/// called with the bytes of each chunk once it is sent.
pub fn send(
    link: &mut Link,
    dir: &Path,
    name: &str,
    sent: &mut dyn FnMut(u64),
) -> Result<(), FilesError> {
    let path = dir.join(confined(name)?);
    let read = |source| FilesError::Read {
        path: path.clone(),
        source,
    };
    let mut file = File::open(&path).map_err(read)?;
    let size = file.metadata().map_err(read)?.len();
    link.send(&Control::File {
        path: name.to_owned(),
        size,
    })?;
    let mut buf = vec![0u8; CHUNK_SIZE];
    let mut total = 0u64;
    loop {
        let n = read_full(&mut file, &mut buf).map_err(read)?;
        if n == 0 {
            break;
        }
        link.send_chunk(&buf[..n])?;
        total += n as u64;
        sent(n as u64);
    }
    if total != size {
        return Err(FilesError::WrongSize {
            path,
            announced: size,
            got: total,
        });
    }
    link.send(&Control::FileEnd)?;
    Ok(())
}

/// Fill `buf` from `file` as far as it goes; the bytes read (less only at the end).
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Writes received files beneath a directory the receiver made.
#[derive(Debug)]
pub struct ImageWriter {
    root: PathBuf,
    files: u64,
    bytes: u64,
    unsynced: Vec<(PathBuf, File)>,
    /// The files reserved for blocks written in later (post-copy).
    reserved: Vec<(PathBuf, File)>,
}

impl ImageWriter {
    /// A writer into `root`, a fresh directory of the receiver's.
    pub fn new(root: &Path) -> ImageWriter {
        ImageWriter {
            root: root.to_path_buf(),
            files: 0,
            bytes: 0,
            unsynced: Vec::new(),
            reserved: Vec::new(),
        }
    }

    /// Files and bytes written so far.
    pub fn written(&self) -> (u64, u64) {
        (self.files, self.bytes)
    }

    /// Receive the file `name` of `size` bytes (its File message already read): its
    /// chunks, checked, then FileEnd.
    pub fn receive(&mut self, link: &mut Link, name: &str, size: u64) -> Result<(), FilesError> {
        let (path, mut file) = create_confined(&self.root, name)?;
        let write = |source| FilesError::Write {
            path: path.clone(),
            source,
        };
        let mut got = 0u64;
        loop {
            match link.receive()? {
                super::link::Incoming::Chunk { digest, data } => {
                    if !Link::chunk_intact(digest, data) {
                        return Err(FilesError::Corrupt { path, offset: got });
                    }
                    if got + data.len() as u64 > size {
                        return Err(FilesError::WrongSize {
                            path,
                            announced: size,
                            got: got + data.len() as u64,
                        });
                    }
                    file.write_all(data).map_err(write)?;
                    got += data.len() as u64;
                }
                super::link::Incoming::Control(Control::FileEnd) => break,
                super::link::Incoming::Control(other) => {
                    return Err(FilesError::Unexpected {
                        message: other.name(),
                    })
                }
            }
        }
        if got != size {
            return Err(FilesError::WrongSize {
                path,
                announced: size,
                got,
            });
        }
        self.unsynced.push((path, file));
        self.files += 1;
        self.bytes += got;
        Ok(())
    }

    /// Make the file `name` of `size` bytes, sparse, for its blocks to be written in
    /// later (post-copy).
    pub fn reserve(&mut self, name: &str, size: u64) -> Result<(), FilesError> {
        let (path, file) = create_confined(&self.root, name)?;
        if let Err(source) = file.set_len(size) {
            return Err(FilesError::Write { path, source });
        }
        self.reserved.push((path, file));
        self.files += 1;
        Ok(())
    }

    /// Every file is in: what is left to put on disk, its files and `more` (those
    /// written in parts), and the root directory, so that their names are too; and,
    /// apart, the files reserved for later blocks, to be put on disk once those are in.
    pub fn finish(self, more: Vec<(PathBuf, File)>) -> (Unsynced, Unsynced) {
        let mut files = self.unsynced;
        files.extend(more);
        let reserved = Unsynced {
            files: self.reserved,
            root: self.root.clone(),
        };
        let written = Unsynced {
            files,
            root: self.root,
        };
        (written, reserved)
    }
}

/// Received files not yet put on disk, and the directory they are in.
#[derive(Debug)]
pub struct Unsynced {
    files: Vec<(PathBuf, File)>,
    root: PathBuf,
}

/// The files being put on disk, on a thread of their own.
#[derive(Debug)]
pub struct Syncing(std::thread::JoinHandle<Result<(), FilesError>>);

impl Unsynced {
    /// Put every file on disk, then the directory.
    pub fn sync(self) -> Result<(), FilesError> {
        for (path, file) in self.files {
            file.sync_all()
                .map_err(|source| FilesError::Write { path, source })?;
        }
        File::open(&self.root)
            .and_then(|d| d.sync_all())
            .map_err(|source| FilesError::Write {
                path: self.root,
                source,
            })
    }

    /// [`Unsynced::sync`] on a thread of its own: the restore reads the files from
    /// the page cache meanwhile, and need not wait for the disk.
    pub fn start(self) -> Syncing {
        Syncing(std::thread::spawn(move || self.sync()))
    }
}

impl Syncing {
    /// Wait until every file is on disk.
    pub fn wait(self) -> Result<(), FilesError> {
        self.0.join().unwrap_or(Err(FilesError::Unexpected {
            message: "a panic of the thread putting the image on disk",
        }))
    }
}

/// Make the file `name` beneath `root` (a directory the receiver made), new (0600,
/// never through a link), and the directories above it: its path and the file, open
/// for writing.
pub fn create_confined(root: &Path, name: &str) -> Result<(PathBuf, File), FilesError> {
    let relative = confined(name)?;
    let path = root.join(&relative);
    if let Some(parent) = relative.parent() {
        make_dirs(root, parent)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => Ok((path, file)),
        Err(source) => Err(FilesError::Write { path, source }),
    }
}

/// Make each directory of `relative` beneath `root` that is not there yet (0700); one
/// that is there must be a directory, never a link.
fn make_dirs(root: &Path, relative: &Path) -> Result<(), FilesError> {
    let mut path = root.to_path_buf();
    for part in relative.components() {
        path.push(part);
        let write = |source| FilesError::Write {
            path: path.clone(),
            source,
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let meta = std::fs::symlink_metadata(&path).map_err(write)?;
                if !meta.is_dir() {
                    return Err(FilesError::NotRegular { path });
                }
            }
            Err(e) => return Err(write(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::link::testing::{pair, with_a_damaged_chunk};
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_confined() {
        for good in ["pages-1.img", "gpu/state/task-1.bin", "gpucr.json"] {
            confined(good).unwrap();
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "gpu/../../x",
            "./x",
            "a//b",
            "a/",
            "a/./b",
            "a\0b",
            "a/b/c/d/e/f/g/h/i",
        ] {
            assert!(confined(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_directory_arrives_whole_with_the_manifest_last() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("gpu/state")).unwrap();
        std::fs::write(src.path().join("gpucr.json"), b"{}").unwrap();
        std::fs::write(
            src.path().join("pages-1.img"),
            vec![7u8; 3 * CHUNK_SIZE + 5],
        )
        .unwrap();
        std::fs::write(src.path().join("gpu/state/task-1.bin"), b"state").unwrap();
        let files = list(src.path(), "gpucr.json").unwrap();
        assert_eq!(files.last().unwrap().0, "gpucr.json");
        let dst = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair();
        let sender = std::thread::spawn({
            let src = src.path().to_path_buf();
            let files = files.clone();
            move || {
                for (name, _) in &files {
                    send(&mut a, &src, name, &mut |_| {}).unwrap();
                }
            }
        });
        let mut writer = ImageWriter::new(dst.path());
        for _ in &files {
            let Control::File { path, size } = b.receive_control().unwrap() else {
                panic!("no file")
            };
            writer.receive(&mut b, &path, size).unwrap();
        }
        sender.join().unwrap();
        for (name, size) in files {
            let got = std::fs::read(dst.path().join(&name)).unwrap();
            assert_eq!(got.len() as u64, size, "{name}");
            assert_eq!(got, std::fs::read(src.path().join(&name)).unwrap());
        }
    }

    #[test]
    fn a_corrupt_chunk_and_an_escaping_path_are_refused() {
        let dst = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair();
        let mut y = with_a_damaged_chunk(b"data");
        let mut writer = ImageWriter::new(dst.path());
        let err = writer.receive(&mut y, "pages-1.img", 4).unwrap_err();
        assert!(
            matches!(err, FilesError::Corrupt { offset: 0, .. }),
            "{err}"
        );
        let err = writer.receive(&mut b, "../escape", 1).unwrap_err();
        assert!(matches!(err, FilesError::Unconfined { .. }), "{err}");
        assert!(!dst.path().join("../escape").exists());
        a.send(&Control::Done).unwrap();
    }
}
