//! `gpucr inspect DIR`: collect the report, verify if asked, print it.

use std::io::{self, Write};

use crate::cli::InspectArgs;
use crate::exit_code;
use crate::image::manifest::Manifest;
use crate::image::verify::default_threads;
use crate::inspect::{self, text, Options, Views};

pub fn run(args: &InspectArgs) -> anyhow::Result<u8> {
    // CRIU's pagemaps count pages of the dumping host; its page size is in the manifest
    // (the inspecting host's is the fallback for an image without one).
    let page_size = Manifest::read(&args.dir)
        .ok()
        .map(|m| m.host.page_size)
        .filter(|&size| size > 0)
        .unwrap_or_else(inspect::host_page_size);
    let opts = Options {
        pid: args.pid,
        page_size,
    };
    let mut report = match inspect::collect(&args.dir, &opts) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("gpucr: error: {e}");
            return Ok(e.exit_code());
        }
    };
    let mut verdict = None;
    let code = if args.verify {
        let (status, result) =
            inspect::verify::verify(&args.dir, page_size, default_threads(), &report.errors);
        report.verify = Some(result);
        verdict = Some(status);
        status.exit_code()
    } else if !report.errors.is_empty() {
        if report.image.complete {
            exit_code::IMAGE_DAMAGED
        } else {
            exit_code::IMAGE_INCOMPLETE
        }
    } else {
        exit_code::SUCCESS
    };
    // Buffered: stdout is line-buffered, and the JSON has thousands of lines.
    let mut out = io::BufWriter::with_capacity(1 << 16, io::stdout().lock());
    if args.output.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else if let (Some(status), Some(result)) = (verdict, &report.verify) {
        out.write_all(text::render_verify(&report, result, status).as_bytes())?;
    } else {
        out.write_all(text::render(&report, &views(args)).as_bytes())?;
        for e in &report.errors {
            eprintln!("gpucr: error: {}", e.message);
        }
    }
    out.flush()?;
    Ok(code)
}

fn views(args: &InspectArgs) -> Views {
    if args.all {
        return Views::all();
    }
    Views {
        cmdline: args.ps_tree_cmd,
        environment: args.ps_tree_env,
        files: args.files,
        sockets: args.sockets,
        mounts: args.mounts,
        memory: args.memory,
        gpu: args.gpu,
        stats: args.stats,
    }
}
