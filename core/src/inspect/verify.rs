//! `gpucr inspect --verify`: the manifest's checksums of every file, every GPU memory
//! chunk against the GPU index, then the structure of CRIU's images (framing, pagemaps
//! against pages files, the images each process needs), then whatever the views could
//! not read.

use std::collections::BTreeMap;
use std::path::Path;

use gpucr_criu_image::check::check_dir;
use gpucr_criu_image::{magic, ImageDir};

use super::collect::read_manifest;
use super::model::{Problem, ReportError, VerifyReport};
use super::source::ImageSource;
use super::with_causes;
use crate::archive::{Scan, CHECKPOINT_DIR};
use crate::image::verify::{verify_digests, verify_files, ProblemKind};
use crate::image::{dir as image_dir, Manifest, ManifestError, MANIFEST_FILE};
use crate::transfer::GPU_DIR;

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
    let mut files_size_only = 0;
    let manifest = Manifest::read(dir);
    match &manifest {
        Ok(manifest) => {
            files_checked = manifest.files.len() as u64;
            bytes_checked = manifest.files.iter().map(|f| f.size).sum();
            files_size_only = size_only_files(manifest);
            match verify_files(dir, manifest, threads) {
                Ok(found) => problems.extend(found.iter().map(manifest_problem)),
                Err(e) => problems.push(problem(MANIFEST_FILE, None, "manifest", with_causes(&e))),
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
        Err(e @ ManifestError::Symlink { .. }) => {
            problems.push(problem(MANIFEST_FILE, None, "symlink", with_causes(&e)))
        }
        Err(e) => problems.push(problem(MANIFEST_FILE, None, "manifest", with_causes(&e))),
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
    let images_checked = check_images(&images, dir, "pages-", view_errors, &mut problems);
    let status = verdict(incomplete, &problems);
    let report = VerifyReport {
        status: status.name().into(),
        problems,
        files_checked,
        bytes_checked,
        files_size_only,
        images_checked,
        gpu_chunks_checked,
    };
    (status, report)
}

/// The structure of CRIU's images (named relative to `base`, where a pages file's name
/// starts with `pages_prefix`), then the errors the views met that no problem names yet.
/// Returns how many framed images there are.
fn check_images(
    images: &ImageDir,
    base: &Path,
    pages_prefix: &str,
    view_errors: &[ReportError],
    problems: &mut Vec<Problem>,
) -> u64 {
    let images_checked = images
        .file_names()
        .map(|names| names.iter().filter(|n| magic::is_framed_image(n)).count() as u64)
        .unwrap_or(0);
    for e in check_dir(images) {
        let file = e.relative_path(base);
        let kind = if file.starts_with(pages_prefix) {
            "pages"
        } else if e.is_missing() {
            "missing"
        } else {
            "framing"
        };
        let offset = (!e.is_missing()).then_some(e.offset);
        problems.push(problem(&file, offset, kind, e.describe_in(base)));
    }
    for e in view_errors {
        if !problems
            .iter()
            .any(|p| p.file == e.file && (p.offset == e.offset || p.kind == "missing"))
        {
            // In an archive, the engine's description of the container; every other
            // view error is about a CRIU image's framing.
            let kind = if [crate::archive::CONFIG_DUMP, crate::archive::SPEC_DUMP]
                .contains(&e.file.as_str())
            {
                "container"
            } else {
                "framing"
            };
            problems.push(problem(&e.file, e.offset, kind, e.message.clone()));
        }
    }
    images_checked
}

/// Incomplete wins; otherwise intact when nothing is wrong.
fn verdict(incomplete: bool, problems: &[Problem]) -> Status {
    if incomplete {
        Status::Incomplete
    } else if problems.is_empty() {
        Status::Intact
    } else {
        Status::Damaged
    }
}

/// How many files `manifest` records by size only.
fn size_only_files(manifest: &Manifest) -> u64 {
    manifest
        .files
        .iter()
        .filter(|f| f.checksum == crate::image::checksum::SIZE_ONLY)
        .count() as u64
}

fn manifest_problem(p: &crate::image::Problem) -> Problem {
    let (kind, offset) = match &p.kind {
        ProblemKind::Missing => ("missing", None),
        ProblemKind::Unreadable(_) => ("unreadable", None),
        ProblemKind::Size { expected, actual } => ("size", Some((*actual).min(*expected))),
        ProblemKind::Content { offset, .. } => ("checksum", Some(*offset)),
        ProblemKind::Symlink { .. } => ("symlink", None),
        ProblemKind::Unlisted => ("unlisted", None),
        ProblemKind::NoChecksum => ("checksum", None),
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

/// Verify an image read from a checkpoint archive: the manifest's checksums against the
/// digests taken while the archive streamed, the GPU chunks checked then, and the
/// structure of CRIU's images kept in memory. Files are named as in the archive
/// (`checkpoint/pages-1.img`). An archive without gpucr's manifest (a container that
/// held no GPU) has only its CRIU images checked.
pub fn verify_archive(
    scan: &Scan,
    source: &ImageSource,
    page_size: u64,
    view_errors: &[ReportError],
) -> (Status, VerifyReport) {
    let archive = scan.path.as_path();
    let in_archive = |file: &str| format!("{CHECKPOINT_DIR}/{file}");
    let mut problems = Vec::new();
    let mut incomplete = false;
    let mut files_checked = 0;
    let mut bytes_checked = 0;
    let mut files_size_only = 0;
    match read_manifest(source) {
        Ok(manifest) => {
            files_checked = manifest.files.len() as u64;
            bytes_checked = manifest.files.iter().map(|f| f.size).sum();
            files_size_only = size_only_files(&manifest);
            let sizes: BTreeMap<String, u64> = scan.sizes.iter().cloned().collect();
            let path = Manifest::path_in(source.root());
            match verify_digests(&path, &manifest, &sizes, &scan.digests) {
                Ok(found) => problems.extend(found.into_iter().map(|mut p| {
                    p.file = in_archive(&p.file);
                    manifest_problem(&p)
                })),
                Err(e) => problems.push(problem(
                    &in_archive(MANIFEST_FILE),
                    None,
                    "manifest",
                    with_causes(&e),
                )),
            }
        }
        // No manifest and no GPU memory: a container checkpointed without gpucr.
        Err(ManifestError::Missing { .. }) if !source.has_dir(GPU_DIR) => {}
        Err(ManifestError::Missing { .. }) => {
            incomplete = true;
            problems.push(problem(
                &in_archive(MANIFEST_FILE),
                None,
                "incomplete",
                format!(
                    "{}: missing: the image is incomplete (the dump did not finish)",
                    in_archive(MANIFEST_FILE)
                ),
            ));
        }
        Err(e) => problems.push(problem(
            &in_archive(MANIFEST_FILE),
            None,
            "manifest",
            with_causes(&e),
        )),
    }
    if let Some(reason) = source.incomplete_reason() {
        incomplete = true;
        let file = in_archive(crate::image::INCOMPLETE_FILE);
        problems.push(problem(
            &file,
            None,
            "incomplete",
            format!("{file}: the dump failed: {reason}"),
        ));
    }
    for p in &scan.gpu.problems {
        let file = in_archive(&format!("{GPU_DIR}/{}", p.file));
        problems.push(problem(
            &file,
            Some(p.file_offset),
            "gpu",
            format!("{CHECKPOINT_DIR}/{p}"),
        ));
    }
    for e in &scan.gpu.errors {
        let r = super::gpu::index_error(archive, e);
        problems.push(problem(&r.file, r.offset, "gpu", r.message));
    }
    let images = source.images(page_size);
    let images_checked = check_images(
        &images,
        archive,
        &in_archive("pages-"),
        view_errors,
        &mut problems,
    );
    let status = verdict(incomplete, &problems);
    let report = VerifyReport {
        status: status.name().into(),
        problems,
        files_checked,
        bytes_checked,
        files_size_only,
        images_checked,
        gpu_chunks_checked: scan.gpu.chunks_checked,
    };
    (status, report)
}
