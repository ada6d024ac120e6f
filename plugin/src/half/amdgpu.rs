//! The amdgpu backend's plugin half: the KFD CRIU operations, which the kernel accepts
//! only from CRIU's tracer (dump) or from the restored task itself (restore).
//!
//! * CHECKPOINT_DEVICES (criu main, the task seized): PROCESS_INFO and CHECKPOINT on the
//!   task's own kfd file (taken with pidfd_getfd), then the KFD state and one dmabuf per
//!   VRAM/GTT buffer go to the helper. The queues stay paused until the dump is over:
//!   UNPAUSE comes at `exit(DUMP)` (after post-dump, where gpucr has waited for every
//!   copy), and at once on any failure after PROCESS_INFO.
//! * HANDLE_DEVICE_VMA: mappings of /dev/kfd and render nodes are the plugin's.
//! * RESTORE_EXT_FILE (inside the restored task): for /dev/kfd, open a kfd and a render
//!   node per GPU (the gpu_ids the helper mapped), RESTORE, and hand the new dmabufs to
//!   the helper; for a render node, a copy of the one KFD was given. The render fds are
//!   kept above every fd the task will get, for UPDATE_VMA_MAP, and closed once the
//!   last render-node file and mapping of the task is restored (the dump recorded which
//!   buffers the task maps), so none is left behind in the task.
//! * UPDATE_VMA_MAP: each restored buffer's new mmap offset, through the render fd that
//!   owns it.
//! * RESUME_DEVICES_LATE (criu main): after the helper has written the task's buffers,
//!   RESUME.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use gpucr_abi::kfd::{
    KfdCriuBoBucket, KfdCriuDeviceBucket, KFD_CRIU_MIN_VERSION, KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL,
    KFD_IOC_ALLOC_MEM_FLAGS_GTT, KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
};
use gpucr_abi::plugin_abi::stage;
use gpucr_abi::proto::DeviceSpec;
use gpucr_amdgpu::state::{
    self, KfdBo, KfdDevice, KfdState, Mapped, RenderState, RestoreState, COLLECTED_FORMAT,
    RENDER_FORMAT, RESTORE_FORMAT,
};
use gpucr_amdgpu::{DeviceKind, KernelError, Kfd, RestoreRequest};

use super::{Collected, HalfError, PluginHalf, Recreated};
use crate::criu;

/// A restored buffer's mapping.
#[derive(Debug, Clone, Copy)]
struct Vma {
    addr: u64,
    old_offset: u64,
    new_offset: u64,
    /// The render node that owns it.
    minor: u32,
    /// Whether the task maps it through a render node (and UPDATE_VMA_MAP for it is
    /// still to come).
    pending: bool,
}

/// What this restored task recreated.
#[derive(Debug, Default)]
struct Restored {
    /// Render node fds by minor (the ones KFD RESTORE was given).
    renders: BTreeMap<u32, OwnedFd>,
    vmas: Vec<Vma>,
    /// The task's pid in its namespace (for CRIU's fd floor).
    ns_pid: u32,
    /// Render-node RESTORE_EXT_FILEs and render-node UPDATE_VMA_MAPs still to come, once
    /// KFD RESTORE ran; at 0 the render fds are closed (the task keeps its own).
    pending: Option<u32>,
    /// Render-node RESTORE_EXT_FILEs served before the kfd file's.
    early_renders: u32,
}

impl Restored {
    /// One render-node use served: close the render fds when none is left.
    fn served(&mut self) {
        match &mut self.pending {
            Some(n) => *n = n.saturating_sub(1),
            None => self.early_renders += 1,
        }
        self.release_if_done();
    }

    fn release_if_done(&mut self) {
        if self.pending == Some(0) {
            self.renders.clear();
        }
    }
}

pub struct AmdgpuHalf {
    kfd: Arc<dyn Kfd>,
    /// The kfd files of the tasks PROCESS_INFO paused, for UNPAUSE after the dump.
    paused: Mutex<Vec<(i32, OwnedFd)>>,
    restored: Mutex<Restored>,
}

impl std::fmt::Debug for AmdgpuHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdgpuHalf").finish_non_exhaustive()
    }
}

/// KFD or a render node refused: the device's failure.
fn kernel(e: KernelError) -> HalfError {
    HalfError::device(e.errno, e.to_string())
}

/// The restore's device state does not fit together: the image's.
fn bad(detail: String) -> HalfError {
    HalfError::image(libc::EINVAL, detail)
}

/// KFD answered, but without what it must hand over: the device's failure.
fn short(detail: String) -> HalfError {
    HalfError::device(libc::EIO, detail)
}

impl AmdgpuHalf {
    pub fn new(kfd: Arc<dyn Kfd>) -> AmdgpuHalf {
        AmdgpuHalf {
            kfd,
            paused: Mutex::new(Vec::new()),
            restored: Mutex::new(Restored::default()),
        }
    }

    /// UNPAUSE `pid`'s queues (after a failure: the error is only logged, the first
    /// failure is what CRIU gets).
    /// UNPAUSE `pid`'s queues; what failed, also logged.
    fn unpause_logged(&self, pid: i32, kfd: BorrowedFd<'_>) -> Option<String> {
        let e = self.kfd.unpause(kfd).err()?;
        let text = format!("pid {pid}: cannot unpause its GPU queues: {e}");
        criu::error(&text);
        Some(text)
    }

    /// PROCESS_INFO and CHECKPOINT on `kfd`: the state, and the dmabufs of the buffers
    /// with contents in bucket order.
    fn collect(
        &self,
        pid: i32,
        kfd: BorrowedFd<'_>,
    ) -> Result<(KfdState, Vec<OwnedFd>), HalfError> {
        let info = self.kfd.process_info(kfd).map_err(kernel)?;
        let checkpoint = self.kfd.checkpoint(kfd, &info).map_err(kernel)?;
        let mappings = self.kfd.device_mappings(pid).map_err(kernel)?;
        let bos: Vec<KfdBo> = checkpoint
            .bos
            .iter()
            .map(|b| KfdBo {
                addr: b.addr,
                size: b.size,
                offset: b.offset,
                gpu_id: b.gpu_id,
                alloc_flags: b.alloc_flags,
                mapped: mappings
                    .iter()
                    .find(|m| m.start == b.addr)
                    .map(|m| match m.kind {
                        DeviceKind::Kfd => Mapped::Kfd,
                        DeviceKind::Render { .. } => Mapped::Render,
                    }),
            })
            .collect();
        let mut fds = Vec::new();
        for (bo, fd) in bos.iter().zip(checkpoint.dmabufs) {
            match (bo.has_contents(), fd) {
                (true, Some(fd)) => fds.push(fd),
                (true, None) => {
                    return Err(short(format!(
                        "pid {pid}: KFD exported no dmabuf for the buffer at {:#x}",
                        bo.addr
                    )))
                }
                (false, _) => {}
            }
        }
        let state = KfdState {
            kfd_pid: info.pid,
            num_objects: info.num_objects,
            priv_data: checkpoint.priv_data,
            devices: checkpoint
                .devices
                .iter()
                .map(|d| KfdDevice {
                    user_gpu_id: d.user_gpu_id,
                    actual_gpu_id: d.actual_gpu_id,
                })
                .collect(),
            bos,
        };
        Ok((state, fds))
    }

    /// The render fd of `minor` in this task (opened once, kept above CRIU's fds).
    fn render(&self, restored: &mut Restored, minor: u32) -> Result<RawFd, HalfError> {
        if let Some(fd) = restored.renders.get(&minor) {
            return Ok(fd.as_raw_fd());
        }
        let fd = above_floor(
            self.kfd.open_render(minor).map_err(kernel)?,
            restored.ns_pid,
        )?;
        let raw = fd.as_raw_fd();
        restored.renders.insert(minor, fd);
        Ok(raw)
    }

    fn restore_kfd(&self, spec: &DeviceSpec) -> Result<Recreated, HalfError> {
        let restore: RestoreState =
            state::decode(&spec.format, RESTORE_FORMAT, &spec.state).map_err(bad)?;
        let kfd_state = restore.kfd;
        if restore.render_minors.len() != kfd_state.devices.len() {
            return Err(bad(format!(
                "{} render nodes for {} GPUs",
                restore.render_minors.len(),
                kfd_state.devices.len()
            )));
        }
        let kfd = self.kfd.open_kfd().map_err(kernel)?;
        let (major, minor) = self.kfd.version(kfd.as_fd()).map_err(kernel)?;
        if major != KFD_CRIU_MIN_VERSION.0 || minor < KFD_CRIU_MIN_VERSION.1 {
            return Err(HalfError::device(
                libc::ENOTSUP,
                format!(
                    "KFD {major}.{minor} cannot restore (CRIU support needs 1.{} or later)",
                    KFD_CRIU_MIN_VERSION.1
                ),
            ));
        }
        let mut restored = self.restored.lock().unwrap_or_else(|e| e.into_inner());
        restored.ns_pid = kfd_state.kfd_pid;
        let mut devices = Vec::with_capacity(kfd_state.devices.len());
        for (d, &minor) in kfd_state.devices.iter().zip(&restore.render_minors) {
            devices.push(KfdCriuDeviceBucket {
                user_gpu_id: d.user_gpu_id,
                actual_gpu_id: d.actual_gpu_id,
                drm_fd: self.render(&mut restored, minor)? as u32,
                pad: 0,
            });
        }
        let mut request = RestoreRequest {
            devices,
            bos: kfd_state
                .bos
                .iter()
                .map(|b| KfdCriuBoBucket {
                    addr: b.addr,
                    size: b.size,
                    offset: b.offset,
                    gpu_id: b.gpu_id,
                    alloc_flags: b.alloc_flags,
                    ..Default::default()
                })
                .collect(),
            priv_data: kfd_state.priv_data.clone(),
            num_objects: kfd_state.num_objects,
        };
        let dmabufs = self
            .kfd
            .restore(kfd.as_fd(), &mut request)
            .map_err(kernel)?;
        let mut buffers = Vec::new();
        for ((bo, bucket), fd) in kfd_state.bos.iter().zip(&request.bos).zip(dmabufs) {
            let mapped = KFD_IOC_ALLOC_MEM_FLAGS_VRAM
                | KFD_IOC_ALLOC_MEM_FLAGS_GTT
                | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP
                | KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL;
            if bo.alloc_flags & mapped != 0 {
                let index = kfd_state
                    .devices
                    .iter()
                    .position(|d| d.user_gpu_id == bo.gpu_id)
                    .ok_or_else(|| bad(format!("buffer at {:#x} on an unknown GPU", bo.addr)))?;
                restored.vmas.push(Vma {
                    addr: bo.addr,
                    old_offset: bo.offset,
                    new_offset: bucket.restored_offset,
                    minor: restore.render_minors[index],
                    pending: bo.mapped == Some(Mapped::Render),
                });
            }
            match (bo.has_contents(), fd) {
                (true, Some(fd)) => buffers.push(File::from(fd)),
                (true, None) => {
                    return Err(short(format!(
                        "KFD RESTORE exported no dmabuf for the buffer at {:#x}",
                        bo.addr
                    )))
                }
                (false, _) => {}
            }
        }
        let render_vmas = restored.vmas.iter().filter(|v| v.pending).count() as u32;
        let early = restored.early_renders;
        restored.pending = Some((restore.render_files + render_vmas).saturating_sub(early));
        restored.release_if_done();
        let kfd = above_floor(kfd, kfd_state.kfd_pid)?;
        Ok(Recreated {
            device_fd: kfd.into_raw_fd(),
            buffers,
        })
    }

    /// Render fds this task still holds for KFD and UPDATE_VMA_MAP (0 once every
    /// render-node file and mapping is restored: none is left behind in the task).
    pub fn held_render_fds(&self) -> usize {
        self.restored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .renders
            .len()
    }

    fn restore_render(&self, spec: &DeviceSpec) -> Result<Recreated, HalfError> {
        let render: RenderState =
            state::decode(&spec.format, RENDER_FORMAT, &spec.state).map_err(bad)?;
        let mut restored = self.restored.lock().unwrap_or_else(|e| e.into_inner());
        let fd = self.render(&mut restored, render.minor)?;
        let device_fd = dup_raw(fd)?;
        restored.served();
        Ok(Recreated {
            device_fd,
            buffers: Vec::new(),
        })
    }
}

/// Move `fd` to CRIU's fd floor for the task (so no fd CRIU restores later lands on it).
fn above_floor(fd: OwnedFd, ns_pid: u32) -> Result<OwnedFd, HalfError> {
    let Some(floor) = criu::unused_fd_floor(ns_pid) else {
        return Ok(fd);
    };
    let moved = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(floor))
        .map_err(|e| HalfError::new(e as i32, format!("moving a device fd to {floor}: {e}")))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(moved) })
}

/// A new descriptor for `fd`, owned by whoever gets the number (CRIU).
fn dup_raw(fd: RawFd) -> Result<RawFd, HalfError> {
    // SAFETY: `fd` is one of the render fds this half keeps open; borrowed for the dup.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed
        .try_clone_to_owned()
        .map(IntoRawFd::into_raw_fd)
        .map_err(|e| HalfError::new(e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))
}

impl PluginHalf for AmdgpuHalf {
    fn name(&self) -> &'static str {
        "amdgpu"
    }

    fn checkpoint(&self, pid: i32) -> Result<Option<Collected>, HalfError> {
        let Some(kfd) = self.kfd.task_kfd(pid).map_err(kernel)? else {
            return Ok(None);
        };
        match self.collect(pid, kfd.as_fd()) {
            Ok((state, buffers)) => {
                self.paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((pid, kfd));
                Ok(Some(Collected {
                    format: COLLECTED_FORMAT.into(),
                    state: state::encode(&state),
                    buffers,
                    run_thread: None,
                }))
            }
            Err(e) => {
                // PROCESS_INFO may have paused the queues before the failure.
                self.unpause_logged(pid, kfd.as_fd());
                Err(e)
            }
        }
    }

    fn owns_vma(&self, stat: &libc::stat) -> bool {
        self.kfd.kind_of(stat).is_some()
    }

    fn recreate(&self, spec: &DeviceSpec) -> Result<Recreated, HalfError> {
        match spec.format.as_str() {
            RESTORE_FORMAT => self.restore_kfd(spec),
            RENDER_FORMAT => self.restore_render(spec),
            other => Err(bad(format!(
                "the amdgpu plugin half cannot recreate {other:?} state"
            ))),
        }
    }

    fn update_vma(&self, path: &CStr, addr: u64, pgoff: u64) -> Option<(u64, RawFd)> {
        let path = path.to_str().ok()?.replace("//", "/");
        let render = path.starts_with("/dev/dri/renderD");
        if !render && path != gpucr_amdgpu::real::KFD_PATH {
            return None;
        }
        let mut restored = self.restored.lock().unwrap_or_else(|e| e.into_inner());
        let index = restored
            .vmas
            .iter()
            .position(|v| v.addr == addr && v.old_offset == pgoff)?;
        let vma = restored.vmas[index];
        if !render {
            // CRIU reopens /dev/kfd by path: KFD binds to the process's memory.
            return Some((vma.new_offset, -1));
        }
        // DRM only maps a buffer through the file that created it.
        let fd = restored.renders.get(&vma.minor)?.as_raw_fd();
        let answer = dup_raw(fd).ok().map(|fd| (vma.new_offset, fd));
        if vma.pending {
            restored.vmas[index].pending = false;
            restored.served();
        }
        answer
    }

    fn resume(&self, pid: i32) -> Result<(), HalfError> {
        let kfd = self.kfd.open_kfd().map_err(kernel)?;
        match self.kfd.resume(kfd.as_fd(), pid) {
            // No KFD process: the task holds no AMD GPU.
            Err(e) if e.errno == libc::ESRCH => Ok(()),
            other => other.map_err(kernel),
        }
    }

    fn finish(&self, stage: i32, _ret: i32) -> Vec<String> {
        if stage != stage::DUMP {
            return Vec::new();
        }
        // The dump is over (post-dump waited for every copy) or failed: every paused
        // task's queues run again, whether the tree lives on or is killed next.
        let paused = std::mem::take(&mut *self.paused.lock().unwrap_or_else(|e| e.into_inner()));
        paused
            .into_iter()
            .filter_map(|(pid, kfd)| self.unpause_logged(pid, kfd.as_fd()))
            .collect()
    }
}
