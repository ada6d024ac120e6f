//! `gpucr check-topology [DIR|ARCHIVE]`: glue between the CLI and `gpucr-topology`.
//!
//! Exit codes: [`exit_code::SUCCESS`] when the image can be restored here (or without
//! DIR, once the table is printed), [`exit_code::TOPOLOGY_INCOMPATIBLE`] when it cannot;
//! errors are returned, and [`CheckTopologyError::exit_code`] says which code an error
//! about the image's manifest deserves.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpucr_topology::{check_local, read_local, Checks, GpuTable, Report, Topology};

use super::common::print_out;
use crate::cli::{CheckTopologyArgs, TopologyCheckArgs};
use crate::exit_code;
use crate::image::dir::ImagePath;
use crate::image::{Manifest, ManifestError};

/// The manifest's file name in an image directory.
const MANIFEST: &str = "gpucr.json";

/// What `check-topology DIR` says about an image without GPU state.
const NO_GPU_STATE: &str = "the image holds no GPU state: compatible with any machine";

/// What `check-topology DIR` says about an image whose tasks use GPUs that the dump
/// recorded no topology of (the dumping machine's GPUs could not be read).
fn no_topology(gpus: &[String]) -> String {
    format!(
        "the image's tasks use GPUs ({}), but the dump recorded no topology of them (that \
         machine's GPUs could not be read): there is nothing to check this machine against",
        gpus.join(", ")
    )
}

/// Why the image's topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckTopologyError {
    /// No `gpucr.json`: not an image, or an incomplete one.
    #[error("{} is missing: not a gpucr image, or the dump did not finish", path.display())]
    ManifestMissing {
        /// The manifest's path.
        path: PathBuf,
    },
    /// The manifest exists but cannot be read.
    #[error("cannot read {}", path.display())]
    ManifestRead {
        /// The manifest's path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Nothing at the path given.
    #[error("{}: no such image directory or archive", path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The path exists but is neither a directory nor a file.
    #[error("{}: not an image directory or archive (neither a directory nor a file)", path.display())]
    NotAnImage {
        /// The path given.
        path: PathBuf,
    },
    /// The archive cannot be read.
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
    /// The manifest is not one this gpucr reads (not JSON, a field missing or of the
    /// wrong type, another format, a newer version), as `inspect` and `restore` find.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// An archive with GPU memory (`checkpoint/gpu/`) but no manifest: the dump did not
    /// finish.
    #[error("{}: missing, but the image holds GPU memory (gpu/): the dump did not finish", path.display())]
    ArchiveManifestMissing {
        /// The manifest's path in the archive.
        path: PathBuf,
    },
}

impl crate::exit_code::ExitCode for CheckTopologyError {
    /// The process exit code for this error.
    fn exit_code(&self) -> u8 {
        match self {
            CheckTopologyError::ManifestMissing { .. }
            | CheckTopologyError::ArchiveManifestMissing { .. }
            | CheckTopologyError::NotFound { .. } => exit_code::IMAGE_INCOMPLETE,
            CheckTopologyError::ManifestRead { source, .. } => {
                crate::image::manifest::read_error_code(source)
            }
            CheckTopologyError::NotAnImage { .. } => exit_code::IMAGE_DAMAGED,
            CheckTopologyError::Manifest(e) => e.exit_code(),
            CheckTopologyError::Archive(e) => e.exit_code(),
        }
    }
}

/// What an image says about GPUs: the topology recorded at the dump (`None` without
/// one), the backend that carried its device state, and the GPUs its tasks use
/// (`"nvidia:<UUID>"`, `"kfd:<gpu_id>"`).
#[derive(Debug, Default)]
pub struct ImageGpus {
    pub topology: Option<Topology>,
    pub backend: Option<String>,
    pub used: Vec<String>,
}

/// The GPU topology stored in the image at `dir` (a directory, or a container
/// checkpoint archive holding the image under `checkpoint/`), and the GPUs its tasks
/// use.
pub fn read_image_topology(dir: &Path) -> Result<ImageGpus, CheckTopologyError> {
    match ImagePath::of(dir) {
        ImagePath::File => return read_archive_topology(dir),
        ImagePath::Other => {
            return Err(CheckTopologyError::NotAnImage {
                path: dir.to_path_buf(),
            })
        }
        ImagePath::Missing => {
            return Err(CheckTopologyError::NotFound {
                path: dir.to_path_buf(),
            })
        }
        ImagePath::Directory => {}
    }
    // Read as inspect and restore read it (a symlink refused), with this command's
    // words for a manifest that is missing or cannot be read.
    let manifest = Manifest::read(dir).map_err(|e| match e {
        ManifestError::Missing { path } => CheckTopologyError::ManifestMissing { path },
        ManifestError::Read { path, source } => CheckTopologyError::ManifestRead { path, source },
        other => other.into(),
    })?;
    Ok(gpus_of(manifest))
}

/// The topology in the manifest `checkpoint/gpucr.json` of the archive at `archive`,
/// read as a stream up to the manifest. An archive without one (a container
/// checkpointed without gpucr) holds no GPU state gpucr knows of, unless it holds GPU
/// memory: then the dump did not finish.
fn read_archive_topology(archive: &Path) -> Result<ImageGpus, CheckTopologyError> {
    let name = format!("{}/{MANIFEST}", crate::archive::CHECKPOINT_DIR);
    let path = archive.join(&name);
    let found = crate::archive::read_checkpoint_file(archive, MANIFEST, MAX_MANIFEST)?;
    match found.content {
        Some(text) => parse_topology(&text, &path),
        None if found.has_gpu_dir => Err(CheckTopologyError::ArchiveManifestMissing { path }),
        None => Ok(ImageGpus::default()),
    }
}

/// The largest manifest read from an archive.
const MAX_MANIFEST: u64 = 256 << 20;

/// The GPUs of the manifest `text`, read whole as `inspect` and `restore` read it: a
/// manifest they refuse (another format, a newer version, a field missing or of the
/// wrong type) is refused here too.
fn parse_topology(text: &[u8], path: &Path) -> Result<ImageGpus, CheckTopologyError> {
    Ok(gpus_of(Manifest::parse(text, path)?))
}

/// The topology the manifest records and the GPUs its tasks use.
fn gpus_of(manifest: Manifest) -> ImageGpus {
    let (backend, used) = match &manifest.gpu {
        Some(gpu) => (Some(gpu.backend.clone()), gpu.used_gpus()),
        None => (None, Vec::new()),
    };
    ImageGpus {
        topology: manifest.topology.filter(Topology::has_gpus),
        used,
        backend,
    }
}

/// Checks `saved` against this machine's topology as `gpucr restore` would: read under
/// `--sysfs-root`, else where the image's backend reads it (the sim root for simulated
/// GPUs), with `CUDA_VISIBLE_DEVICES` and the checks the environment and `--skip-check`
/// leave on.
fn check_against_local(
    saved: &Topology,
    backend: Option<&str>,
    args: &TopologyCheckArgs,
) -> anyhow::Result<Report> {
    let root = args
        .sysfs_root
        .clone()
        .or_else(|| backend.and_then(crate::gpu::topology_root));
    let visible = std::env::var(gpucr_topology::nvidia::visible::VARIABLE).ok();
    check_local(
        saved,
        root.as_deref(),
        visible.as_deref(),
        &Checks::from_env_and_skips(&args.skip_check),
    )
    .context("cannot read this machine's GPU topology")
}

pub fn run(args: &CheckTopologyArgs) -> Result<u8, crate::cmd::Failure> {
    let json = args.output.json;
    let Some(dir) = &args.dir else {
        let local = read_local(args.topology.sysfs_root.as_deref())
            .context("cannot read this machine's GPU topology")?;
        let table = GpuTable::new(&local);
        if json {
            print_out(serde_json::to_string_pretty(&table)? + "\n")?;
        } else {
            print_out(table.to_string())?;
        }
        return Ok(exit_code::SUCCESS);
    };

    let image = read_image_topology(dir)?;
    let Some(saved) = image.topology else {
        let note = if image.used.is_empty() {
            NO_GPU_STATE.to_owned()
        } else {
            no_topology(&image.used)
        };
        if json {
            let value = serde_json::json!({
                "compatible": true,
                "mapping": null,
                "disabled_checks": [],
                "problems": [],
                "gpus": [],
                "would_map_without": [],
                "notes": [note],
            });
            print_out(serde_json::to_string_pretty(&value)? + "\n")?;
        } else {
            print_out(format!("{note}\n"))?;
        }
        return Ok(exit_code::SUCCESS);
    };

    let report = check_against_local(&saved, image.backend.as_deref(), &args.topology)?;
    if json {
        print_out(serde_json::to_string_pretty(&report)? + "\n")?;
    } else {
        print_out(report.to_string())?;
    }
    Ok(if report.compatible {
        exit_code::SUCCESS
    } else {
        exit_code::TOPOLOGY_INCOMPATIBLE
    })
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn manifest_errors_have_image_exit_codes() {
        use crate::exit_code::ExitCode;
        let dir = tempfile::tempdir().unwrap();
        let err = read_image_topology(dir.path()).unwrap_err();
        assert_eq!(err.exit_code(), exit_code::IMAGE_INCOMPLETE);
        fs::write(dir.path().join(MANIFEST), "{").unwrap();
        let err = read_image_topology(dir.path()).unwrap_err();
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::create_dir(dir.path().join("sub").join(MANIFEST)).unwrap();
        let err = read_image_topology(&dir.path().join("sub")).unwrap_err();
        assert_eq!(
            err.exit_code(),
            exit_code::IMAGE_DAMAGED,
            "a manifest that is a directory"
        );
    }

    /// A valid manifest (`gpucr_core::testing::sample_manifest`) with `changes` applied.
    fn manifest_with(changes: serde_json::Value) -> Vec<u8> {
        let mut value = serde_json::to_value(gpucr_core::testing::sample_manifest()).unwrap();
        for (key, field) in changes.as_object().unwrap() {
            value[key] = field.clone();
        }
        serde_json::to_vec(&value).unwrap()
    }

    /// A GPU section whose tasks use `gpus`.
    fn gpu_section(backend: &str, gpus: &[&[&str]]) -> serde_json::Value {
        let tasks: Vec<serde_json::Value> = gpus
            .iter()
            .enumerate()
            .map(|(i, gpus)| {
                serde_json::json!({
                    "ns_pid": i + 1, "host_pid": 100 + i, "gpus": gpus, "device_files": [],
                    "state": {"file": format!("gpu/state/task-{}.bin", i + 1), "format": "sim/1", "size": 0},
                    "buffers": [], "operations": [],
                })
            })
            .collect();
        serde_json::json!({
            "backend": backend,
            "tasks": tasks,
            "stats": {"buffers": 0, "raw_bytes": 0, "stored_bytes": 0, "zero_chunks": 0,
                      "raw_chunks": 0, "compressed_chunks": 0, "seconds": 0.0},
            "timings": [],
        })
    }

    #[test]
    fn an_image_whose_gpus_have_no_recorded_topology_says_so() {
        let manifest = manifest_with(serde_json::json!({
            "topology": {"kfd_nodes": [], "nvidia_gpus": []},
            "gpu": gpu_section("cuda", &[&["nvidia:GPU-b"], &["nvidia:GPU-a", "nvidia:GPU-b"]]),
        }));
        let image = parse_topology(&manifest, Path::new("gpucr.json")).unwrap();
        assert!(image.topology.is_none());
        assert_eq!(image.used, ["nvidia:GPU-a", "nvidia:GPU-b"]);
        assert_eq!(image.backend.as_deref(), Some("cuda"));
        assert!(no_topology(&image.used).starts_with(
            "the image's tasks use GPUs (nvidia:GPU-a, nvidia:GPU-b), but the dump recorded no topology"
        ));
        let plain = parse_topology(
            &manifest_with(serde_json::json!({})),
            Path::new("gpucr.json"),
        )
        .unwrap();
        assert!(plain.topology.is_none() && plain.used.is_empty() && plain.backend.is_none());
    }

    /// What `inspect` and `restore` refuse as no gpucr image, damaged or too new, this
    /// refuses too, with the same exit code and the file and field named; it is never
    /// "compatible with any machine".
    #[test]
    fn a_manifest_inspect_and_restore_refuse_is_refused() {
        use crate::exit_code::ExitCode;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                manifest_with(serde_json::json!({"format": "other"})),
                "gpucr.json: field `format` is \"other\", not \"gpucr-image\"",
            ),
            (
                manifest_with(serde_json::json!({"format_version": 99})),
                "gpucr.json: field `format_version` is 99",
            ),
            (b"{}".to_vec(), "gpucr.json: field `format` is \"\""),
            (
                manifest_with(
                    serde_json::json!({"target": {"pid": "x", "comm": "w", "cmdline": []}}),
                ),
                "gpucr.json: malformed manifest at line 1",
            ),
            (
                manifest_with(serde_json::json!({"created": null})),
                "gpucr.json: malformed manifest at line 1",
            ),
            (
                {
                    let mut v: serde_json::Value =
                        serde_json::from_slice(&manifest_with(serde_json::json!({}))).unwrap();
                    v.as_object_mut().unwrap().remove("host");
                    serde_json::to_vec(&v).unwrap()
                },
                "missing field `host`",
            ),
        ];
        for (text, says) in cases {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(MANIFEST), &text).unwrap();
            let err = read_image_topology(dir.path()).unwrap_err();
            assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED, "{err}");
            let inspect = Manifest::read(dir.path()).unwrap_err();
            assert_eq!(err.exit_code(), inspect.exit_code());
            assert!(err.to_string().contains(says), "{err}");
            assert!(
                err.to_string()
                    .starts_with(&dir.path().join(MANIFEST).display().to_string()),
                "{err}"
            );
        }
    }

    /// An archive inspect calls no checkpoint archive, or incomplete, is one here too.
    #[test]
    fn archives_inspect_refuses_are_refused() {
        use crate::exit_code::ExitCode;
        use gpucr_core::testing::raw_tar;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        raw_tar(&path, &[("checkpoint/../../y", b"x")]);
        let err = read_image_topology(&path).unwrap_err();
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
        assert!(
            err.to_string()
                .contains("not a container checkpoint archive"),
            "{err}"
        );

        raw_tar(&path, &[("checkpoint/gpu/data-0", b"y")]);
        let err = read_image_topology(&path).unwrap_err();
        assert_eq!(err.exit_code(), exit_code::IMAGE_INCOMPLETE);
        assert!(
            err.to_string().starts_with(&format!(
                "{}/checkpoint/gpucr.json: missing",
                path.display()
            )),
            "{err}"
        );

        raw_tar(
            &path,
            &[("checkpoint/gpucr.json", br#"{"format": "other"}"#)],
        );
        let err = read_image_topology(&path).unwrap_err();
        assert_eq!(err.exit_code(), exit_code::IMAGE_DAMAGED);
        assert!(
            err.to_string()
                .contains("checkpoint/gpucr.json: field `format`"),
            "{err}"
        );

        // A container checkpointed without gpucr holds no GPU state.
        raw_tar(&path, &[("checkpoint/inventory.img", b"x")]);
        let image = read_image_topology(&path).unwrap();
        assert!(image.topology.is_none() && image.used.is_empty());
    }
}
