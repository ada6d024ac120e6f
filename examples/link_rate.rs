//! The rate of gpucr's migration link alone: chunks of 1 MiB, each with its xxh3 (checked
//! on arrival), through the same mutual TLS and framing as `gpucr migrate`, with no disk
//! and no CRIU on either side. The ceiling a migration's transfer can reach on a given
//! machine and link (`scripts/bench-migrate.sh` runs it beside iperf3).
//!
//! * `receive ADDR:PORT --key K --cert C --peer-cert P`: accept one connection, read
//!   chunks until the sender's Done, print the bytes and the rate, answer Done.
//! * `send ADDR:PORT --mib N --key K --cert C --peer-cert P`: send N MiB of chunks, then
//!   Done, and wait for the receiver's.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpucr::migrate::link::{Incoming, Link, CHUNK_SIZE};
use gpucr::migrate::message::Control;
use gpucr::migrate::{tls, IdentityFiles};

#[derive(Parser)]
#[command(about = "The rate of gpucr's migration link, without disk")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Receive {
        address: String,
        #[command(flatten)]
        identity: Identity,
    },
    Send {
        address: String,
        #[arg(long)]
        mib: u64,
        #[command(flatten)]
        identity: Identity,
    },
}

#[derive(clap::Args)]
struct Identity {
    #[arg(long)]
    key: PathBuf,
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    peer_cert: PathBuf,
}

impl Identity {
    fn files(&self) -> IdentityFiles {
        IdentityFiles {
            key: self.key.clone(),
            cert: self.cert.clone(),
            peer_cert: self.peer_cert.clone(),
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn prepare(tcp: &TcpStream) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(TIMEOUT))?;
    tcp.set_write_timeout(Some(TIMEOUT))?;
    tcp.set_nodelay(true)
}

fn receive(address: &str, identity: &Identity) -> Result<(), Box<dyn std::error::Error>> {
    let identity = identity.files().load()?;
    let (tcp, peer) = TcpListener::bind(address)?.accept()?;
    prepare(&tcp)?;
    let mut link = Link::new(
        Box::new(tls::accept(tcp, &identity)?),
        peer.to_string(),
        TIMEOUT,
    );
    let mut bytes = 0u64;
    let mut started = None;
    loop {
        match link.receive()? {
            Incoming::Chunk { digest, data } => {
                started.get_or_insert_with(Instant::now);
                if !Link::chunk_intact(digest, data) {
                    return Err(format!("chunk at byte {bytes} damaged").into());
                }
                bytes += data.len() as u64;
            }
            Incoming::Control(Control::Done) => break,
            Incoming::Control(other) => return Err(format!("unexpected {other:?}").into()),
        }
    }
    let seconds = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    // The sender waits for this before it closes: a socket closed with data unread (the
    // TLS session tickets) is reset, and what it sent last could be lost.
    link.send(&Control::Done)?;
    println!(
        "{bytes} bytes in {seconds:.3} s: {:.0} MB/s",
        bytes as f64 / 1e6 / seconds.max(1e-9)
    );
    Ok(())
}

fn send(address: &str, mib: u64, identity: &Identity) -> Result<(), Box<dyn std::error::Error>> {
    let identity = identity.files().load()?;
    let tcp = TcpStream::connect(address)?;
    prepare(&tcp)?;
    let mut link = Link::new(
        Box::new(tls::connect(tcp, &identity)?),
        address.to_owned(),
        TIMEOUT,
    );
    // Not zeros: bytes a page of memory could hold, the same for every chunk.
    let chunk: Vec<u8> = (0..CHUNK_SIZE).map(|i| (i * 31 % 251) as u8).collect();
    let chunks = (mib << 20).div_ceil(CHUNK_SIZE as u64);
    for _ in 0..chunks {
        link.send_chunk(&chunk)?;
    }
    link.send(&Control::Done)?;
    match link.receive_control()? {
        Control::Done => Ok(()),
        other => Err(format!("unexpected {other:?}").into()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.command {
        Command::Receive { address, identity } => receive(address, identity),
        Command::Send {
            address,
            mib,
            identity,
        } => send(address, *mib, identity),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("link_rate: {e}");
            ExitCode::FAILURE
        }
    }
}
