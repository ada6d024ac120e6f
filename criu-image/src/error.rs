//! The one error type of this crate: what went wrong, in which file, at which byte.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// An image file could not be read or is malformed.
///
/// Every error names the file and, where it applies, the byte offset at which the
/// problem starts (the offset of the entry, size field or page concerned).
#[derive(Debug)]
pub struct ImageError {
    /// The file, as it was opened (the image directory joined with the file's name).
    pub path: PathBuf,
    /// The byte offset in `path` where the problem starts.
    pub offset: u64,
    pub kind: ErrorKind,
}

/// What is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("missing")]
    Missing,
    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
    #[error("unexpected end of file: {needed} bytes needed, {available} left")]
    Truncated { needed: u64, available: u64 },
    #[error(
        "head magic {found:#010x} is neither CRIU's image magic ({:#010x}) nor its service \
         magic ({:#010x})",
        crate::magic::IMG_COMMON,
        crate::magic::IMG_SERVICE
    )]
    BadHeadMagic { found: u32 },
    #[error("magic {found:#010x} ({}), expected {expected} ({expected_value:#010x})",
        crate::magic::name(*found).unwrap_or("unknown"))]
    WrongMagic {
        expected: &'static str,
        expected_value: u32,
        found: u32,
    },
    #[error("unknown image magic {found:#010x}")]
    UnknownMagic { found: u32 },
    #[error("entry of {size} bytes, but only {available} bytes are left in the file")]
    EntryTooLarge { size: u64, available: u64 },
    #[error("malformed {message} entry: {source}")]
    Decode {
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("no {message} entry")]
    Empty { message: &'static str },
    #[error("{0}")]
    Invalid(String),
}

impl ImageError {
    pub fn new(path: impl Into<PathBuf>, offset: u64, kind: ErrorKind) -> ImageError {
        ImageError {
            path: path.into(),
            offset,
            kind,
        }
    }

    /// A file that should exist does not.
    pub fn missing(path: &Path) -> ImageError {
        ImageError::new(path, 0, ErrorKind::Missing)
    }

    /// An I/O error at `offset`; a missing file becomes [`ErrorKind::Missing`].
    pub fn io(path: &Path, offset: u64, err: io::Error) -> ImageError {
        if err.kind() == io::ErrorKind::NotFound {
            return ImageError::missing(path);
        }
        ImageError::new(path, offset, ErrorKind::Io(err))
    }

    /// A semantic problem (the framing is fine, the content is not).
    pub fn invalid(path: &Path, offset: u64, message: impl Into<String>) -> ImageError {
        ImageError::new(path, offset, ErrorKind::Invalid(message.into()))
    }

    /// The file's name without the directory, for short messages.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// The message with the file named relative to `base` (the image directory).
    pub fn describe_in(&self, base: &Path) -> String {
        let name = self.relative_path(base);
        match &self.kind {
            ErrorKind::Missing => format!("{name}: missing"),
            kind => format!("{name}: at offset {}: {kind}", self.offset),
        }
    }

    /// The file relative to `base`, '/'-separated; the full path if it is not below it.
    pub fn relative_path(&self, base: &Path) -> String {
        self.path
            .strip_prefix(base)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| self.path.display().to_string())
    }

    /// True when the file does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self.kind, ErrorKind::Missing)
    }
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Missing => write!(f, "{}: missing", self.path.display()),
            kind => write!(
                f,
                "{}: at offset {}: {kind}",
                self.path.display(),
                self.offset
            ),
        }
    }
}

impl std::error::Error for ImageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            ErrorKind::Decode { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = ImageError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_and_offset() {
        let e = ImageError::new(
            "d/pstree.img",
            8,
            ErrorKind::EntryTooLarge {
                size: 4_294_967_295,
                available: 92,
            },
        );
        assert_eq!(
            e.to_string(),
            "d/pstree.img: at offset 8: entry of 4294967295 bytes, but only 92 bytes are left \
             in the file"
        );
        assert_eq!(e.file_name(), "pstree.img");
        assert!(e
            .describe_in(Path::new("d"))
            .starts_with("pstree.img: at offset 8: entry of"));
        assert_eq!(
            ImageError::missing(Path::new("d/x.img")).to_string(),
            "d/x.img: missing"
        );
    }

    #[test]
    fn not_found_io_error_is_missing() {
        let e = ImageError::io(Path::new("a"), 0, io::Error::from(io::ErrorKind::NotFound));
        assert!(e.is_missing());
    }
}
