//! The give-back guard of a CUDA dump.
//!
//! gpucr locks and checkpoints a job's CUDA processes before CRIU dumps them, and gives
//! them back (restore, unlock) when the tree lives on: after a failure, an interrupt or
//! with `--leave-running`. Those driver calls are made by the helper, inside the gpucr
//! process. A gpucr killed outright (SIGKILL, the OOM killer) makes none of them: CRIU
//! lets the tree go when its RPC peer disappears, but the job stays locked or
//! checkpointed, its CUDA calls blocked.
//!
//! So a CUDA dump starts a guard (`crate::guard`): `gpucr cuda-guard` (hidden), told
//! of every process gpucr touches (`task PID START STATE`: the pid, its start time,
//! which tells it from a later process with the same pid, and the driver's state code
//! before gpucr touched it), and `done` when the backend is dropped, at the end of the
//! dump whatever its outcome. If its input ends without `done`, gpucr died: the guard
//! waits until CRIU has let each process go (no tracer), then gives each one that is
//! still the same process back to its first state, as [`give_back`] does after any dump
//! the tree lives on from.
//!
//! With custom storage (CUDA 13.4) the guard only unlocks: a checkpointed process's
//! memory went to gpucr's own mapping and `gpu/`, and a driver restore without gpucr's
//! copy would bring it back with empty device memory, so such a process is reported
//! and left checkpointed.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use gpucr_cuda_driver::{Driver, ProcessState};

use super::{driver_error, GpuError, Staging};
use crate::gpu::give_back::{self, GivenBack};
use crate::guard::GuardProcess;
use crate::target;

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "cuda-guard";

/// How long the guard keeps trying to bring a process back to its first state.
pub const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// gpucr's end of a running guard.
#[derive(Debug)]
pub struct Guard(GuardProcess);

impl Guard {
    /// Start `gpucr cuda-guard` for the dump into `images_dir`, whose device memory
    /// moves by `staging`.
    pub fn start(images_dir: &Path, staging: Staging) -> io::Result<Guard> {
        GuardProcess::start([
            SUBCOMMAND.as_ref(),
            "--images-dir".as_ref(),
            images_dir.as_os_str(),
            "--staging".as_ref(),
            staging.name().as_ref(),
        ])
        .map(Guard)
    }

    /// Tell the guard that gpucr touched `pid`, which was in `initial` before.
    pub fn record(&self, pid: i32, initial: ProcessState) {
        if let Some(start) = target::start_time(pid) {
            self.0.send(
                &Task {
                    pid,
                    start,
                    initial,
                }
                .line(),
            );
        }
    }
}

/// One process gpucr touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    pub pid: i32,
    /// [`target::start_time`] when gpucr touched it.
    pub start: u64,
    /// Its state before.
    pub initial: ProcessState,
}

impl Task {
    /// The record: `task PID START STATE`.
    fn line(&self) -> String {
        format!("task {} {} {}", self.pid, self.start, self.initial.to_raw())
    }

    fn parse(line: &str) -> Option<Task> {
        let mut words = line.split_whitespace();
        (words.next()? == "task").then_some(())?;
        let task = Task {
            pid: words.next()?.parse().ok()?,
            start: words.next()?.parse().ok()?,
            initial: ProcessState::from_raw(words.next()?.parse().ok()?)?,
        };
        words.next().is_none().then_some(task)
    }
}

/// The processes the records name, each once (its last record wins); lines that are
/// not records are skipped.
pub fn tasks(lines: &[String]) -> Vec<Task> {
    give_back::last_records(lines, Task::parse, |t| t.pid)
}

/// Give every task that is still the same process back to its first state, once CRIU
/// has let it go (waiting up to `wait`), one thread per process. Tasks that are gone
/// are left out.
pub fn give_back_all(
    tasks: &[Task],
    staging: Staging,
    wait: Duration,
) -> Result<Vec<GivenBack>, GpuError> {
    let live = give_back::live_once_untraced(tasks, |t| (t.pid, t.start), wait);
    if live.is_empty() {
        return Ok(Vec::new());
    }
    let driver = super::load_driver()?;
    Ok(give_back::each(
        &live,
        |t| t.pid,
        |t| give_back_settled(&driver, t.pid, t.initial, staging, SETTLE_WAIT),
    ))
}

/// [`give_back`] until `pid` is in `initial` again, trying for up to `wait`. A driver
/// call gpucr made before it died may still be under way in the process (a checkpoint
/// completes when the process's restore thread runs), so a state read a moment ago may
/// be stale: a step that fails, or leaves the process elsewhere, is tried again. With
/// custom storage a checkpointed process is not restored (see the module's comment).
pub fn give_back_settled(
    driver: &Driver,
    pid: i32,
    initial: ProcessState,
    staging: Staging,
    wait: Duration,
) -> Result<Vec<&'static str>, GpuError> {
    let deadline = Instant::now() + wait;
    let mut calls = Vec::new();
    loop {
        if staging == Staging::Custom
            && initial != ProcessState::Checkpointed
            && driver.process_state(pid).ok() == Some(ProcessState::Checkpointed)
        {
            return Err(GpuError::Task {
                pid,
                detail: "left checkpointed: its device memory was in gpucr's custom-storage \
                         copy, which ended with gpucr; restore the job from an earlier image"
                    .into(),
            });
        }
        let attempt = give_back(driver, pid, initial).map(|made| calls.extend(made));
        let now = driver.process_state(pid).map_err(driver_error(pid));
        match (attempt, now) {
            (Ok(()), Ok(state)) if state == initial => return Ok(calls),
            (Err(e), _) | (_, Err(e)) if Instant::now() >= deadline => return Err(e),
            (Ok(()), Ok(state)) if Instant::now() >= deadline => {
                return Err(GpuError::Task {
                    pid,
                    detail: format!(
                        "still {} after {} s of giving it back (it was {})",
                        state.name(),
                        wait.as_secs(),
                        initial.name()
                    ),
                })
            }
            // Tried again every 100 ms: the CUDA driver reports a process's state only
            // when asked (cuCheckpointProcessGetState), with no fd or callback.
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Bring `pid` back to `initial`, its state before gpucr touched it, from the state the
/// driver reports now: restore it if gpucr left it checkpointed, unlock it if gpucr
/// left it locked. A step that failed may have left it short of where gpucr meant it to
/// be, so only what is needed is done. The driver calls made, by name.
pub fn give_back(
    driver: &Driver,
    pid: i32,
    initial: ProcessState,
) -> Result<Vec<&'static str>, GpuError> {
    let mut calls = Vec::new();
    let mut current = driver.process_state(pid).map_err(driver_error(pid))?;
    if current == ProcessState::Checkpointed && initial != ProcessState::Checkpointed {
        driver.restore(pid, &[]).map_err(driver_error(pid))?;
        calls.push("restore");
        current = ProcessState::Locked;
    }
    if current == ProcessState::Locked && initial == ProcessState::Running {
        driver.unlock(pid).map_err(driver_error(pid))?;
        calls.push("unlock");
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let task = Task {
            pid: 42,
            start: 123_456,
            initial: ProcessState::Locked,
        };
        assert_eq!(Task::parse(&task.line()), Some(task));
        for bad in [
            "",
            "task 1 2",
            "task 1 2 3 4",
            "task x 2 1",
            "task 1 2 999",
            "undo",
        ] {
            assert_eq!(Task::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_pid_once_its_last_record_winning() {
        let running = ProcessState::Running.to_raw();
        let locked = ProcessState::Locked.to_raw();
        let lines: Vec<String> = [
            format!("task 7 1 {running}"),
            "garbage".into(),
            format!("task 7 1 {locked}"),
            format!("task 8 1 {running}"),
        ]
        .into();
        let found = tasks(&lines);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].pid, 7);
        assert_eq!(found[0].initial, ProcessState::Locked);
    }

    #[test]
    fn processes_that_are_gone_or_another_are_left_alone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = target::start_time(pid).unwrap();
        let other = Task {
            pid,
            start: start + 1,
            initial: ProcessState::Running,
        };
        // No driver is loaded when no task is still the process gpucr touched.
        let given = give_back_all(&[other], Staging::Host, Duration::from_secs(1)).unwrap();
        assert!(given.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        let gone = Task { start, ..other };
        let given = give_back_all(&[gone], Staging::Host, Duration::from_secs(1)).unwrap();
        assert!(given.is_empty());
    }
}
