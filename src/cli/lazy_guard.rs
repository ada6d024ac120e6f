//! `gpucr lazy-guard LOG` (hidden): the guard a lazy restore starts.

use std::path::PathBuf;

use clap::Args;

/// Keep a lazy restore's userfaultfds open and kill its tree should the gpucr that
/// serves its memory die.
///
/// Started by `gpucr restore --lazy`, never by hand: standard input is a socket that
/// carries the tasks' userfaultfds and `done` when serving is over (see
/// docs/architecture.md, "On-demand restore").
#[derive(Debug, Clone, Args)]
pub struct LazyGuardArgs {
    /// Where to say why the tree was killed.
    #[arg(value_name = "LOG")]
    pub log: PathBuf,
}
