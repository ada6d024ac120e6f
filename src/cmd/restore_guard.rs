//! `gpucr restore-guard`: wait for the restore to end; if gpucr died instead, kill the
//! half-restored tree (`restore_guard`).

use std::io;

use crate::cli::RestoreGuardArgs;
use crate::exit_code;
use crate::guard::{ignore_terminal_signals, read_records, UNTRACED_WAIT};
use crate::restore_guard::{discarded, kill_half_restored, root};

pub fn run(_args: &RestoreGuardArgs) -> Result<u8, crate::cmd::Failure> {
    ignore_terminal_signals();
    let records = read_records(io::stdin().lock());
    if records.done {
        return Ok(exit_code::SUCCESS);
    }
    if let Some(root) = root(&records.lines) {
        let killed = kill_half_restored(root, UNTRACED_WAIT);
        if !killed.is_empty() {
            let pids: Vec<String> = killed.iter().map(i32::to_string).collect();
            crate::errln!(
                "gpucr restore-guard: gpucr ended before the restored tree could run on \
                 its own (its devices back, or its migration committed); the tree was \
                 killed (pids {})",
                pids.join(", ")
            );
        }
    }
    let mut code = exit_code::SUCCESS;
    for dir in discarded(&records.lines) {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => crate::errln!(
                "gpucr restore-guard: gpucr ended before the image in {} was whole; \
                 removed it",
                dir.display()
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                crate::errln!(
                    "gpucr restore-guard: cannot remove the partial image {}: {e}",
                    dir.display()
                );
                code = exit_code::FAILURE;
            }
        }
    }
    Ok(code)
}
