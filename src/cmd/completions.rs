//! `gpucr completions SHELL`: print a completion script.

use std::io;

use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};
use crate::exit_code;

pub fn run(args: &CompletionsArgs) -> anyhow::Result<u8> {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "gpucr", &mut io::stdout());
    Ok(exit_code::SUCCESS)
}
