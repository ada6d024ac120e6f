//! A "GPU program" for gpucr's simulator: device contexts with buffers on several
//! simulated GPUs, "kernels" updating them deterministically, a child process with its
//! own device, and a verify mode that proves every byte of every buffer is what it must
//! be after a restore.
//!
//! Run it as the init of its own PID namespace, with the sim root in the environment:
//!   GPUCR_SIM_ROOT=/dev/shm/sim unshare --pid --fork setsid sim_workload --state DIR
//!
//! Options: --state DIR (required), --gpus N (default 3; creates the sim topology when
//! the root has none), --use-gpus N (default: all; the buffers go on the topology's first
//! N GPUs only), --parent-mib N (default 768), --child-mib N (default 320, 0: no
//! child), --children N (default 1: how many children, "child", "child2", ...; each gets
//! --child-mib), --cpu-mib N (each process also holds N MiB of ordinary anonymous memory,
//! which CRIU carries), --cpu-bounds own|parent (default own: each process maps that memory
//! at bounds of its own; parent: every process maps it at the same address, which CRIU
//! takes for memory a child may share with its parent copy-on-write), --max-buffer-mib N (default 1024: the largest buffer), --fill
//! mixed|random (default mixed: random, compressible and zeroed buffers; random: every
//! buffer random), --hold PATH (the parent also keeps PATH open, e.g. a device CRIU
//! cannot dump), --driver kfd|nvidia (default kfd: gpucr copies device memory; nvidia:
//! the process's own driver moves it into process memory and back on request, through
//! a restore thread named `simgpu-rst`, as CUDA's checkpoint API does), --zombies N
//! (default 0: children of the parent that exit at once and are never reaped),
//! --hold-request-ms N (default 0; tests: the restore thread keeps the request file of
//! its mailbox open N ms each time it reads it).
//!
//! The parent forks the child first (as GPU programs fork before initialising the
//! device), then each opens its own device and allocates buffers of mixed sizes (4 KiB up
//! to 1 GiB) round-robin over the GPUs: random data, compressible data, and buffers that
//! start zeroed. One kernel thread per GPU rewrites one 4 KiB page of each of its buffers
//! every 20 ms: page `s % pages` of step `s` gets generation `s / pages + 1`, so a
//! buffer's whole content follows from its step counter, which lives in CPU memory
//! (carried by CRIU) while the buffer lives in device memory (carried by gpucr).
//!
//! Each process appends `tick=N steps=S verified=V bad=B` to `DIR/journal-<role>` every
//! 100 ms. Writing a number to `DIR/verify` asks every process to check every byte; when
//! all buffers match, `verified` becomes that number. Any mismatch sets `bad=1` (and the
//! offending buffer and page are written to `DIR/bad-<role>`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use gpucr::gpu::sim::client::{MappedBuffer, SimDevice};
use gpucr::gpu::sim::{SimRoot, DEFAULT_DEVICE, ENV_DEVICE};
use gpucr_abi::sim::{
    DRIVER_FAIL_FILE, DRIVER_NVIDIA, DRIVER_REQUEST_FILE, DRIVER_STATE_FILE, RESTORE_THREAD,
};
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// The `nvidia` driver model: while set, the kernels park (a driver lock).
static LOCKED: AtomicBool = AtomicBool::new(false);
/// Kernels parked by the lock.
static PARKED: AtomicUsize = AtomicUsize::new(0);
/// `--hold-request-ms`: how long the restore thread keeps the request file open each
/// time it reads it (a test's way to make a freeze find it open, were it open then).
static HOLD_REQUEST_MS: AtomicU64 = AtomicU64::new(0);

const PAGE: usize = 4096;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

struct Options {
    state: PathBuf,
    gpus: usize,
    use_gpus: Option<usize>,
    parent_mib: u64,
    child_mib: u64,
    children: usize,
    cpu_mib: u64,
    cpu_bounds: CpuBounds,
    max_buffer_mib: u64,
    random: bool,
    hold: Vec<PathBuf>,
    driver: String,
    zombies: u64,
    hold_request_ms: u64,
}

fn parse_args() -> Options {
    let mut opts = Options {
        state: PathBuf::new(),
        gpus: 3,
        use_gpus: None,
        parent_mib: 768,
        child_mib: 320,
        children: 1,
        cpu_mib: 0,
        cpu_bounds: CpuBounds::Own,
        max_buffer_mib: 1024,
        random: false,
        hold: Vec::new(),
        driver: String::new(),
        zombies: 0,
        hold_request_ms: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{arg} needs a value")))
        };
        let number = |v: String| {
            v.parse::<u64>()
                .unwrap_or_else(|_| die(&format!("bad number {v:?}")))
        };
        match arg.as_str() {
            "--state" => opts.state = PathBuf::from(value()),
            "--gpus" => opts.gpus = number(value()) as usize,
            "--use-gpus" => opts.use_gpus = Some(number(value()) as usize),
            "--parent-mib" => opts.parent_mib = number(value()),
            "--child-mib" => opts.child_mib = number(value()),
            "--hold" => opts.hold.push(PathBuf::from(value())),
            "--zombies" => opts.zombies = number(value()),
            "--hold-request-ms" => opts.hold_request_ms = number(value()),
            "--children" => opts.children = number(value()) as usize,
            "--cpu-mib" => opts.cpu_mib = number(value()),
            "--cpu-bounds" => match value().as_str() {
                "own" => opts.cpu_bounds = CpuBounds::Own,
                "parent" => opts.cpu_bounds = CpuBounds::Parent,
                other => die(&format!("--cpu-bounds takes own or parent, not {other:?}")),
            },
            "--max-buffer-mib" => opts.max_buffer_mib = number(value()).max(1),
            "--driver" => match value().as_str() {
                "kfd" => opts.driver = String::new(),
                "nvidia" => opts.driver = DRIVER_NVIDIA.to_owned(),
                other => die(&format!("--driver takes kfd or nvidia, not {other:?}")),
            },
            "--fill" => match value().as_str() {
                "mixed" => opts.random = false,
                "random" => opts.random = true,
                other => die(&format!("--fill takes mixed or random, not {other:?}")),
            },
            _ => die(&format!("unknown argument {arg}")),
        }
    }
    if opts.state.as_os_str().is_empty() {
        die("--state DIR is required");
    }
    if opts.gpus == 0 || opts.use_gpus == Some(0) {
        die("--gpus and --use-gpus must be at least 1");
    }
    opts
}

/// Where each process of the tree maps its CPU memory (`--cpu-bounds`).
#[derive(Clone, Copy, PartialEq)]
enum CpuBounds {
    /// At bounds no other process of the tree uses.
    Own,
    /// Every process at the same address and size. CRIU takes a child's private mapping
    /// with its parent's exact bounds for memory the two may share copy-on-write: it
    /// reads such memory page by page, comparing it with the parent's, while it sets up
    /// the tasks' mappings and before it restores any file, instead of in each task's
    /// restorer afterwards. A tree whose children allocate the same sizes after the fork
    /// can look like this by chance (two mappings merging or not decides it).
    Parent,
}

/// Where the tree's CPU memory mappings start: below where the kernel places mappings
/// and above where the heap grows.
const CPU_MEMORY_BASE: usize = 0x4000_0000_0000;

/// Maps `mib` MiB of anonymous memory for process `index` of the tree (0: the parent),
/// placed as `bounds` says, and fills it with data of that process's own (pseudo-random:
/// it does not compress). The mapping lives as long as the process.
fn cpu_memory(mib: u64, index: usize, bounds: CpuBounds) -> &'static mut [u64] {
    if mib == 0 {
        return &mut [];
    }
    let len = (mib * MIB) as usize;
    let slot = match bounds {
        CpuBounds::Own => index,
        CpuBounds::Parent => 0,
    };
    // A gap of 1 GiB between the processes' mappings keeps them from touching.
    let address = CPU_MEMORY_BASE + slot * (len + (1 << 30));
    // SAFETY: a new private anonymous mapping; MAP_FIXED_NOREPLACE fails instead of
    // replacing anything already mapped there.
    let mapped = unsafe {
        nix::sys::mman::mmap_anonymous(
            std::num::NonZeroUsize::new(address),
            std::num::NonZeroUsize::new(len).expect("mib > 0"),
            nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
            nix::sys::mman::MapFlags::MAP_PRIVATE | nix::sys::mman::MapFlags::MAP_FIXED_NOREPLACE,
        )
    }
    .unwrap_or_else(|e| {
        die(&format!(
            "mapping {mib} MiB of CPU memory at {address:#x}: {e}"
        ))
    });
    // SAFETY: the mapping is `len` bytes, readable and writable, page-aligned (so aligned
    // for u64), never unmapped, and this is the only reference to it.
    let words = unsafe { std::slice::from_raw_parts_mut(mapped.as_ptr().cast::<u64>(), len / 8) };
    let mut x = cpu_seed(index, mib);
    for w in words.iter_mut() {
        x = splitmix(x);
        *w = x;
    }
    words
}

fn cpu_seed(index: usize, mib: u64) -> u64 {
    0x1234_5678_u64 ^ ((index as u64) << 32) ^ mib
}

/// Whether the CPU memory still holds what [`cpu_memory`] wrote into it (it is only
/// read after that), word by word.
fn cpu_memory_intact(words: &[u64], index: usize, mib: u64) -> bool {
    let mut x = cpu_seed(index, mib);
    words.iter().all(|&w| {
        x = splitmix(x);
        w == x
    })
}

fn die(msg: &str) -> ! {
    eprintln!("sim_workload: {msg}");
    exit(2)
}

/// What buffers a process allocates.
struct Layout {
    bytes: u64,
    max_buffer: u64,
    random: bool,
}

/// How a buffer starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    Random,
    Compressible,
    Zero,
}

struct Buffer {
    id: u64,
    fill: Fill,
    mem: MappedBuffer,
    steps: AtomicU64,
}

impl Buffer {
    fn pages(&self) -> u64 {
        (self.mem.len() / PAGE) as u64
    }

    /// The generation page `p` has after `steps` steps.
    fn generation(&self, p: u64, steps: u64) -> u64 {
        let pages = self.pages();
        steps / pages + u64::from(p < steps % pages)
    }
}

/// The content of page `p` of buffer `id` at generation `g`, into `out`.
fn page_content(id: u64, fill: Fill, p: u64, g: u64, out: &mut [u8]) {
    if g == 0 && fill == Fill::Zero {
        out.fill(0);
        return;
    }
    let seed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ p.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ g;
    if fill == Fill::Compressible && g == 0 {
        // Text-like: a short line repeated, different per page.
        let line = format!("buffer {id} page {p} generation {g} seed {seed:x}\n");
        for (i, b) in out.iter_mut().enumerate() {
            *b = line.as_bytes()[i % line.len()];
        }
        return;
    }
    let mut x = seed;
    for word in out.chunks_mut(8) {
        x = splitmix(x);
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Buffer sizes adding up to `total` bytes: small ones first, then big ones of at most
/// `max_buffer` bytes.
fn buffer_sizes(total: u64, max_buffer: u64) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut left = total;
    for small in [4 * KIB, 64 * KIB, MIB, 16 * MIB] {
        if left >= small {
            sizes.push(small);
            left -= small;
        }
    }
    while left >= PAGE as u64 {
        let size = left.min(max_buffer) / PAGE as u64 * PAGE as u64;
        sizes.push(size);
        left -= size;
    }
    sizes
}

fn main() {
    let opts = parse_args();
    HOLD_REQUEST_MS.store(opts.hold_request_ms, Ordering::SeqCst);
    let root = SimRoot::from_env().unwrap_or_else(|| die("GPUCR_SIM_ROOT is not set"));
    let device_path = std::env::var_os(ENV_DEVICE)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE));
    fs::create_dir_all(&opts.state).unwrap_or_else(|e| die(&format!("state dir: {e}")));
    let mut gpu_ids = root
        .ensure_topology(opts.gpus)
        .unwrap_or_else(|e| die(&e.to_string()));
    gpu_ids.truncate(opts.use_gpus.unwrap_or(usize::MAX));

    let mut role = "parent".to_owned();
    let mut index = 0;
    let mut mib = opts.parent_mib;
    let children = if opts.child_mib > 0 { opts.children } else { 0 };
    for n in 1..=children {
        // SAFETY: no thread has been started yet, so the child is a copy of a
        // single-threaded process.
        match unsafe { nix::unistd::fork() }.unwrap_or_else(|e| die(&format!("fork: {e}"))) {
            nix::unistd::ForkResult::Child => {
                let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
                role = if n == 1 {
                    "child".to_owned()
                } else {
                    format!("child{n}")
                };
                mib = opts.child_mib;
                index = n;
                break;
            }
            nix::unistd::ForkResult::Parent { .. } => {}
        }
    }
    if role == "parent" {
        for _ in 0..opts.zombies {
            // SAFETY: as above; the child only exits.
            match unsafe { nix::unistd::fork() }.unwrap_or_else(|e| die(&format!("fork: {e}"))) {
                // SAFETY: _exit is async-signal-safe and ends the child at once.
                nix::unistd::ForkResult::Child => unsafe { nix::libc::_exit(0) },
                nix::unistd::ForkResult::Parent { .. } => {}
            }
        }
    }
    // Ordinary process memory, for CRIU to carry.
    let cpu = CpuMemory {
        words: cpu_memory(opts.cpu_mib, index, opts.cpu_bounds),
        index,
        mib: opts.cpu_mib,
    };
    let _ = nix::sys::prctl::set_name(&std::ffi::CString::new(format!("simgpu-{role}")).unwrap());
    let _held: Vec<fs::File> = if role == "parent" {
        opts.hold
            .iter()
            .map(|p| fs::File::open(p).unwrap_or_else(|e| die(&format!("{}: {e}", p.display()))))
            .collect()
    } else {
        Vec::new()
    };
    let layout = Layout {
        bytes: mib * MIB,
        max_buffer: opts.max_buffer_mib * MIB,
        random: opts.random,
    };
    run(
        &opts.state,
        &role,
        &root,
        &device_path,
        &gpu_ids,
        layout,
        (&opts.driver, &cpu),
    );
}

/// A process's ordinary memory and what it was filled from, checked with its buffers.
struct CpuMemory {
    words: &'static mut [u64],
    index: usize,
    mib: u64,
}

fn run(
    state: &Path,
    role: &str,
    root: &SimRoot,
    device_path: &Path,
    gpu_ids: &[u32],
    layout: Layout,
    (driver, cpu): (&str, &CpuMemory),
) -> ! {
    let host_pid = fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        .unwrap_or(0);
    let mut device =
        SimDevice::open_with_driver(root, device_path, &format!("{role}-{host_pid}"), driver)
            .unwrap_or_else(|e| die(&e.to_string()));
    let mut all: Vec<(PathBuf, Arc<Buffer>)> = Vec::new();
    let role_id: u64 = if role == "parent" { 0 } else { 1000 };
    let mut per_gpu: Vec<Vec<Arc<Buffer>>> = vec![Vec::new(); gpu_ids.len()];
    for (i, size) in buffer_sizes(layout.bytes, layout.max_buffer)
        .into_iter()
        .enumerate()
    {
        let gpu = i % gpu_ids.len();
        let fill = if layout.random {
            Fill::Random
        } else {
            [Fill::Random, Fill::Compressible, Fill::Zero][i % 3]
        };
        let kind = if i % 4 == 3 { "gtt" } else { "vram" };
        let mut mem = device
            .alloc(&format!("buf{i}"), gpu_ids[gpu], size, kind)
            .unwrap_or_else(|e| die(&e.to_string()));
        let id = role_id + i as u64;
        if fill != Fill::Zero {
            for (p, page) in mem.as_mut_slice().chunks_mut(PAGE).enumerate() {
                page_content(id, fill, p as u64, 0, page);
            }
        }
        let buffer = Arc::new(Buffer {
            id,
            fill,
            mem,
            steps: AtomicU64::new(0),
        });
        all.push((device.dir().join(format!("buf{i}")), buffer.clone()));
        per_gpu[gpu].push(buffer);
    }
    let kernels = per_gpu.len();
    if driver == DRIVER_NVIDIA {
        let dir = device.dir().to_path_buf();
        thread::Builder::new()
            .name(RESTORE_THREAD.into())
            .spawn(move || driver_thread(&dir, &all, kernels))
            .unwrap_or_else(|e| die(&format!("restore thread: {e}")));
    }

    let verify_request = Arc::new(AtomicU64::new(0));
    let verified = Arc::new(Mutex::new(vec![0u64; per_gpu.len()]));
    let bad = Arc::new(AtomicU64::new(0));
    let total_steps = Arc::new(AtomicU64::new(0));
    for (g, buffers) in per_gpu.into_iter().enumerate() {
        let (request, verified, bad, steps) = (
            verify_request.clone(),
            verified.clone(),
            bad.clone(),
            total_steps.clone(),
        );
        let bad_file = state.join(format!("bad-{role}"));
        thread::spawn(move || kernel(g, &buffers, &request, &verified, &bad, &steps, &bad_file));
    }

    let journal_path = state.join(format!("journal-{role}"));
    let mut journal = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&journal_path)
        .unwrap_or_else(|e| die(&format!("{}: {e}", journal_path.display())));
    fs::write(state.join(format!("ready-{role}")), b"ready\n")
        .unwrap_or_else(|e| die(&e.to_string()));
    let mut tick = 0u64;
    // The CPU memory's last verified request (its own check, beside the kernels').
    let mut cpu_verified = 0u64;
    loop {
        tick += 1;
        if let Some(n) = fs::read_to_string(state.join("verify"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            verify_request.fetch_max(n, Ordering::SeqCst);
        }
        let wanted = verify_request.load(Ordering::SeqCst);
        if wanted > cpu_verified {
            if cpu_memory_intact(cpu.words, cpu.index, cpu.mib) {
                cpu_verified = wanted;
            } else {
                let _ = fs::write(
                    state.join(format!("bad-{role}")),
                    format!("CPU memory ({} MiB) differs\n", cpu.mib),
                );
                bad.store(1, Ordering::SeqCst);
            }
        }
        let done = verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .min()
            .unwrap_or(0)
            .min(cpu_verified);
        let line = format!(
            "tick={tick} steps={} verified={done} bad={}\n",
            total_steps.load(Ordering::SeqCst),
            bad.load(Ordering::SeqCst)
        );
        if journal.write_all(line.as_bytes()).is_err() {
            exit(3);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// One GPU: step every buffer it owns every 20 ms; verify all of them on request.
fn kernel(
    gpu: usize,
    buffers: &[Arc<Buffer>],
    request: &AtomicU64,
    verified: &Mutex<Vec<u64>>,
    bad: &AtomicU64,
    steps: &AtomicU64,
    bad_file: &Path,
) {
    let mut page = vec![0u8; PAGE];
    loop {
        if LOCKED.load(Ordering::SeqCst) {
            PARKED.fetch_add(1, Ordering::SeqCst);
            while LOCKED.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(2));
            }
            PARKED.fetch_sub(1, Ordering::SeqCst);
        }
        let wanted = request.load(Ordering::SeqCst);
        let have = verified.lock().unwrap_or_else(|e| e.into_inner())[gpu];
        if wanted > have {
            let ok = buffers.iter().all(|b| verify(b, bad_file));
            if ok {
                verified.lock().unwrap_or_else(|e| e.into_inner())[gpu] = wanted;
            } else {
                bad.store(1, Ordering::SeqCst);
            }
        }
        for b in buffers {
            let s = b.steps.load(Ordering::SeqCst);
            let p = s % b.pages();
            page_content(b.id, b.fill, p, b.generation(p, s + 1), &mut page);
            let offset = p as usize * PAGE;
            // SAFETY: only this thread writes this buffer, and nothing holds a slice of
            // it across this write; the mapping lives as long as `b`.
            let mem = unsafe {
                std::slice::from_raw_parts_mut(
                    b.mem.as_slice().as_ptr().cast_mut().add(offset),
                    PAGE,
                )
            };
            mem.copy_from_slice(&page);
            b.steps.store(s + 1, Ordering::SeqCst);
            steps.fetch_add(1, Ordering::SeqCst);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The `nvidia` driver's restore thread: answers the requests gpucr's half writes into
/// the context's mailbox (lock, checkpoint, restore, unlock). It runs while the tree is
/// frozen only when CRIU's plugin lets it. An operation named in the sim root's
/// `driver-fail` file is answered with an error and changes nothing. It looks at the
/// mailbox again at once after an answer, every 2 ms otherwise, and holds none of its
/// files open in between ([`new_request`]).
fn driver_thread(dir: &Path, buffers: &[(PathBuf, Arc<Buffer>)], kernels: usize) {
    let request = dir.join(DRIVER_REQUEST_FILE);
    let mut last = 0u64;
    let mut seen = None;
    loop {
        let Some((seq, op)) = new_request(&request, &mut seen)
            .and_then(|t| {
                let (seq, op) = t.trim().split_once(' ')?;
                Some((seq.parse::<u64>().ok()?, op.to_owned()))
            })
            .filter(|(seq, _)| *seq > last)
        else {
            thread::sleep(Duration::from_millis(2));
            continue;
        };
        last = seq;
        // The context is ROOT/contexts/CTX.
        let root = dir.parent().and_then(Path::parent).unwrap_or(dir);
        let failing = fs::read_to_string(root.join(DRIVER_FAIL_FILE))
            .is_ok_and(|names| names.split_whitespace().any(|name| name == op));
        let state = match op.as_str() {
            _ if failing => Err(std::io::Error::other(format!("{op} failed (injected)"))),
            "lock" => {
                LOCKED.store(true, Ordering::SeqCst);
                while PARKED.load(Ordering::SeqCst) < kernels {
                    thread::sleep(Duration::from_millis(1));
                }
                Ok("locked")
            }
            "checkpoint" if LOCKED.load(Ordering::SeqCst) => buffers
                .iter()
                .try_for_each(|(path, b)| b.mem.move_to_host(path))
                .map(|()| "checkpointed"),
            "restore" => buffers
                .iter()
                .try_for_each(|(path, b)| b.mem.move_to_device(path))
                .map(|()| "locked"),
            // Whatever was done, undone: the memory back on the device (when it is in
            // the process), then unlocked.
            "resume" => buffers
                .iter()
                .filter(|(path, _)| !path.exists())
                .try_for_each(|(path, b)| b.mem.move_to_device(path))
                .map(|()| {
                    LOCKED.store(false, Ordering::SeqCst);
                    "running"
                }),
            "unlock" => {
                LOCKED.store(false, Ordering::SeqCst);
                Ok("running")
            }
            other => Err(std::io::Error::other(format!(
                "cannot {other} in this state"
            ))),
        };
        let answer = match state {
            Ok(state) => format!("{seq} {state}\n"),
            Err(e) => format!("{seq} error: {e}\n"),
        };
        let tmp = dir.join(format!("{DRIVER_STATE_FILE}.tmp"));
        if fs::write(&tmp, answer).is_ok() {
            let _ = fs::rename(&tmp, dir.join(DRIVER_STATE_FILE));
        }
    }
}

/// One request file: gpucr's side writes each request into a new file and renames it
/// into place, so another request is another file (inode, or times).
#[derive(Clone, Copy, PartialEq, Eq)]
struct RequestFile {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl RequestFile {
    fn of(meta: &fs::Metadata) -> RequestFile {
        use std::os::unix::fs::MetadataExt;
        RequestFile {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The request file's text when it is another file than the one read last (`seen`).
///
/// The mailbox is device state, which a real driver keeps in the device: the thread must
/// never be frozen with the file open, or CRIU dumps that fd as a file of the process and
/// cannot reopen it on a machine whose device memory (the context directory) is gone.
/// So it is watched without an fd (stat), and opened only for a request gpucr's side
/// has just posted and waits for the answer of: the file is closed before that answer,
/// and nothing new comes before gpucr has it, so neither the freeze (after the lock's
/// answer) nor the stop after the checkpoint finds it open. (`--hold-request-ms` keeps
/// it open that long at each read, to show it.)
fn new_request(path: &Path, seen: &mut Option<RequestFile>) -> Option<String> {
    let now = RequestFile::of(&fs::metadata(path).ok()?);
    if *seen == Some(now) {
        return None;
    }
    let mut file = fs::File::open(path).ok()?;
    // What was opened, which may be newer than what was looked at.
    let opened = RequestFile::of(&file.metadata().ok()?);
    let mut text = String::new();
    let read = std::io::Read::read_to_string(&mut file, &mut text);
    thread::sleep(Duration::from_millis(
        HOLD_REQUEST_MS.load(Ordering::SeqCst),
    ));
    drop(file);
    read.ok()?;
    *seen = Some(opened);
    Some(text)
}

/// Check every page of `b` against its step counter. The page of the step in flight when
/// the process was frozen may already hold the next generation.
fn verify(b: &Buffer, bad_file: &Path) -> bool {
    let s = b.steps.load(Ordering::SeqCst);
    let mut expected = vec![0u8; PAGE];
    for (p, actual) in b.mem.as_slice().chunks(PAGE).enumerate() {
        let p = p as u64;
        let g = b.generation(p, s);
        page_content(b.id, b.fill, p, g, &mut expected);
        if actual == expected.as_slice() {
            continue;
        }
        if p == s % b.pages() {
            page_content(b.id, b.fill, p, g + 1, &mut expected);
            if actual == expected.as_slice() {
                continue;
            }
        }
        let _ = fs::write(
            bad_file,
            format!("buffer {} page {p} (steps {s}) differs\n", b.id),
        );
        return false;
    }
    true
}
