//! Flags shared by several subcommands.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// How CRIU selects and runs.
#[derive(Debug, Clone, Args)]
pub struct CriuArgs {
    /// The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin).
    #[arg(long, value_name = "PATH", env = "GPUCR_CRIU")]
    pub criu: Option<PathBuf>,

    /// More detail: -v shows every CRIU phase and raises CRIU's log level to 4 (debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// How results are printed.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Print the result as one JSON object on stdout (for scripts); no progress output.
    #[arg(long)]
    pub json: bool,
}

/// How CRIU locks the network while TCP connections are dumped and restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkLockArg {
    /// iptables rules (CRIU's default; needs iptables-restore).
    Iptables,
    /// an nftables table (needs CRIU built with libnftables).
    Nftables,
    /// no lock: only safe when nothing can reach the connections meanwhile.
    Skip,
}
