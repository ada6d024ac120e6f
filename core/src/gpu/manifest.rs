//! The GPU part of a dump in its runtime form: what a dump records about device state
//! and how its memory moved. On disk it is `image::gpu::GpuSection`, which converts to
//! and from this.

use serde::{Deserialize, Serialize};

use super::TaskDevice;
use crate::transfer::GpuStats;

/// The GPU part of a dump (on disk: `gpucr.json`, field `gpu`, and `gpu/state/`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuManifest {
    /// The backend that carried the device state ("sim", "amdgpu", "cuda").
    pub backend: String,
    /// Every task's device state and buffer table.
    pub tasks: Vec<TaskDevice>,
    /// What the transfer engine stored.
    pub stats: GpuStats,
    /// When each task's buffers were copied, relative to the helper's start.
    pub timings: Vec<TaskTiming>,
}

/// When one task's device memory started and finished moving (milliseconds since the
/// helper started), for the phase timeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskTiming {
    pub ns_pid: u32,
    pub bytes: u64,
    pub start_ms: Option<f64>,
    pub end_ms: Option<f64>,
}
