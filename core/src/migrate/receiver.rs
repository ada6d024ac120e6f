//! `gpucr receive`: the destination's side of a migration.
//!
//! It listens, and serves one connection at a time until a migration has been
//! restored here (or, with `once`, after the first connection whatever became of it).
//! For each connection:
//!
//! 1. The TLS handshake: a peer without the pinned certificate and its key is refused
//!    before anything else is read.
//! 2. Hello (versions), then the source's Offer: its GPU backend and topology, checked
//!    against this machine's as a restore checks an image's (`gpucr check-topology`'s
//!    check). Mismatch or Accept, with the lanes granted and their ticket.
//! 3. The lanes join ([`super::lanes`]): connections to the same port, authenticated
//!    the same way, that carry the memory pages and the GPU data in parallel.
//! 4. The files, into a fresh directory (0700) made beneath `dir`, each path confined
//!    and each chunk checked ([`super::files`], [`super::parts`]).
//! 5. The image restored, verified as every restore verifies it (before any task
//!    runs), the tree left stopped. Restored.
//! 6. On the source's Commit, the tree is let run: Resumed. The image directory stays.
//!
//! Any failure before the Commit kills what was restored and removes the directory,
//! and the source is told (Failed) when the link still carries it. A receiver killed
//! outright leaves both to its guard ([`crate::restore_guard`]), which does the same
//! until the tree may run without it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::files::{FilesError, ImageWriter, Syncing, Unsynced};
use super::identity::{Identity, IdentityError, IdentityFiles};
use super::lanes::{self, JoinError, Readers, MAX_LANES};
use super::link::{Link, LinkError};
use super::message::Control;
use super::parts::PartsWriter;
use super::postcopy::Puller;
use super::tls::TlsError;
use super::tree::StoppedTree;
use super::{AcceptError, ProtocolError, BEAT};
use crate::exit_code::{self, ExitCode};
use crate::gpu::TaskTiming;
use crate::progress::Progress;
use crate::restore::{RestoreError, RestoreOptions};
use crate::restore_guard::RestoreGuard;
use crate::transfer::GpuStats;

/// Where to listen, where to keep images, and how to restore.
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// `ADDR:PORT` to listen on.
    pub listen: String,
    /// The directory beneath which each migration's image directory is made.
    pub dir: PathBuf,
    pub identity: IdentityFiles,
    /// How long the link may stay silent.
    pub timeout: Duration,
    /// Serve one connection and stop, whatever became of it.
    pub once: bool,
    /// The restore: its `dir` is the received image's, the tree left stopped until the
    /// source's Commit. Its topology settings (`sysfs_root`, `skip_checks`,
    /// `cuda_visible_devices`) also check the source's Offer.
    pub restore: RestoreOptions,
}

/// A migration received and running here.
#[derive(Debug, Clone)]
pub struct ReceiveOutcome {
    pub peer: String,
    pub pid: i32,
    pub dir: PathBuf,
    pub files: u64,
    pub bytes: u64,
    /// The restore's GPU transfer and each task's fill, as `gpucr restore` reports
    /// them (milliseconds since the restore's start).
    pub gpu: Option<(GpuStats, Vec<TaskTiming>)>,
}

/// Why a migration was not received.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot listen on {listen}: {source}")]
    Listen {
        listen: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a directory this side can make image directories in: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refused a connection: {source}")]
    Tls {
        #[source]
        source: TlsError,
    },
    #[error("{peer}: {source}")]
    Protocol {
        peer: String,
        #[source]
        source: ProtocolError,
    },
    #[error("{peer}: the job's GPUs do not fit here; refused:\n{report}")]
    Mismatch { peer: String, report: String },
    #[error("{peer}: cannot read this machine's GPU topology: {source}")]
    Topology {
        peer: String,
        #[source]
        source: gpucr_topology::TopologyError,
    },
    #[error("{peer}: the migration's lanes: {source}; nothing kept")]
    Lanes {
        peer: String,
        #[source]
        source: JoinError,
    },
    #[error("{peer}: cannot make a ticket for the lanes: {source}")]
    Ticket {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer}: the source gave up: {reason}; nothing kept")]
    SourceFailed { peer: String, reason: String },
    #[error("{peer}: receiving the image: {source}; nothing kept")]
    Files {
        peer: String,
        #[source]
        source: FilesError,
    },
    #[error("{0}; no migration could be restored here, so none is awaited")]
    Criu(#[source] RestoreError),
    #[error("{peer}: restoring the received image: {source}; nothing kept")]
    Restore {
        peer: String,
        #[source]
        source: Box<RestoreError>,
    },
    #[error("interrupted by {signal} while waiting for a migration")]
    Interrupted { signal: &'static str },
    #[error("{peer}: no commit from the source ({why}): the restored tree (pid {pid}) was killed, nothing kept")]
    NoCommit { peer: String, pid: i32, why: String },
    #[error("{peer}: post-copy: {why}; nothing restored, nothing kept")]
    PostCopy { peer: String, why: String },
    #[error(
        "{peer}: post-copy failed after the job ran here (pid {pid}): {why}; the tree was \
         killed, since its memory can no longer come, the partial image removed, and the \
         job is lost"
    )]
    PostCopyLost { peer: String, pid: i32, why: String },
}

impl ExitCode for ReceiveError {
    fn exit_code(&self) -> u8 {
        match self {
            ReceiveError::Identity(e) => e.exit_code(),
            ReceiveError::Listen { .. } => exit_code::USAGE,
            ReceiveError::Interrupted { .. } => exit_code::INTERRUPTED,
            ReceiveError::Dir { .. } => exit_code::IMAGE_DIR,
            ReceiveError::Mismatch { .. } => exit_code::TOPOLOGY_INCOMPATIBLE,
            ReceiveError::Files { source, .. } if source.disk_full() => exit_code::IMAGE_DIR,
            ReceiveError::Files {
                source: FilesError::Corrupt { .. },
                ..
            } => exit_code::IMAGE_DAMAGED,
            ReceiveError::Restore { source, .. } => source.exit_code(),
            ReceiveError::Criu(e) => e.exit_code(),
            ReceiveError::Topology { .. }
            | ReceiveError::Tls { .. }
            | ReceiveError::Protocol { .. }
            | ReceiveError::SourceFailed { .. }
            | ReceiveError::Lanes { .. }
            | ReceiveError::Ticket { .. }
            | ReceiveError::Files { .. }
            | ReceiveError::NoCommit { .. }
            | ReceiveError::PostCopy { .. }
            | ReceiveError::PostCopyLost { .. } => exit_code::MIGRATION_FAILED,
        }
    }
}

/// Listen on `opts.listen` and receive migrations until one runs here (or, with
/// `opts.once`, until the first connection ends). `listening` is told the address
/// once bound; each connection that came to nothing is reported through `progress`
/// when another is awaited.
pub fn receive(
    opts: &ReceiveOptions,
    progress: &mut Progress,
    listening: &mut dyn FnMut(SocketAddr),
) -> Result<ReceiveOutcome, ReceiveError> {
    let identity = opts.identity.load()?;
    // A CRIU that is not there would be found only once a job is frozen and its image
    // has crossed.
    crate::restore::locate_criu(&opts.restore).map_err(ReceiveError::Criu)?;
    let dir_meta = std::fs::metadata(&opts.dir).and_then(|m| {
        if m.is_dir() {
            Ok(m)
        } else {
            Err(std::io::Error::from_raw_os_error(libc::ENOTDIR))
        }
    });
    if let Err(source) = dir_meta {
        return Err(ReceiveError::Dir {
            path: opts.dir.clone(),
            source,
        });
    }
    let listen = |source| ReceiveError::Listen {
        listen: opts.listen.clone(),
        source,
    };
    let listener = TcpListener::bind(&opts.listen).map_err(listen)?;
    listening(listener.local_addr().map_err(listen)?);
    // Ctrl-C (SIGINT, SIGTERM, SIGHUP) ends the wait for a connection; a migration
    // under way is ended by its restore's token, or fails on its own.
    let wake = crate::interrupt::WakeFd::new().map_err(listen)?;
    loop {
        let signalled = match crate::interrupt::requested() {
            Some(signal) => Some(signal),
            None => {
                let fds = [std::os::fd::AsFd::as_fd(&listener), wake.fd()];
                match crate::wait::readable(fds, None).map_err(listen)? {
                    Some(1) => Some(crate::interrupt::requested().unwrap_or(libc::SIGINT)),
                    _ => None,
                }
            }
        };
        if let Some(signal) = signalled {
            return Err(ReceiveError::Interrupted {
                signal: crate::interrupt::name(signal),
            });
        }
        let (tcp, _) = listener.accept().map_err(listen)?;
        match serve(tcp, &listener, &identity, opts, progress) {
            Ok(outcome) => return Ok(outcome),
            Err(e) if opts.once => return Err(e),
            Err(e) => progress.warn(&e.to_string()),
        }
    }
}

/// Serve one connection (its lanes join on `listener`).
fn serve(
    tcp: TcpStream,
    listener: &TcpListener,
    identity: &Identity,
    opts: &ReceiveOptions,
    progress: &mut Progress,
) -> Result<ReceiveOutcome, ReceiveError> {
    let mut link = super::accept(tcp, identity, opts.timeout).map_err(|e| match e {
        AcceptError::Tls(source) => ReceiveError::Tls { source },
        AcceptError::Limit { peer, source } => ReceiveError::Protocol {
            peer: peer.clone(),
            source: ProtocolError::Link(LinkError::Io { peer, source }),
        },
        AcceptError::Hello { peer, source } => ReceiveError::Protocol { peer, source },
    })?;
    let peer = link.peer().to_owned();
    progress.event("authenticated", &format!("{peer} authenticated"));
    let (post_copy, lanes) = check_offer(&mut link, opts, &peer)?;
    let lanes = match lanes::join(listener, identity, &lanes.ticket, lanes.count, opts.timeout) {
        Ok(links) => links,
        Err(source) => {
            let error = ReceiveError::Lanes {
                peer: peer.clone(),
                source,
            };
            let _ = link.send(&Control::Failed {
                code: error.exit_code(),
                reason: error.to_string(),
            });
            return Err(error);
        }
    };
    let image = tempfile::Builder::new()
        .prefix("migration-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&opts.dir)
        .map_err(|source| ReceiveError::Dir {
            path: opts.dir.clone(),
            source,
        })?;
    // A receiver killed outright leaves what it made to this guard: the partial image
    // removed, and once restored, the stopped tree killed (`restore_guard`). Told
    // `done` once the tree may run without this side.
    let guard = match RestoreGuard::start() {
        Ok(guard) => {
            guard.discard(image.path());
            Some(guard)
        }
        Err(e) => {
            progress.warn(&format!("cannot start the restore guard: {e}"));
            None
        }
    };
    let refuse = |link: &mut Link, error: ReceiveError| {
        let _ = link.send(&Control::Failed {
            code: error.exit_code(),
            reason: error.to_string(),
        });
        error
    };
    let Received {
        files,
        bytes,
        later,
        syncing,
        reserved,
    } = match receive_files(&mut link, lanes, image.path(), &peer) {
        Ok(written) => written,
        Err(e) => {
            let e = refuse(&mut link, e);
            // The source sends on until Done before it reads the answer: what it sends
            // meanwhile is read and dropped, so that closing the connection on unread
            // data (a reset) does not lose the answer with it.
            drain(&mut link, opts.timeout * 4);
            return Err(e);
        }
    };
    if post_copy {
        progress.event(
            "received",
            &format!(
                "{files} files ({bytes} bytes) received, {} pages files to pull as needed",
                later.len()
            ),
        );
        let received = (files, bytes, syncing, reserved);
        let image = (image, guard);
        return serve_post_copy(link, image, &later, opts, &peer, progress, received);
    }
    // Each chunk was checked as it came; the restore verifies the image as every
    // restore does (sizes and small files before CRIU starts, the memory pages beside
    // CRIU's restore, before any task runs): verifying it whole first would only add
    // the time to read it once more to the job's downtime.
    progress.event(
        "received",
        &format!("{files} files ({bytes} bytes) received; restoring"),
    );
    let restore = RestoreOptions {
        dir: image.path().to_path_buf(),
        leave_stopped: true,
        lazy: false,
        ..opts.restore.clone()
    };
    let (restored, beat) = link.beating_while(BEAT, || crate::restore::restore(&restore, progress));
    let restored = match restored {
        Ok(outcome) => outcome,
        Err(source) => {
            return Err(refuse(
                &mut link,
                ReceiveError::Restore {
                    peer: peer.clone(),
                    source: Box::new(source),
                },
            ))
        }
    };
    if let Some(guard) = &guard {
        guard.root(restored.pid);
    }
    let tree = StoppedTree::restored(
        restored.pid,
        image.path(),
        restored.manifest.host.page_size_or_here(),
    );
    let gpu = restored.gpu;
    let give_up = |why: String| no_commit(&tree, &peer, why);
    if let Some(hold) = gpucr_abi::env::test_millis("GPUCR_TEST_MIGRATE_HOLD_RESTORED_MS") {
        // The restored tree held, stopped, as a test makes it.
        std::thread::sleep(hold);
    }
    if let Err(e) = beat.and_then(|()| link.send(&Control::Restored { pid: tree.root })) {
        return Err(give_up(e.to_string()));
    }
    progress.event(
        "restored",
        &format!(
            "restored pid {}, stopped until the source commits",
            tree.root
        ),
    );
    match link.receive_control() {
        Ok(Control::Commit) => {}
        Ok(other) => {
            return Err(give_up(
                ProtocolError::unexpected("commit", &other).to_string(),
            ))
        }
        Err(e) => return Err(give_up(e.to_string())),
    }
    let dir = image.keep();
    tree.resume();
    // The tree runs on its own now.
    drop(guard);
    if std::env::var_os("GPUCR_TEST_MIGRATE_NO_RESUMED").is_some() {
        // The link lost right after the Commit, as a test makes it.
        drop(link);
        on_disk(syncing, tree.root, &dir, progress);
        return Ok(ReceiveOutcome {
            peer,
            pid: tree.root,
            dir,
            files,
            bytes,
            gpu,
        });
    }
    // The tree runs here now, whatever becomes of the link.
    if let Err(e) = link.send(&Control::Resumed {
        pid: tree.root,
        dir: dir.display().to_string(),
    }) {
        progress.warn(&format!(
            "pid {} runs here, but the source was not told: {e}",
            tree.root
        ));
    }
    on_disk(syncing, tree.root, &dir, progress);
    Ok(ReceiveOutcome {
        peer,
        pid: tree.root,
        dir,
        files,
        bytes,
        gpu,
    })
}

/// Wait until the image the job running here as `pid` was restored from is on disk
/// (its files were put there while it was restored); say so if it cannot be.
fn on_disk(syncing: Syncing, pid: i32, dir: &Path, progress: &mut Progress) {
    if let Err(e) = syncing.wait() {
        progress.warn(&format!(
            "pid {pid} runs here, but its image in {} may not be whole on disk: {e}",
            dir.display()
        ));
    }
}

/// The source never committed (`why`): the restored tree, still stopped, is killed and
/// reaped.
fn no_commit(tree: &StoppedTree, peer: &str, why: String) -> ReceiveError {
    tree.kill();
    let _ = waitpid(Pid::from_raw(tree.root), None);
    ReceiveError::NoCommit {
        peer: peer.to_owned(),
        pid: tree.root,
        why,
    }
}

/// Read and drop what the source sends, up to its Done (or the end of the link), for
/// at most `limit`: a source that sends on longer finds the link reset.
fn drain(link: &mut Link, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        match link.receive() {
            Ok(super::link::Incoming::Control(Control::Done | Control::Failed { .. })) | Err(_) => {
                return
            }
            Ok(_) => {}
        }
    }
}

/// The lanes granted a migration, and the ticket they join with.
struct Granted {
    count: u32,
    ticket: String,
}

/// Read the source's Offer and answer it: Accept (with the lanes granted) when this
/// machine's GPUs can hold the job's, else Mismatch with the report. Ok(whether it is
/// post-copy, and the lanes).
fn check_offer(
    link: &mut Link,
    opts: &ReceiveOptions,
    peer: &str,
) -> Result<(bool, Granted), ReceiveError> {
    let protocol = |source| ReceiveError::Protocol {
        peer: peer.to_owned(),
        source,
    };
    let (backend, topology, post_copy, lanes) = match link.receive_control() {
        Ok(Control::Offer {
            backend,
            topology,
            post_copy,
            lanes,
            ..
        }) => (backend, topology, post_copy, lanes),
        Ok(other) => return Err(protocol(ProtocolError::unexpected("offer", &other))),
        Err(e) => return Err(protocol(e.into())),
    };
    if let Some(saved) = topology.filter(|t| t.has_gpus()) {
        let root = opts
            .restore
            .sysfs_root
            .clone()
            .or_else(|| backend.as_deref().and_then(crate::gpu::topology_root));
        let topology_error = |source| ReceiveError::Topology {
            peer: peer.to_owned(),
            source,
        };
        let local = gpucr_topology::read_local(root.as_deref()).map_err(topology_error)?;
        let report = gpucr_topology::check_read(
            &saved,
            local,
            opts.restore.cuda_visible_devices.as_deref(),
            &gpucr_topology::Checks::from_env_and_skips(&opts.restore.skip_checks),
        )
        .map_err(topology_error)?;
        if !report.compatible || report.mapping.is_none() {
            let text = report.to_string();
            let _ = link.send(&Control::Mismatch {
                report: text.clone(),
            });
            return Err(ReceiveError::Mismatch {
                peer: peer.to_owned(),
                report: text,
            });
        }
    }
    let granted = Granted {
        count: lanes.clamp(1, MAX_LANES),
        ticket: lanes::new_ticket().map_err(|source| ReceiveError::Ticket {
            peer: peer.to_owned(),
            source,
        })?,
    };
    link.send(&Control::Accept {
        lanes: granted.count,
        ticket: granted.ticket.clone(),
    })
    .map_err(|e| protocol(ProtocolError::Link(e)))?;
    Ok((post_copy, granted))
}

/// Receive the files into `dir` until Done: those sent whole on `link`, and those sent
/// in parts on the `lanes`; the files and bytes written, and the files announced to be
/// pulled later (post-copy: name and size, made here, sparse). A lane that fails ends
/// it at the next message on `link` (Working comes every heartbeat).
fn receive_files(
    link: &mut Link,
    lanes: Vec<Link>,
    dir: &Path,
    peer: &str,
) -> Result<Received, ReceiveError> {
    let files = |source| ReceiveError::Files {
        peer: peer.to_owned(),
        source,
    };
    let mut writer = ImageWriter::new(dir);
    let parts = std::sync::Arc::new(PartsWriter::new(dir));
    let mut readers = Some(Readers::start(lanes, &parts));
    let mut later = Vec::new();
    loop {
        let message = link.receive_control_or_beat();
        if let Some(failed) = readers.as_mut().and_then(Readers::failed) {
            return Err(files(failed));
        }
        // Whatever follows the parts on this link comes once the lanes are done.
        if let Ok(
            Control::Whole { .. } | Control::File { .. } | Control::Later { .. } | Control::Done,
        ) = &message
        {
            if let Some(readers) = readers.take() {
                readers.finish().map_err(files)?;
            }
        }
        match message {
            Ok(Control::Working) => {}
            Ok(Control::File { path, size }) => {
                writer.receive(link, &path, size).map_err(files)?;
            }
            Ok(Control::Whole { path, size }) => {
                parts.whole(&path, size).map_err(files)?;
            }
            Ok(Control::Later { path, size }) => {
                writer.reserve(&path, size).map_err(files)?;
                later.push((path, size));
            }
            Ok(Control::Done) => break,
            Ok(Control::LaneLost { why }) => {
                // The lane this side closed, if it did: its reason is the one to give.
                let failed = readers
                    .as_mut()
                    .and_then(|r| r.failed_within(Duration::from_secs(2)));
                return Err(match failed {
                    Some(failure) => files(failure),
                    None => ReceiveError::SourceFailed {
                        peer: peer.to_owned(),
                        reason: format!("it lost a lane: {why}"),
                    },
                });
            }
            Ok(Control::Failed { reason, .. }) => {
                return Err(ReceiveError::SourceFailed {
                    peer: peer.to_owned(),
                    reason,
                })
            }
            Ok(other) => {
                return Err(ReceiveError::Protocol {
                    peer: peer.to_owned(),
                    source: ProtocolError::unexpected("file", &other),
                })
            }
            Err(e) => return Err(files(e.into())),
        }
    }
    if let Some(name) = parts.unfinished() {
        return Err(files(FilesError::NotWhole { path: name }));
    }
    let (whole, streamed) = parts.written();
    let (files, bytes) = writer.written();
    let (written, reserved) = writer.finish(parts.take_unsynced());
    Ok(Received {
        files: files + whole,
        bytes: bytes + streamed,
        later,
        syncing: written.start(),
        reserved,
    })
}

/// What [`receive_files`] received: files and bytes written, and the files announced to
/// be pulled later (post-copy: name and size).
struct Received {
    files: u64,
    bytes: u64,
    later: Vec<(String, u64)>,
    /// The files being put on disk meanwhile.
    syncing: Syncing,
    /// The files in `later`, to be put on disk once their blocks are in.
    reserved: Unsynced,
}

/// The rest of a post-copy migration, once the files but those in `later` are in
/// `image`: the blocks CRIU reads itself pulled, the image restored with `--lazy` and
/// its other blocks pulled as the tree needs them (tree left stopped), Restored; on the
/// source's Commit the tree runs (Resumed); once every page is in, and the rest of the
/// image with it, AllIn.
fn serve_post_copy(
    link: Link,
    // The guard is told `done` as this returns: the tree needs this side until then.
    (image, guard): (tempfile::TempDir, Option<RestoreGuard>),
    later: &[(String, u64)],
    opts: &ReceiveOptions,
    peer: &str,
    progress: &mut Progress,
    (files, bytes, syncing, reserved): (u64, u64, Syncing, Unsynced),
) -> Result<ReceiveOutcome, ReceiveError> {
    let lost = |why: String| ReceiveError::PostCopy {
        peer: peer.to_owned(),
        why,
    };
    let puller = Puller::start(link, image.path(), later, BEAT).map_err(|e| lost(e.to_string()))?;
    let refuse = |error: ReceiveError| {
        puller.tell(Control::Failed {
            code: error.exit_code(),
            reason: error.to_string(),
        });
        puller.close();
        error
    };
    let page_size = crate::image::Manifest::read(image.path()).map_or_else(
        |_| crate::units::host_page_size(),
        |m| m.host.page_size_or_here(),
    );
    let eager: Vec<(String, u64)> = match crate::lazy::pages::eager_blocks(image.path(), page_size)
    {
        Ok(map) => map
            .into_iter()
            .flat_map(|(file, (_, blocks))| blocks.into_iter().map(move |k| (file.clone(), k)))
            .collect(),
        Err(e) => return Err(refuse(lost(e.to_string()))),
    };
    puller.fetch_all(&eager).map_err(|e| lost(e.to_string()))?;
    // Until the tree runs, the link is the Restored's and the Commit's.
    puller.hold_background();
    let restore = RestoreOptions {
        dir: image.path().to_path_buf(),
        leave_stopped: true,
        lazy: true,
        lazy_remote: Some(puller.clone()),
        ..opts.restore.clone()
    };
    let restored = match crate::restore::restore(&restore, progress) {
        Ok(outcome) => outcome,
        Err(source) => {
            return Err(refuse(ReceiveError::Restore {
                peer: peer.to_owned(),
                source: Box::new(source),
            }))
        }
    };
    if let Some(guard) = &guard {
        guard.root(restored.pid);
    }
    let tree = StoppedTree::restored(
        restored.pid,
        image.path(),
        restored.manifest.host.page_size_or_here(),
    );
    let give_up = |why: String| {
        let error = no_commit(&tree, peer, why);
        puller.close();
        error
    };
    progress.event(
        "restored",
        &format!(
            "restored pid {}, stopped until the source commits; its memory comes on demand",
            tree.root
        ),
    );
    match puller.ask_message(Control::Restored { pid: tree.root }) {
        Ok(Control::Commit) => {}
        Ok(other) => {
            return Err(give_up(
                ProtocolError::unexpected("commit", &other).to_string(),
            ))
        }
        Err(e) => return Err(give_up(e.to_string())),
    }
    let dir = image.keep();
    tree.resume();
    puller.tell(Control::Resumed {
        pid: tree.root,
        dir: dir.display().to_string(),
    });
    puller.release_background();
    progress.event("resumed", &format!("pid {} runs", tree.root));
    progress.note(&format!(
        "pid {} runs here; its memory is pulled from {peer} as it needs it",
        tree.root
    ));
    let served = restored.lazy.as_ref().and_then(|serving| serving.wait());
    if let Some(Err(e)) = served {
        // The server killed the tree: it would have waited for pages that cannot come.
        // What was received is no image of anything now.
        puller.close();
        let _ = std::fs::remove_dir_all(&dir);
        return Err(ReceiveError::PostCopyLost {
            peer: peer.to_owned(),
            pid: tree.root,
            why: e.to_string(),
        });
    }
    // What no task asked for (pages of a task that is gone, blocks no range needs), so
    // that the image directory is whole.
    let missing = puller.missing();
    if let Err(e) = puller.fetch_all(&missing) {
        progress.warn(&format!(
            "pid {} runs here with all its memory, but the image in {} lacks {} blocks: {e}",
            tree.root,
            dir.display(),
            missing.len()
        ));
    }
    match puller.ask_message(Control::AllIn) {
        Ok(Control::Done) => {}
        Ok(other) => progress.warn(&format!(
            "pid {} runs here, but the source answered '{}' to the end of the migration",
            tree.root,
            other.name()
        )),
        Err(e) => progress.warn(&format!(
            "pid {} runs here with all its memory, but the source was not told: {e}",
            tree.root
        )),
    }
    let pulled = puller.bytes();
    puller.close();
    // The pulled pages files too.
    if let Err(e) = reserved.sync() {
        progress.warn(&format!("a pulled pages file is not put on disk: {e}"));
    }
    on_disk(syncing, tree.root, &dir, progress);
    Ok(ReceiveOutcome {
        peer: peer.to_owned(),
        pid: tree.root,
        dir,
        files,
        bytes: bytes + pulled,
        gpu: restored.gpu,
    })
}
