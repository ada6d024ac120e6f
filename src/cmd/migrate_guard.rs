//! `gpucr migrate-guard`: wait for the migration to end; if gpucr died instead, let the
//! job run on at the source, or keep it stopped once it was committed (`migrate::guard`).

use std::io;

use crate::cli::MigrateGuardArgs;
use crate::exit_code;
use crate::guard::{ignore_terminal_signals, read_records, UNTRACED_WAIT};
use crate::migrate::guard::{guarded, undo, Left};

pub fn run(_args: &MigrateGuardArgs) -> Result<u8, crate::cmd::Failure> {
    ignore_terminal_signals();
    let records = read_records(io::stdin().lock());
    let guarded = guarded(&records.lines);
    if records.done || guarded.tasks.is_empty() {
        return Ok(exit_code::SUCCESS);
    }
    let pids = |pids: &[i32]| -> String {
        let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
        pids.join(", ")
    };
    match undo(&guarded, UNTRACED_WAIT) {
        Left::Resumed(resumed) if resumed.is_empty() => {}
        Left::Resumed(resumed) => crate::errln!(
            "gpucr migrate-guard: gpucr ended during the migration before the destination \
             could run the job; the job runs on here (pids {})",
            pids(&resumed)
        ),
        Left::KeptStopped(kept) if kept.is_empty() => {}
        Left::KeptStopped(kept) => crate::errln!(
            "gpucr migrate-guard: gpucr ended during the migration after it let the \
             destination run the job; its copy here is kept stopped (pids {}). If the \
             destination did not resume it (its `gpucr receive` says so), let it run here \
             with `kill -CONT` to each of these tasks; else kill them",
            pids(&kept)
        ),
    }
    Ok(exit_code::SUCCESS)
}
