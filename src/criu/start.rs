//! Starting CRIU for one dump or restore, and the log level both ask CRIU for.

use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::sys::utsname::uname;

use super::{check_supported, locate, CriuError, CriuVersion, Swrk};
use crate::progress::Progress;

/// Start `criu swrk` with `env` and the `inherit`ed descriptors, check its version and
/// print the socket warning where it applies.
pub fn start_criu(
    explicit: Option<&Path>,
    env: &[(OsString, OsString)],
    inherit: &[BorrowedFd<'_>],
    progress: &mut Progress,
) -> Result<(Swrk, CriuVersion), CriuError> {
    let path = locate(explicit)?;
    let mut swrk = Swrk::spawn(&path, env, inherit)?;
    let version = swrk.version()?;
    let kernel = uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(warning) = check_supported(&path, version, &kernel)? {
        progress.warn(&warning);
    }
    progress.event("criu-started", &format!("CRIU {version} started"));
    Ok((swrk, version))
}

/// CRIU's log level: 2 (errors and warnings), or 4 (debug) with -v or whenever gpucr's
/// plugin is in use, so the log shows the plugin loading and each hook it answers.
pub fn criu_log_level(verbose: bool, plugin: bool) -> i32 {
    if verbose || plugin {
        4
    } else {
        2
    }
}
