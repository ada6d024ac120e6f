//! `checkpoint_cycle` (the driver path alone, from another process, as the device
//! validation runs it on a GPU machine): lock, checkpoint, restore and unlock a running
//! application; its device memory verifies afterwards and every call is reported.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn checkpoint_cycle_brings_the_process_back() {
    let w = common::world(&[("GPUCR_FAKE_CUDA_GPUS", "2")]);
    let mut app = common::App::start(&[]);
    assert_eq!(app.ask("rewrite 41"), "ok");
    assert_eq!(app.ask("verify"), "ok");
    let tool = Path::new(common::APP)
        .parent()
        .expect("the binary is in a directory")
        .join("examples/checkpoint_cycle");
    assert!(
        tool.exists(),
        "{} was not built: run `cargo build --workspace --examples`",
        tool.display()
    );
    let out = Command::new(&tool)
        .args([&app.pid().to_string(), "--repeat", "50", "--hold-ms", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "load+cuInit",
            "driver",
            "get-restore-thread",
            "get-state",
            "lock",
            "checkpoint",
            "get-state",
            "get-state",
            "restore",
            "unlock",
            "get-state",
            "summary"
        ]
    );
    assert_eq!(steps.last().unwrap()["repeat"], 50);
    // Back and running: the memory is as it was, and the application works on.
    assert_eq!(app.ask("verify"), "ok");
    assert_eq!(app.ask("rewrite 42"), "ok");
    assert_eq!(app.ask("verify"), "ok");
    assert_eq!(app.memory_files(&w).len(), 2);

    // In two halves, as around a plain `criu dump` / `criu restore`.
    let run = |steps: &str| {
        let out = Command::new(&tool)
            .args([&app.pid().to_string(), "--steps", steps, "--repeat", "1"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("checkpoint");
    assert!(app.memory_files(&w).is_empty(), "the memory left the GPUs");
    run("restore");
    assert_eq!(app.ask("verify"), "ok");

    // A process that does not use CUDA is named.
    let out = Command::new(&tool).arg("1").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("process 1 does not use CUDA"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
