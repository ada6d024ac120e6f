//! `gpucr cuda-guard`: wait for the dump to end; if gpucr died instead, give the job's
//! CUDA processes back and mark the image incomplete (`gpu::cuda::guard`).

use crate::cli::CudaGuardArgs;
use crate::gpu::cuda::guard;

pub fn run(args: &CudaGuardArgs) -> Result<u8, crate::cmd::Failure> {
    super::give_back::run_guard(
        guard::SUBCOMMAND,
        "CUDA",
        &args.images_dir,
        guard::tasks,
        |tasks| guard::give_back_all(tasks, args.staging.staging(), crate::guard::UNTRACED_WAIT),
    )
}
