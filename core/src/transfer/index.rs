//! The chunk index (`gpu/index`): which buffers the image holds and where each chunk of
//! each buffer is stored. Encoded and decoded here; every field a damaged index can get
//! wrong is checked, and every error names the byte offset of the field.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use twox_hash::XxHash3_64;

use super::config::{Compression, MAX_CHUNK_SIZE, MAX_JOBS, MIN_CHUNK_SIZE};
use super::error::{ChunkProblem, ProblemKind, TransferError};
use super::format::*;
use super::source::BufferKey;
use super::GPU_DIR;

/// How a chunk is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// All zeros: nothing stored.
    Zero,
    /// The bytes as they are.
    Raw,
    /// One zstd frame.
    Zstd,
}

impl Encoding {
    fn code(self) -> u8 {
        match self {
            Encoding::Zero => ENCODING_ZERO,
            Encoding::Raw => ENCODING_RAW,
            Encoding::Zstd => ENCODING_ZSTD,
        }
    }

    fn from_code(code: u8) -> Option<Encoding> {
        match code {
            ENCODING_ZERO => Some(Encoding::Zero),
            ENCODING_RAW => Some(Encoding::Raw),
            ENCODING_ZSTD => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// One data file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DataFileEntry {
    /// File name inside `gpu/`.
    pub name: String,
    /// Bytes, header included.
    pub size: u64,
}

/// One buffer, with totals over its chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferEntry {
    pub key: BufferKey,
    /// Bytes in the buffer.
    pub len: u64,
    /// Its first chunk in [`GpuIndex::chunks`].
    pub first_chunk: u64,
    pub chunk_count: u64,
    /// Bytes its chunks take in the data files.
    pub stored_bytes: u64,
    pub zero_chunks: u64,
    pub raw_chunks: u64,
    pub compressed_chunks: u64,
}

impl BufferEntry {
    /// A buffer entry whose totals are computed from its chunks.
    pub(crate) fn new(key: BufferKey, len: u64, first_chunk: u64, chunks: &[ChunkEntry]) -> Self {
        let mut entry = BufferEntry {
            key,
            len,
            first_chunk,
            chunk_count: chunks.len() as u64,
            stored_bytes: 0,
            zero_chunks: 0,
            raw_chunks: 0,
            compressed_chunks: 0,
        };
        for c in chunks {
            entry.stored_bytes += u64::from(c.stored_len);
            match c.encoding {
                Encoding::Zero => entry.zero_chunks += 1,
                Encoding::Raw => entry.raw_chunks += 1,
                Encoding::Zstd => entry.compressed_chunks += 1,
            }
        }
        entry
    }
}

/// One chunk: bytes `offset..offset + raw_len` of its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkEntry {
    /// Offset in the buffer.
    pub offset: u64,
    /// Bytes of buffer the chunk holds.
    pub raw_len: u32,
    /// Bytes stored in the data file (0 for zero chunks).
    pub stored_len: u32,
    pub encoding: Encoding,
    /// Data file number (0 for zero chunks).
    pub file: u16,
    /// Offset of the stored bytes in the data file (0 for zero chunks).
    pub file_offset: u64,
    /// xxh3-64 of the stored bytes (0 for zero chunks).
    pub stored_xxh3: u64,
    /// xxh3-64 of the chunk's buffer bytes (0 for zero chunks).
    pub raw_xxh3: u64,
}

/// What `gpu/index` says: the image's buffers and chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuIndex {
    pub version: u32,
    /// The nominal chunk size: every chunk but a buffer's last has this many bytes.
    pub chunk_size: u64,
    /// The compression the dump asked for (each chunk says what it got).
    pub compression: Compression,
    pub files: Vec<DataFileEntry>,
    /// Sorted by key.
    pub buffers: Vec<BufferEntry>,
    /// Buffer by buffer, in buffer order; within a buffer, by offset.
    pub chunks: Vec<ChunkEntry>,
}

impl GpuIndex {
    /// The chunks of buffer `b` (an index into [`GpuIndex::buffers`]).
    pub fn chunks_of(&self, b: usize) -> &[ChunkEntry] {
        let e = &self.buffers[b];
        let start = e.first_chunk as usize;
        &self.chunks[start..start + e.chunk_count as usize]
    }

    /// Bytes in all buffers.
    pub fn raw_bytes(&self) -> u64 {
        self.buffers.iter().map(|b| b.len).sum()
    }

    /// Bytes stored in the data files (headers excluded).
    pub fn stored_bytes(&self) -> u64 {
        self.buffers.iter().map(|b| b.stored_bytes).sum()
    }

    /// The buffer (position in [`GpuIndex::buffers`]) of each chunk.
    pub(crate) fn chunk_owners(&self) -> Vec<usize> {
        let mut owners = Vec::with_capacity(self.chunks.len());
        for (b, e) in self.buffers.iter().enumerate() {
            owners.extend(std::iter::repeat_n(b, e.chunk_count as usize));
        }
        owners
    }

    /// Describe a damaged chunk `c` of buffer `b`.
    pub(crate) fn problem(&self, c: usize, b: usize, kind: ProblemKind) -> ChunkProblem {
        let chunk = &self.chunks[c];
        ChunkProblem {
            file: self.files[usize::from(chunk.file)].name.clone(),
            file_offset: chunk.file_offset,
            chunk: c as u64,
            buffer: self.buffers[b].key,
            range: chunk.offset..chunk.offset + u64::from(chunk.raw_len),
            kind,
        }
    }

    /// The path of data file `n` of the image in `dir`.
    pub fn data_path(&self, dir: &Path, n: usize) -> PathBuf {
        dir.join(GPU_DIR).join(&self.files[n].name)
    }

    /// The encoded index: header, file table, buffer table, chunk table, trailer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = HEADER_LEN
            + FILE_ENTRY_LEN * self.files.len() as u64
            + BUFFER_ENTRY_LEN * self.buffers.len() as u64
            + CHUNK_ENTRY_LEN * self.chunks.len() as u64
            + TRAILER_LEN;
        let mut out = Vec::with_capacity(len as usize);
        let (codec, level) = match self.compression {
            Compression::None => (CODEC_NONE, 0),
            Compression::Zstd(level) => (CODEC_ZSTD, level),
        };
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.buffers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        out.extend_from_slice(&codec.to_le_bytes());
        out.extend_from_slice(&level.to_le_bytes());
        out.extend_from_slice(&self.raw_bytes().to_le_bytes());
        out.extend_from_slice(&self.stored_bytes().to_le_bytes());
        for f in &self.files {
            out.extend_from_slice(&f.size.to_le_bytes());
        }
        for b in &self.buffers {
            out.extend_from_slice(&b.key.task.to_le_bytes());
            out.extend_from_slice(&b.key.buffer.to_le_bytes());
            out.extend_from_slice(&b.len.to_le_bytes());
            out.extend_from_slice(&b.first_chunk.to_le_bytes());
            out.extend_from_slice(&b.chunk_count.to_le_bytes());
        }
        for c in &self.chunks {
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&c.file_offset.to_le_bytes());
            out.extend_from_slice(&c.raw_len.to_le_bytes());
            out.extend_from_slice(&c.stored_len.to_le_bytes());
            out.extend_from_slice(&c.file.to_le_bytes());
            out.push(c.encoding.code());
            out.extend_from_slice(&[0u8; 5]);
            out.extend_from_slice(&c.stored_xxh3.to_le_bytes());
            out.extend_from_slice(&c.raw_xxh3.to_le_bytes());
        }
        out.extend_from_slice(&TRAILER_MAGIC);
        let sum = XxHash3_64::oneshot(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        debug_assert_eq!(out.len() as u64, len);
        out
    }

    /// Decode and validate an index read from `path` (named in errors).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<GpuIndex, TransferError> {
        Decoder { bytes, path }.decode()
    }
}

/// Read and validate `DIR/gpu/index`.
pub fn read_index(dir: &Path) -> Result<GpuIndex, TransferError> {
    let path = dir.join(GPU_DIR).join(INDEX_FILE);
    let len = match fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(TransferError::IndexMissing { path })
        }
        Err(e) => return Err(TransferError::io("stat", path, e)),
    };
    if len > MAX_INDEX_LEN {
        return Err(TransferError::index(
            path,
            0,
            format!("the index is {len} bytes, more than the {MAX_INDEX_LEN} accepted"),
        ));
    }
    let bytes = gpucr_criu_image::store::read_regular(&path)
        .map_err(|e| TransferError::io("read", &path, e))?;
    GpuIndex::from_bytes(&bytes, &path)
}

struct Decoder<'a> {
    bytes: &'a [u8],
    path: &'a Path,
}

impl Decoder<'_> {
    fn err(&self, offset: u64, what: impl Into<String>) -> TransferError {
        TransferError::index(self.path, offset, what)
    }

    fn short(&self, c: &Cursor<'_>) -> TransferError {
        self.err(c.pos(), "the index ends early")
    }

    fn decode(&self) -> Result<GpuIndex, TransferError> {
        let total = self.bytes.len() as u64;
        let mut c = Cursor::new(self.bytes);
        if total < HEADER_LEN + TRAILER_LEN {
            return Err(self.err(total, format!("the index is only {total} bytes")));
        }
        let magic = c.take(8).ok_or_else(|| self.short(&c))?;
        if magic != INDEX_MAGIC {
            return Err(self.err(0, "not a gpucr GPU index (bad magic)"));
        }
        let at = c.pos();
        let version = c.u32().ok_or_else(|| self.short(&c))?;
        if version != VERSION {
            return Err(self.err(
                at,
                format!("format version {version}; this gpucr reads version {VERSION}"),
            ));
        }
        let at = c.pos();
        if c.u32().ok_or_else(|| self.short(&c))? != 0 {
            return Err(self.err(at, "unknown flags"));
        }
        let at = c.pos();
        let chunk_size = c.u64().ok_or_else(|| self.short(&c))?;
        if !(MIN_CHUNK_SIZE as u64..=MAX_CHUNK_SIZE as u64).contains(&chunk_size) {
            return Err(self.err(at, format!("chunk size {chunk_size} is out of range")));
        }
        let at_files = c.pos();
        let file_count = c.u32().ok_or_else(|| self.short(&c))?;
        if file_count as usize > MAX_JOBS {
            return Err(self.err(at_files, format!("{file_count} data files is too many")));
        }
        let buffer_count = c.u32().ok_or_else(|| self.short(&c))?;
        let chunk_count = c.u64().ok_or_else(|| self.short(&c))?;
        let expected = u128::from(HEADER_LEN)
            + u128::from(FILE_ENTRY_LEN) * u128::from(file_count)
            + u128::from(BUFFER_ENTRY_LEN) * u128::from(buffer_count)
            + u128::from(CHUNK_ENTRY_LEN) * u128::from(chunk_count)
            + u128::from(TRAILER_LEN);
        if expected != u128::from(total) {
            return Err(self.err(
                at_files,
                format!(
                    "the header describes {file_count} files, {buffer_count} buffers and \
                     {chunk_count} chunks ({expected} bytes), but the index is {total} bytes"
                ),
            ));
        }
        // From here on every count is backed by bytes that exist.
        let trailer_at = total - TRAILER_LEN;
        let trailer = &self.bytes[trailer_at as usize..];
        if trailer[..8] != TRAILER_MAGIC {
            return Err(self.err(trailer_at, "bad trailer magic"));
        }
        let stored_sum = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes"));
        let sum = XxHash3_64::oneshot(&self.bytes[..total as usize - 8]);
        if sum != stored_sum {
            return Err(self.err(
                trailer_at + 8,
                format!("index checksum mismatch (stored {stored_sum:016x}, computed {sum:016x})"),
            ));
        }
        let at = c.pos();
        let codec = c.u32().ok_or_else(|| self.short(&c))?;
        let level = c.i32().ok_or_else(|| self.short(&c))?;
        let compression = match (codec, level) {
            (CODEC_NONE, 0) => Compression::None,
            (CODEC_ZSTD, l) if zstd::compression_level_range().contains(&l) => Compression::Zstd(l),
            _ => return Err(self.err(at, format!("unknown codec {codec} level {level}"))),
        };
        let at_raw = c.pos();
        let raw_total = c.u64().ok_or_else(|| self.short(&c))?;
        let at_stored = c.pos();
        let stored_total = c.u64().ok_or_else(|| self.short(&c))?;

        let mut files = Vec::with_capacity(file_count as usize);
        for n in 0..file_count as usize {
            let at = c.pos();
            let size = c.u64().ok_or_else(|| self.short(&c))?;
            if size < DATA_HEADER_LEN {
                return Err(self.err(
                    at,
                    format!("data file {n} size {size} is below its header size"),
                ));
            }
            files.push(DataFileEntry {
                name: data_file_name(n),
                size,
            });
        }

        let mut raw_buffers = Vec::with_capacity(buffer_count as usize);
        let mut next_chunk = 0u64;
        let mut previous: Option<BufferKey> = None;
        for _ in 0..buffer_count {
            let at = c.pos();
            let key = BufferKey {
                task: c.u32().ok_or_else(|| self.short(&c))?,
                buffer: c.u32().ok_or_else(|| self.short(&c))?,
            };
            if previous.is_some_and(|p| p >= key) {
                return Err(self.err(at, format!("buffer {key} is out of order or repeated")));
            }
            previous = Some(key);
            let len = c.u64().ok_or_else(|| self.short(&c))?;
            let at_first = c.pos();
            let first = c.u64().ok_or_else(|| self.short(&c))?;
            if first != next_chunk {
                return Err(self.err(
                    at_first,
                    format!("buffer {key} starts at chunk {first}, expected {next_chunk}"),
                ));
            }
            let at_count = c.pos();
            let count = c.u64().ok_or_else(|| self.short(&c))?;
            if count != len.div_ceil(chunk_size) {
                return Err(self.err(
                    at_count,
                    format!("buffer {key} of {len} bytes cannot have {count} chunks"),
                ));
            }
            next_chunk = match next_chunk.checked_add(count) {
                Some(n) if n <= chunk_count => n,
                _ => return Err(self.err(at_count, "more chunks than the index holds")),
            };
            raw_buffers.push((key, len, first, count));
        }
        if next_chunk != chunk_count {
            return Err(self.err(
                c.pos(),
                format!("the buffers have {next_chunk} chunks, the header says {chunk_count}"),
            ));
        }

        let mut chunks = Vec::with_capacity(chunk_count as usize);
        let mut buffers = Vec::with_capacity(raw_buffers.len());
        let mut raw_sum = 0u64;
        for &(key, len, first, count) in &raw_buffers {
            for k in 0..count {
                chunks.push(self.chunk(&mut c, &files, key, len, chunk_size, k)?);
            }
            let mine = &chunks[first as usize..];
            buffers.push(BufferEntry::new(key, len, first, mine));
            raw_sum = raw_sum.saturating_add(len);
        }
        if raw_sum != raw_total {
            return Err(self.err(
                at_raw,
                format!("the buffers hold {raw_sum} bytes, the header says {raw_total}"),
            ));
        }
        let stored_sum: u64 = buffers.iter().map(|b| b.stored_bytes).sum();
        if stored_sum != stored_total {
            return Err(self.err(
                at_stored,
                format!("the chunks store {stored_sum} bytes, the header says {stored_total}"),
            ));
        }
        Ok(GpuIndex {
            version,
            chunk_size,
            compression,
            files,
            buffers,
            chunks,
        })
    }

    /// Decode and check chunk `k` of buffer `key`.
    fn chunk(
        &self,
        c: &mut Cursor<'_>,
        files: &[DataFileEntry],
        key: BufferKey,
        len: u64,
        chunk_size: u64,
        k: u64,
    ) -> Result<ChunkEntry, TransferError> {
        let at = c.pos();
        let offset = c.u64().ok_or_else(|| self.short(c))?;
        let file_offset = c.u64().ok_or_else(|| self.short(c))?;
        let raw_len = c.u32().ok_or_else(|| self.short(c))?;
        let stored_len = c.u32().ok_or_else(|| self.short(c))?;
        let file = c.u16().ok_or_else(|| self.short(c))?;
        let code = c.u8().ok_or_else(|| self.short(c))?;
        let reserved = c.take(5).ok_or_else(|| self.short(c))?;
        let stored_xxh3 = c.u64().ok_or_else(|| self.short(c))?;
        let raw_xxh3 = c.u64().ok_or_else(|| self.short(c))?;
        let name = |what: String| format!("chunk {k} of buffer {key}: {what}");

        // `k < chunk_count = ceil(len / chunk_size)`, so neither product overflows.
        let want_offset = k * chunk_size;
        if offset != want_offset {
            return Err(self.err(at, name(format!("offset {offset}, expected {want_offset}"))));
        }
        let want_len = (len - want_offset).min(chunk_size);
        if u64::from(raw_len) != want_len {
            return Err(self.err(
                at + 16,
                name(format!("{raw_len} bytes, expected {want_len}")),
            ));
        }
        let encoding = Encoding::from_code(code)
            .ok_or_else(|| self.err(at + 26, name(format!("unknown encoding {code}"))))?;
        if reserved.iter().any(|&b| b != 0) {
            return Err(self.err(at + 27, name("reserved bytes are not zero".into())));
        }
        match encoding {
            Encoding::Zero => {
                if stored_len != 0
                    || file != 0
                    || file_offset != 0
                    || stored_xxh3 != 0
                    || raw_xxh3 != 0
                {
                    return Err(self.err(at, name("a zero chunk with stored data".into())));
                }
                return Ok(ChunkEntry {
                    offset,
                    raw_len,
                    stored_len,
                    encoding,
                    file,
                    file_offset,
                    stored_xxh3,
                    raw_xxh3,
                });
            }
            Encoding::Raw if stored_len != raw_len => {
                return Err(self.err(
                    at + 20,
                    name(format!("raw chunk stores {stored_len} bytes of {raw_len}")),
                ));
            }
            Encoding::Zstd if stored_len == 0 || stored_len >= raw_len => {
                return Err(self.err(
                    at + 20,
                    name(format!(
                        "compressed chunk stores {stored_len} bytes of {raw_len}"
                    )),
                ));
            }
            _ => {}
        }
        let Some(data) = files.get(usize::from(file)) else {
            return Err(self.err(at + 24, name(format!("data file {file} does not exist"))));
        };
        let end = file_offset.checked_add(u64::from(stored_len));
        if file_offset < DATA_HEADER_LEN || end.is_none_or(|e| e > data.size) {
            return Err(self.err(
                at + 8,
                name(format!(
                    "bytes {file_offset}..+{stored_len} are outside {} ({} bytes)",
                    data.name, data.size
                )),
            ));
        }
        Ok(ChunkEntry {
            offset,
            raw_len,
            stored_len,
            encoding,
            file,
            file_offset,
            stored_xxh3,
            raw_xxh3,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The largest single allocation a thread makes, seen by this test binary's global
    /// allocator (the system's, watched): other tests' threads are not counted.
    mod allocations {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        struct Watched;

        thread_local! {
            static WATCHING: Cell<bool> = const { Cell::new(false) };
            static LARGEST: Cell<usize> = const { Cell::new(0) };
        }

        fn note(size: usize) {
            // try_with: a thread being torn down has no locals left; neither allocates.
            let _ = WATCHING.try_with(|on| {
                if on.get() {
                    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
                }
            });
        }

        // SAFETY: every call is forwarded unchanged to the system allocator; `note`
        // only looks at the size and allocates nothing.
        unsafe impl GlobalAlloc for Watched {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                // SAFETY: the caller's contract for `alloc` is passed through.
                unsafe { System.alloc(layout) }
            }

            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                // SAFETY: the caller's contract for `alloc_zeroed` is passed through.
                unsafe { System.alloc_zeroed(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: `ptr` was allocated by `System` with `layout`.
                unsafe { System.dealloc(ptr, layout) }
            }

            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                note(new_size);
                // SAFETY: the caller's contract for `realloc` is passed through.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static ALLOCATOR: Watched = Watched;

        /// `f`'s result and the largest single allocation this thread made in it.
        pub fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
            LARGEST.with(|l| l.set(0));
            WATCHING.with(|on| on.set(true));
            let out = f();
            WATCHING.with(|on| on.set(false));
            (out, LARGEST.with(Cell::get))
        }
    }

    /// What decoding `bytes` may allocate at most in one block: a few times the index's
    /// own size (its entries are decoded into structs of about their size), never what
    /// a count field claims.
    fn allocation_bound(bytes: &[u8]) -> usize {
        8 * bytes.len() + 4096
    }

    /// Decode `bytes`, failing the test when one allocation exceeds [`allocation_bound`].
    fn decode_in_bounded_memory(bytes: &[u8]) -> Result<GpuIndex, TransferError> {
        let (result, largest) =
            allocations::largest_during(|| GpuIndex::from_bytes(bytes, &path()));
        assert!(
            largest <= allocation_bound(bytes),
            "decoding {} bytes allocated {largest} bytes at once ({result:?})",
            bytes.len()
        );
        result
    }

    /// The allocator sees the decoder's allocations, and counts of 2^64 - 1 are refused
    /// without allocating for them.
    #[test]
    fn decoding_allocates_about_the_index_size() {
        let good = sample().to_bytes();
        let (_, largest) = allocations::largest_during(|| GpuIndex::from_bytes(&good, &path()));
        assert!(largest > 0, "the watching allocator saw nothing");
        decode_in_bounded_memory(&good).unwrap();
        let over = allocation_bound(&good) + 1;
        let (_, huge) = allocations::largest_during(|| std::hint::black_box(vec![0u8; over]));
        assert_eq!(huge, over, "an allocation is seen at its size");
        // The file, buffer and chunk counts of the header, at their largest.
        for (at, max) in [(24, &[0xff; 4][..]), (28, &[0xff; 4]), (32, &[0xff; 8])] {
            let mut bytes = good.clone();
            bytes[at..at + max.len()].copy_from_slice(max);
            reseal(&mut bytes);
            decode_in_bounded_memory(&bytes).unwrap_err();
        }
    }

    /// A small valid index: three buffers (one empty), every encoding, two files.
    pub(crate) fn sample() -> GpuIndex {
        let cs = 4096u64;
        let mk = |offset, raw_len, stored_len, encoding, file, file_offset, h| ChunkEntry {
            offset,
            raw_len,
            stored_len,
            encoding,
            file,
            file_offset,
            stored_xxh3: if encoding == Encoding::Zero { 0 } else { h },
            raw_xxh3: if encoding == Encoding::Zero { 0 } else { h + 1 },
        };
        let chunks = vec![
            mk(0, 4096, 4096, Encoding::Raw, 0, 16, 7),
            mk(4096, 4096, 0, Encoding::Zero, 0, 0, 0),
            mk(8192, 100, 50, Encoding::Zstd, 1, 16, 9),
            mk(0, 4096, 300, Encoding::Zstd, 1, 66, 11),
        ];
        let buffers = vec![
            BufferEntry::new(BufferKey::new(1, 0), 8292, 0, &chunks[0..3]),
            BufferEntry::new(BufferKey::new(1, 1), 0, 3, &[]),
            BufferEntry::new(BufferKey::new(2, 0), 4096, 3, &chunks[3..4]),
        ];
        GpuIndex {
            version: VERSION,
            chunk_size: cs,
            compression: Compression::Zstd(3),
            files: vec![
                DataFileEntry {
                    name: data_file_name(0),
                    size: 16 + 4096,
                },
                DataFileEntry {
                    name: data_file_name(1),
                    size: 16 + 50 + 300,
                },
            ],
            buffers,
            chunks,
        }
    }

    fn path() -> PathBuf {
        PathBuf::from("gpu/index")
    }

    /// Recompute the trailer checksum so that mutations reach the field checks.
    fn reseal(bytes: &mut [u8]) {
        if bytes.len() >= 8 {
            let n = bytes.len() - 8;
            let sum = XxHash3_64::oneshot(&bytes[..n]);
            bytes[n..].copy_from_slice(&sum.to_le_bytes());
        }
    }

    fn offset_of(e: &TransferError) -> u64 {
        match e {
            TransferError::Index { offset, .. } => *offset,
            other => panic!("not an index error: {other}"),
        }
    }

    #[test]
    fn round_trips() {
        let index = sample();
        let bytes = index.to_bytes();
        assert_eq!(GpuIndex::from_bytes(&bytes, &path()).unwrap(), index);
        assert_eq!(index.raw_bytes(), 8292 + 4096);
        assert_eq!(index.stored_bytes(), 4096 + 50 + 300);
        assert_eq!(index.chunks_of(2).len(), 1);
    }

    #[test]
    fn names_the_offset_of_a_bad_field() {
        let good = sample().to_bytes();
        // Buffer table starts after the header and two file entries.
        let buffers_at = (HEADER_LEN + 2 * FILE_ENTRY_LEN) as usize;
        let chunks_at = buffers_at + 3 * BUFFER_ENTRY_LEN as usize;
        let cases: Vec<(usize, u8, u64)> = vec![
            (0, b'X', 0),                                 // magic
            (8, 2, 8),                                    // version
            (40, 9, 40),                                  // codec
            (buffers_at + 16, 5, buffers_at as u64 + 16), // first chunk of buffer 0
            (chunks_at + 26, 7, chunks_at as u64 + 26),   // encoding of chunk 0
            (chunks_at + 8, 0, chunks_at as u64 + 8),     // file offset of chunk 0 -> 0
        ];
        for (at, value, want) in cases {
            let mut bytes = good.clone();
            bytes[at] = value;
            reseal(&mut bytes);
            let e = GpuIndex::from_bytes(&bytes, &path()).unwrap_err();
            assert_eq!(offset_of(&e), want, "byte {at}: {e}");
            assert!(
                e.to_string().starts_with("gpu/index is damaged at offset"),
                "{e}"
            );
            assert!(e.is_damage());
        }
    }

    #[test]
    fn detects_a_flipped_byte_without_reseal() {
        let good = sample().to_bytes();
        let mut bytes = good.clone();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        let e = GpuIndex::from_bytes(&bytes, &path()).unwrap_err();
        assert_eq!(offset_of(&e), good.len() as u64 - 8);
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
    }

    #[test]
    fn rejects_truncation_and_huge_counts() {
        let good = sample().to_bytes();
        for n in [0, 10, 63, 64, 79, good.len() - 1] {
            assert!(GpuIndex::from_bytes(&good[..n], &path()).is_err(), "{n}");
        }
        let mut bytes = good.clone();
        bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut bytes);
        let e = GpuIndex::from_bytes(&bytes, &path()).unwrap_err();
        assert_eq!(offset_of(&e), 24, "{e}");
    }

    #[test]
    fn missing_index_is_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_index(dir.path()).unwrap_err();
        assert!(matches!(e, TransferError::IndexMissing { .. }), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes at all: an error or an index, never a panic or a huge allocation.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_in_bounded_memory(&bytes);
            let mut sealed = bytes.clone();
            if sealed.len() >= 16 {
                sealed[..8].copy_from_slice(&INDEX_MAGIC);
            }
            reseal(&mut sealed);
            let _ = decode_in_bounded_memory(&sealed);
        }

        /// A valid index with bytes overwritten (and its checksum fixed, so the field
        /// checks are what stands between the bytes and the engine): an error naming an
        /// offset inside the file, or an index that still satisfies every invariant.
        #[test]
        fn mutated_index_is_rejected_or_consistent(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut bytes = sample().to_bytes();
            for (at, value) in edits {
                let i = at.index(bytes.len() - 8);
                bytes[i] = value;
            }
            if let Some(cut) = cut {
                let n = cut.index(bytes.len());
                bytes.truncate(n);
            }
            reseal(&mut bytes);
            match GpuIndex::from_bytes(&bytes, &path()) {
                Err(TransferError::Index { offset, .. }) => {
                    prop_assert!(offset <= bytes.len() as u64);
                }
                Err(other) => prop_assert!(false, "unexpected error {other}"),
                Ok(index) => {
                    prop_assert_eq!(index.to_bytes(), bytes);
                    for (b, entry) in index.buffers.iter().enumerate() {
                        let mut at = 0;
                        for c in index.chunks_of(b) {
                            prop_assert_eq!(c.offset, at);
                            at += u64::from(c.raw_len);
                            if c.encoding != Encoding::Zero {
                                let f = &index.files[usize::from(c.file)];
                                prop_assert!(c.file_offset + u64::from(c.stored_len) <= f.size);
                            }
                        }
                        prop_assert_eq!(at, entry.len);
                    }
                }
            }
        }
    }
}
