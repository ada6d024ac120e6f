//! Drive the CUDA checkpoint API of another process by hand, one call per run, through
//! `gpucr-cuda-driver` (on a real driver, or on the fake with `GPUCR_CUDA_LIBRARY` and
//! `GPUCR_FAKE_CUDA_DIR`):
//!
//!   cuda_ctl state PID
//!   cuda_ctl lock PID [TIMEOUT_MS]
//!   cuda_ctl checkpoint PID
//!   cuda_ctl restore PID
//!   cuda_ctl unlock PID
//!
//! Prints the process's state after the call (`running`, `locked`, `checkpointed`, ...);
//! a failed call prints the driver's error and exits with status 1, bad arguments with 2.

use std::process::exit;
use std::time::Duration;

use gpucr_cuda_driver::Driver;

fn usage() -> ! {
    eprintln!("usage: cuda_ctl state|lock|checkpoint|restore|unlock PID [TIMEOUT_MS]");
    exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(call), Some(pid)) = (args.first(), args.get(1)) else {
        usage()
    };
    let Ok(pid) = pid.parse::<i32>() else { usage() };
    let timeout = match args.get(2).map(|t| t.parse::<u64>()) {
        None => None,
        Some(Ok(ms)) => Some(Duration::from_millis(ms)),
        Some(Err(_)) => usage(),
    };
    let driver = Driver::load().unwrap_or_else(|e| {
        eprintln!("cuda_ctl: {e}");
        exit(1)
    });
    let done = match call.as_str() {
        "state" => Ok(()),
        "lock" => driver.lock(pid, timeout),
        "checkpoint" => driver.checkpoint(pid),
        "restore" => driver.restore(pid, &[]),
        "unlock" => driver.unlock(pid),
        _ => usage(),
    };
    if let Err(e) = done.and_then(|()| {
        let state = driver.process_state(pid)?;
        println!("{}", state.name());
        Ok(())
    }) {
        eprintln!("cuda_ctl: {e}");
        exit(1);
    }
}
