//! `gpucr inspect DIR`.

use std::path::PathBuf;

use clap::Args;

use super::common::OutputArgs;

/// Show what is in an image directory.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct InspectArgs {
    /// The image directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    #[command(flatten)]
    pub output: OutputArgs,
}
