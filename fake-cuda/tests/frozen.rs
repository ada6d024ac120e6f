//! A checkpoint of a stopped process waits for its restore thread, then fails after the
//! timeout instead of hanging; the withdrawn request is not acted on later.

mod common;

use std::time::{Duration, Instant};

use gpucr_cuda_driver::{result, ProcessState};

#[test]
fn checkpoint_of_a_stopped_process_times_out() {
    let w = common::world(&[("GPUCR_FAKE_CUDA_TIMEOUT", "1")]);
    let d = &w.driver;
    let mut app = common::App::start(&[]);
    let pid = app.pid();
    d.lock(pid, None).unwrap();

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    let started = Instant::now();
    let err = d.checkpoint(pid).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.cuda_code(), Some(result::TIMEOUT), "{err}");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // The state is read from the context, so it answers while the process is stopped.
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    // The memory is still on the "GPUs".
    assert_eq!(app.memory_files(&w).len(), 2);

    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    // The withdrawn checkpoint did not happen once the process ran again.
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    assert_eq!(app.memory_files(&w).len(), 2);
    d.checkpoint(pid).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Checkpointed);
    d.restore(pid, &[]).unwrap();
    d.unlock(pid).unwrap();
    assert_eq!(app.ask("verify"), "ok");
}

/// Wait until every thread of `pid` is stopped: SIGSTOP takes effect after kill(2)
/// returns, and a restore thread still running could answer the request meanwhile.
fn wait_stopped(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all_stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|task| {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            });
        if all_stopped {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(2));
    }
}
