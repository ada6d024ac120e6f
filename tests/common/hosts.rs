//! Hosts for tests that move a job between machines: network namespaces this test makes
//! and removes, joined the way machines on one network are.
//!
//! `Hosts::new` makes three namespaces: `source` and `destination` stand for two
//! machines, `client` for the network outside them (a bridge, with the clients' address
//! [`CLIENT_ADDRESS`]), and a veth pair joins each machine to the bridge; each machine
//! has an address of its own ([`Hosts::address`]). The job's
//! address ([`JOB_ADDRESS`]) starts on the source; [`Hosts::move_job_address`] moves it
//! to the destination as a floating address moves (the clients' neighbour entries
//! flushed, as a gratuitous ARP does). Every address is inside these namespaces.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The job's address, on whichever host runs it.
pub const JOB_ADDRESS: &str = "10.201.0.100";
/// The clients' address, on the bridge in the `client` namespace.
pub const CLIENT_ADDRESS: &str = "10.201.0.1";
/// The source's and the destination's own addresses, beside the job's.
const HOST_ADDRESSES: [&str; 2] = ["10.201.0.11", "10.201.0.12"];
const PREFIX: &str = "/24";

/// One of the namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Source,
    Destination,
    Client,
}

/// The three namespaces; removed (with every interface in them) when dropped.
pub struct Hosts {
    names: [String; 3],
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Hosts {
    pub fn new() -> Hosts {
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "gpucr-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        let hosts = Hosts {
            names: ["src", "dst", "cli"].map(|role| format!("{tag}-{role}")),
        };
        for name in &hosts.names {
            ip(&["netns", "add", name]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        let client = hosts.name(Host::Client);
        ip(&["-n", client, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", client, "link", "set", "br0", "up"]);
        let bridge_address = format!("{CLIENT_ADDRESS}{PREFIX}");
        ip(&["-n", client, "addr", "add", &bridge_address, "dev", "br0"]);
        for (host, port) in [(Host::Source, "to-src"), (Host::Destination, "to-dst")] {
            let name = hosts.name(host);
            ip(&[
                "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns",
                client,
            ]);
            ip(&["-n", client, "link", "set", port, "master", "br0"]);
            ip(&["-n", client, "link", "set", port, "up"]);
            ip(&["-n", name, "link", "set", "eth0", "up"]);
            let own = format!("{}{PREFIX}", HOST_ADDRESSES[host as usize]);
            ip(&["-n", name, "addr", "add", &own, "dev", "eth0"]);
        }
        let job = format!("{JOB_ADDRESS}{PREFIX}");
        ip(&[
            "-n",
            hosts.name(Host::Source),
            "addr",
            "add",
            &job,
            "dev",
            "eth0",
        ]);
        hosts
    }

    /// The namespace's name (`ip netns`).
    pub fn name(&self, host: Host) -> &str {
        &self.names[host as usize]
    }

    /// Its file, for `nsenter --net=`.
    pub fn path(&self, host: Host) -> PathBuf {
        PathBuf::from("/run/netns").join(self.name(host))
    }

    /// `nsenter --net=HOST PROGRAM`: a command that runs in the host's network namespace
    /// only (its mount namespace stays the caller's, so CRIU sees one).
    pub fn command(&self, host: Host, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path(host).display()))
            .arg(program);
        cmd
    }

    /// The source's or the destination's own address.
    pub fn address(&self, host: Host) -> &'static str {
        HOST_ADDRESSES[host as usize]
    }

    /// Cut the host off the network: its end of its veth pair goes down.
    pub fn cut(&self, host: Host) {
        ip(&["-n", self.name(host), "link", "set", "eth0", "down"]);
    }

    /// Move the job's address from the source to the destination.
    pub fn move_job_address(&self) {
        let job = format!("{JOB_ADDRESS}{PREFIX}");
        ip(&[
            "-n",
            self.name(Host::Source),
            "addr",
            "del",
            &job,
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            self.name(Host::Destination),
            "addr",
            "add",
            &job,
            "dev",
            "eth0",
        ]);
        ip(&["-n", self.name(Host::Client), "neigh", "flush", "all"]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}
