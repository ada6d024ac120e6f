//! `gpucr cuda-guard`: wait for the dump to end; if gpucr died instead, give the job's
//! CUDA processes back and mark the image incomplete (`gpu::cuda::guard`).

use std::io;

use crate::cli::CudaGuardArgs;
use crate::exit_code;
use crate::gpu::cuda::guard;

pub fn run(args: &CudaGuardArgs) -> anyhow::Result<u8> {
    crate::guard::ignore_terminal_signals();
    let records = crate::guard::read_records(io::stdin().lock());
    let tasks = guard::tasks(&records.lines);
    if records.done || tasks.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let given = guard::give_back_all(&tasks, args.staging.staging(), crate::guard::UNTRACED_WAIT)?;
    Ok(super::give_back::report(
        guard::SUBCOMMAND,
        "CUDA",
        &args.images_dir,
        &given,
    ))
}
