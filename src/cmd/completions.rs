//! `gpucr completions SHELL`: print a completion script.

use std::io;

use crate::cli::CompletionsArgs;
use crate::exit_code;

pub fn run(args: &CompletionsArgs) -> anyhow::Result<u8> {
    let mut cmd = crate::docs::completion_command();
    clap_complete::generate(args.shell, &mut cmd, "gpucr", &mut io::stdout());
    Ok(exit_code::SUCCESS)
}
