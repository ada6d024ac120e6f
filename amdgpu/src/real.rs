//! The kernel itself: the KFD and amdgpu DRM ioctls declared in `gpucr_abi`, and the
//! generic DRM ones (PRIME import, GEM close) through `drm-ffi`.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use gpucr_abi::amdgpu_drm::*;
use gpucr_abi::kfd::*;
use gpucr_abi::procfs::{self, Mapping};

use crate::kernel::{
    DeviceKind, DeviceMapping, Drm, KernelError, Kfd, KfdCheckpoint, NodeInfo, ProcessInfo,
    RenderNode, RestoreRequest,
};

/// The KFD node.
pub const KFD_PATH: &str = "/dev/kfd";
/// The DRM major of render nodes.
pub const DRM_MAJOR: u32 = 226;
/// Render-node minors.
pub const RENDER_MINORS: std::ops::RangeInclusive<u32> = 128..=255;

/// How often an ioctl interrupted (EINTR) or told to retry (EAGAIN) is retried.
const RETRIES: usize = 200;

/// The path of render node `minor`.
pub fn render_path(minor: u32) -> String {
    format!("/dev/dri/renderD{minor}")
}

/// ioctl `request` on `fd` with `arg`, retried on EINTR and EAGAIN.
///
/// # Safety
/// `request` must be an ioctl whose argument is a `T` (and whatever user pointers the
/// `T` holds must be valid for the kernel to read and write as the request says).
unsafe fn ioctl<T>(
    fd: RawFd,
    request: u32,
    arg: &mut T,
    op: &str,
    what: &str,
) -> Result<(), KernelError> {
    for _ in 0..RETRIES {
        // SAFETY: the caller guarantees `request` takes a `T`; `arg` is a valid, exclusive
        // reference for the call.
        let ret = unsafe { libc::ioctl(fd, request as _, arg as *mut T) };
        if ret == 0 {
            return Ok(());
        }
        let err = KernelError::last(op, what);
        if err.errno != libc::EINTR && err.errno != libc::EAGAIN {
            return Err(err);
        }
    }
    Err(KernelError::new(op, what, libc::EAGAIN))
}

fn open(path: &str) -> Result<OwnedFd, KernelError> {
    let c = CString::new(path).map_err(|_| KernelError::new("open", path, libc::EINVAL))?;
    // SAFETY: a NUL-terminated path and plain flags.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(KernelError::last("open", path));
    }
    // SAFETY: open just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The KFD of this machine.
#[derive(Debug, Default)]
pub struct RealKfd;

fn criu_op(
    kfd: BorrowedFd<'_>,
    args: &mut KfdIoctlCriuArgs,
    name: &str,
    what: &str,
) -> Result<(), KernelError> {
    // SAFETY: AMDKFD_IOC_CRIU_OP takes a kfd_ioctl_criu_args; the callers point its
    // user pointers at arrays of the sizes the counts say, alive for the call.
    unsafe {
        ioctl(
            kfd.as_raw_fd(),
            AMDKFD_IOC_CRIU_OP,
            args,
            &format!("KFD CRIU_OP {name}"),
            what,
        )
    }
}

impl Kfd for RealKfd {
    fn kind_of(&self, stat: &libc::stat) -> Option<DeviceKind> {
        if stat.st_mode & libc::S_IFMT != libc::S_IFCHR {
            return None;
        }
        let major = libc::major(stat.st_rdev);
        let minor = libc::minor(stat.st_rdev);
        if major == DRM_MAJOR && RENDER_MINORS.contains(&minor) {
            return Some(DeviceKind::Render { minor });
        }
        let kfd = nix::sys::stat::stat(KFD_PATH).ok()?;
        (kfd.st_rdev == stat.st_rdev).then_some(DeviceKind::Kfd)
    }

    fn task_kfd(&self, pid: i32) -> Result<Option<OwnedFd>, KernelError> {
        // An fd table that cannot be read is an error here, not "no KFD open".
        let dir = gpucr_abi::procfs::fd_dir(pid);
        let Some(number) = gpucr_abi::procfs::read_open_files(pid)
            .map_err(|e| KernelError::new("read_dir", &dir, errno(&e)))?
            .find_map(|(fd, target)| (target == std::path::Path::new(KFD_PATH)).then_some(fd))
        else {
            return Ok(None);
        };
        let what = format!("pid {pid} fd {number}");
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            return Err(KernelError::last("pidfd_open", what));
        }
        // SAFETY: pidfd_open returned this descriptor; nothing else owns it.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that process and
        // flags, and returns a new descriptor (close-on-exec) or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), number, 0) };
        if fd < 0 {
            return Err(KernelError::last("pidfd_getfd", what));
        }
        // SAFETY: pidfd_getfd installed this descriptor in our table; nothing else owns it.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    fn device_mappings(&self, pid: i32) -> Result<Vec<DeviceMapping>, KernelError> {
        let mappings = procfs::mappings(pid).map_err(|e| {
            KernelError::new(
                "read",
                procfs::maps_path(pid).display().to_string(),
                errno(&e),
            )
        })?;
        Ok(mappings.iter().filter_map(device_mapping).collect())
    }

    fn open_kfd(&self) -> Result<OwnedFd, KernelError> {
        open(KFD_PATH)
    }

    fn open_render(&self, minor: u32) -> Result<OwnedFd, KernelError> {
        open(&render_path(minor))
    }

    fn version(&self, kfd: BorrowedFd<'_>) -> Result<(u32, u32), KernelError> {
        let mut args = KfdIoctlGetVersionArgs::default();
        // SAFETY: AMDKFD_IOC_GET_VERSION takes a kfd_ioctl_get_version_args.
        unsafe {
            ioctl(
                kfd.as_raw_fd(),
                AMDKFD_IOC_GET_VERSION,
                &mut args,
                "KFD GET_VERSION",
                KFD_PATH,
            )?
        };
        Ok((args.major_version, args.minor_version))
    }

    fn process_info(&self, kfd: BorrowedFd<'_>) -> Result<ProcessInfo, KernelError> {
        let mut args = KfdIoctlCriuArgs {
            op: KfdCriuOp::ProcessInfo as u32,
            ..Default::default()
        };
        criu_op(kfd, &mut args, "PROCESS_INFO", "")?;
        Ok(ProcessInfo {
            pid: args.pid,
            num_devices: args.num_devices,
            num_bos: args.num_bos,
            num_objects: args.num_objects,
            priv_data_size: args.priv_data_size,
        })
    }

    fn checkpoint(
        &self,
        kfd: BorrowedFd<'_>,
        info: &ProcessInfo,
    ) -> Result<KfdCheckpoint, KernelError> {
        let mut devices = vec![KfdCriuDeviceBucket::default(); info.num_devices as usize];
        let mut bos = vec![KfdCriuBoBucket::default(); info.num_bos as usize];
        let mut priv_data = vec![0u8; info.priv_data_size as usize];
        let mut args = KfdIoctlCriuArgs {
            devices: devices.as_mut_ptr() as u64,
            bos: bos.as_mut_ptr() as u64,
            priv_data: priv_data.as_mut_ptr() as u64,
            priv_data_size: info.priv_data_size,
            num_devices: info.num_devices,
            num_bos: info.num_bos,
            num_objects: info.num_objects,
            pid: info.pid,
            op: KfdCriuOp::Checkpoint as u32,
        };
        criu_op(kfd, &mut args, "CHECKPOINT", &format!("pid {}", info.pid))?;
        let dmabufs = bos.iter().map(|b| take_dmabuf(b.dmabuf_fd)).collect();
        Ok(KfdCheckpoint {
            devices,
            bos,
            dmabufs,
            priv_data,
        })
    }

    fn unpause(&self, kfd: BorrowedFd<'_>) -> Result<(), KernelError> {
        let mut args = KfdIoctlCriuArgs {
            op: KfdCriuOp::Unpause as u32,
            ..Default::default()
        };
        criu_op(kfd, &mut args, "UNPAUSE", "")
    }

    fn restore(
        &self,
        kfd: BorrowedFd<'_>,
        request: &mut RestoreRequest,
    ) -> Result<Vec<Option<OwnedFd>>, KernelError> {
        let mut args = KfdIoctlCriuArgs {
            devices: request.devices.as_mut_ptr() as u64,
            bos: request.bos.as_mut_ptr() as u64,
            priv_data: request.priv_data.as_mut_ptr() as u64,
            priv_data_size: request.priv_data.len() as u64,
            num_devices: request.devices.len() as u32,
            num_bos: request.bos.len() as u32,
            num_objects: request.num_objects,
            pid: 0,
            op: KfdCriuOp::Restore as u32,
        };
        criu_op(kfd, &mut args, "RESTORE", "")?;
        Ok(request
            .bos
            .iter()
            .map(|b| take_dmabuf(b.dmabuf_fd))
            .collect())
    }

    fn resume(&self, kfd: BorrowedFd<'_>, pid: i32) -> Result<(), KernelError> {
        let mut args = KfdIoctlCriuArgs {
            pid: pid as u32,
            op: KfdCriuOp::Resume as u32,
            ..Default::default()
        };
        criu_op(kfd, &mut args, "RESUME", &format!("pid {pid}"))
    }
}

/// A line of /proc/PID/maps, if it maps /dev/kfd or a render node.
fn device_mapping(mapping: &Mapping) -> Option<DeviceMapping> {
    let path = mapping.path.as_deref()?.to_str()?;
    let kind = if path == KFD_PATH {
        DeviceKind::Kfd
    } else {
        let minor = path.strip_prefix("/dev/dri/renderD")?.parse().ok()?;
        DeviceKind::Render { minor }
    };
    Some(DeviceMapping {
        start: mapping.start,
        offset: mapping.offset,
        kind,
    })
}

/// Own a dmabuf fd the kernel installed in our table (KFD_INVALID_FD: none).
fn take_dmabuf(fd: u32) -> Option<OwnedFd> {
    // SAFETY: CHECKPOINT and RESTORE install a new descriptor per VRAM/GTT buffer in the
    // caller's table and report it in the bucket; nothing else owns it.
    (fd != KFD_INVALID_FD).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// This machine's render nodes.
#[derive(Debug, Default)]
pub struct RealDrm;

impl Drm for RealDrm {
    fn open(&self, minor: u32) -> Result<Arc<dyn RenderNode>, KernelError> {
        let path = render_path(minor);
        Ok(Arc::new(RealNode {
            fd: open(&path)?,
            path,
        }))
    }
}

/// A render node of gpucr's own.
#[derive(Debug)]
pub struct RealNode {
    fd: OwnedFd,
    path: String,
}

impl RealNode {
    /// A generic DRM ioctl through `drm-ffi`, retried on EINTR and EAGAIN as [`ioctl`]
    /// retries the others.
    fn generic<T>(
        &self,
        op: &str,
        call: impl Fn() -> std::io::Result<T>,
    ) -> Result<T, KernelError> {
        for _ in 0..RETRIES {
            match call() {
                Ok(value) => return Ok(value),
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    if errno != libc::EINTR && errno != libc::EAGAIN {
                        return Err(KernelError::new(op, &self.path, errno));
                    }
                }
            }
        }
        Err(KernelError::new(op, &self.path, libc::EAGAIN))
    }

    /// # Safety
    /// As for [`ioctl`].
    unsafe fn ioctl<T>(&self, request: u32, arg: &mut T, op: &str) -> Result<(), KernelError> {
        // SAFETY: passed on to the caller.
        unsafe { ioctl(self.fd.as_raw_fd(), request, arg, op, &self.path) }
    }

    fn query<T: Default>(&self, mut info: DrmAmdgpuInfo) -> Result<T, KernelError> {
        let mut out = T::default();
        info.return_pointer = &mut out as *mut T as u64;
        info.return_size = size_of::<T>() as u32;
        // SAFETY: DRM_IOCTL_AMDGPU_INFO takes a drm_amdgpu_info whose return pointer is
        // `out`, `return_size` bytes, alive for the call.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_INFO, &mut info, "DRM_IOCTL_AMDGPU_INFO")? };
        Ok(out)
    }
}

impl RenderNode for RealNode {
    fn info(&self) -> Result<NodeInfo, KernelError> {
        let mut dev_query = DrmAmdgpuInfo::hw_ip(AMDGPU_INFO_DEV_INFO, 0, 0);
        dev_query.query = AMDGPU_INFO_DEV_INFO;
        let dev: DrmAmdgpuInfoDevice = self.query(dev_query)?;
        let ip: DrmAmdgpuInfoHwIp = self.query(DrmAmdgpuInfo::hw_ip(
            AMDGPU_INFO_HW_IP_INFO,
            AMDGPU_HW_IP_DMA,
            0,
        ))?;
        let rings = (0..32)
            .filter(|r| ip.available_rings & (1 << r) != 0)
            .collect();
        Ok(NodeInfo {
            family: dev.family,
            sdma_major: ip.hw_ip_version_major,
            rings,
            va_start: dev.virtual_address_offset.max(1 << 32),
            va_end: dev.virtual_address_max,
        })
    }

    fn import(&self, dmabuf: BorrowedFd<'_>) -> Result<u32, KernelError> {
        self.generic("PRIME_FD_TO_HANDLE", || {
            drm_ffi::gem::fd_to_handle(self.fd.as_fd(), dmabuf).map(|prime| prime.handle)
        })
    }

    unsafe fn userptr(&self, addr: *mut u8, size: u64) -> Result<u32, KernelError> {
        let mut args = DrmAmdgpuGemUserptr {
            addr: addr as u64,
            size,
            flags: AMDGPU_GEM_USERPTR_ANONONLY
                | AMDGPU_GEM_USERPTR_VALIDATE
                | AMDGPU_GEM_USERPTR_REGISTER,
            handle: 0,
        };
        // SAFETY: DRM_IOCTL_AMDGPU_GEM_USERPTR takes a drm_amdgpu_gem_userptr; the caller
        // keeps the memory alive until the handle is closed.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_GEM_USERPTR, &mut args, "GEM_USERPTR")? };
        Ok(args.handle)
    }

    fn create_gtt(&self, size: u64) -> Result<u32, KernelError> {
        let mut args = DrmAmdgpuGemCreate {
            r#in: DrmAmdgpuGemCreateIn {
                bo_size: size,
                alignment: 4096,
                domains: AMDGPU_GEM_DOMAIN_GTT,
                domain_flags: 0,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_GEM_CREATE takes a union drm_amdgpu_gem_create.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_GEM_CREATE, &mut args, "GEM_CREATE")? };
        // SAFETY: on success the kernel wrote the `out` member.
        Ok(unsafe { args.out.handle })
    }

    fn map_cpu(&self, handle: u32, size: u64) -> Result<memmap2::MmapMut, KernelError> {
        let mut args = DrmAmdgpuGemMmap {
            r#in: DrmAmdgpuGemMmapIn { handle, _pad: 0 },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_GEM_MMAP takes a union drm_amdgpu_gem_mmap.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_GEM_MMAP, &mut args, "GEM_MMAP")? };
        // SAFETY: on success the kernel wrote the `out` member.
        let offset = unsafe { args.out.addr_ptr };
        // SAFETY: the mapping is of the render node at the offset the kernel gave for
        // this buffer, `size` bytes (the buffer's size); it is device memory nothing
        // else in this process maps.
        unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(size as usize)
                .map_mut(self.fd.as_raw_fd())
        }
        .map_err(|e| KernelError::new("mmap", &self.path, errno(&e)))
    }

    fn va_map(&self, handle: u32, va: u64, size: u64) -> Result<(), KernelError> {
        self.va_op(handle, va, size, AMDGPU_VA_OP_MAP)
    }

    fn va_unmap(&self, handle: u32, va: u64, size: u64) -> Result<(), KernelError> {
        self.va_op(handle, va, size, AMDGPU_VA_OP_UNMAP)
    }

    fn close(&self, handle: u32) -> Result<(), KernelError> {
        self.generic("GEM_CLOSE", || {
            drm_ffi::gem::close(self.fd.as_fd(), handle).map(|_| ())
        })
    }

    fn bo_list(&self, handles: &[u32]) -> Result<u32, KernelError> {
        let entries: Vec<DrmAmdgpuBoListEntry> = handles
            .iter()
            .map(|&bo_handle| DrmAmdgpuBoListEntry {
                bo_handle,
                bo_priority: 0,
            })
            .collect();
        let mut args = DrmAmdgpuBoList {
            r#in: DrmAmdgpuBoListIn {
                operation: AMDGPU_BO_LIST_OP_CREATE,
                list_handle: 0,
                bo_number: entries.len() as u32,
                bo_info_size: size_of::<DrmAmdgpuBoListEntry>() as u32,
                bo_info_ptr: entries.as_ptr() as u64,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_BO_LIST takes a union drm_amdgpu_bo_list; the entries
        // it points at live until the call returns.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_BO_LIST, &mut args, "BO_LIST CREATE")? };
        // SAFETY: on success the kernel wrote the `out` member.
        Ok(unsafe { args.out.list_handle })
    }

    fn bo_list_destroy(&self, list: u32) -> Result<(), KernelError> {
        let mut args = DrmAmdgpuBoList {
            r#in: DrmAmdgpuBoListIn {
                operation: AMDGPU_BO_LIST_OP_DESTROY,
                list_handle: list,
                ..Default::default()
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_BO_LIST takes a union drm_amdgpu_bo_list.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_BO_LIST, &mut args, "BO_LIST DESTROY") }
    }

    fn ctx_create(&self) -> Result<u32, KernelError> {
        let mut args = DrmAmdgpuCtx {
            r#in: DrmAmdgpuCtxIn {
                op: AMDGPU_CTX_OP_ALLOC_CTX,
                flags: 0,
                ctx_id: 0,
                priority: AMDGPU_CTX_PRIORITY_NORMAL,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_CTX takes a union drm_amdgpu_ctx.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_CTX, &mut args, "CTX ALLOC")? };
        // SAFETY: on success the kernel wrote the `out.alloc` member.
        Ok(unsafe { args.out.alloc.ctx_id })
    }

    fn ctx_free(&self, ctx: u32) -> Result<(), KernelError> {
        let mut args = DrmAmdgpuCtx {
            r#in: DrmAmdgpuCtxIn {
                op: AMDGPU_CTX_OP_FREE_CTX,
                flags: 0,
                ctx_id: ctx,
                priority: 0,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_CTX takes a union drm_amdgpu_ctx.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_CTX, &mut args, "CTX FREE") }
    }

    fn submit(
        &self,
        ctx: u32,
        list: u32,
        ring: u32,
        ib_va: u64,
        dwords: u32,
    ) -> Result<u64, KernelError> {
        let ib = DrmAmdgpuCsChunkIb {
            _pad: 0,
            flags: 0,
            va_start: ib_va,
            ib_bytes: dwords * 4,
            ip_type: AMDGPU_HW_IP_DMA,
            ip_instance: 0,
            ring,
        };
        let chunk = DrmAmdgpuCsChunk {
            chunk_id: AMDGPU_CHUNK_ID_IB,
            length_dw: (size_of::<DrmAmdgpuCsChunkIb>() / 4) as u32,
            chunk_data: &ib as *const _ as u64,
        };
        let chunks = [&chunk as *const DrmAmdgpuCsChunk as u64];
        let mut args = DrmAmdgpuCs {
            r#in: DrmAmdgpuCsIn {
                ctx_id: ctx,
                bo_list_handle: list,
                num_chunks: 1,
                flags: 0,
                chunks: chunks.as_ptr() as u64,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_CS takes a union drm_amdgpu_cs whose chunk array,
        // chunk and IB description above live until the call returns.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_CS, &mut args, "CS")? };
        // SAFETY: on success the kernel wrote the `out` member.
        Ok(unsafe { args.out.handle })
    }

    fn wait(&self, ctx: u32, ring: u32, seq: u64, timeout: Duration) -> Result<bool, KernelError> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the time into `now`, a valid timespec.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
            return Err(KernelError::last("clock_gettime", ""));
        }
        let deadline = Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + timeout;
        let mut args = DrmAmdgpuWaitCs {
            r#in: DrmAmdgpuWaitCsIn {
                handle: seq,
                timeout: deadline.as_nanos() as u64,
                ip_type: AMDGPU_HW_IP_DMA,
                ip_instance: 0,
                ring,
                ctx_id: ctx,
            },
        };
        // SAFETY: DRM_IOCTL_AMDGPU_WAIT_CS takes a union drm_amdgpu_wait_cs.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_WAIT_CS, &mut args, "WAIT_CS")? };
        // SAFETY: on success the kernel wrote the `out` member.
        Ok(unsafe { args.out.status } == 0)
    }
}

impl RealNode {
    fn va_op(&self, handle: u32, va: u64, size: u64, operation: u32) -> Result<(), KernelError> {
        let mut args = DrmAmdgpuGemVa {
            handle,
            _pad: 0,
            operation,
            flags: AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
            va_address: va,
            offset_in_bo: 0,
            map_size: size.next_multiple_of(4096),
        };
        // SAFETY: DRM_IOCTL_AMDGPU_GEM_VA takes a drm_amdgpu_gem_va.
        unsafe { self.ioctl(DRM_IOCTL_AMDGPU_GEM_VA, &mut args, "GEM_VA") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_files_are_not_devices_and_missing_nodes_are_named() {
        let kfd = RealKfd;
        let null = nix::sys::stat::stat("/dev/null").unwrap();
        assert_eq!(kfd.kind_of(&null), None);
        let me = std::process::id() as i32;
        if !std::path::Path::new(KFD_PATH).exists() {
            assert!(kfd.task_kfd(me).unwrap().is_none());
            let err = kfd.open_kfd().unwrap_err();
            assert_eq!(err.errno, libc::ENOENT);
            assert!(err.to_string().contains("/dev/kfd"), "{err}");
        }
        if !std::path::Path::new(&render_path(255)).exists() {
            let err = RealDrm.open(255).err().unwrap();
            assert!(err.to_string().contains("/dev/dri/renderD255"), "{err}");
        }
        assert!(kfd.device_mappings(me).unwrap().is_empty());
    }

    fn parse_mapping(line: &str) -> Option<DeviceMapping> {
        device_mapping(&procfs::parse_mapping(line)?)
    }

    #[test]
    fn device_mappings_are_read_from_maps_lines() {
        let kfd = "7f0000000000-7f0000002000 rw-s 1f00000000 00:05 123 /dev/kfd";
        let render =
            "7f1000000000-7f1000200000 rw-s 100400000 00:05 456                  /dev/dri/renderD129";
        assert_eq!(
            parse_mapping(kfd),
            Some(DeviceMapping {
                start: 0x7f00_0000_0000,
                offset: 0x1f_0000_0000,
                kind: DeviceKind::Kfd
            })
        );
        assert_eq!(
            parse_mapping(render),
            Some(DeviceMapping {
                start: 0x7f10_0000_0000,
                offset: 0x1_0040_0000,
                kind: DeviceKind::Render { minor: 129 }
            })
        );
        for other in [
            "7f-80 r--p 00000000 08:01 1 /usr/lib/libc.so.6",
            "7f-80 rw-p 00000000 00:00 0 ",
            "7f-80 rw-s 00000000 00:05 9 /dev/dri/card0",
        ] {
            assert_eq!(parse_mapping(other), None, "{other}");
        }
    }
}
