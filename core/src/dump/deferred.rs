//! The give-back a post-copy dump defers: where the tree's GPU backend writes into
//! the tree's memory as it gives the devices back (`Backend::gives_back_into_memory`,
//! CUDA's host staging), the pages the page server left in the stopped tree would
//! change under the image. The dump then leaves the devices as it made them, and the
//! migration, once it knows which copy lives, gives them back (the job runs on here)
//! or lets them go with the tree it kills.

use std::sync::Arc;

use crate::helper::{GpuDump, HelperError};

/// The GPU side of a dump whose give-back is deferred, held until the migration ends.
/// Dropped, it lets the devices go without giving them back (the tree was killed).
#[derive(Debug, Clone)]
pub struct DeferredGiveBack {
    gpu: Arc<GpuDump>,
}

impl DeferredGiveBack {
    pub(super) fn new(gpu: Arc<GpuDump>) -> DeferredGiveBack {
        DeferredGiveBack { gpu }
    }

    /// The tree runs again (the caller has let it run: a driver gives a process back
    /// through a thread of its own): every task the dump touched gets its devices and
    /// memory back. Nothing to do where the end of the dump gave them back already (a
    /// dump that failed).
    pub fn give_back(&self) -> Result<(), HelperError> {
        self.gpu.give_back_deferred().map(drop)
    }
}
