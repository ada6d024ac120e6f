//! The kernel uAPI gpucr declares (`gpucr_abi::kfd`, `gpucr_abi::amdgpu_drm`) against the
//! system headers: a generated C program includes `<linux/kfd_ioctl.h>` (linux-libc-dev)
//! and `<libdrm/amdgpu_drm.h>`, `<libdrm/amdgpu.h>` (libdrm-dev), prints every size, field
//! offset, constant and ioctl number that `gpucr_abi::uapi_facts::all()` lists, and each value
//! must equal gpucr's. A missing header or compiler is a failure, never a skip.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpucr_abi::uapi::Fact;
use gpucr_abi::uapi_facts;

mod common;
use common::{cc, require_cc};

/// libdrm's include directory: `amdgpu.h` includes `<amdgpu_drm.h>` and friends from it.
const LIBDRM_INCLUDE: &str = "/usr/include/libdrm";

/// Headers the program includes, each with the Debian package that ships it, in the order
/// they are checked (kfd_ioctl.h needs drm.h, so libdrm's headers come first).
const HEADERS: &[(&str, &str)] = &[
    ("libdrm/drm.h", "libdrm-dev"),
    ("libdrm/amdgpu_drm.h", "libdrm-dev"),
    ("libdrm/amdgpu.h", "libdrm-dev"),
    ("linux/kfd_ioctl.h", "linux-libc-dev"),
];

/// A scratch directory of this test under cargo's target tmpdir, with the shim
/// `drm/drm.h`: `<linux/kfd_ioctl.h>` includes `<drm/drm.h>`, which Debian's linux-libc-dev
/// does not ship (libdrm-dev ships the same header as `<libdrm/drm.h>`).
fn workdir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("uapi_headers");
    let shim = dir.join("include/drm");
    std::fs::create_dir_all(&shim).expect("create the test's scratch directory");
    std::fs::write(shim.join("drm.h"), "#include <libdrm/drm.h>\n").expect("write the drm.h shim");
    dir
}

fn include_args(dir: &Path) -> Vec<String> {
    vec![
        format!("-I{}", dir.join("include").display()),
        format!("-I{LIBDRM_INCLUDE}"),
    ]
}

/// Fails with the package to install when a header cannot be preprocessed.
fn require_headers(dir: &Path) {
    require_cc("uAPI header check");
    for (header, package) in HEADERS {
        let src = dir.join("probe.c");
        std::fs::write(&src, format!("#include <{header}>\n")).expect("write probe.c");
        let out = Command::new(cc())
            .args(include_args(dir))
            .args(["-E", "-o", "/dev/null"])
            .arg(&src)
            .output()
            .expect("run the C preprocessor");
        assert!(
            out.status.success(),
            "header <{header}> is missing or unusable: install the {package} package\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The C program: one line "index value" per fact.
fn program(facts: &[&Fact]) -> String {
    let mut c = String::new();
    // fcntl.h: DRM_RDWR and DRM_CLOEXEC expand to O_RDWR and O_CLOEXEC.
    c.push_str("#include <fcntl.h>\n#include <stdio.h>\n#include <stddef.h>\n");
    for (header, _) in HEADERS {
        writeln!(c, "#include <{header}>").unwrap();
    }
    c.push_str("int main(void) {\n");
    for (i, fact) in facts.iter().enumerate() {
        let expr = fact.c_expr();
        if fact.is_signed() {
            writeln!(c, "    printf(\"{i} %lld\\n\", (long long)({expr}));").unwrap();
        } else {
            writeln!(
                c,
                "    printf(\"{i} %llu\\n\", (unsigned long long)({expr}));"
            )
            .unwrap();
        }
    }
    c.push_str(
        "    printf(\"version %d.%d\\n\", KFD_IOCTL_MAJOR_VERSION, KFD_IOCTL_MINOR_VERSION);\n",
    );
    c.push_str("    return 0;\n}\n");
    c
}

#[test]
fn uapi_matches_system_headers() {
    let dir = workdir();
    require_headers(&dir);

    let facts: Vec<&Fact> = uapi_facts::all().collect();
    let src = dir.join("uapi_check.c");
    let exe = dir.join("uapi_check");
    std::fs::write(&src, program(&facts)).expect("write uapi_check.c");
    let out = Command::new(cc())
        .args(include_args(&dir))
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "the header check program ({}) does not compile; a name gpucr declares is missing \
         from the headers or differs in kind:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(&exe)
        .output()
        .expect("run the header check program");
    assert!(out.status.success(), "the header check program failed");
    let stdout = String::from_utf8(out.stdout).expect("program output is text");

    let mut seen = vec![None; facts.len()];
    let mut version = None;
    for line in stdout.lines() {
        let (key, value) = line.split_once(' ').expect("a line is \"key value\"");
        if key == "version" {
            version = Some(value.to_string());
            continue;
        }
        let i: usize = key.parse().expect("index");
        let v: i128 = value.parse().expect("value");
        seen[i] = Some(v);
    }

    let mut mismatches = Vec::new();
    let (mut sizes, mut offsets, mut values) = (0, 0, 0);
    for (fact, c_value) in facts.iter().zip(&seen) {
        match fact {
            Fact::Size { .. } => sizes += 1,
            Fact::Offset { .. } => offsets += 1,
            Fact::Value { .. } => values += 1,
        }
        match c_value {
            Some(v) if *v == fact.value() => {}
            Some(v) => mismatches.push(format!(
                "{}: headers say {v}, gpucr says {}",
                fact.c_expr(),
                fact.value()
            )),
            None => mismatches.push(format!("{}: not printed by the program", fact.c_expr())),
        }
    }
    println!(
        "checked {} facts against the headers (KFD {}): {sizes} sizes, {offsets} offsets, \
         {values} constants and ioctl numbers",
        facts.len(),
        version.as_deref().unwrap_or("?"),
    );
    assert!(
        mismatches.is_empty(),
        "{} of {} uAPI facts differ from the system headers:\n  {}",
        mismatches.len(),
        facts.len(),
        mismatches.join("\n  ")
    );
}
