//! Engine mode: the helper process that gpucr's plugin starts itself when CRIU was
//! started by a container engine (podman, CRI-O, containerd through runc), not by gpucr.
//!
//! The plugin runs `gpucr engine-helper dump|restore` with the helper's end of a
//! socketpair it made (fd 3, the connector) and the write end of a status pipe (fd 4).
//! The helper detaches at once (CRIU must never see it as a child), sets up the same
//! helper `gpucr dump` and `gpucr restore` use, says `ready BACKEND` (or `none`, or
//! `error MESSAGE`) on the status pipe, and then serves the plugin until the plugin's
//! last engine step ([`gpucr_abi::proto::EngineStep`]). GPU memory, the device state and
//! the manifest go into CRIU's own image directory, so they travel inside the engine's
//! checkpoint archive.
//!
//! Settings come from the environment the plugin gives it: CRIU's own, completed by the
//! settings file beside the installed plugin (`gpucr_plugin.conf`, see
//! docs/containers.md).

mod dump;
mod events;
mod restore;
mod settings;
mod status;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

pub use settings::{check_setting, EngineSettings, SettingsError};
pub use status::StatusPipe;

use crate::exit_code;

use gpucr_abi::engine::{CONNECTOR_FD, STATUS_FD};

/// Why engine mode could not serve a dump or a restore (said on the status pipe, so
/// that the plugin fails CRIU's hook with it, and so CRIU's log and the engine's error
/// show it).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Dump(#[from] crate::dump::DumpError),
    #[error(transparent)]
    Restore(#[from] crate::restore::RestoreError),
    #[error(transparent)]
    Helper(#[from] crate::helper::HelperError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot detach from CRIU: {0}")]
    Detach(nix::Error),
}

/// What CRIU is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineStage {
    Dump,
    Restore,
}

/// The one dump or restore a helper serves, as the plugin started it.
#[derive(Debug, Clone)]
pub struct EngineRun {
    pub stage: EngineStage,
    /// CRIU's image directory.
    pub images_dir: PathBuf,
    /// The CRIU process (the helper ends when it does).
    pub criu_pid: i32,
    /// The root of the dumped tree (dump only).
    pub pid: Option<i32>,
}

/// `gpucr engine-helper`: detach, then serve one dump or one restore; the exit code.
/// What went wrong goes to the plugin on the status pipe.
pub fn run(args: &EngineRun) -> u8 {
    // SAFETY: fds 3 and 4 are the connector and the status pipe the plugin put there
    // (checked below before use); nothing else in this process owns them.
    let (connector, status) = unsafe {
        (
            OwnedFd::from_raw_fd(CONNECTOR_FD),
            OwnedFd::from_raw_fd(STATUS_FD),
        )
    };
    // Nothing this helper starts (the CUDA give-back guard, `criu --version`) may keep
    // them: the plugin reads the status pipe to its end, and a guard that held it open
    // would keep CRIU waiting until its own timeout.
    for fd in [&connector, &status] {
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
    let mut status = StatusPipe::new(status);
    if let Err(e) = detach(args.criu_pid) {
        status.error(&e.to_string());
        return exit_code::FAILURE;
    }
    let result = match args.stage {
        EngineStage::Dump => dump::serve(args, connector, &mut status),
        EngineStage::Restore => restore::serve(args, connector, &mut status),
    };
    match result {
        Ok(()) => exit_code::SUCCESS,
        Err(e) => {
            status.error(&e.to_string());
            exit_code::FAILURE
        }
    }
}

/// Leave CRIU's process tree: fork, the parent (CRIU's child) exits at once, the child
/// goes on in a session of its own. CRIU reaps the exiting parent; a restore's CRIU
/// would take any child of its own that exits later for a restored task that died.
/// The new session keeps the CPU weight of CRIU's (its autogroup's nice value), so the
/// copy runs at the priority the engine runs CRIU at.
fn detach(criu_pid: i32) -> Result<(), EngineError> {
    // SAFETY: called first thing in `engine-helper`, while this process has one thread,
    // so the child may do anything.
    match unsafe { nix::unistd::fork() }.map_err(EngineError::Detach)? {
        nix::unistd::ForkResult::Parent { .. } => std::process::exit(0),
        nix::unistd::ForkResult::Child => {
            nix::unistd::setsid().map_err(EngineError::Detach)?;
            // Best effort: a kernel without autogroups has nothing to follow.
            let _ = crate::niceness::follow_autogroup_of(criu_pid);
            Ok(())
        }
    }
}

/// How long the helper waits, after answering the plugin's last step, for that answer
/// to be sent before it ends (the send itself takes microseconds).
const LAST_REPLY_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Say on stderr (which goes to `GPUCR_ENGINE_LOG` where that is set) how long the
/// answer to `step` took and what it was.
fn log_step(
    step: gpucr_abi::proto::engine_step::Step,
    started: std::time::Instant,
    answer: &Result<(), String>,
) {
    crate::errln!(
        "gpucr engine-helper: {step:?} answered in {:.1} ms: {}",
        started.elapsed().as_secs_f64() * 1e3,
        answer.as_ref().map_or_else(|e| e.as_str(), |()| "ok")
    );
}

/// CRIU's version, from its binary (`/proc/PID/exe --version`).
fn criu_version(criu_pid: i32) -> String {
    std::process::Command::new(format!("/proc/{criu_pid}/exe"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("Version:").map(|v| v.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown".into())
}
