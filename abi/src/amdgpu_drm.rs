//! The amdgpu DRM uAPI that gpucr's amdgpu backend uses on its own render node
//! (`/dev/dri/renderD*`) to copy buffer contents with the SDMA engines: PRIME import of the
//! dmabufs KFD exports, userptr staging buffers, GEM create/mmap for the indirect buffer,
//! GPU VA mapping, buffer lists, contexts, command submission and its wait, and the device
//! queries; plus the SDMA linear copy packet ([`sdma`]), which no uAPI header declares.
//!
//! Written from Debian 12's `libdrm-dev` 2.4.114-1+b1: `<libdrm/amdgpu_drm.h>`,
//! `<libdrm/drm.h>` (the generic `drm_prime_handle` and `drm_gem_close`) and
//! `<libdrm/amdgpu.h>` (`AMDGPU_TIMEOUT_INFINITE`). These headers carry no interface
//! version macro; the DRM driver reports its own (amdgpu 3.x) through `DRM_IOCTL_VERSION`.
//! Every type, constant and ioctl number here except [`sdma`] is compared with those headers
//! by `abi/tests/uapi_headers.rs`.

pub mod sdma;

use super::uapi::{iow, iowr, uapi_consts, uapi_ioctls, uapi_types};

/// `DRM_IOCTL_BASE`: the ioctl type of every DRM request.
pub const DRM_IOCTL_BASE: u8 = b'd';
/// `DRM_COMMAND_BASE`: driver-specific requests start here.
pub const DRM_COMMAND_BASE: u8 = 0x40;

uapi_consts! {
    CONSTS;
    /// `DRM_RDWR` (`O_RDWR`), for `drm_prime_handle::flags`.
    DRM_RDWR: u32 = libc::O_RDWR as u32;
    /// `DRM_CLOEXEC` (`O_CLOEXEC`).
    DRM_CLOEXEC: u32 = libc::O_CLOEXEC as u32;

    /// Driver request numbers (added to [`DRM_COMMAND_BASE`]).
    DRM_AMDGPU_GEM_CREATE: u8 = 0x00;
    DRM_AMDGPU_GEM_MMAP: u8 = 0x01;
    DRM_AMDGPU_CTX: u8 = 0x02;
    DRM_AMDGPU_BO_LIST: u8 = 0x03;
    DRM_AMDGPU_CS: u8 = 0x04;
    DRM_AMDGPU_INFO: u8 = 0x05;
    DRM_AMDGPU_GEM_VA: u8 = 0x08;
    DRM_AMDGPU_WAIT_CS: u8 = 0x09;
    DRM_AMDGPU_GEM_USERPTR: u8 = 0x11;

    /// Memory domains (`drm_amdgpu_gem_create_in::domains`).
    AMDGPU_GEM_DOMAIN_CPU: u64 = 0x1;
    AMDGPU_GEM_DOMAIN_GTT: u64 = 0x2;
    AMDGPU_GEM_DOMAIN_VRAM: u64 = 0x4;

    /// `drm_amdgpu_gem_userptr::flags`.
    AMDGPU_GEM_USERPTR_READONLY: u32 = 1 << 0;
    /// Only anonymous private memory (not shm, memfd or a file).
    AMDGPU_GEM_USERPTR_ANONONLY: u32 = 1 << 1;
    AMDGPU_GEM_USERPTR_VALIDATE: u32 = 1 << 2;
    AMDGPU_GEM_USERPTR_REGISTER: u32 = 1 << 3;

    /// `drm_amdgpu_bo_list_in::operation`.
    AMDGPU_BO_LIST_OP_CREATE: u32 = 0;
    AMDGPU_BO_LIST_OP_DESTROY: u32 = 1;
    AMDGPU_BO_LIST_OP_UPDATE: u32 = 2;

    /// `drm_amdgpu_ctx_in::op`.
    AMDGPU_CTX_OP_ALLOC_CTX: u32 = 1;
    AMDGPU_CTX_OP_FREE_CTX: u32 = 2;
    /// `drm_amdgpu_ctx_in::priority`.
    AMDGPU_CTX_PRIORITY_NORMAL: i32 = 0;
    AMDGPU_CTX_PRIORITY_LOW: i32 = -512;

    /// `drm_amdgpu_gem_va::operation`.
    AMDGPU_VA_OP_MAP: u32 = 1;
    AMDGPU_VA_OP_UNMAP: u32 = 2;
    /// `drm_amdgpu_gem_va::flags`.
    AMDGPU_VM_PAGE_READABLE: u32 = 1 << 1;
    AMDGPU_VM_PAGE_WRITEABLE: u32 = 1 << 2;
    AMDGPU_VM_PAGE_EXECUTABLE: u32 = 1 << 3;

    /// Hardware IP types; SDMA is `AMDGPU_HW_IP_DMA`.
    AMDGPU_HW_IP_GFX: u32 = 0;
    AMDGPU_HW_IP_COMPUTE: u32 = 1;
    AMDGPU_HW_IP_DMA: u32 = 2;

    /// `drm_amdgpu_cs_chunk::chunk_id` of an indirect buffer chunk.
    AMDGPU_CHUNK_ID_IB: u32 = 0x01;

    /// `drm_amdgpu_info::query` values.
    AMDGPU_INFO_ACCEL_WORKING: u32 = 0x00;
    AMDGPU_INFO_HW_IP_INFO: u32 = 0x02;
    AMDGPU_INFO_HW_IP_COUNT: u32 = 0x03;
    AMDGPU_INFO_DEV_INFO: u32 = 0x16;

    /// `drm_amdgpu_info_device::family` values around the SDMA count-field change.
    AMDGPU_FAMILY_SI: u32 = 110;
    AMDGPU_FAMILY_CI: u32 = 120;
    AMDGPU_FAMILY_KV: u32 = 125;
    AMDGPU_FAMILY_VI: u32 = 130;
    AMDGPU_FAMILY_CZ: u32 = 135;
    /// Vega10: the first family with SDMA 4.
    AMDGPU_FAMILY_AI: u32 = 141;

    /// `drm_amdgpu_wait_cs_in::timeout` that never expires (libdrm's `amdgpu.h`; the
    /// kernel treats any timeout that is negative as an `i64` as infinite).
    AMDGPU_TIMEOUT_INFINITE: u64 = u64::MAX;
}

uapi_types! {
    /// `struct drm_gem_close` (`DRM_IOCTL_GEM_CLOSE`, in).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmGemClose = "struct drm_gem_close", size 8 {
        pub handle: u32 => 0,
        pub pad: u32 => 4,
    }

    /// `struct drm_prime_handle` (`DRM_IOCTL_PRIME_FD_TO_HANDLE`: `fd` in, `handle` out).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmPrimeHandle = "struct drm_prime_handle", size 12 {
        pub handle: u32 => 0,
        /// `DRM_CLOEXEC | DRM_RDWR`, for handle to fd only.
        pub flags: u32 => 4,
        pub fd: i32 => 8,
    }

    /// `struct drm_amdgpu_gem_create_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemCreateIn = "struct drm_amdgpu_gem_create_in", size 32 {
        pub bo_size: u64 => 0,
        pub alignment: u64 => 8,
        /// `AMDGPU_GEM_DOMAIN_*`.
        pub domains: u64 => 16,
        pub domain_flags: u64 => 24,
    }

    /// `struct drm_amdgpu_gem_create_out`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemCreateOut = "struct drm_amdgpu_gem_create_out", size 8 {
        pub handle: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// `union drm_amdgpu_gem_create` (`DRM_IOCTL_AMDGPU_GEM_CREATE`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuGemCreate = "union drm_amdgpu_gem_create", size 32 {
        pub r#in: DrmAmdgpuGemCreateIn => 0,
        pub out: DrmAmdgpuGemCreateOut => 0,
    }

    /// `struct drm_amdgpu_gem_mmap_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemMmapIn = "struct drm_amdgpu_gem_mmap_in", size 8 {
        pub handle: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// `struct drm_amdgpu_gem_mmap_out`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemMmapOut = "struct drm_amdgpu_gem_mmap_out", size 8 {
        /// The offset to mmap the render node at.
        pub addr_ptr: u64 => 0,
    }

    /// `union drm_amdgpu_gem_mmap` (`DRM_IOCTL_AMDGPU_GEM_MMAP`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuGemMmap = "union drm_amdgpu_gem_mmap", size 8 {
        pub r#in: DrmAmdgpuGemMmapIn => 0,
        pub out: DrmAmdgpuGemMmapOut => 0,
    }

    /// `struct drm_amdgpu_gem_userptr` (`DRM_IOCTL_AMDGPU_GEM_USERPTR`). `addr` and `size`
    /// must be page-aligned.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemUserptr = "struct drm_amdgpu_gem_userptr", size 24 {
        pub addr: u64 => 0,
        pub size: u64 => 8,
        /// `AMDGPU_GEM_USERPTR_*`.
        pub flags: u32 => 16,
        /// Out: the GEM handle.
        pub handle: u32 => 20,
    }

    /// `struct drm_amdgpu_gem_va` (`DRM_IOCTL_AMDGPU_GEM_VA`, in).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuGemVa = "struct drm_amdgpu_gem_va", size 40 {
        pub handle: u32 => 0,
        pub _pad: u32 => 4,
        /// `AMDGPU_VA_OP_*`.
        pub operation: u32 => 8,
        /// `AMDGPU_VM_PAGE_*`.
        pub flags: u32 => 12,
        pub va_address: u64 => 16,
        pub offset_in_bo: u64 => 24,
        pub map_size: u64 => 32,
    }

    /// `struct drm_amdgpu_bo_list_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuBoListIn = "struct drm_amdgpu_bo_list_in", size 24 {
        /// `AMDGPU_BO_LIST_OP_*`.
        pub operation: u32 => 0,
        pub list_handle: u32 => 4,
        pub bo_number: u32 => 8,
        /// `size_of::<DrmAmdgpuBoListEntry>()`.
        pub bo_info_size: u32 => 12,
        /// User pointer to `bo_number` [`DrmAmdgpuBoListEntry`]s.
        pub bo_info_ptr: u64 => 16,
    }

    /// `struct drm_amdgpu_bo_list_entry`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuBoListEntry = "struct drm_amdgpu_bo_list_entry", size 8 {
        pub bo_handle: u32 => 0,
        pub bo_priority: u32 => 4,
    }

    /// `struct drm_amdgpu_bo_list_out`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuBoListOut = "struct drm_amdgpu_bo_list_out", size 8 {
        pub list_handle: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// `union drm_amdgpu_bo_list` (`DRM_IOCTL_AMDGPU_BO_LIST`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuBoList = "union drm_amdgpu_bo_list", size 24 {
        pub r#in: DrmAmdgpuBoListIn => 0,
        pub out: DrmAmdgpuBoListOut => 0,
    }

    /// `struct drm_amdgpu_ctx_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCtxIn = "struct drm_amdgpu_ctx_in", size 16 {
        /// `AMDGPU_CTX_OP_*`.
        pub op: u32 => 0,
        pub flags: u32 => 4,
        pub ctx_id: u32 => 8,
        /// `AMDGPU_CTX_PRIORITY_*`.
        pub priority: i32 => 12,
    }

    /// The `alloc` member of `union drm_amdgpu_ctx_out` (an anonymous struct in C).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCtxOutAlloc = "__typeof__(((union drm_amdgpu_ctx_out *)0)->alloc)", size 8 {
        pub ctx_id: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// The `state` member of `union drm_amdgpu_ctx_out` (an anonymous struct in C).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCtxOutState = "__typeof__(((union drm_amdgpu_ctx_out *)0)->state)", size 16 {
        pub flags: u64 => 0,
        pub hangs: u32 => 8,
        pub reset_status: u32 => 12,
    }

    /// The `pstate` member of `union drm_amdgpu_ctx_out` (an anonymous struct in C).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCtxOutPstate = "__typeof__(((union drm_amdgpu_ctx_out *)0)->pstate)", size 8 {
        pub flags: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// `union drm_amdgpu_ctx_out`.
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuCtxOut = "union drm_amdgpu_ctx_out", size 16 {
        pub alloc: DrmAmdgpuCtxOutAlloc => 0,
        pub state: DrmAmdgpuCtxOutState => 0,
        pub pstate: DrmAmdgpuCtxOutPstate => 0,
    }

    /// `union drm_amdgpu_ctx` (`DRM_IOCTL_AMDGPU_CTX`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuCtx = "union drm_amdgpu_ctx", size 16 {
        pub r#in: DrmAmdgpuCtxIn => 0,
        pub out: DrmAmdgpuCtxOut => 0,
    }

    /// `struct drm_amdgpu_cs_chunk`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCsChunk = "struct drm_amdgpu_cs_chunk", size 16 {
        /// `AMDGPU_CHUNK_ID_*`.
        pub chunk_id: u32 => 0,
        /// Size of the chunk data in dwords.
        pub length_dw: u32 => 4,
        /// User pointer to the chunk data (a [`DrmAmdgpuCsChunkIb`] for an IB).
        pub chunk_data: u64 => 8,
    }

    /// `struct drm_amdgpu_cs_chunk_ib`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCsChunkIb = "struct drm_amdgpu_cs_chunk_ib", size 32 {
        pub _pad: u32 => 0,
        pub flags: u32 => 4,
        /// GPU VA of the indirect buffer.
        pub va_start: u64 => 8,
        /// Its size in bytes (4 × dwords).
        pub ib_bytes: u32 => 16,
        /// `AMDGPU_HW_IP_*`.
        pub ip_type: u32 => 20,
        pub ip_instance: u32 => 24,
        pub ring: u32 => 28,
    }

    /// `struct drm_amdgpu_cs_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCsIn = "struct drm_amdgpu_cs_in", size 24 {
        pub ctx_id: u32 => 0,
        pub bo_list_handle: u32 => 4,
        pub num_chunks: u32 => 8,
        pub flags: u32 => 12,
        /// User pointer to `num_chunks` u64 user pointers to [`DrmAmdgpuCsChunk`]s.
        pub chunks: u64 => 16,
    }

    /// `struct drm_amdgpu_cs_out`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuCsOut = "struct drm_amdgpu_cs_out", size 8 {
        /// The submission's sequence number.
        pub handle: u64 => 0,
    }

    /// `union drm_amdgpu_cs` (`DRM_IOCTL_AMDGPU_CS`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuCs = "union drm_amdgpu_cs", size 24 {
        pub r#in: DrmAmdgpuCsIn => 0,
        pub out: DrmAmdgpuCsOut => 0,
    }

    /// `struct drm_amdgpu_wait_cs_in`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuWaitCsIn = "struct drm_amdgpu_wait_cs_in", size 32 {
        /// The sequence number from `DRM_IOCTL_AMDGPU_CS`.
        pub handle: u64 => 0,
        /// Absolute CLOCK_MONOTONIC nanoseconds, or [`AMDGPU_TIMEOUT_INFINITE`].
        pub timeout: u64 => 8,
        pub ip_type: u32 => 16,
        pub ip_instance: u32 => 20,
        pub ring: u32 => 24,
        pub ctx_id: u32 => 28,
    }

    /// `struct drm_amdgpu_wait_cs_out`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuWaitCsOut = "struct drm_amdgpu_wait_cs_out", size 8 {
        /// 0: completed, 1: still busy.
        pub status: u64 => 0,
    }

    /// `union drm_amdgpu_wait_cs` (`DRM_IOCTL_AMDGPU_WAIT_CS`).
    #[derive(Clone, Copy)]
    pub union DrmAmdgpuWaitCs = "union drm_amdgpu_wait_cs", size 32 {
        pub r#in: DrmAmdgpuWaitCsIn => 0,
        pub out: DrmAmdgpuWaitCsOut => 0,
    }

    /// `struct drm_amdgpu_query_fw`.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuQueryFw = "struct drm_amdgpu_query_fw", size 16 {
        pub fw_type: u32 => 0,
        pub ip_instance: u32 => 4,
        pub index: u32 => 8,
        pub _pad: u32 => 12,
    }

    /// The `mode_crtc` member of `struct drm_amdgpu_info`'s anonymous union.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoModeCrtc = "__typeof__(((struct drm_amdgpu_info *)0)->mode_crtc)", size 8 {
        pub id: u32 => 0,
        pub _pad: u32 => 4,
    }

    /// The `query_hw_ip` member (`AMDGPU_INFO_HW_IP_INFO`, `AMDGPU_INFO_HW_IP_COUNT`).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoQueryHwIp = "__typeof__(((struct drm_amdgpu_info *)0)->query_hw_ip)", size 8 {
        /// `AMDGPU_HW_IP_*`.
        pub r#type: u32 => 0,
        pub ip_instance: u32 => 4,
    }

    /// The `read_mmr_reg` member.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoReadMmrReg = "__typeof__(((struct drm_amdgpu_info *)0)->read_mmr_reg)", size 16 {
        pub dword_offset: u32 => 0,
        pub count: u32 => 4,
        pub instance: u32 => 8,
        pub flags: u32 => 12,
    }

    /// The `vbios_info` member.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoVbiosInfo = "__typeof__(((struct drm_amdgpu_info *)0)->vbios_info)", size 8 {
        pub r#type: u32 => 0,
        pub offset: u32 => 4,
    }

    /// The `sensor_info` member.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoSensorInfo = "__typeof__(((struct drm_amdgpu_info *)0)->sensor_info)", size 4 {
        pub r#type: u32 => 0,
    }

    /// The `video_cap` member.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoVideoCap = "__typeof__(((struct drm_amdgpu_info *)0)->video_cap)", size 4 {
        pub r#type: u32 => 0,
    }

    /// `struct drm_amdgpu_info` (`DRM_IOCTL_AMDGPU_INFO`, in; the answer goes to
    /// `return_pointer`). The C struct's anonymous union is [`DrmAmdgpuInfoArgs`]; its
    /// offset is checked as that of its first member, `mode_crtc`.
    #[derive(Clone, Copy)]
    pub struct DrmAmdgpuInfo = "struct drm_amdgpu_info", size 32 {
        pub return_pointer: u64 => 0,
        pub return_size: u32 => 8,
        /// `AMDGPU_INFO_*`.
        pub query: u32 => 12,
        pub args: DrmAmdgpuInfoArgs => 16 as "mode_crtc",
    }

    /// `struct drm_amdgpu_info_hw_ip` (the answer to `AMDGPU_INFO_HW_IP_INFO`).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoHwIp = "struct drm_amdgpu_info_hw_ip", size 32 {
        /// For `AMDGPU_HW_IP_DMA`, the SDMA generation (see [`sdma::CountEncoding`]).
        pub hw_ip_version_major: u32 => 0,
        pub hw_ip_version_minor: u32 => 4,
        pub capabilities_flags: u64 => 8,
        pub ib_start_alignment: u32 => 16,
        pub ib_size_alignment: u32 => 20,
        /// Bit n: ring n is available.
        pub available_rings: u32 => 24,
        pub _pad: u32 => 28,
    }

    /// `struct drm_amdgpu_info_device` (the answer to `AMDGPU_INFO_DEV_INFO`), as in
    /// libdrm 2.4.114. The kernel copies at most `return_size` bytes, so this prefix of
    /// newer kernels' struct is answered in full.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct DrmAmdgpuInfoDevice = "struct drm_amdgpu_info_device", size 368 {
        pub device_id: u32 => 0,
        pub chip_rev: u32 => 4,
        pub external_rev: u32 => 8,
        pub pci_rev: u32 => 12,
        /// `AMDGPU_FAMILY_*`.
        pub family: u32 => 16,
        pub num_shader_engines: u32 => 20,
        pub num_shader_arrays_per_engine: u32 => 24,
        pub gpu_counter_freq: u32 => 28,
        pub max_engine_clock: u64 => 32,
        pub max_memory_clock: u64 => 40,
        pub cu_active_number: u32 => 48,
        pub cu_ao_mask: u32 => 52,
        pub cu_bitmap: [[u32; 4]; 4] => 56,
        pub enabled_rb_pipes_mask: u32 => 120,
        pub num_rb_pipes: u32 => 124,
        pub num_hw_gfx_contexts: u32 => 128,
        pub _pad: u32 => 132,
        pub ids_flags: u64 => 136,
        /// Start of the VA range user space may use.
        pub virtual_address_offset: u64 => 144,
        /// End of that range.
        pub virtual_address_max: u64 => 152,
        pub virtual_address_alignment: u32 => 160,
        pub pte_fragment_size: u32 => 164,
        pub gart_page_size: u32 => 168,
        pub ce_ram_size: u32 => 172,
        pub vram_type: u32 => 176,
        pub vram_bit_width: u32 => 180,
        pub vce_harvest_config: u32 => 184,
        pub gc_double_offchip_lds_buf: u32 => 188,
        pub prim_buf_gpu_addr: u64 => 192,
        pub pos_buf_gpu_addr: u64 => 200,
        pub cntl_sb_buf_gpu_addr: u64 => 208,
        pub param_buf_gpu_addr: u64 => 216,
        pub prim_buf_size: u32 => 224,
        pub pos_buf_size: u32 => 228,
        pub cntl_sb_buf_size: u32 => 232,
        pub param_buf_size: u32 => 236,
        pub wave_front_size: u32 => 240,
        pub num_shader_visible_vgprs: u32 => 244,
        pub num_cu_per_sh: u32 => 248,
        pub num_tcc_blocks: u32 => 252,
        pub gs_vgt_table_depth: u32 => 256,
        pub gs_prim_buffer_depth: u32 => 260,
        pub max_gs_waves_per_vgt: u32 => 264,
        pub _pad1: u32 => 268,
        pub cu_ao_bitmap: [[u32; 4]; 4] => 272,
        /// Start of the high VA range.
        pub high_va_offset: u64 => 336,
        /// End of the high VA range.
        pub high_va_max: u64 => 344,
        pub pa_sc_tile_steering_override: u32 => 352,
        pub tcc_disabled_mask: u64 => 360,
    }
}

/// The anonymous union of `struct drm_amdgpu_info`. C gives it no name, so its size and
/// members are asserted here only; the header check sees it through
/// [`DrmAmdgpuInfo`]'s size and the offset of its first member.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DrmAmdgpuInfoArgs {
    pub mode_crtc: DrmAmdgpuInfoModeCrtc,
    pub query_hw_ip: DrmAmdgpuInfoQueryHwIp,
    pub read_mmr_reg: DrmAmdgpuInfoReadMmrReg,
    pub query_fw: DrmAmdgpuQueryFw,
    pub vbios_info: DrmAmdgpuInfoVbiosInfo,
    pub sensor_info: DrmAmdgpuInfoSensorInfo,
    pub video_cap: DrmAmdgpuInfoVideoCap,
}

const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<DrmAmdgpuInfoArgs>() == 16);
    assert!(offset_of!(DrmAmdgpuInfoArgs, mode_crtc) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, query_hw_ip) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, read_mmr_reg) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, query_fw) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, vbios_info) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, sensor_info) == 0);
    assert!(offset_of!(DrmAmdgpuInfoArgs, video_cap) == 0);
};

impl DrmAmdgpuInfo {
    /// An `AMDGPU_INFO_HW_IP_INFO` or `AMDGPU_INFO_HW_IP_COUNT` query for `ip_type`
    /// (`AMDGPU_HW_IP_*`), answered into `return_size` bytes at `return_pointer`.
    pub const fn hw_ip(query: u32, ip_type: u32, ip_instance: u32) -> Self {
        // Start from the largest member so that all 16 bytes of the union are zero.
        let mut args = DrmAmdgpuInfoArgs {
            read_mmr_reg: DrmAmdgpuInfoReadMmrReg {
                dword_offset: 0,
                count: 0,
                instance: 0,
                flags: 0,
            },
        };
        args.query_hw_ip = DrmAmdgpuInfoQueryHwIp {
            r#type: ip_type,
            ip_instance,
        };
        DrmAmdgpuInfo {
            return_pointer: 0,
            return_size: 0,
            query,
            args,
        }
    }
}

uapi_ioctls! {
    /// `DRM_IOCTL_GEM_CLOSE`: `DRM_IOW(0x09, struct drm_gem_close)`.
    DRM_IOCTL_GEM_CLOSE = iow::<DrmGemClose>(DRM_IOCTL_BASE, 0x09), 0x4008_6409;
    /// `DRM_IOCTL_PRIME_FD_TO_HANDLE`: `DRM_IOWR(0x2e, struct drm_prime_handle)`.
    DRM_IOCTL_PRIME_FD_TO_HANDLE = iowr::<DrmPrimeHandle>(DRM_IOCTL_BASE, 0x2e), 0xC00C_642E;
    /// `DRM_IOCTL_AMDGPU_GEM_CREATE`.
    DRM_IOCTL_AMDGPU_GEM_CREATE =
        iowr::<DrmAmdgpuGemCreate>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_CREATE), 0xC020_6440;
    /// `DRM_IOCTL_AMDGPU_GEM_MMAP`.
    DRM_IOCTL_AMDGPU_GEM_MMAP =
        iowr::<DrmAmdgpuGemMmap>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_MMAP), 0xC008_6441;
    /// `DRM_IOCTL_AMDGPU_CTX`.
    DRM_IOCTL_AMDGPU_CTX =
        iowr::<DrmAmdgpuCtx>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_CTX), 0xC010_6442;
    /// `DRM_IOCTL_AMDGPU_BO_LIST`.
    DRM_IOCTL_AMDGPU_BO_LIST =
        iowr::<DrmAmdgpuBoList>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_BO_LIST), 0xC018_6443;
    /// `DRM_IOCTL_AMDGPU_CS`.
    DRM_IOCTL_AMDGPU_CS =
        iowr::<DrmAmdgpuCs>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_CS), 0xC018_6444;
    /// `DRM_IOCTL_AMDGPU_INFO`: a write-only request (`DRM_IOW`); the answer goes through
    /// `return_pointer`.
    DRM_IOCTL_AMDGPU_INFO =
        iow::<DrmAmdgpuInfo>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_INFO), 0x4020_6445;
    /// `DRM_IOCTL_AMDGPU_GEM_VA`: `DRM_IOW`.
    DRM_IOCTL_AMDGPU_GEM_VA =
        iow::<DrmAmdgpuGemVa>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_VA), 0x4028_6448;
    /// `DRM_IOCTL_AMDGPU_WAIT_CS`.
    DRM_IOCTL_AMDGPU_WAIT_CS =
        iowr::<DrmAmdgpuWaitCs>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_WAIT_CS), 0xC020_6449;
    /// `DRM_IOCTL_AMDGPU_GEM_USERPTR`.
    DRM_IOCTL_AMDGPU_GEM_USERPTR =
        iowr::<DrmAmdgpuGemUserptr>(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_USERPTR), 0xC018_6451;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uapi::Fact;

    #[test]
    fn hw_ip_query_layout() {
        let info = DrmAmdgpuInfo::hw_ip(AMDGPU_INFO_HW_IP_INFO, AMDGPU_HW_IP_DMA, 0);
        // SAFETY: DrmAmdgpuInfo is 32 bytes of plain integers with no padding (asserted
        // above), and hw_ip initialised all 16 bytes of the union.
        let words: [u32; 8] = unsafe { std::mem::transmute(info) };
        assert_eq!(
            words,
            [0, 0, 0, AMDGPU_INFO_HW_IP_INFO, AMDGPU_HW_IP_DMA, 0, 0, 0]
        );
    }

    #[test]
    fn every_ioctl_is_listed() {
        assert_eq!(IOCTLS.len(), 11);
        assert!(IOCTLS.iter().any(|f| matches!(
            f,
            Fact::Value { name: "DRM_IOCTL_PRIME_FD_TO_HANDLE", value, .. }
                if *value == i128::from(DRM_IOCTL_PRIME_FD_TO_HANDLE)
        )));
    }
}
