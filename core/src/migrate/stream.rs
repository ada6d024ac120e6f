//! Stop-and-copy's stream of the memory pages and the GPU memory while they are dumped.
//!
//! CRIU writes each `pages-N.img` from start to end and never rewrites a byte of it, and
//! so does each pack thread of the transfer engine its `gpu/data-NNNN`. So while the
//! dump runs, a thread watches the staging directory and sends every whole chunk of such
//! a file that has landed (Part, then the chunk), and punches it out of the staging file
//! once it is sent: the memory crosses the link as it is dumped, and the source's disk
//! never holds a full copy of it. Once CRIU is done, the rest of each
//! file follows the same way, then Whole with its size. When nothing has landed for a
//! heartbeat's interval, the thread sends Working instead, as
//! [`Link::beating_while`] does.
//!
//! The staging files are punched out, so their contents are not read back after the
//! dump: the migration's dump records the pages files by size only (the GPU data files'
//! chunks are checked against `gpu/index` at restore anyway), and each chunk's xxh3 is
//! what the receiver checks them against on arrival.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::{fallocate, FallocateFlags};

use super::files::FilesError;
use super::link::{Link, CHUNK_SIZE};
use super::message::Control;
use crate::image::checksum::is_pages_file;
use crate::transfer::{is_data_file_name, GPU_DIR};

/// How long the thread waits for CRIU to write more when it found nothing to send.
const LOOK_AGAIN: Duration = Duration::from_millis(2);

/// The files streamed so far: each one open, and how much of it was sent.
#[derive(Debug, Default)]
pub struct Streamed {
    files: BTreeMap<String, Sent>,
    /// Bytes sent while CRIU dumped.
    pub while_dumping: u64,
    /// When the first of them was sent.
    pub first_sent: Option<Instant>,
}

#[derive(Debug)]
struct Sent {
    path: PathBuf,
    file: File,
    offset: u64,
}

impl Streamed {
    /// Whether the file `name` went (or goes) in parts.
    pub fn has(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// Send what is left of every streamed file of `dir` (those not begun yet too),
    /// each followed by Whole: once the dump is done with them. `sent` is called with the
    /// bytes of each chunk once it is sent. The bytes sent.
    pub fn finish(
        &mut self,
        link: &mut Link,
        dir: &Path,
        sent: &mut dyn FnMut(u64),
    ) -> Result<u64, FilesError> {
        self.open_new(dir)?;
        let mut bytes = 0;
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
                let n = file.send_part(link, name, size - file.offset)?;
                bytes += n;
                sent(n);
            }
            link.send(&Control::Whole {
                path: name.clone(),
                size,
            })?;
        }
        Ok(bytes)
    }

    /// Open the streamed files of `dir` not open yet: its pages files, and the GPU data
    /// files in its `gpu/`.
    fn open_new(&mut self, dir: &Path) -> Result<(), FilesError> {
        let mut names = appended_files(dir, "", is_pages_file)?;
        let gpu = dir.join(GPU_DIR);
        if gpu.is_dir() {
            names.extend(appended_files(&gpu, GPU_DIR, is_data_file_name)?);
        }
        for name in names {
            if self.files.contains_key(&name) {
                continue;
            }
            let path = dir.join(&name);
            // Written to only by the holes punched behind the sender.
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
                    file,
                    offset: 0,
                },
            );
        }
        Ok(())
    }

    /// Send every whole chunk that has landed in the streamed files of `dir` since the
    /// last look; the bytes sent.
    fn send_landed(&mut self, link: &mut Link, dir: &Path) -> Result<u64, FilesError> {
        self.open_new(dir)?;
        let mut bytes = 0;
        for (name, file) in &mut self.files {
            let size = file.file.metadata().map(|m| m.len()).unwrap_or(0);
            while size.saturating_sub(file.offset) >= CHUNK_SIZE as u64 {
                bytes += file.send_part(link, name, CHUNK_SIZE as u64)?;
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
    /// Send up to `most` bytes (at most a chunk) from the file's offset as a Part, and
    /// punch them out of the staging file; the bytes sent.
    fn send_part(&mut self, link: &mut Link, name: &str, most: u64) -> Result<u64, FilesError> {
        let len = most.min(CHUNK_SIZE as u64) as usize;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, self.offset)
            .map_err(|source| FilesError::Read {
                path: self.path.clone(),
                source,
            })?;
        link.send(&Control::Part {
            path: name.to_owned(),
            offset: self.offset,
        })?;
        link.send_chunk(&buf)?;
        // The bytes are on their way: the staging file need not keep them. A file
        // system without hole punching keeps them until the staging directory goes.
        let _ = fallocate(
            self.file.as_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            self.offset as i64,
            len as i64,
        );
        self.offset += len as u64;
        Ok(len as u64)
    }
}

/// Run `work` (the dump into `dir`) on this thread while another streams the pages
/// and GPU data files the dump writes into `dir` over `link`, and sends Working whenever nothing was
/// sent for `interval`. The first failure stops the stream and is returned beside
/// `work`'s result; else what was streamed, for [`Streamed::finish`].
pub fn streaming_while<T>(
    link: &mut Link,
    dir: &Path,
    interval: Duration,
    work: impl FnOnce() -> T,
) -> (T, Result<Streamed, FilesError>) {
    let stop = (Mutex::new(false), Condvar::new());
    std::thread::scope(|scope| {
        let streamer = scope.spawn(|| {
            let mut streamed = Streamed::default();
            let mut last_sent = Instant::now();
            let (stopped, wake) = &stop;
            loop {
                // The staging directory exists once the dump has made it.
                let landed = if dir.is_dir() {
                    streamed.send_landed(link, dir)?
                } else {
                    0
                };
                if landed > 0 {
                    last_sent = Instant::now();
                } else if last_sent.elapsed() >= interval {
                    link.send(&Control::Working)?;
                    last_sent = Instant::now();
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
    use crate::migrate::files::ImageWriter;
    use crate::migrate::link::testing::{pair, with_a_damaged_chunk};
    use crate::migrate::link::Incoming;

    /// What a receiver does with what the stream sends, until Done.
    fn receive_all(mut link: Link, root: &Path) -> Result<(u64, u64), FilesError> {
        let mut writer = ImageWriter::new(root);
        loop {
            match link.receive()? {
                Incoming::Control(Control::Part { path, offset }) => {
                    writer.part(&mut link, &path, offset)?
                }
                Incoming::Control(Control::Whole { path, size }) => writer.whole(&path, size)?,
                Incoming::Control(Control::Done) => break,
                other => panic!("{:?}", matches!(other, Incoming::Chunk { .. })),
            }
        }
        writer.finish()?;
        Ok(writer.written())
    }

    #[test]
    fn files_written_while_the_work_runs_cross_and_are_punched_out_behind() {
        let staging = tempfile::tempdir().unwrap();
        let received = tempfile::tempdir().unwrap();
        let (mut a, b) = pair();
        let receiver = std::thread::spawn({
            let root = received.path().to_path_buf();
            move || receive_all(b, &root)
        });
        let content: Vec<u8> = (0..(3 * CHUNK_SIZE + 100))
            .map(|i| (i % 253) as u8)
            .collect();
        let dir = staging.path().to_path_buf();
        let ((), streamed) = streaming_while(&mut a, &dir, Duration::from_millis(5), || {
            // "CRIU" writes two chunks, waits for them to cross, then the rest.
            let mut file = File::create(dir.join("pages-1.img")).unwrap();
            file.write_all(&content[..2 * CHUNK_SIZE]).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            file.write_all(&content[2 * CHUNK_SIZE..]).unwrap();
            std::fs::write(dir.join("core-1.img"), b"not a pages file").unwrap();
            std::fs::create_dir(dir.join("gpu")).unwrap();
            std::fs::write(dir.join("gpu/data-0000"), &content[..100]).unwrap();
            std::fs::write(dir.join("gpu/index"), b"not a data file").unwrap();
        });
        let mut streamed = streamed.unwrap();
        assert!(streamed.while_dumping >= 2 * CHUNK_SIZE as u64);
        let rest = streamed.finish(&mut a, &dir, &mut |_| {}).unwrap();
        assert!(streamed.has("pages-1.img") && streamed.has("gpu/data-0000"));
        assert!(!streamed.has("core-1.img") && !streamed.has("gpu/index"));
        assert_eq!(streamed.while_dumping + rest, content.len() as u64 + 100);
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
    fn a_part_out_of_order_or_a_file_not_whole_is_refused() {
        let received = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair();
        let mut writer = ImageWriter::new(received.path());
        a.send_chunk(b"abc").unwrap();
        writer.part(&mut b, "pages-1.img", 0).unwrap();
        let err = writer.part(&mut b, "pages-1.img", 7).unwrap_err();
        assert!(
            matches!(
                err,
                FilesError::OutOfOrder {
                    expected: 3,
                    got: 7,
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            writer.finish().unwrap_err(),
            FilesError::NotWhole { .. }
        ));
        let err = writer.whole("pages-1.img", 4).unwrap_err();
        assert!(matches!(err, FilesError::WrongSize { .. }), "{err}");
        let err = writer.whole("pages-2.img", 0).unwrap_err();
        assert!(matches!(err, FilesError::NoParts { .. }), "{err}");
    }

    #[test]
    fn a_damaged_part_is_refused() {
        let received = tempfile::tempdir().unwrap();
        let mut y = with_a_damaged_chunk(b"abc");
        let mut writer = ImageWriter::new(received.path());
        let err = writer.part(&mut y, "pages-1.img", 0).unwrap_err();
        assert!(
            matches!(err, FilesError::Corrupt { offset: 0, .. }),
            "{err}"
        );
        let err = writer.part(&mut y, "../escape", 0).unwrap_err();
        assert!(matches!(err, FilesError::Unconfined { .. }), "{err}");
    }
}
