//! Where a restore's own files go: CRIU's log and statistics ([`RESTORE_OUTPUTS`]), which
//! are no part of the image. They go into the image directory when it is writable, the
//! previous restore's removed first, so that a failure never shows an earlier run's log;
//! an image directory that is not writable (a read-only mount) is read only, and CRIU
//! writes them into a private directory of their own instead (its RPC `work_dir_fd`).
//!
//! A private directory lives under the system's temporary directory as
//! `gpucr-restore-NAME-HASH-XXXXXX` (NAME: the image directory's own name, HASH: of its
//! canonical path, so every restore of one image shares the prefix). It follows the rule
//! of the image directory's own log: removed once its restore succeeded (its log is not
//! needed), kept after a failure for its log (named in the error; removed at once when
//! CRIU wrote nothing into it), and removed by the next restore of the same image. The
//! restore that owns a directory holds an exclusive `flock` on it while it runs, so a
//! concurrent restore of the same image never removes it; a directory is made under
//! another name and renamed into place once locked.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{renameat2, Flock, FlockArg, RenameFlags, AT_FDCWD};
use nix::unistd::{access, geteuid, AccessFlags};

use super::{dir, RESTORE_OUTPUTS};
use crate::exit_code::{self, ExitCode};

/// How the names of all private work directories begin.
const PRIVATE_PREFIX: &str = "gpucr-restore-";
/// The name a private work directory has until it is locked: no restore removes it.
const NEW_PREFIX: &str = "gpucr-restore-new.";
/// At most this much of the image directory's name goes into a private directory's.
const NAME_CHARS: usize = 32;

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
    /// The private directory, opened for CRIU (`work_dir_fd`) and locked while this
    /// restore runs; None when CRIU writes into the image directory.
    private: Option<Flock<File>>,
    /// Directories of earlier restores of the image that could not be removed, each
    /// with the reason, for warnings.
    pub unremoved: Vec<String>,
}

impl WorkDir {
    /// Whether CRIU writes into a private directory instead of the image directory.
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }

    /// The private directory's descriptor for CRIU (`work_dir_fd`); None when CRIU
    /// writes into the image directory.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.private.as_ref().map(|locked| locked.as_fd())
    }

    /// After a restore that succeeded: a private directory is removed, its log being of
    /// no more use. Nothing to do for the image directory.
    pub fn remove(self) -> io::Result<()> {
        match &self.private {
            Some(_) => std::fs::remove_dir_all(&self.path),
            None => Ok(()),
        }
    }

    /// After a restore that failed: a private directory CRIU wrote into is kept for its
    /// log and returned (the next restore of the image removes it); an empty one, of a
    /// restore that failed before CRIU opened its log, is removed. None for the image
    /// directory.
    pub fn keep_for_failure(self) -> Option<PathBuf> {
        self.private.as_ref()?;
        let written = std::fs::read_dir(&self.path)
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(true);
        if !written && std::fs::remove_dir(&self.path).is_ok() {
            return None;
        }
        Some(self.path.clone())
    }
}

/// The work directory of a restore from `image`: the image directory itself, rid of the
/// previous restore's outputs, when it is writable; else a new private directory (mode
/// 0700) under the system's temporary directory, locked for this restore, once those
/// that earlier restores of the image left are removed (see the module's text).
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
            private: None,
            unremoved: Vec::new(),
        });
    };
    let base = std::env::temp_dir();
    let private = |source| WorkDirError::Private {
        image: image.to_path_buf(),
        why,
        base: base.clone(),
        source,
    };
    let prefix = private_prefix(image);
    let unremoved = remove_ended(&base, &prefix);
    let made = tempfile::Builder::new()
        .prefix(NEW_PREFIX)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&base)
        .map_err(private)?;
    let opened =
        dir::open_dir(made.path()).map_err(|e| private(io::Error::other(e.to_string())))?;
    let locked = Flock::lock(opened, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, errno)| private(errno.into()))?;
    let suffix = made
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(NEW_PREFIX))
        .unwrap_or_default();
    let path = base.join(format!("{prefix}{suffix}"));
    renameat2(
        AT_FDCWD,
        made.path(),
        AT_FDCWD,
        &path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|errno| private(errno.into()))?;
    let _renamed = made.keep();
    Ok(WorkDir {
        path,
        private: Some(locked),
        unremoved,
    })
}

/// How the names of the private work directories of restores of `image` begin:
/// `gpucr-restore-NAME-HASH-`, NAME the image directory's name (letters, digits, `.` and
/// `_` kept, the rest `_`, at most 32 characters) and HASH 16 hex digits of a hash of its
/// canonical path.
fn private_prefix(image: &Path) -> String {
    let canonical = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    let name: String = canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(NAME_CHARS)
        .collect();
    let hash = twox_hash::XxHash3_64::oneshot(canonical.as_os_str().as_bytes());
    format!("{PRIVATE_PREFIX}{name}-{hash:016x}-")
}

/// Remove the directories under `base` whose names begin with `prefix` (private work
/// directories of earlier restores of one image) and whose restore has ended: their
/// lock is free. Only directories of this user are touched, never through a symbolic
/// link. Returns each one that could not be removed, with the reason.
fn remove_ended(base: &Path, prefix: &str) -> Vec<String> {
    let mut unremoved = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return unremoved;
    };
    let me = geteuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().as_bytes().starts_with(prefix.as_bytes()) {
            continue;
        }
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours {
            continue;
        }
        let Ok(opened) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)
        else {
            continue;
        };
        // Locked: its restore still runs.
        let Ok(_locked) = Flock::lock(opened, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => unremoved.push(format!("{}: {e}", path.display())),
        }
    }
    unremoved
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
        if !gpucr_abi::testing::require(
            "root",
            nix::unistd::geteuid().is_root(),
            "the image is bind-mounted read-only",
        ) {
            return;
        }
        assert!(mount(&["--bind", from, to]), "bind-mount {from} on {to}");
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
        let name = work.path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with(&private_prefix(ro.path())), "{name}");
        let path = work.path.clone();
        work.remove().unwrap();
        assert!(!path.exists());
    }

    /// A private directory as a restore of an image under `base` leaves it: named with
    /// `prefix`, holding a log when `written`.
    fn left(base: &Path, prefix: &str, suffix: &str, written: bool) -> PathBuf {
        let path = base.join(format!("{prefix}{suffix}"));
        std::fs::create_dir(&path).unwrap();
        if written {
            std::fs::write(path.join("restore.log"), "log").unwrap();
        }
        path
    }

    /// The directories earlier restores of the image left are removed; those of another
    /// image, one whose restore still runs (locked), one of a restore being set up and
    /// a symbolic link are not.
    #[test]
    fn only_ended_restores_of_the_same_image_lose_their_directory() {
        let base = tempfile::tempdir().unwrap();
        let image = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let prefix = private_prefix(image.path());
        assert_ne!(prefix, private_prefix(other.path()));
        let ended = left(base.path(), &prefix, "aaaaaa", true);
        let empty = left(base.path(), &prefix, "bbbbbb", false);
        let running = left(base.path(), &prefix, "cccccc", true);
        let _lock = Flock::lock(
            dir::open_dir(&running).unwrap(),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        let another = left(base.path(), &private_prefix(other.path()), "dddddd", true);
        let new = left(base.path(), NEW_PREFIX, "eeeeee", true);
        let target = left(base.path(), "elsewhere", "", true);
        let link = base.path().join(format!("{prefix}ffffff"));
        std::os::unix::fs::symlink(&target, &link).unwrap();

        assert!(remove_ended(base.path(), &prefix).is_empty());
        assert!(!ended.exists() && !empty.exists());
        for kept in [&running, &another, &new, &target] {
            assert!(kept.join("restore.log").exists(), "{}", kept.display());
        }
        assert!(link.symlink_metadata().is_ok());
    }

    /// The prefix names the image's directory (cleaned) and is the same for every path
    /// that leads to it.
    #[test]
    fn the_prefix_names_the_image_and_hashes_its_canonical_path() {
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("my job: 1");
        std::fs::create_dir(&image).unwrap();
        let prefix = private_prefix(&image);
        assert!(prefix.starts_with("gpucr-restore-my_job__1-"), "{prefix}");
        assert_eq!(prefix.len(), "gpucr-restore-my_job__1-".len() + 17);
        assert_eq!(private_prefix(&tmp.path().join("./my job: 1/")), prefix);
        let long = tmp.path().join("x".repeat(100));
        std::fs::create_dir(&long).unwrap();
        assert!(private_prefix(&long).starts_with(&format!("gpucr-restore-{}-", "x".repeat(32))));
    }

    /// After a failure a private directory is kept for its log, unless CRIU wrote
    /// nothing into it.
    #[test]
    fn a_failure_keeps_a_private_directory_only_with_a_log() {
        let base = tempfile::tempdir().unwrap();
        let private = |written| {
            let path = left(base.path(), "p-", if written { "w" } else { "e" }, written);
            WorkDir {
                private: Some(
                    Flock::lock(dir::open_dir(&path).unwrap(), FlockArg::LockExclusive).unwrap(),
                ),
                path,
                unremoved: Vec::new(),
            }
        };
        let kept = private(true).keep_for_failure().unwrap();
        assert!(kept.join("restore.log").exists());
        let empty = private(false);
        let path = empty.path.clone();
        assert_eq!(empty.keep_for_failure(), None);
        assert!(!path.exists());
        let image = WorkDir {
            path: base.path().to_path_buf(),
            private: None,
            unremoved: Vec::new(),
        };
        assert_eq!(image.keep_for_failure(), None);
        assert!(base.path().exists());
    }
}
