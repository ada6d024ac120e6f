//! The SDMA linear copy packet that gpucr writes into its indirect buffers, and the
//! splitting of a copy into packets.
//!
//! No uAPI header declares the packet; its layout is the one the kernel's SDMA drivers emit
//! (`*_emit_copy_buffer` in drivers/gpu/drm/amd/amdgpu/cik_sdma.c, sdma_v2_4.c, sdma_v3_0.c,
//! sdma_v4_0.c and later) and CRIU's amdgpu plugin writes (plugins/amdgpu/amdgpu_plugin.c):
//! seven little-endian dwords,
//!
//! | dword | content |
//! |-------|---------|
//! | 0 | header: `(extra & 0xFFFF) << 16 \| (sub_op & 0xFF) << 8 \| (op & 0xFF)`, COPY (1) / LINEAR (0): `0x00000001` |
//! | 1 | count (see [`CountEncoding`]) |
//! | 2 | parameters (endian swap): 0 |
//! | 3, 4 | source GPU VA, low then high 32 bits |
//! | 5, 6 | destination GPU VA, low then high 32 bits |
//!
//! The count field changed meaning with SDMA 4.0 (Vega10, `AMDGPU_FAMILY_AI`): before, it
//! holds the byte count; from 4.0 on, the byte count minus one. CRIU's plugin writes the
//! byte count on every generation, so on SDMA 4.0 and later each of its packets copies one
//! byte more than asked (overwritten by the next packet, except after the last packet of a
//! batch or buffer). gpucr encodes the count for the generation the device reports.

use thiserror::Error;

use super::{AMDGPU_FAMILY_AI, AMDGPU_FAMILY_CI};

/// `SDMA_OP_NOP`: a one-dword no-op (header 0), used to pad an indirect buffer.
pub const SDMA_OP_NOP: u32 = 0;
/// `SDMA_OP_COPY`.
pub const SDMA_OP_COPY: u32 = 1;
/// `SDMA_SUBOP_COPY_LINEAR`.
pub const SDMA_SUBOP_COPY_LINEAR: u32 = 0;
/// Dwords in a linear copy packet.
pub const COPY_LINEAR_DWORDS: usize = 7;
/// An indirect buffer's length is padded with NOPs to a multiple of this many dwords.
pub const IB_ALIGN_DWORDS: usize = 8;
/// The most bytes gpucr copies with one packet: 2 MiB (`SDMA_LINEAR_COPY_MAX_SIZE`).
pub const MAX_COPY_BYTES: u32 = 1 << 21;
/// Every packet but the last of a copy is a multiple of this, so that a copy that starts
/// page-aligned keeps every packet page-aligned.
pub const PIECE_ALIGN: u32 = 4096;

/// An SDMA packet header.
pub const fn header(op: u32, sub_op: u32, extra: u32) -> u32 {
    ((extra & 0xFFFF) << 16) | ((sub_op & 0xFF) << 8) | (op & 0xFF)
}

/// The header of a linear copy packet: `0x00000001`.
pub const COPY_LINEAR_HEADER: u32 = header(SDMA_OP_COPY, SDMA_SUBOP_COPY_LINEAR, 0);

/// What dword 1 of a linear copy packet holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CountEncoding {
    /// CIK SDMA, SDMA 2.4 and 3.x (families CI, KV, VI, CZ): the byte count, at most
    /// 0x1FFFFF (the kernel's `copy_max_bytes` for these engines).
    Bytes,
    /// SDMA 4.0 and later (families AI and newer): the byte count minus one.
    BytesMinusOne,
}

impl CountEncoding {
    /// From the SDMA IP major version (`drm_amdgpu_info_hw_ip::hw_ip_version_major` for
    /// `AMDGPU_HW_IP_DMA`). Versions below 2 are SI's DMA engine, whose packets differ.
    pub const fn for_sdma_version(major: u32) -> Option<Self> {
        match major {
            0 | 1 => None,
            2 | 3 => Some(CountEncoding::Bytes),
            _ => Some(CountEncoding::BytesMinusOne),
        }
    }

    /// From the device family (`drm_amdgpu_info_device::family`). SI (and unknown
    /// families) have no SDMA engine with this packet.
    pub const fn for_family(family: u32) -> Option<Self> {
        if family >= AMDGPU_FAMILY_AI {
            Some(CountEncoding::BytesMinusOne)
        } else if family >= AMDGPU_FAMILY_CI {
            Some(CountEncoding::Bytes)
        } else {
            None
        }
    }

    /// The count field for a packet copying `bytes` (1 or more) bytes.
    pub const fn count_field(self, bytes: u32) -> u32 {
        match self {
            CountEncoding::Bytes => bytes,
            CountEncoding::BytesMinusOne => bytes - 1,
        }
    }

    /// The most bytes gpucr puts in one packet: [`MAX_COPY_BYTES`] where the count field
    /// can say it, otherwise the largest multiple of [`PIECE_ALIGN`] it can say
    /// (2 MiB - 4 KiB for [`CountEncoding::Bytes`]).
    pub const fn max_packet_bytes(self) -> u32 {
        match self {
            CountEncoding::Bytes => (0x1F_FFFF / PIECE_ALIGN) * PIECE_ALIGN,
            CountEncoding::BytesMinusOne => MAX_COPY_BYTES,
        }
    }
}

/// Why a copy cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SdmaError {
    #[error("an SDMA copy of 0 bytes")]
    Empty,
    #[error("an SDMA copy packet of {len} bytes exceeds the {max}-byte limit")]
    PacketTooLarge { len: u64, max: u32 },
    #[error("a copy of {len} bytes at {addr:#x} runs past the end of the address space")]
    AddressOverflow { addr: u64, len: u64 },
}

/// One linear copy packet: `len` bytes (1 to [`CountEncoding::max_packet_bytes`]) from GPU
/// VA `src` to GPU VA `dst`.
pub const fn copy_linear_packet(
    enc: CountEncoding,
    src: u64,
    dst: u64,
    len: u32,
) -> Result<[u32; COPY_LINEAR_DWORDS], SdmaError> {
    if len == 0 {
        return Err(SdmaError::Empty);
    }
    let max = enc.max_packet_bytes();
    if len > max {
        return Err(SdmaError::PacketTooLarge {
            len: len as u64,
            max,
        });
    }
    if src.checked_add(len as u64).is_none() {
        return Err(SdmaError::AddressOverflow {
            addr: src,
            len: len as u64,
        });
    }
    if dst.checked_add(len as u64).is_none() {
        return Err(SdmaError::AddressOverflow {
            addr: dst,
            len: len as u64,
        });
    }
    Ok([
        COPY_LINEAR_HEADER,
        enc.count_field(len),
        0,
        src as u32,
        (src >> 32) as u32,
        dst as u32,
        (dst >> 32) as u32,
    ])
}

/// One packet's share of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPiece {
    pub src: u64,
    pub dst: u64,
    pub len: u32,
}

/// The pieces of a copy, in address order; see [`split_copy`].
#[derive(Debug, Clone)]
pub struct Pieces {
    src: u64,
    dst: u64,
    remaining: u64,
    max: u64,
}

impl Iterator for Pieces {
    type Item = CopyPiece;

    fn next(&mut self) -> Option<CopyPiece> {
        if self.remaining == 0 {
            return None;
        }
        let len = self.remaining.min(self.max);
        let piece = CopyPiece {
            src: self.src,
            dst: self.dst,
            len: len as u32,
        };
        // Cannot overflow: split_copy checked src + len and dst + len.
        self.src += len;
        self.dst += len;
        self.remaining -= len;
        Some(piece)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining.div_ceil(self.max) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Pieces {}

/// Splits a copy of `len` bytes from `src` to `dst` into packets of at most
/// [`CountEncoding::max_packet_bytes`] bytes; every piece but the last has that size.
pub fn split_copy(enc: CountEncoding, src: u64, dst: u64, len: u64) -> Result<Pieces, SdmaError> {
    if len == 0 {
        return Err(SdmaError::Empty);
    }
    for addr in [src, dst] {
        if addr.checked_add(len).is_none() {
            return Err(SdmaError::AddressOverflow { addr, len });
        }
    }
    Ok(Pieces {
        src,
        dst,
        remaining: len,
        max: u64::from(enc.max_packet_bytes()),
    })
}

/// Appends the packets of a copy to an indirect buffer; returns how many it appended.
pub fn emit_copy(
    ib: &mut Vec<u32>,
    enc: CountEncoding,
    src: u64,
    dst: u64,
    len: u64,
) -> Result<usize, SdmaError> {
    let pieces = split_copy(enc, src, dst, len)?;
    let n = pieces.len();
    ib.reserve(n * COPY_LINEAR_DWORDS);
    for p in pieces {
        ib.extend_from_slice(&copy_linear_packet(enc, p.src, p.dst, p.len)?);
    }
    Ok(n)
}

/// Pads an indirect buffer with NOPs to a multiple of [`IB_ALIGN_DWORDS`].
pub fn pad_ib(ib: &mut Vec<u32>) {
    let padded = ib.len().next_multiple_of(IB_ALIGN_DWORDS);
    ib.resize(padded, header(SDMA_OP_NOP, 0, 0));
}

/// The dwords of an indirect buffer holding `packets` copy packets, padded.
pub const fn ib_dwords(packets: usize) -> usize {
    (packets * COPY_LINEAR_DWORDS).next_multiple_of(IB_ALIGN_DWORDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: u64 = 1 << 21;
    const GIB: u64 = 1 << 30;

    #[test]
    fn header_is_copy_linear() {
        assert_eq!(COPY_LINEAR_HEADER, 0x0000_0001);
        assert_eq!(header(SDMA_OP_NOP, 0, 0), 0);
        assert_eq!(header(0x1FF, 0x1AB, 0x1_2345), 0x2345_ABFF);
    }

    #[test]
    fn count_field_per_generation() {
        let p = copy_linear_packet(CountEncoding::BytesMinusOne, 0x1000, 0x2000, 4096).unwrap();
        assert_eq!(p[1], 4095);
        let p = copy_linear_packet(CountEncoding::Bytes, 0x1000, 0x2000, 4096).unwrap();
        assert_eq!(p[1], 4096);
        // The largest packet of each encoding still fits the hardware's count field.
        assert_eq!(
            CountEncoding::BytesMinusOne
                .count_field(CountEncoding::BytesMinusOne.max_packet_bytes()),
            0x1F_FFFF
        );
        assert_eq!(CountEncoding::Bytes.max_packet_bytes(), (2 << 20) - 4096);
        assert!(CountEncoding::Bytes.max_packet_bytes() <= 0x1F_FFFF);
    }

    #[test]
    fn generation_from_device() {
        use CountEncoding::*;
        assert_eq!(CountEncoding::for_sdma_version(1), None);
        assert_eq!(CountEncoding::for_sdma_version(2), Some(Bytes));
        assert_eq!(CountEncoding::for_sdma_version(3), Some(Bytes));
        assert_eq!(CountEncoding::for_sdma_version(4), Some(BytesMinusOne));
        assert_eq!(CountEncoding::for_sdma_version(6), Some(BytesMinusOne));
        assert_eq!(
            CountEncoding::for_family(super::super::AMDGPU_FAMILY_SI),
            None
        );
        assert_eq!(
            CountEncoding::for_family(super::super::AMDGPU_FAMILY_CI),
            Some(Bytes)
        );
        assert_eq!(
            CountEncoding::for_family(super::super::AMDGPU_FAMILY_CZ),
            Some(Bytes)
        );
        assert_eq!(
            CountEncoding::for_family(AMDGPU_FAMILY_AI),
            Some(BytesMinusOne)
        );
        assert_eq!(CountEncoding::for_family(143), Some(BytesMinusOne));
    }

    #[test]
    fn addresses_above_4_gib() {
        let src = 0x0000_0001_2345_6000;
        let dst = 0x0000_7FFF_8000_1000;
        let p = copy_linear_packet(CountEncoding::BytesMinusOne, src, dst, 8192).unwrap();
        assert_eq!(
            p,
            [
                1,
                8191,
                0,
                0x2345_6000,
                0x0000_0001,
                0x8000_1000,
                0x0000_7FFF
            ]
        );
    }

    #[test]
    fn split_offsets_above_2_31() {
        // 5 GiB + 123 bytes from just below 4 GiB to a high VA: pieces cross offsets 2^31
        // and 2^32 and the 4 GiB address boundary.
        let src = 0xFFFF_F000;
        let dst = 0x0000_7F00_0000_0000;
        let len = 5 * GIB + 123;
        let enc = CountEncoding::BytesMinusOne;
        let pieces: Vec<_> = split_copy(enc, src, dst, len).unwrap().collect();
        assert_eq!(pieces.len() as u64, len.div_ceil(MIB2));
        let mut at = 0u64;
        for p in &pieces {
            assert_eq!(p.src, src + at);
            assert_eq!(p.dst, dst + at);
            assert!(p.len as u64 <= MIB2);
            at += p.len as u64;
        }
        assert_eq!(at, len);
        assert_eq!(pieces.last().unwrap().len, 123);

        // The piece at offset 2^31 and the one at offset 2^32.
        for offset in [1u64 << 31, 1u64 << 32] {
            let i = (offset / MIB2) as usize;
            let p = pieces[i];
            assert_eq!(p.src, src + offset);
            let packet = copy_linear_packet(enc, p.src, p.dst, p.len).unwrap();
            assert_eq!(packet[1], (MIB2 - 1) as u32);
            assert_eq!(packet[3], (src + offset) as u32);
            assert_eq!(packet[4], ((src + offset) >> 32) as u32);
            assert_eq!(packet[5], (dst + offset) as u32);
            assert_eq!(packet[6], ((dst + offset) >> 32) as u32);
        }
        assert_eq!(pieces[(1usize << 31) / MIB2 as usize].src, 0x1_7FFF_F000);
        assert_eq!(pieces[(1usize << 32) / MIB2 as usize].src, 0x1_FFFF_F000);
    }

    #[test]
    fn split_keeps_pieces_aligned_before_sdma4() {
        let enc = CountEncoding::Bytes;
        let max = enc.max_packet_bytes() as u64;
        let src = 0x0000_0008_0000_0000;
        let pieces: Vec<_> = split_copy(enc, src, 0x1000, 3 * GIB).unwrap().collect();
        assert_eq!(pieces.len() as u64, (3 * GIB).div_ceil(max));
        for p in &pieces[..pieces.len() - 1] {
            assert_eq!(p.len as u64, max);
            assert_eq!(p.src % PIECE_ALIGN as u64, 0);
            assert_eq!(p.dst % PIECE_ALIGN as u64, 0);
            let packet = copy_linear_packet(enc, p.src, p.dst, p.len).unwrap();
            assert_eq!(packet[1], p.len);
        }
        let total: u64 = pieces.iter().map(|p| p.len as u64).sum();
        assert_eq!(total, 3 * GIB);
    }

    #[test]
    fn emit_and_pad() {
        let mut ib = Vec::new();
        let n = emit_copy(
            &mut ib,
            CountEncoding::BytesMinusOne,
            0x1_0000_0000,
            0x2_0000_0000,
            2 * MIB2 + 1,
        )
        .unwrap();
        assert_eq!(n, 3);
        assert_eq!(ib.len(), 21);
        assert_eq!(
            &ib[7..14],
            &[1, (MIB2 - 1) as u32, 0, 0x0020_0000, 1, 0x0020_0000, 2]
        );
        assert_eq!(&ib[14..21], &[1, 0, 0, 0x0040_0000, 1, 0x0040_0000, 2]);
        pad_ib(&mut ib);
        assert_eq!(ib.len(), 24);
        assert_eq!(&ib[21..], &[0, 0, 0]);
        assert_eq!(ib_dwords(3), 24);
        assert_eq!(ib_dwords(8), 56);
        let mut aligned = vec![1u32; 16];
        pad_ib(&mut aligned);
        assert_eq!(aligned.len(), 16);
    }

    /// The sizes the issue names: 4 KiB, 2 MiB - 1, 2 MiB, 2 MiB + 1 and 1 GiB, on both
    /// count encodings: the packets' byte counts add up, every packet but the last is
    /// full, packets stay page-aligned, and the IB is padded.
    #[test]
    fn packets_for_the_named_sizes() {
        let src = 0x0000_0001_0000_0000u64;
        let dst = 0x0000_7F00_0000_0000u64;
        for enc in [CountEncoding::Bytes, CountEncoding::BytesMinusOne] {
            let max = enc.max_packet_bytes() as u64;
            for len in [4096, MIB2 - 1, MIB2, MIB2 + 1, GIB] {
                let mut ib = Vec::new();
                let n = emit_copy(&mut ib, enc, src, dst, len).unwrap();
                assert_eq!(n as u64, len.div_ceil(max), "{enc:?} {len}");
                assert_eq!(ib.len(), n * COPY_LINEAR_DWORDS);
                let mut at = 0u64;
                for (i, packet) in ib.chunks(COPY_LINEAR_DWORDS).enumerate() {
                    assert_eq!(packet[0], COPY_LINEAR_HEADER);
                    assert_eq!(packet[2], 0);
                    let bytes = match enc {
                        CountEncoding::Bytes => packet[1] as u64,
                        CountEncoding::BytesMinusOne => packet[1] as u64 + 1,
                    };
                    assert!(bytes <= max && bytes <= MIB2, "{enc:?} {len}: {bytes}");
                    if i + 1 < n {
                        assert_eq!(bytes, max, "{enc:?} {len}: packet {i} not full");
                    }
                    let s = packet[3] as u64 | (packet[4] as u64) << 32;
                    let d = packet[5] as u64 | (packet[6] as u64) << 32;
                    assert_eq!((s, d), (src + at, dst + at));
                    assert_eq!(s % PIECE_ALIGN as u64, 0);
                    assert_eq!(d % PIECE_ALIGN as u64, 0);
                    at += bytes;
                }
                assert_eq!(at, len, "{enc:?} {len}");
                pad_ib(&mut ib);
                assert_eq!(ib.len() % IB_ALIGN_DWORDS, 0);
                assert_eq!(ib.len(), ib_dwords(n));
            }
        }
        // With the byte count minus one, 2 MiB is one packet whose count is 2^21 - 1, and
        // 2 MiB + 1 ends with a one-byte packet whose count is 0.
        let mut ib = Vec::new();
        emit_copy(&mut ib, CountEncoding::BytesMinusOne, src, dst, MIB2 + 1).unwrap();
        assert_eq!((ib[1], ib[8]), ((MIB2 - 1) as u32, 0));
    }

    #[test]
    fn rejects_bad_copies() {
        let enc = CountEncoding::BytesMinusOne;
        assert_eq!(copy_linear_packet(enc, 0, 0, 0), Err(SdmaError::Empty));
        assert!(split_copy(enc, 0, 0, 0).is_err());
        assert_eq!(
            copy_linear_packet(enc, 0, 0, MAX_COPY_BYTES + 1),
            Err(SdmaError::PacketTooLarge {
                len: MAX_COPY_BYTES as u64 + 1,
                max: MAX_COPY_BYTES
            })
        );
        assert!(matches!(
            copy_linear_packet(CountEncoding::Bytes, 0, 0, MAX_COPY_BYTES),
            Err(SdmaError::PacketTooLarge { .. })
        ));
        assert_eq!(
            split_copy(enc, u64::MAX - 10, 0, 11).err(),
            Some(SdmaError::AddressOverflow {
                addr: u64::MAX - 10,
                len: 11
            })
        );
        assert!(matches!(
            copy_linear_packet(enc, 0, u64::MAX, 1),
            Err(SdmaError::AddressOverflow { .. })
        ));
    }
}
