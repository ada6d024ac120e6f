//! `gpucr dump PID DIR`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::common::{CriuArgs, OutputArgs, TransferArgs, TreeDumpArgs};
use crate::transfer::Compression;

/// Checkpoint a process tree into an image directory.
///
/// Freezes PID and all its descendants, dumps them through CRIU into DIR and writes the
/// manifest `DIR/gpucr.json` last. DIR is created with mode 0700 (it holds process
/// memory); an existing DIR must be empty unless --force is given, and no other dump may
/// be writing into it (refused with exit 6, even with --force). Unless
/// --leave-running or --leave-stopped is given, the tree is killed after a successful
/// dump. If the dump
/// fails, the tree keeps running and DIR is marked incomplete (`gpucr-incomplete.json`).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = super::EXIT_STATUS_HELP)]
pub struct DumpArgs {
    /// The root of the process tree to checkpoint.
    #[arg(value_name = "PID", value_parser = parse_pid)]
    pub pid: i32,

    /// The image directory to write.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Keep the tree running after the dump instead of killing it. GPU tasks get their
    /// devices back after the image is complete; if that fails, the image is kept and
    /// gpucr exits 10 naming the task and the failure.
    #[arg(long)]
    pub leave_running: bool,

    /// Keep the tree after the dump, stopped: every task takes SIGSTOP while CRIU still
    /// holds it, so none runs an instruction between the image and the stop, and CRIU
    /// lets it go with its network unlocked. `kill -CONT` to each task lets it run on
    /// (as after --leave-running); kill it once its image is restored elsewhere. A
    /// failed dump leaves the tree running, but for tasks already stopped before it.
    #[arg(long, conflicts_with = "leave_running")]
    pub leave_stopped: bool,

    #[command(flatten)]
    pub tree: TreeDumpArgs,

    /// Record CRIU's memory pages files (pages-*.img) in the manifest by their size
    /// only, not their checksum: the dump then reads no page a second time while the
    /// tree is frozen (it otherwise digests every page from the tree's memory while
    /// CRIU copies it; in engine mode, from the file CRIU writes, which on a machine
    /// with few cores slows CRIU's memory dump: docs/benchmarks.md). A restore and
    /// `inspect --verify` then check those files' sizes, not their contents; every
    /// other file keeps its checksum.
    #[arg(
        long,
        env = gpucr_abi::engine::ENV_NO_PAGE_CHECKSUMS,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_page_checksums: bool,

    /// Write into DIR even when it is not empty: a previous image's files are removed,
    /// and a DIR that also holds anything else is refused with nothing removed.
    #[arg(long)]
    pub force: bool,

    /// How GPU memory is stored: none, zstd (level 1) or zstd:LEVEL. Chunks that do not
    /// compress are stored raw either way, and all-zero chunks are not stored.
    #[arg(long, value_name = "METHOD", env = gpucr_abi::engine::ENV_COMPRESS, default_value = "zstd")]
    pub compress: Compression,

    /// How a CUDA process's GPU memory is moved: host (the driver stages it in the
    /// process's memory, which CRIU dumps) or custom (the driver maps it into gpucr,
    /// which copies it into DIR/gpu like any GPU memory; CUDA 13.4 drivers)
    /// [default: custom where the driver offers it, else host].
    #[arg(long, value_enum, value_name = "HOW")]
    pub cuda_staging: Option<CudaStagingArg>,

    #[command(flatten)]
    pub transfer: TransferArgs,

    #[command(flatten)]
    pub criu: CriuArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// A process id: a number from 1 up (0 and negative numbers never name a process).
pub(super) fn parse_pid(text: &str) -> Result<i32, String> {
    match text.trim().parse::<i64>() {
        Ok(pid) if pid >= 1 => i32::try_from(pid).map_err(|_| "not a process id: too large".into()),
        Ok(_) => Err("no process has this id: process ids are numbers from 1 up".into()),
        Err(_) => Err("not a process id: expected a number from 1 up".into()),
    }
}

/// `--cuda-staging`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaStagingArg {
    /// the driver stages GPU memory in the process's own memory, which CRIU dumps.
    Host,
    /// the driver maps GPU memory into gpucr, which copies it into DIR/gpu.
    Custom,
}

impl CudaStagingArg {
    /// The backend's setting.
    pub fn staging(self) -> crate::gpu::cuda::Staging {
        match self {
            CudaStagingArg::Host => crate::gpu::cuda::Staging::Host,
            CudaStagingArg::Custom => crate::gpu::cuda::Staging::Custom,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<i32, clap::Error> {
        match Cli::try_parse_from(args)?.command {
            Command::Dump(args) => Ok(args.pid),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn a_pid_is_a_number_from_1_up() {
        assert_eq!(parse(&["gpucr", "dump", "4242", "d"]).unwrap(), 4242);
        for bad in ["0", "-5", "2147483648", "abc", ""] {
            let err = parse(&["gpucr", "dump", "--", bad, "d"]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert_eq!(err.exit_code(), 2, "{bad}");
        }
        let err = parse(&["gpucr", "dump", "0", "d"]).unwrap_err().to_string();
        assert!(err.contains("from 1 up"), "{err}");
    }
}
