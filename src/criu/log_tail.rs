//! The last lines of CRIU's log file, shown when a request fails.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Read at most the last 64 KiB of `path` and return its last `lines` lines. Errors and
/// warnings are what a user needs; a missing log gives an empty list.
pub fn log_tail(path: &Path, lines: usize) -> Vec<String> {
    const WINDOW: u64 = 64 << 10;
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(WINDOW)))
        .is_err()
    {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if file.take(WINDOW).read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_non_empty_lines() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "a\nb\n\nc\nd\n").unwrap();
        assert_eq!(log_tail(f.path(), 2), ["c", "d"]);
        assert_eq!(log_tail(f.path(), 10), ["a", "b", "c", "d"]);
    }

    #[test]
    fn missing_log_is_empty() {
        assert!(log_tail(Path::new("/nonexistent/dump.log"), 5).is_empty());
    }
}
