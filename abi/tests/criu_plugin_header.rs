//! gpucr's side of CRIU's plugin ABI (`gpucr_abi::plugin_abi`) against the plugin header
//! of each CRIU it is tested with (`tests/criu-plugin/*/criu-plugin.h`, copied from CRIU
//! 4.1.1, 4.2.1 and criu-dev 2cf8f13): for each, a generated C program includes that
//! header and `_Static_assert`s what gpucr declares for the matching [`HookAbi`]:
//! `CR_PLUGIN_HOOK__MAX`, `CRIU_PLUGIN_VERSION`, the stage numbers, the size and offset of
//! every `cr_plugin_desc_t` field up to the hook array and the array's stride, and for
//! every hook gpucr registers under that ABI its number and its C type, which
//! `__builtin_types_compatible_p` compares with the header's `CR_PLUGIN_HOOK__X_t`. The
//! program only compiles when every assertion holds; the compiler names each one that
//! fails. A missing compiler is a failure, never a skip.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpucr_abi::plugin_abi::{
    stage, CrPluginDesc, HookAbi, CRIU_PLUGIN_VERSION, CRIU_PLUGIN_VERSION_OLD,
};

mod common;
use common::{cc, require_cc};

/// Each vendored header: its directory under `tests/criu-plugin`, the hook ABI of that
/// CRIU, and the header's sha256 (as `tests/criu-plugin/README.md` lists it).
const HEADERS: &[(&str, HookAbi, &str)] = &[
    (
        "4.1.1",
        HookAbi::Criu41,
        "79488bc843e284bd56fc93fee5a0304f33f9ffa144e0c21a1b80058d61373b2a",
    ),
    (
        "4.2.1",
        HookAbi::Criu42,
        "eb713813a52bfd4cc2e48ade7a279eddd01af809dc0dd48851451462e439d051",
    ),
    (
        "dev-2cf8f13",
        HookAbi::Criu43,
        "aef62a1d370ba3a9ddb06ce9ff804e0767053640425ef4a405cdd894213ed673",
    ),
];

fn header_dir(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/criu-plugin")
        .join(version)
}

/// A scratch directory of this test under cargo's target tmpdir.
fn workdir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("criu_plugin_header");
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

/// The size of what `field` returns: a field's size without a value to take it of.
fn size_of_return<F>(_field: impl Fn(&CrPluginDesc) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! field_size {
    ($field:ident) => {
        size_of_return(|d: &CrPluginDesc| &d.$field)
    };
}

/// One `_Static_assert(expr == value)`, its message naming the expression and gpucr's
/// value.
fn assert_eq_line(c: &mut String, expr: &str, value: impl std::fmt::Display) {
    writeln!(
        c,
        "_Static_assert(({expr}) == ({value}), \"{}: gpucr says {value}\");",
        expr.replace('"', "\\\"")
    )
    .unwrap();
}

/// The C program for `abi`, one `_Static_assert` a line; returns it with the number of
/// assertions.
fn program(abi: HookAbi) -> (String, usize) {
    let mut c = String::new();
    c.push_str("#include <stddef.h>\n#include \"criu-plugin.h\"\n\n");
    c.push_str("#define FIELD(f) (((cr_plugin_desc_t *)0)->f)\n\n");

    assert_eq_line(&mut c, "CR_PLUGIN_HOOK__MAX", abi.max_hooks());
    assert_eq_line(
        &mut c,
        "CRIU_PLUGIN_VERSION",
        format_args!("{CRIU_PLUGIN_VERSION:#x}"),
    );
    assert_eq_line(
        &mut c,
        "CRIU_PLUGIN_VERSION_OLD",
        format_args!("{CRIU_PLUGIN_VERSION_OLD:#x}"),
    );
    assert_eq_line(&mut c, "CR_PLUGIN_STAGE__DUMP", stage::DUMP);
    assert_eq_line(&mut c, "CR_PLUGIN_STAGE__PRE_DUMP", stage::PRE_DUMP);
    assert_eq_line(&mut c, "CR_PLUGIN_STAGE__RESTORE", stage::RESTORE);

    // The descriptor: gpucr's hook array may be longer than the header's (CRIU reads
    // `max_hooks` entries), so what must agree is everything up to the array, the
    // array's stride, and the header's whole descriptor being gpucr's cut after
    // `max_hooks` entries.
    let fields = [
        ("name", offset_of!(CrPluginDesc, name), field_size!(name)),
        ("init", offset_of!(CrPluginDesc, init), field_size!(init)),
        ("exit", offset_of!(CrPluginDesc, exit), field_size!(exit)),
        (
            "version",
            offset_of!(CrPluginDesc, version),
            field_size!(version),
        ),
        (
            "max_hooks",
            offset_of!(CrPluginDesc, max_hooks),
            field_size!(max_hooks),
        ),
    ];
    for (field, offset, size) in fields {
        assert_eq_line(
            &mut c,
            &format!("offsetof(cr_plugin_desc_t, {field})"),
            offset,
        );
        assert_eq_line(&mut c, &format!("sizeof(FIELD({field}))"), size);
    }
    let hooks_at = offset_of!(CrPluginDesc, hooks);
    let stride = size_of_return(|d: &CrPluginDesc| &d.hooks[0]);
    assert_eq_line(&mut c, "offsetof(cr_plugin_desc_t, hooks)", hooks_at);
    assert_eq_line(&mut c, "sizeof(FIELD(hooks[0]))", stride);
    assert_eq_line(
        &mut c,
        "sizeof(cr_plugin_desc_t)",
        hooks_at + stride * abi.max_hooks(),
    );
    assert!(
        size_of::<CrPluginDesc>() >= hooks_at + stride * abi.max_hooks(),
        "gpucr's descriptor has fewer hook slots than {abi:?}'s max_hooks"
    );
    // The function pointers' types: `init(int stage)`, `exit(int stage, int ret)`.
    c.push_str(
        "_Static_assert(__builtin_types_compatible_p(__typeof__(FIELD(init)), int (*)(int)), \
         \"init: gpucr says int (*)(int)\");\n",
    );
    c.push_str(
        "_Static_assert(__builtin_types_compatible_p(__typeof__(FIELD(exit)), void (*)(int, int)), \
         \"exit: gpucr says void (*)(int, int)\");\n",
    );

    for hook in abi.registered() {
        assert!(
            hook.number < abi.max_hooks(),
            "{} ({}) is registered under {abi:?}, whose CRIU reads {} hooks",
            hook.c_name,
            hook.number,
            abi.max_hooks()
        );
        assert_eq_line(&mut c, hook.c_name, hook.number);
        writeln!(
            c,
            "_Static_assert(__builtin_types_compatible_p({name}_t, {ty}), \
             \"{name}_t: gpucr's hook is {ty}\");",
            name = hook.c_name,
            ty = hook.c_type
        )
        .unwrap();
    }
    let asserts = c.matches("_Static_assert(").count();
    (c, asserts)
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {} failed", path.display());
    String::from_utf8(out.stdout)
        .expect("sha256sum prints text")
        .split_whitespace()
        .next()
        .expect("sha256sum prints a sum")
        .to_string()
}

/// Compiles `abi`'s program against the header in `dir`; the compiler's complaints on
/// failure.
fn compile(work: &Path, version: &str, abi: HookAbi) -> Result<usize, String> {
    let (source, asserts) = program(abi);
    let src = work.join(format!("criu_plugin_{version}.c"));
    let obj = work.join(format!("criu_plugin_{version}.o"));
    std::fs::write(&src, source).expect("write the check program");
    let out = Command::new(cc())
        .arg(format!("-I{}", header_dir(version).display()))
        .args(["-std=gnu11", "-Wall", "-Werror", "-c", "-o"])
        .arg(&obj)
        .arg(&src)
        .output()
        .expect("run the C compiler");
    if out.status.success() {
        Ok(asserts)
    } else {
        Err(format!(
            "{} against CRIU {version}'s header:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn vendored_headers_are_criu_own() {
    for (version, _, sum) in HEADERS {
        let path = header_dir(version).join("criu-plugin.h");
        assert_eq!(
            sha256(&path),
            *sum,
            "{} differs from CRIU {version}'s criu/include/criu-plugin.h",
            path.display()
        );
    }
}

#[test]
fn every_hook_abi_has_a_header() {
    for abi in HookAbi::ALL {
        assert!(
            HEADERS.iter().any(|(_, a, _)| *a == abi),
            "{abi:?} has no CRIU header to check it against"
        );
    }
}

#[test]
fn plugin_abi_matches_each_criu_header() {
    require_cc("CRIU plugin header check");
    let work = workdir();
    let mut failures = Vec::new();
    for (version, abi, _) in HEADERS {
        match compile(&work, version, *abi) {
            Ok(asserts) => println!(
                "CRIU {version} ({abi:?}): {asserts} assertions hold, {} hooks registered",
                abi.registered().len()
            ),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "gpucr's plugin ABI differs from CRIU's header (or the program does not compile):\n{}",
        failures.join("\n")
    );
}

/// The check can fail: gpucr's 4.3 hooks against 4.2's header (RESTORE_EXT_FILE's second
/// argument, a hook 4.2 lacks, another CR_PLUGIN_HOOK__MAX), and the other way round.
#[test]
fn a_header_of_another_abi_fails_the_check() {
    require_cc("CRIU plugin header check");
    let work = workdir().join("crossed");
    std::fs::create_dir_all(&work).expect("create the scratch directory");
    let err = compile(&work, "4.2.1", HookAbi::Criu43).expect_err("4.3's ABI passed 4.2.1");
    for expected in [
        "CR_PLUGIN_HOOK__MAX: gpucr says 15",
        "CR_PLUGIN_HOOK__RESTORE_EXT_FILE_t: gpucr's hook is int (int, bool *)",
        "CR_PLUGIN_HOOK__DUMP_DEVICES_LATE",
    ] {
        assert!(err.contains(expected), "no `{expected}` in:\n{err}");
    }
    let err = compile(&work, "dev-2cf8f13", HookAbi::Criu41).expect_err("4.1's ABI passed dev");
    for expected in [
        "CR_PLUGIN_HOOK__MAX: gpucr says 12",
        "CR_PLUGIN_HOOK__RESTORE_EXT_FILE_t: gpucr's hook is int (int)",
        "sizeof(cr_plugin_desc_t): gpucr says 128",
    ] {
        assert!(err.contains(expected), "no `{expected}` in:\n{err}");
    }
}
