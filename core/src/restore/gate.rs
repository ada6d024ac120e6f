//! CRIU's notifications during a restore, answered: the tree is let run only once every
//! page is verified and every device is back.
//!
//! post-restore comes before any restored task runs, and a refusal there makes CRIU
//! kill the tree: by then the memory pages (verified on a thread of their own while
//! CRIU restores) and the GPU memory must be in place. pre-resume comes once the
//! devices should be back; a tree whose device is not is stopped then and killed once
//! CRIU lets go of it.

use std::thread::JoinHandle;

use nix::sys::signal::Signal;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::criu::Notification;
use crate::helper::{GpuRestore, HelperError};
use crate::image::verify::{Problem, ProblemKind, VerifyError};
use crate::interrupt;
use crate::progress::Progress;
use crate::restore_guard::RestoreGuard;

/// The background verification of the memory pages.
pub(super) type BulkVerification = JoinHandle<Result<Vec<Problem>, VerifyError>>;

/// What a restore answers CRIU's notifications with, and what it learns from them.
pub(super) struct Gate<'a> {
    gpu: Option<&'a GpuRestore>,
    guard: Option<&'a RestoreGuard>,
    /// Still running until post-restore (None with `--verify-first`).
    bulk: Option<BulkVerification>,
    /// What the verification of the memory pages found.
    bulk_problems: Vec<Problem>,
    /// The restored root, from post-restore on.
    restored_root: Option<i32>,
    /// The root of a tree stopped at pre-resume because a device did not come back.
    to_kill: Option<i32>,
    /// Why the GPU side failed a notification.
    gpu_error: Option<HelperError>,
    /// post-restore was answered: the tree is whole and verified, and a later signal is
    /// for the restored tree.
    past_gate: bool,
    /// Leave the tree stopped: SIGSTOP to every task at pre-resume, once the devices are
    /// back, so that it stops as CRIU lets it go ([`Gate::leaving_stopped`]).
    stop_at_resume: bool,
}

/// Why the gate refused one of CRIU's notifications. The gate keeps the details itself
/// (the damage found, the helper's error) for [`Gate::verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    #[error("a restored task's device did not come back")]
    Unresumed,
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
    #[error("the image is damaged")]
    Damaged,
    #[error("the GPU memory could not be restored")]
    Gpu,
}

/// How a restore ended on gpucr's side, once CRIU has answered.
pub(super) enum Verdict {
    /// Nothing stopped it here: CRIU's answer says how it went.
    Criu,
    /// The memory pages are damaged.
    Damaged(Vec<Problem>),
    /// The GPU side failed (the tree, if one was made, is gone).
    Gpu(HelperError),
    /// A device did not come back: the tree rooted at `root` was stopped before it ran
    /// an instruction, and is to be killed once CRIU has let go of it
    /// ([`kill_unresumed`]).
    Unresumed { root: i32, error: HelperError },
}

impl<'a> Gate<'a> {
    pub(super) fn new(
        gpu: Option<&'a GpuRestore>,
        guard: Option<&'a RestoreGuard>,
        bulk: Option<BulkVerification>,
    ) -> Gate<'a> {
        Gate {
            gpu,
            guard,
            bulk,
            bulk_problems: Vec::new(),
            restored_root: None,
            to_kill: None,
            gpu_error: None,
            past_gate: false,
            stop_at_resume: false,
        }
    }

    /// The gate, leaving the tree stopped when `stopped`. Not CRIU's own `leave_stopped`:
    /// CRIU sends that SIGSTOP before RESUME_DEVICES_LATE, and a restore thread the
    /// plugin then lets run to bring a device back (CUDA's) would take the stop and
    /// never bring it.
    pub(super) fn leaving_stopped(mut self, stopped: bool) -> Gate<'a> {
        self.stop_at_resume = stopped;
        self
    }

    /// Answer one of CRIU's notifications: Err refuses it, and CRIU kills what it
    /// has made of the tree.
    pub(super) fn notify(
        &mut self,
        n: &Notification,
        progress: &mut Progress,
    ) -> Result<(), Refusal> {
        progress.event(n.name(), &n.describe());
        if let Notification::PostRestore { pid } = n {
            self.restored_root = *pid;
            if let (Some(guard), Some(root)) = (self.guard, *pid) {
                guard.root(root);
            }
        }
        // pre-resume: the tasks are still stopped, and every device must be back. CRIU
        // only logs a failed RESUME_DEVICES_LATE or pre-resume and lets the tree go, so
        // a tree whose device did not come back gets SIGSTOP now, which stops it the
        // moment CRIU detaches (before it runs an instruction), and SIGKILL once CRIU is
        // done with it (killing it while CRIU still traces it would deadlock CRIU).
        if let (Some(gpu), Notification::PreResume) = (self.gpu, n) {
            if let Err(e) = gpu.check_resumed() {
                if let Some(root) = self.restored_root {
                    signal_tree(root, Signal::SIGSTOP);
                    self.to_kill = Some(root);
                }
                self.gpu_error = Some(e);
                return Err(Refusal::Unresumed);
            }
        }
        if self.stop_at_resume && *n == Notification::PreResume {
            match self.restored_root {
                Some(root) => {
                    signal_tree(root, Signal::SIGSTOP);
                    progress.event(
                        "left-stopped",
                        &format!("the tree of pid {root} stops as CRIU lets it go"),
                    );
                }
                None => {
                    progress.warn("CRIU did not name the restored tree: it cannot be left stopped")
                }
            }
        }
        if self.past_gate {
            return Ok(());
        }
        if let Some(signal) = interrupt::requested() {
            return Err(Refusal::Interrupted(interrupt::name(signal)));
        }
        if !matches!(n, Notification::PostRestore { .. }) {
            return Ok(());
        }
        // post-restore comes before any restored task runs, and a refusal here makes
        // CRIU kill the tree: everything must be verified and in place by now.
        if let Some(handle) = self.bulk.take() {
            self.bulk_problems = join_bulk(handle);
            progress.event("pages-verified", "memory pages verified");
            if !self.bulk_problems.is_empty() {
                return Err(Refusal::Damaged);
            }
        }
        if let Some(gpu) = self.gpu {
            if let Err(e) = gpu.wait_restored() {
                self.gpu_error = Some(e);
                return Err(Refusal::Gpu);
            }
            progress.event("gpu-done", "GPU memory restored");
        }
        // Detached first, checked after: a signal either comes in time to fail the
        // restore here, or finds the restore's steps out of its reach.
        if let Some(gpu) = self.gpu {
            gpu.tree_whole();
        }
        match interrupt::requested() {
            Some(signal) => Err(Refusal::Interrupted(interrupt::name(signal))),
            None => {
                self.past_gate = true;
                Ok(())
            }
        }
    }

    /// Once CRIU has answered (`criu_failed` if it failed the restore,
    /// `plugin_named_a_cause` if its log holds a hook failure of gpucr's plugin): what
    /// stopped the restore on gpucr's side, if anything. Damage explains a failure best,
    /// even one CRIU met before post-restore.
    pub(super) fn verdict(mut self, criu_failed: bool, plugin_named_a_cause: bool) -> Verdict {
        if let Some(handle) = self.bulk.take() {
            self.bulk_problems = join_bulk(handle);
        }
        if !self.bulk_problems.is_empty() {
            return Verdict::Damaged(self.bulk_problems);
        }
        if let Some(root) = self.to_kill {
            let error = self.gpu_error.unwrap_or_else(|| {
                HelperError::Device("a restored task's device did not come back".into())
            });
            return Verdict::Unresumed { root, error };
        }
        if let Some(error) = self.gpu_error {
            return Verdict::Gpu(error);
        }
        // A failure the GPU side met on its own (not in answering a notification)
        // explains CRIU's failure; taken only then, it is reported once.
        let failure = self
            .gpu
            .filter(|_| criu_failed)
            .and_then(GpuRestore::take_failure);
        failure_verdict(failure, plugin_named_a_cause)
    }
}

/// The verdict on a failure the GPU side met on its own while CRIU failed. A plugin
/// whose task went away mid-request does not explain it when the plugin of another task
/// named why CRIU gave up: CRIU killed the tasks it had made for that.
fn failure_verdict(failure: Option<HelperError>, plugin_named_a_cause: bool) -> Verdict {
    match failure {
        Some(error) if error.is_a_task_gone() && plugin_named_a_cause => Verdict::Criu,
        Some(error) => Verdict::Gpu(error),
        None => Verdict::Criu,
    }
}

/// Kill the tree rooted at `root`, stopped at pre-resume, and reap its root. Only once
/// CRIU has let go of it (its answer, `Swrk::finish`): killing a tree CRIU still
/// traces would deadlock CRIU.
pub(super) fn kill_unresumed(root: i32) {
    signal_tree(root, Signal::SIGKILL);
    let _ = waitpid(Pid::from_raw(root), None);
}

/// Send `signal` to every process of the restored tree rooted at `root`.
fn signal_tree(root: i32, signal: Signal) {
    for pid in crate::gpu::tree_pids(root) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
    }
}

/// What the background verification of the memory pages found; its failure, or its
/// thread's panic, as a problem of its own.
fn join_bulk(handle: BulkVerification) -> Vec<Problem> {
    match handle.join() {
        Ok(Ok(problems)) => problems,
        Ok(Err(e)) => vec![Problem {
            file: "gpucr.json".into(),
            kind: ProblemKind::Unreadable(e.to_string()),
        }],
        Err(_) => vec![Problem {
            file: "(pages)".into(),
            kind: ProblemKind::Unreadable("the verification thread panicked".into()),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone() -> HelperError {
        HelperError::PluginGone {
            what: "RESTORE_EXT_FILE",
            peer: 42,
        }
    }

    #[test]
    fn a_task_gone_gives_way_to_the_cause_a_plugin_named() {
        assert!(matches!(failure_verdict(Some(gone()), true), Verdict::Criu));
    }

    #[test]
    fn a_task_gone_is_the_reason_when_no_plugin_named_one() {
        match failure_verdict(Some(gone()), false) {
            Verdict::Gpu(error) => assert_eq!(
                error.to_string(),
                "device state: RESTORE_EXT_FILE (plugin in pid 42): the plugin went away \
                 before it was answered"
            ),
            _ => panic!("a vanished plugin with nothing else named is the GPU side's failure"),
        }
    }

    #[test]
    fn a_failure_of_the_gpu_side_explains_the_restore_even_beside_a_named_cause() {
        let failure = HelperError::Device("the copy engine stopped".into());
        assert!(matches!(
            failure_verdict(Some(failure), true),
            Verdict::Gpu(HelperError::Device(_))
        ));
        assert!(matches!(failure_verdict(None, true), Verdict::Criu));
    }
}
