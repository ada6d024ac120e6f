//! Processes as /proc shows them (their trees and their mappings), for gpucr and its
//! plugin alike.

use std::io;
use std::path::PathBuf;

/// The threads of `pid` (`/proc/PID/task`), none once it is gone.
pub fn threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The children of `pid`, of every thread of it (/proc/PID/task/TID/children); none
/// once it is gone.
pub fn children(pid: i32) -> Vec<i32> {
    threads(pid)
        .into_iter()
        .flat_map(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// `pid` and all its descendants ([`children`]), each once, parents before their
/// children.
pub fn tree_pids(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        for c in children(out[i]) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// Send SIGSTOP to every process of the tree rooted at `root` ([`tree_pids`]); how many
/// were sent it. A tree held frozen (by CRIU, under ptrace) takes the signal pending, and
/// stops as it is let go, before it runs an instruction of its own.
pub fn stop_tree(root: i32) -> usize {
    let pids = tree_pids(root);
    for pid in &pids {
        // SAFETY: kill(2) with a pid and a signal number touches no memory of ours.
        unsafe { libc::kill(*pid, libc::SIGSTOP) };
    }
    pids.len()
}

/// A task of a tree that a process traces (a debugger, `strace -p`). CRIU must trace
/// every task it dumps itself, and a task has one tracer: CRIU's own failure to seize
/// it says nothing about why, so gpucr (and its plugin in a CRIU gpucr did not start)
/// refuses such a tree with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pid {pid} is traced by pid {tracer} ({tracer_comm}): a process can have one tracer, \
     and CRIU must be it; detach {tracer} and dump again"
)]
pub struct Traced {
    /// The traced task (a thread id where a thread other than its process's first is
    /// traced).
    pub pid: i32,
    pub tracer: i32,
    /// The tracer's name, "gone" once it has exited.
    pub tracer_comm: String,
}

/// The first traced task of the tree rooted at `root` (every thread of every process),
/// None when no task of it is traced.
pub fn traced_task(root: i32) -> Option<Traced> {
    tree_pids(root).into_iter().find_map(|process| {
        threads(process).into_iter().find_map(|task| {
            let status = std::fs::read_to_string(format!("/proc/{process}/task/{task}/status"));
            let tracer = parse_tracer(&status.ok()?)?;
            let tracer_comm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_else(|_| "gone".to_owned());
            Some(Traced {
                pid: task,
                tracer,
                tracer_comm,
            })
        })
    })
}

/// The `TracerPid:` of a `/proc/PID/status` text, None when 0 (untraced) or missing.
pub fn parse_tracer(status: &str) -> Option<i32> {
    status_value(status, "TracerPid")?
        .parse()
        .ok()
        .filter(|&tracer| tracer != 0)
}

/// The value of the `NAME:` line of a `/proc/PID/status` text, trimmed ("412" for
/// `Tgid`, "1234 kB" for `VmRSS`).
pub fn status_value<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The state letter of `pid` (`State:` of `/proc/PID/status`: R, S, D, T stopped, t
/// traced, Z zombie, X dead, ...); None when it is gone.
pub fn state(pid: i32) -> Option<char> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_value(&status, "State")?.chars().next()
}

/// Whether a task in `state` (its state letter) has exited: Z (zombie) or X/x (dead).
pub fn is_exited_state(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

/// Whether `pid` has exited: gone, or a zombie. CRIU dumps a zombie of the tree without
/// calling its plugins' CHECKPOINT_DEVICES.
pub fn has_exited(pid: i32) -> bool {
    state(pid).is_none_or(is_exited_state)
}

/// Whether `pid` is stopped by a signal (SIGSTOP, or job control's SIGTSTP).
pub fn is_stopped(pid: i32) -> bool {
    state(pid) == Some('T')
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// The permissions as the kernel writes them: read, write, execute (`r`, `w`, `x`
    /// or `-`), then `p` (private) or `s` (shared), as in `rw-p`.
    pub perms: String,
    /// The offset into the mapped file, in bytes.
    pub offset: u64,
    /// The mapped file, as the kernel writes its path: everything after the inode
    /// field, spaces included (a file deleted since ends in " (deleted)"). None for
    /// anonymous memory and the kernel's own areas (`[heap]`, `[stack]`, `[vdso]`).
    pub path: Option<PathBuf>,
}

/// Parse one line of `/proc/PID/maps`: "START-END PERMS OFFSET DEV INODE   PATH". The
/// path is the rest of the line after the padding, so a path with spaces stays whole.
pub fn parse_mapping(line: &str) -> Option<Mapping> {
    let (range, rest) = line.split_once(' ')?;
    let (perms, rest) = rest.split_once(' ')?;
    let (offset, rest) = rest.split_once(' ')?;
    let (_device, rest) = rest.split_once(' ')?;
    let path = rest.split_once(' ').map_or("", |(_inode, path)| path);
    let path = path.trim_start_matches(' ');
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.to_owned(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.starts_with('/').then(|| PathBuf::from(path)),
    })
}

/// The mappings of `pid`, in address order.
pub fn mappings(pid: i32) -> io::Result<Vec<Mapping>> {
    let maps = std::fs::read_to_string(maps_path(pid))?;
    Ok(maps.lines().filter_map(parse_mapping).collect())
}

/// The files `pid` maps, each as often as it is mapped.
pub fn mapped_files(pid: i32) -> io::Result<Vec<PathBuf>> {
    Ok(mappings(pid)?.into_iter().filter_map(|m| m.path).collect())
}

/// `/proc/PID/maps`, for error messages.
pub fn maps_path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/maps"))
}

/// The numbers of the fds `pid` has open, read as the caller goes; none if `pid`'s fd
/// table cannot be read.
pub fn fd_numbers(pid: i32) -> impl Iterator<Item = i32> {
    read_fd_numbers(pid).into_iter().flatten()
}

/// [`fd_numbers`], or why `pid`'s fd table cannot be read.
pub fn read_fd_numbers(pid: i32) -> io::Result<impl Iterator<Item = i32>> {
    Ok(std::fs::read_dir(fd_dir(pid))?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok()))
}

/// `/proc/PID/fd`: the links to the files `pid` has open, one per fd number.
pub fn fd_dir(pid: i32) -> String {
    format!("/proc/{pid}/fd")
}

/// The files `pid` has open: each fd's number and the path `/proc/PID/fd/N` links to
/// (pipes, sockets and anonymous files as their link text, `pipe:[N]`, not absolute),
/// read as the caller goes; none if `pid`'s fd table cannot be read.
pub fn open_files(pid: i32) -> impl Iterator<Item = (i32, PathBuf)> {
    read_open_files(pid).into_iter().flatten()
}

/// [`open_files`], or why `pid`'s fd table cannot be read.
pub fn read_open_files(pid: i32) -> io::Result<impl Iterator<Item = (i32, PathBuf)>> {
    let dir = fd_dir(pid);
    Ok(read_fd_numbers(pid)?
        .filter_map(move |fd| Some((fd, std::fs::read_link(format!("{dir}/{fd}")).ok()?))))
}

/// `/proc/PID/fdinfo/FD`: where an fd's open flags are.
pub fn fdinfo_path(pid: i32, fd: i32) -> String {
    format!("/proc/{pid}/fdinfo/{fd}")
}

/// The open flags in an fd's `fdinfo` text (its `flags:` line, octal).
pub fn parse_fd_flags(fdinfo: &str) -> Option<i32> {
    fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .and_then(|octal| i32::from_str_radix(octal.trim(), 8).ok())
}

/// The files `pid` has open for writing (write-only or read-write), other than deleted
/// files and what is not a path (pipes, sockets). Empty if `pid` cannot be read.
pub fn files_open_for_writing(pid: i32) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = open_files(pid)
        .filter(|(_, target)| {
            target.is_absolute() && !target.to_string_lossy().ends_with(" (deleted)")
        })
        .filter_map(|(fd, target)| {
            let info = std::fs::read_to_string(fdinfo_path(pid, fd)).ok()?;
            let flags = parse_fd_flags(&info)?;
            (flags & libc::O_ACCMODE != libc::O_RDONLY).then_some(target)
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_fd_is_listed_with_its_file() {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let me = std::process::id() as i32;
        let fd = file.as_raw_fd();
        assert!(fd_numbers(me).any(|n| n == fd));
        let target = open_files(me).find(|(n, _)| *n == fd).map(|(_, t)| t);
        assert_eq!(target, Some(PathBuf::from(format!("/proc/{me}/status"))));
        assert_eq!(fd_numbers(i32::MAX).count(), 0);
    }

    #[test]
    fn files_open_for_writing_are_told_from_those_open_for_reading() {
        let dir = std::env::temp_dir().join(format!("gpucr-abi-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let written = dir.join("written.log");
        let read = dir.join("read.img");
        std::fs::write(&read, b"x").unwrap();
        let writing = std::fs::File::create(&written).unwrap();
        let reading = std::fs::File::open(&read).unwrap();
        let both = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&read);
        let me = std::process::id() as i32;
        let open = files_open_for_writing(me);
        drop(both);
        let after = files_open_for_writing(me);
        drop((writing, reading));
        std::fs::remove_dir_all(&dir).unwrap();
        let mine = |files: &[PathBuf]| -> Vec<PathBuf> {
            files
                .iter()
                .filter(|f| f.starts_with(&dir))
                .cloned()
                .collect()
        };
        assert_eq!(mine(&open).len(), 2, "{open:?}");
        assert!(
            mine(&after).iter().any(|f| f.ends_with("written.log")),
            "{after:?}"
        );
        assert!(
            !mine(&after).iter().any(|f| f.ends_with("read.img")),
            "{after:?}"
        );
        assert!(files_open_for_writing(i32::MAX).is_empty());
    }

    #[test]
    fn the_tracer_is_read_from_status() {
        assert_eq!(parse_tracer("Name:\tx\nTracerPid:\t0\n"), None);
        assert_eq!(parse_tracer("TracerPid:\t77\n"), Some(77));
        assert_eq!(parse_tracer("Name:\tx\n"), None);
        // A field whose name begins another's is not taken for it.
        assert_eq!(
            status_value("VmRSSx:\t1 kB\nVmRSS:\t 2 kB\n", "VmRSS"),
            Some("2 kB")
        );
        assert_eq!(traced_task(std::process::id() as i32), None);
    }

    #[test]
    fn a_mapping_line_keeps_its_whole_path() {
        let line =
            "7fee80042000-7fee80043000 rw-s 00001000 fe:00 10011426                   /tmp/a b/c";
        assert_eq!(
            parse_mapping(line),
            Some(Mapping {
                start: 0x7fee80042000,
                end: 0x7fee80043000,
                perms: "rw-s".into(),
                offset: 0x1000,
                path: Some(PathBuf::from("/tmp/a b/c")),
            })
        );
        let deleted = "7f00-7f01 rw-s 00000000 00:01 5  /memfd:x (deleted)";
        assert_eq!(
            parse_mapping(deleted).unwrap().path,
            Some(PathBuf::from("/memfd:x (deleted)"))
        );
        for anonymous in [
            "7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]",
            "55d0-55d1 rw-p 00000000 00:00 0 ",
            "55d0-55d1 rw-p 00000000 00:00 0",
        ] {
            let m = parse_mapping(anonymous).unwrap();
            assert_eq!(m.path, None, "{anonymous}");
        }
        assert_eq!(parse_mapping("garbage"), None);
        assert_eq!(parse_mapping("zz-1 r--p 0 00:00 0"), None);
    }

    #[test]
    fn a_file_mapped_here_under_a_path_with_spaces_is_found() {
        let dir = std::env::temp_dir().join(format!("gpucr procfs {}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mapped file");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh private read-only mapping of a whole open file, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let files = mapped_files(std::process::id() as i32).unwrap();
        let found = mappings(std::process::id() as i32)
            .unwrap()
            .into_iter()
            .find(|m| m.start == addr as u64);
        // SAFETY: the mapping made above, of 4096 bytes, no longer used.
        unsafe { libc::munmap(addr, 4096) };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(files.contains(&path), "{files:?}");
        assert_eq!(found.unwrap().path, Some(path));
    }

    #[test]
    fn a_child_is_in_its_parents_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let tree = tree_pids(me);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree[0], me);
        assert!(tree.contains(&(child.id() as i32)), "{tree:?}");
    }

    /// Whether `holds` becomes true within 10 s, looking every 5 ms.
    fn within_10_s(holds: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !holds() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        holds()
    }

    /// A running process has not exited; a zombie (exited, not yet reaped) has, and so
    /// has a reaped one.
    #[test]
    fn a_zombie_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(!has_exited(std::process::id() as i32));
        assert!(
            within_10_s(|| has_exited(pid)),
            "`true` did not end within 10 s"
        );
        assert!(
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok(),
            "still a zombie, not reaped"
        );
        child.wait().unwrap();
        assert!(has_exited(pid));
    }

    /// A process stopped by SIGSTOP is stopped until SIGCONT; a sleeping one is not.
    #[test]
    fn a_stopped_process_is_seen_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!is_stopped(pid));
        let signal = |sig| {
            // SAFETY: kill with a pid this test spawned and has not reaped.
            assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        };
        signal(libc::SIGSTOP);
        let stopped = within_10_s(|| is_stopped(pid));
        signal(libc::SIGCONT);
        let _ = child.kill();
        let _ = child.wait();
        assert!(stopped, "SIGSTOP did not stop it within 10 s");
    }
}
