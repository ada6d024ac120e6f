//! `gpucr inspect --verify` for GPU memory: the index, every data file, every chunk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

use super::chunk::Unpacker;
use super::error::{ChunkProblem, ProblemKind, TransferError};
use super::format::{check_data_file, DATA_HEADER_LEN, DATA_MAGIC, VERSION};
use super::index::{read_index, Encoding, GpuIndex};

/// Check the GPU memory of the image in `dir` with `threads` threads: the index must be
/// valid and every data file must have its header and recorded size (else an error);
/// every stored chunk is read, its checksums compared and compressed chunks
/// decompressed. Returns the damaged chunks, in index order (empty: intact).
pub fn verify_image(dir: &Path, threads: usize) -> Result<Vec<ChunkProblem>, TransferError> {
    verify_image_until(dir, threads, &AtomicBool::new(false))
}

/// [`verify_image`], giving up with [`TransferError::Cancelled`] soon after `stop` is set
/// (within one chunk per thread), however large the image.
pub fn verify_image_until(
    dir: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> Result<Vec<ChunkProblem>, TransferError> {
    let index = read_index(dir)?;
    let mut files = Vec::with_capacity(index.files.len());
    for n in 0..index.files.len() {
        let path = index.data_path(dir, n);
        let file = gpucr_criu_image::store::open_regular(&path)
            .map_err(|e| TransferError::io("open", &path, e))?;
        check_data_file(&file, &path, n, index.files[n].size)?;
        files.push(file);
    }
    let owners = index.chunk_owners();
    let next = AtomicUsize::new(0);
    let problems = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut unpacker = Unpacker::new();
                let mut out = Vec::new();
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    let Some(entry) = index.chunks.get(c) else {
                        return;
                    };
                    if entry.encoding == Encoding::Zero {
                        continue;
                    }
                    let file = &files[usize::from(entry.file)];
                    if let Err(kind) = unpacker.unpack(file, entry, &mut out) {
                        let problem = index.problem(c, owners[c], kind);
                        problems
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(problem);
                    }
                }
            });
        }
    });
    if stop.load(Ordering::SeqCst) {
        return Err(TransferError::Cancelled {
            reason: "the verification was stopped".into(),
        });
    }
    let mut problems = problems.into_inner().unwrap_or_else(|e| e.into_inner());
    problems.sort_by_key(|p| p.chunk);
    Ok(problems)
}

/// Verifies data file `n` of an image as its bytes arrive in order (a file read from an
/// archive stream): the header, the size the index records, and every stored chunk,
/// as [`verify_image`] does for a file on disk.
pub struct DataStreamVerifier<'a> {
    index: &'a GpuIndex,
    n: usize,
    path: PathBuf,
    owners: Vec<usize>,
    /// The stored chunks of this file, by file offset.
    chunks: Vec<usize>,
    next: usize,
    pos: u64,
    header: Vec<u8>,
    stored: Vec<u8>,
    out: Vec<u8>,
    unpacker: Unpacker,
    problems: Vec<ChunkProblem>,
}

impl<'a> DataStreamVerifier<'a> {
    /// Verify data file `n` of `index`; `path` names it in errors.
    pub fn new(index: &'a GpuIndex, n: usize, path: PathBuf) -> DataStreamVerifier<'a> {
        let mut chunks: Vec<usize> = (0..index.chunks.len())
            .filter(|&c| {
                let e = &index.chunks[c];
                e.encoding != Encoding::Zero && usize::from(e.file) == n
            })
            .collect();
        chunks.sort_by_key(|&c| index.chunks[c].file_offset);
        DataStreamVerifier {
            index,
            n,
            path,
            owners: index.chunk_owners(),
            chunks,
            next: 0,
            pos: 0,
            header: Vec::with_capacity(DATA_HEADER_LEN as usize),
            stored: Vec::new(),
            out: Vec::new(),
            unpacker: Unpacker::new(),
            problems: Vec::new(),
        }
    }

    /// The number of chunks this file holds.
    pub fn chunk_count(&self) -> u64 {
        self.chunks.len() as u64
    }

    /// The next bytes of the file.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.pos < DATA_HEADER_LEN {
                let n = ((DATA_HEADER_LEN - self.pos) as usize).min(bytes.len());
                self.header.extend_from_slice(&bytes[..n]);
                self.advance(&mut bytes, n);
                continue;
            }
            let Some(&c) = self.chunks.get(self.next) else {
                return;
            };
            let entry = self.index.chunks[c];
            let start = entry.file_offset + self.stored.len() as u64;
            if self.pos < start {
                // Bytes between chunks (none in files gpucr writes).
                let n = ((start - self.pos) as usize).min(bytes.len());
                self.advance(&mut bytes, n);
                continue;
            }
            if self.pos > start {
                // A chunk that starts inside the previous one: the index is damaged.
                self.problems.push(self.index.problem(
                    c,
                    self.owners[c],
                    ProblemKind::ChecksumMismatch,
                ));
                self.next += 1;
                self.stored.clear();
                continue;
            }
            let want = entry.stored_len as usize - self.stored.len();
            let n = want.min(bytes.len());
            self.stored.extend_from_slice(&bytes[..n]);
            self.advance(&mut bytes, n);
            if self.stored.len() == entry.stored_len as usize {
                if let Err(kind) = self
                    .unpacker
                    .unpack_stored(&self.stored, &entry, &mut self.out)
                {
                    self.problems
                        .push(self.index.problem(c, self.owners[c], kind));
                }
                self.stored.clear();
                self.next += 1;
            }
        }
    }

    fn advance(&mut self, bytes: &mut &[u8], n: usize) {
        *bytes = &bytes[n..];
        self.pos += n as u64;
    }

    /// The damaged chunks, once every byte was given; an error when the file is not
    /// the data file the index describes (size, header).
    pub fn finish(mut self) -> Result<Vec<ChunkProblem>, TransferError> {
        let expected = self.index.files[self.n].size;
        let damaged = |offset: u64, what: String| TransferError::DataFile {
            path: self.path.clone(),
            offset,
            what,
        };
        if self.pos != expected {
            return Err(damaged(
                self.pos.min(expected),
                format!("the file is {} bytes, the index says {expected}", self.pos),
            ));
        }
        let n32 = u32::try_from(self.n).unwrap_or(u32::MAX);
        if self.header.len() < DATA_HEADER_LEN as usize || self.header[..8] != DATA_MAGIC {
            return Err(damaged(0, "not a gpucr data file (bad magic)".into()));
        }
        if self.header[8..12] != VERSION.to_le_bytes() {
            return Err(damaged(8, "unsupported data file version".into()));
        }
        if self.header[12..16] != n32.to_le_bytes() {
            return Err(damaged(
                12,
                format!("the header does not name file {}", self.n),
            ));
        }
        for &c in &self.chunks[self.next..] {
            self.problems.push(
                self.index
                    .problem(c, self.owners[c], ProblemKind::Truncated),
            );
        }
        Ok(self.problems)
    }
}
