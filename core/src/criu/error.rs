//! Errors of the CRIU client.

use std::io;
use std::path::PathBuf;

use gpucr_abi::PluginFailureKind;

use super::{PluginFailure, ScriptFailure};
use crate::exit_code::{self, ExitCode};

/// What went wrong talking to CRIU.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "criu not found (looked for {searched}); install CRIU >= 4.2 with \
         scripts/install-criu.sh, or name the binary with --criu PATH or GPUCR_CRIU"
    )]
    NotFound { searched: String },
    #[error(
        "{path} is CRIU {found}, which cannot restore {} of pid {pid}'s mount namespace \
         (CRIU < 4.2 binds a file mount again as a directory); the tree was not frozen. \
         Install CRIU >= 4.2 with scripts/install-criu.sh, or unmount {} in the tree's \
         namespace",
        file_mounts(mounts),
        if mounts.len() > 1 { "them" } else { "it" }
    )]
    FileMounts {
        path: PathBuf,
        found: String,
        pid: i32,
        mounts: Vec<PathBuf>,
    },
    #[error("cannot run {path}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is CRIU {found}; gpucr needs CRIU >= {needed}. Install a newer CRIU with \
         scripts/install-criu.sh (it builds 4.2.1), or name one with --criu PATH"
    )]
    TooOld {
        path: PathBuf,
        found: String,
        needed: String,
    },
    #[error("cannot talk to criu over its RPC socket")]
    Socket(#[source] io::Error),
    #[error("criu broke the RPC protocol: {detail}")]
    Protocol { detail: String },
    #[error("criu ({}) exited before answering ({status})", .path.display())]
    Died { path: PathBuf, status: String },
    #[error(
        "criu ({}) did not answer its first request within {seconds} s of its start: it \
         was killed. Is it CRIU (`{} --version`), and does it run on this machine?",
        .path.display(), .path.display()
    )]
    StartTimeout { path: PathBuf, seconds: f64 },
    #[error(
        "interrupted by {signal} while criu ({}) was starting: it was killed; nothing was done",
        .path.display()
    )]
    Interrupted { path: PathBuf, signal: &'static str },
    #[error("{}", refused_message(.request, .errno, .log, .config, .stderr))]
    Refused {
        request: &'static str,
        errno: Option<i32>,
        /// The log CRIU was to write, and did not.
        log: PathBuf,
        /// The `--criu-config` file whose options the request carried, if any.
        config: Option<PathBuf>,
        /// What CRIU wrote on its stderr, where it logs until its log is open.
        stderr: String,
    },
    #[error("{}", failed_message(self))]
    Failed {
        request: &'static str,
        errno: Option<i32>,
        errmsg: Option<String>,
        /// The hook failure of gpucr's plugin that made CRIU give up, if one did.
        plugin_failure: Option<Box<PluginFailure>>,
        /// The user's action script that failed, if one did (CRIU fails the request for
        /// it at most stages).
        script_failure: Option<Box<ScriptFailure>>,
        log: Option<PathBuf>,
        log_tail: Vec<String>,
    },
}

impl ExitCode for CriuError {
    /// The process exit code this error maps to.
    fn exit_code(&self) -> u8 {
        // CRIU fails whatever made one of gpucr's hooks fail; a device that refused, or
        // an image whose device state cannot be used, is said as such.
        match self {
            CriuError::Failed { plugin_failure, .. } => match plugin_failure.as_ref() {
                Some(f) if f.kind == PluginFailureKind::Device => exit_code::DEVICE_FAILED,
                Some(f) if f.kind == PluginFailureKind::Image => exit_code::IMAGE_DAMAGED,
                _ => exit_code::CRIU_FAILED,
            },
            CriuError::Refused { .. } => exit_code::CRIU_FAILED,
            CriuError::Interrupted { .. } => exit_code::INTERRUPTED,
            _ => exit_code::CRIU_UNAVAILABLE,
        }
    }
}

impl CriuError {
    /// The hook failure of gpucr's plugin that made CRIU fail, if one did.
    pub fn plugin_failure(&self) -> Option<&str> {
        match self {
            CriuError::Failed { plugin_failure, .. } => {
                plugin_failure.as_ref().map(|f| f.what.as_str())
            }
            _ => None,
        }
    }
}

/// "the file mount /a" or "the file mounts /a, /b".
fn file_mounts(mounts: &[PathBuf]) -> String {
    let names: Vec<String> = mounts.iter().map(|m| m.display().to_string()).collect();
    let plural = if names.len() > 1 { "s" } else { "" };
    format!("the file mount{plural} {}", names.join(", "))
}

fn failed_message(error: &CriuError) -> String {
    let CriuError::Failed {
        request,
        errno,
        errmsg,
        plugin_failure,
        script_failure,
        log,
        log_tail,
    } = error
    else {
        return String::new();
    };
    let mut text = format!("criu {request} failed");
    // A hook of gpucr's plugin that failed is why CRIU gave up (what CRIU logs after it
    // follows from it), as is the user's action script that failed (CRIU's own lines
    // about it only say that one of the scripts failed). Otherwise: CRIU's errmsg is the
    // first error it logged, which is often harmless (an rlimit it could not raise); the
    // last real error in the log says what stopped it.
    match (plugin_failure, script_failure, last_error(log_tail), errmsg) {
        (Some(failure), _, _, _) => {
            text.push_str(&format!(": gpucr's plugin failed in {}", failure.what))
        }
        (None, Some(script), _, _) => text.push_str(&format!(": {}", script.describe())),
        (None, None, Some(line), _) => text.push_str(&format!(": {line}")),
        (None, None, None, Some(msg)) if !msg.trim().is_empty() => {
            text.push_str(&format!(": {}", msg.trim()))
        }
        _ => {}
    }
    if let Some(errno) = errno.filter(|e| *e != 0) {
        text.push_str(&format!(" ({})", io::Error::from_raw_os_error(errno)));
    }
    if !log_tail.is_empty() {
        text.push_str("\n  last lines of the CRIU log:");
        for line in log_tail {
            text.push_str("\n    ");
            text.push_str(line);
        }
    }
    if let Some(log) = log {
        text.push_str(&format!("\n  full log: {}", log.display()));
    }
    text
}

/// How many lines of CRIU's stderr a refusal shows.
const STDERR_LINES: usize = 12;

fn refused_message(
    request: &str,
    errno: &Option<i32>,
    log: &std::path::Path,
    config: &Option<PathBuf>,
    stderr: &str,
) -> String {
    let mut text = format!("criu {request} failed");
    if let Some(errno) = errno.filter(|e| *e != 0) {
        text.push_str(&format!(" ({})", io::Error::from_raw_os_error(errno)));
    }
    text.push_str(&format!(
        ": CRIU refused the request before it opened its log (there is no {} of this \
         run): it could not take the request's options, or open the image directory or \
         its log",
        log.display()
    ));
    if let Some(config) = config {
        text.push_str(&format!(
            "\n  the request carried the CRIU options of --criu-config {}",
            config.display()
        ));
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if !lines.is_empty() {
        text.push_str("\n  CRIU's stderr:");
        for line in &lines[lines.len().saturating_sub(STDERR_LINES)..] {
            text.push_str("\n    ");
            text.push_str(line);
        }
    }
    text
}

/// The error line of the log that says why CRIU failed, with its timestamp and pid
/// prefix removed: the last "Error (...)" line that is neither CRIU's closing "FAILED"
/// line, nor one that only passes a failure up ("Dump files (pid: 7) failed with -1",
/// logged after the error that caused it), nor one CRIU logs at every run where it
/// cannot raise its file limit. Failing those, the last that is not the closing line.
fn last_error(log_tail: &[String]) -> Option<String> {
    let errors: Vec<String> = log_tail
        .iter()
        .filter_map(|line| line.find("Error (").map(|at| line[at..].trim().to_owned()))
        .filter(|line| !line.ends_with("FAILED."))
        .collect();
    errors
        .iter()
        .rev()
        .find(|line| !passes_failure_up(line) && !line.contains(HARMLESS_RLIMIT))
        .or_else(|| errors.last())
        .cloned()
}

/// What CRIU logs when it cannot raise its own RLIMIT_NOFILE (it goes on regardless).
const HARMLESS_RLIMIT: &str = "rlimit: Can't setup RLIMIT_NOFILE";

/// Whether an error line of CRIU's only reports that a step failed whose cause was
/// logged before it: "<step> (pid: N) failed with <ret>" (`cr-dump.c`), or "Unable to
/// open fd=N id=0x..." (`files.c`, after the file's own error, such as "File x has bad
/// size").
fn passes_failure_up(line: &str) -> bool {
    if line.contains("): Unable to open fd=") {
        return true;
    }
    let Some((head, ret)) = line.rsplit_once(" failed with ") else {
        return false;
    };
    let ret = ret.trim_end_matches(['!', '.']);
    ret.trim_start_matches('-').parse::<u32>().is_ok()
        && head.ends_with(')')
        && head.contains("(pid: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_heads_the_message_not_the_step_that_passed_it_up() {
        let tail: Vec<String> = [
            "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted",
            "Warn  (compel/arch/x86/src/lib/infect.c:419): Will restore 30649 with interrupted system call",
            "Error (criu/sk-inet.c:200): inet: Connected TCP socket, consider using --tcp-established option.",
            "Error (criu/cr-dump.c:1545): Dump files (pid: 30649) failed with -1",
            "Error (criu/cr-dump.c:1975): Dumping FAILED.",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            last_error(&tail).unwrap(),
            "Error (criu/sk-inet.c:200): inet: Connected TCP socket, consider using \
             --tcp-established option."
        );
        // With no cause logged, the step that failed is still better than nothing, and
        // better than the harmless rlimit line.
        let passed_up_only = [&tail[0], &tail[3], &tail[4]].map(String::clone).to_vec();
        assert_eq!(
            last_error(&passed_up_only).unwrap(),
            "Error (criu/cr-dump.c:1545): Dump files (pid: 30649) failed with -1"
        );
        assert!(passes_failure_up(
            "Error (criu/cr-dump.c:1356): Collect mappings (pid: 7) failed with -22"
        ));
        assert!(!passes_failure_up(
            "Error (criu/sk-tcp.c:147): libsoccr_save() failed with 3"
        ));
    }

    /// A failed `request` with CRIU's `errmsg` and the tail of its log, and the cause
    /// `plugin_failure` if a hook of gpucr's plugin made it fail; no script failure,
    /// errno or log path.
    fn failed_request(
        request: &'static str,
        errmsg: Option<&str>,
        plugin_failure: Option<PluginFailure>,
        log_tail: &[&str],
    ) -> CriuError {
        CriuError::Failed {
            request,
            errno: None,
            errmsg: errmsg.map(str::to_owned),
            plugin_failure: plugin_failure.map(Box::new),
            script_failure: None,
            log: None,
            log_tail: log_tail.iter().map(|line| (*line).to_owned()).collect(),
        }
    }

    #[test]
    fn the_last_real_error_heads_the_message() {
        let tail = [
            "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self",
            "(00.1)      1: Error (criu/files-reg.c:2175): File x has bad size 54 (expect 0)",
            "(00.1)      1: Error (criu/files.c:1221): Unable to open fd=7 id=0xb",
            "(00.2) Error (criu/cr-restore.c:2331): Restoring FAILED.",
        ];
        let text = failed_request("restore", Some("rlimit"), None, &tail).to_string();
        assert!(
            text.starts_with(
                "criu restore failed: Error (criu/files-reg.c:2175): File x has bad size"
            ),
            "{text}"
        );
        let text = failed_request("dump", Some("why"), None, &[]).to_string();
        assert_eq!(text, "criu dump failed: why");
    }

    #[test]
    fn a_failed_plugin_hook_heads_the_message() {
        // CRIU could not detach from a task it never seized, because the hook before
        // the freeze failed: the hook's failure is the cause.
        let tail = [
            "(00.05) gpucr: error: PAUSE_DEVICES: the driver refused",
            "(00.06) Error (compel/src/lib/infect.c:417): Unable to detach from 9",
            "(00.07) Error (criu/cr-dump.c:1975): Dumping FAILED.",
        ];
        let failure = PluginFailure {
            kind: PluginFailureKind::Device,
            what: "PAUSE_DEVICES: the driver refused".to_owned(),
        };
        let text = failed_request("dump", Some("rlimit"), Some(failure), &tail).to_string();
        assert!(
            text.starts_with(
                "criu dump failed: gpucr's plugin failed in PAUSE_DEVICES: the driver refused\n"
            ),
            "{text}"
        );
    }

    /// A user's action script that failed heads the message, with its stage and the
    /// config file that named it, not CRIU's line that one of the scripts failed; a
    /// hook of gpucr's plugin that failed still comes first.
    #[test]
    fn a_failed_action_script_heads_the_message() {
        let failed = |plugin: Option<PluginFailure>| {
            let tail = [
                "Error (criu/action-scripts.c:156): One of more action scripts failed",
                "Error (criu/cr-dump.c:1975): Dumping FAILED.",
            ];
            let mut error = failed_request("dump", Some("rlimit"), plugin, &tail);
            if let CriuError::Failed {
                script_failure,
                log,
                ..
            } = &mut error
            {
                *script_failure = Some(Box::new(ScriptFailure {
                    script: "/etc/job/post.sh".into(),
                    stage: Some("post-dump".into()),
                    how: Some("exited with status 3".into()),
                    config: Some(PathBuf::from("/etc/job.conf")),
                }));
                *log = Some(PathBuf::from("/img/dump.log"));
            }
            error
        };
        let error = failed(None);
        assert!(
            error.to_string().starts_with(
                "criu dump failed: the action script /etc/job/post.sh failed at post-dump \
                 (exited with status 3) (action-script of --criu-config /etc/job.conf)\n"
            ),
            "{error}"
        );
        assert_eq!(error.exit_code(), exit_code::CRIU_FAILED);
        let error = failed(Some(PluginFailure {
            kind: PluginFailureKind::Plugin,
            what: "CHECKPOINT_DEVICES: why".into(),
        }));
        assert!(
            error
                .to_string()
                .starts_with("criu dump failed: gpucr's plugin failed in CHECKPOINT_DEVICES"),
            "{error}"
        );
    }

    /// CRIU refused before it opened its log: no log is pointed at, the config file is
    /// named, and CRIU's stderr (where it logged the reason) is shown.
    #[test]
    fn a_refusal_before_the_log_names_no_log_but_the_config_file() {
        let refused = CriuError::Refused {
            request: "dump",
            errno: Some(56),
            log: PathBuf::from("/img/dump.log"),
            config: Some(PathBuf::from("/etc/job.conf")),
            stderr: "\nError (criu/config.c:1): unrecognized option '--bogus'\n".into(),
        };
        let text = refused.to_string();
        assert!(
            text.starts_with("criu dump failed (Invalid request code (os error 56)): CRIU refused the request before it opened its log (there is no /img/dump.log of this run)"),
            "{text}"
        );
        assert!(!text.contains("full log"), "{text}");
        assert!(
            text.contains(
                "\n  the request carried the CRIU options of --criu-config /etc/job.conf"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "CRIU's stderr:\n    Error (criu/config.c:1): unrecognized option '--bogus'"
            ),
            "{text}"
        );
        assert_eq!(refused.exit_code(), exit_code::CRIU_FAILED);
    }

    #[test]
    fn a_failed_hook_decides_the_exit_code_by_its_kind() {
        let failed = |kind: Option<PluginFailureKind>| {
            let failure = kind.map(|kind| PluginFailure {
                kind,
                what: "RESTORE_EXT_FILE: why".into(),
            });
            failed_request("restore", None, failure, &[])
        };
        assert_eq!(failed(None).exit_code(), exit_code::CRIU_FAILED);
        assert_eq!(
            failed(Some(PluginFailureKind::Plugin)).exit_code(),
            exit_code::CRIU_FAILED
        );
        assert_eq!(
            failed(Some(PluginFailureKind::Device)).exit_code(),
            exit_code::DEVICE_FAILED
        );
        assert_eq!(
            failed(Some(PluginFailureKind::Image)).exit_code(),
            exit_code::IMAGE_DAMAGED
        );
    }
}
