//! The stream of the memory pages and the GPU memory while they are dumped, over the
//! lanes ([`super::lanes`]).
//!
//! CRIU writes each `pages-N.img` from start to end and never rewrites a byte of it, and
//! so does each pack thread of the transfer engine its `gpu/data-NNNN`. So while the
//! dump runs, a thread watches the staging directory and gives every whole chunk of such
//! a file that has landed to the next lane, which sends it (Part, then the chunk) and
//! punches it out of the staging file: the memory crosses the link as it is dumped, in
//! parallel, and the source's disk never holds a full copy of it. Once CRIU is done, the
//! rest of each file follows the same way, the lanes end, and Whole with each file's
//! size goes on the control link. Meanwhile the control link carries Working every
//! heartbeat, as [`Link::beating_while`] does.
//!
//! Stop-and-copy streams the pages files and the GPU data files; post-copy only the GPU
//! data (the pages are served from the staging image later).
//!
//! The staging files are punched out, so their contents are not read back after the
//! dump: the migration's dump records the pages files by size only (the GPU data files'
//! chunks are checked against `gpu/index` at restore anyway), and each chunk's xxh3 is
//! what the receiver checks them against on arrival.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::files::FilesError;
use super::lanes::{Lanes, Piece};
use super::link::{Link, CHUNK_SIZE};
use super::message::Control;
use crate::image::checksum::is_pages_file;
use crate::transfer::{is_data_file_name, GPU_DIR};

/// How long the thread waits for CRIU to write more when it found nothing to send.
const LOOK_AGAIN: Duration = Duration::from_millis(2);

/// Which files of the dump stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The memory pages files and the GPU data files (stop-and-copy).
    PagesAndGpuData,
    /// The GPU data files only (post-copy).
    GpuData,
}

/// The files streamed so far: each one open, and how much of it was given to a lane.
#[derive(Debug)]
pub struct Streamed {
    pick: Pick,
    files: BTreeMap<String, Sent>,
    /// Bytes given to the lanes while CRIU dumped.
    pub while_dumping: u64,
    /// When the first of them was.
    pub first_sent: Option<Instant>,
}

#[derive(Debug)]
struct Sent {
    path: PathBuf,
    file: Arc<File>,
    offset: u64,
}

impl Streamed {
    fn new(pick: Pick) -> Streamed {
        Streamed {
            pick,
            files: BTreeMap::new(),
            while_dumping: 0,
            first_sent: None,
        }
    }

    /// Whether the file `name` went (or goes) in parts.
    pub fn has(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// Send what is left of every streamed file of `dir` (those not begun yet too),
    /// end the lanes, then Whole for each file on `link`, which carries Working every
    /// `beat` meanwhile: once the dump is done with them. The bytes the lanes sent.
    pub fn finish(
        &mut self,
        link: &mut Link,
        mut lanes: Lanes,
        dir: &Path,
        beat: Duration,
    ) -> Result<u64, FilesError> {
        let (sent, beats) = link.beating_while(beat, || {
            self.open_new(dir)?;
            let mut sizes = Vec::new();
            for (name, file) in &mut self.files {
                let size = file
                    .file
                    .metadata()
                    .map_err(|source| FilesError::Read {
                        path: file.path.clone(),
                        source,
                    })?
                    .len();
                while file.offset < size {
                    lanes.send(file.piece(name, size - file.offset))?;
                }
                sizes.push((name.clone(), size));
            }
            Ok::<_, FilesError>((lanes.finish()?, sizes))
        });
        let (sent, sizes) = sent?;
        beats?;
        for (name, size) in sizes {
            link.send(&Control::Whole { path: name, size })?;
        }
        Ok(sent)
    }

    /// Open the streamed files of `dir` not open yet: its pages files (when picked),
    /// and the GPU data files in its `gpu/`.
    fn open_new(&mut self, dir: &Path) -> Result<(), FilesError> {
        let mut names = match self.pick {
            Pick::PagesAndGpuData => appended_files(dir, "", is_pages_file)?,
            Pick::GpuData => Vec::new(),
        };
        let gpu = dir.join(GPU_DIR);
        if gpu.is_dir() {
            names.extend(appended_files(&gpu, GPU_DIR, is_data_file_name)?);
        }
        for name in names {
            if self.files.contains_key(&name) {
                continue;
            }
            let path = dir.join(&name);
            // Written to only by the holes punched behind the lanes.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|source| FilesError::Read {
                    path: path.clone(),
                    source,
                })?;
            self.files.insert(
                name,
                Sent {
                    path,
                    file: Arc::new(file),
                    offset: 0,
                },
            );
        }
        Ok(())
    }

    /// Give every whole chunk that has landed in the streamed files of `dir` since the
    /// last look to the lanes; the bytes given.
    fn send_landed(&mut self, lanes: &mut Lanes, dir: &Path) -> Result<u64, FilesError> {
        self.open_new(dir)?;
        let mut bytes = 0;
        for (name, file) in &mut self.files {
            let size = file.file.metadata().map(|m| m.len()).unwrap_or(0);
            while size.saturating_sub(file.offset) >= CHUNK_SIZE as u64 {
                let piece = file.piece(name, CHUNK_SIZE as u64);
                bytes += piece.len as u64;
                lanes.send(piece)?;
            }
        }
        if bytes > 0 && self.first_sent.is_none() {
            self.first_sent = Some(Instant::now());
        }
        self.while_dumping += bytes;
        Ok(bytes)
    }
}

/// The names (below `prefix`) of the files of `dir` that `appended` picks.
fn appended_files(
    dir: &Path,
    prefix: &str,
    appended: fn(&str) -> bool,
) -> Result<Vec<String>, FilesError> {
    let read = |source| FilesError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let name = entry.map_err(read)?.file_name();
        if let Some(name) = name.to_str().filter(|n| appended(n)) {
            names.push(match prefix {
                "" => name.to_owned(),
                _ => format!("{prefix}/{name}"),
            });
        }
    }
    Ok(names)
}

impl Sent {
    /// The next piece of the file, up to `most` bytes (at most a chunk), for a lane.
    fn piece(&mut self, name: &str, most: u64) -> Piece {
        let len = most.min(CHUNK_SIZE as u64) as usize;
        let piece = Piece {
            name: name.to_owned(),
            path: self.path.clone(),
            file: self.file.clone(),
            offset: self.offset,
            len,
        };
        self.offset += len as u64;
        piece
    }
}

/// Run `work` (the dump into `dir`) on this thread while another gives the files `pick`
/// names, as the dump writes them into `dir`, to the `lanes`, and sends Working on
/// `link` every `interval`. The first failure stops the stream and is returned beside
/// `work`'s result; else what was streamed, for [`Streamed::finish`].
pub fn streaming_while<T>(
    link: &mut Link,
    lanes: &mut Lanes,
    dir: &Path,
    pick: Pick,
    interval: Duration,
    work: impl FnOnce() -> T,
) -> (T, Result<Streamed, FilesError>) {
    let stop = (Mutex::new(false), Condvar::new());
    std::thread::scope(|scope| {
        let streamer = scope.spawn(|| {
            let mut streamed = Streamed::new(pick);
            let mut last_beat = Instant::now();
            let (stopped, wake) = &stop;
            loop {
                // The staging directory exists once the dump has made it.
                let landed = if dir.is_dir() {
                    streamed.send_landed(lanes, dir)?
                } else {
                    0
                };
                if last_beat.elapsed() >= interval {
                    link.send(&Control::Working)?;
                    last_beat = Instant::now();
                }
                let guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
                if *guard {
                    return Ok(streamed);
                }
                if landed == 0 {
                    let (guard, _) = wake
                        .wait_timeout(guard, LOOK_AGAIN)
                        .unwrap_or_else(|e| e.into_inner());
                    if *guard {
                        return Ok(streamed);
                    }
                }
            }
        });
        let out = work();
        *stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        stop.1.notify_all();
        let streamed = streamer.join().unwrap_or_else(|_| {
            Err(FilesError::Unexpected {
                message: "a panic of the stream's thread",
            })
        });
        (out, streamed)
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::migrate::lanes::Readers;
    use crate::migrate::link::testing::pair;
    use crate::migrate::parts::PartsWriter;

    /// What a receiver does with what the stream sends: the lanes' parts written, each
    /// file checked at Whole, until Done on the control link.
    fn receive_all(
        mut control: Link,
        lanes: Vec<Link>,
        root: &Path,
    ) -> Result<(u64, u64), FilesError> {
        let writer = Arc::new(PartsWriter::new(root));
        let mut readers = Some(Readers::start(lanes, &writer));
        loop {
            match control.receive_control()? {
                Control::Whole { path, size } => {
                    if let Some(readers) = readers.take() {
                        readers.finish()?;
                    }
                    writer.whole(&path, size)?
                }
                Control::Done => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(writer.unfinished(), None);
        Ok(writer.written())
    }

    fn lanes(count: usize) -> (Lanes, Vec<Link>) {
        let (ours, theirs): (Vec<Link>, Vec<Link>) = (0..count).map(|_| pair()).unzip();
        (Lanes::start(ours, Duration::from_millis(5), None), theirs)
    }

    #[test]
    fn files_written_while_the_work_runs_cross_and_are_punched_out_behind() {
        let staging = tempfile::tempdir().unwrap();
        let received = tempfile::tempdir().unwrap();
        let (mut a, b) = pair();
        let (mut lanes, theirs) = lanes(3);
        let receiver = std::thread::spawn({
            let root = received.path().to_path_buf();
            move || receive_all(b, theirs, &root)
        });
        let content: Vec<u8> = (0..(5 * CHUNK_SIZE + 100))
            .map(|i| (i % 253) as u8)
            .collect();
        let dir = staging.path().to_path_buf();
        let ((), streamed) = streaming_while(
            &mut a,
            &mut lanes,
            &dir,
            Pick::PagesAndGpuData,
            Duration::from_millis(5),
            || {
                // "CRIU" writes four chunks, waits for them to cross, then the rest.
                let mut file = File::create(dir.join("pages-1.img")).unwrap();
                file.write_all(&content[..4 * CHUNK_SIZE]).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                file.write_all(&content[4 * CHUNK_SIZE..]).unwrap();
                std::fs::write(dir.join("core-1.img"), b"not a pages file").unwrap();
                std::fs::create_dir(dir.join("gpu")).unwrap();
                std::fs::write(dir.join("gpu/data-0000"), &content[..100]).unwrap();
                std::fs::write(dir.join("gpu/index"), b"not a data file").unwrap();
            },
        );
        let mut streamed = streamed.unwrap();
        assert!(streamed.while_dumping >= 4 * CHUNK_SIZE as u64);
        let sent = streamed
            .finish(&mut a, lanes, &dir, Duration::from_millis(5))
            .unwrap();
        assert!(streamed.has("pages-1.img") && streamed.has("gpu/data-0000"));
        assert!(!streamed.has("core-1.img") && !streamed.has("gpu/index"));
        assert_eq!(sent, content.len() as u64 + 100);
        a.send(&Control::Done).unwrap();
        let written = receiver.join().unwrap().unwrap();
        assert_eq!(written, (2, content.len() as u64 + 100));
        assert_eq!(
            std::fs::read(received.path().join("gpu/data-0000")).unwrap(),
            &content[..100]
        );
        assert_eq!(
            std::fs::read(received.path().join("pages-1.img")).unwrap(),
            content
        );
        // The staging file keeps its size, and no block of its bytes but the one the
        // last 100 bytes share (a hole is punched in whole blocks only).
        let staged = std::fs::metadata(dir.join("pages-1.img")).unwrap();
        assert_eq!(staged.len(), content.len() as u64);
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&staged) <= 8,
            "{} blocks left",
            std::os::unix::fs::MetadataExt::blocks(&staged)
        );
    }

    #[test]
    fn post_copy_streams_the_gpu_data_only() {
        let staging = tempfile::tempdir().unwrap();
        let received = tempfile::tempdir().unwrap();
        let (mut a, b) = pair();
        let (mut lanes, theirs) = lanes(2);
        let receiver = std::thread::spawn({
            let root = received.path().to_path_buf();
            move || receive_all(b, theirs, &root)
        });
        let dir = staging.path().to_path_buf();
        let ((), streamed) = streaming_while(
            &mut a,
            &mut lanes,
            &dir,
            Pick::GpuData,
            Duration::from_millis(5),
            || {
                std::fs::write(dir.join("pages-1.img"), vec![1u8; 2 * CHUNK_SIZE]).unwrap();
                std::fs::create_dir(dir.join("gpu")).unwrap();
                std::fs::write(dir.join("gpu/data-0001"), vec![2u8; 2 * CHUNK_SIZE]).unwrap();
            },
        );
        let mut streamed = streamed.unwrap();
        streamed
            .finish(&mut a, lanes, &dir, Duration::from_millis(5))
            .unwrap();
        assert!(streamed.has("gpu/data-0001") && !streamed.has("pages-1.img"));
        a.send(&Control::Done).unwrap();
        assert_eq!(
            receiver.join().unwrap().unwrap(),
            (1, 2 * CHUNK_SIZE as u64)
        );
        // The pages stay whole in the staging image, to be served from.
        assert_eq!(
            std::fs::read(dir.join("pages-1.img")).unwrap(),
            vec![1u8; 2 * CHUNK_SIZE]
        );
    }

    #[test]
    fn a_lane_that_fails_stops_the_stream_with_its_error() {
        let staging = tempfile::tempdir().unwrap();
        let (mut a, _b) = pair();
        let (mut lanes, theirs) = lanes(2);
        drop(theirs);
        let dir = staging.path().to_path_buf();
        let ((), streamed) = streaming_while(
            &mut a,
            &mut lanes,
            &dir,
            Pick::PagesAndGpuData,
            Duration::from_millis(5),
            || std::fs::write(dir.join("pages-1.img"), vec![1u8; 16 * CHUNK_SIZE]).unwrap(),
        );
        let err = match streamed {
            Err(e) => e,
            Ok(mut streamed) => streamed
                .finish(&mut a, lanes, &dir, Duration::from_millis(5))
                .unwrap_err(),
        };
        assert!(
            matches!(
                err,
                FilesError::Link(crate::migrate::link::LinkError::Disconnected { .. })
            ),
            "{err}"
        );
    }
}
