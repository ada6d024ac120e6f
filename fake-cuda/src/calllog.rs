//! Call recording: with `GPUCR_FAKE_CUDA_LOG=<file>`, every call appends one line
//! `pid=<caller> fn=<function> target=<pid or -> args=<summary> result=<CUresult name>
//! start_ns=<ns> end_ns=<ns>`, written with one `write` on an `O_APPEND` descriptor so
//! that lines of several processes do not interleave. The times are `CLOCK_MONOTONIC`,
//! one clock for every process of the machine, so the calls of several processes can be
//! ordered and their overlap seen.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::sys::CUresult;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the current time into our local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends the line of one call, made from `start_ns` until now, to `log`.
pub fn record(
    log: &Path,
    function: &str,
    target: Option<i32>,
    args: &str,
    code: CUresult,
    start_ns: u64,
) {
    let target = target.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let name = result::name(code).map_or_else(|| code.to_string(), str::to_owned);
    let line = format!(
        "pid={} fn={function} target={target} args={} result={name} start_ns={start_ns} \
         end_ns={}\n",
        std::process::id(),
        if args.is_empty() { "-" } else { args },
        now_ns(),
    );
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(line.as_bytes());
    }
}
