//! On-demand restore with real CRIU: gpucr's lazy-pages server (gpucr_core::lazy) serves
//! the memory of a tree CRIU restores with lazy pages, and the tree's memory checks out.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use gpucr_core::cancel::Cancel;
use gpucr_core::image::manifest::Manifest;
use gpucr_core::lazy::{LazyServer, ServeOptions};
use nix::sys::signal::Signal;

/// Dump a 64 MiB workload with gpucr; its tree, image and state.
fn dumped_tree(tmp: &Path) -> (Tree, std::path::PathBuf) {
    dumped_tree_of(tmp, 64)
}

/// Dump a workload holding `mib` MiB with gpucr; its tree, image and state.
fn dumped_tree_of(tmp: &Path, mib: u32) -> (Tree, std::path::PathBuf) {
    let state = tmp.join("state");
    let image = tmp.join("image");
    let tree = Tree::start(&state, &["--memory-mib", &mib.to_string()]);
    let out = gpucr(&[
        "dump",
        "--tcp-established",
        &tree.pid.to_string(),
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    wait_for(
        Duration::from_secs(10),
        "the dumped tree to be killed",
        || (!alive(tree.pid)).then_some(()),
    );
    (tree, image)
}

/// `criu restore --lazy-pages -d` of `image` with `work` as its working directory; the
/// restored root's pid.
fn criu_lazy_restore(image: &Path, work: &Path) -> Result<i32, String> {
    criu_lazy_restore_with(image, work, |_| {})
}

/// [`criu_lazy_restore`], `started` told CRIU's pid once it runs.
fn criu_lazy_restore_with(
    image: &Path,
    work: &Path,
    started: impl FnOnce(i32),
) -> Result<i32, String> {
    let pidfile = work.join("restored.pid");
    let child = Command::new("criu")
        .args(["restore", "--lazy-pages", "-d", "--tcp-established", "-v4"])
        .arg("-D")
        .arg(image)
        .arg("-W")
        .arg(work)
        .arg("-o")
        .arg(work.join("restore.log"))
        .arg("--pidfile")
        .arg(&pidfile)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run criu");
    started(child.id() as i32);
    let out = child.wait_with_output().expect("wait for criu");
    if !out.status.success() {
        let log = std::fs::read_to_string(work.join("restore.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        return Err(format!(
            "criu restore failed: {:?}\n{}",
            out.status,
            tail.join("\n")
        ));
    }
    Ok(std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap())
}

#[test]
fn criu_lazy_restore_served_by_gpucr_keeps_its_memory() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let server = serve(&image, &work);
    let pid = match criu_lazy_restore(&image, &work) {
        Ok(pid) => pid,
        Err(e) => panic!("{e}\nserver: {:?}", server.wait()),
    };
    let _restored = Restored(pid);
    let summary = server.wait().unwrap();
    eprintln!("{summary:?}");
    assert!(summary.tasks >= 3, "{summary:?}");
    assert!(
        summary.fault_bytes + summary.background_bytes >= 64 << 20,
        "the workload's 64 MiB were not all served: {summary:?}"
    );
    tree.wait_ticks(5);
    for role in ROLES {
        assert_journal_continuous(&tree.state, role);
        let last = tree.last(role);
        assert!(last.healthy(), "journal-{role}: {last:?}");
    }
}

/// One byte flipped in the middle of the largest lazy run of `image` (a page that only
/// the lazy server places: one CRIU reads itself would be caught before CRIU starts by
/// `pages::verify_eager`, which this test does not run). The pages file's name.
fn damage_pages(image: &Path) -> String {
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .unwrap()
        .unwrap() as u64;
    let (file, offset) = std::fs::read_dir(image)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = name
                .strip_prefix("pagemap-")?
                .strip_suffix(".img")?
                .parse()
                .ok()?;
            let memory = gpucr_core::lazy::pages::task_memory(image, pid, page_size).ok()?;
            let largest = memory
                .ranges
                .in_file(0, u64::MAX)
                .into_iter()
                .max_by_key(|s| s.end - s.start)?;
            Some((memory.pages_file, largest))
        })
        .max_by_key(|(_, s)| s.end - s.start)
        .map(|(file, s)| (file, s.offset + (s.end - s.start) / 2))
        .expect("a lazy run in the image");
    let path = image.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset as usize] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    file
}

#[test]
fn a_damaged_block_kills_the_tree_and_names_the_file() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let damaged = damage_pages(&image);
    let server = serve(&image, &work);
    // CRIU may or may not have let the tree go when the damaged block is found. A tree
    // stopped or killed while CRIU still traces it makes CRIU fail and wait for ever:
    // the server kills CRIU first (named here), then the tree.
    server.criu_running();
    let restored = criu_lazy_restore_with(&image, &work, |pid| server.criu_started(pid)).ok();
    server.criu_done();
    let _restored = restored.map(Restored);
    let error = server.wait().expect_err("a damaged block was served");
    assert_eq!(
        gpucr_core::exit_code::ExitCode::exit_code(&error),
        gpucr_core::exit_code::IMAGE_DAMAGED
    );
    assert!(error.to_string().contains(&damaged), "{error}");
    if let Some(pid) = restored {
        wait_for(
            Duration::from_secs(10),
            "the restored tree to be killed",
            || (!alive(pid)).then_some(()),
        );
    }
    // Nothing of the tree goes on writing its journals.
    let lines = tree.journal("parent").len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(tree.journal("parent").len(), lines);
}

/// The lazy restore's log named on stderr by `gpucr restore --lazy`.
fn named_log(out: &std::process::Output) -> std::path::PathBuf {
    let err = stderr(out);
    let at = err
        .find("the reason written to ")
        .unwrap_or_else(|| panic!("no log named: {err}"));
    let rest = &err[at + "the reason written to ".len()..];
    std::path::PathBuf::from(rest.split_whitespace().next().unwrap())
}

#[test]
fn gpucr_restore_lazy_detached_returns_while_a_helper_serves_the_rest() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    // Until the gate opens, nothing is copied in the background and no fault is served
    // once CRIU is done (the 300 ms per block keeps the faults served before that few):
    // a command that waited for the memory would not return before it opens.
    let gate = tmp.path().join("gate");
    let mut command = Command::new(gpucr_bin());
    command
        .args(["restore", "--lazy", "--detach", image.to_str().unwrap()])
        .env("GPUCR_TEST_LAZY_GATE", &gate)
        .env("GPUCR_TEST_LAZY_THROTTLE_MS", "300")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = command.spawn().unwrap();
    let (sender, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(child.wait_with_output()));
    let out = match returned.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            std::fs::write(&gate, b"").unwrap();
            panic!("gpucr restore --lazy --detach did not return before any page was served");
        }
    };
    let _restored = Restored::from_output(&out);
    let log = named_log(&out);
    assert_eq!(log, image.join("lazy-pages.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("all memory in"),
        "all in with the gate shut: {text}"
    );
    std::fs::write(&gate, b"").unwrap();
    let text = wait_for(
        Duration::from_secs(60),
        "the helper to say all memory is in",
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("all memory in"))
        },
    );
    assert!(
        text.trim_end().ends_with("forked)"),
        "the helper's last line: {text}"
    );
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&tree.state, role);
        for line in tree.journal(role) {
            assert!(line.healthy(), "journal-{role}: {line:?}");
        }
    }
}

#[test]
fn a_second_restore_of_an_image_still_being_served_is_refused_and_changes_nothing() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    // A second a block: 64 MiB take the helper well over ten seconds to serve.
    let slow = ("GPUCR_TEST_LAZY_THROTTLE_MS", "1000");
    let dir = image.to_str().unwrap();
    let out = gpucr_env(&["restore", "--lazy", "--detach", dir], &[slow]);
    let _restored = Restored::from_output(&out);
    let log = named_log(&out);
    for second in [
        &["restore", "--lazy", "--detach", dir][..],
        &["restore", dir],
    ] {
        let refused = gpucr(second);
        assert_fails_with(
            &refused,
            i32::from(gpucr_core::exit_code::IMAGE_DIR),
            "an on-demand restore still serving its memory",
        );
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("all memory in"),
        "served before the second restores were tried, which proves nothing: {text}"
    );
    wait_for(
        Duration::from_secs(120),
        "the first restore's helper to say all memory is in",
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("all memory in"))
        },
    );
    tree.wait_ticks(3);
    for role in ROLES {
        assert_journal_continuous(&tree.state, role);
        for line in tree.journal(role) {
            assert!(line.healthy(), "journal-{role}: {line:?}");
        }
    }
}

#[test]
fn a_damaged_block_found_after_a_detached_return_kills_the_tree_and_is_logged() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let damaged = damage_pages(&image);
    let slow = ("GPUCR_TEST_LAZY_THROTTLE_MS", "300");
    let out = gpucr_env(
        &["restore", "--lazy", "--detach", image.to_str().unwrap()],
        &[slow],
    );
    let restored = Restored::from_output(&out);
    let log = named_log(&out);
    let text = wait_for(Duration::from_secs(60), "the damage in the log", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains(&damaged))
    });
    assert!(text.contains("the restored tree was killed"), "{text}");
    wait_for(Duration::from_secs(10), "the tree to be killed", || {
        (!alive(restored.0)).then_some(())
    });
    let lines = tree.journal("parent").len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(tree.journal("parent").len(), lines, "the tree still runs");
}

#[test]
fn gpucr_restore_lazy_of_a_damaged_image_kills_the_tree_with_exit_7() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let damaged = damage_pages(&image);
    let out = gpucr(&["restore", "--lazy", image.to_str().unwrap()]);
    assert_fails_with(&out, 7, &damaged);
    let lines = tree.journal("parent").len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(tree.journal("parent").len(), lines, "the tree still runs");
}

/// The pause before each block served that keeps a 256 MiB restore serving for seconds.
const THROTTLE: (&str, &str) = ("GPUCR_TEST_LAZY_THROTTLE_MS", "100");

/// `gpucr restore --lazy IMAGE` (waiting), throttled, started; once the tree runs: the
/// command, its stderr lines and the pids of the restored tree.
fn serving_restore(image: &Path) -> (std::process::Child, Lines, Vec<i32>) {
    let mut child = spawn_gpucr(&["restore", "--lazy", image.to_str().unwrap()], &[THROTTLE]);
    let mut lines = Lines::of(child.stderr.take().unwrap());
    let line = lines.wait_for_line(Duration::from_secs(60), "restored pid");
    let root: i32 = line
        .split_whitespace()
        .nth(2)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    let pids = gpucr_abi::procfs::tree_pids(root);
    assert!(pids.len() >= 3, "the restored tree: {pids:?}");
    (child, lines, pids)
}

/// Every process of `pids` is gone (or a zombie) within 10 s, and no journal line the
/// tree wrote reports damaged memory (a task that read a zero page where its data was).
fn assert_tree_gone_and_never_corrupt(tree: &Tree, pids: &[i32]) {
    wait_for(
        Duration::from_secs(10),
        "every process of the restored tree to be gone",
        || pids.iter().all(|p| !alive(*p)).then_some(()),
    );
    for role in ROLES {
        for line in tree.journal(role) {
            assert!(line.healthy(), "journal-{role}: {line:?}");
        }
    }
}

#[test]
fn gpucr_killed_while_serving_leaves_no_task_of_the_tree() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree_of(tmp.path(), 256);
    let (mut child, _lines, pids) = serving_restore(&image);
    let _restored: Vec<Restored> = pids.iter().map(|p| Restored(*p)).collect();
    // SIGKILL: gpucr's userfaultfds close with it.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_tree_gone_and_never_corrupt(&tree, &pids);
    // The guard kills the tree first and writes why after: the tree can be gone
    // before the line is there.
    let log = image.join("lazy-pages.log");
    wait_for(
        Duration::from_secs(10),
        "the guard's line in the log",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("gpucr ended while serving").then_some(())
        },
    );
}

#[test]
fn an_interrupt_while_serving_kills_the_tree_exits_130_and_names_the_log() {
    let _lock = criu_lock();
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // A tree's journals grow once it runs again: each restore needs its own dump.
        let tmp = tempfile::tempdir().unwrap();
        let (tree, image) = dumped_tree_of(tmp.path(), 256);
        let (mut child, lines, pids) = serving_restore(&image);
        let _restored: Vec<Restored> = pids.iter().map(|p| Restored(*p)).collect();
        signal_child(&child, signal);
        let status = child.wait().unwrap();
        let err = lines.all();
        assert_eq!(status.code(), Some(130), "{signal}: {err}");
        let log = image.join("lazy-pages.log");
        assert!(
            err.contains(&format!("the reason is in {}", log.display())),
            "{signal}: {err}"
        );
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            text.contains(&format!("interrupted by {signal}")),
            "{signal}: log: {text:?}"
        );
        assert_tree_gone_and_never_corrupt(&tree, &pids);
    }
}

#[test]
fn gpucr_restore_lazy_json_says_when_and_how_memory_came() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let out = gpucr(&[
        "restore",
        "--lazy",
        "--detach",
        "--json",
        image.to_str().unwrap(),
    ]);
    assert_success(&out);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let _restored = Restored(report["pid"].as_i64().unwrap() as i32);
    let lazy = &report["lazy"];
    let resumed = lazy["resumed_ms"].as_f64().expect("resumed_ms");
    let all_in = lazy["all_in_ms"].as_f64().expect("all_in_ms");
    assert!(0.0 < resumed && resumed <= all_in, "{lazy}");
    let num = |k: &str| lazy[k].as_u64().unwrap_or_else(|| panic!("no {k}: {lazy}"));
    assert!(
        num("fault_bytes") + num("background_bytes") >= 64 << 20,
        "{lazy}"
    );
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .unwrap()
        .unwrap() as u64;
    assert_eq!(num("fault_pages"), num("fault_bytes") / page, "{lazy}");
    assert_eq!(
        num("background_pages"),
        num("background_bytes") / page,
        "{lazy}"
    );
    assert!(num("tasks") >= 3, "{lazy}");
    assert_eq!(
        lazy["log"].as_str(),
        Some(image.join("lazy-pages.log").to_str().unwrap())
    );
    assert!(
        names_in(&report["events"]).contains(&"all-memory-in"),
        "{report}"
    );
    tree.wait_ticks(3);
}

/// gpucr's lazy-pages server for `image`, listening in `work`, before CRIU starts (two
/// background threads, no guard).
fn serve(image: &Path, work: &Path) -> LazyServer {
    let manifest = Arc::new(Manifest::read(image).unwrap());
    LazyServer::start(
        work,
        manifest,
        ServeOptions {
            image_dir: image.to_path_buf(),
            threads: 2,
            guard: None,
            quiet: gpucr_core::lazy::hold::DEFAULT_QUIET,
            remote: None,
        },
        &Cancel::new(),
    )
    .unwrap()
}
