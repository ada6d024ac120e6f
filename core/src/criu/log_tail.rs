//! What CRIU's log file says when a request fails: its last lines, and the failure of
//! gpucr's plugin or of the user's action script that made CRIU give up, if one did.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    lines_at(path)?.find_map(|(_, text)| {
        let (kind, what) = PluginFailureKind::parse(after(&text, &prefix)?)?;
        let what = what.trim();
        (!what.is_empty() && !what.starts_with(PLUGIN_EXIT_STEP.trim_end())).then(|| {
            PluginFailure {
                kind,
                what: what.to_owned(),
            }
        })
    })
}

/// The lines of the log at `path`, each with its offset in the file (CRIU's log may
/// hold any bytes a process wrote: they are read lossily); None when it cannot be
/// opened.
fn lines_at(path: &Path) -> Option<impl Iterator<Item = (u64, String)>> {
    let mut reader = BufReader::new(File::open(path).ok()?);
    let mut offset = 0u64;
    Some(std::iter::from_fn(move || {
        let mut line = Vec::new();
        let read = reader
            .read_until(b'\n', &mut line)
            .ok()
            .filter(|&n| n > 0)?;
        let at = offset;
        offset += read as u64;
        Some((at, String::from_utf8_lossy(&line).into_owned()))
    }))
}

/// What follows the first `mark` in `line`.
fn after<'a>(line: &'a str, mark: &str) -> Option<&'a str> {
    line.find(mark).map(|at| &line[at + mark.len()..])
}

/// A user's CRIU action script (CRIU's `action-script` option, from a `--criu-config`
/// file) that failed, as CRIU's log tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptFailure {
    /// The script, as CRIU ran it.
    pub script: String,
    /// The action CRIU ran it for ("post-dump", "pre-resume", ...), when known.
    pub stage: Option<String>,
    /// How it ended ("exited with status 3", "was killed by signal 9 (Killed)", "could
    /// not be run: Permission denied"), when the log says.
    pub how: Option<String>,
    /// The `--criu-config` file that named it, when known.
    pub config: Option<PathBuf>,
}

impl ScriptFailure {
    /// "the action script PATH failed at STAGE (HOW) (action-script of --criu-config
    /// FILE)", as much as is known.
    pub fn describe(&self) -> String {
        let mut text = format!("the action script {} failed", self.script);
        if let Some(stage) = &self.stage {
            text.push_str(&format!(" at {stage}"));
        }
        if let Some(how) = &self.how {
            text.push_str(&format!(" ({how})"));
        }
        if let Some(config) = &self.config {
            text.push_str(&format!(
                " (action-script of --criu-config {})",
                config.display()
            ));
        }
        text
    }
}

/// What CRIU logs after each action script that failed (`action-scripts.c`): "Script
/// PATH exited with -1".
const SCRIPT_FILE: &str = "action-scripts.c:";
const SCRIPT_MARK: &str = "): Script ";
const SCRIPT_END: &str = " exited with ";

/// The first action script that CRIU's log at `path` says failed. CRIU logs "Script PATH
/// exited with -1" (`action-scripts.c`) after each script that failed, right after how
/// it ended (`util.c`: "exited, status=N", "killed by signal N: NAME", after "execvp(...)
/// failed: WHY" when it could not be run). Its notification for an action comes right
/// before it runs the action's scripts: `stages` are the notifications CRIU sent during
/// the request, each with the log's length when it came, and the failed script's stage
/// is the last one sent before its line.
pub fn script_failure(path: &Path, stages: &[(u64, String)]) -> Option<ScriptFailure> {
    // The two lines before the current one.
    let mut before: [String; 2] = Default::default();
    for (at, line) in lines_at(path)? {
        let text = line.trim_end().to_owned();
        let script = after(&text, SCRIPT_FILE)
            .and_then(|rest| after(rest, SCRIPT_MARK))
            .and_then(|rest| rest.rsplit_once(SCRIPT_END))
            .map(|(script, _)| script.to_owned());
        let Some(script) = script else {
            before = [std::mem::take(&mut before[1]), text];
            continue;
        };
        let stage = stages
            .iter()
            .rev()
            .find(|(length, _)| *length <= at)
            .map(|(_, stage)| stage.clone());
        let how = exec_failure(&before[0], &script)
            .or_else(|| exec_failure(&before[1], &script))
            .or_else(|| how_it_ended(&before[1]));
        return Some(ScriptFailure {
            script,
            stage,
            how,
            config: None,
        });
    }
    None
}

/// "could not be run: WHY" from the line a script's child logs when it cannot exec
/// `script` (`execvp("PATH", ...) failed: WHY`).
fn exec_failure(line: &str, script: &str) -> Option<String> {
    let why = after(line, &format!("execvp(\"{script}\", ...) failed: "))?;
    Some(format!("could not be run: {}", why.trim()))
}

/// How a command CRIU ran ended, from CRIU's line about it (`util.c`: "exited,
/// status=N", "killed by signal N: NAME").
fn how_it_ended(line: &str) -> Option<String> {
    if let Some(status) = after(line, "): exited, status=") {
        return Some(format!("exited with status {}", status.trim()));
    }
    let signal = after(line, "): killed by signal ")?.trim();
    Some(match signal.split_once(": ") {
        Some((number, name)) => format!("was killed by signal {number} ({name})"),
        None => format!("was killed by signal {signal}"),
    })
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

    /// The log of a real CRIU 4.2.1 dump (`-v2`) whose action script refused post-dump,
    /// the script's own lines among CRIU's.
    const POST_DUMP_FAILED: &str = "\
Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
fail.sh: action pre-dump
Warn  (compel/arch/x86/src/lib/infect.c:419): Will restore 8868 with interrupted system call
fail.sh: action post-dump
fail.sh: refusing post-dump
Error (criu/util.c:657): exited, status=3
Error (criu/action-scripts.c:94): Script /tmp/as repro/fail.sh exited with -1
Error (criu/action-scripts.c:156): One of more action scripts failed
Error (criu/cr-dump.c:1975): Dumping FAILED.
";

    #[test]
    fn a_failed_action_script_is_found_with_its_stage_and_status() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), POST_DUMP_FAILED).unwrap();
        let at = |needle: &str| POST_DUMP_FAILED.find(needle).unwrap() as u64;
        let stages = [
            (at("fail.sh: action pre-dump"), "pre-dump".to_owned()),
            (at("fail.sh: action post-dump"), "post-dump".to_owned()),
        ];
        let failure = script_failure(f.path(), &stages).unwrap();
        assert_eq!(
            failure,
            ScriptFailure {
                script: "/tmp/as repro/fail.sh".into(),
                stage: Some("post-dump".into()),
                how: Some("exited with status 3".into()),
                config: None,
            }
        );
        assert_eq!(
            failure.describe(),
            "the action script /tmp/as repro/fail.sh failed at post-dump (exited with status 3)"
        );
        // Without notifications the stage is unknown.
        assert_eq!(script_failure(f.path(), &[]).unwrap().stage, None);
        // A refused notification of gpucr's is no script's failure.
        std::fs::write(
            f.path(),
            "Error (criu/cr-service.c:235): RPC client reported script error\n\
             Error (criu/action-scripts.c:156): One of more action scripts failed\n",
        )
        .unwrap();
        assert_eq!(script_failure(f.path(), &stages), None);
    }

    #[test]
    fn a_script_that_cannot_run_or_was_killed_says_so() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            "(00.1) Error (criu/util.c:642): execvp(\"/x/s\", ...) failed: Permission denied\n\
             (00.1) Error (criu/util.c:657): exited, status=1\n\
             (00.1) Error (criu/action-scripts.c:94): Script /x/s exited with -1\n",
        )
        .unwrap();
        assert_eq!(
            script_failure(f.path(), &[]).unwrap().how.as_deref(),
            Some("could not be run: Permission denied")
        );
        std::fs::write(
            f.path(),
            "(00.1) Error (criu/util.c:660): killed by signal 9: Killed\n\
             (00.1) Error (criu/action-scripts.c:94): Script /x/s exited with -1\n",
        )
        .unwrap();
        assert_eq!(
            script_failure(f.path(), &[]).unwrap().how.as_deref(),
            Some("was killed by signal 9 (Killed)")
        );
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
