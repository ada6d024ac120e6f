//! The kernel operations gpucr's amdgpu backend uses, as traits: one implementation issues
//! the ioctls ([`crate::real`]), the other models them (`crate::fake`).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use gpucr_abi::kfd::{KfdCriuBoBucket, KfdCriuDeviceBucket};

/// A kernel operation that failed: which one, on what, and the errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}{}: {}", if .what.is_empty() { String::new() } else { format!(" ({})", .what) }, std::io::Error::from_raw_os_error(*.errno))]
pub struct KernelError {
    /// The operation: "KFD CRIU_OP PROCESS_INFO", "DRM_IOCTL_AMDGPU_CS", "open /dev/kfd".
    pub op: String,
    /// What it was done to ("pid 1234", "/dev/dri/renderD128", "ring 1").
    pub what: String,
    pub errno: i32,
}

impl KernelError {
    pub fn new(op: impl Into<String>, what: impl Into<String>, errno: i32) -> KernelError {
        KernelError {
            op: op.into(),
            what: what.into(),
            errno,
        }
    }

    /// The calling thread's errno after a failed call.
    pub fn last(op: impl Into<String>, what: impl Into<String>) -> KernelError {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        KernelError::new(op, what, errno)
    }
}

/// What a device node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// `/dev/kfd`.
    Kfd,
    /// `/dev/dri/renderD<minor>`.
    Render { minor: u32 },
}

/// A mapping of a KFD or render node in a process (from /proc/PID/maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMapping {
    pub start: u64,
    /// The mmap byte offset.
    pub offset: u64,
    pub kind: DeviceKind,
}

/// PROCESS_INFO's answer (the process's queues are paused from then on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessInfo {
    /// The process's pid in its own PID namespace.
    pub pid: u32,
    pub num_devices: u32,
    pub num_bos: u32,
    /// Queues, events and SVM ranges.
    pub num_objects: u32,
    pub priv_data_size: u64,
}

/// CHECKPOINT's answer.
#[derive(Debug)]
pub struct KfdCheckpoint {
    pub devices: Vec<KfdCriuDeviceBucket>,
    pub bos: Vec<KfdCriuBoBucket>,
    /// Per buffer (bucket order): the dmabuf the kernel exported for a VRAM or GTT
    /// buffer, now owned by the caller; None for the others.
    pub dmabufs: Vec<Option<OwnedFd>>,
    pub priv_data: Vec<u8>,
}

/// RESTORE's input and output.
#[derive(Debug)]
pub struct RestoreRequest {
    /// One per GPU: user gpu_id, actual gpu_id and a render fd of the actual GPU.
    pub devices: Vec<KfdCriuDeviceBucket>,
    /// In: the buffers as checkpointed; out: `restored_offset` and `dmabuf_fd` set.
    pub bos: Vec<KfdCriuBoBucket>,
    pub priv_data: Vec<u8>,
    pub num_objects: u32,
}

/// `/dev/kfd` and the KFD CRIU operations. Which process may issue what: PROCESS_INFO,
/// CHECKPOINT and UNPAUSE only CRIU's tracer, on the task's own kfd file; RESTORE the
/// restored task itself; RESUME anyone with CAP_CHECKPOINT_RESTORE, by pid.
pub trait Kfd: Send + Sync {
    /// What the file with `stat` is, if it is one of the KFD or render nodes.
    fn kind_of(&self, stat: &libc::stat) -> Option<DeviceKind>;
    /// The kfd file `pid` has open, duplicated into this process (pidfd_getfd), or None.
    fn task_kfd(&self, pid: i32) -> Result<Option<OwnedFd>, KernelError>;
    /// The mappings of KFD and render nodes in `pid`.
    fn device_mappings(&self, pid: i32) -> Result<Vec<DeviceMapping>, KernelError>;
    /// Open `/dev/kfd` (O_RDWR | O_CLOEXEC).
    fn open_kfd(&self) -> Result<OwnedFd, KernelError>;
    /// Open `/dev/dri/renderD<minor>` (O_RDWR | O_CLOEXEC).
    fn open_render(&self, minor: u32) -> Result<OwnedFd, KernelError>;
    /// GET_VERSION: (major, minor).
    fn version(&self, kfd: BorrowedFd<'_>) -> Result<(u32, u32), KernelError>;
    fn process_info(&self, kfd: BorrowedFd<'_>) -> Result<ProcessInfo, KernelError>;
    fn checkpoint(
        &self,
        kfd: BorrowedFd<'_>,
        info: &ProcessInfo,
    ) -> Result<KfdCheckpoint, KernelError>;
    fn unpause(&self, kfd: BorrowedFd<'_>) -> Result<(), KernelError>;
    /// RESTORE on the caller's own kfd file: the buffers' new dmabufs (bucket order;
    /// None where the kernel exports none).
    fn restore(
        &self,
        kfd: BorrowedFd<'_>,
        request: &mut RestoreRequest,
    ) -> Result<Vec<Option<OwnedFd>>, KernelError>;
    /// RESUME the KFD process of `pid` (in the caller's PID namespace).
    fn resume(&self, kfd: BorrowedFd<'_>, pid: i32) -> Result<(), KernelError>;
}

/// What gpucr needs to know of a GPU to copy with its SDMA engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `AMDGPU_FAMILY_*`.
    pub family: u32,
    /// The SDMA IP's major version (decides the copy packet's count field).
    pub sdma_major: u32,
    /// The SDMA rings the kernel offers (`available_rings` bits).
    pub rings: Vec<u32>,
    /// The general GPU VA range gpucr may place its own buffers in.
    pub va_start: u64,
    pub va_end: u64,
}

/// A render node of gpucr's own: a DRM file with its own GPU VM.
pub trait RenderNode: Send + Sync {
    fn info(&self) -> Result<NodeInfo, KernelError>;
    /// PRIME_FD_TO_HANDLE: a GEM handle for `dmabuf`.
    fn import(&self, dmabuf: BorrowedFd<'_>) -> Result<u32, KernelError>;
    /// GEM_USERPTR over `size` bytes at `addr` (both page-aligned, anonymous memory).
    ///
    /// # Safety
    /// The memory must stay mapped, and not be used by anything but the GPU copies and
    /// their owner, until the handle is closed.
    unsafe fn userptr(&self, addr: *mut u8, size: u64) -> Result<u32, KernelError>;
    /// GEM_CREATE in GTT.
    fn create_gtt(&self, size: u64) -> Result<u32, KernelError>;
    /// GEM_MMAP and mmap: the buffer's memory in this process.
    fn map_cpu(&self, handle: u32, size: u64) -> Result<memmap2::MmapMut, KernelError>;
    /// GEM_VA MAP (readable, writeable) of the whole buffer at `va`.
    fn va_map(&self, handle: u32, va: u64, size: u64) -> Result<(), KernelError>;
    fn va_unmap(&self, handle: u32, va: u64, size: u64) -> Result<(), KernelError>;
    /// GEM_CLOSE.
    fn close(&self, handle: u32) -> Result<(), KernelError>;
    /// BO_LIST CREATE.
    fn bo_list(&self, handles: &[u32]) -> Result<u32, KernelError>;
    fn bo_list_destroy(&self, list: u32) -> Result<(), KernelError>;
    /// CTX ALLOC_CTX.
    fn ctx_create(&self) -> Result<u32, KernelError>;
    fn ctx_free(&self, ctx: u32) -> Result<(), KernelError>;
    /// CS: one SDMA indirect buffer of `dwords` dwords at `ib_va` on `ring`; its
    /// sequence number.
    fn submit(
        &self,
        ctx: u32,
        list: u32,
        ring: u32,
        ib_va: u64,
        dwords: u32,
    ) -> Result<u64, KernelError>;
    /// WAIT_CS: true when submission `seq` finished within `timeout`.
    fn wait(&self, ctx: u32, ring: u32, seq: u64, timeout: Duration) -> Result<bool, KernelError>;
}

/// Opens render nodes.
pub trait Drm: Send + Sync {
    fn open(&self, minor: u32) -> Result<std::sync::Arc<dyn RenderNode>, KernelError>;
}
