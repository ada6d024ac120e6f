//! Each task's way through a dump and through a restore, as explicit state machines.
//!
//! The helper moves a task from stage to stage as the plugin's requests arrive; a
//! request that does not fit the task's stage (twice, out of order, for a task never
//! announced) is refused with the stage it found, instead of being half-applied. The
//! stages are also what the helper asks at the end: which tasks hold a device to give
//! back after a dump that leaves the tree running, and whether every restored task was
//! brought back on its device before CRIU lets the tree run.
//!
//! Backend calls and copies are not made here: a transition that needs one hands out
//! what the call needs (`Adopt`) and the caller records how it went.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;

use crate::gpu::Operation;

/// A request that does not fit the stage its task is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event} for {task} while it is {stage}")]
pub struct LifecycleError {
    /// "pid 1234" (dump, host pid) or "task 2" (restore, pid in the image).
    pub task: String,
    pub stage: &'static str,
    pub event: &'static str,
}

// ----- dump ---------------------------------------------------------------------------

/// Where one task of a dump is.
#[derive(Debug)]
pub enum DumpStage {
    /// Paused with the whole tree at the first PAUSE_DEVICES; CRIU's PAUSE_DEVICES for
    /// it has not come yet.
    PausedAhead,
    /// PAUSE_DEVICES went through: the backend's step before the freeze is done (the
    /// task is frozen). `checkpointed_ahead`: the backend already checkpointed it with
    /// the whole tree, before its CHECKPOINT_DEVICES.
    Paused { checkpointed_ahead: bool },
    /// CHECKPOINT_DEVICES sent the task's state; buffer fds are still arriving.
    Collecting {
        format: String,
        state: Vec<u8>,
        count: usize,
        fds: Vec<OwnedFd>,
        checkpointed_ahead: bool,
    },
    /// Everything is in; the gpucr half is taking the task over.
    Adopting,
    /// The gpucr half holds the task; its buffers are moving into the image.
    Adopted,
    /// The task holds no device of this backend.
    NoDevice,
    /// Taking the task over failed.
    Failed,
    /// After the dump, the task got its device back (the tree lives on).
    Released,
}

impl DumpStage {
    pub fn name(&self) -> &'static str {
        match self {
            DumpStage::PausedAhead | DumpStage::Paused { .. } => "paused",
            DumpStage::Collecting { .. } => "collecting its buffers",
            DumpStage::Adopting => "being taken over",
            DumpStage::Adopted => "taken over",
            DumpStage::NoDevice => "without a device",
            DumpStage::Failed => "failed",
            DumpStage::Released => "released",
        }
    }

    /// Whether the backend may have changed the task (locked it, checkpointed it), so
    /// that a tree living on needs it undone.
    fn touched(&self) -> bool {
        !matches!(self, DumpStage::NoDevice | DumpStage::Released)
    }
}

/// How taking a task over ended: the stage it leaves `Adopting` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdoptOutcome {
    /// The gpucr half holds the task: `Adopted`.
    Adopted,
    /// The task holds no device of this backend: `NoDevice`.
    NoDevice,
    /// Taking it over failed: `Failed`.
    Failed,
}

impl AdoptOutcome {
    fn stage(self) -> DumpStage {
        match self {
            AdoptOutcome::Adopted => DumpStage::Adopted,
            AdoptOutcome::NoDevice => DumpStage::NoDevice,
            AdoptOutcome::Failed => DumpStage::Failed,
        }
    }
}

/// What taking a task over needs: the plugin half's state and every buffer fd.
#[derive(Debug)]
pub struct Adopt {
    pub format: String,
    pub state: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// The operations done for the task so far (its pause, a checkpoint made ahead).
    pub operations: Vec<Operation>,
    /// The backend already checkpointed the task with the whole tree.
    pub checkpointed_ahead: bool,
}

#[derive(Debug)]
struct DumpTask {
    stage: DumpStage,
    operations: Vec<Operation>,
}

impl DumpTask {
    fn new(stage: DumpStage, operations: Vec<Operation>) -> DumpTask {
        DumpTask { stage, operations }
    }
}

/// The tasks of one dump, by host pid, in the order CRIU announced them, and where the
/// tree is as a whole.
#[derive(Debug, Default)]
pub struct DumpTasks {
    tasks: BTreeMap<i32, DumpTask>,
    /// The whole tree was paused at the first PAUSE_DEVICES.
    tree_paused: bool,
    /// The image is complete (post-dump went through): CRIU kills the tree unless it
    /// is left running. CRIU's DumpFinished comes after post-dump, and its result does
    /// not tell a post-dump that failed.
    kept: bool,
    /// Why a tree that lives on may not have all its devices back (the first failure
    /// of the end of the dump).
    give_back_failure: Option<String>,
    /// The end of the dump left the tree's devices as the dump made them, to be given
    /// back only when asked ([`DumpTasks::defer_give_back`]).
    give_back_deferred: bool,
}

impl DumpTasks {
    fn unexpected(pid: i32, stage: &DumpStage, event: &'static str) -> LifecycleError {
        LifecycleError {
            task: format!("pid {pid}"),
            stage: stage.name(),
            event,
        }
    }

    /// The first PAUSE_DEVICES of the dump: true the first time (the whole tree is to
    /// be paused now), false after.
    pub fn pause_tree(&mut self) -> bool {
        !std::mem::replace(&mut self.tree_paused, true)
    }

    /// The image is complete (post-dump went through).
    pub fn keep(&mut self) {
        self.kept = true;
    }

    /// Whether the image is complete ([`DumpTasks::keep`]).
    pub fn kept(&self) -> bool {
        self.kept
    }

    /// The end of a dump that succeeded, its tree living on stopped: its devices stay
    /// as the dump left them (a give-back would write into memory the image leaves in
    /// the tree) until [`DumpTasks::take_deferred`].
    pub fn defer_give_back(&mut self) {
        self.give_back_deferred = true;
    }

    /// Whether a give-back was deferred and not yet taken; true once.
    pub fn take_deferred(&mut self) -> bool {
        std::mem::replace(&mut self.give_back_deferred, false)
    }

    /// The end of the dump failed for a tree that lives on: `why` it may not have all
    /// its devices back (the first such failure is kept).
    pub fn give_back_failed(&mut self, why: String) {
        self.give_back_failure.get_or_insert(why);
    }

    /// Why the tree, which lives on, may not have all its devices back, if the end of
    /// the dump failed.
    pub fn give_back_failure(&self) -> Option<&str> {
        self.give_back_failure.as_deref()
    }

    /// PAUSE_DEVICES done for `pid`, with the operation it took.
    pub fn paused(&mut self, pid: i32, pause: Operation) -> Result<(), LifecycleError> {
        self.enter(
            pid,
            DumpStage::Paused {
                checkpointed_ahead: false,
            },
            pause,
        )
    }

    /// `pid` paused with the whole tree at the first PAUSE_DEVICES, before CRIU asked
    /// for it.
    pub fn paused_ahead(&mut self, pid: i32, pause: Operation) -> Result<(), LifecycleError> {
        self.enter(pid, DumpStage::PausedAhead, pause)
    }

    /// A task not seen before, at `stage` after `pause`.
    fn enter(
        &mut self,
        pid: i32,
        stage: DumpStage,
        pause: Operation,
    ) -> Result<(), LifecycleError> {
        if let Some(task) = self.tasks.get(&pid) {
            return Err(Self::unexpected(pid, &task.stage, "PAUSE_DEVICES"));
        }
        self.tasks.insert(pid, DumpTask::new(stage, vec![pause]));
        Ok(())
    }

    /// CRIU's PAUSE_DEVICES for `pid`: true when the task was paused ahead with the
    /// whole tree (nothing more to do for it; it is now `Paused`), false when it was
    /// not.
    pub fn confirm_ahead(&mut self, pid: i32) -> bool {
        match self.tasks.get_mut(&pid) {
            Some(task) if matches!(task.stage, DumpStage::PausedAhead) => {
                task.stage = DumpStage::Paused {
                    checkpointed_ahead: false,
                };
                true
            }
            _ => false,
        }
    }

    /// The tasks to checkpoint with the whole tree: paused through CRIU's own
    /// PAUSE_DEVICES (so frozen now) and not yet checkpointed.
    pub fn to_checkpoint_ahead(&self) -> Vec<i32> {
        self.tasks
            .iter()
            .filter(|(_, t)| {
                matches!(
                    t.stage,
                    DumpStage::Paused {
                        checkpointed_ahead: false
                    }
                )
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// How the checkpoint with the whole tree went for `pid`: done (with the operation,
    /// when the backend made a call) or failed.
    pub fn checkpointed_ahead(&mut self, pid: i32, outcome: Result<Option<Operation>, ()>) {
        if let Some(task) = self.tasks.get_mut(&pid) {
            match outcome {
                Ok(operation) => {
                    if let DumpStage::Paused { checkpointed_ahead } = &mut task.stage {
                        *checkpointed_ahead = true;
                    }
                    task.operations.extend(operation);
                }
                Err(()) => task.stage = DumpStage::Failed,
            }
        }
    }

    /// One more operation done for `pid` before it is taken over.
    pub fn log(&mut self, pid: i32, operation: Operation) {
        if let Some(task) = self.tasks.get_mut(&pid) {
            task.operations.push(operation);
        }
    }

    /// The tasks paused ahead whose PAUSE_DEVICES never came (they left the tree before
    /// CRIU reached them), each then `Released`: the backend must give them back
    /// whatever becomes of the dump.
    pub fn release_unconfirmed(&mut self) -> Vec<i32> {
        self.tasks
            .iter_mut()
            .filter(|(_, task)| matches!(task.stage, DumpStage::PausedAhead))
            .map(|(pid, task)| {
                task.stage = DumpStage::Released;
                *pid
            })
            .collect()
    }

    /// PAUSE_DEVICES failed for `pid`: the backend may have changed it halfway, so the
    /// task is given back after the dump like any other it touched.
    pub fn pause_failed(&mut self, pid: i32) {
        self.tasks
            .entry(pid)
            .or_insert_with(|| DumpTask::new(DumpStage::Failed, Vec::new()));
    }

    /// CHECKPOINT_DEVICES for `pid` (paused before, or not when the CRIU pauses no
    /// device): its state and the first of `count` buffer fds. `Some` when the task is
    /// ready to be taken over.
    pub fn checkpoint(
        &mut self,
        pid: i32,
        format: String,
        state: Vec<u8>,
        count: usize,
        fds: Vec<OwnedFd>,
    ) -> Result<Option<Adopt>, LifecycleError> {
        let task = self.tasks.entry(pid).or_insert_with(|| {
            let stage = DumpStage::Paused {
                checkpointed_ahead: false,
            };
            DumpTask::new(stage, Vec::new())
        });
        let checkpointed_ahead = match task.stage {
            DumpStage::PausedAhead => false,
            DumpStage::Paused { checkpointed_ahead } => checkpointed_ahead,
            _ => return Err(Self::unexpected(pid, &task.stage, "CHECKPOINT_DEVICES")),
        };
        task.stage = DumpStage::Collecting {
            format,
            state,
            count,
            fds,
            checkpointed_ahead,
        };
        Ok(self.take_if_complete(pid))
    }

    /// More buffer fds for `pid`, starting at index `first`.
    pub fn buffers(
        &mut self,
        pid: i32,
        first: usize,
        more: Vec<OwnedFd>,
    ) -> Result<Option<Adopt>, LifecycleError> {
        let Some(task) = self.tasks.get_mut(&pid) else {
            return Err(LifecycleError {
                task: format!("pid {pid}"),
                stage: "unknown",
                event: "DumpBuffers",
            });
        };
        match &mut task.stage {
            DumpStage::Collecting { count, fds, .. }
                if first == fds.len() && first + more.len() <= *count =>
            {
                fds.extend(more);
            }
            stage => return Err(Self::unexpected(pid, stage, "DumpBuffers")),
        }
        Ok(self.take_if_complete(pid))
    }

    /// The task's state and fds when every announced fd is in; it is then `Adopting`.
    fn take_if_complete(&mut self, pid: i32) -> Option<Adopt> {
        let task = self.tasks.get_mut(&pid)?;
        let complete =
            matches!(&task.stage, DumpStage::Collecting { count, fds, .. } if fds.len() == *count);
        if !complete {
            return None;
        }
        let DumpStage::Collecting {
            format,
            state,
            fds,
            checkpointed_ahead,
            ..
        } = std::mem::replace(&mut task.stage, DumpStage::Adopting)
        else {
            unreachable!("checked above");
        };
        Some(Adopt {
            format,
            state,
            fds,
            operations: std::mem::take(&mut task.operations),
            checkpointed_ahead,
        })
    }

    /// How taking `pid` over went: adopted (it holds a device), no device, or failed.
    /// Only a task being taken over (`Adopting`) ends its takeover.
    pub fn adopted(&mut self, pid: i32, outcome: AdoptOutcome) -> Result<(), LifecycleError> {
        const EVENT: &str = "the end of its takeover";
        let Some(task) = self.tasks.get_mut(&pid) else {
            return Err(LifecycleError {
                task: format!("pid {pid}"),
                stage: "unknown",
                event: EVENT,
            });
        };
        if !matches!(task.stage, DumpStage::Adopting) {
            return Err(Self::unexpected(pid, &task.stage, EVENT));
        }
        task.stage = outcome.stage();
        Ok(())
    }

    /// Every task the backend may have changed (for the step after a dump that leaves
    /// the tree running), each then `Released`.
    pub fn release(&mut self) -> Vec<i32> {
        self.tasks
            .iter_mut()
            .filter(|(_, task)| task.stage.touched())
            .map(|(pid, task)| {
                task.stage = DumpStage::Released;
                *pid
            })
            .collect()
    }

    /// Every task announced so far (the tree), by host pid.
    pub fn pids(&self) -> Vec<i32> {
        self.tasks.keys().copied().collect()
    }

    pub fn stage(&self, pid: i32) -> Option<&DumpStage> {
        self.tasks.get(&pid).map(|t| &t.stage)
    }
}

// ----- restore ------------------------------------------------------------------------

/// Where one task of a restore is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreStage {
    /// Its device file is not restored yet.
    Waiting,
    /// RESTORE_EXT_FILE: the restored task is recreating its device; `attached` of its
    /// buffers are handed over for filling.
    Recreating { attached: usize },
    /// RESUME_DEVICES_LATE: its buffers are being finished and its device brought back.
    Resuming,
    /// Its device is back; it may run.
    Resumed,
    /// Bringing it back failed.
    Failed,
}

impl RestoreStage {
    pub fn name(self) -> &'static str {
        match self {
            RestoreStage::Waiting => "waiting for its device file",
            RestoreStage::Recreating { .. } => "recreating its device",
            RestoreStage::Resuming => "resuming",
            RestoreStage::Resumed => "resumed",
            RestoreStage::Failed => "failed",
        }
    }
}

/// One task of a restore.
#[derive(Debug)]
struct RestoreTask {
    /// Its pid in the image.
    ns_pid: u32,
    /// How many buffers it has.
    buffers: usize,
    /// It has no device files (its driver keeps the device state, as CUDA's): no
    /// RESTORE_EXT_FILE comes for it, RESUME_DEVICES_LATE finds it by its pid in the
    /// image, and it starts `Recreating`.
    fileless: bool,
    stage: RestoreStage,
}

/// The tasks of one restore, by their index in the manifest.
#[derive(Debug)]
pub struct RestoreTasks {
    tasks: Vec<RestoreTask>,
    /// The host pid each restored task asked from (SO_PEERCRED), to its index.
    peers: HashMap<i32, usize>,
}

impl RestoreTasks {
    /// `tasks`: each task's pid in the image, its number of buffers, and whether it
    /// has no device files.
    pub fn new(tasks: impl IntoIterator<Item = (u32, usize, bool)>) -> RestoreTasks {
        let tasks = tasks
            .into_iter()
            .map(|(ns_pid, buffers, fileless)| RestoreTask {
                ns_pid,
                buffers,
                fileless,
                stage: if fileless {
                    RestoreStage::Recreating { attached: 0 }
                } else {
                    RestoreStage::Waiting
                },
            })
            .collect();
        RestoreTasks {
            tasks,
            peers: HashMap::new(),
        }
    }

    fn unexpected(&self, index: usize, event: &'static str) -> LifecycleError {
        LifecycleError {
            task: format!("task {}", self.tasks[index].ns_pid),
            stage: self.tasks[index].stage.name(),
            event,
        }
    }

    /// RESTORE_EXT_FILE for task `index`, asked by host pid `peer`.
    pub fn recreating(&mut self, index: usize, peer: i32) -> Result<(), LifecycleError> {
        if self.tasks[index].stage != RestoreStage::Waiting {
            return Err(self.unexpected(index, "RESTORE_EXT_FILE"));
        }
        self.tasks[index].stage = RestoreStage::Recreating { attached: 0 };
        self.peers.insert(peer, index);
        Ok(())
    }

    /// `count` more buffers of task `index`, from `first`, handed over for filling.
    pub fn attach(
        &mut self,
        index: usize,
        first: usize,
        count: usize,
    ) -> Result<(), LifecycleError> {
        let task = &mut self.tasks[index];
        match &mut task.stage {
            RestoreStage::Recreating { attached }
                if *attached == first && first + count <= task.buffers =>
            {
                *attached += count;
                Ok(())
            }
            _ => Err(self.unexpected(index, "BuffersReady")),
        }
    }

    /// Recreating task `index`'s device (its RESTORE_EXT_FILE, or a hand-over of its
    /// buffers) failed: it must not run.
    pub fn recreate_failed(&mut self, index: usize) {
        self.tasks[index].stage = RestoreStage::Failed;
    }

    /// RESUME_DEVICES_LATE from host pid `pid` (`ns_pid` in its own PID namespace):
    /// the index of its task, now `Resuming`, or None when the task carries no device
    /// of gpucr's.
    pub fn resuming(
        &mut self,
        pid: i32,
        ns_pid: Option<u32>,
    ) -> Result<Option<usize>, LifecycleError> {
        let fileless = || {
            let ns_pid = ns_pid?;
            self.tasks
                .iter()
                .position(|t| t.ns_pid == ns_pid && t.fileless)
        };
        let Some(index) = self.peers.get(&pid).copied().or_else(fileless) else {
            return Ok(None);
        };
        self.peers.insert(pid, index);
        let task = &mut self.tasks[index];
        match task.stage {
            RestoreStage::Recreating { attached } if attached == task.buffers => {
                task.stage = RestoreStage::Resuming;
                Ok(Some(index))
            }
            _ => Err(self.unexpected(index, "RESUME_DEVICES_LATE")),
        }
    }

    /// Whether host pid `pid` (`ns_pid` in its own PID namespace) is a task without
    /// device files still waiting for its RESUME_DEVICES_LATE: one the tree's resume
    /// may bring back ahead of it.
    pub fn awaits_resume_without_files(&self, pid: i32, ns_pid: u32) -> bool {
        if self.peers.contains_key(&pid) {
            return false;
        }
        self.tasks.iter().any(|t| {
            t.ns_pid == ns_pid
                && t.fileless
                && t.stage
                    == RestoreStage::Recreating {
                        attached: t.buffers,
                    }
        })
    }

    /// How bringing task `index` back went. Only a task being resumed (`Resuming`)
    /// ends its resume.
    pub fn resumed(&mut self, index: usize, ok: bool) -> Result<(), LifecycleError> {
        if self.tasks[index].stage != RestoreStage::Resuming {
            return Err(self.unexpected(index, "the end of its resume"));
        }
        self.tasks[index].stage = if ok {
            RestoreStage::Resumed
        } else {
            RestoreStage::Failed
        };
        Ok(())
    }

    /// RESUME_DEVICES_LATE failed in the plugin half for host pid `pid` after the
    /// helper's part: the task must not run.
    pub fn resume_failed(&mut self, pid: i32) {
        if let Some(&index) = self.peers.get(&pid) {
            self.tasks[index].stage = RestoreStage::Failed;
        }
    }

    /// The first task (pid in the image, stage) not brought back on its device.
    pub fn first_not_resumed(&self) -> Option<(u32, RestoreStage)> {
        self.tasks
            .iter()
            .find(|t| t.stage != RestoreStage::Resumed)
            .map(|t| (t.ns_pid, t.stage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn op(name: &str) -> Operation {
        Operation {
            name: name.into(),
            start_ms: 0.0,
            duration_ms: 1.0,
            result: "ok".into(),
        }
    }

    fn fds(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| File::open("/dev/null").unwrap().into())
            .collect()
    }

    #[test]
    fn a_dump_task_goes_from_pause_to_adoption_once_every_fd_is_in() {
        let mut tasks = DumpTasks::default();
        tasks.paused(10, op("pause")).unwrap();
        let err = tasks.paused(10, op("pause")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "PAUSE_DEVICES for pid 10 while it is paused"
        );
        let none = tasks
            .checkpoint(10, "f/1".into(), vec![1], 3, fds(2))
            .unwrap();
        assert!(none.is_none(), "one fd still to come");
        let err = tasks.buffers(10, 1, fds(1)).unwrap_err();
        assert_eq!(err.stage, "collecting its buffers", "out of order");
        let adopt = tasks.buffers(10, 2, fds(1)).unwrap().unwrap();
        assert_eq!((adopt.format.as_str(), adopt.fds.len()), ("f/1", 3));
        assert_eq!(adopt.operations.len(), 1, "the pause travels with it");
        assert_eq!(tasks.stage(10).unwrap().name(), "being taken over");
        let err = tasks.checkpoint(10, "f/1".into(), vec![], 0, vec![]);
        assert!(err.is_err(), "CHECKPOINT_DEVICES twice");
        tasks.adopted(10, AdoptOutcome::Adopted).unwrap();
        // A task without a device, never paused (its CRIU pauses nothing).
        let adopt = tasks
            .checkpoint(11, String::new(), vec![], 0, vec![])
            .unwrap()
            .unwrap();
        assert!(adopt.state.is_empty());
        tasks.adopted(11, AdoptOutcome::NoDevice).unwrap();
        assert!(tasks.buffers(12, 0, fds(1)).is_err(), "never announced");
        assert_eq!(tasks.pids(), [10, 11]);
        assert_eq!(tasks.release(), [10], "only the task the backend touched");
        assert!(tasks.release().is_empty(), "released once");
    }

    #[test]
    fn only_a_task_being_taken_over_ends_its_takeover() {
        let mut tasks = DumpTasks::default();
        let err = tasks.adopted(10, AdoptOutcome::Adopted).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the end of its takeover for pid 10 while it is unknown"
        );
        tasks.paused(10, op("pause")).unwrap();
        let err = tasks.adopted(10, AdoptOutcome::Failed).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the end of its takeover for pid 10 while it is paused"
        );
        assert_eq!(tasks.stage(10).unwrap().name(), "paused", "left as it was");
        tasks
            .checkpoint(10, "f/1".into(), vec![1], 0, vec![])
            .unwrap()
            .unwrap();
        tasks.adopted(10, AdoptOutcome::Failed).unwrap();
        assert_eq!(tasks.stage(10).unwrap().name(), "failed");
        let err = tasks.adopted(10, AdoptOutcome::Adopted).unwrap_err();
        assert_eq!(err.stage, "failed", "ended once");
        assert_eq!(tasks.release(), [10], "a failed takeover is given back");
    }

    #[test]
    fn a_tree_paused_and_checkpointed_ahead() {
        let mut tasks = DumpTasks::default();
        for pid in [1, 2, 3] {
            tasks.paused_ahead(pid, op("pause")).unwrap();
        }
        assert!(tasks.paused_ahead(2, op("pause")).is_err(), "twice");
        assert!(tasks.to_checkpoint_ahead().is_empty(), "none frozen yet");
        assert!(tasks.confirm_ahead(1));
        assert!(!tasks.confirm_ahead(1), "confirmed once");
        assert!(tasks.confirm_ahead(2));
        assert!(!tasks.confirm_ahead(4), "never paused ahead");
        tasks.paused(4, op("pause")).unwrap();
        assert_eq!(tasks.to_checkpoint_ahead(), [1, 2, 4]);
        tasks.checkpointed_ahead(1, Ok(Some(op("checkpoint"))));
        tasks.checkpointed_ahead(4, Ok(None));
        tasks.checkpointed_ahead(2, Err(()));
        assert_eq!(tasks.to_checkpoint_ahead(), Vec::<i32>::new());
        assert_eq!(tasks.stage(2).unwrap().name(), "failed");
        let adopt = tasks
            .checkpoint(1, "f/1".into(), vec![1], 0, vec![])
            .unwrap()
            .unwrap();
        assert!(adopt.checkpointed_ahead);
        let names: Vec<&str> = adopt.operations.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["pause", "checkpoint"]);
        assert!(tasks
            .checkpoint(2, "f/1".into(), vec![1], 0, vec![])
            .is_err());
        // 3 left the tree before CRIU reached it: given back whatever the dump does.
        assert_eq!(tasks.release_unconfirmed(), [3]);
        assert!(tasks.release_unconfirmed().is_empty());
        assert_eq!(tasks.release(), [1, 2, 4]);
    }

    #[test]
    fn the_tree_is_paused_once_and_its_end_recorded() {
        let mut tasks = DumpTasks::default();
        assert!(tasks.pause_tree(), "the first PAUSE_DEVICES");
        assert!(!tasks.pause_tree(), "once");
        assert!(!tasks.kept());
        tasks.keep();
        assert!(tasks.kept());
        assert_eq!(tasks.give_back_failure(), None);
        tasks.give_back_failed("first".into());
        tasks.give_back_failed("second".into());
        assert_eq!(tasks.give_back_failure(), Some("first"));
    }

    #[test]
    fn too_many_fds_are_refused() {
        let mut tasks = DumpTasks::default();
        tasks
            .checkpoint(1, "f/1".into(), vec![1], 2, fds(1))
            .unwrap();
        assert!(tasks.buffers(1, 1, fds(2)).is_err());
    }

    #[test]
    fn a_task_without_device_files_is_found_by_its_pid_in_the_image() {
        let mut tasks = RestoreTasks::new([(1, 0, true), (2, 0, false)]);
        assert_eq!(
            tasks.resuming(900, Some(7)).unwrap(),
            None,
            "not in the image"
        );
        assert_eq!(
            tasks.resuming(901, Some(2)).unwrap(),
            None,
            "has files: by peer"
        );
        assert!(tasks.awaits_resume_without_files(900, 1));
        assert!(!tasks.awaits_resume_without_files(900, 2), "has files");
        assert!(
            !tasks.awaits_resume_without_files(900, 7),
            "not in the image"
        );
        assert_eq!(tasks.resuming(900, Some(1)).unwrap(), Some(0));
        assert!(!tasks.awaits_resume_without_files(900, 1), "asked already");
        assert!(tasks.resuming(900, Some(1)).is_err(), "twice");
        tasks.resumed(0, true).unwrap();
        assert_eq!(tasks.first_not_resumed(), Some((2, RestoreStage::Waiting)));
    }

    #[test]
    fn a_restore_task_is_resumed_only_with_every_buffer_attached() {
        let mut tasks = RestoreTasks::new([(1, 2, false), (2, 0, false)]);
        assert_eq!(tasks.resuming(500, None).unwrap(), None, "not one of ours");
        assert!(tasks.attach(0, 0, 1).is_err(), "before its file");
        tasks.recreating(0, 500).unwrap();
        assert!(tasks.recreating(0, 500).is_err(), "twice");
        tasks.attach(0, 0, 1).unwrap();
        let err = tasks.resuming(500, None).unwrap_err();
        assert_eq!(err.task, "task 1");
        assert_eq!(err.event, "RESUME_DEVICES_LATE");
        tasks.attach(0, 1, 1).unwrap();
        assert!(tasks.attach(0, 2, 1).is_err(), "more than it has");
        assert_eq!(tasks.resuming(500, None).unwrap(), Some(0));
        tasks.resumed(0, true).unwrap();
        assert_eq!(tasks.first_not_resumed(), Some((2, RestoreStage::Waiting)));
        // The plugin half failed after the helper's part: the task must not run.
        tasks.resume_failed(500);
        assert_eq!(tasks.first_not_resumed(), Some((1, RestoreStage::Failed)));
        // A resume ending again does not bring a failed task back.
        let err = tasks.resumed(0, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the end of its resume for task 1 while it is failed"
        );
        assert_eq!(tasks.first_not_resumed(), Some((1, RestoreStage::Failed)));
        tasks.recreating(1, 501).unwrap();
        assert_eq!(tasks.resuming(501, None).unwrap(), Some(1));
        tasks.resumed(1, false).unwrap();
        assert_eq!(tasks.first_not_resumed(), Some((1, RestoreStage::Failed)));
        assert_eq!(tasks.tasks[1].stage, RestoreStage::Failed);
    }

    #[test]
    fn only_a_task_being_resumed_ends_its_resume() {
        let mut tasks = RestoreTasks::new([(1, 0, false), (2, 0, true)]);
        let err = tasks.resumed(0, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the end of its resume for task 1 while it is waiting for its device file"
        );
        assert_eq!(tasks.first_not_resumed(), Some((1, RestoreStage::Waiting)));
        let err = tasks.resumed(1, false).unwrap_err();
        assert_eq!(err.stage, "recreating its device", "left as it was");
        tasks.recreating(0, 500).unwrap();
        assert_eq!(tasks.resuming(500, None).unwrap(), Some(0));
        tasks.resumed(0, false).unwrap();
        assert!(
            tasks.resumed(0, true).is_err(),
            "ended once: failed stays failed"
        );
        assert_eq!(tasks.first_not_resumed(), Some((1, RestoreStage::Failed)));
        // A task whose device could not be recreated is failed too.
        tasks.recreate_failed(1);
        assert_eq!(tasks.tasks[1].stage, RestoreStage::Failed);
        assert!(tasks.resuming(900, Some(2)).is_err(), "failed: not resumed");
    }
}
