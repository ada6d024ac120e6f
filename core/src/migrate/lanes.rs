//! The lanes: connections beside the control link that carry the memory pages and the
//! GPU data in parallel, as parts ([`Control::Part`], then the chunk).
//!
//! The source asks for lanes in its Offer; the receiver grants at most [`MAX_LANES`]
//! and gives a ticket (16 random bytes) in its Accept. Each lane is a connection of its
//! own to the same port, with the same mutual TLS (so the same pinned certificates),
//! Hello, then Join with the ticket: a connection that does not join with it is
//! dropped, and a migration whose lanes have not all joined within the link's time
//! limit is refused. A lane's memory is bounded as the control link's: one frame.
//!
//! On the source, [`Lanes`] runs one thread per lane, each fed pieces of the staging
//! files (round robin) that it reads, sends and punches out of the file; a lane with
//! nothing to send sends Working. At the end each lane sends Done and waits for the
//! receiver's Done, which comes once all its parts are written. On the receiver,
//! [`Readers`] runs one thread per lane writing each part where it says
//! ([`PartsWriter`]); the control thread looks at them between its own messages.

use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::{fallocate, FallocateFlags};

use super::files::FilesError;
use super::identity::Identity;
use super::link::{Incoming, Link, CHUNK_SIZE};
use super::message::Control;
use super::parts::PartsWriter;

/// The most lanes a receiver grants one migration.
pub const MAX_LANES: u32 = 8;

/// How many pieces wait for each lane.
const QUEUED: usize = 2;

/// A piece of a staging file for a lane to send: `len` bytes at `offset` of `name`,
/// punched out of the file once sent.
#[derive(Debug)]
pub struct Piece {
    pub name: String,
    pub path: PathBuf,
    pub file: Arc<File>,
    pub offset: u64,
    pub len: usize,
}

/// The source's lanes, each a thread that owns its link.
#[derive(Debug)]
pub struct Lanes {
    queues: Vec<SyncSender<Piece>>,
    threads: Vec<Option<JoinHandle<Result<(), FilesError>>>>,
    next: usize,
    sent: Arc<AtomicU64>,
}

impl Lanes {
    /// Start a thread for each of `links`: each sends Working when it had nothing to
    /// send for `beat`, and pauses `throttle` (a test's) after each chunk.
    pub fn start(links: Vec<Link>, beat: Duration, throttle: Option<Duration>) -> Lanes {
        let sent = Arc::new(AtomicU64::new(0));
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for link in links {
            let (queue, pieces) = sync_channel(QUEUED);
            let sent = sent.clone();
            queues.push(queue);
            threads.push(Some(std::thread::spawn(move || {
                send_pieces(link, pieces, beat, throttle, &sent)
            })));
        }
        Lanes {
            queues,
            threads,
            next: 0,
            sent,
        }
    }

    /// The bytes the lanes have sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Give `piece` to the next lane (waiting while its queue is full); a lane that
    /// failed stops the migration with its error.
    pub fn send(&mut self, piece: Piece) -> Result<(), FilesError> {
        let lane = self.next % self.queues.len();
        self.next += 1;
        if self.queues[lane].send(piece).is_err() {
            return Err(self.failure(lane));
        }
        Ok(())
    }

    /// Why the lane `lane`, whose thread ended, failed.
    fn failure(&mut self, lane: usize) -> FilesError {
        match self.threads[lane].take().map(join_lane) {
            Some(Err(e)) => e,
            _ => FilesError::Unexpected {
                message: "the end of a lane's thread",
            },
        }
    }

    /// Every piece was given: each lane sends what it has, then Done, and waits for
    /// the receiver's Done. The first lane's failure, if any.
    pub fn finish(mut self) -> Result<u64, FilesError> {
        self.queues.clear();
        let mut first = Ok(());
        for thread in &mut self.threads {
            if let Some(ended) = thread.take().map(join_lane) {
                if first.is_ok() {
                    first = ended;
                }
            }
        }
        first.map(|()| self.sent())
    }
}

/// A lane's thread: send each piece given, Working when none came for `beat`, and
/// Done once the pieces end (then wait for the receiver's Done).
fn send_pieces(
    mut link: Link,
    pieces: Receiver<Piece>,
    beat: Duration,
    throttle: Option<Duration>,
    sent: &AtomicU64,
) -> Result<(), FilesError> {
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let piece = match pieces.recv_timeout(beat) {
            Ok(piece) => piece,
            Err(RecvTimeoutError::Timeout) => {
                link.send(&Control::Working)?;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let data = &mut buf[..piece.len.min(CHUNK_SIZE)];
        piece
            .file
            .read_exact_at(data, piece.offset)
            .map_err(|source| FilesError::Read {
                path: piece.path.clone(),
                source,
            })?;
        link.send(&Control::Part {
            path: piece.name.clone(),
            offset: piece.offset,
        })?;
        link.send_chunk(data)?;
        // The bytes are on their way: the staging file need not keep them. A file
        // system without hole punching keeps them until the staging directory goes.
        let _ = fallocate(
            piece.file.as_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            piece.offset as i64,
            data.len() as i64,
        );
        sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        if let Some(pause) = throttle {
            std::thread::sleep(pause);
        }
    }
    link.send(&Control::Done)?;
    match link.receive_control()? {
        Control::Done => Ok(()),
        Control::Failed { reason, .. } => Err(FilesError::Refused { reason }),
        other => Err(FilesError::Unexpected {
            message: other.name(),
        }),
    }
}

/// A fresh ticket: 16 random bytes, in hex.
pub fn new_ticket() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Why the lanes of a migration did not all join.
#[derive(Debug, thiserror::Error)]
#[error("{joined} of {wanted} lanes joined within {} s; the last refused: {last}", within.as_secs())]
pub struct JoinError {
    pub wanted: u32,
    pub joined: u32,
    pub within: Duration,
    pub last: String,
}

/// At most this many connections are in their handshake at once while lanes join; more
/// wait in the listener's backlog.
const HANDSHAKES_AT_ONCE: usize = 2 * MAX_LANES as usize;

/// How often the joining loop looks at the handshakes that ended.
const JOIN_TICK: Duration = Duration::from_millis(20);

/// Accept `count` lanes on `listener` for the migration whose Accept gave `ticket`,
/// within `timeout`: the links, in lane order. A connection that fails the handshake,
/// or does not join with the ticket, is dropped and told why. Each connection's
/// handshake runs on a thread of its own (at most [`HANDSHAKES_AT_ONCE`] at once), so a
/// peer that connects and stalls holds up no lane behind it; those still in their
/// handshake when the lanes are all in (or the time is up) are shut down.
pub fn join(
    listener: &TcpListener,
    identity: &Identity,
    ticket: &str,
    count: u32,
    timeout: Duration,
) -> Result<Vec<Link>, JoinError> {
    let deadline = Instant::now() + timeout;
    let mut lanes: Vec<Option<Link>> = (0..count).map(|_| None).collect();
    let mut joined = 0;
    let mut last = String::from("none came");
    let (ended, outcomes) = std::sync::mpsc::channel::<(u64, Result<(usize, Link), String>)>();
    std::thread::scope(|scope| {
        // A second handle on each connection still in its handshake, to end it.
        let mut shaking: std::collections::HashMap<u64, std::net::TcpStream> = Default::default();
        let mut next = 0u64;
        while joined < count {
            for (id, outcome) in outcomes.try_iter() {
                shaking.remove(&id);
                match outcome {
                    Ok((lane, link)) if lanes[lane].is_none() => {
                        lanes[lane] = Some(link);
                        joined += 1;
                    }
                    Ok((lane, mut link)) => {
                        last = format!("lane {lane} joined twice");
                        let _ = link.send(&Control::Failed {
                            code: crate::exit_code::MIGRATION_FAILED,
                            reason: last.clone(),
                        });
                    }
                    Err(why) => last = why,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if joined == count || left.is_zero() {
                break;
            }
            if shaking.len() >= HANDSHAKES_AT_ONCE {
                std::thread::sleep(JOIN_TICK.min(left));
                continue;
            }
            if !matches!(
                crate::wait::readable([listener.as_fd()], Some(JOIN_TICK.min(left))),
                Ok(Some(_))
            ) {
                continue;
            }
            let Ok((tcp, _)) = listener.accept() else {
                continue;
            };
            let Ok(handle) = tcp.try_clone() else {
                continue;
            };
            let id = next;
            next += 1;
            shaking.insert(id, handle);
            let ended = ended.clone();
            scope.spawn(move || {
                let outcome = accept_lane(tcp, identity, ticket, count, left);
                let _ = ended.send((id, outcome));
            });
        }
        for connection in shaking.values() {
            let _ = connection.shutdown(std::net::Shutdown::Both);
        }
    });
    if joined < count {
        return Err(JoinError {
            wanted: count,
            joined,
            within: timeout,
            last,
        });
    }
    Ok(lanes.into_iter().flatten().collect())
}

/// One connection that should be a lane: its handshake, Hello and Join checked. Its
/// number and link, or why not.
fn accept_lane(
    tcp: std::net::TcpStream,
    identity: &Identity,
    ticket: &str,
    count: u32,
    timeout: Duration,
) -> Result<(usize, Link), String> {
    let mut link = super::accept(tcp, identity, timeout).map_err(|e| e.to_string())?;
    let peer = link.peer().to_owned();
    let refuse = |link: &mut Link, why: String| {
        let _ = link.send(&Control::Failed {
            code: crate::exit_code::MIGRATION_FAILED,
            reason: why.clone(),
        });
        why
    };
    match link.receive_control() {
        Ok(Control::Join { ticket: t, lane }) if t == ticket && lane < count => {
            Ok((lane as usize, link))
        }
        Ok(Control::Join { lane, .. }) => {
            let why = format!("{peer}: lane {lane} joined with a wrong ticket or number");
            Err(refuse(&mut link, why))
        }
        Ok(other) => {
            let why = format!(
                "{peer}: sent '{}' where a lane's join was due (a migration is under way \
                 here)",
                other.name()
            );
            Err(refuse(&mut link, why))
        }
        Err(e) => Err(format!("{peer}: {e}")),
    }
}

/// The receiver's lanes, each a thread writing the parts it receives.
#[derive(Debug)]
pub struct Readers {
    threads: Vec<Option<JoinHandle<Result<(), FilesError>>>>,
}

impl Readers {
    /// Start a thread for each of `links`, writing with `writer`.
    pub fn start(links: Vec<Link>, writer: &Arc<PartsWriter>) -> Readers {
        let threads = links
            .into_iter()
            .map(|link| {
                let writer = writer.clone();
                Some(std::thread::spawn(move || write_parts(link, &writer)))
            })
            .collect();
        Readers { threads }
    }

    /// The failure of a lane that has ended with one, if any.
    pub fn failed(&mut self) -> Option<FilesError> {
        for thread in &mut self.threads {
            if thread.as_ref().is_some_and(JoinHandle::is_finished) {
                if let Some(Err(e)) = thread.take().map(join_lane) {
                    return Some(e);
                }
            }
        }
        None
    }

    /// The failure of a lane that ends with one within `limit`, if any.
    pub fn failed_within(&mut self, limit: Duration) -> Option<FilesError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(failure) = self.failed() {
                return Some(failure);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait for every lane's Done; the first failure, if any.
    pub fn finish(mut self) -> Result<(), FilesError> {
        let mut first = Ok(());
        for thread in &mut self.threads {
            if let Some(ended) = thread.take().map(join_lane) {
                if first.is_ok() {
                    first = ended;
                }
            }
        }
        first
    }
}

/// A lane's thread's end: its own, or its panic as a failure.
fn join_lane(thread: JoinHandle<Result<(), FilesError>>) -> Result<(), FilesError> {
    thread.join().unwrap_or(Err(FilesError::Unexpected {
        message: "a panic of a lane's thread",
    }))
}

/// A lane's thread on the receiver: write each part where it says, until Done (then
/// answer Done).
fn write_parts(mut link: Link, writer: &PartsWriter) -> Result<(), FilesError> {
    loop {
        let (path, offset) = match link.receive_control()? {
            Control::Part { path, offset } => (path, offset),
            Control::Done => break,
            other => {
                return Err(FilesError::Unexpected {
                    message: other.name(),
                })
            }
        };
        match link.receive()? {
            Incoming::Chunk { digest, data } => writer.write(&path, offset, digest, data)?,
            Incoming::Control(other) => {
                return Err(FilesError::Unexpected {
                    message: other.name(),
                })
            }
        }
    }
    link.send(&Control::Done)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;
    use crate::migrate::identity::keygen;
    use crate::migrate::identity::testing::identity;
    use crate::migrate::tls;

    /// A lane's connection from the source's side: the handshake, Hello, Join.
    fn open(addr: std::net::SocketAddr, source: &Identity, ticket: &str, lane: u32) -> Link {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let stream = tls::connect(tcp, source).unwrap();
        let mut link = Link::new(Box::new(stream), "receiver".into(), Duration::from_secs(10));
        crate::migrate::hello(&mut link).unwrap();
        link.send(&Control::Join {
            ticket: ticket.into(),
            lane,
        })
        .unwrap();
        link
    }

    #[test]
    fn lanes_join_with_the_ticket_and_nothing_else_does() {
        let keys = tempfile::tempdir().unwrap();
        keygen(keys.path(), "source").unwrap();
        keygen(keys.path(), "receiver").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ticket = new_ticket().unwrap();
        assert_eq!(ticket.len(), 32);
        assert_ne!(ticket, new_ticket().unwrap());
        let source = identity(keys.path(), "source", "receiver");
        let opener = std::thread::spawn({
            let ticket = ticket.clone();
            move || {
                let mut wrong = open(addr, &source, "0123", 0);
                let refused = wrong.receive_control().unwrap();
                assert!(
                    matches!(&refused, Control::Failed { reason, .. } if reason.contains("wrong ticket")),
                    "{refused:?}"
                );
                let mut lanes = vec![
                    open(addr, &source, &ticket, 1),
                    open(addr, &source, &ticket, 0),
                ];
                for (k, lane) in lanes.iter_mut().enumerate() {
                    lane.send(&Control::Part {
                        path: format!("lane-{k}"),
                        offset: 0,
                    })
                    .unwrap();
                }
                lanes
            }
        });
        let receiver = identity(keys.path(), "receiver", "source");
        let mut joined = join(&listener, &receiver, &ticket, 2, Duration::from_secs(10)).unwrap();
        let _lanes = opener.join().unwrap();
        // In lane order: lane 0 is the one opened second.
        let first = joined[0].receive_control().unwrap();
        assert!(
            matches!(first, Control::Part { ref path, .. } if path == "lane-1"),
            "{first:?}"
        );

        // A peer that connects and says nothing holds up no lane behind it: the
        // lanes join within a time limit its handshake would use up on its own.
        let stalled = TcpStream::connect(addr).unwrap();
        let opener = std::thread::spawn({
            let ticket = ticket.clone();
            let source = identity(keys.path(), "source", "receiver");
            move || {
                std::thread::sleep(Duration::from_millis(100));
                vec![
                    open(addr, &source, &ticket, 0),
                    open(addr, &source, &ticket, 1),
                ]
            }
        });
        let joined = join(&listener, &receiver, &ticket, 2, Duration::from_secs(5)).unwrap();
        assert_eq!(joined.len(), 2);
        let _lanes = opener.join().unwrap();
        // ... and it was shut down once the lanes were in.
        let mut byte = [0u8; 1];
        stalled
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(std::io::Read::read(&mut &stalled, &mut byte).unwrap(), 0);

        // Too few: the time limit names what came last.
        let err = join(&listener, &receiver, &ticket, 1, Duration::from_millis(200)).unwrap_err();
        assert_eq!((err.wanted, err.joined), (1, 0));
        assert!(err.to_string().contains("none came"), "{err}");
    }
}
