//! `gpucr cuda-guard` (hidden): the give-back guard a CUDA dump starts.

use std::path::PathBuf;

use clap::Args;

use super::CudaStagingArg;

/// Give a CUDA job its GPU back should the gpucr dump that started this guard die.
///
/// Started by `gpucr dump`, never by hand: standard input carries one record per CUDA
/// process the dump touches and `done` when the dump is over (see
/// docs/architecture.md, "The CUDA give-back guard").
#[derive(Debug, Clone, Args)]
pub struct CudaGuardArgs {
    /// The dump's image directory (marked incomplete when the guard acts).
    #[arg(long, value_name = "DIR")]
    pub images_dir: PathBuf,

    /// How the dump moves device memory (custom: a checkpointed process is not
    /// restored, only reported).
    #[arg(long, value_enum, default_value = "host")]
    pub staging: CudaStagingArg,
}
