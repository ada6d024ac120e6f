//! Why a restore failed, said so that the user knows what to do.

use std::path::{Path, PathBuf};

use crate::criu::{CriuConfigError, CriuError};
use crate::exit_code::{self, ExitCode};
use crate::gpu::GpuError;
use crate::helper::HelperError;
use crate::image::dir::{ImageDirError, ImagePath};
use crate::image::manifest::{Manifest, ManifestError};
use crate::image::verify::{Problem, VerifyError};
use crate::image::workdir::WorkDirError;
use crate::interrupt;
use crate::transfer::{ChunkProblem, TransferError};

/// Why a restore failed. No restored process is left behind in any case.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{dir}: no such image directory")]
    NoDir { dir: PathBuf },
    #[error("{dir}: {}", not_a_directory(*.found))]
    NotADirectory { dir: PathBuf, found: ImagePath },
    #[error("{}: the image is incomplete: {reason}", .dir.display())]
    Incomplete { dir: PathBuf, reason: String },
    #[error(transparent)]
    Manifest(ManifestError),
    #[error("{}", damaged_message(.dir, .problems))]
    Damaged {
        dir: PathBuf,
        problems: Vec<Problem>,
    },
    #[error("{}", damaged_gpu_message(.dir, .problems))]
    GpuDamaged {
        dir: PathBuf,
        problems: Vec<ChunkProblem>,
    },
    #[error("{}: refusing to restore the image: {source}", .dir.display())]
    GpuImage { dir: PathBuf, source: TransferError },
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    ImageDir(#[from] ImageDirError),
    #[error(transparent)]
    WorkDir(#[from] WorkDirError),
    #[error(transparent)]
    Criu(#[from] CriuError),
    #[error(transparent)]
    CriuConfig(#[from] CriuConfigError),
    #[error("{error}\n  {advice}")]
    CriuAdvised {
        error: Box<CriuError>,
        /// What may overcome the failure (see [`advise`]).
        advice: String,
    },
    #[error("{}: option {field} has the unknown value {value:?}", .manifest.display())]
    BadOption {
        manifest: PathBuf,
        field: &'static str,
        value: String,
    },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{}: {source}", .manifest.display())]
    GpuSection {
        manifest: PathBuf,
        source: crate::image::gpu::GpuSectionError,
    },
    #[error("{}: the device state of gpu.tasks[{task}] has {source}; refusing to restore an image that would create or open files there", .manifest.display())]
    UnsafePath {
        manifest: PathBuf,
        task: usize,
        source: crate::gpu::OutsideRoot,
    },
    #[error("{0}\n  the restore was aborted before any restored task ran")]
    Helper(Box<HelperError>),
    #[error("the GPUs of this machine cannot hold the image; nothing was restored\n{0}")]
    Topology(Box<gpucr_topology::Report>),
    #[error("cannot read this machine's GPU topology")]
    TopologyRead(#[from] gpucr_topology::TopologyError),
    #[error("interrupted by {signal}: nothing was restored (CRIU removed what it had begun)")]
    Interrupted { signal: &'static str },
    #[error("GPUCR_LAZY_STAGING={value:?}: this gpucr knows \"fill\" (the default) and \"lazy\"")]
    LazyStaging { value: String },
    #[error("{0}\n  the restored tree was killed: no task may wait for ever on its memory")]
    Lazy(#[from] crate::lazy::LazyError),
    #[error(
        "{error}\n  CRIU's log of this restore is kept in {} (the image directory is not \
         writable); the next restore of this image removes it",
        .dir.display()
    )]
    LogKept {
        error: Box<RestoreError>,
        /// The private work directory holding CRIU's log and statistics.
        dir: PathBuf,
    },
    #[error(
        "pid {pid} of the image's tree is in use on this machine ({holder}): CRIU gives a \
         restored tree its own pids, so they must be free (a tree dumped in a PID namespace \
         of its own, as in a container, gets a new namespace and never collides). End that \
         process, or wait for it to exit, and restore again; nothing was restored\n{criu}"
    )]
    PidTaken {
        pid: i32,
        holder: String,
        /// CRIU's failure, shown in full inside the message (not as its cause, which
        /// would print it twice).
        criu: Box<CriuError>,
    },
}

/// A CRIU restore that failed because a pid of the tree is taken ("Can't fork for PID:
/// File exists") becomes [`RestoreError::PidTaken`], naming what holds the pid.
pub(super) fn pid_taken(error: CriuError) -> RestoreError {
    let text = error.to_string();
    let pid = text.split("Can't fork for ").nth(1).and_then(|rest| {
        let (pid, after) = rest.split_once(':')?;
        after
            .trim_start()
            .starts_with("File exists")
            .then(|| pid.trim().parse::<i32>().ok())?
    });
    let Some(pid) = pid else {
        return RestoreError::Criu(error);
    };
    RestoreError::PidTaken {
        pid,
        holder: pid_holder(pid),
        criu: Box::new(error),
    }
}

/// A failed CRIU restore, with advice where a CRIU option may overcome it: one CRIU's
/// message names, or, when this restore was given none (`configured` false), the ones
/// the dump took from its `--criu-config` file, which a restore does not reuse.
pub(super) fn advise(error: CriuError, manifest: &Manifest, configured: bool) -> RestoreError {
    let text = error.to_string();
    let advice = crate::criu::advice_for(&text).or_else(|| {
        let dumped = manifest
            .options
            .criu_config
            .as_ref()
            .filter(|c| !configured && !c.options.is_empty())?;
        Some(format!(
            "the dump took CRIU options from {} ({}); a restore does not reuse them: give \
             it those it needs with --criu-config",
            dumped.file,
            dumped.options.join("; ")
        ))
    });
    match advice {
        Some(advice) => RestoreError::CriuAdvised {
            error: Box::new(error),
            advice,
        },
        None => RestoreError::Criu(error),
    }
}

/// What holds `pid` now, for a message: its command name and state.
fn pid_holder(pid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
    match (stat.find('('), stat.rfind(')')) {
        (Some(open), Some(close)) if open < close => {
            let comm = &stat[open + 1..close];
            match stat[close + 1..].split_whitespace().next() {
                Some("Z") => format!("{comm}, exited and not yet reaped by its parent"),
                _ => format!("by {comm}"),
            }
        }
        _ => "by a process that has exited since".to_owned(),
    }
}

impl ExitCode for RestoreError {
    fn exit_code(&self) -> u8 {
        match self {
            RestoreError::NoDir { .. } | RestoreError::Incomplete { .. } => {
                exit_code::IMAGE_INCOMPLETE
            }
            RestoreError::Manifest(e) => e.exit_code(),
            RestoreError::Damaged { .. }
            | RestoreError::NotADirectory { .. }
            | RestoreError::Verify(_)
            | RestoreError::BadOption { .. }
            | RestoreError::UnsafePath { .. }
            | RestoreError::GpuSection { .. }
            | RestoreError::GpuDamaged { .. } => exit_code::IMAGE_DAMAGED,
            RestoreError::GpuImage { source, .. } => source.exit_code(),
            RestoreError::ImageDir(e @ ImageDirError::InUse { .. }) => e.exit_code(),
            RestoreError::ImageDir(_) => exit_code::FAILURE,
            RestoreError::WorkDir(e) => e.exit_code(),
            RestoreError::Criu(e) => e.exit_code(),
            RestoreError::CriuConfig(e) => e.exit_code(),
            RestoreError::CriuAdvised { error, .. } => error.exit_code(),
            RestoreError::PidTaken { criu, .. } => criu.exit_code(),
            RestoreError::LogKept { error, .. } => error.exit_code(),
            RestoreError::Gpu(e) => restored_gpu_code(e),
            RestoreError::TopologyRead(_) => exit_code::FAILURE,
            RestoreError::Topology(_) => exit_code::TOPOLOGY_INCOMPATIBLE,
            RestoreError::Interrupted { .. } => exit_code::INTERRUPTED,
            RestoreError::Lazy(e) => e.exit_code(),
            RestoreError::LazyStaging { .. } => exit_code::USAGE,
            RestoreError::Helper(e) => match e.as_ref() {
                HelperError::Gpu(e) => restored_gpu_code(e),
                other => other.exit_code(),
            },
        }
    }
}

/// The exit code of a backend's error in a restore: device state of the image that does
/// not parse is damage; a device or driver failing is the backend's own code.
fn restored_gpu_code(e: &GpuError) -> u8 {
    match e {
        GpuError::Malformed { .. } => exit_code::IMAGE_DAMAGED,
        e => e.exit_code(),
    }
}

/// Why a path that exists is no image directory.
fn not_a_directory(found: ImagePath) -> &'static str {
    match found {
        ImagePath::File => {
            "not an image directory (a file); a container checkpoint archive is restored by \
             the engine that made it (podman container restore --import ARCHIVE)"
        }
        _ => "not an image directory (neither a directory nor a file)",
    }
}

fn damaged_message(dir: &Path, problems: &[Problem]) -> String {
    let mut text = format!(
        "{}: the image is damaged; refusing to restore it",
        dir.display()
    );
    for p in problems {
        text.push_str(&format!("\n  {p}"));
    }
    text
}

fn damaged_gpu_message(dir: &Path, problems: &[ChunkProblem]) -> String {
    let mut text = format!(
        "{}: the image's GPU memory is damaged; refusing to restore it",
        dir.display()
    );
    for p in problems {
        text.push_str(&format!("\n  {p}"));
    }
    text
}

/// The error for a restore a signal stopped.
pub(super) fn interrupted() -> RestoreError {
    RestoreError::Interrupted {
        signal: interrupt::requested().map_or("a signal", interrupt::name),
    }
}
