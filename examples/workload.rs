//! A sample workload for gpucr: a small process tree that exercises what a checkpoint
//! must carry, and reports in journal files whether everything survived.
//!
//! The tree: the parent (run it as the init of its own PID namespace with
//! `unshare --pid --fork setsid workload --state DIR`) and two children.
//!   * parent: a large anonymous region filled with a known pattern (checked by a
//!     thread), a memfd with known contents, a TCP echo thread serving child 1 over
//!     loopback, a thread writing a sequence into a pipe read by child 2.
//!   * child 1 ("tcp"): pings the parent over TCP; echoes child 2 over a unix socketpair.
//!   * child 2 ("pipe"): reads the pipe sequence; pings child 1 over the socketpair.
//!
//! Every process appends one line per tick (100 ms) to `DIR/journal-<role>`, a file it
//! keeps open, so the file offset must survive a restore:
//!   `tick=N pipe=N tcp=N unix=N mem=ok|BAD passes=N memfd=ok|BAD`
//! Counters only grow; any broken invariant turns a field to BAD and the process exits
//! with status 3. `DIR/ready` appears once the tree is set up.
//!
//! Options: --state DIR (required), --memory-mib N (default 64), --exit-after-ticks N
//! with --exit-code C (the parent exits with C after N ticks, to test waiting restores),
//! --hold PATH (the parent keeps PATH open, e.g. a device CRIU cannot dump; repeatable),
//! --scratch-mib N (the parent keeps a deleted file of N MiB of a known pattern open,
//! `DIR/scratch` before it was deleted, and checks a piece of it every tick; CRIU dumps
//! such a "ghost" file's contents only up to its ghost-limit, 1 MiB by default).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const TICK: Duration = Duration::from_millis(100);
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const MEMFD_TEXT: &[u8] = b"gpucr workload memfd contents\n";

struct Options {
    state: PathBuf,
    memory_mib: usize,
    exit_after_ticks: Option<u64>,
    exit_code: i32,
    hold: Vec<PathBuf>,
    scratch_mib: usize,
}

fn parse_args() -> Options {
    let mut args = std::env::args().skip(1);
    let mut opts = Options {
        state: PathBuf::new(),
        memory_mib: 64,
        exit_after_ticks: None,
        exit_code: 0,
        hold: Vec::new(),
        scratch_mib: 0,
    };
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--state" => opts.state = PathBuf::from(value()),
            "--memory-mib" => opts.memory_mib = value().parse().unwrap_or_else(|_| usage("bad N")),
            "--exit-after-ticks" => {
                opts.exit_after_ticks = Some(value().parse().unwrap_or_else(|_| usage("bad N")))
            }
            "--exit-code" => opts.exit_code = value().parse().unwrap_or_else(|_| usage("bad C")),
            "--hold" => opts.hold.push(PathBuf::from(value())),
            "--scratch-mib" => {
                opts.scratch_mib = value().parse().unwrap_or_else(|_| usage("bad N"))
            }
            _ => usage(&format!("unknown argument {arg}")),
        }
    }
    if opts.state.as_os_str().is_empty() {
        usage("--state DIR is required");
    }
    opts
}

fn usage(msg: &str) -> ! {
    eprintln!("workload: {msg}\nusage: workload --state DIR [--memory-mib N] [--exit-after-ticks N --exit-code C] [--hold PATH]... [--scratch-mib N]");
    exit(2)
}

/// Counters and health flags of one process, written to its journal every tick.
#[derive(Default)]
struct Health {
    pipe: AtomicU64,
    tcp: AtomicU64,
    unix: AtomicU64,
    passes: AtomicU64,
    mem_bad: AtomicBool,
    memfd_bad: AtomicBool,
    other_bad: AtomicBool,
}

fn main() {
    let opts = parse_args();
    fs::create_dir_all(&opts.state).expect("create state dir");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    let (pipe_read, pipe_write) = nix::unistd::pipe().expect("pipe");
    let (unix_a, unix_b) = UnixStream::pair().expect("socketpair");

    // Child 1: TCP client of the parent, unix echo server for child 2.
    if fork_child() {
        drop(listener);
        drop(pipe_read);
        drop(pipe_write);
        drop(unix_b);
        set_name("wl-tcp");
        let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let health = Arc::new(Health::default());
        let h = health.clone();
        thread::spawn(move || echo_loop(unix_a, &h.other_bad));
        run_ticks(&opts, "tcp", &health, |_| {
            ping(&tcp, &health.tcp, &health.other_bad);
        });
    }
    // Child 2: reads the pipe sequence, pings child 1 over the socketpair.
    if fork_child() {
        drop(listener);
        drop(pipe_write);
        drop(unix_a);
        set_name("wl-pipe");
        let mut pipe = File::from(pipe_read);
        let health = Arc::new(Health::default());
        let h = health.clone();
        thread::spawn(move || loop {
            let mut word = [0u8; 8];
            if pipe.read_exact(&mut word).is_err() {
                h.other_bad.store(true, Ordering::SeqCst);
                return;
            }
            let expected = h.pipe.load(Ordering::SeqCst) + 1;
            if u64::from_le_bytes(word) != expected {
                h.other_bad.store(true, Ordering::SeqCst);
            }
            h.pipe.store(expected, Ordering::SeqCst);
        });
        run_ticks(&opts, "pipe", &health, |_| {
            ping(&unix_b, &health.unix, &health.other_bad);
        });
    }

    // The parent.
    drop(pipe_read);
    drop(unix_a);
    drop(unix_b);
    set_name("wl-parent");
    let health = Arc::new(Health::default());
    let memory = Arc::new(filled_region(opts.memory_mib << 20));
    {
        let (memory, h) = (memory.clone(), health.clone());
        thread::spawn(move || loop {
            if !pattern_intact(&memory) {
                h.mem_bad.store(true, Ordering::SeqCst);
            }
            h.passes.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(500));
        });
    }
    let memfd = make_memfd();
    let held: Vec<File> = opts
        .hold
        .iter()
        .map(|p| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap_or_else(|e| {
                    eprintln!("workload: cannot open {}: {e}", p.display());
                    exit(2)
                })
        })
        .collect();
    let (tcp, _) = listener.accept().expect("accept");
    {
        let h = health.clone();
        thread::spawn(move || echo_loop(tcp, &h.other_bad));
    }
    {
        let h = health.clone();
        let mut pipe = File::from(pipe_write);
        thread::spawn(move || loop {
            let next = h.pipe.load(Ordering::SeqCst) + 1;
            if pipe.write_all(&next.to_le_bytes()).is_err() {
                h.other_bad.store(true, Ordering::SeqCst);
                return;
            }
            h.pipe.store(next, Ordering::SeqCst);
            thread::sleep(TICK);
        });
    }
    let scratch = (opts.scratch_mib > 0).then(|| make_scratch(&opts.state, opts.scratch_mib << 20));
    fs::write(opts.state.join("ready"), b"ready\n").expect("write ready");
    let _keep_open = held;
    run_ticks(&opts, "parent", &health, |tick| {
        let mut buf = vec![0u8; MEMFD_TEXT.len()];
        let ok = nix::sys::uio::pread(&memfd, &mut buf, 0).is_ok_and(|n| n == buf.len())
            && buf == MEMFD_TEXT;
        if !ok {
            health.memfd_bad.store(true, Ordering::SeqCst);
        }
        if let Some(file) = &scratch {
            if !scratch_piece_intact(file, opts.scratch_mib << 20, tick) {
                health.other_bad.store(true, Ordering::SeqCst);
            }
        }
    });
}

/// fork(); true in the child. Children die with the parent.
fn fork_child() -> bool {
    // SAFETY: called before the process starts any thread, so the child is a copy of a
    // single-threaded process and may run arbitrary code.
    match unsafe { nix::unistd::fork() }.expect("fork") {
        nix::unistd::ForkResult::Child => {
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            true
        }
        nix::unistd::ForkResult::Parent { .. } => false,
    }
}

fn set_name(name: &str) {
    let _ = nix::sys::prctl::set_name(&std::ffi::CString::new(name).expect("no NUL"));
}

/// Tick forever: run `each`, then append the journal line.
fn run_ticks(opts: &Options, role: &str, health: &Health, mut each: impl FnMut(u64)) -> ! {
    let path = opts.state.join(format!("journal-{role}"));
    let mut journal = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut tick = 0u64;
    loop {
        tick += 1;
        each(tick);
        let flag = |b: &AtomicBool| {
            if b.load(Ordering::SeqCst) {
                "BAD"
            } else {
                "ok"
            }
        };
        let line = format!(
            "tick={tick} pipe={} tcp={} unix={} mem={} passes={} memfd={} other={}\n",
            health.pipe.load(Ordering::SeqCst),
            health.tcp.load(Ordering::SeqCst),
            health.unix.load(Ordering::SeqCst),
            flag(&health.mem_bad),
            health.passes.load(Ordering::SeqCst),
            flag(&health.memfd_bad),
            flag(&health.other_bad),
        );
        // One write per line at the file's own offset (no O_APPEND): a restore that lost
        // the offset would overwrite the start of the journal, which the tests detect.
        if journal.write_all(line.as_bytes()).is_err() {
            exit(3);
        }
        if line.contains("BAD") {
            exit(3);
        }
        if role == "parent" && opts.exit_after_ticks.is_some_and(|n| tick >= n) {
            exit(opts.exit_code);
        }
        thread::sleep(TICK);
    }
}

/// Send the counter + 1 and expect it back + 1.
fn ping<S>(stream: S, counter: &AtomicU64, bad: &AtomicBool)
where
    S: Read + Write,
{
    let mut stream = stream;
    let sent = counter.load(Ordering::SeqCst) * 2 + 1;
    let mut back = [0u8; 8];
    let ok = stream.write_all(&sent.to_le_bytes()).is_ok()
        && stream.read_exact(&mut back).is_ok()
        && u64::from_le_bytes(back) == sent + 1;
    if ok {
        counter.fetch_add(1, Ordering::SeqCst);
    } else {
        bad.store(true, Ordering::SeqCst);
    }
}

/// Answer every 8-byte word with word + 1.
fn echo_loop<S: Read + Write>(mut stream: S, bad: &AtomicBool) {
    let mut word = [0u8; 8];
    loop {
        if stream.read_exact(&mut word).is_err() {
            bad.store(true, Ordering::SeqCst);
            return;
        }
        let reply = u64::from_le_bytes(word) + 1;
        if stream.write_all(&reply.to_le_bytes()).is_err() {
            bad.store(true, Ordering::SeqCst);
            return;
        }
    }
}

fn pattern_word(i: usize) -> u64 {
    (i as u64).wrapping_mul(SEED) ^ 0x5555_AAAA_5555_AAAA
}

fn filled_region(bytes: usize) -> Vec<u64> {
    (0..bytes / 8).map(pattern_word).collect()
}

fn pattern_intact(memory: &[u64]) -> bool {
    memory
        .iter()
        .enumerate()
        .all(|(i, w)| *w == pattern_word(i))
}

/// Bytes of the scratch file checked each tick.
const SCRATCH_PIECE: usize = 64 << 10;

/// `DIR/scratch` filled with `bytes` of the pattern, deleted, and kept open.
fn make_scratch(dir: &std::path::Path, bytes: usize) -> File {
    let path = dir.join("scratch");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("create scratch file");
    let words: Vec<u8> = filled_region(bytes)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    file.write_all(&words).expect("write scratch file");
    fs::remove_file(&path).expect("delete scratch file");
    file
}

/// The piece of the scratch file that tick `tick` checks (a different one each tick,
/// the last one included), compared with the pattern.
fn scratch_piece_intact(file: &File, bytes: usize, tick: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let pieces = bytes.div_ceil(SCRATCH_PIECE);
    let start = (tick as usize % pieces) * SCRATCH_PIECE;
    let mut piece = vec![0u8; SCRATCH_PIECE.min(bytes - start)];
    if file.read_exact_at(&mut piece, start as u64).is_err() {
        return false;
    }
    piece
        .chunks_exact(8)
        .enumerate()
        .all(|(i, w)| w == pattern_word(start / 8 + i).to_le_bytes())
}

fn make_memfd() -> OwnedFd {
    let fd = nix::sys::memfd::memfd_create("gpucr-workload", nix::sys::memfd::MFdFlags::empty())
        .expect("memfd_create");
    let mut file = File::from(fd);
    file.write_all(MEMFD_TEXT).expect("write memfd");
    file.into()
}
