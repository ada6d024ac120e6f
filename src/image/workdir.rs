//! Where a restore's own files go: CRIU's log and statistics ([`RESTORE_OUTPUTS`]), which
//! are no part of the image. They go into the image directory when it is writable, the
//! previous restore's removed first, so that a failure never shows an earlier run's log;
//! an image directory that is not writable (a read-only mount) is read only, and CRIU
//! writes them into a private directory of their own instead (its RPC `work_dir_fd`).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::unistd::{access, AccessFlags};

use super::{dir, RESTORE_OUTPUTS};
use crate::exit_code::{self, ExitCode};

/// Why no place for CRIU's log and statistics could be found.
#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    #[error(
        "{}: the image directory is not writable ({why}), and no private directory for \
         CRIU's log could be made in {}",
        .image.display(), .base.display()
    )]
    Private {
        image: PathBuf,
        why: Errno,
        base: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot remove the previous restore's {name}", .image.display())]
    Stale {
        image: PathBuf,
        name: &'static str,
        #[source]
        source: io::Error,
    },
}

impl ExitCode for WorkDirError {
    fn exit_code(&self) -> u8 {
        exit_code::IMAGE_DIR
    }
}

/// CRIU's work directory for one restore.
#[derive(Debug)]
pub struct WorkDir {
    /// Where CRIU's log and statistics go.
    pub path: PathBuf,
    /// The directory's descriptor for CRIU (`work_dir_fd`), when it is not the image
    /// directory.
    pub fd: Option<File>,
}

impl WorkDir {
    /// Whether CRIU writes into a private directory instead of the image directory.
    pub fn is_private(&self) -> bool {
        self.fd.is_some()
    }
}

/// The work directory of a restore from `image`: the image directory itself, rid of the
/// previous restore's outputs, when it is writable; else a new private directory (mode
/// 0700) under the system's temporary directory, which is kept after the restore for
/// its log.
pub fn for_restore(image: &Path) -> Result<WorkDir, WorkDirError> {
    let readonly = match access(image, AccessFlags::W_OK) {
        Ok(()) => None,
        Err(e @ (Errno::EROFS | Errno::EACCES | Errno::EPERM)) => Some(e),
        // Anything else shows up when CRIU opens the directory.
        Err(_) => None,
    };
    let Some(why) = readonly else {
        for name in RESTORE_OUTPUTS {
            match std::fs::remove_file(image.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(WorkDirError::Stale {
                        image: image.to_path_buf(),
                        name,
                        source,
                    })
                }
            }
        }
        return Ok(WorkDir {
            path: image.to_path_buf(),
            fd: None,
        });
    };
    let base = std::env::temp_dir();
    let private = |source| WorkDirError::Private {
        image: image.to_path_buf(),
        why,
        base: base.clone(),
        source,
    };
    let path = tempfile::Builder::new()
        .prefix("gpucr-restore-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&base)
        .map_err(private)?
        .keep();
    let fd = dir::open_dir(&path).map_err(|e| private(io::Error::other(e.to_string())))?;
    Ok(WorkDir { path, fd: Some(fd) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_writable_image_loses_the_previous_restores_outputs() {
        let image = tempfile::tempdir().unwrap();
        for name in RESTORE_OUTPUTS {
            std::fs::write(image.path().join(name), "old").unwrap();
        }
        std::fs::write(image.path().join("dump.log"), "kept").unwrap();
        let work = for_restore(image.path()).unwrap();
        assert_eq!(work.path, image.path());
        assert!(!work.is_private());
        for name in RESTORE_OUTPUTS {
            assert!(!image.path().join(name).exists(), "{name}");
        }
        assert!(image.path().join("dump.log").exists());
    }

    /// A read-only mount of the image: CRIU gets a private 0700 directory, and nothing
    /// in the image is touched.
    #[test]
    fn a_read_only_image_gets_a_private_work_dir() {
        let image = tempfile::tempdir().unwrap();
        std::fs::write(image.path().join("restore.log"), "old").unwrap();
        let ro = tempfile::tempdir().unwrap();
        let mount = |args: &[&str]| {
            std::process::Command::new("mount")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let (from, to) = (image.path().to_str().unwrap(), ro.path().to_str().unwrap());
        if !mount(&["--bind", from, to]) {
            eprintln!("skipped: cannot bind-mount (needs root)");
            return;
        }
        let remounted = mount(&["-o", "remount,bind,ro", to]);
        let work = remounted.then(|| for_restore(ro.path()));
        assert!(std::process::Command::new("umount")
            .arg(to)
            .status()
            .unwrap()
            .success());
        let work = work.unwrap().unwrap();
        assert!(work.is_private());
        assert_ne!(work.path, ro.path());
        let mode = std::fs::metadata(&work.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(image.path().join("restore.log").exists(), "left alone");
        std::fs::remove_dir(&work.path).unwrap();
    }
}
