//! The clap tree: one documented struct per subcommand, no behaviour.
//!
//! Man pages (`man/`) and shell completions (`completions/`) are generated from this
//! tree; `tests/docs_fresh.rs` fails when the committed copies are stale.

mod check_topology;
mod common;
mod completions;
mod cuda_guard;
mod dump;
mod engine_helper;
mod inspect;
mod install_plugin;
mod restore;
mod restore_guard;
mod sim_guard;

use clap::{Parser, Subcommand};

pub use check_topology::CheckTopologyArgs;
pub use check_topology::TopologyCheckArgs;
pub use common::{parse_size, CriuArgs, NetworkLockArg, OutputArgs, TransferArgs};
pub use completions::CompletionsArgs;
pub use cuda_guard::CudaGuardArgs;
pub use dump::{CudaStagingArg, DumpArgs};
pub use engine_helper::{EngineHelperArgs, EngineStage};
pub use inspect::InspectArgs;
pub use install_plugin::InstallPluginArgs;
pub use restore::RestoreArgs;
pub use restore_guard::RestoreGuardArgs;
pub use sim_guard::SimGuardArgs;

const EXIT_STATUS_HELP: &str = "\
Exit status:
    0  success (check-topology: compatible; inspect --verify: intact)
    1  unexpected internal error
    2  usage error (bad flag, value or argument)
    3  target process not found, a kernel thread or a thread (not a process), or not permitted
    4  CRIU missing, too old, it broke the RPC protocol, or it did not answer within 30 s
    5  CRIU reported that the dump or restore failed
    6  image directory not usable (not empty, not writable, not a directory, no room for the manifest)
    7  image damaged (checksum, size or format mismatch)
    8  image incomplete (no manifest, or the dump failed)
    9  GPU topology incompatible
   10  dump --leave-running: image complete, but a task may not have its GPU back
   11  a GPU driver or device step failed (a dump leaves the tree running, a restore no process)
  130  interrupted (SIGINT/SIGTERM/SIGHUP): a dump leaves the tree running, a restore leaves no process
`gpucr restore` without --detach exits with the restored tree's own status.";

/// Checkpoint and restore GPU process trees.
///
/// gpucr drives CRIU through its RPC socket for everything a CPU process has (memory,
/// threads, files, sockets, namespaces) and moves GPU state itself. An image is a
/// directory: CRIU's images at the top (so `crit` works on it), GPU memory under `gpu/`,
/// and the manifest `gpucr.json`, written last. An image without a manifest is incomplete.
///
/// Needs Linux, root (or CAP_CHECKPOINT_RESTORE) and CRIU >= 4.0 (4.2 or newer on
/// Linux >= 6.16, where older CRIU cannot dump TCP/UDP sockets).
#[derive(Debug, Parser)]
#[command(name = "gpucr", version, propagate_version = true, after_long_help = EXIT_STATUS_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    Dump(DumpArgs),
    Restore(RestoreArgs),
    Inspect(InspectArgs),
    CheckTopology(CheckTopologyArgs),
    InstallPlugin(InstallPluginArgs),
    Completions(CompletionsArgs),
    #[command(hide = true)]
    EngineHelper(EngineHelperArgs),
    #[command(hide = true)]
    CudaGuard(CudaGuardArgs),
    #[command(hide = true)]
    RestoreGuard(RestoreGuardArgs),
    #[command(hide = true)]
    SimGuard(SimGuardArgs),
}

/// The long help text listing the exit codes, shared with the man pages.
pub fn exit_status_help() -> &'static str {
    EXIT_STATUS_HELP
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::exit_code;

    #[test]
    fn clap_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exit_status_help_lists_every_code() {
        for (code, meaning) in exit_code::ALL {
            let line = format!("{code:>5}  {meaning}");
            assert!(EXIT_STATUS_HELP.contains(&line), "missing {line:?}");
        }
    }
}
