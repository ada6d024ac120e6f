//! The GPU memory path end to end on the simulator, with real CRIU: gpucr's plugin is
//! loaded by CRIU, the helper moves the device buffers, and the restored tree finds every
//! byte of them where it left it, even after the device memory was wiped.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const TARGET: i32 = 3;
const CRIU_FAILED: i32 = 5;
const IMAGE_DAMAGED: i32 = 7;
const IMAGE_INCOMPLETE: i32 = 8;
const GIVE_BACK_FAILED: i32 = 10;
const DEVICE_FAILED: i32 = 11;

/// A small two-process tree of the NVIDIA model.
const NVIDIA_SMALL: &[&str] = &[
    "--driver",
    "nvidia",
    "--parent-mib",
    "8",
    "--child-mib",
    "4",
];

fn dump(sim: &SimRoot, args: &[&str]) -> std::process::Output {
    let mut all = vec!["dump"];
    all.extend_from_slice(args);
    gpucr_env(&all, &sim.env())
}

fn restore(sim: &SimRoot, args: &[&str]) -> std::process::Output {
    let mut all = vec!["restore"];
    all.extend_from_slice(args);
    gpucr_env(&all, &sim.env())
}

/// A sim tree started with `args` in a temporary directory, with its image's path.
/// Destructure it as `Started { tmp, sim, image, tree }`: locals drop in reverse order,
/// so the tree is killed before its sim root and directory are removed.
struct Started {
    tmp: tempfile::TempDir,
    sim: SimRoot,
    image: std::path::PathBuf,
    tree: SimTree,
}

fn started(name: &str, args: &[&str]) -> Started {
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new(name);
    let image = tmp.path().join("image");
    let tree = SimTree::start(&tmp.path().join("state"), &sim.0, args);
    Started {
        tmp,
        sim,
        image,
        tree,
    }
}

/// [`started`], then dumped into `image` (which kills the tree), and its device memory
/// wiped, as on a new machine.
fn dumped(name: &str, args: &[&str]) -> Started {
    let s = started(name, args);
    assert_success(&dump(
        &s.sim,
        &[&s.tree.pid.to_string(), s.image.to_str().unwrap()],
    ));
    kill_and_wait(s.tree.pid);
    s.tree.wipe_device_memory();
    s
}

/// Parent + child, 3 GPUs, 1 GiB of buffers: dumped (killing the tree), the device memory
/// wiped as on a new machine, restored; every byte verifies and the kernels go on.
#[test]
fn sim_tree_survives_dump_wipe_and_restore() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "e2e",
        &["--gpus", "3", "--parent-mib", "704", "--child-mib", "320"],
    );
    assert!(tree.verify(1), "the buffers verify before the dump");

    let out = dump(
        &sim,
        &["--json", &tree.pid.to_string(), image.to_str().unwrap()],
    );
    assert_success(&out);
    let result: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["gpu"]["backend"], "sim");
    assert_eq!(result["gpu"]["tasks"], 2);
    assert!(result["gpu"]["stats"]["raw_bytes"].as_u64().unwrap() >= 1 << 30);
    let manifest: serde_json::Value = manifest_json(&image);
    assert_eq!(manifest["backend"], "sim");
    let gpus: std::collections::BTreeSet<u64> = manifest["gpu"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t["buffers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["gpu_id"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(gpus.len(), 3, "buffers on three GPUs");

    // Manifest format 2: typed GPUs, device files with roles, the state blob as a
    // checksummed file, the operation log.
    assert_eq!(manifest["format_version"], 2);
    let recorded: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for task in manifest["gpu"]["tasks"].as_array().unwrap() {
        let typed: Vec<&str> = task["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap())
            .collect();
        assert!(
            !typed.is_empty() && typed.iter().all(|g| g.starts_with("kfd:")),
            "{typed:?}"
        );
        assert_eq!(task["device_files"][0]["role"], "device");
        assert_eq!(task["device_files"][0]["path"], "/dev/fuse");
        let state = task["state"]["file"].as_str().unwrap();
        assert!(state.starts_with("gpu/state/"), "{state}");
        assert_eq!(
            fs::metadata(image.join(state)).unwrap().len(),
            task["state"]["size"].as_u64().unwrap()
        );
        assert!(recorded.contains(&state), "the state blob is checksummed");
        let ops: Vec<&str> = operation_names(task);
        assert_eq!(ops, ["pause", "checkpoint", "copy"]);
    }
    let shown = gpucr_env(&["inspect", "--gpu", image.to_str().unwrap()], &sim.env());
    assert_success(&shown);
    let text = stdout(&shown);
    for needle in [
        "GPUs: kfd:",
        "(device)",
        "state: gpu/state/task-1.bin (sim/1",
        "checkpoint at",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }

    // CRIU loaded the plugin and called its hooks.
    let log = fs::read_to_string(image.join("dump.log")).unwrap();
    assert!(
        log.contains("gpucr: plugin loaded (dump"),
        "plugin not loaded"
    );
    // The log is at info level (the plugin's lines), not debug, unless -v.
    assert!(
        !log.contains("Plugin \"gpucr\" (version 512 hooks"),
        "CRIU logged at debug level"
    );
    assert!(log.contains("gpucr: CHECKPOINT_DEVICES pid"));
    assert!(log.contains("gpucr: DUMP_EXT_FILE id"));
    // The descriptor was fitted to this CRIU's hook ABI.
    assert!(
        log.contains("; hook ABI of CRIU "),
        "the plugin could not tell CRIU's hook ABI"
    );

    kill_and_wait(tree.pid);
    let steps_at_dump = tree.steps();
    tree.wipe_device_memory();
    let out = restore(&sim, &["--detach", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    let log = fs::read_to_string(image.join("restore.log")).unwrap();
    assert!(log.contains("gpucr: RESTORE_EXT_FILE id"));
    assert!(log.contains("gpucr: RESUME_DEVICES_LATE pid"));
    assert!(tree.verify(2), "every byte of every buffer is back");
    tree.wait_ticks(3);
    assert!(tree.steps() > steps_at_dump, "the kernels go on");
}

/// --leave-running keeps the tree and its device going. Then a second dump (which kills
/// the tree) restores twice from the one image.
#[test]
fn leave_running_then_restore_twice() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("twice");
    let state = tmp.path().join("state");
    let tree = SimTree::start(&state, &sim.0, &["--parent-mib", "48", "--child-mib", "24"]);
    let running = tmp.path().join("running");
    assert_success(&dump(
        &sim,
        &[
            "--leave-running",
            &tree.pid.to_string(),
            running.to_str().unwrap(),
        ],
    ));
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(tree.verify(1), "the running tree's buffers are intact");

    let image = tmp.path().join("image");
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    kill_and_wait(tree.pid);
    // CRIU checks the sizes of the tree's open files: put the journals back as they were
    // at the dump before each restore.
    let snapshot = tmp.path().join("snapshot");
    copy_files(&state, &snapshot);
    for round in 0..2u64 {
        copy_files(&snapshot, &state);
        tree.wipe_device_memory();
        let out = restore(&sim, &["-d", image.to_str().unwrap()]);
        let restored = Restored::from_output(&out);
        assert!(tree.verify(10 + round), "round {round}");
        drop(restored);
    }
}

/// Without gpucr's plugin CRIU cannot dump the tree at all: the plugin is what carries
/// the device.
#[test]
fn plain_criu_cannot_dump_the_device() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("plain");
    let tree = SimTree::start(
        &tmp.path().join("state"),
        &sim.0,
        &["--parent-mib", "8", "--child-mib", "0"],
    );
    let dir = tmp.path().join("criu-image");
    fs::create_dir(&dir).unwrap();
    let out = Command::new("criu")
        .args([
            "dump",
            "-t",
            &tree.pid.to_string(),
            "-D",
            dir.to_str().unwrap(),
            "-o",
            "dump.log",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = fs::read_to_string(dir.join("dump.log")).unwrap();
    assert!(
        log.contains("Can't dump file") && log.contains("chr 10:229"),
        "{log}"
    );
    assert!(alive(tree.pid));
}

/// gpucr's plugin installed into `dir/criu-libs` by the documented command, as for a
/// container engine's CRIU, with the simulator's root and `settings`; returns the
/// plugin directory.
fn install_plugin(dir: &Path, sim: &SimRoot, settings: &[&str]) -> std::path::PathBuf {
    let sim_root = format!("GPUCR_SIM_ROOT={}", sim.0.display());
    let mut all = vec![sim_root.as_str()];
    all.extend_from_slice(settings);
    install_plugin_with(dir, &all)
}

/// Engine mode on a file system with room for the GPU memory but not for the manifest:
/// the plugin's last step that CRIU honours (DUMP_DEVICES_LATE on CRIU 4.3, else the
/// first device file, where the copy is finished) takes the manifest's room, so CRIU's
/// dump fails there, CRIU's log names the
/// image directory and says there is no room, and the tree keeps running with every
/// byte; no manifest is written. Before, the room was only looked for in CRIU's exit
/// hook, after CRIU had decided to kill the tree.
#[test]
fn engine_mode_without_room_for_the_manifest_fails_the_dump_and_the_tree_runs_on() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image: _image,
        tree,
    } = started("engine-room", &["--parent-mib", "8", "--child-mib", "4"]);
    // Uncompressed, so the GPU memory takes the same room every time.
    let libs = install_plugin(tmp.path(), &sim, &["GPUCR_COMPRESS=none"]);
    // What the GPU memory takes, measured on a file system with room.
    let roomy = tmp.path().join("roomy");
    let roomy_fs = mount_tmpfs(&roomy, 1 << 30);
    let (out, log) =
        criu_dump_with_plugin(&libs, tree.pid, &roomy.join("img"), &["--leave-running"]);
    let bytes_in = |dir: &Path| -> u64 {
        fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name() != "gpucr.json")
                    .map(|e| std::os::unix::fs::MetadataExt::blocks(&e.metadata().unwrap()) * 512)
                    .sum()
            })
            .unwrap_or(0)
    };
    let gpu_bytes = bytes_in(&roomy.join("img/gpu"));
    let image_bytes = bytes_in(&roomy.join("img")) + gpu_bytes;
    let manifest = roomy.join("img/gpucr.json").exists();
    drop(roomy_fs);
    assert!(out.status.success(), "{log}");
    assert!(manifest, "{log}");
    assert!(gpu_bytes >= 12 << 20, "{gpu_bytes}");
    // A CRIU with DUMP_DEVICES_LATE (4.3) gets the room taken there, after it wrote
    // the tree's memory: then all of CRIU's image fits, and the GPU memory, with less
    // than the manifest's room to spare. An older CRIU gets it at the first device
    // file, before its memory: then the GPU memory fits, with less than that to spare.
    let late = criu_calls_dump_devices_late(&log);
    assert!(late || log.contains("hook ABI of CRIU "), "{log}");
    let fits = if late { image_bytes } else { gpu_bytes };
    let full = tmp.path().join("full");
    let full_fs = mount_tmpfs(&full, fits + (96 << 10));
    let dir = full.join("img");
    let (out, log) = criu_dump_with_plugin(&libs, tree.pid, &dir, &[]);
    let manifest_written = dir.join("gpucr.json").exists();
    drop(full_fs);
    assert!(!out.status.success(), "{log}");
    let refusal = log
        .lines()
        .find(|l| l.contains("gpucr: error:") && l.contains("no room for the manifest"))
        .unwrap_or_else(|| panic!("no refusal in CRIU's log:\n{log}"));
    assert!(refusal.contains(dir.to_str().unwrap()), "{refusal}");
    assert!(!manifest_written);
    assert!(alive(tree.pid), "the tree was killed");
    tree.wait_ticks(2);
    assert!(tree.verify(1), "the tree's buffers are intact");
}

/// Engine mode with CRIU's log in the image directory (CRIU's default work directory,
/// as when CRIU is run by hand) at log level 4: CRIU goes on writing its log after the
/// plugin's exit hook, where the manifest is written, so the manifest leaves out the
/// files CRIU still has open for writing. The image verifies intact and restores, every
/// byte back. (Before, the manifest recorded the log half-written, and the restore
/// refused the image as damaged.)
#[test]
fn engine_mode_with_criu_logging_into_the_image_directory() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image,
        tree,
    } = started("engine-log", &["--parent-mib", "8", "--child-mib", "4"]);
    let libs = install_plugin(tmp.path(), &sim, &[]);
    fs::create_dir_all(&image).unwrap();
    let out = std::process::Command::new("criu")
        .args(["dump", "-t", &tree.pid.to_string(), "-D"])
        .arg(&image)
        .args(["-o", "dump.log", "-v4", "-L"])
        .arg(&libs)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let log = fs::read_to_string(image.join("dump.log")).unwrap_or_default();
    assert!(out.status.success(), "{log}");
    let manifest = manifest_json(&image);
    let listed: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(!listed.contains(&"dump.log"), "{listed:?}");
    assert!(listed.contains(&"inventory.img"), "{listed:?}");
    let verified = gpucr(&["inspect", "--verify", image.to_str().unwrap()]);
    assert_success(&verified);
    assert!(
        stdout(&verified).contains("intact"),
        "{}",
        stdout(&verified)
    );
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(tree.verify(1), "every byte is back on the device");
}

/// Engine mode with `GPUCR_NO_PAGE_CHECKSUMS=yes` installed: the image records CRIU's
/// memory pages files by size only, as `gpucr dump --no-page-checksums` does; every
/// other file, and the GPU memory's chunks, keep their checksums.
#[test]
fn engine_mode_without_page_checksums_records_the_pages_by_size() {
    let _lock = criu_lock();
    let Started { tmp, sim, tree, .. } =
        started("engine-sizes", &["--parent-mib", "8", "--child-mib", "4"]);
    let libs = install_plugin(tmp.path(), &sim, &["GPUCR_NO_PAGE_CHECKSUMS=yes"]);
    let images = tmp.path().join("img");
    let (out, log) = criu_dump_with_plugin(&libs, tree.pid, &images, &["--leave-running"]);
    assert!(out.status.success(), "{log}");
    let manifest = manifest_json(&images);
    assert_eq!(manifest["options"]["no_page_checksums"], true, "{manifest}");
    let files = manifest["files"].as_array().unwrap();
    let pages: Vec<_> = files
        .iter()
        .filter(|f| f["path"].as_str().unwrap().starts_with("pages-"))
        .collect();
    assert!(!pages.is_empty(), "{files:?}");
    assert!(
        pages.iter().all(|f| f["checksum"] == "size-only"),
        "{pages:?}"
    );
    assert!(
        files
            .iter()
            .filter(|f| !f["path"].as_str().unwrap().starts_with("pages-"))
            .all(|f| f["checksum"] != "size-only"),
        "{files:?}"
    );
    let verified = gpucr(&["inspect", "--verify", images.to_str().unwrap()]);
    assert_success(&verified);
    assert!(
        stdout(&verified).contains("by size only: dumped with --no-page-checksums")
            && stdout(&verified).contains("GPU memory chunks match their checksums"),
        "{}",
        stdout(&verified)
    );
    assert!(alive(tree.pid));
}

/// A settings file edited by hand after `gpucr install-plugin`: the plugin uses the
/// lines it knows and leaves out a misspelt name, an unknown `KFD_*` switch, a name
/// without a value and a line that is not NAME=VALUE, each said in CRIU's log with its
/// line number; the checkpoint goes on with the defaults they would have changed. A
/// misspelt name in CRIU's own environment is named in the log as well.
#[test]
fn a_hand_edited_settings_file_is_read_and_its_bad_lines_are_named() {
    let _lock = criu_lock();
    let Started { tmp, sim, tree, .. } = started(
        "engine-settings",
        &["--parent-mib", "8", "--child-mib", "0"],
    );
    let libs = install_plugin(tmp.path(), &sim, &["GPUCR_JOBS=2"]);
    let settings = libs.join("gpucr_plugin.conf");
    let mut text = fs::read_to_string(&settings).unwrap();
    let written = text.lines().count();
    text.push_str("GPUCR_COMPRES=none\nKFD_NUMA_CHEK=0\nGPUCR_DEVICE_TIMEOUT=\nplease compress\n");
    fs::write(&settings, text).unwrap();
    let images = tmp.path().join("img");
    // A misspelt name in CRIU's own environment is named too.
    let (out, log) = criu_dump_with_plugin_env(
        &libs,
        tree.pid,
        &images,
        &["--leave-running"],
        &[("GPUCR_SIM_ROT", "/nowhere")],
    );
    assert!(out.status.success(), "{log}");
    assert!(images.join("gpucr.json").exists(), "{log}");
    assert!(
        log.contains(
            "CRIU's environment: GPUCR_SIM_ROT is set, but nothing of gpucr's reads it \
             (did you mean GPUCR_SIM_ROOT?)"
        ),
        "{log}"
    );
    let warned = |line: usize, what: &str| {
        let needle = format!("gpucr_plugin.conf: line {line}: {what}");
        assert!(log.contains(&needle), "no {needle:?} in CRIU's log:\n{log}");
    };
    warned(written + 1, "GPUCR_COMPRES is not a setting gpucr reads");
    warned(written + 2, "KFD_NUMA_CHEK is not a setting gpucr reads");
    warned(written + 3, "GPUCR_DEVICE_TIMEOUT has no value; left out");
    warned(
        written + 4,
        "\"please compress\" is not NAME=VALUE; left out",
    );
    // The misspelt `none` did not apply: some GPU memory was compressed (zstd).
    let stats = &manifest_json(&images)["gpu"]["stats"];
    assert!(stats["compressed_chunks"].as_u64() > Some(0), "{stats}");
    assert!(alive(tree.pid));
}

/// Engine mode on a tree one of whose processes another tracer holds (a debugger,
/// `strace -p`; here a thread of the test): CRIU would fail to seize it with a message
/// that names no tracer. The plugin refuses the tree at its first hook, before its
/// helper starts or anything is paused, and CRIU's log names the process and its
/// tracer, as `gpucr dump` does; the tree runs on.
#[test]
fn engine_mode_refuses_a_traced_tree_naming_the_tracer() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image,
        tree,
    } = started("engine-traced", &["--parent-mib", "8", "--child-mib", "4"]);
    let libs = install_plugin(tmp.path(), &sim, &[]);
    let child = gpucr_abi::procfs::tree_pids(tree.pid)[1];
    let tracing = Tracer::seize(child);
    let tracer = tracing.tid;
    let (out, log) = criu_dump_with_plugin(&libs, tree.pid, &image, &[]);
    drop(tracing);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "gpucr: error: PAUSE_DEVICES: pid {child} is traced by pid {tracer} \
             (test-tracer): a process can have one tracer, and CRIU must be it; detach \
             {tracer} and dump again"
        )),
        "{log}"
    );
    assert!(!log.contains("starting gpucr's helper"), "{log}");
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
    assert!(tree.verify(1), "the tree's buffers are intact");
}

/// A damaged GPU chunk aborts the restore, names the chunk, and leaves no process.
#[test]
fn bad_gpu_chunk_aborts_the_restore_cleanly() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started("badchunk", &["--parent-mib", "48", "--child-mib", "0"]);
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    kill_and_wait(tree.pid);
    let ticks = tree.last("parent").num("tick");
    let data = image.join("gpu/data-0000");
    let mut bytes = fs::read(&data).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&data, bytes).unwrap();
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_DAMAGED, "gpu/data-0000");
    assert!(stderr(&out).contains("chunk"), "{}", stderr(&out));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        tree.last("parent").num("tick"),
        ticks,
        "no restored process ran"
    );
}

/// With --verify-first a damaged GPU chunk is refused before CRIU starts: the file and
/// the chunk are named, and no CRIU ran (it would have written restore.log).
#[test]
fn verify_first_refuses_a_bad_gpu_chunk_before_criu_starts() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree: _tree,
    } = dumped("verifyfirst", &["--parent-mib", "16", "--child-mib", "0"]);
    let data = image.join("gpu/data-0000");
    let mut bytes = fs::read(&data).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&data, bytes).unwrap();
    let out = restore(
        &sim,
        &["-v", "--detach", "--verify-first", image.to_str().unwrap()],
    );
    assert_fails_with(&out, IMAGE_DAMAGED, "gpu/data-0000: chunk ");
    let err = stderr(&out);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!err.contains("image verified"), "{err}");
    assert!(!err.contains("CRIU 4"), "CRIU was started: {err}");
    assert!(
        !image.join("restore.log").exists(),
        "CRIU was started: {err}"
    );
}

/// CRIU fails after the helper started copying (the tree also holds /dev/kvm): the dump
/// fails, the tree keeps running with its device, the image is marked incomplete.
#[test]
fn criu_failure_after_the_helper_started_leaves_the_tree_running() {
    let _lock = criu_lock();
    let device = ["/dev/kvm", "/dev/net/tun"]
        .into_iter()
        .find(|d| Path::new(d).exists());
    let Some(device) = device else {
        panic!("this test needs /dev/kvm")
    };
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "criufail",
        &["--parent-mib", "48", "--child-mib", "16", "--hold", device],
    );
    let out = dump(&sim, &[&tree.pid.to_string(), image.to_str().unwrap()]);
    assert_fails_with(&out, CRIU_FAILED, "criu dump failed");
    assert!(
        stderr(&out).contains("is still running"),
        "{}",
        stderr(&out)
    );
    assert!(!image.join("gpucr.json").exists());
    assert!(image.join("gpucr-incomplete.json").exists());
    tree.wait_ticks(3);
    assert!(tree.verify(1));
    let out = restore(&sim, &[image.to_str().unwrap()]);
    assert_fails_with(&out, IMAGE_INCOMPLETE, "incomplete");
}

/// A user's action script failing at post-dump, after gpucr finished the GPU copy at
/// that notification: the dump fails with CRIU's failure naming the script, not with
/// the helper's "the dump was already finished" (which finishing the copy a second
/// time answered, and which was once reported as the cause); the image is marked
/// incomplete, and the tree runs on with every byte of its device memory.
#[test]
fn a_script_failing_at_post_dump_after_the_gpu_copy_is_reported_as_criu_s_failure() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image,
        tree,
    } = started(
        "postdumpscript",
        &["--parent-mib", "16", "--child-mib", "8"],
    );
    let (script, config) = failing_script(tmp.path(), "post-dump", 3);
    let out = dump(
        &sim,
        &[
            "--criu-config",
            config.to_str().unwrap(),
            &tree.pid.to_string(),
            image.to_str().unwrap(),
        ],
    );
    assert_fails_with(
        &out,
        CRIU_FAILED,
        &format!(
            "gpucr: error: criu dump failed: the action script {} failed at post-dump \
             (exited with status 3)",
            script.display()
        ),
    );
    let err = stderr(&out);
    assert!(!err.contains("already finished"), "{err}");
    assert!(
        err.contains(&format!("pid {} is still running", tree.pid)),
        "{err}"
    );
    assert!(!image.join("gpucr.json").exists());
    assert!(image.join("gpucr-incomplete.json").exists());
    tree.wait_ticks(3);
    assert!(tree.verify(1));
}

/// The plugin cannot reach the helper: CRIU aborts the dump, the tree keeps running.
#[test]
fn plugin_that_cannot_reach_the_helper_fails_the_dump_cleanly() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started("nohelper", &["--parent-mib", "16", "--child-mib", "0"]);
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &[sim.env()[0], ("GPUCR_TEST_HELPER_FD", "999")],
    );
    assert_fails_with(&out, CRIU_FAILED, "criu dump failed");
    let log = fs::read_to_string(image.join("dump.log")).unwrap();
    assert!(
        log.contains("GPUCR_HELPER_FD=\"999\": Bad file descriptor"),
        "{log}"
    );
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
    assert!(tree.verify(1));
}

/// The disk fills up while the helper writes GPU memory: the dump fails, the tree keeps
/// running, and what was written is marked incomplete.
#[test]
fn disk_full_during_the_dump_leaves_the_tree_running() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("diskfull");
    let tree = SimTree::start(
        &tmp.path().join("state"),
        &sim.0,
        &["--parent-mib", "96", "--child-mib", "0"],
    );
    let small = tmp.path().join("small");
    fs::create_dir(&small).unwrap();
    // A 24 MiB file system for an image that needs more, in a private mount namespace.
    let script = format!(
        "mount -t tmpfs -o size=24m none '{dir}' && '{bin}' dump --compress none {pid} '{dir}/image'; \
         code=$?; ls '{dir}/image' > '{list}'; exit $code",
        dir = small.display(),
        bin = gpucr_bin().display(),
        pid = tree.pid,
        list = tmp.path().join("listing").display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("GPUCR_SIM_ROOT", &sim.0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        stderr(&out)
    );
    let listing = fs::read_to_string(tmp.path().join("listing")).unwrap();
    assert!(!listing.contains("gpucr.json"), "{listing}");
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
    assert!(tree.verify(1));
}

/// Restore checks the GPU topology first: onto a machine with too few GPUs it refuses
/// with the report (exit 9) before touching anything; onto GPUs with other ids it maps
/// the buffers onto them.
#[test]
fn restore_checks_the_topology_and_maps_the_gpus() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("topo");
    let image = tmp.path().join("image");
    let state = tmp.path().join("state");
    let tree = SimTree::start(
        &state,
        &sim.0,
        &["--gpus", "3", "--parent-mib", "24", "--child-mib", "8"],
    );
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    kill_and_wait(tree.pid);
    let manifest: serde_json::Value = manifest_json(&image);
    assert!(
        manifest["topology"].is_object(),
        "the dump recorded the topology"
    );

    // A "machine" with two GPUs: refused before CRIU starts.
    fs::remove_dir_all(&sim.0).unwrap();
    gpucr::gpu::sim::SimRoot::new(&sim.0)
        .ensure_topology(2)
        .unwrap();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    assert_fails_with(&out, 9, "cannot hold the image");
    assert!(
        !image.join("restore.log").exists(),
        "refused before CRIU started"
    );

    // Three GPUs with other ids: the image's GPUs map onto them.
    fs::remove_dir_all(&sim.0).unwrap();
    let root = gpucr::gpu::sim::SimRoot::new(&sim.0);
    let old_ids = root.ensure_topology(3).unwrap();
    let nodes = root.topology_dir().join("nodes");
    for node in 1..=3 {
        let path = nodes.join(node.to_string()).join("gpu_id");
        let id: u32 = fs::read_to_string(&path).unwrap().trim().parse().unwrap();
        fs::write(&path, format!("{}\n", id + 7)).unwrap();
    }
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(tree.verify(1));
    let contexts = sim.0.join("contexts");
    for ctx in fs::read_dir(&contexts).unwrap() {
        let text = fs::read_to_string(ctx.unwrap().path().join("context.json")).unwrap();
        let ctx: serde_json::Value = serde_json::from_str(&text).unwrap();
        for b in ctx["buffers"].as_array().unwrap() {
            let id = b["gpu_id"].as_u64().unwrap() as u32;
            assert!(!old_ids.contains(&id), "buffer still on old GPU {id}");
            assert!(
                old_ids.iter().any(|o| o + 7 == id),
                "buffer on unknown GPU {id}"
            );
        }
    }
}

/// gpucr (and with it the helper) is killed in the middle of a dump: CRIU's requests to
/// the helper fail, the dump is abandoned and the tree goes on with its device memory.
#[test]
fn killed_helper_leaves_the_tree_running() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started("killed", &["--parent-mib", "64", "--child-mib", "0"]);
    // A slow copy engine keeps the helper busy long enough to be killed mid-copy.
    let mut gpucr = Command::new(gpucr_bin())
        .args(["dump", &tree.pid.to_string(), image.to_str().unwrap()])
        .env("GPUCR_SIM_ROOT", &sim.0)
        .env("GPUCR_SIM_COPY_BW", "20MB/s")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Mid-copy: a data file of the GPU image has bytes, more to come.
    wait_for(
        Duration::from_secs(20),
        "the helper to write device memory into the image",
        || {
            fs::read_dir(image.join("gpu"))
                .ok()?
                .flatten()
                .any(|e| {
                    e.file_name().to_string_lossy().starts_with("data-")
                        && e.metadata().is_ok_and(|m| m.len() > 0)
                })
                .then_some(())
        },
    );
    gpucr.kill().unwrap();
    gpucr.wait().unwrap();
    wait_for(Duration::from_secs(30), "CRIU to give up", || {
        let criu_left = Command::new("pgrep")
            .args(["-f", "criu swrk"])
            .output()
            .unwrap();
        criu_left.stdout.is_empty().then_some(())
    });
    assert!(alive(tree.pid), "the tree survives");
    assert!(
        !image.join("gpucr.json").exists(),
        "no manifest: the image is incomplete"
    );
    tree.wait_ticks(3);
    assert!(tree.verify(1), "the device memory is intact");
}

/// gpucr killed outright (SIGKILL, as the OOM killer does) once the NVIDIA model's
/// driver has locked every process: it can ask for nothing back itself, but its guard,
/// a process of its own, waits for CRIU to let the tree go and asks each driver to
/// resume; the job runs on with every byte, and the image is marked incomplete with
/// what the guard did.
#[test]
fn nvidia_model_sigkill_during_a_dump_is_undone_by_the_guard() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-sigkill",
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "256",
            "--child-mib",
            "128",
        ],
    );
    let steps_before = tree.steps();
    let contexts = sim_contexts(&sim.0);
    assert_eq!(contexts.len(), 2, "one context per process");
    let mut gpucr = spawn_gpucr(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &sim.env(),
    );
    wait_for(
        Duration::from_secs(30),
        "both processes to be locked",
        || sim_drivers_hold(&contexts).then_some(()),
    );
    gpucr.kill().unwrap();
    gpucr.wait().unwrap();
    let marker = image.join("gpucr-incomplete.json");
    let reason = wait_for(
        Duration::from_secs(60),
        "the guard to give the processes back",
        || fs::read_to_string(&marker).ok(),
    );
    assert!(
        reason.contains("its simulated driver's guard gave the processes back")
            && reason.matches(": resume").count() == 2,
        "{reason}"
    );
    assert!(!image.join("gpucr.json").exists());
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(tree.verify(1), "the memory is back on the device");
    assert!(tree.steps() > steps_before, "and the kernels run again");
}

/// A GPU process with a mount namespace of its own, in which gpucr's temporary directory
/// is hidden (as a container's /tmp hides the host's): the plugin inside the restored
/// task reaches the helper through the inherited connector, not a path, and every byte
/// comes back.
/// A file bind-mounted in gpucr's mount namespace, and so in the copy the tree's own
/// namespace was made from: CRIU before 4.2 dumps it but restores it as a directory and
/// fails, so gpucr refuses such a dump before anything is frozen (exit 4, the mount and
/// the CRIU named, the tree running on); a newer CRIU restores it.
#[test]
fn a_file_mount_older_criu_cannot_restore_is_refused_before_the_dump() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("filemnt");
    let hidden = tmp.path().join("gpucr-tmp");
    fs::create_dir(&hidden).unwrap();
    let source = tmp.path().join("settings");
    let target = tmp.path().join("settings-bound");
    fs::write(&source, b"bound\n").unwrap();
    fs::write(&target, b"").unwrap();
    let _mount = BindMount::new(&source, &target);
    let image = tmp.path().join("image");
    let tree = SimTree::start_hiding(
        &tmp.path().join("state"),
        &sim.0,
        &["--gpus", "1", "--parent-mib", "16", "--child-mib", "0"],
        Some(&hidden),
    );
    let mountinfo = fs::read_to_string(format!("/proc/{}/mountinfo", tree.pid)).unwrap();
    let target_text = target.to_str().unwrap();
    assert!(mountinfo.contains(target_text), "{mountinfo}");
    let env = [sim.env()[0], ("TMPDIR", hidden.to_str().unwrap())];
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
    );
    if out.status.success() {
        let criu = manifest_json(&image)["criu_version"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            criu_at_least_4_2(&criu),
            "CRIU {criu} dumped a file mount it cannot restore"
        );
        kill_and_wait(tree.pid);
        tree.wipe_device_memory();
        let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &env);
        let restored = Restored::from_output(&out);
        let mountinfo = fs::read_to_string(format!("/proc/{}/mountinfo", restored.0)).unwrap();
        assert!(
            mountinfo.contains(target_text),
            "the file mount is back: {mountinfo}"
        );
        assert!(tree.verify(2), "every byte of every buffer is back");
    } else {
        assert_fails_with(&out, 4, "which cannot restore the file mount");
        let message = stderr(&out);
        assert!(
            message.contains(target_text),
            "the mount is named: {message}"
        );
        let criu = message
            .split("is CRIU ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .unwrap_or_else(|| panic!("the CRIU is named: {message}"));
        assert!(
            !criu_at_least_4_2(criu),
            "CRIU {criu} was refused: {message}"
        );
        assert!(alive(tree.pid), "the tree runs on");
        assert!(tree.verify(1), "its device memory untouched");
        assert!(!image.join("gpucr.json").exists(), "no image was written");
        kill_and_wait(tree.pid);
    }
}

/// "4.2.1", "4.3" -> true; "4.1.1" -> false.
fn criu_at_least_4_2(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (4, 2)
}

/// `mount --bind SOURCE TARGET` in gpucr's namespace, undone when dropped.
struct BindMount(std::path::PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> BindMount {
        let out = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount --bind: {out:?}");
        BindMount(target.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

#[test]
fn gpu_process_with_its_own_mount_namespace_restores() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("mntns");
    let hidden = tmp.path().join("gpucr-tmp");
    fs::create_dir(&hidden).unwrap();
    let image = tmp.path().join("image");
    let tree = SimTree::start_hiding(
        &tmp.path().join("state"),
        &sim.0,
        &["--gpus", "2", "--parent-mib", "48", "--child-mib", "24"],
        Some(&hidden),
    );
    assert_ne!(
        fs::read_link(format!("/proc/{}/ns/mnt", tree.pid)).unwrap(),
        fs::read_link("/proc/self/ns/mnt").unwrap(),
        "the tree has a mount namespace of its own"
    );
    assert!(tree.verify(1));
    let env = [sim.env()[0], ("TMPDIR", hidden.to_str().unwrap())];
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
    );
    assert_success(&out);
    let manifest: serde_json::Value = manifest_json(&image);
    assert_eq!(manifest["options"]["mount_namespace"], true);
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &env);
    let restored = Restored::from_output(&out);
    assert_ne!(
        fs::read_link(format!("/proc/{}/ns/mnt", restored.0)).unwrap(),
        fs::read_link("/proc/self/ns/mnt").unwrap(),
        "restored into a mount namespace of its own"
    );
    let log = fs::read_to_string(image.join("restore.log")).unwrap();
    assert!(log.contains("gpucr: RESTORE_EXT_FILE id"), "{log}");
    assert!(tree.verify(2), "every byte of every buffer is back");
}

/// Device state that names paths outside the backend's root (or a device node outside
/// /dev) is refused before CRIU starts, even when the crafted state blob's checksum is
/// recorded again as a forger would; nothing is created or changed.
#[test]
fn manifest_paths_outside_the_root_are_refused() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image,
        tree: _tree,
    } = dumped("confine", &["--parent-mib", "8", "--child-mib", "0"]);
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let before = fs::metadata(&victim).unwrap().modified().unwrap();
    let original = fs::read_to_string(image.join("gpucr.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&original).unwrap();
    let state_file = manifest["gpu"]["tasks"][0]["state"]["file"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(manifest["gpu"]["tasks"][0]["state"]["format"], "sim/1");
    let state_path = image.join(&state_file);
    let original_state: serde_json::Value =
        serde_json::from_slice(&fs::read(&state_path).unwrap()).unwrap();
    let sim_root = sim.0.display().to_string();
    let crafted: [(&str, String); 4] = [
        ("buffers", victim.display().to_string()),
        ("buffers", format!("{sim_root}/../{}", victim.display())),
        (
            "directories",
            tmp.path().join("made-by-restore").display().to_string(),
        ),
        ("device_path", "/etc/gpucr-made-by-restore".to_owned()),
    ];
    for (field, path) in &crafted {
        let mut manifest: serde_json::Value = serde_json::from_str(&original).unwrap();
        let mut state = original_state.clone();
        match *field {
            "buffers" => manifest["gpu"]["tasks"][0]["buffers"][0]["path"] = path.clone().into(),
            "directories" => state["directories"][0] = path.clone().into(),
            _ => state["device_path"] = path.clone().into(),
        }
        let bytes = serde_json::to_vec(&state).unwrap();
        fs::write(&state_path, &bytes).unwrap();
        let digest = gpucr::image::checksum::digest_file(&state_path).unwrap();
        let task = &mut manifest["gpu"]["tasks"][0];
        task["state"]["size"] = bytes.len().into();
        for record in manifest["files"].as_array_mut().unwrap() {
            if record["path"] == state_file.as_str() {
                record["size"] = bytes.len().into();
                record["checksum"] = digest.checksum().into();
            }
        }
        fs::write(
            image.join("gpucr.json"),
            serde_json::to_vec_pretty(&manifest).unwrap(),
        )
        .unwrap();
        let out = restore(&sim, &["-d", image.to_str().unwrap()]);
        assert_fails_with(&out, IMAGE_DAMAGED, "is not beneath");
        assert!(stderr(&out).contains(path.as_str()), "{}", stderr(&out));
        assert!(
            !image.join("restore.log").exists(),
            "{field}: CRIU must not have started"
        );
    }
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert_eq!(fs::metadata(&victim).unwrap().modified().unwrap(), before);
    assert!(!tmp.path().join("made-by-restore").exists());
    assert!(!Path::new("/etc/gpucr-made-by-restore").exists());
    assert!(
        !sim.0.join("contexts").exists(),
        "no device state was recreated"
    );
}

const INTERRUPTED: i32 = 130;

/// Run gpucr with `args` and `env`, send it SIGINT once `ready` holds, and return its
/// output.
fn interrupt_gpucr_when(
    args: &[&str],
    env: &[(&str, &str)],
    mut ready: impl FnMut() -> bool,
) -> std::process::Output {
    let child = spawn_gpucr(args, env);
    wait_for(
        Duration::from_secs(60),
        "the moment to interrupt gpucr",
        || ready().then_some(()),
    );
    signal_child(&child, nix::sys::signal::Signal::SIGINT);
    child.wait_with_output().expect("wait for gpucr")
}

/// Processes whose command line mentions `needle` (the tree's state directory).
fn processes_mentioning(needle: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// SIGINT while the helper copies GPU memory: the copy stops, CRIU rolls back, the tree
/// runs on with every byte intact, the image is marked incomplete, exit code 130.
#[test]
fn sigint_during_a_gpu_dump_leaves_the_tree_running() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "sigint-dump",
        &[
            "--parent-mib",
            "256",
            "--child-mib",
            "64",
            "--fill",
            "random",
        ],
    );
    // 320 MiB at 40 MB/s: the copy takes about 8 s, and the signal comes within it.
    let env = [sim.env()[0], ("GPUCR_SIM_COPY_BW", "40MB/s")];
    let log = image.join("dump.log");
    let out = interrupt_gpucr_when(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
        || {
            fs::read_to_string(&log).is_ok_and(|l| l.contains("DUMP_EXT_FILE"))
                && image.join("gpu").is_dir()
        },
    );
    assert_fails_with(&out, INTERRUPTED, "interrupted by SIGINT");
    assert!(stderr(&out).contains("still running"), "{}", stderr(&out));
    assert!(image.join("gpucr-incomplete.json").exists());
    assert!(!image.join("gpucr.json").exists());
    assert!(alive(tree.pid), "the tree keeps running");
    tree.wait_ticks(2);
    assert!(tree.verify(1), "and its device memory is intact");
}

/// SIGINT while the helper fills the restored tree's buffers: CRIU kills what it had
/// restored, nothing of the tree is left, exit code 130; the image restores afterwards.
#[test]
fn sigint_during_a_gpu_restore_leaves_no_process() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = dumped(
        "sigint-restore",
        &[
            "--parent-mib",
            "256",
            "--child-mib",
            "64",
            "--fill",
            "random",
        ],
    );
    let state = tree.state.clone();
    let env = [sim.env()[0], ("GPUCR_SIM_COPY_BW", "40MB/s")];
    let log = image.join("restore.log");
    let out = interrupt_gpucr_when(&["restore", "-d", image.to_str().unwrap()], &env, || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("gpucr: RESTORE_EXT_FILE id"))
    });
    assert_fails_with(&out, INTERRUPTED, "interrupted by SIGINT");
    assert!(stdout(&out).trim().is_empty(), "no restored pid is printed");
    let state_text = state.to_str().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the half-restored tree to be gone",
        || processes_mentioning(state_text).is_empty().then_some(()),
    );
    // The image is untouched: a restore that is let finish brings everything back.
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(tree.verify(2));
}

/// The NVIDIA-modelled simulator: the driver moves device memory into the process
/// before CRIU dumps it, through the process's restore thread, which gpucr's plugin lets
/// run while the tree is frozen; on restore the thread is let run again while the driver
/// brings the memory back. Every byte verifies and the kernels go on.
#[test]
fn nvidia_model_tree_survives_dump_wipe_and_restore() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-e2e",
        &[
            "--driver",
            "nvidia",
            "--gpus",
            "2",
            "--parent-mib",
            "48",
            "--child-mib",
            "24",
        ],
    );
    assert!(tree.verify(1));
    let out = dump(&sim, &[&tree.pid.to_string(), image.to_str().unwrap()]);
    assert_success(&out);
    let manifest: serde_json::Value = manifest_json(&image);
    for task in manifest["gpu"]["tasks"].as_array().unwrap() {
        assert_eq!(
            task["buffers"].as_array().unwrap().len(),
            0,
            "the driver kept them"
        );
        assert_eq!(task["gpus"].as_array().unwrap().len(), 2);
        let ops: Vec<&str> = operation_names(task);
        // Nothing moved through gpucr, so no "copy" is logged.
        assert_eq!(ops, ["pause", "checkpoint"]);
    }
    let log = fs::read_to_string(image.join("dump.log")).unwrap();
    assert!(
        log.contains("gpucr: thread") && log.contains("let run"),
        "{log}"
    );
    kill_and_wait(tree.pid);
    let steps_at_dump = tree.steps();
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(tree.verify(2), "every byte is back on the device");
    tree.wait_ticks(3);
    assert!(tree.steps() > steps_at_dump, "the kernels go on");
}

/// The NVIDIA model's mailbox is device state, not a file of the process: a freeze must
/// never find the restore thread with the request file open, or CRIU dumps that fd as a
/// regular file and cannot reopen it once the device memory (the context directory) is
/// gone. Here the thread keeps the request file open 300 ms every time it reads it: it
/// reads it only for a new request, which it answers after closing it, so neither the
/// freeze (after the lock's answer) nor the stop after the checkpoint finds it open, and
/// the tree restores after the wipe, and the dump log names no mailbox file. (A thread
/// that polled by opening the file, as it looks again at once after an answer, would be
/// stopped with it open every time: CRIU's restore then fails with "Can't open file
/// .../driver-request".)
#[test]
fn nvidia_model_restore_thread_never_holds_its_mailbox_at_a_freeze() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-mailbox",
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "16",
            "--child-mib",
            "8",
            "--hold-request-ms",
            "300",
        ],
    );
    assert!(tree.verify(1));
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    let log = fs::read_to_string(image.join("dump.log")).unwrap();
    assert!(
        !log.contains(gpucr_abi::sim::DRIVER_REQUEST_FILE),
        "the dump holds the mailbox as a file of the process:\n{log}"
    );
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    assert!(tree.verify(2), "every byte is back on the device");
}

/// A simulated GPU tree with a zombie (a child its parent never reaped), with each
/// driver model: CRIU pauses the zombie but calls no CHECKPOINT_DEVICES for it. The dump
/// takes it as it is, and the restore brings it back beside the GPU processes, whose
/// every byte verifies.
fn zombie_in_the_tree(driver: &str) {
    let _lock = criu_lock();
    let name = format!("zombie-{driver}");
    let args = [
        "--driver",
        driver,
        "--gpus",
        "2",
        "--parent-mib",
        "24",
        "--child-mib",
        "8",
        "--zombies",
        "1",
    ];
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(&name, &args);
    assert_eq!(zombie_children(tree.pid), 1);
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    assert_eq!(
        manifest_json(&image)["gpu"]["tasks"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let restored = Restored::from_output(&out);
    assert!(tree.verify(1), "every byte is back on the device");
    assert_eq!(zombie_children(restored.0), 1, "the zombie is back too");
}

#[test]
fn kfd_model_tree_with_a_zombie_survives_dump_wipe_and_restore() {
    zombie_in_the_tree("kfd");
}

#[test]
fn nvidia_model_tree_with_a_zombie_survives_dump_wipe_and_restore() {
    zombie_in_the_tree("nvidia");
}

/// The NVIDIA model with a process stopped by SIGSTOP: its driver locks it through its
/// restore thread, which cannot run while it is stopped. The dump is refused at once
/// (not after the driver's timeout) with the target's exit code, naming the process and
/// what to do; the image is marked incomplete, and the tree, its other process unlocked
/// again, runs on once continued, every byte intact.
#[test]
fn nvidia_model_stopped_process_is_refused_at_once() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-stopped",
        &[
            "--driver",
            "nvidia",
            "--gpus",
            "2",
            "--parent-mib",
            "16",
            "--child-mib",
            "8",
        ],
    );
    let child = children(tree.pid)[0];
    stop(child);
    let started = std::time::Instant::now();
    let out = dump(&sim, &[&tree.pid.to_string(), image.to_str().unwrap()]);
    let took = started.elapsed();
    continue_process(child);
    assert_fails_with(
        &out,
        TARGET,
        &format!("pid {child} is stopped (SIGSTOP or job control)"),
    );
    assert!(
        stderr(&out).contains(&format!("kill -CONT {child}")),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(8), "refused after {took:?}");
    assert!(image.join("gpucr-incomplete.json").exists());
    let steps = tree.steps();
    tree.wait_ticks(3);
    assert!(tree.steps() > steps, "the kernels go on");
    assert!(tree.verify(1), "every byte is intact");
}

/// `GPUCR_COMPRESS` sets `gpucr dump`'s `--compress` as it sets engine mode's, a flag
/// on the command line beats it, and a misspelt `GPUCR_*` name is named on stderr with
/// the name it resembles, the dump going on.
#[test]
fn compression_from_the_environment_and_a_misspelt_name() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image: _,
        tree,
    } = started("env-compress", &["--parent-mib", "16", "--child-mib", "0"]);
    let pid = tree.pid.to_string();
    let dump_with = |name: &str, flags: &[&str], env: &[(&str, &str)]| {
        let image = tmp.path().join(name);
        let mut args = vec!["dump", "--leave-running"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[&pid, image.to_str().unwrap()]);
        let mut all = sim.env().to_vec();
        all.extend_from_slice(env);
        let out = gpucr_env(&args, &all);
        assert_success(&out);
        (manifest_json(&image)["gpu"]["stats"].clone(), stderr(&out))
    };
    let (stats, said) = dump_with(
        "from-env",
        &[],
        &[("GPUCR_COMPRESS", "none"), ("GPUCR_COMPRES", "zstd")],
    );
    assert_eq!(stats["compressed_chunks"], 0, "{stats}");
    assert!(stats["raw_chunks"].as_u64() > Some(0), "{stats}");
    assert!(
        said.contains(
            "gpucr: warning: GPUCR_COMPRES is set, but nothing of gpucr's reads it (did you \
             mean GPUCR_COMPRESS?)"
        ),
        "{said}"
    );
    let (stats, said) = dump_with(
        "flag-wins",
        &["--compress", "zstd"],
        &[("GPUCR_COMPRESS", "none")],
    );
    assert!(stats["compressed_chunks"].as_u64() > Some(0), "{stats}");
    assert!(!said.contains("warning"), "{said}");
    assert!(alive(tree.pid));
}

/// A process of the KFD model stopped by SIGSTOP: unlike the NVIDIA model, whose driver
/// needs a thread of the process to run, every KFD step runs in CRIU (its tracer), so
/// the tree is dumped as it is, and the restore brings the process back stopped, as
/// CRIU does for any stopped task. Once continued, every byte verifies and the kernels
/// go on.
#[test]
fn kfd_model_stopped_process_is_dumped_and_restored_stopped() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "kfd-stopped",
        &["--gpus", "2", "--parent-mib", "16", "--child-mib", "8"],
    );
    let child = children(tree.pid)[0];
    stop(child);
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let restored = Restored::from_output(&out);
    let child = children(restored.0)[0];
    assert!(
        gpucr_abi::procfs::is_stopped(child),
        "the child is back stopped, as it was dumped"
    );
    continue_process(child);
    assert!(tree.verify(1), "every byte is back on the device");
    let steps = tree.steps();
    tree.wait_ticks(3);
    assert!(tree.steps() > steps, "the kernels go on");
}

/// --leave-running with the NVIDIA model: after the dump the driver brings the memory
/// back and unlocks, so the job runs on with every byte intact.
#[test]
fn nvidia_model_leave_running_keeps_the_job_going() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-leave",
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "32",
            "--child-mib",
            "16",
        ],
    );
    let steps_before = tree.steps();
    assert_success(&dump(
        &sim,
        &[
            "--leave-running",
            &tree.pid.to_string(),
            image.to_str().unwrap(),
        ],
    ));
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(
        tree.verify(1),
        "the running tree's memory is back on its device"
    );
    assert!(tree.steps() > steps_before, "and its kernels were unlocked");
}

/// A plugin that does not let the restore thread run: the driver never answers, the
/// dump fails after the driver timeout instead of hanging and the tree runs on; the
/// restore fails the same way and leaves no process.
#[test]
fn nvidia_model_without_its_thread_let_run_fails_instead_of_hanging() {
    let _lock = criu_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimRoot::new("nv-nothread");
    let state = tmp.path().join("state");
    let tree = SimTree::start(
        &state,
        &sim.0,
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "16",
            "--child-mib",
            "8",
        ],
    );
    let no_run = [
        sim.env()[0],
        ("GPUCR_TEST_NO_THREAD_RUN", "1"),
        ("GPUCR_SIM_DRIVER_TIMEOUT", "1.5"),
    ];
    let failed = tmp.path().join("failed");
    let started = std::time::Instant::now();
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), failed.to_str().unwrap()],
        &no_run,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("did not answer checkpoint"),
        "{}",
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
    assert!(
        tree.verify(1),
        "the tree runs on, unlocked, its memory intact"
    );

    let image = tmp.path().join("image");
    assert_success(&dump(
        &sim,
        &[&tree.pid.to_string(), image.to_str().unwrap()],
    ));
    kill_and_wait(tree.pid);
    tree.wipe_device_memory();
    let started = std::time::Instant::now();
    let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &no_run);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("did not answer resume"),
        "{}",
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let state_text = state.to_str().unwrap();
    wait_for(
        Duration::from_secs(10),
        "no restored process to be left",
        || processes_mentioning(state_text).is_empty().then_some(()),
    );
}

/// CRIU fails after the NVIDIA-model driver moved the memory into the processes (a file
/// CRIU cannot dump, found after CHECKPOINT_DEVICES): the plugin's exit hook lets each
/// restore thread run while the driver moves the memory back and unlocks, so the tree
/// runs on with every byte intact.
#[test]
fn nvidia_model_criu_failure_after_the_checkpoint_gives_the_memory_back() {
    let _lock = criu_lock();
    let device = ["/dev/kvm", "/dev/net/tun"]
        .into_iter()
        .find(|d| Path::new(d).exists())
        .expect("this test needs /dev/kvm or /dev/net/tun");
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started(
        "nv-criufail",
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "32",
            "--child-mib",
            "16",
            "--hold",
            device,
        ],
    );
    let steps_before = tree.steps();
    let out = dump(&sim, &[&tree.pid.to_string(), image.to_str().unwrap()]);
    assert_fails_with(&out, CRIU_FAILED, "criu dump failed");
    let log = fs::read_to_string(image.join("dump.log")).unwrap();
    assert!(
        log.contains("CHECKPOINT_DEVICES pid") && log.contains("let run"),
        "the driver had checkpointed before CRIU failed:\n{log}"
    );
    assert!(alive(tree.pid));
    tree.wait_ticks(3);
    assert!(tree.verify(1), "the memory is back on the device");
    assert!(tree.steps() > steps_before, "and the kernels run again");
}

/// A dump or restore step where a failure is injected: `GPUCR_FAULT` names a step of
/// gpucr's helper or plugin, `driver` makes the simulated driver answer an operation
/// with an error (the sim root's `driver-fail` file).
#[derive(Clone, Copy, Debug)]
enum Injected {
    Fault(&'static str),
    Driver(&'static str),
}

impl Injected {
    /// The environment of the gpucr run (sim root, fault), with the driver failure set
    /// up in `sim`.
    fn arm(self, sim: &SimRoot) -> Vec<(&str, &str)> {
        let mut env = vec![sim.env()[0]];
        let _ = fs::remove_file(sim.0.join("driver-fail"));
        match self {
            Injected::Fault(step) => env.push(("GPUCR_FAULT", step)),
            Injected::Driver(op) => fs::write(sim.0.join("driver-fail"), op).unwrap(),
        }
        env
    }

    fn disarm(sim: &SimRoot) {
        let _ = fs::remove_file(sim.0.join("driver-fail"));
    }

    /// What the failure says, in gpucr's message or CRIU's log.
    fn needle(self) -> String {
        match self {
            Injected::Fault(step) => format!("fault injected at step {step}"),
            Injected::Driver(op) => format!("{op} failed (injected)"),
        }
    }
}

/// The dump steps of each simulator mode (the NVIDIA model has no buffer to copy), in a
/// dump that kills the tree (which never gives devices back: see
/// `give_back_failure_after_a_leave_running_dump_is_reported`).
fn dump_steps(driver: &str) -> Vec<Injected> {
    let mut steps: Vec<Injected> = gpucr_abi::fault::FaultStep::ALL
        .iter()
        .filter(|s| s.is_dump() && **s != gpucr_abi::fault::FaultStep::GiveBack)
        .map(|s| Injected::Fault(s.name()))
        .filter(|s| driver == "kfd" || !matches!(s, Injected::Fault("copy")))
        .collect();
    if driver == "nvidia" {
        steps.extend([Injected::Driver("lock"), Injected::Driver("checkpoint")]);
    }
    steps
}

/// The restore steps of each simulator mode.
fn restore_steps(driver: &str) -> Vec<Injected> {
    let mut steps: Vec<Injected> = gpucr_abi::fault::FaultStep::ALL
        .iter()
        .filter(|s| !s.is_dump())
        .map(|s| Injected::Fault(s.name()))
        .filter(|s| driver == "kfd" || !matches!(s, Injected::Fault("fill")))
        .collect();
    if driver == "nvidia" {
        steps.push(Injected::Driver("resume"));
    }
    steps
}

/// `out` failed, and its message says why.
fn assert_failed_because(out: &std::process::Output, image: &Path, log: &str, why: &Injected) {
    common::assert_failed_because(out, &image.join(log), &why, &why.needle());
}

/// A two-process tree of `driver`'s mode, with a failure injected at every step of the
/// dump in turn: each dump fails, the image is marked incomplete, and the tree runs on
/// with every byte of its device memory. Then a good dump, and a failure at every step
/// of the restore in turn: each restore fails and leaves no process; a last restore
/// without a failure brings the tree back, every byte verified.
fn faults_at_every_step(driver: &str) {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image,
        tree,
    } = started(
        &format!("faults-{driver}"),
        &[
            "--driver",
            driver,
            "--gpus",
            "2",
            "--parent-mib",
            "12",
            "--child-mib",
            "6",
        ],
    );
    let pid = tree.pid.to_string();
    let mut verified = 0;
    for (n, step) in dump_steps(driver).into_iter().enumerate() {
        let env = step.arm(&sim);
        let failed = tmp.path().join(format!("failed-{n}"));
        let steps_before = tree.steps();
        let out = gpucr_env(&["dump", &pid, failed.to_str().unwrap()], &env);
        Injected::disarm(&sim);
        assert_failed_because(&out, &failed, "dump.log", &step);
        assert_eq!(out.status.code(), Some(DEVICE_FAILED), "{step:?}");
        assert!(
            failed.join("gpucr-incomplete.json").exists(),
            "{step:?}: not marked incomplete"
        );
        assert!(alive(tree.pid), "{step:?}: the tree died");
        tree.wait_ticks(2);
        verified += 1;
        assert!(tree.verify(verified), "{step:?}: device memory damaged");
        assert!(tree.steps() > steps_before, "{step:?}: the kernels stopped");
    }

    assert_success(&dump(&sim, &[&pid, image.to_str().unwrap()]));
    kill_and_wait(tree.pid);
    let state = tmp.path().join("state");
    let state_text = state.to_str().unwrap();
    for step in restore_steps(driver) {
        // A dead task's device memory is gone, as on a real device.
        tree.wipe_device_memory();
        let env = step.arm(&sim);
        let out = gpucr_env(&["restore", "-d", image.to_str().unwrap()], &env);
        Injected::disarm(&sim);
        assert_failed_because(&out, &image, "restore.log", &step);
        assert_eq!(out.status.code(), Some(DEVICE_FAILED), "{step:?}");
        wait_for(
            Duration::from_secs(10),
            &format!("{step:?}: no restored process to be left"),
            || processes_mentioning(state_text).is_empty().then_some(()),
        );
    }
    tree.wipe_device_memory();
    let out = restore(&sim, &["-d", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    verified += 1;
    assert!(
        tree.verify(verified),
        "every byte is back after the failed restores"
    );
}

#[test]
fn kfd_model_fault_at_every_step_loses_nothing() {
    faults_at_every_step("kfd");
}

#[test]
fn nvidia_model_fault_at_every_step_loses_nothing() {
    faults_at_every_step("nvidia");
}

/// `--leave-running` whose end fails: the image is complete and gpucr says so, but
/// exits with its own code naming what failed, since a task may be left without its
/// device. First a fault after every task got its device back (the tree runs on,
/// verified; the image verifies), then the driver's resume itself failing.
#[test]
fn give_back_failure_after_a_leave_running_dump_is_reported() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image: _image,
        tree,
    } = started("giveback", NVIDIA_SMALL);
    let pid = tree.pid.to_string();
    for (n, why) in [Injected::Fault("give-back"), Injected::Driver("resume")]
        .into_iter()
        .enumerate()
    {
        let dir = tmp.path().join(format!("image-{n}"));
        let steps_before = tree.steps();
        let env = why.arm(&sim);
        let out = gpucr_env(
            &["dump", "--leave-running", &pid, dir.to_str().unwrap()],
            &env,
        );
        Injected::disarm(&sim);
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(GIVE_BACK_FAILED), "{why:?}: {text}");
        assert!(text.contains(&why.needle()), "{why:?}: {text}");
        assert!(text.contains("is complete"), "{why:?}: {text}");
        assert!(
            text.contains(&format!("pid {pid} is still running")),
            "{text}"
        );
        assert!(dir.join("gpucr.json").exists(), "{why:?}: no manifest");
        assert!(!dir.join("gpucr-incomplete.json").exists());
        assert_success(&gpucr(&["inspect", "--verify", dir.to_str().unwrap()]));
        assert!(alive(tree.pid), "{why:?}: the tree died");
        if n == 0 {
            tree.wait_ticks(2);
            assert!(tree.verify(1), "the memory is back on the device");
            assert!(tree.steps() > steps_before, "and the kernels run again");
        }
    }
}

/// A dump that fails (the tree lives on) and whose give-back then fails too (the
/// driver's resume): gpucr reports the dump's failure with its own exit code, and says
/// that a task may not have its device back, and why.
#[test]
fn failed_dump_whose_give_back_fails_names_both() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = started("giveback-failed", NVIDIA_SMALL);
    let mut env = Injected::Driver("resume").arm(&sim);
    env.push(("GPUCR_FAULT", "dump-file"));
    let out = gpucr_env(
        &["dump", &tree.pid.to_string(), image.to_str().unwrap()],
        &env,
    );
    Injected::disarm(&sim);
    let text = stderr(&out);
    assert!(!out.status.success(), "{text}");
    assert_ne!(out.status.code(), Some(GIVE_BACK_FAILED), "{text}");
    assert!(text.contains("fault injected at step dump-file"), "{text}");
    assert!(
        text.contains("may not have its device back") && text.contains("resume failed (injected)"),
        "{text}"
    );
    assert!(image.join("gpucr-incomplete.json").exists());
    assert!(alive(tree.pid));
}

/// A device step that hangs (the driver's thread is never let run, and the driver
/// itself would wait 10 minutes) is given up after `--device-timeout`: the dump fails
/// within seconds and the tree runs on.
#[test]
fn device_timeout_gives_up_a_stuck_step() {
    let _lock = criu_lock();
    let Started {
        tmp,
        sim,
        image: _image,
        tree,
    } = started(
        "devtimeout",
        &[
            "--driver",
            "nvidia",
            "--parent-mib",
            "8",
            "--child-mib",
            "0",
        ],
    );
    let env = [
        sim.env()[0],
        ("GPUCR_TEST_NO_THREAD_RUN", "1"),
        ("GPUCR_SIM_DRIVER_TIMEOUT", "600"),
    ];
    let failed = tmp.path().join("failed");
    let started = std::time::Instant::now();
    let out = gpucr_env(
        &[
            "dump",
            "--device-timeout",
            "2",
            &tree.pid.to_string(),
            failed.to_str().unwrap(),
        ],
        &env,
    );
    assert!(!out.status.success());
    let log = fs::read_to_string(failed.join("dump.log")).unwrap_or_default();
    assert!(
        format!("{}{log}", stderr(&out))
            .contains("not done within 2.0 s, nothing copied meanwhile (--device-timeout)"),
        "{}\n{log}",
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(alive(tree.pid));
    tree.wait_ticks(2);
    assert!(
        tree.verify(1),
        "the tree runs on, unlocked, its memory intact"
    );
}

/// `restore --lazy` of a GPU tree: 3 processes, each with device memory and 48 MiB of
/// CPU memory. The device memory is filled as without --lazy and the tree is let run
/// once it is back (GPU memory restored before pre-resume), its CPU memory served by
/// gpucr's lazy-pages server meanwhile; every byte of both verifies in the processes
/// and the kernels go on.
#[test]
fn lazy_restore_of_a_gpu_tree_fills_the_devices_and_serves_the_cpu_memory() {
    let _lock = criu_lock();
    let Started {
        tmp: _tmp,
        sim,
        image,
        tree,
    } = dumped(
        "lazy-gpu",
        &[
            "--gpus",
            "2",
            "--children",
            "2",
            "--parent-mib",
            "64",
            "--child-mib",
            "32",
            "--cpu-mib",
            "48",
        ],
    );
    let steps_at_dump = tree.steps();
    let out = restore(&sim, &["--lazy", "--detach", image.to_str().unwrap()]);
    let _restored = Restored::from_output(&out);
    let err = stderr(&out);
    // Detached, the rest is served by a helper whose output goes to the image's log.
    let log = image.join("lazy-pages.log");
    wait_for(Duration::from_secs(60), "all memory in", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("all memory in"))
    });
    // The order of events: the GPU memory is back before the tree may run.
    let at = |needle: &str| {
        err.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing from\n{err}"))
    };
    assert!(at("-> gpu-done") < at("-> pre-resume"), "{err}");
    assert!(tree.verify(2), "every byte of the buffers and CPU memory");
    tree.wait_ticks(3);
    assert!(tree.steps() > steps_at_dump, "the kernels go on");
}
