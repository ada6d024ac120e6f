//! `gpucr restore-guard` (hidden): the guard a restore of GPU state starts.

use clap::Args;

/// Kill a half-restored tree should the gpucr restore that started this guard die.
///
/// Started by `gpucr restore`, never by hand: standard input carries the restored root
/// and `done` when the restore is over (see docs/architecture.md, section 3,
/// "Interrupts").
#[derive(Debug, Clone, Args)]
pub struct RestoreGuardArgs {}
