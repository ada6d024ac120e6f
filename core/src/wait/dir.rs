//! A watch on the files of one directory, chosen by name: block until one of them is
//! created or moved in, written, or closed after writing (inotify), instead of listing
//! the directory or reading the files again and again.
//!
//! inotify reports `write(2)` into a file as `IN_MODIFY`; older kernels do not report
//! what `splice(2)` writes (CRIU's pages), recent ones do. Creation, renames and the
//! closing of a written file are reported on every kernel, and an overflowing queue is
//! reported too ([`Changes::lost`]). A wait has a time limit all the same, so that a
//! change nothing reports is only found late, never missed for good.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// What happened to the selected files since the last wait.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// One was created, or moved into the directory.
    pub created: bool,
    /// One was written into (`IN_MODIFY`).
    pub written: bool,
    /// One that was open for writing was closed.
    pub closed: bool,
    /// Changes may have gone unreported: the event queue overflowed, or the watch
    /// ended (the directory went away).
    pub lost: bool,
}

impl Changes {
    fn any(&self) -> bool {
        self.created || self.written || self.closed || self.lost
    }
}

/// How a [`DirWatch::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// Selected files changed.
    Changed(Changes),
    /// The wake fd it was given turned readable (it is left readable).
    Wake,
    /// The time ran out with no change reported.
    TimedOut,
}

/// An inotify watch on one directory, reporting the files whose names `select` takes.
#[derive(Debug)]
pub struct DirWatch {
    inotify: Inotify,
    select: fn(&str) -> bool,
}

impl DirWatch {
    /// Watch `dir` (which must exist) for changes to the files whose names `select`
    /// takes. Changes from before this call are not reported: look at the directory
    /// once after it.
    pub fn new(dir: &Path, select: fn(&str) -> bool) -> io::Result<DirWatch> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(
            dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_ONLYDIR,
        )?;
        Ok(DirWatch { inotify, select })
    }

    /// Wait until a selected file changes, or `wake` (if given) turns readable, for at
    /// most `timeout`. The changes reported are all those queued since the last wait:
    /// several writes may come back as one.
    pub fn wait(&self, timeout: Duration, wake: Option<BorrowedFd<'_>>) -> io::Result<Woken> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = match wake {
                Some(wake) => match super::readable([wake, self.inotify.as_fd()], Some(left))? {
                    Some(0) => return Ok(Woken::Wake),
                    other => other.is_some(),
                },
                None => super::readable([self.inotify.as_fd()], Some(left))?.is_some(),
            };
            if !ready {
                return Ok(Woken::TimedOut);
            }
            let changes = self.drain()?;
            if changes.any() {
                return Ok(Woken::Changed(changes));
            }
            // Only files not selected changed: wait on for what is left of the time.
        }
    }

    /// Read every queued event: what they say of the selected files.
    fn drain(&self) -> io::Result<Changes> {
        let mut changes = Changes::default();
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(Errno::EAGAIN) => return Ok(changes),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if events.is_empty() {
                return Ok(changes);
            }
            for event in events {
                if event
                    .mask
                    .intersects(AddWatchFlags::IN_Q_OVERFLOW | AddWatchFlags::IN_IGNORED)
                {
                    changes.lost = true;
                    continue;
                }
                let selected = event
                    .name
                    .as_deref()
                    .and_then(|n| std::str::from_utf8(n.as_bytes()).ok())
                    .is_some_and(self.select);
                if !selected {
                    continue;
                }
                let mask = event.mask;
                changes.created |=
                    mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                changes.written |= mask.contains(AddWatchFlags::IN_MODIFY);
                changes.closed |= mask.contains(AddWatchFlags::IN_CLOSE_WRITE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};

    use nix::sys::eventfd::{EfdFlags, EventFd};

    use super::*;

    fn pages(name: &str) -> bool {
        name.starts_with("pages-")
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn creation_writes_and_closing_of_selected_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let watch = DirWatch::new(dir.path(), pages).unwrap();
        let short = Duration::from_millis(20);
        assert_eq!(watch.wait(short, None).unwrap(), Woken::TimedOut);
        // A file not selected wakes no one.
        std::fs::write(dir.path().join("core-1.img"), b"x").unwrap();
        assert_eq!(watch.wait(short, None).unwrap(), Woken::TimedOut);
        let mut f = std::fs::File::create(dir.path().join("pages-1.img")).unwrap();
        let Woken::Changed(c) = watch.wait(LONG, None).unwrap() else {
            panic!("no creation reported")
        };
        assert!(c.created && !c.written && !c.lost, "{c:?}");
        f.write_all(b"some pages").unwrap();
        let Woken::Changed(c) = watch.wait(LONG, None).unwrap() else {
            panic!("no write reported")
        };
        assert!(c.written && !c.created, "{c:?}");
        drop(f);
        let Woken::Changed(c) = watch.wait(LONG, None).unwrap() else {
            panic!("no close reported")
        };
        assert!(c.closed, "{c:?}");
        // Moved in under a selected name: as good as created.
        std::fs::write(dir.path().join("tmp"), b"x").unwrap();
        std::fs::rename(dir.path().join("tmp"), dir.path().join("pages-2.img")).unwrap();
        let Woken::Changed(c) = watch.wait(LONG, None).unwrap() else {
            panic!("no rename reported")
        };
        assert!(c.created, "{c:?}");
    }

    #[test]
    fn what_splice_writes_wakes_the_wait_or_the_time_limit_does() {
        // CRIU writes its pages with splice(2), which older kernels do not report:
        // either way the wait ends, by the event or by its time limit.
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("pages-1.img")).unwrap();
        let watch = DirWatch::new(dir.path(), pages).unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, &[7u8; 4096]).unwrap();
        // SAFETY: both fds are open for the call; null offsets (the pipe has none, the
        // file's own position is used) and plain flags; no memory is passed.
        let moved = unsafe {
            libc::splice(
                r.as_raw_fd(),
                std::ptr::null_mut(),
                f.as_raw_fd(),
                std::ptr::null_mut(),
                4096,
                0,
            )
        };
        assert_eq!(moved, 4096);
        match watch.wait(Duration::from_millis(200), None).unwrap() {
            Woken::Changed(c) => assert!(c.written, "{c:?}"),
            Woken::TimedOut => {}
            Woken::Wake => unreachable!(),
        }
    }

    #[test]
    fn the_wake_fd_ends_the_wait_and_wins_over_changes() {
        let dir = tempfile::tempdir().unwrap();
        let watch = DirWatch::new(dir.path(), pages).unwrap();
        let wake = std::sync::Arc::new(EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap());
        let w = wake.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w.write(1).unwrap();
        });
        assert_eq!(watch.wait(LONG, Some(wake.as_fd())).unwrap(), Woken::Wake);
        t.join().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"x").unwrap();
        assert_eq!(watch.wait(LONG, Some(wake.as_fd())).unwrap(), Woken::Wake);
        // The changes stay queued for the next wait without it.
        assert!(matches!(
            watch.wait(LONG, None).unwrap(),
            Woken::Changed(Changes { created: true, .. })
        ));
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(DirWatch::new(&dir.path().join("nope"), pages).is_err());
    }
}
