//! The SDMA copy engine of one GPU, on gpucr's own render node: device buffers imported
//! from dmabufs, staging chunks of page-aligned anonymous memory registered as userptr
//! buffers, and indirect buffers of SDMA linear-copy packets submitted on every SDMA
//! ring the GPU offers.
//!
//! Each ring has two slots (staging chunk, indirect buffer, context): while one slot's
//! copy runs on the engine, the other is filled or drained by the CPU, so the engine
//! does not wait for the disk or the compressor. Callers take slots round-robin across
//! the rings; every fence wait has a time limit. Reads (dump) are waited for at once,
//! their callers being many threads; a restore writer thread leaves its write running
//! while it fills the next slot ([`DeviceBo::write_behind`]), and waits for all of them
//! at the end of each buffer.
//!
//! Every copy takes the transfer's cancellation token: nothing is submitted once it is
//! cancelled, and a fence wait is made of slices of the kernel's own wait
//! ([`FENCE_SLICE`]), the token looked at between them, so it ends soon after the
//! cancellation, within the same time limit. A copy whose fence was not seen (given up
//! or timed out) may still run on the engine: its slot is waited for before its staging
//! memory is used again.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gpucr_abi::amdgpu_drm::sdma::{self, CountEncoding};
use gpucr_amdgpu::{KernelError, RenderNode};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use crate::cancel::{Cancel, Cancelled};

/// Bytes per staging chunk: four full 2 MiB packets.
pub const CHUNK_BYTES: usize = 8 << 20;
/// Slots per ring.
const SLOTS_PER_RING: usize = 2;
/// GPU VA alignment of gpucr's mappings.
const VA_ALIGN: u64 = 1 << 21;
/// The longest single kernel fence wait (and wait for a free slot): how late a copy
/// notices its cancellation at most.
pub const FENCE_SLICE: Duration = Duration::from_millis(50);

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("GPU {gpu:#x}: {source}")]
    Kernel {
        gpu: u32,
        #[source]
        source: KernelError,
    },
    #[error(
        "GPU {gpu:#x}: the SDMA fence of ring {ring} (submission {seq}) did not signal within \
         {timeout:?}; the copy engine is hung or far slower than expected"
    )]
    FenceTimeout {
        gpu: u32,
        ring: u32,
        seq: u64,
        timeout: Duration,
    },
    #[error("GPU {gpu:#x}: {detail}")]
    Other { gpu: u32, detail: String },
    /// The copy's token was cancelled (the transfer failed or was cancelled).
    #[error("GPU {gpu:#x}: copy cancelled: {reason}")]
    Cancelled { gpu: u32, reason: String },
}

impl From<CopyError> for std::io::Error {
    fn from(e: CopyError) -> Self {
        let kind = match &e {
            CopyError::FenceTimeout { .. } => std::io::ErrorKind::TimedOut,
            CopyError::Cancelled { .. } => std::io::ErrorKind::Interrupted,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Page-aligned anonymous private memory (what GEM_USERPTR with ANONONLY accepts).
struct AnonChunk {
    ptr: NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the chunk is plain memory owned by its slot; a slot is used by one thread at
// a time (taken out of the engine's free list).
unsafe impl Send for AnonChunk {}

impl AnonChunk {
    fn new(len: usize) -> std::io::Result<AnonChunk> {
        let size = NonZeroUsize::new(len).expect("a non-empty chunk");
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        Ok(AnonChunk { ptr, len })
    }

    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    fn bytes(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: the mapping is `self.len` bytes, readable and writable, and only
        // reachable through `&mut self` (the GPU touches it only while the owner waits
        // for the fence of a copy).
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len.min(self.len)) }
    }
}

impl Drop for AnonChunk {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this length and is unmapped once.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// A buffer mapped into gpucr's GPU VA space.
#[derive(Debug, Clone, Copy)]
struct Mapped {
    handle: u32,
    va: u64,
    size: u64,
}

struct Slot {
    ring: u32,
    ctx: u32,
    staging: AnonChunk,
    staging_bo: Mapped,
    ib: memmap2::MmapMut,
    ib_bo: Mapped,
    /// The submission of the slot's last copy when its fence was not seen (the wait
    /// was given up or timed out): the engine may still be copying from or into the
    /// staging chunk, so the slot is waited for before it is used again.
    unsignalled: Option<u64>,
}

/// How a fence wait ended.
enum Fence {
    Signalled,
    TimedOut,
    Cancelled(Cancelled),
}

/// The copy engine of one GPU.
pub struct GpuEngine {
    gpu: u32,
    node: Arc<dyn RenderNode>,
    enc: CountEncoding,
    rings: Vec<u32>,
    free: Mutex<Vec<Option<Slot>>>,
    freed: Condvar,
    next: AtomicUsize,
    va_next: AtomicU64,
    va_end: u64,
    timeout: Duration,
    /// Bytes copied per ring (index into `rings`).
    ring_bytes: Vec<AtomicU64>,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("gpu", &self.gpu)
            .field("rings", &self.rings)
            .finish_non_exhaustive()
    }
}

/// A device buffer imported from a dmabuf and mapped for the engine.
#[derive(Debug)]
pub struct DeviceBo {
    engine: Arc<GpuEngine>,
    mapped: Mapped,
}

impl Drop for DeviceBo {
    fn drop(&mut self) {
        let _ = self.engine.unmap(self.mapped);
    }
}

impl DeviceBo {
    pub fn len(&self) -> u64 {
        self.mapped.size
    }

    pub fn is_empty(&self) -> bool {
        self.mapped.size == 0
    }

    /// Copy `out.len()` bytes at `offset` of the buffer into `out`; given up at
    /// `cancel` ([`CopyError::Cancelled`]).
    pub fn read(&self, offset: u64, out: &mut [u8], cancel: &Cancel) -> Result<(), CopyError> {
        self.check(offset, out.len())?;
        for (i, piece) in out.chunks_mut(CHUNK_BYTES).enumerate() {
            let at = self.mapped.va + offset + (i * CHUNK_BYTES) as u64;
            self.engine.with_slot(cancel, |engine, slot| {
                let staging = slot.staging_bo.va;
                engine.copy(slot, self.mapped, at, staging, piece.len(), cancel)?;
                piece.copy_from_slice(slot.staging.bytes(piece.len()));
                Ok(())
            })?;
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), CopyError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.mapped.size => Ok(()),
            _ => Err(CopyError::Other {
                gpu: self.engine.gpu,
                detail: format!(
                    "bytes {offset}..+{len} are outside the {}-byte buffer",
                    self.mapped.size
                ),
            }),
        }
    }
}

impl GpuEngine {
    /// The engine of GPU `gpu` on `node`, with fence waits limited to `timeout`, on
    /// every SDMA ring the GPU offers, or on those of them in `only` when given.
    pub fn new(
        gpu: u32,
        node: Arc<dyn RenderNode>,
        timeout: Duration,
        only: Option<&[u32]>,
    ) -> Result<Arc<GpuEngine>, CopyError> {
        let kernel = |source| CopyError::Kernel { gpu, source };
        let mut info = node.info().map_err(kernel)?;
        if let Some(only) = only {
            info.rings.retain(|r| only.contains(r));
        }
        let enc = CountEncoding::for_sdma_version(info.sdma_major).ok_or(CopyError::Other {
            gpu,
            detail: format!(
                "SDMA {} has no linear copy packet gpucr can encode",
                info.sdma_major
            ),
        })?;
        if info.rings.is_empty() {
            return Err(CopyError::Other {
                gpu,
                detail: "the GPU offers no SDMA ring (of those asked for)".into(),
            });
        }
        let engine = Arc::new(GpuEngine {
            gpu,
            node,
            enc,
            ring_bytes: info.rings.iter().map(|_| AtomicU64::new(0)).collect(),
            rings: info.rings.clone(),
            free: Mutex::new(Vec::new()),
            freed: Condvar::new(),
            next: AtomicUsize::new(0),
            va_next: AtomicU64::new(info.va_start.next_multiple_of(VA_ALIGN)),
            va_end: info.va_end,
            timeout,
        });
        let mut slots = Vec::new();
        for _ in 0..SLOTS_PER_RING {
            for &ring in &info.rings {
                slots.push(Some(engine.slot(ring)?));
            }
        }
        *engine.free.lock().unwrap_or_else(|e| e.into_inner()) = slots;
        Ok(engine)
    }

    /// The SDMA rings used.
    pub fn rings(&self) -> &[u32] {
        &self.rings
    }

    /// Bytes copied on each ring so far, in [`GpuEngine::rings`] order.
    pub fn ring_bytes(&self) -> Vec<u64> {
        self.ring_bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    fn kernel(&self) -> impl Fn(KernelError) -> CopyError + '_ {
        move |source| CopyError::Kernel {
            gpu: self.gpu,
            source,
        }
    }

    /// A GPU VA range of `size` bytes.
    fn alloc_va(&self, size: u64) -> Result<u64, CopyError> {
        let step = size.next_multiple_of(VA_ALIGN);
        let va = self.va_next.fetch_add(step, Ordering::Relaxed);
        if va.checked_add(step).is_none_or(|end| end > self.va_end) {
            return Err(CopyError::Other {
                gpu: self.gpu,
                detail: format!("gpucr's GPU VA space is full ({size} more bytes)"),
            });
        }
        Ok(va)
    }

    fn map(&self, handle: u32, size: u64) -> Result<Mapped, CopyError> {
        let va = match self.alloc_va(size) {
            Ok(va) => va,
            Err(e) => {
                let _ = self.node.close(handle);
                return Err(e);
            }
        };
        if let Err(e) = self.node.va_map(handle, va, size) {
            let _ = self.node.close(handle);
            return Err(self.kernel()(e));
        }
        Ok(Mapped { handle, va, size })
    }

    fn unmap(&self, m: Mapped) -> Result<(), CopyError> {
        let unmapped = self.node.va_unmap(m.handle, m.va, m.size);
        let closed = self.node.close(m.handle);
        unmapped.and(closed).map_err(self.kernel())
    }

    fn slot(&self, ring: u32) -> Result<Slot, CopyError> {
        let staging = AnonChunk::new(CHUNK_BYTES).map_err(|e| CopyError::Other {
            gpu: self.gpu,
            detail: format!("staging memory: {e}"),
        })?;
        // SAFETY: the chunk is owned by the slot, which closes the userptr handle (in
        // `Drop for GpuEngine`) before the chunk is unmapped.
        let handle = unsafe { self.node.userptr(staging.as_mut_ptr(), CHUNK_BYTES as u64) }
            .map_err(self.kernel())?;
        let staging_bo = self.map(handle, CHUNK_BYTES as u64)?;
        let ib_bytes = (sdma::ib_dwords(CHUNK_BYTES.div_ceil(self.enc.max_packet_bytes() as usize))
            * 4)
        .next_multiple_of(4096) as u64;
        let ib_handle = self.node.create_gtt(ib_bytes).map_err(self.kernel())?;
        let ib = self
            .node
            .map_cpu(ib_handle, ib_bytes)
            .inspect_err(|_| {
                let _ = self.node.close(ib_handle);
            })
            .map_err(self.kernel())?;
        let ib_bo = self.map(ib_handle, ib_bytes)?;
        let ctx = self.node.ctx_create().map_err(self.kernel())?;
        Ok(Slot {
            ring,
            ctx,
            staging,
            staging_bo,
            ib,
            ib_bo,
            unsignalled: None,
        })
    }

    /// Import `dmabuf` (`size` bytes) as a device buffer the engine copies.
    pub fn import(
        self: &Arc<Self>,
        dmabuf: std::os::fd::BorrowedFd<'_>,
        size: u64,
    ) -> Result<DeviceBo, CopyError> {
        let handle = self.node.import(dmabuf).map_err(self.kernel())?;
        let mapped = self.map(handle, size)?;
        Ok(DeviceBo {
            engine: self.clone(),
            mapped,
        })
    }

    /// Take a free slot, round-robin across the rings; None when all are taken.
    fn try_take(&self) -> Option<(usize, Slot)> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        Self::pick(&mut free, &self.next)
    }

    /// Take a free slot, waiting for one (the wait ends at `cancel`, looked at every
    /// [`FENCE_SLICE`]: the slots' holders end their own waits at their tokens).
    fn take(&self, cancel: &Cancel) -> Result<(usize, Slot), CopyError> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(taken) = Self::pick(&mut free, &self.next) {
                return Ok(taken);
            }
            cancel.check().map_err(|c| self.cancelled(c))?;
            free = self
                .freed
                .wait_timeout(free, FENCE_SLICE)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn cancelled(&self, c: Cancelled) -> CopyError {
        CopyError::Cancelled {
            gpu: self.gpu,
            reason: c.0,
        }
    }

    /// Make a slot just taken ready for a copy: a copy of it whose fence was not seen
    /// is waited for first (with the time limit, given up at `cancel`).
    fn ready(&self, slot: &mut Slot, cancel: &Cancel) -> Result<(), CopyError> {
        let Some(seq) = slot.unsignalled else {
            return Ok(());
        };
        match self.wait_fence(slot, seq, cancel)? {
            Fence::Signalled => {
                slot.unsignalled = None;
                Ok(())
            }
            Fence::TimedOut => Err(CopyError::FenceTimeout {
                gpu: self.gpu,
                ring: slot.ring,
                seq,
                timeout: self.timeout,
            }),
            Fence::Cancelled(c) => Err(self.cancelled(c)),
        }
    }

    fn pick(free: &mut [Option<Slot>], next: &AtomicUsize) -> Option<(usize, Slot)> {
        let n = free.len();
        let start = next.fetch_add(1, Ordering::Relaxed);
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| free[i].is_some())?;
        Some((i, free[i].take().expect("checked")))
    }

    fn put_back(&self, index: usize, slot: Slot) {
        self.free.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(slot);
        self.freed.notify_one();
    }

    /// Run `f` with a free slot, taken round-robin across the rings.
    fn with_slot<R>(
        &self,
        cancel: &Cancel,
        f: impl FnOnce(&Self, &mut Slot) -> Result<R, CopyError>,
    ) -> Result<R, CopyError> {
        let (index, mut slot) = self.take(cancel)?;
        let result = self
            .ready(&mut slot, cancel)
            .and_then(|()| f(self, &mut slot));
        self.put_back(index, slot);
        result
    }

    /// Copy `len` bytes from GPU VA `src` to `dst` (one of them the slot's staging
    /// chunk, the other in `bo`) on the slot's ring, and wait for the fence; nothing is
    /// submitted once `cancel` is cancelled, and the wait ends at it.
    fn copy(
        &self,
        slot: &mut Slot,
        bo: Mapped,
        src: u64,
        dst: u64,
        len: usize,
        cancel: &Cancel,
    ) -> Result<(), CopyError> {
        cancel.check().map_err(|c| self.cancelled(c))?;
        let submitted = self.submit(slot, bo, src, dst, len)?;
        self.finish(slot, submitted, cancel)
    }

    /// Write the copy's packets into the slot's IB and submit it on the slot's ring.
    fn submit(
        &self,
        slot: &mut Slot,
        bo: Mapped,
        src: u64,
        dst: u64,
        len: usize,
    ) -> Result<Submitted, CopyError> {
        let mut ib = Vec::with_capacity(slot.ib.len() / 4);
        sdma::emit_copy(&mut ib, self.enc, src, dst, len as u64).map_err(|e| CopyError::Other {
            gpu: self.gpu,
            detail: e.to_string(),
        })?;
        sdma::pad_ib(&mut ib);
        for (dst, word) in slot.ib.chunks_exact_mut(4).zip(&ib) {
            dst.copy_from_slice(&word.to_le_bytes());
        }
        let list = self
            .node
            .bo_list(&[bo.handle, slot.staging_bo.handle, slot.ib_bo.handle])
            .map_err(self.kernel())?;
        match self
            .node
            .submit(slot.ctx, list, slot.ring, slot.ib_bo.va, ib.len() as u32)
        {
            Ok(seq) => Ok(Submitted { seq, list, len }),
            Err(e) => {
                let _ = self.node.bo_list_destroy(list);
                Err(self.kernel()(e))
            }
        }
    }

    /// Wait for submission `seq` on the slot's ring: slices of the kernel's own fence
    /// wait ([`FENCE_SLICE`]), `cancel` looked at between them, within the engine's time
    /// limit.
    fn wait_fence(&self, slot: &Slot, seq: u64, cancel: &Cancel) -> Result<Fence, CopyError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(FENCE_SLICE);
            let signalled = self
                .node
                .wait(slot.ctx, slot.ring, seq, slice)
                .map_err(self.kernel())?;
            if signalled {
                return Ok(Fence::Signalled);
            }
            if left <= slice {
                return Ok(Fence::TimedOut);
            }
            if let Err(c) = cancel.check() {
                return Ok(Fence::Cancelled(c));
            }
        }
    }

    /// Wait for a submitted copy's fence (with the time limit, given up at `cancel`)
    /// and release its BO list.
    fn finish(
        &self,
        slot: &mut Slot,
        submitted: Submitted,
        cancel: &Cancel,
    ) -> Result<(), CopyError> {
        let waited = self.wait_fence(slot, submitted.seq, cancel);
        if !matches!(waited, Ok(Fence::Signalled)) {
            // The copy may still run: the slot is not used again before it ended.
            slot.unsignalled = Some(submitted.seq);
        }
        let destroyed = self
            .node
            .bo_list_destroy(submitted.list)
            .map_err(self.kernel());
        match waited? {
            Fence::Signalled => {}
            Fence::TimedOut => {
                return Err(CopyError::FenceTimeout {
                    gpu: self.gpu,
                    ring: slot.ring,
                    seq: submitted.seq,
                    timeout: self.timeout,
                })
            }
            Fence::Cancelled(c) => return Err(self.cancelled(c)),
        }
        destroyed?;
        if let Some(i) = self.rings.iter().position(|&r| r == slot.ring) {
            self.ring_bytes[i].fetch_add(submitted.len as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A copy on its way: its sequence number, BO list and size.
#[derive(Debug, Clone, Copy)]
struct Submitted {
    seq: u64,
    list: u32,
    len: usize,
}

/// The write a thread left running on the engine: its slot is held until the thread's
/// next write (or the end of the buffer) waits for it.
struct InFlight {
    engine: Arc<GpuEngine>,
    index: usize,
    slot: Option<Slot>,
    submitted: Submitted,
    /// The token of the write that submitted it, for a wait at the thread's end.
    cancel: Cancel,
}

impl InFlight {
    /// Wait for the write (given up at `cancel`) and give the slot back.
    fn complete(mut self, cancel: &Cancel) -> Result<(), CopyError> {
        let mut slot = self.slot.take().expect("a slot until completed");
        let result = self.engine.finish(&mut slot, self.submitted, cancel);
        self.engine.put_back(self.index, slot);
        result
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A thread that ends with a write in flight (after a failure elsewhere) still
        // waits for it, unless its write was cancelled; a slot whose fence was not seen
        // is waited for before its staging memory is reused.
        if let Some(mut slot) = self.slot.take() {
            let _ = self.engine.finish(&mut slot, self.submitted, &self.cancel);
            self.engine.put_back(self.index, slot);
        }
    }
}

thread_local! {
    /// The write this thread has running on an SDMA engine (restore writer threads
    /// write one queue each, in order).
    static IN_FLIGHT: std::cell::RefCell<Option<InFlight>> = const { std::cell::RefCell::new(None) };
}

/// Wait for this thread's write in flight, if any (given up at `cancel`).
fn drain_thread(cancel: &Cancel) -> Result<(), CopyError> {
    match IN_FLIGHT.with(|f| f.borrow_mut().take()) {
        Some(prev) => prev.complete(cancel),
        None => Ok(()),
    }
}

impl DeviceBo {
    /// Copy `data` to `offset` of the buffer, double buffered: the copy is submitted and
    /// left running while the caller prepares its next write, whose slot (of the other
    /// ring, or the ring's other slot) is filled meanwhile; the write before is waited
    /// for then. With `last`, every write of this thread is waited for before returning
    /// (the buffer is complete when the call returns). Given up at `cancel`: nothing
    /// more is submitted, and the waits end at it.
    pub fn write_behind(
        &self,
        offset: u64,
        data: &[u8],
        last: bool,
        cancel: &Cancel,
    ) -> Result<(), CopyError> {
        self.check(offset, data.len())?;
        for (i, piece) in data.chunks(CHUNK_BYTES).enumerate() {
            let at = self.mapped.va + offset + (i * CHUNK_BYTES) as u64;
            cancel.check().map_err(|c| self.engine.cancelled(c))?;
            let (index, mut slot) = match self.engine.try_take() {
                Some(taken) => taken,
                None => {
                    drain_thread(cancel)?;
                    self.engine.take(cancel)?
                }
            };
            if let Err(e) = self.engine.ready(&mut slot, cancel) {
                self.engine.put_back(index, slot);
                return Err(e);
            }
            slot.staging.bytes(piece.len()).copy_from_slice(piece);
            let va = slot.staging_bo.va;
            let submitted = match self
                .engine
                .submit(&mut slot, self.mapped, va, at, piece.len())
            {
                Ok(s) => s,
                Err(e) => {
                    self.engine.put_back(index, slot);
                    return Err(e);
                }
            };
            let now = InFlight {
                engine: self.engine.clone(),
                index,
                slot: Some(slot),
                submitted,
                cancel: cancel.clone(),
            };
            if let Some(prev) = IN_FLIGHT.with(|f| f.borrow_mut().replace(now)) {
                prev.complete(cancel)?;
            }
        }
        if last {
            drain_thread(cancel)?;
        }
        Ok(())
    }
}

impl Drop for GpuEngine {
    fn drop(&mut self) {
        let slots = std::mem::take(self.free.get_mut().unwrap_or_else(|e| e.into_inner()));
        for slot in slots.into_iter().flatten() {
            // A copy given up (`unsignalled`) may still run: not waited for here, as
            // nothing of gpucr's uses its staging chunk again, and the kernel keeps a
            // userptr buffer's pages until its jobs are done.
            let _ = self.node.ctx_free(slot.ctx);
            let _ = self.unmap(slot.ib_bo);
            let _ = self.unmap(slot.staging_bo);
            // The chunk is unmapped after its userptr handle is closed.
            drop(slot.staging);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use gpucr_amdgpu::fake::{BoSpec, FakeGpu, FakeKernel, FakeTask};

    use super::*;

    const GPU: u32 = 0x1000;
    const SIZE: u64 = 1 << 20;

    /// A fake GPU's engine (fence waits limited to 30 s), a process holding one VRAM
    /// buffer of `SIZE` bytes, and that buffer imported for the engine.
    fn engine_and_buffer() -> (Arc<FakeKernel>, FakeTask, DeviceBo) {
        let kernel = FakeKernel::new(vec![FakeGpu::new(GPU, 128)]);
        let task = kernel.spawn_process(&[GPU], &[BoSpec::vram(GPU, SIZE)], 0);
        let kfd = kernel.kfd(std::process::id() as i32);
        let info = kfd.process_info(task.kfd.as_fd()).unwrap();
        let checkpoint = kfd.checkpoint(task.kfd.as_fd(), &info).unwrap();
        let dmabuf = checkpoint.dmabufs[0].as_ref().unwrap();
        let node = kernel.drm().open(128).unwrap();
        let engine = GpuEngine::new(GPU, node, Duration::from_secs(30), None).unwrap();
        let bo = engine.import(dmabuf.as_fd(), SIZE).unwrap();
        (kernel, task, bo)
    }

    /// `cancel` cancelled 100 ms from now, on a thread of its own.
    fn cancel_soon(cancel: &Cancel) -> std::thread::JoinHandle<()> {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            cancel.cancel("the transfer failed");
        })
    }

    fn assert_cancelled(result: Result<(), CopyError>, started: Instant) {
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "the copy ended {took:?} after it began, not at its cancellation"
        );
        match result {
            Err(e @ CopyError::Cancelled { .. }) => {
                assert_eq!(
                    std::io::Error::from(e).kind(),
                    std::io::ErrorKind::Interrupted
                );
            }
            other => panic!("not a cancelled copy: {other:?}"),
        }
    }

    /// A hung copy engine (fences that never signal): a read and a write whose token is
    /// cancelled end within a second with a cancelled error, not after the 30 s fence
    /// timeout; once the engine is back, the slots left with those copies are usable.
    #[test]
    fn a_cancelled_copy_ends_at_once_on_a_hung_engine() {
        let (kernel, _task, bo) = engine_and_buffer();
        kernel.stall_fences(true);

        let cancel = Cancel::new();
        let canceller = cancel_soon(&cancel);
        let mut out = vec![0u8; 4096];
        let started = Instant::now();
        assert_cancelled(bo.read(0, &mut out, &cancel), started);
        canceller.join().unwrap();

        let cancel = Cancel::new();
        let canceller = cancel_soon(&cancel);
        let started = Instant::now();
        assert_cancelled(bo.write_behind(0, &[7u8; 4096], true, &cancel), started);
        canceller.join().unwrap();

        // Cancelled before: nothing is submitted.
        let submits = |k: &FakeKernel| k.log().iter().filter(|l| l.contains("CS ring")).count();
        let before = submits(&kernel);
        let started = Instant::now();
        assert_cancelled(bo.read(0, &mut out, &cancel), started);
        assert_cancelled(bo.write_behind(0, &[7u8; 4096], true, &cancel), started);
        assert_eq!(submits(&kernel), before, "a cancelled copy was submitted");

        kernel.stall_fences(false);
        let fresh = Cancel::new();
        bo.write_behind(0, &[9u8; 4096], true, &fresh).unwrap();
        bo.read(0, &mut out, &fresh).unwrap();
        assert!(out.iter().all(|&b| b == 9));
    }
}
