//! The work a dump does while CRIU still holds the tree, once the image is written:
//! the GPU copy finished and the tasks' device state written, then the manifest's room
//! taken. After this the tree is let go (killed, unless it is left running), so each
//! step's failure must fail the dump while the tree can still run on.
//!
//! `gpucr dump` does it at CRIU's post-dump notification ([`super::gate`]); engine mode,
//! whose CRIU notifies the engine and not gpucr, at the plugin's FINISH_COPY and
//! DUMP_DONE steps (`crate::engine`). Both go through [`PostDump`], once each step.

use std::path::Path;

use crate::gpu::GpuManifest;
use crate::helper::{GpuDump, HelperError};
use crate::image;
use crate::image::room::{ManifestRoom, RoomError};

/// The GPU half of a dump, as the end of a dump uses it: [`GpuDump`], or a scripted
/// stand-in in tests.
pub trait DumpDevices {
    /// Wait for every copy and close the image's GPU part.
    fn finish(&self) -> Result<GpuManifest, HelperError>;
    /// The image is complete: the tree may lose its device memory.
    fn keep(&self);
    /// What went wrong in the helper on its own, if anything did (taken once).
    fn take_failure(&self) -> Option<HelperError>;
    /// Why a tree that lives on may not have all its devices back.
    fn give_back_failure(&self) -> Option<String>;
}

impl DumpDevices for GpuDump {
    fn finish(&self) -> Result<GpuManifest, HelperError> {
        GpuDump::finish(self)
    }
    fn keep(&self) {
        GpuDump::keep(self)
    }
    fn take_failure(&self) -> Option<HelperError> {
        GpuDump::take_failure(self)
    }
    fn give_back_failure(&self) -> Option<String> {
        GpuDump::give_back_failure(self)
    }
}

/// Why the work at the end of a dump failed.
#[derive(Debug, thiserror::Error)]
pub enum PostDumpError {
    /// The GPU copy, or the device state's files.
    #[error(transparent)]
    Devices(HelperError),
    /// No room for the manifest.
    #[error(transparent)]
    Room(RoomError),
}

/// The end of one dump into `dir`: each step done at most once, its results kept.
pub struct PostDump<'a> {
    dir: &'a Path,
    devices: Option<&'a dyn DumpDevices>,
    manifest: Option<GpuManifest>,
    room: Option<ManifestRoom>,
}

impl<'a> PostDump<'a> {
    pub fn new(dir: &'a Path, devices: Option<&'a dyn DumpDevices>) -> PostDump<'a> {
        PostDump {
            dir,
            devices,
            manifest: None,
            room: None,
        }
    }

    /// Wait for every copy, write the tasks' device state into the image and let the
    /// helper keep the image (the tree may then lose its device memory). Once: later
    /// calls answer Ok. Without a GPU half, nothing to do.
    pub fn finish_copy(&mut self) -> Result<(), PostDumpError> {
        let Some(devices) = self.devices.filter(|_| self.manifest.is_none()) else {
            return Ok(());
        };
        let manifest = devices.finish().map_err(PostDumpError::Devices)?;
        image::gpu::write_states(self.dir, &manifest).map_err(|source| {
            PostDumpError::Devices(HelperError::Io {
                path: self.dir.join(image::gpu::STATE_DIR),
                source,
            })
        })?;
        devices.keep();
        self.manifest = Some(manifest);
        Ok(())
    }

    /// Whether the GPU copy was finished here (and the helper's dump with it).
    pub fn copy_finished(&self) -> bool {
        self.manifest.is_some()
    }

    /// Take the room the manifest needs: `needed` gets the bytes of the image's GPU
    /// section and answers the bytes to reserve. Once: later calls answer Ok.
    pub fn take_room(&mut self, needed: impl FnOnce(u64) -> u64) -> Result<(), PostDumpError> {
        if self.room.is_some() {
            return Ok(());
        }
        let gpu_bytes = self
            .manifest
            .as_ref()
            .map_or(0, super::complete::gpu_section_bytes);
        let room = ManifestRoom::take(self.dir, needed(gpu_bytes)).map_err(PostDumpError::Room)?;
        self.room = Some(room);
        Ok(())
    }

    /// Take what the steps produced: the GPU manifest and the manifest's room (engine
    /// mode keeps its `PostDump` in a loop, so it is taken, not consumed).
    pub fn take_parts(&mut self) -> (Option<GpuManifest>, Option<ManifestRoom>) {
        (self.manifest.take(), self.room.take())
    }
}
