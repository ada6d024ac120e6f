//! Starting CRIU for one dump or restore, and the log level both ask CRIU for.

use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::sys::utsname::uname;

use super::config::{default_config_files, unread_config_note, ConfigHandover};
use super::swrk::START_TIMEOUT;
use super::{check_supported, locate, CriuError, CriuVersion, Swrk};
use crate::progress::Progress;

/// Start `criu swrk` with `env`, the `inherit`ed descriptors and the checked options of
/// `--criu-config` (`config`), check its version and print the socket warning where it
/// applies. Without `config`, a note names CRIU's own config files that hold options:
/// the CRIU gpucr runs does not read them. A CRIU that does not answer within
/// [`START_TIMEOUT`], or a signal while it is awaited (gpucr's interrupt handling), kills
/// it and ends the start with an error.
pub fn start_criu(
    explicit: Option<&Path>,
    env: &[(OsString, OsString)],
    inherit: &[BorrowedFd<'_>],
    config: Option<&ConfigHandover>,
    progress: &mut Progress,
) -> Result<(Swrk, CriuVersion), CriuError> {
    let path = locate(explicit)?;
    let mut fds = inherit.to_vec();
    match config {
        Some(config) => fds.push(config.fd()),
        None => {
            if let Some(note) = unread_config_note(&default_config_files()) {
                progress.warn(&note);
            }
        }
    }
    let mut swrk = Swrk::spawn(&path, env, &fds)?;
    // Made before the first wait, so that no signal falls between the flags' reading
    // and the poll: each one wakes the waits for CRIU at once.
    match crate::interrupt::WakeFd::new() {
        Ok(wake) => swrk.wake_on(wake),
        Err(e) => progress.warn(&format!(
            "cannot make an eventfd for signals ({e}): gpucr looks for them every 50-200 ms"
        )),
    }
    // A hung binary must not hang gpucr, nor make it deaf to Ctrl-C: the first answer
    // is awaited for START_TIMEOUT at most, and a signal ends the wait at once.
    let version = swrk.version_within(START_TIMEOUT, &crate::interrupt::requested)?;
    swrk.watch_interrupts(crate::interrupt::requested, crate::interrupt::count);
    let kernel = uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(warning) = check_supported(&path, version, &kernel)? {
        progress.warn(&warning);
    }
    progress.event("criu-started", &format!("CRIU {version} started"));
    Ok((swrk, version))
}

/// CRIU's log level: 4 (debug) with -v; 3 (info) whenever gpucr's plugin is in use, so
/// the log shows each hook the plugin answers (it logs at info); else 2 (errors and
/// warnings). Not 4 by default: at debug level CRIU writes about 15 lines for each
/// piece of memory it moves (about 18,000 lines per GiB dumped, each its own write),
/// which cost a large GPU job's dump and restore hundreds of milliseconds.
pub fn criu_log_level(verbose: bool, plugin: bool) -> i32 {
    match (verbose, plugin) {
        (true, _) => 4,
        (false, true) => 3,
        (false, false) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::criu_log_level;

    #[test]
    fn the_log_level_follows_verbose_and_the_plugin() {
        assert_eq!(criu_log_level(false, false), 2);
        assert_eq!(criu_log_level(false, true), 3);
        assert_eq!(criu_log_level(true, false), 4);
        assert_eq!(criu_log_level(true, true), 4);
    }
}
