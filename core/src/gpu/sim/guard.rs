//! The give-back guard of a dump of the simulator's `nvidia` model, the counterpart of
//! the CUDA guard (`gpu::cuda::guard`).
//!
//! Before the freeze gpucr asks each `nvidia`-model process's driver to lock it, and at
//! CHECKPOINT_DEVICES to move its device memory into the process; when the tree lives
//! on, gpucr asks it to resume (the memory back on the device, unlocked). Those
//! requests are made by the helper, inside the gpucr process (or the engine helper a
//! container engine's CRIU started). Killed outright, it makes none, and the job
//! stays locked with its memory off the device.
//!
//! So such a dump starts `gpucr sim-guard` (hidden), told of every process before its
//! driver is asked to lock it (`task PID START CONTEXT_DIR`) and `done` when the
//! backend is dropped. Input that ends without `done` means gpucr died: the guard waits
//! until CRIU has let the processes go, then asks the driver of each one that is still
//! the same process to resume, which undoes a lock and a checkpoint alike, until it
//! answers or [`SETTLE_WAIT`] has passed.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::nv_driver::{self, DriverOp};
use crate::gpu::give_back::{self, GivenBack};
use crate::gpu::GpuError;
use crate::guard::GuardProcess;
use crate::target;

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "sim-guard";

/// How long the guard keeps asking a process's driver to resume it.
pub const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// gpucr's end of a running guard.
#[derive(Debug)]
pub struct Guard(GuardProcess);

impl Guard {
    /// Start `gpucr sim-guard` for the dump into `images_dir`.
    pub fn start(images_dir: &Path) -> io::Result<Guard> {
        GuardProcess::start([
            SUBCOMMAND.as_ref(),
            "--images-dir".as_ref(),
            images_dir.as_os_str(),
        ])
        .map(Guard)
    }

    /// Tell the guard that gpucr is about to ask the driver of `pid`, whose context is
    /// `context`, to lock it.
    pub fn record(&self, pid: i32, context: &Path) {
        if let Some(start) = target::start_time(pid) {
            let task = Task {
                pid,
                start,
                context: context.to_path_buf(),
            };
            if let Some(line) = task.line() {
                self.0.send(&line);
            }
        }
    }
}

/// One process gpucr asked to lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub pid: i32,
    /// [`target::start_time`] when gpucr recorded it.
    pub start: u64,
    /// Its driver's context directory (the mailbox).
    pub context: PathBuf,
}

impl Task {
    /// The record: `task PID START CONTEXT_DIR`; None for a directory whose name is not
    /// one line of UTF-8 (a sim root holds none such).
    fn line(&self) -> Option<String> {
        let dir = self.context.to_str().filter(|d| !d.contains('\n'))?;
        Some(format!("task {} {} {dir}", self.pid, self.start))
    }

    fn parse(line: &str) -> Option<Task> {
        let mut words = line.splitn(4, ' ');
        (words.next()? == "task").then_some(())?;
        Some(Task {
            pid: words.next()?.parse().ok()?,
            start: words.next()?.parse().ok()?,
            context: PathBuf::from(words.next().filter(|d| d.starts_with('/'))?),
        })
    }
}

/// The processes the records name, each once (its last record wins); lines that are
/// not records are skipped.
pub fn tasks(lines: &[String]) -> Vec<Task> {
    give_back::last_records(lines, Task::parse, |t| t.pid)
}

/// Resume every task that is still the same process, once CRIU has let it go (waiting
/// up to `wait`), one thread per process. Tasks that are gone are left out.
pub fn give_back_all(tasks: &[Task], wait: Duration) -> Result<Vec<GivenBack>, GpuError> {
    let timeout = nv_driver::timeout_from_env()?;
    let live = give_back::live_once_untraced(tasks, |t| (t.pid, t.start), wait);
    Ok(give_back::each(
        &live,
        |t| t.pid,
        |t| resume_settled(t, timeout, SETTLE_WAIT),
    ))
}

/// Ask the driver of `task` to resume it until it answers that it runs, for up to
/// `wait`: its restore thread may still be stopped a moment after CRIU let the tree go
/// (a container's cgroup being thawed), and a request it misses is made again.
fn resume_settled(
    task: &Task,
    timeout: Duration,
    wait: Duration,
) -> Result<Vec<&'static str>, GpuError> {
    let deadline = Instant::now() + wait;
    loop {
        match nv_driver::call(&task.context, task.pid, DriverOp::Resume, timeout) {
            Ok(()) => return Ok(vec![DriverOp::Resume.name()]),
            Err(e) if Instant::now() >= deadline || !target::is_running(task.pid) => return Err(e),
            // Asked again every 100 ms: nothing tells when the task's restore thread
            // can answer (a container's cgroup being thawed, out of gpucr's sight).
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let task = Task {
            pid: 42,
            start: 123_456,
            context: PathBuf::from("/dev/shm/sim root/contexts/7"),
        };
        assert_eq!(Task::parse(&task.line().unwrap()), Some(task));
        let odd = Task {
            context: PathBuf::from("/a\nb"),
            ..Task::parse("task 1 2 /x").unwrap()
        };
        assert_eq!(odd.line(), None);
        for bad in ["", "task 1 2", "task 1 2 relative", "task x 2 /d", "undo"] {
            assert_eq!(Task::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_last_record_of_a_pid_wins() {
        let lines: Vec<String> = ["task 7 1 /a", "task 7 1 /b"].map(String::from).into();
        assert_eq!(tasks(&lines)[0].context, Path::new("/b"));
    }

    /// A driver that answers only on the second request: the guard asks again.
    #[test]
    fn a_missed_request_is_made_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let task = Task {
            pid: std::process::id() as i32,
            start: 0,
            context: dir.clone(),
        };
        let answerer = std::thread::spawn(move || {
            let request = dir.join(gpucr_abi::sim::DRIVER_REQUEST_FILE);
            let mut seen = Vec::new();
            while seen.len() < 2 {
                if let Ok(text) = std::fs::read_to_string(&request) {
                    let seq = text.split_whitespace().next().unwrap_or("").to_owned();
                    if !seen.contains(&seq) {
                        seen.push(seq);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let state = dir.join(gpucr_abi::sim::DRIVER_STATE_FILE);
            std::fs::write(state, format!("{} running\n", seen[1])).unwrap();
        });
        let calls = resume_settled(&task, Duration::from_millis(100), Duration::from_secs(10));
        answerer.join().unwrap();
        assert_eq!(calls.unwrap(), ["resume"]);
        // Nobody answers: the failure names the operation once the wait is over.
        let err = resume_settled(&task, Duration::from_millis(50), Duration::from_millis(120))
            .unwrap_err();
        assert!(err.to_string().contains("did not answer resume"), "{err}");
    }
}
