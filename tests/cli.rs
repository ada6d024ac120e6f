//! Command-line behaviour: every failure path with its message and exit code, and the
//! generated man pages and completions being up to date.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// Exit codes, as documented (core/src/exit_code.rs).
const USAGE: i32 = 2;
const TARGET: i32 = 3;
const CRIU_UNAVAILABLE: i32 = 4;
const CRIU_FAILED: i32 = 5;
const IMAGE_DIR: i32 = 6;
const IMAGE_DAMAGED: i32 = 7;
const IMAGE_INCOMPLETE: i32 = 8;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A harmless live process to name as a target.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_fails_with(&gpucr(&["dump"]), USAGE, "required");
    assert_fails_with(
        &gpucr(&["dump", "notapid", "/tmp/x"]),
        USAGE,
        "invalid value",
    );
    assert_fails_with(&gpucr(&["frobnicate"]), USAGE, "unrecognized subcommand");
    assert_fails_with(
        &gpucr(&["dump", "--timeout", "0", "1", "/tmp/x"]),
        USAGE,
        "invalid value '0' for '--timeout <SECS>'",
    );
    assert_success(&gpucr(&["--help"]));
    assert!(stdout(&gpucr(&["--version"])).starts_with("gpucr "));
}

/// `install-plugin` refuses a directory that holds CRIU's own GPU plugins (CRIU calls
/// each hook on the first plugin that answers, so either could take a GPU process from
/// the other), names them, changes nothing, and installs with `--force`.
#[test]
fn install_plugin_beside_criu_gpu_plugins_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("cuda_plugin.so"), b"").unwrap();
    let libdir = dir.path().to_str().unwrap();
    assert_fails_with(
        &gpucr(&["install-plugin", "--criu-libdir", libdir]),
        1,
        "cuda_plugin.so",
    );
    assert!(!dir.path().join("gpucr_plugin.so").exists());
    assert!(!dir.path().join("gpucr_plugin.conf").exists());
    let out = gpucr(&["install-plugin", "--criu-libdir", libdir, "--force"]);
    assert_success(&out);
    assert!(stderr(&out).contains("warning"), "{}", stderr(&out));
    assert!(dir.path().join("gpucr_plugin.so").is_file());
}

/// `install-plugin` refuses a --criu-libdir that is a file (exit 6, naming it), and a
/// --setting whose value engine mode would refuse (exit 2, naming the setting), writing
/// nothing.
#[test]
fn install_plugin_refuses_a_file_as_libdir_and_bad_settings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plugins");
    fs::write(&file, b"").unwrap();
    let file = file.to_str().unwrap();
    let out = gpucr(&["install-plugin", "--criu-libdir", file]);
    assert_fails_with(&out, IMAGE_DIR, &format!("{file}: not a directory"));
    let out = gpucr(&["install-plugin", "--uninstall", "--criu-libdir", file]);
    assert_fails_with(&out, IMAGE_DIR, &format!("{file}: not a directory"));

    let libdir = dir.path().join("libdir");
    for (setting, named) in [
        ("GPUCR_JOBS=abc", "GPUCR_JOBS=\"abc\""),
        ("GPUCR_COMPRESS=zstd:99", "GPUCR_COMPRESS=\"zstd:99\""),
    ] {
        let out = gpucr(&[
            "install-plugin",
            "--criu-libdir",
            libdir.to_str().unwrap(),
            "--setting",
            setting,
        ]);
        assert_fails_with(&out, USAGE, named);
        assert!(!libdir.exists(), "{setting}: nothing is written");
    }
}

/// `install-plugin` checks the backends' variables with the parsers the backends read
/// them with at the dump or restore, and the paths engine mode opens for what they must
/// name, and refuses a `GPUCR_*` name engine mode does not read (a misspelt one),
/// naming the ones it reads: exit 2, the setting named, nothing written. Good values
/// are written to the settings file.
#[test]
fn install_plugin_refuses_bad_backend_settings_and_unknown_names() {
    let dir = tempfile::tempdir().unwrap();
    let libdir = dir.path().join("libdir");
    let install = |settings: &[&str]| {
        let mut args = vec!["install-plugin", "--criu-libdir", libdir.to_str().unwrap()];
        for s in settings {
            args.extend(["--setting", s]);
        }
        gpucr(&args)
    };
    for (setting, named) in [
        (
            "GPUCR_AMDGPU_RINGS=x",
            "GPUCR_AMDGPU_RINGS=\"x\": \"x\" is not an SDMA ring number (0-31)",
        ),
        (
            "GPUCR_SIM_COPY_BW=fast",
            "GPUCR_SIM_COPY_BW=\"fast\": \"fast\" is not a bandwidth",
        ),
        (
            "GPUCR_AMDGPU_FENCE_TIMEOUT=30",
            "GPUCR_AMDGPU_FENCE_TIMEOUT=\"30\": time unit needed",
        ),
        (
            "GPUCR_SIM_DRIVER_TIMEOUT=0",
            "GPUCR_SIM_DRIVER_TIMEOUT=\"0\": not a positive number of seconds",
        ),
        (
            "GPUCR_ENGINE_LOG=/nonexistent/gpucr/engine.log",
            "GPUCR_ENGINE_LOG=\"/nonexistent/gpucr/engine.log\": /nonexistent/gpucr does not \
             exist",
        ),
        (
            "GPUCR_BIN=gpucr",
            "GPUCR_BIN=\"gpucr\": not an absolute path",
        ),
        (
            "GPUCR_COMPRES=zstd",
            "GPUCR_COMPRES: not a setting engine mode reads (did you mean \
             GPUCR_COMPRESS?); the GPUCR_* settings are GPUCR_COMPRESS, GPUCR_JOBS, \
             GPUCR_DEVICE_TIMEOUT,",
        ),
    ] {
        let out = install(&["GPUCR_JOBS=2", setting]);
        assert_fails_with(&out, USAGE, named);
        assert!(!libdir.exists(), "{setting}: nothing is written");
    }

    let log = format!(
        "GPUCR_ENGINE_LOG={}",
        dir.path().join("engine.log").display()
    );
    let out = install(&[
        "GPUCR_AMDGPU_RINGS=0,1",
        "GPUCR_AMDGPU_FENCE_TIMEOUT=45s",
        "GPUCR_SIM_COPY_BW=20MiB",
        "GPUCR_SIM_DRIVER_TIMEOUT=2.5",
        &log,
    ]);
    assert_success(&out);
    let written = fs::read_to_string(libdir.join("gpucr_plugin.conf")).unwrap();
    for line in [
        "GPUCR_AMDGPU_RINGS=0,1\n",
        "GPUCR_AMDGPU_FENCE_TIMEOUT=45s\n",
        "GPUCR_SIM_COPY_BW=20MiB\n",
        "GPUCR_SIM_DRIVER_TIMEOUT=2.5\n",
        &format!("{log}\n"),
    ] {
        assert!(written.contains(line), "{line:?} in {written}");
    }
}

#[test]
fn dump_of_a_missing_pid_fails_with_target_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let out = gpucr(&["dump", "99999999", dir.to_str().unwrap()]);
    assert_fails_with(&out, TARGET, "pid 99999999: no such process");
    assert!(!dir.exists(), "nothing is created for a bad target");
}

#[test]
fn dump_of_a_kernel_thread_fails_with_target_code() {
    let tmp = tempfile::tempdir().unwrap();
    let out = gpucr(&["dump", "2", tmp.path().join("img").to_str().unwrap()]);
    assert_fails_with(&out, TARGET, "pid 2: kthreadd is a kernel thread");
}

/// A thread id is not a process: refused up front (CRIU would abort on it) with the
/// thread's process named, nothing created, and the tree left running.
#[test]
fn dump_of_a_thread_names_its_process() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    fs::create_dir(&state).unwrap();
    let tree = Tree::start(&state, &[]);
    let tasks = |pid: i32| -> Vec<i32> {
        fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut pending = vec![tree.pid];
    let mut found = None;
    while let Some(pid) = pending.pop() {
        if let Some(tid) = tasks(pid).into_iter().find(|&tid| tid != pid) {
            found = Some((pid, tid));
            break;
        }
        pending.extend(children(pid));
    }
    let (process, tid) = found.expect("the workload has threads");
    let dir = tmp.path().join("img");
    let out = gpucr(&["dump", &tid.to_string(), dir.to_str().unwrap()]);
    assert_fails_with(
        &out,
        TARGET,
        &format!("pid {tid} is a thread of process {process} ("),
    );
    assert!(
        stderr(&out).contains(&format!("not a process; dump {process}")),
        "{}",
        stderr(&out)
    );
    assert!(!dir.exists(), "nothing is created for a thread");
    tree.wait_ticks(1);
    assert!(alive(tree.pid));
}

/// A process another tracer holds (a debugger, `strace -p`; here a thread of the test)
/// cannot be seized by CRIU: a tree whose root or a child is traced is refused up front
/// with the traced process and its tracer named, nothing created, and the process left
/// running under its tracer.
#[test]
fn dump_of_a_traced_process_or_child_names_its_tracer() {
    // Without the check CRIU would run.
    let _lock = criu_lock();
    let mut shell = Sleeper(
        Command::new("sh")
            .args(["-c", "sleep 600 & wait"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let root = shell.0.id() as i32;
    let child = wait_for(
        std::time::Duration::from_secs(10),
        "the shell's child",
        || children(root).first().copied(),
    );
    let lone = Sleeper::start();
    for (target, traced) in [(lone.0.id() as i32, lone.0.id() as i32), (root, child)] {
        let tracing = Tracer::seize(traced);
        let tracer = tracing.tid;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("img");
        let out = gpucr(&["dump", &target.to_string(), dir.to_str().unwrap()]);
        assert_fails_with(
            &out,
            TARGET,
            &format!(
                "pid {traced} is traced by pid {tracer} (test-tracer): a process can have \
                 one tracer, and CRIU must be it; detach {tracer} and dump again"
            ),
        );
        assert!(!dir.exists(), "nothing is created for a traced target");
        let status = fs::read_to_string(format!("/proc/{traced}/status")).unwrap();
        assert!(
            status.contains(&format!("TracerPid:\t{tracer}\n")),
            "the tracer is left attached: {status}"
        );
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = shell.0.kill();
}

/// Ctrl-C while CRIU runs a user's action script that hangs: gpucr cannot answer CRIU
/// before the script ends, but it says, after a few seconds, what it waits for (CRIU,
/// the stage, the script), instead of sitting there without a word. A second Ctrl-C
/// ends the script and what it started; CRIU then fails the stage and rolls the dump
/// back: exit 130, the image marked incomplete, the target running on.
#[test]
fn a_second_sigint_ends_the_action_script_criu_waits_for() {
    let _lock = criu_lock();
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let hangs = HangingScript::new(tmp.path(), "pre-dump");
    let image = tmp.path().join("img");
    let begun = std::time::Instant::now();
    let child = spawn_gpucr(
        &[
            "dump",
            "--criu-config",
            hangs.config.to_str().unwrap(),
            &target.pid(),
            image.to_str().unwrap(),
        ],
        &[],
    );
    let said = hangs.interrupt_twice(child, "dump");
    assert!(
        said.contains(
            "since it reported pre-dump (after which it runs the stage's action scripts)"
        ) && said.contains(", at pre-dump): another signal ends it"),
        "{said}"
    );
    assert!(
        begun.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        begun.elapsed()
    );
    assert!(image.join("gpucr-incomplete.json").exists());
    assert!(alive(target.0.id() as i32), "the target runs on");
}

/// 0 and negative numbers are no process id at all: a usage error, not a missing target.
#[test]
fn dump_of_a_pid_below_1_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let dir = dir.to_str().unwrap();
    assert_fails_with(&gpucr(&["dump", "0", dir]), USAGE, "from 1 up");
    assert_fails_with(&gpucr(&["dump", "--", "-5", dir]), USAGE, "from 1 up");
}

#[test]
fn dump_into_a_non_empty_dir_is_refused() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("keep.txt"), b"mine").unwrap();
    let out = gpucr(&["dump", &target.pid(), tmp.path().to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_DIR, "not empty (holds \"keep.txt\")");
    assert_eq!(fs::read(tmp.path().join("keep.txt")).unwrap(), b"mine");
}

/// CRIU's own config files are not read by the CRIU gpucr runs (these would send the
/// pages to a page server and CRIU's log elsewhere): the dump works, and a note names
/// them; with --criu-config there is no note.
#[test]
fn criu_default_config_files_are_not_read() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    fs::create_dir_all(home.join(".criu")).unwrap();
    let user = home.join(".criu/default.conf");
    fs::write(&user, "work-dir /nonexistent\n").unwrap();
    let named = tmp.path().join("env.conf");
    fs::write(&named, "page-server\naddress 127.0.0.1\nport 1\n").unwrap();
    let env = [
        ("HOME", home.to_str().unwrap()),
        ("CRIU_CONFIG_FILE", named.to_str().unwrap()),
    ];
    // The target is a tree in its own PID namespace (a plain child of the test shares the
    // test's session, whose leader is outside any namespace the test runs in).
    let tree = Tree::start(&tmp.path().join("state"), &[]);
    let image = tmp.path().join("image");
    let out = gpucr_env(
        &[
            "dump",
            "--tcp-established",
            "--leave-running",
            &tree.pid.to_string(),
            image.to_str().unwrap(),
        ],
        &env,
    );
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "{}, {} are not read",
            user.display(),
            named.display()
        )),
        "{err}"
    );
    assert!(image.join("pages-1.img").exists() && image.join("dump.log").exists());

    let config = tmp.path().join("mine.conf");
    fs::write(&config, "ghost-limit 2M\n").unwrap();
    let image = tmp.path().join("image2");
    let out = gpucr_env(
        &[
            "dump",
            "--tcp-established",
            "--criu-config",
            config.to_str().unwrap(),
            &tree.pid.to_string(),
            image.to_str().unwrap(),
        ],
        &env,
    );
    assert_success(&out);
    assert!(!stderr(&out).contains("not read"), "{}", stderr(&out));
}

#[test]
fn dump_into_a_dir_another_dump_holds_is_refused() {
    // `flock DIR CMD` holds the lock a running `gpucr dump` takes on its image directory.
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    fs::write(tmp.path().join("pages-1.img"), b"being written").unwrap();
    let out = Command::new("flock")
        .args([dir, gpucr_bin().to_str().unwrap(), "dump", "--force"])
        .args([target.pid().as_str(), dir])
        .output()
        .unwrap();
    assert_fails_with(
        &out,
        IMAGE_DIR,
        "another gpucr is using the image directory",
    );
    assert_eq!(
        fs::read(tmp.path().join("pages-1.img")).unwrap(),
        b"being written",
        "--force removed nothing"
    );
}

#[test]
fn dump_into_a_read_only_dir_is_refused() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ro");
    fs::create_dir(&dir).unwrap();
    // A read-only tmpfs over DIR, in a private mount namespace that dies with the command.
    let script = format!(
        "mount -t tmpfs -o ro none '{dir}' && exec '{bin}' dump {pid} '{dir}'",
        dir = dir.display(),
        bin = gpucr_bin().display(),
        pid = target.pid()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails_with(&out, IMAGE_DIR, "not writable");
    assert!(
        stderr(&out).contains("Read-only file system"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_criu_is_reported_with_install_advice() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let out = gpucr(&[
        "dump",
        "--criu",
        "/nonexistent/criu",
        &target.pid(),
        dir.to_str().unwrap(),
    ]);
    assert_fails_with(
        &out,
        CRIU_UNAVAILABLE,
        "criu not found (looked for /nonexistent/criu)",
    );
    assert!(stderr(&out).contains("scripts/install-criu.sh"));
    // The environment variable selects the binary too.
    let out = gpucr_env(
        &["dump", &target.pid(), dir.to_str().unwrap()],
        &[("GPUCR_CRIU", "/nonexistent/criu2")],
    );
    assert_fails_with(&out, CRIU_UNAVAILABLE, "/nonexistent/criu2");
    assert!(!dir.exists());
}

#[test]
fn criu_older_than_4_0_is_refused() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let fake = fixture("fake-criu-3.17");
    let out = gpucr(&[
        "dump",
        "--criu",
        fake.to_str().unwrap(),
        &target.pid(),
        tmp.path().join("i").to_str().unwrap(),
    ]);
    assert_fails_with(
        &out,
        CRIU_UNAVAILABLE,
        "is CRIU 3.17; gpucr needs CRIU >= 4.0",
    );
    assert!(stderr(&out).contains("scripts/install-criu.sh"));
}

#[test]
fn criu_that_dies_is_reported() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let fake = fixture("fake-criu-crash");
    let out = gpucr(&[
        "dump",
        "--criu",
        fake.to_str().unwrap(),
        &target.pid(),
        tmp.path().join("i").to_str().unwrap(),
    ]);
    assert_fails_with(
        &out,
        CRIU_UNAVAILABLE,
        &format!(
            "criu ({}) exited before answering (exit status: 1",
            fake.display()
        ),
    );
    assert!(
        stderr(&out).contains("crashing on purpose"),
        "{}",
        stderr(&out)
    );
    // A binary that is no CRIU at all is named too.
    let out = gpucr(&[
        "dump",
        "--criu",
        "/bin/true",
        &target.pid(),
        tmp.path().join("i").to_str().unwrap(),
    ]);
    assert_fails_with(
        &out,
        CRIU_UNAVAILABLE,
        "criu (/bin/true) exited before answering (exit status: 0)",
    );
}

/// A criu that hangs before its first answer does not hang gpucr for Ctrl-C: SIGINT
/// (and SIGTERM) end the wait at once with exit 130, and the hung binary, with what it
/// started, is killed.
#[test]
fn sigint_while_criu_hangs_at_its_start_ends_gpucr_at_once() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("hung-criu");
    let marker = tmp.path().join("hung-criu-started");
    gpucr_abi::testing::write_script(
        &script,
        &format!(
            "#!/bin/sh\nsleep 41 &\ntouch {}\nexec sleep 42\n",
            marker.display()
        ),
    );
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        let _ = fs::remove_file(&marker);
        let started = std::time::Instant::now();
        let child = spawn_gpucr(
            &[
                "dump",
                "--criu",
                script.to_str().unwrap(),
                &target.pid(),
                tmp.path().join("i").to_str().unwrap(),
            ],
            &[],
        );
        wait_for(
            std::time::Duration::from_secs(10),
            "the hung criu to start",
            || marker.exists().then_some(()),
        );
        // The hung criu runs `sleep 42` (its own child `sleep 41` started before).
        wait_for(
            std::time::Duration::from_secs(10),
            "gpucr's criu to exec `sleep 42`",
            || {
                gpucr_abi::procfs::children(child.id() as i32)
                    .into_iter()
                    .any(|c| {
                        fs::read(format!("/proc/{c}/cmdline"))
                            .is_ok_and(|a| a == b"sleep\x0042\x00")
                    })
                    .then_some(())
            },
        );
        signal_child(&child, signal);
        let out = child.wait_with_output().unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "gpucr waited for the hung criu: {:?}",
            started.elapsed()
        );
        assert_fails_with(
            &out,
            130,
            &format!(
                "while criu ({}) was starting: it was killed",
                script.display()
            ),
        );
        wait_for(
            std::time::Duration::from_secs(5),
            "the hung criu and its child to be killed",
            || {
                let left = Command::new("pgrep")
                    .args(["-f", "^sleep 4[12]$"])
                    .output()
                    .unwrap();
                left.stdout.is_empty().then_some(())
            },
        );
        assert!(!tmp.path().join("i").exists(), "nothing was done");
    }
}

/// `--criu-config` lines CRIU would refuse before it opens its log (so that its failure
/// named neither the file nor the line), or would misread, are refused before anything
/// is touched, with the file, the line and why.
#[test]
fn criu_config_lines_criu_refuses_are_refused_up_front() {
    let target = Sleeper::start();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("job.conf");
    let image = tmp.path().join("i");
    let pid = target.pid();
    for (text, line, why) in [
        (
            "tcp-close\nbogusoption\n",
            2,
            "`bogusoption` is not an option of CRIU 4.2",
        ),
        ("ghost-limit\n", 1, "`ghost-limit` needs a value"),
        ("# x\ntcp-close yes\n", 2, "`tcp-close` takes no value"),
        (
            "manage-cgroups bogus\n",
            1,
            "`manage-cgroups` takes one of none",
        ),
        ("external\n", 1, "`external` needs a value"),
        (
            "ghost-limit abc\n",
            1,
            "`ghost-limit` takes a size in bytes",
        ),
        // Values with a structure: `veth-pair` without `=` is refused by CRIU before its
        // log, `external mnt[]x` is read by it as `mnt[]`.
        (
            "tcp-close\nveth-pair eth0\n",
            2,
            "`veth-pair` takes IN=OUT[@BRIDGE]",
        ),
        (
            "external mnt[]x\n",
            1,
            "`external` takes a mount as mnt[KEY]:VALUE",
        ),
    ] {
        fs::write(&config, text).unwrap();
        for command in ["dump", "restore"] {
            let mut args = vec![command, "--criu-config", config.to_str().unwrap()];
            if command == "dump" {
                args.push(&pid);
            }
            args.push(image.to_str().unwrap());
            let out = gpucr(&args);
            assert_fails_with(
                &out,
                USAGE,
                &format!("--criu-config {}, line {line}: {why}", config.display()),
            );
            assert!(!image.exists(), "{command}: nothing is touched");
        }
    }
}

/// A device CRIU cannot dump: the dump fails, the tree keeps running, the image is
/// marked incomplete, and restore refuses it.
/// A standard error that cannot be written (`gpucr ... 2>&1 | head -1`, its reader
/// gone) is never a panic: the lines are lost, the command's own outcome and exit
/// status stand, for a failure and for a dump that happens.
#[test]
fn stderr_that_cannot_be_written_is_no_panic() {
    let run = |args: &[&str]| {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        Command::new(env!("CARGO_BIN_EXE_gpucr"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(write))
            .status()
            .unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("img");
    let image = image.to_str().unwrap();
    assert_eq!(run(&["dump", "99999999", image]).code(), Some(TARGET));
    assert_eq!(
        run(&["inspect", tmp.path().join("none").to_str().unwrap()]).code(),
        Some(IMAGE_INCOMPLETE)
    );
    let _lock = criu_lock();
    let tree = Tree::start(&tmp.path().join("state"), &[]);
    let pid = tree.pid.to_string();
    let status = run(&[
        "dump",
        "-v",
        "--leave-running",
        "--tcp-established",
        &pid,
        image,
    ]);
    assert_eq!(status.code(), Some(0));
    assert!(Path::new(image).join("gpucr.json").exists());
    assert!(alive(tree.pid));
}

/// A file system with room for CRIU's image but not for the manifest: the dump fails
/// while the tree is still held (exit 6), the tree keeps running and the image is
/// marked incomplete; a dump that kills its tree no longer loses both.
#[test]
fn a_full_file_system_fails_the_dump_before_the_tree_is_killed() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let tree = Tree::start(&tmp.path().join("state"), &["--memory-mib", "1"]);
    let pid = tree.pid.to_string();
    // What the image takes, measured on a file system with room.
    let roomy = tmp.path().join("roomy");
    let roomy_fs = mount_tmpfs(&roomy, 1 << 30);
    let empty = used_bytes(&roomy);
    let out = gpucr(&[
        "dump",
        "--leave-running",
        "--tcp-established",
        &pid,
        roomy.join("img").to_str().unwrap(),
    ]);
    assert_success(&out);
    let manifest = fs::metadata(roomy.join("img/gpucr.json")).unwrap().len();
    let image = used_bytes(&roomy) - empty;
    drop(roomy_fs);
    // Room for that image but one page of its manifest (which takes more than one):
    // CRIU's files fit, the manifest does not.
    assert!(manifest > 4096, "{manifest}");
    let full = tmp.path().join("full");
    let full_fs = mount_tmpfs(&full, image - 4096);
    let dir = full.join("img");
    let out = gpucr(&["dump", "--tcp-established", &pid, dir.to_str().unwrap()]);
    let listing = fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        .unwrap_or_default();
    let incomplete = dir.join("gpucr-incomplete.json").exists();
    let manifest_written = dir.join("gpucr.json").exists();
    drop(full_fs);
    assert_fails_with(&out, IMAGE_DIR, "no room for the manifest");
    assert!(
        stderr(&out).contains(&format!("pid {pid} is still running")),
        "{}",
        stderr(&out)
    );
    assert!(alive(tree.pid), "the tree was killed");
    assert!(!manifest_written, "{listing:?}");
    assert!(incomplete, "not marked incomplete: {listing:?}");
    tree.wait_ticks(2);
}

#[test]
fn undumpable_fd_fails_the_dump_and_leaves_the_tree_running() {
    let _lock = criu_lock();
    let device = ["/dev/kvm", "/dev/fuse"]
        .into_iter()
        .find(|d| Path::new(d).exists());
    let device = device.expect("this test needs /dev/kvm or /dev/fuse");
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &["--hold", device]);
    let out = gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_fails_with(&out, CRIU_FAILED, "criu dump failed");
    let err = stderr(&out);
    assert!(
        err.contains("Can't dump file"),
        "CRIU's reason is shown: {err}"
    );
    assert!(err.contains("dump.log"), "the log is named: {err}");
    assert_failed_dump_left_the_tree_running(&err, &tree, &state, &image);
    let out = gpucr(&["restore", image.to_str().unwrap()]);
    assert_fails_with(
        &out,
        IMAGE_INCOMPLETE,
        "the image is incomplete: the dump failed",
    );
}

/// After a failed dump: gpucr said the tree still runs, it does and its journals go
/// on without a gap, and the image is marked incomplete, with no manifest.
fn assert_failed_dump_left_the_tree_running(err: &str, tree: &Tree, state: &Path, image: &Path) {
    assert!(
        err.contains(&format!("pid {} is still running", tree.pid)),
        "{err}"
    );
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(state, role);
    }
    assert!(!image.join("gpucr.json").exists());
    assert!(image.join("gpucr-incomplete.json").exists());
}

/// A user's action script (`action-script` of a --criu-config file) that fails at
/// post-dump fails the dump: the error's headline names the script, the stage and how
/// it ended (CRIU's own last error only says that one of the scripts failed), the exit
/// code is CRIU's failure, the image is marked incomplete, and the tree runs on.
#[test]
fn a_failing_action_script_is_named_and_the_tree_runs_on() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (script, config) = failing_script(tmp.path(), "post-dump", 3);
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &[]);
    let out = gpucr(&[
        "dump",
        "--tcp-established",
        "--criu-config",
        config.to_str().unwrap(),
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_fails_with(
        &out,
        CRIU_FAILED,
        &format!(
            "gpucr: error: criu dump failed: the action script {} failed at post-dump \
             (exited with status 3) (action-script of --criu-config {})\n",
            script.display(),
            config.display()
        ),
    );
    let err = stderr(&out);
    assert!(err.contains("hook: post-dump"), "the log's tail: {err}");
    assert_failed_dump_left_the_tree_running(&err, &tree, &state, &image);
}

/// An action script that fails at network-unlock, in a dump of a tree with its own
/// network namespace (the only kind CRIU runs network-lock and network-unlock scripts
/// for): CRIU lets that dump succeed, so the image is complete and the tree, left
/// running, runs on; gpucr says which script failed at which stage, with its exit
/// status and the config file that named it, and where CRIU's log is.
#[test]
fn a_script_failing_at_network_unlock_is_warned_of() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (script, config) = failing_script(tmp.path(), "network-unlock", 4);
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start_in(&state, &[], OwnNamespaces::Network);
    let out = gpucr(&[
        "dump",
        "--leave-running",
        "--tcp-established",
        "--criu-config",
        config.to_str().unwrap(),
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    let warning = format!(
        "gpucr: warning: the action script {} failed at network-unlock (exited with status \
         4) (action-script of --criu-config {}); CRIU does not fail a dump for it: see {}",
        script.display(),
        config.display(),
        image.join("dump.log").display()
    );
    assert!(stderr(&out).contains(&warning), "{}", stderr(&out));
    assert!(image.join("gpucr.json").exists());
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
}

/// Damaged images are refused before CRIU starts (CRIU would write restore.log), except
/// memory pages, which are verified before the restored tree may run.
#[test]
fn damaged_images_are_refused_and_never_run() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("image");
    let state = tmp.path().join("state");
    let tree = Tree::start(&state, &["--memory-mib", "32"]);
    let out = gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    kill_and_wait(tree.pid);
    let journal_at_dump = tree.journal("parent").len();
    let variant = |name: &str| {
        let dir = tmp.path().join(name);
        copy_files(&image, &dir);
        dir
    };
    let first = |dir: &Path, prefix: &str| {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix) && n.ends_with(".img"))
            .collect();
        names.sort();
        dir.join(&names[0])
    };

    let no_manifest = variant("no-manifest");
    fs::remove_file(no_manifest.join("gpucr.json")).unwrap();
    let out = gpucr(&["restore", no_manifest.to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_INCOMPLETE, "gpucr.json is missing");
    assert!(!no_manifest.join("restore.log").exists());

    let truncated = variant("truncated");
    let pages = first(&truncated, "pages-");
    let len = fs::metadata(&pages).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&pages)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = gpucr(&["restore", truncated.to_str().unwrap()]);
    let name = pages.file_name().unwrap().to_str().unwrap();
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        &format!("{name}: truncated at offset {}", len / 2),
    );
    assert!(!truncated.join("restore.log").exists());

    // A CRIU image added after the dump (CRIU reads some only when they exist) would be
    // restored from unverified bytes: refused, as inspect --verify reports it.
    let added = variant("added");
    fs::write(added.join("tcp-stream-7.img"), b"not from the dump").unwrap();
    let out = gpucr(&["restore", added.to_str().unwrap()]);
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        "tcp-stream-7.img: a CRIU image the manifest does not list",
    );
    assert!(!added.join("restore.log").exists());
    let out = gpucr(&["inspect", "--verify", "--json", added.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(IMAGE_DAMAGED));
    assert!(stdout(&out).contains("\"unlisted\""), "{}", stdout(&out));

    let flipped = variant("flipped");
    let core = first(&flipped, "core-");
    let mut bytes = fs::read(&core).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    fs::write(&core, bytes).unwrap();
    let out = gpucr(&["restore", flipped.to_str().unwrap()]);
    let name = core.file_name().unwrap().to_str().unwrap();
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        &format!("{name}: checksum mismatch: bytes 0.."),
    );
    assert!(stderr(&out).contains("refusing to restore"));
    assert!(!flipped.join("restore.log").exists());

    let garbage = variant("garbage-manifest");
    fs::write(
        garbage.join("gpucr.json"),
        b"{\"format\": \"gpucr-image\", \"format_version\": 1,",
    )
    .unwrap();
    let out = gpucr(&["restore", garbage.to_str().unwrap()]);
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        "gpucr.json: malformed manifest at line 1",
    );

    let out = gpucr(&["restore", tmp.path().join("nowhere").to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_INCOMPLETE, "no such image directory");
    let out = gpucr(&[
        "check-topology",
        tmp.path().join("nowhere").to_str().unwrap(),
    ]);
    assert_fails_with(&out, IMAGE_INCOMPLETE, "no such image directory or archive");
    let out = gpucr(&["restore", "/dev/null"]);
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        "/dev/null: not an image directory (neither a directory nor a file)",
    );
    let out = gpucr(&["restore", first(&image, "core-").to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_DAMAGED, "not an image directory (a file)");

    // A FIFO where the manifest or a CRIU image belongs: refused as not a regular file,
    // never waited on (opening a FIFO blocks until a writer comes, and a restore takes
    // SIGTERM on a thread of its own). `timeout` turns a hang into exit 124.
    let bounded = |args: &[&str]| {
        std::process::Command::new("timeout")
            .arg("20")
            .arg(gpucr_bin())
            .args(args)
            .output()
            .unwrap()
    };
    // Each command exits IMAGE_DAMAGED and says `needle` on stdout or stderr.
    let each_refuses_as_damaged = |commands: &[&[&str]], needle: &str| {
        for args in commands {
            let out = bounded(args);
            assert_eq!(
                out.status.code(),
                Some(IMAGE_DAMAGED),
                "{args:?}: {}",
                stderr(&out)
            );
            let said = format!("{}{}", stdout(&out), stderr(&out));
            assert!(said.contains(needle), "{args:?}: {said}");
        }
    };
    let fifo_manifest = variant("fifo-manifest");
    fs::remove_file(fifo_manifest.join("gpucr.json")).unwrap();
    nix::unistd::mkfifo(
        &fifo_manifest.join("gpucr.json"),
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let dir = fifo_manifest.to_str().unwrap();
    for (args, code) in [
        (&["restore", dir][..], IMAGE_DAMAGED),
        // A manifest that is there but cannot be read damages the image, with or
        // without --verify.
        (&["inspect", dir], IMAGE_DAMAGED),
        (&["inspect", "--verify", dir], IMAGE_DAMAGED),
        (&["check-topology", dir], IMAGE_DAMAGED),
    ] {
        let out = bounded(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a regular file (a FIFO)")
                || stdout(&out).contains("not a regular file (a FIFO)"),
            "{args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let fifo_core = variant("fifo-core");
    let core = first(&fifo_core, "core-");
    fs::remove_file(&core).unwrap();
    nix::unistd::mkfifo(
        &core,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let dir = fifo_core.to_str().unwrap();
    for args in [
        &["restore", dir][..],
        &["inspect", dir],
        &["inspect", "--verify", dir],
    ] {
        let out = bounded(args);
        assert_eq!(
            out.status.code(),
            Some(IMAGE_DAMAGED),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!fifo_core.join("restore.log").exists());

    // A CRIU image that is a symbolic link to the same bytes elsewhere: not the image
    // the dump wrote (a copy of the directory would not carry it), so damaged, named.
    let linked = variant("symlinked-core");
    let core = first(&linked, "core-");
    let aside = tmp.path().join("core-aside.img");
    fs::rename(&core, &aside).unwrap();
    std::os::unix::fs::symlink(&aside, &core).unwrap();
    let name = core.file_name().unwrap().to_str().unwrap();
    let needle = format!("{name}: a symbolic link (to {})", aside.display());
    let dir = linked.to_str().unwrap();
    each_refuses_as_damaged(&[&["restore", dir], &["inspect", "--verify", dir]], &needle);
    assert!(!linked.join("restore.log").exists());

    // The manifest itself a symbolic link to an intact copy elsewhere: damaged the same
    // way, the link and its target named, by restore (before CRIU starts), inspect
    // --verify (kind "symlink") and check-topology.
    let linked = variant("symlinked-manifest");
    let manifest = linked.join("gpucr.json");
    let aside = tmp.path().join("gpucr-aside.json");
    fs::rename(&manifest, &aside).unwrap();
    std::os::unix::fs::symlink(&aside, &manifest).unwrap();
    let needle = format!(
        "{}: a symbolic link (to {}), not the manifest the dump wrote",
        manifest.display(),
        aside.display()
    );
    let dir = linked.to_str().unwrap();
    each_refuses_as_damaged(
        &[
            &["restore", dir],
            &["inspect", "--verify", dir],
            &["check-topology", dir],
        ],
        &needle,
    );
    assert!(!linked.join("restore.log").exists());
    let out = bounded(&["inspect", "--verify", "--json", dir]);
    assert_eq!(out.status.code(), Some(IMAGE_DAMAGED));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = report["verify"]["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["file"] == "gpucr.json" && p["kind"] == "symlink"),
        "{problems:?}"
    );

    // A flipped byte in the memory pages. By default they are hashed while CRIU restores
    // and the post-restore notification is refused: CRIU kills the half-made tree before
    // it ever runs. With --verify-first the image is refused before CRIU starts.
    let big_pages = |dir: &Path| {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("pages-")
            })
            .max_by_key(|p| fs::metadata(p).unwrap().len())
            .unwrap()
    };
    let flip_middle = |path: &Path| {
        let mut bytes = fs::read(path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        fs::write(path, bytes).unwrap();
        middle as u64
    };
    let strict = variant("flipped-pages-strict");
    let pages = big_pages(&strict);
    let offset = flip_middle(&pages);
    let block = offset / (4 << 20) * (4 << 20);
    let name = pages.file_name().unwrap().to_str().unwrap().to_owned();
    let out = gpucr(&["restore", "--verify-first", strict.to_str().unwrap()]);
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        &format!("{name}: checksum mismatch: bytes {block}.."),
    );
    assert!(!strict.join("restore.log").exists());

    let overlapped = variant("flipped-pages");
    flip_middle(&overlapped.join(&name));
    let out = gpucr(&["restore", "--detach", overlapped.to_str().unwrap()]);
    assert_fails_with(
        &out,
        IMAGE_DAMAGED,
        &format!("{name}: checksum mismatch: bytes {block}.."),
    );
    let log = fs::read_to_string(overlapped.join("restore.log")).unwrap();
    assert!(
        log.contains("Aborting restore due to post-restore script"),
        "{log}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        tree.journal("parent").len(),
        journal_at_dump,
        "the half-made tree never ran"
    );

    // Ctrl-C while --verify-first hashes a large image stops it at once (exit 130), not
    // after the whole image is read. The pages file becomes an 8 GiB sparse one, listed
    // with that size; one core hashes it (taskset), which takes seconds anywhere, and
    // left to finish it would end in a checksum mismatch (exit 7) instead.
    let large = variant("interrupted-verification");
    let pages = large.join(&name);
    let large_size: u64 = 8 << 30;
    fs::File::options()
        .write(true)
        .open(&pages)
        .unwrap()
        .set_len(large_size)
        .unwrap();
    let manifest_path = large.join("gpucr.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(&manifest_path).unwrap()).unwrap();
    for file in manifest["files"].as_array_mut().unwrap() {
        if file["path"] == name.as_str() {
            file["size"] = large_size.into();
        }
    }
    fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let child = Command::new("timeout")
        .args(["60", "taskset", "-c", "0"])
        .arg(gpucr_bin())
        .args(["restore", "--verify-first", large.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once gpucr (`timeout`'s child, taskset having become it) has the pages file
    // open, it hashes it.
    wait_for(
        std::time::Duration::from_secs(20),
        "gpucr to open the pages file to hash it",
        || {
            gpucr_abi::procfs::children(child.id() as i32)
                .into_iter()
                .any(|gpucr| {
                    fs::read_dir(format!("/proc/{gpucr}/fd")).is_ok_and(|fds| {
                        fds.flatten()
                            .any(|fd| fs::read_link(fd.path()).is_ok_and(|p| p == pages))
                    })
                })
                .then_some(())
        },
    );
    // `timeout` passes the signal on to gpucr.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    fs::remove_file(&pages).unwrap();
    assert_fails_with(&out, 130, "interrupted by SIGINT");
    assert!(!large.join("restore.log").exists());

    // The intact image still restores.
    let out = gpucr(&["restore", "--detach", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    tree.wait_ticks(2);
    assert_journal_continuous(&state, "parent");
}

/// The RPC client speaks VERSION and CHECK with the installed CRIU (CHECK's verdict is
/// reported, never required).
#[test]
fn rpc_client_speaks_version_and_check() {
    let path = gpucr::criu::locate(None).expect("criu is installed for the tests");
    let mut swrk = gpucr::criu::Swrk::spawn(&path, &[], &[]).unwrap();
    let version = swrk.version().unwrap();
    assert!(version >= gpucr::criu::MIN_VERSION, "{version}");
    let _looks_good: bool = swrk.check().unwrap();
    swrk.finish().unwrap();
}

// ----- generated documentation --------------------------------------------------------

/// Regenerate with `GPUCR_BLESS=1 cargo test --test cli generated_docs_are_fresh`.
#[test]
fn generated_docs_are_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = gpucr::docs::render_all().expect("render docs");
    let bless = std::env::var_os("GPUCR_BLESS").is_some();
    let mut stale = Vec::new();
    for (rel, content) in &generated {
        let path = root.join(rel);
        if bless {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, content).unwrap();
        } else if fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
            stale.push(rel.clone());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files {stale:?}: run `GPUCR_BLESS=1 cargo test --test cli generated_docs_are_fresh`"
    );
}

/// A bad value in a flag's variable is refused as the flag's would be, and the message
/// says where it came from.
#[test]
fn a_bad_value_from_the_environment_is_named() {
    let out = gpucr_env(
        &["dump", "1", "/nonexistent"],
        &[("GPUCR_COMPRESS", "zstd:99")],
    );
    assert_eq!(out.status.code(), Some(2));
    let said = stderr(&out);
    assert!(
        said.contains("invalid value 'zstd:99' for '--compress"),
        "{said}"
    );
    assert!(
        said.contains("gpucr: note: that value came from the environment (GPUCR_COMPRESS)"),
        "{said}"
    );
    let out = gpucr_env(
        &["restore", "--jobs", "0", "/nonexistent"],
        &[("GPUCR_JOBS", "0")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!stderr(&out).contains("note:"), "{}", stderr(&out));
}

/// Every `GPUCR_*` name in the project's sources, scripts and docs is one of gpucr-abi's
/// list (`gpucr_abi::env`), which the warnings about unknown names, the settings file
/// and gpucr(1) go by: a variable added without an entry fails here.
#[test]
fn every_gpucr_variable_in_the_sources_is_listed() {
    // Names the tests misspell on purpose.
    const MISSPELT: [&str; 3] = [
        "GPUCR_COMPRES",
        "GPUCR_SIM_ROT",
        "GPUCR_SOMETHING_ELSE_ENTIRELY",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join(".ci/run")];
    let mut dirs: Vec<PathBuf> = [
        "src",
        "core",
        "abi",
        "plugin",
        "amdgpu",
        "cuda-driver",
        "fake-cuda",
        "topology",
        "criu-image",
        "examples",
        "tests",
        "scripts",
        "docs",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    dirs.push(path);
                }
            } else if ["rs", "sh", "c", "py", "md", "toml"]
                .iter()
                .any(|ext| path.extension().is_some_and(|e| e == *ext))
            {
                files.push(path);
            }
        }
    }
    let mut unlisted = Vec::new();
    let mut seen = 0;
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(gpucr_abi::env::PREFIX) {
            let token: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            rest = &rest[at + token.len().max(1)..];
            seen += 1;
            let listed = if token == gpucr_abi::env::PREFIX {
                true
            } else if token.ends_with('_') {
                gpucr_abi::env::VARIABLES
                    .iter()
                    .any(|v| v.name.starts_with(&token))
            } else {
                gpucr_abi::env::find(&token).is_some() || MISSPELT.contains(&token.as_str())
            };
            if !listed {
                unlisted.push(format!("{token} in {}", file.display()));
            }
        }
    }
    assert!(seen > 100, "only {seen} names found: is the walk right?");
    assert!(
        unlisted.is_empty(),
        "not in gpucr_abi::env::VARIABLES: {unlisted:#?}"
    );
}
