//! The CUDA driver's checkpoint API driven from another process, as gpucr's helper
//! drives it: lock, checkpoint, restore and unlock one running CUDA process, each call
//! timed, with the driver loaded (and `cuInit` paid) once, before the first call.
//!
//!   checkpoint_cycle PID [--steps cycle|checkpoint|restore] [--repeat N]
//!                        [--lock-timeout-ms MS] [--hold-ms MS]
//!
//! `--steps checkpoint` only locks and checkpoints (the process is left CHECKPOINTED,
//! its device memory in its host memory, for a plain `criu dump`); `--steps restore`
//! only restores and unlocks (after a plain `criu restore`); `cycle` (the default) does
//! all four.
//! Prints one JSON object per line: `{"step": ..., "ms": ..., ...}` for the load and
//! each call, then `{"step": "summary", ...}`. `--repeat N` (default 100) times N more
//! `cuCheckpointProcessGetState` calls once the cycle is done: the per-call cost of the
//! driver once it is loaded. `--hold-ms` keeps the process checkpointed that long (its
//! device memory is then in its host memory only). Exit status 0 when every call
//! succeeded and the process is running again, 1 otherwise (the error on stderr).
//!
//! Runs on a real driver (`libcuda.so.1`) and on the fake
//! (`GPUCR_CUDA_LIBRARY=.../libgpucr_fake_cuda.so GPUCR_FAKE_CUDA_DIR=...`).

use std::process::exit;
use std::time::{Duration, Instant};

use gpucr_cuda_driver::{Driver, Error, ProcessState};

struct Options {
    pid: i32,
    repeat: usize,
    lock_timeout: Duration,
    hold: Duration,
    steps: Steps,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Steps {
    Cycle,
    Checkpoint,
    Restore,
}

fn die(message: &str) -> ! {
    eprintln!("checkpoint_cycle: {message}");
    exit(1)
}

fn parse_args() -> Options {
    let usage = "usage: checkpoint_cycle PID [--steps cycle|checkpoint|restore] [--repeat N] \
                 [--lock-timeout-ms MS] [--hold-ms MS]";
    let mut args = std::env::args().skip(1);
    let pid = args
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 0)
        .unwrap_or_else(|| die(usage));
    let mut opts = Options {
        pid,
        repeat: 100,
        lock_timeout: Duration::from_secs(10),
        hold: Duration::ZERO,
        steps: Steps::Cycle,
    };
    while let Some(flag) = args.next() {
        if flag == "--steps" {
            opts.steps = match args.next().as_deref() {
                Some("cycle") => Steps::Cycle,
                Some("checkpoint") => Steps::Checkpoint,
                Some("restore") => Steps::Restore,
                _ => die(&format!(
                    "--steps needs cycle, checkpoint or restore\n{usage}"
                )),
            };
            continue;
        }
        let value: u64 = args
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| die(&format!("{flag} needs a number\n{usage}")));
        match flag.as_str() {
            "--repeat" => opts.repeat = value as usize,
            "--lock-timeout-ms" => opts.lock_timeout = Duration::from_millis(value),
            "--hold-ms" => opts.hold = Duration::from_millis(value),
            _ => die(&format!("unknown option {flag}\n{usage}")),
        }
    }
    opts
}

/// Run `call`, print its step line with the time it took, and return its value.
fn timed<T>(step: &str, call: impl FnOnce() -> Result<T, Error>) -> T {
    let start = Instant::now();
    let result = call();
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(value) => {
            println!(r#"{{"step": "{step}", "ms": {ms:.3}}}"#);
            value
        }
        Err(e) => die(&format!("{step} failed after {ms:.3} ms: {e}")),
    }
}

fn expect_state(driver: &Driver, pid: i32, wanted: ProcessState) {
    let state = timed("get-state", || driver.process_state(pid));
    if state != wanted {
        die(&format!(
            "process {pid} is {} where it should be {}",
            state.name(),
            wanted.name()
        ));
    }
}

fn main() {
    let opts = parse_args();
    let pid = opts.pid;
    let whole = Instant::now();
    let driver = timed("load+cuInit", Driver::load);
    println!(
        r#"{{"step": "driver", "version": {}, "library": "{}"}}"#,
        driver.version(),
        driver.path().display()
    );
    let tid = timed("get-restore-thread", || driver.restore_thread_id(pid));
    if tid.is_none() {
        die(&format!("process {pid} does not use CUDA"));
    }
    if opts.steps != Steps::Restore {
        expect_state(&driver, pid, ProcessState::Running);
        timed("lock", || driver.lock(pid, Some(opts.lock_timeout)));
        timed("checkpoint", || driver.checkpoint(pid));
        expect_state(&driver, pid, ProcessState::Checkpointed);
        std::thread::sleep(opts.hold);
    }
    if opts.steps != Steps::Checkpoint {
        expect_state(&driver, pid, ProcessState::Checkpointed);
        timed("restore", || driver.restore(pid, &[]));
        timed("unlock", || driver.unlock(pid));
        expect_state(&driver, pid, ProcessState::Running);
    }
    let start = Instant::now();
    for _ in 0..opts.repeat {
        if let Err(e) = driver.process_state(pid) {
            die(&format!("get-state failed: {e}"));
        }
    }
    let per_call_ms = start.elapsed().as_secs_f64() * 1000.0 / opts.repeat.max(1) as f64;
    println!(
        r#"{{"step": "summary", "pid": {pid}, "total_ms": {:.3}, "repeat": {}, "per_call_ms": {per_call_ms:.4}}}"#,
        whole.elapsed().as_secs_f64() * 1000.0,
        opts.repeat
    );
}
