//! The dumping machine's GPU topology, read beside the dump.
//!
//! A dump records the topology of the GPUs its tasks use, for the restore to check
//! against. Reading it can take a while: on NVIDIA machines it goes through NVML, whose
//! initialisation took about 200 ms on an H200 (docs/gpu-validation.md). A dump starts
//! the read on a thread of its own as soon as it knows its backend, so that time
//! overlaps CRIU's dump instead of following it, and takes the result when it writes
//! the manifest. A restore starts it as soon as it has read the manifest, so that it
//! overlaps the image's verification and the driver's initialisation, and checks the
//! image's GPUs against the result.

use std::path::PathBuf;
use std::thread::JoinHandle;

use gpucr_topology::{Topology, TopologyError};

use super::{Backend, TaskDevice};

/// The local topology, being read where a backend keeps it (`Backend::sysfs_root`).
#[derive(Debug)]
pub struct LocalTopology {
    root: Option<PathBuf>,
    reading: Option<JoinHandle<Result<Topology, TopologyError>>>,
}

impl LocalTopology {
    /// Starts reading the topology `backend` sees, on a thread of its own.
    pub fn start(backend: &dyn Backend) -> LocalTopology {
        LocalTopology::start_at(backend.sysfs_root())
    }

    /// Starts reading the topology under `root` (None: this machine's), on a thread of
    /// its own.
    pub fn start_at(root: Option<PathBuf>) -> LocalTopology {
        let reading = std::thread::Builder::new()
            .name("gpucr-topology".into())
            .spawn({
                let root = root.clone();
                move || gpucr_topology::read_local(root.as_deref())
            })
            .ok();
        LocalTopology { root, reading }
    }

    /// The topology of the GPUs `tasks` use (their `gpus`: KFD gpu_ids and NVIDIA UUIDs
    /// alike), waiting for the read to end. Should the thread not have started, or have
    /// panicked, the topology is read here instead.
    pub fn used_by(self, tasks: &[TaskDevice]) -> Result<Topology, TopologyError> {
        let local = self.read()?;
        Ok(local.retain_gpus(|id| tasks.iter().flat_map(|t| &t.gpus).any(|g| g.matches(id))))
    }

    /// The whole topology, waiting for the read to end. Should the thread not have
    /// started, or have panicked, the topology is read here instead.
    pub fn read(self) -> Result<Topology, TopologyError> {
        match self.reading.and_then(|reading| reading.join().ok()) {
            Some(read) => read,
            None => gpucr_topology::read_local(self.root.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::gpu::sim::{SimBackend, SimRoot};
    use crate::gpu::GpuRef;

    fn task_using(gpus: Vec<GpuRef>) -> TaskDevice {
        TaskDevice {
            ns_pid: 1,
            host_pid: 1,
            gpus,
            device_files: Vec::new(),
            state_format: String::new(),
            state: Vec::new(),
            buffers: Vec::new(),
            operations: Vec::new(),
        }
    }

    fn sim_backend(root: &Path) -> SimBackend {
        SimBackend::new(SimRoot::new(root), Path::new("/dev/null"), None).unwrap()
    }

    #[test]
    fn keeps_only_the_gpus_the_tasks_use() {
        let dir = tempfile::tempdir().unwrap();
        let ids = SimRoot::new(dir.path()).ensure_topology(3).unwrap();
        let local = LocalTopology::start(&sim_backend(dir.path()));
        let tasks = [
            task_using(vec![GpuRef::Kfd(ids[2])]),
            task_using(vec![GpuRef::Kfd(ids[0]), GpuRef::Kfd(ids[2])]),
        ];
        let kept = local.used_by(&tasks).unwrap().gpus();
        let mut kept_ids: Vec<u32> = kept
            .iter()
            .map(|id| match id {
                gpucr_topology::GpuId::Kfd { gpu_id, .. } => *gpu_id,
                other => panic!("not a KFD GPU: {other:?}"),
            })
            .collect();
        kept_ids.sort_unstable();
        let mut expected = vec![ids[0], ids[2]];
        expected.sort_unstable();
        assert_eq!(kept_ids, expected);
    }

    #[test]
    fn the_topology_is_read_when_started_not_when_taken() {
        // The read happens beside the dump: what the manifest records is the machine
        // as the dump began. With no topology there yet, the dump records no GPUs.
        let dir = tempfile::tempdir().unwrap();
        let local = LocalTopology::start(&sim_backend(dir.path()));
        let reading = local.reading.as_ref().expect("the thread started");
        while !reading.is_finished() {
            std::thread::yield_now();
        }
        let ids = SimRoot::new(dir.path()).ensure_topology(2).unwrap();
        let topology = local.used_by(&[task_using(vec![GpuRef::Kfd(ids[0])])]);
        assert!(!topology.unwrap().has_gpus());
    }
}
