//! `gpucr migrate PID HOST[:PORT]`: the source's side of a stop-and-copy migration.
//!
//! 1. Connect, authenticate (mutual TLS, pinned certificates), exchange versions.
//! 2. Offer the job's GPU backend and the GPUs of this machine it uses; the receiver checks
//!    it as a restore would. A mismatch ends the migration here (exit 9), the job
//!    untouched. Else it grants lanes, and this side opens them ([`super::lanes`]).
//! 3. Dump the tree into a private 0700 staging directory: CRIU's freeze is the job's
//!    from here on. The dump runs with CRIU's `leave_running` and gpucr's `stop_after`:
//!    every process takes SIGSTOP while CRIU still holds it (gpucr's plugin sends it
//!    once the devices are given back, or gpucr at post-dump without a GPU), so CRIU
//!    lets the tasks go stopped, with their network unlocked, and they never run between
//!    the image and the stop. (CRIU's own `leave_stopped` would leave the network locked
//!    and the TCP sockets in repair mode, which only a restore undoes: the job could not
//!    run on here after a failure. A SIGSTOP before the dump would keep a driver that
//!    locks a process through a thread of its own, as CUDA's, from locking it.)
//!    Meanwhile the memory pages and the GPU data cross on the lanes as they are
//!    written ([`stream`]).
//! 4. Send every other file of the image (the manifest last), then Done.
//! 5. The receiver verifies and restores, its tree left stopped, and answers Restored.
//!    The source answers Commit, the receiver lets its tree run and answers Resumed, and
//!    the source kills its stopped copy.
//!
//! Any failure before Commit is sent (the link, the receiver's refusal, its restore, a
//! full disk there) lets the job run on here (SIGCONT). Once Commit is sent, the
//! source never lets its copy run again on its own: without Resumed it keeps it
//! stopped and says so ([`MigrateError::Uncertain`]). A gpucr killed outright leaves
//! the job to its guard ([`super::guard`]), which does the same: lets it run before the
//! Commit, keeps it stopped after.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::files::{self, FilesError};
use super::guard::SourceGuard;
use super::identity::{IdentityError, IdentityFiles};
use super::lanes::Lanes;
use super::link::{Link, LinkError};
use super::message::{Control, PROTOCOL_VERSION};
use super::postcopy;
use super::stream;
use super::tls::{self, TlsError};
use super::tree::StoppedTree;
use super::tree_blocks::TreeBlocks;
use super::{hello, ProtocolError, BEAT, DEFAULT_PORT};
use crate::dump::{DeferredGiveBack, DumpError, DumpOptions, InTree};
use crate::exit_code::{self, ExitCode};
use crate::gpu::{self, GpuError};
use crate::image::MANIFEST_FILE;
use crate::progress::Progress;
use crate::target::TargetError;

/// What to migrate, where, and how.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// The destination, `HOST[:PORT]` (port [`DEFAULT_PORT`] when none).
    pub to: String,
    pub identity: IdentityFiles,
    /// How long the link may stay silent, and a connection take.
    pub timeout: Duration,
    /// Where the private staging directory is made (None: the temporary directory).
    pub staging: Option<PathBuf>,
    /// The dump: its `dir` is the staging directory's, and the tree is left stopped.
    pub dump: DumpOptions,
    /// Post-copy: the destination runs the job once all but its large memory pages
    /// files are there, and pulls those as it needs them; this side keeps its stopped
    /// copy until every page is in there.
    pub post_copy: bool,
    /// How many lanes (connections beside the control link) carry the memory pages
    /// and the GPU data (taken as 1 to 8); the receiver may grant fewer, never none.
    pub lanes: u32,
}

/// A finished migration.
#[derive(Debug, Clone)]
pub struct MigrateOutcome {
    pub peer: String,
    /// The job's root on the destination, and the image directory it was restored from.
    pub remote_pid: i32,
    pub remote_dir: String,
    pub files: u64,
    pub bytes: u64,
    /// From the freeze (the dump's start) to the destination's Resumed.
    pub frozen: Duration,
    /// How long the image took to cross: from its first byte sent to Done (post-copy:
    /// to AllIn, every page in on the destination).
    pub sent: Duration,
    /// Post-copy: from the freeze until the destination said it runs the job (`frozen`
    /// then lasts until every page was in there).
    pub downtime: Option<Duration>,
    /// The bytes of memory pages (stop-and-copy) and GPU data given to the lanes while
    /// CRIU was still dumping.
    pub streamed: u64,
    /// The lanes the destination granted.
    pub lanes: u32,
    /// Post-copy: the bytes of the pulled memory pages served from the stopped job,
    /// never written to this disk.
    pub pages_in_tree: u64,
    /// Post-copy: the bytes of the pulled memory pages this disk held (what the
    /// stopped job could not give back: its last partial blocks, the threads'
    /// restartable-sequences areas, executable mappings).
    pub pages_staged: u64,
}

/// Why a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("{to}: not a HOST[:PORT] that resolves: {detail}")]
    Address { to: String, detail: String },
    #[error("cannot connect to {to}: {source}; the job was not touched")]
    Connect {
        to: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{source}; the job was not touched")]
    Tls {
        #[source]
        source: TlsError,
    },
    #[error("{source}; the job was not touched")]
    Link {
        #[source]
        source: LinkError,
    },
    #[error("{0}; the job was not touched")]
    Protocol(#[from] ProtocolError),
    #[error("cannot read the job's GPUs: {0}; the job was not touched")]
    Gpu(#[from] GpuError),
    #[error("cannot read this machine's GPU topology: {0}; the job was not touched")]
    Topology(#[from] gpucr_topology::TopologyError),
    #[error("{peer} cannot hold the job's GPUs; the job was not touched:\n{report}")]
    Mismatch { peer: String, report: String },
    #[error("{peer} refused the migration: {reason}; the job was not touched")]
    Refused { peer: String, reason: String },
    #[error("cannot make a staging directory in {path}: {source}; the job was not touched")]
    Staging {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Dump(#[from] DumpError),
    #[error("{0}; the job runs on")]
    Stop(#[from] super::tree::StopError),
    #[error("migration of pid {pid} to {peer} failed while {during}: {why}; {resumed}")]
    Failed {
        pid: i32,
        peer: String,
        during: &'static str,
        why: String,
        resumed: String,
    },
    #[error(
        "the link to {peer} was lost after this side gave the job up ({why}): pid {pid} \
         is kept stopped here. If {peer} did not resume it (its `gpucr receive` says \
         so), let it run here with `kill -CONT` to each of its tasks; else kill it"
    )]
    Uncertain { pid: i32, peer: String, why: String },
}

impl ExitCode for MigrateError {
    fn exit_code(&self) -> u8 {
        match self {
            MigrateError::Identity(e) => e.exit_code(),
            MigrateError::Target(e) => e.exit_code(),
            MigrateError::Address { .. } => exit_code::USAGE,
            MigrateError::Gpu(e) => e.exit_code(),
            MigrateError::Topology(_) => exit_code::FAILURE,
            MigrateError::Mismatch { .. } => exit_code::TOPOLOGY_INCOMPATIBLE,
            MigrateError::Staging { .. } => exit_code::IMAGE_DIR,
            MigrateError::Dump(e) => e.exit_code(),
            MigrateError::Stop(_) => exit_code::TARGET,
            MigrateError::Connect { .. }
            | MigrateError::Tls { .. }
            | MigrateError::Link { .. }
            | MigrateError::Protocol(_)
            | MigrateError::Refused { .. }
            | MigrateError::Failed { .. } => exit_code::MIGRATION_FAILED,
            MigrateError::Uncertain { .. } => exit_code::MIGRATION_UNCERTAIN,
        }
    }
}

impl From<LinkError> for MigrateError {
    fn from(source: LinkError) -> MigrateError {
        MigrateError::Link { source }
    }
}

/// `HOST[:PORT]` resolved: its addresses.
pub fn resolve(to: &str) -> Result<Vec<SocketAddr>, MigrateError> {
    let refuse = |detail: String| MigrateError::Address {
        to: to.to_owned(),
        detail,
    };
    if let Ok(ip) = to.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, DEFAULT_PORT)]);
    }
    let with_port = match to.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() => to.to_owned(),
        Some((_, port)) => return Err(refuse(format!("{port:?} is not a port"))),
        None => format!("{to}:{DEFAULT_PORT}"),
    };
    let addrs: Vec<SocketAddr> = with_port
        .to_socket_addrs()
        .map_err(|e| refuse(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(refuse("no address".into()));
    }
    Ok(addrs)
}

/// Connect to the first of `addrs` that answers within `timeout`, authenticate: the
/// link, and the address it went to.
fn connect(
    to: &str,
    addrs: &[SocketAddr],
    identity: &super::identity::Identity,
    timeout: Duration,
) -> Result<(Link, SocketAddr), MigrateError> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(tcp) => {
                tls::limit(&tcp, timeout).map_err(|source| MigrateError::Connect {
                    to: to.to_owned(),
                    source,
                })?;
                let peer = tls::peer_name(&tcp);
                let stream =
                    tls::connect(tcp, identity).map_err(|source| MigrateError::Tls { source })?;
                return Ok((Link::new(Box::new(stream), peer, timeout), *addr));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(MigrateError::Connect {
        to: to.to_owned(),
        source: last.unwrap_or_else(|| std::io::Error::other("no address")),
    })
}

/// Migrate `opts.dump.pid` to `opts.to`, stop-and-copy.
pub fn migrate(
    opts: &MigrateOptions,
    progress: &mut Progress,
) -> Result<MigrateOutcome, MigrateError> {
    let pid = opts.dump.pid;
    let identity = opts.identity.load()?;
    crate::target::validate(pid)?;
    crate::target::check_untraced(pid)?;
    let addrs = resolve(&opts.to)?;
    progress.event("connect", &format!("connecting to {}", opts.to));
    let (mut link, addr) = connect(&opts.to, &addrs, &identity, opts.timeout)?;
    let peer = link.peer().to_owned();
    hello(&mut link)?;
    progress.event("authenticated", &format!("{peer} authenticated"));
    let wanted = opts.lanes.clamp(1, super::lanes::MAX_LANES);
    let (count, ticket) = offer(&mut link, pid, &peer, opts.post_copy, wanted)?;
    progress.event("accepted", &format!("{peer} can hold the job"));
    let mut links = Vec::new();
    for lane in 0..count {
        let (mut lane_link, _) = connect(&opts.to, &[addr], &identity, opts.timeout)?;
        hello(&mut lane_link)?;
        lane_link.send(&Control::Join {
            ticket: ticket.clone(),
            lane,
        })?;
        links.push(lane_link);
    }
    let mut lanes = Lanes::start(links, BEAT, throttle());
    progress.event("lanes", &format!("{count} lanes open to {peer}"));
    let parent = opts.staging.clone().unwrap_or_else(std::env::temp_dir);
    let staging = tempfile::Builder::new()
        .prefix("gpucr-migrate-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&parent)
        .map_err(|source| MigrateError::Staging {
            path: parent.clone(),
            source,
        })?;
    let image = staging.path().join("image");
    // Stop-and-copy streams the memory pages as CRIU writes them and punches them out
    // of the staging files behind it (`stream`), so the dump records them by size
    // only: each chunk's xxh3 checks them on arrival. Post-copy serves them from the
    // staging image later.
    let dump = DumpOptions {
        dir: image.clone(),
        leave_running: true,
        force: false,
        no_page_checksums: opts.dump.no_page_checksums || !opts.post_copy,
        // Post-copy serves the pages from the stopped tree: what it holds never needs
        // to be on this disk.
        pages_in_tree: opts.post_copy,
        ..opts.dump.clone()
    };
    // Tasks stopped by their owner stay stopped should the job run on here.
    let stopped = StoppedTree::before_freeze(pid);
    // A gpucr killed outright from here on leaves the job to its guard, which lets it
    // run before the Commit (`guard`). Dropped as this function returns, it ends
    // without a word.
    let guard = match SourceGuard::start() {
        Ok(guard) => {
            guard.tasks(&stopped);
            Some(guard)
        }
        Err(e) => {
            progress.warn(&format!("cannot start the migrate guard: {e}"));
            None
        }
    };
    let frozen_at = Instant::now();
    progress.event("freeze", "dumping the job (CRIU freezes it)");
    // Post-copy's dump may leave the devices as it made them (their give-back would
    // change the memory served from the tree): given back should the job run on here,
    // let go with the tree killed otherwise.
    let mut deferred = None;
    let dumping = || crate::dump::dump_deferring(&dump, progress, &mut deferred);
    let pick = match opts.post_copy {
        true => stream::Pick::GpuData,
        false => stream::Pick::PagesAndGpuData,
    };
    let (dumped, beat) =
        stream::streaming_while(&mut link, &mut lanes, &image, pick, BEAT, dumping);
    // The dump stopped the tree as CRIU let it go (`stop_after`); a dump that failed
    // after post-dump may have too, and CRIU gave the tree back running otherwise.
    let dumped = match dumped {
        Ok(dumped) => dumped,
        Err(error) => {
            // The job runs on, and the receiver is told and keeps nothing.
            stopped.resume();
            if let Some(why) = give_devices_back(deferred.as_ref()) {
                progress.warn(&format!("pid {pid}: {why}"));
            }
            let _ = link.send(&Control::Failed {
                code: error.exit_code(),
                reason: error.to_string(),
            });
            return Err(error.into());
        }
    };
    // Every task is stopped, or stops now: the plugin's or the gate's SIGSTOP came
    // while CRIU held them, and this waits for each (and stops any it missed).
    let tree = match stopped.stop() {
        Ok(tree) => {
            // Any task the walk before the freeze missed.
            if let Some(guard) = &guard {
                guard.tasks(&tree);
            }
            tree
        }
        Err(error) => {
            let _ = link.send(&Control::Failed {
                code: exit_code::MIGRATION_FAILED,
                reason: error.to_string(),
            });
            return Err(error.into());
        }
    };
    if deferred.is_some() {
        progress.event(
            "give-back-deferred",
            "the job keeps its devices as the dump left them until the move is decided \
             (their give-back would change the memory served from it)",
        );
    }
    let abort = |link: &mut Link, during: &'static str, why: String| {
        let _ = link.send(&Control::Failed {
            code: exit_code::MIGRATION_FAILED,
            reason: format!("the source gave up while {during}: {why}"),
        });
        let mut resumed = match tree.resume() {
            0 => format!("pid {pid} is no longer there to resume"),
            n => format!("the job runs on here (pid {pid}, {n} tasks resumed)"),
        };
        if let Some(why) = give_devices_back(deferred.as_ref()) {
            resumed.push_str(&format!(", but {why}"));
        }
        MigrateError::Failed {
            pid,
            peer: peer.clone(),
            during,
            why,
            resumed,
        }
    };
    let mut streamed = match beat {
        Ok(streamed) => streamed,
        Err(e) => {
            let why = receiver_reason(&mut link, &e).unwrap_or_else(|| e.to_string());
            return Err(abort(&mut link, "dumping", why));
        }
    };
    let sending = streamed.first_sent.unwrap_or_else(Instant::now);
    if opts.post_copy {
        let sent = (&mut streamed, lanes);
        // What the page server left out of the pages files, served from the tree.
        let dumped = (image.as_path(), dumped.in_tree);
        let held = (&tree, guard.as_ref());
        return post_copy(&mut link, dumped, sent, held, &peer, frozen_at, progress)
            .map(|outcome| MigrateOutcome {
                lanes: count,
                ..outcome
            })
            .map_err(|failure| match failure {
                PostCopyFailure::Before(during, why) => abort(&mut link, during, why),
                PostCopyFailure::After(why) => MigrateError::Uncertain {
                    pid,
                    peer: peer.clone(),
                    why,
                },
            });
    }
    let (files, bytes) = match send_image(&mut link, &image, &[], (&mut streamed, lanes)) {
        Ok(sent) => sent,
        Err(e) => {
            let why = receiver_reason(&mut link, &e).unwrap_or_else(|| e.to_string());
            return Err(abort(&mut link, "sending the image", why));
        }
    };
    let sent = sending.elapsed();
    progress.event(
        "sent",
        &format!("{files} files ({bytes} bytes) sent; the destination restores"),
    );
    let remote_pid = match link.receive_control() {
        Ok(Control::Restored { pid }) => pid,
        Ok(Control::Failed { reason, .. }) => {
            return Err(abort(
                &mut link,
                "the destination verified and restored the image",
                reason,
            ))
        }
        Ok(other) => {
            let why = ProtocolError::unexpected("restored", &other).to_string();
            return Err(abort(
                &mut link,
                "the destination verified and restored the image",
                why,
            ));
        }
        Err(e) => {
            return Err(abort(
                &mut link,
                "the destination verified and restored the image",
                e.to_string(),
            ))
        }
    };
    progress.event(
        "restored-there",
        &format!("restored on {peer} as pid {remote_pid}, stopped; committing"),
    );
    // From the Commit on, this copy never runs again on its own.
    let uncertain = |why: String| MigrateError::Uncertain {
        pid,
        peer: peer.clone(),
        why,
    };
    if let Some(guard) = &guard {
        guard.commit();
    }
    link.send(&Control::Commit)
        .map_err(|e| uncertain(e.to_string()))?;
    match link.receive_control() {
        Ok(Control::Resumed { pid: there, dir }) => {
            tree.kill();
            progress.event(
                "resumed",
                &format!("the job runs on {peer} (pid {there}); killed here"),
            );
            Ok(MigrateOutcome {
                peer,
                remote_pid: there,
                remote_dir: dir,
                files,
                bytes,
                frozen: frozen_at.elapsed(),
                sent,
                downtime: None,
                streamed: streamed.while_dumping,
                lanes: count,
                pages_in_tree: 0,
                pages_staged: 0,
            })
        }
        // The receiver kills its copy before it says so: this one runs on.
        Ok(Control::Failed { reason, .. }) => Err(abort(&mut link, "resuming there", reason)),
        Ok(other) => Err(uncertain(
            ProtocolError::unexpected("resumed", &other).to_string(),
        )),
        Err(e) => Err(uncertain(e.to_string())),
    }
}

/// Offer the job to the receiver: its backend and the part of this machine's GPU
/// topology the running tree uses ([`in_use`]). Ok when accepted.
/// Ok: the lanes granted, and the ticket they join with.
fn offer(
    link: &mut Link,
    pid: i32,
    peer: &str,
    post_copy: bool,
    lanes: u32,
) -> Result<(u32, String), MigrateError> {
    let setup = gpu::DumpSetup {
        freeze_timeout: None,
        cuda_staging: None,
        images_dir: None,
    };
    let backend = gpu::detect(pid, &setup)?;
    let topology = match &backend {
        Some(b) => Some(in_use(
            b.as_ref(),
            pid,
            gpu::LocalTopology::start(b.as_ref()).read()?,
        )),
        None => None,
    };
    link.send(&Control::Offer {
        pid,
        backend: backend.as_ref().map(|b| b.name().to_owned()),
        topology,
        post_copy,
        lanes,
    })?;
    match link.receive_control()? {
        Control::Accept {
            lanes: granted,
            ticket,
        } if (1..=lanes).contains(&granted) => Ok((granted, ticket)),
        Control::Accept { lanes: granted, .. } => Err(MigrateError::Refused {
            peer: peer.to_owned(),
            reason: format!("it granted {granted} lanes where 1 to {lanes} were asked for"),
        }),
        Control::Mismatch { report } => Err(MigrateError::Mismatch {
            peer: peer.to_owned(),
            report,
        }),
        Control::Failed { reason, .. } => Err(MigrateError::Refused {
            peer: peer.to_owned(),
            reason,
        }),
        other => Err(ProtocolError::unexpected("accept", &other).into()),
    }
}

/// The part of this machine's topology `local` that the tree rooted at `pid` uses, as
/// its backend tells it from the running tree; the whole of it when the backend cannot
/// tell. A destination with fewer GPUs than this machine, enough for the job, can then
/// take it; the restore there checks the image's own GPUs again.
fn in_use(
    backend: &dyn gpu::Backend,
    pid: i32,
    local: gpucr_topology::Topology,
) -> gpucr_topology::Topology {
    match backend.gpus_in_use(&gpu::tree_pids(pid), &local) {
        Some(used) => local.retain_gpus(|id| used.iter().any(|g| g.matches(id))),
        None => local,
    }
}

/// How a post-copy migration failed: before the Commit (while what; the job may run on
/// here), or after it.
enum PostCopyFailure {
    Before(&'static str, String),
    After(String),
}

/// The post-copy half of a migration, once the job is dumped into `image` (its pages
/// digested from the tree where `in_tree` says): every file but the large pages files,
/// which the destination pulls ([`postcopy::serve_blocks`]), from the stopped tree
/// where it can ([`TreeBlocks`]).
fn post_copy(
    link: &mut Link,
    (image, in_tree): (&Path, HashMap<String, InTree>),
    streamed: (&mut stream::Streamed, Lanes),
    (tree, guard): (&StoppedTree, Option<&SourceGuard>),
    peer: &str,
    frozen_at: Instant,
    progress: &mut Progress,
) -> Result<MigrateOutcome, PostCopyFailure> {
    let sending = Instant::now();
    let while_dumping = streamed.0.while_dumping;
    let (later, sizes): (Vec<String>, Vec<u64>) = files::list(image, MANIFEST_FILE)
        .map_err(|e| PostCopyFailure::Before("sending the image", e.to_string()))?
        .into_iter()
        .filter(|(name, size)| is_pulled(name, *size))
        .unzip();
    let pulled_bytes: u64 = sizes.iter().sum();
    // The tree is stopped and stays so until every page is in: what it holds is not
    // on the disk (the dump's page server left it out), and is served from there.
    let tree_blocks = TreeBlocks::new(&later, in_tree);
    let staged = staged_bytes(image, &later);
    progress.event(
        "pages-in-tree",
        &format!(
            "{} of the {} of memory pages to be pulled are served from the stopped job; \
             {} of them are on this disk",
            crate::units::size(tree_blocks.bytes()),
            crate::units::size(pulled_bytes),
            crate::units::size(staged),
        ),
    );
    {
        let (files, bytes) = send_image(link, image, &later, streamed).map_err(|e| {
            let why = receiver_reason(link, &e).unwrap_or_else(|| e.to_string());
            PostCopyFailure::Before("sending the image", why)
        })?;
        progress.event(
            "sent",
            &format!(
                "{files} files ({bytes} bytes) sent, {} pages files to be pulled; the \
                 destination restores",
                later.len()
            ),
        );
        let mut turns = SourceTurns {
            progress: &mut *progress,
            peer,
            tree,
            guard,
        };
        let served = postcopy::serve_blocks(link, image, &tree_blocks, &mut turns);
        match served {
            Ok(postcopy::Served::Finished {
                pid: there,
                dir,
                resumed_at,
                pulled,
            }) => {
                progress.event(
                    "all-in",
                    &format!("every page is in on {peer} (pid {there}); killed here"),
                );
                Ok(MigrateOutcome {
                    peer: peer.to_owned(),
                    remote_pid: there,
                    remote_dir: dir,
                    files,
                    bytes: bytes + pulled,
                    frozen: frozen_at.elapsed(),
                    sent: sending.elapsed(),
                    downtime: resumed_at.map(|at| at.duration_since(frozen_at)),
                    streamed: while_dumping,
                    lanes: 0,
                    pages_in_tree: tree_blocks.bytes(),
                    pages_staged: staged,
                })
            }
            Ok(postcopy::Served::Refused(why)) => Err(PostCopyFailure::Before(
                "the destination verified and restored the image",
                why,
            )),
            Err(failure) if failure.committed => Err(PostCopyFailure::After(format!(
                "post-copy: {}; the destination kills its copy when it loses the link",
                failure.why
            ))),
            Err(failure) => Err(PostCopyFailure::Before(
                "the destination restored the image",
                failure.why,
            )),
        }
    }
}

/// Once the tree runs again: the devices a post-copy dump left as it made them given
/// back (nothing to do without a deferred give-back); why a task may lack its device.
fn give_devices_back(deferred: Option<&DeferredGiveBack>) -> Option<String> {
    let error = deferred?.give_back().err()?;
    Some(format!("a task may not have its device back: {error}"))
}

/// Bytes of the files `names` in `dir` that take room on its disk (holes do not).
fn staged_bytes(dir: &Path, names: &[String]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    names
        .iter()
        .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
        .map(|m| (m.blocks() * 512).min(m.len()))
        .sum()
}

/// The source's part in post-copy's turns: the events, the stopped copy killed once
/// every page is in.
struct SourceTurns<'a> {
    progress: &'a mut Progress,
    peer: &'a str,
    tree: &'a StoppedTree,
    guard: Option<&'a SourceGuard>,
}

impl postcopy::ServingTurns for SourceTurns<'_> {
    fn committing(&mut self, there: i32) {
        if let Some(guard) = self.guard {
            guard.commit();
        }
        let peer = self.peer;
        self.progress.event(
            "restored-there",
            &format!("restored on {peer} as pid {there}, stopped; committing"),
        );
    }

    fn resumed(&mut self) {
        let peer = self.peer;
        self.progress.event(
            "resumed",
            &format!("the job runs on {peer}; its memory pages are served from here"),
        );
    }

    fn all_in(&mut self) {
        self.tree.kill();
    }
}

/// Whether post-copy leaves the file `name` of `size` bytes to be pulled: a memory
/// pages file large enough to be checked block by block.
fn is_pulled(name: &str, size: u64) -> bool {
    name.starts_with("pages-")
        && name.ends_with(".img")
        && !name.contains('/')
        && size >= crate::image::verify::BULK_THRESHOLD
}

/// Send the image at `dir`, the manifest last, then Done; the files and bytes sent.
/// The files streamed while CRIU dumped go first: the rest of each on the `lanes`, then
/// Whole. The files named in `later` are announced (Later, with their size) but not
/// sent.
fn send_image(
    link: &mut Link,
    dir: &Path,
    later: &[String],
    (streamed, lanes): (&mut stream::Streamed, Lanes),
) -> Result<(u64, u64), FilesError> {
    let list = files::list(dir, MANIFEST_FILE)?;
    let throttle = throttle();
    let mut bytes = 0u64;
    let mut pause = |n| {
        bytes += n;
        if let Some(pause) = throttle {
            std::thread::sleep(pause);
        }
    };
    let in_parts = streamed.finish(link, lanes, dir, BEAT)?;
    for (name, size) in &list {
        if streamed.has(name) {
            continue;
        }
        if later.contains(name) {
            link.send(&Control::Later {
                path: name.clone(),
                size: *size,
            })?;
            continue;
        }
        if let Some(signal) = crate::interrupt::requested() {
            return Err(FilesError::Read {
                path: dir.join(name),
                source: std::io::Error::other(format!(
                    "interrupted by {}",
                    crate::interrupt::name(signal)
                )),
            });
        }
        files::send(link, dir, name, &mut pause)?;
    }
    link.send(&Control::Done)?;
    Ok((list.len() as u64, bytes + in_parts))
}

/// The receiver's own account of a failure that reached this side as `error`: a lane
/// it closed (a full disk, a corrupt chunk) is asked about (LaneLost), and it answers
/// why (Failed).
fn receiver_reason(link: &mut Link, error: &FilesError) -> Option<String> {
    let closed = matches!(
        error,
        FilesError::Link(LinkError::Disconnected { .. }) | FilesError::Refused { .. }
    );
    if !closed {
        return None;
    }
    let asked = link.send(&Control::LaneLost {
        why: error.to_string(),
    });
    if asked.is_err() {
        return None;
    }
    match link.receive_control() {
        Ok(Control::Failed { reason, .. }) => Some(reason),
        _ => None,
    }
}

/// The test-only pause after each chunk sent (`GPUCR_TEST_MIGRATE_THROTTLE_MS`), so
/// that tests can cut the link while the image crosses.
fn throttle() -> Option<Duration> {
    gpucr_abi::env::test_millis("GPUCR_TEST_MIGRATE_THROTTLE_MS")
}

/// The version this side speaks, for the Hello.
pub(super) fn own_hello() -> Control {
    Control::Hello {
        protocol: PROTOCOL_VERSION,
        gpucr: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_of_no_lanes_or_more_than_asked_is_refused() {
        for (granted, ok) in [(0, false), (2, true), (3, true), (4, false)] {
            let (mut source, mut receiver) = super::super::link::testing::pair();
            let answering = std::thread::spawn(move || {
                let offer = receiver.receive_control().unwrap();
                assert!(
                    matches!(offer, Control::Offer { lanes: 3, .. }),
                    "{offer:?}"
                );
                receiver
                    .send(&Control::Accept {
                        lanes: granted,
                        ticket: "t".into(),
                    })
                    .unwrap();
            });
            let got = offer(&mut source, std::process::id() as i32, "peer", false, 3);
            answering.join().unwrap();
            match got {
                Ok((lanes, ticket)) => {
                    assert!(ok, "{granted} lanes taken");
                    assert_eq!((lanes, ticket.as_str()), (granted, "t"));
                }
                Err(e) => {
                    assert!(!ok, "{granted} lanes refused: {e}");
                    assert!(e.to_string().contains("lanes"), "{e}");
                    assert_eq!(e.exit_code(), exit_code::MIGRATION_FAILED);
                }
            }
        }
    }

    #[test]
    fn addresses_take_the_default_port_and_bad_ports_are_named() {
        let addrs = resolve("127.0.0.1").unwrap();
        assert_eq!(addrs[0].port(), DEFAULT_PORT);
        assert_eq!(resolve("127.0.0.1:9").unwrap()[0].port(), 9);
        assert_eq!(resolve("[::1]:9").unwrap()[0].port(), 9);
        assert_eq!(resolve("::1").unwrap()[0].port(), DEFAULT_PORT);
        let err = resolve("127.0.0.1:http").unwrap_err();
        assert!(err.to_string().contains("not a port"), "{err}");
        assert_eq!(err.exit_code(), exit_code::USAGE);
    }
}
