//! The image directory: its layout, the manifest `gpucr.json`, file checksums and the
//! verification of an image against its manifest.
//!
//! The format is described for users in `docs/image-format.md`.

pub mod atomic;
pub mod checksum;
pub mod dir;
pub mod follow;
pub mod gpu;
pub mod manifest;
pub mod room;
pub mod verify;
pub mod workdir;

pub use dir::ImageDirError;
pub use manifest::{Manifest, ManifestError};
pub use verify::{Problem, VerifyError};

/// The manifest, written last and atomically: an image without it is incomplete.
pub const MANIFEST_FILE: &str = "gpucr.json";
/// Written instead of the manifest when a dump fails: why the image is incomplete.
pub const INCOMPLETE_FILE: &str = "gpucr-incomplete.json";
/// CRIU's log of the dump, inside the image directory.
pub const DUMP_LOG: &str = "dump.log";
/// CRIU's log of the latest restore, inside the image directory.
pub const RESTORE_LOG: &str = "restore.log";
/// Files a restore adds to the image directory; they are not part of the image.
pub const RESTORE_OUTPUTS: &[&str] = &[RESTORE_LOG, "stats-restore"];
