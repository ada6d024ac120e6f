//! The plugin half of a backend: what must run as CRIU's tracer (in criu's main
//! process) or inside a restored task, and nothing else. Driver calls and copies are the
//! gpucr half's, in the helper; the two halves exchange the backend's opaque,
//! versioned state bytes and fds over the helper protocol.
//!
//! gpucr names the backend in `GPUCR_BACKEND` on the `criu swrk` child; [`for_backend`]
//! picks its half. Every method has the meaning of the CRIU hook it serves; a backend
//! implements those it needs, and the defaults answer "not mine" or do nothing.

pub mod amdgpu;
mod cuda;
pub mod error;
mod sim;

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;

use gpucr_abi::proto::DeviceSpec;
use gpucr_abi::ENV_BACKEND;

use crate::device;
use crate::helper::Connector;

pub use error::HalfError;

/// What a plugin half collected for one task at CHECKPOINT_DEVICES.
#[derive(Debug)]
pub struct Collected {
    /// The encoding of `state` ("sim-collected/1").
    pub format: String,
    pub state: Vec<u8>,
    /// One fd per device buffer, readable by the gpucr half (a DMABUF on AMD).
    pub buffers: Vec<OwnedFd>,
    /// A thread of the task to let run while the gpucr half takes the task over (a
    /// driver's restore thread, which performs the driver's checkpoint).
    pub run_thread: Option<i32>,
}

/// What RESTORE_EXT_FILE recreated inside the restored task.
#[derive(Debug)]
pub struct Recreated {
    /// The device fd CRIU installs in the task.
    pub device_fd: RawFd,
    /// The task's new buffers, in `DeviceSpec.buffers` order, for the gpucr half to fill.
    pub buffers: Vec<File>,
}

/// One backend's plugin half.
pub trait PluginHalf: Send + Sync {
    /// "sim", "amdgpu", "cuda".
    fn name(&self) -> &'static str;

    /// PAUSE_DEVICES, criu main, right before `pid` is frozen: what only CRIU's process
    /// can do then (the gpucr half's own step follows through the helper).
    fn pause(&self, _pid: i32) -> Result<(), HalfError> {
        Ok(())
    }

    /// The first CHECKPOINT_DEVICES of a dump, criu main, tree frozen, before that
    /// task's own step: what the gpucr half does for every task of the tree at once
    /// (the CUDA driver's checkpoints, with every restore thread let run meanwhile).
    /// Default: nothing.
    fn checkpoint_tree(&self) -> Result<(), HalfError> {
        Ok(())
    }

    /// CHECKPOINT_DEVICES, criu main, tree frozen: `pid`'s device state and buffer fds,
    /// or None when it holds no device of this backend.
    fn checkpoint(&self, pid: i32) -> Result<Option<Collected>, HalfError>;

    /// Whether a task this half checkpointed still holds device files, which CRIU dumps
    /// through DUMP_EXT_FILE (not so for a CUDA process, whose driver releases them at
    /// the checkpoint). Default: yes.
    fn dumps_device_files(&self) -> bool {
        true
    }

    /// HANDLE_DEVICE_VMA, criu main: whether a mapping of the file with `stat` is one
    /// of this backend's device mappings (then CRIU leaves it to the plugin).
    fn owns_vma(&self, _stat: &libc::stat) -> bool {
        false
    }

    /// RESTORE_EXT_FILE, inside the restored task: recreate the device state `spec`
    /// describes and open the task's buffers.
    fn recreate(&self, spec: &DeviceSpec) -> Result<Recreated, HalfError> {
        let buffers = device::recreate(spec)?;
        let device_fd = device::open_device(spec)?;
        Ok(Recreated { device_fd, buffers })
    }

    /// UPDATE_VMA_MAP, inside the restored task, for a mapping [`PluginHalf::owns_vma`]
    /// claimed: the new page offset and fd of the mapping of `path` at `addr`, or None
    /// to leave it as it was.
    fn update_vma(&self, _path: &CStr, _addr: u64, _pgoff: u64) -> Option<(u64, RawFd)> {
        None
    }

    /// The thread of `pid` to let run while the gpucr half brings the task's device
    /// back at RESUME_DEVICES_LATE (a driver's restore thread), if any.
    fn restore_thread(&self, _pid: i32) -> Option<i32> {
        None
    }

    /// The first RESUME_DEVICES_LATE of a restore, criu main, every task restored and
    /// stopped: what the gpucr half does for every task of the tree rooted at `root` at
    /// once (the CUDA driver's restores and unlocks, with every restore thread let run
    /// meanwhile). The tasks done, whose own RESUME_DEVICES_LATE then skip the helper.
    /// Default: none.
    fn resume_tree(&self, _root: i32) -> Result<Vec<i32>, HalfError> {
        Ok(Vec::new())
    }

    /// RESUME_DEVICES_LATE, criu main, before `pid` runs, after the gpucr half has
    /// filled its memory.
    fn resume(&self, _pid: i32) -> Result<(), HalfError> {
        Ok(())
    }

    /// The plugin's `exit` hook (a dump's happens after post-dump, before the gpucr
    /// half's end of the dump): undo what the plugin half still holds of every task.
    /// What it could not undo, one message each (already in CRIU's log).
    fn finish(&self, _stage: i32, _ret: i32) -> Vec<String> {
        Vec::new()
    }
}

/// The plugin half of the backend gpucr named in `GPUCR_BACKEND` (`backend`), if any;
/// the simulator's beneath `sim_root`, CUDA's asking the driver through `helper`.
pub fn for_backend(
    backend: Option<&OsStr>,
    sim_root: Option<&Path>,
    helper: &Connector,
) -> Result<Option<Box<dyn PluginHalf>>, HalfError> {
    let Some(name) = backend else {
        return Ok(None);
    };
    match name.to_str() {
        Some("sim") => Ok(Some(Box::new(sim::SimHalf::at(sim_root)?))),
        Some("cuda") => Ok(Some(Box::new(cuda::CudaHalf {
            helper: helper.clone(),
        }))),
        Some("amdgpu") => Ok(Some(Box::new(amdgpu::AmdgpuHalf::new(
            std::sync::Arc::new(gpucr_amdgpu::real::RealKfd),
        )))),
        other => Err(HalfError::new(
            libc::ENOTSUP,
            format!("{ENV_BACKEND}={other:?}: this plugin has no such backend"),
        )),
    }
}
