//! Framed messages over the TLS stream, with a hard bound on a frame's size and a time
//! limit on every read and write.
//!
//! A frame is a 4-byte big-endian length, then that many bytes: one kind byte and the
//! payload. A control frame's payload is a [`Control`] as JSON (at most
//! [`MAX_CONTROL`]); a chunk frame's is an 8-byte xxh3 of the data, then the data (at
//! most [`CHUNK_SIZE`]). A larger length is refused before anything is allocated: a
//! connection never holds more than one frame's buffer.

use std::io::{Read, Write};
use std::time::Duration;

use super::message::Control;

/// Whether a socket's error says only that the peer sent nothing within the socket's
/// time limit (a read on a socket with `SO_RCVTIMEO` fails with EAGAIN).
pub(super) fn is_silence(kind: std::io::ErrorKind) -> bool {
    matches!(
        kind,
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The most data one chunk frame carries.
pub const CHUNK_SIZE: usize = 1 << 20;
/// The largest control message (a topology report is a few KiB).
pub const MAX_CONTROL: usize = 1 << 20;
/// The largest frame accepted: a full chunk with its kind and digest.
pub const MAX_FRAME: usize = CHUNK_SIZE + 1 + 8;

const CONTROL: u8 = 1;
const CHUNK: u8 = 2;

/// Why a frame could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{peer} disconnected")]
    Disconnected { peer: String },
    #[error("{peer} sent nothing for {} s", timeout.as_secs())]
    Silent { peer: String, timeout: Duration },
    #[error("{peer}: a frame of {size} bytes, more than the {limit} allowed")]
    TooLarge {
        peer: String,
        size: usize,
        limit: usize,
    },
    #[error("{peer}: a malformed frame: {detail}")]
    Malformed { peer: String, detail: String },
    #[error("link with {peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
}

/// A stream a link runs over (the TLS stream of either side, or a test's pipe).
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// What a frame held.
#[derive(Debug)]
pub enum Incoming<'a> {
    Control(Control),
    Chunk { digest: u64, data: &'a [u8] },
}

/// One side's end of the migration's connection.
pub struct Link {
    stream: Box<dyn Stream>,
    peer: String,
    /// The time limit the stream's reads and writes were given, for messages.
    timeout: Duration,
    frame: Vec<u8>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("peer", &self.peer).finish()
    }
}

impl Link {
    /// A link over `stream`, whose reads and writes fail after `timeout` (set on the
    /// socket beneath by the caller).
    pub fn new(stream: Box<dyn Stream>, peer: String, timeout: Duration) -> Link {
        Link {
            stream,
            peer,
            timeout,
            frame: Vec::new(),
        }
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn error(&self, source: std::io::Error) -> LinkError {
        use std::io::ErrorKind::*;
        let peer = self.peer.clone();
        match source.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
                LinkError::Disconnected { peer }
            }
            kind if is_silence(kind) => LinkError::Silent {
                peer,
                timeout: self.timeout,
            },
            _ => LinkError::Io { peer, source },
        }
    }

    fn write_frame(&mut self, kind: u8, parts: &[&[u8]]) -> Result<(), LinkError> {
        let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
        let header = u32::try_from(len).map_err(|_| LinkError::TooLarge {
            peer: self.peer.clone(),
            size: len,
            limit: MAX_FRAME,
        })?;
        let mut write = || -> std::io::Result<()> {
            self.stream.write_all(&header.to_be_bytes())?;
            self.stream.write_all(&[kind])?;
            for part in parts {
                self.stream.write_all(part)?;
            }
            self.stream.flush()
        };
        write().map_err(|e| self.error(e))
    }

    /// Send a control message.
    pub fn send(&mut self, message: &Control) -> Result<(), LinkError> {
        let json = serde_json::to_vec(message).map_err(|e| LinkError::Malformed {
            peer: self.peer.clone(),
            detail: e.to_string(),
        })?;
        if json.len() > MAX_CONTROL {
            return Err(LinkError::TooLarge {
                peer: self.peer.clone(),
                size: json.len(),
                limit: MAX_CONTROL,
            });
        }
        self.write_frame(CONTROL, &[&json])
    }

    /// Send `data` (at most [`CHUNK_SIZE`] bytes) as a chunk with its xxh3.
    pub fn send_chunk(&mut self, data: &[u8]) -> Result<(), LinkError> {
        if data.len() > CHUNK_SIZE {
            return Err(LinkError::TooLarge {
                peer: self.peer.clone(),
                size: data.len(),
                limit: CHUNK_SIZE,
            });
        }
        let digest = twox_hash::XxHash3_64::oneshot(data).to_be_bytes();
        self.write_frame(CHUNK, &[&digest, data])
    }

    /// Whether a received chunk's `data` matches the `digest` its sender framed it with
    /// ([`Link::send_chunk`]).
    pub fn chunk_intact(digest: u64, data: &[u8]) -> bool {
        twox_hash::XxHash3_64::oneshot(data) == digest
    }

    /// The next frame, [`Control::Working`] skipped.
    pub fn receive(&mut self) -> Result<Incoming<'_>, LinkError> {
        self.receive_frame(true)
    }

    /// The next control message, [`Control::Working`] included: for a reader that has
    /// more to watch than this link, and looks at it between messages.
    pub fn receive_control_or_beat(&mut self) -> Result<Control, LinkError> {
        match self.receive_frame(false)? {
            Incoming::Control(message) => Ok(message),
            Incoming::Chunk { .. } => Err(LinkError::Malformed {
                peer: self.peer.clone(),
                detail: "a chunk where a control message was due".into(),
            }),
        }
    }

    fn receive_frame(&mut self, skip_beats: bool) -> Result<Incoming<'_>, LinkError> {
        loop {
            self.read_frame()?;
            let (kind, payload) = (self.frame[0], &self.frame[1..]);
            if kind == CONTROL {
                let message: Control =
                    serde_json::from_slice(payload).map_err(|e| LinkError::Malformed {
                        peer: self.peer.clone(),
                        detail: format!("control message: {e}"),
                    })?;
                if skip_beats && message == Control::Working {
                    continue;
                }
                return Ok(Incoming::Control(message));
            }
            break;
        }
        let (kind, payload) = (self.frame[0], &self.frame[1..]);
        if kind != CHUNK || payload.len() < 8 {
            return Err(LinkError::Malformed {
                peer: self.peer.clone(),
                detail: format!("frame kind {kind} of {} bytes", payload.len()),
            });
        }
        let mut digest = [0u8; 8];
        digest.copy_from_slice(&payload[..8]);
        Ok(Incoming::Chunk {
            digest: u64::from_be_bytes(digest),
            data: &payload[8..],
        })
    }

    /// The next control message, [`Control::Working`] skipped; a chunk is malformed here.
    pub fn receive_control(&mut self) -> Result<Control, LinkError> {
        match self.receive()? {
            Incoming::Control(message) => Ok(message),
            Incoming::Chunk { .. } => Err(LinkError::Malformed {
                peer: self.peer.clone(),
                detail: "a chunk where a control message was due".into(),
            }),
        }
    }

    fn read_frame(&mut self) -> Result<(), LinkError> {
        let mut header = [0u8; 4];
        if let Err(e) = self.stream.read_exact(&mut header) {
            return Err(self.error(e));
        }
        let len = u32::from_be_bytes(header) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(LinkError::TooLarge {
                peer: self.peer.clone(),
                size: len,
                limit: MAX_FRAME,
            });
        }
        self.frame.resize(len, 0);
        if let Err(e) = self.stream.read_exact(&mut self.frame) {
            return Err(self.error(e));
        }
        Ok(())
    }

    /// Run `work` on this thread while another sends [`Control::Working`] every
    /// `interval`, so that the peer's time limit measures silence, not work. The first
    /// failure to send stops the beats and is returned beside `work`'s result.
    pub fn beating_while<T>(
        &mut self,
        interval: Duration,
        work: impl FnOnce() -> T,
    ) -> (T, Result<(), LinkError>) {
        let stop = (std::sync::Mutex::new(false), std::sync::Condvar::new());
        std::thread::scope(|scope| {
            let beats = scope.spawn(|| {
                let (stopped, wake) = &stop;
                let mut stopped = stopped.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    // The work may be done before this thread first waits: its wake-up
                    // is then already gone, and only the flag says so.
                    let (now, _) = wake
                        .wait_timeout_while(stopped, interval, |done| !*done)
                        .unwrap_or_else(|e| e.into_inner());
                    stopped = now;
                    if *stopped {
                        return Ok(());
                    }
                    self.send(&Control::Working)?;
                }
            });
            let out = work();
            *stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            stop.1.notify_all();
            let beat = beats.join().unwrap_or_else(|_| {
                Err(LinkError::Malformed {
                    peer: String::new(),
                    detail: "the heartbeat thread panicked".into(),
                })
            });
            (out, beat)
        })
    }
}

/// Links for the migration's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use super::{Link, CHUNK};

    /// Two ends of one link, each read with a time limit of 5 s.
    pub(crate) fn pair() -> (Link, Link) {
        let (a, b) = UnixStream::pair().unwrap();
        let timeout = Duration::from_secs(5);
        for s in [&a, &b] {
            s.set_read_timeout(Some(timeout)).unwrap();
        }
        (
            Link::new(Box::new(a), "a".into(), timeout),
            Link::new(Box::new(b), "b".into(), timeout),
        )
    }

    /// A link whose next frame is a chunk of `data` with a digest that does not match.
    pub(crate) fn with_a_damaged_chunk(data: &[u8]) -> Link {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(1 + 8 + data.len() as u32).to_be_bytes());
        raw.push(CHUNK);
        raw.extend_from_slice(&0u64.to_be_bytes());
        raw.extend_from_slice(data);
        let (mut x, y) = UnixStream::pair().unwrap();
        x.write_all(&raw).unwrap();
        Link::new(Box::new(y), "y".into(), Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::testing::pair;
    use super::*;

    #[test]
    fn messages_and_chunks_arrive_as_sent_and_working_is_skipped() {
        let (mut a, mut b) = pair();
        a.send(&Control::Working).unwrap();
        a.send(&Control::AllIn).unwrap();
        a.send_chunk(b"some bytes").unwrap();
        assert_eq!(b.receive_control().unwrap(), Control::AllIn);
        match b.receive().unwrap() {
            Incoming::Chunk { digest, data } => {
                assert_eq!(data, b"some bytes");
                assert_eq!(digest, twox_hash::XxHash3_64::oneshot(b"some bytes"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn work_done_before_the_heartbeat_first_waits_ends_it_at_once() {
        // Before 2026-11-28 the heartbeat missed a wake-up that came before it first
        // waited, and the work's caller waited out a whole interval (2 s in a move).
        let (mut a, _b) = pair();
        let interval = Duration::from_secs(5);
        for round in 0..50 {
            let started = std::time::Instant::now();
            let (out, beat) = a.beating_while(interval, || round);
            assert_eq!(out, round);
            beat.unwrap();
            let took = started.elapsed();
            assert!(took < interval / 2, "round {round}: {took:?}");
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_read() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Link::new(Box::new(b), "b".into(), Duration::from_secs(5));
        let mut a = a;
        a.write_all(&(u32::MAX).to_be_bytes()).unwrap();
        let err = b.receive().unwrap_err();
        assert!(matches!(err, LinkError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn a_peer_gone_and_a_silent_peer_are_named() {
        let (a, mut b) = pair();
        drop(a);
        assert!(matches!(
            b.receive().unwrap_err(),
            LinkError::Disconnected { .. }
        ));
        let (x, y) = UnixStream::pair().unwrap();
        y.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut y = Link::new(Box::new(y), "y".into(), Duration::from_millis(50));
        let err = y.receive().unwrap_err();
        assert!(matches!(err, LinkError::Silent { .. }), "{err}");
        drop(x);
    }

    #[test]
    fn beats_flow_while_work_runs() {
        let (mut a, mut b) = pair();
        let (value, beat) = a.beating_while(Duration::from_millis(5), || {
            std::thread::sleep(Duration::from_millis(100));
            7
        });
        assert_eq!(value, 7);
        beat.unwrap();
        a.send(&Control::Done).unwrap();
        // The beats are skipped; what was sent after them arrives.
        assert_eq!(b.receive_control().unwrap(), Control::Done);
    }
}
