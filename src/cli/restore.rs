//! `gpucr restore DIR`.

use std::path::PathBuf;

use clap::Args;

use super::common::{parse_size, CriuArgs, OutputArgs, TransferArgs};

/// Restore a process tree from an image directory.
///
/// Refuses a missing, incomplete or damaged image before CRIU starts: the manifest is
/// read and every file's size and checksum verified. The options the image needs
/// (tcp-established, shell-job, ext-unix-sk, file-locks) come from the manifest; the
/// flags below force them on. The network is locked the way the dump locked it (CRIU
/// reads the method from the image). By default gpucr waits for the restored
/// tree, like `criu restore`, and exits with its status; --detach prints the new root
/// pid and returns at once. NVIDIA GPUs are restored onto the local GPUs
/// `check-topology DIR` shows, limited to those `CUDA_VISIBLE_DEVICES` names when it is
/// set (see `gpucr check-topology --help`).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct RestoreArgs {
    /// The image directory written by `gpucr dump`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Print the restored root pid and return instead of waiting for the tree.
    #[arg(short, long)]
    pub detach: bool,

    /// Restore established TCP connections (on by default when the image has them).
    #[arg(long)]
    pub tcp_established: bool,

    /// Restore as a shell job (on by default when the image was dumped as one).
    #[arg(long)]
    pub shell_job: bool,

    /// Allow unix sockets connected to peers outside the tree.
    #[arg(long)]
    pub ext_unix_sk: bool,

    /// Restore file locks.
    #[arg(long)]
    pub file_locks: bool,

    /// Hash every image file, and check every GPU memory chunk against the GPU index,
    /// before CRIU starts. By default the memory pages are hashed and the GPU chunks
    /// checked while CRIU restores, and the tree is resumed only once they are verified.
    #[arg(long)]
    pub verify_first: bool,

    /// Memory for GPU data read ahead of its buffers (binary units: 512M, 2G).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub max_staging: u64,

    /// Read GPU memory only once each task's buffers exist and fill them before the task
    /// goes on (CRIU 4.1's sequential way; for comparison). By default gpucr streams
    /// the image from the start while CRIU restores the rest.
    #[arg(long)]
    pub no_parallel_restore: bool,

    /// Restore CPU memory on demand: the tree resumes before its memory is back, and
    /// gpucr serves each page as it is touched while streaming the rest in the
    /// background, every block checked against the image's checksums first. Waiting,
    /// gpucr reports when all memory is in; with --detach it returns once the tree runs
    /// and a helper of its own serves the rest, its output going to the log (with
    /// --json, the report waits until all memory is in). A guard process holds the
    /// tasks' userfaultfds, so that a gpucr killed outright leaves no page to read as
    /// zeros: it kills the tree instead. Whenever serving fails (a damaged block: exit 7;
    /// Ctrl-C or SIGTERM: exit 130; gpucr killed) the tree is killed and the reason
    /// written to lazy-pages.log in the image directory (named on stderr). GPU memory is
    /// restored as without --lazy, and the tree resumes once it is back (CUDA host
    /// staging: once the processes' memory is in).
    #[arg(long)]
    pub lazy: bool,

    #[command(flatten)]
    pub transfer: TransferArgs,

    #[command(flatten)]
    pub topology: super::TopologyCheckArgs,

    #[command(flatten)]
    pub criu: CriuArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}
