//! A CUDA program for gpucr's cuda backend: device memory on every GPU, a "kernel" loop
//! updating it deterministically from a step counter in host memory, child processes,
//! and a verify mode that checks every byte after a restore. It uses only
//! `gpucr-cuda-driver`'s application side, so it runs on a real driver and on the fake
//! (`GPUCR_CUDA_LIBRARY=.../libgpucr_fake_cuda.so GPUCR_FAKE_CUDA_DIR=...`).
//!
//!   cuda_workload --state DIR [--procs N] [--mib M] [--zombies Z] [--sync 1]
//!
//! Options: --state DIR (required), --procs N (default 2: the parent and N-1 children,
//! "child", "child2", ...), --mib M (default 64: device memory per process, in buffers
//! of mixed sizes from 4 KiB to 16 MiB, round-robin over the GPUs), --zombies Z
//! (default 0: children of the parent that exit at once and are never reaped, as a
//! job's finished helpers can be), --sync 1 (each step waits for its work with
//! `cuCtxSynchronize` instead of sleeping 20 ms; on the fake that takes
//! `GPUCR_FAKE_CUDA_SYNC_MS`, work in flight that a lock waits for).
//!
//! The parent forks the children before anything loads the driver (CUDA does not
//! survive a fork). Every 20 ms each process writes one 4 KiB page of each buffer: page
//! `s % pages` of step `s` gets generation `s / pages + 1`, so a buffer's whole content
//! follows from its step counter, which lives in host memory (carried by CRIU) while the
//! buffer lives in device memory (carried by the driver's checkpoint).
//!
//! Each process appends `tick=N steps=S verified=V bad=B` to `DIR/journal-<role>` every
//! 100 ms. SIGUSR1, or a number written to `DIR/verify`, asks it to check every byte;
//! when all buffers match, `verified` becomes that number (SIGUSR1: one more than
//! before). A mismatch sets `bad=1` and writes the buffer and page to `DIR/bad-<role>`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpucr_cuda_driver::{Context, DevicePtr, Driver};

const PAGE: usize = 4096;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

static VERIFY_SIGNAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigusr1(_: libc::c_int) {
    VERIFY_SIGNAL.store(true, Ordering::SeqCst);
}

struct Options {
    state: PathBuf,
    procs: usize,
    mib: usize,
    zombies: usize,
    sync: bool,
}

fn parse_args() -> Options {
    let mut opts = Options {
        state: PathBuf::new(),
        procs: 2,
        mib: 64,
        zombies: 0,
        sync: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| die(&format!("{arg} needs a value")));
        let number = || {
            value
                .parse::<usize>()
                .unwrap_or_else(|_| die(&format!("bad number {value:?}")))
        };
        match arg.as_str() {
            "--state" => opts.state = PathBuf::from(&value),
            "--procs" => opts.procs = number().max(1),
            "--mib" => opts.mib = number(),
            "--zombies" => opts.zombies = number(),
            "--sync" => opts.sync = number() > 0,
            _ => die(&format!("unknown argument {arg}")),
        }
    }
    if opts.state.as_os_str().is_empty() {
        die("--state DIR is required");
    }
    opts
}

fn die(msg: &str) -> ! {
    eprintln!("cuda_workload: {msg}");
    exit(2)
}

struct Buffer {
    id: u64,
    context: Context,
    ptr: DevicePtr,
    pages: u64,
    steps: u64,
}

impl Buffer {
    /// The generation page `p` has after `steps` steps.
    fn generation(&self, p: u64, steps: u64) -> u64 {
        steps / self.pages + u64::from(p < steps % self.pages)
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The content of page `p` of buffer `id` at generation `g`, into `out`.
fn page_content(id: u64, p: u64, g: u64, out: &mut [u8]) {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ p.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ g;
    for word in out.chunks_mut(8) {
        x = splitmix(x);
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// Buffer sizes adding up to `total` bytes: small ones first, then up to 16 MiB each.
fn buffer_sizes(total: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut left = total;
    for small in [4 * KIB, 64 * KIB, MIB] {
        if left >= small {
            sizes.push(small);
            left -= small;
        }
    }
    while left >= PAGE {
        let size = left.min(16 * MIB) / PAGE * PAGE;
        sizes.push(size);
        left -= size;
    }
    sizes
}

fn main() {
    let opts = parse_args();
    fs::create_dir_all(&opts.state).unwrap_or_else(|e| die(&format!("state dir: {e}")));
    let mut role = "parent".to_owned();
    for n in 1..opts.procs {
        // SAFETY: no thread has been started and no driver loaded yet, so the child is a
        // copy of a single-threaded process.
        match unsafe { libc::fork() } {
            -1 => die(&format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                // SAFETY: prctl with an integer argument; no memory is passed.
                unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
                role = if n == 1 {
                    "child".into()
                } else {
                    format!("child{n}")
                };
                break;
            }
            _ => {}
        }
    }
    if role == "parent" {
        for _ in 0..opts.zombies {
            // SAFETY: as above; the child only exits.
            match unsafe { libc::fork() } {
                -1 => die(&format!("fork: {}", std::io::Error::last_os_error())),
                // SAFETY: _exit is async-signal-safe and ends the child at once.
                0 => unsafe { libc::_exit(0) },
                _ => {}
            }
        }
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            on_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    run(&opts.state, &role, opts.mib * MIB, opts.sync);
}

fn run(state: &Path, role: &str, bytes: usize, sync: bool) -> ! {
    let driver = Driver::load().unwrap_or_else(|e| die(&e.to_string()));
    let fail = |e: gpucr_cuda_driver::Error| -> ! { die(&format!("{role}: {e}")) };
    let gpus = driver.device_count().unwrap_or_else(|e| fail(e));
    if gpus == 0 {
        die("no GPU");
    }
    let contexts: Vec<Context> = (0..gpus)
        .map(|i| driver.primary_ctx_retain(driver.device_get(i)?))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| fail(e));
    let role_id: u64 = if role == "parent" {
        0
    } else {
        1000 * role.len() as u64
    };
    let mut page = vec![0u8; PAGE];
    let mut buffers = Vec::new();
    for (i, size) in buffer_sizes(bytes).into_iter().enumerate() {
        let context = contexts[i % gpus];
        driver.ctx_set_current(context).unwrap_or_else(|e| fail(e));
        let ptr = driver.mem_alloc(size).unwrap_or_else(|e| fail(e));
        let b = Buffer {
            id: role_id + i as u64,
            context,
            ptr,
            pages: (size / PAGE) as u64,
            steps: 0,
        };
        for p in 0..b.pages {
            page_content(b.id, p, 0, &mut page);
            driver
                .memcpy_htod(ptr.offset(p as usize * PAGE), &page)
                .unwrap_or_else(|e| fail(e));
        }
        buffers.push(b);
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
    let (mut tick, mut steps, mut verified, mut bad) = (0u64, 0u64, 0u64, 0u64);
    let mut last_journal = Instant::now();
    loop {
        // One step of the "kernel": a page of each buffer.
        for b in &mut buffers {
            let p = b.steps % b.pages;
            page_content(b.id, p, b.generation(p, b.steps + 1), &mut page);
            driver
                .ctx_set_current(b.context)
                .unwrap_or_else(|e| fail(e));
            driver
                .memcpy_htod(b.ptr.offset(p as usize * PAGE), &page)
                .unwrap_or_else(|e| fail(e));
            b.steps += 1;
            steps += 1;
        }
        let requested = fs::read_to_string(state.join("verify"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|n| *n > verified);
        let signalled = VERIFY_SIGNAL.swap(false, Ordering::SeqCst);
        if requested.is_some() || signalled {
            match verify(&driver, &buffers) {
                Ok(()) => verified = requested.unwrap_or(verified + 1),
                Err(what) => {
                    bad = 1;
                    let _ = fs::write(state.join(format!("bad-{role}")), what);
                }
            }
        }
        if last_journal.elapsed() >= Duration::from_millis(100) {
            tick += 1;
            last_journal = Instant::now();
            let line = format!("tick={tick} steps={steps} verified={verified} bad={bad}\n");
            if journal.write_all(line.as_bytes()).is_err() {
                exit(3);
            }
        }
        if sync {
            driver.ctx_synchronize().unwrap_or_else(|e| fail(e));
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Checks every page of every buffer against its step counter. The page of the step in
/// flight when the process was frozen may already hold the next generation.
fn verify(driver: &Driver, buffers: &[Buffer]) -> Result<(), String> {
    let mut expected = vec![0u8; PAGE];
    for b in buffers {
        driver
            .ctx_set_current(b.context)
            .map_err(|e| e.to_string())?;
        let mut actual = vec![0u8; b.pages as usize * PAGE];
        driver
            .memcpy_dtoh(&mut actual, b.ptr)
            .map_err(|e| e.to_string())?;
        for (p, got) in actual.chunks(PAGE).enumerate() {
            let p = p as u64;
            let g = b.generation(p, b.steps);
            page_content(b.id, p, g, &mut expected);
            if got == expected.as_slice() {
                continue;
            }
            if p == b.steps % b.pages {
                page_content(b.id, p, g + 1, &mut expected);
                if got == expected.as_slice() {
                    continue;
                }
            }
            return Err(format!(
                "buffer {} page {p} (steps {}) differs\n",
                b.id, b.steps
            ));
        }
    }
    Ok(())
}
