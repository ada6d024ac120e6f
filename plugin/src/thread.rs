//! Letting one thread of a task that CRIU holds stopped run for a while (a driver's
//! restore thread, as CUDA's), as CRIU's tracer: its signals blocked, PTRACE_CONT, and
//! when the guard is dropped, PTRACE_INTERRUPT, a wait for the stop, and its signal
//! mask put back. Only CRIU's process may do this (it is the tracer of every task of
//! the tree), which makes it the plugin half's job.

use std::mem::size_of;

use crate::half::error::HalfError;

/// Test hook: when set, threads are never let run (to prove that a backend whose
/// restore thread does not run fails instead of hanging).
pub const ENV_TEST_NO_THREAD_RUN: &str = "GPUCR_TEST_NO_THREAD_RUN";

/// The kernel's signal set as ptrace(PTRACE_GETSIGMASK) reads it (64 signals).
type KernelSigset = u64;

/// A thread let run; stopped again when dropped.
#[derive(Debug)]
pub struct RunGuard {
    tid: i32,
    saved_mask: KernelSigset,
}

fn ptrace(request: libc::c_uint, tid: i32, addr: usize, data: *mut libc::c_void) -> i64 {
    // SAFETY: every caller passes a request whose `data` is null or points to a live
    // KernelSigset of the size given in `addr`; the kernel checks the tracee itself.
    unsafe { libc::ptrace(request, tid, addr, data) }
}

/// Let go of thread `tid` for good (PTRACE_DETACH, no signal); an error when this
/// process does not hold it stopped under ptrace.
pub fn detach(tid: i32) -> Result<(), HalfError> {
    if ptrace(libc::PTRACE_DETACH, tid, 0, std::ptr::null_mut()) != 0 {
        return Err(failed("detach", tid));
    }
    Ok(())
}

fn failed(what: &str, tid: i32) -> HalfError {
    let e = std::io::Error::last_os_error();
    HalfError::new(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("{what} thread {tid}: {e}"),
    )
}

impl RunGuard {
    /// Let thread `tid` run (None when the test hook forbids it).
    pub fn start(tid: i32) -> Result<Option<RunGuard>, HalfError> {
        if std::env::var_os(ENV_TEST_NO_THREAD_RUN).is_some() {
            crate::criu::info(&format!(
                "{ENV_TEST_NO_THREAD_RUN}: thread {tid} is not let run"
            ));
            return Ok(None);
        }
        let mut saved_mask: KernelSigset = 0;
        let size = size_of::<KernelSigset>();
        if ptrace(
            libc::PTRACE_GETSIGMASK,
            tid,
            size,
            (&mut saved_mask as *mut KernelSigset).cast(),
        ) != 0
        {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                // Not a stopped tracee of CRIU's: CRIU never froze the tree (a dump
                // that failed before the freeze) or already let it go, so the thread
                // runs by itself (or is gone); there is nothing to let run.
                crate::criu::info(&format!("thread {tid} is not held by CRIU: not let run"));
                return Ok(None);
            }
            return Err(failed("cannot read the signal mask of", tid));
        }
        let mut blocked: KernelSigset = !0;
        if ptrace(
            libc::PTRACE_SETSIGMASK,
            tid,
            size,
            (&mut blocked as *mut KernelSigset).cast(),
        ) != 0
        {
            return Err(failed("cannot block the signals of", tid));
        }
        let guard = RunGuard { tid, saved_mask };
        if ptrace(libc::PTRACE_CONT, tid, 0, std::ptr::null_mut()) != 0 {
            return Err(failed("cannot let run", tid));
        }
        crate::criu::info(&format!("thread {tid} let run"));
        Ok(Some(guard))
    }

    /// Let every thread of `tids` run; each is stopped again when its guard drops.
    pub fn start_all(tids: &[i32]) -> Result<Vec<RunGuard>, HalfError> {
        let mut running = Vec::with_capacity(tids.len());
        for &tid in tids {
            running.extend(RunGuard::start(tid)?);
        }
        Ok(running)
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, std::ptr::null_mut()) != 0 {
            crate::criu::error(&format!(
                "cannot stop thread {} again: {}",
                self.tid,
                std::io::Error::last_os_error()
            ));
            return;
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status into our local.
            let ret = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL) };
            if ret < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if libc::WIFSTOPPED(status) || libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                break;
            }
        }
        let size = size_of::<KernelSigset>();
        if ptrace(
            libc::PTRACE_SETSIGMASK,
            self.tid,
            size,
            (&mut self.saved_mask as *mut KernelSigset).cast(),
        ) != 0
        {
            crate::criu::error(&format!(
                "cannot restore the signal mask of thread {}: {}",
                self.tid,
                std::io::Error::last_os_error()
            ));
        }
        crate::criu::info(&format!("thread {} stopped again", self.tid));
    }
}

/// The thread of `pid` named `name` (its comm), if it has one.
pub fn find_named(pid: i32, name: &str) -> Option<i32> {
    gpucr_abi::procfs::threads(pid).into_iter().find(|tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_found_by_name() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("gpucr-tnamed".into())
            .spawn(move || rx.recv().unwrap())
            .unwrap();
        let me = std::process::id() as i32;
        let mut found = None;
        for _ in 0..100 {
            found = find_named(me, "gpucr-tnamed");
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(found.is_some_and(|tid| tid > 0));
        assert_eq!(find_named(me, "no-such-thread"), None);
        tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_thread_we_do_not_trace_runs_by_itself() {
        // Our own thread is not our tracee (ptrace says ESRCH): it already runs, so
        // there is nothing to let run and nothing failed.
        let me = std::process::id() as i32;
        assert!(RunGuard::start(me).unwrap().is_none());
        assert!(RunGuard::start_all(&[me]).unwrap().is_empty());
    }
}
