//! Constants of the on-disk format (`docs/gpu-image-format.md`) and a bounds-checked
//! little-endian reader for it.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::error::TransferError;

/// Format version written in the index and in every data file header.
pub const VERSION: u32 = 1;

/// The index file's name inside `gpu/`.
pub const INDEX_FILE: &str = "index";
/// The index is written under this name, then renamed to [`INDEX_FILE`].
pub const INDEX_TEMP_FILE: &str = "index.tmp";
/// First bytes of the index.
pub const INDEX_MAGIC: [u8; 8] = *b"GPUCRIDX";
/// First bytes of the index's trailer.
pub const TRAILER_MAGIC: [u8; 8] = *b"GPUCREND";
/// First bytes of every data file.
pub const DATA_MAGIC: [u8; 8] = *b"GPUCRDAT";

/// Index header bytes.
pub const HEADER_LEN: u64 = 64;
/// Bytes per data file entry.
pub const FILE_ENTRY_LEN: u64 = 8;
/// Bytes per buffer entry.
pub const BUFFER_ENTRY_LEN: u64 = 32;
/// Bytes per chunk entry.
pub const CHUNK_ENTRY_LEN: u64 = 48;
/// Index trailer bytes: magic and checksum.
pub const TRAILER_LEN: u64 = 16;
/// Data file header bytes: magic, version, file number.
pub const DATA_HEADER_LEN: u64 = 16;
/// The largest index accepted (about 22 million chunks: 21 TiB of 1 MiB chunks).
pub const MAX_INDEX_LEN: u64 = 1 << 30;

/// Codec numbers in the index header.
pub const CODEC_NONE: u32 = 0;
pub const CODEC_ZSTD: u32 = 1;

/// Encoding numbers in a chunk entry.
pub const ENCODING_ZERO: u8 = 0;
pub const ENCODING_RAW: u8 = 1;
pub const ENCODING_ZSTD: u8 = 2;

/// The name of data file `n`.
pub fn data_file_name(n: usize) -> String {
    format!("data-{n:04}")
}

/// Whether `name` (within `gpu/`) is a data file's: written from start to end by one
/// pack thread, never rewritten.
pub fn is_data_file_name(name: &str) -> bool {
    name.strip_prefix("data-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The header of data file `n`.
pub fn data_header(n: u32) -> [u8; DATA_HEADER_LEN as usize] {
    let mut h = [0u8; DATA_HEADER_LEN as usize];
    h[..8].copy_from_slice(&DATA_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&n.to_le_bytes());
    h
}

/// Check that `file` (data file `n`, at `path`) starts with the right header and has
/// the size the index records.
pub fn check_data_file(
    file: &File,
    path: &Path,
    n: usize,
    expected_size: u64,
) -> Result<(), TransferError> {
    let damaged = |offset: u64, what: String| TransferError::DataFile {
        path: path.to_path_buf(),
        offset,
        what,
    };
    let size = file
        .metadata()
        .map_err(|e| TransferError::io("stat", path, e))?
        .len();
    if size != expected_size {
        return Err(damaged(
            size.min(expected_size),
            format!("the file is {size} bytes, the index says {expected_size}"),
        ));
    }
    let mut header = [0u8; DATA_HEADER_LEN as usize];
    (&*file)
        .read_exact(&mut header)
        .map_err(|e| TransferError::io("read", path, e))?;
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    if header[..8] != DATA_MAGIC {
        return Err(damaged(0, "not a gpucr data file (bad magic)".into()));
    }
    if header[8..12] != VERSION.to_le_bytes() {
        return Err(damaged(8, "unsupported data file version".into()));
    }
    if header[12..16] != n32.to_le_bytes() {
        return Err(damaged(12, format!("the header does not name file {n}")));
    }
    Ok(())
}

/// Reads little-endian fields from a byte slice, never past its end, and knows the
/// offset of each field for error messages.
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    /// Offset of the next field.
    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// The next `n` bytes, or `None` past the end.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|a| a[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_stops_at_the_end() {
        let bytes = [1u8, 0, 0, 0, 2];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u32(), Some(1));
        assert_eq!(c.pos(), 4);
        assert_eq!(c.u32(), None);
        assert_eq!(c.u8(), Some(2));
        assert_eq!(c.u8(), None);
        assert_eq!(c.take(usize::MAX), None);
    }

    #[test]
    fn data_file_names_sort() {
        assert_eq!(data_file_name(3), "data-0003");
        assert!(is_data_file_name(&data_file_name(12)));
        for other in ["index", "index.tmp", "data-", "data-1x", "xdata-1"] {
            assert!(!is_data_file_name(other), "{other}");
        }
        assert!(data_file_name(9) < data_file_name(10));
    }
}
