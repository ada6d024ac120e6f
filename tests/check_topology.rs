//! `gpucr check-topology`: the table, the image check, JSON, exit codes and errors, run as
//! the binary against the topology fixtures (`tests/fixtures/topology`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpucr_topology::{read_local, Topology};

const SUCCESS: i32 = 0;
const FAILURE: i32 = 1;
const USAGE: i32 = 2;
const TOPOLOGY_INCOMPATIBLE: i32 = 9;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/topology")
        .join(name)
}

fn machine(name: &str) -> Topology {
    read_local(Some(&fixture(name))).unwrap()
}

/// Runs `gpucr ARGS` with the `KFD_*_CHECK` variables cleared and `extra_env` set.
fn gpucr(args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpucr"));
    cmd.args(args)
        .env_remove("GPUCR_SYSFS_ROOT")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for var in [
        "KFD_FW_VER_CHECK",
        "KFD_SDMA_FW_VER_CHECK",
        "KFD_CACHES_COUNT_CHECK",
        "KFD_NUM_GWS_CHECK",
        "KFD_VRAM_SIZE_CHECK",
        "KFD_NUMA_CHECK",
        "KFD_CAPABILITY_CHECK",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A valid manifest (every field `gpucr restore` needs) with `topology`.
fn manifest(topology: Option<&Topology>) -> serde_json::Value {
    serde_json::json!({
        "format": "gpucr-image",
        "format_version": 2,
        "gpucr_version": "0.1.0",
        "criu_version": "4.2.1",
        "created": "2026-01-01T00:00:00Z",
        "host": {"hostname": "h", "kernel": "6.12.0", "arch": "x86_64", "page_size": 4096},
        "backend": "none",
        "target": {"pid": 42, "comm": "w", "cmdline": ["w"]},
        "options": {"leave_running": false, "tcp_established": false, "shell_job": false,
                    "ext_unix_sk": false, "file_locks": false, "network_lock": "skip"},
        "checksum_algorithm": "xxh3-blocks-4m",
        "files": [],
        "timings": {"total_ms": 1.0, "events": []},
        "topology": topology,
    })
}

/// A GPU section (`gpu`) of `backend` whose one task uses `gpus`.
fn gpu_section(backend: &str, gpus: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "backend": backend,
        "tasks": [{
            "ns_pid": 1, "host_pid": 100, "gpus": gpus, "device_files": [],
            "state": {"file": "gpu/state/task-1.bin", "format": "sim/1", "size": 0},
            "buffers": [], "operations": [],
        }],
        "stats": {"buffers": 0, "raw_bytes": 0, "stored_bytes": 0, "zero_chunks": 0,
                  "raw_chunks": 0, "compressed_chunks": 0, "seconds": 0.0},
        "timings": [],
    })
}

/// An image directory whose manifest holds `topology` (and fields this command ignores).
fn image(topology: Option<&Topology>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("gpucr.json"),
        manifest(topology).to_string(),
    )
    .unwrap();
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn table_of_local_gpus() {
    let root = fixture("mi300x-8x");
    let out = gpucr(&["check-topology", "--sysfs-root", path(&root)], &[]);
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 9, "{text}");
    for column in [
        "NODE", "GPU", "NAME", "VRAM", "CUS", "FIRMWARE", "NUMA", "LINKS",
    ] {
        assert!(lines[0].contains(column), "{text}");
    }
    assert!(
        lines[1].starts_with(
            "2     28851  gfx942  192.0 GiB  304  mec 186 sdma 24  0     pcie:0 xgmi:3-9 (hive 0)"
        ),
        "{text}"
    );

    // The environment variable names the root too.
    let out = gpucr(
        &["check-topology"],
        &[("GPUCR_SYSFS_ROOT", path(&fixture("h100-8x")))],
    );
    assert_eq!(out.status.code(), Some(SUCCESS));
    assert!(
        stdout(&out).contains("GPU-0e6f8a21-3b5c-4d7e-8f90-a1b2c3d4e5f0  NVIDIA H100 80GB HBM3")
    );
}

/// A flag's variable set but empty (`GPUCR_SYSFS_ROOT= gpucr ...`) counts as unset, not
/// as an empty value of the flag; an empty value given as the flag is still refused.
#[test]
fn an_empty_variable_counts_as_unset() {
    let unset = gpucr(&["check-topology", "--json"], &[]);
    let empty = gpucr(&["check-topology", "--json"], &[("GPUCR_SYSFS_ROOT", "")]);
    assert_eq!(
        empty.status.code(),
        unset.status.code(),
        "{}",
        stderr(&empty)
    );
    assert_ne!(empty.status.code(), Some(USAGE), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), stdout(&unset));
    assert_eq!(stderr(&empty), stderr(&unset));

    // Neither is GPUCR_CRIU (nor GPUCR_CRIU_CONFIG) a flag given empty: the dump goes on
    // to the target check.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let out = gpucr(
        &["dump", "99999999", path(&dir)],
        &[("GPUCR_CRIU", ""), ("GPUCR_CRIU_CONFIG", "")],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pid 99999999: no such process"),
        "{}",
        stderr(&out)
    );
    let out = gpucr(&["check-topology", "--sysfs-root", ""], &[]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
}

#[test]
fn table_as_json() {
    let root = fixture("mi100-4x-xgmi");
    let out = gpucr(
        &["check-topology", "--json", "--sysfs-root", path(&root)],
        &[],
    );
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["cpu_nodes"], serde_json::json!([0, 1]));
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 4);
    assert_eq!(gpus[0]["kind"], "kfd");
    assert_eq!(gpus[0]["node"], 2);
    assert_eq!(gpus[0]["gpu_id"], 3213);
    assert_eq!(gpus[0]["vram_bytes"], 32u64 << 30);
    assert_eq!(gpus[0]["compute_units"], 120);
    assert_eq!(gpus[2]["numa_nodes"], serde_json::json!([1]));
    assert_eq!(gpus[0]["hive"], 0);
    assert_eq!(gpus[0]["links"].as_array().unwrap().len(), 4);
    assert_eq!(gpus[0]["links"][1]["type"], "xgmi");
    assert_eq!(gpus[0]["links"][1]["bidirectional"], true);
}

#[test]
fn compatible_image_prints_the_mapping() {
    let img = image(Some(&machine("mi250x-8gcd")));
    let root = fixture("mi250x-8gcd");
    let out = gpucr(
        &[
            "check-topology",
            path(img.path()),
            "--sysfs-root",
            path(&root),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("compatible: the image's 8 GPU(s) can be restored on this machine\n"));
    assert!(text.contains(
        "node 2 gpu_id 15718 (gfx90a aldebaran) -> node 2 gpu_id 15718 (gfx90a aldebaran)"
    ));
    assert!(text.contains("CPU node 1 -> CPU node 1"));
}

/// An image of simulated GPUs is checked against the sim root, as `gpucr restore` checks
/// it, when `--sysfs-root` names no other; images of real devices against `/`.
#[test]
fn a_sim_image_is_checked_against_the_sim_root() {
    let sim_root = fixture("mi250x-8gcd");
    let with_backend = |backend: &str| {
        let img = image(Some(&machine("mi250x-8gcd")));
        let manifest = path(img.path()).to_owned() + "/gpucr.json";
        let mut value: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&manifest).unwrap()).unwrap();
        value["gpu"] = gpu_section(backend, &["kfd:15718"]);
        fs::write(&manifest, value.to_string()).unwrap();
        img
    };
    let sim = with_backend("sim");
    let env = [("GPUCR_SIM_ROOT", path(&sim_root))];
    let out = gpucr(&["check-topology", path(sim.path())], &env);
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("compatible:"), "{}", stdout(&out));

    // --sysfs-root still wins over the sim root.
    let elsewhere = fixture("mi300x-8x");
    let out = gpucr(
        &[
            "check-topology",
            path(sim.path()),
            "--sysfs-root",
            path(&elsewhere),
        ],
        &env,
    );
    assert_eq!(
        out.status.code(),
        Some(TOPOLOGY_INCOMPATIBLE),
        "{}",
        stderr(&out)
    );

    // The sim root means nothing to an image of real GPUs: this machine's / has none
    // of the image's MI250X GPUs.
    let amd = with_backend("amdgpu");
    let out = gpucr(&["check-topology", path(amd.path())], &env);
    assert_eq!(
        out.status.code(),
        Some(TOPOLOGY_INCOMPATIBLE),
        "{}",
        stderr(&out)
    );
}

#[test]
fn incompatible_image_explains_every_mismatch() {
    let img = image(Some(&machine("mi300x-8x")));
    let root = fixture("mi250x-8gcd");
    let out = gpucr(
        &[
            "check-topology",
            path(img.path()),
            "--sysfs-root",
            path(&root),
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(TOPOLOGY_INCOMPATIBLE),
        "{}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.starts_with("incompatible:"), "{text}");
    for line in [
        "checkpointed GPU node 2 gpu_id 28851 (gfx942):",
        "  vs local node 9 gpu_id 28603 (gfx90a aldebaran):",
        "    device_id: checkpointed 0x74a1, local 0x740c (must be equal)",
        "    simd_count: checkpointed 1216, local 440 (must be equal)",
        "    vram_size: checkpointed 192.0 GiB, local 64.0 GiB (local must be at least the checkpointed value)",
        "    fw_version: checkpointed 186, local 78 (local must be at least the checkpointed value)",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    let out = gpucr(
        &[
            "check-topology",
            path(img.path()),
            "--sysfs-root",
            path(&root),
            "--json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(TOPOLOGY_INCOMPATIBLE));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["compatible"], false);
    assert_eq!(json["mapping"], serde_json::Value::Null);
    let gpu = &json["gpus"][0];
    assert_eq!(gpu["saved"]["gpu_id"], 28851);
    assert_eq!(gpu["candidates"].as_array().unwrap().len(), 8);
    let failed = gpu["candidates"][0]["failed"].as_array().unwrap();
    let device = failed.iter().find(|m| m["check"] == "device_id").unwrap();
    assert_eq!(device["saved"], 0x74a1);
    assert_eq!(device["local"], 0x740c);
    assert_eq!(device["requirement"], "equal");
}

#[test]
fn checks_switch_off_by_environment_and_flag() {
    // The local MI50s run older firmware than the checkpointed ones.
    let mut saved = machine("mi50-2x");
    for node in saved.kfd_nodes.iter_mut().filter(|n| n.is_gpu()) {
        node.properties.set("fw_version", 500);
    }
    let img = image(Some(&saved));
    let root = fixture("mi50-2x");
    let args = [
        "check-topology",
        path(img.path()),
        "--sysfs-root",
        path(&root),
    ];

    let out = gpucr(&args, &[]);
    assert_eq!(out.status.code(), Some(TOPOLOGY_INCOMPATIBLE));
    assert!(stdout(&out).contains(
        "a mapping would exist without the check: fw_version (--skip-check fw_version or KFD_FW_VER_CHECK=0)"
    ));

    for off in ["0", "NO", "no"] {
        let out = gpucr(&args, &[("KFD_FW_VER_CHECK", off)]);
        assert_eq!(out.status.code(), Some(SUCCESS), "{off}: {}", stdout(&out));
        assert!(stdout(&out).contains(&format!(
            "checks not applied: fw_version (KFD_FW_VER_CHECK={off})"
        )));
    }
    let out = gpucr(&args, &[("KFD_FW_VER_CHECK", "YES")]);
    assert_eq!(out.status.code(), Some(TOPOLOGY_INCOMPATIBLE));
    let out = gpucr(&args, &[("KFD_FW_VER_CHECK", "maybe")]);
    assert_eq!(out.status.code(), Some(TOPOLOGY_INCOMPATIBLE));
    assert!(stdout(&out).contains("note: ignoring invalid value for KFD_FW_VER_CHECK=\"maybe\""));

    let mut with_flag = args.to_vec();
    with_flag.extend(["--skip-check", "fw_version"]);
    let out = gpucr(&with_flag, &[]);
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stdout(&out));
    assert!(stdout(&out).contains("checks not applied: fw_version (--skip-check)"));

    let mut bad = args.to_vec();
    bad.extend(["--skip-check", "firmware"]);
    let out = gpucr(&bad, &[]);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(stderr(&out).contains("invalid value 'firmware' for '--skip-check <NAME>'"));
}

#[test]
fn nvidia_image_onto_a_bigger_machine() {
    let json = fs::read_to_string(fixture("nvml/h100-1x.json")).unwrap();
    let saved: Topology = serde_json::from_str(&json).unwrap();
    let img = image(Some(&saved));
    let root = fixture("h100-8x");
    let out = gpucr(
        &[
            "check-topology",
            path(img.path()),
            "--sysfs-root",
            path(&root),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(SUCCESS), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("GPU-5b9d0a3e-7c41-4f2e-9a8b-1d2c3e4f5a61 (NVIDIA H100 80GB HBM3) -> GPU-")
    );
    // Memory sizes cannot be read from procfs: said, not hidden.
    assert!(text.contains("note: vram_size was not compared"));
}

/// `CUDA_VISIBLE_DEVICES` limits the GPUs an NVIDIA image may be mapped onto, by index
/// (PCI bus order) or UUID, with CUDA's rules.
#[test]
fn nvidia_mapping_honours_cuda_visible_devices() {
    let json = fs::read_to_string(fixture("nvml/h100-1x.json")).unwrap();
    let saved: Topology = serde_json::from_str(&json).unwrap();
    let img = image(Some(&saved));
    let root = fixture("h100-8x");
    let args = [
        "check-topology",
        path(img.path()),
        "--sysfs-root",
        path(&root),
    ];
    let sixth = "GPU-5db4cf76-80a1-42c3-de45-f60718293a45";
    for value in ["5", "5,2", "GPU-5db4cf76", sixth] {
        let out = gpucr(&args, &[("CUDA_VISIBLE_DEVICES", value)]);
        assert_eq!(
            out.status.code(),
            Some(SUCCESS),
            "{value}: {}",
            stdout(&out)
        );
        let text = stdout(&out);
        assert!(text.contains(&format!("-> {sixth}")), "{value}: {text}");
        assert!(
            text.contains(&format!("CUDA_VISIBLE_DEVICES=\"{value}\": restoring onto")),
            "{value}: {text}"
        );
    }
    // The first entry that names no GPU ends the list: none is left here.
    for value in ["8,5", "-1", ""] {
        let out = gpucr(&args, &[("CUDA_VISIBLE_DEVICES", value)]);
        assert_eq!(
            out.status.code(),
            Some(TOPOLOGY_INCOMPATIBLE),
            "{value}: {}",
            stdout(&out)
        );
    }
    let out = gpucr(
        &args,
        &[(
            "CUDA_VISIBLE_DEVICES",
            "MIG-5f3e1c2d-aaaa-bbbb-cccc-000000000001",
        )],
    );
    assert_eq!(out.status.code(), Some(FAILURE), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("names the MIG instance"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn image_without_gpu_state() {
    let root = fixture("cpu-only");
    for img in [image(None), image(Some(&machine("cpu-only")))] {
        let out = gpucr(
            &[
                "check-topology",
                path(img.path()),
                "--sysfs-root",
                path(&root),
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(SUCCESS));
        assert_eq!(
            stdout(&out),
            "the image holds no GPU state: compatible with any machine\n"
        );
    }
    // A manifest without the field at all (written before the topology was stored).
    let dir = tempfile::tempdir().unwrap();
    let mut value = manifest(None);
    value.as_object_mut().unwrap().remove("topology");
    fs::write(dir.path().join("gpucr.json"), value.to_string()).unwrap();
    let out = gpucr(&["check-topology", path(dir.path()), "--json"], &[]);
    assert_eq!(out.status.code(), Some(SUCCESS));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["compatible"], true);
    assert_eq!(json["mapping"], serde_json::Value::Null);
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpucr(&["check-topology", path(dir.path())], &[]);
    assert_eq!(out.status.code(), Some(8), "no manifest: image incomplete");
    let manifest = dir.path().join("gpucr.json");
    assert!(
        stderr(&out).contains(&format!("{} is missing", manifest.display())),
        "{}",
        stderr(&out)
    );

    let mut value = self::manifest(None);
    value["topology"] = serde_json::json!({"kfd_nodes": 3});
    fs::write(&manifest, value.to_string()).unwrap();
    let out = gpucr(&["check-topology", path(dir.path())], &[]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "malformed manifest: image damaged"
    );
    assert!(
        stderr(&out).contains(&format!(
            "{}: malformed manifest at line 1",
            manifest.display()
        )),
        "{}",
        stderr(&out)
    );

    // What inspect and restore refuse is no "compatible with any machine": another
    // format, a newer version, an empty object, a wrong type in any field.
    let mut wrong_type = self::manifest(None);
    wrong_type["created"] = serde_json::json!(12);
    for (text, says) in [
        (
            r#"{"format": "other"}"#.to_string(),
            "field `format` is \"other\"",
        ),
        (
            {
                let mut v = self::manifest(None);
                v["format_version"] = serde_json::json!(99);
                v.to_string()
            },
            "field `format_version` is 99",
        ),
        ("{}".to_string(), "field `format` is \"\""),
        (wrong_type.to_string(), "malformed manifest at line 1"),
    ] {
        fs::write(&manifest, &text).unwrap();
        let out = gpucr(&["check-topology", path(dir.path())], &[]);
        assert_eq!(out.status.code(), Some(7), "{text}: {}", stdout(&out));
        assert!(
            stderr(&out).contains(&format!("{}: {says}", manifest.display())),
            "{text}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    }

    // --sysfs-root that is missing or a file is a usage error, not "no GPUs here".
    let file = dir.path().join("file");
    fs::write(&file, "").unwrap();
    for root in [dir.path().join("nonexistent"), file] {
        let out = gpucr(&["check-topology", "--sysfs-root", path(&root)], &[]);
        assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&root.display().to_string()),
            "{}",
            stderr(&out)
        );
    }

    // A broken sysfs file under the root.
    let root = tempfile::tempdir().unwrap();
    let node = root.path().join("sys/class/kfd/kfd/topology/nodes/0");
    fs::create_dir_all(node.join("io_links")).unwrap();
    fs::write(node.join("gpu_id"), "0\n").unwrap();
    fs::write(node.join("name"), "\n").unwrap();
    fs::write(node.join("properties"), "cpu_cores_count 16\nsimd_count\n").unwrap();
    let out = gpucr(&["check-topology", "--sysfs-root", path(root.path())], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cannot read this machine's GPU topology"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{}:2: malformed line \"simd_count\"",
            node.join("properties").display()
        )),
        "{err}"
    );
}

/// Output that cannot be written is never a panic. A pipe whose reader has gone
/// (`gpucr ... | head`) cuts the output short without an error, and the exit status is
/// the command's own (9 for an incompatible image); a full disk behind `>` is an error
/// naming standard output.
#[test]
fn stdout_that_cannot_be_written_is_no_panic() {
    let closed_pipe = || {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        std::process::Stdio::from(write)
    };
    let full_disk = || std::process::Stdio::from(fs::File::create("/dev/full").unwrap());
    let root = fixture("mi250x-8gcd");
    let img = image(Some(&machine("mi300x-8x")));
    let run = |args: &[&str], stdout: std::process::Stdio| {
        Command::new(env!("CARGO_BIN_EXE_gpucr"))
            .args(args)
            .env_remove("GPUCR_SYSFS_ROOT")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    let table = ["check-topology", "--sysfs-root", path(&root)];
    let incompatible = [
        "check-topology",
        path(img.path()),
        "--sysfs-root",
        path(&root),
    ];
    let completions = ["completions", "bash"];
    for (args, code) in [
        (&table[..], SUCCESS),
        (&incompatible[..], TOPOLOGY_INCOMPATIBLE),
        (&completions[..], SUCCESS),
    ] {
        let out = run(args, closed_pipe());
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "{args:?}: {}", stderr(&out));

        let out = run(args, full_disk());
        assert_eq!(
            out.status.code(),
            Some(FAILURE),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("cannot write to standard output")
                && stderr(&out).contains("No space left on device")
                && !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // inspect (whose report is large) keeps its own exit status behind a closed pipe.
    let inspect = ["inspect", path(img.path())];
    let expected = run(&inspect, std::process::Stdio::piped()).status.code();
    let out = run(&inspect, closed_pipe());
    assert_eq!(out.status.code(), expected, "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("standard output") && !stderr(&out).contains("panicked"),
        "{}",
        stderr(&out)
    );
}
