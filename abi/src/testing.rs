//! For the project's tests: a test that needs something the machine may lack (root,
//! podman, a kernel feature) says so with [`require`] instead of returning early.
//!
//! A missing requirement fails the test, naming it, unless [`ENV_MAY_SKIP`] lists it
//! (`GPUCR_TESTS_MAY_SKIP=podman,root`): then the test is reported as not run, on
//! stderr and in the not-run ledger ([`ledger_path`]) that `scripts/test.sh` clears at
//! its start and lists at its end. Nothing passes without running.
//!
//! A test that runs a shell script it wrote makes it with [`write_script`].

use std::io::Write;
use std::path::{Path, PathBuf};

/// Environment variable listing, comma-separated, the requirements a test run may do
/// without; a test that needs one of them is reported as not run instead of failing.
pub const ENV_MAY_SKIP: &str = "GPUCR_TESTS_MAY_SKIP";

/// The ledger's file name, in the directory of the build profile (`target/debug`).
pub const LEDGER_NAME: &str = "gpucr-tests-not-run.txt";

/// The not-run ledger of the test binary running: `target/PROFILE/gpucr-tests-not-run.txt`
/// (test binaries live in `target/PROFILE/deps`).
pub fn ledger_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    deps.parent().unwrap_or(deps).join(LEDGER_NAME)
}

/// Whether `list` (the value of [`ENV_MAY_SKIP`]) names `what`.
pub fn allows(list: &str, what: &str) -> bool {
    list.split(',').any(|name| name.trim() == what)
}

/// The running test's name (libtest names each test's thread after it), with its
/// binary's name.
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => stem,
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    format!("{binary} {}", thread.name().unwrap_or("(unnamed test)"))
}

/// Whether the test may go on: true when `present`. When not, the test fails naming
/// `what` (a short name such as `podman` or `root`) and `why` it is needed, unless
/// [`ENV_MAY_SKIP`] lists `what`: then the test is recorded as not run and this
/// returns false, for the test to return at once.
#[must_use = "return from the test when this is false"]
pub fn require(what: &str, present: bool, why: &str) -> bool {
    if present {
        return true;
    }
    let test = test_name();
    let allowed = std::env::var(ENV_MAY_SKIP).is_ok_and(|list| allows(&list, what));
    if !allowed {
        panic!(
            "{test}: needs {what}: {why}. Provide it, or set {ENV_MAY_SKIP}={what} to \
             report this test as not run instead"
        );
    }
    // Straight to the stderr file, past libtest's capture of a passing test's output.
    let _ = writeln!(std::io::stderr(), "not run: {test}: {what}: {why}");
    let line = ledger_line(&test, what, why);
    let ledger = ledger_path();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&ledger)
        // One write per line: O_APPEND keeps concurrent tests' lines whole.
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        panic!(
            "{test}: cannot record it as not run in {}: {e}",
            ledger.display()
        );
    }
    false
}

/// The ledger's line for a test not run: one line, whatever `why` holds (a tool's
/// output, say), since `scripts/test.sh` counts the tests by the ledger's lines.
fn ledger_line(test: &str, what: &str, why: &str) -> String {
    let why: Vec<&str> = why
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("{test}: {what}: {}", why.join(" / "))
}

/// Writes `text` to `path` as a program (mode 0755) that runs at once, whatever the
/// test's other threads do. A program this process wrote itself can fail to start with
/// ETXTBSY ("Text file busy"): a child that another test's thread forked meanwhile holds
/// the write descriptor until its own exec. So the text goes to `PATH.text`, which
/// never runs, and `install`, a process of its own, copies it to `path`.
pub fn write_script(path: &Path, text: &str) {
    let mut source = path.as_os_str().to_owned();
    source.push(".text");
    let source = PathBuf::from(source);
    std::fs::write(&source, text)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&source)
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("cannot run install: {e}"));
    assert!(status.success(), "install {}: {status}", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_requirements_exactly() {
        assert!(allows("podman,root", "root"));
        assert!(allows(" podman , root ", "podman"));
        assert!(!allows("podman", "pod"));
        assert!(!allows("", "root"));
    }

    #[test]
    fn a_present_requirement_lets_the_test_run() {
        assert!(require("anything", true, "never missing"));
    }

    #[test]
    fn a_missing_requirement_not_allowed_fails_the_test() {
        let name = "gpucr-testing-requirement-nobody-allows";
        let failed = std::panic::catch_unwind(|| require(name, false, "because"));
        let message = failed.expect_err("must fail");
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(
            message.contains(&format!("needs {name}: because"))
                && message.contains(&format!("{ENV_MAY_SKIP}={name}")),
            "{message}"
        );
    }

    #[test]
    fn a_reason_of_several_lines_is_one_ledger_line() {
        let line = ledger_line(
            "t x",
            "cuda-headers",
            "fetch failed:\n  ERROR: no\n\nat all\n",
        );
        assert_eq!(
            line,
            "t x: cuda-headers: fetch failed: / ERROR: no / at all"
        );
    }

    #[test]
    fn the_ledger_is_beside_the_test_binaries() {
        let ledger = ledger_path();
        assert_eq!(ledger.file_name().unwrap(), LEDGER_NAME);
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            Some(ledger.parent().unwrap()),
            exe.parent().unwrap().parent()
        );
    }

    #[test]
    fn a_written_script_runs_while_other_threads_fork() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let forks = std::thread::spawn({
            let done = done.clone();
            move || {
                while !done.load(Ordering::Relaxed) {
                    std::process::Command::new("true").status().unwrap();
                }
            }
        });
        for n in 0..200 {
            let script = dir.path().join(format!("s{n}"));
            write_script(&script, &format!("#!/bin/sh\nexit {}\n", n % 7));
            let status = std::process::Command::new(&script).status();
            let status = status.unwrap_or_else(|e| panic!("{}: {e}", script.display()));
            assert_eq!(status.code(), Some(n % 7), "{}", script.display());
        }
        done.store(true, Ordering::Relaxed);
        forks.join().unwrap();
    }
}
