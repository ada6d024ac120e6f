//! Creating an image directory for a dump and listing what it holds.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use super::atomic::write_atomically;
use super::{INCOMPLETE_FILE, MANIFEST_FILE};
use crate::exit_code::{self, ExitCode};

/// Why an image directory cannot be used for a dump.
#[derive(Debug, thiserror::Error)]
pub enum ImageDirError {
    #[error("{path}: not empty (holds {first:?}); use --force to overwrite an image there")]
    NotEmpty { path: PathBuf, first: String },
    #[error(
        "{path}: holds {first:?}, which is not part of an image: --force overwrites a \
         previous image only, and nothing was removed"
    )]
    NotOnlyAnImage { path: PathBuf, first: String },
    #[error("{path}: exists and is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{path}: cannot create the image directory")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not writable")]
    NotWritable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot read the image directory")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: another gpucr is using the image directory (a dump writing an image \
         there, a restore reading it, or an on-demand restore still serving its memory); \
         try again once it has finished"
    )]
    InUse { path: PathBuf },
    #[error("{path}: cannot lock the image directory")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot remove the previous image's file")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ExitCode for ImageDirError {
    /// Every way the directory can be unusable is [`exit_code::IMAGE_DIR`].
    fn exit_code(&self) -> u8 {
        exit_code::IMAGE_DIR
    }
}

/// What a path named as an image on the command line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePath {
    /// A directory (followed through symlinks): an image directory, or meant as one.
    Directory,
    /// A regular file: a container checkpoint archive, for the commands that read them.
    File,
    /// Something that exists but is neither: a device, a FIFO, a socket, a dangling
    /// symlink.
    Other,
    /// Nothing there.
    Missing,
}

impl ImagePath {
    /// Look at `path`, following symlinks.
    pub fn of(path: &Path) -> ImagePath {
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => ImagePath::Directory,
            Ok(meta) if meta.is_file() => ImagePath::File,
            Ok(_) => ImagePath::Other,
            Err(_) if fs::symlink_metadata(path).is_ok() => ImagePath::Other,
            Err(_) => ImagePath::Missing,
        }
    }
}

/// Make `dir` ready for a dump: create it (mode 0700) or check that it is an empty,
/// writable directory. With `force`, the files of a previous image are removed first.
/// Returns the directory opened (O_DIRECTORY) for CRIU's `images_dir_fd`, locked
/// (`flock`, exclusive) for as long as it stays open: a second dump into the same
/// directory is refused before it looks at or removes anything there, so two CRIUs never
/// write (and truncate) one image's files, nor one while gpucr hashes them through
/// mappings (a file truncated under a mapping ends the process with SIGBUS).
pub fn prepare_for_dump(dir: &Path, force: bool) -> Result<Flock<File>, ImageDirError> {
    // A symlink to a directory is that directory, as for mkdir -p and cd.
    match fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| ImageDirError::Create {
                    path: dir.into(),
                    source,
                })?;
        }
        Err(source) => {
            return Err(ImageDirError::Read {
                path: dir.into(),
                source,
            })
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(ImageDirError::NotADirectory { path: dir.into() })
        }
        Ok(_) => {}
    }
    let locked = lock_for_dump(dir, open_dir(dir)?)?;
    if force {
        remove_previous_image(dir)?;
    }
    if let Some(first) = sorted_entries(dir)?.first() {
        return Err(ImageDirError::NotEmpty {
            path: dir.into(),
            first: first.clone(),
        });
    }
    // The image will hold process memory: keep it private even in an existing dir.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|source| {
        ImageDirError::NotWritable {
            path: dir.into(),
            source,
        }
    })?;
    probe_writable(dir)?;
    Ok(locked)
}

/// Take the dump's exclusive lock on the opened image directory, without waiting.
fn lock_for_dump(dir: &Path, opened: File) -> Result<Flock<File>, ImageDirError> {
    lock_dir(dir, opened, FlockArg::LockExclusiveNonblock)
}

/// How a restore holds the image directory it reads, taken without waiting and kept for
/// as long as the returned lock stays open.
///
/// A restore takes it shared, so restores of one image run side by side, while a dump
/// into the directory (exclusive) is refused and cannot remove or truncate a file the
/// restore maps. An on-demand restore (`serving`) takes it exclusive and keeps it until
/// the last page is served: a second restore of the image, which would remove the first
/// one's log and socket or bind its own beside them, is refused until then.
pub fn lock_for_restore(dir: &Path, serving: bool) -> Result<Flock<File>, ImageDirError> {
    let how = match serving {
        true => FlockArg::LockExclusiveNonblock,
        false => FlockArg::LockSharedNonblock,
    };
    lock_dir(dir, open_dir(dir)?, how)
}

fn lock_dir(dir: &Path, opened: File, how: FlockArg) -> Result<Flock<File>, ImageDirError> {
    Flock::lock(opened, how).map_err(|(_, errno)| {
        if errno == Errno::EWOULDBLOCK {
            ImageDirError::InUse { path: dir.into() }
        } else {
            ImageDirError::Lock {
                path: dir.into(),
                source: errno.into(),
            }
        }
    })
}

/// Open a directory for use as CRIU's `images_dir_fd`.
pub fn open_dir(dir: &Path) -> Result<File, ImageDirError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|source| ImageDirError::Read {
            path: dir.into(),
            source,
        })
}

/// Every regular file of the image below `dir` except the manifest and the incomplete
/// marker, as sorted '/'-separated relative paths.
pub fn image_files(dir: &Path) -> Result<Vec<String>, ImageDirError> {
    let mut out = Vec::new();
    walk(dir, "", Entries::Files, &mut out)?;
    out.retain(|p| p != MANIFEST_FILE && p != INCOMPLETE_FILE && !p.ends_with(".tmp"));
    out.sort();
    Ok(out)
}

/// Mark a failed dump: write `gpucr-incomplete.json` with the reason, and make sure no
/// manifest claims the image is complete.
pub fn mark_incomplete(dir: &Path, reason: &str) -> io::Result<()> {
    #[derive(Serialize)]
    struct Incomplete<'a> {
        complete: bool,
        reason: &'a str,
        gpucr_version: &'a str,
    }
    let _ = fs::remove_file(dir.join(MANIFEST_FILE));
    let body = Incomplete {
        complete: false,
        reason,
        gpucr_version: env!("CARGO_PKG_VERSION"),
    };
    let mut text = serde_json::to_vec_pretty(&body).map_err(io::Error::other)?;
    text.push(b'\n');
    write_atomically(&dir.join(INCOMPLETE_FILE), &text)
}

/// The reason recorded by [`mark_incomplete`], if the directory has one.
pub fn incomplete_reason(dir: &Path) -> Option<String> {
    let text = gpucr_criu_image::store::read_regular(&dir.join(INCOMPLETE_FILE)).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&text).ok()?;
    Some(value.get("reason")?.as_str()?.to_owned())
}

/// Which entries [`walk`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entries {
    /// Regular files only.
    Files,
    /// Everything: directories, links and special files too.
    All,
}

/// The `entries` below `dir`, as '/'-separated paths relative to it after `prefix`, in
/// no particular order.
fn walk(
    dir: &Path,
    prefix: &str,
    entries: Entries,
    out: &mut Vec<String>,
) -> Result<(), ImageDirError> {
    let read_err = |source| ImageDirError::Read {
        path: dir.into(),
        source,
    };
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry.file_type().map_err(read_err)?;
        if kind.is_dir() {
            if entries == Entries::All {
                out.push(rel.clone());
            }
            walk(&entry.path(), &rel, entries, out)?;
        } else if kind.is_file() || entries == Entries::All {
            out.push(rel);
        }
    }
    Ok(())
}

fn sorted_entries(dir: &Path) -> Result<Vec<String>, ImageDirError> {
    let read_err = |source| ImageDirError::Read {
        path: dir.into(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        names.push(
            entry
                .map_err(read_err)?
                .file_name()
                .to_string_lossy()
                .into_owned(),
        );
    }
    names.sort();
    Ok(names)
}

/// The names a previous gpucr image consists of (removed by `--force`).
fn is_previous_image_file(name: &str) -> bool {
    name.ends_with(".img")
        || name.ends_with(".log")
        || name.starts_with("stats-")
        || name == MANIFEST_FILE
        || name == INCOMPLETE_FILE
        || name == "gpu"
}

/// The names gpucr's GPU memory part (`gpu/`) consists of, as '/'-separated paths
/// below it: the data files, the index (and its temporary name) and the device state.
fn is_previous_gpu_file(rel: &str) -> bool {
    let is_data = |name: &str| {
        name.strip_prefix("data-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let is_state = |name: &str| {
        name.strip_prefix("task-")
            .and_then(|n| n.strip_suffix(".bin"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match rel.split_once('/') {
        None => is_data(rel) || rel == "index" || rel == "index.tmp" || rel == "state",
        Some(("state", name)) => is_state(name) || name.ends_with(".tmp"),
        Some(_) => false,
    }
}

/// The first entry of `dir` that `--force` must not remove: anything but a previous
/// image's files, inside `gpu/` too.
fn first_foreign_entry(dir: &Path, names: &[String]) -> Result<Option<String>, ImageDirError> {
    for name in names {
        if !is_previous_image_file(name) {
            return Ok(Some(name.clone()));
        }
        if name == "gpu" && fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.is_dir()) {
            let mut below = Vec::new();
            walk(&dir.join(name), "", Entries::All, &mut below)?;
            below.sort();
            if let Some(other) = below.into_iter().find(|rel| !is_previous_gpu_file(rel)) {
                return Ok(Some(format!("gpu/{other}")));
            }
        }
    }
    Ok(None)
}

/// Remove a previous image from `dir` (`--force`), or nothing at all when `dir` holds
/// anything else: a refusal never comes after part of the directory is gone.
fn remove_previous_image(dir: &Path) -> Result<(), ImageDirError> {
    let names = sorted_entries(dir)?;
    if let Some(first) = first_foreign_entry(dir, &names)? {
        return Err(ImageDirError::NotOnlyAnImage {
            path: dir.into(),
            first,
        });
    }
    for name in names {
        let path = dir.join(&name);
        let result = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        result.map_err(|source| ImageDirError::Remove { path, source })?;
    }
    Ok(())
}

/// Create and remove a file: the only reliable test (root passes access(2) checks, but
/// not a read-only or immutable file system).
fn probe_writable(dir: &Path) -> Result<(), ImageDirError> {
    let probe = dir.join(".gpucr-write-probe");
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .map_err(|source| ImageDirError::NotWritable {
            path: dir.into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn creates_missing_dir_with_mode_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        prepare_for_dump(&dir, false).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn existing_empty_dir_is_tightened_to_0700() {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        prepare_for_dump(tmp.path(), false).unwrap();
        assert_eq!(fs::metadata(tmp.path()).unwrap().mode() & 0o777, 0o700);
        assert!(
            sorted_entries(tmp.path()).unwrap().is_empty(),
            "probe file left behind"
        );
    }

    #[test]
    fn image_paths_are_told_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("archive.tar");
        fs::write(&file, b"").unwrap();
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        let linked_dir = tmp.path().join("linked");
        std::os::unix::fs::symlink(tmp.path(), &linked_dir).unwrap();
        assert_eq!(ImagePath::of(tmp.path()), ImagePath::Directory);
        assert_eq!(ImagePath::of(&linked_dir), ImagePath::Directory);
        assert_eq!(ImagePath::of(&file), ImagePath::File);
        assert_eq!(ImagePath::of(Path::new("/dev/null")), ImagePath::Other);
        assert_eq!(ImagePath::of(&dangling), ImagePath::Other);
        assert_eq!(
            ImagePath::of(&tmp.path().join("nowhere")),
            ImagePath::Missing
        );
    }

    #[test]
    fn a_second_dump_into_a_locked_dir_is_refused_and_removes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let first = prepare_for_dump(tmp.path(), false).unwrap();
        fs::write(tmp.path().join("pages-1.img"), b"being written").unwrap();
        for force in [false, true] {
            let err = prepare_for_dump(tmp.path(), force).unwrap_err();
            assert!(matches!(err, ImageDirError::InUse { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .contains("another gpucr is using the image directory"),
                "{err}"
            );
            assert_eq!(err.exit_code(), exit_code::IMAGE_DIR);
        }
        assert_eq!(sorted_entries(tmp.path()).unwrap(), ["pages-1.img"]);
        drop(first);
        prepare_for_dump(tmp.path(), true).unwrap();
        assert!(sorted_entries(tmp.path()).unwrap().is_empty());
    }

    #[test]
    fn restores_share_an_image_and_an_on_demand_restore_has_it_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let in_use = |result: Result<Flock<File>, ImageDirError>| match result {
            Err(err @ ImageDirError::InUse { .. }) => {
                assert_eq!(err.exit_code(), exit_code::IMAGE_DIR)
            }
            other => panic!("not refused as in use: {other:?}"),
        };
        let first = lock_for_restore(tmp.path(), false).unwrap();
        let second = lock_for_restore(tmp.path(), false).unwrap();
        in_use(lock_for_restore(tmp.path(), true));
        in_use(prepare_for_dump(tmp.path(), true));
        drop((first, second));
        let serving = lock_for_restore(tmp.path(), true).unwrap();
        in_use(lock_for_restore(tmp.path(), false));
        in_use(lock_for_restore(tmp.path(), true));
        in_use(prepare_for_dump(tmp.path(), true));
        drop(serving);
        let dump = prepare_for_dump(tmp.path(), false).unwrap();
        in_use(lock_for_restore(tmp.path(), false));
        drop(dump);
        lock_for_restore(tmp.path(), true).unwrap();
    }

    #[test]
    fn non_empty_dir_is_refused_unless_forced() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("core-1.img"), b"x").unwrap();
        fs::write(tmp.path().join(MANIFEST_FILE), b"{}").unwrap();
        let err = prepare_for_dump(tmp.path(), false).unwrap_err();
        assert!(
            err.to_string().contains("not empty (holds \"core-1.img\")"),
            "{err}"
        );
        prepare_for_dump(tmp.path(), true).unwrap();
        assert!(sorted_entries(tmp.path()).unwrap().is_empty());
    }

    #[test]
    fn force_removes_nothing_where_a_file_is_not_part_of_an_image() {
        let tmp = tempfile::tempdir().unwrap();
        let image = ["pages-1.img", "core-5.img", "dump.log", "gpucr.json"];
        for name in image {
            fs::write(tmp.path().join(name), b"x").unwrap();
        }
        fs::write(tmp.path().join("notes.txt"), b"x").unwrap();
        let err = prepare_for_dump(tmp.path(), true).unwrap_err();
        assert!(matches!(err, ImageDirError::NotOnlyAnImage { .. }), "{err}");
        assert!(err.to_string().contains("\"notes.txt\""), "{err}");
        assert!(err.to_string().contains("nothing was removed"), "{err}");
        for name in image.iter().chain(&["notes.txt"]) {
            assert!(tmp.path().join(name).exists(), "{name} removed");
        }
    }

    #[test]
    fn force_removes_nothing_where_gpu_holds_a_file_of_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let gpu = tmp.path().join("gpu");
        fs::create_dir_all(gpu.join("state")).unwrap();
        for name in ["data-0000", "data-0001", "index", "state/task-1.bin"] {
            fs::write(gpu.join(name), b"x").unwrap();
        }
        fs::write(tmp.path().join("pages-1.img"), b"x").unwrap();
        fs::write(gpu.join("mine.txt"), b"precious").unwrap();
        let err = prepare_for_dump(tmp.path(), true).unwrap_err();
        assert!(err.to_string().contains("\"gpu/mine.txt\""), "{err}");
        assert!(tmp.path().join("pages-1.img").exists());
        assert_eq!(fs::read(gpu.join("mine.txt")).unwrap(), b"precious");
        fs::remove_file(gpu.join("mine.txt")).unwrap();
        fs::write(gpu.join("state/notes"), b"x").unwrap();
        let err = prepare_for_dump(tmp.path(), true).unwrap_err();
        assert!(err.to_string().contains("\"gpu/state/notes\""), "{err}");
        fs::remove_file(gpu.join("state/notes")).unwrap();
        prepare_for_dump(tmp.path(), true).unwrap();
        assert!(sorted_entries(tmp.path()).unwrap().is_empty());
    }

    #[test]
    fn a_symlink_to_a_directory_is_that_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        prepare_for_dump(&link, false).unwrap();
        assert_eq!(fs::metadata(&real).unwrap().mode() & 0o777, 0o700);
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("gone"), &dangling).unwrap();
        assert!(prepare_for_dump(&dangling, false).is_err());
    }

    #[test]
    fn a_file_is_not_a_directory() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let err = prepare_for_dump(tmp.path(), false).unwrap_err();
        assert!(matches!(err, ImageDirError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn image_files_are_recursive_sorted_and_skip_the_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("gpu")).unwrap();
        for f in [
            "b.img",
            "a.img",
            "gpu/0.chunk",
            MANIFEST_FILE,
            INCOMPLETE_FILE,
        ] {
            fs::write(tmp.path().join(f), b"x").unwrap();
        }
        assert_eq!(
            image_files(tmp.path()).unwrap(),
            ["a.img", "b.img", "gpu/0.chunk"]
        );
    }

    #[test]
    fn incomplete_marker_replaces_the_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join(MANIFEST_FILE), b"{}").unwrap();
        mark_incomplete(tmp.path(), "criu failed").unwrap();
        assert!(!tmp.path().join(MANIFEST_FILE).exists());
        assert_eq!(
            incomplete_reason(tmp.path()).as_deref(),
            Some("criu failed")
        );
    }
}
