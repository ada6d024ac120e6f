//! The `gpucr` command: parse, dispatch, map errors to exit codes.

use std::process::ExitCode;

use gpucr::cli::{self, Command};
use gpucr::{cmd, exit_code};

fn main() -> ExitCode {
    let cli::Parsed { cli, users_command } = match cli::try_parse() {
        Ok(parsed) => parsed,
        Err(err) => {
            // --help and --version print to stdout and succeed; real errors exit USAGE.
            let code = if err.use_stderr() {
                exit_code::USAGE
            } else {
                exit_code::SUCCESS
            };
            let _ = err.print();
            let args: Vec<_> = std::env::args_os().collect();
            if let Some(variable) = cli::variable_behind(&err, &args) {
                gpucr::errln!("gpucr: note: that value came from the environment ({variable})");
            }
            return ExitCode::from(code);
        }
    };
    if users_command {
        // A misspelt variable would otherwise leave its default in force unnoticed.
        for unknown in gpucr_abi::env::unknown_in_environment() {
            gpucr::errln!("gpucr: warning: {unknown}");
        }
    }
    let result = match &cli.command {
        Command::Dump(args) => cmd::dump::run(args),
        Command::Restore(args) => cmd::restore::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::CheckTopology(args) => cmd::check_topology::run(args),
        Command::Migrate(args) => cmd::migrate::run(args),
        Command::Receive(args) => cmd::migrate::receive(args),
        Command::Keygen(args) => cmd::migrate::keygen(args),
        Command::InstallPlugin(args) => cmd::install_plugin::run(args),
        Command::Completions(args) => cmd::completions::run(args),
        Command::EngineHelper(args) => Ok(cmd::engine_helper::run(args)),
        Command::CudaGuard(args) => cmd::cuda_guard::run(args),
        Command::RestoreGuard(args) => cmd::restore_guard::run(args),
        Command::MigrateGuard(args) => cmd::migrate_guard::run(args),
        Command::SimGuard(args) => cmd::sim_guard::run(args),
        Command::LazyGuard(args) => cmd::lazy_guard::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            gpucr::errln!("gpucr: error: {err}");
            let mut cause = std::error::Error::source(&err);
            while let Some(c) = cause {
                gpucr::errln!("  caused by: {c}");
                cause = c.source();
            }
            ExitCode::from(gpucr::exit_code::ExitCode::exit_code(&err))
        }
    }
}
