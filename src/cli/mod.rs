//! The clap tree: one documented struct per subcommand, no behaviour.
//!
//! Man pages (`man/`) and shell completions (`completions/`) are generated from this
//! tree; `generated_docs_are_fresh` in `tests/cli.rs` fails when the committed copies are stale.

mod check_topology;
mod common;
mod completions;
mod cuda_guard;
mod dump;
mod engine_helper;
mod inspect;
mod install_plugin;
mod lazy_guard;
mod migrate;
mod migrate_guard;
mod restore;
mod restore_guard;
mod sim_guard;

use std::ffi::OsStr;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use check_topology::CheckTopologyArgs;
pub use check_topology::TopologyCheckArgs;
pub use common::{parse_size, CriuArgs, NetworkLockArg, OutputArgs, TransferArgs, TreeDumpArgs};
pub use completions::CompletionsArgs;
pub use cuda_guard::CudaGuardArgs;
pub use dump::{CudaStagingArg, DumpArgs};
pub use engine_helper::{EngineHelperArgs, EngineStageArg};
pub use inspect::InspectArgs;
pub use install_plugin::InstallPluginArgs;
pub use lazy_guard::LazyGuardArgs;
pub use migrate::{IdentityArgs, KeygenArgs, MigrateArgs, ReceiveArgs};
pub use migrate_guard::MigrateGuardArgs;
pub use restore::RestoreArgs;
pub use restore_guard::RestoreGuardArgs;
pub use sim_guard::SimGuardArgs;

const EXIT_STATUS_HELP: &str = "\
Exit status:
    0  success (check-topology: compatible; inspect --verify: intact)
    1  unexpected internal error
    2  usage error (bad flag, value or argument)
    3  target process not found, a kernel thread or a thread (not a process), traced by another process, a GPU process stopped by a signal, or not permitted
    4  CRIU missing, too old, it broke the RPC protocol, or it did not answer within 30 s
    5  CRIU reported that the dump or restore failed
    6  image directory not usable (not empty, not writable, not a directory, no room for the manifest, in use by another gpucr dump or on-demand restore)
    7  image damaged (checksum, size or format mismatch)
    8  image incomplete (no manifest, or the dump failed)
    9  GPU topology incompatible
   10  dump --leave-running: image complete, but a task may not have its GPU back
   11  a GPU driver or device step failed (a dump leaves the tree running, a restore no process)
   12  migration failed (link, authentication, receiver or destination restore): migrate leaves the job running on the source, receive leaves nothing running
   13  migrate: link lost after the commit: the source's copy is kept stopped; the job runs on the destination if the commit arrived
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
    Migrate(MigrateArgs),
    Receive(ReceiveArgs),
    Keygen(KeygenArgs),
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
    #[command(hide = true)]
    LazyGuard(LazyGuardArgs),
    #[command(hide = true)]
    MigrateGuard(MigrateGuardArgs),
}

/// Parse gpucr's command line. An environment variable that backs a flag (`GPUCR_CRIU`,
/// `GPUCR_SYSFS_ROOT`, ...) and is set but empty counts as unset, as a shell's `VAR=`
/// means, instead of as an empty value of the flag.
pub fn try_parse() -> Result<Parsed, clap::Error> {
    let mut command = forget_empty_variables(Cli::command(), |name| {
        std::env::var_os(name).is_some_and(|v| v.is_empty())
    });
    let mut matches = command.try_get_matches_from_mut(std::env::args_os())?;
    let users_command = matches
        .subcommand_name()
        .is_some_and(|name| is_users_command(&command, name));
    let cli = Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut command))?;
    Ok(Parsed { cli, users_command })
}

/// A parsed command line.
#[derive(Debug)]
pub struct Parsed {
    pub cli: Cli,
    /// The subcommand is one users run, not one gpucr runs itself (the engine helper,
    /// the guards: the subcommands hidden from `--help`).
    pub users_command: bool,
}

/// `command` (and its subcommands), every argument whose environment variable
/// `is_empty` says is empty no longer read from it.
fn forget_empty_variables(
    command: clap::Command,
    is_empty: impl Fn(&OsStr) -> bool + Copy,
) -> clap::Command {
    let command = command.mut_args(|arg| match arg.get_env() {
        Some(name) if is_empty(name) => arg.env(None::<&str>),
        _ => arg,
    });
    let names: Vec<String> = command
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    names.into_iter().fold(command, |command, name| {
        command.mut_subcommand(name, |sub| forget_empty_variables(sub, is_empty))
    })
}

/// The environment variable an invalid flag value came from, when it came from one
/// and not from `args` (the command line): clap's message names only the flag.
pub fn variable_behind(err: &clap::Error, args: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let flag = format!("--{long}");
    let on_command_line = args.iter().filter_map(|a| a.to_str()).any(|a| {
        a == flag
            || a.strip_prefix(flag.as_str())
                .is_some_and(|rest| rest.starts_with('='))
    });
    if on_command_line {
        return None;
    }
    let variable = env_of_flag(&Cli::command(), long)?;
    std::env::var_os(&variable).is_some().then_some(variable)
}

/// The environment variable of the flag `--long`, anywhere in `command`'s tree.
fn env_of_flag(command: &clap::Command, long: &str) -> Option<String> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| env_of_flag(sub, long))
        })
}

/// Whether subcommand `name` of `cli` is one users run: gpucr's own (the engine
/// helper, the guards) are hidden from `--help`.
fn is_users_command(cli: &clap::Command, name: &str) -> bool {
    cli.find_subcommand(name)
        .is_some_and(|sub| !sub.is_hide_set())
}

/// The long help text listing the exit codes, shared with the man pages.
pub fn exit_status_help() -> &'static str {
    EXIT_STATUS_HELP
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit_code;

    #[test]
    fn clap_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The subcommands gpucr runs itself are hidden from `--help`, which is what tells
    /// them from the users' (who alone are warned about misspelt variables).
    #[test]
    fn gpucrs_own_subcommands_are_the_hidden_ones() {
        let cli = Cli::command();
        let own: Vec<&str> = cli
            .get_subcommands()
            .map(|sub| sub.get_name())
            .filter(|name| !is_users_command(&cli, name))
            .collect();
        assert_eq!(
            own,
            [
                "engine-helper",
                "cuda-guard",
                "restore-guard",
                "sim-guard",
                "lazy-guard",
                "migrate-guard"
            ]
        );
        for users in [
            "dump",
            "restore",
            "inspect",
            "check-topology",
            "migrate",
            "receive",
            "keygen",
            "install-plugin",
        ] {
            assert!(is_users_command(&cli, users), "{users}");
        }
        assert!(!is_users_command(&cli, "no-such-command"));
    }

    /// An empty variable no longer backs its flag; the others still do.
    #[test]
    fn empty_flag_variables_count_as_unset() {
        let env_of = |command: &clap::Command, sub: &str, id: &str| {
            command
                .find_subcommand(sub)
                .unwrap()
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap()
                .get_env()
                .map(|v| v.to_owned())
        };
        let all = forget_empty_variables(Cli::command(), |_| false);
        assert_eq!(env_of(&all, "dump", "criu").unwrap(), "GPUCR_CRIU");
        assert_eq!(
            env_of(&all, "check-topology", "sysfs_root").unwrap(),
            "GPUCR_SYSFS_ROOT"
        );
        let some = forget_empty_variables(Cli::command(), |name| name == "GPUCR_CRIU");
        assert_eq!(env_of(&some, "dump", "criu"), None);
        assert_eq!(env_of(&some, "restore", "criu"), None);
        assert_eq!(
            env_of(&some, "dump", "criu_config").unwrap(),
            "GPUCR_CRIU_CONFIG"
        );
        some.debug_assert();
    }

    #[test]
    fn exit_status_help_lists_every_code() {
        for (code, meaning) in exit_code::ALL {
            let line = format!("{code:>5}  {meaning}");
            assert!(EXIT_STATUS_HELP.contains(&line), "missing {line:?}");
        }
    }
}
