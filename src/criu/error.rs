//! Errors of the CRIU client.

use std::io;
use std::path::PathBuf;

use crate::exit_code::{self, ExitCode};

/// What went wrong talking to CRIU.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "criu not found (looked for {searched}); install CRIU >= 4.2 with \
         scripts/install-criu.sh, or name the binary with --criu PATH or GPUCR_CRIU"
    )]
    NotFound { searched: String },
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
    #[error("criu exited before answering ({status})")]
    Died { status: String },
    #[error("{}", failed_message(.request, .errno, .errmsg, .plugin_failure, .log, .log_tail))]
    Failed {
        request: &'static str,
        errno: Option<i32>,
        errmsg: Option<String>,
        /// The hook failure of gpucr's plugin that made CRIU give up, if one did.
        plugin_failure: Option<String>,
        log: Option<PathBuf>,
        log_tail: Vec<String>,
    },
}

impl ExitCode for CriuError {
    /// The process exit code this error maps to.
    fn exit_code(&self) -> u8 {
        match self {
            CriuError::Failed { .. } => exit_code::CRIU_FAILED,
            _ => exit_code::CRIU_UNAVAILABLE,
        }
    }
}

impl CriuError {
    /// The hook failure of gpucr's plugin that made CRIU fail, if one did.
    pub fn plugin_failure(&self) -> Option<&str> {
        match self {
            CriuError::Failed { plugin_failure, .. } => plugin_failure.as_deref(),
            _ => None,
        }
    }
}

fn failed_message(
    request: &str,
    errno: &Option<i32>,
    errmsg: &Option<String>,
    plugin_failure: &Option<String>,
    log: &Option<PathBuf>,
    log_tail: &[String],
) -> String {
    let mut text = format!("criu {request} failed");
    // A hook of gpucr's plugin that failed is why CRIU gave up (what CRIU logs after it
    // follows from it). Otherwise: CRIU's errmsg is the first error it logged, which is
    // often harmless (an rlimit it could not raise); the last real error in the log says
    // what stopped it.
    match (plugin_failure, last_error(log_tail), errmsg) {
        (Some(failure), _, _) => text.push_str(&format!(": gpucr's plugin failed in {failure}")),
        (None, Some(line), _) => text.push_str(&format!(": {line}")),
        (None, None, Some(msg)) if !msg.trim().is_empty() => {
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

/// The last "Error (...)" line of the log that is not CRIU's closing "FAILED" line, with
/// its timestamp and pid prefix removed.
fn last_error(log_tail: &[String]) -> Option<String> {
    log_tail
        .iter()
        .rev()
        .filter_map(|line| line.find("Error (").map(|at| line[at..].trim().to_owned()))
        .find(|line| !line.ends_with("FAILED."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_real_error_heads_the_message() {
        let tail = vec![
            "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self".to_owned(),
            "(00.1)      1: Error (criu/files-reg.c:2175): File x has bad size 54 (expect 0)"
                .to_owned(),
            "(00.2) Error (criu/cr-restore.c:2331): Restoring FAILED.".to_owned(),
        ];
        let text = failed_message(
            "restore",
            &Some(0),
            &Some("rlimit".into()),
            &None,
            &None,
            &tail,
        );
        assert!(
            text.starts_with(
                "criu restore failed: Error (criu/files-reg.c:2175): File x has bad size"
            ),
            "{text}"
        );
        let text = failed_message("dump", &None, &Some("why".into()), &None, &None, &[]);
        assert_eq!(text, "criu dump failed: why");
    }

    #[test]
    fn a_failed_plugin_hook_heads_the_message() {
        // CRIU could not detach from a task it never seized, because the hook before
        // the freeze failed: the hook's failure is the cause.
        let tail = vec![
            "(00.05) gpucr: error: PAUSE_DEVICES: the driver refused".to_owned(),
            "(00.06) Error (compel/src/lib/infect.c:417): Unable to detach from 9".to_owned(),
            "(00.07) Error (criu/cr-dump.c:1975): Dumping FAILED.".to_owned(),
        ];
        let failure = Some("PAUSE_DEVICES: the driver refused".to_owned());
        let text = failed_message(
            "dump",
            &None,
            &Some("rlimit".into()),
            &failure,
            &None,
            &tail,
        );
        assert!(
            text.starts_with(
                "criu dump failed: gpucr's plugin failed in PAUSE_DEVICES: the driver refused\n"
            ),
            "{text}"
        );
    }
}
