//! The process exit codes of `gpucr`, one named constant per outcome.
//!
//! These are part of gpucr's interface: scripts branch on them. They are listed in the
//! README and in every man page (`EXIT STATUS`). `gpucr restore` without `--detach` is the
//! exception: it waits for the restored tree and exits with the tree's own status.
//!
//! This module is a leaf: it holds the codes and the [`ExitCode`] trait, and imports no
//! other module of gpucr. Each error type maps itself to a code in its own module
//! (`impl ExitCode for ...`), and the command line's `Failure` (one enum of every
//! error a command ends with) picks it with one exhaustive match.

/// Success (for `check-topology DIR`: the image can be restored here; for
/// `inspect --verify`: the image is intact).
pub const SUCCESS: u8 = 0;
/// An unexpected internal error (a bug, or an I/O error no other code covers).
pub const FAILURE: u8 = 1;
/// The command line is wrong: unknown flag, bad value, missing argument.
pub const USAGE: u8 = 2;
/// The target process does not exist, has exited, is a kernel thread, is gpucr itself,
/// or may not be checkpointed by this user (needs root or CAP_CHECKPOINT_RESTORE).
pub const TARGET: u8 = 3;
/// CRIU cannot be used: not installed, not executable, too old, or it died or broke the
/// RPC protocol.
pub const CRIU_UNAVAILABLE: u8 = 4;
/// CRIU ran and reported that the dump or restore failed (for a reason of its own, or of
/// gpucr's plugin other than a device's: see [`DEVICE_FAILED`]).
pub const CRIU_FAILED: u8 = 5;
/// The image directory cannot be written: not empty (without `--force`), not writable,
/// not a directory; or another gpucr holds it (a dump writing it, an on-demand restore
/// still serving from it).
pub const IMAGE_DIR: u8 = 6;
/// The image is damaged: a checksum, size, manifest field or CRIU image does not match.
pub const IMAGE_DAMAGED: u8 = 7;
/// The image is incomplete: no manifest (`gpucr.json`), or the dump was marked failed.
pub const IMAGE_INCOMPLETE: u8 = 8;
/// The GPU topology of this machine cannot hold the image.
pub const TOPOLOGY_INCOMPATIBLE: u8 = 9;
/// `dump --leave-running`: the image is complete, but a task of the tree that lives on
/// may not have its device back (a driver's restore or unlock failed after the dump).
pub const GIVE_BACK_FAILED: u8 = 10;
/// A GPU step failed: the device or its driver refused, or did not finish in time, a
/// lock, a checkpoint, a restore or a resume of a task. A dump leaves the tree running
/// and the image incomplete; a restore leaves no process.
pub const DEVICE_FAILED: u8 = 11;
/// A migration failed: the link, the peer's authentication, the receiver or the
/// destination's restore (`gpucr migrate`: the job runs on, on the source; `gpucr
/// receive`: nothing restored is left running, and nothing received is kept).
pub const MIGRATION_FAILED: u8 = 12;
/// `gpucr migrate`: the link was lost after the source gave its copy up (commit), so
/// whether the destination let the job run is unknown; the source keeps its copy
/// stopped, never running beside the destination's.
pub const MIGRATION_UNCERTAIN: u8 = 13;
/// SIGINT, SIGTERM or SIGHUP stopped a dump (the tree keeps running, the image is marked
/// incomplete) or a restore (no restored process is left): 128 + SIGINT, as a shell
/// reports a command Ctrl-C stopped.
pub const INTERRUPTED: u8 = 130;

/// Every documented exit code with its one-line meaning, in order. The README table and
/// the man pages are generated from (and tested against) this list.
pub const ALL: &[(u8, &str)] = &[
    (
        SUCCESS,
        "success (check-topology: compatible; inspect --verify: intact)",
    ),
    (FAILURE, "unexpected internal error"),
    (USAGE, "usage error (bad flag, value or argument)"),
    (
        TARGET,
        "target process not found, a kernel thread or a thread (not a process), traced by another process, a GPU process stopped by a signal, or not permitted",
    ),
    (
        CRIU_UNAVAILABLE,
        "CRIU missing, too old, it broke the RPC protocol, or it did not answer within 30 s",
    ),
    (CRIU_FAILED, "CRIU reported that the dump or restore failed"),
    (
        IMAGE_DIR,
        "image directory not usable (not empty, not writable, not a directory, no room for the manifest, in use by another gpucr dump or on-demand restore)",
    ),
    (
        IMAGE_DAMAGED,
        "image damaged (checksum, size or format mismatch)",
    ),
    (
        IMAGE_INCOMPLETE,
        "image incomplete (no manifest, or the dump failed)",
    ),
    (TOPOLOGY_INCOMPATIBLE, "GPU topology incompatible"),
    (
        GIVE_BACK_FAILED,
        "dump --leave-running: image complete, but a task may not have its GPU back",
    ),
    (
        DEVICE_FAILED,
        "a GPU driver or device step failed (a dump leaves the tree running, a restore no process)",
    ),
    (
        MIGRATION_FAILED,
        "migration failed (link, authentication, receiver or destination restore): migrate leaves the job running on the source, receive leaves nothing running",
    ),
    (
        MIGRATION_UNCERTAIN,
        "migrate: link lost after the commit: the source's copy is kept stopped; the job runs on the destination if the commit arrived",
    ),
    (
        INTERRUPTED,
        "interrupted (SIGINT/SIGTERM/SIGHUP): a dump leaves the tree running, a restore leaves no process",
    ),
];

/// The `EXIT STATUS` text shared by the man pages and `--help`.
pub fn table() -> String {
    ALL.iter()
        .map(|(code, meaning)| format!("  {code:>3}  {meaning}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An error (or outcome) that knows which exit code `gpucr` ends with because of it.
pub trait ExitCode {
    /// The process exit code, one of the constants of this module.
    fn exit_code(&self) -> u8;
}
