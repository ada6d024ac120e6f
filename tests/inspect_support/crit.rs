//! Run `crit` and parse what it prints: `crit x DIR ps|fds|mems` (text) and
//! `crit show FILE` (JSON).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// `crit ARGS` stdout; panics with its stderr if it fails.
pub fn crit(args: &[&str]) -> String {
    let out = Command::new("crit")
        .args(args)
        .output()
        .expect("run crit (installed with CRIU)");
    assert!(
        out.status.success(),
        "crit {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("crit prints UTF-8")
}

/// `crit show FILE` as JSON.
pub fn show(dir: &Path, file: &str) -> serde_json::Value {
    let path = dir.join(file);
    serde_json::from_str(&crit(&["show", path.to_str().unwrap()])).expect("crit show prints JSON")
}

/// One row of `crit x DIR ps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsRow {
    pub pid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub comm: String,
    /// Indentation level in the tree.
    pub depth: usize,
}

/// `crit x DIR ps`: "    PID   PGID    SID   COMM" then one row per process, the
/// comm indented by four spaces per level.
pub fn ps(dir: &Path) -> Vec<PsRow> {
    let text = crit(&["x", dir.to_str().unwrap(), "ps"]);
    text.lines()
        .skip(1)
        .map(|line| {
            let (nums, comm) = line.split_at(21);
            let n: Vec<u32> = nums
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            let comm = &comm[3..];
            let depth = (comm.len() - comm.trim_start().len()) / 4;
            PsRow {
                pid: n[0],
                pgid: n[1],
                sid: n[2],
                comm: comm.trim_start().to_string(),
                depth,
            }
        })
        .collect()
}

/// `crit x DIR fds`: pid -> (fd or "cwd"/"root" -> description).
pub fn fds(dir: &Path) -> BTreeMap<u32, BTreeMap<String, String>> {
    let text = crit(&["x", dir.to_str().unwrap(), "fds"]);
    let mut out: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
    let mut pid = 0;
    for line in text.lines() {
        if !line.starts_with('\t') {
            pid = line.trim().parse().unwrap();
            out.entry(pid).or_default();
            continue;
        }
        let (key, value) = line.trim().split_once(": ").unwrap();
        out.get_mut(&pid)
            .expect("a pid line comes first")
            .insert(key.trim().to_string(), value.to_string());
    }
    out
}

/// One VMA line of `crit x DIR mems`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemRow {
    pub start: u64,
    pub end: u64,
    /// "rw-" etc.
    pub prot: String,
    /// What follows the protection: a path (+ " + 0xOFF", " (s)"), "[stack]", ...
    pub tag: String,
}

/// `crit x DIR mems`: pid -> (exe, VMAs).
pub fn mems(dir: &Path) -> BTreeMap<u32, (String, Vec<MemRow>)> {
    let text = crit(&["x", dir.to_str().unwrap(), "mems"]);
    let mut out: BTreeMap<u32, (String, Vec<MemRow>)> = BTreeMap::new();
    let mut pid = 0;
    for line in text.lines() {
        if !line.starts_with('\t') {
            pid = line.trim().parse().unwrap();
            continue;
        }
        let line = &line[1..];
        if let Some(exe) = line.strip_prefix("exe") {
            out.insert(pid, (exe.trim().to_string(), Vec::new()));
            continue;
        }
        let (range, rest) = line.split_at(36);
        let (start, end) = range.trim().split_once('-').unwrap();
        let row = MemRow {
            start: u64::from_str_radix(start, 16).unwrap(),
            end: u64::from_str_radix(end, 16).unwrap(),
            prot: rest[..3].to_string(),
            tag: rest[3..].trim().to_string(),
        };
        out.get_mut(&pid)
            .expect("the exe line comes first")
            .1
            .push(row);
    }
    out
}
