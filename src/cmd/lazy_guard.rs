//! `gpucr lazy-guard LOG`: hold a lazy restore's userfaultfds; if gpucr died while
//! serving, kill the tree before they close (`lazy::guard`).

use std::os::fd::AsFd;

use crate::cli::LazyGuardArgs;
use crate::exit_code;
use crate::guard::ignore_terminal_signals;

pub fn run(args: &LazyGuardArgs) -> Result<u8, crate::cmd::Failure> {
    ignore_terminal_signals();
    let stdin = std::io::stdin();
    crate::lazy::guard::run(stdin.as_fd(), &args.log);
    Ok(exit_code::SUCCESS)
}
