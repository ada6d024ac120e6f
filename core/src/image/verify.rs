//! Verify an image directory against its manifest: every listed file present, with the
//! recorded size and checksum.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::checksum::{self, FileDigest, BLOCK_SIZE};
use super::manifest::{FileRecord, Manifest};

/// Errors that stop verification itself (as opposed to problems found in the image).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "{path}: checksum algorithm {found:?} is not supported (this gpucr knows {:?} and {:?})",
        checksum::Algorithm::Pages4m.name(),
        checksum::Algorithm::Blocks4m.name()
    )]
    UnknownAlgorithm { path: PathBuf, found: String },
    #[error(
        "{path}: checksum algorithm {found:?} (an earlier gpucr's) is verified in an image \
         directory only, not in an archive: unpack it and run gpucr inspect --verify on the \
         directory"
    )]
    EarlierAlgorithm { path: PathBuf, found: String },
    #[error("{path}: unsafe file name {name:?} in the manifest")]
    UnsafeName { path: PathBuf, name: String },
    #[error("{path}: file {name:?} is listed more than once in the manifest")]
    DuplicateName { path: PathBuf, name: String },
    #[error("verification was stopped before it finished")]
    Stopped,
    #[error("cannot list the image directory")]
    List(#[source] Box<super::ImageDirError>),
}

/// One thing wrong with an image file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the image directory.
    pub file: String,
    pub kind: ProblemKind,
}

/// What is wrong with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProblemKind {
    /// Listed in the manifest, absent from the directory.
    Missing,
    /// Present but unreadable.
    Unreadable(String),
    /// Its size differs from the manifest's (truncated or grown).
    Size { expected: u64, actual: u64 },
    /// Its content differs; `offset..end` is the first block that differs, when known.
    Content { offset: u64, end: u64 },
    /// It, or a directory on its way (`link`, relative to the image directory), is a
    /// symbolic link: its bytes are not in the image, which CRIU and gpucr never write
    /// so, and a copy of the directory would not carry them.
    Symlink { link: String, target: PathBuf },
    /// A CRIU image (`*.img`) in the directory that the manifest does not list: added
    /// after the dump. CRIU reads some images only when they exist, so it would be
    /// restored from unverified bytes.
    Unlisted,
    /// The manifest records only its size, which it may do for memory pages files
    /// alone (a dump with `--no-page-checksums`): anything else without a checksum was
    /// not written by a dump.
    NoChecksum,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = &self.file;
        match &self.kind {
            ProblemKind::Missing => write!(f, "{file}: missing"),
            ProblemKind::Unreadable(e) => write!(f, "{file}: cannot read: {e}"),
            ProblemKind::Size { expected, actual } if actual < expected => write!(
                f,
                "{file}: truncated at offset {actual}: {actual} bytes, the manifest says {expected}"
            ),
            ProblemKind::Size { expected, actual } => write!(
                f,
                "{file}: {actual} bytes, the manifest says {expected} (grew after the dump)"
            ),
            ProblemKind::Content { offset, end } => write!(
                f,
                "{file}: checksum mismatch: bytes {offset}..{end} differ from the dump"
            ),
            ProblemKind::Symlink { link, target } if link == file => write!(
                f,
                "{file}: a symbolic link (to {}), not the file the dump wrote",
                target.display()
            ),
            ProblemKind::Symlink { link, target } => write!(
                f,
                "{file}: {link} is a symbolic link (to {}), not the directory the dump wrote",
                target.display()
            ),
            ProblemKind::NoChecksum => write!(
                f,
                "{file}: the manifest records no checksum of it, which only memory pages \
                 files (pages-*.img) may lack"
            ),
            ProblemKind::Unlisted => write!(
                f,
                "{file}: a CRIU image the manifest does not list (added after the dump); \
                 CRIU would read it unverified"
            ),
        }
    }
}

/// Files at least this large are "bulk" (memory pages): [`Scope`] lets a restore hash
/// them while CRIU runs instead of before.
pub const BULK_THRESHOLD: u64 = 4 * BLOCK_SIZE;

/// Which files [`verify_files`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Presence, size and checksum of every file.
    All,
    /// Presence and size of every file; checksums of files below [`BULK_THRESHOLD`].
    SmallFiles,
    /// Checksums of files of [`BULK_THRESHOLD`] and more.
    BulkFiles,
}

impl Scope {
    fn checks_size(self, _record: &FileRecord) -> bool {
        self != Scope::BulkFiles
    }

    fn checks_content(self, record: &FileRecord) -> bool {
        if !checksum::is_content_checksum(&record.checksum) {
            return false;
        }
        match self {
            Scope::All => true,
            Scope::SmallFiles => record.size < BULK_THRESHOLD,
            Scope::BulkFiles => record.size >= BULK_THRESHOLD,
        }
    }
}

/// Check every file the manifest lists: presence, size and checksum. Returns the
/// problems found (empty: intact).
pub fn verify_files(
    dir: &Path,
    manifest: &Manifest,
    threads: usize,
) -> Result<Vec<Problem>, VerifyError> {
    verify_files_until(dir, manifest, threads, Scope::All, &AtomicBool::new(false))
}

/// Check the files the manifest lists, as far as `scope` says; give up with
/// [`VerifyError::Stopped`] soon after `stop` is set (within a block's hashing,
/// milliseconds), however large the image.
pub fn verify_files_until(
    dir: &Path,
    manifest: &Manifest,
    threads: usize,
    scope: Scope,
    stop: &AtomicBool,
) -> Result<Vec<Problem>, VerifyError> {
    let manifest_path = Manifest::path_in(dir);
    let algorithm = algorithm_of(&manifest_path, manifest)?;
    let mut listed = std::collections::HashSet::with_capacity(manifest.files.len());
    if let Some(twice) = manifest
        .files
        .iter()
        .find(|r| !listed.insert(r.path.as_str()))
    {
        return Err(VerifyError::DuplicateName {
            path: manifest_path,
            name: twice.path.clone(),
        });
    }
    let mut problems = Vec::new();
    let mut to_hash: Vec<(&FileRecord, PathBuf)> = Vec::new();
    for record in &manifest.files {
        if !scope.checks_size(record) && !scope.checks_content(record) {
            continue;
        }
        if let Some(problem) = marker_misused(record) {
            problems.push(problem);
            continue;
        }
        if !is_safe_relative(&record.path) {
            return Err(VerifyError::UnsafeName {
                path: manifest_path,
                name: record.path.clone(),
            });
        }
        if let Some((link, target)) = symlink_on_the_way(dir, &record.path) {
            problems.push(Problem {
                file: record.path.clone(),
                kind: ProblemKind::Symlink { link, target },
            });
            continue;
        }
        let path = dir.join(&record.path);
        match path.metadata() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => problems.push(Problem {
                file: record.path.clone(),
                kind: ProblemKind::Missing,
            }),
            Err(e) => problems.push(Problem {
                file: record.path.clone(),
                kind: ProblemKind::Unreadable(e.to_string()),
            }),
            Ok(meta) if meta.len() != record.size && scope.checks_size(record) => {
                problems.push(Problem {
                    file: record.path.clone(),
                    kind: ProblemKind::Size {
                        expected: record.size,
                        actual: meta.len(),
                    },
                })
            }
            Ok(_) if scope.checks_content(record) => to_hash.push((record, path)),
            Ok(_) => {}
        }
    }
    if scope != Scope::BulkFiles {
        problems.extend(unlisted_images(
            super::dir::image_files(dir)
                .map_err(|source| VerifyError::List(Box::new(source)))?
                .iter()
                .map(String::as_str),
            &listed,
        ));
    }
    let paths: Vec<&Path> = to_hash.iter().map(|(_, p)| p.as_path()).collect();
    let digests = checksum::digest_image_files_until(&paths, threads, stop, algorithm);
    if stop.load(Ordering::SeqCst) {
        return Err(VerifyError::Stopped);
    }
    for ((record, _), digest) in to_hash.iter().zip(digests) {
        match digest {
            Err(e) => problems.push(Problem {
                file: record.path.clone(),
                kind: ProblemKind::Unreadable(e.to_string()),
            }),
            Ok(digest) if digest.checksum() != record.checksum => problems.push(Problem {
                file: record.path.clone(),
                kind: first_bad_block(record, &digest),
            }),
            Ok(_) => {}
        }
    }
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(problems)
}

/// Check the files the manifest lists against files read elsewhere (an archive
/// stream): `sizes` has every file's size, `digests` its digest.
pub fn verify_digests(
    manifest_path: &Path,
    manifest: &Manifest,
    sizes: &BTreeMap<String, u64>,
    digests: &BTreeMap<String, FileDigest>,
) -> Result<Vec<Problem>, VerifyError> {
    // The stream was digested by the algorithm a dump writes now.
    if algorithm_of(manifest_path, manifest)? != checksum::Algorithm::CURRENT {
        return Err(VerifyError::EarlierAlgorithm {
            path: manifest_path.to_path_buf(),
            found: manifest.checksum_algorithm.clone(),
        });
    }
    let listed: std::collections::HashSet<&str> =
        manifest.files.iter().map(|r| r.path.as_str()).collect();
    let mut problems = unlisted_images(sizes.keys().map(String::as_str), &listed);
    for record in &manifest.files {
        if !is_safe_relative(&record.path) {
            return Err(VerifyError::UnsafeName {
                path: manifest_path.to_path_buf(),
                name: record.path.clone(),
            });
        }
        if let Some(problem) = marker_misused(record) {
            problems.push(problem);
            continue;
        }
        let problem = |kind| Problem {
            file: record.path.clone(),
            kind,
        };
        let Some(&size) = sizes.get(&record.path) else {
            problems.push(problem(ProblemKind::Missing));
            continue;
        };
        if size != record.size {
            problems.push(problem(ProblemKind::Size {
                expected: record.size,
                actual: size,
            }));
            continue;
        }
        if !checksum::is_content_checksum(&record.checksum) {
            continue;
        }
        match digests.get(&record.path) {
            None => problems.push(problem(ProblemKind::Unreadable("not hashed".into()))),
            Some(digest) if digest.checksum() != record.checksum => {
                problems.push(problem(first_bad_block(record, digest)))
            }
            Some(_) => {}
        }
    }
    problems.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(problems)
}

/// The checksum algorithm `manifest` (read from `manifest_path`) names.
fn algorithm_of(
    manifest_path: &Path,
    manifest: &Manifest,
) -> Result<checksum::Algorithm, VerifyError> {
    checksum::Algorithm::from_name(&manifest.checksum_algorithm).ok_or_else(|| {
        VerifyError::UnknownAlgorithm {
            path: manifest_path.to_path_buf(),
            found: manifest.checksum_algorithm.clone(),
        }
    })
}

/// A record that claims to need no checksum although its file is not a memory pages
/// file.
fn marker_misused(record: &FileRecord) -> Option<Problem> {
    (record.checksum == checksum::SIZE_ONLY && !checksum::is_pages_file(&record.path)).then(|| {
        Problem {
            file: record.path.clone(),
            kind: ProblemKind::NoChecksum,
        }
    })
}

/// The CRIU images (`*.img`, at the top of the image directory) among `present` (paths
/// relative to it) that the manifest does not list.
fn unlisted_images<'a>(
    present: impl Iterator<Item = &'a str>,
    listed: &std::collections::HashSet<&str>,
) -> Vec<Problem> {
    present
        .filter(|name| !name.contains('/') && name.ends_with(".img"))
        .filter(|name| !listed.contains(name))
        .map(|name| Problem {
            file: name.to_owned(),
            kind: ProblemKind::Unlisted,
        })
        .collect()
}

/// The number of threads to hash with: the machine's cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn first_bad_block(record: &FileRecord, digest: &FileDigest) -> ProblemKind {
    let actual = digest.block_hex();
    let whole = ProblemKind::Content {
        offset: 0,
        end: record.size,
    };
    if record.blocks.len() != actual.len() {
        return whole;
    }
    match record.blocks.iter().zip(&actual).position(|(a, b)| a != b) {
        Some(i) => {
            let offset = i as u64 * BLOCK_SIZE;
            ProblemKind::Content {
                offset,
                end: (offset + BLOCK_SIZE).min(record.size),
            }
        }
        None => whole,
    }
}

/// The first component of `name` (relative to `dir`) that is a symbolic link, with
/// where it points.
fn symlink_on_the_way(dir: &Path, name: &str) -> Option<(String, PathBuf)> {
    let mut prefix = String::new();
    for component in name.split('/') {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(component);
        let path = dir.join(&prefix);
        if path.symlink_metadata().ok()?.file_type().is_symlink() {
            return Some((prefix, std::fs::read_link(&path).unwrap_or_default()));
        }
    }
    None
}

/// A manifest path must stay inside the image directory.
fn is_safe_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_names_are_rejected() {
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "a//b", "./a"] {
            assert!(!is_safe_relative(bad), "{bad}");
        }
        for good in ["core-1.img", "gpu/index.bin", "a.b"] {
            assert!(is_safe_relative(good), "{good}");
        }
    }

    #[test]
    fn symlinks_on_the_way_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("gpu")).unwrap();
        std::fs::write(d.join("gpu/data"), b"x").unwrap();
        std::fs::write(d.join("real"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("gpu"), d.join("gpu2")).unwrap();
        assert_eq!(symlink_on_the_way(d, "gpu/data"), None);
        assert_eq!(symlink_on_the_way(d, "absent/x"), None);
        assert_eq!(
            symlink_on_the_way(d, "link"),
            Some(("link".into(), d.join("real")))
        );
        let (link, target) = symlink_on_the_way(d, "gpu2/data").unwrap();
        assert_eq!((link.as_str(), target), ("gpu2", d.join("gpu")));
        let problem = Problem {
            file: "gpu2/data".into(),
            kind: ProblemKind::Symlink {
                link,
                target: "/x".into(),
            },
        };
        assert_eq!(
            problem.to_string(),
            "gpu2/data: gpu2 is a symbolic link (to /x), not the directory the dump wrote"
        );
    }

    /// A CRIU image added after the dump is damage, in a directory and in an archive's
    /// listing alike; other files (a user's notes, gpucr's own) are not.
    #[test]
    fn an_image_the_manifest_does_not_list_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"abc").unwrap();
        let mut manifest = crate::testing::sample_manifest();
        let core = checksum::digest_file(&dir.path().join("core-1.img")).unwrap();
        manifest.files[0].checksum = core.checksum();
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap(), vec![]);
        std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        std::fs::write(dir.path().join("restore.log"), b"log").unwrap();
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap(), vec![]);
        std::fs::write(dir.path().join("tcp-stream-1.img"), b"added").unwrap();
        let problems = verify_files(dir.path(), &manifest, 1).unwrap();
        let unlisted = Problem {
            file: "tcp-stream-1.img".into(),
            kind: ProblemKind::Unlisted,
        };
        assert_eq!(problems, vec![unlisted.clone()]);
        assert!(
            unlisted
                .to_string()
                .contains("does not list (added after the dump)"),
            "{unlisted}"
        );
        // The bulk pass leaves listing to the first one.
        let bulk = verify_files_until(
            dir.path(),
            &manifest,
            1,
            Scope::BulkFiles,
            &AtomicBool::new(false),
        );
        assert_eq!(bulk.unwrap(), vec![]);
        let sizes: BTreeMap<String, u64> = [("core-1.img", 3), ("tcp-stream-1.img", 5)]
            .into_iter()
            .map(|(n, s)| (n.to_owned(), s))
            .collect();
        let digests = [("core-1.img".to_owned(), core)].into_iter().collect();
        let problems = verify_digests(Path::new("gpucr.json"), &manifest, &sizes, &digests);
        assert_eq!(problems.unwrap(), vec![unlisted]);
    }

    /// An earlier gpucr's image (a block digested whole) verifies in a directory, is
    /// refused with its name in an archive, and an unknown algorithm is refused.
    #[test]
    fn an_earlier_algorithm_verifies_in_a_directory() {
        use checksum::Algorithm;
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3 * checksum::PAGE_PIECE)
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(dir.path().join("core-1.img"), &bytes).unwrap();
        let path = dir.path().join("core-1.img");
        let digest_by = |algorithm| {
            checksum::digest_image_files_until(&[&path], 1, &AtomicBool::new(false), algorithm)
                .pop()
                .unwrap()
                .unwrap()
        };
        let (earlier, current) = (
            digest_by(Algorithm::Blocks4m),
            digest_by(Algorithm::CURRENT),
        );
        assert_ne!(earlier.checksum(), current.checksum());
        let mut manifest = crate::testing::sample_manifest();
        manifest.checksum_algorithm = Algorithm::Blocks4m.name().into();
        manifest.files[0].size = bytes.len() as u64;
        manifest.files[0].checksum = earlier.checksum();
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap(), vec![]);
        // Read by the current algorithm, the same file would be damage.
        manifest.files[0].checksum = current.checksum();
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap().len(), 1);

        let sizes = BTreeMap::from([("core-1.img".to_owned(), bytes.len() as u64)]);
        let digests = BTreeMap::from([("core-1.img".to_owned(), current)]);
        let err = verify_digests(Path::new("gpucr.json"), &manifest, &sizes, &digests);
        assert!(
            matches!(err, Err(VerifyError::EarlierAlgorithm { .. })),
            "{err:?}"
        );
        manifest.checksum_algorithm = "sha256-blocks".into();
        let err = verify_files(dir.path(), &manifest, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: checksum algorithm \"sha256-blocks\" is not supported (this gpucr knows \
                 \"xxh3-pages-4m\" and \"xxh3-blocks-4m\")",
                dir.path().join("gpucr.json").display()
            )
        );
    }

    /// A pages file recorded by size only (`--no-page-checksums`) is checked by its
    /// size, in a directory and an archive alike; any other file recorded so is damage.
    #[test]
    fn size_only_is_for_pages_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"abc").unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"0123456789").unwrap();
        let mut manifest = crate::testing::sample_manifest();
        manifest.files[0].checksum = checksum::digest_file(&dir.path().join("core-1.img"))
            .unwrap()
            .checksum();
        manifest.files.push(FileRecord {
            path: "pages-1.img".into(),
            size: 10,
            checksum: checksum::SIZE_ONLY.into(),
            blocks: vec![],
        });
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap(), vec![]);
        // Its content is not checked; its size is.
        std::fs::write(dir.path().join("pages-1.img"), b"9876543210").unwrap();
        assert_eq!(verify_files(dir.path(), &manifest, 1).unwrap(), vec![]);
        std::fs::write(dir.path().join("pages-1.img"), b"01234").unwrap();
        let size = Problem {
            file: "pages-1.img".into(),
            kind: ProblemKind::Size {
                expected: 10,
                actual: 5,
            },
        };
        assert_eq!(
            verify_files(dir.path(), &manifest, 1).unwrap(),
            vec![size.clone()]
        );
        let sizes: BTreeMap<String, u64> = [("core-1.img", 3), ("pages-1.img", 5)]
            .into_iter()
            .map(|(n, s)| (n.to_owned(), s))
            .collect();
        let core = checksum::digest_file(&dir.path().join("core-1.img")).unwrap();
        let digests: BTreeMap<String, FileDigest> =
            [("core-1.img".to_owned(), core)].into_iter().collect();
        let found = verify_digests(Path::new("gpucr.json"), &manifest, &sizes, &digests);
        assert_eq!(found.unwrap(), vec![size]);
        // A crafted manifest cannot exempt another file from its checksum.
        std::fs::write(dir.path().join("pages-1.img"), b"0123456789").unwrap();
        manifest.files[0].checksum = checksum::SIZE_ONLY.into();
        let exempted = Problem {
            file: "core-1.img".into(),
            kind: ProblemKind::NoChecksum,
        };
        assert_eq!(
            verify_files(dir.path(), &manifest, 1).unwrap(),
            vec![exempted.clone()]
        );
        assert_eq!(
            exempted.to_string(),
            "core-1.img: the manifest records no checksum of it, which only memory pages \
             files (pages-*.img) may lack"
        );
        let found = verify_digests(Path::new("gpucr.json"), &manifest, &sizes, &digests);
        assert!(found.unwrap().contains(&exempted));
        assert!(!checksum::is_pages_file("gpu/pages-1.img"));
    }

    #[test]
    fn a_file_listed_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"abc").unwrap();
        let mut manifest = crate::testing::sample_manifest();
        let record = manifest.files[0].clone();
        manifest.files.push(record);
        let err = verify_files(dir.path(), &manifest, 1).unwrap_err();
        assert!(
            matches!(&err, VerifyError::DuplicateName { name, .. } if name == "core-1.img"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("gpucr.json: file \"core-1.img\" is listed more than once"),
            "{err}"
        );
    }

    #[test]
    fn problems_render_with_file_and_offset() {
        let p = Problem {
            file: "pages-1.img".into(),
            kind: ProblemKind::Size {
                expected: 8192,
                actual: 4096,
            },
        };
        assert_eq!(
            p.to_string(),
            "pages-1.img: truncated at offset 4096: 4096 bytes, the manifest says 8192"
        );
        let p = Problem {
            file: "core-1.img".into(),
            kind: ProblemKind::Content { offset: 0, end: 10 },
        };
        assert_eq!(
            p.to_string(),
            "core-1.img: checksum mismatch: bytes 0..10 differ from the dump"
        );
    }
}
