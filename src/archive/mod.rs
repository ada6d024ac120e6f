//! Container checkpoint archives, as podman, CRI-O and containerd write them: a tar
//! (zstd, gzip or plain) holding `checkpoint/` (CRIU's image directory, with gpucr's
//! manifest and GPU memory when gpucr's plugin took part), the engine's `config.dump` and
//! `spec.dump`, `stats-dump`, `rootfs-diff.tar` and a few more.
//!
//! * [`open`]: the decompressed stream, the compression told by its first bytes;
//! * [`scan`]: one streaming read, bounded memory, nothing unpacked to disk;
//! * [`pages`]: which pages of a pages file the views need;
//! * [`container`]: the container from `config.dump` and `spec.dump`.

pub mod container;
pub mod open;
pub mod pages;
pub mod scan;

use std::io;
use std::path::PathBuf;

pub use container::{container_info, CheckpointSize, ContainerInfo};
pub use open::Compression;
pub use scan::{scan, Member, Scan, ScanOptions};

/// The directory of CRIU's images inside an archive.
pub const CHECKPOINT_DIR: &str = "checkpoint";
/// The engine's container configuration.
pub const CONFIG_DUMP: &str = "config.dump";
/// The container's OCI runtime spec.
pub const SPEC_DUMP: &str = "spec.dump";
/// CRIU's dump statistics (podman keeps them next to `checkpoint/`).
pub const STATS_DUMP: &str = "stats-dump";
/// The changes to the container's root filesystem.
pub const ROOTFS_DIFF: &str = "rootfs-diff.tar";

/// Why an archive cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{}: cannot open", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {}cannot read the archive", path.display(),
        member.as_ref().map(|m| format!("{m}: ")).unwrap_or_default())]
    Read {
        path: PathBuf,
        member: Option<String>,
        #[source]
        source: io::Error,
    },
    #[error("{}: {member}: {size} bytes, more than the {limit} bytes gpucr keeps in memory \
             while reading an archive; unpack it and inspect the directory", path.display())]
    TooLarge {
        path: PathBuf,
        member: String,
        size: u64,
        limit: u64,
    },
    /// The file's first bytes are neither a tar header nor gzip or zstd.
    #[error("{}: not a container checkpoint archive (neither a tar archive nor a gzip- or \
             zstd-compressed one)", path.display())]
    NotAnArchive { path: PathBuf },
    /// A tar archive, but without CRIU's images under [`CHECKPOINT_DIR`].
    #[error("{}: not a container checkpoint archive: it has no files under {CHECKPOINT_DIR}/",
            path.display())]
    NoCheckpoint { path: PathBuf },
}

impl crate::exit_code::ExitCode for ArchiveError {
    /// A path that does not exist is what a missing image directory is (incomplete);
    /// an archive that cannot be read, or a file that is not one, is damaged.
    fn exit_code(&self) -> u8 {
        use crate::exit_code::{FAILURE, IMAGE_DAMAGED, IMAGE_INCOMPLETE};
        match self {
            ArchiveError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                IMAGE_INCOMPLETE
            }
            ArchiveError::Open { .. } | ArchiveError::TooLarge { .. } => FAILURE,
            ArchiveError::Read { .. }
            | ArchiveError::NotAnArchive { .. }
            | ArchiveError::NoCheckpoint { .. } => IMAGE_DAMAGED,
        }
    }
}

/// What [`read_checkpoint_file`] found.
#[derive(Debug, Default)]
pub struct CheckpointFile {
    /// The file's content; None when the image has no such file.
    pub content: Option<Vec<u8>>,
    /// The image has a file under `checkpoint/gpu/` (GPU memory) before the file, or at
    /// all when there is no such file.
    pub has_gpu_dir: bool,
}

/// Read the file `file` of the image in the archive at `path` (the member
/// `checkpoint/FILE`, at most `limit` bytes). Stops reading once it is found. An archive
/// with no file under `checkpoint/` is not a checkpoint archive
/// ([`ArchiveError::NoCheckpoint`]): members whose names `inspect` skips (`..`, empty
/// components) and directories count for nothing, as they do there.
pub fn read_checkpoint_file(
    path: &std::path::Path,
    file: &str,
    limit: u64,
) -> Result<CheckpointFile, ArchiveError> {
    let name = format!("{CHECKPOINT_DIR}/{file}");
    let gpu_prefix = format!("{}/", crate::transfer::GPU_DIR);
    let mut found = CheckpointFile::default();
    let mut image_seen = false;
    let result = scan::each_member(path, |member, size, kind, reader| {
        if kind != "file" {
            return Ok(scan::Flow::Next);
        }
        let Some(rel) = scan::checkpoint_file(member) else {
            return Ok(scan::Flow::Next);
        };
        image_seen = true;
        found.has_gpu_dir |= rel.starts_with(&gpu_prefix);
        if member != name {
            return Ok(scan::Flow::Next);
        }
        if size > limit {
            return Err(ArchiveError::TooLarge {
                path: path.to_path_buf(),
                member: member.to_string(),
                size,
                limit,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        io::Read::read_to_end(reader, &mut bytes).map_err(|source| ArchiveError::Read {
            path: path.to_path_buf(),
            member: Some(member.to_string()),
            source,
        })?;
        found.content = Some(bytes);
        Ok(scan::Flow::Stop)
    });
    result?;
    if !image_seen {
        return Err(ArchiveError::NoCheckpoint {
            path: path.to_path_buf(),
        });
    }
    Ok(found)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;

    /// A plain tar at `path` of `(name, content)` files, the names written as given
    /// (`..` included, which tar's own path setters refuse).
    pub(crate) fn raw_tar(path: &Path, members: &[(&str, &[u8])]) {
        let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, content) in members {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_size(content.len() as u64);
            h.set_mode(0o600);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            tar.append(&h, *content).unwrap();
        }
        tar.into_inner().unwrap();
    }

    #[test]
    fn a_member_inspect_skips_makes_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        raw_tar(&path, &[("checkpoint/../../y", b"x")]);
        let err = read_checkpoint_file(&path, "gpucr.json", 1 << 20).unwrap_err();
        assert!(matches!(err, ArchiveError::NoCheckpoint { .. }), "{err}");
        assert_eq!(
            crate::exit_code::ExitCode::exit_code(&err),
            crate::exit_code::IMAGE_DAMAGED
        );
    }

    #[test]
    fn gpu_memory_without_the_file_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        raw_tar(&path, &[("checkpoint/inventory.img", b"x")]);
        let found = read_checkpoint_file(&path, "gpucr.json", 1 << 20).unwrap();
        assert!(found.content.is_none() && !found.has_gpu_dir);
        raw_tar(
            &path,
            &[
                ("checkpoint/inventory.img", b"x"),
                ("checkpoint/gpu/data-0", b"y"),
            ],
        );
        let found = read_checkpoint_file(&path, "gpucr.json", 1 << 20).unwrap();
        assert!(found.content.is_none() && found.has_gpu_dir);
        raw_tar(
            &path,
            &[
                ("checkpoint/gpucr.json", b"{}"),
                ("checkpoint/gpu/data-0", b"y"),
            ],
        );
        let found = read_checkpoint_file(&path, "gpucr.json", 1 << 20).unwrap();
        assert_eq!(found.content.as_deref(), Some(&b"{}"[..]));
    }
}
