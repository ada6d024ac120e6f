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

/// The most characters of a member's name, or of a reader's message quoting one, that a
/// message shows.
pub const SHOWN_LIMIT: usize = 200;

/// `text` (a member's name, or a message that quotes a header's bytes) as a message
/// shows it: control and other unprintable characters, backslashes and the replacement
/// character that stands for bytes that were not UTF-8 escaped (`\u{1b}`, `\u{ad}`,
/// `\\`, `\u{fffd}`), in at most [`SHOWN_LIMIT`] characters, then `...`. An archive's names are arbitrary bytes; a
/// terminal must not be sent them raw.
pub fn printable(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let shown = match c {
            '"' | '\'' => c.to_string(),
            char::REPLACEMENT_CHARACTER => "\\u{fffd}".to_string(),
            _ => c.escape_debug().to_string(),
        };
        if out.chars().count() + shown.chars().count() > SHOWN_LIMIT {
            out.push_str("...");
            break;
        }
        out.push_str(&shown);
    }
    out
}

/// `source` with a message fit to show ([`printable`]): unchanged when every message of
/// its chain is, else one error of the same kind whose message is the chain's, made
/// printable. The tar reader's messages quote a damaged header's bytes.
fn printable_error(source: io::Error) -> io::Error {
    let mut messages = vec![source.to_string()];
    let mut cause = std::error::Error::source(&source);
    while let Some(e) = cause {
        messages.push(e.to_string());
        cause = e.source();
    }
    if messages.iter().all(|m| printable(m) == *m) {
        return source;
    }
    let mut text = String::new();
    for m in &messages {
        if !text.contains(m.as_str()) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(m);
        }
    }
    io::Error::new(source.kind(), printable(&text))
}

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

impl ArchiveError {
    /// [`ArchiveError::Read`] of `member` (if known), its name and the reader's message
    /// made printable.
    pub fn read(path: &std::path::Path, member: Option<&str>, source: io::Error) -> Self {
        ArchiveError::Read {
            path: path.to_path_buf(),
            member: member.map(printable),
            source: printable_error(source),
        }
    }

    /// [`ArchiveError::TooLarge`] of `member`, its name made printable.
    pub fn too_large(path: &std::path::Path, member: &str, size: u64, limit: u64) -> Self {
        ArchiveError::TooLarge {
            path: path.to_path_buf(),
            member: printable(member),
            size,
            limit,
        }
    }
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
            return Err(ArchiveError::too_large(path, member, size, limit));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        io::Read::read_to_end(reader, &mut bytes)
            .map_err(|source| ArchiveError::read(path, Some(member), source))?;
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
mod tests {
    use super::*;
    use crate::testing::raw_tar;

    /// Every message of `e`'s chain, as the top level prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str("\n  caused by: ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    #[test]
    fn names_and_messages_are_shown_escaped_and_capped() {
        assert_eq!(printable("checkpoint/core-1.img"), "checkpoint/core-1.img");
        assert_eq!(
            printable("caf\u{e9} \"x\" 'y'"),
            "caf\u{e9} \"x\" 'y'",
            "printable text is kept"
        );
        assert_eq!(printable("soft\u{ad}hyphen"), "soft\\u{ad}hyphen");
        assert_eq!(
            printable("a\u{1b}[2J\n\\\u{fffd}"),
            "a\\u{1b}[2J\\n\\\\\\u{fffd}"
        );
        let long = printable(&"y".repeat(5000));
        assert_eq!(long, format!("{}...", "y".repeat(SHOWN_LIMIT)));
        let plain = io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected end of file");
        let kept = printable_error(plain);
        assert_eq!(kept.to_string(), "unexpected end of file");
        assert_eq!(kept.kind(), io::ErrorKind::UnexpectedEof);
        let garbled = printable_error(io::Error::other("bad field: \u{7}\u{fffd} for \u{1b}[31m"));
        assert_eq!(
            garbled.to_string(),
            "bad field: \\u{7}\\u{fffd} for \\u{1b}[31m"
        );
    }

    /// Random bytes in a zstd frame: the tar reader's message quotes the "header", raw
    /// bytes that are no name; they reach the message escaped and capped.
    #[test]
    fn a_compressed_file_of_random_bytes_is_named_printably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tar.zst");
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        std::fs::write(&path, zstd::encode_all(noise.as_slice(), 1).unwrap()).unwrap();
        let err = read_checkpoint_file(&path, "gpucr.json", 1 << 20).unwrap_err();
        assert!(matches!(err, ArchiveError::Read { .. }), "{err}");
        assert_eq!(
            crate::exit_code::ExitCode::exit_code(&err),
            crate::exit_code::IMAGE_DAMAGED
        );
        let shown = chain(&err);
        let shows_as_itself = |c: char| {
            matches!(c, '\n' | '\\' | '"' | '\'')
                || (c != char::REPLACEMENT_CHARACTER && c.escape_debug().eq([c]))
        };
        assert!(shown.chars().all(shows_as_itself), "{shown:?}");
        let cause = shown.lines().nth(1).unwrap();
        assert!(
            cause.chars().count() <= "  caused by: ...".len() + SHOWN_LIMIT,
            "{shown:?}"
        );
    }

    /// A member whose name holds a terminal escape and a byte that is not UTF-8 is named
    /// escaped.
    #[test]
    fn a_member_name_of_any_bytes_is_named_printably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
        let name = b"checkpoint/\x1b[2J\xff.img";
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_size(100);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        tar.append(&h, &[0u8; 100][..]).unwrap();
        tar.into_inner().unwrap();
        let err = read_checkpoint_file(&path, "\u{1b}[2J\u{fffd}.img", 10).unwrap_err();
        assert!(matches!(err, ArchiveError::TooLarge { .. }), "{err}");
        let shown = err.to_string();
        assert!(
            shown.contains(": checkpoint/\\u{1b}[2J\\u{fffd}.img: 100 bytes"),
            "{shown:?}"
        );
        assert!(!shown.contains('\u{1b}'), "{shown:?}");
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
