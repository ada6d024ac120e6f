//! The GPU part of `gpucr.json` as it is on disk (manifest format 2): what a dump
//! records about each task's device state and how its memory moved.
//!
//! These are the only types that define the on-disk GPU section. The runtime types of
//! the backends (`crate::gpu`) convert to and from them here, so refactoring a backend
//! cannot change the format without a change in this file. Each task's backend state
//! is an opaque, backend-versioned blob in a file of its own under [`STATE_DIR`],
//! checksummed like every other file of the image.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gpu::TaskTiming;
use crate::gpu::{BufferInfo, DeviceFile, DeviceRole, GpuManifest, GpuRef, Operation, TaskDevice};
use crate::transfer::GpuStats;

/// Where the tasks' state blobs live, relative to the image directory.
pub const STATE_DIR: &str = "gpu/state";

/// Why the GPU section cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum GpuSectionError {
    #[error("{path}: cannot read task {ns_pid}'s device state: {source}")]
    State {
        path: std::path::PathBuf,
        ns_pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("gpu.tasks[{task}].state.file = {file:?} is not a file under {STATE_DIR}/")]
    StatePath { task: usize, file: String },
    #[error(
        "{path}: task {ns_pid}'s device state is {actual} bytes, the manifest says {expected}"
    )]
    StateSize {
        path: std::path::PathBuf,
        ns_pid: u32,
        actual: u64,
        expected: u64,
    },
    #[error("gpu.tasks[{task}].gpus[{index}] = {value:?}: {detail}")]
    GpuRef {
        task: usize,
        index: usize,
        value: String,
        detail: String,
    },
}

/// The GPU section (`gpucr.json`, field `gpu`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSection {
    /// The backend that carried the device state ("sim", "amdgpu", "cuda").
    pub backend: String,
    pub tasks: Vec<TaskRecord>,
    pub stats: StatsRecord,
    /// When each task's memory was copied (milliseconds since the helper started).
    pub timings: Vec<TimingRecord>,
}

/// One task's device state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task's pid in the checkpointed tree's own PID namespace.
    pub ns_pid: u32,
    /// The task's pid on the dumping host.
    pub host_pid: i32,
    /// The GPUs the task uses: `"kfd:<gpu_id>"` or `"nvidia:<UUID>"`.
    pub gpus: Vec<String>,
    /// The task's device files CRIU handed over, by CRIU file id, with their role.
    pub device_files: Vec<DeviceFileRecord>,
    /// The backend's private state of the task.
    pub state: StateRecord,
    /// The device buffers, in buffer-key order.
    pub buffers: Vec<BufferRecord>,
    /// What the backend did for the task at dump, in order.
    pub operations: Vec<OperationRecord>,
}

/// A device file of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFileRecord {
    /// CRIU's file id (DUMP_EXT_FILE / RESTORE_EXT_FILE).
    pub id: u32,
    /// "device" (the node the state hangs on: /dev/kfd, /dev/nvidiactl, the
    /// simulator's), "render" (a DRM render node), "gpu" (a per-GPU node).
    pub role: String,
    /// The path the task had open.
    pub path: String,
}

/// Where a task's backend state is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    /// The blob's file, relative to the image directory (under [`STATE_DIR`]).
    pub file: String,
    /// The backend's name and version of the blob's encoding ("sim/1").
    pub format: String,
    pub size: u64,
}

/// One device buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferRecord {
    /// Where the buffer lives (for the simulator, its file).
    pub path: String,
    pub size: u64,
    /// The KFD gpu_id (or copy queue) holding it.
    pub gpu_id: u32,
    /// "vram", "gtt", ...
    pub kind: String,
    /// Permission bits of the buffer's file (the simulator's; 0 for real devices).
    pub mode: u32,
}

/// One backend operation: a driver call, a state change, a copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub name: String,
    /// Milliseconds since the helper started.
    pub start_ms: f64,
    pub duration_ms: f64,
    /// "ok", or the error.
    pub result: String,
}

/// What the transfer engine stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsRecord {
    pub buffers: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub zero_chunks: u64,
    pub raw_chunks: u64,
    pub compressed_chunks: u64,
    pub seconds: f64,
}

/// When one task's device memory started and finished moving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingRecord {
    pub ns_pid: u32,
    pub bytes: u64,
    pub start_ms: Option<f64>,
    pub end_ms: Option<f64>,
}

/// The state blob's file of the task with `ns_pid`, relative to the image directory.
pub fn state_file(ns_pid: u32) -> String {
    format!("{STATE_DIR}/task-{ns_pid}.bin")
}

/// The GPUs named in `per_task` (each task's `gpus`), each once, sorted.
pub fn distinct_gpus<'a>(per_task: impl IntoIterator<Item = &'a Vec<String>>) -> Vec<String> {
    let mut used: Vec<String> = per_task.into_iter().flatten().cloned().collect();
    used.sort_unstable();
    used.dedup();
    used
}

impl GpuSection {
    /// The GPUs the image's tasks use, each once, sorted.
    pub fn used_gpus(&self) -> Vec<String> {
        distinct_gpus(self.tasks.iter().map(|t| &t.gpus))
    }

    /// The section for a dump's GPU part. The state blobs are written separately
    /// ([`write_states`]), under the names recorded here.
    pub fn from_runtime(gpu: &GpuManifest) -> GpuSection {
        GpuSection {
            backend: gpu.backend.clone(),
            tasks: gpu.tasks.iter().map(TaskRecord::from_runtime).collect(),
            stats: StatsRecord::from(&gpu.stats),
            timings: gpu.timings.iter().map(TimingRecord::from).collect(),
        }
    }

    /// The runtime form, with each task's state read from `dir` (already verified
    /// against the manifest's checksums by then).
    pub fn load(&self, dir: &Path) -> Result<GpuManifest, GpuSectionError> {
        let tasks = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| t.load(i, dir))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuManifest {
            backend: self.backend.clone(),
            tasks,
            stats: GpuStats::from(&self.stats),
            timings: self.timings.iter().map(TaskTiming::from).collect(),
        })
    }
}

/// Write every task's state blob into `dir` (the files [`GpuSection::from_runtime`]
/// names), before the image's files are checksummed.
pub fn write_states(dir: &Path, gpu: &GpuManifest) -> std::io::Result<()> {
    if gpu.tasks.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir.join(STATE_DIR))?;
    for task in &gpu.tasks {
        let path = dir.join(state_file(task.ns_pid));
        let mut file = std::fs::File::create(&path)?;
        std::io::Write::write_all(&mut file, &task.state)?;
        file.sync_all()?;
    }
    Ok(())
}

impl TaskRecord {
    fn from_runtime(t: &TaskDevice) -> TaskRecord {
        TaskRecord {
            ns_pid: t.ns_pid,
            host_pid: t.host_pid,
            gpus: t.gpus.iter().map(GpuRef::to_string).collect(),
            device_files: t
                .device_files
                .iter()
                .map(|f| DeviceFileRecord {
                    id: f.id,
                    role: f.role.as_str().to_owned(),
                    path: f.path.clone(),
                })
                .collect(),
            state: StateRecord {
                file: state_file(t.ns_pid),
                format: t.state_format.clone(),
                size: t.state.len() as u64,
            },
            buffers: t
                .buffers
                .iter()
                .map(|b| BufferRecord {
                    path: b.path.clone(),
                    size: b.size,
                    gpu_id: b.gpu_id,
                    kind: b.kind.clone(),
                    mode: b.mode,
                })
                .collect(),
            operations: t
                .operations
                .iter()
                .map(|o| OperationRecord {
                    name: o.name.clone(),
                    start_ms: o.start_ms,
                    duration_ms: o.duration_ms,
                    result: o.result.clone(),
                })
                .collect(),
        }
    }

    fn load(&self, index: usize, dir: &Path) -> Result<TaskDevice, GpuSectionError> {
        let inside = self
            .state
            .file
            .strip_prefix(STATE_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| !name.is_empty() && !name.contains('/') && name != "..");
        if !inside {
            return Err(GpuSectionError::StatePath {
                task: index,
                file: self.state.file.clone(),
            });
        }
        let path = dir.join(&self.state.file);
        let state = gpucr_criu_image::store::read_regular(&path).map_err(|source| {
            GpuSectionError::State {
                path: path.clone(),
                ns_pid: self.ns_pid,
                source,
            }
        })?;
        if state.len() as u64 != self.state.size {
            return Err(GpuSectionError::StateSize {
                path,
                ns_pid: self.ns_pid,
                actual: state.len() as u64,
                expected: self.state.size,
            });
        }
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<GpuRef>()
                    .map_err(|detail| GpuSectionError::GpuRef {
                        task: index,
                        index: i,
                        value: text.clone(),
                        detail,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TaskDevice {
            ns_pid: self.ns_pid,
            host_pid: self.host_pid,
            gpus,
            device_files: self
                .device_files
                .iter()
                .map(|f| DeviceFile {
                    id: f.id,
                    role: DeviceRole::parse(&f.role),
                    path: f.path.clone(),
                })
                .collect(),
            state_format: self.state.format.clone(),
            state,
            buffers: self
                .buffers
                .iter()
                .map(|b| BufferInfo {
                    path: b.path.clone(),
                    size: b.size,
                    gpu_id: b.gpu_id,
                    kind: b.kind.clone(),
                    mode: b.mode,
                })
                .collect(),
            operations: self
                .operations
                .iter()
                .map(|o| Operation {
                    name: o.name.clone(),
                    start_ms: o.start_ms,
                    duration_ms: o.duration_ms,
                    result: o.result.clone(),
                })
                .collect(),
        })
    }
}

impl From<&GpuStats> for StatsRecord {
    fn from(s: &GpuStats) -> Self {
        StatsRecord {
            buffers: s.buffers,
            raw_bytes: s.raw_bytes,
            stored_bytes: s.stored_bytes,
            zero_chunks: s.zero_chunks,
            raw_chunks: s.raw_chunks,
            compressed_chunks: s.compressed_chunks,
            seconds: s.seconds,
        }
    }
}

impl From<&StatsRecord> for GpuStats {
    fn from(s: &StatsRecord) -> Self {
        GpuStats {
            buffers: s.buffers,
            raw_bytes: s.raw_bytes,
            stored_bytes: s.stored_bytes,
            zero_chunks: s.zero_chunks,
            raw_chunks: s.raw_chunks,
            compressed_chunks: s.compressed_chunks,
            seconds: s.seconds,
        }
    }
}

impl From<&TaskTiming> for TimingRecord {
    fn from(t: &TaskTiming) -> Self {
        TimingRecord {
            ns_pid: t.ns_pid,
            bytes: t.bytes,
            start_ms: t.start_ms,
            end_ms: t.end_ms,
        }
    }
}

impl From<&TimingRecord> for TaskTiming {
    fn from(t: &TimingRecord) -> Self {
        TaskTiming {
            ns_pid: t.ns_pid,
            bytes: t.bytes,
            start_ms: t.start_ms,
            end_ms: t.end_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> TaskDevice {
        TaskDevice {
            ns_pid: 2,
            host_pid: 100,
            gpus: vec![GpuRef::Kfd(4096), GpuRef::Nvidia("GPU-1234".into())],
            device_files: vec![DeviceFile {
                id: 5,
                role: DeviceRole::Device,
                path: "/dev/fuse".into(),
            }],
            state_format: "sim/1".into(),
            state: vec![0, 1, 2, 255],
            buffers: vec![BufferInfo {
                path: "/r/c/b0".into(),
                size: 10,
                gpu_id: 4096,
                kind: "vram".into(),
                mode: 0o600,
            }],
            operations: vec![Operation {
                name: "checkpoint".into(),
                start_ms: 1.0,
                duration_ms: 2.5,
                result: "ok".into(),
            }],
        }
    }

    #[test]
    fn a_section_round_trips_through_json_and_state_files() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = GpuManifest {
            backend: "sim".into(),
            tasks: vec![task()],
            stats: GpuStats {
                buffers: 1,
                raw_bytes: 10,
                ..GpuStats::default()
            },
            timings: vec![TaskTiming {
                ns_pid: 2,
                bytes: 10,
                start_ms: Some(1.0),
                end_ms: None,
            }],
        };
        write_states(dir.path(), &gpu).unwrap();
        let section = GpuSection::from_runtime(&gpu);
        assert_eq!(section.tasks[0].state.file, "gpu/state/task-2.bin");
        assert_eq!(section.tasks[0].gpus, ["kfd:4096", "nvidia:GPU-1234"]);
        let json = serde_json::to_string(&section).unwrap();
        let back: GpuSection = serde_json::from_str(&json).unwrap();
        assert_eq!(back.load(dir.path()).unwrap(), gpu);
    }

    #[test]
    fn state_files_outside_the_state_dir_and_bad_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = GpuManifest {
            backend: "sim".into(),
            tasks: vec![task()],
            stats: GpuStats::default(),
            timings: vec![],
        };
        write_states(dir.path(), &gpu).unwrap();
        let good = GpuSection::from_runtime(&gpu);
        for file in [
            "gpucr.json",
            "gpu/state/../../etc/passwd",
            "/etc/passwd",
            "gpu/state/",
        ] {
            let mut s = good.clone();
            s.tasks[0].state.file = file.into();
            let err = s.load(dir.path()).unwrap_err();
            assert!(
                matches!(err, GpuSectionError::StatePath { .. }),
                "{file}: {err}"
            );
        }
        let mut s = good.clone();
        s.tasks[0].state.size = 3;
        assert!(matches!(
            s.load(dir.path()).unwrap_err(),
            GpuSectionError::StateSize { .. }
        ));
        let mut s = good;
        s.tasks[0].gpus[0] = "pci:0000".into();
        assert!(s
            .load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("gpus[0]"));
    }
}
