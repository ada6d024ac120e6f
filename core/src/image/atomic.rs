//! A file written atomically: through a temporary file beside it, fsynced and renamed
//! into place, the directory fsynced after it. A reader finds the whole file or none.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Write `bytes` to `path` through a temporary file in the same directory, fsync it,
/// rename it into place and fsync the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temporary_path(path);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    put_in_place(&file, &tmp, path)
}

/// The temporary file beside `path` that it is written to before it is renamed into
/// place: `.NAME.tmp`.
pub fn temporary_path(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}.tmp"))
}

/// Make `file`, written at `tmp`, the file at `path`: fsync it, rename it into place and
/// fsync the directory.
pub fn put_in_place(file: &File, tmp: &Path, path: &Path) -> io::Result<()> {
    file.sync_all()?;
    fs::rename(tmp, path)?;
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}
