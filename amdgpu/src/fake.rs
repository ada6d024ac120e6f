//! A recording fake of the KFD and amdgpu DRM kernel interfaces, for tests.
//!
//! It models what gpucr relies on:
//! * processes with a KFD file, render-node files and buffers, each buffer a memfd
//!   (sparse: a 5 GiB buffer costs no memory until written), the files held by a real
//!   child process ([`FakeKernel::spawn_process`]) so that `/proc` and `kcmp` see them;
//! * queues that are running, paused (PROCESS_INFO) or evicted (a RESTORE not yet
//!   RESUMEd), with the KFD rules: CHECKPOINT only while paused, UNPAUSE only when
//!   paused, RESTORE only on a fresh kfd file with a render fd of each actual GPU;
//! * dmabufs (the buffers' memfds) and render nodes of gpucr's own that import them,
//!   register userptr memory, create GTT buffers, map GPU VAs and run SDMA rings that
//!   execute the copy packets of the indirect buffers submitted to them (count field per
//!   SDMA generation), on memory, with fences;
//! * a dispatch on a process's queues ([`FakeKernel::dispatch`]) that reads and writes a
//!   buffer, and refuses (the job would hang) unless the queues were resumed;
//! * one-shot failures of any operation ([`FakeKernel::fail_next`]), fences that never
//!   signal ([`FakeKernel::stall_fences`]), and a log of every operation.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpucr_abi::amdgpu_drm::sdma::{CountEncoding, COPY_LINEAR_DWORDS, COPY_LINEAR_HEADER};
use gpucr_abi::kfd::{
    bo_has_contents, KfdCriuBoBucket, KfdCriuDeviceBucket, KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL,
    KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
    KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE,
};
use serde::{Deserialize, Serialize};

use crate::kernel::{
    DeviceKind, DeviceMapping, Drm, KernelError, Kfd, KfdCheckpoint, NodeInfo, ProcessInfo,
    RenderNode, RestoreRequest,
};

/// Where a fake process's child holds its kfd and render files (above any fd number the
/// parent's descriptors could have, so the dup2s cannot overwrite one another).
const HELD_FD_BASE: RawFd = 900;

/// A GPU of the fake machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeGpu {
    pub gpu_id: u32,
    pub render_minor: u32,
    /// `AMDGPU_FAMILY_*`.
    pub family: u32,
    pub sdma_major: u32,
    /// SDMA rings offered.
    pub rings: u32,
}

impl FakeGpu {
    /// An MI100-like GPU (family AI, SDMA 4, two rings).
    pub fn new(gpu_id: u32, render_minor: u32) -> FakeGpu {
        FakeGpu {
            gpu_id,
            render_minor,
            family: 141,
            sdma_major: 4,
            rings: 2,
        }
    }
}

/// Operations that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeOp {
    TaskKfd,
    ProcessInfo,
    Checkpoint,
    Unpause,
    Restore,
    Resume,
    OpenRender,
    Import,
    Userptr,
    CreateGtt,
    VaMap,
    Submit,
    Wait,
}

/// Where a process's queues are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queues {
    Running,
    /// PROCESS_INFO paused them.
    Paused,
    /// RESTORE recreated them; RESUME has not run.
    Evicted,
}

/// A buffer of a process the test asks for.
#[derive(Debug, Clone, Copy)]
pub struct BoSpec {
    /// The user gpu_id.
    pub gpu_id: u32,
    pub size: u64,
    pub alloc_flags: u32,
    /// The process maps it (through its render node, or /dev/kfd for doorbells).
    pub mapped: bool,
}

impl BoSpec {
    /// A writable VRAM buffer the process maps.
    pub fn vram(gpu_id: u32, size: u64) -> BoSpec {
        BoSpec {
            gpu_id,
            size,
            alloc_flags: KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE,
            mapped: true,
        }
    }
}

/// The fake's private data: what a process's queues run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Program {
    fake_kfd: u32,
    queues: u32,
    events: u32,
    /// The buffer whose first 8 bytes the dispatch increments.
    counter_bo: usize,
}

#[derive(Debug)]
struct Bo {
    addr: u64,
    size: u64,
    offset: u64,
    gpu_id: u32,
    alloc_flags: u32,
    mapped: bool,
    mem: Arc<File>,
}

#[derive(Debug)]
struct Process {
    pid: i32,
    kfd: Arc<File>,
    /// (user gpu_id, actual gpu_id).
    devices: Vec<(u32, u32)>,
    bos: Vec<Bo>,
    queues: Queues,
    program: Program,
}

#[derive(Debug, Clone, Copy)]
enum FileRole {
    /// A kfd file, and the process it belongs to once it has one.
    Kfd(Option<usize>),
    Render {
        minor: u32,
    },
    /// A buffer's memory, exported as a dmabuf.
    Dmabuf,
}

#[derive(Debug, Default)]
struct Inner {
    gpus: Vec<FakeGpu>,
    files: HashMap<u64, FileRole>,
    processes: Vec<Process>,
    faults: Vec<(FakeOp, i32)>,
    stalled: bool,
    log: Vec<String>,
    /// Bytes copied per (gpu_id, ring).
    ring_bytes: BTreeMap<(u32, u32), u64>,
    next_offset: u64,
}

/// The fake kernel; share it between the fake KFD of each process and the fake DRM.
#[derive(Debug)]
pub struct FakeKernel {
    inner: Mutex<Inner>,
}

fn memfd(name: &std::ffi::CStr, size: u64) -> File {
    // SAFETY: a NUL-terminated name and a flag.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: memfd_create returned this descriptor; nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size).expect("sizing a memfd");
    file
}

fn ino(fd: BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(fd).ok().map(|s| s.st_ino)
}

fn dup(file: &File) -> OwnedFd {
    file.as_fd().try_clone_to_owned().expect("dup")
}

impl FakeKernel {
    pub fn new(gpus: Vec<FakeGpu>) -> Arc<FakeKernel> {
        Arc::new(FakeKernel {
            inner: Mutex::new(Inner {
                gpus,
                next_offset: 1 << 40,
                ..Default::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The KFD as seen by calls from host pid `caller` (RESTORE binds the new KFD
    /// process to it).
    pub fn kfd(self: &Arc<Self>, caller: i32) -> Arc<dyn Kfd> {
        Arc::new(FakeKfd {
            kernel: self.clone(),
            caller,
        })
    }

    /// The render nodes.
    pub fn drm(self: &Arc<Self>) -> Arc<dyn Drm> {
        Arc::new(FakeDrm {
            kernel: self.clone(),
        })
    }

    /// Make the next `op` fail with `errno`.
    pub fn fail_next(&self, op: FakeOp, errno: i32) {
        self.lock().faults.push((op, errno));
    }

    /// Fences never signal (a hung SDMA engine).
    pub fn stall_fences(&self, stalled: bool) {
        self.lock().stalled = stalled;
    }

    /// Every operation so far, in order.
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// Bytes copied per (gpu_id, ring).
    pub fn ring_bytes(&self) -> BTreeMap<(u32, u32), u64> {
        self.lock().ring_bytes.clone()
    }

    /// A process with `devices` (user gpu_ids, running on the same actual GPUs) and
    /// `bos` (laid out at increasing VAs), its queues running, its kfd and render files
    /// held open by a child process (`sleep`) whose pid it takes. The dispatch
    /// increments buffer `counter_bo`.
    pub fn spawn_process(&self, devices: &[u32], bos: &[BoSpec], counter_bo: usize) -> FakeTask {
        let mut inner = self.lock();
        let kfd = Arc::new(memfd(c"fake-kfd", 0));
        let mut held: Vec<OwnedFd> = vec![dup(&kfd)];
        for &gpu in devices {
            let minor = inner
                .gpus
                .iter()
                .find(|g| g.gpu_id == gpu)
                .unwrap_or_else(|| panic!("no fake GPU {gpu}"))
                .render_minor;
            let render = memfd(c"fake-render", 0);
            inner
                .files
                .insert(ino(render.as_fd()).unwrap(), FileRole::Render { minor });
            held.push(render.into());
        }
        let raw: Vec<RawFd> = held.iter().map(|f| f.as_raw_fd()).collect();
        let mut command = std::process::Command::new("sleep");
        command.arg("1000");
        // SAFETY: between fork and exec the closure only calls dup2, which is
        // async-signal-safe, on descriptors the parent keeps open until the spawn returns.
        unsafe {
            command.pre_exec(move || {
                for (i, &fd) in raw.iter().enumerate() {
                    if libc::dup2(fd, HELD_FD_BASE + i as RawFd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawning sleep");
        let pid = child.id() as i32;
        let index = inner.processes.len();
        let mut addr = 0x7f00_0000_0000u64;
        let bos = bos
            .iter()
            .map(|b| {
                let mem = Arc::new(memfd(c"fake-bo", b.size));
                inner
                    .files
                    .insert(ino(mem.as_fd()).unwrap(), FileRole::Dmabuf);
                let offset = inner.next_offset;
                inner.next_offset += b.size.next_multiple_of(4096);
                let bo = Bo {
                    addr,
                    size: b.size,
                    offset,
                    gpu_id: b.gpu_id,
                    alloc_flags: b.alloc_flags,
                    mapped: b.mapped,
                    mem,
                };
                addr += b.size.next_multiple_of(1 << 21);
                bo
            })
            .collect();
        inner
            .files
            .insert(ino(kfd.as_fd()).unwrap(), FileRole::Kfd(Some(index)));
        inner.processes.push(Process {
            pid,
            kfd: kfd.clone(),
            devices: devices.iter().map(|&g| (g, g)).collect(),
            bos,
            queues: Queues::Running,
            program: Program {
                fake_kfd: 1,
                queues: 2,
                events: 3,
                counter_bo,
            },
        });
        FakeTask {
            child,
            pid,
            kfd: dup(&kfd),
            files: held,
        }
    }

    fn process_of(&self, inner: &Inner, kfd: BorrowedFd<'_>) -> Option<usize> {
        match inner.files.get(&ino(kfd)?) {
            Some(FileRole::Kfd(p)) => *p,
            _ => None,
        }
    }

    /// Write `data` into buffer `bo` of the process with kfd file `kfd`.
    pub fn write_bo(&self, kfd: BorrowedFd<'_>, bo: usize, offset: u64, data: &[u8]) {
        let inner = self.lock();
        let p = self.process_of(&inner, kfd).expect("a fake kfd file");
        inner.processes[p].bos[bo]
            .mem
            .write_all_at(data, offset)
            .expect("writing a fake buffer");
    }

    /// Read `len` bytes of buffer `bo` of the process with kfd file `kfd`.
    pub fn read_bo(&self, kfd: BorrowedFd<'_>, bo: usize, offset: u64, len: usize) -> Vec<u8> {
        let inner = self.lock();
        let p = self.process_of(&inner, kfd).expect("a fake kfd file");
        let mut out = vec![0; len];
        inner.processes[p].bos[bo]
            .mem
            .read_exact_at(&mut out, offset)
            .expect("reading a fake buffer");
        out
    }

    /// (addr, size, mmap offset, mapped) of every buffer of the process.
    pub fn bos(&self, kfd: BorrowedFd<'_>) -> Vec<(u64, u64, u64, bool)> {
        let inner = self.lock();
        let p = self.process_of(&inner, kfd).expect("a fake kfd file");
        inner.processes[p]
            .bos
            .iter()
            .map(|b| (b.addr, b.size, b.offset, b.mapped))
            .collect()
    }

    /// (user, actual) gpu_ids of the process.
    pub fn devices(&self, kfd: BorrowedFd<'_>) -> Vec<(u32, u32)> {
        let inner = self.lock();
        let p = self.process_of(&inner, kfd).expect("a fake kfd file");
        inner.processes[p].devices.clone()
    }

    /// Where the process's queues are; None when `kfd` has no process.
    pub fn queues(&self, kfd: BorrowedFd<'_>) -> Option<Queues> {
        let inner = self.lock();
        self.process_of(&inner, kfd)
            .map(|p| inner.processes[p].queues)
    }

    /// Every process's queues, in creation order.
    pub fn all_queues(&self) -> Vec<(i32, Queues)> {
        self.lock()
            .processes
            .iter()
            .map(|p| (p.pid, p.queues))
            .collect()
    }

    /// Run the process's dispatch: read the counter at the start of its counter buffer,
    /// write it back plus one, and return the new value. Refused unless the queues run.
    pub fn dispatch(&self, kfd: BorrowedFd<'_>) -> Result<u64, String> {
        let inner = self.lock();
        let p = self
            .process_of(&inner, kfd)
            .ok_or("no KFD process behind this file")?;
        let process = &inner.processes[p];
        if process.queues != Queues::Running {
            return Err(format!(
                "queues of pid {} are {:?}: the dispatch would never run",
                process.pid, process.queues
            ));
        }
        let bo = &process.bos[process.program.counter_bo];
        let mut counter = [0u8; 8];
        bo.mem
            .read_exact_at(&mut counter, 0)
            .map_err(|e| e.to_string())?;
        let next = u64::from_le_bytes(counter) + 1;
        bo.mem
            .write_all_at(&next.to_le_bytes(), 0)
            .map_err(|e| e.to_string())?;
        Ok(next)
    }

    fn check(&self, inner: &mut Inner, op: FakeOp, what: &str) -> Result<(), KernelError> {
        inner.log.push(format!("{op:?} {what}"));
        match inner.faults.iter().position(|(o, _)| *o == op) {
            Some(i) => {
                let (_, errno) = inner.faults.remove(i);
                Err(KernelError::new(format!("fake {op:?}"), what, errno))
            }
            None => Ok(()),
        }
    }
}

/// A process of the fake, held by a child process; killed when dropped.
#[derive(Debug)]
pub struct FakeTask {
    child: std::process::Child,
    /// The child's pid.
    pub pid: i32,
    /// The process's kfd file (the same open file the child holds).
    pub kfd: OwnedFd,
    /// The kfd and render files, as the child holds them.
    pub files: Vec<OwnedFd>,
}

impl Drop for FakeTask {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The KFD as one process sees it.
#[derive(Debug)]
struct FakeKfd {
    kernel: Arc<FakeKernel>,
    caller: i32,
}

fn einval(op: &str, what: impl Into<String>) -> KernelError {
    KernelError::new(op, what, libc::EINVAL)
}

impl Kfd for FakeKfd {
    fn kind_of(&self, stat: &libc::stat) -> Option<DeviceKind> {
        match self.kernel.lock().files.get(&stat.st_ino)? {
            FileRole::Kfd(_) => Some(DeviceKind::Kfd),
            FileRole::Render { minor } => Some(DeviceKind::Render { minor: *minor }),
            FileRole::Dmabuf => None,
        }
    }

    fn task_kfd(&self, pid: i32) -> Result<Option<OwnedFd>, KernelError> {
        let mut inner = self.kernel.lock();
        self.kernel
            .check(&mut inner, FakeOp::TaskKfd, &format!("pid {pid}"))?;
        Ok(inner
            .processes
            .iter()
            .rev()
            .find(|p| p.pid == pid)
            .map(|p| dup(&p.kfd)))
    }

    fn device_mappings(&self, pid: i32) -> Result<Vec<DeviceMapping>, KernelError> {
        let inner = self.kernel.lock();
        let Some(p) = inner.processes.iter().rev().find(|p| p.pid == pid) else {
            return Ok(Vec::new());
        };
        Ok(p.bos
            .iter()
            .filter(|b| b.mapped)
            .map(|b| {
                let through_kfd = b.alloc_flags
                    & (KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
                    != 0;
                let kind = if through_kfd {
                    DeviceKind::Kfd
                } else {
                    let actual = p
                        .devices
                        .iter()
                        .find(|d| d.0 == b.gpu_id)
                        .map_or(b.gpu_id, |d| d.1);
                    let minor = inner
                        .gpus
                        .iter()
                        .find(|g| g.gpu_id == actual)
                        .map_or(0, |g| g.render_minor);
                    DeviceKind::Render { minor }
                };
                DeviceMapping {
                    start: b.addr,
                    offset: b.offset,
                    kind,
                }
            })
            .collect())
    }

    fn open_kfd(&self) -> Result<OwnedFd, KernelError> {
        let file = memfd(c"fake-kfd", 0);
        self.kernel
            .lock()
            .files
            .insert(ino(file.as_fd()).unwrap(), FileRole::Kfd(None));
        Ok(file.into())
    }

    fn open_render(&self, minor: u32) -> Result<OwnedFd, KernelError> {
        let mut inner = self.kernel.lock();
        let what = format!("renderD{minor}");
        self.kernel.check(&mut inner, FakeOp::OpenRender, &what)?;
        if !inner.gpus.iter().any(|g| g.render_minor == minor) {
            return Err(KernelError::new("open", what, libc::ENOENT));
        }
        let file = memfd(c"fake-render", 0);
        inner
            .files
            .insert(ino(file.as_fd()).unwrap(), FileRole::Render { minor });
        Ok(file.into())
    }

    fn version(&self, _kfd: BorrowedFd<'_>) -> Result<(u32, u32), KernelError> {
        Ok((1, 11))
    }

    fn process_info(&self, kfd: BorrowedFd<'_>) -> Result<ProcessInfo, KernelError> {
        let mut inner = self.kernel.lock();
        let p = self
            .kernel
            .process_of(&inner, kfd)
            .ok_or_else(|| KernelError::new("PROCESS_INFO", "", libc::EBADF))?;
        let pid = inner.processes[p].pid;
        self.kernel
            .check(&mut inner, FakeOp::ProcessInfo, &format!("pid {pid}"))?;
        let process = &mut inner.processes[p];
        if process.queues == Queues::Running {
            process.queues = Queues::Paused;
        }
        Ok(ProcessInfo {
            pid: pid as u32,
            num_devices: process.devices.len() as u32,
            num_bos: process.bos.len() as u32,
            num_objects: process.program.queues + process.program.events,
            priv_data_size: serde_json::to_vec(&process.program).unwrap().len() as u64,
        })
    }

    fn checkpoint(
        &self,
        kfd: BorrowedFd<'_>,
        info: &ProcessInfo,
    ) -> Result<KfdCheckpoint, KernelError> {
        let mut inner = self.kernel.lock();
        let p = self
            .kernel
            .process_of(&inner, kfd)
            .ok_or_else(|| KernelError::new("CHECKPOINT", "", libc::EBADF))?;
        let what = format!("pid {}", inner.processes[p].pid);
        self.kernel.check(&mut inner, FakeOp::Checkpoint, &what)?;
        let process = &inner.processes[p];
        if process.queues != Queues::Paused {
            return Err(einval("CHECKPOINT", format!("{what}: queues not paused")));
        }
        let priv_data = serde_json::to_vec(&process.program).unwrap();
        if info.num_devices as usize != process.devices.len()
            || info.num_bos as usize != process.bos.len()
            || info.priv_data_size != priv_data.len() as u64
        {
            return Err(einval("CHECKPOINT", format!("{what}: counts differ")));
        }
        let devices = process
            .devices
            .iter()
            .map(|&(user, actual)| KfdCriuDeviceBucket {
                user_gpu_id: user,
                actual_gpu_id: actual,
                ..Default::default()
            })
            .collect();
        let mut dmabufs = Vec::new();
        let bos = process
            .bos
            .iter()
            .map(|b| {
                let fd = bo_has_contents(b.alloc_flags).then(|| dup(&b.mem));
                let bucket = KfdCriuBoBucket {
                    addr: b.addr,
                    size: b.size,
                    offset: b.offset,
                    gpu_id: b.gpu_id,
                    alloc_flags: b.alloc_flags,
                    dmabuf_fd: fd.as_ref().map_or(u32::MAX, |f| f.as_raw_fd() as u32),
                    ..Default::default()
                };
                dmabufs.push(fd);
                bucket
            })
            .collect();
        Ok(KfdCheckpoint {
            devices,
            bos,
            dmabufs,
            priv_data,
        })
    }

    fn unpause(&self, kfd: BorrowedFd<'_>) -> Result<(), KernelError> {
        let mut inner = self.kernel.lock();
        let p = self
            .kernel
            .process_of(&inner, kfd)
            .ok_or_else(|| KernelError::new("UNPAUSE", "", libc::EBADF))?;
        let what = format!("pid {}", inner.processes[p].pid);
        self.kernel.check(&mut inner, FakeOp::Unpause, &what)?;
        let process = &mut inner.processes[p];
        if process.queues != Queues::Paused {
            return Err(einval("UNPAUSE", format!("{what}: queues not paused")));
        }
        process.queues = Queues::Running;
        Ok(())
    }

    fn restore(
        &self,
        kfd: BorrowedFd<'_>,
        request: &mut RestoreRequest,
    ) -> Result<Vec<Option<OwnedFd>>, KernelError> {
        let mut inner = self.kernel.lock();
        let what = format!("pid {}", self.caller);
        self.kernel.check(&mut inner, FakeOp::Restore, &what)?;
        let kfd_ino = ino(kfd).ok_or_else(|| KernelError::new("RESTORE", &what, libc::EBADF))?;
        if !matches!(inner.files.get(&kfd_ino), Some(FileRole::Kfd(None))) {
            return Err(einval("RESTORE", format!("{what}: not a fresh kfd file")));
        }
        let program: Program = serde_json::from_slice(&request.priv_data)
            .map_err(|e| einval("RESTORE", format!("{what}: private data: {e}")))?;
        if program.queues + program.events != request.num_objects {
            return Err(einval("RESTORE", format!("{what}: object count")));
        }
        for d in &request.devices {
            let gpu = inner
                .gpus
                .iter()
                .find(|g| g.gpu_id == d.actual_gpu_id)
                .ok_or_else(|| einval("RESTORE", format!("no GPU {}", d.actual_gpu_id)))?;
            // SAFETY: only borrowed for fstat; the caller passed the fd number in its
            // own table, which stays open for the call.
            let drm = unsafe { BorrowedFd::borrow_raw(d.drm_fd as RawFd) };
            match ino(drm).and_then(|i| inner.files.get(&i)) {
                Some(FileRole::Render { minor }) if *minor == gpu.render_minor => {}
                _ => {
                    return Err(einval(
                        "RESTORE",
                        format!(
                            "drm_fd {} is not a render node of GPU {}",
                            d.drm_fd, gpu.gpu_id
                        ),
                    ))
                }
            }
        }
        for b in &request.bos {
            if !request.devices.iter().any(|d| d.user_gpu_id == b.gpu_id) {
                return Err(einval(
                    "RESTORE",
                    format!("buffer on unknown GPU {}", b.gpu_id),
                ));
            }
        }
        let index = inner.processes.len();
        let mut bos = Vec::new();
        let mut fds = Vec::new();
        for b in request.bos.iter_mut() {
            let mem = Arc::new(memfd(c"fake-bo", b.size));
            inner
                .files
                .insert(ino(mem.as_fd()).unwrap(), FileRole::Dmabuf);
            b.restored_offset = inner.next_offset;
            inner.next_offset += b.size.next_multiple_of(4096);
            let fd = bo_has_contents(b.alloc_flags).then(|| dup(&mem));
            b.dmabuf_fd = fd.as_ref().map_or(u32::MAX, |f| f.as_raw_fd() as u32);
            fds.push(fd);
            bos.push(Bo {
                addr: b.addr,
                size: b.size,
                offset: b.restored_offset,
                gpu_id: b.gpu_id,
                alloc_flags: b.alloc_flags,
                mapped: false,
                mem,
            });
        }
        // SAFETY: only borrowed to duplicate it; the caller's fd is open for the call.
        let kfd_file = Arc::new(File::from(dup_borrowed(kfd)));
        inner.files.insert(kfd_ino, FileRole::Kfd(Some(index)));
        inner.processes.push(Process {
            pid: self.caller,
            kfd: kfd_file,
            devices: request
                .devices
                .iter()
                .map(|d| (d.user_gpu_id, d.actual_gpu_id))
                .collect(),
            bos,
            queues: Queues::Evicted,
            program,
        });
        Ok(fds)
    }

    fn resume(&self, _kfd: BorrowedFd<'_>, pid: i32) -> Result<(), KernelError> {
        let mut inner = self.kernel.lock();
        let what = format!("pid {pid}");
        self.kernel.check(&mut inner, FakeOp::Resume, &what)?;
        let Some(process) = inner
            .processes
            .iter_mut()
            .rev()
            .find(|p| p.pid == pid && p.queues == Queues::Evicted)
        else {
            return Err(KernelError::new("RESUME", what, libc::ESRCH));
        };
        process.queues = Queues::Running;
        Ok(())
    }
}

fn dup_borrowed(fd: BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("dup")
}

/// The fake's render nodes.
#[derive(Debug)]
struct FakeDrm {
    kernel: Arc<FakeKernel>,
}

impl Drm for FakeDrm {
    fn open(&self, minor: u32) -> Result<Arc<dyn RenderNode>, KernelError> {
        let mut inner = self.kernel.lock();
        let what = format!("renderD{minor}");
        self.kernel.check(&mut inner, FakeOp::OpenRender, &what)?;
        let gpu = *inner
            .gpus
            .iter()
            .find(|g| g.render_minor == minor)
            .ok_or_else(|| KernelError::new("open", &what, libc::ENOENT))?;
        Ok(Arc::new(FakeNode {
            kernel: self.kernel.clone(),
            gpu,
            state: Mutex::new(NodeState {
                next: 1,
                ..Default::default()
            }),
        }))
    }
}

#[derive(Debug, Clone)]
enum Backing {
    /// An imported dmabuf or a GTT buffer: a memfd.
    File(Arc<File>),
    /// Userptr memory at this address.
    User { addr: usize, len: u64 },
}

#[derive(Debug, Default)]
struct NodeState {
    next: u32,
    handles: HashMap<u32, Backing>,
    /// VA → (handle, size).
    vas: BTreeMap<u64, (u32, u64)>,
    lists: HashMap<u32, Vec<u32>>,
    ctxs: Vec<u32>,
    seq: HashMap<u32, u64>,
}

/// A render node of the fake, with SDMA rings that execute copy packets.
#[derive(Debug)]
struct FakeNode {
    kernel: Arc<FakeKernel>,
    gpu: FakeGpu,
    state: Mutex<NodeState>,
}

impl FakeNode {
    fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, op: FakeOp, what: &str) -> Result<(), KernelError> {
        let mut inner = self.kernel.lock();
        self.kernel.check(
            &mut inner,
            op,
            &format!("renderD{} {what}", self.gpu.render_minor),
        )
    }

    fn add(&self, backing: Backing) -> u32 {
        let mut s = self.lock();
        let h = s.next;
        s.next += 1;
        s.handles.insert(h, backing);
        h
    }
}

/// Resolve `len` bytes at GPU VA `va` to a buffer of `list`.
fn resolve(s: &NodeState, list: &[u32], va: u64, len: u64) -> Result<(Backing, u64), KernelError> {
    let (&start, &(handle, size)) = s
        .vas
        .range(..=va)
        .next_back()
        .ok_or_else(|| einval("SDMA copy", format!("VA {va:#x} is not mapped")))?;
    if va + len > start + size {
        return Err(einval(
            "SDMA copy",
            format!("{len} bytes at VA {va:#x} run past the buffer mapped at {start:#x}"),
        ));
    }
    if !list.contains(&handle) {
        return Err(einval(
            "SDMA copy",
            format!("buffer {handle} at VA {va:#x} is not in the submission's BO list"),
        ));
    }
    Ok((s.handles[&handle].clone(), va - start))
}

fn read_backing(b: &Backing, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
    match b {
        Backing::File(f) => f.read_exact_at(out, offset),
        Backing::User { addr, .. } => {
            // SAFETY: userptr memory stays valid until its handle is closed (the
            // contract of `RenderNode::userptr`); the range was checked against its size.
            let src = unsafe {
                std::slice::from_raw_parts((*addr as *const u8).add(offset as usize), out.len())
            };
            out.copy_from_slice(src);
            Ok(())
        }
    }
}

fn write_backing(b: &Backing, offset: u64, data: &[u8]) -> std::io::Result<()> {
    match b {
        Backing::File(f) => {
            if data.iter().all(|&x| x == 0) {
                // Zeros stay holes, so large sparse buffers cost no memory.
                nix::fcntl::fallocate(
                    f.as_fd(),
                    nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    offset as i64,
                    data.len() as i64,
                )
                .map_err(std::io::Error::from)
            } else {
                f.write_all_at(data, offset)
            }
        }
        Backing::User { addr, .. } => {
            // SAFETY: as in `read_backing`; the GPU copy is the memory's only writer
            // while the submission runs (the owner waits for its fence).
            let dst = unsafe {
                std::slice::from_raw_parts_mut((*addr as *mut u8).add(offset as usize), data.len())
            };
            dst.copy_from_slice(data);
            Ok(())
        }
    }
}

fn backing_len(b: &Backing) -> u64 {
    match b {
        Backing::File(f) => f.metadata().map(|m| m.len()).unwrap_or(0),
        Backing::User { len, .. } => *len,
    }
}

impl RenderNode for FakeNode {
    fn info(&self) -> Result<NodeInfo, KernelError> {
        Ok(NodeInfo {
            family: self.gpu.family,
            sdma_major: self.gpu.sdma_major,
            rings: (0..self.gpu.rings).collect(),
            va_start: 1 << 32,
            va_end: 1 << 47,
        })
    }

    fn import(&self, dmabuf: BorrowedFd<'_>) -> Result<u32, KernelError> {
        self.check(FakeOp::Import, "PRIME_FD_TO_HANDLE")?;
        let known = ino(dmabuf)
            .and_then(|i| self.kernel.lock().files.get(&i).copied())
            .is_some_and(|r| matches!(r, FileRole::Dmabuf));
        if !known {
            return Err(einval("PRIME_FD_TO_HANDLE", "not a dmabuf"));
        }
        Ok(self.add(Backing::File(Arc::new(File::from(dup_borrowed(dmabuf))))))
    }

    unsafe fn userptr(&self, addr: *mut u8, size: u64) -> Result<u32, KernelError> {
        self.check(FakeOp::Userptr, "GEM_USERPTR")?;
        if addr as usize % 4096 != 0 || size % 4096 != 0 || size == 0 {
            return Err(einval(
                "GEM_USERPTR",
                "address and size must be page-aligned",
            ));
        }
        Ok(self.add(Backing::User {
            addr: addr as usize,
            len: size,
        }))
    }

    fn create_gtt(&self, size: u64) -> Result<u32, KernelError> {
        self.check(FakeOp::CreateGtt, "GEM_CREATE")?;
        Ok(self.add(Backing::File(Arc::new(memfd(c"fake-gtt", size)))))
    }

    fn map_cpu(&self, handle: u32, size: u64) -> Result<memmap2::MmapMut, KernelError> {
        let s = self.lock();
        let Some(Backing::File(f)) = s.handles.get(&handle) else {
            return Err(einval("GEM_MMAP", format!("handle {handle}")));
        };
        // SAFETY: a shared mapping of the GTT buffer's memfd, which only the owner of
        // the handle and the fake's SDMA rings (reading submitted IBs) use.
        unsafe {
            memmap2::MmapOptions::new()
                .len(size as usize)
                .map_mut(f.as_ref())
        }
        .map_err(|e| KernelError::new("mmap", "", e.raw_os_error().unwrap_or(libc::EIO)))
    }

    fn va_map(&self, handle: u32, va: u64, size: u64) -> Result<(), KernelError> {
        self.check(FakeOp::VaMap, "GEM_VA MAP")?;
        let mut s = self.lock();
        let Some(b) = s.handles.get(&handle) else {
            return Err(einval("GEM_VA", format!("handle {handle}")));
        };
        if size > backing_len(b).next_multiple_of(4096) || va % 4096 != 0 {
            return Err(einval("GEM_VA", format!("{size} bytes at {va:#x}")));
        }
        let overlaps = s
            .vas
            .range(..va + size)
            .next_back()
            .is_some_and(|(&start, &(_, len))| start + len > va);
        if overlaps {
            return Err(einval("GEM_VA", format!("VA {va:#x} is taken")));
        }
        s.vas.insert(va, (handle, size));
        Ok(())
    }

    fn va_unmap(&self, handle: u32, va: u64, _size: u64) -> Result<(), KernelError> {
        let mut s = self.lock();
        match s.vas.get(&va) {
            Some(&(h, _)) if h == handle => {
                s.vas.remove(&va);
                Ok(())
            }
            _ => Err(einval("GEM_VA UNMAP", format!("{va:#x}"))),
        }
    }

    fn close(&self, handle: u32) -> Result<(), KernelError> {
        let mut s = self.lock();
        s.vas.retain(|_, (h, _)| *h != handle);
        s.handles
            .remove(&handle)
            .map(|_| ())
            .ok_or_else(|| einval("GEM_CLOSE", format!("handle {handle}")))
    }

    fn bo_list(&self, handles: &[u32]) -> Result<u32, KernelError> {
        let mut s = self.lock();
        if let Some(h) = handles.iter().find(|h| !s.handles.contains_key(h)) {
            return Err(einval("BO_LIST", format!("handle {h}")));
        }
        let id = s.next;
        s.next += 1;
        s.lists.insert(id, handles.to_vec());
        Ok(id)
    }

    fn bo_list_destroy(&self, list: u32) -> Result<(), KernelError> {
        self.lock()
            .lists
            .remove(&list)
            .map(|_| ())
            .ok_or_else(|| einval("BO_LIST DESTROY", format!("list {list}")))
    }

    fn ctx_create(&self) -> Result<u32, KernelError> {
        let mut s = self.lock();
        let id = s.next;
        s.next += 1;
        s.ctxs.push(id);
        Ok(id)
    }

    fn ctx_free(&self, ctx: u32) -> Result<(), KernelError> {
        let mut s = self.lock();
        let before = s.ctxs.len();
        s.ctxs.retain(|&c| c != ctx);
        if s.ctxs.len() == before {
            return Err(einval("CTX FREE", format!("ctx {ctx}")));
        }
        Ok(())
    }

    fn submit(
        &self,
        ctx: u32,
        list: u32,
        ring: u32,
        ib_va: u64,
        dwords: u32,
    ) -> Result<u64, KernelError> {
        self.check(FakeOp::Submit, &format!("CS ring {ring}"))?;
        let mut s = self.lock();
        if ring >= self.gpu.rings || !s.ctxs.contains(&ctx) {
            return Err(einval("CS", format!("ring {ring} ctx {ctx}")));
        }
        let list_bos = s
            .lists
            .get(&list)
            .cloned()
            .ok_or_else(|| einval("CS", format!("BO list {list}")))?;
        if dwords % 8 != 0 {
            return Err(einval(
                "CS",
                format!("IB of {dwords} dwords is not padded to 8"),
            ));
        }
        let (ib, at) = resolve(&s, &list_bos, ib_va, dwords as u64 * 4)?;
        let mut bytes = vec![0u8; dwords as usize * 4];
        read_backing(&ib, at, &mut bytes).map_err(|_| einval("CS", "IB unreadable"))?;
        let ib: Vec<u32> = bytes
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let enc = CountEncoding::for_sdma_version(self.gpu.sdma_major)
            .ok_or_else(|| einval("CS", "no SDMA copy on this GPU"))?;
        let mut i = 0;
        let mut copied = 0u64;
        while i < ib.len() {
            match ib[i] {
                0 => i += 1,
                COPY_LINEAR_HEADER if i + COPY_LINEAR_DWORDS <= ib.len() => {
                    let p = &ib[i..i + COPY_LINEAR_DWORDS];
                    let len = match enc {
                        CountEncoding::Bytes => p[1] as u64,
                        CountEncoding::BytesMinusOne => p[1] as u64 + 1,
                    };
                    let src = p[3] as u64 | (p[4] as u64) << 32;
                    let dst = p[5] as u64 | (p[6] as u64) << 32;
                    let (sb, so) = resolve(&s, &list_bos, src, len)?;
                    let (db, doff) = resolve(&s, &list_bos, dst, len)?;
                    let mut data = vec![0u8; len as usize];
                    read_backing(&sb, so, &mut data)
                        .and_then(|()| write_backing(&db, doff, &data))
                        .map_err(|e| {
                            KernelError::new("SDMA copy", "", e.raw_os_error().unwrap_or(libc::EIO))
                        })?;
                    copied += len;
                    i += COPY_LINEAR_DWORDS;
                }
                other => {
                    return Err(einval(
                        "CS",
                        format!("unknown SDMA packet header {other:#x}"),
                    ))
                }
            }
        }
        let seq = s.seq.entry(ring).or_insert(0);
        *seq += 1;
        let seq = *seq;
        drop(s);
        *self
            .kernel
            .lock()
            .ring_bytes
            .entry((self.gpu.gpu_id, ring))
            .or_insert(0) += copied;
        Ok(seq)
    }

    fn wait(&self, ctx: u32, ring: u32, seq: u64, timeout: Duration) -> Result<bool, KernelError> {
        self.check(FakeOp::Wait, &format!("WAIT_CS ring {ring} seq {seq}"))?;
        if !self.lock().ctxs.contains(&ctx) {
            return Err(einval("WAIT_CS", format!("ctx {ctx}")));
        }
        if self.kernel.lock().stalled {
            std::thread::sleep(timeout);
            return Ok(false);
        }
        Ok(self.lock().seq.get(&ring).is_some_and(|&s| s >= seq))
    }
}
