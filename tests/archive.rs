//! `gpucr inspect ARCHIVE` and `gpucr check-topology ARCHIVE` on container checkpoint
//! archives in the layout podman, CRI-O and containerd write (`checkpoint/` with CRIU's
//! images, `config.dump`, `spec.dump`, `stats-dump`, `rootfs-diff.tar`, ...), built here
//! around a real gpucr dump of the simulator's workload: zstd, gzip and plain tar, in
//! podman's (lexical) member order and in the reverse order. The archive read as a
//! stream must show what the directory shows, and `--verify` must name the member a
//! flipped byte is in. tests/containers.rs reads an archive podman wrote.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{assert_success, gpucr, gpucr_env, names_in, stdout};
use serde_json::Value;

/// One dump of the sim workload (two processes, two GPUs), shared by the tests: the
/// image and the sim root it was dumped from, below the target's tmp directory
/// (replaced on the next run).
fn shared() -> &'static (PathBuf, PathBuf) {
    static SHARED: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("archive-shared");
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let _lock = common::criu_lock();
        let sim = base.join("sim");
        let image = base.join("image");
        let tree = common::SimTree::start(
            &base.join("state"),
            &sim,
            &["--gpus", "2", "--parent-mib", "8", "--child-mib", "4"],
        );
        let pid = tree.pid.to_string();
        let env = [("GPUCR_SIM_ROOT", sim.to_str().unwrap())];
        let out = gpucr_env(&["dump", &pid, image.to_str().unwrap()], &env);
        assert_success(&out);
        drop(tree);
        (image, sim)
    })
}

fn image() -> &'static Path {
    &shared().0
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Packing {
    Zstd,
    Gzip,
    Plain,
}

const CONFIG_DUMP: &str = r#"{"id":"4f0c3a1e2b7d9c8e5f6a","name":"sim-counter","rootfsImageName":"localhost/gpucr-sim:latest","runtime":"runc","createdTime":"2026-11-23T09:00:00.5Z","checkpointedTime":"2026-11-23T09:05:00Z"}"#;
const SPEC_DUMP: &str = r#"{"ociVersion":"1.0.2","annotations":{"io.container.manager":"libpod"}}"#;

/// Every regular file below `dir`, as sorted relative paths.
fn files_below(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), &format!("{name}/"), out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// An archive of `image` in the engines' layout; `reverse` writes the members in the
/// reverse of podman's order (pages files before their pagemaps, the GPU index after
/// its data files become before).
fn make_archive(image: &Path, out: &Path, packing: Packing, reverse: bool) {
    make_archive_with(image, out, packing, reverse, CONFIG_DUMP.as_bytes());
}

/// [`make_archive`] with `config` as the engine's `config.dump`.
fn make_archive_with(image: &Path, out: &Path, packing: Packing, reverse: bool, config: &[u8]) {
    let file = fs::File::create(out).unwrap();
    let writer: Box<dyn Write> = match packing {
        Packing::Zstd => Box::new(
            zstd::stream::write::Encoder::new(file, 3)
                .unwrap()
                .auto_finish(),
        ),
        Packing::Gzip => Box::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        )),
        Packing::Plain => Box::new(file),
    };
    let mut tar = tar::Builder::new(writer);
    let mut members: Vec<(String, Vec<u8>)> = vec![
        ("config.dump".into(), config.to_vec()),
        ("spec.dump".into(), SPEC_DUMP.into()),
        ("network.status".into(), b"[]".to_vec()),
        ("rootfs-diff.tar".into(), vec![0u8; 10240]),
    ];
    // CRIU's stats-dump is next to checkpoint/ in podman's archives (CRIU writes it to
    // runc's work directory); gpucr's manifest lists the copy in the image too.
    if let Ok(stats) = fs::read(image.join("stats-dump")) {
        members.push(("stats-dump".into(), stats));
    }
    let mut files = files_below(image);
    if reverse {
        files.reverse();
    }
    for (name, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, &name, bytes.as_slice()).unwrap();
    }
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o700);
    dir.set_size(0);
    tar.append_data(&mut dir, "checkpoint/", std::io::empty())
        .unwrap();
    // Streamed from disk: the test process stays small (see peak_rss).
    for f in &files {
        let mut file = fs::File::open(image.join(f)).unwrap();
        tar.append_file(format!("checkpoint/{f}"), &mut file)
            .unwrap();
    }
    tar.into_inner().unwrap().flush().unwrap();
}

fn inspect_json(target: &Path, args: &[&str]) -> Value {
    let mut all = vec!["inspect", "--json"];
    all.extend_from_slice(args);
    all.push(target.to_str().unwrap());
    let out = gpucr(&all);
    assert_success(&out);
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

fn verify(target: &Path, code: i32) -> Value {
    let out = gpucr(&["inspect", "--verify", "--json", target.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        common::stderr(&out)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["verify"].clone()
}

/// What a view shows of each process, to compare the archive's with the directory's.
fn processes(report: &Value) -> Vec<(Value, Value, Value, Value)> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].clone(),
                p["comm"].clone(),
                p["cmdline"].clone(),
                p["environment"].clone(),
            )
        })
        .collect()
}

#[test]
fn archives_show_what_the_directory_shows() {
    let image = image();
    let dir_report = inspect_json(image, &["--all"]);
    let tmp = tempfile::tempdir().unwrap();
    for (packing, reverse) in [
        (Packing::Zstd, false),
        (Packing::Gzip, false),
        (Packing::Plain, false),
        (Packing::Zstd, true),
    ] {
        let archive = tmp.path().join(format!("ckpt-{packing:?}-{reverse}.tar"));
        make_archive(image, &archive, packing, reverse);
        let report = inspect_json(&archive, &["--all"]);
        let what = format!("{packing:?}, reverse {reverse}");
        let c = &report["container"];
        assert_eq!(c["container_name"], "sim-counter", "{what}");
        assert_eq!(c["id"], "4f0c3a1e2b7d9c8e5f6a");
        assert_eq!(c["image"], "localhost/gpucr-sim:latest");
        assert_eq!(c["runtime"], "runc");
        assert_eq!(c["engine"], "Podman");
        assert_eq!(c["created"], "2026-11-23T09:00:00.5Z");
        assert_eq!(c["checkpointed"], "2026-11-23T09:05:00Z");
        assert_eq!(c["checkpoint_size"]["root_fs_diff_size"], 10240);
        assert_eq!(
            c["checkpoint_size"]["total_size"], dir_report["image"]["sizes"]["total"],
            "{what}"
        );
        let expected = match packing {
            Packing::Zstd => "zstd",
            Packing::Gzip => "gzip",
            Packing::Plain => "none",
        };
        assert_eq!(report["archive"]["compression"], expected);
        // The CRIU view: the same processes, argv and environment read from the pages
        // kept while the pages files streamed past.
        assert_eq!(processes(&report), processes(&dir_report), "{what}");
        assert!(processes(&report)
            .iter()
            .all(|p| p.2.as_array().is_some_and(|argv| !argv.is_empty())));
        assert_eq!(report["process_tree"], dir_report["process_tree"]);
        assert_eq!(report["mounts"], dir_report["mounts"]);
        for p in 0..dir_report["processes"].as_array().unwrap().len() {
            assert_eq!(
                report["processes"][p]["files"], dir_report["processes"][p]["files"],
                "{what}"
            );
            assert_eq!(
                report["processes"][p]["memory"],
                dir_report["processes"][p]["memory"]
            );
        }
        // The GPU view.
        assert_eq!(report["gpu"], dir_report["gpu"], "{what}");
        assert_eq!(report["gpu"]["recorded"], true);
        assert_eq!(report["stats"]["dump"], dir_report["stats"]["dump"]);
        assert_eq!(report["image"]["complete"], true);
        assert_eq!(report["errors"], Value::Array(vec![]), "{what}");
        // In podman's order one read suffices; in the reverse order the pages files
        // pass before the pagemaps that say which of their pages to keep.
        assert_eq!(
            report["archive"]["reads"],
            if reverse { 2 } else { 1 },
            "{what}"
        );
        let members = names_in(&report["archive"]["members"]);
        for needle in [
            "checkpoint/gpucr.json",
            "checkpoint/gpu/index",
            "checkpoint/gpu/data-0000",
            "config.dump",
            "spec.dump",
        ] {
            assert!(members.contains(&needle), "{needle} not in {members:?}");
        }
    }
}

#[test]
fn text_view_shows_the_container_first() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("ckpt.tar.zst");
    make_archive(image(), &archive, Packing::Zstd, false);
    let out = gpucr(&["inspect", "--gpu", archive.to_str().unwrap()]);
    assert_success(&out);
    let text = stdout(&out);
    let container = text.find("Container: sim-counter (Podman)").expect(&text);
    let summary = text.find("Complete: yes").expect(&text);
    assert!(container < summary, "{text}");
    for needle in [
        "ID: 4f0c3a1e2b7d9c8e5f6a",
        "Image: localhost/gpucr-sim:latest",
        "Runtime: runc",
        "zstd compression",
        "Backend: sim",
        "Process tree",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
}

#[test]
fn verify_says_intact_and_names_a_flipped_byte() {
    let image = image();
    let tmp = tempfile::tempdir().unwrap();
    for packing in [Packing::Zstd, Packing::Gzip, Packing::Plain] {
        let archive = tmp.path().join(format!("ok-{packing:?}"));
        make_archive(image, &archive, packing, false);
        let v = verify(&archive, 0);
        assert_eq!(v["status"], "intact", "{packing:?}: {v}");
        assert!(v["files_checked"].as_u64().unwrap() > 10);
        assert!(v["gpu_chunks_checked"].as_u64().unwrap() > 0);
        assert!(v["images_checked"].as_u64().unwrap() > 5);
    }
    let out = gpucr(&[
        "inspect",
        "--verify",
        tmp.path().join("ok-Zstd").to_str().unwrap(),
    ]);
    assert!(stdout(&out).contains(": intact: "), "{}", stdout(&out));

    // One byte flipped in the copy of each kind of file that goes into the archive.
    let pages = files_below(image)
        .into_iter()
        .filter(|f| f.starts_with("pages-"))
        .max_by_key(|f| fs::metadata(image.join(f)).unwrap().len())
        .unwrap();
    for (victim, at) in [
        (pages.as_str(), 100u64),
        ("gpu/data-0000", 4096),
        ("core-1.img", 20),
        ("gpucr.json", 30),
    ] {
        let copy = tmp.path().join("copy");
        let _ = fs::remove_dir_all(&copy);
        copy_tree(image, &copy);
        let path = copy.join(victim);
        let mut bytes = fs::read(&path).unwrap();
        bytes[at as usize] ^= 0x5a;
        fs::write(&path, bytes).unwrap();
        let archive = tmp.path().join("flipped.tar.zst");
        make_archive(&copy, &archive, Packing::Zstd, false);
        let v = verify(&archive, 7);
        assert_eq!(v["status"], "damaged", "{victim}: {v}");
        let named = format!("checkpoint/{victim}");
        let problems = v["problems"].as_array().unwrap();
        if victim == "gpucr.json" {
            // A manifest that no longer parses is reported as the manifest's problem.
            assert!(problems.iter().any(|p| p["file"] == named), "{v}");
            continue;
        }
        assert!(
            problems
                .iter()
                .any(|p| p["file"] == named && p["message"].as_str().unwrap().starts_with(&named)),
            "{victim}: {v}"
        );
    }
}

/// A byte flipped in the archive file itself, inside a member's data: `--verify` names
/// that member.
#[test]
fn verify_names_the_member_of_a_byte_flipped_in_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("ckpt.tar");
    make_archive(image(), &archive, Packing::Plain, false);
    for member in [
        "checkpoint/gpu/data-0001",
        "checkpoint/pages-2.img",
        "checkpoint/mm-1.img",
    ] {
        let mut bytes = fs::read(&archive).unwrap();
        let mut tar = tar::Archive::new(bytes.as_slice());
        let (start, size) = tar
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.path().unwrap().to_str() == Some(member))
            .map(|e| (e.raw_file_position(), e.size()))
            .unwrap_or_else(|| panic!("{member} not in the archive"));
        bytes[(start + size / 2) as usize] ^= 0x01;
        let damaged = tmp.path().join("damaged.tar");
        fs::write(&damaged, &bytes).unwrap();
        let v = verify(&damaged, 7);
        let problems = v["problems"].as_array().unwrap();
        assert!(
            problems.iter().any(|p| p["file"] == member),
            "{member}: {v}"
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for f in files_below(from) {
        let dest = to.join(&f);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(from.join(&f), dest).unwrap();
    }
}

#[test]
fn check_topology_reads_the_manifest_in_the_archive() {
    let image = image();
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("ckpt.tar.gz");
    make_archive(image, &archive, Packing::Gzip, false);
    // This machine's topology as the simulator's root describes it.
    let sysfs = shared().1.to_str().unwrap();
    let from_dir = gpucr(&[
        "check-topology",
        "--json",
        "--sysfs-root",
        sysfs,
        image.to_str().unwrap(),
    ]);
    let from_archive = gpucr(&[
        "check-topology",
        "--json",
        "--sysfs-root",
        sysfs,
        archive.to_str().unwrap(),
    ]);
    assert_eq!(
        from_archive.status.code(),
        from_dir.status.code(),
        "{}",
        common::stderr(&from_archive)
    );
    assert_eq!(stdout(&from_archive), stdout(&from_dir));
    let report: Value = serde_json::from_slice(&from_archive.stdout).unwrap_or(Value::Null);
    assert!(
        report.get("compatible").is_some(),
        "{}",
        stdout(&from_archive)
    );

    // An archive of a container checkpointed without gpucr holds no GPU state.
    let plain = tmp.path().join("plain");
    copy_tree(image, &plain);
    fs::remove_file(plain.join("gpucr.json")).unwrap();
    fs::remove_dir_all(plain.join("gpu")).unwrap();
    let archive = tmp.path().join("plain.tar");
    make_archive(&plain, &archive, Packing::Plain, false);
    let out = gpucr(&[
        "check-topology",
        "--sysfs-root",
        sysfs,
        archive.to_str().unwrap(),
    ]);
    assert_success(&out);
    assert!(
        stdout(&out).contains("holds no GPU state"),
        "{}",
        stdout(&out)
    );
    // ... and verifies on its CRIU images alone.
    let v = verify(&archive, 0);
    assert_eq!(v["files_checked"], 0, "{v}");
}

#[test]
fn broken_archives_are_refused_with_their_name() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("cut.tar.zst");
    make_archive(image(), &archive, Packing::Zstd, false);
    let bytes = fs::read(&archive).unwrap();
    fs::write(&archive, &bytes[..bytes.len() / 2]).unwrap();
    let out = gpucr(&["inspect", archive.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "a damaged archive is a damaged image"
    );
    let err = common::stderr(&out);
    assert!(err.contains(archive.to_str().unwrap()), "{err}");
    // A tar that is not a checkpoint archive, and a file that is not a tar.
    let other = tmp.path().join("other.tar");
    let mut tar = tar::Builder::new(fs::File::create(&other).unwrap());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o600);
    tar.append_data(&mut h, "notes.txt", &b"hello"[..]).unwrap();
    tar.into_inner().unwrap();
    for command in ["inspect", "check-topology"] {
        let out = gpucr(&[command, other.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(7), "{command}");
        let err = common::stderr(&out);
        assert!(
            err.contains("not a container checkpoint archive: it has no files under checkpoint/"),
            "{command}: {err}"
        );
    }
    let text = tmp.path().join("text");
    fs::write(&text, vec![b'x'; 2000]).unwrap();
    for command in ["inspect", "check-topology"] {
        let out = gpucr(&[command, text.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(7), "{command}");
        let err = common::stderr(&out);
        assert!(
            err.contains(&format!(
                "{}: not a container checkpoint archive (neither a tar archive",
                text.display()
            )),
            "{command}: {err}"
        );
        // The tar reader's message, which quotes the file's bytes, is not passed on.
        assert!(!err.contains("xxxx"), "{command}: {err}");
    }
    // Nothing there: what a missing image directory is (incomplete); something that
    // is neither a directory nor a file: not an image.
    for command in ["inspect", "check-topology"] {
        let missing = tmp.path().join("missing");
        let out = gpucr(&[command, missing.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(8), "{command}");
        let out = gpucr(&[command, "/dev/null"]);
        assert_eq!(out.status.code(), Some(7), "{command}");
        assert!(
            common::stderr(&out).contains("/dev/null: not an image directory or archive"),
            "{command}: {}",
            common::stderr(&out)
        );
    }
}

/// An archive whose `config.dump` is not JSON: damaged, the file named; the container is
/// still described from `spec.dump`, and the CRIU and GPU views are all there.
#[test]
fn a_damaged_container_description_is_named_and_the_rest_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("config.tar");
    make_archive_with(image(), &archive, Packing::Plain, false, b"{\"id\": ");
    let out = gpucr(&["inspect", archive.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(7), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(err.contains("config.dump: not valid JSON"), "{err}");
    let text = common::stdout(&out);
    assert!(
        text.contains("(Podman)") && text.contains("Process tree"),
        "{text}"
    );
    let verdict = verify(&archive, 7);
    let problems = verdict["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["file"], "config.dump");
    assert_eq!(problems[0]["kind"], "container");
}

/// Damage of any kind to an archive's bytes (flipped bytes in tar headers or anywhere,
/// a cut) never makes `inspect --verify --json` panic, hang or fail in any other way
/// than by calling the image damaged (7) or incomplete (8), or intact (0) where the
/// damage landed in nothing that is checked (padding, `rootfs-diff.tar`); what it
/// prints on stdout is JSON. 64 cases from a fixed seed, so a failure reproduces.
#[test]
fn damaged_archive_bytes_never_crash_inspect() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base.tar");
    make_archive(image(), &base, Packing::Plain, false);
    let bytes = fs::read(&base).unwrap();
    let headers: Vec<usize> = tar::Archive::new(bytes.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().raw_header_position() as usize)
        .collect();
    let len = bytes.len();
    // A flip: in a member's header (offset within its 512 bytes) or anywhere.
    let flip = prop_oneof![
        (0..headers.len(), 0..512usize).prop_map({
            let headers = headers.clone();
            move |(h, at)| headers[h] + at
        }),
        0..len,
    ];
    let damage = (
        proptest::collection::vec((flip, 1..=255u8), 1..4),
        proptest::option::weighted(0.2, 0..len),
    );
    let damaged = tmp.path().join("damaged.tar");
    let config = Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    runner
        .run(&damage, |(flips, cut)| {
            let mut copy = bytes.clone();
            for (at, mask) in &flips {
                copy[*at] ^= mask;
            }
            copy.truncate(cut.unwrap_or(len));
            fs::write(&damaged, &copy).unwrap();
            let out = std::process::Command::new("timeout")
                .arg("60")
                .arg(common::gpucr_bin())
                .args(["inspect", "--verify", "--json"])
                .arg(&damaged)
                .output()
                .unwrap();
            let err = common::stderr(&out);
            let code = out.status.code();
            prop_assert!(
                matches!(code, Some(0 | 7 | 8)),
                "exit {code:?} for {flips:?}, cut {cut:?}: {err}"
            );
            prop_assert!(!err.contains("panicked"), "{err}");
            if !out.stdout.is_empty() {
                prop_assert!(
                    serde_json::from_slice::<Value>(&out.stdout).is_ok(),
                    "not JSON for {flips:?}, cut {cut:?}"
                );
            }
            Ok(())
        })
        .unwrap();
}

/// The peak resident memory of `gpucr ARGS`, in bytes, and its exit code. Linux counts
/// the memory of the process that spawned it too (the child shares it until exec), so
/// gpucr is spawned by a small python3 (CRIT's, which the tests need anyway), not by the
/// test process: what is measured is gpucr's own peak, or python's (about 15 MiB) if
/// that were more.
fn peak_rss(args: &[&str]) -> (u64, i32) {
    const SPAWN: &str = "import os, subprocess, sys\n\
        child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n\
        _, status, usage = os.wait4(child.pid, 0)\n\
        print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))\n";
    let out = std::process::Command::new("python3")
        .args(["-c", SPAWN])
        .arg(common::gpucr_bin())
        .args(args)
        .output()
        .expect("run python3");
    let text = common::stdout(&out);
    assert!(out.status.success(), "{text}{}", common::stderr(&out));
    let (kib, code) = text
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("not `MAXRSS CODE`: {text:?}"));
    (kib.parse::<u64>().unwrap() * 1024, code.parse().unwrap())
}

/// The archive is read as a stream: inspecting and verifying an archive with 192 MiB of
/// GPU memory takes far less memory than that, and writes nothing to disk.
#[test]
fn archives_are_read_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = common::SimRoot::new("archive-large");
    let image = tmp.path().join("image");
    {
        let _lock = common::criu_lock();
        let tree = common::SimTree::start(
            &tmp.path().join("state"),
            &sim.0,
            &["--gpus", "1", "--parent-mib", "192", "--child-mib", "0"],
        );
        let pid = tree.pid.to_string();
        let out = gpucr_env(
            &["dump", "--compress", "none", &pid, image.to_str().unwrap()],
            &sim.env(),
        );
        assert_success(&out);
    }
    let archive = tmp.path().join("large.tar");
    make_archive(&image, &archive, Packing::Plain, false);
    let size = fs::metadata(&archive).unwrap().len();
    assert!(size > 150 << 20, "{} MiB", size >> 20);
    let before = files_below(tmp.path());
    let (rss, code) = peak_rss(&["inspect", "--verify", "--json", archive.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(rss < 96 << 20, "peak RSS {} MiB", rss >> 20);
    let (rss, code) = peak_rss(&["inspect", "--all", archive.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(rss < 96 << 20, "peak RSS {} MiB", rss >> 20);
    assert_eq!(files_below(tmp.path()), before, "nothing is unpacked");
}
