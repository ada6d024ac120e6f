//! End-to-end checkpoint tests with real CRIU and real process trees, each in its own
//! PID namespace: dump, kill, restore, and check that the tree goes on from where it was.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;

/// Dump the tree (killing it), restore it detached, and check it carried on.
#[test]
fn dump_kill_restore_continues_where_it_was() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &["--memory-mib", "64"]);
    let before: Vec<JournalLine> = ROLES.iter().map(|r| tree.last(r)).collect();

    let out = gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    assert!(
        stdout(&out).contains(&format!("dumped pid {}", tree.pid)),
        "{}",
        stdout(&out)
    );
    wait_for(
        std::time::Duration::from_secs(10),
        "the dumped tree to be killed",
        || (!alive(tree.pid)).then_some(()),
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&image).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(image.join("gpucr.json").exists());
    assert!(image.join("pstree.img").exists());
    let dumped: Vec<usize> = ROLES.iter().map(|r| tree.journal(r).len()).collect();

    let out = gpucr(&["restore", "--detach", image.to_str().unwrap()]);
    assert_success(&out);
    let pid: i32 = stdout(&out)
        .trim()
        .parse()
        .expect("restore --detach prints the pid");
    let _restored = Restored(pid);
    tree.wait_ticks(5);

    for (i, role) in ROLES.iter().enumerate() {
        assert_journal_continuous(&state, role);
        let now = tree.last(role);
        assert!(
            tree.journal(role).len() > dumped[i] + 3,
            "{role} did not go on"
        );
        assert!(now.num("tick") > before[i].num("tick"));
    }
    // Every channel kept working: TCP and unix pings, the pipe sequence, and the 64 MiB
    // pattern was checked again after the restore.
    let parent = tree.last("parent");
    assert!(parent.num("pipe") > before[0].num("pipe"));
    assert!(tree.last("tcp").num("tcp") > before[1].num("tcp"));
    assert!(tree.last("pipe").num("unix") > before[2].num("unix"));
    wait_for(
        std::time::Duration::from_secs(20),
        "a memory check after restore",
        || (tree.last("parent").num("passes") > parent.num("passes")).then_some(()),
    );
    assert!(tree.last("parent").healthy());
}

/// --leave-running: the tree is not killed and goes on ticking.
#[test]
fn leave_running_keeps_the_tree_running() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &[]);
    let json = dump_keeping(&tree, &image, "--leave-running");
    assert_eq!(json["pid"], tree.pid);
    assert_eq!(json["left_running"], true);
    assert!(json["pages_bytes"].as_u64().unwrap() > 64 << 20);
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }
    let manifest: serde_json::Value = manifest_json(&image);
    assert_eq!(manifest["options"]["leave_running"], true);
    assert_eq!(
        manifest["host"]["page_size"].as_u64(),
        Some(gpucr::inspect::host_page_size())
    );
    // The memory pages were digested from the tree while CRIU held it, before it ran on
    // and changed its memory: the image verifies.
    let events = names_in(&manifest["timings"]["events"]);
    let at = |name| events.iter().position(|e| *e == name);
    let (post_dump, digested) = (at("post-dump"), at("pages-digested"));
    assert!(post_dump.is_some() && post_dump < digested, "{events:?}");
    assert_eq!(manifest["checksum_algorithm"], "xxh3-pages-4m");
    let out = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
    assert_success(&out);
    assert!(stdout(&out).contains("intact"), "{}", stdout(&out));
}

/// `gpucr dump --json` of `tree` into `image` with the flag `keep` (`--leave-running`
/// or `--leave-stopped`): its report.
fn dump_keeping(tree: &Tree, image: &Path, keep: &str) -> serde_json::Value {
    let out = gpucr(&[
        "dump",
        keep,
        "--tcp-established",
        "--json",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    serde_json::from_str(&stdout(&out)).expect("--json output")
}

/// --leave-stopped: every task is stopped when the dump returns, the tree does nothing
/// until it gets SIGCONT, then goes on where it was; the image is whole.
#[test]
fn leave_stopped_keeps_the_tree_stopped_until_it_is_let_run() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &[]);
    let json = dump_keeping(&tree, &image, "--leave-stopped");
    assert_eq!(json["left_stopped"], true);
    assert_eq!(json["left_running"], false);
    let tasks = gpucr::lazy::kill::descendants(&[tree.pid]);
    assert!(tasks.len() >= 3, "{tasks:?}");
    for pid in &tasks {
        assert!(
            gpucr_abi::procfs::is_stopped(*pid),
            "task {pid} of the tree is not stopped"
        );
    }
    let at_dump: Vec<usize> = ROLES.iter().map(|r| tree.journal(r).len()).collect();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let later: Vec<usize> = ROLES.iter().map(|r| tree.journal(r).len()).collect();
    assert_eq!(at_dump, later, "the stopped tree wrote to its journals");
    for pid in &tasks {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGCONT)
            .unwrap();
    }
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }
    assert!(tree.last("parent").healthy());
    let out = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
    assert_success(&out);
    // Both at once make no sense: refused as a usage error.
    let out = gpucr(&[
        "dump",
        "--leave-stopped",
        "--leave-running",
        "1",
        "/nonexistent",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A workload tree dumped into `tmp/image` (and killed), with its state files as they
/// were at the dump kept in `tmp/snapshot` (CRIU checks their sizes at restore).
struct Dumped {
    /// The dumped tree, killed; its journal goes on once it is restored.
    tree: Tree,
    state: PathBuf,
    snapshot: PathBuf,
    image: PathBuf,
    /// The parent's tick count at the dump.
    dumped_ticks: u64,
}

fn dumped_and_killed(tmp: &Path) -> Dumped {
    let state = tmp.join("state");
    let snapshot = tmp.join("snapshot");
    let image = tmp.join("image");
    let tree = Tree::start(&state, &[]);
    assert_success(&gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]));
    kill_and_wait(tree.pid);
    copy_files(&state, &snapshot);
    let dumped_ticks = tree.last("parent").num("tick");
    Dumped {
        tree,
        state,
        snapshot,
        image,
        dumped_ticks,
    }
}

/// One image restores twice (the workload's own files are put back as they were at the
/// dump: CRIU checks their sizes, it does not carry their contents).
#[test]
fn one_image_restores_twice() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let Dumped {
        tree,
        state,
        snapshot,
        image,
        dumped_ticks,
    } = dumped_and_killed(tmp.path());

    for round in 0..2 {
        copy_files(&snapshot, &state);
        let out = gpucr(&["restore", "-d", image.to_str().unwrap()]);
        let restored = Restored::from_output(&out);
        tree.wait_ticks(3);
        for role in ROLES {
            assert_journal_continuous(&state, role);
        }
        assert!(
            tree.last("parent").num("tick") > dumped_ticks + 2,
            "round {round}"
        );
        drop(restored);
    }
}

/// Without --detach, gpucr waits for the restored tree and exits with its status, a
/// SIGHUP meanwhile notwithstanding.
#[test]
fn restore_waits_for_the_tree_and_exits_with_its_status() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &["--exit-after-ticks", "30", "--exit-code", "7"]);
    assert_success(&gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]));
    kill_and_wait(tree.pid);
    let at_dump = tree.journal("parent").len();
    let child = spawn_gpucr(&["restore", image.to_str().unwrap()], &[]);
    // A lost terminal while gpucr waits: SIGHUP does not end gpucr, which still reports
    // the job's own status. (That it is not passed on cannot show here: the tree's root
    // is its PID namespace's init, which ignores signals it has no handler for.)
    wait_for(
        std::time::Duration::from_secs(30),
        "the restored tree to tick",
        || (tree.journal("parent").len() > at_dump + 1).then_some(()),
    );
    signal_child(&child, nix::sys::signal::Signal::SIGHUP);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("restored pid"), "{err}");
    assert!(err.contains("total"), "no timeline: {err}");
    assert_eq!(tree.last("parent").num("tick"), 30);
    assert_journal_continuous(&state, "parent");
}

/// A tree dumped outside a PID namespace of its own is restored with its own pids: with
/// the original still running (`--leave-running`), the restore is refused with a
/// message naming the pid and what holds it, and nothing is restored.
#[test]
fn a_restore_onto_a_taken_pid_names_the_holder() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("image");
    let mut sleeper = std::process::Command::new("setsid")
        .args(["sleep", "601.25"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = sleeper.id() as i32;
    wait_for(std::time::Duration::from_secs(10), "sleep to run", || {
        fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "sleep")
            .then_some(())
    });
    let out = gpucr(&[
        "dump",
        "--leave-running",
        &pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    let out = gpucr(&["restore", "--detach", image.to_str().unwrap()]);
    assert_fails_with(
        &out,
        5,
        &format!("pid {pid} of the image's tree is in use on this machine (by sleep)"),
    );
    assert!(stderr(&out).contains("nothing was restored"));
    // CRIU's failure is shown once, inside the message, not again as its cause.
    assert_eq!(
        stderr(&out).matches("Can't fork for").count(),
        2,
        "the headline and the log tail: {}",
        stderr(&out)
    );
    let sleeping: Vec<_> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("cmdline"))
                .is_ok_and(|c| c.split('\0').take(2).eq(["sleep", "601.25"]))
        })
        .collect();
    assert_eq!(sleeping.len(), 1, "only the original sleeps");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// `--criu-config`: CRIU options gpucr has no flag for. The tree keeps a deleted 3 MiB
/// file open, over CRIU's 1 MiB ghost-limit: the dump fails (the tree runs on, and the
/// error says which line would help); a file setting a managed option is refused before
/// anything is touched; `ghost-limit 8M` dumps it, the image records the option, and
/// the restored tree reads the whole file back. A restore's config reaches CRIU too:
/// `tcp-close` restores the tree's TCP connection closed, which the workload notices.
#[test]
fn criu_config_passes_options_gpucr_has_no_flag_for() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let snapshot = tmp.path().join("snapshot");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &["--scratch-mib", "3"]);
    let pid = tree.pid.to_string();
    let dump = |config: Option<&std::path::Path>, dir: &std::path::Path| {
        let mut args = vec!["dump", "--tcp-established"];
        if let Some(c) = config {
            args.extend(["--criu-config", c.to_str().unwrap()]);
        }
        args.extend([pid.as_str(), dir.to_str().unwrap()]);
        gpucr(&args)
    };

    let out = dump(None, &tmp.path().join("no-config"));
    assert_fails_with(&out, 5, "Can't dump ghost file");
    assert!(
        stderr(&out).contains("`ghost-limit SIZE`"),
        "{}",
        stderr(&out)
    );
    assert!(alive(tree.pid));

    let managed = tmp.path().join("managed.conf");
    fs::write(&managed, "ghost-limit 8M\nleave-running\n").unwrap();
    let out = dump(Some(&managed), &image);
    assert_fails_with(
        &out,
        2,
        "managed.conf, line 2: `leave-running` is set by gpucr",
    );
    assert!(!image.exists(), "nothing is touched");
    let out = dump(Some(&tmp.path().join("missing.conf")), &image);
    assert_fails_with(&out, 2, "missing.conf: cannot read it");
    assert!(!image.exists());
    tree.wait_ticks(2);
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }

    let config = tmp.path().join("ghosts.conf");
    fs::write(&config, "# the scratch file\nghost-limit 8M  # 3 MiB\n").unwrap();
    assert_success(&dump(Some(&config), &image));
    kill_and_wait(tree.pid);
    copy_files(&state, &snapshot);
    let recorded = &manifest_json(&image)["options"]["criu_config"];
    assert_eq!(recorded["file"], config.to_str().unwrap());
    assert_eq!(recorded["options"], serde_json::json!(["ghost-limit=8M"]));
    let out = gpucr(&["inspect", image.to_str().unwrap()]);
    assert!(
        stdout(&out).contains(&format!("CRIU config {}: ghost-limit=8M", config.display())),
        "{}",
        stdout(&out)
    );

    // The scratch file has 48 pieces of 64 KiB, one checked per tick: after 60 ticks
    // every byte was read back.
    let dumped_ticks = tree.last("parent").num("tick");
    let restored = Restored::from_output(&gpucr(&["restore", "-d", image.to_str().unwrap()]));
    wait_for(
        std::time::Duration::from_secs(30),
        "the restored tree to check its whole scratch file",
        || (tree.last("parent").num("tick") > dumped_ticks + 60).then_some(()),
    );
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }
    assert!(tree.last("parent").healthy());
    drop(restored);

    // The journals grew since the dump, which CRIU refuses; the error recalls the
    // dump's own options, which a restore does not reuse.
    let out = gpucr(&["restore", image.to_str().unwrap()]);
    assert_fails_with(&out, 5, "criu restore failed");
    assert!(
        stderr(&out).contains(&format!(
            "the dump took CRIU options from {} (ghost-limit=8M)",
            config.display()
        )),
        "{}",
        stderr(&out)
    );

    copy_files(&snapshot, &state);
    let close = tmp.path().join("close.conf");
    fs::write(&close, "tcp-close\n").unwrap();
    let out = gpucr(&[
        "restore",
        "--criu-config",
        close.to_str().unwrap(),
        image.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the workload exits 3 once its TCP connection is gone: {}",
        stderr(&out)
    );
    // The root exits 3 only after writing a line with the broken check (the child that
    // pings may die with it before its own next line).
    assert!(
        tree.journal("parent").iter().any(|l| !l.healthy()),
        "the parent saw its TCP peer gone"
    );
}

/// A read-only bind mount, unmounted when dropped.
struct ReadOnlyMount(std::path::PathBuf);

impl ReadOnlyMount {
    fn new(from: &std::path::Path, at: &std::path::Path) -> ReadOnlyMount {
        fs::create_dir_all(at).unwrap();
        let run = |args: &[&str]| {
            let status = std::process::Command::new("mount")
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "mount {args:?}");
        };
        run(&["--bind", from.to_str().unwrap(), at.to_str().unwrap()]);
        let mount = ReadOnlyMount(at.to_path_buf());
        run(&["-o", "remount,bind,ro", at.to_str().unwrap()]);
        mount
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The private directory a restore from a read-only image names for CRIU's log.
fn private_work_dir(stderr: &str) -> std::path::PathBuf {
    let (_, rest) = stderr
        .split_once("CRIU's log and statistics go to ")
        .unwrap_or_else(|| panic!("no private work directory named: {stderr}"));
    std::path::PathBuf::from(rest.split_whitespace().next().unwrap())
}

/// What is in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A read-only image directory restores: CRIU writes its log and statistics into a
/// private 0700 directory that gpucr names, removed once the restore succeeded, kept
/// and named after a failure, and removed by the next restore of the image; the image
/// is left as it was. A log left by an earlier restore is never shown as this run's:
/// not when CRIU fails after writing its own log, nor when CRIU refuses the request
/// before it opens one (which names the --criu-config file whose options the request
/// carried). An action script that fails at pre-restore is named as the cause; one that
/// fails at pre-resume, which CRIU lets pass, is warned of.
#[test]
fn a_read_only_image_restores_and_no_stale_log_is_shown() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let Dumped {
        tree,
        state,
        snapshot,
        image,
        dumped_ticks,
    } = dumped_and_killed(tmp.path());
    let stale = "(00.01) Error (criu/stale.c:1): STALE line of an earlier restore\n";
    fs::write(image.join("restore.log"), stale).unwrap();
    // The private directories go under TMPDIR: nothing else is there.
    let temp = tmp.path().join("temp");
    fs::create_dir(&temp).unwrap();
    let env = [("TMPDIR", temp.to_str().unwrap())];
    let (_, pre_resume) = failing_script(tmp.path(), "pre-resume", 3);
    let (_, pre_restore) = failing_script(tmp.path(), "pre-restore", 3);

    let ro = ReadOnlyMount::new(&image, &tmp.path().join("ro"));
    let out = gpucr_env(
        &[
            "restore",
            "-d",
            "--criu-config",
            pre_resume.to_str().unwrap(),
            ro.0.to_str().unwrap(),
        ],
        &env,
    );
    let restored = Restored::from_output(&out);
    let err = stderr(&out);
    let work = private_work_dir(&err);
    assert!(work.starts_with(&temp), "{err}");
    assert!(!work.exists(), "a successful restore leaves its log behind");
    assert!(listing(&temp).is_empty(), "{:?}", listing(&temp));
    assert!(
        err.contains(&format!(
            "warning: the action script {} failed at pre-resume (exited with status 3) \
             (action-script of --criu-config {}); CRIU does not fail a restore for it and \
             resumed the tree\n",
            tmp.path().join("fail-at-pre-resume.sh").display(),
            pre_resume.display()
        )),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(image.join("restore.log")).unwrap(),
        stale
    );
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }
    assert!(tree.last("parent").num("tick") > dumped_ticks + 2);
    drop(restored);

    // The journals grew since the dump, which CRIU refuses, having written its log: the
    // private directory is kept for it, and named.
    let out = gpucr_env(&["restore", "-d", ro.0.to_str().unwrap()], &env);
    assert_fails_with(&out, 5, "criu restore failed");
    let err = stderr(&out);
    let failed = private_work_dir(&err);
    assert!(
        err.contains(&format!(
            "full log: {}",
            failed.join("restore.log").display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "CRIU's log of this restore is kept in {} (the image directory is not writable); \
             the next restore of this image removes it",
            failed.display()
        )),
        "{err}"
    );
    assert!(!err.contains("STALE"), "{err}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&failed).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(failed.join("restore.log").exists());

    // The next restore removes it; its action script fails at pre-restore, which heads
    // the error, not CRIU's line that one of the scripts failed.
    let out = gpucr_env(
        &[
            "restore",
            "-d",
            "--criu-config",
            pre_restore.to_str().unwrap(),
            ro.0.to_str().unwrap(),
        ],
        &env,
    );
    assert_fails_with(
        &out,
        5,
        &format!(
            "gpucr: error: criu restore failed: the action script {} failed at pre-restore \
             (exited with status 3) (action-script of --criu-config {})\n",
            tmp.path().join("fail-at-pre-restore.sh").display(),
            pre_restore.display()
        ),
    );
    let err = stderr(&out);
    let work = private_work_dir(&err);
    assert!(
        !failed.exists(),
        "the earlier restore's directory is removed"
    );
    assert!(
        err.contains(&format!("is kept in {}", work.display())),
        "{err}"
    );
    assert!(
        fs::read_to_string(work.join("restore.log"))
            .unwrap()
            .contains("hook: pre-restore"),
        "the script's output is in the kept log"
    );
    assert_eq!(listing(&temp).len(), 1, "{:?}", listing(&temp));
    fs::remove_dir_all(&work).unwrap();
    drop(ro);

    // CRIU refuses an option value before it opens its log (here a namespace file that
    // is not there, which gpucr leaves to CRIU): the earlier restore's log is neither
    // shown nor left behind, and the config file is named.
    let config = tmp.path().join("join-ns.conf");
    fs::write(&config, "join-ns net:/nonexistent/gpucr-netns\n").unwrap();
    copy_files(&snapshot, &state);
    let out = gpucr(&[
        "restore",
        "-d",
        "--criu-config",
        config.to_str().unwrap(),
        image.to_str().unwrap(),
    ]);
    assert_fails_with(&out, 5, "CRIU refused the request before it opened its log");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the request carried the CRIU options of --criu-config {}",
            config.display()
        )),
        "{err}"
    );
    assert!(!err.contains("STALE") && !err.contains("full log"), "{err}");
    assert!(!image.join("restore.log").exists());
}

/// --no-page-checksums: the memory pages files are recorded by size only. The image
/// restores, `inspect` and `inspect --verify` say how it was made, a truncated pages file
/// is still found, and no other file can be exempted from its checksum.
#[test]
fn no_page_checksums_records_the_pages_files_by_size() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let snapshot = tmp.path().join("snapshot");
    let image = tmp.path().join("image");
    let tree = Tree::start(&state, &[]);
    assert_success(&gpucr(&[
        "dump",
        "--no-page-checksums",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]));
    kill_and_wait(tree.pid);
    copy_files(&state, &snapshot);
    let manifest = manifest_json(&image);
    assert_eq!(manifest["options"]["no_page_checksums"], true);
    let files = manifest["files"].as_array().unwrap();
    let (pages, others): (Vec<_>, Vec<_>) = files.iter().partition(|f| {
        let path = f["path"].as_str().unwrap();
        path.starts_with("pages-") && path.ends_with(".img")
    });
    assert!(!pages.is_empty(), "{files:?}");
    for f in &pages {
        assert_eq!(f["checksum"], "size-only", "{f}");
        assert!(f.get("blocks").is_none(), "{f}");
    }
    for f in &others {
        assert_eq!(f["checksum"].as_str().unwrap().len(), 32, "{f}");
    }

    let out = gpucr(&["inspect", image.to_str().unwrap()]);
    assert_success(&out);
    assert!(
        stdout(&out).contains("no page checksums"),
        "{}",
        stdout(&out)
    );
    let out = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
    assert_success(&out);
    let by_size = format!(
        "match the manifest ({} memory pages file{} by size only: dumped with --no-page-checksums)",
        pages.len(),
        if pages.len() == 1 { "" } else { "s" }
    );
    assert!(stdout(&out).contains(&by_size), "{}", stdout(&out));

    let out = gpucr(&["restore", "-d", "-v", image.to_str().unwrap()]);
    assert!(
        stderr(&out).contains(
            "image verified (its memory pages files by size only: dumped with \
             --no-page-checksums)"
        ),
        "{}",
        stderr(&out)
    );
    let restored = Restored::from_output(&out);
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&state, role);
    }
    drop(restored);

    // The sizes are still checked: a truncated pages file is damage, and the restore
    // refuses the image before CRIU runs.
    let largest = pages
        .iter()
        .max_by_key(|f| f["size"].as_u64().unwrap())
        .unwrap();
    let name = largest["path"].as_str().unwrap();
    let size = largest["size"].as_u64().unwrap();
    let saved = tmp.path().join("saved-pages.img");
    fs::copy(image.join(name), &saved).unwrap();
    fs::File::options()
        .write(true)
        .open(image.join(name))
        .unwrap()
        .set_len(size - 4096)
        .unwrap();
    let damaged = |needle: &str| {
        let out = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(7), "{}", stdout(&out));
        assert!(stdout(&out).contains(needle), "{}", stdout(&out));
    };
    damaged(&format!("{name}: truncated at offset {}", size - 4096));
    copy_files(&snapshot, &state);
    let out = gpucr(&["restore", "-d", image.to_str().unwrap()]);
    assert_fails_with(&out, 7, &format!("{name}: truncated"));
    fs::copy(&saved, image.join(name)).unwrap();

    // A manifest that claims no checksum for another file is refused.
    let mut crafted = manifest.clone();
    let core = crafted["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["path"].as_str().unwrap().starts_with("core-"))
        .unwrap();
    core["checksum"] = "size-only".into();
    let core_name = core["path"].as_str().unwrap().to_owned();
    fs::write(image.join("gpucr.json"), crafted.to_string()).unwrap();
    damaged(&format!(
        "{core_name}: the manifest records no checksum of it"
    ));
}

/// A restore whose action script hangs (at pre-restore, before any task is made),
/// interrupted twice: the first signal is answered with what gpucr waits for, the second
/// ends the script and what it started; CRIU rolls the restore back, gpucr exits 130,
/// and no task of the image's tree is left.
#[test]
fn a_second_sigint_during_a_restore_ends_the_hung_action_script() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let Dumped {
        tree,
        state,
        snapshot,
        image,
        ..
    } = dumped_and_killed(tmp.path());
    copy_files(&snapshot, &state);
    let hangs = HangingScript::new(tmp.path(), "pre-restore");
    let child = spawn_gpucr(
        &[
            "restore",
            "--detach",
            "--criu-config",
            hangs.config.to_str().unwrap(),
            image.to_str().unwrap(),
        ],
        &[],
    );
    let said = hangs.interrupt_twice(child, "restore");
    assert!(said.contains(", at pre-restore)"), "{said}");
    assert!(!alive(tree.pid), "nothing of the image's tree is left");
}
