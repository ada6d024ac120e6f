//! One streaming read of a checkpoint archive: what `gpucr inspect ARCHIVE` needs, in
//! bounded memory, nothing written to disk.
//!
//! * The engine's `config.dump` and `spec.dump`, and the listing of every member.
//! * CRIU's images and gpucr's small files under `checkpoint/` are kept in memory
//!   (each at most [`KEEP_FILE_LIMIT`], together at most [`KEEP_TOTAL_LIMIT`]).
//! * Of a pages file only the pages that hold a process's argv and environment are
//!   kept (see [`super::pages`]).
//! * GPU data files are never kept; with `verify` every chunk is checked as it passes.
//! * With `verify` every file under `checkpoint/` is hashed as it passes, for the
//!   manifest's checksums.
//!
//! Engines write members in directory order (podman: lexical), so the pagemaps a pages
//! file needs and the GPU index usually come first or last. What could not be done in
//! the first read because its inputs came later is done in a second read of just those
//! members.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use gpucr_criu_image::store::{MemoryFile, MemoryFiles};

use super::open::{open, Compression};
use super::pages::{capture_plan, Capture};
use super::{ArchiveError, CHECKPOINT_DIR, CONFIG_DUMP, SPEC_DUMP, STATS_DUMP};
use crate::image::checksum::{FileDigest, StreamDigest};
use crate::transfer::{ChunkProblem, DataStreamVerifier, GpuIndex, TransferError, GPU_DIR};

/// The largest file under `checkpoint/` kept in memory whole (GPU data and pages files
/// are never kept whole).
pub const KEEP_FILE_LIMIT: u64 = 256 << 20;
/// The most bytes kept in memory over all files.
pub const KEEP_TOTAL_LIMIT: u64 = 1 << 30;
/// The largest `config.dump` or `spec.dump` read.
const METADATA_LIMIT: u64 = 16 << 20;
/// Bytes read from the stream at a time.
const PIECE: usize = 256 << 10;

/// What to do while reading.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Hash every file and check every GPU chunk.
    pub verify: bool,
    /// The page size for pagemaps when the manifest records none.
    pub page_size: u64,
}

/// One member of the archive.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    pub name: String,
    pub size: u64,
    /// "file", "dir", "symlink" or "other".
    pub kind: &'static str,
}

/// What a read of the archive found.
#[derive(Debug)]
pub struct Scan {
    pub path: PathBuf,
    pub compression: Compression,
    /// Every member, in archive order.
    pub members: Vec<Member>,
    pub config_dump: Option<Vec<u8>>,
    pub spec_dump: Option<Vec<u8>>,
    /// Files of `checkpoint/` kept in memory, by name below it.
    pub files: MemoryFiles,
    /// Every regular file below `checkpoint/` with its size, sorted.
    pub sizes: Vec<(String, u64)>,
    /// With `verify`: the digest of every file below `checkpoint/`.
    pub digests: BTreeMap<String, FileDigest>,
    /// With `verify`: what the GPU data files' chunks showed.
    pub gpu: GpuCheck,
    /// How many times the archive was read (1 or 2).
    pub reads: u32,
}

/// The GPU chunks checked while reading.
#[derive(Debug, Default)]
pub struct GpuCheck {
    pub chunks_checked: u64,
    pub problems: Vec<ChunkProblem>,
    /// Data files that are not what the index describes, or an index that is damaged.
    pub errors: Vec<TransferError>,
}

/// What happens to one member's bytes.
enum Handling<'a> {
    Keep(Vec<u8>),
    Pages(Capture),
    Gpu(Box<DataStreamVerifier<'a>>),
    Skip,
}

/// Read the archive at `path`.
pub fn scan(path: &Path, opts: &ScanOptions) -> Result<Scan, ArchiveError> {
    let mut scan = Scan {
        path: path.to_path_buf(),
        compression: Compression::None,
        members: Vec::new(),
        config_dump: None,
        spec_dump: None,
        files: MemoryFiles::new(),
        sizes: Vec::new(),
        digests: BTreeMap::new(),
        gpu: GpuCheck::default(),
        reads: 1,
    };
    let mut top_stats: Option<Vec<u8>> = None;
    // Pages files captured with the plan known when they passed, GPU data files checked.
    let mut captured_with: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut gpu_checked: BTreeSet<String> = BTreeSet::new();
    let mut kept: u64 = 0;
    let root = path.join(CHECKPOINT_DIR);
    scan.compression = each_member(path, |name, size, kind, reader| {
        scan.members.push(Member {
            name: name.to_string(),
            size,
            kind,
        });
        if kind != "file" {
            return Ok(Flow::Next);
        }
        let Some(rel) = checkpoint_file(name) else {
            let slot = match name {
                CONFIG_DUMP => &mut scan.config_dump,
                SPEC_DUMP => &mut scan.spec_dump,
                STATS_DUMP => &mut top_stats,
                _ => return Ok(Flow::Next),
            };
            *slot = Some(read_limited(path, name, size, METADATA_LIMIT, reader)?);
            return Ok(Flow::Next);
        };
        scan.sizes.push((rel.to_string(), size));
        let index = if opts.verify && is_gpu_data(rel) {
            gpu_index(&scan.files, &root).ok()
        } else {
            None
        };
        let mut handling = if is_pages(rel) {
            let plan = capture_plan(&scan.files, &root, opts.page_size, rel);
            captured_with.insert(rel.to_string(), plan.clone());
            Handling::Pages(Capture::new(plan))
        } else if is_gpu_data(rel) {
            match (&index, gpu_data_number(rel)) {
                (Some(index), Some(n)) if n < index.files.len() => {
                    gpu_checked.insert(rel.to_string());
                    Handling::Gpu(Box::new(DataStreamVerifier::new(index, n, root.join(rel))))
                }
                _ => Handling::Skip,
            }
        } else {
            if size > KEEP_FILE_LIMIT || kept + size > KEEP_TOTAL_LIMIT {
                return Err(ArchiveError::too_large(
                    path,
                    name,
                    size,
                    KEEP_FILE_LIMIT.min(KEEP_TOTAL_LIMIT - kept),
                ));
            }
            kept += size;
            Handling::Keep(Vec::with_capacity(size as usize))
        };
        let mut digest = opts.verify.then(StreamDigest::new);
        stream(path, name, reader, |piece| {
            if let Some(d) = &mut digest {
                d.update(piece);
            }
            match &mut handling {
                Handling::Keep(bytes) => bytes.extend_from_slice(piece),
                Handling::Pages(capture) => capture.update(piece),
                Handling::Gpu(verifier) => verifier.update(piece),
                Handling::Skip => {}
            }
        })?;
        if let Some(d) = digest {
            scan.digests.insert(rel.to_string(), d.finish());
        }
        match handling {
            Handling::Keep(bytes) => scan.files.insert(rel, MemoryFile::whole(bytes)),
            Handling::Pages(capture) => {
                let (extents, held) = capture.finish();
                kept += held;
                scan.files.insert(rel, MemoryFile::sparse(size, extents));
            }
            Handling::Gpu(verifier) => record_gpu(&mut scan.gpu, *verifier),
            Handling::Skip => {}
        }
        Ok(Flow::Next)
    })?;
    if let Some(stats) = top_stats {
        // Podman keeps CRIU's dump statistics next to checkpoint/, not in it.
        if !scan.files.contains(STATS_DUMP) {
            scan.files.insert(STATS_DUMP, MemoryFile::whole(stats));
        }
    }
    scan.sizes.sort();

    // What the first read could not do: pages files whose plan is now larger, GPU data
    // files that passed before the index.
    let mut again: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (name, before) in &captured_with {
        let plan = capture_plan(&scan.files, &root, opts.page_size, name);
        if &plan != before {
            again.insert(name.clone(), plan);
        }
    }
    let index = if opts.verify {
        match gpu_index(&scan.files, &root) {
            Ok(index) => Some(index),
            Err(TransferError::IndexMissing { .. }) => None,
            Err(e) => {
                scan.gpu.errors.push(e);
                None
            }
        }
    } else {
        None
    };
    let gpu_again: BTreeSet<String> = match &index {
        Some(index) => (0..index.files.len())
            .map(|n| format!("{}", index.data_path(Path::new(""), n).display()))
            .filter(|rel| !gpu_checked.contains(rel))
            .collect(),
        None => BTreeSet::new(),
    };
    if let Some(index) = &index {
        scan.gpu.chunks_checked = index.chunks.len() as u64;
        // A data file the index names that is not in the archive at all.
        for (n, file) in index.files.iter().enumerate() {
            let rel = format!("{}", index.data_path(Path::new(""), n).display());
            if !scan.sizes.iter().any(|(name, _)| *name == rel) {
                scan.gpu.errors.push(TransferError::io(
                    "read",
                    root.join(GPU_DIR).join(&file.name),
                    io::Error::from(io::ErrorKind::NotFound),
                ));
            }
        }
    }
    if again.is_empty() && gpu_again.is_empty() {
        return Ok(scan);
    }
    scan.reads = 2;
    each_member(path, |name, _size, kind, reader| {
        let Some(rel) = checkpoint_file(name).filter(|_| kind == "file") else {
            return Ok(Flow::Next);
        };
        if let Some(plan) = again.get(rel) {
            let mut capture = Capture::new(plan.clone());
            stream(path, name, reader, |piece| capture.update(piece))?;
            let size = scan.files.get(rel).map(MemoryFile::size).unwrap_or(0);
            let (extents, held) = capture.finish();
            kept += held;
            scan.files.insert(rel, MemoryFile::sparse(size, extents));
        } else if let (true, Some(index), Some(n)) =
            (gpu_again.contains(rel), &index, gpu_data_number(rel))
        {
            let mut verifier = DataStreamVerifier::new(index, n, root.join(rel));
            stream(path, name, reader, |piece| verifier.update(piece))?;
            record_gpu(&mut scan.gpu, verifier);
        }
        Ok(Flow::Next)
    })?;
    Ok(scan)
}

fn record_gpu(gpu: &mut GpuCheck, verifier: DataStreamVerifier<'_>) {
    match verifier.finish() {
        Ok(problems) => gpu.problems.extend(problems),
        Err(e) => gpu.errors.push(e),
    }
}

/// The GPU index kept in `files`.
fn gpu_index(files: &MemoryFiles, root: &Path) -> Result<GpuIndex, TransferError> {
    let rel = format!("{GPU_DIR}/{}", crate::transfer::INDEX_FILE);
    let path = root.join(&rel);
    let file = files
        .get(&rel)
        .ok_or_else(|| TransferError::IndexMissing { path: path.clone() })?;
    let mut bytes = vec![0u8; file.size() as usize];
    gpucr_criu_image::store::Source::Memory(file.clone())
        .read_exact_at(&mut bytes, 0)
        .map_err(|e| TransferError::io("read", &path, e))?;
    GpuIndex::from_bytes(&bytes, &path)
}

/// Whether [`each_member`] goes on to the next member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Next,
    Stop,
}

/// Call `f` for every member of the archive at `path` with its normalised name
/// (`./` and a trailing `/` removed), size, kind and content, until it says stop.
pub fn each_member(
    path: &Path,
    mut f: impl FnMut(&str, u64, &'static str, &mut dyn Read) -> Result<Flow, ArchiveError>,
) -> Result<Compression, ArchiveError> {
    let (compression, stream) = open(path)?;
    let mut archive = tar::Archive::new(stream);
    let read_err = |member: Option<&str>, source: io::Error, first: bool| {
        // A plain file whose first header does not parse was never a tar archive (the
        // tar reader's own message then quotes the file's bytes).
        if first && compression == Compression::None {
            ArchiveError::NotAnArchive {
                path: path.to_path_buf(),
            }
        } else {
            ArchiveError::read(path, member, source)
        }
    };
    let entries = archive.entries().map_err(|e| read_err(None, e, true))?;
    for (index, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| read_err(None, e, index == 0))?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw);
        let name = name
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        let kind = match entry.header().entry_type() {
            t if t.is_file() => "file",
            t if t.is_dir() => "dir",
            t if t.is_symlink() => "symlink",
            _ => "other",
        };
        let size = entry.size();
        if name.is_empty() || name.split('/').any(|c| c == ".." || c.is_empty()) {
            // Nothing in a checkpoint archive is named like this; list it, read nothing.
            if f(&name, size, "other", &mut io::empty())? == Flow::Stop {
                break;
            }
            continue;
        }
        if f(&name, size, kind, &mut entry)? == Flow::Stop {
            break;
        }
    }
    Ok(compression)
}

/// Read a member through `sink`, a piece at a time.
fn stream(
    path: &Path,
    name: &str,
    reader: &mut dyn Read,
    mut sink: impl FnMut(&[u8]),
) -> Result<(), ArchiveError> {
    let mut buf = vec![0u8; PIECE];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => sink(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(ArchiveError::read(path, Some(name), source)),
        }
    }
}

/// A small member, read whole.
fn read_limited(
    path: &Path,
    name: &str,
    size: u64,
    limit: u64,
    reader: &mut dyn Read,
) -> Result<Vec<u8>, ArchiveError> {
    if size > limit {
        return Err(ArchiveError::too_large(path, name, size, limit));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    stream(path, name, reader, |piece| bytes.extend_from_slice(piece))?;
    Ok(bytes)
}

/// The name below `checkpoint/` of a member in it.
pub fn checkpoint_file(name: &str) -> Option<&str> {
    name.strip_prefix(CHECKPOINT_DIR)?
        .strip_prefix('/')
        .filter(|rel| !rel.is_empty())
}

fn is_pages(rel: &str) -> bool {
    !rel.contains('/') && rel.starts_with("pages-") && rel.ends_with(".img")
}

fn is_gpu_data(rel: &str) -> bool {
    gpu_data_number(rel).is_some()
}

/// `n` of `gpu/data-NNNN`.
fn gpu_data_number(rel: &str) -> Option<usize> {
    rel.strip_prefix(GPU_DIR)?
        .strip_prefix("/data-")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_classified() {
        assert_eq!(checkpoint_file("checkpoint/core-1.img"), Some("core-1.img"));
        assert_eq!(checkpoint_file("checkpoint/gpu/index"), Some("gpu/index"));
        assert_eq!(checkpoint_file("checkpoint"), None);
        assert_eq!(checkpoint_file("checkpointx/a"), None);
        assert!(is_pages("pages-1.img"));
        assert!(!is_pages("pagemap-1.img"));
        assert_eq!(gpu_data_number("gpu/data-0003"), Some(3));
        assert_eq!(gpu_data_number("gpu/index"), None);
    }
}
