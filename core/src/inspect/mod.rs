//! `gpucr inspect`: what an image holds, and whether it is intact.
//!
//! * [`collect`] reads the manifest and CRIU's images into a [`Report`] (the schema in
//!   [`model`], printed as JSON by `--json`);
//! * [`text`] renders the report as the text views;
//! * [`verify`] checks the image against its manifest and CRIU's format;
//! * [`gpu`] reads and verifies the GPU memory (`gpu/`).

pub mod collect;
pub mod gpu;
pub mod model;
pub mod source;
pub mod text;
pub mod tree;
pub mod verify;

use std::path::PathBuf;

pub use collect::{collect, collect_from, read_manifest, Options};
pub use model::{Report, SCHEMA_VERSION};
pub use source::ImageSource;
pub use text::Views;
pub use verify::Status;

use crate::exit_code;

/// Why `gpucr inspect` cannot show an image at all.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{path}: no such image directory or archive")]
    NotFound { path: PathBuf },
    #[error("{path}: not an image directory or archive (neither a directory nor a file)")]
    NotADirectory { path: PathBuf },
    #[error("process {pid} is not in the image (its processes: {pids})")]
    NoSuchProcess { pid: u32, pids: String },
}

impl InspectError {
    /// The exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            // As `gpucr restore` and `check-topology` answer for a missing image.
            InspectError::NotFound { .. } => exit_code::IMAGE_INCOMPLETE,
            InspectError::NotADirectory { .. } => exit_code::IMAGE_DAMAGED,
            InspectError::NoSuchProcess { .. } => exit_code::USAGE,
        }
    }
}

/// An error's message followed by those of its causes ("cannot read the manifest: not a
/// regular file (a FIFO)"), for a report line, where no error chain is printed.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        message.push_str(&format!(": {c}"));
        cause = c.source();
    }
    message
}

/// The page size of this machine, used to read pagemaps of images whose manifest does
/// not record the dumping host's (CRIU does not).
pub use crate::units::host_page_size;
