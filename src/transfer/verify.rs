//! `gpucr inspect --verify` for GPU memory: the index, every data file, every chunk.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

use super::chunk::Unpacker;
use super::error::{ChunkProblem, TransferError};
use super::format::check_data_file;
use super::index::{read_index, Encoding};

/// Check the GPU memory of the image in `dir` with `threads` threads: the index must be
/// valid and every data file must have its header and recorded size (else an error);
/// every stored chunk is read, its checksums compared and compressed chunks
/// decompressed. Returns the damaged chunks, in index order (empty: intact).
pub fn verify_image(dir: &Path, threads: usize) -> Result<Vec<ChunkProblem>, TransferError> {
    let index = read_index(dir)?;
    let mut files = Vec::with_capacity(index.files.len());
    for n in 0..index.files.len() {
        let path = index.data_path(dir, n);
        let file = File::open(&path).map_err(|e| TransferError::io("open", &path, e))?;
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
    let mut problems = problems.into_inner().unwrap_or_else(|e| e.into_inner());
    problems.sort_by_key(|p| p.chunk);
    Ok(problems)
}
