//! gpucr's side of the simulator's `nvidia` driver model: requests to a process's
//! driver through its context's mailbox, as gpucr's cuda backend makes driver calls on
//! a process (lock, checkpoint, restore, unlock). Each request is answered by the
//! process's restore thread; while the tree is frozen, that thread runs only if CRIU's
//! plugin lets it, and a request it never answers fails after the driver timeout
//! rather than hanging.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpucr_abi::sim::{DRIVER_REQUEST_FILE, DRIVER_REQUEST_SIZE, DRIVER_STATE_FILE, RESTORE_THREAD};

use std::os::fd::AsFd;

use crate::cancel::Cancel;
use crate::gpu::GpuError;
use crate::wait::dir::DirWatch;

/// How long a driver request may take: `GPUCR_SIM_DRIVER_TIMEOUT` (seconds, fractions
/// allowed), default 10.
pub const ENV_DRIVER_TIMEOUT: &str = "GPUCR_SIM_DRIVER_TIMEOUT";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the wait for an answer, which inotify reports, sleeps at most before it
/// reads the state file anyway.
const ANSWER_FALLBACK: Duration = Duration::from_millis(10);

/// A driver operation and the state it leaves the process in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverOp {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
    /// Restore when the memory is in the process, then unlock: one request, so that a
    /// driver that answers late (its thread let run only once CRIU lets the tree go)
    /// still leaves the process running.
    Resume,
}

impl DriverOp {
    pub fn name(self) -> &'static str {
        match self {
            DriverOp::Lock => "lock",
            DriverOp::Checkpoint => "checkpoint",
            DriverOp::Restore => "restore",
            DriverOp::Unlock => "unlock",
            DriverOp::Resume => "resume",
        }
    }

    fn expected_state(self) -> &'static str {
        match self {
            DriverOp::Lock | DriverOp::Restore => "locked",
            DriverOp::Checkpoint => "checkpointed",
            DriverOp::Unlock | DriverOp::Resume => "running",
        }
    }
}

/// The timeout from the environment.
pub fn timeout_from_env() -> Result<Duration, GpuError> {
    match std::env::var(ENV_DRIVER_TIMEOUT) {
        Ok(text) if !text.trim().is_empty() => {
            parse_timeout(&text).map_err(|detail| GpuError::Config {
                variable: ENV_DRIVER_TIMEOUT,
                value: text.clone(),
                detail,
            })
        }
        _ => Ok(DEFAULT_TIMEOUT),
    }
}

/// `GPUCR_SIM_DRIVER_TIMEOUT`: a positive number of seconds, fractions allowed. Engine
/// mode's settings are checked with it too (`gpucr install-plugin --setting`).
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| "not a positive number of seconds".to_owned())
}

/// Ask the driver of the context in `dir` to do `op`, and wait for its answer.
pub fn call(dir: &Path, pid: i32, op: DriverOp, timeout: Duration) -> Result<(), GpuError> {
    // The give-back guard's calls: no request of a plugin to give up, only the
    // timeout.
    call_or_cancel(dir, pid, op, timeout, &Cancel::new())
}

/// [`call`], given up at `cancel`: nothing is asked once it is cancelled, and the wait
/// for the answer ends at the cancellation ([`GpuError::Cancelled`]). The request
/// stays posted then, and the driver may still act on it; since it acts on the newest
/// request only, a request [`post`]ed after it supersedes it, or undoes it once done.
pub fn call_or_cancel(
    dir: &Path,
    pid: i32,
    op: DriverOp,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<(), GpuError> {
    cancel.check()?;
    // The answer is renamed into place (`DRIVER_STATE_FILE`), which inotify reports:
    // the wait sleeps until then, or until the cancellation (its wake fd). Watched
    // before the request is made, so that no answer goes unreported; without a watch
    // (no inotify instance left) it looks every millisecond.
    let watch = DirWatch::new(dir, |name| name == DRIVER_STATE_FILE).ok();
    let wake = watch.as_ref().and_then(|_| cancel.wake_fd().ok());
    let seq = post(dir, op)?;
    let state_file = dir.join(DRIVER_STATE_FILE);
    let started = Instant::now();
    loop {
        if let Some(answer) = read_answer(&state_file, seq) {
            return if answer == op.expected_state() {
                Ok(())
            } else {
                Err(GpuError::Task {
                    pid,
                    detail: format!(
                        "the simulated driver answered {:?} to {}",
                        answer,
                        op.name()
                    ),
                })
            };
        }
        if started.elapsed() > timeout {
            return Err(GpuError::Task {
                pid,
                detail: format!(
                    "the simulated driver did not answer {} within {:.1} s: its restore \
                     thread ({RESTORE_THREAD}) did not run (a frozen process's restore \
                     thread runs only when CRIU's plugin lets it)",
                    op.name(),
                    timeout.as_secs_f64()
                ),
            });
        }
        let left = timeout.saturating_sub(started.elapsed());
        match (&watch, &wake) {
            // At most ANSWER_FALLBACK, should an answer go unreported.
            (Some(watch), Some(wake)) => {
                let _ = watch.wait(left.min(ANSWER_FALLBACK), Some(wake.as_fd()));
                cancel.check()?;
            }
            _ => cancel.sleep(Duration::from_millis(1))?,
        }
    }
}

/// Post `op` to the driver of the context in `dir` without waiting for its answer; its
/// sequence number.
pub fn post(dir: &Path, op: DriverOp) -> Result<u64, GpuError> {
    // Sequence numbers only grow, across restores too (the process remembers the last
    // one it answered): the time in nanoseconds.
    let seq = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let request = dir.join(DRIVER_REQUEST_FILE);
    let tmp = dir.join(format!("{DRIVER_REQUEST_FILE}.tmp"));
    let line = format!("{seq} {}", op.name());
    let padded = format!("{line:<width$}\n", width = DRIVER_REQUEST_SIZE - 1);
    fs::write(&tmp, padded).map_err(GpuError::io(&tmp))?;
    fs::rename(&tmp, &request).map_err(GpuError::io(&request))?;
    Ok(seq)
}

/// The state answered to request `seq`, once it is there.
fn read_answer(path: &PathBuf, seq: u64) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let (got, state) = text.trim().split_once(' ')?;
    (got.parse::<u64>().ok()? == seq).then(|| state.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in driver answering one request as the workload's restore thread does.
    fn answer_once(dir: PathBuf, state: &'static str) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || loop {
            if let Ok(text) = fs::read_to_string(dir.join(DRIVER_REQUEST_FILE)) {
                let seq = text.split_whitespace().next().unwrap().to_owned();
                fs::write(dir.join(DRIVER_STATE_FILE), format!("{seq} {state}\n")).unwrap();
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        })
    }

    #[test]
    fn a_request_is_answered_or_times_out() {
        let tmp = tempfile::tempdir().unwrap();
        let t = answer_once(tmp.path().to_path_buf(), "locked");
        call(tmp.path(), 1, DriverOp::Lock, Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        // Every request has the same size, whatever its operation.
        let size = |p: &Path| fs::metadata(p).unwrap().len() as usize;
        assert_eq!(
            size(&tmp.path().join(DRIVER_REQUEST_FILE)),
            DRIVER_REQUEST_SIZE
        );
        // Nobody answers the next one.
        let err = call(tmp.path(), 1, DriverOp::Unlock, Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("did not answer unlock"), "{err}");
        // A wrong state is an error naming it. (The unanswered request goes first: the
        // stand-in would otherwise answer it, not the next one.)
        fs::remove_file(tmp.path().join(DRIVER_REQUEST_FILE)).unwrap();
        let t = answer_once(tmp.path().to_path_buf(), "error: no");
        let err = call(tmp.path(), 1, DriverOp::Checkpoint, Duration::from_secs(5)).unwrap_err();
        t.join().unwrap();
        assert!(err.to_string().contains("\"error: no\""), "{err}");
    }
}
