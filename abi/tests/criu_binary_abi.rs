//! The hook ABI told from a real CRIU binary is the one that CRIU's header declares.
//!
//! The binary is `GPUCR_CRIU` (as gpucr runs it), else the `criu` on PATH or in
//! /usr/local/bin. The ABI it must be detected as is `GPUCR_CRIU_ABI` (`4.1`, `4.2` or
//! `4.3`; scripts/test-criu-matrix.sh sets it for each CRIU it builds, criu-dev among
//! them, which calls itself 4.2), else the one of the release `criu --version` names.
//! The header each ABI stands for is checked by tests/criu_plugin_header.rs.

use std::path::PathBuf;
use std::process::Command;

use gpucr_abi::criu_hook_abi;
use gpucr_abi::plugin_abi::HookAbi;

fn criu() -> PathBuf {
    if let Some(path) = std::env::var_os("GPUCR_CRIU").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/bin".into(), "/usr/local/sbin".into()])
        .map(|dir| dir.join("criu"))
        .find(|p| p.is_file())
        .expect("no criu on PATH or in /usr/local: scripts/install-criu.sh installs it")
}

fn abi_named(name: &str) -> HookAbi {
    match name {
        "4.0" | "4.1" => HookAbi::Criu41,
        "4.2" => HookAbi::Criu42,
        "4.3" => HookAbi::Criu43,
        other => panic!("no hook ABI known for CRIU {other:?}"),
    }
}

fn expected_abi(criu: &PathBuf) -> HookAbi {
    if let Some(name) = std::env::var("GPUCR_CRIU_ABI")
        .ok()
        .filter(|v| !v.is_empty())
    {
        return abi_named(&name);
    }
    let out = Command::new(criu).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .unwrap_or_else(|| panic!("{}: no version in {text:?}", criu.display()))
        .trim();
    let major_minor: Vec<&str> = version.split('.').take(2).collect();
    abi_named(&major_minor.join("."))
}

#[test]
fn the_criu_binary_is_detected_as_its_header_declares() {
    let criu = criu();
    let expected = expected_abi(&criu);
    let detected =
        criu_hook_abi::of_file(&criu).unwrap_or_else(|e| panic!("{}: {e}", criu.display()));
    assert_eq!(
        detected,
        expected,
        "{} detected as {} ({} hooks), expected {} ({} hooks)",
        criu.display(),
        detected.releases(),
        detected.max_hooks(),
        expected.releases(),
        expected.max_hooks()
    );
}
