//! CRIU's notifications during `gpucr dump`, answered, and the dump's verdict once CRIU
//! has answered: which failure the user is told about.
//!
//! post-dump comes while CRIU still holds the tree: the device memory, the pages'
//! digests and the manifest's room are settled then ([`PostDump`]), and a refusal fails
//! the dump with the tree left running. A signal refuses whatever comes next, which
//! makes CRIU roll the dump back.

use std::path::Path;

use super::page_digests::PageDigests;
use super::page_server::{PageServer, PageServerError};
use super::post_dump::{DumpDevices, PostDump, PostDumpError};
use super::tree_pages::TreePages;
use crate::criu::{CriuError, Notification};
use crate::gpu::GpuManifest;
use crate::helper::HelperError;
use crate::image::room::{self, ManifestRoom, RoomError};
use crate::interrupt;
use crate::progress::Progress;

/// Why the gate refused one of CRIU's notifications.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
    #[error(transparent)]
    PostDump(#[from] PostDumpError),
    #[error(transparent)]
    Pages(#[from] PageServerError),
}

/// Where the memory pages' digests come from.
pub(super) enum PageSource {
    /// CRIU writes the pages files; the digests are read from the tree meanwhile.
    Tree(TreePages),
    /// CRIU sends the pages to gpucr's page server, which digests what it gets.
    Server(PageServer),
}

/// What a dump answers CRIU's notifications with, and what it gathers at post-dump.
pub(super) struct Gate<'a> {
    post: PostDump<'a>,
    /// The signal that asked gpucr to stop, if one did (`interrupt::requested`).
    interrupted: fn() -> Option<i32>,
    dir: &'a Path,
    /// The pages' digests, taken while CRIU dumps the pages; laid out at post-dump.
    pages: Option<PageSource>,
    page_digests: PageDigests,
    /// The root of the tree to stop as CRIU lets it go ([`Gate::stopping`]).
    stop: Option<i32>,
}

/// What the gate gathered at post-dump, for the manifest.
pub(super) struct Gathered {
    pub gpu: Option<GpuManifest>,
    pub room: Option<ManifestRoom>,
    pub page_digests: PageDigests,
    /// The page server's own failure, where CRIU failed before post-dump (CRIU only
    /// says that the connection broke).
    pub pages_failure: Option<PageServerError>,
    /// The GPU copy was finished at post-dump (the helper's dump is closed).
    pub copy_finished: bool,
}

impl<'a> Gate<'a> {
    pub(super) fn new(
        dir: &'a Path,
        devices: Option<&'a dyn DumpDevices>,
        pages: Option<PageSource>,
    ) -> Gate<'a> {
        Gate {
            post: PostDump::new(dir, devices),
            interrupted: interrupt::requested,
            dir,
            pages,
            page_digests: PageDigests::default(),
            stop: None,
        }
    }

    /// The gate, stopping the tree rooted at `root` (if any) at the end of a post-dump
    /// it lets through: CRIU, which holds the tree, lets it go stopped.
    pub(super) fn stopping(mut self, root: Option<i32>) -> Gate<'a> {
        self.stop = root;
        self
    }

    /// Answer one of CRIU's notifications: Err refuses it, and CRIU rolls the dump back
    /// (the tree runs on).
    pub(super) fn notify(
        &mut self,
        n: &Notification,
        progress: &mut Progress,
    ) -> Result<(), Refusal> {
        progress.event(n.name(), &n.describe());
        if let Some(signal) = (self.interrupted)() {
            return Err(Refusal::Interrupted(interrupt::name(signal)));
        }
        if *n != Notification::PostDump {
            return Ok(());
        }
        // The device memory must be in the image before CRIU lets the tree go, and the
        // tasks' device state with it: a failure fails the dump.
        self.post.finish_copy()?;
        if self.post.copy_finished() {
            progress.event("gpu-done", "GPU memory written");
        }
        // The pages' digests are laid out while the tree is held: what was not read
        // from it yet still can be.
        if let Some(pages) = self.pages.take() {
            self.page_digests = match pages {
                PageSource::Tree(pages) => pages.finish(self.dir),
                PageSource::Server(server) => server.finish(self.dir)?,
            };
            progress.event(
                "pages-digested",
                &format!(
                    "memory pages digested: {} from the tree, {} read back",
                    crate::units::size(self.page_digests.from_tree),
                    crate::units::size(self.page_digests.from_files)
                ),
            );
        }
        // The manifest's room is taken while the tree is held, so that a full file
        // system fails the dump and leaves the tree running instead of losing both.
        let dir = self.dir;
        self.post
            .take_room(|gpu_bytes| room::needed(dir, gpu_bytes))?;
        if let Some(root) = self.stop {
            let stopped = gpucr_abi::procfs::stop_tree(root);
            progress.event(
                "stop-after-dump",
                &format!("the tree of pid {root} stops as CRIU lets it go ({stopped} processes)"),
            );
        }
        Ok(())
    }

    /// The gate, with `interrupted` asked whether a signal came (tests: none, whatever
    /// the test process's own signals).
    #[cfg(test)]
    fn with_interrupts(mut self, interrupted: fn() -> Option<i32>) -> Gate<'a> {
        self.interrupted = interrupted;
        self
    }

    /// What post-dump gathered.
    pub(super) fn gathered(mut self) -> Gathered {
        let copy_finished = self.post.copy_finished();
        let (gpu, room) = self.post.take_parts();
        let pages_failure = match self.pages.take() {
            Some(PageSource::Server(server)) => server.failure(),
            _ => None,
        };
        Gathered {
            gpu,
            room,
            page_digests: self.page_digests,
            pages_failure,
            copy_finished,
        }
    }
}

/// How a dump ended, once CRIU has answered.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The image is written: the manifest comes next.
    Written,
    /// A signal stopped it.
    Interrupted(&'static str),
    /// The GPU side failed; `criu_too` is CRIU's own failure where it says something
    /// the helper's error does not (CRIU did not merely relay the helper's refusal).
    Helper {
        error: HelperError,
        criu_too: Option<CriuError>,
    },
    /// No room for the manifest: the tree was not let go.
    Room(RoomError),
    /// The page server failed (CRIU then fails, or was refused at post-dump).
    Pages(PageServerError),
    /// CRIU failed on its own.
    Criu(CriuError),
}

/// The failure the user is told about, from what happened:
/// * `interrupted`: the signal that asked gpucr to stop, if one did;
/// * `refused`: the gate's first refusal of a notification;
/// * `criu`: CRIU's answer (and its exit);
/// * `devices`: the GPU half, asked for a failure of its own when CRIU failed;
/// * `copy_finished`: the GPU copy was already finished at post-dump, so finishing it
///   again cannot explain anything (it would only answer that it was finished).
///
/// In order: an interrupted dump that failed is reported as interrupted; a refusal at
/// post-dump names its own cause; when CRIU failed, the helper's own failure explains
/// it best (with CRIU's error beside it unless CRIU only relayed the helper's); else
/// CRIU's failure.
pub(super) fn verdict(
    interrupted: Option<&'static str>,
    refused: Option<Refusal>,
    criu: Result<(), CriuError>,
    devices: Option<&dyn DumpDevices>,
    copy_finished: bool,
) -> Verdict {
    let gpu_refused = matches!(refused, Some(Refusal::PostDump(PostDumpError::Devices(_))));
    if let (Some(signal), true) = (interrupted, criu.is_err() || gpu_refused) {
        return Verdict::Interrupted(signal);
    }
    match refused {
        Some(Refusal::Interrupted(signal)) => return Verdict::Interrupted(signal),
        Some(Refusal::PostDump(PostDumpError::Devices(error))) => {
            return Verdict::Helper {
                error,
                criu_too: None,
            }
        }
        Some(Refusal::PostDump(PostDumpError::Room(error))) => return Verdict::Room(error),
        Some(Refusal::Pages(error)) => return Verdict::Pages(error),
        None => {}
    }
    let Err(error) = criu else {
        return Verdict::Written;
    };
    let helper_failure = devices.and_then(|d| {
        d.take_failure()
            .or_else(|| (!copy_finished).then(|| d.finish().err()).flatten())
    });
    match helper_failure {
        Some(helper_error) => {
            // CRIU gave up because the plugin passed the helper's refusal on: nothing
            // more to say. Any other CRIU failure is shown too.
            let relayed = error
                .plugin_failure()
                .is_some_and(|f| f.contains(&helper_error.to_string()));
            Verdict::Helper {
                error: helper_error,
                criu_too: (!relayed).then_some(error),
            }
        }
        None => Verdict::Criu(error),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::gpu::GpuManifest;

    /// A scripted GPU half: what `finish` answers, a failure of its own, and how often
    /// each was asked.
    #[derive(Default)]
    struct Scripted {
        finish_fails: Option<String>,
        own_failure: RefCell<Option<String>>,
        finished: Cell<u32>,
        kept: Cell<u32>,
    }

    impl DumpDevices for Scripted {
        fn finish(&self) -> Result<GpuManifest, HelperError> {
            self.finished.set(self.finished.get() + 1);
            if self.finished.get() > 1 {
                return Err(HelperError::Failed("the dump was already finished".into()));
            }
            match &self.finish_fails {
                Some(text) => Err(HelperError::Failed(text.clone())),
                None => Ok(GpuManifest {
                    backend: "sim".into(),
                    tasks: Vec::new(),
                    stats: Default::default(),
                    timings: Vec::new(),
                }),
            }
        }
        fn keep(&self) {
            self.kept.set(self.kept.get() + 1);
        }
        fn take_failure(&self) -> Option<HelperError> {
            self.own_failure
                .borrow_mut()
                .take()
                .map(HelperError::Failed)
        }
        fn give_back_failure(&self) -> Option<String> {
            None
        }
    }

    fn criu_failed(text: &str) -> CriuError {
        CriuError::Failed {
            request: "dump",
            errno: None,
            errmsg: Some(text.into()),
            plugin_failure: None,
            script_failure: None,
            log: None,
            log_tail: Vec::new(),
        }
    }

    /// CRIU's notifications of one dump, answered by a gate over `devices` in
    /// `dir`, as CRIU would send them; the first refusal, as `Swrk` keeps it.
    fn session(dir: &Path, devices: &dyn DumpDevices) -> (Option<Refusal>, Gathered) {
        let mut gate = Gate::new(dir, Some(devices), None).with_interrupts(|| None);
        let mut progress = Progress::silent();
        let mut refused = None;
        for n in ["pre-dump", "network-lock", "query-ext-files", "post-dump"] {
            if let Err(e) = gate.notify(&Notification::from_wire(n, None), &mut progress) {
                refused.get_or_insert(e);
                break;
            }
        }
        (refused, gate.gathered())
    }

    #[test]
    fn a_dump_with_nothing_wrong_is_written_and_its_copy_finished_once() {
        let dir = tempfile::tempdir().unwrap();
        let devices = Scripted::default();
        let (refused, gathered) = session(dir.path(), &devices);
        assert!(refused.is_none());
        assert!(gathered.copy_finished && gathered.gpu.is_some() && gathered.room.is_some());
        assert_eq!((devices.finished.get(), devices.kept.get()), (1, 1));
        let v = verdict(None, None, Ok(()), Some(&devices), true);
        assert!(matches!(v, Verdict::Written), "{v:?}");
        assert_eq!(devices.finished.get(), 1);
    }

    /// The defect this module fixed: CRIU failing after post-dump finished the copy
    /// (a user's post-dump action script, say) was reported as the helper's "the dump
    /// was already finished", from a second finish.
    #[test]
    fn criu_failing_after_post_dump_is_reported_as_criu_s_failure() {
        let dir = tempfile::tempdir().unwrap();
        let devices = Scripted::default();
        let (refused, gathered) = session(dir.path(), &devices);
        let v = verdict(
            None,
            refused,
            Err(criu_failed("the action script failed")),
            Some(&devices),
            gathered.copy_finished,
        );
        match v {
            Verdict::Criu(e) => assert!(e.to_string().contains("the action script failed")),
            other => panic!("{other:?}"),
        }
        assert_eq!(devices.finished.get(), 1, "the copy was finished once");
    }

    #[test]
    fn a_copy_failing_at_post_dump_names_the_helper_and_not_criu() {
        let dir = tempfile::tempdir().unwrap();
        let devices = Scripted {
            finish_fails: Some("the disk is full".into()),
            ..Scripted::default()
        };
        let (refused, gathered) = session(dir.path(), &devices);
        assert!(!gathered.copy_finished && gathered.room.is_none());
        assert_eq!(devices.kept.get(), 0, "an unfinished image is not kept");
        let v = verdict(
            None,
            refused,
            Err(criu_failed("post-dump refused")),
            Some(&devices),
            gathered.copy_finished,
        );
        match v {
            Verdict::Helper { error, criu_too } => {
                assert!(error.to_string().contains("the disk is full"));
                assert!(criu_too.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn criu_failing_before_post_dump_is_explained_by_the_helper_s_own_failure() {
        let devices = Scripted {
            own_failure: RefCell::new(Some("pid 7 could not be paused".into())),
            ..Scripted::default()
        };
        let v = verdict(
            None,
            None,
            Err(criu_failed("Dumping FAILED")),
            Some(&devices),
            false,
        );
        match v {
            Verdict::Helper { error, criu_too } => {
                assert!(error.to_string().contains("pid 7 could not be paused"));
                // The plugin did not relay it: CRIU's failure is shown too.
                assert!(criu_too.is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn criu_failing_before_post_dump_with_a_sound_helper_is_criu_s_failure() {
        let devices = Scripted::default();
        let v = verdict(
            None,
            None,
            Err(criu_failed("Can't handle non-regular mapping")),
            Some(&devices),
            false,
        );
        // The unfinished copy is finished to see whether it failed: it did not.
        assert!(matches!(v, Verdict::Criu(_)), "{v:?}");
        assert_eq!(devices.finished.get(), 1);
    }

    #[test]
    fn a_signal_wins_over_every_other_failure_and_a_finished_dump_stays_written() {
        let devices = Scripted::default();
        let v = verdict(
            Some("SIGINT"),
            Some(Refusal::Interrupted("SIGINT")),
            Err(criu_failed("interrupted")),
            Some(&devices),
            false,
        );
        assert!(matches!(v, Verdict::Interrupted("SIGINT")), "{v:?}");
        // A signal that came after CRIU's success does not undo the dump.
        let v = verdict(Some("SIGTERM"), None, Ok(()), Some(&devices), true);
        assert!(matches!(v, Verdict::Written), "{v:?}");
    }

    #[test]
    fn no_room_for_the_manifest_is_its_own_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let error = ManifestRoom::take(&dir.path().join("missing"), 1).unwrap_err();
        let v = verdict(
            None,
            Some(Refusal::PostDump(PostDumpError::Room(error))),
            Err(criu_failed("post-dump refused")),
            None,
            false,
        );
        assert!(matches!(v, Verdict::Room(_)), "{v:?}");
    }

    #[test]
    fn a_cpu_dump_has_no_gpu_part_and_criu_s_failure_is_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut gate = Gate::new(dir.path(), None, None).with_interrupts(|| None);
        let mut progress = Progress::silent();
        gate.notify(&Notification::PostDump, &mut progress).unwrap();
        let gathered = gate.gathered();
        assert!(gathered.gpu.is_none() && !gathered.copy_finished);
        assert!(gathered.room.is_some());
        let v = verdict(None, None, Err(criu_failed("x")), None, false);
        assert!(matches!(v, Verdict::Criu(_)));
    }
}
