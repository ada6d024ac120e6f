//! Injected failures, in the controlling process and in an application, and the call
//! log that records them.

mod common;

use gpucr_cuda_driver::{result, ProcessState};

#[test]
fn injected_failures_and_the_call_log() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("calls.log");
    let log_text = log.to_str().unwrap().to_owned();
    let w = common::world(&[
        (
            "GPUCR_FAKE_CUDA_FAIL",
            "cuCheckpointProcessLock:CUDA_ERROR_NOT_READY@1,\
             cuCheckpointProcessCheckpoint:OUT_OF_MEMORY@1,\
             cuCheckpointProcessGetState:999@3,\
             cuCheckpointProcessRestore@1,\
             cuCheckpointProcessUnlock:801@1",
        ),
        ("GPUCR_FAKE_CUDA_LOG", &log_text),
    ]);
    let d = &w.driver;
    // The application's own environment has no failures.
    let mut app = common::App::start(&[("GPUCR_FAKE_CUDA_FAIL", "")]);
    let pid = app.pid();
    let code = |e: gpucr_cuda_driver::Error| e.cuda_code();

    assert_eq!(
        code(d.lock(pid, None).unwrap_err()),
        Some(result::NOT_READY)
    );
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Running); // GetState #1
    d.lock(pid, None).unwrap();
    let err = d.checkpoint(pid).unwrap_err();
    assert_eq!(code(err), Some(result::OUT_OF_MEMORY));
    assert_eq!(d.process_state(pid).unwrap(), ProcessState::Locked); // #2
    let err = d.process_state(pid).unwrap_err(); // #3
    assert_eq!(code(err), Some(result::UNKNOWN));
    d.checkpoint(pid).unwrap();
    let err = d.restore(pid, &[]).unwrap_err();
    assert_eq!(code(err), Some(result::UNKNOWN));
    assert!(
        app.memory_files(&w).is_empty(),
        "a failed restore does nothing"
    );
    d.restore(pid, &[]).unwrap();
    let err = d.unlock(pid).unwrap_err();
    assert_eq!(code(err), Some(result::NOT_SUPPORTED));
    assert!(err_text(d.unlock(pid)).is_empty());
    assert_eq!(app.ask("verify"), "ok");

    // In an application: its second allocation fails, which it reports by name.
    let mut failing = common::App::spawn(&[(
        "GPUCR_FAKE_CUDA_FAIL",
        "cuMemAlloc:CUDA_ERROR_OUT_OF_MEMORY@2",
    )]);
    let line = failing.line();
    assert!(
        line.starts_with("error cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)"),
        "{line}"
    );
    assert_eq!(failing.child.wait().unwrap().code(), Some(1));

    // Every call is in the log, with caller, target and result.
    let text = std::fs::read_to_string(&log).unwrap();
    let me = std::process::id();
    let has = |needle: &str| text.lines().any(|l| l.contains(needle));
    assert!(has(&format!(
        "pid={me} fn=cuCheckpointProcessLock target={pid} args=timeout_ms=0 result=CUDA_ERROR_NOT_READY"
    )), "{text}");
    assert!(has(&format!(
        "pid={me} fn=cuCheckpointProcessCheckpoint target={pid} args=custom=false result=CUDA_ERROR_OUT_OF_MEMORY"
    )), "{text}");
    assert!(
        has(&format!(
            "pid={me} fn=cuCheckpointProcessUnlock target={pid} args=- result=CUDA_SUCCESS"
        )),
        "{text}"
    );
    assert!(
        has("fn=cuMemAlloc target=- args=bytes=65553 result=CUDA_ERROR_OUT_OF_MEMORY"),
        "{text}"
    );
    assert!(
        has(&format!("pid={pid} fn=cuMemcpyDtoH")),
        "the application logs too: {text}"
    );
}

fn err_text(r: Result<(), gpucr_cuda_driver::Error>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}
