//! The state machine, the restore thread, and a lock that times out.

mod common;

use std::time::{Duration, Instant};

use gpucr_cuda_driver::{result, ProcessState};

#[test]
fn state_transitions_follow_the_driver() {
    let w = common::world(&[("GPUCR_FAKE_CUDA_TIMEOUT", "5")]);
    let d = &w.driver;
    assert_eq!(d.version(), 13000);
    assert!(!d.has_custom_storage());
    let mut app = common::App::start(&[]);
    let pid = app.pid();

    // The restore thread is the application's thread named cuda-restore.
    let tid = d.restore_thread_id(pid).unwrap().expect("a CUDA process");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap();
    assert_eq!(comm.trim(), "cuda-restore");
    // This test process called cuInit too (the driver does): it has its own.
    assert!(d
        .restore_thread_id(std::process::id() as i32)
        .unwrap()
        .is_some());
    // A process without the library is not a CUDA process.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    assert_eq!(d.restore_thread_id(sleeper.id() as i32).unwrap(), None);
    let err = d.process_state(sleeper.id() as i32).unwrap_err();
    assert_eq!(err.cuda_code(), Some(result::INVALID_VALUE));
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    let illegal = |e: gpucr_cuda_driver::Error| {
        assert_eq!(e.cuda_code(), Some(result::ILLEGAL_STATE), "{e}");
        assert!(e.to_string().contains("CUDA_ERROR_ILLEGAL_STATE"), "{e}");
        assert!(e.to_string().contains(&pid.to_string()), "{e}");
    };
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Running);
    illegal(d.checkpoint(pid).unwrap_err());
    illegal(d.restore(pid, &[]).unwrap_err());
    illegal(d.unlock(pid).unwrap_err());

    d.lock(pid, Some(Duration::from_secs(2))).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    illegal(d.lock(pid, None).unwrap_err());
    illegal(d.restore(pid, &[]).unwrap_err());

    d.checkpoint(pid).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Checkpointed);
    illegal(d.checkpoint(pid).unwrap_err());
    illegal(d.unlock(pid).unwrap_err());
    illegal(d.lock(pid, None).unwrap_err());

    d.restore(pid, &[]).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.unlock(pid).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Running);
    assert_eq!(app.ask("verify"), "ok");

    // While locked the application's own calls block; unlock lets them finish.
    d.lock(pid, None).unwrap();
    app.ask_later("verify");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!app.has_output(), "a locked process's calls wait");
    d.unlock(pid).unwrap();
    assert_eq!(app.line(), "ok");

    // A lock waits for work in flight, and gives up after its timeout: RUNNING again.
    drop(app);
    let mut app = common::App::start(&[("GPUCR_FAKE_CUDA_SYNC_MS", "3000")]);
    let pid = app.pid();
    assert_eq!(app.ask("sync"), "started");
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let err = d.lock(pid, Some(Duration::from_millis(300))).unwrap_err();
    assert_eq!(err.cuda_code(), Some(result::TIMEOUT), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Running);
    // Without a limit it waits for the work.
    d.lock(pid, None).unwrap();
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked);
    d.unlock(pid).unwrap();
}
