//! `gpucr inspect DIR`.

use std::path::PathBuf;

use clap::Args;

use super::common::OutputArgs;

/// Show what is in an image directory or a container checkpoint archive, or verify it.
///
/// Without flags: a summary (gpucr and CRIU versions, host, kernel, time, backend,
/// target, whether the image is complete, its size, CPU and GPU memory sizes), then the
/// process tree. The flags add sections; --json prints all of them as one JSON object
/// (schema in docs/inspect.md). Works on any CRIU image directory; gpucr's manifest adds
/// the summary and the checksums.
///
/// With --verify: check every file against the manifest's sizes and checksums and every
/// CRIU image's structure (framing, pagemaps against pages files), print each problem
/// with its file and offset, and exit 0 (intact), 7 (damaged) or 8 (incomplete).
///
/// ARCHIVE: a checkpoint archive of podman (`podman container checkpoint --export`),
/// CRI-O or containerd (Kubernetes' checkpoint API), zstd, gzip or plain tar. It is read
/// as a stream, never unpacked to disk, in bounded memory; the container (name, id,
/// image, runtime, engine, from config.dump and spec.dump) is shown first, and the image
/// under checkpoint/ as for a directory. The JSON adds `container` (checkpointctl's field
/// names) and `archive`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct InspectArgs {
    /// The image directory, or a container checkpoint archive.
    #[arg(value_name = "DIR|ARCHIVE")]
    pub dir: PathBuf,

    /// Show the process tree (always shown; kept for checkpointctl users).
    #[arg(long)]
    pub ps_tree: bool,

    /// Show each process's argv, read from the dumped memory, instead of its name.
    #[arg(long)]
    pub ps_tree_cmd: bool,

    /// Show each process's environment, read from the dumped memory.
    #[arg(long)]
    pub ps_tree_env: bool,

    /// Show open files: every descriptor with its type and path, the cwd and root.
    #[arg(long)]
    pub files: bool,

    /// Show sockets: unix, TCP, UDP, netlink and packet, with addresses, ports, states
    /// and buffer and queue sizes.
    #[arg(long)]
    pub sockets: bool,

    /// Show the mounts of the tree's mount namespaces.
    #[arg(long)]
    pub mounts: bool,

    /// Show each process's memory mappings and how much of each was dumped.
    #[arg(long)]
    pub memory: bool,

    /// Show the GPU state: backend, devices, buffers, sizes and compression.
    #[arg(long)]
    pub gpu: bool,

    /// Show CRIU's dump (and restore) statistics and gpucr's phase timings.
    #[arg(long)]
    pub stats: bool,

    /// Show every section.
    #[arg(long)]
    pub all: bool,

    /// Show only process PID and its descendants (PID as in the image, inside the tree's
    /// PID namespace).
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Verify the image instead of showing it; the exit status says intact (0),
    /// damaged (7) or incomplete (8).
    #[arg(long)]
    pub verify: bool,

    #[command(flatten)]
    pub output: OutputArgs,
}
