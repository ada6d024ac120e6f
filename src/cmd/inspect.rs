//! `gpucr inspect DIR|ARCHIVE`: collect the report, verify if asked, print it.

use std::path::Path;
use std::sync::Arc;

use super::common::print_out;
use crate::archive::{self, ScanOptions};
use crate::cli::InspectArgs;
use crate::exit_code;
use crate::image::dir::ImagePath;
use crate::image::manifest::Manifest;
use crate::image::verify::default_threads;
use crate::inspect::model::{ArchiveInfo, Report, ReportError, VerifyReport};
use crate::inspect::{self, text, ImageSource, InspectError, Options, Status, Views};

pub fn run(args: &InspectArgs) -> Result<u8, crate::cmd::Failure> {
    let found = if ImagePath::of(&args.dir) == ImagePath::File {
        inspect_archive(&args.dir, args)?
    } else {
        inspect_dir(&args.dir, args)
    };
    let (mut report, verdict) = match found {
        Ok(found) => found,
        Err(e) => {
            crate::errln!("gpucr: error: {e}");
            return Ok(e.exit_code());
        }
    };
    let code = match &verdict {
        Some((status, result)) => {
            report.verify = Some(result.clone());
            status.exit_code()
        }
        None if !report.errors.is_empty() => {
            if report.image.complete || report.image.manifest_damaged {
                exit_code::IMAGE_DAMAGED
            } else {
                exit_code::IMAGE_INCOMPLETE
            }
        }
        None => exit_code::SUCCESS,
    };
    // Rendered whole, then written at once (the JSON has thousands of lines).
    let rendered = if args.output.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else if let (Some((status, _)), Some(result)) = (verdict, &report.verify) {
        text::render_verify(&report, result, status)
    } else {
        text::render(&report, &views(args))
    };
    print_out(rendered)?;
    if !args.output.json && report.verify.is_none() {
        for e in &report.errors {
            crate::errln!("gpucr: error: {}", e.message);
        }
    }
    Ok(code)
}

type Inspected = (Report, Option<(Status, VerifyReport)>);

/// `gpucr inspect DIR`.
fn inspect_dir(dir: &Path, args: &InspectArgs) -> Result<Inspected, InspectError> {
    // CRIU's pagemaps count pages of the dumping host; its page size is in the manifest
    // (the inspecting host's is the fallback for an image without one).
    let page_size = Manifest::read(dir)
        .ok()
        .map(|m| m.host.page_size)
        .filter(|&size| size > 0)
        .unwrap_or_else(inspect::host_page_size);
    let opts = Options {
        pid: args.pid,
        page_size,
    };
    let report = inspect::collect(dir, &opts)?;
    let verdict = args
        .verify
        .then(|| inspect::verify::verify(dir, page_size, default_threads(), &report.errors));
    Ok((report, verdict))
}

/// `gpucr inspect ARCHIVE`: one streaming read (two when what a view needs comes after
/// the files it is needed for), nothing unpacked to disk.
fn inspect_archive(
    path: &Path,
    args: &InspectArgs,
) -> Result<Result<Inspected, InspectError>, crate::cmd::Failure> {
    let scan = archive::scan(
        path,
        &ScanOptions {
            verify: args.verify,
            page_size: inspect::host_page_size(),
        },
    )?;
    if scan.sizes.is_empty() {
        return Err(archive::ArchiveError::NoCheckpoint {
            path: path.to_path_buf(),
        }
        .into());
    }
    let source = ImageSource::archive(
        path.join(archive::CHECKPOINT_DIR),
        Arc::new(scan.files.clone()),
        scan.sizes.clone(),
    );
    let page_size = inspect::read_manifest(&source)
        .ok()
        .map(|m| m.host.page_size)
        .filter(|&size| size.is_power_of_two())
        .unwrap_or_else(inspect::host_page_size);
    let opts = Options {
        pid: args.pid,
        page_size,
    };
    let mut report = match inspect::collect_from(&source, &opts) {
        Ok(report) => report,
        Err(e) => return Ok(Err(e)),
    };
    for e in &mut report.errors {
        name_in_archive(e);
    }
    report.image.dir = path.display().to_string();
    let (mut container, unreadable) =
        archive::container_info(scan.config_dump.as_deref(), scan.spec_dump.as_deref());
    // A damaged container description damages the archive; the rest is still shown.
    report.errors.extend(unreadable.iter().map(|e| ReportError {
        file: e.file().to_owned(),
        offset: None,
        message: e.to_string(),
    }));
    container.checkpoint_size = checkpoint_size(&scan);
    report.container = Some(container);
    report.archive = Some(ArchiveInfo {
        path: path.display().to_string(),
        compression: scan.compression.name().into(),
        reads: scan.reads,
        members: scan.members.clone(),
    });
    let verdict = args
        .verify
        .then(|| inspect::verify::verify_archive(&scan, &source, page_size, &report.errors));
    Ok(Ok((report, verdict)))
}

/// A view error names its file below `checkpoint/`; in an archive it is named as the
/// archive names it.
fn name_in_archive(e: &mut ReportError) {
    let named = format!("{}/{}", archive::CHECKPOINT_DIR, e.file);
    if let Some(rest) = e.message.strip_prefix(e.file.as_str()) {
        e.message = format!("{named}{rest}");
    }
    e.file = named;
}

fn checkpoint_size(scan: &archive::Scan) -> archive::CheckpointSize {
    let mut size = archive::CheckpointSize::default();
    for (name, bytes) in &scan.sizes {
        size.total_size += bytes;
        if name.starts_with("pages-") && name.ends_with(".img") {
            size.memory_pages_size += bytes;
        } else if name.starts_with("gpu/") {
            size.gpu_memory_size += bytes;
        }
    }
    size.root_fs_diff_size = scan
        .members
        .iter()
        .find(|m| m.name == archive::ROOTFS_DIFF)
        .map(|m| m.size)
        .unwrap_or(0);
    size
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
