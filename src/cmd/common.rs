//! Output helpers shared by the subcommands.

use std::io::{self, Write};

use anyhow::Context;

use crate::cli::NetworkLockArg;
use crate::criu::NetworkLock;
use crate::image::manifest::TimedEvent;
use crate::progress::spans;
pub use crate::units::size;

/// The dump options `--tcp-established`, `--shell-job`, `--ext-unix-sk`,
/// `--file-locks`, `--network-lock` and `--timeout` give: CRIU's flags, the network lock
/// and the freeze's time limit.
pub fn tree_dump(
    args: &crate::cli::TreeDumpArgs,
) -> (crate::criu::CriuFlags, Option<NetworkLock>, Option<u32>) {
    let flags = crate::criu::CriuFlags {
        tcp_established: args.tcp_established,
        shell_job: args.shell_job,
        ext_unix_sk: args.ext_unix_sk,
        file_locks: args.file_locks,
    };
    (flags, args.network_lock.map(network_lock), args.timeout)
}

pub fn network_lock(arg: NetworkLockArg) -> NetworkLock {
    match arg {
        NetworkLockArg::Iptables => NetworkLock::Iptables,
        NetworkLockArg::Nftables => NetworkLock::Nftables,
        NetworkLockArg::Skip => NetworkLock::Skip,
    }
}

/// The phase timeline on stderr: what took how long.
pub fn print_timeline(events: &[TimedEvent], total_ms: f64) {
    for (from, to, ms) in spans(events) {
        crate::errln!("  {:>10.1} ms  {from} -> {to}", ms);
    }
    crate::errln!("  {:>10.1} ms  total", total_ms);
}

/// Write a command's result to standard output. A reader that stopped reading (`gpucr
/// inspect DIR | head`) ends the output without an error: the command's own outcome and
/// exit status stand. Any other failure (a full disk behind `>`) is returned.
pub fn print_out(text: impl AsRef<[u8]>) -> Result<(), crate::cmd::Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_ref()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => Ok(result.context("cannot write to standard output")?),
    }
}

/// [`print_out`] for the report of a dump or restore that has already happened: what
/// was checkpointed or restored does not depend on the report, so a report that cannot
/// be written is a warning on stderr, not a failure.
pub fn report_out(text: impl AsRef<[u8]>) {
    if let Err(e) = print_out(text) {
        crate::errln!("gpucr: warning: {e:#}");
    }
}
