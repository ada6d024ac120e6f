//! The action scripts CRIU is running (`--criu-config`'s `action-script`), found and
//! ended when a user who interrupted gpucr asks again.
//!
//! CRIU runs each action script as a child of its own (`cr_system`), with the stage in
//! its environment (`CRTOOLS_SCRIPT_ACTION`), and waits for it however long it takes.
//! An interrupted gpucr can only answer CRIU at its next report, so a script that hangs
//! would keep the tree as it is (frozen, after `network-lock`) until it ends. A script
//! that is killed fails its stage, and CRIU rolls back as for any failed stage: the
//! dumped tree runs on, a half-restored one is killed.

use gpucr_abi::procfs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The environment variable CRIU sets for an action script: the stage it runs at.
const ACTION_VARIABLE: &[u8] = b"CRTOOLS_SCRIPT_ACTION=";

/// An action script CRIU is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningScript {
    pub pid: i32,
    /// Its command line as it is now: the script CRIU started (a script with a `#!`
    /// line after its interpreter, `/bin/sh /etc/criu/lock.sh`), or what the script
    /// went on to run in its stead (`exec`).
    pub command: String,
    /// The stage it runs at ("pre-dump", "network-lock", ...).
    pub action: String,
}

/// The action scripts `criu` (CRIU's pid) is running now: those of its children whose
/// environment names a stage.
pub fn running(criu: i32) -> Vec<RunningScript> {
    procfs::children(criu)
        .into_iter()
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let action = action_of(&environ)?;
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .map(|argv| command_line(&argv))
                .filter(|c| !c.is_empty())
                .or_else(|| {
                    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
                    Some(exe.display().to_string())
                })
                .unwrap_or_default();
            Some(RunningScript {
                pid,
                command,
                action,
            })
        })
        .collect()
}

/// End `script` and whatever it started (SIGKILL to each), so that CRIU, which waits for
/// the script alone, goes on and whatever the script left behind does not linger.
pub fn end(script: &RunningScript) {
    for pid in procfs::tree_pids(script.pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// The stage in a `/proc/PID/environ` text (NUL-separated `NAME=value` entries), if it
/// is an action script's.
fn action_of(environ: &[u8]) -> Option<String> {
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(ACTION_VARIABLE))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}

/// A `/proc/PID/cmdline` text (NUL-terminated arguments) as one line, the arguments
/// separated by spaces.
fn command_line(cmdline: &[u8]) -> String {
    cmdline
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_is_read_from_the_environment() {
        let environ = b"PATH=/usr/bin\0CRTOOLS_SCRIPT_ACTION=network-lock\0CRTOOLS_INIT_PID=7\0";
        assert_eq!(action_of(environ).as_deref(), Some("network-lock"));
        assert_eq!(
            action_of(b"PATH=/usr/bin\0XCRTOOLS_SCRIPT_ACTION=x\0"),
            None
        );
        assert_eq!(action_of(b""), None);
        assert_eq!(
            command_line(b"/bin/sh\0/etc/criu/lock.sh\0"),
            "/bin/sh /etc/criu/lock.sh"
        );
        assert_eq!(command_line(b""), "");
    }

    /// A child running with the stage in its environment is found, and ending it ends
    /// what it started too; a child without it is left alone.
    #[test]
    fn a_running_script_is_found_and_ended_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let script = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 60 & echo $! > {}; wait", started.display()))
            .env("CRTOOLS_SCRIPT_ACTION", "post-dump")
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let sleeper: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&started)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the script did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let me = std::process::id() as i32;
        let found = running(me);
        let ours: Vec<&RunningScript> = found
            .iter()
            .filter(|s| s.pid == script.id() as i32)
            .collect();
        assert_eq!(ours.len(), 1, "{found:?}");
        assert_eq!(ours[0].action, "post-dump");
        assert!(
            ours[0].command.starts_with("sh -c sleep 60 &"),
            "{:?}",
            ours[0].command
        );
        assert!(!found.iter().any(|s| s.pid == other.id() as i32));
        end(ours[0]);
        let status = {
            let mut script = script;
            script.wait().unwrap()
        };
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        let exited = crate::wait::pidfd::exited_within(sleeper, std::time::Duration::from_secs(10));
        assert!(
            exited.unwrap() && procfs::has_exited(sleeper),
            "the script's child lives on"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
