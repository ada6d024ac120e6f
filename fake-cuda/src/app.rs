//! The application side: a process that called `cuInit`.
//!
//! `cuInit` creates the process's context directory under `GPUCR_FAKE_CUDA_DIR`
//! (`ctx-<pid>-<nanoseconds>`), maps its control file there `MAP_SHARED` (so another
//! process finds the context through `/proc/PID/maps` and reads the state from it) and
//! starts the restore thread (`cuda-restore`), which answers the mailbox every
//! millisecond. Device memory is one file per GPU (`mem-<uuid>`); device pointers are
//! opaque handles ([`crate::devptr`]) and copies `pread`/`pwrite` the files; the
//! allocation table lives in this process's heap.
//!
//! The state machine is the driver's: RUNNING → lock → LOCKED → checkpoint →
//! CHECKPOINTED → restore → LOCKED → unlock → RUNNING; any other call returns
//! `CUDA_ERROR_ILLEGAL_STATE`. While the process is not RUNNING its own CUDA calls block.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::sys::CUresult;
use gpucr_cuda_driver::{ProcessState, Uuid};

use crate::config::Config;
use crate::devptr::DevPtr;
use crate::mailbox::{self, Answer, GpuMemory, Op, Request};
use crate::mapping::Mapping;

/// The control file's name in a context directory.
pub const CONTROL_FILE: &str = "gpucr-fake-cuda.control";
/// The restore thread's name.
pub const RESTORE_THREAD: &str = "cuda-restore";
/// The control file's length.
pub const CONTROL_LEN: usize = 4096;
/// The control file's magic bytes, at offset 0.
pub const CONTROL_MAGIC: &[u8; 8] = b"GPUCRFK1";
/// Offset of the process state (native-endian `u32`) in the control file.
pub const STATE_OFFSET: usize = 8;
/// How often the restore thread looks at the mailbox.
const POLL: Duration = Duration::from_millis(1);
/// Allocations are aligned to this.
const ALIGN: u64 = 256;

/// The file holding GPU `uuid`'s memory in `dir`.
pub fn memory_file(dir: &Path, uuid: Uuid) -> PathBuf {
    dir.join(format!("mem-{uuid}"))
}

#[derive(Debug, Clone, Copy)]
struct Alloc {
    ordinal: u8,
    offset: u64,
    size: u64,
}

/// How the device memory left the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Host,
    Custom,
}

#[derive(Debug)]
enum Pending {
    None,
    CheckpointBegun,
    RestoreBegun { old_gpus: Vec<Uuid> },
}

#[derive(Debug)]
struct Inner {
    state: ProcessState,
    in_flight: usize,
    /// Each ordinal's UUID (changed by a restore onto other GPUs).
    gpus: Vec<Uuid>,
    /// Each ordinal's memory length (allocations are never moved).
    sizes: Vec<u64>,
    allocs: BTreeMap<u64, Alloc>,
    /// Host staging: each ordinal's memory, in this process's anonymous memory.
    staged: Vec<(u8, Mapping)>,
    mode: Option<Mode>,
    pending: Pending,
}

/// This process's fake driver.
#[derive(Debug)]
pub struct App {
    dir: PathBuf,
    pid: u32,
    control: Mapping,
    sync: Duration,
    step: Duration,
    /// [`crate::config::ENV_STAGED_RESIDENT`].
    staged_resident: bool,
    inner: Mutex<Inner>,
    cond: Condvar,
}

static APP: OnceLock<Result<App, CUresult>> = OnceLock::new();

/// The process's driver once `cuInit` has run (`CUDA_ERROR_NOT_INITIALIZED` before, and
/// in a child forked after it).
pub fn get() -> Result<&'static App, CUresult> {
    match APP.get() {
        Some(Ok(app)) if app.pid == std::process::id() => Ok(app),
        _ => Err(result::NOT_INITIALIZED),
    }
}

/// `cuInit`: creates the context once per process.
pub fn init(config: &'static Config) -> Result<&'static App, CUresult> {
    let app = APP.get_or_init(|| {
        App::create(config).map_err(|e| {
            eprintln!("gpucr-fake-cuda: cuInit: {e}");
            result::OPERATING_SYSTEM
        })
    });
    match app {
        Ok(app) if app.pid == std::process::id() => Ok(app),
        Ok(_) => Err(result::NOT_INITIALIZED),
        Err(code) => Err(*code),
    }
}

/// While alive, one of the process's own CUDA calls is in flight.
pub struct InFlight<'a> {
    app: &'a App,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut inner = self.app.lock();
        inner.in_flight -= 1;
        self.app.cond.notify_all();
    }
}

impl App {
    fn create(config: &Config) -> io::Result<Self> {
        let root = config
            .dir
            .as_ref()
            .ok_or_else(|| io::Error::other(format!("{} is not set", crate::config::ENV_DIR)))?;
        let pid = std::process::id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = root.join(format!("ctx-{pid}-{nanos}"));
        fs::create_dir_all(&dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join(CONTROL_FILE))?;
        file.set_len(CONTROL_LEN as u64)?;
        let mut control = Mapping::shared(&file, CONTROL_LEN)?;
        control.as_mut_slice()[..8].copy_from_slice(CONTROL_MAGIC);
        control.as_mut_slice()[12..16].copy_from_slice(&pid.to_ne_bytes());
        let gpus = config.gpus.clone();
        let app = Self {
            dir,
            pid,
            control,
            sync: config.sync,
            step: config.step,
            staged_resident: config.staged_resident,
            inner: Mutex::new(Inner {
                state: ProcessState::Running,
                in_flight: 0,
                sizes: vec![0; gpus.len()],
                gpus,
                allocs: BTreeMap::new(),
                staged: Vec::new(),
                mode: None,
                pending: Pending::None,
            }),
            cond: Condvar::new(),
        };
        app.publish(ProcessState::Running);
        // The thread names itself once it runs; `cuInit` returns only after that, so
        // that a controller asking for the restore thread right away finds it (as with
        // the real driver, whose thread exists when `cuInit` returns).
        let (named, running) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(RESTORE_THREAD.into())
            .spawn(move || {
                let _ = named.send(());
                restore_thread()
            })?;
        let _ = running.recv();
        Ok(app)
    }

    /// The context directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state_word(&self) -> &AtomicU32 {
        // SAFETY: the control mapping is CONTROL_LEN bytes, page-aligned, and lives as
        // long as `self`; offset 8 is 4-byte aligned and only ever accessed atomically.
        unsafe { &*self.control.as_ptr().add(STATE_OFFSET).cast::<AtomicU32>() }
    }

    fn publish(&self, state: ProcessState) {
        self.state_word()
            .store(state.to_raw() as u32, Ordering::SeqCst);
    }

    fn set_state(&self, inner: &mut Inner, state: ProcessState) {
        inner.state = state;
        self.publish(state);
        self.cond.notify_all();
    }

    /// Waits until the process is RUNNING, then counts a call in flight.
    pub fn enter(&self) -> InFlight<'_> {
        let mut inner = self.lock();
        while inner.state != ProcessState::Running {
            inner = self.cond.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
        inner.in_flight += 1;
        InFlight { app: self }
    }

    /// The number of GPUs.
    pub fn device_count(&self) -> usize {
        self.lock().gpus.len()
    }

    /// GPU `ordinal`'s UUID.
    pub fn uuid(&self, ordinal: usize) -> Option<Uuid> {
        self.lock().gpus.get(ordinal).copied()
    }

    /// `cuCtxSynchronize`: outstanding work takes `GPUCR_FAKE_CUDA_SYNC_MS`.
    pub fn synchronize(&self) {
        let _call = self.enter();
        std::thread::sleep(self.sync);
    }

    /// `cuMemAlloc` on GPU `ordinal`.
    pub fn alloc(&self, ordinal: usize, bytes: usize) -> Result<u64, CUresult> {
        let _call = self.enter();
        let mut inner = self.lock();
        let uuid = *inner.gpus.get(ordinal).ok_or(result::INVALID_CONTEXT)?;
        if bytes == 0 {
            return Err(result::INVALID_VALUE);
        }
        let offset = inner.sizes[ordinal];
        let size = (bytes as u64).div_ceil(ALIGN) * ALIGN;
        let end = offset + size;
        if end > DevPtr::MAX_OFFSET {
            return Err(result::OUT_OF_MEMORY);
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(memory_file(&self.dir, uuid))
            .map_err(|_| result::OPERATING_SYSTEM)?;
        file.set_len(end).map_err(|_| result::OUT_OF_MEMORY)?;
        inner.sizes[ordinal] = end;
        let ordinal = ordinal as u8;
        let ptr = DevPtr::App { ordinal, offset }.encode();
        inner.allocs.insert(
            ptr,
            Alloc {
                ordinal,
                offset,
                size: bytes as u64,
            },
        );
        Ok(ptr)
    }

    /// `cuMemFree`.
    pub fn free(&self, ptr: u64) -> Result<(), CUresult> {
        let _call = self.enter();
        self.lock()
            .allocs
            .remove(&ptr)
            .map(|_| ())
            .ok_or(result::INVALID_VALUE)
    }

    /// The file and offset of `len` bytes at `ptr`, inside one allocation.
    fn locate(&self, ptr: u64, len: usize) -> Result<(File, u64), CUresult> {
        let inner = self.lock();
        let (start, a) = inner
            .allocs
            .range(..=ptr)
            .next_back()
            .ok_or(result::INVALID_VALUE)?;
        let within = ptr - start;
        if within + len as u64 > a.size {
            return Err(result::INVALID_VALUE);
        }
        let path = memory_file(&self.dir, inner.gpus[a.ordinal as usize]);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|_| result::ILLEGAL_ADDRESS)?;
        Ok((file, a.offset + within))
    }

    /// `cuMemcpyHtoD` into an allocation.
    pub fn write(&self, ptr: u64, src: &[u8]) -> Result<(), CUresult> {
        let _call = self.enter();
        let (file, offset) = self.locate(ptr, src.len())?;
        file.write_all_at(src, offset)
            .map_err(|_| result::ILLEGAL_ADDRESS)
    }

    /// `cuMemcpyDtoH` from an allocation.
    pub fn read(&self, ptr: u64, dst: &mut [u8]) -> Result<(), CUresult> {
        let _call = self.enter();
        let (file, offset) = self.locate(ptr, dst.len())?;
        file.read_exact_at(dst, offset)
            .map_err(|_| result::ILLEGAL_ADDRESS)
    }

    /// Acts on one request of the mailbox.
    fn serve(&self, request: &Request) -> Answer {
        if !matches!(request.op, Op::Cancel) {
            // The driver's own work for the step (GPUCR_FAKE_CUDA_STEP_MS).
            std::thread::sleep(self.step);
        }
        let mut gpus = Vec::new();
        let code = match self.apply(&request.op, &mut gpus) {
            Ok(()) => result::SUCCESS,
            Err(code) => code,
        };
        Answer {
            seq: request.seq,
            code,
            state: self.lock().state.to_raw(),
            gpus,
        }
    }

    fn apply(&self, op: &Op, out: &mut Vec<GpuMemory>) -> Result<(), CUresult> {
        use ProcessState::*;
        let mut inner = self.lock();
        let pending = !matches!(inner.pending, Pending::None);
        match op {
            Op::Lock { timeout_ms } => {
                if inner.state != Running {
                    return Err(result::ILLEGAL_STATE);
                }
                self.set_state(&mut inner, Locked);
                let deadline = (*timeout_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(u64::from(*timeout_ms)));
                while inner.in_flight > 0 {
                    let wait = match deadline {
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => w,
                            _ => {
                                // The lock timed out: the process stays RUNNING.
                                self.set_state(&mut inner, Running);
                                return Err(result::TIMEOUT);
                            }
                        },
                        None => Duration::from_millis(100),
                    };
                    inner = self
                        .cond
                        .wait_timeout(inner, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                Ok(())
            }
            Op::Checkpoint => {
                if inner.state != Locked || pending {
                    return Err(result::ILLEGAL_STATE);
                }
                let mut staged = Vec::new();
                for ordinal in 0..inner.gpus.len() {
                    let path = memory_file(&self.dir, inner.gpus[ordinal]);
                    let Ok(file) = File::open(&path) else {
                        continue;
                    };
                    let len = inner.sizes[ordinal] as usize;
                    let mut memory = Mapping::anonymous(len).map_err(|_| result::OUT_OF_MEMORY)?;
                    file.read_exact_at(memory.as_mut_slice(), 0)
                        .map_err(|_| result::OPERATING_SYSTEM)?;
                    staged.push((ordinal as u8, memory, path));
                }
                for (_, _, path) in &staged {
                    fs::remove_file(path).map_err(|_| result::OPERATING_SYSTEM)?;
                }
                inner.staged = staged.into_iter().map(|(o, m, _)| (o, m)).collect();
                inner.mode = Some(Mode::Host);
                self.set_state(&mut inner, Checkpointed);
                Ok(())
            }
            Op::Restore { pairs } => {
                if inner.state != Checkpointed || inner.mode != Some(Mode::Host) || pending {
                    return Err(result::ILLEGAL_STATE);
                }
                if self.staged_resident
                    && !inner
                        .staged
                        .iter()
                        .all(|(_, memory)| memory.resident().unwrap_or(false))
                {
                    return Err(result::ILLEGAL_STATE);
                }
                let used: Vec<u8> = inner.staged.iter().map(|(o, _)| *o).collect();
                let gpus = remapped(&inner.gpus, &used, pairs)?;
                for (ordinal, memory) in &inner.staged {
                    let path = memory_file(&self.dir, gpus[*ordinal as usize]);
                    fs::write(&path, memory.as_slice()).map_err(|_| result::OUT_OF_MEMORY)?;
                }
                inner.gpus = gpus;
                inner.staged.clear();
                inner.mode = None;
                self.set_state(&mut inner, Locked);
                Ok(())
            }
            Op::Unlock => {
                if inner.state != Locked || pending {
                    return Err(result::ILLEGAL_STATE);
                }
                self.set_state(&mut inner, Running);
                Ok(())
            }
            Op::CheckpointBegin => {
                if inner.state != Locked || pending {
                    return Err(result::ILLEGAL_STATE);
                }
                *out = self.memory_list(&inner);
                inner.pending = Pending::CheckpointBegun;
                Ok(())
            }
            Op::CheckpointComplete => {
                if !matches!(inner.pending, Pending::CheckpointBegun) {
                    return Err(result::ILLEGAL_STATE);
                }
                // The memory is dropped without staging: the caller has it.
                for g in self.memory_list(&inner) {
                    fs::remove_file(memory_file(&self.dir, g.uuid))
                        .map_err(|_| result::OPERATING_SYSTEM)?;
                }
                inner.pending = Pending::None;
                inner.mode = Some(Mode::Custom);
                self.set_state(&mut inner, Checkpointed);
                Ok(())
            }
            Op::RestoreBegin { pairs } => {
                if inner.state != Checkpointed || inner.mode != Some(Mode::Custom) || pending {
                    return Err(result::ILLEGAL_STATE);
                }
                let used: Vec<u8> = (0..inner.gpus.len() as u8)
                    .filter(|o| inner.sizes[*o as usize] > 0)
                    .collect();
                let gpus = remapped(&inner.gpus, &used, pairs)?;
                for o in &used {
                    let file = File::create(memory_file(&self.dir, gpus[*o as usize]))
                        .map_err(|_| result::OPERATING_SYSTEM)?;
                    file.set_len(inner.sizes[*o as usize])
                        .map_err(|_| result::OUT_OF_MEMORY)?;
                }
                let old_gpus = std::mem::replace(&mut inner.gpus, gpus);
                *out = self.memory_list(&inner);
                inner.pending = Pending::RestoreBegun { old_gpus };
                Ok(())
            }
            Op::RestoreComplete => {
                if !matches!(inner.pending, Pending::RestoreBegun { .. }) {
                    return Err(result::ILLEGAL_STATE);
                }
                inner.pending = Pending::None;
                inner.mode = None;
                self.set_state(&mut inner, Locked);
                Ok(())
            }
            Op::Cancel => {
                match std::mem::replace(&mut inner.pending, Pending::None) {
                    Pending::RestoreBegun { old_gpus } => {
                        for g in self.memory_list(&inner) {
                            let _ = fs::remove_file(memory_file(&self.dir, g.uuid));
                        }
                        inner.gpus = old_gpus;
                    }
                    Pending::CheckpointBegun | Pending::None => {}
                }
                Ok(())
            }
        }
    }

    fn memory_list(&self, inner: &Inner) -> Vec<GpuMemory> {
        (0..inner.gpus.len())
            .filter(|o| inner.sizes[*o] > 0)
            .map(|o| GpuMemory {
                ordinal: o as u8,
                uuid: inner.gpus[o],
                size: inner.sizes[o],
            })
            .collect()
    }
}

/// The GPUs after a restore with `pairs`: every GPU in `used` must be paired (when pairs
/// are given) and each pair's old GPU must be one of this process's.
fn remapped(gpus: &[Uuid], used: &[u8], pairs: &[(Uuid, Uuid)]) -> Result<Vec<Uuid>, CUresult> {
    if pairs.is_empty() {
        return Ok(gpus.to_vec());
    }
    if pairs.iter().any(|(old, _)| !gpus.contains(old)) {
        return Err(result::INVALID_VALUE);
    }
    if used
        .iter()
        .any(|o| !pairs.iter().any(|(old, _)| *old == gpus[*o as usize]))
    {
        return Err(result::INVALID_VALUE);
    }
    let out: Vec<Uuid> = gpus
        .iter()
        .map(|g| {
            pairs
                .iter()
                .find(|(old, _)| old == g)
                .map_or(*g, |(_, new)| *new)
        })
        .collect();
    for (i, u) in out.iter().enumerate() {
        if out[..i].contains(u) {
            return Err(result::INVALID_VALUE);
        }
    }
    Ok(out)
}

/// The restore thread: answers the newest request of the mailbox nobody has answered.
/// While CRIU has the process frozen it runs only if the plugin lets it.
fn restore_thread() {
    // Spawned while `cuInit` sets the context up: wait until it is in place.
    let app = loop {
        match APP.get() {
            Some(Ok(app)) => break app,
            Some(Err(_)) => return,
            None => std::thread::sleep(POLL),
        }
    };
    let mut last = 0u64;
    loop {
        std::thread::sleep(POLL);
        let Some(request) =
            mailbox::get(&app.dir, mailbox::REQUEST_FILE).and_then(|t| Request::decode(&t))
        else {
            continue;
        };
        if request.seq <= last {
            continue;
        }
        last = request.seq;
        // A request the mailbox shows answered was acted on by an earlier incarnation
        // of this process (one CRIU restored from the same image and that was killed
        // since): it is not acted on again.
        let answered = mailbox::get(&app.dir, mailbox::ANSWER_FILE)
            .and_then(|t| Answer::decode(&t))
            .is_some_and(|a| a.seq >= request.seq);
        if answered {
            continue;
        }
        let answer = app.serve(&request);
        if let Err(e) = mailbox::put(&app.dir, mailbox::ANSWER_FILE, &answer.encode()) {
            eprintln!("gpucr-fake-cuda: restore thread: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::gpu_uuid;

    #[test]
    fn remap_rules() {
        let gpus = [gpu_uuid(0), gpu_uuid(1)];
        assert_eq!(remapped(&gpus, &[0, 1], &[]), Ok(gpus.to_vec()));
        assert_eq!(
            remapped(
                &gpus,
                &[0, 1],
                &[(gpu_uuid(0), gpu_uuid(2)), (gpu_uuid(1), gpu_uuid(3))]
            ),
            Ok(vec![gpu_uuid(2), gpu_uuid(3)])
        );
        // A checkpointed GPU left out.
        assert_eq!(
            remapped(&gpus, &[0, 1], &[(gpu_uuid(0), gpu_uuid(2))]),
            Err(result::INVALID_VALUE)
        );
        // A GPU without memory may be left out.
        assert_eq!(
            remapped(&gpus, &[0], &[(gpu_uuid(0), gpu_uuid(2))]),
            Ok(vec![gpu_uuid(2), gpu_uuid(1)])
        );
        // Not this process's GPU.
        assert_eq!(
            remapped(&gpus, &[0], &[(gpu_uuid(5), gpu_uuid(2))]),
            Err(result::INVALID_VALUE)
        );
        // Two GPUs onto one.
        assert_eq!(
            remapped(&gpus, &[0], &[(gpu_uuid(0), gpu_uuid(1))]),
            Err(result::INVALID_VALUE)
        );
    }
}
