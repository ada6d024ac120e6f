//! The explorers on a synthetic image directory whose contents are known.

mod support;

use gpucr_criu_image::check::check_dir;
use gpucr_criu_image::explore::fds::FileContext;
use gpucr_criu_image::explore::{
    explore_fds, explore_mems, explore_mounts, read_cmdline, read_environ, ProcessTree, VmaKind,
};
use gpucr_criu_image::ImageDir;
use support::*;

fn image() -> (tempfile::TempDir, ImageDir) {
    let tmp = tempfile::tempdir().unwrap();
    write_image_dir(tmp.path());
    let dir = ImageDir::new(tmp.path(), PAGE);
    (tmp, dir)
}

#[test]
fn process_tree_and_threads() {
    let (_tmp, dir) = image();
    let tree = ProcessTree::load(&dir).unwrap();
    let walk: Vec<(usize, u32, &str)> = tree
        .walk()
        .iter()
        .map(|(d, p)| (*d, p.pid, p.comm.as_str()))
        .collect();
    assert_eq!(walk, [(0, 1, "parent"), (1, 2, "child")]);
    let parent = tree.get(1).unwrap();
    assert_eq!(parent.threads.len(), 2);
    assert_eq!(parent.threads[1].comm.as_deref(), Some("worker"));
    assert_eq!(tree.subtree(2).len(), 1);
    assert!(tree.subtree(9).is_empty());
}

#[test]
fn files_sockets_and_queues() {
    let (_tmp, dir) = image();
    let tree = ProcessTree::load(&dir).unwrap();
    let ctx = FileContext::load(&dir).unwrap();
    let all = explore_fds(&dir, &tree, &ctx).unwrap();
    let parent = &all[0];
    assert_eq!(parent.cwd.as_deref(), Some("/work"));
    assert_eq!(parent.root.as_deref(), Some("/"));
    let paths: Vec<(u32, &str, &str)> = parent
        .files
        .iter()
        .map(|f| (f.fd, f.kind.as_str(), f.path.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            (0, "REG", "/data/log"),
            (3, "PIPE", "pipe[777]"),
            (4, "UNIXSK", "unix[900 (0) @abstract]"),
            (
                5,
                "INETSK",
                "tcp 127.0.0.1:8080 -> 127.0.0.2:51000 ESTABLISHED"
            ),
            (6, "MEMFD", "memfd:buf"),
        ]
    );
    assert_eq!(parent.files[0].pos, Some(1234));
    let tcp = parent.files[3].socket.as_ref().unwrap();
    assert_eq!((tcp.in_queue, tcp.out_queue), (Some(3), Some(2)));
    assert_eq!(tcp.local_port, Some(8080));
    let unix = parent.files[2].socket.as_ref().unwrap();
    assert_eq!(unix.state.as_deref(), Some("LISTEN"));
    assert_eq!(unix.local.as_deref(), Some("@abstract"));
    assert_eq!(all[1].files[0].path, "pipe[777]");
}

#[test]
fn memory_argv_environment_mounts_and_stats() {
    let (_tmp, dir) = image();
    let tree = ProcessTree::load(&dir).unwrap();
    let ctx = FileContext::load(&dir).unwrap();
    let mems = explore_mems(&dir, &tree, &ctx).unwrap();
    let m = &mems[0];
    assert_eq!(m.exe.as_deref(), Some("/usr/bin/prog"));
    assert_eq!(m.vmas[0].kind, VmaKind::File);
    assert_eq!(m.vmas[0].file.as_deref(), Some("/usr/bin/prog"));
    assert_eq!(m.vmas[0].dumped_pages, 0);
    assert_eq!(m.vmas[1].kind, VmaKind::Anon);
    assert_eq!(m.vmas[1].dumped_pages, 2);
    assert_eq!(m.dumped_bytes(), 2 * PAGE);
    let memory = dir.memory(1).unwrap();
    assert_eq!(
        read_cmdline(&m.mm, &memory).unwrap().unwrap(),
        ["prog", "--flag", "value"]
    );
    assert_eq!(
        read_environ(&m.mm, &memory).unwrap().unwrap(),
        ["A=1", "B=two"]
    );
    let mounts = explore_mounts(&dir, &tree).unwrap().unwrap();
    assert_eq!(mounts[0].fstype, "proc");
    assert_eq!(mounts[0].mountpoint, "/proc");
    let stats = dir.stats("dump").unwrap().unwrap().dump.unwrap();
    assert_eq!((stats.frozen_time, stats.pages_written), (1500, 4));
    assert!(dir.stats("restore").unwrap().is_none());
}

#[test]
fn a_sound_image_has_no_problems() {
    let (_tmp, dir) = image();
    let problems = check_dir(&dir);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn check_reports_pages_size_mismatch_and_missing_images() {
    let (tmp, dir) = image();
    let pages = tmp.path().join("pages-11.img");
    std::fs::write(&pages, vec![0u8; 4096]).unwrap();
    std::fs::remove_file(tmp.path().join("core-3.img")).unwrap();
    let problems: Vec<String> = check_dir(&dir)
        .iter()
        .map(|e| e.describe_in(tmp.path()))
        .collect();
    assert!(
        problems.iter().any(|p| p.starts_with(
            "pages-11.img: at offset 4096: truncated: 4096 bytes, but pagemap-1.img describe 8192 bytes"
        )),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p
                .starts_with("core-3.img: at offset 0: missing, but pstree.img lists process 1")),
        "{problems:?}"
    );
}

#[test]
fn extra_payloads_must_fit_in_the_file() {
    let (tmp, dir) = image();
    let path = tmp.path().join("tcp-stream-1234.img");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&path, bytes).unwrap();
    let problems: Vec<String> = check_dir(&dir).iter().map(|e| e.to_string()).collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("tcp-stream-1234.img") && p.contains("5 bytes needed, 4 left")),
        "{problems:?}"
    );
}
