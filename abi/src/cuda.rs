//! What the cuda backend's two halves exchange.

use serde::{Deserialize, Serialize};

/// The encoding of [`Collected`] (JSON).
pub const COLLECTED_FORMAT: &str = "cuda-collected/1";

/// What the plugin half sends at CHECKPOINT_DEVICES for a CUDA process: no buffer fds
/// (the driver keeps the memory), the restore thread it lets run for the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    pub restore_tid: i32,
}
