//! `gpucr sim-guard`: wait for the dump to end; if gpucr died instead, give the
//! simulator's `nvidia`-model processes back and mark the image incomplete
//! (`gpu::sim::guard`).

use std::io;

use crate::cli::SimGuardArgs;
use crate::exit_code;
use crate::gpu::sim::guard;

pub fn run(args: &SimGuardArgs) -> anyhow::Result<u8> {
    crate::guard::ignore_terminal_signals();
    let records = crate::guard::read_records(io::stdin().lock());
    let tasks = guard::tasks(&records.lines);
    if records.done || tasks.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let given = guard::give_back_all(&tasks, crate::guard::UNTRACED_WAIT)?;
    Ok(super::give_back::report(
        guard::SUBCOMMAND,
        "simulated driver's",
        &args.images_dir,
        &given,
    ))
}
