//! `gpucr sim-guard`: wait for the dump to end; if gpucr died instead, give the
//! simulator's `nvidia`-model processes back and mark the image incomplete
//! (`gpu::sim::guard`).

use crate::cli::SimGuardArgs;
use crate::gpu::sim::guard;

pub fn run(args: &SimGuardArgs) -> Result<u8, crate::cmd::Failure> {
    super::give_back::run_guard(
        guard::SUBCOMMAND,
        "simulated driver's",
        &args.images_dir,
        guard::tasks,
        |tasks| guard::give_back_all(tasks, crate::guard::UNTRACED_WAIT),
    )
}
