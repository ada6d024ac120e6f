//! GPU topology for gpucr: read a machine's GPUs, decide whether a checkpointed topology
//! can be restored on them, and find onto which GPUs.
//!
//! # API
//!
//! * [`read_local`]`(root)` reads this machine's topology: AMD (and simulated) GPUs and
//!   the CPU nodes from the KFD sysfs tree, NVIDIA GPUs from NVML or the driver's procfs.
//!   `root` (`--sysfs-root`, `GPUCR_SYSFS_ROOT`) stands for `/`: the KFD tree is read
//!   from `ROOT/sys/class/kfd/kfd/topology/nodes`, NVIDIA GPUs from
//!   `ROOT/proc/driver/nvidia/gpus/*/information` and `ROOT/sys/bus/pci/devices`, and NVML
//!   is not used. Errors ([`TopologyError`]) name the missing or malformed file.
//! * [`Topology`] is the snapshot (serde), stored as `topology` in an image's manifest.
//!   [`Topology::retain_gpus`] keeps only the GPUs a process tree uses.
//! * [`Checks`]`::from_env_and_skips(&skips)` says which rules apply: the `KFD_*_CHECK`
//!   variables of CRIU's amdgpu plugin (`0`/`NO` off, `1`/`YES` on, default on) and
//!   `--skip-check NAME` ([`CheckName`]).
//! * [`check`]`(saved, local, &checks)` returns a [`Report`]: `mapping` (old GPU -> new
//!   GPU, a [`Mapping`]) when one exists, else the failed checks of every checkpointed GPU
//!   against every local candidate, with both values. `Report` prints the human report
//!   (`Display`) and serializes to the JSON of `gpucr check-topology --json`.
//! * [`check_local`]`(saved, root, cuda_visible_devices, &checks)` reads this machine's
//!   topology and checks `saved` against it, as a restore does.
//! * [`find_mapping`]`(saved, local, &checks)` is the search alone (no report).
//! * [`GpuTable`]`::new(&topology)` is the table of local GPUs (`Display`, `Serialize`).
//!
//! The rules are CRIU's (`amdgpu_plugin_topology.c`) for KFD GPUs and NVIDIA's for CUDA
//! ("same chip, enough memory, every GPU mapped"); `docs/topology.md` lists them. The
//! mapping search ([`check`]) is complete: it finds a mapping whenever one exists.
//!
//! ```no_run
//! use gpucr_topology::{check, read_local, Checks, Topology};
//!
//! # fn saved() -> Topology { Topology::default() }
//! let local = read_local(None)?;
//! let report = check(&saved(), &local, &Checks::from_env_and_skips(&[]));
//! match &report.mapping {
//!     Some(mapping) => println!("{:?}", mapping.kfd_gpu_ids()),
//!     None => eprint!("{report}"),
//! }
//! # Ok::<(), gpucr_topology::TopologyError>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod bitset;
mod checks;
pub mod kfd;
mod matching;
mod model;
pub mod nvidia;
mod properties;
mod report;
mod rules;
mod search;
mod system;
mod table;

#[cfg(test)]
mod exhaustive;

use std::path::Path;

pub use checks::{CheckName, Checks, Disabled, Requirement, UnknownCheck};
pub use kfd::KfdError;
pub use model::{
    CacheGroup, GpuId, IoLink, KfdNode, LinkType, MemBank, NvidiaGpu, NvidiaSource, Properties,
    Topology, Vram, AMD_VENDOR_ID, HEAP_TYPE_FB_PRIVATE, HEAP_TYPE_FB_PUBLIC, IOLINK_TYPE_PCIE,
    IOLINK_TYPE_XGMI, NVIDIA_VENDOR_ID,
};
pub use nvidia::{NvidiaError, NvmlError, Visible, VisibleError};
pub use report::{
    check, find_mapping, Candidate, CpuPair, DisabledCheck, GpuPair, GpuRef, GpuReport, Mapping,
    Problem, Report,
};
pub use rules::{Mismatch, Value};
pub use table::{GpuRow, GpuTable, LinkRow};

/// Why the local topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The KFD tree.
    #[error("cannot read the KFD topology")]
    Kfd(#[from] KfdError),
    /// The NVIDIA GPUs.
    #[error("cannot read the NVIDIA GPUs")]
    Nvidia(#[from] NvidiaError),
    /// `CUDA_VISIBLE_DEVICES` cannot be applied.
    #[error(transparent)]
    Visible(#[from] VisibleError),
}

/// Reads the GPU topology of this machine (`root` `None`), or of the tree under `root`
/// (a fixture, or the simulator's root), which stands for `/`.
pub fn read_local(root: Option<&Path>) -> Result<Topology, TopologyError> {
    let base = root.unwrap_or(Path::new("/"));
    let kfd_nodes = kfd::read_nodes(&base.join(kfd::NODES_DIR))?;
    let nvidia_gpus = nvidia::read(base, root.is_none())?;
    Ok(Topology {
        kfd_nodes,
        nvidia_gpus,
    })
}

/// This machine's topology as a restore may use it: [`read_local`], with the NVIDIA GPUs
/// limited to those `cuda_visible_devices` (the value of `CUDA_VISIBLE_DEVICES`, when it
/// is set) leaves, in the order it names them. The second value says what the variable
/// did, for the report.
pub fn read_local_visible(
    root: Option<&Path>,
    cuda_visible_devices: Option<&str>,
) -> Result<(Topology, Option<String>), TopologyError> {
    visible_only(read_local(root)?, cuda_visible_devices).map_err(TopologyError::from)
}

/// `local` with the NVIDIA GPUs `cuda_visible_devices` leaves, in the order it names
/// them, and what the variable did ([`read_local_visible`] on a topology already read).
fn visible_only(
    mut local: Topology,
    cuda_visible_devices: Option<&str>,
) -> Result<(Topology, Option<String>), VisibleError> {
    let Some(value) = cuda_visible_devices else {
        return Ok((local, None));
    };
    let visible = nvidia::visible::select(&local.nvidia_gpus, value)?;
    local.nvidia_gpus = visible.gpus;
    Ok((local, Some(visible.note)))
}

/// `saved` checked against this machine's GPUs as a restore uses them: the topology under
/// `root` with the NVIDIA GPUs `cuda_visible_devices` leaves ([`read_local_visible`]),
/// under `checks`. What the variable did is among the report's notes. `gpucr restore`
/// and `gpucr check-topology DIR` both decide through this one function.
pub fn check_local(
    saved: &Topology,
    root: Option<&Path>,
    cuda_visible_devices: Option<&str>,
    checks: &Checks,
) -> Result<Report, TopologyError> {
    check_read(saved, read_local(root)?, cuda_visible_devices, checks)
}

/// [`check_local`] against `local`, this machine's topology as [`read_local`] read it
/// (a restore starts the read early, on a thread of its own, since NVML's
/// initialisation takes a while).
pub fn check_read(
    saved: &Topology,
    local: Topology,
    cuda_visible_devices: Option<&str>,
    checks: &Checks,
) -> Result<Report, TopologyError> {
    let (local, note) = visible_only(local, cuda_visible_devices)?;
    let mut report = check(saved, &local, checks);
    report.notes.extend(note);
    Ok(report)
}
