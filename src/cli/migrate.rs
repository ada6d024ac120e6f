//! `gpucr migrate PID HOST[:PORT]`, `gpucr receive` and `gpucr keygen NAME`.

use std::path::PathBuf;

use clap::Args;

use super::check_topology::TopologyCheckArgs;
use super::common::{CriuArgs, OutputArgs, TransferArgs, TreeDumpArgs};

/// This side's key and certificate, and the other side's certificate.
#[derive(Debug, Clone, Args)]
pub struct IdentityArgs {
    /// This side's private key (PEM, mode 0600: a key others may read is refused), as
    /// `gpucr keygen` writes it.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,

    /// This side's certificate (PEM), the one the other side was given as its
    /// --peer-cert. It must hold --key's public half: a certificate of another key is
    /// refused (exit 2) before anything is connected or listened on.
    #[arg(long, value_name = "FILE")]
    pub cert: PathBuf,

    /// The other side's certificate (PEM): the only one accepted. A peer that does not
    /// present it, or cannot sign with its key, is refused during the TLS handshake,
    /// before anything else is read.
    #[arg(long, value_name = "FILE")]
    pub peer_cert: PathBuf,
}

/// Move a running process tree to another machine (stop-and-copy, or --post-copy).
///
/// Connects to `gpucr receive` on HOST (mutual TLS: each side pins the other's
/// certificate), offers the job's GPU backend and the GPUs of this machine the running
/// job holds open (all of them when its backend finds none), and stops with exit 9,
/// the job untouched, when the destination's GPUs cannot hold it.
/// Then dumps the tree into a private staging directory (0700, removed at the end),
/// the tree left stopped. Stop-and-copy sends the memory pages and the GPU data as
/// they are dumped, each part punched out of the staging file once sent, then the
/// rest of the image;
/// every chunk is checked on arrival, and the destination restores the image as every
/// restore does. Only once the destination has
/// restored the tree does this side give its copy up (commit); it kills it when the
/// destination says the job runs there.
///
/// Any failure before the commit (the link cut or silent for --link-timeout, the
/// receiver refusing, its disk full, its restore failing) lets the job run on here
/// (exit 12). A link lost after the commit leaves this side's copy stopped and exits
/// 13: the job runs on the destination if the commit arrived. The staging directory
/// holds the image but its memory pages and GPU data while it is sent. With
/// --post-copy, the memory pages go through gpucr's page server, which keeps on this
/// disk only what the stopped copy cannot serve; a job whose devices' give-back would
/// change its memory (CUDA) keeps them as the dump left them until the move is
/// decided, and gets them back only if it runs on here (docs/migration.md).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct MigrateArgs {
    /// The root of the process tree to move.
    #[arg(value_name = "PID", value_parser = super::dump::parse_pid)]
    pub pid: i32,

    /// The destination: where `gpucr receive` listens (port 7431 when none is given;
    /// an IPv6 address with a port as [ADDR]:PORT).
    #[arg(value_name = "HOST[:PORT]")]
    pub to: String,

    #[command(flatten)]
    pub identity: IdentityArgs,

    /// Give up when the link stays silent for SECS seconds, or a connection takes
    /// longer (each side tells the other it is still working while it dumps or
    /// restores).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub link_timeout: u32,

    /// Where the staging directory is made (default: the temporary directory).
    #[arg(long, value_name = "DIR")]
    pub staging: Option<PathBuf>,

    /// Post-copy: the destination runs the job as soon as everything but its CPU
    /// memory is there (its GPU memory included), and pulls each block of memory from
    /// this side when the job first touches it, while the rest streams in behind;
    /// every block is checked against the image's checksums before the job sees it.
    /// The downtime no longer grows with the job's memory. This side keeps its stopped
    /// copy until every page is in there, then kills it. Once the destination runs the
    /// job, the job cannot be saved if the link drops: the destination kills its tree
    /// (its memory can no longer come), and this side's copy stays stopped (exit 13).
    #[arg(long)]
    pub post_copy: bool,

    /// Carry the memory pages and the GPU data on N connections in parallel beside
    /// the control connection (each authenticated as it is; the receiver grants at
    /// most 8). Each connection sends, checks and writes its own chunks, so more of
    /// them keep more cores busy on a fast link.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub lanes: u32,

    /// How the GPU memory crosses: none, zstd (level 1) or zstd:LEVEL, as `gpucr dump
    /// --compress` stores it (the image on the destination keeps it so). zstd sends
    /// fewer bytes at the cost of the source's and the destination's CPU: on a link
    /// faster than the cores compress, none moves the job sooner.
    #[arg(long, value_name = "METHOD", env = gpucr_abi::engine::ENV_COMPRESS, default_value = "zstd")]
    pub compress: crate::transfer::Compression,

    #[command(flatten)]
    pub tree: TreeDumpArgs,

    #[command(flatten)]
    pub transfer: TransferArgs,

    #[command(flatten)]
    pub criu: CriuArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Receive a process tree `gpucr migrate` sends, and run it here.
///
/// Listens on --listen and serves one connection at a time: the TLS handshake (the
/// peer must present --peer-cert and sign with its key; anyone else is refused before
/// anything is read), the source's GPU topology checked as a restore checks an image's
/// (a mismatch is answered, and the source stops with exit 9), then the image, written
/// into a fresh directory (0700) beneath --dir, every path confined to it and every
/// chunk's checksum checked. The image is restored, verified as every restore verifies
/// an image (before any task runs), the tree left stopped; it runs once the source has
/// given its copy up. The image directory is kept (its path is printed); on any failure nothing restored
/// is left running and nothing received is kept.
///
/// Returns once a migration runs here, printing the tree's root pid; a connection that
/// comes to nothing is reported and the next awaited, unless --once is given.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct ReceiveArgs {
    /// The address and port to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:7431")]
    pub listen: String,

    /// The directory beneath which each migration's image directory is made.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    #[command(flatten)]
    pub identity: IdentityArgs,

    /// Give up a migration when the link stays silent for SECS seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub link_timeout: u32,

    /// Serve one connection, then exit with its outcome.
    #[arg(long)]
    pub once: bool,

    #[command(flatten)]
    pub topology: TopologyCheckArgs,

    #[command(flatten)]
    pub transfer: TransferArgs,

    #[command(flatten)]
    pub criu: CriuArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Make a key pair and a self-signed certificate for migrations.
///
/// Writes NAME.key (the private key, ECDSA P-256, mode 0600) and NAME.crt (its
/// certificate) into --dir; an existing file is never overwritten. Give each side its
/// own pair, and each side the other's certificate as --peer-cert.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct KeygenArgs {
    /// The name of the pair (and of the files).
    #[arg(value_name = "NAME", value_parser = key_name)]
    pub name: String,

    /// Where to write the files.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
}

/// A name that makes a file name: letters, digits, '-', '_' and '.', not starting with
/// a dot.
fn key_name(text: &str) -> Result<String, String> {
    let plain = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if text.is_empty() || text.starts_with('.') || !plain || text.len() > 64 {
        return Err("a name of letters, digits, '-', '_' and '.' (not first) is expected".into());
    }
    Ok(text.to_owned())
}
