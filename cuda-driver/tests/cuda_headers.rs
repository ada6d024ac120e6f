//! gpucr's CUDA declarations against NVIDIA's own `cuda.h` and `cudaTypedefs.h`, of every
//! CUDA version gpucr supports (12.8 to 13.5, `scripts/fetch-cuda-headers.sh`).
//!
//! For each version, the layout `ArgsLayout::from_driver_version(CUDA_VERSION)` selects
//! is compared with the header, fact by fact (`gpucr_cuda_driver::header_facts`): a
//! generated C program prints every struct's size and alignment, every field's offset
//! and size, every typedef's size, every enum value, whether each function's
//! `PFN_<name>_v<version>` is the type gpucr calls it as
//! (`__builtin_types_compatible_p`), and each parameter's size, signedness and
//! pointee size; each value must equal gpucr's. The structs' field names must be
//! those of the header, in order, and what a version does not have (a struct, an
//! enumerator, a function) must be absent from its header.
//!
//! Headers missing from the cache are fetched first; when that fails the test fails,
//! unless `GPUCR_TESTS_MAY_SKIP` names `cuda-headers`.

#[path = "common/cuda_h.rs"]
mod cuda_h;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use cuda_h::Header;
use gpucr_cuda_driver::header_facts::{self, Function};
use gpucr_cuda_driver::layout::{ArgsLayout, MIN_DRIVER_VERSION};

/// A value the C program prints (`key value`) and the one gpucr expects.
struct Check {
    key: String,
    c_expr: String,
    expected: i128,
}

/// Everything to check in one header: the program's checks, and what was found wrong
/// without compiling (names, absences).
struct Plan {
    checks: Vec<Check>,
    problems: Vec<String>,
}

impl Plan {
    fn check(&mut self, key: String, c_expr: String, expected: i128) {
        self.checks.push(Check {
            key,
            c_expr,
            expected,
        });
    }
}

fn plan(header: &Header, layout: ArgsLayout) -> Plan {
    let mut p = Plan {
        checks: Vec::new(),
        problems: Vec::new(),
    };
    let v = header.cuda_version;

    for s in header_facts::structs(layout) {
        let name = s.name;
        match cuda_h::struct_fields(&header.cuda_h, name) {
            None => p.problems.push(format!(
                "{name}: gpucr's {layout:?} layout has it, cuda.h does not"
            )),
            Some(c_fields) => {
                let c_names: Vec<&str> = c_fields.iter().map(|f| f.name.as_str()).collect();
                let rust_names: Vec<&str> = s.fields.iter().map(|f| f.name).collect();
                if c_names != rust_names {
                    p.problems.push(format!(
                        "{name}: cuda.h has the fields {c_names:?}, gpucr's {layout:?} layout {rust_names:?}"
                    ));
                }
            }
        }
        p.check(
            format!("sizeof({name})"),
            format!("sizeof({name})"),
            s.size as i128,
        );
        p.check(
            format!("_Alignof({name})"),
            format!("_Alignof({name})"),
            s.align as i128,
        );
        for f in &s.fields {
            let field = f.name;
            p.check(
                format!("offsetof({name}, {field})"),
                format!("offsetof({name}, {field})"),
                f.offset as i128,
            );
            p.check(
                format!("sizeof({name}.{field})"),
                format!("sizeof((({name} *)0)->{field})"),
                f.size as i128,
            );
        }
    }
    for name in header_facts::absent_structs(layout) {
        if cuda_h::has_struct(&header.cuda_h, name) {
            p.problems.push(format!(
                "{name}: cuda.h declares it, gpucr's {layout:?} layout (chosen for {v}) does not use it"
            ));
        }
    }

    for (name, size, since) in header_facts::typedefs() {
        if v >= since {
            p.check(
                format!("sizeof({name})"),
                format!("sizeof({name})"),
                size as i128,
            );
        } else if header.cuda_h.contains(name) {
            p.problems.push(format!(
                "{name}: gpucr says it appears in CUDA {since}, but the {v} header has it"
            ));
        }
    }

    for c in header_facts::constants() {
        if v >= c.since {
            p.check(c.name.to_string(), c.name.to_string(), i128::from(c.value));
        } else if header.cuda_h.contains(c.name) {
            p.problems.push(format!(
                "{}: gpucr says it appears in CUDA {}, but the {v} header has it",
                c.name, c.since
            ));
        }
    }

    for (i, f) in header_facts::functions().iter().enumerate() {
        plan_function(&mut p, header, i, f);
    }
    p
}

fn plan_function(p: &mut Plan, header: &Header, i: usize, f: &Function) {
    let v = header.cuda_version;
    let versions = cuda_h::pfn_versions(&header.typedefs, f.name);
    let first = versions.first().copied();
    let declared = cuda_h::declares_function(&header.cuda_h, f.name);
    // cuda.h declares a function from the first version that has an ABI of it.
    if declared != first.is_some_and(|first| first <= v) {
        p.problems.push(format!(
            "{}: cuda.h {} it, cudaTypedefs.h has the ABIs {versions:?}",
            f.name,
            if declared {
                "declares"
            } else {
                "does not declare"
            }
        ));
    }
    if v < f.version {
        if versions.contains(&f.version) {
            p.problems.push(format!(
                "{}: gpucr says its ABI {} is newer than CUDA {v}, whose header has it",
                f.name, f.version
            ));
        }
        return;
    }
    if !versions.contains(&f.version) {
        p.problems.push(format!(
            "{}: gpucr requests it at {}, but cudaTypedefs.h of {v} has the ABIs {versions:?} \
             (PFN_{}_v<N>)",
            f.name, f.version, f.name
        ));
        return;
    }
    let pfn = format!("PFN_{}_v{}", f.name, f.version);
    let sig = &f.signature;
    p.check(
        format!("{pfn} is {}", sig.rust),
        format!(
            "__builtin_types_compatible_p({pfn}, {})",
            sig.c_pointer_type()
        ),
        1,
    );
    for (j, param) in sig.params.iter().enumerate() {
        let t = param.c_type;
        let key = format!("fn{i} {pfn} param {j} ({t})");
        p.check(
            format!("{key} size"),
            format!("sizeof({t})"),
            param.size as i128,
        );
        match param.signed {
            // C enums are as signed as the compiler likes; only their size matters.
            Some(_) if cuda_h::is_enum(&header.cuda_h, t) => {}
            Some(signed) => p.check(
                format!("{key} signed"),
                format!("(({t})-1 < ({t})0)"),
                i128::from(signed),
            ),
            None => {
                if let Some(pointee) = param.pointee_size {
                    p.check(
                        format!("{key} pointee size"),
                        format!("sizeof(*({t})0)"),
                        pointee as i128,
                    );
                }
            }
        }
    }
}

fn program(checks: &[Check]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\n#include <cudaTypedefs.h>\n\
         int main(void) {\n    printf(\"CUDA_VERSION %lld\\n\", (long long)CUDA_VERSION);\n",
    );
    for (i, check) in checks.iter().enumerate() {
        writeln!(
            c,
            "    printf(\"{i} %lld\\n\", (long long)({}));",
            check.c_expr
        )
        .unwrap();
    }
    c.push_str("    return 0;\n}\n");
    c
}

fn run(scratch: &Path, header: &Header) -> (usize, Vec<String>) {
    let layout = ArgsLayout::from_driver_version(header.cuda_version).unwrap_or_else(|e| {
        panic!(
            "CUDA {} ({}) is a supported version, but gpucr refuses it: {e}",
            header.wheel, header.cuda_version
        )
    });
    let Plan {
        checks,
        mut problems,
    } = plan(header, layout);
    let stdout = cuda_h::compile_and_run(scratch, header, &program(&checks));
    let mut printed = BTreeMap::new();
    for line in stdout.lines() {
        let (key, value) = line.split_once(' ').expect("a line is \"key value\"");
        printed.insert(key.to_string(), value.parse::<i128>().expect("a number"));
    }
    if printed.get("CUDA_VERSION") != Some(&i128::from(header.cuda_version)) {
        problems.push(format!(
            "CUDA_VERSION is {:?}, the fetch script lists {}",
            printed.get("CUDA_VERSION"),
            header.cuda_version
        ));
    }
    for (i, check) in checks.iter().enumerate() {
        match printed.get(&i.to_string()) {
            Some(v) if *v == check.expected => {}
            Some(v) => problems.push(format!(
                "{}: cuda.h says {v}, gpucr says {}",
                check.key, check.expected
            )),
            None => problems.push(format!("{}: not printed", check.key)),
        }
    }
    println!(
        "CUDA {} ({}), layout {layout:?}: {} values checked, {} wrong",
        header.wheel,
        header.cuda_version,
        checks.len(),
        problems.len()
    );
    (checks.len(), problems)
}

#[test]
fn cuda_declarations_match_every_supported_cuda_h() {
    let Some(headers) = cuda_h::headers() else {
        return;
    };
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_headers");
    let mut all = Vec::new();
    let mut total = 0;
    for header in &headers {
        let (n, problems) = run(&scratch, header);
        total += n;
        all.extend(
            problems
                .into_iter()
                .map(|p| format!("CUDA {}: {p}", header.wheel)),
        );
    }
    // The oldest header is the oldest driver gpucr accepts, and every layout is used.
    assert_eq!(headers[0].cuda_version, MIN_DRIVER_VERSION);
    let layouts: std::collections::BTreeSet<ArgsLayout> = headers
        .iter()
        .filter_map(|h| ArgsLayout::from_driver_version(h.cuda_version).ok())
        .collect();
    assert_eq!(layouts.len(), 4, "every layout is checked against a header");
    println!("{total} values checked in {} headers", headers.len());
    assert!(
        all.is_empty(),
        "{} differences between gpucr and cuda.h:\n  {}",
        all.len(),
        all.join("\n  ")
    );
}
