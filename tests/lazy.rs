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

/// Dump a 64 MiB workload with gpucr; its tree, image and state.
fn dumped_tree(tmp: &Path) -> (Tree, std::path::PathBuf) {
    let state = tmp.join("state");
    let image = tmp.join("image");
    let tree = Tree::start(&state, &["--memory-mib", "64"]);
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
    let pidfile = work.join("restored.pid");
    let out = Command::new("criu")
        .args(["restore", "--lazy-pages", "-d", "--tcp-established", "-v4"])
        .arg("-D")
        .arg(image)
        .arg("-W")
        .arg(work)
        .arg("-o")
        .arg(work.join("restore.log"))
        .arg("--pidfile")
        .arg(&pidfile)
        .output()
        .expect("run criu");
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
    let manifest = Arc::new(Manifest::read(&image).unwrap());
    let server = LazyServer::start(
        &work,
        manifest,
        ServeOptions {
            image_dir: image.clone(),
            threads: 2,
        },
        &Cancel::new(),
    )
    .unwrap();
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
    let manifest = Arc::new(Manifest::read(&image).unwrap());
    let damaged = damage_pages(&image);
    let server = LazyServer::start(
        &work,
        manifest,
        ServeOptions {
            image_dir: image.clone(),
            threads: 2,
        },
        &Cancel::new(),
    )
    .unwrap();
    // CRIU may or may not see its tasks die before it lets them go.
    let restored = criu_lazy_restore(&image, &work).ok();
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

#[test]
fn gpucr_restore_lazy_detached_returns_once_all_memory_is_in() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let out = gpucr(&["restore", "--lazy", "--detach", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(stderr(&out).contains("all memory in"), "{}", stderr(&out));
    tree.wait_ticks(5);
    for role in ROLES {
        assert_journal_continuous(&tree.state, role);
        let last = tree.last(role);
        assert!(last.healthy(), "journal-{role}: {last:?}");
    }
}

#[test]
fn gpucr_restore_lazy_of_a_damaged_image_kills_the_tree_with_exit_7() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (tree, image) = dumped_tree(tmp.path());
    let damaged = damage_pages(&image);
    let out = gpucr(&["restore", "--lazy", "--detach", image.to_str().unwrap()]);
    assert_fails_with(&out, 7, &damaged);
    let lines = tree.journal("parent").len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(tree.journal("parent").len(), lines, "the tree still runs");
}
