//! An image's GPU state, checked before anything is restored: its backend, its GPUs
//! mapped onto this machine's, and its paths confined to the backend's root.

use super::{RestoreError, RestoreOptions};
use crate::gpu::{GpuManifest, GpuRef, LocalTopology};
use crate::image::manifest::Manifest;

/// A warning for an image whose tasks use GPUs but whose dump recorded no topology of
/// them (the dumping machine's GPUs could not be read): there is nothing to check this
/// machine's against, so the tasks keep their GPU ids. None otherwise.
pub(super) fn unchecked_gpus(manifest: &Manifest) -> Option<String> {
    let section = manifest.gpu.as_ref()?;
    if manifest.topology.as_ref().is_some_and(|t| t.has_gpus()) {
        return None;
    }
    let used = section.used_gpus();
    (!used.is_empty()).then(|| {
        format!(
            "the image records no GPU topology (the dumping machine's GPUs could not be \
             read): its tasks keep their GPUs ({}), unchecked against this machine's",
            used.join(", ")
        )
    })
}

/// An image's GPU state mapped onto this machine, and the backend that restores it.
pub type PreparedGpu = (GpuManifest, std::sync::Arc<dyn crate::gpu::Backend>);

/// The image's GPU state, checked before anything is restored: its backend, the mapping
/// onto this machine's GPUs (the topology check), and every path it would create or
/// open confined to the backend's root. None for an image without GPU state.
pub fn prepare_gpu(
    opts: &RestoreOptions,
    manifest: &Manifest,
    topology: Option<LocalTopology>,
) -> Result<Option<PreparedGpu>, RestoreError> {
    let Some(section) = &manifest.gpu else {
        return Ok(None);
    };
    let gpu = section
        .load(&opts.dir)
        .map_err(|e| RestoreError::GpuSection {
            manifest: Manifest::path_in(&opts.dir),
            source: e,
        })?;
    let backend = crate::gpu::backend_named(&gpu.backend)?;
    let gpu = map_onto_local_gpus(opts, manifest, &gpu, backend.as_ref(), topology)?;
    for (task, device) in gpu.tasks.iter().enumerate() {
        let spec = backend.restore_spec(device)?;
        crate::gpu::check_confined(&spec).map_err(|source| RestoreError::UnsafePath {
            manifest: Manifest::path_in(&opts.dir),
            task,
            source,
        })?;
    }
    Ok(Some((gpu, backend)))
}

/// Check the image's GPUs against this machine's (the same check as `gpucr
/// check-topology DIR`), as `topology` read it (read here when None), and move the
/// device state onto the GPUs the mapping chose.
fn map_onto_local_gpus(
    opts: &RestoreOptions,
    manifest: &Manifest,
    gpu: &GpuManifest,
    backend: &dyn crate::gpu::Backend,
    topology: Option<LocalTopology>,
) -> Result<GpuManifest, RestoreError> {
    let mut gpu = gpu.clone();
    let Some(saved) = manifest.topology.as_ref().filter(|t| t.has_gpus()) else {
        return Ok(gpu);
    };
    let local = match topology {
        Some(reading) => reading.read()?,
        None => {
            let root = opts.sysfs_root.clone().or_else(|| backend.sysfs_root());
            gpucr_topology::read_local(root.as_deref())?
        }
    };
    let report = gpucr_topology::check_read(
        saved,
        local,
        opts.cuda_visible_devices.as_deref(),
        &gpucr_topology::Checks::from_env_and_skips(&opts.skip_checks),
    )?;
    let Some(mapping) = report.mapping.as_ref().filter(|_| report.compatible) else {
        return Err(RestoreError::Topology(Box::new(report)));
    };
    let pairs: Vec<(GpuRef, GpuRef)> = mapping
        .kfd_gpu_ids()
        .into_iter()
        .map(|(a, b)| (GpuRef::Kfd(a), GpuRef::Kfd(b)))
        .chain(
            mapping
                .nvidia_uuids()
                .into_iter()
                .map(|(a, b)| (GpuRef::Nvidia(a), GpuRef::Nvidia(b))),
        )
        .collect();
    for task in &mut gpu.tasks {
        backend.remap_gpus(task, &pairs)?;
    }
    Ok(gpu)
}
