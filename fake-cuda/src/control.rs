//! The controlling side: the checkpoint functions called on another process.
//!
//! A target's context is found through `/proc/PID/maps` (its control file is mapped
//! there), its state read from the control file, its restore thread found by name in
//! `/proc/PID/task/*/comm`. Lock, checkpoint, restore and unlock are requests in the
//! context's mailbox, answered by the target's restore thread: a call blocks until that
//! thread runs, and fails with `CUDA_ERROR_TIMEOUT` after `GPUCR_FAKE_CUDA_TIMEOUT`
//! seconds, withdrawing its request.
//!
//! Custom storage: the target names its device memory, this process maps the target's
//! memory files `MAP_SHARED` and hands out device pointers into them
//! ([`DevPtr::Mapped`]); `cuCheckpointOperationComplete` unmaps them and tells the
//! target to finish.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::sys::CUresult;
use gpucr_cuda_driver::Uuid;

use crate::app::{self, CONTROL_FILE, CONTROL_MAGIC, RESTORE_THREAD, STATE_OFFSET};
use crate::args::{CustomStorageInfo, Region};
use crate::config::Config;
use crate::cuda_h::Header;
use crate::devptr::DevPtr;
use crate::mailbox::{self, Answer, GpuMemory, Op, Request};
use crate::mapping::Mapping;

const POLL: Duration = Duration::from_millis(1);

/// The context directory of `pid`, from the control file it maps.
pub fn find_context(pid: i32) -> Result<PathBuf, CUresult> {
    if pid <= 0 {
        return Err(result::INVALID_VALUE);
    }
    let files = gpucr_abi::procfs::mapped_files(pid).map_err(|_| result::INVALID_VALUE)?;
    files
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == CONTROL_FILE))
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
        // No fake context: not a CUDA process, which the driver answers with
        // CUDA_ERROR_INVALID_VALUE.
        .ok_or(result::INVALID_VALUE)
}

/// `cuCheckpointProcessGetState`: read from the target's control file, so it works
/// while the target is frozen.
pub fn state(pid: i32) -> Result<i32, CUresult> {
    let dir = find_context(pid)?;
    let file = File::open(dir.join(CONTROL_FILE)).map_err(|_| result::INVALID_VALUE)?;
    let mut head = [0u8; STATE_OFFSET + 4];
    file.read_exact_at(&mut head, 0)
        .map_err(|_| result::INVALID_VALUE)?;
    if &head[..8] != CONTROL_MAGIC {
        return Err(result::INVALID_VALUE);
    }
    let word: [u8; 4] = head[STATE_OFFSET..].try_into().expect("4 bytes");
    Ok(u32::from_ne_bytes(word) as i32)
}

/// `cuCheckpointProcessGetRestoreThreadId`: the tid (as this process sees it) of the
/// target's thread named `cuda-restore`.
pub fn restore_tid(pid: i32) -> Result<i32, CUresult> {
    find_context(pid)?;
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| result::INVALID_VALUE)?;
    for task in tasks.flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == RESTORE_THREAD {
            if let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) {
                return Ok(tid);
            }
        }
    }
    Err(result::NOT_INITIALIZED)
}

/// Sends `op` to `pid`'s restore thread and waits for its answer, at most the
/// configured timeout plus `extra`. A failed answer is its code.
pub fn request(config: &Config, pid: i32, op: Op, extra: Duration) -> Result<Answer, CUresult> {
    let dir = find_context(pid)?;
    let answer = send(&dir, pid, op, config.timeout + extra)?;
    if answer.code == result::SUCCESS {
        Ok(answer)
    } else {
        Err(answer.code)
    }
}

fn send(dir: &Path, pid: i32, op: Op, timeout: Duration) -> Result<Answer, CUresult> {
    let last = mailbox::get(dir, mailbox::ANSWER_FILE)
        .and_then(|t| Answer::decode(&t))
        .map_or(0, |a| a.seq);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seq = now.max(last + 1);
    mailbox::put(dir, mailbox::REQUEST_FILE, &Request { seq, op }.encode())
        .map_err(|_| result::OPERATING_SYSTEM)?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(a) = mailbox::get(dir, mailbox::ANSWER_FILE).and_then(|t| Answer::decode(&t)) {
            if a.seq == seq {
                return Ok(a);
            }
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(result::INVALID_VALUE);
        }
        if Instant::now() >= deadline {
            // Withdraw the request, so that a target let run later does not act on it.
            let cancel = Request {
                seq: seq + 1,
                op: Op::Cancel,
            };
            let _ = mailbox::put(dir, mailbox::REQUEST_FILE, &cancel.encode());
            return Err(result::TIMEOUT);
        }
        std::thread::sleep(POLL);
    }
}

/// Checks the new GPUs of `pairs` against this machine's (the configured ones).
pub fn check_pairs(config: &Config, pairs: &[(Uuid, Uuid)]) -> Result<(), CUresult> {
    for (i, (old, new)) in pairs.iter().enumerate() {
        if !config.gpus.contains(new) || pairs[..i].iter().any(|(o, n)| o == old || n == new) {
            return Err(result::INVALID_VALUE);
        }
    }
    Ok(())
}

/// A custom-storage operation in progress in this process.
struct Operation {
    pid: i32,
    restore: bool,
    slots: Vec<u16>,
    // Kept alive while the caller reads it through the pointer it was given.
    _info: CustomStorageInfo,
}

static OPERATIONS: Mutex<Option<HashMap<usize, Operation>>> = Mutex::new(None);
static REGIONS: Mutex<Option<HashMap<u16, Arc<Mapping>>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);
static NEXT_SLOT: AtomicU16 = AtomicU16::new(1);
/// Handles are this plus a counter: opaque, never dereferenced.
const HANDLE_BASE: usize = 0x0fa6_0000;
/// Streams handed out are this plus the ordinal.
const STREAM_BASE: usize = 0x57e0_0000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Begins a custom-storage checkpoint (`restore: false`) or restore of `pid`: maps the
/// target's device memory and stores the information in `*out`.
///
/// The information is laid out as `header` says.
///
/// # Safety
/// `out` points to a writable `CUcheckpointCustomStorageInfo *`.
pub unsafe fn begin_custom(
    config: &Config,
    header: &'static Header,
    pid: i32,
    restore: bool,
    pairs: Vec<(Uuid, Uuid)>,
    out: *mut *mut c_void,
) -> Result<(), CUresult> {
    let op = if restore {
        Op::RestoreBegin { pairs }
    } else {
        Op::CheckpointBegin
    };
    let dir = find_context(pid)?;
    let answer = request(config, pid, op, Duration::ZERO)?;
    let mapped = match map_regions(&dir, &answer.gpus) {
        Ok(m) => m,
        Err(code) => {
            let _ = request(config, pid, Op::Cancel, Duration::ZERO);
            return Err(code);
        }
    };
    let mut slots = Vec::new();
    let mut per_device = Vec::new();
    {
        let mut regions = lock(&REGIONS);
        let regions = regions.get_or_insert_with(HashMap::new);
        for (g, mapping) in answer.gpus.iter().zip(mapped) {
            let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
            regions.insert(slot, Arc::new(mapping));
            slots.push(slot);
            per_device.push(Region {
                dev_ptr: DevPtr::Mapped { slot, offset: 0 }.encode(),
                size: g.size as usize,
                stream: STREAM_BASE + usize::from(g.ordinal),
            });
        }
    }
    let handle = HANDLE_BASE + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let mut info = match CustomStorageInfo::new(header, handle, &per_device) {
        Ok(info) => info,
        Err(_) => {
            let _ = request(config, pid, Op::Cancel, Duration::ZERO);
            return Err(result::NOT_SUPPORTED);
        }
    };
    // SAFETY: the caller guarantees `out` is writable; the information lives in the
    // operation until it completes.
    unsafe { *out = info.as_ptr() };
    lock(&OPERATIONS).get_or_insert_with(HashMap::new).insert(
        handle,
        Operation {
            pid,
            restore,
            slots,
            _info: info,
        },
    );
    Ok(())
}

fn map_regions(dir: &Path, gpus: &[GpuMemory]) -> Result<Vec<Mapping>, CUresult> {
    gpus.iter()
        .map(|g| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(app::memory_file(dir, g.uuid))
                .map_err(|_| result::OPERATING_SYSTEM)?;
            Mapping::shared(&file, g.size as usize).map_err(|_| result::OUT_OF_MEMORY)
        })
        .collect()
}

/// `cuCheckpointOperationComplete`: unmaps the operation's memory and lets the target
/// finish.
pub fn complete(config: &Config, handle: usize) -> Result<(), CUresult> {
    let op = lock(&OPERATIONS)
        .as_mut()
        .and_then(|ops| ops.remove(&handle))
        .ok_or(result::INVALID_HANDLE)?;
    if let Some(regions) = lock(&REGIONS).as_mut() {
        for slot in &op.slots {
            regions.remove(slot);
        }
    }
    let finish = if op.restore {
        Op::RestoreComplete
    } else {
        Op::CheckpointComplete
    };
    request(config, op.pid, finish, Duration::ZERO).map(|_| ())
}

/// The mapped region of `slot`, and whether `len` bytes at `offset` lie in it.
fn region(slot: u16, offset: u64, len: usize) -> Result<Arc<Mapping>, CUresult> {
    let region = lock(&REGIONS)
        .as_ref()
        .and_then(|r| r.get(&slot).cloned())
        .ok_or(result::INVALID_VALUE)?;
    if offset + len as u64 > region.len() as u64 {
        return Err(result::INVALID_VALUE);
    }
    Ok(region)
}

/// A copy of `bytes` to or from a mapped region takes the time
/// [`crate::config::ENV_COPY_MIBPS`] gives it.
pub fn copy_time(config: &Config, bytes: usize) {
    if let Some(rate) = config.copy_rate {
        std::thread::sleep(Duration::from_secs_f64(bytes as f64 / rate as f64));
    }
}

/// `cuMemcpyDtoH` from a mapped region.
pub fn read_mapped(slot: u16, offset: u64, dst: &mut [u8]) -> Result<(), CUresult> {
    let region = region(slot, offset, dst.len())?;
    dst.copy_from_slice(&region.as_slice()[offset as usize..][..dst.len()]);
    Ok(())
}

/// `cuMemcpyHtoD` into a mapped region.
pub fn write_mapped(slot: u16, offset: u64, src: &[u8]) -> Result<(), CUresult> {
    let region = region(slot, offset, src.len())?;
    // SAFETY: the range lies inside the mapping (checked by `region`), which the `Arc`
    // keeps mapped; concurrent copies into one region are the caller's to order, as on a
    // GPU.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr(),
            region.as_ptr().add(offset as usize),
            src.len(),
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::gpu_uuid;

    #[test]
    fn pairs_must_name_existing_distinct_gpus() {
        let config = Config {
            dir: None,
            gpus: (0..4).map(gpu_uuid).collect(),
            version: 13000,
            timeout: Duration::from_secs(1),
            fail: Vec::new(),
            log: None,
            sync: Duration::ZERO,
            step: Duration::ZERO,
            copy_rate: None,
            staged_resident: false,
        };
        assert_eq!(check_pairs(&config, &[(gpu_uuid(0), gpu_uuid(3))]), Ok(()));
        assert_eq!(
            check_pairs(&config, &[(gpu_uuid(0), gpu_uuid(9))]),
            Err(result::INVALID_VALUE)
        );
        assert_eq!(
            check_pairs(
                &config,
                &[(gpu_uuid(0), gpu_uuid(2)), (gpu_uuid(1), gpu_uuid(2))]
            ),
            Err(result::INVALID_VALUE)
        );
    }

    #[test]
    fn a_process_without_context_is_not_a_cuda_process() {
        assert_eq!(
            find_context(std::process::id() as i32),
            Err(result::INVALID_VALUE)
        );
        assert_eq!(find_context(-1), Err(result::INVALID_VALUE));
    }
}
