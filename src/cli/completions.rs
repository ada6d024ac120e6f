//! `gpucr completions SHELL`.

use clap::Args;
use clap_complete::Shell;

/// Print a shell completion script to stdout.
///
/// For example: `gpucr completions bash > /etc/bash_completion.d/gpucr`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}
