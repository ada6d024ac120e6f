//! A page server for CRIU's own dump: the memory pages come over a socket instead of
//! into the image directory, and only what the stopped tree cannot give back is
//! written there.
//!
//! Post-copy's source keeps the job stopped until the destination has every page, and
//! serves those pages from the stopped tree's memory (`migrate::tree_blocks`). The
//! pages need no copy on its disk then, but CRIU writes its pages files whole before
//! gpucr could know where each piece of them lies in the tree (the pagemap naming a
//! file's pieces is written last). Given a page server, CRIU sends every run of pages
//! after a header that names the process and the address (its page-server protocol,
//! [`wire`]); this one writes the pagemaps as CRIU's own page server would, and each
//! pages file sparse: a 4 KiB piece that equals the tree's memory at its address is
//! left out, and recorded ([`InTree`]), unless
//!
//! * it lies in memory that does not stay as CRIU dumped it (an executable mapping,
//!   where CRIU pokes its system calls; a shared or device mapping; any memory of a
//!   shared segment's file),
//! * it is in a file's last, partial block (the final checksum pass reads that from
//!   the disk), or in a file smaller than `BULK_THRESHOLD` (post-copy sends those
//!   whole, from the disk: they are read from the tree into the file at post-dump),
//!   or
//! * it holds a thread's restartable-sequences area, which the kernel rewrites each
//!   time the thread returns to user space, as it does to run CRIU's parasite: those
//!   are known at post-dump, from the threads' core images, and read from the tree
//!   then, stopped for good ([`PageServer::finish`]).
//!
//! Every piece's digest is taken from the bytes CRIU sent (or, for a thread's area,
//! read at post-dump), so the image's checksums are those of the pages as the
//! destination gets them. The socket is a stream socketpair whose other end CRIU
//! inherits (`criu_page_server_info.fd`): nothing else can connect to it.

use std::collections::{HashMap, HashSet};
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use gpucr_abi::procfs;
use gpucr_criu_image::encode::{image_bytes, push_entry};
use gpucr_criu_image::framing::Head;
use gpucr_criu_image::magic;
use gpucr_criu_image::proto::{PagemapEntry, PagemapHead};
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use super::page_digests::{readable_private_mappings, rseq_pieces, InTree, PageDigests};
use crate::exit_code::{self, ExitCode};
use crate::image::checksum::{BlockHasher, BLOCK_SIZE, PAGE_PIECE};
use crate::image::verify::BULK_THRESHOLD;

mod pages_file;
pub mod wire;

use pages_file::{Closed, PagesFile, TreeSource};
pub use wire::Layout;
use wire::{Command, Target, WireError, PE_PRESENT};

/// Bytes of pages read from the socket at a time.
const CHUNK: usize = 1 << 20;
/// How long the server may still be serving once CRIU is at post-dump (it closed the
/// session before: the writing of its last pages is all that is left).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The send buffer of CRIU's end of the socket.
const SOCKET_BUFFER: usize = 4 << 20;

/// Why the page server failed: CRIU's dump fails with it, and the tree runs on.
#[derive(Debug, thiserror::Error)]
pub enum PageServerError {
    #[error("cannot make the page server's socket: {0}")]
    Socket(#[source] io::Error),
    #[error("CRIU's page-server connection: {0}")]
    Wire(#[from] WireError),
    #[error("CRIU's page-server connection failed: {0}")]
    Connection(#[source] io::Error),
    #[error("CRIU's page-server connection ended before the dump did")]
    Unfinished,
    #[error("CRIU did not close its page-server session {0:?} after its post-dump notice")]
    NotClosed(std::time::Duration),
    #[error("CRIU asked the dump's page server for pages, which only a lazy restore does")]
    Get,
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{dir}: a thread's core image cannot be read, so its restartable-sequences area is not known")]
    Cores { dir: PathBuf },
    #[error(
        "{file}: cannot read the page at {addr:#x} from pid {pid} of the stopped tree \
         ({why})"
    )]
    Tree {
        file: String,
        pid: i32,
        addr: u64,
        why: String,
    },
    #[error("the page server's thread {0}")]
    Thread(String),
}

impl ExitCode for PageServerError {
    fn exit_code(&self) -> u8 {
        match self {
            PageServerError::Write { .. } => exit_code::IMAGE_DIR,
            _ => exit_code::CRIU_FAILED,
        }
    }
}

/// The socket pair, before CRIU starts: CRIU inherits [`Socket::criu_end`].
#[derive(Debug)]
pub struct Socket {
    ours: UnixStream,
    criu: OwnedFd,
}

impl Socket {
    pub fn new() -> Result<Socket, PageServerError> {
        let (ours, theirs) = UnixStream::pair().map_err(PageServerError::Socket)?;
        // Room for a few chunks in flight, so that CRIU does not wait on the reader
        // for every one (root may go past `net.core.wmem_max`; a smaller buffer only
        // costs time).
        use nix::sys::socket::{setsockopt, sockopt};
        if setsockopt(&theirs, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
            let _ = setsockopt(&theirs, sockopt::SndBuf, &SOCKET_BUFFER);
        }
        Ok(Socket {
            ours,
            criu: theirs.into(),
        })
    }

    /// The end CRIU writes to: inherited by `criu swrk` at this number, and named in
    /// its dump request.
    pub fn criu_end(&self) -> BorrowedFd<'_> {
        self.criu.as_fd()
    }

    /// Serve CRIU (`layout` is its version's) for the tree rooted at `root`, writing
    /// into `dir`. Our copy of CRIU's end is closed, so that the server sees CRIU go.
    pub fn serve(self, layout: Layout, root: i32, dir: PathBuf) -> PageServer {
        drop(self.criu);
        let stream = Arc::new(self.ours);
        let theirs = stream.clone();
        // Dropped as the thread ends, which `finish` waits for.
        let (ended, ends) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("gpucr-page-server".into())
            .spawn(move || {
                let _ended = ended;
                Server::new(layout, root, dir).run(&theirs)
            });
        PageServer {
            stream,
            ends,
            handle: Some(handle.map_err(|e| e.to_string())),
        }
    }
}

type Served = Result<Vec<Closed>, PageServerError>;

/// The page server's thread, running while CRIU dumps.
#[derive(Debug)]
pub struct PageServer {
    stream: Arc<UnixStream>,
    /// Disconnected once the thread has ended.
    ends: Receiver<()>,
    handle: Option<Result<JoinHandle<Served>, String>>,
}

impl PageServer {
    /// What the thread ended with (CRIU has closed the connection, or is gone).
    fn join(&mut self) -> Served {
        match self.handle.take() {
            Some(Ok(handle)) => handle
                .join()
                .unwrap_or_else(|_| Err(PageServerError::Thread("panicked".into()))),
            Some(Err(why)) => Err(PageServerError::Thread(format!("did not start: {why}"))),
            None => Err(PageServerError::Thread("was already joined".into())),
        }
    }

    /// CRIU failed: the server's own failure, when it had one (CRIU then only says
    /// that the connection broke).
    pub fn failure(mut self) -> Option<PageServerError> {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        match self.join() {
            Err(PageServerError::Unfinished) | Ok(_) => None,
            Err(e) => Some(e),
        }
    }

    /// CRIU is at post-dump: every pages file is written, and the tree is stopped
    /// for good. Read the threads' restartable-sequences areas from it into the
    /// files, and fold each file's digests into its leading full blocks.
    pub fn finish(self, dir: &Path) -> Result<PageDigests, PageServerError> {
        self.finish_within(dir, CLOSE_WAIT)
    }

    /// [`PageServer::finish`], the server given `wait` to end.
    fn finish_within(
        mut self,
        dir: &Path,
        wait: std::time::Duration,
    ) -> Result<PageDigests, PageServerError> {
        // CRIU closes the session before post-dump: a server still serving then would
        // wait for ever.
        if let Err(RecvTimeoutError::Timeout) = self.ends.recv_timeout(wait) {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            let _ = self.join();
            return Err(PageServerError::NotClosed(wait));
        }
        let files = self.join()?;
        let page_size = crate::units::host_page_size();
        let entries = std::fs::read_dir(dir)
            .and_then(|e| e.collect::<Result<Vec<_>, _>>())
            .map_err(|_| PageServerError::Cores { dir: dir.into() })?;
        let changing = rseq_pieces(dir, &entries, page_size)
            .ok_or(PageServerError::Cores { dir: dir.into() })?;
        let mut outcome = PageDigests::default();
        for mut file in files {
            read_back(&mut file, &changing)?;
            let full = (file.len / BLOCK_SIZE) as usize;
            let per_block = BLOCK_SIZE as usize / PAGE_PIECE;
            let blocks = file
                .digests
                .chunks_exact(per_block)
                .take(full)
                .map(|pieces| {
                    let mut hasher = BlockHasher::default();
                    pieces.iter().for_each(|&d| hasher.add_piece_digest(d));
                    hasher.finish()
                })
                .collect();
            outcome.prefixes.insert(file.name.clone(), blocks);
            outcome.from_tree += file.in_tree.bytes();
            outcome.from_files += file.written;
            if !file.in_tree.runs.is_empty() {
                outcome.in_tree.insert(file.name, file.in_tree);
            }
        }
        Ok(outcome)
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        if self.handle.is_some() {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            let _ = self.join();
        }
    }
}

/// Write into `file` the pieces it left to the tree that must be on the disk after
/// all, read from the stopped tree now, with their digests: those holding a thread's
/// restartable-sequences area (`changing`), and every one of a file smaller than
/// [`BULK_THRESHOLD`] (post-copy sends such a file whole, from the disk, instead of
/// serving it block by block).
fn read_back(file: &mut Closed, changing: &HashSet<u64>) -> Result<(), PageServerError> {
    let piece = PAGE_PIECE as u64;
    let hit: Vec<(u64, u64)> = match file.len < BULK_THRESHOLD {
        true => file
            .in_tree
            .runs
            .iter()
            .flat_map(|run| {
                (0..run.len)
                    .step_by(PAGE_PIECE)
                    .map(|at| (run.offset + at, run.addr + at))
            })
            .collect(),
        false => file
            .in_tree
            .runs
            .iter()
            .flat_map(|run| {
                changing
                    .iter()
                    .filter(|&&a| a >= run.addr && a < run.addr + run.len)
                    .map(|&a| (run.offset + (a - run.addr), a))
            })
            .collect(),
    };
    if hit.is_empty() {
        return Ok(());
    }
    let disk = std::fs::OpenOptions::new()
        .write(true)
        .open(&file.path)
        .map_err(|source| PageServerError::Write {
            path: file.path.clone(),
            source,
        })?;
    let pid = file.in_tree.pid;
    let mut bytes = vec![0u8; PAGE_PIECE];
    for &(offset, addr) in &hit {
        let remote = [RemoteIoVec {
            base: addr as usize,
            len: PAGE_PIECE,
        }];
        let got = process_vm_readv(
            Pid::from_raw(pid),
            &mut [IoSliceMut::new(&mut bytes)],
            &remote,
        );
        match got {
            Ok(n) if n == PAGE_PIECE => {}
            other => {
                return Err(PageServerError::Tree {
                    file: file.name.clone(),
                    pid,
                    addr,
                    why: match other {
                        Ok(n) => format!("{n} bytes of {PAGE_PIECE} read"),
                        Err(e) => e.to_string(),
                    },
                })
            }
        }
        disk.write_all_at(&bytes, offset)
            .map_err(|source| PageServerError::Write {
                path: file.path.clone(),
                source,
            })?;
        file.digests[(offset / piece) as usize] = crate::image::checksum::piece_digest(&bytes);
        file.written += piece;
    }
    let gone: HashSet<u64> = hit.iter().map(|&(offset, _)| offset).collect();
    let mut kept = InTree {
        pid,
        runs: Vec::new(),
    };
    for run in std::mem::take(&mut file.in_tree.runs) {
        for at in (0..run.len).step_by(PAGE_PIECE) {
            if !gone.contains(&(run.offset + at)) {
                kept.add_piece(run.offset + at, run.addr + at);
            }
        }
    }
    file.in_tree = kept;
    Ok(())
}

/// The protocol's state: the pagemap open now. The pages files are written by a
/// second thread ([`write_pages`]), so that reading CRIU's socket and comparing with
/// the tree run side by side, as CRIU's writes and the tree's digests did without a
/// page server.
struct Server {
    layout: Layout,
    root: i32,
    dir: PathBuf,
    page_size: u64,
    /// The tree's processes by their pid in its own namespace, as CRIU names them;
    /// read at the first process's pagemap (the tree is frozen by then).
    tasks: Option<HashMap<u64, i32>>,
    next_pages_id: u32,
    open: Option<Open>,
}

/// A pagemap being written (its pages file is the writer's).
struct Open {
    target: Target,
    pagemap: PathBuf,
    /// The pagemap image so far (written whole when CRIU moves on).
    entries: Vec<u8>,
}

/// What the reading thread hands the writing one, in CRIU's order.
enum Work {
    /// A new pages file: the one before it is finished.
    Open(PagesFile),
    /// The next bytes of the pages file open now, the memory from `addr` on: the first
    /// `len` of `buf`, which goes back to the reader once written.
    Take { addr: u64, buf: Vec<u8>, len: usize },
}

/// Buffers of [`CHUNK`] bytes between the two threads: the memory a connection holds.
const BUFFERS: usize = 4;

impl Server {
    fn new(layout: Layout, root: i32, dir: PathBuf) -> Server {
        Server {
            layout,
            root,
            dir,
            page_size: crate::units::host_page_size(),
            tasks: None,
            next_pages_id: 1,
            open: None,
        }
    }

    /// Answer CRIU until it closes the session; the pages files are written meanwhile
    /// by [`write_pages`]. The close is answered once every page is written, and not
    /// at all when the writing failed (CRIU's dump then fails).
    fn run(mut self, stream: &UnixStream) -> Served {
        let (work, works) = std::sync::mpsc::sync_channel::<Work>(BUFFERS);
        let (give_back, buffers) = std::sync::mpsc::sync_channel::<Vec<u8>>(BUFFERS);
        for _ in 0..BUFFERS {
            give_back
                .send(vec![0u8; CHUNK])
                .expect("room for every buffer");
        }
        std::thread::scope(|scope| {
            let writer = std::thread::Builder::new()
                .name("gpucr-pages-write".into())
                .spawn_scoped(scope, move || write_pages(works, give_back))
                .map_err(|e| PageServerError::Thread(format!("did not start: {e}")))?;
            let read = self.read(stream, &work, &buffers);
            drop(work);
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(PageServerError::Thread("panicked".into())));
            match (read, written) {
                // The writer stopped first: its failure is the cause.
                (_, Err(e)) => Err(e),
                (Err(e), Ok(_)) => Err(e),
                (Ok(()), Ok(closed)) => {
                    let mut stream = stream;
                    send(&mut stream, &0i32.to_le_bytes())?;
                    Ok(closed)
                }
            }
        })
    }

    /// Read CRIU's commands until its close, handing the pages to the writer.
    fn read(
        &mut self,
        stream: &UnixStream,
        work: &SyncSender<Work>,
        buffers: &Receiver<Vec<u8>>,
    ) -> Result<(), PageServerError> {
        let mut stream = stream;
        let mut header = vec![0u8; self.layout.header_len()];
        // The writer has stopped: it says why.
        let stopped = || PageServerError::Thread("that writes the pages files stopped".into());
        loop {
            read_exactly(&mut stream, &mut header)?;
            match self.layout.decode(&header)? {
                Command::Open { target, answered } => {
                    self.open(target, work).map_err(|e| e.or(stopped()))?;
                    if answered {
                        // No parent image: CRIU sends every page.
                        send(&mut stream, &[0])?;
                    }
                }
                Command::Parent { .. } => send(&mut stream, &0i32.to_le_bytes())?,
                Command::Add {
                    target,
                    vaddr,
                    nr_pages,
                    flags,
                } => {
                    if self.open.as_ref().map(|o| o.target) != Some(target) {
                        // CRIU's own server opens the pagemap then ("IO w/o open").
                        self.open(target, work).map_err(|e| e.or(stopped()))?;
                    }
                    let open = self.open.as_mut().expect("opened above");
                    let entry = PagemapEntry {
                        vaddr,
                        compat_nr_pages: match self.layout {
                            Layout::Narrow => nr_pages as u32,
                            Layout::Wide => 0,
                        },
                        in_parent: None,
                        flags: Some(flags),
                        nr_pages: (self.layout == Layout::Wide).then_some(nr_pages),
                    };
                    push_entry(&mut open.entries, &entry);
                    if flags & PE_PRESENT != 0 {
                        let len = nr_pages
                            .checked_mul(self.page_size)
                            .ok_or(PageServerError::Unfinished)?;
                        receive_pages(&mut stream, vaddr, len, work, buffers)
                            .map_err(|e| e.or(stopped()))?;
                    }
                }
                Command::Close => return self.close_open(),
                Command::Get => return Err(PageServerError::Get),
            }
        }
    }

    /// Finish the pagemap open now, if any, and open `target`'s with the next pages
    /// file, as CRIU numbers them.
    fn open(&mut self, target: Target, work: &SyncSender<Work>) -> Result<(), Handed> {
        self.close_open()?;
        let pages_id = self.next_pages_id;
        self.next_pages_id += 1;
        let tree = match target {
            Target::Task(vpid) => self.tree_source(vpid),
            Target::Shmem(_) => None,
        };
        let pages = PagesFile::create(&self.dir, format!("pages-{pages_id}.img"), tree)?;
        work.send(Work::Open(pages)).map_err(|_| Handed::Stopped)?;
        self.open = Some(Open {
            target,
            pagemap: self.dir.join(target.pagemap_name()),
            entries: image_bytes(Head::Common, magic::PAGEMAP, &[PagemapHead { pages_id }]),
        });
        Ok(())
    }

    /// Where the pages of the process `vpid` (in the tree's namespace) can be read.
    fn tree_source(&mut self, vpid: u64) -> Option<TreeSource> {
        let root = self.root;
        let tasks = self.tasks.get_or_insert_with(|| {
            procfs::tree_pids(root)
                .into_iter()
                .filter_map(|pid| Some((u64::from(crate::gpu::ns_pid(pid).ok()?), pid)))
                .collect()
        });
        let pid = *tasks.get(&vpid)?;
        let maps = std::fs::read_to_string(procfs::maps_path(pid)).ok()?;
        Some(TreeSource {
            pid,
            stable: readable_private_mappings(&maps),
        })
    }

    /// Write the pagemap open now, if any.
    fn close_open(&mut self) -> Result<(), PageServerError> {
        match self.open.take() {
            Some(open) => write_new(&open.pagemap, &open.entries),
            None => Ok(()),
        }
    }
}

/// Why the reader could not hand something to the writer.
enum Handed {
    /// Its own failure.
    Failed(PageServerError),
    /// The writer has stopped (its failure is the one to tell).
    Stopped,
}

impl Handed {
    fn or(self, stopped: PageServerError) -> PageServerError {
        match self {
            Handed::Failed(e) => e,
            Handed::Stopped => stopped,
        }
    }
}

impl From<PageServerError> for Handed {
    fn from(e: PageServerError) -> Handed {
        Handed::Failed(e)
    }
}

/// The writing thread: each pages file in turn, CRIU's bytes compared with the tree's
/// and written where they differ ([`PagesFile::take`]); the files, once the reader
/// is done.
fn write_pages(works: Receiver<Work>, give_back: SyncSender<Vec<u8>>) -> Served {
    let mut open: Option<PagesFile> = None;
    let mut closed = Vec::new();
    for work in works {
        match work {
            Work::Open(pages) => {
                if let Some(done) = open.replace(pages) {
                    closed.push(done.close()?);
                }
            }
            Work::Take { addr, buf, len } => {
                let pages = open.as_mut().ok_or(PageServerError::Unfinished)?;
                pages.take(addr, &buf[..len])?;
                // The reader is gone when this fails: nothing more comes.
                let _ = give_back.send(buf);
            }
        }
    }
    if let Some(done) = open {
        closed.push(done.close()?);
    }
    Ok(closed)
}

/// Fill `buf` from CRIU (a header, or pages); a connection that ends first ends
/// before the dump did.
fn read_exactly(stream: &mut impl Read, buf: &mut [u8]) -> Result<(), PageServerError> {
    stream.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => PageServerError::Unfinished,
        _ => PageServerError::Connection(e),
    })
}

fn send(stream: &mut impl Write, bytes: &[u8]) -> Result<(), PageServerError> {
    stream.write_all(bytes).map_err(PageServerError::Connection)
}

/// Receive `len` bytes of pages, the memory from `vaddr` on, into buffers handed to
/// the writer.
fn receive_pages(
    stream: &mut impl Read,
    vaddr: u64,
    len: u64,
    work: &SyncSender<Work>,
    buffers: &Receiver<Vec<u8>>,
) -> Result<(), Handed> {
    let mut done = 0u64;
    while done < len {
        let mut buf = buffers.recv().map_err(|_| Handed::Stopped)?;
        let n = (len - done).min(buf.len() as u64) as usize;
        read_exactly(stream, &mut buf[..n])?;
        work.send(Work::Take {
            addr: vaddr + done,
            buf,
            len: n,
        })
        .map_err(|_| Handed::Stopped)?;
        done += n as u64;
    }
    Ok(())
}

/// Write a new image file (0600), failing if it exists.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), PageServerError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|source| PageServerError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// For the tests here and below: `pieces` pieces of this process's own memory in a
/// page-aligned buffer (the buffer, and where the pieces start in it), each filled with
/// its number from 1, the first 8 bytes that number whole.
#[cfg(test)]
fn own_memory(pieces: usize) -> (Vec<u8>, usize) {
    let mut backing = vec![0u8; (pieces + 1) * PAGE_PIECE];
    let skip = (PAGE_PIECE - backing.as_ptr() as usize % PAGE_PIECE) % PAGE_PIECE;
    backing.truncate(skip + pieces * PAGE_PIECE);
    for (i, piece) in backing[skip..].chunks_exact_mut(PAGE_PIECE).enumerate() {
        let number = i as u64 + 1;
        piece.fill(number as u8);
        piece[..8].copy_from_slice(&number.to_le_bytes());
    }
    (backing, skip)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use gpucr_criu_image::pagemap::Pagemap;

    use super::*;
    use crate::image::checksum::block_digest;

    /// Play CRIU's part for `layout`: this process's memory as pid `vpid`'s, then a
    /// shared segment's page, then the close.
    fn play_criu(layout: Layout, socket: UnixStream, vpid: u64, addr: u64, memory: &[u8]) {
        let mut socket = socket;
        let task = Target::Task(vpid);
        let page = crate::units::host_page_size();
        socket
            .write_all(&layout.encode(&Command::Open {
                target: task,
                answered: true,
            }))
            .unwrap();
        let mut parent = [9u8; 1];
        socket.read_exact(&mut parent).unwrap();
        assert_eq!(parent, [0], "no parent image");
        // Two entries, as CRIU splits a run at its page pipe's limits.
        let half = memory.len() / 2 / page as usize * page as usize;
        for (at, bytes) in [(0, &memory[..half]), (half, &memory[half..])] {
            socket
                .write_all(&layout.encode(&Command::Add {
                    target: task,
                    vaddr: addr + at as u64,
                    nr_pages: bytes.len() as u64 / page,
                    flags: PE_PRESENT,
                }))
                .unwrap();
            socket.write_all(bytes).unwrap();
        }
        let shmem = Target::Shmem(77);
        socket
            .write_all(&layout.encode(&Command::Open {
                target: shmem,
                answered: false,
            }))
            .unwrap();
        socket
            .write_all(&layout.encode(&Command::Add {
                target: shmem,
                vaddr: 0,
                nr_pages: 1,
                flags: PE_PRESENT,
            }))
            .unwrap();
        socket.write_all(&vec![5u8; page as usize]).unwrap();
        socket.write_all(&layout.encode(&Command::Close)).unwrap();
        let mut status = [9u8; 4];
        socket.read_exact(&mut status).unwrap();
        assert_eq!(status, [0; 4]);
    }

    #[test]
    fn pages_criu_sends_leave_out_what_the_tree_holds_with_the_pagemaps_criu_writes() {
        let me = std::process::id() as i32;
        let vpid = u64::from(crate::gpu::ns_pid(me).unwrap());
        let bulk = (BULK_THRESHOLD / BLOCK_SIZE) as usize;
        // A file post-copy pulls block by block, and one it sends whole.
        for (layout, blocks) in [(Layout::Narrow, bulk), (Layout::Wide, bulk - 2)] {
            let (backing, skip) = own_memory(blocks * (BLOCK_SIZE as usize / PAGE_PIECE) + 2);
            let memory = &backing[skip..];
            let addr = memory.as_ptr() as u64;
            let dir = tempfile::tempdir().unwrap();
            let socket = Socket::new().unwrap();
            let criu = UnixStream::from(socket.criu.try_clone().unwrap());
            let server = socket.serve(layout, me, dir.path().to_path_buf());
            play_criu(layout, criu, vpid, addr, memory);
            let outcome = server.finish(dir.path()).unwrap();
            let whole = blocks * BLOCK_SIZE as usize;
            let pages = dir.path().join("pages-1.img");
            let on_disk = std::fs::read(&pages).unwrap();
            assert_eq!(on_disk.len(), memory.len());
            assert_eq!(on_disk[whole..], memory[whole..]);
            if blocks == bulk {
                // The whole blocks are the tree's; the two pieces after them are
                // written, as is the shared segment's page.
                let in_tree = &outcome.in_tree["pages-1.img"];
                assert_eq!(in_tree.pid, me);
                assert_eq!(in_tree.bytes(), whole as u64);
                assert_eq!(outcome.from_tree, whole as u64);
                assert_eq!(outcome.from_files, 3 * PAGE_PIECE as u64);
            } else {
                // Too small to be pulled: read from the tree into the file.
                assert!(outcome.in_tree.is_empty());
                assert_eq!(on_disk, memory);
                assert_eq!(outcome.from_files, memory.len() as u64 + PAGE_PIECE as u64);
            }
            // The digests are those of the pages as sent.
            let digests: Vec<u64> = memory
                .chunks(BLOCK_SIZE as usize)
                .take(blocks)
                .map(|b| block_digest(crate::image::checksum::Algorithm::CURRENT, b))
                .collect();
            assert_eq!(outcome.prefixes["pages-1.img"], digests);
            assert!(!outcome.in_tree.contains_key("pages-2.img"));
            assert_eq!(
                std::fs::read(dir.path().join("pages-2.img")).unwrap(),
                vec![5u8; 4096]
            );
            // The pagemaps read as CRIU's own.
            let page = crate::units::host_page_size();
            let pagemap =
                Pagemap::read(&dir.path().join(format!("pagemap-{vpid}.img")), page).unwrap();
            assert_eq!(pagemap.pages_file_name(), "pages-1.img");
            assert_eq!(pagemap.present_bytes(), memory.len() as u64);
            assert_eq!(pagemap.runs()[0].vaddr, addr);
            let shmem = Pagemap::read(&dir.path().join("pagemap-shmem-77.img"), page).unwrap();
            assert_eq!(shmem.pages_file_name(), "pages-2.img");
            assert_eq!(shmem.present_pages(), 1);
        }
    }

    #[test]
    fn a_connection_that_ends_before_the_close_or_speaks_nonsense_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let socket = Socket::new().unwrap();
        let mut criu = UnixStream::from(socket.criu.try_clone().unwrap());
        let server = socket.serve(Layout::Wide, std::process::id() as i32, dir.path().into());
        criu.write_all(&[1, 2, 3]).unwrap();
        drop(criu);
        assert!(matches!(
            server.finish(dir.path()),
            Err(PageServerError::Unfinished)
        ));
        let socket = Socket::new().unwrap();
        let mut criu = UnixStream::from(socket.criu.try_clone().unwrap());
        let server = socket.serve(Layout::Wide, std::process::id() as i32, dir.path().into());
        criu.write_all(&[0x55; 32]).unwrap();
        let error = server.failure().expect("its own failure");
        assert!(
            error.to_string().contains("unknown page-server command"),
            "{error}"
        );
        drop(criu);
    }

    #[test]
    fn a_session_still_open_at_post_dump_fails_the_dump_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let socket = Socket::new().unwrap();
        let mut criu = UnixStream::from(socket.criu.try_clone().unwrap());
        let server = socket.serve(Layout::Wide, std::process::id() as i32, dir.path().into());
        criu.write_all(&Layout::Wide.encode(&Command::Open {
            target: Target::Shmem(3),
            answered: false,
        }))
        .unwrap();
        let started = std::time::Instant::now();
        let error = server
            .finish_within(dir.path(), std::time::Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(error, PageServerError::NotClosed(_)), "{error}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        drop(criu);
    }

    #[test]
    fn a_pages_file_that_cannot_be_written_fails_the_server_by_its_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"in the way").unwrap();
        let socket = Socket::new().unwrap();
        let mut criu = UnixStream::from(socket.criu.try_clone().unwrap());
        let server = socket.serve(Layout::Narrow, std::process::id() as i32, dir.path().into());
        criu.write_all(&Layout::Narrow.encode(&Command::Open {
            target: Target::Task(1),
            answered: true,
        }))
        .unwrap();
        let error = server.failure().expect("its own failure");
        assert_eq!(error.exit_code(), exit_code::IMAGE_DIR);
        assert!(error.to_string().contains("pages-1.img"), "{error}");
    }
}
