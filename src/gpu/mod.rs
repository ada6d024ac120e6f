//! GPU backends: what a task's device state is, how to find and copy its buffers, and
//! how to recreate it on restore.
//!
//! One trait, one implementation per device family. The plugin, the helper protocol,
//! the transfer engine and the image format are shared. This module has the `sim`
//! backend, which runs every part except a kernel driver for real (docs/architecture.md §4).
//!
//! Dependencies run one way: the helper (`crate::helper`) uses this module (it calls
//! backends through [`Backend`], collects their [`TaskDevice`]s, and fills in the
//! [`GpuManifest`] with its [`TaskTiming`]s), and this module imports nothing from the
//! helper. It describes device state and how to copy it; the plugin protocol, the
//! session directory and the lifetime of one dump or restore (`helper::GpuDump`,
//! `helper::GpuRestore`) belong to the helper. The manifest types live here, not with
//! the helper that fills them in, because the image's manifest, restore and inspect
//! read them where no helper runs.

pub mod manifest;
pub mod sim;

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use gpucr_abi::proto::{BufferSpec, DeviceSpec, FileSpec};
use serde::{Deserialize, Serialize};

pub use manifest::{GpuManifest, TaskTiming};

use crate::transfer::{BufferSink, BufferSource};

/// Errors of the GPU backends.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: malformed device state: {detail}")]
    Malformed { path: PathBuf, detail: String },
    #[error("pid {pid}: {detail}")]
    Task { pid: i32, detail: String },
    #[error("{variable}={value:?}: {detail}")]
    Config {
        variable: &'static str,
        value: String,
        detail: String,
    },
}

impl GpuError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> GpuError {
        let path = path.into();
        move |source| GpuError::Io { path, source }
    }
}

/// The device state of one checkpointed task, as stored in the manifest: enough to
/// recreate it on restore, plus the table of its buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDevice {
    /// The task's pid in the checkpointed tree's own PID namespace (stable on restore).
    pub ns_pid: u32,
    /// The task's pid on the dumping host.
    pub host_pid: i32,
    /// CRIU file ids of the task's device files (DUMP_EXT_FILE / RESTORE_EXT_FILE ids).
    pub ext_files: Vec<u32>,
    pub device_path: String,
    pub device_flags: i32,
    /// Directories of device state, recreated before the files and buffers.
    pub directories: Vec<String>,
    /// Small state files, recreated with their contents.
    pub files: Vec<StateFile>,
    /// The device buffers, in `BufferKey::buffer` order.
    pub buffers: Vec<BufferInfo>,
}

/// A small device-state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    pub path: String,
    pub contents: String,
    /// Permission bits.
    pub mode: u32,
}

/// One device buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferInfo {
    /// Where the buffer lives (for the simulator, its file).
    pub path: String,
    pub size: u64,
    /// The GPU holding it.
    pub gpu_id: u32,
    /// "vram", "gtt", ...
    pub kind: String,
    /// Permission bits of the buffer's file (the simulator's; 0 for real devices).
    #[serde(default)]
    pub mode: u32,
}

/// Where device nodes live: the only place a manifest's `device_path` may name.
pub const DEVICE_DIR: &str = "/dev";

/// A path from a manifest that would reach outside where its backend keeps state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {path:?} is not beneath {root}")]
pub struct OutsideRoot {
    /// The manifest field, e.g. `buffers[3].path`.
    pub field: String,
    pub path: String,
    pub root: String,
}

/// True when `path` is absolute, lies strictly beneath `root` and has only normal
/// components (no `.`, no `..`): a lexical check, done before anything is touched; the
/// plugin also opens every path with openat2(RESOLVE_BENEATH) from the root.
pub fn is_beneath(path: &std::path::Path, root: &std::path::Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path.strip_prefix(root).is_ok_and(|rel| {
            !rel.as_os_str().is_empty()
                && rel.components().all(|c| matches!(c, Component::Normal(_)))
        })
}

impl TaskDevice {
    /// Check every path the restore would create or open: state directories, files
    /// and buffers beneath `root` (the backend's state root; None: the backend keeps no
    /// files, so there may be none), the device node beneath `/dev`.
    pub fn check_confined(&self, root: Option<&std::path::Path>) -> Result<(), OutsideRoot> {
        let none = std::path::Path::new("");
        let state_root = root.unwrap_or(none);
        let outside = |field: String, path: &str, root: &std::path::Path| OutsideRoot {
            field,
            path: path.to_owned(),
            root: if root.as_os_str().is_empty() {
                "any root (this backend keeps no files)".to_owned()
            } else {
                root.display().to_string()
            },
        };
        let paths = self
            .directories
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("directories[{i}]"), d))
            .chain(
                self.files
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (format!("files[{i}].path"), &f.path)),
            )
            .chain(
                self.buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (format!("buffers[{i}].path"), &b.path)),
            );
        for (field, path) in paths {
            if root.is_none() || !is_beneath(std::path::Path::new(path), state_root) {
                return Err(outside(field, path, state_root));
            }
        }
        let dev = std::path::Path::new(DEVICE_DIR);
        if !is_beneath(std::path::Path::new(&self.device_path), dev) {
            return Err(outside("device_path".into(), &self.device_path, dev));
        }
        Ok(())
    }

    /// What the restored task recreates (sent to the plugin in RESTORE_EXT_FILE), with
    /// the backend's state root every path must lie beneath.
    pub fn spec(&self, root: Option<&std::path::Path>) -> DeviceSpec {
        DeviceSpec {
            root: root.map(|r| r.display().to_string()).unwrap_or_default(),
            device_path: self.device_path.clone(),
            directories: self.directories.clone(),
            files: self
                .files
                .iter()
                .map(|f| FileSpec {
                    path: f.path.clone(),
                    contents: f.contents.clone().into_bytes(),
                    mode: f.mode,
                })
                .collect(),
            buffers: self
                .buffers
                .iter()
                .map(|b| BufferSpec {
                    path: b.path.clone(),
                    size: b.size,
                    mode: b.mode,
                })
                .collect(),
            device_flags: self.device_flags,
        }
    }
}

/// A task's device state and a copy-engine source for each of its buffers.
pub struct Checkpointed {
    pub device: TaskDevice,
    pub sources: Vec<Box<dyn BufferSource>>,
}

/// One GPU device family.
pub trait Backend: Send + Sync {
    /// "sim", "amdgpu", "cuda".
    fn name(&self) -> &'static str;

    /// Whether `pid` holds a device of this backend (before anything is frozen).
    fn holds_device(&self, pid: i32) -> bool;

    /// CHECKPOINT_DEVICES (tree frozen): the device state of `pid`, or None when the task
    /// holds no device of this backend.
    fn checkpoint_task(&self, pid: i32) -> Result<Option<Checkpointed>, GpuError>;

    /// DUMP_EXT_FILE: if `fd` is a device of this backend, which of `tasks` has it open.
    fn file_owner(&self, fd: BorrowedFd<'_>, tasks: &[i32]) -> Result<Option<i32>, GpuError>;

    /// A copy-engine sink writing buffer `index` of `task` through `file`, the buffer
    /// the restored task created and handed over.
    fn buffer_sink(&self, task: &TaskDevice, index: usize, file: File) -> Box<dyn BufferSink>;

    /// Where this backend's GPU topology is read: None for the machine's own `/`, or a
    /// root directory (the simulator's).
    fn sysfs_root(&self) -> Option<PathBuf>;

    /// The directory every device-state file and buffer of a restore must lie beneath
    /// (paths from an image are confined to it); None when the backend keeps no files.
    fn state_root(&self) -> Option<PathBuf>;

    /// Move a task's device state onto other GPUs: `map` pairs each checkpointed GPU id
    /// with the local one the topology check chose.
    fn remap_gpus(&self, task: &mut TaskDevice, map: &[(u32, u32)]) -> Result<(), GpuError>;
}

/// The topology of the GPUs the dumped tasks use, read where `backend` keeps it.
pub fn used_topology(
    backend: &dyn Backend,
    tasks: &[TaskDevice],
) -> Result<gpucr_topology::Topology, gpucr_topology::TopologyError> {
    let local = gpucr_topology::read_local(backend.sysfs_root().as_deref())?;
    let used: std::collections::BTreeSet<u32> = tasks
        .iter()
        .flat_map(|t| t.buffers.iter().map(|b| b.gpu_id))
        .collect();
    Ok(local.retain_gpus(|id| match id {
        gpucr_topology::GpuId::Kfd { gpu_id, .. } => used.contains(gpu_id),
        gpucr_topology::GpuId::Nvidia { .. } => false,
    }))
}

/// The backend whose devices the tree rooted at `pid` holds, if any. Today that is the
/// simulator when `GPUCR_SIM_ROOT` is set.
pub fn detect(pid: i32) -> Result<Option<std::sync::Arc<dyn Backend>>, GpuError> {
    let Some(sim) = sim::SimBackend::from_env()? else {
        return Ok(None);
    };
    let tree = tree_pids(pid);
    Ok(tree
        .iter()
        .any(|&p| sim.holds_device(p))
        .then(|| std::sync::Arc::new(sim) as std::sync::Arc<dyn Backend>))
}

/// The backend named in a manifest, configured from the environment.
pub fn backend_named(name: &str) -> Result<std::sync::Arc<dyn Backend>, GpuError> {
    match name {
        "sim" => match sim::SimBackend::from_env()? {
            Some(sim) => Ok(std::sync::Arc::new(sim)),
            None => Err(GpuError::Config {
                variable: sim::ENV_ROOT,
                value: String::new(),
                detail: "the image holds simulated GPU state: set GPUCR_SIM_ROOT to the sim root to restore into".into(),
            }),
        },
        other => Err(GpuError::Config {
            variable: "backend",
            value: other.to_owned(),
            detail: "this gpucr has no such GPU backend".into(),
        }),
    }
}

/// `pid` and all its descendants (through /proc/PID/task/TID/children).
pub fn tree_pids(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let children =
                    std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                for c in children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok())
                {
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// The task's pid in its innermost PID namespace (the last NSpid field).
pub fn ns_pid(pid: i32) -> Result<u32, GpuError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path).map_err(GpuError::io(&path))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .ok_or_else(|| GpuError::Malformed {
            path,
            detail: "no NSpid line".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ns_pid_is_found() {
        let me = std::process::id() as i32;
        assert!(ns_pid(me).unwrap() > 0);
        assert!(ns_pid(-1).is_err());
    }

    #[test]
    fn spec_carries_everything_to_recreate() {
        let t = TaskDevice {
            ns_pid: 2,
            host_pid: 100,
            ext_files: vec![5],
            device_path: "/dev/fuse".into(),
            device_flags: 2,
            directories: vec!["/r/c".into()],
            files: vec![StateFile {
                path: "/r/c/context.json".into(),
                contents: "{}".into(),
                mode: 0o644,
            }],
            buffers: vec![BufferInfo {
                path: "/r/c/b0".into(),
                size: 10,
                gpu_id: 7,
                kind: "vram".into(),
                mode: 0o600,
            }],
        };
        let s = t.spec(Some(std::path::Path::new("/r")));
        assert_eq!(s.root, "/r");
        assert_eq!(s.device_path, "/dev/fuse");
        assert_eq!(s.buffers[0].size, 10);
        assert_eq!(s.files[0].contents, b"{}");
    }
}
