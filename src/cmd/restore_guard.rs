//! `gpucr restore-guard`: wait for the restore to end; if gpucr died instead, kill the
//! half-restored tree (`restore_guard`).

use std::io;

use crate::cli::RestoreGuardArgs;
use crate::exit_code;
use crate::guard::{ignore_terminal_signals, read_records, UNTRACED_WAIT};
use crate::restore_guard::{kill_half_restored, root};

pub fn run(_args: &RestoreGuardArgs) -> Result<u8, crate::cmd::Failure> {
    ignore_terminal_signals();
    let records = read_records(io::stdin().lock());
    let Some(root) = root(&records.lines).filter(|_| !records.done) else {
        return Ok(exit_code::SUCCESS);
    };
    let killed = kill_half_restored(root, UNTRACED_WAIT);
    if !killed.is_empty() {
        let pids: Vec<String> = killed.iter().map(i32::to_string).collect();
        crate::errln!(
            "gpucr restore-guard: gpucr ended during the restore before the tree's devices \
             were back; the half-restored tree was killed (pids {})",
            pids.join(", ")
        );
    }
    Ok(exit_code::SUCCESS)
}
