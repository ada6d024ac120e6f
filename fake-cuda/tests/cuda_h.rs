//! `src/cuda_h.rs`, the fake driver's view of the CUDA driver API, is generated from
//! NVIDIA's `cuda.h` and `cudaTypedefs.h` of every supported version
//! (`scripts/fetch-cuda-headers.sh`): this test generates it again from the cached
//! headers and fails when the committed file differs. `GPUCR_WRITE_CUDA_H=1` writes it
//! instead.
//!
//! The field names and types come from the headers' text, the sizes and offsets from a
//! C program compiled against each header, the function pointer types from the
//! `PFN_<name>_v<version>` typedefs, so the fake decodes its arguments as the real
//! driver of each version would, independently of gpucr's own declarations.

#[path = "../../cuda-driver/tests/common/cuda_h.rs"]
mod cuda_h;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use cuda_h::Header;

/// The checkpoint API's structs, as far as each header has them.
const STRUCTS: &[&str] = &[
    "CUcheckpointLockArgs",
    "CUcheckpointCheckpointArgs",
    "CUcheckpointRestoreArgs",
    "CUcheckpointUnlockArgs",
    "CUcheckpointGpuPair",
    "CUcheckpointCustomStorageInfo",
    "CUcheckpointCustomStoragePerDeviceData",
];

/// The ABIs the fake exports: (name, version of the `PFN_` typedef).
const ABIS: &[(&str, i32)] = &[
    ("cuInit", 2000),
    ("cuDriverGetVersion", 2020),
    ("cuGetErrorName", 6000),
    ("cuGetProcAddress", 11030),
    ("cuGetProcAddress", 12000),
    ("cuDeviceGetCount", 2000),
    ("cuDeviceGet", 2000),
    ("cuDeviceGetUuid", 9020),
    ("cuDeviceGetUuid", 11040),
    ("cuDevicePrimaryCtxRetain", 7000),
    ("cuCtxSetCurrent", 4000),
    ("cuCtxSynchronize", 2000),
    ("cuMemAlloc", 3020),
    ("cuMemFree", 3020),
    ("cuMemcpyHtoD", 3020),
    ("cuMemcpyDtoH", 3020),
    ("cuCheckpointProcessLock", 12080),
    ("cuCheckpointProcessCheckpoint", 12080),
    ("cuCheckpointProcessRestore", 12080),
    ("cuCheckpointProcessUnlock", 12080),
    ("cuCheckpointProcessGetState", 12080),
    ("cuCheckpointProcessGetRestoreThreadId", 12080),
    ("cuCheckpointOperationComplete", 13040),
];

/// A C parameter type of those functions, as a Rust type, and the C expression whose
/// size must equal the Rust type's (checked by the compiled program).
fn rust_type(c: &str) -> &'static str {
    match c {
        "unsigned int" => "c_uint",
        "int" | "CUdevice" | "CUdevice_v1" => "c_int",
        "CUresult" => "CUresult",
        "int *"
        | "CUdevice *"
        | "CUdevice_v1 *"
        | "CUdriverProcAddressQueryResult *"
        | "CUprocessState *" => "*mut c_int",
        "const char *" => "*const c_char",
        "const char **" => "*mut *const c_char",
        "void **" | "CUcontext *" => "*mut *mut c_void",
        "void *" | "CUcontext" | "CUcheckpointOperationHandle" => "*mut c_void",
        "const void *" => "*const c_void",
        "cuuint64_t" | "CUdeviceptr" | "CUdeviceptr_v2" => "u64",
        "CUdeviceptr *" | "CUdeviceptr_v2 *" => "*mut u64",
        "size_t" => "usize",
        "CUuuid *" => "*mut CUuuid",
        // The argument structs are read by the layout of the version asked for.
        "CUcheckpointLockArgs *"
        | "CUcheckpointCheckpointArgs *"
        | "CUcheckpointRestoreArgs *"
        | "CUcheckpointUnlockArgs *" => "*mut c_void",
        other => panic!("no Rust type for the C parameter type `{other}`: add one"),
    }
}

/// The size of a Rust type of [`rust_type`] on this (LP64) target.
fn rust_size(r: &str) -> usize {
    match r {
        "c_uint" | "c_int" | "CUresult" => 4,
        _ => 8,
    }
}

/// Splits a parameter (`CUdeviceptr_v2 *dptr`) into its type (`CUdeviceptr_v2 *`).
fn param_type(param: &str) -> String {
    let param = param.trim();
    let split = param
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let (ty, name) = param.split_at(split);
    let ty = ty.trim();
    // `void` alone, or a parameter without a name.
    if ty.is_empty() || name.is_empty() {
        return param.to_string();
    }
    ty.to_string()
}

struct Layout {
    name: &'static str,
    size: usize,
    fields: Vec<(String, usize, usize)>,
}

/// The structs of one header, with sizes and offsets from the compiler.
fn layouts(scratch: &Path, header: &Header) -> (Vec<Layout>, BTreeMap<String, i128>) {
    let mut exprs: Vec<(String, String)> = vec![
        ("sizeof(CUuuid)".into(), "sizeof(CUuuid)".into()),
        ("sizeof(CUresult)".into(), "sizeof(CUresult)".into()),
    ];
    let mut parsed = Vec::new();
    for name in STRUCTS {
        let Some(fields) = cuda_h::struct_fields(&header.cuda_h, name) else {
            continue;
        };
        exprs.push((format!("sizeof({name})"), format!("sizeof({name})")));
        for f in &fields {
            let field = &f.name;
            exprs.push((
                format!("offsetof({name}, {field})"),
                format!("offsetof({name}, {field})"),
            ));
            exprs.push((
                format!("sizeof({name}.{field})"),
                format!("sizeof((({name} *)0)->{field})"),
            ));
        }
        parsed.push((*name, fields));
    }
    for (name, version) in ABIS {
        if let Some(params) = cuda_h::pfn_params(&header.typedefs, name, *version) {
            for p in params.split(',') {
                let t = param_type(p);
                if t != "void" {
                    exprs.push((format!("sizeof({t})"), format!("sizeof({t})")));
                }
            }
        }
    }
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\n#include <cudaTypedefs.h>\n\
         int main(void) {\n",
    );
    for (key, expr) in &exprs {
        writeln!(
            c,
            "    printf(\"%s\\t%lld\\n\", \"{key}\", (long long)({expr}));"
        )
        .unwrap();
    }
    c.push_str("    return 0;\n}\n");
    let out = cuda_h::compile_and_run(scratch, header, &c);
    let values: BTreeMap<String, i128> = out
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').expect("key\\tvalue");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    let get = |k: &str| -> usize {
        usize::try_from(*values.get(k).unwrap_or_else(|| panic!("{k} not printed")))
            .expect("a size")
    };
    let layouts = parsed
        .into_iter()
        .map(|(name, fields)| Layout {
            name,
            size: get(&format!("sizeof({name})")),
            fields: fields
                .iter()
                .map(|f| {
                    (
                        f.name.clone(),
                        get(&format!("offsetof({name}, {})", f.name)),
                        get(&format!("sizeof({name}.{})", f.name)),
                    )
                })
                .collect(),
        })
        .collect();
    (layouts, values)
}

fn render(scratch: &Path, headers: &[Header]) -> String {
    let mut out = String::new();
    out.push_str(
        "//! The CUDA driver API as NVIDIA's headers declare it, for the fake driver: the\n\
         //! checkpoint API's structs of every supported CUDA version (field names, offsets,\n\
         //! sizes), the ABI versions of each function the fake exports, and their function\n\
         //! pointer types.\n\
         //!\n\
         //! Generated by `fake-cuda/tests/cuda_h.rs` from `cuda.h` and `cudaTypedefs.h` of\n\
         //! NVIDIA's runtime wheels (`scripts/fetch-cuda-headers.sh`); do not edit.\n\
         //! `GPUCR_WRITE_CUDA_H=1 cargo test -p gpucr-fake-cuda --test cuda_h` rewrites it.\n\
         \n\
         #![allow(non_camel_case_types, dead_code)]\n\
         \n\
         use std::ffi::{c_char, c_int, c_uint, c_void};\n\
         \n",
    );
    let computed: Vec<(Vec<Layout>, BTreeMap<String, i128>)> =
        headers.iter().map(|h| layouts(scratch, h)).collect();
    let of = |h: &Header| {
        let i = headers
            .iter()
            .position(|x| x.wheel == h.wheel)
            .expect("one of the headers");
        &computed[i]
    };
    let newest = headers.last().expect("at least one header");
    let (_, values) = of(newest);
    let cu_result = values["sizeof(CUresult)"];
    assert_eq!(cu_result, 4, "CUresult is int-sized");
    out.push_str("/// `CUresult`: an int-sized enum.\npub type CUresult = c_int;\n\n");
    let uuid = cuda_h::struct_fields(&newest.cuda_h, "CUuuid").expect("cuda.h declares CUuuid");
    assert_eq!(
        uuid.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["bytes"]
    );
    writeln!(
        out,
        "/// `CUuuid`: `char bytes[{n}]`.\n#[repr(C)]\n#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]\n\
         pub struct CUuuid {{\n    /// `bytes`.\n    pub bytes: [u8; {n}],\n}}\n",
        n = values["sizeof(CUuuid)"]
    )
    .unwrap();

    // The function pointer types, from the newest header that declares each ABI; every
    // header that declares it must agree.
    for (name, version) in ABIS {
        let texts: Vec<(String, &Header)> = headers
            .iter()
            .filter_map(|h| cuda_h::pfn_params(&h.typedefs, name, *version).map(|p| (p, h)))
            .collect();
        let (params, from) = texts
            .last()
            .unwrap_or_else(|| panic!("no header declares PFN_{name}_v{version}"));
        for (p, h) in &texts {
            assert_eq!(
                p, params,
                "PFN_{name}_v{version} differs between CUDA {} and {}",
                h.wheel, from.wheel
            );
        }
        let (_, values) = of(from);
        let rust: Vec<&str> = if params == "void" {
            Vec::new()
        } else {
            params
                .split(',')
                .map(|p| {
                    let t = param_type(p);
                    let r = rust_type(&t);
                    let c_size = values[&format!("sizeof({t})")];
                    assert_eq!(
                        c_size,
                        rust_size(r) as i128,
                        "`{t}` of PFN_{name}_v{version} is {c_size} bytes, its Rust type {r} is not"
                    );
                    r
                })
                .collect()
        };
        writeln!(
            out,
            "/// `PFN_{name}_v{version}`: `CUresult ({params})`.\n\
             pub type PFN_{name}_v{version} = unsafe extern \"C\" fn({}) -> CUresult;",
            rust.join(", ")
        )
        .unwrap();
    }
    out.push('\n');

    out.push_str(
        "/// A field of a struct: its name in `cuda.h`, offset and size.\n\
         #[derive(Debug)]\npub struct Field {\n    pub name: &'static str,\n    \
         pub offset: usize,\n    pub size: usize,\n}\n\n\
         /// A struct of `cuda.h`.\n#[derive(Debug)]\npub struct Struct {\n    \
         pub name: &'static str,\n    pub size: usize,\n    pub fields: &'static [Field],\n}\n\n\
         /// A function and the versions of its ABIs (`PFN_<name>_v<version>`).\n\
         #[derive(Debug)]\npub struct Function {\n    pub name: &'static str,\n    \
         pub versions: &'static [i32],\n}\n\n\
         /// One CUDA version's headers.\n#[derive(Debug)]\npub struct Header {\n    \
         /// `CUDA_VERSION`.\n    pub cuda_version: i32,\n    /// The wheel it came from.\n    \
         pub wheel: &'static str,\n    pub structs: &'static [Struct],\n    \
         pub functions: &'static [Function],\n}\n\n\
         /// Every supported version, oldest first.\npub const HEADERS: &[Header] = &[\n",
    );
    let mut names: Vec<&str> = ABIS.iter().map(|(n, _)| *n).collect();
    names.dedup();
    for h in headers {
        let (layouts, _) = of(h);
        writeln!(
            out,
            "    Header {{\n        cuda_version: {},\n        wheel: \"{}\",\n        structs: &[",
            h.cuda_version, h.wheel
        )
        .unwrap();
        for l in layouts {
            writeln!(
                out,
                "            Struct {{\n                name: \"{}\",\n                size: {},\n                fields: &[",
                l.name, l.size
            )
            .unwrap();
            for (name, offset, size) in &l.fields {
                writeln!(
                    out,
                    "                    Field {{\n                        name: \"{name}\",\n                        offset: {offset},\n                        size: {size},\n                    }},"
                )
                .unwrap();
            }
            out.push_str("                ],\n            },\n");
        }
        out.push_str("        ],\n        functions: &[\n");
        for name in &names {
            let versions = cuda_h::pfn_versions(&h.typedefs, name);
            if versions.is_empty() {
                continue;
            }
            let versions: Vec<String> = versions.iter().map(i32::to_string).collect();
            writeln!(
                out,
                "            Function {{\n                name: \"{name}\",\n                versions: &[{}],\n            }},",
                versions.join(", ")
            )
            .unwrap();
        }
        out.push_str("        ],\n    },\n");
    }
    out.push_str("];\n");
    rustfmt(&out)
}

/// `out` as rustfmt writes it, so the committed file passes `cargo fmt --check`.
fn rustfmt(out: &str) -> String {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2021", "--emit", "stdout"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run rustfmt");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(out.as_bytes())
        .expect("write to rustfmt");
    let done = child.wait_with_output().expect("rustfmt");
    assert!(
        done.status.success(),
        "rustfmt failed on the generated file"
    );
    String::from_utf8(done.stdout).expect("rustfmt prints text")
}

#[test]
fn cuda_h_rs_is_generated_from_the_headers() {
    let Some(headers) = cuda_h::headers() else {
        return;
    };
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake_cuda_h");
    let generated = render(&scratch, &headers);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda_h.rs");
    if std::env::var_os("GPUCR_WRITE_CUDA_H").is_some() {
        std::fs::write(&path, &generated).expect("write src/cuda_h.rs");
        println!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from what the CUDA headers give (first at line {}: committed {:?}, \
             generated {:?}); run GPUCR_WRITE_CUDA_H=1 cargo test -p gpucr-fake-cuda --test cuda_h",
            path.display(),
            first + 1,
            committed.lines().nth(first),
            generated.lines().nth(first)
        );
    }
}
