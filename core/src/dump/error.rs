//! Why a dump failed, said with what became of the tree and the image.

use std::path::PathBuf;

use crate::criu::{CriuConfigError, CriuError};
use crate::exit_code::{self, ExitCode};
use crate::gpu::GpuError;
use crate::helper::HelperError;
use crate::image::dir::ImageDirError;
use crate::image::manifest::ManifestError;
use crate::image::room::RoomError;
use crate::target::TargetError;

use super::page_server::PageServerError;

/// Why a dump failed. In every case the tree keeps running.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    CriuConfig(#[from] CriuConfigError),
    #[error(transparent)]
    ImageDir(#[from] ImageDirError),
    #[error("{error}\n  the image in {dir} is incomplete; {running}")]
    Criu {
        error: Box<CriuError>,
        dir: PathBuf,
        running: String,
    },
    #[error(transparent)]
    CriuSetup(Box<CriuError>),
    #[error("{path}: cannot checksum the dumped file")]
    Checksum {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{error}\n  the image in {dir} is incomplete; {running}")]
    ManifestRoom {
        error: Box<RoomError>,
        dir: PathBuf,
        running: String,
    },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("cannot record the GPU topology")]
    Topology(#[from] gpucr_topology::TopologyError),
    #[error("{error}\n  the image in {dir} is incomplete; {running}")]
    Helper {
        error: Box<HelperError>,
        dir: PathBuf,
        running: String,
    },
    #[error(transparent)]
    HelperSetup(Box<HelperError>),
    #[error("{error}\n  the image in {dir} is incomplete; {running}")]
    Pages {
        error: Box<PageServerError>,
        dir: PathBuf,
        running: String,
    },
    #[error("{error}\n  the image in {dir} is complete, but a task of the tree that lives on may not have its device back; {running}")]
    GiveBack {
        error: Box<HelperError>,
        dir: PathBuf,
        running: String,
    },
    #[error("interrupted by {signal}: the dump was rolled back; the image in {dir} is incomplete; {running}")]
    Interrupted {
        signal: &'static str,
        dir: PathBuf,
        running: String,
    },
}

impl DumpError {
    /// The page server's failure before CRIU started: nothing was dumped.
    pub(super) fn pages(dir: &std::path::Path) -> impl Fn(PageServerError) -> DumpError + '_ {
        move |error| DumpError::Pages {
            error: Box::new(error),
            dir: dir.to_path_buf(),
            running: "the tree was not touched".into(),
        }
    }
}

impl ExitCode for DumpError {
    fn exit_code(&self) -> u8 {
        match self {
            DumpError::Target(e) => e.exit_code(),
            DumpError::CriuConfig(e) => e.exit_code(),
            DumpError::ImageDir(_) | DumpError::ManifestRoom { .. } => exit_code::IMAGE_DIR,
            DumpError::Criu { error, .. } | DumpError::CriuSetup(error) => error.exit_code(),
            DumpError::Gpu(e) => e.exit_code(),
            DumpError::Helper { error, .. } | DumpError::HelperSetup(error) => error.exit_code(),
            DumpError::Manifest(e) => e.exit_code(),
            DumpError::Pages { error, .. } => error.exit_code(),
            DumpError::Checksum { .. } | DumpError::Topology(_) => exit_code::FAILURE,
            DumpError::GiveBack { .. } => exit_code::GIVE_BACK_FAILED,
            DumpError::Interrupted { .. } => exit_code::INTERRUPTED,
        }
    }
}
