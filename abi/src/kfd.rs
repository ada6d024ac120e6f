//! The KFD (`/dev/kfd`) uAPI that gpucr's amdgpu backend uses: the version query, the CRIU
//! operation (`AMDKFD_IOC_CRIU_OP`) with its device and buffer buckets, the allocation
//! flags found in those buckets, and the few memory ioctls the backend's tests use to set
//! up buffers.
//!
//! Written from `<linux/kfd_ioctl.h>` of Debian 12's `linux-libc-dev` 6.1.187-1, which
//! declares `KFD_IOCTL_MAJOR_VERSION` 1 and `KFD_IOCTL_MINOR_VERSION` 11. Every type,
//! constant and ioctl number here is compared with that header by
//! `abi/tests/uapi_headers.rs`. Newer kernels add allocation flags (`EXT_COHERENT`
//! 1 << 24, `CONTIGUOUS` 1 << 23) that this header lacks; gpucr stores and restores
//! `alloc_flags` as the kernel reports them, so it never needs to name them.
//!
//! Who may issue what (kfd_chardev.c): `AMDKFD_IOC_CRIU_OP` needs CAP_CHECKPOINT_RESTORE or
//! CAP_SYS_ADMIN; the KFD process is the one that opened the file, and only it, or (for
//! CRIU_OP) the ptrace parent of its lead thread, may use the fd (others get EBADF).
//! PROCESS_INFO, CHECKPOINT and UNPAUSE therefore come from CRIU's main process (the
//! tracer), RESTORE from the restored task on its own `/dev/kfd`, RESUME from any process
//! with a `/dev/kfd` fd of its own, naming the task by pid.

use super::uapi::{ior, iow, iowr, uapi_consts, uapi_ioctls, uapi_types};

/// The KFD version gpucr's CRIU support needs: 1.8 (CRIU_OP, with dmabuf export of VRAM
/// and GTT buffers and `KFD_INVALID_FD` for the others).
pub const KFD_CRIU_MIN_VERSION: (u32, u32) = (1, 8);
/// The `KFD_IOCTL_MAJOR_VERSION`.`KFD_IOCTL_MINOR_VERSION` of the header this module was
/// written from (informational; a kernel reports its own through `AMDKFD_IOC_GET_VERSION`).
pub const HEADER_VERSION: (u32, u32) = (1, 11);

/// `AMDKFD_IOCTL_BASE`: the ioctl type of every KFD request.
pub const AMDKFD_IOCTL_BASE: u8 = b'K';

uapi_consts! {
    CONSTS;
    /// A bucket's `dmabuf_fd` when the buffer has no dmabuf (neither VRAM nor GTT).
    KFD_INVALID_FD: u32 = 0xFFFF_FFFF;

    /// `enum kfd_criu_op`: pause the queues and report the counts (criu main, on the
    /// drained fd).
    KFD_CRIU_OP_PROCESS_INFO: u32 = 0;
    /// Fill the device and buffer buckets and the private data; exports dmabuf fds into
    /// the caller.
    KFD_CRIU_OP_CHECKPOINT: u32 = 1;
    /// Restart the queues PROCESS_INFO paused.
    KFD_CRIU_OP_UNPAUSE: u32 = 2;
    /// Recreate the process's KFD state (the restored task itself).
    KFD_CRIU_OP_RESTORE: u32 = 3;
    /// Resume the restored process named by `pid`.
    KFD_CRIU_OP_RESUME: u32 = 4;

    /// Allocation flags (`kfd_criu_bo_bucket::alloc_flags`): memory types.
    KFD_IOC_ALLOC_MEM_FLAGS_VRAM: u32 = 1 << 0;
    KFD_IOC_ALLOC_MEM_FLAGS_GTT: u32 = 1 << 1;
    KFD_IOC_ALLOC_MEM_FLAGS_USERPTR: u32 = 1 << 2;
    KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL: u32 = 1 << 3;
    KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP: u32 = 1 << 4;
    /// Allocation flags: attributes and access.
    KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE: u32 = 1 << 31;
    KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE: u32 = 1 << 30;
    KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC: u32 = 1 << 29;
    KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE: u32 = 1 << 28;
    KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM: u32 = 1 << 27;
    KFD_IOC_ALLOC_MEM_FLAGS_COHERENT: u32 = 1 << 26;
    KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED: u32 = 1 << 25;
}

/// `enum kfd_criu_op`, for `KfdIoctlCriuArgs::op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum KfdCriuOp {
    ProcessInfo = KFD_CRIU_OP_PROCESS_INFO,
    Checkpoint = KFD_CRIU_OP_CHECKPOINT,
    Unpause = KFD_CRIU_OP_UNPAUSE,
    Restore = KFD_CRIU_OP_RESTORE,
    Resume = KFD_CRIU_OP_RESUME,
}

/// Buffers whose contents gpucr copies: the ones CHECKPOINT exports as dmabufs.
pub const fn bo_has_contents(alloc_flags: u32) -> bool {
    alloc_flags & (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT) != 0
}

uapi_types! {
    /// `struct kfd_ioctl_get_version_args` (`AMDKFD_IOC_GET_VERSION`, out).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlGetVersionArgs = "struct kfd_ioctl_get_version_args", size 8 {
        pub major_version: u32 => 0,
        pub minor_version: u32 => 4,
    }

    /// `struct kfd_ioctl_criu_args` (`AMDKFD_IOC_CRIU_OP`). Four bytes of tail padding
    /// follow `op`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlCriuArgs = "struct kfd_ioctl_criu_args", size 56 {
        /// User pointer to `num_devices` [`KfdCriuDeviceBucket`]s (CHECKPOINT, RESTORE).
        pub devices: u64 => 0,
        /// User pointer to `num_bos` [`KfdCriuBoBucket`]s (CHECKPOINT, RESTORE).
        pub bos: u64 => 8,
        /// User pointer to `priv_data_size` opaque bytes (CHECKPOINT, RESTORE).
        pub priv_data: u64 => 16,
        /// PROCESS_INFO (out), RESTORE (in).
        pub priv_data_size: u64 => 24,
        /// PROCESS_INFO (out), RESTORE (in).
        pub num_devices: u32 => 32,
        /// PROCESS_INFO (out), RESTORE (in).
        pub num_bos: u32 => 36,
        /// Queues, events and SVM ranges: PROCESS_INFO (out), RESTORE (in).
        pub num_objects: u32 => 40,
        /// PROCESS_INFO (out: in the target's pid namespace), RESUME (in: in the caller's).
        pub pid: u32 => 44,
        /// A [`KfdCriuOp`].
        pub op: u32 => 48,
    }

    /// `struct kfd_criu_device_bucket`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdCriuDeviceBucket = "struct kfd_criu_device_bucket", size 16 {
        /// The gpu_id the process knows.
        pub user_gpu_id: u32 => 0,
        /// The gpu_id of the device it runs on.
        pub actual_gpu_id: u32 => 4,
        /// RESTORE: a render node fd of the actual device, in the caller's table.
        pub drm_fd: u32 => 8,
        pub pad: u32 => 12,
    }

    /// `struct kfd_criu_bo_bucket`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdCriuBoBucket = "struct kfd_criu_bo_bucket", size 48 {
        /// GPU virtual address (equal to the CPU address of the mapping).
        pub addr: u64 => 0,
        pub size: u64 => 8,
        /// mmap offset at checkpoint.
        pub offset: u64 => 16,
        /// RESTORE (out): the buffer's new mmap offset.
        pub restored_offset: u64 => 24,
        /// The user gpu_id.
        pub gpu_id: u32 => 32,
        /// `KFD_IOC_ALLOC_MEM_FLAGS_*`.
        pub alloc_flags: u32 => 36,
        /// CHECKPOINT and RESTORE (out): a dmabuf fd in the caller's table, or
        /// [`KFD_INVALID_FD`].
        pub dmabuf_fd: u32 => 40,
        pub pad: u32 => 44,
    }

    /// `struct kfd_ioctl_acquire_vm_args` (`AMDKFD_IOC_ACQUIRE_VM`, in).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlAcquireVmArgs = "struct kfd_ioctl_acquire_vm_args", size 8 {
        pub drm_fd: u32 => 0,
        pub gpu_id: u32 => 4,
    }

    /// `struct kfd_ioctl_alloc_memory_of_gpu_args` (`AMDKFD_IOC_ALLOC_MEMORY_OF_GPU`).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlAllocMemoryOfGpuArgs = "struct kfd_ioctl_alloc_memory_of_gpu_args", size 40 {
        pub va_addr: u64 => 0,
        pub size: u64 => 8,
        /// Out.
        pub handle: u64 => 16,
        /// In for userptr (the CPU address), out otherwise (the render node mmap offset).
        pub mmap_offset: u64 => 24,
        pub gpu_id: u32 => 32,
        /// `KFD_IOC_ALLOC_MEM_FLAGS_*`.
        pub flags: u32 => 36,
    }

    /// `struct kfd_ioctl_map_memory_to_gpu_args` (`AMDKFD_IOC_MAP_MEMORY_TO_GPU`).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlMapMemoryToGpuArgs = "struct kfd_ioctl_map_memory_to_gpu_args", size 24 {
        pub handle: u64 => 0,
        /// User pointer to `n_devices` u32 gpu_ids.
        pub device_ids_array_ptr: u64 => 8,
        pub n_devices: u32 => 16,
        /// In/out: how many devices from the start of the array are mapped.
        pub n_success: u32 => 20,
    }

    /// `struct kfd_ioctl_get_dmabuf_info_args` (`AMDKFD_IOC_GET_DMABUF_INFO`).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlGetDmabufInfoArgs = "struct kfd_ioctl_get_dmabuf_info_args", size 32 {
        pub size: u64 => 0,
        pub metadata_ptr: u64 => 8,
        pub metadata_size: u32 => 16,
        pub gpu_id: u32 => 20,
        /// `KFD_IOC_ALLOC_MEM_FLAGS_*`.
        pub flags: u32 => 24,
        pub dmabuf_fd: u32 => 28,
    }

    /// `struct kfd_ioctl_get_available_memory_args` (`AMDKFD_IOC_AVAILABLE_MEMORY`, KFD 1.9).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct KfdIoctlGetAvailableMemoryArgs = "struct kfd_ioctl_get_available_memory_args", size 16 {
        pub available: u64 => 0,
        pub gpu_id: u32 => 8,
        pub pad: u32 => 12,
    }
}

uapi_ioctls! {
    /// `AMDKFD_IOC_GET_VERSION`: `_IOR('K', 0x01, struct kfd_ioctl_get_version_args)`.
    AMDKFD_IOC_GET_VERSION = ior::<KfdIoctlGetVersionArgs>(AMDKFD_IOCTL_BASE, 0x01), 0x8008_4B01;
    /// `AMDKFD_IOC_ACQUIRE_VM`: `_IOW('K', 0x15, struct kfd_ioctl_acquire_vm_args)`.
    AMDKFD_IOC_ACQUIRE_VM = iow::<KfdIoctlAcquireVmArgs>(AMDKFD_IOCTL_BASE, 0x15), 0x4008_4B15;
    /// `AMDKFD_IOC_ALLOC_MEMORY_OF_GPU`: `_IOWR('K', 0x16, ...)`.
    AMDKFD_IOC_ALLOC_MEMORY_OF_GPU =
        iowr::<KfdIoctlAllocMemoryOfGpuArgs>(AMDKFD_IOCTL_BASE, 0x16), 0xC028_4B16;
    /// `AMDKFD_IOC_MAP_MEMORY_TO_GPU`: `_IOWR('K', 0x18, ...)`.
    AMDKFD_IOC_MAP_MEMORY_TO_GPU =
        iowr::<KfdIoctlMapMemoryToGpuArgs>(AMDKFD_IOCTL_BASE, 0x18), 0xC018_4B18;
    /// `AMDKFD_IOC_GET_DMABUF_INFO`: `_IOWR('K', 0x1C, ...)`.
    AMDKFD_IOC_GET_DMABUF_INFO =
        iowr::<KfdIoctlGetDmabufInfoArgs>(AMDKFD_IOCTL_BASE, 0x1C), 0xC020_4B1C;
    /// `AMDKFD_IOC_CRIU_OP`: `_IOWR('K', 0x22, struct kfd_ioctl_criu_args)`.
    AMDKFD_IOC_CRIU_OP = iowr::<KfdIoctlCriuArgs>(AMDKFD_IOCTL_BASE, 0x22), 0xC038_4B22;
    /// `AMDKFD_IOC_AVAILABLE_MEMORY`: `_IOWR('K', 0x23, ...)`.
    AMDKFD_IOC_AVAILABLE_MEMORY =
        iowr::<KfdIoctlGetAvailableMemoryArgs>(AMDKFD_IOCTL_BASE, 0x23), 0xC010_4B23;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criu_op_values() {
        assert_eq!(KfdCriuOp::ProcessInfo as u32, 0);
        assert_eq!(KfdCriuOp::Checkpoint as u32, 1);
        assert_eq!(KfdCriuOp::Unpause as u32, 2);
        assert_eq!(KfdCriuOp::Restore as u32, 3);
        assert_eq!(KfdCriuOp::Resume as u32, 4);
    }

    #[test]
    fn contents_only_for_vram_and_gtt() {
        assert!(bo_has_contents(KFD_IOC_ALLOC_MEM_FLAGS_VRAM));
        assert!(bo_has_contents(
            KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
        ));
        assert!(!bo_has_contents(KFD_IOC_ALLOC_MEM_FLAGS_USERPTR));
        assert!(!bo_has_contents(
            KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP
        ));
    }

    #[test]
    fn every_field_is_listed() {
        // kfd_ioctl_criu_args: its size and nine field offsets.
        let criu: Vec<_> = LAYOUT
            .iter()
            .filter(|f| f.c_expr().contains("kfd_ioctl_criu_args"))
            .collect();
        assert_eq!(criu.len(), 10);
        assert_eq!(IOCTLS.len(), 7);
    }
}
