//! What engine mode's main loop waits for, on one channel: the plugin's engine steps,
//! and the end of the CRIU that started the helper (its pidfd turning readable). The
//! loop blocks on the channel; nothing is polled.

use std::os::fd::AsFd;
use std::sync::mpsc::{channel, Receiver, Sender};

use crate::helper::EngineCall;
use crate::wait::pidfd::PidFd;

/// One thing for the main loop.
pub(super) enum Event {
    /// An engine step the plugin asks for.
    Step(EngineCall),
    /// CRIU ended (or the helper stopped handing steps on) without the plugin's last
    /// step.
    CriuGone,
}

/// The steps of `steps`, then [`Event::CriuGone`] once CRIU (`criu_pid`) has exited or
/// `steps` has closed, whichever comes first.
pub(super) fn events(steps: Receiver<EngineCall>, criu_pid: i32) -> Receiver<Event> {
    let (tx, rx) = channel();
    let forward = tx.clone();
    std::thread::Builder::new()
        .name("gpucr-engine-steps".into())
        .spawn(move || {
            for call in steps {
                if forward.send(Event::Step(call)).is_err() {
                    return;
                }
            }
            let _ = forward.send(Event::CriuGone);
        })
        .map(drop)
        .unwrap_or_else(|_| {
            let _ = tx.send(Event::CriuGone);
        });
    watch_exit(tx, criu_pid);
    rx
}

/// Send [`Event::CriuGone`] on `tx` when `pid` exits, from a thread blocked in `poll`
/// on its pidfd; at once when it is gone already or cannot be watched (a kernel
/// without pidfds falls back to the steps channel closing).
fn watch_exit(tx: Sender<Event>, pid: i32) {
    let pidfd = match PidFd::open(pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            let _ = tx.send(Event::CriuGone);
            return;
        }
        Err(_) => return,
    };
    let _ = std::thread::Builder::new()
        .name("gpucr-engine-criu".into())
        .spawn(move || {
            // Readable once the process has exited; a signal only restarts the wait.
            let _ = crate::wait::readable([pidfd.as_fd()], None);
            let _ = tx.send(Event::CriuGone);
        });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn steps_come_through_and_the_end_of_criu_is_told_without_polling() {
        let (steps_tx, steps) = channel::<EngineCall>();
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let events = events(steps, child.id() as i32);
        let (reply, _answer) = channel();
        steps_tx
            .send(EngineCall {
                step: gpucr_abi::proto::engine_step::Step::FinishCopy,
                ret: 0,
                reply,
            })
            .unwrap();
        assert!(matches!(
            events.recv_timeout(Duration::from_secs(10)),
            Ok(Event::Step(_))
        ));
        // The steps' sender is still open: only CRIU's exit can end the wait.
        let started = std::time::Instant::now();
        assert!(matches!(
            events.recv_timeout(Duration::from_secs(10)),
            Ok(Event::CriuGone)
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
        let _ = child.wait();
        drop(steps_tx);
    }

    #[test]
    fn a_criu_already_gone_is_told_at_once() {
        let (_steps_tx, steps) = channel::<EngineCall>();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let events = events(steps, pid);
        assert!(matches!(
            events.recv_timeout(Duration::from_secs(5)),
            Ok(Event::CriuGone)
        ));
    }
}
