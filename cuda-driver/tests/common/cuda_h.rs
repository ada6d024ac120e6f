//! The real CUDA headers of every version gpucr supports, for the header tests of
//! `gpucr-cuda-driver` (`tests/cuda_headers.rs`) and `gpucr-fake-cuda` (`tests/cuda_h.rs`,
//! which includes this file by path).
//!
//! `scripts/fetch-cuda-headers.sh` lists the versions and keeps `cuda.h` and
//! `cudaTypedefs.h` of each in its cache (`GPUCR_CUDA_HEADERS_DIR`, default
//! `/var/cache/gpucr/cuda-headers`); [`headers`] runs it (it only downloads what is
//! missing and verifies every header's sha256) and reads them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cache the fetch script fills, as the script chooses it.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("GPUCR_CUDA_HEADERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/gpucr/cuda-headers"))
}

/// The repository's root (both crates are one level below it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the repository")
        .to_path_buf()
}

fn fetch_script() -> PathBuf {
    repo_root().join("scripts/fetch-cuda-headers.sh")
}

/// One CUDA version's headers.
#[derive(Debug)]
pub struct Header {
    /// `CUDA_VERSION` (13050).
    pub cuda_version: i32,
    /// The wheel's version (13.5.37), the cache's directory name.
    pub wheel: String,
    /// The directory holding `cuda.h` and `cudaTypedefs.h`.
    pub dir: PathBuf,
    /// `cuda.h`.
    pub cuda_h: String,
    /// `cudaTypedefs.h`.
    pub typedefs: String,
}

/// Every supported version's headers, oldest first, fetched first where missing. `None`
/// when they cannot be fetched and `GPUCR_TESTS_MAY_SKIP` names `cuda-headers` (the test
/// is then listed as not run, `gpucr_abi::testing::require`); a failure otherwise.
pub fn headers() -> Option<Vec<Header>> {
    let script = fetch_script();
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let why = format!(
        "{} failed (the CUDA headers are fetched from PyPI; cache {}):\n{}",
        script.display(),
        cache_dir().display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // Fails here unless GPUCR_TESTS_MAY_SKIP names cuda-headers; then the test is listed
    // as not run.
    if !gpucr_abi::testing::require("cuda-headers", out.status.success(), &why) {
        return None;
    }
    let list = Command::new("bash")
        .arg(&script)
        .arg("--list")
        .output()
        .expect("run the fetch script's --list");
    assert!(list.status.success(), "{} --list failed", script.display());
    let list = String::from_utf8(list.stdout).expect("--list prints text");
    let mut headers = Vec::new();
    for line in list.lines() {
        let (version, wheel) = line
            .split_once(' ')
            .expect("--list prints \"CUDA_VERSION wheel-version\"");
        let dir = cache_dir().join(wheel);
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
        };
        headers.push(Header {
            cuda_version: version.parse().expect("CUDA_VERSION is a number"),
            wheel: wheel.to_string(),
            cuda_h: read("cuda.h"),
            typedefs: read("cudaTypedefs.h"),
            dir,
        });
    }
    assert!(!headers.is_empty(), "the fetch script lists no versions");
    Some(headers)
}

/// The C compiler (`CC`, else `cc`).
pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// Compiles `program` against `header`'s directory in `scratch` and runs it; its
/// standard output.
pub fn compile_and_run(scratch: &Path, header: &Header, program: &str) -> String {
    std::fs::create_dir_all(scratch).expect("create the scratch directory");
    let src = scratch.join(format!("check-{}.c", header.wheel));
    let exe = scratch.join(format!("check-{}", header.wheel));
    std::fs::write(&src, program).expect("write the C program");
    let out = Command::new(cc())
        .arg(format!("-I{}", header.dir.display()))
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("no C compiler `{}` ({e}); Debian: gcc", cc()));
    assert!(
        out.status.success(),
        "the check program {} does not compile against CUDA {} ({}); a name gpucr uses is \
         missing from cuda.h or differs in kind:\n{}",
        src.display(),
        header.wheel,
        header.dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run the check program");
    assert!(out.status.success(), "{} failed", exe.display());
    String::from_utf8(out.stdout).expect("the program prints text")
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The body of `typedef struct <name>_st { ... } <name>;` without comments, or `None`
/// when the header does not declare the struct.
fn struct_body(cuda_h: &str, name: &str) -> Option<String> {
    let open = format!("typedef struct {name}_st {{");
    let start = cuda_h.find(&open)? + open.len();
    let close = format!("}} {name};");
    let end = start + cuda_h[start..].find(&close)?;
    Some(strip_comments(&cuda_h[start..end]))
}

/// Whether `cuda.h` declares `typedef struct <name>_st { ... } <name>;`.
pub fn has_struct(cuda_h: &str, name: &str) -> bool {
    struct_body(cuda_h, name).is_some()
}

/// One field declaration of a struct: `CUcheckpointGpuPair *gpuPairs` is
/// (`CUcheckpointGpuPair *`, `gpuPairs`, no array).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CField {
    /// The type, as written (pointer stars included, array bounds not).
    pub c_type: String,
    /// The field name.
    pub name: String,
    /// Whether it is an array (`reserved[52]`).
    pub array: bool,
}

/// The fields of `typedef struct <name>_st`, in order, read from the header's text.
pub fn struct_fields(cuda_h: &str, name: &str) -> Option<Vec<CField>> {
    let body = struct_body(cuda_h, name)?;
    let mut fields = Vec::new();
    for decl in body.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        if decl.is_empty() {
            continue;
        }
        let (head, array) = match decl.find('[') {
            Some(i) => (decl[..i].trim_end(), true),
            None => (decl.as_str(), false),
        };
        let split = head
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (c_type, name) = head.split_at(split);
        assert!(!name.is_empty(), "cannot read the field `{decl}`");
        fields.push(CField {
            c_type: c_type.trim().to_string(),
            name: name.to_string(),
            array,
        });
    }
    Some(fields)
}

/// Whether `name` is a C enum type of the header (`typedef enum ... } name;`), whose
/// signedness the compiler chooses.
pub fn is_enum(cuda_h: &str, name: &str) -> bool {
    let close = format!("}} {name};");
    let Some(end) = cuda_h.find(&close) else {
        return false;
    };
    cuda_h[..end]
        .rfind("typedef ")
        .is_some_and(|i| cuda_h[i..].starts_with("typedef enum"))
}

/// The ABI versions `cudaTypedefs.h` declares of `name`: `PFN_<name>_v<N>`, ascending.
pub fn pfn_versions(typedefs: &str, name: &str) -> Vec<i32> {
    let prefix = format!("(CUDAAPI *PFN_{name}_v");
    let mut out: Vec<i32> = typedefs
        .match_indices(&prefix)
        .filter_map(|(i, _)| {
            let rest = &typedefs[i + prefix.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (rest[digits.len()..].starts_with(')')).then(|| digits.parse().ok())?
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The parameter list of `PFN_<name>_v<version>` as written in `cudaTypedefs.h`
/// (`CUdeviceptr_v2 *dptr, size_t bytesize`).
pub fn pfn_params(typedefs: &str, name: &str, version: i32) -> Option<String> {
    let marker = format!("(CUDAAPI *PFN_{name}_v{version})(");
    let start = typedefs.find(&marker)? + marker.len();
    let end = start + typedefs[start..].find(");")?;
    Some(
        typedefs[start..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Whether `cuda.h` declares the function `name` (`CUresult CUDAAPI name(`).
pub fn declares_function(cuda_h: &str, name: &str) -> bool {
    cuda_h.contains(&format!("CUDAAPI {name}("))
}
