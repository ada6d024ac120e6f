//! SIGINT (Ctrl-C), SIGTERM and SIGHUP while gpucr dumps or restores.
//!
//! SIGHUP is what gpucr gets when the terminal it ran from goes away (a dropped ssh
//! session). Its default action would end gpucr on the spot, and with it the helper that
//! gives a CUDA job its GPU back: the job would stay locked. It is handled like the other
//! two, unless gpucr was started with SIGHUP ignored (`nohup`), which is left as it is.
//!
//! gpucr never stops in the middle of an operation. A signal is remembered, every hook
//! registered with [`on_interrupt`] runs at once (the GPU transfer cancels itself), and
//! the next CRIU notification is answered with a failure, so that CRIU rolls back by
//! itself: at dump it lets the tree go exactly as it was, at restore it kills the
//! half-restored tree. The command then exits with [`crate::exit_code::INTERRUPTED`].
//! CRIU runs in a process group of its own, so a terminal's Ctrl-C reaches gpucr only.
//!
//! Once an operation is over, `gpucr restore` (waiting for the restored tree) forwards
//! these signals to the tree instead.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The signal that asked gpucr to stop (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Every signal that arrived so far (a second one ends the action scripts CRIU waits
/// for).
static COUNT: AtomicU64 = AtomicU64::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A hook, called with the signal that arrived.
type Hook = Box<dyn Fn(i32) + Send + Sync>;
static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());

/// Handle SIGINT, SIGTERM and (unless it is ignored) SIGHUP from now on (idempotent): a
/// thread of its own takes them.
pub fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut handled = vec![SIGINT, SIGTERM];
    if !is_ignored(SIGHUP)? {
        handled.push(SIGHUP);
    }
    let mut signals = Signals::new(handled)?;
    std::thread::Builder::new()
        .name("gpucr-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                deliver(signal);
            }
        })?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// Whether `signal`'s disposition is "ignore" (as `nohup` leaves SIGHUP for the command
/// it runs).
fn is_ignored(signal: i32) -> io::Result<bool> {
    // SAFETY: a zeroed sigaction is a valid out-parameter; with a null `act`, sigaction
    // only reads the current disposition into it and changes nothing.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `current` is a valid, writable sigaction; `act` is null (query only).
    if unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(current.sa_sigaction == libc::SIG_IGN)
}

/// Record `signal` and run every hook (what the signal thread does; public for tests).
pub fn deliver(signal: i32) {
    let _ = SIGNAL.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
    for (_, hook) in HOOKS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        hook(signal);
    }
}

/// The signal that asked gpucr to stop, if one did.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// How many signals arrived so far.
pub fn count() -> u64 {
    COUNT.load(Ordering::SeqCst)
}

/// The signal's name, for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Run `hook` when a signal arrives (at once if one already did), until the returned
/// registration is dropped.
#[must_use = "the hook is removed when the registration is dropped"]
pub fn on_interrupt(hook: impl Fn() + Send + Sync + 'static) -> Registration {
    if requested().is_some() {
        hook();
    }
    register(Box::new(move |_| hook()))
}

/// Cancel `token` when a signal arrives (at once if one already did), with "gpucr was
/// interrupted by SIGINT" (or the signal's name), until the returned registration is
/// dropped: how a command's token learns of Ctrl-C.
#[must_use = "the link is removed when the registration is dropped"]
pub fn cancels(token: crate::cancel::Cancel) -> Registration {
    let cancel =
        move |signal: i32| token.cancel(format!("gpucr was interrupted by {}", name(signal)));
    if let Some(signal) = requested() {
        cancel(signal);
    }
    register(Box::new(cancel))
}

/// A file descriptor that turns readable at each signal from now on (an eventfd the
/// signal thread writes to), for a wait in `poll(2)` beside the fd it waits on; the
/// link lasts as long as the value.
#[derive(Debug)]
pub struct WakeFd {
    fd: std::os::fd::OwnedFd,
    _link: Registration,
}

impl WakeFd {
    /// Make one.
    pub fn new() -> io::Result<WakeFd> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        use std::os::fd::AsFd;
        let event = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let fd = event.as_fd().try_clone_to_owned()?;
        let link = register(Box::new(move |_| {
            let _ = event.write(1);
        }));
        Ok(WakeFd { fd, _link: link })
    }

    /// The fd to poll for readability.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Take the signals it reported so far, so that it turns readable again only at
    /// the next one.
    pub fn clear(&self) {
        let mut count = [0u8; 8];
        let _ = nix::unistd::read(&self.fd, &mut count);
    }
}

/// Run `hook` with each signal that arrives from now on (not one that came before),
/// on the signal thread, until the returned registration is dropped: what a waiting
/// restore forwards to the tree with, instead of looking for new signals in a loop.
#[must_use = "the hook is removed when the registration is dropped"]
pub fn on_each_signal(hook: impl Fn(i32) + Send + Sync + 'static) -> Registration {
    register(Box::new(hook))
}

fn register(hook: Hook) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, hook));
    Registration(id)
}

/// A hook registered with [`on_interrupt`]; dropping it removes the hook.
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        HOOKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _)| *id != self.0);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_ignored_signal_is_seen_as_ignored() {
        // SIGUSR2: nothing else in the test process uses it.
        let set = |handler| {
            // SAFETY: SIG_IGN and SIG_DFL are valid dispositions for SIGUSR2; no handler
            // function is installed.
            unsafe { libc::signal(libc::SIGUSR2, handler) };
        };
        set(libc::SIG_IGN);
        assert!(is_ignored(libc::SIGUSR2).unwrap());
        set(libc::SIG_DFL);
        assert!(!is_ignored(libc::SIGUSR2).unwrap());
    }

    #[test]
    fn hooks_run_on_delivery_and_stop_when_dropped() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let registration = on_interrupt(move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let before = count();
        deliver(SIGINT);
        assert_eq!(requested(), Some(SIGINT));
        assert_eq!(count(), before + 1);
        assert!(calls.load(Ordering::SeqCst) >= 1);
        drop(registration);
        let after = calls.load(Ordering::SeqCst);
        // A per-signal hook gets the signals that come after it, not the one before.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let each = on_each_signal(move |signal| s.lock().unwrap().push(signal));
        deliver(SIGTERM);
        drop(each);
        assert_eq!(*seen.lock().unwrap(), [SIGTERM]);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            after,
            "removed hooks never run"
        );
        assert_eq!(
            requested(),
            Some(SIGINT),
            "the first signal is the one kept"
        );
        // A hook registered after the signal runs at once.
        let late = Arc::new(AtomicUsize::new(0));
        let l = late.clone();
        let _r = on_interrupt(move || {
            l.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(late.load(Ordering::SeqCst), 1);
        assert_eq!(name(SIGTERM), "SIGTERM");
        // A wake fd turns readable at the next signal, and clears; a token linked with
        // `cancels` after the first signal is cancelled at once.
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let wake = WakeFd::new().unwrap();
        let readable = |wake: &WakeFd| {
            let mut fds = [PollFd::new(wake.fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
        };
        assert!(!readable(&wake));
        deliver(SIGHUP);
        assert!(readable(&wake));
        wake.clear();
        assert!(!readable(&wake));
        let token = crate::cancel::Cancel::new();
        let _link = cancels(token.clone());
        assert_eq!(
            token.check().unwrap_err().0,
            "gpucr was interrupted by SIGINT"
        );
    }
}
