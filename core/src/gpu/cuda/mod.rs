//! The cuda backend's gpucr half: NVIDIA GPUs through the CUDA driver's checkpoint API
//! (`gpucr-cuda-driver`), driven from gpucr's helper, with the driver loaded once per
//! gpucr run, before anything is frozen.
//!
//! The driver keeps a process's device memory: at the checkpoint it moves it into the
//! process's own memory (host staging), which CRIU then dumps with the rest, and brings
//! it back on restore, onto the GPUs a list of UUID pairs names. Every call on a frozen
//! process needs its restore thread to run, which the plugin half lets it do (ptrace)
//! for the length of the call, asking this half which thread that is
//! ([`Backend::restore_thread`]).
//!
//! Where the driver offers custom storage (CUDA 13.4), the memory takes the other way
//! ([`Staging::Custom`], `custom`): with the tree frozen and the restore threads let
//! run, the checkpoint maps it into the helper, which copies each GPU's region into
//! `gpu/` through the transfer engine, and only then completes the operation (which
//! drops the GPU memory), before CRIU dumps the task. A copy that fails gives the
//! memory, still mapped, back through the helper's own memory; a tree that lives on
//! after the completion (`--leave-running`, a later failure) gets it back from `gpu/`.
//! On restore the driver recreates the memory empty, mapped into the helper, which
//! fills it from `gpu/` before completing and unlocking. The process's own memory
//! never holds the GPU's.
//!
//! Per task: before the freeze the process is locked (unless it already was, or was
//! already checkpointed: what it was is remembered and respected); once frozen it is
//! checkpointed; after a dump the tree lives on from (`--leave-running`, a failure) it
//! is restored and unlocked back to what it was; on restore it is restored onto the
//! mapped GPUs and unlocked. Every driver call is timed in the task's operation log.
//!
//! Cancellation: a driver call in progress cannot be interrupted, so the step's token is
//! looked at before each call, and after a call that changed the process (the lock, the
//! checkpoint): if the token was cancelled meanwhile, the request that asked for it was
//! given up and records nothing of it, so the change is undone at once, the way the
//! give-back after a failed dump undoes one (the lock given back, the checkpoint
//! restored to the lock), and a late completion leaves the process as it was.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpucr_abi::proto::DeviceSpec;
use gpucr_cuda_driver::{Context, CustomStorage, Driver, ProcessState, Uuid};
use serde::{Deserialize, Serialize};

use super::{ns_pid, Backend, BufferInfo, Checkpointed, GpuError, GpuRef, TaskDevice};
use crate::cancel::{Cancel, Cancelled};
use crate::transfer::{BufferSink, BufferSource};

mod custom;
pub mod guard;

pub use custom::Staging;
use custom::{Copier, RegionSink, RegionSource};

/// The backend's name, in manifests.
pub const NAME: &str = "cuda";
/// The encoding of the cuda backend's task state ([`CudaState`] as JSON).
pub const STATE_FORMAT: &str = "cuda/1";
/// What the plugin half sends at CHECKPOINT_DEVICES ([`gpucr_abi::cuda::Collected`]).
pub use gpucr_abi::cuda::COLLECTED_FORMAT;

/// How long a lock may wait for the process's CUDA work in flight, unless the dump
/// gives its freeze timeout (CRIU's default freeze timeout).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The state of one checkpointed CUDA process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaState {
    /// The process's state before gpucr touched it: "running", "locked" or
    /// "checkpointed" (a restore brings it back to that, as CRIU's cuda plugin does).
    pub initial: String,
    /// `cuDriverGetVersion` of the dumping driver.
    pub driver_version: i32,
    /// The GPUs of the dumping machine, as UUIDs: a restore names every one of them in
    /// its UUID pairs, as the driver requires.
    pub gpus: Vec<String>,
    /// GPU moves chosen by the topology check at restore (old UUID, new UUID).
    #[serde(default)]
    pub remap: Vec<(String, String)>,
    /// How the device memory was moved: "host" (in the process's memory, dumped by
    /// CRIU) or "custom" (copied by gpucr into `gpu/`, one buffer per GPU region).
    #[serde(default = "host_staging")]
    pub staging: String,
}

fn host_staging() -> String {
    Staging::Host.name().into()
}

impl CudaState {
    fn decode(task: &TaskDevice) -> Result<CudaState, GpuError> {
        super::decode_state(task, STATE_FORMAT, "cuda backend")
    }

    /// The UUID pairs of a restore: every dumped GPU, onto itself unless remapped.
    fn pairs(&self) -> Result<Vec<(Uuid, Uuid)>, GpuError> {
        let parse = |text: &str| {
            text.parse::<Uuid>().map_err(|e| GpuError::Malformed {
                path: PathBuf::from("cuda task state"),
                detail: e.to_string(),
            })
        };
        self.gpus
            .iter()
            .map(|old| {
                let new = self
                    .remap
                    .iter()
                    .find(|(from, _)| from == old)
                    .map_or(old.as_str(), |(_, to)| to.as_str());
                Ok((parse(old)?, parse(new)?))
            })
            .collect()
    }

    fn staging(&self) -> Result<Staging, GpuError> {
        Staging::parse(&self.staging).ok_or_else(|| GpuError::Malformed {
            path: PathBuf::from("cuda task state"),
            detail: format!(
                "staging {:?}, this gpucr knows \"host\" and \"custom\"",
                self.staging
            ),
        })
    }
}

/// Whether `pid` has a `/dev/nvidia*` node open.
fn uses_nvidia_device(pid: i32) -> bool {
    gpucr_abi::procfs::open_files(pid)
        .any(|(_, target)| target.to_string_lossy().starts_with("/dev/nvidia"))
}

/// What gpucr did to one process of a dump, to undo it when the tree lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Touched {
    initial: ProcessState,
    checkpointed: bool,
}

/// The cuda backend.
#[derive(Debug)]
pub struct CudaBackend {
    driver: Arc<Driver>,
    lock_timeout: Duration,
    /// How a dump moves device memory.
    staging: Staging,
    /// The dump's CUDA processes, by host pid.
    touched: Mutex<HashMap<i32, Touched>>,
    /// Custom-storage checkpoints begun and not yet completed, by host pid.
    held: Mutex<HashMap<i32, CustomStorage>>,
    /// Custom-storage checkpoints completed: the sizes of their GPU regions (the
    /// image's buffers), by host pid.
    copied: Mutex<HashMap<i32, Vec<u64>>>,
    /// Custom-storage restores begun and not yet completed, by host pid.
    restoring: Mutex<HashMap<i32, CustomStorage>>,
    /// The helper's own context, current in every thread that copies a region.
    context: Mutex<Option<Context>>,
    /// The dump's give-back guard, told of every process gpucr touches.
    guard: Option<guard::Guard>,
}

fn driver_error(pid: i32) -> impl FnOnce(gpucr_cuda_driver::Error) -> GpuError {
    move |e| GpuError::Task {
        pid,
        detail: e.to_string(),
    }
}

/// Load the driver: a driver that answers its initialisation with an error
/// ([`GpuError::Driver`]) is told from one that cannot be used at all (missing, too
/// old: [`GpuError::Config`], naming `GPUCR_CUDA_LIBRARY`).
pub(crate) fn load_driver() -> Result<Driver, GpuError> {
    Driver::load().map_err(|e| match e {
        gpucr_cuda_driver::Error::Cuda(_) => GpuError::Driver {
            detail: e.to_string(),
        },
        e => GpuError::Config {
            variable: gpucr_cuda_driver::ENV_LIBRARY,
            value: std::env::var(gpucr_cuda_driver::ENV_LIBRARY).unwrap_or_default(),
            detail: e.to_string(),
        },
    })
}

impl CudaBackend {
    /// Load the driver (`libcuda.so.1`, or `GPUCR_CUDA_LIBRARY`) and initialise it.
    pub fn load() -> Result<CudaBackend, GpuError> {
        let driver = load_driver()?;
        Ok(CudaBackend {
            driver: Arc::new(driver),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            staging: Staging::Host,
            touched: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            copied: Mutex::new(HashMap::new()),
            restoring: Mutex::new(HashMap::new()),
            context: Mutex::new(None),
            guard: None,
        })
    }

    /// Give the processes this dump touches a guard ([`guard`]) that gives them back
    /// should gpucr die during the dump.
    pub fn set_guard(&mut self, guard: guard::Guard) {
        self.guard = Some(guard);
    }

    /// Remember that gpucr touched `pid`, in `initial` before, and tell the guard.
    fn touch(&self, pid: i32, initial: ProcessState) {
        self.touched().insert(
            pid,
            Touched {
                initial,
                checkpointed: initial == ProcessState::Checkpointed,
            },
        );
        if let Some(guard) = &self.guard {
            guard.record(pid, initial);
        }
    }

    /// Choose how the dump moves device memory: `requested` (`--cuda-staging`), else
    /// custom storage where the driver offers it, else host staging. Custom storage
    /// asked for where the driver has none is an error.
    pub fn set_staging(&mut self, requested: Option<Staging>) -> Result<Staging, GpuError> {
        let offered = self.driver.has_custom_storage();
        self.staging = match requested {
            Some(Staging::Custom) if !offered => {
                return Err(GpuError::Config {
                    variable: "--cuda-staging",
                    value: Staging::Custom.name().into(),
                    detail: format!(
                        "the CUDA driver ({}, version {}) has no custom storage (CUDA \
                         13.4, version 13040, needed)",
                        self.driver.path().display(),
                        self.driver.version()
                    ),
                })
            }
            Some(staging) => staging,
            None if offered => Staging::Custom,
            None => Staging::Host,
        };
        Ok(self.staging)
    }

    /// How a dump moves device memory.
    pub fn staging(&self) -> Staging {
        self.staging
    }

    /// The helper's context (the primary context of the first GPU), retained once.
    fn copier(&self, pid: i32) -> Result<Copier, GpuError> {
        let mut context = self.context.lock().unwrap_or_else(|e| e.into_inner());
        let context = match *context {
            Some(c) => c,
            None => {
                let device = self.driver.device_get(0).map_err(driver_error(pid))?;
                let c = self
                    .driver
                    .primary_ctx_retain(device)
                    .map_err(driver_error(pid))?;
                *context = Some(c);
                c
            }
        };
        Ok(Copier {
            driver: self.driver.clone(),
            context,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<i32, CustomStorage>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn copied(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Vec<u64>>> {
        self.copied.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn restoring(&self) -> std::sync::MutexGuard<'_, HashMap<i32, CustomStorage>> {
        self.restoring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begin a custom-storage restore of `pid` onto `pairs` whose regions must have
    /// `sizes`, held until [`complete_restore`](Self::complete_restore); sinks for the
    /// regions, in order.
    fn begin_restore(
        &self,
        pid: i32,
        pairs: &[(Uuid, Uuid)],
        sizes: &[u64],
    ) -> Result<Vec<Box<dyn BufferSink>>, GpuError> {
        let storage = self
            .driver
            .restore_custom(pid, pairs)
            .map_err(driver_error(pid))?;
        let regions = storage.devices.clone();
        // Held first: a restore that fails from here on still has its operation.
        self.restoring().insert(pid, storage);
        let found: Vec<u64> = regions.iter().map(|r| r.size as u64).collect();
        if found != sizes {
            return Err(GpuError::Task {
                pid,
                detail: format!(
                    "the driver recreated GPU regions of {found:?} bytes, the image has \
                     {sizes:?}"
                ),
            });
        }
        let copier = self.copier(pid)?;
        Ok(regions
            .into_iter()
            .enumerate()
            .map(|(i, region)| {
                Box::new(RegionSink {
                    copier: copier.clone(),
                    region,
                    queue: i as u32,
                }) as Box<dyn BufferSink>
            })
            .collect())
    }

    /// Complete the custom-storage restore of `pid` begun by
    /// [`begin_restore`](Self::begin_restore), if there is one (LOCKED after).
    fn complete_restore(&self, pid: i32) -> Result<bool, GpuError> {
        let Some(storage) = self.restoring().remove(&pid) else {
            return Ok(false);
        };
        self.driver
            .operation_complete(&storage.handle)
            .map_err(driver_error(pid))?;
        Ok(true)
    }

    /// A custom-storage checkpoint of `pid` whose copy failed (or whose tree lives on):
    /// its memory, still mapped here, goes back through the helper's own memory (never
    /// the process's): read out, the checkpoint completed, a custom-storage restore
    /// onto the same GPUs begun and filled, completed. The process is LOCKED after.
    fn give_back_held(&self, pid: i32, storage: CustomStorage) -> Result<(), GpuError> {
        let copier = self.copier(pid)?;
        let mut saved = Vec::with_capacity(storage.devices.len());
        for region in &storage.devices {
            let mut bytes = vec![0u8; region.size];
            copier
                .read(region, 0, &mut bytes)
                .map_err(|e| GpuError::Task {
                    pid,
                    detail: format!(
                        "reading its GPU memory back failed ({e}): the custom-storage \
                         checkpoint is left open and the process locked"
                    ),
                })?;
            saved.push(bytes);
        }
        self.driver
            .operation_complete(&storage.handle)
            .map_err(driver_error(pid))?;
        let back = self
            .driver
            .restore_custom(pid, &[])
            .map_err(driver_error(pid))?;
        let sizes_match = back.devices.len() == saved.len()
            && back
                .devices
                .iter()
                .zip(&saved)
                .all(|(r, s)| r.size == s.len());
        if !sizes_match {
            return Err(GpuError::Task {
                pid,
                detail: format!(
                    "the driver's restore has {} GPU regions, its checkpoint had {}",
                    back.devices.len(),
                    saved.len()
                ),
            });
        }
        for (region, bytes) in back.devices.iter().zip(&saved) {
            copier.write(region, 0, bytes).map_err(|e| GpuError::Task {
                pid,
                detail: format!("writing its GPU memory back: {e}"),
            })?;
        }
        self.driver
            .operation_complete(&back.handle)
            .map_err(driver_error(pid))
    }

    /// Whether the driver should be loaded for a dump of `tree`: a driver is named in
    /// `GPUCR_CUDA_LIBRARY`, or a task has an NVIDIA device node open (cheap: no
    /// `cuInit`).
    pub fn wanted(tree: &[i32]) -> bool {
        std::env::var_os(gpucr_cuda_driver::ENV_LIBRARY).is_some()
            || tree.iter().any(|&pid| uses_nvidia_device(pid))
    }

    /// The GPUs of this machine, as UUIDs.
    fn gpu_uuids(&self, pid: i32) -> Result<Vec<String>, GpuError> {
        let count = self.driver.device_count().map_err(driver_error(pid))?;
        (0..count)
            .map(|i| {
                let device = self.driver.device_get(i).map_err(driver_error(pid))?;
                let uuid = self.driver.device_uuid(device).map_err(driver_error(pid))?;
                Ok(uuid.to_string())
            })
            .collect()
    }

    /// How long a lock before the freeze may wait for the process's work in flight
    /// (the dump's freeze timeout).
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    /// Checkpoint `pid` unless it already is, marked first: a checkpoint that fails
    /// halfway is restored after the dump. Whether a driver call was made. Not begun
    /// once `cancel` is cancelled; one that completes after it is undone
    /// ([`CudaBackend::undo_checkpoint`]).
    fn checkpoint_once(&self, pid: i32, cancel: &Cancel) -> Result<bool, GpuError> {
        cancel.check()?;
        match self.touched().get_mut(&pid) {
            Some(touched) if !touched.checkpointed => touched.checkpointed = true,
            _ => return Ok(false),
        }
        match self.staging {
            Staging::Host => {
                self.driver.checkpoint(pid).map_err(driver_error(pid))?;
                if let Err(c) = cancel.check() {
                    return Err(self.undo_checkpoint(pid, None, c));
                }
            }
            Staging::Custom => {
                let storage = self
                    .driver
                    .checkpoint_custom(pid)
                    .map_err(driver_error(pid))?;
                if let Err(c) = cancel.check() {
                    return Err(self.undo_checkpoint(pid, Some(storage), c));
                }
                self.held().insert(pid, storage);
            }
        }
        Ok(true)
    }

    /// A lock of `pid` (in `initial` before) that completed, or failed half-way, after
    /// its request was given up (`why`): given back at once, as the give-back after a
    /// dump gives back a lock that failed half-way, since the helper records nothing of
    /// it. The cancellation, or why the give-back failed.
    fn undo_lock(&self, pid: i32, initial: ProcessState, why: Cancelled) -> GpuError {
        match guard::give_back(&self.driver, pid, initial) {
            Ok(_) => {
                self.touched().remove(&pid);
                GpuError::Cancelled(why)
            }
            Err(e) => GpuError::Task {
                pid,
                detail: format!(
                    "its lock completed after the request was given up ({}), and giving                      it back failed: {e}",
                    why.0
                ),
            },
        }
    }

    /// A checkpoint of `pid` that completed after its request was given up (`why`):
    /// brought back to the lock [`Backend::pre_freeze`] left (a driver restore; with
    /// custom storage its memory, still mapped here, goes back through the helper as
    /// after a failed copy). The cancellation, or why undoing it failed.
    fn undo_checkpoint(
        &self,
        pid: i32,
        storage: Option<CustomStorage>,
        why: Cancelled,
    ) -> GpuError {
        let undone = match storage {
            Some(storage) => self.give_back_held(pid, storage),
            None => guard::give_back(&self.driver, pid, ProcessState::Locked).map(drop),
        };
        match undone {
            Ok(()) => {
                if let Some(touched) = self.touched().get_mut(&pid) {
                    touched.checkpointed = false;
                }
                GpuError::Cancelled(why)
            }
            Err(e) => GpuError::Task {
                pid,
                detail: format!(
                    "its checkpoint completed after the request was given up ({}), and                      undoing it failed: {e}",
                    why.0
                ),
            },
        }
    }

    fn touched(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Touched>> {
        self.touched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn holds_device(&self, pid: i32) -> bool {
        matches!(self.driver.restore_thread_id(pid), Ok(Some(_)))
    }

    /// The GPUs whose `/dev/nvidiaN` the tasks hold open (the driver opens one for each
    /// GPU it lets the process see).
    fn gpus_in_use(&self, pids: &[i32], local: &gpucr_topology::Topology) -> Option<Vec<GpuRef>> {
        let devices = crate::gpu::devices_open::char_devices(pids);
        gpus_with_minors(
            local,
            &crate::gpu::devices_open::nvidia_gpu_minors(&devices),
        )
    }

    fn whole_tree(&self) -> bool {
        true
    }

    fn checkpoint_ahead(&self, pid: i32, cancel: &Cancel) -> Result<bool, GpuError> {
        self.checkpoint_once(pid, cancel)
    }

    fn restore_thread(&self, pid: i32, cancel: &Cancel) -> Result<Option<i32>, GpuError> {
        cancel.check()?;
        self.driver
            .restore_thread_id(pid)
            .map_err(driver_error(pid))
    }

    fn pre_freeze(&self, pid: i32, cancel: &Cancel) -> Result<(), GpuError> {
        if self.restore_thread(pid, cancel)?.is_none() {
            return Ok(());
        }
        cancel.check()?;
        let initial = self.driver.process_state(pid).map_err(driver_error(pid))?;
        cancel.check()?;
        match initial {
            ProcessState::Running => {
                // The driver's lock waits for the process's restore thread, which a
                // stopped process does not run: said at once, not after the timeout.
                GpuError::refuse_stopped(pid)?;
                // Remembered first: a lock that fails halfway is undone after the dump.
                self.touch(pid, initial);
                let locked = self
                    .driver
                    .lock(pid, Some(self.lock_timeout))
                    .map_err(driver_error(pid));
                if let Err(why) = cancel.check() {
                    return Err(self.undo_lock(pid, initial, why));
                }
                locked
            }
            ProcessState::Locked | ProcessState::Checkpointed => {
                self.touch(pid, initial);
                Ok(())
            }
            other => Err(GpuError::Task {
                pid,
                detail: format!(
                    "the CUDA process is {}: it cannot be checkpointed",
                    other.name()
                ),
            }),
        }
    }

    fn adopt_task(
        &self,
        pid: i32,
        format: &str,
        state: &[u8],
        buffers: Vec<OwnedFd>,
        cancel: &Cancel,
    ) -> Result<Option<Checkpointed>, GpuError> {
        cancel.check()?;
        if state.is_empty() {
            return Ok(None);
        }
        if format != COLLECTED_FORMAT || !buffers.is_empty() {
            return Err(GpuError::Task {
                pid,
                detail: format!(
                    "the plugin half sent {format:?} with {} fds, not {COLLECTED_FORMAT:?} \
                     without fds",
                    buffers.len()
                ),
            });
        }
        let Some(touched) = self.touched().get(&pid).copied() else {
            return Err(GpuError::Task {
                pid,
                detail: "a CUDA process that was not locked before the freeze".into(),
            });
        };
        // Already done when the helper checkpointed the whole tree at once.
        self.checkpoint_once(pid, cancel)?;
        cancel.check()?;
        let gpus = self.gpu_uuids(pid)?;
        // The regions of a custom-storage checkpoint gpucr made (none for a process
        // already checkpointed before the dump, whose memory the driver keeps).
        let regions: Vec<u64> = match self.held().get(&pid) {
            Some(storage) => storage.devices.iter().map(|r| r.size as u64).collect(),
            None => self.copied().get(&pid).cloned().unwrap_or_default(),
        };
        let staging = if regions.is_empty() && touched.initial == ProcessState::Checkpointed {
            Staging::Host
        } else {
            self.staging
        };
        let cuda_state = CudaState {
            initial: touched.initial.name().into(),
            driver_version: self.driver.version(),
            gpus: gpus.clone(),
            remap: Vec::new(),
            staging: staging.name().into(),
        };
        // The buffers are copied by the helper ([`Backend::held_sources`]).
        let buffers = regions
            .into_iter()
            .enumerate()
            .map(|(i, size)| BufferInfo {
                path: String::new(),
                size,
                gpu_id: i as u32,
                kind: "vram".into(),
                mode: 0,
            })
            .collect();
        let device = TaskDevice {
            ns_pid: ns_pid(pid)?,
            host_pid: pid,
            gpus: gpus.into_iter().map(GpuRef::Nvidia).collect(),
            device_files: Vec::new(),
            state_format: STATE_FORMAT.into(),
            state: serde_json::to_vec(&cuda_state).expect("the cuda state serialises"),
            buffers,
            operations: Vec::new(),
        };
        Ok(Some(Checkpointed {
            device,
            sources: Vec::new(),
        }))
    }

    fn held_sources(
        &self,
        pid: i32,
        cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSource>>, GpuError> {
        cancel.check()?;
        let regions = match self.held().get(&pid) {
            Some(storage) => storage.devices.clone(),
            None => return Ok(Vec::new()),
        };
        let copier = self.copier(pid)?;
        Ok(regions
            .into_iter()
            .map(|region| {
                Box::new(RegionSource {
                    copier: copier.clone(),
                    region,
                }) as Box<dyn BufferSource>
            })
            .collect())
    }

    fn release_held(&self, pid: i32, copied: bool, cancel: &Cancel) -> Result<bool, GpuError> {
        // Not begun once cancelled: the memory stays held, for the give-back at the end
        // of the dump. Once begun it runs whole (a completion that lands after the
        // cancellation is recorded, so that a tree living on gets the memory back from
        // the image; a give-back stopped half-way would lose the memory).
        cancel.check()?;
        let Some(storage) = self.held().remove(&pid) else {
            return Ok(false);
        };
        if copied {
            let sizes = storage.devices.iter().map(|r| r.size as u64).collect();
            if let Err(e) = self.driver.operation_complete(&storage.handle) {
                // Still open, the memory still mapped: it goes back to the process,
                // and the dump fails.
                let failed = driver_error(pid)(e);
                return Err(match self.give_back_held(pid, storage) {
                    Ok(()) => failed,
                    Err(also) => GpuError::Task {
                        pid,
                        detail: format!("{failed}; giving the memory back: {also}"),
                    },
                });
            }
            self.copied().insert(pid, sizes);
        } else {
            self.give_back_held(pid, storage)?;
        }
        Ok(true)
    }

    fn refill_sinks(
        &self,
        pid: i32,
        cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSink>>, GpuError> {
        cancel.check()?;
        let Some(sizes) = self.copied().remove(&pid) else {
            return Ok(Vec::new());
        };
        self.begin_restore(pid, &[], &sizes)
    }

    fn after_dump(&self, pid: i32, cancel: &Cancel) -> Result<(), GpuError> {
        // Not begun once cancelled; once begun it runs whole: a restore without its
        // unlock would leave the job locked, with nothing left to unlock it.
        cancel.check()?;
        // Memory written back from the image (refill_sinks) completes first.
        self.complete_restore(pid)?;
        let Some(touched) = self.touched().remove(&pid) else {
            return Ok(());
        };
        guard::give_back(&self.driver, pid, touched.initial).map(drop)
    }

    fn resume_sinks(
        &self,
        pid: i32,
        task: &TaskDevice,
        cancel: &Cancel,
    ) -> Result<Vec<Box<dyn BufferSink>>, GpuError> {
        let state = CudaState::decode(task)?;
        if state.initial == "checkpointed" || state.staging()? != Staging::Custom {
            return Ok(Vec::new());
        }
        cancel.check()?;
        let sizes: Vec<u64> = task.buffers.iter().map(|b| b.size).collect();
        self.begin_restore(pid, &state.pairs()?, &sizes)
    }

    /// Host staging: the driver's restore copies the staged memory out of the process
    /// (a kernel-side copy: whether the driver copes with pages still to come through
    /// a userfaultfd is unmeasured, so they are brought in first). A state that does
    /// not decode says yes: its resume fails anyway.
    fn resume_reads_process_memory(&self, task: &TaskDevice) -> bool {
        CudaState::decode(task).map_or(true, |state| {
            state.initial != "checkpointed" && state.staging().map_or(true, |s| s == Staging::Host)
        })
    }

    fn resume_task(&self, pid: i32, task: &TaskDevice, cancel: &Cancel) -> Result<(), GpuError> {
        let state = CudaState::decode(task)?;
        if state.initial == "checkpointed" {
            return Ok(());
        }
        // A restore given up fails, and CRIU kills the restored tree: nothing to undo.
        cancel.check()?;
        // Custom storage: the regions are filled; else the driver restores.
        if !self.complete_restore(pid)? {
            cancel.check()?;
            self.driver
                .restore(pid, &state.pairs()?)
                .map_err(driver_error(pid))?;
        }
        if state.initial == "running" {
            cancel.check()?;
            self.driver.unlock(pid).map_err(driver_error(pid))?;
        }
        Ok(())
    }

    fn file_owner(&self, _fd: BorrowedFd<'_>, _tasks: &[i32]) -> Result<Option<i32>, GpuError> {
        // A checkpointed CUDA process holds no device file the driver needs back.
        Ok(None)
    }

    fn restore_spec(&self, task: &TaskDevice) -> Result<DeviceSpec, GpuError> {
        CudaState::decode(task)?;
        Ok(DeviceSpec::default())
    }

    fn buffer_sink(
        &self,
        task: &TaskDevice,
        index: usize,
        _file: File,
    ) -> Result<Box<dyn BufferSink>, GpuError> {
        Err(GpuError::Task {
            pid: task.host_pid,
            detail: format!("buffer {index}: the cuda backend's driver restores the memory"),
        })
    }

    fn sysfs_root(&self) -> Option<PathBuf> {
        None
    }

    fn state_root(&self) -> Option<PathBuf> {
        None
    }

    fn remap_gpus(&self, task: &mut TaskDevice, map: &[(GpuRef, GpuRef)]) -> Result<(), GpuError> {
        let mut state = CudaState::decode(task)?;
        state.remap = map
            .iter()
            .filter_map(|pair| match pair {
                (GpuRef::Nvidia(from), GpuRef::Nvidia(to)) => Some((from.clone(), to.clone())),
                _ => None,
            })
            .collect();
        for gpu in &mut task.gpus {
            if let GpuRef::Nvidia(uuid) = gpu {
                if let Some((_, to)) = state.remap.iter().find(|(from, _)| from == uuid) {
                    *uuid = to.clone();
                }
            }
        }
        task.state = serde_json::to_vec(&state).expect("the cuda state serialises");
        Ok(())
    }
}

/// The GPUs of `local` whose `/dev/nvidiaN` minor is among `minors`; None when none
/// is (the machine's minors unknown, or no GPU node open).
fn gpus_with_minors(
    local: &gpucr_topology::Topology,
    minors: &std::collections::BTreeSet<u32>,
) -> Option<Vec<GpuRef>> {
    let gpus: Vec<GpuRef> = local
        .nvidia_gpus
        .iter()
        .filter(|g| g.minor.is_some_and(|m| minors.contains(&m)))
        .map(|g| GpuRef::Nvidia(g.uuid.clone()))
        .collect();
    (!gpus.is_empty()).then_some(gpus)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    #[test]
    fn the_gpus_in_use_are_those_whose_nodes_are_open() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/topology/h100-8x");
        let local = gpucr_topology::read_local(Some(&root)).unwrap();
        let uuid_of = |minor: u32| {
            let gpu = local
                .nvidia_gpus
                .iter()
                .find(|g| g.minor == Some(minor))
                .unwrap();
            GpuRef::Nvidia(gpu.uuid.clone())
        };
        let used = gpus_with_minors(&local, &BTreeSet::from([3, 5])).unwrap();
        assert_eq!(used.len(), 2, "{used:?}");
        assert!(
            used.contains(&uuid_of(3)) && used.contains(&uuid_of(5)),
            "{used:?}"
        );
        // No GPU node open, or only minors this machine has no GPU for: cannot tell.
        assert_eq!(gpus_with_minors(&local, &BTreeSet::new()), None);
        assert_eq!(gpus_with_minors(&local, &BTreeSet::from([99])), None);
    }

    fn task(state: &CudaState) -> TaskDevice {
        TaskDevice {
            ns_pid: 1,
            host_pid: 10,
            gpus: state.gpus.iter().cloned().map(GpuRef::Nvidia).collect(),
            device_files: Vec::new(),
            state_format: STATE_FORMAT.into(),
            state: serde_json::to_vec(state).unwrap(),
            buffers: Vec::new(),
            operations: Vec::new(),
        }
    }

    const A: &str = "GPU-00000000-0000-0000-0000-00000000000a";
    const B: &str = "GPU-00000000-0000-0000-0000-00000000000b";
    const C: &str = "GPU-00000000-0000-0000-0000-00000000000c";

    #[test]
    fn restore_pairs_name_every_dumped_gpu() {
        let mut state = CudaState {
            initial: "running".into(),
            driver_version: 13000,
            gpus: vec![A.into(), B.into()],
            remap: Vec::new(),
            staging: "host".into(),
        };
        let pairs = state.pairs().unwrap();
        assert_eq!(pairs.len(), 2);
        assert!(pairs.iter().all(|(old, new)| old == new));
        state.remap = vec![(A.into(), C.into())];
        let pairs = state.pairs().unwrap();
        assert_eq!(pairs[0], (A.parse().unwrap(), C.parse().unwrap()));
        assert_eq!(pairs[1], (B.parse().unwrap(), B.parse().unwrap()));
    }

    #[test]
    fn a_state_of_another_format_or_garbage_is_refused() {
        let state = CudaState {
            initial: "running".into(),
            driver_version: 13000,
            gpus: vec![A.into()],
            remap: Vec::new(),
            staging: "host".into(),
        };
        let mut t = task(&state);
        assert_eq!(CudaState::decode(&t).unwrap(), state);
        t.state_format = "cuda/9".into();
        let err = CudaState::decode(&t).unwrap_err().to_string();
        assert!(err.contains("cuda/9"), "{err}");
        t.state_format = STATE_FORMAT.into();
        t.state = b"{".to_vec();
        assert!(CudaState::decode(&t).is_err());
        let bad = CudaState {
            gpus: vec!["not-a-uuid".into()],
            ..state
        };
        assert!(bad.pairs().is_err());
    }
}
