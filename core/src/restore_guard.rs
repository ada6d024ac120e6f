//! The restore's guard (`gpucr restore-guard`, hidden; see `crate::guard`).
//!
//! gpucr answers CRIU's post-restore notification only once every page is verified and
//! every buffer filled. After it, CRIU brings the devices back (RESUME_DEVICES_LATE) and
//! then resumes the tree whatever their outcome: it only logs a failed
//! RESUME_DEVICES_LATE or pre-resume. gpucr stops a tree whose devices did not come
//! back (`restore::restore`, at pre-resume); a gpucr killed in that window cannot, and
//! CRIU would let a half-restored tree run, its CUDA calls blocked forever.
//!
//! So a restore of an image with GPU state starts this guard, tells it the restored
//! root at post-restore (`root PID START`, the start time telling the process from a
//! later one with the same pid), and says `done` once the restore is over, whatever its
//! outcome. Input that ends without `done` after a root: the guard sends the tree
//! SIGSTOP at once (a task CRIU still traces takes it the moment CRIU detaches, before
//! it runs an instruction), waits until CRIU has let go, and kills the tree.
//!
//! `gpucr receive` starts the same guard for each migration it takes, as soon as it
//! makes the image's directory (`discard DIR`), tells it the restored root once CRIU
//! has restored the tree, stopped, and says `done` once the tree may run without it
//! (stop-and-copy: the source's Commit; post-copy: every page in). Input that ends
//! without `done` then kills the tree as above and removes the directory: a receiver
//! killed outright leaves neither a stopped tree nor a partial image behind.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::guard::{GuardProcess, Recorded};

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "restore-guard";

/// gpucr's end of a running restore guard.
#[derive(Debug)]
pub struct RestoreGuard(GuardProcess);

impl RestoreGuard {
    /// Start `gpucr restore-guard`.
    pub fn start() -> io::Result<RestoreGuard> {
        GuardProcess::start([SUBCOMMAND]).map(RestoreGuard)
    }

    /// Tell the guard the restored tree's root.
    pub fn root(&self, pid: i32) {
        if let Some(root) = Root::now(pid) {
            self.0.send(&root.line(ROOT));
        }
    }

    /// Tell the guard to remove `dir` (a directory this gpucr made) should gpucr die
    /// before it says `done`. A path that is not one line of UTF-8 is not recorded.
    pub fn discard(&self, dir: &Path) {
        if let Some(record) = discard_record(dir) {
            self.0.send(&record);
        }
    }
}

/// The record `discard DIR` for `dir`, made absolute (the guard reads only absolute
/// paths, and `gpucr receive --dir` may be relative); None for a path that is not one
/// line of UTF-8.
fn discard_record(dir: &Path) -> Option<String> {
    let dir = std::path::absolute(dir).ok()?;
    let dir = dir.to_str().filter(|d| !d.contains('\n'))?;
    Some(format!("{DISCARD} {dir}"))
}

/// The record's word for a directory to remove.
const DISCARD: &str = "discard";

/// The directories the records name to remove, in their order.
pub fn discarded(lines: &[String]) -> Vec<PathBuf> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(DISCARD)?.strip_prefix(' '))
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The restored tree's root, as gpucr recorded it at post-restore.
pub type Root = Recorded;

/// The record's word for the root: `root PID START`.
const ROOT: &str = "root";

/// The root the records name (the last one), if any.
pub fn root(lines: &[String]) -> Option<Root> {
    lines
        .iter()
        .filter_map(|l| Root::parse(ROOT, l))
        .next_back()
}

/// Stop the tree of `root` at once, and again every few milliseconds until CRIU has let
/// go of it (up to `wait`), then kill it. The pids signalled; none when `root` is no
/// longer the restored process.
///
/// A SIGSTOP sent while CRIU traces a task may be swallowed by CRIU (it reports to the
/// tracer, which resumes the task without it); sent again right after CRIU detached, it
/// stops the task within milliseconds of its first instruction.
pub fn kill_half_restored(root: Root, wait: Duration) -> Vec<i32> {
    let mut signalled: Vec<i32> = Vec::new();
    // Signals the tree as it is now; returns its pids (none once the root is gone).
    let mut signal_tree = |signal: Signal| -> Vec<i32> {
        if !root.is_alive() {
            return Vec::new();
        }
        let pids = gpucr_abi::procfs::tree_pids(root.pid);
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), signal);
            if !signalled.contains(&pid) {
                signalled.push(pid);
            }
        }
        pids
    };
    crate::guard::until_untraced(wait, Duration::from_millis(2), || {
        signal_tree(Signal::SIGSTOP)
    });
    // SIGKILL also ends a stopped task.
    signal_tree(Signal::SIGKILL);
    signalled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_record_reads_back_and_the_last_one_wins() {
        let first = Root { pid: 10, start: 5 };
        let second = Root { pid: 11, start: 6 };
        assert_eq!(Root::parse(ROOT, &first.line(ROOT)), Some(first));
        let lines = vec![first.line(ROOT), "garbage".into(), second.line(ROOT)];
        assert_eq!(root(&lines), Some(second));
        for bad in ["root", "root 1", "root 1 2 3", "root x 2", "task 1 2 3"] {
            assert_eq!(Root::parse(ROOT, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn discarded_directories_read_back_and_relative_ones_are_skipped() {
        let lines: Vec<String> = [
            "root 1 2",
            "discard /var/lib/gpucr/in/migration-x",
            "discard relative",
            "discarded /nope",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            discarded(&lines),
            [PathBuf::from("/var/lib/gpucr/in/migration-x")]
        );
        assert_eq!(root(&lines), Some(Root { pid: 1, start: 2 }));
    }

    #[test]
    fn a_relative_directory_is_recorded_absolute_and_reads_back() {
        let record = discard_record(Path::new("in/migration-x")).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(discarded(&[record]), [cwd.join("in/migration-x")]);
        assert_eq!(discard_record(Path::new("/a\nb")), None);
    }

    #[test]
    fn a_root_that_is_another_process_now_is_left_alone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = crate::target::start_time(pid).unwrap();
        let other = Root {
            pid,
            start: start + 1,
        };
        assert!(kill_half_restored(other, Duration::from_secs(1)).is_empty());
        assert!(crate::target::is_running(pid));
        let root = Root { pid, start };
        assert_eq!(kill_half_restored(root, Duration::from_secs(1)), [pid]);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
