//! Reader of the KFD topology tree (`/sys/class/kfd/kfd/topology/nodes`), for AMD GPUs
//! and for the simulator, which writes the same format under its root.
//!
//! The walk follows CRIU's amdgpu plugin (`topology_parse`): numeric node directories,
//! `gpu_id` 0 for a CPU node, a node whose directory or `gpu_id` cannot be read for lack of
//! permission is skipped (a device cgroup hides it), and a GPU must have a VRAM bank.
//! Unlike CRIU, directories are read in numeric order and every file's content is checked:
//! a missing or malformed file is an error that names it.

mod parse;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::model::{CacheGroup, IoLink, KfdNode, MemBank, Properties};

/// Where the KFD topology lives, relative to the filesystem root.
pub const NODES_DIR: &str = "sys/class/kfd/kfd/topology/nodes";

/// Why the KFD topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KfdError {
    /// A file or directory the tree must have is missing.
    #[error("{path} is missing")]
    Missing {
        /// The missing path.
        path: PathBuf,
    },
    /// A file or directory exists but reading it failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A line of a `properties` file is not `NAME VALUE` with an unsigned integer.
    #[error(
        "{path}:{line}: malformed line {text:?} (expected `NAME VALUE`, VALUE an unsigned integer)"
    )]
    MalformedLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A one-number file (`gpu_id`) holds something else.
    #[error("{path}: expected an unsigned integer, found {text:?}")]
    NotANumber {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// A GPU node has no memory bank of heap type 1 or 2 with a non-zero size.
    #[error(
        "{path}: GPU node has no VRAM bank (no mem_banks entry with heap_type 1 or 2 and a size)"
    )]
    NoVram {
        /// The node's `mem_banks` directory.
        path: PathBuf,
    },
}

/// What reading one path gave.
enum Read<T> {
    Found(T),
    /// Permission denied: the kernel hides this device from us (device cgroup).
    Hidden,
}

fn io_error(path: &Path, source: io::Error) -> KfdError {
    if source.kind() == io::ErrorKind::NotFound {
        KfdError::Missing {
            path: path.to_owned(),
        }
    } else {
        KfdError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

fn read_text(path: &Path) -> Result<Read<String>, KfdError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Read::Found(text)),
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => Ok(Read::Hidden),
        Err(err) => Err(io_error(path, err)),
    }
}

/// The numeric entries of `dir` (names made only of digits), in numeric order.
fn numeric_entries(dir: &Path) -> Result<Vec<(u32, PathBuf)>, KfdError> {
    let entries = fs::read_dir(dir).map_err(|err| io_error(dir, err))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| io_error(dir, err))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(index) = name.parse::<u32>() else {
            continue;
        };
        found.push((index, entry.path()));
    }
    found.sort();
    Ok(found)
}

/// Reads every node under `nodes_dir` (`<root>/sys/class/kfd/kfd/topology/nodes`).
///
/// A missing `nodes_dir` means the KFD driver is not loaded: no KFD nodes, not an error.
pub fn read_nodes(nodes_dir: &Path) -> Result<Vec<KfdNode>, KfdError> {
    if !nodes_dir.exists() {
        return Ok(Vec::new());
    }
    let mut nodes = Vec::new();
    for (number, dir) in numeric_entries(nodes_dir)? {
        // CRIU skips a node it cannot stat: a device cgroup may mask it.
        match fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            _ => continue,
        }
        if let Some(node) = read_node(number, &dir)? {
            nodes.push(node);
        }
    }
    Ok(nodes)
}

/// Reads one node directory; `None` when the kernel hides it from us.
fn read_node(number: u32, dir: &Path) -> Result<Option<KfdNode>, KfdError> {
    let gpu_id_path = dir.join("gpu_id");
    let Read::Found(text) = read_text(&gpu_id_path)? else {
        return Ok(None);
    };
    let gpu_id = parse::number(&text, &gpu_id_path)?;
    let Read::Found(name) = read_text(&dir.join("name"))? else {
        return Ok(None);
    };
    let props_path = dir.join("properties");
    let Read::Found(text) = read_text(&props_path)? else {
        return Ok(None);
    };
    let properties = parse::properties(&text, &props_path)?;
    let is_gpu = gpu_id != 0;

    let banks_dir = dir.join("mem_banks");
    let mem_banks = if is_gpu || banks_dir.exists() {
        read_entries(&banks_dir, parse::properties)?
            .into_iter()
            .map(|properties| MemBank { properties })
            .collect()
    } else {
        Vec::new()
    };
    let io_links = read_entries(&dir.join("io_links"), parse::properties)?
        .into_iter()
        .map(|properties| IoLink { properties })
        .collect();
    let caches_dir = dir.join("caches");
    let caches = if caches_dir.exists() {
        group_caches(read_entries(&caches_dir, parse::cache_properties)?)
    } else {
        Vec::new()
    };

    let node = KfdNode {
        node: number,
        gpu_id,
        name: name.trim_end_matches('\n').to_owned(),
        properties,
        mem_banks,
        io_links,
        caches,
    };
    if is_gpu && node.vram().is_none_or(|vram| vram.size == 0) {
        return Err(KfdError::NoVram { path: banks_dir });
    }
    Ok(Some(node))
}

/// Reads `dir/N/properties` for every numeric N, in order. An entry the kernel hides from
/// us (permission denied) is left out.
fn read_entries(
    dir: &Path,
    parse: fn(&str, &Path) -> Result<Properties, KfdError>,
) -> Result<Vec<Properties>, KfdError> {
    let mut entries = Vec::new();
    for (_, entry) in numeric_entries(dir)? {
        let path = entry.join("properties");
        if let Read::Found(text) = read_text(&path)? {
            entries.push(parse(&text, &path)?);
        }
    }
    Ok(entries)
}

fn group_caches(caches: Vec<Properties>) -> Vec<CacheGroup> {
    let mut groups: BTreeMap<(u64, u64, u64, u64), u64> = BTreeMap::new();
    for cache in &caches {
        let key = (
            cache.value("level"),
            cache.value("size"),
            cache.value("cache_line_size"),
            cache.value("type"),
        );
        *groups.entry(key).or_default() += 1;
    }
    groups
        .into_iter()
        .map(
            |((level, size_kib, cache_line_size, cache_type), count)| CacheGroup {
                level,
                size_kib,
                cache_line_size,
                cache_type,
                count,
            },
        )
        .collect()
}
