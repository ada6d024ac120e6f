//! Flags shared by several subcommands.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// What CRIU dumps of a tree and how it freezes it (`gpucr dump`, `gpucr migrate`).
#[derive(Debug, Clone, Args)]
pub struct TreeDumpArgs {
    /// Dump established TCP connections (restored with their sequence numbers; needs a
    /// network lock).
    #[arg(long)]
    pub tcp_established: bool,

    /// The tree is a shell job: it shares a session or controlling terminal with the
    /// caller.
    #[arg(long)]
    pub shell_job: bool,

    /// Allow unix sockets connected to peers outside the tree.
    #[arg(long)]
    pub ext_unix_sk: bool,

    /// Dump file locks (flock, POSIX and OFD locks).
    #[arg(long)]
    pub file_locks: bool,

    /// How to lock the network during the dump and the restore [default: skip when
    /// there is nothing to lock (no --tcp-established and the tree shares gpucr's
    /// network namespace), else iptables when iptables-restore is installed, else
    /// nftables].
    #[arg(long, value_enum, value_name = "METHOD")]
    pub network_lock: Option<NetworkLockArg>,

    /// Give up when the tree cannot be frozen within SECS seconds (CRIU's --timeout).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..))]
    pub timeout: Option<u32>,
}

/// How CRIU selects and runs.
#[derive(Debug, Clone, Args)]
pub struct CriuArgs {
    /// The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin).
    #[arg(long, value_name = "PATH", env = "GPUCR_CRIU")]
    pub criu: Option<PathBuf>,

    /// Further CRIU options, from a file in CRIU's config format (one long option name
    /// per line, without dashes, then its value: `ghost-limit 64M`, `tcp-close`,
    /// `external mnt[KEY]:PATH`, `manage-cgroups full`). Checked before anything is
    /// touched: options gpucr sets itself (the image directory, CRIU's log,
    /// leave-running, the network lock, tcp-established, page servers, ...) are refused
    /// with the flag to use instead. A dump records the options in the image (`gpucr
    /// inspect` shows them); a restore does not reuse them: give a restore the ones it
    /// needs. The CRIU gpucr runs reads no other config file: not CRIU's own
    /// (/etc/criu/default.conf, ~/.criu/default.conf, CRIU_CONFIG_FILE), which a note
    /// names when one holds options.
    #[arg(long, value_name = "FILE", env = "GPUCR_CRIU_CONFIG")]
    pub criu_config: Option<PathBuf>,

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

/// How GPU memory moves (only used when the tree holds a GPU).
#[derive(Debug, Clone, Args)]
pub struct TransferArgs {
    /// Threads moving GPU memory (default: the number of CPU cores).
    #[arg(long, value_name = "N", env = gpucr_abi::engine::ENV_JOBS, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: Option<u16>,

    /// Give up a device step (a driver lock, checkpoint or restore, a task's device
    /// taken over or recreated) that takes longer than SECS seconds: the dump fails
    /// with the tree running on, the restore with nothing left behind. A step that
    /// copies device memory gets SECS again each time its copy moves bytes.
    #[arg(long, value_name = "SECS", env = gpucr_abi::engine::ENV_DEVICE_TIMEOUT, default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub device_timeout: u32,
}

/// Parse a size: "512M", "1G", "1GiB", "4096" (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    let shift = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use K, M, G, T)"
            ))
        }
    };
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("1X").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
