//! CRIU's notifications during a request, as a type: what CRIU is about to do, and the
//! pid it names where it names one.
//!
//! CRIU sends one before each of its action-script stages (`criu/include/action-scripts.h`)
//! and waits for the answer: a refusal fails the stage, and with it the request (except
//! network-unlock, post-resume and pre-resume, which CRIU only logs). The names on the
//! wire are kept for the timeline's event names and for stages CRIU may add later.

use std::fmt;

/// A notification CRIU sent during a dump or a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// The tree is about to be frozen.
    PreDump,
    /// The network of the tree's namespace is locked.
    NetworkLock,
    /// CRIU asks which external files it may dump.
    QueryExtFiles,
    /// The image is written and the tree still held: the last moment a dump can fail
    /// with the tree left as it was.
    PostDump,
    /// The network is unlocked (a failure here is only logged).
    NetworkUnlock,
    /// A restore begins.
    PreRestore,
    /// The restored root's namespaces exist (`pid`: the restored root).
    SetupNamespaces { pid: Option<i32> },
    /// The tasks are being restored inside their namespaces.
    PostSetupNamespaces,
    /// Every task is restored and none has run (`pid`: the restored root). A refusal
    /// makes CRIU kill the tree.
    PostRestore { pid: Option<i32> },
    /// The tasks are about to run (a refusal is only logged).
    PreResume,
    /// The tasks run.
    PostResume,
    /// A stage this version of gpucr has no name for, as CRIU named it.
    Other(String),
}

impl Notification {
    /// The notification CRIU names `script`, with the pid it sent.
    pub fn from_wire(script: &str, pid: Option<i32>) -> Notification {
        match script {
            "pre-dump" => Notification::PreDump,
            "network-lock" => Notification::NetworkLock,
            "query-ext-files" => Notification::QueryExtFiles,
            "post-dump" => Notification::PostDump,
            "network-unlock" => Notification::NetworkUnlock,
            "pre-restore" => Notification::PreRestore,
            "setup-namespaces" => Notification::SetupNamespaces { pid },
            "post-setup-namespaces" => Notification::PostSetupNamespaces,
            "post-restore" => Notification::PostRestore { pid },
            "pre-resume" => Notification::PreResume,
            "post-resume" => Notification::PostResume,
            other => Notification::Other(other.to_owned()),
        }
    }

    /// CRIU's name for it ("post-dump"): the timeline's event name.
    pub fn name(&self) -> &str {
        match self {
            Notification::PreDump => "pre-dump",
            Notification::NetworkLock => "network-lock",
            Notification::QueryExtFiles => "query-ext-files",
            Notification::PostDump => "post-dump",
            Notification::NetworkUnlock => "network-unlock",
            Notification::PreRestore => "pre-restore",
            Notification::SetupNamespaces { .. } => "setup-namespaces",
            Notification::PostSetupNamespaces => "post-setup-namespaces",
            Notification::PostRestore { .. } => "post-restore",
            Notification::PreResume => "pre-resume",
            Notification::PostResume => "post-resume",
            Notification::Other(name) => name,
        }
    }

    /// What it means, for the user ("CRIU: dump written").
    pub fn describe(&self) -> String {
        let text = match self {
            Notification::PreDump => "freezing the tree",
            Notification::NetworkLock => "network locked",
            Notification::QueryExtFiles => "dumping files",
            Notification::PostDump => "dump written",
            Notification::NetworkUnlock => "network unlocked",
            Notification::PreRestore => "restoring",
            Notification::SetupNamespaces { .. } => "namespaces created",
            Notification::PostSetupNamespaces => "restoring tasks",
            Notification::PostRestore { .. } => "tasks restored",
            Notification::PreResume => "resuming",
            Notification::PostResume => "tree running",
            Notification::Other(name) => name,
        };
        format!("CRIU: {text}")
    }
}

impl fmt::Display for Notification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_stage_round_trips_through_its_wire_name() {
        let all = [
            Notification::PreDump,
            Notification::NetworkLock,
            Notification::QueryExtFiles,
            Notification::PostDump,
            Notification::NetworkUnlock,
            Notification::PreRestore,
            Notification::SetupNamespaces { pid: Some(7) },
            Notification::PostSetupNamespaces,
            Notification::PostRestore { pid: Some(7) },
            Notification::PreResume,
            Notification::PostResume,
        ];
        for n in all {
            assert_eq!(Notification::from_wire(n.name(), Some(7)).name(), n.name());
            assert!(!matches!(
                Notification::from_wire(n.name(), None),
                Notification::Other(_)
            ));
        }
    }

    #[test]
    fn the_restored_root_is_kept_and_unknown_stages_keep_their_name() {
        assert_eq!(
            Notification::from_wire("post-restore", Some(42)),
            Notification::PostRestore { pid: Some(42) }
        );
        let other = Notification::from_wire("status-ready", None);
        assert_eq!(other, Notification::Other("status-ready".into()));
        assert_eq!(other.describe(), "CRIU: status-ready");
        assert_eq!(Notification::PostDump.describe(), "CRIU: dump written");
    }
}
