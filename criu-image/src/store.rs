//! Where an image directory's files are read from: the filesystem, or memory.
//!
//! A checkpoint archive (podman, CRI-O, containerd) is read as a stream, never unpacked
//! to disk. Its small images are kept whole in a [`MemoryFiles`]; of a large pages
//! file only the byte ranges a reader asked for in advance are kept (a sparse
//! [`MemoryFile`]). An [`crate::ImageDir`] over a [`MemoryFiles`] reads them like files.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// Open an image file for reading, refusing anything but a regular file (a symbolic
/// link to one is followed). A FIFO or a device node where an image file belongs would
/// block `open` or `read` forever; the file is opened non-blocking, which a regular
/// file ignores, and its type checked before anything is read. The error for anything
/// else is of kind `InvalidInput` and says what the file is.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file (a {})", describe(kind)),
    ))
}

/// The whole content of the regular file at `path` (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// One file held in memory: its size, and the byte ranges that are held (all of it for
/// a whole file, a few pages of a large pages file).
#[derive(Debug, Clone)]
pub struct MemoryFile {
    size: u64,
    /// Start offset -> bytes; ranges do not overlap.
    extents: Arc<BTreeMap<u64, Vec<u8>>>,
}

impl MemoryFile {
    /// A file held whole.
    pub fn whole(bytes: Vec<u8>) -> MemoryFile {
        let size = bytes.len() as u64;
        let mut extents = BTreeMap::new();
        if !bytes.is_empty() {
            extents.insert(0, bytes);
        }
        MemoryFile {
            size,
            extents: Arc::new(extents),
        }
    }

    /// A file of `size` bytes of which only `extents` (start offset -> bytes, not
    /// overlapping) are held.
    pub fn sparse(size: u64, extents: BTreeMap<u64, Vec<u8>>) -> MemoryFile {
        MemoryFile {
            size,
            extents: Arc::new(extents),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held in memory.
    pub fn held(&self) -> u64 {
        self.extents.values().map(|v| v.len() as u64).sum()
    }

    /// Fill `buf` from `offset`; an error when part of the range is past the end or not
    /// held.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        let mut at = offset;
        while at < end {
            let Some((&start, bytes)) = self.extents.range(..=at).next_back() else {
                return Err(not_held(at));
            };
            let held_end = start + bytes.len() as u64;
            if held_end <= at {
                return Err(not_held(at));
            }
            let n = (held_end.min(end) - at) as usize;
            let from = (at - start) as usize;
            let to = (at - offset) as usize;
            buf[to..to + n].copy_from_slice(&bytes[from..from + n]);
            at += n as u64;
        }
        Ok(())
    }
}

fn not_held(offset: u64) -> io::Error {
    io::Error::other(format!(
        "byte {offset} was not kept in memory while the archive was read"
    ))
}

/// Files held in memory, by name relative to the image directory (`core-1.img`,
/// `gpu/index`).
#[derive(Debug, Clone, Default)]
pub struct MemoryFiles {
    files: BTreeMap<String, MemoryFile>,
}

impl MemoryFiles {
    pub fn new() -> MemoryFiles {
        MemoryFiles::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, file: MemoryFile) {
        self.files.insert(name.into(), file);
    }

    pub fn get(&self, name: &str) -> Option<&MemoryFile> {
        self.files.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Bytes held in memory over all files.
    pub fn held(&self) -> u64 {
        self.files.values().map(MemoryFile::held).sum()
    }
}

/// An open file: on disk or in memory.
#[derive(Debug)]
pub enum Source {
    File(File),
    Memory(MemoryFile),
}

impl Source {
    /// The size of the file.
    pub fn size(&self) -> io::Result<u64> {
        match self {
            Source::File(f) => Ok(f.metadata()?.len()),
            Source::Memory(m) => Ok(m.size),
        }
    }

    /// Fill `buf` from `offset`.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Source::File(f) => f.read_exact_at(buf, offset),
            Source::Memory(m) => m.read_exact_at(buf, offset),
        }
    }

    /// A sequential reader over the source.
    pub fn into_reader(self) -> SourceReader {
        SourceReader {
            source: self,
            pos: 0,
        }
    }
}

/// [`Read`] and [`Seek`] over a [`Source`].
#[derive(Debug)]
pub struct SourceReader {
    source: Source,
    pos: u64,
}

impl Read for SourceReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.source {
            Source::File(f) => {
                let n = f.read_at(buf, self.pos)?;
                self.pos += n as u64;
                Ok(n)
            }
            Source::Memory(m) => {
                let left = m.size.saturating_sub(self.pos);
                let n = (buf.len() as u64).min(left) as usize;
                m.read_exact_at(&mut buf[..n], self.pos)?;
                self.pos += n as u64;
                Ok(n)
            }
        }
    }
}

impl Seek for SourceReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::Current(delta) => self.pos.checked_add_signed(delta),
            SeekFrom::End(delta) => self.source.size()?.checked_add_signed(delta),
        };
        self.pos = target.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_files_read_only_what_they_hold() {
        let mut extents = BTreeMap::new();
        extents.insert(4, vec![1, 2, 3, 4]);
        extents.insert(8, vec![5, 6]);
        let f = MemoryFile::sparse(16, extents);
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, 4).unwrap();
        assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
        assert!(f.read_exact_at(&mut [0u8; 2], 2).is_err());
        assert!(f.read_exact_at(&mut [0u8; 2], 9).is_err());
        let err = f.read_exact_at(&mut [0u8; 4], 14).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(f.held(), 6);
    }

    #[test]
    fn readers_over_memory_read_and_seek() {
        let mut r = Source::Memory(MemoryFile::whole(b"abcdef".to_vec())).into_reader();
        let mut buf = [0u8; 4];
        r.seek(SeekFrom::Start(2)).unwrap();
        assert_eq!(r.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf, b"cdef");
        assert_eq!(r.read(&mut buf).unwrap(), 0);
        r.seek(SeekFrom::Current(-3)).unwrap();
        assert_eq!(r.read(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"def");
    }

    #[test]
    fn only_regular_files_are_opened_and_a_fifo_is_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("core-1.img");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file).unwrap(), b"abc");
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(
            read_regular(&link).unwrap(),
            b"abc",
            "a link to a file is followed"
        );
        let err = open_regular(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(err.to_string(), "not a regular file (a directory)");
        // No writer ever comes: a blocking open would wait forever.
        let fifo = dir.path().join("pages-1.img");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read_regular(&fifo).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (a FIFO)");
        let err = open_regular(Path::new("/dev/null")).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (a character device)");
    }
}
