//! The lazy-pages server: takes each task's userfaultfd from the restoring CRIU, answers
//! its page faults first and streams the rest of its memory in the background, block by
//! checked block, on several threads.
//!
//! Threads: one reads CRIU's announcements and then waits for the end; one per
//! userfaultfd reads its messages (faults and events) and serves its faults itself;
//! `threads` workers take (task, block) jobs and fill them. Every fill of a task's memory
//! happens under its state's lock, and so does every read of its messages: an event
//! (mremap, madvise, munmap, fork) is applied to the ranges before any later fill looks
//! at them, and a fill that races an event not read yet gets EAGAIN from the kernel and
//! is tried again after it.
//!
//! The first failure (a damaged block, a read error, a userfaultfd error, the caller's
//! cancellation) kills the tree before any userfaultfd is closed: a task never faults on
//! a page that will not come, nor reads zeros where its data was.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, Flock, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::error::LazyError;
use super::hold::StartupHold;
use super::kill;
use super::pages::{self, PagesFile};
use super::ranges::RangeSet;
use super::socket::{Announcement, Announcements, LazySocket};
use super::uffd::{Event, Fill, Uffd};
use crate::cancel::Cancel;
use crate::image::checksum::BLOCK_SIZE;
use crate::image::manifest::Manifest;
use crate::wait::dir::DirWatch;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The image directory (pagemaps, mm and pages files).
    pub image_dir: PathBuf,
    /// Background copy threads.
    pub threads: usize,
    /// The guard that holds a duplicate of every userfaultfd (`guard`): handed each one
    /// before it is served, told `done` when serving ends.
    pub guard: Option<Arc<super::guard::LazyGuard>>,
    /// How long the starting tree must have made no fault before the background
    /// stream starts a block (`hold`; zero: no hold).
    pub quiet: Duration,
    /// Where blocks not yet in the image directory come from (a post-copy migration's
    /// destination); None: every block is there.
    pub remote: Option<Arc<dyn super::RemoteBlocks>>,
}

/// The test-only pause before each block served (`GPUCR_TEST_LAZY_THROTTLE_MS`).
fn throttle() -> Option<Duration> {
    gpucr_abi::env::test_millis("GPUCR_TEST_LAZY_THROTTLE_MS")
}

/// The test-only gate (`GPUCR_TEST_LAZY_GATE`): until this file exists, the background
/// stream places no block, nor do faults once CRIU's restore is over (CRIU's own steps
/// need faults served).
fn gate() -> Option<PathBuf> {
    std::env::var_os("GPUCR_TEST_LAZY_GATE").map(PathBuf::from)
}

/// What the server did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Tasks CRIU announced (zombies included), and tasks forked since.
    pub tasks: usize,
    pub forks: usize,
    /// Bytes placed to answer a fault, and in the background.
    pub fault_bytes: u64,
    pub background_bytes: u64,
    /// Faults answered with a zero page (memory never dumped).
    pub zero_pages: u64,
    /// From the start of the server until every task's memory was in.
    pub elapsed: Duration,
    /// From the start until CRIU said every task was restored.
    pub restored_after: Duration,
    /// The page size of the memory served (bytes / page_size = pages).
    pub page_size: u64,
}

/// A running server. Dropped before [`LazyServer::wait`] (a restore that failed), it is
/// stopped: the tasks it had are killed.
#[derive(Debug)]
pub struct LazyServer {
    thread: Option<JoinHandle<Result<Summary, LazyError>>>,
    socket_path: PathBuf,
    stop: Cancel,
    memory: TaskMemory,
}

/// A way to bring a task's memory in ahead of the rest and wait for it
/// ([`LazyServer::memory`]).
#[derive(Clone)]
pub struct TaskMemory(Arc<Shared>);

impl std::fmt::Debug for TaskMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskMemory")
    }
}

impl TaskMemory {
    /// Bring every lazy page of task `pid` (its pid in the image) in now, its blocks
    /// ahead of every other task's, and wait until they are in: for a step that reads
    /// the task's memory other than through its own faults (a driver restoring device
    /// memory it staged there). Waits for CRIU's word that every task is restored first
    /// (at RESUME_DEVICES_LATE it came already). `cancel`, or the server's failure,
    /// ends the wait with an error.
    pub fn fill_task(&self, pid: i32, cancel: &Cancel) -> Result<(), LazyError> {
        let shared = &self.0;
        let _filling = shared.hold.filling();
        let mut ahead = false;
        loop {
            if let Err(c) = cancel.check() {
                return Err(LazyError::Cancelled(c.0));
            }
            if shared.stop.is_cancelled() {
                let reason = shared
                    .failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map_or_else(|| "the server stopped".to_string(), |e| e.to_string());
                return Err(LazyError::NotIn { pid, reason });
            }
            if shared.restored.load(Ordering::Acquire) {
                if !ahead {
                    let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                    let (mine, others): (VecDeque<_>, VecDeque<_>) =
                        queue.drain(..).partition(|(space, _)| space.pid == pid);
                    queue.extend(mine);
                    queue.extend(others);
                    drop(queue);
                    shared.ready.notify_all();
                    ahead = true;
                }
                let spaces: Vec<Arc<Space>> = shared
                    .spaces
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter(|s| s.pid == pid)
                    .cloned()
                    .collect();
                if spaces.iter().all(|s| s.finished()) {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for LazyServer {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            // No CRIU will be reported done by a restore that gives up.
            self.criu_done();
            self.stop.cancel("the restore failed");
            let _ = thread.join();
        }
    }
}

/// A server handed on with a restored tree: whoever has it waits for the end once. A
/// failure is written to the restore's log ([`Serving::log`]) as well as returned.
#[derive(Debug, Clone)]
pub struct Serving {
    server: Arc<Mutex<Option<LazyServer>>>,
    log: PathBuf,
    /// The image directory's lock (`image::dir::lock_for_restore`), let go once every
    /// page is in or serving has failed: no other restore of the image runs until then.
    image_lock: Arc<Mutex<Option<Flock<File>>>>,
}

impl Serving {
    pub fn new(server: LazyServer, log: PathBuf, image_lock: Flock<File>) -> Serving {
        Serving {
            server: Arc::new(Mutex::new(Some(server))),
            log,
            image_lock: Arc::new(Mutex::new(Some(image_lock))),
        }
    }

    /// Where the reason goes when serving fails (the tree killed).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Wait until every page is in; None when it was waited for already.
    pub fn wait(&self) -> Option<Result<Summary, LazyError>> {
        let server = self
            .server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        let result = server.wait();
        if let Err(e) = &result {
            super::guard::append_log(
                &self.log,
                &format!("lazy restore failed, the restored tree was killed: {e}"),
            );
        }
        drop(
            self.image_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        Some(result)
    }
}

impl LazyServer {
    /// Listen on `work_dir/lazy-pages.socket` (before CRIU starts) and serve the tasks
    /// CRIU announces there. `cancel` stops it (and kills the tree).
    pub fn start(
        work_dir: &Path,
        manifest: Arc<Manifest>,
        options: ServeOptions,
        cancel: &Cancel,
    ) -> Result<LazyServer, LazyError> {
        let socket = LazySocket::bind(work_dir)?;
        let socket_path = socket.path().to_path_buf();
        let stop = cancel.child();
        let shared = Shared::new(manifest, options, stop.clone());
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("lazy-pages".into())
            .spawn(move || serve(socket, theirs))
            .map_err(LazyError::Thread)?;
        Ok(LazyServer {
            thread: Some(thread),
            socket_path,
            stop,
            memory: TaskMemory(shared),
        })
    }

    /// CRIU is about to restore the tree: until [`LazyServer::criu_done`], a failure
    /// neither stops nor kills a task CRIU still traces, which makes CRIU fail and then
    /// wait for ever on the tasks it traces (a pid namespace's init waits for children
    /// only CRIU may reap). It kills CRIU first, when [`LazyServer::criu_started`] named
    /// it (its tracees are let go as it dies), and otherwise waits for CRIU to let go;
    /// then it kills the tree.
    pub fn criu_running(&self) {
        self.memory.0.criu.set(CriuPhase::Running);
    }

    /// CRIU's process, started for this restore.
    pub fn criu_started(&self, pid: i32) {
        self.memory.0.criu.set_process(pid);
    }

    /// Whether serving has failed for a reason of its own (not CRIU's hangup): a
    /// restore whose CRIU failed reports this reason instead, CRIU having been killed
    /// for it.
    pub fn failed(&self) -> bool {
        matches!(
            &*self
                .memory
                .0
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
            Some(e) if !matches!(e, LazyError::Hangup)
        )
    }

    /// CRIU has answered (whatever its outcome): a failure kills the tree at once.
    pub fn criu_done(&self) {
        self.memory.0.criu.set(CriuPhase::Done);
    }

    /// A handle that brings one task's memory in ahead of the rest.
    pub fn memory(&self) -> TaskMemory {
        self.memory.clone()
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Wait until every page is in (or the server failed, the tree killed).
    pub fn wait(mut self) -> Result<Summary, LazyError> {
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(LazyError::Protocol("the lazy-pages server panicked".into()))
            }),
            None => Err(LazyError::Protocol(
                "the lazy-pages server was waited for twice".into(),
            )),
        }
    }
}

/// Where CRIU's restore is, for a failure's kill ([`LazyServer::criu_running`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CriuPhase {
    /// Nobody tells the server (a restore run by hand): kill at once.
    Untracked,
    Running,
    Done,
}

/// The phase, CRIU's process when known, and a wait for CRIU's end.
#[derive(Debug)]
struct CriuTracker {
    phase: Mutex<CriuPhase>,
    changed: Condvar,
    process: Mutex<Option<(i32, crate::wait::pidfd::PidFd)>>,
}

impl CriuTracker {
    fn new() -> CriuTracker {
        CriuTracker {
            phase: Mutex::new(CriuPhase::Untracked),
            changed: Condvar::new(),
            process: Mutex::new(None),
        }
    }

    fn set_process(&self, pid: i32) {
        *self.process.lock().unwrap_or_else(|e| e.into_inner()) =
            crate::wait::pidfd::PidFd::open(pid)
                .ok()
                .map(|fd| (pid, fd));
    }

    /// The tasks CRIU has forked so far (none when it was not named).
    fn children(&self) -> Vec<i32> {
        let process = self.process.lock().unwrap_or_else(|e| e.into_inner());
        let Some((criu, _)) = process.as_ref() else {
            return Vec::new();
        };
        let mut all = kill::descendants(&[*criu]);
        all.remove(criu);
        all.into_iter().collect()
    }

    /// Kill CRIU (it still holds the tree): whether it was known and has exited. The
    /// tasks it traced are let go as it dies.
    fn kill_process(&self) -> bool {
        let process = self.process.lock().unwrap_or_else(|e| e.into_inner());
        process
            .as_ref()
            .is_some_and(|(_, criu)| kill::kill_process(criu, CRIU_EXIT_LIMIT))
    }

    fn set(&self, phase: CriuPhase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
        self.changed.notify_all();
    }

    /// Wait (at most `limit`) until CRIU is not running: whether it let go in time.
    fn wait_until_not_running(&self, limit: Duration) -> bool {
        let phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let (phase, timeout) = self
            .changed
            .wait_timeout_while(phase, limit, |p| *p == CriuPhase::Running)
            .unwrap_or_else(|e| e.into_inner());
        *phase != CriuPhase::Running && !timeout.timed_out()
    }

    fn done(&self) -> bool {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) == CriuPhase::Done
    }

    fn running(&self) -> bool {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) == CriuPhase::Running
    }
}

/// How long a failure waits for a CRIU it cannot kill (not named) to let go of the tree
/// before it kills the tree anyway.
const CRIU_LET_GO_LIMIT: Duration = Duration::from_secs(60);
/// How long a failure waits for a killed CRIU to exit.
const CRIU_EXIT_LIMIT: Duration = Duration::from_secs(10);

/// One userfaultfd: a task's memory, or a forked child's.
///
/// Two locks: `shape`, held shared by every fill for as long as it places bytes and
/// exclusively by the message thread while it reads and applies events, so that fills
/// run side by side but never across an event; `state`, held briefly for the ranges.
#[derive(Debug)]
struct Space {
    /// The task's pid in the image (a forked child: its parent's).
    pid: i32,
    uffd: Uffd,
    pages: Arc<PagesFile>,
    shape: RwLock<()>,
    state: Mutex<SpaceState>,
}

#[derive(Debug)]
struct SpaceState {
    ranges: RangeSet,
    /// Its memory is gone (the task exited).
    gone: bool,
}

impl Space {
    fn new(pid: i32, uffd: Uffd, pages: Arc<PagesFile>, ranges: RangeSet) -> Space {
        Space {
            pid,
            uffd,
            pages,
            shape: RwLock::new(()),
            state: Mutex::new(SpaceState {
                ranges,
                gone: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SpaceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Held while bytes are placed: no event is applied meanwhile.
    fn filling(&self) -> RwLockReadGuard<'_, ()> {
        self.shape.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Held while events are read and applied: no fill runs meanwhile.
    fn reshaping(&self) -> RwLockWriteGuard<'_, ()> {
        self.shape.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The memory is gone (the task exited): nothing more to place.
    fn set_gone(&self) {
        let mut state = self.lock();
        state.gone = true;
        state.ranges = RangeSet::new();
    }

    fn finished(&self) -> bool {
        let state = self.lock();
        state.gone || state.ranges.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Fault,
    Background,
}

/// Whether a block was served.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    Done,
    /// The memory is changing shape: try again after its event.
    Again,
}

struct Shared {
    manifest: Arc<Manifest>,
    options: ServeOptions,
    page_size: u64,
    throttle: Option<Duration>,
    gate: Option<PathBuf>,
    /// The gate's file was seen.
    gate_open: AtomicBool,
    stop: Cancel,
    /// CRIU said every task is restored: their lazy mappings are registered, so the
    /// background copy may start (CRIU's own daemon waits for this too).
    restored: AtomicBool,
    done: AtomicBool,
    /// Message threads with faults to serve: the background stream starts no block
    /// meanwhile, so that a fault's block has the disk and the cores to itself.
    faulting: AtomicUsize,
    /// The stream's hold while the tree starts.
    hold: StartupHold,
    failure: Mutex<Option<LazyError>>,
    spaces: Mutex<Vec<Arc<Space>>>,
    pages: Mutex<HashMap<String, Arc<PagesFile>>>,
    hosts: Mutex<Vec<i32>>,
    queue: Mutex<VecDeque<(Arc<Space>, u64)>>,
    ready: Condvar,
    fault_threads: Mutex<Vec<JoinHandle<()>>>,
    tasks: AtomicU64,
    forks: AtomicU64,
    fault_bytes: AtomicU64,
    background_bytes: AtomicU64,
    zero_pages: AtomicU64,
    /// Where CRIU's restore is, for a failure's kill.
    criu: CriuTracker,
}

impl Shared {
    /// Whether the remote the blocks come from holds the background stream back
    /// ([`super::RemoteBlocks::holds_background`]); never while a step waits for a fill.
    fn remote_holds(&self) -> bool {
        !self.hold.filling_now()
            && self
                .options
                .remote
                .as_ref()
                .is_some_and(|remote| remote.holds_background())
    }

    fn fail(&self, error: LazyError) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.is_none() {
            *failure = Some(error);
        }
        drop(failure);
        self.stop.cancel("lazy-pages server failed");
        self.ready.notify_all();
    }

    /// Wait until the test-only gate's file exists (at once without a gate, and for a
    /// fault while CRIU restores); false when the server stops first.
    fn through_gate(&self, why: Why) -> bool {
        let Some(path) = &self.gate else {
            return true;
        };
        if self.gate_open.load(Ordering::Acquire) || (why == Why::Fault && !self.criu.done()) {
            return true;
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let watch = DirWatch::new(dir, |_| true).ok();
        while !path.exists() {
            if self.stop.is_cancelled() {
                return false;
            }
            // A tenth of a second at most between looks: the stop is seen that late.
            match &watch {
                Some(watch) => {
                    let _ = watch.wait(Duration::from_millis(100), None);
                }
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        self.gate_open.store(true, Ordering::Release);
        true
    }

    fn ending(&self) -> bool {
        self.done.load(Ordering::Acquire) || self.stop.is_cancelled()
    }

    fn pages_file(&self, name: &str, pid: i32) -> Result<Arc<PagesFile>, LazyError> {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = pages.get(name) {
            return Ok(file.clone());
        }
        let file = Arc::new(PagesFile::open(
            &self.options.image_dir,
            name,
            &self.manifest,
            pid,
        )?);
        pages.insert(name.to_string(), file.clone());
        Ok(file)
    }

    /// Register a space, queue its blocks and start its message thread.
    fn add_space(self: &Arc<Self>, space: Arc<Space>) -> Result<(), LazyError> {
        let blocks = space.lock().ranges.blocks(BLOCK_SIZE);
        self.spaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(space.clone());
        {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.extend(blocks.into_iter().map(|k| (space.clone(), k)));
        }
        self.ready.notify_all();
        let shared = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("lazy-uffd-{}", space.pid))
            .spawn(move || {
                if let Err(e) = messages(&shared, &space) {
                    shared.fail(e);
                }
            })
            .map_err(LazyError::Thread)?;
        self.fault_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(thread);
        Ok(())
    }

    /// Whether every space is filled or gone.
    fn all_in(&self) -> bool {
        let spaces: Vec<Arc<Space>> = self
            .spaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let all = spaces.iter().all(|s| s.finished());
        // A fork registered during the look has its parent's ranges: look again.
        all && self.spaces.lock().unwrap_or_else(|e| e.into_inner()).len() == spaces.len()
    }
}

fn nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

impl Shared {
    fn new(manifest: Arc<Manifest>, options: ServeOptions, stop: Cancel) -> Arc<Shared> {
        let page_size = manifest.host.page_size_or_here();
        let hold = StartupHold::new(options.quiet, super::hold::WINDOW);
        Arc::new(Shared {
            manifest,
            options,
            page_size,
            throttle: throttle(),
            gate: gate(),
            gate_open: AtomicBool::new(false),
            criu: CriuTracker::new(),
            stop,
            restored: AtomicBool::new(false),
            done: AtomicBool::new(false),
            faulting: AtomicUsize::new(0),
            hold,
            failure: Mutex::new(None),
            spaces: Mutex::new(Vec::new()),
            pages: Mutex::new(HashMap::new()),
            hosts: Mutex::new(Vec::new()),
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            fault_threads: Mutex::new(Vec::new()),
            tasks: AtomicU64::new(0),
            forks: AtomicU64::new(0),
            fault_bytes: AtomicU64::new(0),
            background_bytes: AtomicU64::new(0),
            zero_pages: AtomicU64::new(0),
        })
    }
}

fn serve(socket: LazySocket, shared: Arc<Shared>) -> Result<Summary, LazyError> {
    let started = Instant::now();
    let threads = shared.options.threads.max(1);
    let mut workers = Vec::new();
    for i in 0..threads {
        let mine = shared.clone();
        match std::thread::Builder::new()
            .name(format!("lazy-copy-{i}"))
            .spawn(move || worker(&mine))
        {
            Ok(t) => workers.push(t),
            Err(e) => shared.fail(LazyError::Thread(e)),
        }
    }
    let mut restored_after = Duration::ZERO;
    match announcements(&socket, &shared) {
        Ok(()) => {
            restored_after = started.elapsed();
            shared.hold.restored();
            shared.restored.store(true, Ordering::Release);
            shared.ready.notify_all();
        }
        Err(e) => shared.fail(e),
    }
    drop(socket);
    while !shared.stop.is_cancelled() && !shared.all_in() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let failure = if shared.stop.is_cancelled() {
        let failure = shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        Some(failure.unwrap_or_else(|| {
            LazyError::Cancelled(
                shared
                    .stop
                    .check()
                    .err()
                    .map(|c| c.0)
                    .unwrap_or_else(|| "cancelled".into()),
            )
        }))
    } else {
        None
    };
    if failure.is_some() {
        let hosts = shared
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // While CRIU still holds the tree, no signal reaches a task it traces: CRIU
        // goes first (what it forked is killed with the tree), or is waited for.
        let mut roots = hosts;
        if shared.criu.running() {
            let forked = shared.criu.children();
            if !shared.criu.kill_process() {
                let _ = shared.criu.wait_until_not_running(CRIU_LET_GO_LIMIT);
            }
            roots.extend(forked);
        }
        kill::kill_tree(&roots);
    }
    shared.done.store(true, Ordering::Release);
    shared.ready.notify_all();
    for w in workers {
        let _ = w.join();
    }
    let fault_threads = std::mem::take(
        &mut *shared
            .fault_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    for t in fault_threads {
        let _ = t.join();
    }
    // The tree is whole or dead: the guard may let go of its duplicates.
    if let Some(guard) = &shared.options.guard {
        guard.done();
    }
    // Only now, the tree whole or dead, are the userfaultfds closed.
    shared
        .spaces
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    shared
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(Summary {
        tasks: shared.tasks.load(Ordering::Relaxed) as usize,
        forks: shared.forks.load(Ordering::Relaxed) as usize,
        fault_bytes: shared.fault_bytes.load(Ordering::Relaxed),
        background_bytes: shared.background_bytes.load(Ordering::Relaxed),
        zero_pages: shared.zero_pages.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        restored_after,
        page_size: shared.page_size,
    })
}

/// CRIU's connection, until it says every task is restored.
fn announcements(socket: &LazySocket, shared: &Arc<Shared>) -> Result<(), LazyError> {
    let mut stream: Announcements = socket.accept(&shared.stop)?;
    loop {
        if let Err(c) = shared.stop.check() {
            return Err(LazyError::Cancelled(c.0));
        }
        if !stream.readable(Duration::from_millis(50)) {
            continue;
        }
        match stream.next_announcement()? {
            None | Some(Announcement::Finished) => return Ok(()),
            Some(Announcement::Zombie { .. }) => {
                shared.tasks.fetch_add(1, Ordering::Relaxed);
            }
            Some(Announcement::Task {
                pid,
                host_pid,
                uffd,
            }) => {
                shared.tasks.fetch_add(1, Ordering::Relaxed);
                if let Some(host) = host_pid {
                    shared
                        .hosts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(host);
                }
                if let Some(guard) = &shared.options.guard {
                    guard.task(host_pid, uffd.as_fd())?;
                }
                nonblocking(&uffd).map_err(|source| LazyError::Uffd {
                    pid,
                    op: "setup",
                    addr: 0,
                    source,
                })?;
                let memory = pages::task_memory(&shared.options.image_dir, pid, shared.page_size)?;
                let pages = shared.pages_file(&memory.pages_file, pid)?;
                shared.add_space(Arc::new(Space::new(
                    pid,
                    Uffd::new(uffd),
                    pages,
                    memory.ranges,
                )))?;
            }
        }
    }
}

/// `ioprio_set(2)`'s idle class (linux/ioprio.h: class 3 in the top bits of the value).
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_IDLE: libc::c_int = 3 << 13;

/// The calling thread's reads (and the read-ahead it asks for) go to the disk only when
/// nothing else waits for it: the restored tree's own reads (its programs, its files)
/// come first.
fn background_io_priority() {
    // SAFETY: ioprio_set takes three integers and touches no memory of ours; who 0 is
    // the calling thread.
    unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE) };
}

/// A background copy thread.
fn worker(shared: &Arc<Shared>) {
    background_io_priority();
    let mut buffer = Vec::new();
    loop {
        let job = {
            let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if shared.ending() {
                    return;
                }
                let faulting = shared.faulting.load(Ordering::Acquire) > 0 || shared.hold.holds();
                let held = shared.remote_holds();
                if shared.restored.load(Ordering::Acquire) && !faulting && !held {
                    if let Some(job) = queue.pop_front() {
                        break job;
                    }
                }
                // A remote's hold lasts until a message crosses: no need to look often.
                let pause = if faulting && !held { 1 } else { 20 };
                queue = shared
                    .ready
                    .wait_timeout(queue, Duration::from_millis(pause))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let (space, block) = job;
        match serve_block(shared, &space, block, Why::Background, &mut buffer) {
            Ok(Served::Done) => {}
            Ok(Served::Again) => {
                shared
                    .queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_back((space, block));
                std::thread::yield_now();
            }
            Err(e) => {
                shared.fail(e);
                return;
            }
        }
    }
}

/// Fill what `space` still needs of file block `block`: read and check it first (into
/// `buffer`, the calling thread's), then place its parts, other fills of the space
/// running beside it but no event. The background stream has the blocks after it read
/// ahead first.
fn serve_block(
    shared: &Shared,
    space: &Space,
    block: u64,
    why: Why,
    buffer: &mut Vec<u8>,
) -> Result<Served, LazyError> {
    let (lo, hi) = space.pages.block_bounds(block);
    {
        let state = space.lock();
        if state.gone || state.ranges.in_file(lo, hi).is_empty() {
            return Ok(Served::Done);
        }
    }
    if !shared.through_gate(why) {
        return Ok(Served::Done);
    }
    if let Some(pause) = shared.throttle {
        std::thread::sleep(pause);
    }
    if let Some(remote) = &shared.options.remote {
        let name = space.pages.name();
        remote
            .fetch(&name, block, why == Why::Fault)
            .map_err(|reason| LazyError::Remote {
                pid: space.pid,
                file: space.pages.path().to_path_buf(),
                block,
                reason,
            })?;
    } else if why == Why::Background {
        space.pages.read_ahead(block);
    }
    let bytes = space.pages.read_block(block, space.pid, buffer)?;
    if shared.stop.is_cancelled() {
        return Ok(Served::Done);
    }
    let _filling = space.filling();
    let parts = {
        let state = space.lock();
        if state.gone {
            return Ok(Served::Done);
        }
        state.ranges.in_file(lo, hi)
    };
    let counter = match why {
        Why::Fault => &shared.fault_bytes,
        Why::Background => &shared.background_bytes,
    };
    for part in parts {
        let from = (part.offset - lo) as usize;
        let src = &bytes[from..from + part.len() as usize];
        match place(space, part.start, src, shared.page_size)? {
            Fill::Done => {
                // Another fill of the same block may have placed some of it first: only
                // what this one takes from the ranges counts as its own.
                let taken = space.lock().ranges.take(part.start, part.end);
                counter.fetch_add(taken.iter().map(|t| t.len()).sum(), Ordering::Relaxed);
            }
            Fill::Gone => {
                space.set_gone();
                return Ok(Served::Done);
            }
            Fill::Unregistered => {
                // Nothing of the task is registered there (CRIU registers every lazy
                // mapping before it says the restore is finished): nothing will fault
                // on it through us.
                space.lock().ranges.take(part.start, part.end);
            }
            Fill::Again { .. } | Fill::Exists { .. } => return Ok(Served::Again),
        }
    }
    Ok(Served::Done)
}

/// UFFDIO_COPY `src` to `dst`, stepping over pages that are already there. Done, Gone,
/// or Again (the memory is changing shape; the rest is left).
fn place(space: &Space, dst: u64, src: &[u8], page: u64) -> Result<Fill, LazyError> {
    let mut at = 0u64;
    let len = src.len() as u64;
    while at < len {
        let fill = space
            .uffd
            .copy(dst + at, &src[at as usize..])
            .map_err(|source| LazyError::Uffd {
                pid: space.pid,
                op: "copy",
                addr: dst + at,
                source,
            })?;
        match fill {
            Fill::Done => return Ok(Fill::Done),
            Fill::Gone => return Ok(Fill::Gone),
            Fill::Unregistered => return Ok(Fill::Unregistered),
            Fill::Exists { placed } => at += placed + page,
            Fill::Again { placed } if placed > 0 => at += placed,
            Fill::Again { .. } => return Ok(Fill::Again { placed: at }),
        }
    }
    Ok(Fill::Done)
}

/// The message thread of one userfaultfd: events applied under the lock, faults served
/// (a fault that meets a change of shape waits for the event and is served after it).
fn messages(shared: &Arc<Shared>, space: &Arc<Space>) -> Result<(), LazyError> {
    let wake = shared.stop.wake_fd().map_err(LazyError::Thread)?;
    let mut faults: Vec<u64> = Vec::new();
    let mut buffer = Vec::new();
    let page = shared.page_size;
    let uffd_error = |op, addr, source| LazyError::Uffd {
        pid: space.pid,
        op,
        addr,
        source,
    };
    loop {
        if shared.ending() {
            return Ok(());
        }
        {
            let mut fds = [
                PollFd::new(space.uffd.as_fd(), PollFlags::POLLIN),
                PollFd::new(wake.as_fd(), PollFlags::POLLIN),
            ];
            let ms: u16 = if faults.is_empty() { 50 } else { 1 };
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(uffd_error("poll", 0, e.into())),
            }
        }
        loop {
            let _reshaping = space.reshaping();
            let mut state = space.lock();
            let event = match space.uffd.read_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) if state.gone => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(uffd_error("read", 0, e)),
            };
            match event {
                Event::PageFault { address } => faults.push(address & !(page - 1)),
                Event::Fork { uffd } => {
                    if let Some(guard) = &shared.options.guard {
                        guard.fork(uffd.as_fd())?;
                    }
                    nonblocking(&uffd).map_err(|e| uffd_error("fork", 0, e))?;
                    let child = Arc::new(Space::new(
                        space.pid,
                        Uffd::new(uffd),
                        space.pages.clone(),
                        state.ranges.clone(),
                    ));
                    shared.forks.fetch_add(1, Ordering::Relaxed);
                    shared.add_space(child)?;
                }
                Event::Remap { from, to, len } => state.ranges.remap(from, to, len),
                Event::Remove { start, end } => {
                    // The range reads as zeros now, with no fault for us: like CRIU's
                    // daemon, stop watching it.
                    if !space
                        .uffd
                        .unregister(start, end - start)
                        .map_err(|e| uffd_error("unregister", start, e))?
                    {
                        state.gone = true;
                        state.ranges = RangeSet::new();
                    }
                    state.ranges.take(start, end);
                }
                Event::Unmap { start, end } => {
                    state.ranges.take(start, end);
                }
                Event::Unknown { event } => {
                    return Err(LazyError::UnknownEvent {
                        pid: space.pid,
                        event,
                    })
                }
            }
        }
        let mut again = Vec::new();
        if !faults.is_empty() {
            let _first = FaultsFirst::new(&shared.faulting);
            for address in faults.drain(..) {
                if shared.ending() {
                    return Ok(());
                }
                if serve_fault(shared, space, address, &mut buffer)? == Served::Again {
                    again.push(address);
                }
            }
            shared.hold.fault_served();
        }
        faults = again;
    }
}

/// While alive, the background stream starts no block (`Shared::faulting`).
struct FaultsFirst<'a>(&'a AtomicUsize);

impl<'a> FaultsFirst<'a> {
    fn new(faulting: &'a AtomicUsize) -> FaultsFirst<'a> {
        faulting.fetch_add(1, Ordering::AcqRel);
        FaultsFirst(faulting)
    }
}

impl Drop for FaultsFirst<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serve a fault at page `address`: the block holding it, or a zero page where the image
/// has nothing (a page never dumped, or one already dropped).
fn serve_fault(
    shared: &Shared,
    space: &Space,
    address: u64,
    buffer: &mut Vec<u8>,
) -> Result<Served, LazyError> {
    let found = {
        let state = space.lock();
        if state.gone {
            return Ok(Served::Done);
        }
        state.ranges.find(address)
    };
    match found {
        Some(segment) => {
            let block = (segment.offset + (address - segment.start)) / BLOCK_SIZE;
            serve_block(shared, space, block, Why::Fault, buffer)
        }
        None => {
            let fill = space
                .uffd
                .zero(address, shared.page_size)
                .map_err(|source| LazyError::Uffd {
                    pid: space.pid,
                    op: "zeropage",
                    addr: address,
                    source,
                })?;
            match fill {
                Fill::Again { placed: 0 } => Ok(Served::Again),
                Fill::Gone => {
                    space.lock().gone = true;
                    Ok(Served::Done)
                }
                Fill::Done => {
                    shared.zero_pages.fetch_add(1, Ordering::Relaxed);
                    Ok(Served::Done)
                }
                _ => Ok(Served::Done),
            }
        }
    }
}
