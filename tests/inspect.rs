//! `gpucr inspect` on images of a real workload dumped by real CRIU: the views agree
//! with `crit`, show the workload's argv, environment, ports, files and memory, and
//! `--verify` finds damage with its file and offset.
//!
//! The workload (tests/inspect_support/workload.c) runs in its own PID namespace: a root
//! with 2 extra threads, a file at offset 1234, a memfd, a TCP listener and a loopback
//! connection, a 16 MiB region; child-a (pipe) and child-b (unix socketpair), and
//! child-b's grandchild, each with its own argv and comm. The GPU view and GPU chunk
//! verification run on the simulator's workload (examples/sim_workload.rs).

// The GPU simulator's tree and root (tests/common, shared with tests/gpu.rs).
mod common;
mod inspect_support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;

use inspect_support::*;
use serde_json::Value;

fn processes(report: &Value) -> &Vec<Value> {
    report["processes"].as_array().expect("processes")
}

fn process<'a>(report: &'a Value, comm: &str) -> &'a Value {
    processes(report)
        .iter()
        .find(|p| p["comm"] == comm)
        .unwrap_or_else(|| panic!("no process {comm} in {report}"))
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn processes_agree_with_crit_ps_and_pstree() {
    let d = dumped();
    let report = inspect_json(&d.dir, &[]);
    let rows = crit::ps(&d.dir);
    let ours = processes(&report);
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(ours.len(), rows.len());
    for (row, p) in rows.iter().zip(ours) {
        // Same order (depth first), same ids and names.
        assert_eq!(p["pid"], row.pid, "{p}");
        assert_eq!(p["pgid"], row.pgid, "{p}");
        assert_eq!(p["sid"], row.sid, "{p}");
        assert_eq!(p["comm"], row.comm.as_str(), "{p}");
    }
    let comms: Vec<&str> = rows.iter().map(|r| r.comm.as_str()).collect();
    assert_eq!(
        comms,
        ["gpucr-inspect-w", "child-a", "child-b", "grandchild"]
    );
    let pstree = crit::show(&d.dir, "pstree.img");
    for entry in pstree["entries"].as_array().unwrap() {
        let p = ours.iter().find(|p| p["pid"] == entry["pid"]).unwrap();
        assert_eq!(p["ppid"], entry["ppid"]);
        let tids: Vec<&Value> = p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["tid"])
            .collect();
        let crit_tids: Vec<&Value> = entry["threads"].as_array().unwrap().iter().collect();
        assert_eq!(tids, crit_tids, "threads of {}", p["pid"]);
    }
    let root = process(&report, "gpucr-inspect-w");
    assert_eq!(root["threads"].as_array().unwrap().len(), 3);
    assert_eq!(report["image"]["threads"], 9);
    // The tree: root -> child-a, child-b -> grandchild.
    let tree = &report["process_tree"][0];
    assert_eq!(tree["comm"], "gpucr-inspect-w");
    assert_eq!(tree["children"][1]["children"][0]["comm"], "grandchild");
}

#[test]
fn files_agree_with_crit_fds() {
    let d = dumped();
    let report = inspect_json(&d.dir, &[]);
    let crit_fds = crit::fds(&d.dir);
    assert_eq!(crit_fds.len(), 4);
    for (pid, expected) in &crit_fds {
        let p = processes(&report)
            .iter()
            .find(|p| p["pid"] == *pid)
            .unwrap();
        let mut ours = BTreeMap::new();
        for f in p["files"].as_array().unwrap() {
            let kind = f["type"].as_str().unwrap();
            // crit names the file for these types and prints "TYPE.id" for the rest.
            let text = if ["REG", "PIPE", "UNIXSK"].contains(&kind) {
                f["path"].as_str().unwrap().to_string()
            } else {
                format!("{kind}.{}", f["id"])
            };
            ours.insert(f["fd"].to_string(), text);
        }
        ours.insert("cwd".into(), p["cwd"].as_str().unwrap().into());
        ours.insert("root".into(), p["root"].as_str().unwrap().into());
        assert_eq!(&ours, expected, "fds of pid {pid}");
    }
    let root = process(&report, "gpucr-inspect-w");
    let held = root["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == d.file.to_str().unwrap())
        .expect("the held file");
    assert_eq!(held["type"], "REG");
    assert_eq!(held["pos"], 1234);
    let memfd = root["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["type"] == "MEMFD")
        .unwrap();
    assert_eq!(memfd["path"], "memfd:gpucr-inspect-memfd");
    assert_eq!(memfd["pos"], 8192);
}

#[test]
fn memory_agrees_with_crit_mems_and_pagemaps() {
    let d = dumped();
    let report = inspect_json(&d.dir, &[]);
    let crit_mems = crit::mems(&d.dir);
    assert_eq!(crit_mems.len(), 4);
    for (pid, (exe, rows)) in &crit_mems {
        let p = processes(&report)
            .iter()
            .find(|p| p["pid"] == *pid)
            .unwrap();
        let mem = &p["memory"];
        assert_eq!(mem["exe"], exe.as_str());
        let vmas = mem["vmas"].as_array().unwrap();
        assert_eq!(vmas.len(), rows.len(), "VMAs of pid {pid}");
        for (v, row) in vmas.iter().zip(rows) {
            assert_eq!((hex(&v["start"]), hex(&v["end"])), (row.start, row.end));
            assert_eq!(&v["prot"].as_str().unwrap()[..3], row.prot, "{v}");
            assert_eq!(v["size"], row.end - row.start);
            if v["kind"] == "file" {
                // crit: "PATH", "PATH + 0xOFF", with " (s)" for shared mappings.
                assert!(
                    row.tag.starts_with(v["file"].as_str().unwrap()),
                    "{v} vs {row:?}"
                );
                if v["pgoff"] != 0 {
                    let off = format!("+ {:#x}", v["pgoff"].as_u64().unwrap());
                    assert!(row.tag.contains(&off), "{v} vs {row:?}");
                }
            }
            if row.tag.contains("[vdso]") {
                assert_eq!(v["kind"], "vdso");
            }
        }
        // Page counts: our pagemap and per-VMA counts against crit show pagemap-PID.img.
        let pagemap = crit::show(&d.dir, &format!("pagemap-{pid}.img"));
        let entries = pagemap["entries"].as_array().unwrap();
        assert_eq!(
            mem["pages_file"].as_str().unwrap(),
            format!("pages-{}.img", entries[0]["pages_id"])
        );
        let runs = mem["pagemap"].as_array().unwrap();
        assert_eq!(runs.len(), entries.len() - 1);
        let mut present = 0;
        for (run, e) in runs.iter().zip(&entries[1..]) {
            assert_eq!(run["vaddr"], e["vaddr"]);
            assert_eq!(run["nr_pages"], e["nr_pages"]);
            let flags = e["flags"].as_str().unwrap();
            assert_eq!(
                flags.contains("PE_PRESENT"),
                run["flags"].as_array().unwrap().contains(&"present".into())
            );
            if flags.contains("PE_PRESENT") {
                present += e["nr_pages"].as_u64().unwrap();
            }
        }
        assert_eq!(mem["dumped_pages"], present);
        let per_vma: u64 = vmas
            .iter()
            .map(|v| v["dumped_pages"].as_u64().unwrap())
            .sum();
        assert_eq!(per_vma, present, "every dumped page lies in a VMA");
        let pages_size = fs::metadata(d.dir.join(mem["pages_file"].as_str().unwrap()))
            .unwrap()
            .len();
        assert_eq!(mem["dumped_bytes"], pages_size);
    }
    // The pattern-filled region was dumped whole (the mapping that holds it may be
    // larger: the kernel merges it with a neighbouring anonymous mapping at times),
    // and the memfd mapping is named.
    let root = process(&report, "gpucr-inspect-w");
    let vmas = root["memory"]["vmas"].as_array().unwrap();
    let (addr, len) = d.region;
    let holder = vmas
        .iter()
        .find(|v| hex(&v["start"]) <= addr && addr + len <= hex(&v["end"]))
        .unwrap_or_else(|| panic!("no VMA holds the region at {addr:#x} (+{len:#x})"));
    assert!(holder["dumped_bytes"].as_u64().unwrap() >= len, "{holder}");
    let page = 4096;
    let present_in_region: u64 = root["memory"]["pagemap"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|run| run["flags"].as_array().unwrap().contains(&"present".into()))
        .map(|run| {
            let from = hex(&run["vaddr"]).max(addr);
            let to =
                (hex(&run["vaddr"]) + run["nr_pages"].as_u64().unwrap() * page).min(addr + len);
            to.saturating_sub(from)
        })
        .sum();
    assert_eq!(present_in_region, len, "the region's pages in the pagemap");
    let memfd = vmas
        .iter()
        .find(|v| v["kind"] == "memfd")
        .expect("a memfd VMA");
    assert_eq!(memfd["file"], "memfd:gpucr-inspect-memfd");
    assert_eq!(&memfd["prot"], "rw-s");
}

#[test]
fn ps_tree_cmd_and_env_show_what_is_in_memory() {
    let d = dumped();
    let out = gpucr(&[
        "inspect",
        "--ps-tree-cmd",
        "--ps-tree-env",
        d.dir.to_str().unwrap(),
    ]);
    assert_code(&out, 0);
    let text = stdout(&out);
    let root_cmd = format!(
        "[1] {} root {} {} {}",
        d.bin.display(),
        d.port,
        d.file.display(),
        d.file.with_file_name("ready").display()
    );
    assert!(text.contains(&root_cmd), "{root_cmd:?} not in:\n{text}");
    for line in [
        "] workload child-a alpha (2 threads)",
        "] workload child-b beta",
        "] workload grandchild gamma",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    for mark in [
        "GPUCR_INSPECT_MARK=root",
        "GPUCR_INSPECT_MARK=child-b",
        "GPUCR_INSPECT_MARK=grandchild",
    ] {
        assert!(text.contains(mark), "{mark:?} not in:\n{text}");
    }
    let report = inspect_json(&d.dir, &[]);
    let child = process(&report, "child-a");
    assert_eq!(
        child["cmdline"],
        serde_json::json!(["workload", "child-a", "alpha"])
    );
    assert!(child["environment"]
        .as_array()
        .unwrap()
        .contains(&"GPUCR_INSPECT_MARK=child-a".into()));
}

#[test]
fn sockets_show_ports_states_and_queues() {
    let d = dumped();
    let out = gpucr(&["inspect", "--sockets", d.dir.to_str().unwrap()]);
    assert_code(&out, 0);
    let text = stdout(&out);
    let listen = format!("TCP LISTEN 127.0.0.1:{} ", d.port);
    assert!(text.contains(&listen), "{listen:?} not in:\n{text}");
    let to_server = format!(" -> 127.0.0.1:{} ", d.port);
    assert!(text.contains(&to_server), "{to_server:?} not in:\n{text}");
    assert!(text.contains("UNIX (stream) ESTABLISHED"), "{text}");

    let report = inspect_json(&d.dir, &[]);
    let root = process(&report, "gpucr-inspect-w");
    let sockets = root["sockets"].as_array().unwrap();
    let tcp: Vec<&Value> = sockets.iter().filter(|s| s["protocol"] == "tcp").collect();
    assert_eq!(tcp.len(), 3, "{sockets:?}");
    assert!(tcp
        .iter()
        .any(|s| s["state"] == "LISTEN" && s["local_port"] == d.port));
    // The accepted end holds the 5 unread bytes the client wrote.
    let accepted = tcp
        .iter()
        .find(|s| s["state"] == "ESTABLISHED" && s["local_port"] == d.port)
        .expect("the accepted connection");
    assert_eq!(accepted["in_queue"], 5);
    assert_eq!(accepted["remote"], "127.0.0.1");
    // The socketpair: root's end and child-b's end are each other's peer.
    let mine = sockets.iter().find(|s| s["family"] == "unix").unwrap();
    let theirs = &process(&report, "child-b")["sockets"][0];
    assert_eq!(mine["peer_inode"], theirs["inode"]);
    assert_eq!(theirs["peer_inode"], mine["inode"]);
}

#[test]
fn summary_stats_gpu_and_mounts() {
    let d = dumped();
    let out = gpucr(&["inspect", d.dir.to_str().unwrap()]);
    assert_code(&out, 0);
    let text = stdout(&out);
    for needle in [
        "Complete: yes",
        "CRIU 4.",
        "Options: tcp-established, network lock ",
        "Backend: none",
        "CPU memory pages: ",
        "Process tree",
        "] grandchild (2 threads)",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    assert!(
        !text.contains("Open files"),
        "sections appear only when asked for"
    );

    let out = gpucr(&["inspect", "--all", d.dir.to_str().unwrap()]);
    assert_code(&out, 0);
    let text = stdout(&out);
    for needle in [
        "Freezing time: ",
        "Pages written: ",
        "gpucr dump phases",
        "no GPU state is recorded",
        "Mounts",
        "Memory",
        "Open files",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }

    let report = inspect_json(&d.dir, &[]);
    assert_eq!(report["schema_version"], 1);
    let stats = crit::show(&d.dir, "stats-dump");
    let crit_dump = &stats["entries"][0]["dump"];
    let ours = &report["stats"]["dump"];
    assert_eq!(ours["pages_written"], crit_dump["pages_written"]);
    assert_eq!(ours["frozen_time_us"], crit_dump["frozen_time"]);
    assert_eq!(report["gpu"]["backend"], "none");
    assert_eq!(report["gpu"]["recorded"], false);
    let pages: u64 = fs::read_dir(&d.dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(report["image"]["sizes"]["cpu_pages"], pages);
    assert_eq!(report["image"]["complete"], true);
    assert_eq!(report["image"]["options"]["tcp_established"], true);
    assert!(report["image"]["options"].get("criu_config").is_none());
    assert_eq!(report["errors"], serde_json::json!([]));
}

#[test]
fn pid_selects_a_subtree() {
    let d = dumped();
    let full = inspect_json(&d.dir, &[]);
    let child_b = process(&full, "child-b")["pid"]
        .as_u64()
        .unwrap()
        .to_string();
    let report = inspect_json(&d.dir, &["-p", &child_b]);
    let comms: Vec<&Value> = processes(&report).iter().map(|p| &p["comm"]).collect();
    assert_eq!(comms, ["child-b", "grandchild"]);
    assert_eq!(report["process_tree"][0]["comm"], "child-b");

    let out = gpucr(&["inspect", "-p", "999", d.dir.to_str().unwrap()]);
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("process 999 is not in the image"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn verify_says_intact() {
    let d = dumped();
    let out = gpucr(&["inspect", "--verify", d.dir.to_str().unwrap()]);
    assert_code(&out, 0);
    assert!(stdout(&out).contains(": intact: "), "{}", stdout(&out));
    let out = gpucr(&["inspect", "--verify", "--json", d.dir.to_str().unwrap()]);
    assert_code(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verify"]["status"], "intact");
    assert_eq!(report["verify"]["problems"], serde_json::json!([]));
}

/// The problems `--verify` reports (JSON), after asserting its exit code.
fn verify_problems(dir: &std::path::Path, code: i32) -> Vec<Value> {
    let out = gpucr(&["inspect", "--verify", "--json", dir.to_str().unwrap()]);
    assert_code(&out, code);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["verify"]["problems"].as_array().unwrap().clone()
}

fn largest_pages_file(dir: &std::path::Path) -> String {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn verify_finds_a_truncated_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    let pages = largest_pages_file(&dir);
    let path = dir.join(&pages);
    let size = fs::metadata(&path).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(size - 4096)
        .unwrap();
    let problems = verify_problems(&dir, 7);
    let expected = format!("{pages}: truncated at offset {}", size - 4096);
    assert!(
        problems
            .iter()
            .any(|p| p["message"].as_str().unwrap().starts_with(&expected)),
        "{problems:?}"
    );
    // CRIU's own view of it: the pagemap describes more pages than the file holds.
    assert!(
        problems
            .iter()
            .any(|p| p["file"] == pages.as_str() && p["kind"] == "pages"),
        "{problems:?}"
    );

    // A truncated protobuf image: the framing check names the entry that runs off the end.
    let core = dir.join("core-1.img");
    let len = fs::metadata(&core).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&core)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let problems = verify_problems(&dir, 7);
    let framing = problems
        .iter()
        .find(|p| p["file"] == "core-1.img" && p["kind"] == "framing")
        .expect("a framing problem in core-1.img");
    assert_eq!(framing["offset"], 8);
    assert!(
        framing["message"]
            .as_str()
            .unwrap()
            .starts_with("core-1.img: at offset 8: entry of "),
        "{framing}"
    );
}

#[test]
fn verify_finds_a_flipped_byte_in_a_pages_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    let pages = largest_pages_file(&dir);
    let file = fs::File::options()
        .read(true)
        .write(true)
        .open(dir.join(&pages))
        .unwrap();
    let at = 5 * 1024 * 1024 + 17; // inside the second 4 MiB checksum block
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
    let problems = verify_problems(&dir, 7);
    let expected =
        format!("{pages}: checksum mismatch: bytes 4194304..8388608 differ from the dump");
    assert!(
        problems.iter().any(|p| p["message"] == expected.as_str()),
        "{problems:?}"
    );
    let p = problems.iter().find(|p| p["kind"] == "checksum").unwrap();
    assert_eq!(p["offset"], 4_194_304);
}

#[test]
fn verify_finds_a_missing_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    fs::remove_file(dir.join("gpucr.json")).unwrap();
    let problems = verify_problems(&dir, 8);
    assert!(
        problems
            .iter()
            .any(|p| p["file"] == "gpucr.json" && p["kind"] == "incomplete"),
        "{problems:?}"
    );
    let out = gpucr(&["inspect", "--verify", dir.to_str().unwrap()]);
    assert_code(&out, 8);
    assert!(
        stdout(&out).contains("gpucr.json: missing"),
        "{}",
        stdout(&out)
    );
    // The CRIU images are still shown, marked incomplete.
    let out = gpucr(&["inspect", dir.to_str().unwrap()]);
    assert_code(&out, 0);
    assert!(stdout(&out).contains("Complete: no"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("] grandchild (2 threads)"),
        "{}",
        stdout(&out)
    );
}

/// A manifest that is there but cannot be read (truncated, not JSON, a field of the
/// wrong type) damages the image: inspect names the file and the parse error and exits
/// 7, as --verify does, instead of calling the manifest missing.
#[test]
fn a_broken_manifest_is_damage_not_absence() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    let manifest = dir.join("gpucr.json");
    let good = fs::read_to_string(&manifest).unwrap();
    let wrong_type = good.replacen("\"format_version\": 2", "\"format_version\": \"2\"", 1);
    assert_ne!(wrong_type, good);
    for broken in [&good[..good.len() / 2], "not json", wrong_type.as_str()] {
        fs::write(&manifest, broken).unwrap();
        let out = gpucr(&["inspect", dir.to_str().unwrap()]);
        assert_code(&out, 7);
        let text = stdout(&out);
        assert!(
            text.contains("Complete: no (the image is damaged: "),
            "{text}"
        );
        assert!(!text.contains("no manifest"), "{text}");
        assert!(
            stderr(&out).contains(&format!(
                "{}: malformed manifest at line ",
                manifest.display()
            )),
            "{}",
            stderr(&out)
        );
        let out = gpucr(&["inspect", "--verify", dir.to_str().unwrap()]);
        assert_code(&out, 7);
    }
}

#[test]
fn verify_finds_garbage_in_the_inventory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    let inventory = dir.join("inventory.img");
    let len = fs::metadata(&inventory).unwrap().len() as usize;
    let garbage: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
    fs::write(&inventory, garbage).unwrap();
    let problems = verify_problems(&dir, 7);
    assert!(
        problems
            .iter()
            .any(|p| p["file"] == "inventory.img" && p["kind"] == "checksum"),
        "{problems:?}"
    );
    let framing = problems
        .iter()
        .find(|p| p["file"] == "inventory.img" && p["kind"] == "framing")
        .expect("a framing problem in inventory.img");
    assert_eq!(framing["offset"], 0);
    assert!(
        framing["message"]
            .as_str()
            .unwrap()
            .contains("inventory.img: at offset 0: head magic"),
        "{framing}"
    );

    // Showing the image still works for everything else, and says what is wrong.
    let out = gpucr(&["inspect", dir.to_str().unwrap()]);
    assert_code(&out, 7);
    assert!(
        stdout(&out).contains("] grandchild (2 threads)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("inventory.img: at offset 0"),
        "{}",
        stderr(&out)
    );
}

/// Random damage to every CRIU image of a real dump: reading the image for the views and
/// checking its structure report errors with a file name, and never crash or hang.
#[test]
fn mutated_real_images_never_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_image(tmp.path());
    let originals: Vec<(String, Vec<u8>)> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            gpucr_criu_image::magic::is_framed_image(&n)
        })
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    assert!(originals.len() > 20);
    let page_size = gpucr::inspect::host_page_size();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..400 {
        let (name, original) = &originals[round % originals.len()];
        let mut bytes = original.clone();
        match next() % 4 {
            0 => {
                let i = next() as usize % bytes.len();
                bytes[i] ^= 1 << (next() % 8);
            }
            1 => bytes.truncate(next() as usize % bytes.len()),
            2 if bytes.len() >= 12 => {
                // A huge length field where an entry starts.
                let at = if name == "inventory.img" { 4 } else { 8 };
                bytes[at..at + 4]
                    .copy_from_slice(&(0xffff_fff0u32 - (next() as u32 % 16)).to_le_bytes());
            }
            _ => {
                for _ in 0..8 {
                    let i = next() as usize % bytes.len();
                    bytes[i] = next() as u8;
                }
            }
        }
        fs::write(dir.join(name), &bytes).unwrap();
        let opts = gpucr::inspect::Options {
            pid: None,
            page_size,
        };
        let report = gpucr::inspect::collect(&dir, &opts).expect("collect never fails on content");
        for e in &report.errors {
            assert!(
                !e.file.is_empty() && e.message.starts_with(&e.file),
                "{e:?}"
            );
        }
        let images = gpucr_criu_image::ImageDir::new(&dir, page_size);
        for e in gpucr_criu_image::check::check_dir(&images) {
            let text = e.describe_in(&dir);
            assert!(text.starts_with(&e.relative_path(&dir)), "{text}");
        }
        fs::write(dir.join(name), original).unwrap();
    }
}

/// The GPU view and GPU chunk verification on an image of the simulator's workload: the
/// view agrees with the manifest and the GPU index, and a flipped byte in a stored chunk
/// is found with its data file, offset, chunk and buffer.
#[test]
fn gpu_view_and_chunk_verification() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = common::SimRoot::new("inspect");
    let image = tmp.path().join("image");
    {
        let tree = common::SimTree::start(
            &tmp.path().join("state"),
            &sim.0,
            &["--gpus", "2", "--parent-mib", "16", "--child-mib", "8"],
        );
        let pid = tree.pid.to_string();
        let out = common::gpucr_env(&["dump", &pid, image.to_str().unwrap()], &sim.env());
        assert_code(&out, 0);
    }
    let report = inspect_json(&image, &[]);
    let gpu = &report["gpu"];
    assert_eq!(gpu["backend"], "sim");
    assert_eq!(gpu["recorded"], true);
    let index = gpucr::transfer::read_index(&image).unwrap();
    assert_eq!(gpu["memory_raw"], index.raw_bytes());
    assert_eq!(gpu["memory_stored"], index.stored_bytes());
    assert_eq!(report["image"]["sizes"]["gpu_raw"], index.raw_bytes());
    assert!(index.raw_bytes() >= 24 << 20);
    let buffers = gpu["buffers"].as_array().unwrap();
    assert_eq!(buffers.len(), index.buffers.len());
    let sum: u64 = buffers.iter().map(|b| b["size"].as_u64().unwrap()).sum();
    assert_eq!(sum, index.raw_bytes());
    for b in buffers {
        let entry = index
            .buffers
            .iter()
            .find(|e| e.key.task == b["task"] && e.key.buffer == b["buffer"])
            .unwrap_or_else(|| panic!("{b} not in the index"));
        assert_eq!(b["size"], entry.len);
        assert_eq!(b["stored_bytes"], entry.stored_bytes);
        assert_eq!(b["chunks"], entry.chunk_count);
    }
    assert_eq!(gpu["devices"].as_array().unwrap().len(), 2, "{gpu}");
    let by_kind: u64 = gpu["by_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(by_kind, sum);
    // The topology of the dumping machine is recorded, with every GPU that holds buffers.
    let recorded: Vec<&str> = gpu["topology_gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    for d in gpu["devices"].as_array().unwrap() {
        let id = format!("gpu_id {}", d["gpu_id"]);
        assert!(
            recorded.iter().any(|g| g.ends_with(&id)),
            "{id} not in {recorded:?}"
        );
    }
    assert!(gpu["topology"].is_object(), "{gpu}");
    // The tasks are the tree's processes, by their pids in the image.
    let pids: Vec<&Value> = processes(&report).iter().map(|p| &p["pid"]).collect();
    for t in gpu["tasks"].as_array().unwrap() {
        assert!(pids.contains(&&t["pid"]), "{t}");
    }

    let out = gpucr(&["inspect", "--gpu", image.to_str().unwrap()]);
    assert_code(&out, 0);
    let text = stdout(&out);
    for needle in [
        "Backend: sim",
        "Devices",
        "Buffers by kind",
        "[1/0] ",
        "compression ratio",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let out = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
    assert_code(&out, 0);
    let chunks = format!(
        "{} GPU memory chunks match their checksums",
        index.chunks.len()
    );
    assert!(stdout(&out).contains(&chunks), "{}", stdout(&out));

    // Flip one byte in the middle of a stored chunk.
    let (n, chunk) = index
        .chunks
        .iter()
        .enumerate()
        .find(|(_, c)| c.encoding != gpucr::transfer::Encoding::Zero)
        .expect("a stored chunk");
    let name = &index.files[usize::from(chunk.file)].name;
    let data = fs::File::options()
        .read(true)
        .write(true)
        .open(image.join("gpu").join(name))
        .unwrap();
    let at = chunk.file_offset + u64::from(chunk.stored_len / 2);
    let mut byte = [0u8];
    data.read_exact_at(&mut byte, at).unwrap();
    data.write_all_at(&[byte[0] ^ 0x08], at).unwrap();
    let problems = verify_problems(&image, 7);
    let gpu_problems: Vec<&Value> = problems.iter().filter(|p| p["kind"] == "gpu").collect();
    assert_eq!(gpu_problems.len(), 1, "{problems:?}");
    let p = gpu_problems[0];
    assert_eq!(p["file"], format!("gpu/{name}").as_str());
    assert_eq!(p["offset"], chunk.file_offset);
    let message = p["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("gpu/{name}: chunk {n} (buffer ")),
        "{message}"
    );
    assert!(
        message.contains(&format!("at offset {}: ", chunk.file_offset)),
        "{message}"
    );
}
