//! Completing an image once CRIU has written it: a checksum of every file, then the
//! manifest, written last (an image without it is incomplete).

use std::path::{Path, PathBuf};

use nix::sys::utsname::uname;

use super::{DumpError, DumpOutcome};
use crate::gpu;
use crate::image;
use crate::image::checksum;
use crate::image::dir;
use crate::image::follow::Prefixes;
use crate::image::manifest::{self, FileRecord, Manifest, Timings};
use crate::image::room::ManifestRoom;
use crate::progress::Progress;
use crate::target;

/// What the manifest records besides the image's files.
pub struct ImageFacts<'a> {
    pub target: target::TargetInfo,
    pub criu_version: String,
    pub options: manifest::DumpOptions,
    /// The backend's local topology (being read since the dump started) and what its
    /// helper collected, for a dump with GPU state.
    pub gpu: Option<(gpu::LocalTopology, &'a gpu::GpuManifest)>,
    /// The room taken for the manifest before the tree was let go, if it was.
    pub room: Option<ManifestRoom>,
    /// Files of the image directory left out of the manifest: those CRIU still writes
    /// when it is written (engine mode: CRIU's log, when CRIU keeps it there), whose
    /// final contents no checksum could hold. None under `gpucr dump`, which writes the
    /// manifest once CRIU has ended.
    pub still_written: Vec<String>,
}

/// CRIU has written the image: checksum every file (`known` holds the blocks already
/// hashed while CRIU wrote) and write the manifest, last, which makes the image
/// complete. Shared by `gpucr dump` and the engine mode's helper.
pub fn write_manifest(
    dir: &Path,
    known: &Prefixes,
    facts: ImageFacts<'_>,
    progress: &mut Progress,
) -> Result<DumpOutcome, DumpError> {
    let size_only = facts.options.no_page_checksums;
    let files = checksum_image(dir, known, &facts.still_written, size_only)?;
    progress.event("checksums-done", "writing the manifest");
    let image_bytes = files.iter().map(|f| f.size).sum();
    let pages_bytes = files
        .iter()
        .filter(|f| is_pages_file(&f.path))
        .map(|f| f.size)
        .sum();
    let (topology, gpu_section, backend) = match facts.gpu {
        Some((local, g)) => (
            Some(local.used_by(&g.tasks)?),
            Some(image::gpu::GpuSection::from_runtime(g)),
            g.backend.clone(),
        ),
        None => (None, None, "none".into()),
    };
    let uts = uname().ok();
    let uts_field = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
        uts.as_ref()
            .map(|u| f(u).to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let target = facts.target;
    let mut manifest = Manifest {
        format: manifest::FORMAT_NAME.into(),
        format_version: manifest::FORMAT_VERSION,
        gpucr_version: env!("CARGO_PKG_VERSION").into(),
        criu_version: facts.criu_version,
        created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        host: manifest::Host {
            hostname: uts_field(|u| u.nodename()),
            kernel: uts_field(|u| u.release()),
            arch: uts_field(|u| u.machine()),
            page_size: crate::units::host_page_size(),
        },
        backend,
        target: manifest::Target {
            pid: target.pid,
            comm: target.comm,
            cmdline: target.cmdline,
        },
        options: facts.options,
        checksum_algorithm: checksum::ALGORITHM.into(),
        files,
        timings: Timings::default(),
        gpu: gpu_section,
        topology,
    };
    progress.event("manifest-written", "done");
    manifest.timings = Timings {
        total_ms: progress.elapsed_ms(),
        events: progress.events().to_vec(),
    };
    manifest.write_in(dir, facts.room)?;
    Ok(DumpOutcome {
        manifest,
        image_bytes,
        pages_bytes,
        in_tree: Default::default(),
    })
}

/// The size of the manifest's GPU section for `m`, as JSON.
pub fn gpu_section_bytes(m: &gpu::GpuManifest) -> u64 {
    serde_json::to_vec_pretty(&image::gpu::GpuSection::from_runtime(m))
        .map_or(0, |v| v.len() as u64)
}

/// `gpu/<data file>`: GPU memory, checksummed per chunk by the transfer engine.
pub fn is_gpu_data_file(path: &str) -> bool {
    // Everything in gpu/ but the index (see docs/gpu-image-format.md).
    path.strip_prefix("gpu/")
        .is_some_and(|name| name != crate::transfer::INDEX_FILE && !name.contains('/'))
}

pub use crate::image::checksum::is_pages_file;

/// Checksum every image file but those `left_out`; `known` holds the blocks the
/// follower already hashed. With `pages_size_only`, the memory pages files are
/// recorded by size alone.
fn checksum_image(
    dir: &Path,
    known: &Prefixes,
    left_out: &[String],
    pages_size_only: bool,
) -> Result<Vec<FileRecord>, DumpError> {
    let mut names = dir::image_files(dir)?;
    names.retain(|name| !left_out.contains(name));
    // GPU data files carry a checksum per chunk (gpu/index), and with `pages_size_only`
    // the pages files go without one: only their size is recorded.
    let marker = |name: &str| {
        if is_gpu_data_file(name) {
            Some(checksum::CHUNK_VERIFIED)
        } else if pages_size_only && is_pages_file(name) {
            Some(checksum::SIZE_ONLY)
        } else {
            None
        }
    };
    let mut records: Vec<FileRecord> = Vec::new();
    let mut to_hash = Vec::new();
    for name in names {
        let Some(marker) = marker(&name) else {
            to_hash.push(name);
            continue;
        };
        let path = dir.join(&name);
        let size = std::fs::metadata(&path)
            .map_err(|source| DumpError::Checksum { path, source })?
            .len();
        records.push(FileRecord {
            path: name,
            size,
            checksum: marker.into(),
            blocks: Vec::new(),
        });
    }
    let names = to_hash;
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let prefixes: Vec<Vec<u64>> = names
        .iter()
        .map(|n| known.get(n).cloned().unwrap_or_default())
        .collect();
    // CRIU has finished writing: the files can be mapped.
    let digests =
        checksum::digest_image_files_resuming(&refs, &prefixes, image::verify::default_threads());
    names
        .into_iter()
        .zip(paths)
        .zip(digests)
        .map(|((name, path), digest)| {
            let digest = digest.map_err(|source| DumpError::Checksum { path, source })?;
            let blocks = if digest.blocks.len() > 1 {
                digest.block_hex()
            } else {
                Vec::new()
            };
            Ok(FileRecord {
                path: name,
                size: digest.size,
                checksum: digest.checksum(),
                blocks,
            })
        })
        .collect::<Result<Vec<_>, DumpError>>()
        .map(|mut hashed| {
            hashed.append(&mut records);
            hashed.sort_by(|a, b| a.path.cmp(&b.path));
            hashed
        })
}
