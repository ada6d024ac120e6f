//! `gpucr inspect --verify`: the manifest's checksums of every file, every GPU memory
//! chunk against the GPU index, then the structure of CRIU's images (framing, pagemaps
//! against pages files, the images each process needs), then whatever the views could
//! not read.

use std::path::Path;

use gpucr_criu_image::check::check_dir;
use gpucr_criu_image::{magic, ImageDir};

use super::model::{Problem, ReportError, VerifyReport};
use crate::image::verify::{verify_files, ProblemKind};
use crate::image::{dir as image_dir, Manifest, ManifestError, MANIFEST_FILE};

/// The outcome of a verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Intact,
    Damaged,
    Incomplete,
}

impl Status {
    pub fn name(&self) -> &'static str {
        match self {
            Status::Intact => "intact",
            Status::Damaged => "damaged",
            Status::Incomplete => "incomplete",
        }
    }

    /// The exit code `gpucr inspect --verify` returns.
    pub fn exit_code(&self) -> u8 {
        match self {
            Status::Intact => crate::exit_code::SUCCESS,
            Status::Damaged => crate::exit_code::IMAGE_DAMAGED,
            Status::Incomplete => crate::exit_code::IMAGE_INCOMPLETE,
        }
    }
}

/// Verify `dir`. `view_errors` are the errors met while reading the image for the views;
/// those not already found are added.
pub fn verify(
    dir: &Path,
    page_size: u64,
    threads: usize,
    view_errors: &[ReportError],
) -> (Status, VerifyReport) {
    let mut problems = Vec::new();
    let mut incomplete = false;
    let mut files_checked = 0;
    let mut bytes_checked = 0;
    let manifest = Manifest::read(dir);
    match &manifest {
        Ok(manifest) => {
            files_checked = manifest.files.len() as u64;
            bytes_checked = manifest.files.iter().map(|f| f.size).sum();
            match verify_files(dir, manifest, threads) {
                Ok(found) => problems.extend(found.iter().map(manifest_problem)),
                Err(e) => problems.push(problem(MANIFEST_FILE, None, "manifest", e.to_string())),
            }
        }
        Err(ManifestError::Missing { .. }) => {
            incomplete = true;
            problems.push(problem(
                MANIFEST_FILE,
                None,
                "incomplete",
                format!(
                    "{MANIFEST_FILE}: missing: the image is incomplete (the dump did not finish)"
                ),
            ));
        }
        Err(e) => problems.push(problem(MANIFEST_FILE, None, "manifest", e.to_string())),
    }
    if let Some(reason) = image_dir::incomplete_reason(dir) {
        incomplete = true;
        problems.push(problem(
            crate::image::INCOMPLETE_FILE,
            None,
            "incomplete",
            format!(
                "{}: the dump failed: {reason}",
                crate::image::INCOMPLETE_FILE
            ),
        ));
    }
    let (gpu_problems, gpu_chunks_checked) =
        super::gpu::verify_gpu(dir, manifest.as_ref().ok(), threads);
    problems.extend(gpu_problems);
    let images = ImageDir::new(dir, page_size);
    let images_checked = images
        .file_names()
        .map(|names| names.iter().filter(|n| magic::is_framed_image(n)).count() as u64)
        .unwrap_or(0);
    for e in check_dir(&images) {
        let file = e.relative_path(dir);
        let kind = if file.starts_with("pages-") {
            "pages"
        } else if e.is_missing() {
            "missing"
        } else {
            "framing"
        };
        let offset = (!e.is_missing()).then_some(e.offset);
        problems.push(problem(&file, offset, kind, e.describe_in(dir)));
    }
    for e in view_errors {
        if !problems
            .iter()
            .any(|p| p.file == e.file && (p.offset == e.offset || p.kind == "missing"))
        {
            problems.push(problem(&e.file, e.offset, "framing", e.message.clone()));
        }
    }
    let status = if incomplete {
        Status::Incomplete
    } else if problems.is_empty() {
        Status::Intact
    } else {
        Status::Damaged
    };
    let report = VerifyReport {
        status: status.name().into(),
        problems,
        files_checked,
        bytes_checked,
        images_checked,
        gpu_chunks_checked,
    };
    (status, report)
}

fn manifest_problem(p: &crate::image::Problem) -> Problem {
    let (kind, offset) = match &p.kind {
        ProblemKind::Missing => ("missing", None),
        ProblemKind::Unreadable(_) => ("unreadable", None),
        ProblemKind::Size { expected, actual } => ("size", Some((*actual).min(*expected))),
        ProblemKind::Content { offset, .. } => ("checksum", Some(*offset)),
    };
    problem(&p.file, offset, kind, p.to_string())
}

fn problem(file: &str, offset: Option<u64>, kind: &str, message: String) -> Problem {
    Problem {
        file: file.to_string(),
        offset,
        kind: kind.to_string(),
        message,
    }
}
