//! `gpucr completions SHELL`: print a completion script.

use super::common::print_out;
use crate::cli::CompletionsArgs;
use crate::exit_code;

pub fn run(args: &CompletionsArgs) -> Result<u8, crate::cmd::Failure> {
    let mut cmd = crate::docs::completion_command();
    // Generated into memory: clap_complete panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "gpucr", &mut script);
    print_out(script)?;
    Ok(exit_code::SUCCESS)
}
