//! The framing of CRIU images: an optional head magic, the image magic, then entries,
//! each a little-endian u32 length followed by that many bytes of protobuf.
//!
//! Reads are bounded by the file: an entry is allocated only after its length has been
//! checked against the bytes left in the file, so a corrupt length field cannot make the
//! reader allocate more than the file holds.

use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use prost::{Message, Name};

use crate::error::{ErrorKind, ImageError, Result};
use crate::magic;
use crate::store::{Source, SourceReader};

/// What precedes the image magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// `IMG_COMMON`: an ordinary image.
    Common,
    /// `IMG_SERVICE`: stats-dump, stats-restore, irmap-cache.
    Service,
    /// No head magic: inventory.img.
    Bare,
}

/// An open CRIU image, positioned after its magic(s).
#[derive(Debug)]
pub struct ImageFile {
    path: PathBuf,
    reader: BufReader<SourceReader>,
    size: u64,
    pos: u64,
    head: Head,
    magic: u32,
    buf: Vec<u8>,
}

/// One entry as read from the file.
#[derive(Debug)]
pub struct RawEntry<'a> {
    /// Offset of the entry's length field.
    pub offset: u64,
    /// The protobuf payload.
    pub payload: &'a [u8],
}

impl ImageFile {
    /// Open `path` and read its magic(s). Any magic that follows a head magic is
    /// accepted (newer CRIU versions add image types); without a head magic only
    /// inventory.img's magic is valid.
    pub fn open(path: &Path) -> Result<ImageFile> {
        let file = crate::store::open_regular(path).map_err(|e| ImageError::io(path, 0, e))?;
        ImageFile::from_source(path, Source::File(file))
    }

    /// Read the magic(s) of an image opened elsewhere (held in memory); `path` names
    /// it in errors.
    pub fn from_source(path: &Path, source: Source) -> Result<ImageFile> {
        let size = source.size().map_err(|e| ImageError::io(path, 0, e))?;
        let capacity = size.clamp(64, 64 * 1024) as usize;
        let mut image = ImageFile {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(capacity, source.into_reader()),
            size,
            pos: 0,
            head: Head::Bare,
            magic: 0,
            buf: Vec::new(),
        };
        let first = image.read_u32()?;
        match first {
            magic::IMG_COMMON | magic::IMG_SERVICE => {
                image.head = if first == magic::IMG_COMMON {
                    Head::Common
                } else {
                    Head::Service
                };
                image.magic = image.read_u32()?;
            }
            magic::INVENTORY => image.magic = first,
            found => return Err(ImageError::new(path, 0, ErrorKind::BadHeadMagic { found })),
        }
        Ok(image)
    }

    /// Open `path`, which must hold images of type `expected` (a [`magic`] constant).
    pub fn open_as(path: &Path, expected: u32) -> Result<ImageFile> {
        ImageFile::open(path)?.expect_magic(expected)
    }

    /// This image, if it holds images of type `expected`.
    pub fn expect_magic(self, expected: u32) -> Result<ImageFile> {
        let image = self;
        let path = image.path.clone();
        let path = path.as_path();
        if image.magic != expected {
            let offset = if image.head == Head::Bare { 0 } else { 4 };
            return Err(ImageError::new(
                path,
                offset,
                ErrorKind::WrongMagic {
                    expected: magic::name(expected).unwrap_or("?"),
                    expected_value: expected,
                    found: image.magic,
                },
            ));
        }
        Ok(image)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn magic(&self) -> u32 {
        self.magic
    }

    pub fn head(&self) -> Head {
        self.head
    }

    /// The size of the file in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The current read position.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    /// Bytes between the current position and the end of the file.
    pub fn remaining(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    /// The next entry's payload, or None at a clean end of file.
    pub fn read_raw(&mut self) -> Result<Option<RawEntry<'_>>> {
        let offset = self.pos;
        let Some(len) = self.read_u32_or_eof()? else {
            return Ok(None);
        };
        let len = u64::from(len);
        if len > self.remaining() {
            return Err(ImageError::new(
                &self.path,
                offset,
                ErrorKind::EntryTooLarge {
                    size: len,
                    available: self.remaining(),
                },
            ));
        }
        // Bounded: `len` is at most what is left of the file.
        self.buf.resize(len as usize, 0);
        let at = self.pos;
        self.reader
            .read_exact(&mut self.buf)
            .map_err(|e| self.read_error(at, len, e))?;
        self.pos += len;
        Ok(Some(RawEntry {
            offset,
            payload: &self.buf,
        }))
    }

    /// The next entry decoded as `M`, with its offset; None at a clean end of file.
    pub fn read_entry_at<M: Message + Name + Default>(&mut self) -> Result<Option<(u64, M)>> {
        let path = self.path.clone();
        let Some(entry) = self.read_raw()? else {
            return Ok(None);
        };
        let offset = entry.offset;
        let message = M::decode(entry.payload).map_err(|source| {
            ImageError::new(
                path,
                offset,
                ErrorKind::Decode {
                    message: M::NAME,
                    source,
                },
            )
        })?;
        Ok(Some((offset, message)))
    }

    /// The next entry decoded as `M`; None at a clean end of file.
    pub fn read_entry<M: Message + Name + Default>(&mut self) -> Result<Option<M>> {
        Ok(self.read_entry_at()?.map(|(_, m)| m))
    }

    /// Skip `len` bytes of payload that follow an entry (pipe data, queued packets).
    pub fn skip(&mut self, len: u64) -> Result<()> {
        if len > self.remaining() {
            return Err(ImageError::new(
                &self.path,
                self.pos,
                ErrorKind::Truncated {
                    needed: len,
                    available: self.remaining(),
                },
            ));
        }
        let offset = i64::try_from(len).expect("bounded by the file size");
        self.reader
            .seek_relative(offset)
            .map_err(|e| ImageError::io(&self.path, self.pos, e))?;
        self.pos += len;
        Ok(())
    }

    /// Skip to the end of the file.
    pub fn skip_to_end(&mut self) -> Result<()> {
        self.skip(self.remaining())
    }

    /// Rewind to just after the magic(s).
    pub fn rewind(&mut self) -> Result<()> {
        let start = if self.head == Head::Bare { 4 } else { 8 };
        self.reader
            .seek(SeekFrom::Start(start))
            .map_err(|e| ImageError::io(&self.path, 0, e))?;
        self.pos = start;
        Ok(())
    }

    fn read_u32(&mut self) -> Result<u32> {
        let at = self.pos;
        match self.read_u32_or_eof()? {
            Some(v) => Ok(v),
            None => Err(ImageError::new(
                &self.path,
                at,
                ErrorKind::Truncated {
                    needed: 4,
                    available: 0,
                },
            )),
        }
    }

    /// A little-endian u32, None if the file ends exactly here, an error if it ends
    /// inside the four bytes.
    fn read_u32_or_eof(&mut self) -> Result<Option<u32>> {
        let mut word = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match self.reader.read(&mut word[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ImageError::io(&self.path, self.pos, e)),
            }
        }
        let at = self.pos;
        self.pos += got as u64;
        match got {
            0 => Ok(None),
            4 => Ok(Some(u32::from_le_bytes(word))),
            n => Err(ImageError::new(
                &self.path,
                at,
                ErrorKind::Truncated {
                    needed: 4,
                    available: n as u64,
                },
            )),
        }
    }

    fn read_error(&self, at: u64, len: u64, e: io::Error) -> ImageError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // The file shrank after it was opened.
            ImageError::new(
                &self.path,
                at,
                ErrorKind::Truncated {
                    needed: len,
                    available: 0,
                },
            )
        } else {
            ImageError::io(&self.path, at, e)
        }
    }
}

/// Every entry of `path` (of type `expected`) decoded as `M`.
pub fn read_all<M: Message + Name + Default>(path: &Path, expected: u32) -> Result<Vec<M>> {
    read_all_of(ImageFile::open_as(path, expected)?)
}

/// Every entry of an open image decoded as `M`.
pub fn read_all_of<M: Message + Name + Default>(mut image: ImageFile) -> Result<Vec<M>> {
    let mut out = Vec::new();
    while let Some(m) = image.read_entry()? {
        out.push(m);
    }
    Ok(out)
}

/// The first entry of `path` (of type `expected`) decoded as `M`; an image with no
/// entry is an error.
pub fn read_one<M: Message + Name + Default>(path: &Path, expected: u32) -> Result<M> {
    read_one_of(ImageFile::open_as(path, expected)?)
}

/// The first entry of an open image decoded as `M`; no entry is an error.
pub fn read_one_of<M: Message + Name + Default>(mut image: ImageFile) -> Result<M> {
    let end = image.offset();
    let path = image.path.clone();
    image
        .read_entry()?
        .ok_or_else(|| ImageError::new(path, end, ErrorKind::Empty { message: M::NAME }))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::proto::PstreeEntry;

    fn image(words: &[u32], entries: &[&[u8]]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for w in words {
            f.write_all(&w.to_le_bytes()).unwrap();
        }
        for e in entries {
            f.write_all(&(e.len() as u32).to_le_bytes()).unwrap();
            f.write_all(e).unwrap();
        }
        f
    }

    #[test]
    fn reads_entries_after_both_magics() {
        let entry = PstreeEntry {
            pid: 1,
            ppid: 0,
            pgid: 1,
            sid: 1,
            threads: vec![1, 2],
        };
        let bytes = entry.encode_to_vec();
        let f = image(&[magic::IMG_COMMON, magic::PSTREE], &[&bytes, &bytes]);
        let all: Vec<PstreeEntry> = read_all(f.path(), magic::PSTREE).unwrap();
        assert_eq!(all, vec![entry.clone(), entry]);
    }

    #[test]
    fn wrong_magic_is_named() {
        let f = image(&[magic::IMG_COMMON, magic::CORE], &[]);
        let err = ImageFile::open_as(f.path(), magic::PSTREE).unwrap_err();
        assert_eq!(err.offset, 4);
        assert!(err.to_string().contains("(CORE), expected PSTREE"), "{err}");
    }

    #[test]
    fn huge_length_in_small_file_is_an_error_not_an_allocation() {
        let mut f = image(&[magic::IMG_COMMON, magic::PSTREE], &[]);
        f.write_all(&u32::MAX.to_le_bytes()).unwrap();
        f.write_all(&[0u8; 88]).unwrap();
        let mut img = ImageFile::open(f.path()).unwrap();
        let err = img.read_raw().unwrap_err();
        assert_eq!(err.offset, 8);
        assert!(
            matches!(
                err.kind,
                ErrorKind::EntryTooLarge {
                    size: 4_294_967_295,
                    available: 88
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn partial_length_field_is_truncation() {
        let mut f = image(&[magic::IMG_COMMON, magic::PSTREE], &[]);
        f.write_all(&[1, 0]).unwrap();
        let mut img = ImageFile::open(f.path()).unwrap();
        let err = img.read_raw().unwrap_err();
        assert!(
            matches!(
                err.kind,
                ErrorKind::Truncated {
                    needed: 4,
                    available: 2
                }
            ),
            "{err}"
        );
        assert_eq!(err.offset, 8);
    }

    #[test]
    fn garbage_head_is_rejected_at_offset_zero() {
        let f = image(&[0xdead_beef, magic::PSTREE], &[]);
        let err = ImageFile::open(f.path()).unwrap_err();
        assert_eq!(err.offset, 0);
        assert!(matches!(
            err.kind,
            ErrorKind::BadHeadMagic { found: 0xdead_beef }
        ));
    }

    #[test]
    fn undecodable_entry_names_message_and_offset() {
        let f = image(
            &[magic::IMG_COMMON, magic::PSTREE],
            &[&[0x08], &[0xff, 0xff]],
        );
        let mut img = ImageFile::open(f.path()).unwrap();
        let err = img.read_entry::<PstreeEntry>().unwrap_err();
        assert_eq!(err.offset, 8);
        assert!(
            err.to_string()
                .contains("at offset 8: malformed pstree_entry entry"),
            "{err}"
        );
    }

    #[test]
    fn skip_is_bounded() {
        let f = image(&[magic::IMG_COMMON, magic::PIPES_DATA], &[&[]]);
        let mut img = ImageFile::open(f.path()).unwrap();
        img.read_raw().unwrap().unwrap();
        let err = img.skip(10).unwrap_err();
        assert!(matches!(
            err.kind,
            ErrorKind::Truncated {
                needed: 10,
                available: 0
            }
        ));
    }
}
