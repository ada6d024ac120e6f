//! One chunk on its way to and from the image: zero detection, compression, checksums,
//! and the reverse with verification.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use twox_hash::XxHash3_64;

use super::config::Compression;
use super::error::ProblemKind;
use super::index::{ChunkEntry, Encoding};

/// A compressed chunk is kept only when it is below this share of the raw size
/// (per mille); otherwise the raw bytes are stored and decompression is skipped on
/// restore.
const KEEP_COMPRESSED_PER_MILLE: usize = 970;

/// Bytes of each probe taken before a large chunk is compressed.
const PROBE_LEN: usize = 16 << 10;
/// Probes per chunk, spread evenly over it.
const PROBES: usize = 4;

/// True when every probe of `raw` (four 16 KiB pieces at 0, 1/4, 1/2 and 3/4 of it)
/// fails to shrink below the keep threshold: the chunk is then stored raw without
/// compressing all of it. Random or already-compressed data costs 1.5% of a full
/// compression instead of 100%; a compressible chunk stops at the first probe that
/// shrinks (0.4%). Chunks under 16 probes long are always compressed whole.
fn looks_incompressible(
    cctx: &mut zstd::bulk::Compressor<'static>,
    raw: &[u8],
    out: &mut [u8],
) -> bool {
    if raw.len() < 4 * PROBES * PROBE_LEN {
        return false;
    }
    let limit = PROBE_LEN * KEEP_COMPRESSED_PER_MILLE / 1000;
    (0..PROBES).all(|i| {
        let start = raw.len() / PROBES * i;
        let probe = &raw[start..start + PROBE_LEN];
        !matches!(cctx.compress_to_buffer(probe, &mut out[..limit]), Ok(n) if n < limit)
    })
}

pub fn xxh3(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// True when every byte is zero. Word-at-a-time, stops at the first non-zero word.
pub fn is_zero(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(64);
    for block in &mut words {
        let mut acc = 0u64;
        for w in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&b| b == 0)
}

/// How one chunk is to be stored.
pub struct Packed<'a> {
    pub encoding: Encoding,
    /// The bytes to append to a data file (empty for zero chunks).
    pub stored: &'a [u8],
    pub stored_xxh3: u64,
    pub raw_xxh3: u64,
}

/// Packs chunks for one thread, keeping its zstd context and output buffer.
pub struct Packer {
    compressor: Option<zstd::bulk::Compressor<'static>>,
    out: Vec<u8>,
}

impl Packer {
    pub fn new(compression: Compression) -> io::Result<Packer> {
        let compressor = match compression {
            Compression::None => None,
            Compression::Zstd(level) => Some(zstd::bulk::Compressor::new(level)?),
        };
        Ok(Packer {
            compressor,
            out: Vec::new(),
        })
    }

    /// Decide how `raw` is stored: elided if zero, compressed if that pays, else raw.
    pub fn pack<'a>(&'a mut self, raw: &'a [u8]) -> Packed<'a> {
        if is_zero(raw) {
            return Packed {
                encoding: Encoding::Zero,
                stored: &[],
                stored_xxh3: 0,
                raw_xxh3: 0,
            };
        }
        let raw_xxh3 = xxh3(raw);
        if let Some(cctx) = &mut self.compressor {
            let limit = raw.len() * KEEP_COMPRESSED_PER_MILLE / 1000;
            self.out.resize(limit, 0);
            if looks_incompressible(cctx, raw, &mut self.out) {
                return Packed {
                    encoding: Encoding::Raw,
                    stored: raw,
                    stored_xxh3: raw_xxh3,
                    raw_xxh3,
                };
            }
            // An output buffer below the limit makes zstd give up on chunks that do not
            // shrink enough: they are stored raw.
            if let Ok(n) = cctx.compress_to_buffer(raw, &mut self.out[..limit]) {
                if n > 0 && n < limit {
                    let stored = &self.out[..n];
                    return Packed {
                        encoding: Encoding::Zstd,
                        stored,
                        stored_xxh3: xxh3(stored),
                        raw_xxh3,
                    };
                }
            }
        }
        Packed {
            encoding: Encoding::Raw,
            stored: raw,
            stored_xxh3: raw_xxh3,
            raw_xxh3,
        }
    }
}

/// What [`Unpacker::unpack_stored`] found a chunk's raw bytes to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpacked {
    /// All zeros (nothing is stored).
    Zero,
    /// The stored bytes themselves (a raw chunk): nothing was copied.
    Stored,
    /// Decompressed into the output buffer.
    Decompressed,
}

/// Check a raw chunk's `stored` bytes (which are its raw bytes).
pub fn check_raw(stored: &[u8], c: &ChunkEntry) -> Result<(), ProblemKind> {
    if xxh3(stored) != c.stored_xxh3 {
        return Err(ProblemKind::ChecksumMismatch);
    }
    // Raw chunks have one checksum, stored and raw being the same bytes; the index
    // requires both fields to agree.
    if c.raw_xxh3 != c.stored_xxh3 || stored.len() != c.raw_len as usize {
        return Err(ProblemKind::ContentMismatch);
    }
    Ok(())
}

/// Verifies and decompresses chunks for one thread.
pub struct Unpacker {
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    scratch: Vec<u8>,
}

impl Unpacker {
    pub fn new() -> Unpacker {
        Unpacker {
            decompressor: None,
            scratch: Vec::new(),
        }
    }

    /// Check chunk `c` given its `stored` bytes, and decompress a compressed chunk into
    /// `out` (resized to the chunk's raw size). Raw chunks are only checked: their raw
    /// bytes are `stored`.
    pub fn unpack_stored(
        &mut self,
        stored: &[u8],
        c: &ChunkEntry,
        out: &mut Vec<u8>,
    ) -> Result<Unpacked, ProblemKind> {
        match c.encoding {
            Encoding::Zero => Ok(Unpacked::Zero),
            Encoding::Raw => check_raw(stored, c).map(|()| Unpacked::Stored),
            Encoding::Zstd => {
                if xxh3(stored) != c.stored_xxh3 {
                    return Err(ProblemKind::ChecksumMismatch);
                }
                out.resize(c.raw_len as usize, 0);
                self.decompress(stored, out)?;
                if xxh3(out) != c.raw_xxh3 {
                    return Err(ProblemKind::ContentMismatch);
                }
                Ok(Unpacked::Decompressed)
            }
        }
    }

    /// Read chunk `c` from `file` into `out` (resized to the chunk's raw size) and check
    /// both checksums. Zero chunks are filled with zeros.
    pub fn unpack(
        &mut self,
        file: &File,
        c: &ChunkEntry,
        out: &mut Vec<u8>,
    ) -> Result<(), ProblemKind> {
        match c.encoding {
            Encoding::Zero => {
                out.clear();
                out.resize(c.raw_len as usize, 0);
                Ok(())
            }
            Encoding::Raw => {
                out.resize(c.stored_len as usize, 0);
                read_stored(file, c, out)?;
                check_raw(out, c)
            }
            Encoding::Zstd => {
                let mut stored = std::mem::take(&mut self.scratch);
                stored.resize(c.stored_len as usize, 0);
                let result = read_stored(file, c, &mut stored)
                    .and_then(|()| self.unpack_stored(&stored, c, out));
                self.scratch = stored;
                result.map(drop)
            }
        }
    }

    fn decompress(&mut self, stored: &[u8], out: &mut [u8]) -> Result<(), ProblemKind> {
        let dctx = match &mut self.decompressor {
            Some(d) => d,
            None => {
                let d = zstd::bulk::Decompressor::new()
                    .map_err(|e| ProblemKind::Undecodable(e.to_string()))?;
                self.decompressor.insert(d)
            }
        };
        match dctx.decompress_to_buffer(stored, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(ProblemKind::Undecodable(format!(
                "{n} bytes instead of {}",
                out.len()
            ))),
            Err(e) => Err(ProblemKind::Undecodable(e.to_string())),
        }
    }
}

fn read_stored(file: &File, c: &ChunkEntry, into: &mut [u8]) -> Result<(), ProblemKind> {
    file.read_exact_at(into, c.file_offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ProblemKind::Truncated
        } else {
            ProblemKind::Unreadable(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 1000]));
        for at in [0, 63, 64, 500, 999] {
            let mut b = vec![0u8; 1000];
            b[at] = 1;
            assert!(!is_zero(&b), "{at}");
        }
    }

    #[test]
    fn packs_each_kind() {
        let mut p = Packer::new(Compression::Zstd(1)).unwrap();
        assert_eq!(p.pack(&[0; 4096]).encoding, Encoding::Zero);
        let text: Vec<u8> = b"abcabcabc".iter().cycle().take(4096).copied().collect();
        let packed = p.pack(&text);
        assert_eq!(packed.encoding, Encoding::Zstd);
        assert!(packed.stored.len() < 200);
        let random: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut noise = random.clone();
        for (i, b) in noise.iter_mut().enumerate() {
            *b ^= (xxh3(&(i as u64).to_le_bytes()) & 0xff) as u8;
        }
        let packed = p.pack(&noise);
        assert_eq!(packed.encoding, Encoding::Raw);
        assert_eq!(packed.stored, &noise[..]);
        assert_eq!(packed.stored_xxh3, packed.raw_xxh3);

        // Large chunks are probed first: random bytes are stored raw, but a chunk that is
        // random only in part is still compressed.
        let big: Vec<u8> = (0..1u64 << 20)
            .map(|i| (xxh3(&i.to_le_bytes()) >> 7) as u8)
            .collect();
        assert_eq!(p.pack(&big).encoding, Encoding::Raw);
        let mut half = big.clone();
        half[big.len() / 2..].fill(0);
        let packed = p.pack(&half);
        assert_eq!(packed.encoding, Encoding::Zstd);
        assert!(packed.stored.len() < big.len() * 6 / 10);

        let mut none = Packer::new(Compression::None).unwrap();
        assert_eq!(none.pack(&text).encoding, Encoding::Raw);
    }
}
