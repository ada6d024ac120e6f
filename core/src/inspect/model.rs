//! The report `gpucr inspect` builds: one structure behind both the text views and
//! `--json`. Its JSON form is a documented, stable interface (docs/inspect.md):
//! fields are only ever added, and `schema_version` goes up when one changes meaning.
//!
//! Conventions: sizes are bytes, times carry their unit in the name (`_us`, `_ms`),
//! addresses are "0x..." hex strings (64-bit values do not survive JSON parsers that
//! use doubles), pids are as seen inside the dumped tree's PID namespace, and a value
//! the image does not record is `null`.

use serde::Serialize;

/// The version of the JSON schema below.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything `gpucr inspect` knows about an image.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema_version: u32,
    /// The container, for a container checkpoint archive (absent for a directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::archive::ContainerInfo>,
    /// The archive itself (absent for a directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveInfo>,
    pub image: ImageSummary,
    /// The process tree (the subtree of `-p PID` when given): usually one root.
    pub process_tree: Vec<TreeNode>,
    /// Every process of `process_tree`, depth first.
    pub processes: Vec<ProcessInfo>,
    /// Mounts of the tree's mount namespaces; null when the image records none (the
    /// tree shared the host's mount namespace).
    pub mounts: Option<Vec<MountInfo>>,
    pub gpu: GpuInfo,
    pub stats: Stats,
    /// Set by `--verify`.
    pub verify: Option<VerifyReport>,
    /// Parts of the image that could not be read; the sections they feed are left
    /// out (null or empty). Empty for a sound image.
    pub errors: Vec<ReportError>,
}

/// A container checkpoint archive.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiveInfo {
    /// The archive as given.
    pub path: String,
    /// "zstd", "gzip" or "none".
    pub compression: String,
    /// How many times the archive was read (2 when what a view needed came after the
    /// files it was needed for).
    pub reads: u32,
    /// Every member, in archive order.
    pub members: Vec<crate::archive::Member>,
}

/// The summary: what the image is and where it comes from.
#[derive(Debug, Clone, Serialize)]
pub struct ImageSummary {
    /// The image directory as given.
    pub dir: String,
    /// True when the manifest is present and no failed dump marked the image.
    pub complete: bool,
    /// Why the image is incomplete (no manifest, a manifest that cannot be read, or the
    /// reason a failed dump recorded).
    pub incomplete_reason: Option<String>,
    /// The manifest is present but cannot be read, and that alone keeps the image from
    /// being complete: the image is damaged, not incomplete (not in the JSON: `errors`
    /// names the manifest).
    #[serde(skip)]
    pub manifest_damaged: bool,
    /// The manifest's `format_version`; null without a manifest.
    pub format_version: Option<u32>,
    pub gpucr_version: Option<String>,
    pub criu_version: Option<String>,
    /// CRIU's image format version (inventory.img `img_version`).
    pub criu_image_version: Option<u32>,
    /// When the dump finished (RFC 3339, UTC).
    pub created: Option<String>,
    pub host: Option<HostInfo>,
    /// The GPU backend: "none" for a CPU-only tree; null without a manifest.
    pub backend: Option<String>,
    pub target: Option<TargetInfo>,
    /// The dump's options as the manifest records them (with the CRIU options of
    /// `--criu-config`, if any); null without a manifest.
    pub options: Option<crate::image::manifest::DumpOptions>,
    /// The CRIU plugins that took part in the dump (inventory.img).
    pub criu_plugins: Vec<String>,
    /// The page size used to read the pagemaps (the inspecting host's).
    pub page_size: u64,
    pub processes: u64,
    pub threads: u64,
    pub sizes: Sizes,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: String,
    pub arch: String,
}

/// The dumped tree's root as seen from the dumping host.
#[derive(Debug, Clone, Serialize)]
pub struct TargetInfo {
    pub pid: i32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// How big the image is.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// Every file of the directory, the manifest included.
    pub total: u64,
    pub files: u64,
    /// CRIU's pages files (`pages-*.img`): the dumped CPU memory.
    pub cpu_pages: u64,
    /// GPU memory as it was on the device, and as stored in the image.
    pub gpu_raw: u64,
    pub gpu_stored: u64,
}

/// One node of the process tree.
#[derive(Debug, Clone, Serialize)]
pub struct TreeNode {
    pub pid: u32,
    pub comm: String,
    pub children: Vec<TreeNode>,
}

/// One process.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub comm: String,
    /// "alive", "stopped", "zombie", "dead" or "unknown".
    pub state: String,
    /// The exit code of a zombie.
    pub exit_code: Option<u32>,
    /// Every thread, the main one (tid == pid) first.
    pub threads: Vec<ThreadInfo>,
    /// argv, read from the dumped memory; null when the image does not hold it.
    pub cmdline: Option<Vec<String>>,
    /// The environment ("NAME=value"), read from the dumped memory.
    pub environment: Option<Vec<String>>,
    /// Open descriptors; null for a process without files (a zombie).
    pub files: Option<Vec<FdInfo>>,
    pub cwd: Option<String>,
    pub root: Option<String>,
    /// The sockets among `files`.
    pub sockets: Vec<SocketInfo>,
    pub memory: Option<MemoryInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThreadInfo {
    pub tid: u32,
    pub comm: Option<String>,
}

/// One open descriptor.
#[derive(Debug, Clone, Serialize)]
pub struct FdInfo {
    pub fd: u32,
    /// CRIU's file type: "REG", "PIPE", "FIFO", "UNIXSK", "INETSK", "NETLINKSK",
    /// "PACKETSK", "EVENTFD", "EVENTPOLL", "SIGNALFD", "TIMERFD", "MEMFD", "TTY", "EXT", ...
    #[serde(rename = "type")]
    pub kind: String,
    /// A path for regular files; `pipe[N]`, `unix[INO (PEER) NAME]`, `memfd:NAME`,
    /// `tcp 127.0.0.1:80 LISTEN`, ... for the others.
    pub path: String,
    /// The file object's id in CRIU's files.img.
    pub id: u32,
    /// open(2) flags, when recorded.
    pub flags: Option<u32>,
    /// File offset (regular files, memfds).
    pub pos: Option<u64>,
}

/// One socket.
#[derive(Debug, Clone, Serialize)]
pub struct SocketInfo {
    pub fd: u32,
    /// "unix", "inet", "inet6", "netlink", "packet".
    pub family: String,
    /// "tcp", "udp", "unix", a netlink protocol ("route", ...), "packet", ...
    pub protocol: String,
    /// "stream", "dgram", "seqpacket", "raw", ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The kernel's state name ("LISTEN", "ESTABLISHED", "CLOSE", ...).
    pub state: Option<String>,
    pub inode: u32,
    pub local: Option<String>,
    pub local_port: Option<u16>,
    pub remote: Option<String>,
    pub remote_port: Option<u16>,
    /// The peer's inode (unix sockets).
    pub peer_inode: Option<u32>,
    pub backlog: Option<u32>,
    /// SO_SNDBUF / SO_RCVBUF.
    pub send_buf: u32,
    pub recv_buf: u32,
    /// Bytes of queued data carried in the image.
    pub in_queue: Option<u64>,
    pub out_queue: Option<u64>,
}

/// The address space of one process.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryInfo {
    pub exe: Option<String>,
    /// Bytes mapped (sum of VMA sizes).
    pub vma_bytes: u64,
    /// Pages (and bytes) whose contents are in the image.
    pub dumped_pages: u64,
    pub dumped_bytes: u64,
    /// The pages file holding them.
    pub pages_file: String,
    pub arg_start: String,
    pub arg_end: String,
    pub env_start: String,
    pub env_end: String,
    pub vmas: Vec<VmaInfo>,
    /// The pagemap as dumped, sorted by address.
    pub pagemap: Vec<PagemapRun>,
}

/// One mapping.
#[derive(Debug, Clone, Serialize)]
pub struct VmaInfo {
    pub start: String,
    pub end: String,
    pub size: u64,
    /// "rwxp" as in /proc/PID/maps ('s' for shared).
    pub prot: String,
    /// "anon", "file", "shmem", "memfd", "stack", "heap", "vdso", "vvar", "vsyscall",
    /// "sysvipc", "socket", "aio", "plugin" or "other".
    pub kind: String,
    pub file: Option<String>,
    /// Offset into the file, bytes.
    pub pgoff: u64,
    pub dumped_pages: u64,
    pub dumped_bytes: u64,
    /// MAP_* flags and CRIU's VMA status bits, raw.
    pub flags: u32,
    pub status: u32,
}

/// One pagemap entry.
#[derive(Debug, Clone, Serialize)]
pub struct PagemapRun {
    pub vaddr: String,
    pub nr_pages: u64,
    /// "present" (in the pages file), "parent" (in a parent image), "lazy".
    pub flags: Vec<String>,
}

/// One mount.
#[derive(Debug, Clone, Serialize)]
pub struct MountInfo {
    pub ns_id: u32,
    pub mnt_id: u32,
    pub parent_mnt_id: u32,
    pub mountpoint: String,
    pub fstype: String,
    pub source: String,
    pub root: String,
    pub options: String,
}

/// GPU state carried by the image (docs/gpu-image-format.md).
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// The backend that carried device state: "none" for a CPU-only tree, "sim",
    /// "amdgpu", "cuda"; null without a manifest.
    pub backend: Option<String>,
    /// Whether the image holds GPU state (the manifest's device state, `gpu/`).
    pub recorded: bool,
    /// Each GPU that holds buffers, by its id.
    pub devices: Vec<GpuDevice>,
    /// Each task with device state.
    pub tasks: Vec<GpuTask>,
    pub buffers: Vec<GpuBuffer>,
    /// Totals per buffer kind ("vram", "gtt", ...).
    pub by_kind: Vec<GpuKind>,
    /// Device memory as it was on the GPUs, and as stored in `gpu/` (chunk payloads).
    pub memory_raw: u64,
    pub memory_stored: u64,
    /// memory_raw / memory_stored; null when nothing is stored.
    pub compression_ratio: Option<f64>,
    /// The chunk size and the compression the dump asked for ("none", "zstd:LEVEL").
    pub chunk_size: Option<u64>,
    pub compression: Option<String>,
    /// How long the dump's GPU copy took.
    pub transfer_seconds: Option<f64>,
    /// The GPU topology of the dumping machine, as recorded in the manifest (what a
    /// restore checks this machine against); null when not recorded.
    pub topology: Option<serde_json::Value>,
    /// The recorded GPUs, for people: "node 2 gpu_id 4369", or an NVIDIA UUID.
    pub topology_gpus: Vec<String>,
    /// A sentence for people: what is (not) recorded.
    pub note: String,
}

/// How many buffers, and how many bytes they hold and take in the image.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BufferTotals {
    pub buffers: u64,
    pub bytes: u64,
    pub stored_bytes: u64,
}

impl BufferTotals {
    /// Count one more buffer of `bytes`, stored in `stored_bytes`.
    pub fn add(&mut self, bytes: u64, stored_bytes: u64) {
        self.buffers += 1;
        self.bytes += bytes;
        self.stored_bytes += stored_bytes;
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuDevice {
    pub gpu_id: u32,
    #[serde(flatten)]
    pub totals: BufferTotals,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuTask {
    /// The task's pid inside the tree's PID namespace, as in `processes`.
    pub pid: u32,
    /// Its pid on the dumping host.
    pub host_pid: i32,
    /// The device node of the task (its first device file of role "device").
    pub device_path: String,
    pub buffers: u64,
    pub bytes: u64,
    /// The GPUs the task used: "kfd:<gpu_id>" or "nvidia:<UUID>" (since manifest format 2).
    pub gpus: Vec<String>,
    /// The task's device files with their roles (since manifest format 2).
    pub device_files: Vec<GpuDeviceFile>,
    /// The backend's state of the task (since manifest format 2).
    pub state: GpuTaskState,
    /// What the backend did for the task at dump (since manifest format 2).
    pub operations: Vec<GpuOperation>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuDeviceFile {
    pub id: u32,
    pub role: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuTaskState {
    /// The blob's file, relative to the image directory.
    pub file: String,
    pub format: String,
    pub size: u64,
    /// How a CUDA task's device memory was moved at dump: "host" (in the process's
    /// memory) or "custom" (gpucr's copy in `gpu/`); absent for other backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staging: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuOperation {
    pub name: String,
    pub start_ms: f64,
    pub duration_ms: f64,
    pub result: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuBuffer {
    /// The owning task (pid in the tree's namespace) and the buffer's number in it.
    pub task: u32,
    pub buffer: u32,
    pub gpu_id: u32,
    /// "vram", "gtt", ...
    pub kind: String,
    pub size: u64,
    /// Where the buffer lived (the simulator's buffer file).
    pub path: Option<String>,
    /// From the chunk index: bytes stored and how its chunks are stored.
    pub stored_bytes: Option<u64>,
    pub chunks: Option<u64>,
    pub zero_chunks: Option<u64>,
    pub raw_chunks: Option<u64>,
    pub compressed_chunks: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuKind {
    pub kind: String,
    #[serde(flatten)]
    pub totals: BufferTotals,
}

/// CRIU's statistics and gpucr's phase timings.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// CRIU's stats-dump; null when absent.
    pub dump: Option<DumpStats>,
    /// CRIU's stats-restore, present after a restore from this directory.
    pub restore: Option<RestoreStats>,
    /// gpucr's timeline of the dump (from the manifest).
    pub gpucr: Option<PhaseTimings>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DumpStats {
    pub freezing_time_us: u32,
    pub frozen_time_us: u32,
    pub memdump_time_us: u32,
    pub memwrite_time_us: u32,
    pub irmap_resolve_us: Option<u32>,
    pub pages_scanned: u64,
    pub pages_skipped_parent: u64,
    pub pages_written: u64,
    pub pages_lazy: u64,
    pub page_pipes: Option<u64>,
    pub page_pipe_bufs: Option<u64>,
    pub shpages_scanned: Option<u64>,
    pub shpages_skipped_parent: Option<u64>,
    pub shpages_written: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RestoreStats {
    pub forking_time_us: u32,
    pub restore_time_us: u32,
    pub pages_compared: u64,
    pub pages_skipped_cow: u64,
    pub pages_restored: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseTimings {
    pub total_ms: f64,
    pub events: Vec<TimedEventInfo>,
    /// Time between consecutive events.
    pub phases: Vec<Phase>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimedEventInfo {
    pub name: String,
    pub at_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub from: String,
    pub to: String,
    pub ms: f64,
}

/// The result of `--verify`.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// "intact", "damaged" or "incomplete".
    pub status: String,
    pub problems: Vec<Problem>,
    /// Files checked against the manifest, and their bytes.
    pub files_checked: u64,
    pub bytes_checked: u64,
    /// Of those, the memory pages files the manifest records by size only (a dump with
    /// `--no-page-checksums`): their contents could not be checked.
    pub files_size_only: u64,
    /// CRIU images whose framing was checked.
    pub images_checked: u64,
    /// GPU memory chunks listed by the GPU index (each stored one read and checked).
    pub gpu_chunks_checked: u64,
}

/// One thing wrong with the image.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the image directory.
    pub file: String,
    /// Where in the file, when known.
    pub offset: Option<u64>,
    /// "missing", "size", "checksum", "unreadable", "symlink", "container", "framing", "pages", "manifest",
    /// "incomplete" or "gpu" (the GPU index, a data file or a chunk).
    pub kind: String,
    /// The whole message, starting with the file name.
    pub message: String,
}

/// A part of the image that could not be read.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReportError {
    pub file: String,
    pub offset: Option<u64>,
    pub message: String,
}
