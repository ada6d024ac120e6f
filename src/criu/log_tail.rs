//! What CRIU's log file says when a request fails: its last lines, and the failure of
//! gpucr's plugin that made CRIU give up, if one did.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use gpucr_abi::{PluginFailureKind, PLUGIN_EXIT_STEP, PLUGIN_NAME};

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

/// One version of a log file: which file it is and when it last changed. A log whose
/// stamp is the same after a request as before it was not written by that request (CRIU
/// truncates its log when it opens it, which changes its times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl LogStamp {
    /// The stamp of the file at `path`; None when there is none.
    pub fn of(path: &Path) -> Option<LogStamp> {
        let m = std::fs::symlink_metadata(path).ok()?;
        Some(LogStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether the log at `path` was written since `before` was taken (None: it did not
    /// exist then).
    pub fn written_since(path: &Path, before: Option<LogStamp>) -> bool {
        LogStamp::of(path).is_some_and(|now| Some(now) != before)
    }
}

/// A hook of gpucr's plugin that failed: what failed ("PAUSE_DEVICES: why") and whose
/// failure it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFailure {
    pub kind: PluginFailureKind,
    pub what: String,
}

/// The first hook failure gpucr's plugin logged in `path`: CRIU gives up when a hook
/// fails, so what it logs afterwards (tasks it cannot detach from, its closing FAILED
/// line) follows from this. Failures of the plugin's `exit` steps ("after the dump:
/// ...") are left out: they happen after CRIU's own failure.
pub fn plugin_failure(path: &Path) -> Option<PluginFailure> {
    let prefix = format!("{PLUGIN_NAME}: ");
    let file = File::open(path).ok()?;
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let Some(at) = text.find(&prefix) else {
            continue;
        };
        let Some((kind, what)) = PluginFailureKind::parse(&text[at + prefix.len()..]) else {
            continue;
        };
        let what = what.trim();
        if !what.is_empty() && !what.starts_with(PLUGIN_EXIT_STEP.trim_end()) {
            return Some(PluginFailure {
                kind,
                what: what.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_hook_failure_is_found_and_exit_steps_are_not() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            "(00.01) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n\
             (00.02) gpucr: PAUSE_DEVICES: 1 CUDA processes locked\n\
             (00.03) gpucr: error: after the dump: cannot stop thread 7 again\n\
             (00.04) gpucr: error: CHECKPOINT_DEVICES: the helper refused: broken\n\
             (00.05) gpucr: error: RESUME_DEVICES_LATE: later\n\
             (00.06) Error (criu/cr-dump.c:1975): Dumping FAILED.\n",
        )
        .unwrap();
        assert_eq!(
            plugin_failure(f.path()),
            Some(PluginFailure {
                kind: PluginFailureKind::Plugin,
                what: "CHECKPOINT_DEVICES: the helper refused: broken".into()
            })
        );
        let quiet = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            quiet.path(),
            "(00.01) gpucr: error: after the dump: x\n(00.02) Error (a): b\n",
        )
        .unwrap();
        assert_eq!(plugin_failure(quiet.path()), None);
        assert_eq!(plugin_failure(Path::new("/nonexistent/dump.log")), None);
    }

    #[test]
    fn each_kind_of_failure_is_told_apart() {
        for kind in PluginFailureKind::ALL {
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(
                f.path(),
                format!(
                    "(00.01) gpucr: PAUSE_DEVICES: locked\n\
                     (00.02) gpucr: {}RESTORE_EXT_FILE: why\n",
                    kind.mark()
                ),
            )
            .unwrap();
            assert_eq!(
                plugin_failure(f.path()),
                Some(PluginFailure {
                    kind,
                    what: "RESTORE_EXT_FILE: why".into()
                }),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn keeps_the_last_non_empty_lines() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "a\nb\n\nc\nd\n").unwrap();
        assert_eq!(log_tail(f.path(), 2), ["c", "d"]);
        assert_eq!(log_tail(f.path(), 10), ["a", "b", "c", "d"]);
    }

    #[test]
    fn a_log_counts_as_written_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("restore.log");
        assert!(!LogStamp::written_since(&log, None));
        std::fs::write(&log, "an old run\n").unwrap();
        assert!(LogStamp::written_since(&log, None), "created since");
        let before = LogStamp::of(&log);
        assert!(!LogStamp::written_since(&log, before), "an old log");
        // What CRIU does when it opens its log: truncate, then write.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&log, "a new run\n").unwrap();
        assert!(LogStamp::written_since(&log, before));
        std::fs::remove_file(&log).unwrap();
        assert!(!LogStamp::written_since(&log, before), "gone");
    }

    #[test]
    fn missing_log_is_empty() {
        assert!(log_tail(Path::new("/nonexistent/dump.log"), 5).is_empty());
    }
}
