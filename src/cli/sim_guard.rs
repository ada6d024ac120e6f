//! `gpucr sim-guard` (hidden): the give-back guard a dump of the simulator's `nvidia`
//! model starts.

use std::path::PathBuf;

use clap::Args;

/// Give a simulated `nvidia`-model job its device back should the gpucr dump that
/// started this guard die.
///
/// Started by `gpucr dump`, never by hand: standard input carries one record per
/// process whose simulated driver the dump locks and `done` when the dump is over (see
/// docs/architecture.md, "When gpucr itself is killed").
#[derive(Debug, Clone, Args)]
pub struct SimGuardArgs {
    /// The dump's image directory (marked incomplete when the guard acts).
    #[arg(long, value_name = "DIR")]
    pub images_dir: PathBuf,
}
