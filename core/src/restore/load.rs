//! Reading an image for a restore: its manifest, its files verified, and this
//! machine's GPU topology read meanwhile.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::{interrupted, RestoreError};
use crate::gpu::LocalTopology;
use crate::image::dir::{self, ImagePath};
use crate::image::manifest::{Manifest, ManifestError};
use crate::image::verify::{self, Scope, VerifyError};
use crate::transfer::TransferError;

/// Check every chunk of the image's GPU memory against `gpu/index` (as
/// `gpucr inspect --verify` does), for `--verify-first`: a damaged chunk is refused
/// before CRIU starts. Nothing to do for an image without GPU state. A signal that sets
/// `stop` ends the check with [`RestoreError::Interrupted`].
pub(super) fn verify_gpu_first(
    dir: &Path,
    manifest: &Manifest,
    stop: &AtomicBool,
) -> Result<(), RestoreError> {
    if manifest.gpu.is_none() {
        return Ok(());
    }
    match crate::transfer::verify_image_until(dir, verify::default_threads(), stop) {
        Ok(problems) if problems.is_empty() => Ok(()),
        Ok(problems) => Err(RestoreError::GpuDamaged {
            dir: dir.to_path_buf(),
            problems,
        }),
        Err(TransferError::Cancelled { .. }) => Err(interrupted()),
        Err(source) => Err(RestoreError::GpuImage {
            dir: dir.to_path_buf(),
            source,
        }),
    }
}

/// An image's manifest, read and its files checked, and this machine's GPU topology
/// being read meanwhile, for [`prepare_gpu`].
pub struct Loaded {
    pub manifest: Manifest,
    /// The read of the topology the image's GPUs are checked against: started once the
    /// manifest said the image has GPUs to map, so that NVML's initialisation (about
    /// 200 ms on an H200) overlaps the verification and the driver's start.
    pub topology: Option<LocalTopology>,
}

/// Read the manifest and verify every file, before anything else touches the image;
/// the topology under `sysfs_root` (default: the image's backend's) is read meanwhile.
pub fn load_verified(dir: &Path, sysfs_root: Option<&Path>) -> Result<Loaded, RestoreError> {
    load_checked(dir, Scope::All, &AtomicBool::new(false), sysfs_root)
}

/// Read the manifest and check the files `scope` covers, reading the topology meanwhile
/// ([`Loaded`]); a signal that sets `stop` ends the check with
/// [`RestoreError::Interrupted`].
pub(super) fn load_checked(
    dir: &Path,
    scope: Scope,
    stop: &AtomicBool,
    sysfs_root: Option<&Path>,
) -> Result<Loaded, RestoreError> {
    match ImagePath::of(dir) {
        ImagePath::Directory => {}
        ImagePath::Missing => {
            return Err(RestoreError::NoDir {
                dir: dir.to_path_buf(),
            })
        }
        found => {
            return Err(RestoreError::NotADirectory {
                dir: dir.to_path_buf(),
                found,
            })
        }
    }
    let manifest = match Manifest::read(dir) {
        Ok(m) => m,
        Err(ManifestError::Missing { path }) => {
            let reason = dir::incomplete_reason(dir).map_or_else(
                || format!("{} is missing (the dump did not finish)", path.display()),
                |r| format!("the dump failed: {r}"),
            );
            return Err(RestoreError::Incomplete {
                dir: dir.to_path_buf(),
                reason,
            });
        }
        Err(e) => return Err(RestoreError::Manifest(e)),
    };
    let topology = topology_ahead(&manifest, sysfs_root);
    let problems =
        match verify::verify_files_until(dir, &manifest, verify::default_threads(), scope, stop) {
            Err(VerifyError::Stopped) => return Err(interrupted()),
            result => result?,
        };
    if !problems.is_empty() {
        return Err(RestoreError::Damaged {
            dir: dir.to_path_buf(),
            problems,
        });
    }
    Ok(Loaded { manifest, topology })
}

/// The read of the topology `manifest`'s GPUs will be checked against, started on a
/// thread of its own; None when the image has no GPU state or no recorded GPUs. The
/// topology is read where the image's backend would read it (`gpu::topology_root`,
/// known without loading its driver), or under `sysfs_root`.
fn topology_ahead(manifest: &Manifest, sysfs_root: Option<&Path>) -> Option<LocalTopology> {
    let backend = &manifest.gpu.as_ref()?.backend;
    manifest.topology.as_ref().filter(|t| t.has_gpus())?;
    let root = sysfs_root
        .map(Path::to_path_buf)
        .or_else(|| crate::gpu::topology_root(backend));
    Some(LocalTopology::start_at(root))
}
