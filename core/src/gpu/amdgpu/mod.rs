//! The amdgpu backend's gpucr half: it takes over what the plugin half collected with
//! the KFD CRIU ops (the task's KFD state and one dmabuf per VRAM/GTT buffer), copies
//! the buffers with the GPUs' SDMA engines on render nodes of its own ([`engine`]), and
//! at restore tells the restored task what to recreate (KFD RESTORE with the gpu_ids the
//! topology check mapped, and its render nodes) and fills the buffers whose dmabufs the
//! task hands back. The kernel is reached through `gpucr_amdgpu`'s traits, so tests run
//! every step against its fake.

pub mod engine;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpucr_abi::proto::DeviceSpec;
use gpucr_amdgpu::state::{
    self, KfdState, RenderState, RestoreState, COLLECTED_FORMAT, RENDER_FORMAT, RESTORE_FORMAT,
    STATE_FORMAT,
};
use gpucr_amdgpu::{DeviceKind, Drm, Kfd};
use serde::{Deserialize, Serialize};

use self::engine::{DeviceBo, GpuEngine};
use super::{
    ns_pid, Backend, BufferInfo, Checkpointed, DeviceFile, DeviceRole, GpuError, GpuRef, TaskDevice,
};
use crate::cancel::Cancel;
use crate::transfer::{BufferSink, BufferSource};

/// The backend's name (manifest, `GPUCR_BACKEND`).
pub const NAME: &str = "amdgpu";
/// How long one SDMA fence may take, unless `GPUCR_AMDGPU_FENCE_TIMEOUT` says otherwise.
pub const DEFAULT_FENCE_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variable: the fence timeout (humantime, e.g. "30s").
pub const ENV_FENCE_TIMEOUT: &str = "GPUCR_AMDGPU_FENCE_TIMEOUT";
/// Environment variable: copy only on these SDMA rings (comma-separated ring numbers;
/// unset: every ring), to measure rings one by one.
pub const ENV_RINGS: &str = "GPUCR_AMDGPU_RINGS";

/// The task's device state in the image: the KFD state, and the render nodes the task
/// had open (by the render minor it had then and the GPU's actual gpu_id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmdgpuState {
    pub kfd: KfdState,
    pub render_nodes: Vec<RenderNode>,
}

/// A render node a task had open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderNode {
    /// Its minor on the dumping machine (the device file's path names it).
    pub dumped_minor: u32,
    /// The actual gpu_id of its GPU (rewritten by a remap).
    pub gpu_id: u32,
}

impl AmdgpuState {
    fn decode(task: &TaskDevice) -> Result<AmdgpuState, GpuError> {
        super::decode_state(task, STATE_FORMAT, "amdgpu backend")
    }
}

/// The amdgpu backend.
pub struct AmdgpuBackend {
    kfd: Arc<dyn Kfd>,
    drm: Arc<dyn Drm>,
    sysfs_root: Option<PathBuf>,
    /// Render minor of each GPU of this machine, by gpu_id.
    minors: BTreeMap<u32, u32>,
    engines: Mutex<HashMap<u32, Arc<GpuEngine>>>,
    fence_timeout: Duration,
    /// The SDMA rings to use (None: all).
    rings: Option<Vec<u32>>,
}

impl std::fmt::Debug for AmdgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdgpuBackend")
            .field("sysfs_root", &self.sysfs_root)
            .field("minors", &self.minors)
            .finish_non_exhaustive()
    }
}

impl AmdgpuBackend {
    /// The backend on this machine's kernel.
    pub fn load() -> Result<AmdgpuBackend, GpuError> {
        let timeout = match std::env::var(ENV_FENCE_TIMEOUT) {
            Ok(text) if !text.trim().is_empty() => {
                parse_fence_timeout(&text).map_err(|detail| GpuError::Config {
                    variable: ENV_FENCE_TIMEOUT,
                    value: text.clone(),
                    detail,
                })?
            }
            _ => DEFAULT_FENCE_TIMEOUT,
        };
        let rings = match std::env::var(ENV_RINGS) {
            Ok(text) if !text.trim().is_empty() => {
                Some(parse_rings(&text).map_err(|detail| GpuError::Config {
                    variable: ENV_RINGS,
                    value: text.clone(),
                    detail,
                })?)
            }
            _ => None,
        };
        let backend = AmdgpuBackend::new(
            Arc::new(gpucr_amdgpu::real::RealKfd),
            Arc::new(gpucr_amdgpu::real::RealDrm),
            None,
            timeout,
        )?;
        Ok(match rings {
            Some(rings) => backend.only_rings(rings),
            None => backend,
        })
    }

    /// The backend on `kfd` and `drm`, with the GPU topology under `sysfs_root` (None:
    /// this machine's).
    pub fn new(
        kfd: Arc<dyn Kfd>,
        drm: Arc<dyn Drm>,
        sysfs_root: Option<PathBuf>,
        fence_timeout: Duration,
    ) -> Result<AmdgpuBackend, GpuError> {
        let topology =
            gpucr_topology::read_local(sysfs_root.as_deref()).map_err(|e| GpuError::Config {
                variable: "sysfs",
                value: sysfs_root
                    .as_ref()
                    .map_or("/".into(), |p| p.display().to_string()),
                detail: e.to_string(),
            })?;
        let minors = topology
            .kfd_nodes
            .iter()
            .filter(|n| n.is_gpu())
            .map(|n| (n.gpu_id, n.prop("drm_render_minor") as u32))
            .collect();
        Ok(AmdgpuBackend {
            kfd,
            drm,
            sysfs_root,
            minors,
            engines: Mutex::new(HashMap::new()),
            fence_timeout,
            rings: None,
        })
    }

    /// Copy only on SDMA rings `rings` (of those each GPU offers).
    pub fn only_rings(mut self, rings: Vec<u32>) -> AmdgpuBackend {
        self.rings = Some(rings);
        self
    }

    /// The copy engine of GPU `gpu_id` (opened on first use, for task `pid`).
    pub fn engine(&self, gpu_id: u32, pid: i32) -> Result<Arc<GpuEngine>, GpuError> {
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = engines.get(&gpu_id) {
            return Ok(e.clone());
        }
        let minor = self.minor(gpu_id)?;
        let node = self.drm.open(minor).map_err(|e| GpuError::Task {
            pid,
            detail: format!("GPU {gpu_id:#x}: {e}"),
        })?;
        let engine = GpuEngine::new(gpu_id, node, self.fence_timeout, self.rings.as_deref())
            .map_err(|e| GpuError::Task {
                pid,
                detail: e.to_string(),
            })?;
        engines.insert(gpu_id, engine.clone());
        Ok(engine)
    }

    fn minor(&self, gpu_id: u32) -> Result<u32, GpuError> {
        self.minors
            .get(&gpu_id)
            .copied()
            .ok_or_else(|| GpuError::Config {
                variable: "gpu_id",
                value: format!("{gpu_id:#x}"),
                detail: "no GPU with this gpu_id in the KFD topology".into(),
            })
    }

    /// What the file behind `fd` is, if it is a KFD or render node.
    fn kind(&self, fd: BorrowedFd<'_>) -> Option<DeviceKind> {
        let stat = nix::sys::stat::fstat(fd).ok()?;
        self.kfd.kind_of(&stat)
    }

    /// The KFD and render nodes `pid` has open: (fd number, kind).
    fn device_fds(&self, pid: i32) -> Vec<(i32, DeviceKind)> {
        let fds = gpucr_abi::procfs::fd_dir(pid);
        gpucr_abi::procfs::fd_numbers(pid)
            .filter_map(|n| {
                let stat = nix::sys::stat::stat(format!("{fds}/{n}").as_str()).ok()?;
                Some((n, self.kfd.kind_of(&stat)?))
            })
            .collect()
    }

    /// Import buffer `what` of task `pid` (its dmabuf `fd`, `size` bytes on `gpu_id`).
    fn import(
        &self,
        pid: i32,
        gpu_id: u32,
        fd: BorrowedFd<'_>,
        size: u64,
        what: &str,
    ) -> Result<DeviceBo, GpuError> {
        let actual = fd_size(fd).map_err(GpuError::io(what))?;
        if actual != size {
            return Err(GpuError::Malformed {
                path: PathBuf::from(what),
                detail: format!("its dmabuf is {actual} bytes, the KFD state says {size}"),
            });
        }
        self.engine(gpu_id, pid)?
            .import(fd, size)
            .map_err(|e| GpuError::Task {
                pid,
                detail: format!("{what}: {e}"),
            })
    }
}

/// `GPUCR_AMDGPU_FENCE_TIMEOUT`: a humantime duration ("30s", "2min"). Engine mode's
/// settings are checked with it too (`gpucr install-plugin --setting`).
pub fn parse_fence_timeout(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (a duration such as 30s or 2min)"))
}

/// `GPUCR_AMDGPU_RINGS`: "0", "0,1". Engine mode's settings are checked with it too
/// (`gpucr install-plugin --setting`).
pub fn parse_rings(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|r| {
            r.trim()
                .parse::<u32>()
                .ok()
                .filter(|&r| r < 32)
                .ok_or_else(|| format!("{r:?} is not an SDMA ring number (0-31)"))
        })
        .collect()
}

/// Whether `pid` has /dev/kfd open (a ROCm process), by the links in /proc/PID/fd.
pub fn holds_kfd(pid: i32) -> bool {
    gpucr_abi::procfs::open_files(pid)
        .any(|(_, target)| target == std::path::Path::new(gpucr_amdgpu::real::KFD_PATH))
}

/// A dmabuf's size (lseek to its end, as libdrm does).
fn fd_size(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    let end = nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekEnd)?;
    Ok(end as u64)
}

/// Whether one of the process's buffers is a userptr buffer (its own CPU memory).
fn holds_userptr(kfd: &KfdState) -> bool {
    kfd.bos
        .iter()
        .any(|bo| bo.alloc_flags & gpucr_abi::kfd::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR != 0)
}

fn kind_name(alloc_flags: u32) -> &'static str {
    if alloc_flags & gpucr_abi::kfd::KFD_IOC_ALLOC_MEM_FLAGS_VRAM != 0 {
        "vram"
    } else {
        "gtt"
    }
}

/// How buffers are named in messages and the manifest (by GPU VA, which a restore
/// keeps; the gpu_id is in the buffer table).
fn bo_name(addr: u64) -> String {
    format!("bo va {addr:#x}")
}

/// A buffer being dumped, read through its GPU's SDMA engine.
#[derive(Debug)]
struct Source(DeviceBo);

impl BufferSource for Source {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8], cancel: &Cancel) -> std::io::Result<()> {
        Ok(self.0.read(offset, buf, cancel)?)
    }
}

/// A buffer being restored, written through its GPU's SDMA engine, double buffered:
/// every byte is written once (it does not start zeroed), so the write that brings the
/// count to the buffer's size is its last, which waits for all.
#[derive(Debug)]
struct Sink {
    bo: DeviceBo,
    queue: u32,
    written: std::sync::atomic::AtomicU64,
}

impl BufferSink for Sink {
    fn len(&self) -> u64 {
        self.bo.len()
    }

    fn write_at(&self, offset: u64, data: &[u8], cancel: &Cancel) -> std::io::Result<()> {
        let n = data.len() as u64;
        let before = self
            .written
            .fetch_add(n, std::sync::atomic::Ordering::AcqRel);
        let last = before + n >= self.bo.len();
        Ok(self.bo.write_behind(offset, data, last, cancel)?)
    }

    fn queue(&self) -> u32 {
        self.queue
    }
}

impl Backend for AmdgpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn holds_device(&self, pid: i32) -> bool {
        self.device_fds(pid)
            .iter()
            .any(|(_, k)| *k == DeviceKind::Kfd)
    }

    /// KFD's resume after a dump only restarts the queues: the device memory never
    /// left the device, and no CPU page of the process is written.
    fn gives_back_into_memory(&self, _pids: &[i32]) -> bool {
        false
    }

    /// The GPUs whose render nodes the tasks hold open (the ROCm runtime opens one for
    /// each GPU it lets the process see).
    fn gpus_in_use(&self, pids: &[i32], _local: &gpucr_topology::Topology) -> Option<Vec<GpuRef>> {
        let used: BTreeSet<u32> = pids
            .iter()
            .flat_map(|&pid| self.device_fds(pid))
            .filter_map(|(_, kind)| match kind {
                DeviceKind::Render { minor } => self
                    .minors
                    .iter()
                    .find_map(|(&gpu_id, &m)| (m == minor).then_some(gpu_id)),
                DeviceKind::Kfd => None,
            })
            .collect();
        (!used.is_empty()).then(|| used.into_iter().map(GpuRef::Kfd).collect())
    }

    fn adopt_task(
        &self,
        pid: i32,
        format: &str,
        state: &[u8],
        buffers: Vec<OwnedFd>,
        cancel: &Cancel,
    ) -> Result<Option<Checkpointed>, GpuError> {
        // The buffers are imported here (quick ioctls); the copies, which wait for the
        // engines, take the transfer's token.
        cancel.check()?;
        if state.is_empty() {
            return Ok(None);
        }
        let malformed = |detail: String| GpuError::Task { pid, detail };
        let kfd: KfdState = state::decode(format, COLLECTED_FORMAT, state).map_err(malformed)?;
        let content: Vec<_> = kfd.content_bos().map(|(_, b)| *b).collect();
        if content.len() != buffers.len() {
            return Err(malformed(format!(
                "{} VRAM/GTT buffers described, {} dmabufs received",
                content.len(),
                buffers.len()
            )));
        }
        let mut infos = Vec::with_capacity(content.len());
        let mut sources: Vec<Box<dyn BufferSource>> = Vec::with_capacity(content.len());
        for (bo, fd) in content.iter().zip(&buffers) {
            let gpu = kfd.actual_gpu(bo.gpu_id).ok_or_else(|| {
                malformed(format!(
                    "buffer at {:#x} is on gpu_id {:#x}, which is not one of the process's",
                    bo.addr, bo.gpu_id
                ))
            })?;
            let name = bo_name(bo.addr);
            sources.push(Box::new(Source(self.import(
                pid,
                gpu,
                fd.as_fd(),
                bo.size,
                &name,
            )?)));
            infos.push(BufferInfo {
                path: name,
                size: bo.size,
                gpu_id: gpu,
                kind: kind_name(bo.alloc_flags).into(),
                mode: 0,
            });
        }
        let minor_gpu: BTreeMap<u32, u32> = self.minors.iter().map(|(&g, &m)| (m, g)).collect();
        let render_nodes = self
            .device_fds(pid)
            .into_iter()
            .filter_map(|(_, k)| match k {
                DeviceKind::Render { minor } => Some(minor),
                DeviceKind::Kfd => None,
            })
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .filter_map(|minor| {
                Some(RenderNode {
                    dumped_minor: minor,
                    gpu_id: *minor_gpu.get(&minor)?,
                })
            })
            .collect();
        let gpus = kfd
            .devices
            .iter()
            .map(|d| GpuRef::Kfd(d.actual_gpu_id))
            .collect();
        let device = TaskDevice {
            ns_pid: ns_pid(pid)?,
            host_pid: pid,
            gpus,
            device_files: Vec::new(),
            state_format: STATE_FORMAT.into(),
            state: state::encode(&AmdgpuState { kfd, render_nodes }),
            buffers: infos,
            operations: Vec::new(),
        };
        Ok(Some(Checkpointed { device, sources }))
    }

    fn file_owner(&self, fd: BorrowedFd<'_>, tasks: &[i32]) -> Result<Option<i32>, GpuError> {
        if self.kind(fd).is_none() {
            return Ok(None);
        }
        Ok(super::owner_of(fd, tasks))
    }

    fn file_role(&self, fd: BorrowedFd<'_>) -> (DeviceRole, Option<String>) {
        match self.kind(fd) {
            Some(DeviceKind::Render { minor }) => (
                DeviceRole::Render,
                Some(gpucr_amdgpu::real::render_path(minor)),
            ),
            _ => (
                DeviceRole::Device,
                Some(gpucr_amdgpu::real::KFD_PATH.into()),
            ),
        }
    }

    fn restore_spec(&self, task: &TaskDevice) -> Result<DeviceSpec, GpuError> {
        let state = AmdgpuState::decode(task)?;
        let render_minors = state
            .kfd
            .devices
            .iter()
            .map(|d| self.minor(d.actual_gpu_id))
            .collect::<Result<_, _>>()?;
        let render_files = task
            .device_files
            .iter()
            .filter(|f| f.role == DeviceRole::Render)
            .count() as u32;
        let restore = RestoreState {
            kfd: state.kfd,
            render_minors,
            render_files,
        };
        Ok(DeviceSpec {
            device_path: gpucr_amdgpu::real::KFD_PATH.into(),
            device_flags: libc::O_RDWR,
            format: RESTORE_FORMAT.into(),
            state: state::encode(&restore),
            ..DeviceSpec::default()
        })
    }

    /// A KFD userptr buffer is the task's own memory, which the kernel pins at RESUME
    /// (not through the task's faults): an on-demand restore brings the task's memory
    /// in first. A state that does not decode says yes: its restore fails anyway.
    fn resume_reads_process_memory(&self, task: &TaskDevice) -> bool {
        AmdgpuState::decode(task).map_or(true, |state| holds_userptr(&state.kfd))
    }

    fn file_spec(&self, task: &TaskDevice, file: &DeviceFile) -> Result<DeviceSpec, GpuError> {
        let state = AmdgpuState::decode(task)?;
        let dumped_minor = file
            .path
            .strip_prefix("/dev/dri/renderD")
            .and_then(|m| m.parse::<u32>().ok());
        let node = state
            .render_nodes
            .iter()
            .find(|n| Some(n.dumped_minor) == dumped_minor)
            .ok_or_else(|| GpuError::Task {
                pid: task.host_pid,
                detail: format!(
                    "task {}: {} is not a render node of its GPUs",
                    task.ns_pid, file.path
                ),
            })?;
        let minor = self.minor(node.gpu_id)?;
        Ok(DeviceSpec {
            device_path: gpucr_amdgpu::real::render_path(minor),
            device_flags: libc::O_RDWR,
            format: RENDER_FORMAT.into(),
            state: state::encode(&RenderState {
                gpu_id: node.gpu_id,
                minor,
            }),
            ..DeviceSpec::default()
        })
    }

    fn buffer_sink(
        &self,
        task: &TaskDevice,
        index: usize,
        file: File,
    ) -> Result<Box<dyn BufferSink>, GpuError> {
        let info = task.buffers.get(index).ok_or_else(|| GpuError::Task {
            pid: task.host_pid,
            detail: format!("no buffer {index} in the task's buffer table"),
        })?;
        // Messages name the task by its pid in the image.
        let pid = task.ns_pid as i32;
        let bo = self.import(pid, info.gpu_id, file.as_fd(), info.size, &info.path)?;
        let rings = bo_rings(&*self.engine(info.gpu_id, pid)?);
        // One writer per ring: a GPU's buffers spread over its rings.
        let queue = (info.gpu_id << 5) | (index as u32 % rings);
        Ok(Box::new(Sink {
            bo,
            queue,
            written: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    fn sysfs_root(&self) -> Option<PathBuf> {
        self.sysfs_root.clone()
    }

    fn state_root(&self) -> Option<PathBuf> {
        None
    }

    fn remap_gpus(&self, task: &mut TaskDevice, map: &[(GpuRef, GpuRef)]) -> Result<(), GpuError> {
        let new_id = |old: u32| {
            map.iter()
                .find_map(|pair| match pair {
                    (GpuRef::Kfd(from), GpuRef::Kfd(to)) if *from == old => Some(*to),
                    _ => None,
                })
                .unwrap_or(old)
        };
        let mut state = AmdgpuState::decode(task)?;
        for d in &mut state.kfd.devices {
            d.actual_gpu_id = new_id(d.actual_gpu_id);
        }
        for n in &mut state.render_nodes {
            n.gpu_id = new_id(n.gpu_id);
        }
        for b in &mut task.buffers {
            b.gpu_id = new_id(b.gpu_id);
        }
        for g in &mut task.gpus {
            if let GpuRef::Kfd(id) = g {
                *id = new_id(*id);
            }
        }
        task.state = state::encode(&state);
        Ok(())
    }
}

fn bo_rings(engine: &GpuEngine) -> u32 {
    (engine.rings().len() as u32).clamp(1, 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_task_with_userptr_buffers_has_its_memory_brought_in_before_resume() {
        use gpucr_abi::kfd::{
            KFD_IOC_ALLOC_MEM_FLAGS_GTT, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
            KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
        };
        let bo = |alloc_flags| gpucr_amdgpu::state::KfdBo {
            addr: 0x7000_0000,
            size: 1 << 20,
            offset: 0,
            gpu_id: 1,
            alloc_flags,
            mapped: None,
        };
        let kfd = |bos| KfdState {
            kfd_pid: 1,
            num_objects: 0,
            priv_data: Vec::new(),
            devices: Vec::new(),
            bos,
        };
        assert!(!holds_userptr(&kfd(vec![
            bo(KFD_IOC_ALLOC_MEM_FLAGS_VRAM),
            bo(KFD_IOC_ALLOC_MEM_FLAGS_GTT)
        ])));
        assert!(holds_userptr(&kfd(vec![
            bo(KFD_IOC_ALLOC_MEM_FLAGS_VRAM),
            bo(KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
        ])));
    }

    #[test]
    fn ring_lists_parse() {
        assert_eq!(parse_rings("0").unwrap(), [0]);
        assert_eq!(parse_rings(" 0, 1 ").unwrap(), [0, 1]);
        for bad in ["", "x", "0,,1", "32", "-1"] {
            assert!(parse_rings(bad).is_err(), "{bad}");
        }
    }
}
