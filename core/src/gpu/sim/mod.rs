//! The simulator backend: device contexts and buffers as files in a sim root on tmpfs,
//! a character device CRIU does not handle as the "device", and modelled copy engines.
//!
//! It keeps a real device's rules: a task's device state is found from the task itself
//! (its mappings and open device fd), its buffers are read through a copy engine while
//! CRIU dumps, and on restore they exist only once the restored task has recreated them
//! in RESTORE_EXT_FILE, which is when gpucr may start writing them.

pub mod client;
mod copy_engine;
pub mod guard;
pub mod nv_driver;
mod root;

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use copy_engine::{CopyEngine, EngineBuffer};
pub use root::{
    parse_bandwidth, read_context, sim_gpu_id, Context, ContextBuffer, SimRoot, CONTEXT_FILE,
    DEFAULT_DEVICE, ENV_COPY_BW, ENV_DEVICE, ENV_ROOT,
};

use gpucr_abi::proto::{DeviceSpec, FileSpec};
use gpucr_abi::sim::{Collected, COLLECTED_FORMAT, DRIVER_NVIDIA};
use nv_driver::DriverOp;
use serde::{Deserialize, Serialize};

use super::{
    buffer_specs, ns_pid, Backend, BufferInfo, Checkpointed, GpuError, GpuRef, TaskDevice,
};
use crate::cancel::Cancel;
use crate::transfer::{BufferSink, BufferSource, FileRange};

/// The encoding of the simulator's task state ([`SimState`] as JSON).
pub const STATE_FORMAT: &str = "sim/1";

/// The simulator's private state of a task (`TaskDevice::state`): what the restored
/// task recreates before its buffers, beside the buffer table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimState {
    /// The device node the task had open, and its open flags.
    pub device_path: String,
    pub device_flags: i32,
    /// Directories of device state, recreated before the files and buffers.
    pub directories: Vec<String>,
    /// Small state files, recreated with their contents.
    pub files: Vec<SimStateFile>,
    /// The driver model ("" for kfd, or "nvidia": the driver holds the memory in the
    /// process and must restore it through the process's restore thread).
    #[serde(default)]
    pub driver: String,
}

/// A small device-state file of the simulator (its context description).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStateFile {
    pub path: String,
    pub contents: String,
    /// Permission bits.
    pub mode: u32,
}

impl SimState {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the sim state serialises")
    }

    fn decode(task: &TaskDevice) -> Result<SimState, GpuError> {
        crate::gpu::decode_state(task, STATE_FORMAT, "simulator")
    }
}

/// The simulator backend.
#[derive(Debug)]
pub struct SimBackend {
    root: SimRoot,
    device: PathBuf,
    device_rdev: u64,
    bandwidth: Option<f64>,
    engines: Mutex<HashMap<u32, Arc<CopyEngine>>>,
    /// How long a request to an `nvidia`-model driver may take.
    driver_timeout: std::time::Duration,
    /// The `nvidia`-model tasks of this dump, by host pid: their context directory and
    /// the last operation their driver did, for the step after the dump.
    nv_tasks: Mutex<HashMap<i32, (PathBuf, DriverOp)>>,
    /// The give-back guard of a dump of `nvidia`-model tasks ([`guard`]).
    guard: Option<guard::Guard>,
}

impl SimBackend {
    /// The simulator configured by the environment (`GPUCR_SIM_ROOT`, `GPUCR_SIM_DEVICE`,
    /// `GPUCR_SIM_COPY_BW`), or None when no sim root is set.
    pub fn from_env() -> Result<Option<SimBackend>, GpuError> {
        let Some(root) = SimRoot::from_env() else {
            return Ok(None);
        };
        let device = std::env::var_os(ENV_DEVICE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE));
        let bandwidth = match std::env::var(ENV_COPY_BW) {
            Ok(text) if !text.trim().is_empty() => {
                Some(parse_bandwidth(&text).map_err(|detail| GpuError::Config {
                    variable: ENV_COPY_BW,
                    value: text.clone(),
                    detail,
                })?)
            }
            _ => None,
        };
        Self::new(root, &device, bandwidth).map(Some)
    }

    pub fn new(
        root: SimRoot,
        device: &Path,
        bandwidth: Option<f64>,
    ) -> Result<SimBackend, GpuError> {
        let meta = fs::metadata(device).map_err(GpuError::io(device))?;
        if !meta.file_type().is_char_device() {
            return Err(GpuError::Config {
                variable: ENV_DEVICE,
                value: device.display().to_string(),
                detail: "not a character device".into(),
            });
        }
        Ok(SimBackend {
            root,
            device: device.to_path_buf(),
            device_rdev: meta.rdev(),
            bandwidth,
            engines: Mutex::new(HashMap::new()),
            driver_timeout: nv_driver::timeout_from_env()?,
            nv_tasks: Mutex::new(HashMap::new()),
            guard: None,
        })
    }

    pub fn root(&self) -> &SimRoot {
        &self.root
    }

    fn engine(&self, gpu_id: u32) -> Option<Arc<CopyEngine>> {
        let bw = self.bandwidth?;
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            engines
                .entry(gpu_id)
                .or_insert_with(|| Arc::new(CopyEngine::new(bw)))
                .clone(),
        )
    }

    /// Give the `nvidia`-model tasks this dump locks a guard ([`guard`]) that resumes
    /// them should gpucr die during the dump.
    pub fn set_guard(&mut self, guard: guard::Guard) {
        self.guard = Some(guard);
    }

    /// The context directory of `pid` when it is an `nvidia`-model task (it maps the
    /// buffers of one context, whose driver is that model).
    fn nvidia_context(&self, pid: i32) -> Result<Option<PathBuf>, GpuError> {
        let contexts = self.mapped_contexts(pid)?;
        let (Some(dir), 1) = (contexts.first().cloned(), contexts.len()) else {
            return Ok(None);
        };
        Ok(read_context(&dir)?.is_nvidia().then_some(dir))
    }

    /// True when `pid` is an `nvidia`-model task, whose dump locks it before the freeze.
    pub fn is_nvidia_task(&self, pid: i32) -> bool {
        matches!(self.nvidia_context(pid), Ok(Some(_)))
    }

    /// The sim context directories `pid` maps buffers from.
    fn mapped_contexts(&self, pid: i32) -> Result<BTreeSet<PathBuf>, GpuError> {
        let files = gpucr_abi::procfs::mapped_files(pid)
            .map_err(GpuError::io(&gpucr_abi::procfs::maps_path(pid)))?;
        Ok(files
            .iter()
            .filter_map(|file| self.root.context_of(file))
            .collect())
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn holds_device(&self, pid: i32) -> bool {
        self.mapped_contexts(pid).is_ok_and(|c| !c.is_empty())
    }

    /// The GPUs of the buffers in the contexts the tasks map.
    fn gpus_in_use(&self, pids: &[i32], _local: &gpucr_topology::Topology) -> Option<Vec<GpuRef>> {
        let mut gpus = BTreeSet::new();
        for &pid in pids {
            for context in self.mapped_contexts(pid).ok()? {
                gpus.extend(
                    read_context(&context)
                        .ok()?
                        .buffers
                        .iter()
                        .map(|b| b.gpu_id),
                );
            }
        }
        (!gpus.is_empty()).then(|| gpus.into_iter().map(GpuRef::Kfd).collect())
    }

    /// Only the `nvidia` driver model moves device memory through the process's own
    /// (and back at the give-back); a context that cannot be read counts as one.
    fn gives_back_into_memory(&self, pids: &[i32]) -> bool {
        pids.iter().any(|&pid| {
            self.mapped_contexts(pid).map_or(true, |contexts| {
                contexts
                    .iter()
                    .any(|c| read_context(c).map_or(true, |c| c.is_nvidia()))
            })
        })
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
        let malformed = |detail: String| GpuError::Task { pid, detail };
        if format != COLLECTED_FORMAT {
            return Err(malformed(format!(
                "the plugin half sent state of format {format:?}, not {COLLECTED_FORMAT:?}"
            )));
        }
        let collected: Collected = serde_json::from_slice(state)
            .map_err(|e| malformed(format!("undecodable state from the plugin half: {e}")))?;
        let context: Context = serde_json::from_str(&collected.context)
            .map_err(|e| malformed(format!("undecodable context from the plugin half: {e}")))?;
        if collected.buffers.len() != buffers.len() {
            return Err(malformed(format!(
                "{} buffers described, {} fds received",
                collected.buffers.len(),
                buffers.len()
            )));
        }
        let context_dir = Path::new(&collected.context_dir);
        if self
            .root
            .context_of(&context_dir.join(CONTEXT_FILE))
            .as_deref()
            != Some(context_dir)
        {
            return Err(malformed(format!(
                "context {} is not a context of the sim root {}",
                collected.context_dir,
                self.root.root.display()
            )));
        }
        if context.is_nvidia() {
            // The driver moves the memory into the process (CRIU dumps it with the
            // rest); the plugin half lets the restore thread run for this call.
            if !buffers.is_empty() {
                return Err(malformed(format!(
                    "{} buffer fds for an nvidia-model context, which has none to copy",
                    buffers.len()
                )));
            }
            // A checkpoint given up may still be done late: the task stays recorded as
            // locked, and the resume after the dump ([`Backend::after_dump`]) brings
            // its memory back and unlocks it, whichever the driver did.
            nv_driver::call_or_cancel(
                context_dir,
                pid,
                DriverOp::Checkpoint,
                self.driver_timeout,
                cancel,
            )?;
            self.nv_tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(pid, (context_dir.to_path_buf(), DriverOp::Checkpoint));
        }
        let mut infos = Vec::with_capacity(buffers.len());
        let mut sources: Vec<Box<dyn BufferSource>> = Vec::with_capacity(buffers.len());
        for (b, fd) in collected.buffers.iter().zip(buffers) {
            let file = File::from(fd);
            let actual = file.metadata().map_err(GpuError::io(&b.path))?.len();
            if actual != b.size {
                return Err(GpuError::Malformed {
                    path: PathBuf::from(&b.path),
                    detail: format!(
                        "buffer fd is {actual} bytes, the plugin half says {}",
                        b.size
                    ),
                });
            }
            sources.push(Box::new(EngineBuffer::new(
                FileRange::new(file, 0, b.size),
                self.engine(b.gpu_id),
            )));
            infos.push(BufferInfo {
                path: b.path.clone(),
                size: b.size,
                gpu_id: b.gpu_id,
                kind: b.kind.clone(),
                mode: b.mode,
            });
        }
        let sim_state = SimState {
            device_path: collected.device_path,
            device_flags: collected.device_flags,
            directories: vec![collected.context_dir.clone()],
            files: vec![SimStateFile {
                path: context_dir.join(CONTEXT_FILE).display().to_string(),
                contents: collected.context,
                mode: collected.context_mode,
            }],
            driver: context.driver.clone(),
        };
        let gpus: BTreeSet<u32> = context.buffers.iter().map(|b| b.gpu_id).collect();
        let device = TaskDevice {
            ns_pid: ns_pid(pid)?,
            host_pid: pid,
            gpus: gpus.into_iter().map(GpuRef::Kfd).collect(),
            device_files: Vec::new(),
            state_format: STATE_FORMAT.into(),
            state: sim_state.encode(),
            buffers: infos,
            operations: Vec::new(),
        };
        Ok(Some(Checkpointed { device, sources }))
    }

    fn pre_freeze(&self, pid: i32, cancel: &Cancel) -> Result<(), GpuError> {
        cancel.check()?;
        let Some(dir) = self.nvidia_context(pid)? else {
            return Ok(());
        };
        // As CUDA's: the lock waits for the process's restore thread.
        GpuError::refuse_stopped(pid)?;
        cancel.check()?;
        if let Some(guard) = &self.guard {
            guard.record(pid, &dir);
        }
        let locked =
            nv_driver::call_or_cancel(&dir, pid, DriverOp::Lock, self.driver_timeout, cancel)
                .and_then(|()| Ok(cancel.check()?));
        if let Err(GpuError::Cancelled(_)) = &locked {
            // Given up (while waiting, or just as it answered): the lock is not
            // recorded, so nothing would undo it. A resume asked now supersedes it (the
            // driver acts on the newest request) or undoes it; not waited for, as the
            // request was given up.
            let _ = nv_driver::post(&dir, DriverOp::Resume);
        }
        locked?;
        self.nv_tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, (dir, DriverOp::Lock));
        Ok(())
    }

    fn after_dump(&self, pid: i32, cancel: &Cancel) -> Result<(), GpuError> {
        cancel.check()?;
        let task = self
            .nv_tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        let Some((dir, _)) = task else {
            return Ok(());
        };
        // A wait given up leaves the resume asked: the driver does it when it can.
        nv_driver::call_or_cancel(&dir, pid, DriverOp::Resume, self.driver_timeout, cancel)
    }

    fn resume_task(&self, pid: i32, task: &TaskDevice, cancel: &Cancel) -> Result<(), GpuError> {
        cancel.check()?;
        let state = SimState::decode(task)?;
        if state.driver != DRIVER_NVIDIA {
            return Ok(());
        }
        let Some(dir) = state.directories.first() else {
            return Err(GpuError::Task {
                pid,
                detail: "an nvidia-model task without a context directory".into(),
            });
        };
        nv_driver::call_or_cancel(
            Path::new(dir),
            pid,
            DriverOp::Resume,
            self.driver_timeout,
            cancel,
        )
    }

    fn file_owner(&self, fd: BorrowedFd<'_>, tasks: &[i32]) -> Result<Option<i32>, GpuError> {
        let meta = nix::sys::stat::fstat(fd).map_err(|e| GpuError::io(&self.device)(e.into()))?;
        let is_chr = meta.st_mode & libc::S_IFMT == libc::S_IFCHR;
        if !is_chr || meta.st_rdev != self.device_rdev {
            return Ok(None);
        }
        Ok(super::owner_of(fd, tasks))
    }

    fn sysfs_root(&self) -> Option<PathBuf> {
        Some(self.root.root.clone())
    }

    fn state_root(&self) -> Option<PathBuf> {
        Some(self.root.root.clone())
    }

    fn restore_spec(&self, task: &TaskDevice) -> Result<DeviceSpec, GpuError> {
        let state = SimState::decode(task)?;
        Ok(DeviceSpec {
            root: self.root.root.display().to_string(),
            device_path: state.device_path,
            device_flags: state.device_flags,
            directories: state.directories,
            files: state
                .files
                .into_iter()
                .map(|f| FileSpec {
                    path: f.path,
                    contents: f.contents.into_bytes(),
                    mode: f.mode,
                })
                .collect(),
            buffers: buffer_specs(task),
            ..DeviceSpec::default()
        })
    }

    fn remap_gpus(&self, task: &mut TaskDevice, map: &[(GpuRef, GpuRef)]) -> Result<(), GpuError> {
        let new_id = |old: u32| {
            map.iter()
                .find_map(|pair| match pair {
                    (GpuRef::Kfd(from), GpuRef::Kfd(to)) if *from == old => Some(*to),
                    _ => None,
                })
                .unwrap_or(old)
        };
        for buffer in &mut task.buffers {
            buffer.gpu_id = new_id(buffer.gpu_id);
        }
        for gpu in &mut task.gpus {
            if let GpuRef::Kfd(id) = gpu {
                *id = new_id(*id);
            }
        }
        // The context file names the GPUs too: rewrite it as the restored task will see it.
        let mut state = SimState::decode(task)?;
        for file in &mut state.files {
            if !file.path.ends_with(CONTEXT_FILE) {
                continue;
            }
            let mut ctx: Context =
                serde_json::from_str(&file.contents).map_err(|e| GpuError::Malformed {
                    path: PathBuf::from(&file.path),
                    detail: e.to_string(),
                })?;
            for b in &mut ctx.buffers {
                b.gpu_id = new_id(b.gpu_id);
            }
            file.contents = serde_json::to_string_pretty(&ctx).expect("a context serialises");
        }
        task.state = state.encode();
        Ok(())
    }

    fn buffer_sink(
        &self,
        task: &TaskDevice,
        index: usize,
        file: File,
    ) -> Result<Box<dyn BufferSink>, GpuError> {
        let info = task.buffers.get(index).ok_or_else(|| GpuError::Task {
            pid: task.host_pid,
            detail: format!("no buffer {index} in the task's buffer table"),
        })?;
        let actual = file.metadata().map_err(GpuError::io(&info.path))?.len();
        if actual != info.size {
            return Err(GpuError::Malformed {
                path: PathBuf::from(&info.path),
                detail: format!(
                    "the restored buffer is {actual} bytes, the image holds {}",
                    info.size
                ),
            });
        }
        let range = FileRange::new(file, 0, info.size)
            .starting_zeroed()
            .on_queue(info.gpu_id);
        Ok(Box::new(EngineBuffer::new(range, self.engine(info.gpu_id))))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn file_owner_finds_the_process_holding_the_device() {
        // /dev/null stands in for the device: a character device we can open anywhere.
        let backend =
            SimBackend::new(SimRoot::new("/nonexistent"), Path::new("/dev/null"), None).unwrap();
        let me = std::process::id() as i32;
        let null = File::open("/dev/null").unwrap();
        assert_eq!(backend.file_owner(null.as_fd(), &[me]).unwrap(), Some(me));
        let other = File::open("/proc/self/status").unwrap();
        assert_eq!(backend.file_owner(other.as_fd(), &[me]).unwrap(), None);
    }

    #[test]
    fn a_regular_file_is_not_a_device() {
        let err =
            SimBackend::new(SimRoot::new("/x"), Path::new("/proc/self/status"), None).unwrap_err();
        assert!(err.to_string().contains("not a character device"), "{err}");
    }

    /// What the plugin half would send for a context `ctx` holding one 4 KiB buffer.
    fn collected(root: &Path, gpu_id: u32) -> (Vec<u8>, Vec<OwnedFd>) {
        let dir = root.join("contexts/ctx");
        fs::create_dir_all(&dir).unwrap();
        let context = Context {
            device_path: "/dev/null".into(),
            device_fd: 3,
            buffers: vec![ContextBuffer {
                name: "b0".into(),
                gpu_id,
                size: 4096,
                kind: "vram".into(),
            }],
            driver: String::new(),
        };
        fs::write(dir.join("b0"), vec![7u8; 4096]).unwrap();
        let c = Collected {
            context_dir: dir.display().to_string(),
            context: serde_json::to_string(&context).unwrap(),
            context_mode: 0o644,
            device_path: "/dev/null".into(),
            device_flags: libc::O_RDWR,
            buffers: vec![gpucr_abi::sim::CollectedBuffer {
                path: dir.join("b0").display().to_string(),
                size: 4096,
                gpu_id,
                kind: "vram".into(),
                mode: 0o600,
            }],
        };
        let fd = File::open(dir.join("b0")).unwrap().into();
        (serde_json::to_vec(&c).unwrap(), vec![fd])
    }

    #[test]
    fn adopting_what_the_plugin_half_collected() {
        let tmp = tempfile::tempdir().unwrap();
        let backend =
            SimBackend::new(SimRoot::new(tmp.path()), Path::new("/dev/null"), None).unwrap();
        let me = std::process::id() as i32;
        assert!(backend
            .adopt_task(me, "", &[], vec![], &Cancel::new())
            .unwrap()
            .is_none());
        let (state, fds) = collected(tmp.path(), 0x1000);
        let err = backend
            .adopt_task(me, "other/1", &state, vec![], &Cancel::new())
            .err()
            .unwrap();
        assert!(err.to_string().contains("format"), "{err}");
        let err = backend
            .adopt_task(me, COLLECTED_FORMAT, &state, vec![], &Cancel::new())
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("1 buffers described, 0 fds"),
            "{err}"
        );
        let found = backend
            .adopt_task(me, COLLECTED_FORMAT, &state, fds, &Cancel::new())
            .unwrap()
            .unwrap();
        let mut task = found.device;
        assert_eq!(found.sources.len(), 1);
        assert_eq!(task.gpus, [GpuRef::Kfd(0x1000)]);
        assert_eq!(task.state_format, STATE_FORMAT);
        let spec = backend.restore_spec(&task).unwrap();
        assert_eq!(spec.root, tmp.path().display().to_string());
        assert_eq!(spec.device_flags, libc::O_RDWR);
        assert!(crate::gpu::check_confined(&spec).is_ok());
        // A remap moves the buffers and rewrites the context the task will read.
        backend
            .remap_gpus(&mut task, &[(GpuRef::Kfd(0x1000), GpuRef::Kfd(0x2000))])
            .unwrap();
        assert_eq!(task.gpus, [GpuRef::Kfd(0x2000)]);
        assert_eq!(task.buffers[0].gpu_id, 0x2000);
        let spec = backend.restore_spec(&task).unwrap();
        let ctx: Context = serde_json::from_slice(&spec.files[0].contents).unwrap();
        assert_eq!(ctx.buffers[0].gpu_id, 0x2000);
    }

    #[test]
    fn a_context_outside_the_root_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let backend =
            SimBackend::new(SimRoot::new(tmp.path()), Path::new("/dev/null"), None).unwrap();
        let (state, fds) = collected(elsewhere.path(), 0x1000);
        let me = std::process::id() as i32;
        let err = backend
            .adopt_task(me, COLLECTED_FORMAT, &state, fds, &Cancel::new())
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("not a context of the sim root"),
            "{err}"
        );
    }

    /// An `nvidia`-model lock whose request was given up: asked nothing once the token
    /// is cancelled; cancelled while the driver has not answered, the wait ends at once
    /// (not after the driver timeout), a resume supersedes the lock, and nothing is
    /// recorded for the step after the dump.
    #[test]
    fn a_cancelled_nvidia_model_lock_asks_nothing_or_is_superseded() {
        use gpucr_abi::sim::DRIVER_REQUEST_FILE;
        let tmp = tempfile::tempdir().unwrap();
        let root = SimRoot::new(tmp.path());
        let null = Path::new("/dev/null");
        let mut device =
            client::SimDevice::open_with_driver(&root, null, "ctx", DRIVER_NVIDIA).unwrap();
        let _buffer = device.alloc("b0", 0x1000, 4096, "vram").unwrap();
        let request = device.dir().join(DRIVER_REQUEST_FILE);
        let backend = SimBackend::new(root, null, None).unwrap();
        let me = std::process::id() as i32;
        assert!(backend.is_nvidia_task(me));
        assert!(backend.gives_back_into_memory(&[me]));

        let cancelled = Cancel::new();
        cancelled.cancel("timed out");
        let err = backend.pre_freeze(me, &cancelled).unwrap_err();
        assert!(matches!(err, GpuError::Cancelled(_)), "{err}");
        assert!(!request.exists(), "a cancelled lock asked the driver");

        // No restore thread answers here: only the cancellation ends the wait.
        let cancel = Cancel::new();
        let c = cancel.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            c.cancel("the plugin went away");
        });
        let started = std::time::Instant::now();
        let err = backend.pre_freeze(me, &cancel).unwrap_err();
        canceller.join().unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the lock waited {:?}",
            started.elapsed()
        );
        assert_eq!(err.to_string(), "cancelled: the plugin went away");
        let asked = fs::read_to_string(&request).unwrap();
        assert!(asked.contains(" resume"), "{asked:?}");
        // Not recorded: the give-back after the dump has nothing to ask for.
        let started = std::time::Instant::now();
        backend.after_dump(me, &Cancel::new()).unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// Only the `nvidia` model writes into a task's memory as it gives the device
    /// back: a tree of KFD-model tasks keeps its pages as CRIU dumped them.
    #[test]
    fn only_an_nvidia_model_context_gives_back_into_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SimRoot::new(tmp.path());
        let null = Path::new("/dev/null");
        let me = std::process::id() as i32;
        let mut kfd = client::SimDevice::open(&root, null, "kfd").unwrap();
        let _kfd_buffer = kfd.alloc("b0", 0x1000, 4096, "vram").unwrap();
        let backend = SimBackend::new(root.clone(), null, None).unwrap();
        assert!(!backend.gives_back_into_memory(&[me]));
        let mut nv = client::SimDevice::open_with_driver(&root, null, "nv", DRIVER_NVIDIA).unwrap();
        let _nv_buffer = nv.alloc("b0", 0x1000, 4096, "vram").unwrap();
        assert!(backend.gives_back_into_memory(&[me]));
    }
}
