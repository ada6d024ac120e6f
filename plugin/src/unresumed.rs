//! No restored task runs without its device.
//!
//! RESUME_DEVICES_LATE is the last hook of a restore, called for every task while CRIU
//! still holds the tree stopped; CRIU only logs its failure and resumes the tree anyway
//! (`criu/cr-restore.c`). So once a task's device did not come back, every task of the
//! tree gets SIGSTOP, and the plugin (running in CRIU's main thread, the tracer) lets go
//! of each of its threads: the pending SIGSTOP stops the task before it runs an
//! instruction. CRIU's own detach then finds the tasks no longer traced and fails the
//! restore, killing the tree, so the failure reaches whoever asked CRIU (gpucr, or a
//! container engine through runc) instead of a restore that says it succeeded. The
//! `exit` hook kills whatever is left. (Killing the tasks while CRIU still traces them
//! would hang CRIU: a dying PID-namespace init waits for its traced children, which only
//! their tracer can reap, while CRIU waits for the init.)
//!
//! Under `gpucr restore`, gpucr also stops the tree from its `pre-resume` notification
//! and reports the helper's error; in a container engine's CRIU this is what keeps a
//! container from running on half-restored.

use std::ffi::c_int;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::criu;

/// One restore's tasks, as RESUME_DEVICES_LATE saw them.
#[derive(Debug, Default)]
pub struct Unresumed {
    /// Every task RESUME_DEVICES_LATE was called for, in order.
    seen: Vec<c_int>,
    /// Whether a task's device did not come back in this restore.
    failed: bool,
}

impl Unresumed {
    /// RESUME_DEVICES_LATE for `pid` begins. False when an earlier task's device did
    /// not come back: `pid` is then stopped with the rest, and must not be resumed.
    pub fn begin(&mut self, pid: c_int) -> bool {
        self.seen.push(pid);
        if self.failed {
            stop(&[pid]);
            return false;
        }
        true
    }

    /// `pid`'s device did not come back: stop every task seen so far (the later ones
    /// are stopped by [`Unresumed::begin`]), to be killed at the `exit` hook.
    pub fn failed(&mut self, pid: c_int) {
        self.failed = true;
        stop(&self.seen);
        criu::error(&format!(
            "RESUME_DEVICES_LATE pid {pid}: its device did not come back (why follows); \
             CRIU resumes the tree whatever this hook says, so the restored tasks are \
             stopped and let go, and CRIU's own detach fails the restore and kills them"
        ));
    }

    /// The `exit` hook of a restore: kill the tree if a task's device did not come
    /// back. What it killed, if anything. The restore is over: nothing is kept.
    pub fn finish(self) -> Vec<c_int> {
        if !self.failed {
            return Vec::new();
        }
        let tasks = self.seen;
        for &pid in tasks.iter().filter(|&&pid| is_other_task(pid)) {
            // The tasks are stopped (or gone): no longer traced, so SIGKILL ends them.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        criu::error(&format!(
            "restore: killed the restored tasks {tasks:?}: a task's device did not come back"
        ));
        tasks
    }
}

/// Whether `pid` names one process other than this one (CRIU): never 0 or a negative
/// number, which name groups.
fn is_other_task(pid: c_int) -> bool {
    pid > 0 && pid.unsigned_abs() != std::process::id()
}

/// SIGSTOP to each of `pids`, then let go of each of their threads (where this process
/// traces them): the signal stops them as they leave their ptrace stop.
fn stop(pids: &[c_int]) {
    for &pid in pids.iter().filter(|&&pid| is_other_task(pid)) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        for tid in gpucr_abi::procfs::threads(pid) {
            // Fails (ESRCH) for a thread this process does not trace: nothing to undo.
            let _ = crate::thread::detach(tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    /// The `/proc/PID/stat` state of `child` (None once reaped).
    fn state(child: &Child) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    fn wait_for_state(child: &Child, wanted: char) {
        let start = Instant::now();
        while state(child) != Some(wanted) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pid {} stays {:?}, not {wanted}",
                child.id(),
                state(child)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_failed_resume_stops_the_tree_and_the_exit_hook_kills_it() {
        let spawn = || Command::new("sleep").arg("60").spawn().unwrap();
        let (mut first, mut failing, mut later) = (spawn(), spawn(), spawn());
        let pid = |c: &Child| c.id() as c_int;

        let mut restore = Unresumed::default();
        assert!(restore.begin(pid(&first)));
        assert!(restore.begin(pid(&failing)));
        restore.failed(pid(&failing));
        wait_for_state(&first, 'T');
        wait_for_state(&failing, 'T');
        // A later task is stopped too and must not be resumed.
        assert!(!restore.begin(pid(&later)));
        wait_for_state(&later, 'T');
        // This process is never signalled, even named.
        assert!(!restore.begin(std::process::id() as c_int));

        let killed = restore.finish();
        assert_eq!(killed.len(), 4);
        for child in [&mut first, &mut failing, &mut later] {
            let status = child.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGKILL)
            );
        }

        // A restore without a failure kills nothing.
        let mut next = spawn();
        let mut restore = Unresumed::default();
        assert!(restore.begin(pid(&next)));
        assert!(restore.finish().is_empty());
        std::thread::sleep(Duration::from_millis(50));
        assert_ne!(state(&next), Some('T'));
        next.kill().unwrap();
        next.wait().unwrap();
    }
}
