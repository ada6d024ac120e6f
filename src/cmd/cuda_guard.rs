//! `gpucr cuda-guard`: wait for the dump to end; if gpucr died instead, give the job's
//! CUDA processes back and mark the image incomplete (`gpu::cuda::guard`).

use std::io;

use crate::cli::CudaGuardArgs;
use crate::exit_code;
use crate::gpu::cuda::guard::{self, GivenBack};
use crate::image::{dir, MANIFEST_FILE};

pub fn run(args: &CudaGuardArgs) -> anyhow::Result<u8> {
    crate::guard::ignore_terminal_signals();
    let records = crate::guard::read_records(io::stdin().lock());
    let tasks = guard::tasks(&records.lines);
    if records.done || tasks.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let given = guard::give_back_all(&tasks, args.staging.staging(), crate::guard::UNTRACED_WAIT)?;
    if given.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let reason = format!(
        "gpucr ended during the dump without finishing it; its CUDA guard gave the \
         processes back: {}",
        summary(&given)
    );
    eprintln!("gpucr cuda-guard: {reason}");
    if !args.images_dir.join(MANIFEST_FILE).exists() {
        let _ = dir::mark_incomplete(&args.images_dir, &reason);
    }
    Ok(if given.iter().all(|g| g.result.is_ok()) {
        exit_code::SUCCESS
    } else {
        exit_code::GIVE_BACK_FAILED
    })
}

/// One clause per process: the calls made, or the failure.
fn summary(given: &[GivenBack]) -> String {
    given
        .iter()
        .map(|g| match &g.result {
            Ok(calls) if calls.is_empty() => format!("pid {} was already as before", g.pid),
            Ok(calls) => format!("pid {}: {}", g.pid, calls.join(", ")),
            // The error names the pid.
            Err(e) => format!("not given back: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}
