//! The library's inner boundaries, kept honest without splitting it into more crates
//! (a split did not shorten the builds: docs/benchmarks.md, "Build times"). The
//! transfer engine, the CRIU client, the cancellation token and the fd waits use only
//! the leaf modules listed here; a new `crate::` import across one of these lines fails
//! this test, which names the file and the module.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The modules of the crate a module's files may name (`crate::X`; `errln` is the
/// crate's macro for messages on stderr).
const BOUNDARIES: &[(&str, &[&str])] = &[
    ("transfer", &["cancel", "exit_code", "niceness", "units"]),
    (
        "criu",
        &[
            "cancel",
            "errln",
            "exit_code",
            "interrupt",
            "progress",
            "wait",
        ],
    ),
    ("cancel.rs", &[]),
    ("wait", &[]),
    ("interrupt.rs", &["cancel"]),
    // Migration sits on top: it drives a dump, a restore and a verification, and
    // nothing of the library uses it (`nothing_uses_migrate`).
    (
        "migrate",
        &[
            "dump",
            "exit_code",
            "gpu",
            "guard",
            "image",
            "inspect",
            "interrupt",
            "lazy",
            "progress",
            "restore",
            "restore_guard",
            "target",
            "transfer",
            "units",
            "wait",
        ],
    ),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The `crate::X` names in `text`, outside comments.
fn crate_modules(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` lists are split too.
            if name.is_empty() && after.starts_with('{') {
                let list = after[1..].split('}').next().unwrap_or("");
                for item in list.split(',') {
                    let item = item.trim().split("::").next().unwrap_or("").trim();
                    if !item.is_empty() {
                        found.insert(item.to_owned());
                    }
                }
            } else if !name.is_empty() {
                found.insert(name);
            }
            rest = after;
        }
    }
    found
}

#[test]
fn the_leaf_modules_import_only_what_their_boundary_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut crossings = Vec::new();
    for (module, allowed) in BOUNDARIES {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        assert!(!files.is_empty(), "no source files for {module}");
        let own = module.trim_end_matches(".rs");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for used in crate_modules(&text) {
                if used != own && !allowed.contains(&used.as_str()) {
                    crossings.push(format!(
                        "{} uses crate::{used} ({module} may use only {allowed:?})",
                        file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(crossings.is_empty(), "{}", crossings.join("\n"));
}

#[test]
fn a_crossing_is_found_in_paths_and_lists_but_not_in_comments() {
    let text = "use crate::cancel::Cancel;\nuse crate::{units, gpu::Backend};\n\
                // crate::helper is only named here\nlet x = crate::image::dir::f();\n";
    let found: Vec<String> = crate_modules(text).into_iter().collect();
    assert_eq!(found, ["cancel", "gpu", "image", "units"]);
}

/// The rest of the library never imports migration (it is the command line's to call).
#[test]
fn nothing_uses_migrate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let users: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("migrate")))
        .filter(|f| crate_modules(&std::fs::read_to_string(f).unwrap()).contains("migrate"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(users.is_empty(), "{users:?}");
}
