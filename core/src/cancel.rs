//! A cancellation token for one piece of work (a request of the plugin the helper
//! answers): cancelled once, for good, with a reason; cheap to clone and to check.
//!
//! Three things make it reach the work, not only the future that waited for it:
//! * [`Cancel::live`] runs a change of shared state only while the token is not
//!   cancelled, and [`Cancel::cancel`] waits for a change in progress: once `cancel`
//!   has returned, no change of the cancelled work runs.
//! * [`Cancel::on_cancel`] registers a wake-up (a condition variable to notify), so a
//!   blocked wait ends at once instead of polling.
//! * [`Cancel::sleep`] is a sleep that a cancellation ends.
//! * [`Cancel::wake_fd`] is a file descriptor that turns readable at the cancellation,
//!   for a wait in `poll(2)` beside the fd it waits on.
//!
//! Tokens form a tree: [`Cancel::child`] is cancelled with its parent (and may be
//! cancelled alone), so the command's token, cancelled at Ctrl-C, reaches every
//! request, transfer and driver wait made under it.
//!
//! This module is a leaf: it imports nothing of gpucr.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a piece of work was given up (the reason its token was cancelled with).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Cancelled(pub String);

impl From<Cancelled> for std::io::Error {
    /// An I/O wait (a copy source's read, a sink's write) that ended at the
    /// cancellation: [`std::io::ErrorKind::Interrupted`], with the reason.
    fn from(c: Cancelled) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            format!("cancelled: {}", c.0),
        )
    }
}

/// A cancellation token (see the module's documentation).
#[derive(Clone, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

/// What runs at the cancellation, with its reason.
type Waker = Box<dyn FnOnce(&Cancelled) + Send>;

#[derive(Default)]
struct State {
    reason: Option<String>,
    /// Set by [`Cancel::detach`]: the parent's cancellation no longer reaches it.
    detached: bool,
    wakers: Vec<Waker>,
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cancel").field(&self.lock().reason).finish()
    }
}

impl Cancel {
    /// A token not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancel with `reason` (the first reason is kept): waits for a [`Cancel::live`]
    /// change in progress, then wakes every registered waiter and sleeper.
    pub fn cancel(&self, reason: impl Into<String>) {
        let reason = reason.into();
        let wakers = {
            let mut state = self.lock();
            if state.reason.is_some() {
                return;
            }
            state.reason = Some(reason.clone());
            std::mem::take(&mut state.wakers)
        };
        self.0.changed.notify_all();
        let cancelled = Cancelled(reason);
        for wake in wakers {
            wake(&cancelled);
        }
    }

    /// A token cancelled when this one is (with its reason), and which may also be
    /// cancelled alone without touching this one.
    pub fn child(&self) -> Cancel {
        let child = Cancel::new();
        // Held weakly: a parent never cancelled does not keep its children alive.
        let weak = Arc::downgrade(&child.0);
        self.when_cancelled(move |why| {
            if let Some(child) = weak.upgrade() {
                let child = Cancel(child);
                if !child.lock().detached {
                    child.cancel(why.0.clone());
                }
            }
        });
        child
    }

    /// From now on, the parent's cancellation no longer reaches this token (made by
    /// [`Cancel::child`]); it can still be cancelled itself. What work does once it is
    /// past the point where its parent may stop it (a restore whose tree is whole).
    pub fn detach(&self) {
        self.lock().detached = true;
    }

    /// An eventfd that turns readable when the token is cancelled (at once if it is
    /// already): what a `poll(2)` wait adds to its fds so that the cancellation ends it.
    pub fn wake_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        use std::os::fd::AsFd;
        let event = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let ours = event.as_fd().try_clone_to_owned()?;
        self.on_cancel(move || {
            let _ = event.write(1);
        });
        Ok(ours)
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.lock().reason.is_some()
    }

    /// Ok while not cancelled, else why it was.
    pub fn check(&self) -> Result<(), Cancelled> {
        match &self.lock().reason {
            Some(reason) => Err(Cancelled(reason.clone())),
            None => Ok(()),
        }
    }

    /// Run `change` unless cancelled. A cancellation waits for a change in progress, so
    /// a change either runs entirely before the cancellation or not at all. `change`
    /// must be short and must not cancel this token.
    pub fn live<T>(&self, change: impl FnOnce() -> T) -> Result<T, Cancelled> {
        let state = self.lock();
        if let Some(reason) = &state.reason {
            return Err(Cancelled(reason.clone()));
        }
        let value = change();
        drop(state);
        Ok(value)
    }

    /// Call `wake` once when the token is cancelled (at once if it is already). A wait
    /// on a condition variable registers its notification here, so that it ends
    /// without polling.
    pub fn on_cancel(&self, wake: impl Fn() + Send + 'static) {
        self.when_cancelled(move |_| wake());
    }

    /// Call `then` once with the reason when the token is cancelled (at once if it is
    /// already): what passes a cancellation on to work with a cancel of its own (a
    /// transfer's canceller).
    pub fn when_cancelled(&self, then: impl FnOnce(&Cancelled) + Send + 'static) {
        let mut state = self.lock();
        if let Some(reason) = &state.reason {
            let cancelled = Cancelled(reason.clone());
            drop(state);
            then(&cancelled);
            return;
        }
        state.wakers.push(Box::new(then));
    }

    /// Sleep for `duration`, or less if the token is cancelled meanwhile: Err then.
    pub fn sleep(&self, duration: Duration) -> Result<(), Cancelled> {
        let deadline = Instant::now() + duration;
        let mut state = self.lock();
        loop {
            if let Some(reason) = &state.reason {
                return Err(Cancelled(reason.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            state = self
                .0
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_child_is_cancelled_with_its_parent_and_alone_without_it() {
        let parent = Cancel::new();
        let alone = parent.child();
        alone.cancel("timed out");
        assert!(!parent.is_cancelled(), "a child's cancellation stays below");
        let child = parent.child();
        let grandchild = child.child();
        parent.cancel("SIGINT");
        assert_eq!(child.check(), Err(Cancelled("SIGINT".into())));
        assert_eq!(grandchild.check(), Err(Cancelled("SIGINT".into())));
        assert_eq!(alone.check(), Err(Cancelled("timed out".into())));
        // Made after the parent's cancellation: born cancelled.
        assert!(parent.child().is_cancelled());
        let other = Cancel::new();
        let detached = other.child();
        detached.detach();
        other.cancel("too late");
        assert!(!detached.is_cancelled(), "a detached child stays");
    }

    #[test]
    fn the_wake_fd_turns_readable_at_the_cancellation() {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let c = Cancel::new();
        let fd = c.wake_fd().unwrap();
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 0);
        c.cancel("stop");
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::from(5000u16)).unwrap(), 1);
        let late = c.wake_fd().unwrap();
        let mut fds = [PollFd::new(late.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 1);
    }

    #[test]
    fn the_first_reason_is_kept_and_changes_stop() {
        let c = Cancel::new();
        assert_eq!(c.live(|| 1), Ok(1));
        c.cancel("timed out");
        c.cancel("the helper stopped");
        assert_eq!(c.check(), Err(Cancelled("timed out".into())));
        let ran = AtomicUsize::new(0);
        assert!(c.live(|| ran.fetch_add(1, Ordering::SeqCst)).is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_cancellation_waits_for_a_change_in_progress() {
        let c = Cancel::new();
        let done = Arc::new(AtomicUsize::new(0));
        let (c2, done2) = (c.clone(), done.clone());
        let (started, wait_started) = std::sync::mpsc::channel();
        let change = std::thread::spawn(move || {
            c2.live(|| {
                started.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                done2.store(1, Ordering::SeqCst);
            })
        });
        wait_started.recv().unwrap();
        c.cancel("given up");
        // The change that was running finished before `cancel` returned.
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert!(change.join().unwrap().is_ok());
    }

    #[test]
    fn a_sleep_and_a_registered_wait_end_at_the_cancellation() {
        let c = Cancel::new();
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        c.on_cancel(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        let c2 = c.clone();
        let started = Instant::now();
        let sleeper = std::thread::spawn(move || c2.sleep(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(50));
        c.cancel("stop");
        assert_eq!(
            sleeper.join().unwrap(),
            Err(Cancelled("stop".into())),
            "the sleep ended early"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        // Registered after the cancellation: called at once.
        let w = woken.clone();
        c.on_cancel(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert_eq!(
            c.sleep(Duration::from_secs(60)),
            Err(Cancelled("stop".into()))
        );
    }
}
