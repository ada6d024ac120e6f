//! The file mounts that CRIU before 4.2 dumps but cannot restore.
//!
//! A tree with a mount namespace of its own is dumped with external mounts found for it
//! (see [`super::CommonOptions::own_mount_namespace`]): CRIU finds each mount it shares
//! with gpucr's namespace and, at restore, binds it again from there. CRIU 4.1 names the
//! source of such a bind as `MOUNTPOINT/` even when the mount is a file (a bind-mounted
//! file, or a namespace file like `/run/netns/NAME`), and the restore then fails with
//! "open_tree ...: Not a directory". CRIU 4.2 fixed it (`resolve_external_mounts`). Since
//! the dump kills the tree and the image cannot be restored, gpucr refuses such a dump
//! before anything is frozen.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{CriuError, CriuVersion};

/// The first CRIU that restores a file mount of a tree's own mount namespace that it
/// took as external.
pub const FILE_MOUNTS_OK_VERSION: CriuVersion = CriuVersion {
    major: 4,
    minor: 2,
    sublevel: 0,
};

/// Refuse to dump `pid`, a tree with a mount namespace of its own, with the CRIU at
/// `path` (of `version`) when that CRIU could not restore one of its file mounts. A tree
/// whose mounts cannot be read is let through: the dump itself then says what is wrong.
pub fn check_file_mounts(path: &Path, version: CriuVersion, pid: i32) -> Result<(), CriuError> {
    if version >= FILE_MOUNTS_OK_VERSION {
        return Ok(());
    }
    let mounts = external_file_mounts(pid).unwrap_or_default();
    if mounts.is_empty() {
        return Ok(());
    }
    Err(CriuError::FileMounts {
        path: path.to_path_buf(),
        found: version.to_string(),
        pid,
        mounts,
    })
}

/// The mount points (as the tree sees them) of `pid`'s file mounts that CRIU takes as
/// external and binds again from gpucr's namespace at restore from a path CRIU 4.1
/// writes wrong: those gpucr's namespace mounts too, from the same root.
pub fn external_file_mounts(pid: i32) -> io::Result<Vec<PathBuf>> {
    let theirs = fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let mine = fs::read_to_string("/proc/self/mountinfo")?;
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    Ok(external_mount_points(&theirs, &mine)
        .into_iter()
        .filter(|point| is_file(&root, point))
        .collect())
}

/// One line of a mountinfo file: the filesystem's device, the root of the mount within
/// it, and where it is mounted (mountinfo's octal escapes undone).
struct MountLine {
    device: String,
    root: PathBuf,
    point: PathBuf,
}

fn mount_lines(mountinfo: &str) -> Vec<MountLine> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Some(MountLine {
                device: fields.get(2)?.to_string(),
                root: PathBuf::from(unescape(fields.get(3)?)),
                point: PathBuf::from(unescape(fields.get(4)?)),
            })
        })
        .collect()
}

/// The mount points of `theirs` (other than the root) that `mine` mounts too: the same
/// device from the same root. CRIU binds such a mount from gpucr's mount point with its
/// root cut away, and CRIU 4.1 writes the empty rest as a trailing `/`. (A mount whose
/// best match in `mine` is a mount of a root above it gets a path to bind from that
/// CRIU 4.1 writes right.)
fn external_mount_points(theirs: &str, mine: &str) -> Vec<PathBuf> {
    let mine = mount_lines(mine);
    mount_lines(theirs)
        .into_iter()
        .filter(|m| m.point != Path::new("/"))
        .filter(|m| {
            mine.iter()
                .any(|h| h.device == m.device && h.root == m.root)
        })
        .map(|m| m.point)
        .collect()
}

/// True when `point`, seen through the tree's root, is there and is not a directory.
fn is_file(root: &Path, point: &Path) -> bool {
    let inside = root.join(point.strip_prefix("/").unwrap_or(point));
    fs::metadata(inside).is_ok_and(|m| !m.is_dir())
}

/// Undo mountinfo's octal escapes (`\040`, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const THEIRS: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:4 net:[4026532301] /run/netns/a\\040b rw - nsfs nsfs rw
26 22 8:1 /etc/hosts /etc/hosts rw master:7 - ext4 /dev/sda1 rw
27 22 0:60 / /tmp/hidden rw - tmpfs gpucr-hidden rw
";
    const MINE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
24 22 0:4 net:[4026532301] /run/netns/a\\040b rw shared:40 - nsfs nsfs rw
";

    #[test]
    fn mounts_gpucr_has_from_the_same_root_are_found_with_their_names_unescaped() {
        assert_eq!(
            external_mount_points(THEIRS, MINE),
            [PathBuf::from("/proc"), PathBuf::from("/run/netns/a b")]
        );
    }

    #[test]
    fn a_mount_of_another_root_of_the_same_device_is_not_found() {
        let theirs = "30 22 0:4 net:[1] /run/netns/x rw - nsfs nsfs rw\n";
        let mine = "24 22 0:4 net:[2] /run/netns/y rw - nsfs nsfs rw\n";
        assert!(external_mount_points(theirs, mine).is_empty());
    }

    #[test]
    fn a_short_line_is_skipped() {
        assert!(external_mount_points("24 22 0:4\n", MINE).is_empty());
    }

    #[test]
    fn escapes_are_undone_and_lone_backslashes_kept() {
        assert_eq!(unescape(r"a\040b\134c\011"), "a b\\c\t");
        assert_eq!(unescape(r"a\04"), r"a\04");
        assert_eq!(unescape(r"a\9"), r"a\9");
    }

    #[test]
    fn files_are_told_from_directories_through_the_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("dir")).unwrap();
        fs::write(root.path().join("file"), b"").unwrap();
        assert!(is_file(root.path(), Path::new("/file")));
        assert!(!is_file(root.path(), Path::new("/dir")));
        assert!(!is_file(root.path(), Path::new("/absent")));
    }
}
