//! What the plugin half and the gpucr half exchange (JSON, versioned by format name).
//!
//! * At CHECKPOINT_DEVICES the plugin half sends a [`KfdState`] ([`COLLECTED_FORMAT`])
//!   and one dmabuf fd per buffer with contents ([`KfdBo::has_contents`]), in bucket
//!   order. The gpucr half keeps the same [`KfdState`] as the task's device state
//!   ([`STATE_FORMAT`]); a GPU remap rewrites the devices' actual gpu_ids.
//! * At RESTORE_EXT_FILE the gpucr half sends, for `/dev/kfd`, a [`RestoreState`]
//!   ([`RESTORE_FORMAT`]) and, for a render node, a [`RenderState`] ([`RENDER_FORMAT`]).

use serde::{Deserialize, Serialize};

/// Plugin half to gpucr half, at CHECKPOINT_DEVICES.
pub const COLLECTED_FORMAT: &str = "amdgpu-collected/1";
/// The task's device state in the image.
pub const STATE_FORMAT: &str = "amdgpu/1";
/// gpucr half to plugin half, RESTORE_EXT_FILE of `/dev/kfd`.
pub const RESTORE_FORMAT: &str = "amdgpu-restore/1";
/// gpucr half to plugin half, RESTORE_EXT_FILE of a render node.
pub const RENDER_FORMAT: &str = "amdgpu-render/1";

/// A process's KFD state: what CHECKPOINT returned, less the fds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KfdState {
    /// The pid PROCESS_INFO gave (in the task's own PID namespace).
    pub kfd_pid: u32,
    /// Queues, events and SVM ranges in `priv_data`.
    pub num_objects: u32,
    /// KFD's opaque private data.
    pub priv_data: Vec<u8>,
    pub devices: Vec<KfdDevice>,
    pub bos: Vec<KfdBo>,
}

/// One GPU of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KfdDevice {
    /// The gpu_id the process knows (kept across restores onto other GPUs).
    pub user_gpu_id: u32,
    /// The gpu_id of the GPU it runs on (rewritten by a remap).
    pub actual_gpu_id: u32,
}

/// One buffer of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KfdBo {
    /// GPU VA (the CPU address of its mapping).
    pub addr: u64,
    pub size: u64,
    /// mmap offset at checkpoint.
    pub offset: u64,
    /// The user gpu_id.
    pub gpu_id: u32,
    pub alloc_flags: u32,
    /// How the process maps it at `addr` (None: not mapped there): its restored
    /// mapping needs UPDATE_VMA_MAP, a render-node one through a render fd.
    #[serde(default)]
    pub mapped: Option<Mapped>,
}

/// What a buffer's mapping goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mapped {
    Kfd,
    Render,
}

impl KfdBo {
    /// VRAM and GTT buffers: their contents are copied (a dmabuf each).
    pub fn has_contents(&self) -> bool {
        gpucr_abi::kfd::bo_has_contents(self.alloc_flags)
    }
}

impl KfdState {
    /// The actual gpu_id of user gpu_id `user`.
    pub fn actual_gpu(&self, user: u32) -> Option<u32> {
        self.devices
            .iter()
            .find(|d| d.user_gpu_id == user)
            .map(|d| d.actual_gpu_id)
    }

    /// The buffers with contents, with their bucket index.
    pub fn content_bos(&self) -> impl Iterator<Item = (usize, &KfdBo)> {
        self.bos
            .iter()
            .enumerate()
            .filter(|(_, b)| b.has_contents())
    }
}

/// What the restored task recreates its KFD state from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreState {
    pub kfd: KfdState,
    /// The render minor of each device's actual GPU (`kfd.devices` order).
    pub render_minors: Vec<u32>,
    /// How many render-node files the task has (each comes through RESTORE_EXT_FILE).
    #[serde(default)]
    pub render_files: u32,
}

/// A render node the restored task reopens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderState {
    /// The actual gpu_id of the GPU.
    pub gpu_id: u32,
    pub minor: u32,
}

/// Encode as JSON.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("amdgpu state serialises")
}

/// Decode JSON of `format`, checking the format name.
pub fn decode<T: serde::de::DeserializeOwned>(
    got_format: &str,
    want_format: &str,
    bytes: &[u8],
) -> Result<T, String> {
    if got_format != want_format {
        return Err(format!(
            "state of format {got_format:?}, not {want_format:?}"
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("undecodable {want_format} state: {e}"))
}
