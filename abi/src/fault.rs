//! Fault injection, for tests of every failure path: `GPUCR_FAULT=STEP` makes gpucr's
//! helper or its CRIU plugin fail at that step of a dump or a restore, after the
//! step's own work (so what it changed must be undone), as a driver error or a broken
//! device there would. Unset, nothing is injected; the check is one environment lookup.
//!
//! The same variable reaches the helper (gpucr's process) and the plugin (CRIU's
//! processes, which inherit gpucr's environment).

/// The environment variable naming the step to fail.
pub const ENV_FAULT: &str = "GPUCR_FAULT";

/// A step of a dump or a restore where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultStep {
    /// Plugin, PAUSE_DEVICES (before the freeze).
    PluginPause,
    /// Helper, after the backend's step before the freeze (a driver lock).
    Pause,
    /// Plugin, CHECKPOINT_DEVICES, after collecting the task's state and buffer fds.
    PluginCheckpoint,
    /// Helper, after the backend took the task over (a driver checkpoint).
    Checkpoint,
    /// Helper, reading device memory into the image.
    Copy,
    /// Helper, DUMP_EXT_FILE: recording the device file.
    DumpFile,
    /// Helper, at the end of a dump the tree outlives (`--leave-running`), after the
    /// backend gave every task its device back (a driver restore and unlock). The
    /// image is complete; only a tree that lives on reaches it.
    GiveBack,
    /// Helper, RESTORE_EXT_FILE: after building the task's restore spec.
    RestoreFile,
    /// Plugin, RESTORE_EXT_FILE inside the restored task, after recreating the device.
    PluginRecreate,
    /// Helper, writing device memory back.
    Fill,
    /// Helper, RESUME_DEVICES_LATE, after the backend brought the device back.
    Resume,
    /// Plugin, RESUME_DEVICES_LATE, after the helper answered.
    PluginResume,
}

impl FaultStep {
    /// Every step, in the order a dump then a restore reaches them.
    pub const ALL: [FaultStep; 12] = [
        FaultStep::PluginPause,
        FaultStep::Pause,
        FaultStep::PluginCheckpoint,
        FaultStep::Checkpoint,
        FaultStep::Copy,
        FaultStep::DumpFile,
        FaultStep::GiveBack,
        FaultStep::RestoreFile,
        FaultStep::PluginRecreate,
        FaultStep::Fill,
        FaultStep::Resume,
        FaultStep::PluginResume,
    ];

    /// The name `GPUCR_FAULT` takes.
    pub fn name(self) -> &'static str {
        match self {
            FaultStep::PluginPause => "plugin-pause",
            FaultStep::Pause => "pause",
            FaultStep::PluginCheckpoint => "plugin-checkpoint",
            FaultStep::Checkpoint => "checkpoint",
            FaultStep::Copy => "copy",
            FaultStep::DumpFile => "dump-file",
            FaultStep::GiveBack => "give-back",
            FaultStep::RestoreFile => "restore-file",
            FaultStep::PluginRecreate => "plugin-recreate",
            FaultStep::Fill => "fill",
            FaultStep::Resume => "resume",
            FaultStep::PluginResume => "plugin-resume",
        }
    }

    /// Whether the step belongs to a dump (else to a restore).
    pub fn is_dump(self) -> bool {
        matches!(
            self,
            FaultStep::PluginPause
                | FaultStep::Pause
                | FaultStep::PluginCheckpoint
                | FaultStep::Checkpoint
                | FaultStep::Copy
                | FaultStep::DumpFile
                | FaultStep::GiveBack
        )
    }

    /// Whether `GPUCR_FAULT` names this step.
    pub fn injected(self) -> bool {
        std::env::var_os(ENV_FAULT).is_some_and(|v| v == self.name())
    }

    /// The message of an injected fault.
    pub fn message(self) -> String {
        format!("fault injected at step {} ({ENV_FAULT})", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_split_into_dump_and_restore() {
        let mut names: Vec<&str> = FaultStep::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FaultStep::ALL.len());
        let dump = FaultStep::ALL.iter().filter(|s| s.is_dump()).count();
        assert_eq!(dump, 7);
        assert!(FaultStep::Copy.message().contains("step copy"));
    }
}
