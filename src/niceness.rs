//! CPU priority of gpucr's own threads during a restore.
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
}
