//! `gpucr check-topology [DIR]`.

use std::path::PathBuf;

use clap::Args;

use super::common::OutputArgs;

/// Show the local GPUs, or whether an image can be restored here.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct CheckTopologyArgs {
    /// An image directory to check against this machine.
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,

    #[command(flatten)]
    pub output: OutputArgs,
}
