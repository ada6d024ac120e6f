//! The lock every test that runs CRIU holds, so that no two checkpoint at once on the
//! machine: an exclusive `flock` on [`LOCK_FILE`], shared by every test binary.
//!
//! The holder writes its pid and its test's name into the file; a test that waits
//! longer than `GPUCR_TEST_LOCK_TIMEOUT` seconds (default [`DEFAULT_TIMEOUT_S`]) fails
//! naming the holder, and whether that process still runs, instead of waiting for ever
//! behind a hung test.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// The lock file (also taken by scripts/test.sh, with flock(1)).
pub const LOCK_FILE: &str = "/tmp/gpucr-tests.lock";
/// How long a test waits for the lock by default, in seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 1800;
/// The variable that sets how long a test waits for the lock, in seconds.
const TIMEOUT_VARIABLE: &str = "GPUCR_TEST_LOCK_TIMEOUT";
/// How often a waiting test tries the lock.
const POLL: Duration = Duration::from_millis(100);

/// Hold this while checkpointing: one CRIU run at a time on the machine. Panics,
/// naming the holder, when the lock is not free within the timeout.
pub fn criu_lock() -> Flock<File> {
    let timeout = std::env::var(TIMEOUT_VARIABLE)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(DEFAULT_TIMEOUT_S), Duration::from_secs);
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let mut lock = lock_within(&test, timeout);
    // Record the holder; the file is this lock's alone.
    let record = format!("{} {test}\n", std::process::id());
    let written = lock
        .set_len(0)
        .and_then(|()| lock.rewind())
        .and_then(|()| lock.write_all(record.as_bytes()));
    if let Err(e) = written {
        eprintln!("{test}: cannot record itself in {LOCK_FILE}: {e}");
    }
    lock
}

/// The lock, taken within `timeout`, else a panic naming its holder.
fn lock_within(test: &str, timeout: Duration) -> Flock<File> {
    let started = Instant::now();
    let mut file = open();
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return lock,
            Err((back, nix::errno::Errno::EWOULDBLOCK)) => file = back,
            Err((_, e)) => panic!("{test}: cannot lock {LOCK_FILE}: {e}"),
        }
        if started.elapsed() >= timeout {
            panic!(
                "{test}: {LOCK_FILE} was not free within {} s ({TIMEOUT_VARIABLE}): {}",
                timeout.as_secs(),
                holder(&mut file)
            );
        }
        std::thread::sleep(POLL);
    }
}

fn open() -> File {
    File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(LOCK_FILE)
        .unwrap_or_else(|e| panic!("cannot open {LOCK_FILE}: {e}"))
}

/// Who holds the lock, by what the file says: the last test that took it.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
    let mut words = text.split_whitespace();
    let Some(pid) = words.next().and_then(|w| w.parse::<i32>().ok()) else {
        return "it names no holder (a holder other than a test, such as scripts/test.sh's \
                flock(1), records none)"
            .to_owned();
    };
    let test = words.collect::<Vec<_>>().join(" ");
    let state = if std::path::Path::new(&format!("/proc/{pid}")).exists() {
        "still running"
    } else {
        "no longer running, so another process holds the lock without naming itself"
    };
    format!("it was last taken by pid {pid}, test {test}, which is {state}")
}
