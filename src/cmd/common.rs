//! Output helpers shared by the subcommands.

use crate::cli::NetworkLockArg;
use crate::criu::NetworkLock;
use crate::image::manifest::TimedEvent;
use crate::progress::spans;
pub use crate::units::size;

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
        eprintln!("  {:>10.1} ms  {from} -> {to}", ms);
    }
    eprintln!("  {:>10.1} ms  total", total_ms);
}
