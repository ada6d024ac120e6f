//! File checksums: xxh3 over fixed-size blocks, hashed in parallel.
//!
//! A file's digest is the xxh3-128 of the little-endian digests of its 4 MiB blocks, and
//! a block's digest the xxh3-64 of the little-endian xxh3-64 digests of its 4 KiB pages
//! ([`Algorithm::Pages4m`], the last page of a file may be shorter). Blocks let several
//! threads hash one large file (a 1 GiB `pages-*.img`) at once and let verification say
//! which byte range differs; pages let a dump digest a memory pages file from the pages
//! themselves, read from the frozen tree in any order, without reading the file CRIU
//! writes (`dump::tree_pages`). Images of earlier gpucr versions digest each block's
//! bytes whole ([`Algorithm::Blocks4m`]) and are still verified. xxh3 detects
//! corruption; it is not a defence against deliberate tampering.

use std::fs::File;
use std::hash::Hasher;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use twox_hash::{XxHash3_128, XxHash3_64};

#[cfg(test)]
fn xxh3_64(data: &[u8]) -> u64 {
    XxHash3_64::oneshot(data)
}

fn xxh3_128(data: &[u8]) -> u128 {
    XxHash3_128::oneshot(data)
}

/// Size of one checksummed block.
pub const BLOCK_SIZE: u64 = 4 << 20;
/// Size of the pieces of a block digested one by one ([`Algorithm::Pages4m`]): the
/// smallest page size of the machines CRIU runs on, so that a page of any of them is a
/// whole number of pieces.
pub const PAGE_PIECE: usize = 4096;
/// Bytes read at a time while hashing a block: small enough that the bytes are still in
/// the CPU cache when they are hashed (reading a whole block first costs a third more).
pub const READ_PIECE: usize = 256 << 10;
/// The `checksum` of a file whose content is verified chunk by chunk through another
/// index (the GPU memory data files, see `gpu/index`), not as a whole.
pub const CHUNK_VERIFIED: &str = "verified-by-gpu-index";
/// The `checksum` of a memory pages file (`pages-*.img`) dumped with
/// `--no-page-checksums`: only its size is recorded and checked.
pub const SIZE_ONLY: &str = "size-only";

/// `pages-N.img`: CPU memory contents, the only files a dump may record by size alone
/// ([`SIZE_ONLY`]).
pub fn is_pages_file(path: &str) -> bool {
    path.starts_with("pages-") && path.ends_with(".img") && !path.contains('/')
}

/// Whether a file's recorded `checksum` is one of its content (not one of the markers
/// [`CHUNK_VERIFIED`] and [`SIZE_ONLY`]), to be compared with the file's digest.
pub fn is_content_checksum(checksum: &str) -> bool {
    checksum != CHUNK_VERIFIED && checksum != SIZE_ONLY
}

/// How a block is digested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `xxh3-blocks-4m`: the xxh3-64 of the block's bytes (images of earlier gpucr
    /// versions; verified, no longer written).
    Blocks4m,
    /// `xxh3-pages-4m`: the xxh3-64 of the digests of its [`PAGE_PIECE`] pieces.
    Pages4m,
}

impl Algorithm {
    /// The one a dump writes.
    pub const CURRENT: Algorithm = Algorithm::Pages4m;

    /// The name recorded in the manifest's `checksum_algorithm`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Blocks4m => "xxh3-blocks-4m",
            Algorithm::Pages4m => "xxh3-pages-4m",
        }
    }

    /// The algorithm a manifest names; None for one this gpucr does not know.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        [Algorithm::Blocks4m, Algorithm::Pages4m]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// The name recorded in the manifest for the scheme a dump writes.
pub const ALGORITHM: &str = Algorithm::CURRENT.name();

/// The digest of one [`PAGE_PIECE`] piece of a block (or the shorter last one of a
/// file), for [`BlockHasher::add_piece_digest`].
pub fn piece_digest(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// A block's digest by `algorithm`, its bytes given as they arrive. The default is
/// by [`Algorithm::CURRENT`]; `std::mem::take` gives a block's hasher back and starts
/// the next one's.
pub struct BlockHasher {
    algorithm: Algorithm,
    outer: XxHash3_64,
    /// The bytes of a piece not yet whole ([`Algorithm::Pages4m`]).
    partial: Vec<u8>,
}

impl Default for BlockHasher {
    fn default() -> BlockHasher {
        BlockHasher::new(Algorithm::CURRENT)
    }
}

impl BlockHasher {
    pub fn new(algorithm: Algorithm) -> BlockHasher {
        BlockHasher {
            algorithm,
            outer: XxHash3_64::new(),
            partial: Vec::new(),
        }
    }

    /// Add the block's next bytes.
    pub fn write(&mut self, mut bytes: &[u8]) {
        if self.algorithm == Algorithm::Blocks4m {
            self.outer.write(bytes);
            return;
        }
        if !self.partial.is_empty() {
            let n = (PAGE_PIECE - self.partial.len()).min(bytes.len());
            self.partial.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.partial.len() < PAGE_PIECE {
                return;
            }
            let digest = piece_digest(&self.partial);
            self.partial.clear();
            self.add_piece_digest(digest);
        }
        let mut pieces = bytes.chunks_exact(PAGE_PIECE);
        for piece in &mut pieces {
            self.add_piece_digest(piece_digest(piece));
        }
        self.partial.extend_from_slice(pieces.remainder());
    }

    /// Add the digest of the block's next whole piece ([`piece_digest`]) instead of its
    /// bytes ([`Algorithm::Pages4m`] only, nothing partial written before).
    pub fn add_piece_digest(&mut self, digest: u64) {
        debug_assert_eq!(self.algorithm, Algorithm::Pages4m);
        debug_assert!(self.partial.is_empty());
        self.outer.write(&digest.to_le_bytes());
    }

    /// The block's digest.
    pub fn finish(mut self) -> u64 {
        if !self.partial.is_empty() {
            let digest = piece_digest(&self.partial);
            self.outer.write(&digest.to_le_bytes());
        }
        self.outer.finish()
    }
}

/// The digest of a whole block's bytes.
pub fn block_digest(algorithm: Algorithm, bytes: &[u8]) -> u64 {
    let mut hasher = BlockHasher::new(algorithm);
    hasher.write(bytes);
    hasher.finish()
}

/// The digest of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    /// xxh3-64 of each block, in order.
    pub blocks: Vec<u64>,
}

impl FileDigest {
    /// The whole-file checksum as stored in the manifest (32 hex digits).
    pub fn checksum(&self) -> String {
        let bytes: Vec<u8> = self.blocks.iter().flat_map(|b| b.to_le_bytes()).collect();
        format!("{:032x}", xxh3_128(&bytes))
    }

    /// The block digests as stored in the manifest (16 hex digits each).
    pub fn block_hex(&self) -> Vec<String> {
        self.blocks.iter().map(|b| format!("{b:016x}")).collect()
    }
}

/// Digest several files, spreading their blocks over `threads` threads.
///
/// Returns one result per path, in order.
pub fn digest_files(paths: &[&Path], threads: usize) -> Vec<io::Result<FileDigest>> {
    let known = vec![Vec::new(); paths.len()];
    digest_files_resuming(paths, &known, threads)
}

/// Like [`digest_files`], for files whose leading full blocks were already hashed
/// (`known[i]`, e.g. by a [`Follower`] while the file was being written): only the rest
/// is read. A prefix longer than the file now is ignored and the file hashed whole.
pub fn digest_files_resuming(
    paths: &[&Path],
    known: &[Vec<u64>],
    threads: usize,
) -> Vec<io::Result<FileDigest>> {
    digest_files_with(
        paths,
        known,
        threads,
        BlockRead::Pieces,
        None,
        Algorithm::CURRENT,
    )
}

/// Like [`digest_files`], for the files of a complete image, which nothing writes any
/// more: each block is hashed through a mapping of it rather than copied into a buffer
/// first, which costs about 40% less CPU (a restore hashes the memory pages while CRIU
/// restores them, on the same cores). A file that shrank while it is hashed would end
/// the process with SIGBUS: not for files another process may still be writing.
pub fn digest_image_files(paths: &[&Path], threads: usize) -> Vec<io::Result<FileDigest>> {
    let known = vec![Vec::new(); paths.len()];
    digest_files_with(
        paths,
        &known,
        threads,
        BlockRead::Mapped,
        None,
        Algorithm::CURRENT,
    )
}

/// [`digest_image_files`] by `algorithm` (the one the image's manifest names) that
/// gives up once `stop` is set (a user's Ctrl-C while a restore verifies a large
/// image): no new block is started, and every file with a block left unhashed gets an
/// [`io::ErrorKind::Interrupted`] error.
pub fn digest_image_files_until(
    paths: &[&Path],
    threads: usize,
    stop: &AtomicBool,
    algorithm: Algorithm,
) -> Vec<io::Result<FileDigest>> {
    let known = vec![Vec::new(); paths.len()];
    digest_files_with(
        paths,
        &known,
        threads,
        BlockRead::Mapped,
        Some(stop),
        algorithm,
    )
}

/// [`digest_image_files`] for files whose leading full blocks were already hashed (see
/// [`digest_files_resuming`]): a dump's last pass, once CRIU has written the image.
pub fn digest_image_files_resuming(
    paths: &[&Path],
    known: &[Vec<u64>],
    threads: usize,
) -> Vec<io::Result<FileDigest>> {
    digest_files_with(
        paths,
        known,
        threads,
        BlockRead::Mapped,
        None,
        Algorithm::CURRENT,
    )
}

/// How a block's bytes reach the hasher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockRead {
    /// `pread` into a buffer of [`READ_PIECE`] bytes, one piece at a time.
    Pieces,
    /// A read-only mapping of the whole block.
    Mapped,
}

fn digest_files_with(
    paths: &[&Path],
    known: &[Vec<u64>],
    threads: usize,
    read: BlockRead,
    stop: Option<&AtomicBool>,
    algorithm: Algorithm,
) -> Vec<io::Result<FileDigest>> {
    struct Job {
        file: usize,
        block: usize,
    }
    let mut opened: Vec<io::Result<(File, u64)>> = Vec::with_capacity(paths.len());
    let mut results: Vec<Mutex<Vec<Option<io::Result<u64>>>>> = Vec::with_capacity(paths.len());
    let mut jobs = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let entry = gpucr_criu_image::store::open_regular(path).and_then(|f| {
            let size = f.metadata()?.len();
            Ok((f, size))
        });
        let mut slots = Vec::new();
        if let Ok((_, size)) = &entry {
            let prefix = usable_prefix(&known[i], *size);
            slots.extend(prefix.iter().map(|b| Some(Ok(*b))));
            for block in prefix.len()..block_count(*size) {
                jobs.push(Job { file: i, block });
                slots.push(None);
            }
        }
        results.push(Mutex::new(slots));
        opened.push(entry);
    }
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut buf = match read {
                    BlockRead::Pieces => vec![0u8; READ_PIECE],
                    BlockRead::Mapped => Vec::new(),
                };
                loop {
                    if stop.is_some_and(|stop| stop.load(Ordering::Relaxed)) {
                        break;
                    }
                    let idx = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(idx) else { break };
                    let Ok((file, size)) = &opened[job.file] else {
                        continue;
                    };
                    let digest = match read {
                        BlockRead::Pieces => {
                            hash_block(file, *size, job.block, &mut buf, algorithm)
                        }
                        BlockRead::Mapped => hash_block_mapped(file, *size, job.block, algorithm),
                    };
                    results[job.file]
                        .lock()
                        .expect("no thread panics holding it")[job.block] = Some(digest);
                }
            });
        }
    });
    opened
        .into_iter()
        .zip(results)
        .map(|(entry, blocks)| {
            let (_, size) = entry?;
            let blocks = blocks
                .into_inner()
                .expect("no thread panics holding it")
                .into_iter()
                // Only a stop leaves a block unhashed.
                .map(|b| b.unwrap_or_else(|| Err(io::ErrorKind::Interrupted.into())))
                .collect::<io::Result<Vec<u64>>>()?;
            Ok(FileDigest { size, blocks })
        })
        .collect()
}

/// The known leading blocks that are still valid for a file of `size` bytes: full
/// blocks only, and none if the file is now shorter than they cover.
fn usable_prefix(known: &[u64], size: u64) -> &[u64] {
    if known.len() as u64 * BLOCK_SIZE <= size {
        known
    } else {
        &[]
    }
}

/// Digest one file with the calling thread only.
pub fn digest_file(path: &Path) -> io::Result<FileDigest> {
    digest_files(&[path], 1).pop().expect("one result per path")
}

/// The number of blocks of a file of `size` bytes (an empty file has one empty block).
pub fn block_count(size: u64) -> usize {
    size.div_ceil(BLOCK_SIZE).max(1) as usize
}

/// The digest of block `block` of `file` (of `size` bytes), read through `buf` one
/// `buf.len()` piece at a time.
fn hash_block(
    file: &File,
    size: u64,
    block: usize,
    buf: &mut [u8],
    algorithm: Algorithm,
) -> io::Result<u64> {
    let start = block as u64 * BLOCK_SIZE;
    let len = (size - start.min(size)).min(BLOCK_SIZE) as usize;
    let mut hasher = BlockHasher::new(algorithm);
    let mut done = 0;
    while done < len {
        let want = (len - done).min(buf.len());
        match file.read_at(&mut buf[..want], start + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "file shrank while being read (at byte {})",
                        start + done as u64
                    ),
                ))
            }
            Ok(n) => {
                hasher.write(&buf[..n]);
                done += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(hasher.finish())
}

/// The digest of block `block` of `file` (of `size` bytes), read through a read-only
/// mapping of the block (see [`digest_image_files`]).
fn hash_block_mapped(
    file: &File,
    size: u64,
    block: usize,
    algorithm: Algorithm,
) -> io::Result<u64> {
    let start = block as u64 * BLOCK_SIZE;
    let len = (size - start.min(size)).min(BLOCK_SIZE) as usize;
    if len == 0 {
        return Ok(block_digest(algorithm, &[]));
    }
    // SAFETY: the mapping is read-only, private to this function and dropped before it
    // returns. Another process writing the file could only change the bytes hashed (a
    // mismatch, reported as such); one truncating it would raise SIGBUS, which is why
    // only the files of a complete image, which nothing writes, are hashed this way.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(start)
            .len(len)
            .map(file)?
    };
    // Only a hint: the kernel reads ahead further for a sequential mapping.
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(block_digest(algorithm, &map))
}

/// The digest of bytes that arrive in pieces (a file read from a stream), block by
/// block, the same as [`digest_files`] gives for the file on disk.
#[derive(Default)]
pub struct StreamDigest {
    size: u64,
    blocks: Vec<u64>,
    /// Bytes of the current block so far.
    in_block: u64,
    hasher: BlockHasher,
}

impl StreamDigest {
    pub fn new() -> StreamDigest {
        StreamDigest::default()
    }

    /// Add the next bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = (BLOCK_SIZE - self.in_block) as usize;
            let n = room.min(bytes.len());
            self.hasher.write(&bytes[..n]);
            self.in_block += n as u64;
            self.size += n as u64;
            bytes = &bytes[n..];
            if self.in_block == BLOCK_SIZE {
                self.blocks.push(std::mem::take(&mut self.hasher).finish());
                self.in_block = 0;
            }
        }
    }

    /// The digest of everything added.
    pub fn finish(mut self) -> FileDigest {
        // A last partial block, or the one empty block of an empty file.
        if self.in_block > 0 || self.blocks.is_empty() {
            self.blocks.push(self.hasher.finish());
        }
        FileDigest {
            size: self.size,
            blocks: self.blocks,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn reading_in_pieces_hashes_like_one_read() {
        let data: Vec<u8> = (0..BLOCK_SIZE as usize + 1000)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let f = file_with(&data);
        let file = File::open(f.path()).unwrap();
        for piece in [1, 7, 4096, READ_PIECE, BLOCK_SIZE as usize] {
            let mut buf = vec![0u8; piece];
            let size = data.len() as u64;
            for algorithm in [Algorithm::Blocks4m, Algorithm::Pages4m] {
                assert_eq!(
                    hash_block(&file, size, 0, &mut buf, algorithm).unwrap(),
                    block_digest(algorithm, &data[..BLOCK_SIZE as usize]),
                    "piece {piece}"
                );
                assert_eq!(
                    hash_block(&file, size, 1, &mut buf, algorithm).unwrap(),
                    block_digest(algorithm, &data[BLOCK_SIZE as usize..]),
                    "piece {piece}"
                );
            }
        }
    }

    #[test]
    fn mapped_reads_hash_like_pieces() {
        let data: Vec<u8> = (0..(BLOCK_SIZE as usize * 2 + 4097))
            .map(|i| (i.wrapping_mul(40_503) >> 7) as u8)
            .collect();
        let f = file_with(&data);
        let empty = file_with(b"");
        let pieces = digest_files(&[f.path(), empty.path()], 2);
        let mapped = digest_image_files(&[f.path(), empty.path()], 2);
        assert_eq!(mapped[0].as_ref().unwrap(), pieces[0].as_ref().unwrap());
        assert_eq!(mapped[1].as_ref().unwrap(), pieces[1].as_ref().unwrap());
        assert!(digest_image_files(&[Path::new("/nonexistent/gpucr-test")], 1)[0].is_err());
    }

    #[test]
    fn a_stop_leaves_blocks_unhashed_as_interrupted() {
        let data = vec![7u8; BLOCK_SIZE as usize * 3];
        let f = file_with(&data);
        let stop = AtomicBool::new(true);
        let stopped = digest_image_files_until(&[f.path()], 2, &stop, Algorithm::CURRENT);
        let err = stopped[0].as_ref().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Interrupted);
        stop.store(false, Ordering::SeqCst);
        let whole = digest_image_files_until(&[f.path()], 2, &stop, Algorithm::CURRENT);
        assert_eq!(whole[0].as_ref().unwrap(), &digest_file(f.path()).unwrap());
    }

    #[test]
    fn a_block_of_pages_is_the_digest_of_its_pieces_digests() {
        let data: Vec<u8> = (0..3 * PAGE_PIECE + 100)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let pieces: Vec<u8> = data
            .chunks(PAGE_PIECE)
            .flat_map(|p| xxh3_64(p).to_le_bytes())
            .collect();
        assert_eq!(block_digest(Algorithm::Pages4m, &data), xxh3_64(&pieces));
        assert_eq!(block_digest(Algorithm::Blocks4m, &data), xxh3_64(&data));
        // Bytes split anywhere, or whole pieces given by their digests, digest the same.
        for split in [
            1,
            100,
            PAGE_PIECE - 1,
            PAGE_PIECE,
            PAGE_PIECE + 1,
            3 * PAGE_PIECE,
        ] {
            let mut hasher = BlockHasher::new(Algorithm::Pages4m);
            hasher.write(&data[..split]);
            hasher.write(&data[split..]);
            assert_eq!(hasher.finish(), xxh3_64(&pieces), "split at {split}");
        }
        let mut hasher = BlockHasher::new(Algorithm::Pages4m);
        for piece in data[..3 * PAGE_PIECE].chunks(PAGE_PIECE) {
            hasher.add_piece_digest(piece_digest(piece));
        }
        hasher.write(&data[3 * PAGE_PIECE..]);
        assert_eq!(hasher.finish(), xxh3_64(&pieces));
    }

    #[test]
    fn algorithms_are_known_by_their_manifest_names() {
        assert_eq!(Algorithm::CURRENT.name(), ALGORITHM);
        for a in [Algorithm::Blocks4m, Algorithm::Pages4m] {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(Algorithm::from_name("sha256"), None);
    }

    #[test]
    fn empty_file_has_one_block() {
        let f = file_with(b"");
        let d = digest_file(f.path()).unwrap();
        assert_eq!(d.size, 0);
        assert_eq!(d.blocks, vec![xxh3_64(b"")]);
    }

    #[test]
    fn blocks_split_at_block_size_and_parallel_equals_serial() {
        let data: Vec<u8> = (0..(BLOCK_SIZE as usize * 2 + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let f = file_with(&data);
        let serial = digest_file(f.path()).unwrap();
        assert_eq!(serial.blocks.len(), 3);
        assert_eq!(
            serial.blocks[2],
            block_digest(Algorithm::CURRENT, &data[2 * BLOCK_SIZE as usize..])
        );
        let parallel = digest_files(&[f.path(), f.path()], 4);
        assert_eq!(parallel[0].as_ref().unwrap(), &serial);
        assert_eq!(parallel[1].as_ref().unwrap(), &serial);
    }

    #[test]
    fn one_flipped_byte_changes_checksum_and_its_block_only() {
        let mut data = vec![7u8; BLOCK_SIZE as usize + 10];
        let a = digest_file(file_with(&data).path()).unwrap();
        data[BLOCK_SIZE as usize + 3] ^= 1;
        let b = digest_file(file_with(&data).path()).unwrap();
        assert_ne!(a.checksum(), b.checksum());
        assert_eq!(a.blocks[0], b.blocks[0]);
        assert_ne!(a.blocks[1], b.blocks[1]);
    }

    #[test]
    fn missing_file_is_an_error_in_its_slot() {
        let f = file_with(b"abc");
        let r = digest_files(&[Path::new("/nonexistent/gpucr-test"), f.path()], 2);
        assert!(r[0].is_err());
        assert_eq!(r[1].as_ref().unwrap().size, 3);
    }

    #[test]
    fn stream_digest_matches_the_file_digest() {
        let dir = tempfile::tempdir().unwrap();
        for size in [0usize, 1, BLOCK_SIZE as usize, BLOCK_SIZE as usize + 7] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let path = dir.path().join(format!("f{size}"));
            std::fs::write(&path, &bytes).unwrap();
            let mut stream = StreamDigest::new();
            for piece in bytes.chunks(100_003) {
                stream.update(piece);
            }
            assert_eq!(stream.finish(), digest_file(&path).unwrap(), "size {size}");
        }
    }
}
