//! `gpucr.json`: what an image holds and how to check it.
//!
//! The manifest is written last, atomically (temporary file, fsync, rename, fsync of the
//! directory): a directory without it is an incomplete image. Its schema is versioned by
//! `format_version`; readers refuse versions newer than they know.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic::write_atomically;
use super::MANIFEST_FILE;
use crate::exit_code::{self, ExitCode};

/// The value of the `format` field.
pub const FORMAT_NAME: &str = "gpucr-image";
/// The newest manifest version this gpucr reads and the one it writes.
///
/// Version 2 changed the GPU section (`gpu`: device files with roles, typed GPU ids,
/// each task's backend state in a file under `gpu/state/`, an operation log; see
/// `image::gpu`). A version-1 manifest without GPU state is the same in both and is
/// read; one with GPU state is refused ([`ManifestError::OldGpuFormat`]), never misread.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest version whose GPU section this gpucr reads.
pub const GPU_FORMAT_VERSION: u32 = 2;

/// Errors reading or writing a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: no manifest: the image is incomplete (the dump did not finish)")]
    Missing { path: PathBuf },
    #[error("{path}: cannot read the manifest")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: malformed manifest at line {line}, column {column}: {message}")]
    Malformed {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: field `format` is {found:?}, not {FORMAT_NAME:?}: not a gpucr image")]
    WrongFormat { path: PathBuf, found: String },
    #[error(
        "{path}: field `format_version` is {found}, this gpucr reads up to {FORMAT_VERSION}: \
         upgrade gpucr"
    )]
    TooNew { path: PathBuf, found: u32 },
    #[error(
        "{path}: field `format_version` is {found}, whose GPU section (`gpu`) this gpucr \
         no longer reads (it reads format {GPU_FORMAT_VERSION} and newer); restore the image \
         with the gpucr that dumped it (`gpucr_version`), or dump the tree again"
    )]
    OldGpuFormat { path: PathBuf, found: u32 },
    #[error(
        "{path}: a symbolic link (to {target}), not the manifest the dump wrote: the image \
         is damaged"
    )]
    Symlink { path: PathBuf, target: PathBuf },
    #[error("{path}: cannot write the manifest")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Refuse a manifest at `path` that is a symbolic link (dangling or not), as an image
/// file that is one is refused ([`super::verify::ProblemKind::Symlink`]): gpucr writes a
/// regular file, and a link's target is not in the image, nor in a copy of it.
pub fn refuse_symlink(path: &Path) -> Result<(), ManifestError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(ManifestError::Symlink {
            path: path.to_path_buf(),
            target: fs::read_link(path).unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

/// The exit code for a manifest that exists but cannot be read: one that is not a
/// regular file (`read_regular`'s `InvalidInput`) makes the image damaged; any other
/// error is the machine's.
pub fn read_error_code(source: &io::Error) -> u8 {
    if source.kind() == io::ErrorKind::InvalidInput {
        exit_code::IMAGE_DAMAGED
    } else {
        exit_code::FAILURE
    }
}

impl ExitCode for ManifestError {
    /// No manifest: the image is incomplete; one that cannot be read: the machine
    /// failed; one that cannot be written: the image directory is not usable (full,
    /// read-only); anything else (a manifest that is not a regular file included): the
    /// image is damaged.
    fn exit_code(&self) -> u8 {
        match self {
            ManifestError::Missing { .. } => exit_code::IMAGE_INCOMPLETE,
            ManifestError::Read { source, .. } => read_error_code(source),
            ManifestError::Write { .. } => exit_code::IMAGE_DIR,
            ManifestError::Malformed { .. }
            | ManifestError::WrongFormat { .. }
            | ManifestError::TooNew { .. }
            | ManifestError::OldGpuFormat { .. }
            | ManifestError::Symlink { .. } => exit_code::IMAGE_DAMAGED,
        }
    }
}

/// The manifest of one image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// The schema version, [`FORMAT_VERSION`] when written by this gpucr.
    pub format_version: u32,
    /// The gpucr that wrote the image.
    pub gpucr_version: String,
    /// The CRIU that dumped the image ("4.2.1").
    pub criu_version: String,
    /// When the dump finished (RFC 3339, UTC).
    pub created: String,
    pub host: Host,
    /// The GPU backend that carried device state: "none" for a CPU-only tree.
    pub backend: String,
    pub target: Target,
    pub options: DumpOptions,
    /// The checksum scheme of `files` (see `image::checksum::ALGORITHM`).
    pub checksum_algorithm: String,
    /// Every file of the image except the manifest, with size and checksum.
    pub files: Vec<FileRecord>,
    pub timings: Timings,
    /// The device state of the tree and how its memory was stored (absent for a
    /// CPU-only tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<super::gpu::GpuSection>,
    /// The GPUs the tree used, as found on the dumping machine: what a restore checks
    /// this machine against (absent for a CPU-only tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<gpucr_topology::Topology>,
}

/// The machine the image was dumped on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub hostname: String,
    /// `uname -r`.
    pub kernel: String,
    /// `uname -m`.
    pub arch: String,
    /// Bytes per memory page on the dumping host: the unit of CRIU's pagemap images.
    /// 0 in manifests written before gpucr recorded it (readers then assume their own).
    #[serde(default)]
    pub page_size: u64,
}

impl Host {
    /// The page size of the image's pagemaps: the dumping host's, or this machine's
    /// where the manifest predates the field.
    pub fn page_size_or_here(&self) -> u64 {
        match self.page_size {
            0 => crate::units::host_page_size(),
            n => n,
        }
    }
}

/// The checkpointed tree's root, as seen from the dumping host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub pid: i32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// The CRIU options of the dump; restore reuses those that must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DumpOptions {
    pub leave_running: bool,
    /// tcp_established, shell_job, ext_unix_sk and file_locks, at this level.
    #[serde(flatten)]
    pub flags: crate::criu::CriuFlags,
    /// "iptables", "nftables" or "skip".
    pub network_lock: String,
    /// The tree had a mount namespace of its own (CRIU dumped it; restore needs the
    /// same external-mount options).
    #[serde(default)]
    pub mount_namespace: bool,
    /// The CRIU options `--criu-config` gave the dump (absent when none were given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criu_config: Option<CriuConfigRecord>,
    /// The dump ran in a container engine's CRIU (engine mode): the engine chose CRIU's
    /// options and restores with its own, so the fields above are CRIU's defaults, not
    /// a record (absent, read as false, for `gpucr dump`'s images).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub set_by_engine: bool,
    /// The memory pages files are recorded by size only (`--no-page-checksums`; their
    /// `checksum` is `size-only`). Absent, read as false, when every file has one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_page_checksums: bool,
}

/// CRIU options a dump took from a `--criu-config` file. A restore does not reuse them:
/// some apply to a dump only (`ghost-limit`), others are written differently for a
/// restore (`external`); `gpucr inspect` shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CriuConfigRecord {
    /// The file as given.
    pub file: String,
    /// Its options, one config-file line each, as CRIU got them ("ghost-limit=8M").
    pub options: Vec<String>,
}

/// One file of the image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Relative to the image directory, '/'-separated.
    pub path: String,
    pub size: u64,
    /// The whole-file checksum (see `image::checksum`).
    pub checksum: String,
    /// Per-block digests, present when the file spans more than one block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<String>,
}

/// How long the dump took, and when each phase began.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// From the start of `gpucr dump` to the manifest being written.
    pub total_ms: f64,
    /// Events in order: gpucr's own steps and CRIU's notifications.
    pub events: Vec<TimedEvent>,
}

/// One point in time during a dump or restore.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedEvent {
    /// "criu-started", a CRIU notify name such as "post-dump", or "criu-done".
    pub name: String,
    /// Milliseconds since the command started.
    pub at_ms: f64,
}

impl Manifest {
    /// The manifest path of an image directory.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(MANIFEST_FILE)
    }

    /// Read and validate the manifest of `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = Self::path_in(dir);
        refuse_symlink(&path)?;
        let text = match gpucr_criu_image::store::read_regular(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ManifestError::Missing { path })
            }
            Err(source) => return Err(ManifestError::Read { path, source }),
        };
        Self::parse(&text, &path)
    }

    /// Parse manifest bytes; `path` names the file in errors.
    pub fn parse(text: &[u8], path: &Path) -> Result<Manifest, ManifestError> {
        // Check the format and version first so that a newer manifest gets "upgrade"
        // rather than a confusing missing-field error.
        #[derive(Deserialize)]
        struct Header {
            format: Option<String>,
            format_version: Option<u32>,
            #[serde(default)]
            gpu: Option<serde::de::IgnoredAny>,
        }
        let malformed = |e: serde_json::Error| ManifestError::Malformed {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        };
        let header: Header = serde_json::from_slice(text).map_err(malformed)?;
        let format = header.format.unwrap_or_default();
        if format != FORMAT_NAME {
            return Err(ManifestError::WrongFormat {
                path: path.to_path_buf(),
                found: format,
            });
        }
        if let Some(v) = header.format_version {
            if v > FORMAT_VERSION {
                return Err(ManifestError::TooNew {
                    path: path.to_path_buf(),
                    found: v,
                });
            }
            if v < GPU_FORMAT_VERSION && header.gpu.is_some() {
                return Err(ManifestError::OldGpuFormat {
                    path: path.to_path_buf(),
                    found: v,
                });
            }
        }
        // The whole manifest, with the path of the field that does not fit named
        // (`files[3].size: invalid type ...`): serde alone gives line and column only.
        let mut json = serde_json::Deserializer::from_slice(text);
        let manifest: Manifest = serde_path_to_error::deserialize(&mut json).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            ManifestError::Malformed {
                path: path.to_path_buf(),
                line: inner.line(),
                column: inner.column(),
                message: if field == "." {
                    inner.to_string()
                } else {
                    format!("field `{field}`: {inner}")
                },
            }
        })?;
        json.end().map_err(malformed)?;
        Ok(manifest)
    }

    /// Write the manifest into `dir` atomically.
    pub fn write(&self, dir: &Path) -> Result<(), ManifestError> {
        self.write_in(dir, None)
    }

    /// Write the manifest into `dir` atomically, into the `room` taken for it where
    /// there is one (see [`super::room`]).
    pub fn write_in(
        &self,
        dir: &Path,
        room: Option<super::room::ManifestRoom>,
    ) -> Result<(), ManifestError> {
        let path = Self::path_in(dir);
        let err = |source| ManifestError::Write {
            path: path.clone(),
            source,
        };
        let mut text = serde_json::to_vec_pretty(self)
            .map_err(io::Error::other)
            .map_err(err)?;
        text.push(b'\n');
        match room {
            Some(room) => room.write(&path, &text).map_err(err),
            None => write_atomically(&path, &text).map_err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sample_manifest as sample;

    #[test]
    fn round_trips_through_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let m = sample();
        m.write(dir.path()).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), m);
        assert!(!dir.path().join(".gpucr.json.tmp").exists());
    }

    /// A manifest that is a symbolic link, to an intact manifest or to nothing, is
    /// damage with the link and its target named, not read through.
    #[test]
    fn a_symlinked_manifest_is_damage() {
        let real = tempfile::tempdir().unwrap();
        sample().write(real.path()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let link = Manifest::path_in(dir.path());
        let target = Manifest::path_in(real.path());
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = Manifest::read(dir.path()).unwrap_err();
        assert!(matches!(err, ManifestError::Symlink { .. }), "{err}");
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
        assert_eq!(
            err.to_string(),
            format!(
                "{}: a symbolic link (to {}), not the manifest the dump wrote: the image is \
                 damaged",
                link.display(),
                target.display()
            )
        );
        fs::remove_file(&target).unwrap();
        let err = Manifest::read(dir.path()).unwrap_err();
        assert!(
            matches!(err, ManifestError::Symlink { .. }),
            "dangling: {err}"
        );
    }

    #[test]
    fn a_manifest_without_a_page_size_reads_as_zero() {
        let mut json = serde_json::to_value(sample()).unwrap();
        json["host"].as_object_mut().unwrap().remove("page_size");
        let bytes = serde_json::to_vec(&json).unwrap();
        let m = Manifest::parse(&bytes, Path::new("gpucr.json")).unwrap();
        assert_eq!(m.host.page_size, 0);
    }

    #[test]
    fn missing_manifest_means_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let err = Manifest::read(dir.path()).unwrap_err();
        assert!(matches!(err, ManifestError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("incomplete"));
    }

    #[test]
    fn malformed_json_names_the_position() {
        let err = Manifest::parse(b"{\n  \"format\": ", Path::new("x/gpucr.json")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("x/gpucr.json: malformed manifest at line 2"),
            "{text}"
        );
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_with_its_path() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["files"][0]["size"] = "three".into();
        let text = serde_json::to_vec_pretty(&v).unwrap();
        let err = Manifest::parse(&text, Path::new("m/gpucr.json")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("m/gpucr.json: malformed manifest at line ")
                && message.contains("field `files[0].size`: invalid type: string \"three\""),
            "{message}"
        );
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
    }

    #[test]
    fn missing_field_is_named() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v.as_object_mut().unwrap().remove("files");
        let err = Manifest::parse(&serde_json::to_vec(&v).unwrap(), Path::new("m")).unwrap_err();
        assert!(err.to_string().contains("missing field `files`"), "{err}");
    }

    #[test]
    fn newer_format_version_is_refused() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["format_version"] = 99.into();
        v.as_object_mut().unwrap().remove("files");
        let err = Manifest::parse(&serde_json::to_vec(&v).unwrap(), Path::new("m")).unwrap_err();
        assert!(
            matches!(err, ManifestError::TooNew { found: 99, .. }),
            "{err}"
        );
    }

    #[test]
    fn format_1_is_read_without_gpu_state_and_refused_with_it() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["format_version"] = 1.into();
        let cpu_only = Manifest::parse(&serde_json::to_vec(&v).unwrap(), Path::new("m")).unwrap();
        assert_eq!(cpu_only.format_version, 1);
        // A format-1 GPU section (device_path, ext_files, state files inline).
        v["gpu"] = serde_json::json!({"backend": "sim", "tasks": [{"ns_pid": 1, "host_pid": 5,
            "ext_files": [3], "device_path": "/dev/fuse", "device_flags": 2,
            "directories": [], "files": [], "buffers": []}],
            "stats": {}, "timings": []});
        let err = Manifest::parse(&serde_json::to_vec(&v).unwrap(), Path::new("m")).unwrap_err();
        assert!(
            matches!(err, ManifestError::OldGpuFormat { found: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("gpucr that dumped it"), "{err}");
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
    }

    #[test]
    fn other_json_is_not_a_gpucr_image() {
        let err = Manifest::parse(b"{\"a\": 1}", Path::new("m")).unwrap_err();
        assert!(matches!(err, ManifestError::WrongFormat { .. }), "{err}");
    }
}
