//! Call recording: with `GPUCR_FAKE_CUDA_LOG=<file>`, every call appends one line
//! `pid=<caller> fn=<function> target=<pid or -> args=<summary> result=<CUresult name>`,
//! written with one `write` on an `O_APPEND` descriptor so that lines of several
//! processes do not interleave.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::sys::CUresult;

/// Appends the line of one call to `log`.
pub fn record(log: &Path, function: &str, target: Option<i32>, args: &str, code: CUresult) {
    let target = target.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let name = result::name(code).map_or_else(|| code.to_string(), str::to_owned);
    let line = format!(
        "pid={} fn={function} target={target} args={} result={name}\n",
        std::process::id(),
        if args.is_empty() { "-" } else { args },
    );
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(line.as_bytes());
    }
}
