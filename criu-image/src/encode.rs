//! Writing CRIU images: the inverse of [`crate::framing`], for fixtures and tests.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use prost::Message;

use crate::framing::Head;
use crate::magic;

/// The bytes of an image: head magic (unless `Bare`), `magic`, then each entry with
/// its length.
pub fn image_bytes<M: Message>(head: Head, magic_value: u32, entries: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    match head {
        Head::Common => out.extend_from_slice(&magic::IMG_COMMON.to_le_bytes()),
        Head::Service => out.extend_from_slice(&magic::IMG_SERVICE.to_le_bytes()),
        Head::Bare => {}
    }
    out.extend_from_slice(&magic_value.to_le_bytes());
    for entry in entries {
        push_entry(&mut out, entry);
    }
    out
}

/// Append one entry (length, then protobuf) to `out`.
pub fn push_entry<M: Message>(out: &mut Vec<u8>, entry: &M) {
    let len = u32::try_from(entry.encoded_len()).expect("an entry is smaller than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    entry.encode_raw(out);
}

/// Write an image file.
pub fn write_image<M: Message>(
    path: &Path,
    head: Head,
    magic_value: u32,
    entries: &[M],
) -> io::Result<()> {
    let mut file = BufWriter::new(File::create(path)?);
    file.write_all(&image_bytes(head, magic_value, entries))?;
    file.into_inner().map_err(|e| e.into_error())?.sync_all()
}
