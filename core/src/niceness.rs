//! CPU priority of gpucr's own threads during a restore, and of engine mode's helper.
//!
//! While CRIU restores a tree, each of its phases is on the critical path. Work gpucr
//! does beside it that has slack until the buffers exist (checking and staging GPU
//! memory ahead of them) runs at a lower priority: on a machine with few cores it takes
//! the cycles CRIU leaves instead of slowing CRIU down. The threads that
//! feed the GPUs' copy engines run at a higher one: their CPU time is bounded by the
//! engines' rate, and time an engine spends waiting for them is lost for good.

use std::io;

/// The nice value of background threads (0 is the default, 19 the lowest priority).
pub const BACKGROUND_NICE: i32 = 10;

/// The nice value of the threads that feed copy engines (needs CAP_SYS_NICE, which a
/// restore has: CRIU needs root).
pub const FEEDER_NICE: i32 = -10;

/// Lower the calling thread's priority to [`BACKGROUND_NICE`], or leave it where it is
/// if it is lower already (on Linux, nice values belong to threads). Lowering a
/// priority needs no privilege.
pub fn run_in_background() -> io::Result<()> {
    if current_nice()? >= BACKGROUND_NICE {
        return Ok(());
    }
    set_nice(BACKGROUND_NICE)
}

/// Raise the calling thread's priority to [`FEEDER_NICE`], or leave it where it is if
/// it is higher already. Fails without CAP_SYS_NICE.
pub fn run_as_feeder() -> io::Result<()> {
    if current_nice()? <= FEEDER_NICE {
        return Ok(());
    }
    set_nice(FEEDER_NICE)
}

fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, this_thread()?, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's nice value.
pub fn current_nice() -> io::Result<i32> {
    let who = this_thread()?;
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes plain integers and touches no memory of ours.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, who) };
    match nix::errno::Errno::last_raw() {
        0 => Ok(nice),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Give this process's scheduling autogroup the nice value of `pid`'s.
///
/// With autogroup scheduling (Linux's default on desktops and many servers), a process
/// that starts a session of its own (`setsid`) also gets a CPU-share group of its own,
/// at nice 0, whatever the group it came from had. Engine mode's helper detaches from
/// the CRIU that started it that way; this keeps it at its CRIU's weight, so that an
/// engine run at a raised or lowered priority moves GPU memory at that priority too.
/// Fails where the kernel has no autogroups (no `/proc/PID/autogroup`); raising a
/// priority needs CAP_SYS_NICE.
pub fn follow_autogroup_of(pid: i32) -> io::Result<()> {
    copy_autogroup_nice(pid, "self")
}

/// Give the autogroup of `/proc/TO` (a pid, or `self`) the nice value of `from`'s.
fn copy_autogroup_nice(from: i32, to: &str) -> io::Result<()> {
    let theirs = std::fs::read_to_string(format!("/proc/{from}/autogroup"))?;
    let nice = autogroup_nice(&theirs).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{from}/autogroup: unexpected {:?}", theirs.trim()),
        )
    })?;
    let target = format!("/proc/{to}/autogroup");
    if autogroup_nice(&std::fs::read_to_string(&target)?) == Some(nice) {
        return Ok(());
    }
    std::fs::write(target, nice.to_string())
}

/// The nice value in a `/proc/PID/autogroup` line (`/autogroup-123 nice -15`).
fn autogroup_nice(line: &str) -> Option<i32> {
    line.split_whitespace()
        .skip_while(|w| *w != "nice")
        .nth(1)?
        .parse()
        .ok()
}

/// The calling thread's id, as the priority calls take it.
fn this_thread() -> io::Result<libc::id_t> {
    libc::id_t::try_from(nix::unistd::gettid().as_raw())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowers_only_the_calling_thread() {
        let before = current_nice().unwrap();
        let inside = std::thread::spawn(|| {
            run_in_background().unwrap();
            current_nice().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(inside, BACKGROUND_NICE.max(before));
        assert_eq!(current_nice().unwrap(), before);
    }

    #[test]
    fn reads_the_nice_value_of_an_autogroup() {
        assert_eq!(autogroup_nice("/autogroup-123 nice -15\n"), Some(-15));
        assert_eq!(autogroup_nice("/autogroup-7 nice 0"), Some(0));
        assert_eq!(autogroup_nice("/autogroup-7"), None);
        assert_eq!(autogroup_nice("/autogroup-7 nice x"), None);
    }

    #[test]
    fn a_new_session_takes_the_autogroup_nice_of_another_process() {
        if !gpucr_abi::testing::require(
            "autogroup",
            std::path::Path::new("/proc/self/autogroup").exists(),
            "the kernel has no autogroups (CONFIG_SCHED_AUTOGROUP, or noautogroup)",
        ) {
            return;
        }
        // A process in a session (so an autogroup) of its own, at nice 5 (lowering
        // needs no privilege).
        let donor = std::process::Command::new("setsid")
            .args([
                "-w",
                "sh",
                "-c",
                "echo 5 > /proc/self/autogroup; exec sleep 30",
            ])
            .spawn()
            .unwrap();
        let donor_pid = donor.id() as i32;
        let read_nice = |pid: &str| {
            autogroup_nice(&std::fs::read_to_string(format!("/proc/{pid}/autogroup")).unwrap())
        };
        let started = std::time::Instant::now();
        while read_nice(&donor_pid.to_string()) != Some(5) {
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // A process in a new session gets an autogroup of its own, at nice 0.
        let follower = std::process::Command::new("setsid")
            .args(["-w", "sleep", "30"])
            .spawn()
            .unwrap();
        let follower_pid = follower.id().to_string();
        // Once it runs `sleep`, setsid has given it its session (and autogroup).
        let comm = || std::fs::read_to_string(format!("/proc/{follower_pid}/comm")).unwrap();
        while comm().trim() != "sleep" {
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(read_nice(&follower_pid), Some(0));
        let copied = copy_autogroup_nice(donor_pid, &follower_pid);
        let nice = read_nice(&follower_pid);
        for mut child in [donor, follower] {
            let _ = child.kill();
            let _ = child.wait();
        }
        copied.unwrap();
        assert_eq!(nice, Some(5));
    }
}
