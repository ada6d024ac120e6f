//! `gpucr migrate-guard` (hidden): the guard a migration's source starts.

use clap::Args;

/// Let the job run on at the source should the gpucr migrate that started this guard
/// die before it committed the job to the destination.
///
/// Started by `gpucr migrate`, never by hand: standard input carries the job's tasks,
/// `commit` once the destination may run it, and `done` when the migration is over
/// (see docs/migration.md, "Failures").
#[derive(Debug, Clone, Args)]
pub struct MigrateGuardArgs {}
