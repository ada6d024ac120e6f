//! Post-copy: the destination restores the job before its CPU memory has crossed, and
//! pulls each block of the large pages files from the source when it is needed.
//!
//! On the destination a [`Puller`] owns the link once the image's other files are in.
//! One thread sends the requests (a task's fault first, then the background stream's,
//! at most [`WINDOW`] blocks on their way) and writes each answer into the sparse pages
//! file, where the lazy-pages server reads it and checks it against the manifest as it
//! checks any block (`crate::lazy::RemoteBlocks`). The control messages of the end of
//! the migration (Restored, Resumed, AllIn) go through the same thread, in order.
//!
//! On the source [`serve_blocks`] answers each message in the order it came: a block
//! from the staging image and the stopped tree ([`TreeBlocks`]), Commit for Restored,
//! Done for AllIn once its stopped copy of the job is killed.
//!
//! A lost link fails every fetch at once: the destination's lazy-pages server then
//! kills the tree, which would otherwise wait for ever on pages that will not come.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::files::confined;
use super::link::{Incoming, Link, LinkError, CHUNK_SIZE};
use super::message::Control;
use super::tree_blocks::TreeBlocks;
use crate::image::checksum::BLOCK_SIZE;

/// Blocks asked for and not yet answered, at most: enough to keep the link busy while
/// each answer is written.
pub const WINDOW: usize = 8;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("the link to the source was lost: {0}")]
    Lost(String),
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the source sent {got} bytes for block {block} of {path}, not {expected}")]
    WrongSize {
        path: PathBuf,
        block: u64,
        expected: u64,
        got: u64,
    },
    #[error("the source answered '{got}' where '{expected}' was due")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
}

/// A pages file still on the source.
#[derive(Debug)]
struct Remote {
    path: PathBuf,
    file: File,
    size: u64,
    present: Vec<bool>,
}

impl Remote {
    fn blocks(&self) -> u64 {
        self.size.div_ceil(BLOCK_SIZE)
    }

    fn block_len(&self, k: u64) -> u64 {
        (self.size - k * BLOCK_SIZE).min(BLOCK_SIZE)
    }
}

/// What waits to be sent.
#[derive(Debug)]
enum Request {
    Block(String, u64),
    /// A message, and where its answer goes (None: it has none).
    Message(Control, Option<mpsc::Sender<Result<Control, String>>>),
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<String, Remote>,
    urgent: VecDeque<(String, u64)>,
    background: VecDeque<(String, u64)>,
    messages: VecDeque<Request>,
    asked: HashSet<(String, u64)>,
    failed: Option<String>,
    closing: bool,
    /// Bytes received, and of them on a task's behalf.
    bytes: u64,
}

/// The destination's side: pulls blocks over the link ([`Puller::start`]).
#[derive(Debug)]
pub struct Puller {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The restore's background stream is held back ([`Puller::hold_background`]).
    background_held: AtomicBool,
}

impl Puller {
    /// Take `link` over and pull the files `later` (name, size: made here, sparse, in
    /// `dir`) as they are asked for. `beat`: how often an idle link says Working.
    pub fn start(
        link: Link,
        dir: &Path,
        later: &[(String, u64)],
        beat: Duration,
    ) -> Result<Arc<Puller>, PullError> {
        let mut state = State::default();
        for (name, size) in later {
            let path = dir.join(name);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| PullError::Write {
                    path: path.clone(),
                    source,
                })?;
            let blocks = size.div_ceil(BLOCK_SIZE) as usize;
            state.files.insert(
                name.clone(),
                Remote {
                    path,
                    file,
                    size: *size,
                    present: vec![false; blocks],
                },
            );
        }
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let mine = shared.clone();
        let thread = std::thread::Builder::new()
            .name("postcopy-pull".into())
            .spawn(move || run(link, &mine, beat))
            .map_err(|e| PullError::Lost(format!("cannot start the pulling thread: {e}")))?;
        Ok(Arc::new(Puller {
            shared,
            thread: Mutex::new(Some(thread)),
            background_held: AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ask for `blocks` (name, index) in the background, and wait until all are in.
    pub fn fetch_all(&self, blocks: &[(String, u64)]) -> Result<(), PullError> {
        let mut state = self.lock();
        for (name, k) in blocks {
            ask(&mut state, name, *k, false);
        }
        self.shared.1.notify_all();
        loop {
            if let Some(why) = &state.failed {
                return Err(PullError::Lost(why.clone()));
            }
            if blocks.iter().all(|(name, k)| present(&state, name, *k)) {
                return Ok(());
            }
            state = self.shared.1.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Every block not yet in, so that the image directory is whole.
    pub fn missing(&self) -> Vec<(String, u64)> {
        let state = self.lock();
        let mut out = Vec::new();
        for (name, remote) in &state.files {
            for k in 0..remote.blocks() {
                if !remote.present[k as usize] {
                    out.push((name.clone(), k));
                }
            }
        }
        out.sort();
        out
    }

    /// Send `message` after what was asked before it, and wait for its answer.
    pub fn ask_message(&self, message: Control) -> Result<Control, PullError> {
        let (tx, rx) = mpsc::channel();
        {
            let mut state = self.lock();
            if let Some(why) = &state.failed {
                return Err(PullError::Lost(why.clone()));
            }
            state
                .messages
                .push_back(Request::Message(message, Some(tx)));
        }
        self.shared.1.notify_all();
        match rx.recv() {
            Ok(answer) => answer.map_err(PullError::Lost),
            Err(_) => Err(PullError::Lost(
                self.lock()
                    .failed
                    .clone()
                    .unwrap_or_else(|| "the pulling thread ended".into()),
            )),
        }
    }

    /// Send `message`, which has no answer, after what was asked before it.
    pub fn tell(&self, message: Control) {
        self.lock()
            .messages
            .push_back(Request::Message(message, None));
        self.shared.1.notify_all();
    }

    /// Hold the restore's background stream back until [`Puller::release_background`]:
    /// while the restored tree waits, stopped, for the Commit, the blocks it asks for
    /// would go ahead of the Restored on the link (a window of them, each answered
    /// before the source reads on), and delay the Commit by their time. Faults, and
    /// fills a step waits for, are pulled meanwhile.
    pub fn hold_background(&self) {
        self.background_held.store(true, Ordering::Release);
    }

    /// Let the restore's background stream pull again.
    pub fn release_background(&self) {
        self.background_held.store(false, Ordering::Release);
    }

    /// Bytes received so far.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Stop: what was queued is sent first, then the link is closed.
    pub fn close(&self) {
        self.lock().closing = true;
        self.shared.1.notify_all();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl crate::lazy::RemoteBlocks for Puller {
    fn holds_background(&self) -> bool {
        self.background_held.load(Ordering::Acquire)
    }

    fn fetch(&self, file: &str, block: u64, urgent: bool) -> Result<(), String> {
        let mut state = self.lock();
        if !state.files.contains_key(file) {
            return Ok(());
        }
        ask(&mut state, file, block, urgent);
        if !urgent {
            // The background stream reads a file in order: the blocks after this one
            // are asked for too, so that the link carries a window of them, not one
            // block per waiting thread.
            let blocks = state.files[file].blocks();
            for k in block + 1..(block + 1 + WINDOW as u64).min(blocks) {
                ask(&mut state, file, k, false);
            }
        }
        self.shared.1.notify_all();
        loop {
            if present(&state, file, block) {
                return Ok(());
            }
            if let Some(why) = &state.failed {
                return Err(why.clone());
            }
            state = self.shared.1.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn present(state: &State, name: &str, k: u64) -> bool {
    state
        .files
        .get(name)
        .is_none_or(|r| r.present.get(k as usize).copied().unwrap_or(true))
}

/// Queue block `k` of `name` unless it is in or asked for already; an urgent one that
/// waits in the background queue moves ahead.
fn ask(state: &mut State, name: &str, k: u64, urgent: bool) {
    if present(state, name, k) {
        return;
    }
    let key = (name.to_owned(), k);
    if state.asked.contains(&key) {
        if urgent {
            if let Some(at) = state.background.iter().position(|b| *b == key) {
                state.background.remove(at);
                state.urgent.push_back(key);
            }
        }
        return;
    }
    state.asked.insert(key.clone());
    if urgent {
        state.urgent.push_back(key);
    } else {
        state.background.push_back(key);
    }
}

/// What was sent and not yet answered, in order.
enum Awaited {
    Block(String, u64),
    Answer(mpsc::Sender<Result<Control, String>>),
}

/// The pulling thread: sends what is queued, at most [`WINDOW`] blocks ahead, and
/// writes each answer in.
fn run(mut link: Link, shared: &Arc<(Mutex<State>, Condvar)>, beat: Duration) {
    let (lock, wake) = (&shared.0, &shared.1);
    let mut awaited: VecDeque<Awaited> = VecDeque::new();
    let mut buffer = vec![0u8; BLOCK_SIZE as usize];
    let result = (|| -> Result<(), PullError> {
        loop {
            // What to send next, or wait.
            let mut sends = Vec::new();
            {
                let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let blocks_out = awaited
                        .iter()
                        .filter(|a| matches!(a, Awaited::Block(..)))
                        .count();
                    let mut room = WINDOW.saturating_sub(blocks_out + sends.len());
                    while room > 0 {
                        let next = state
                            .urgent
                            .pop_front()
                            .or_else(|| state.background.pop_front());
                        let Some(key) = next else { break };
                        sends.push(Request::Block(key.0, key.1));
                        room -= 1;
                    }
                    // Messages keep their place after the blocks asked before them.
                    while let Some(m) = state.messages.pop_front() {
                        sends.push(m);
                    }
                    if !sends.is_empty() || !awaited.is_empty() {
                        break;
                    }
                    if state.closing {
                        return Ok(());
                    }
                    let (next, timeout) = wake
                        .wait_timeout(state, beat)
                        .unwrap_or_else(|e| e.into_inner());
                    state = next;
                    if timeout.timed_out() && !state.closing {
                        drop(state);
                        link.send(&Control::Working).map_err(lost)?;
                        state = lock.lock().unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
            for request in sends {
                match request {
                    Request::Block(name, k) => {
                        link.send(&Control::Fetch {
                            path: name.clone(),
                            block: k,
                        })
                        .map_err(lost)?;
                        awaited.push_back(Awaited::Block(name, k));
                    }
                    Request::Message(message, answer) => {
                        link.send(&message).map_err(lost)?;
                        if let Some(tx) = answer {
                            awaited.push_back(Awaited::Answer(tx));
                        }
                    }
                }
            }
            // One answer.
            match awaited.pop_front() {
                Some(Awaited::Block(name, k)) => {
                    let (path, len) = {
                        let state = lock.lock().unwrap_or_else(|e| e.into_inner());
                        let remote = &state.files[&name];
                        (remote.path.clone(), remote.block_len(k))
                    };
                    let got = receive_block(&mut link, &mut buffer)?;
                    if got as u64 != len {
                        return Err(PullError::WrongSize {
                            path,
                            block: k,
                            expected: len,
                            got: got as u64,
                        });
                    }
                    let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let remote = state.files.get_mut(&name).expect("asked of a known file");
                    remote
                        .file
                        .write_all_at(&buffer[..got], k * BLOCK_SIZE)
                        .map_err(|source| PullError::Write { path, source })?;
                    remote.present[k as usize] = true;
                    state.bytes += got as u64;
                    wake.notify_all();
                }
                Some(Awaited::Answer(tx)) => {
                    let answer = link.receive_control().map_err(lost)?;
                    let _ = tx.send(Ok(answer));
                }
                None => {}
            }
        }
    })();
    if let Err(e) = result {
        let why = e.to_string();
        for a in awaited {
            if let Awaited::Answer(tx) = a {
                let _ = tx.send(Err(why.clone()));
            }
        }
        let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
        for request in state.messages.drain(..) {
            if let Request::Message(_, Some(tx)) = request {
                let _ = tx.send(Err(why.clone()));
            }
        }
        state.failed = Some(why);
        wake.notify_all();
    }
}

fn lost(e: LinkError) -> PullError {
    PullError::Lost(e.to_string())
}

/// A block's chunks up to FileEnd, into `buffer`: its length.
fn receive_block(link: &mut Link, buffer: &mut [u8]) -> Result<usize, PullError> {
    let mut got = 0usize;
    loop {
        match link.receive().map_err(lost)? {
            Incoming::Chunk { digest, data } => {
                if !Link::chunk_intact(digest, data) {
                    return Err(PullError::Lost(format!(
                        "a corrupt chunk at byte {got} of a block"
                    )));
                }
                if got + data.len() > buffer.len() {
                    return Err(PullError::Lost("a block longer than a block".into()));
                }
                buffer[got..got + data.len()].copy_from_slice(data);
                got += data.len();
            }
            Incoming::Control(Control::FileEnd) => return Ok(got),
            Incoming::Control(Control::Failed { reason, .. }) => {
                return Err(PullError::Lost(format!("the source failed: {reason}")))
            }
            Incoming::Control(other) => {
                return Err(PullError::Unexpected {
                    expected: "file_end",
                    got: other.name(),
                })
            }
        }
    }
}

/// What the source's [`serve_blocks`] saw happen.
#[derive(Debug)]
pub enum Served {
    /// The destination restored the job and was sent Commit; it ran it (pid there,
    /// from `dir`; Resumed came at `resumed_at`), had every page (AllIn), and was
    /// answered Done once this side's copy was killed.
    Finished {
        pid: i32,
        dir: String,
        resumed_at: Option<std::time::Instant>,
        /// Bytes of blocks sent.
        pulled: u64,
    },
    /// The destination gave up before the Commit: the job may run on here.
    Refused(String),
}

/// Why serving blocks stopped, and whether the Commit had been sent.
#[derive(Debug)]
pub struct ServeFailure {
    pub committed: bool,
    pub why: String,
}

/// What the source does at the turns of post-copy, as [`serve_blocks`] meets them.
pub trait ServingTurns {
    /// The destination restored the job as pid `there`: Commit is about to be sent,
    /// and from then on the job may not run here again.
    fn committing(&mut self, there: i32);
    /// The destination runs the job.
    fn resumed(&mut self);
    /// Every page is in there: the source's copy must go before Done is answered.
    fn all_in(&mut self);
}

/// The source's side: answer the destination's messages from the image in `dir` and
/// the stopped tree (`tree`) until AllIn, telling `turns` of each turn.
pub fn serve_blocks(
    link: &mut Link,
    dir: &Path,
    tree: &TreeBlocks,
    turns: &mut dyn ServingTurns,
) -> Result<Served, ServeFailure> {
    let mut files: HashMap<String, File> = HashMap::new();
    let mut buffer = vec![0u8; BLOCK_SIZE as usize];
    let mut commit = false;
    let mut pulled = 0u64;
    let mut resumed: Option<(i32, String, std::time::Instant)> = None;
    let fail = |commit: bool, why: String| ServeFailure {
        committed: commit,
        why,
    };
    loop {
        let message = link
            .receive_control()
            .map_err(|e| fail(commit, e.to_string()))?;
        match message {
            Control::Fetch { path, block } => {
                let relative = confined(&path).map_err(|e| fail(commit, e.to_string()))?;
                if !files.contains_key(&path) {
                    let file = File::open(dir.join(&relative))
                        .map_err(|e| fail(commit, format!("{path}: {e}")))?;
                    files.insert(path.clone(), file);
                }
                let file = &files[&path];
                let size = file
                    .metadata()
                    .map_err(|e| fail(commit, format!("{path}: {e}")))?
                    .len();
                let lo = block.saturating_mul(BLOCK_SIZE);
                if lo >= size {
                    return Err(fail(
                        commit,
                        format!("the destination asked for block {block} of {path}, past its end"),
                    ));
                }
                let len = (size - lo).min(BLOCK_SIZE) as usize;
                file.read_exact_at(&mut buffer[..len], lo)
                    .map_err(|e| fail(commit, format!("{path}: {e}")))?;
                tree.fill(&path, lo, &mut buffer[..len])
                    .map_err(|e| fail(commit, e.to_string()))?;
                for chunk in buffer[..len].chunks(CHUNK_SIZE) {
                    link.send_chunk(chunk)
                        .map_err(|e| fail(commit, e.to_string()))?;
                }
                link.send(&Control::FileEnd)
                    .map_err(|e| fail(commit, e.to_string()))?;
                pulled += len as u64;
            }
            Control::Restored { pid } => {
                turns.committing(pid);
                commit = true;
                link.send(&Control::Commit)
                    .map_err(|e| fail(commit, e.to_string()))?;
            }
            Control::Resumed { pid, dir } => {
                resumed = Some((pid, dir, std::time::Instant::now()));
                turns.resumed();
            }
            Control::AllIn if commit => {
                turns.all_in();
                let _ = link.send(&Control::Done);
                let (pid, dir, at) = match resumed {
                    Some((pid, dir, at)) => (pid, dir, Some(at)),
                    None => (0, String::new(), None),
                };
                return Ok(Served::Finished {
                    pid,
                    dir,
                    resumed_at: at,
                    pulled,
                });
            }
            Control::Failed { reason, .. } if !commit => return Ok(Served::Refused(reason)),
            Control::Failed { reason, .. } => {
                return Err(fail(commit, format!("the destination failed: {reason}")))
            }
            other => {
                return Err(fail(
                    commit,
                    format!("the destination sent '{}' out of turn", other.name()),
                ))
            }
        }
    }
}
