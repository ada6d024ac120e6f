//! Custom storage does not exist before CUDA 13.4, and a driver older than 12.8 is
//! refused with both versions named.

mod common;

use gpucr_cuda_driver::layout::LayoutError;
use gpucr_cuda_driver::{ArgsLayout, Driver, Error};

#[test]
fn custom_storage_needs_13_4_and_old_drivers_are_refused() {
    let w = common::world(&[]);
    let d = &w.driver;
    assert_eq!(d.version(), 13000);
    assert_eq!(d.layout(), ArgsLayout::Cuda13_0);
    assert!(!d.has_custom_storage());
    let app = common::App::start(&[]);
    let pid = app.pid();
    d.lock(pid, None).unwrap();
    let err = d.checkpoint_custom(pid).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Layout(LayoutError::CustomStorageUnsupported(ArgsLayout::Cuda13_0))
        ),
        "{err:?}"
    );
    // Nothing happened to the process.
    assert_eq!(app.memory_files(&w).len(), 2);
    d.checkpoint(pid).unwrap();
    assert!(d.restore_custom(pid, &[]).is_err());
    d.restore(pid, &[]).unwrap();
    d.unlock(pid).unwrap();

    // The same library reporting 12.4 is too old (a second process, its own config).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "old_driver_probe", "--ignored", "--nocapture"])
        .env("GPUCR_FAKE_CUDA_VERSION", "12040")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("12.4 (12040)") && text.contains("12.8 (12080"),
        "{text}"
    );
}

/// Run by the test above in a child process with `GPUCR_FAKE_CUDA_VERSION=12040`.
#[test]
#[ignore = "run by custom_storage_needs_13_4_and_old_drivers_are_refused"]
fn old_driver_probe() {
    let err = Driver::load().unwrap_err();
    assert!(
        matches!(
            err,
            Error::Layout(LayoutError::DriverTooOld {
                found: 12040,
                needed: 12080
            })
        ),
        "{err:?}"
    );
    println!("{err}");
}
