//! The GPU part of an image: the manifest's device state and buffer table, and the chunk
//! index of `gpu/` (docs/gpu-image-format.md). Read for the `--gpu` view, verified chunk by
//! chunk for `--verify`.

use std::collections::BTreeMap;
use std::path::Path;

use super::model::{
    BufferTotals, GpuBuffer, GpuDevice, GpuDeviceFile, GpuInfo, GpuKind, GpuOperation, GpuTask,
    GpuTaskState, Problem, ReportError,
};
use super::source::ImageSource;
use crate::image::{Manifest, MANIFEST_FILE};
use crate::transfer::{
    read_index, verify_image, BufferKey, GpuIndex, TransferError, GPU_DIR, INDEX_FILE,
};

/// Whether the image carries GPU state: the manifest says so, or there is a `gpu/`.
pub fn has_gpu_state(dir: &Path, manifest: Option<&Manifest>) -> bool {
    manifest.is_some_and(|m| m.gpu.is_some()) || dir.join(GPU_DIR).is_dir()
}

/// How a CUDA task's memory was moved, from its state blob `file` (None for another
/// backend's state, or a blob that cannot be read).
fn cuda_staging(source: &ImageSource, format: &str, file: &str) -> Option<String> {
    if format != crate::gpu::cuda::STATE_FORMAT {
        return None;
    }
    let blob = source.read(file).ok()?;
    let state: crate::gpu::cuda::CudaState = serde_json::from_slice(&blob).ok()?;
    Some(state.staging)
}

/// The GPU index of `source`.
pub fn source_index(source: &ImageSource) -> Result<GpuIndex, TransferError> {
    let path = source.root().join(GPU_DIR).join(INDEX_FILE);
    match source.read(&format!("{GPU_DIR}/{INDEX_FILE}")) {
        Ok(bytes) => GpuIndex::from_bytes(&bytes, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(TransferError::IndexMissing { path })
        }
        Err(e) => Err(TransferError::io("read", path, e)),
    }
}

/// The GPU section; an index that cannot be read is returned as an error too.
pub fn gpu_info(
    source: &ImageSource,
    manifest: Option<&Manifest>,
) -> (GpuInfo, Option<ReportError>) {
    let dir = source.root();
    let backend = manifest.map(|m| m.backend.clone());
    let mut info = GpuInfo {
        backend: backend.clone(),
        recorded: false,
        devices: Vec::new(),
        tasks: Vec::new(),
        buffers: Vec::new(),
        by_kind: Vec::new(),
        memory_raw: 0,
        memory_stored: 0,
        compression_ratio: None,
        chunk_size: None,
        compression: None,
        transfer_seconds: None,
        topology: None,
        topology_gpus: Vec::new(),
        note: String::new(),
    };
    if let Some(topology) = manifest.and_then(|m| m.topology.as_ref()) {
        info.topology = serde_json::to_value(topology).ok();
        info.topology_gpus = topology.gpus().iter().map(ToString::to_string).collect();
    }
    if !(manifest.is_some_and(|m| m.gpu.is_some()) || source.has_dir(GPU_DIR)) {
        info.note = match backend.as_deref() {
            Some("none") => "no GPU state is recorded: the tree used no GPU".into(),
            Some(b) => format!("no GPU state is recorded (backend {b})"),
            None if source.has_file(MANIFEST_FILE) => {
                "GPU state unknown (the manifest cannot be read)".into()
            }
            None => "no GPU state is recorded (no manifest)".into(),
        };
        return (info, None);
    }
    info.recorded = true;
    let gpu = manifest.and_then(|m| m.gpu.as_ref());
    let (index, error) = match source_index(source) {
        Ok(index) => (Some(index), None),
        Err(e) => (None, Some(index_error(dir, &e))),
    };
    if let Some(index) = &index {
        info.memory_raw = index.raw_bytes();
        info.memory_stored = index.stored_bytes();
        info.compression_ratio =
            (info.memory_stored > 0).then(|| info.memory_raw as f64 / info.memory_stored as f64);
        info.chunk_size = Some(index.chunk_size);
        info.compression = Some(index.compression.to_string());
    }
    if let Some(gpu) = gpu {
        info.transfer_seconds = Some(gpu.stats.seconds);
        for task in &gpu.tasks {
            let bytes: u64 = task.buffers.iter().map(|b| b.size).sum();
            info.tasks.push(GpuTask {
                pid: task.ns_pid,
                host_pid: task.host_pid,
                device_path: task
                    .device_files
                    .iter()
                    .find(|f| f.role == "device")
                    .map(|f| f.path.clone())
                    .unwrap_or_default(),
                buffers: task.buffers.len() as u64,
                bytes,
                gpus: task.gpus.clone(),
                device_files: task
                    .device_files
                    .iter()
                    .map(|f| GpuDeviceFile {
                        id: f.id,
                        role: f.role.clone(),
                        path: f.path.clone(),
                    })
                    .collect(),
                state: GpuTaskState {
                    file: task.state.file.clone(),
                    format: task.state.format.clone(),
                    size: task.state.size,
                    staging: cuda_staging(source, &task.state.format, &task.state.file),
                },
                operations: task
                    .operations
                    .iter()
                    .map(|o| GpuOperation {
                        name: o.name.clone(),
                        start_ms: o.start_ms,
                        duration_ms: o.duration_ms,
                        result: o.result.clone(),
                    })
                    .collect(),
            });
            for (n, b) in task.buffers.iter().enumerate() {
                let key = BufferKey::new(task.ns_pid, n as u32);
                info.buffers.push(buffer(
                    key,
                    &b.kind,
                    b.gpu_id,
                    b.size,
                    &b.path,
                    index.as_ref(),
                ));
            }
        }
    } else if let Some(index) = &index {
        // No manifest: what the index alone says.
        for e in &index.buffers {
            info.buffers
                .push(buffer(e.key, "unknown", 0, e.len, "", Some(index)));
        }
    }
    let mut devices: BTreeMap<u32, GpuDevice> = BTreeMap::new();
    let mut kinds: BTreeMap<String, GpuKind> = BTreeMap::new();
    for b in &info.buffers {
        let stored = b.stored_bytes.unwrap_or(0);
        devices
            .entry(b.gpu_id)
            .or_insert_with(|| GpuDevice {
                gpu_id: b.gpu_id,
                totals: BufferTotals::default(),
            })
            .totals
            .add(b.size, stored);
        kinds
            .entry(b.kind.clone())
            .or_insert_with(|| GpuKind {
                kind: b.kind.clone(),
                totals: BufferTotals::default(),
            })
            .totals
            .add(b.size, stored);
    }
    info.devices = devices.into_values().collect();
    info.by_kind = kinds.into_values().collect();
    let topology = if info.topology.is_some() {
        "the GPU topology of the dumping machine is recorded"
    } else {
        "no GPU topology is recorded"
    };
    info.note = match (&index, gpu) {
        (Some(_), Some(_)) => format!(
            "{} buffers of {} task(s) on {} GPU(s); {topology}",
            info.buffers.len(),
            info.tasks.len(),
            info.devices.len()
        ),
        (Some(_), None) => "GPU memory without a manifest: buffers as the index lists them".into(),
        (None, _) => "the GPU memory index (gpu/index) cannot be read".into(),
    };
    (info, error)
}

fn buffer(
    key: BufferKey,
    kind: &str,
    gpu_id: u32,
    size: u64,
    path: &str,
    index: Option<&GpuIndex>,
) -> GpuBuffer {
    let entry = index.and_then(|i| i.buffers.iter().find(|e| e.key == key));
    GpuBuffer {
        task: key.task,
        buffer: key.buffer,
        gpu_id,
        kind: kind.to_string(),
        size,
        path: (!path.is_empty()).then(|| path.to_string()),
        stored_bytes: entry.map(|e| e.stored_bytes),
        chunks: entry.map(|e| e.chunk_count),
        zero_chunks: entry.map(|e| e.zero_chunks),
        raw_chunks: entry.map(|e| e.raw_chunks),
        compressed_chunks: entry.map(|e| e.compressed_chunks),
    }
}

/// Every problem of the GPU memory: the index, each data file, each chunk (checksums of
/// the stored and of the decompressed bytes); and how many chunks the index lists.
pub fn verify_gpu(dir: &Path, manifest: Option<&Manifest>, threads: usize) -> (Vec<Problem>, u64) {
    if !has_gpu_state(dir, manifest) {
        return (Vec::new(), 0);
    }
    let chunks = read_index(dir).map(|i| i.chunks.len() as u64).unwrap_or(0);
    let problems = match verify_image(dir, threads) {
        Ok(found) => found
            .iter()
            .map(|p| Problem {
                file: format!("{GPU_DIR}/{}", p.file),
                offset: Some(p.file_offset),
                kind: "gpu".into(),
                message: p.to_string(),
            })
            .collect(),
        Err(e) => {
            let r = index_error(dir, &e);
            vec![Problem {
                file: r.file,
                offset: r.offset,
                kind: "gpu".into(),
                message: r.message,
            }]
        }
    };
    (problems, chunks)
}

/// A transfer error as "gpu/FILE: at offset N: what".
pub fn index_error(dir: &Path, e: &TransferError) -> ReportError {
    let rel = |p: &Path| {
        p.strip_prefix(dir)
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_else(|_| p.display().to_string())
    };
    match e {
        TransferError::Index { path, offset, what }
        | TransferError::DataFile { path, offset, what } => {
            let file = rel(path);
            ReportError {
                message: format!("{file}: at offset {offset}: {what}"),
                file,
                offset: Some(*offset),
            }
        }
        TransferError::IndexMissing { path } => {
            let file = rel(path);
            ReportError {
                message: format!("{file}: missing: the GPU memory of the image cannot be read"),
                file,
                offset: None,
            }
        }
        TransferError::Io { path, source, .. } => {
            let file = rel(path);
            ReportError {
                message: format!("{file}: cannot read: {source}"),
                file,
                offset: None,
            }
        }
        TransferError::Chunk(p) => ReportError {
            file: format!("{GPU_DIR}/{}", p.file),
            offset: Some(p.file_offset),
            message: p.to_string(),
        },
        other => ReportError {
            file: format!("{GPU_DIR}/index"),
            offset: None,
            message: format!("{GPU_DIR}/index: {other}"),
        },
    }
}
