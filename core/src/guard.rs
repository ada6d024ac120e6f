//! Guard processes: what makes an operation safe from a gpucr killed outright.
//!
//! Signals gpucr can catch roll an operation back (`interrupt`); SIGKILL and the OOM
//! killer leave no chance. For the steps whose half-done state CRIU does not undo by
//! itself, gpucr starts itself again as a hidden subcommand, a guard: a process group of
//! its own (a terminal's signals do not reach it), SIGINT and SIGHUP ignored, reading
//! one record per line on its standard input. gpucr writes what the guard needs to know
//! as the operation goes, and `done` once the operation is over, whatever its outcome
//! (when the [`GuardProcess`] is dropped). Input that ends without `done` means gpucr
//! died, and the guard undoes what is left. Five guards exist: the CUDA dump's
//! (`gpu::cuda::guard`), the dump's of the simulator's NVIDIA model
//! (`gpu::sim::guard`), the restore's (`restore_guard`), the lazy restore's
//! (`lazy::guard`) and the migration source's (`migrate::guard`).

use std::ffi::OsStr;
use std::io::{self, BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The line that says the operation is over.
pub const DONE: &str = "done";

/// How long a guard waits for CRIU to let go of the processes after gpucr died.
pub const UNTRACED_WAIT: Duration = Duration::from_secs(120);

/// gpucr's end of a running guard.
#[derive(Debug)]
pub struct GuardProcess {
    input: Mutex<Option<ChildStdin>>,
    child: Mutex<Option<Child>>,
}

impl GuardProcess {
    /// Start `gpucr ARGS` (this binary) as a guard.
    pub fn start<I, S>(args: I) -> io::Result<GuardProcess>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let input = child.stdin.take();
        Ok(GuardProcess {
            input: Mutex::new(input),
            child: Mutex::new(Some(child)),
        })
    }

    /// Send one record (a line without its newline).
    pub fn send(&self, record: &str) {
        let mut input = self.input.lock().unwrap_or_else(|e| e.into_inner());
        // A guard that is gone guards nothing; the operation itself goes on.
        if let Some(stdin) = input.as_mut() {
            if stdin.write_all(format!("{record}\n").as_bytes()).is_err() {
                *input = None;
            }
        }
    }
}

impl Drop for GuardProcess {
    /// The operation is over: `done`, then the guard ends.
    fn drop(&mut self) {
        self.send(DONE);
        drop(self.input.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = child.wait();
        }
    }
}

/// A process as gpucr recorded it for a guard: its pid, and its start time
/// ([`crate::target::start_time`]), which tells it from a later process with the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub pid: i32,
    pub start: u64,
}

impl Recorded {
    /// `pid` as it is now; None once it is gone.
    pub fn now(pid: i32) -> Option<Recorded> {
        crate::target::start_time(pid).map(|start| Recorded { pid, start })
    }

    /// The record `WORD PID START`.
    pub fn line(&self, word: &str) -> String {
        format!("{word} {} {}", self.pid, self.start)
    }

    /// The record `WORD PID START`, and nothing more on its line.
    pub fn parse(word: &str, line: &str) -> Option<Recorded> {
        let mut words = line.split_whitespace();
        (words.next()? == word).then_some(())?;
        let recorded = Recorded {
            pid: words.next()?.parse().ok()?,
            start: words.next()?.parse().ok()?,
        };
        words.next().is_none().then_some(recorded)
    }

    /// Whether `pid` is still the process gpucr recorded.
    pub fn is_alive(&self) -> bool {
        crate::target::start_time(self.pid) == Some(self.start)
    }
}

/// What a guard read: its records, and whether gpucr said the operation was over.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub lines: Vec<String>,
    pub done: bool,
}

/// In the guard: read the records until `done` or the end of the input.
pub fn read_records(input: impl BufRead) -> Records {
    let mut records = Records::default();
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim() == DONE {
            records.done = true;
            break;
        }
        records.lines.push(line);
    }
    records
}

/// In the guard: ignore the terminal's signals, which are for gpucr (the guard outlives
/// it on purpose).
pub fn ignore_terminal_signals() {
    for signal in [libc::SIGINT, libc::SIGHUP] {
        // SAFETY: SIG_IGN is a valid disposition for these signals; no handler function
        // is installed.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
}

/// In the guard: wait until CRIU has let the processes go, for at most `wait`. Every
/// `poll`, `round` runs and returns the pids to watch now (it may act on them first);
/// the wait ends when none of them is traced.
pub fn until_untraced(wait: Duration, poll: Duration, mut round: impl FnMut() -> Vec<i32>) {
    let deadline = Instant::now() + wait;
    while round()
        .into_iter()
        .any(|pid| crate::target::tracer(pid).is_some())
        && Instant::now() < deadline
    {
        // Polled every `poll`: a ptrace detach raises no event, and CRIU may let the
        // tree go long before it exits, so its pidfd would not tell either.
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_end_at_done_or_at_the_end_of_the_input() {
        let records = read_records("task 1\nroot 2 3\ndone\ntask 4\n".as_bytes());
        assert!(records.done);
        assert_eq!(records.lines, ["task 1", "root 2 3"]);
        let records = read_records("root 2 3\n".as_bytes());
        assert!(!records.done);
        assert_eq!(records.lines, ["root 2 3"]);
    }
}
