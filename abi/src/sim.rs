//! The simulator's formats, shared by its three parts: the sim workload writes a device
//! context, the plugin half (in CRIU) reads it and collects the task's state and buffer
//! fds at CHECKPOINT_DEVICES, and gpucr's half turns what it collected into the task's
//! device state and copy-engine sources.
//!
//! A sim root (`GPUCR_SIM_ROOT`, on tmpfs) holds `contexts/CTX/context.json` (one
//! process's open device, [`Context`]) and `contexts/CTX/BUFFER`, one file per buffer,
//! mapped MAP_SHARED by the process: CRIU does not dump shared file mappings, exactly as
//! it does not dump device memory.

use serde::{Deserialize, Serialize};

/// The environment variable naming the sim root.
pub const ENV_ROOT: &str = "GPUCR_SIM_ROOT";
/// The state file of a device context.
pub const CONTEXT_FILE: &str = "context.json";
/// The directory of the device contexts inside a sim root.
pub const CONTEXTS_DIR: &str = "contexts";
/// The encoding of what the plugin half collects ([`Collected`] as JSON).
pub const COLLECTED_FORMAT: &str = "sim-collected/1";

/// The driver models of a context. `kfd` (the default): device memory stays in the
/// device, and gpucr copies it through buffer fds, as on AMD. `nvidia`: as CUDA's
/// checkpoint API, the driver itself moves device memory into the process's own memory
/// and back, through the process's restore thread, which must be let run while the
/// tree is frozen.
pub const DRIVER_KFD: &str = "kfd";
pub const DRIVER_NVIDIA: &str = "nvidia";
/// The name (comm) of the `nvidia` driver's restore thread in the process.
pub const RESTORE_THREAD: &str = "simgpu-rst";
/// The `nvidia` driver's mailbox in the context directory: a request "SEQ OP" (OP one of
/// lock, checkpoint, restore, unlock, or resume: restore if needed, then unlock; the
/// driver does only the newest request), answered in the state file "SEQ STATE" (STATE one
/// of running, locked, checkpointed, or "error: ..."), each written whole by a rename.
pub const DRIVER_REQUEST_FILE: &str = "driver-request";
/// Every request is padded with spaces to this many bytes (its newline included), so
/// that every request has the same size. The mailbox is device state: the driver's
/// thread watches the request file without holding it open (by its metadata) and opens
/// it only to read a new request, closed before its answer, so that CRIU never finds it
/// open in a frozen tree (it would dump it as a file of the process, which a restore
/// cannot reopen once the device memory is gone).
pub const DRIVER_REQUEST_SIZE: usize = 64;
pub const DRIVER_STATE_FILE: &str = "driver-state";
/// Operation names in this file at the sim root make every simulated driver answer
/// those operations with an error, leaving its state as it was (driver failures, for
/// tests).
pub const DRIVER_FAIL_FILE: &str = "driver-fail";

/// The state of one device context, written by the process that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The device node the process opened.
    pub device_path: String,
    /// The fd number of that device in the owning process.
    pub device_fd: i32,
    /// The buffers, in allocation order.
    pub buffers: Vec<ContextBuffer>,
    /// The driver model ([`DRIVER_KFD`] when absent, or [`DRIVER_NVIDIA`]).
    #[serde(default)]
    pub driver: String,
}

impl Context {
    /// Whether the context's driver moves device memory itself (the `nvidia` model).
    pub fn is_nvidia(&self) -> bool {
        self.driver == DRIVER_NVIDIA
    }
}

/// One buffer of a context; its file is `CTX/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextBuffer {
    pub name: String,
    pub gpu_id: u32,
    pub size: u64,
    pub kind: String,
}

/// What the plugin half collected for one task at CHECKPOINT_DEVICES, sent with one fd
/// per buffer (opened read-only, in `buffers` order), as a DMABUF export would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    /// The context directory the task maps its buffers from.
    pub context_dir: String,
    /// `context.json` as the task wrote it, and its permission bits.
    pub context: String,
    pub context_mode: u32,
    /// The device node the task holds open, and its open flags.
    pub device_path: String,
    pub device_flags: i32,
    pub buffers: Vec<CollectedBuffer>,
}

/// One buffer the plugin half opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectedBuffer {
    pub path: String,
    pub size: u64,
    pub gpu_id: u32,
    pub kind: String,
    /// Permission bits of the buffer's file.
    pub mode: u32,
}
