//! One CRIU run of the plugin: a dump, a pre-dump or a restore, from CRIU's `init` hook
//! to its `exit` hook. [`PluginRun`] holds everything the plugin knows of the run (its
//! settings, the connector to gpucr's helper, the backend's plugin half, engine mode,
//! the tasks each step saw), and each hook is one of its methods; nothing is kept
//! anywhere else, so a run starts from nothing and leaves nothing behind. A restored
//! task, which CRIU forks from its main process after `init`, works on its own copy.

use std::ffi::{c_int, CStr, OsStr};
use std::sync::Arc;

use gpucr_abi::fault::FaultStep;
use gpucr_abi::plugin_abi::{stage, HookAbi};
use gpucr_abi::procfs;
use gpucr_abi::proto::{
    request, BuffersReady, CheckpointDevices, DumpBuffers, DumpFile, PauseDevices, ResumeDevices,
    ResumeFailed,
};
use gpucr_abi::wire::MAX_FDS;
use gpucr_abi::{PluginFailureKind, PLUGIN_EXIT_STEP, PLUGIN_NAME};

use crate::engine::{self, EngineError, EngineMode, Started};
use crate::half::{self, HalfError, PluginHalf};
use crate::helper::{Connector, HelperError};
use crate::settings::Settings;
use crate::thread::RunGuard;
use crate::unresumed::Unresumed;
use crate::{criu, device, NOT_OURS};

/// Why a hook failed: the message for CRIU's log and the errno CRIU gets back (the
/// cause's own errno where there is one, so CRIU's log and exit say what happened).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HookFailure {
    pub errno: i32,
    pub kind: PluginFailureKind,
    pub message: String,
}

/// The helper's connection broke, or the helper refused (its own failure is what gpucr
/// reports then): the plugin's part.
impl From<HelperError> for HookFailure {
    fn from(e: HelperError) -> Self {
        HookFailure {
            errno: e.errno(),
            kind: PluginFailureKind::Plugin,
            message: e.to_string(),
        }
    }
}

impl From<EngineError> for HookFailure {
    fn from(e: EngineError) -> Self {
        HookFailure {
            errno: e.errno(),
            kind: PluginFailureKind::Plugin,
            message: e.to_string(),
        }
    }
}

impl From<device::DeviceError> for HookFailure {
    fn from(e: device::DeviceError) -> Self {
        HookFailure {
            errno: e.errno(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl From<&HalfError> for HookFailure {
    fn from(e: &HalfError) -> Self {
        HookFailure {
            errno: e.errno,
            kind: e.kind,
            message: e.message.clone(),
        }
    }
}

impl From<HalfError> for HookFailure {
    fn from(e: HalfError) -> Self {
        HookFailure::from(&e)
    }
}

/// What serves a run that is gpucr's: the connector to gpucr's helper and the
/// backend's plugin half.
#[derive(Clone)]
struct Served {
    helper: Connector,
    half: Arc<dyn PluginHalf>,
}

/// What a dump's hooks saw.
#[derive(Debug, Default)]
struct DumpSeen {
    /// Whether this dump already named the plugin in CRIU's inventory.
    registered: bool,
    /// Whether this dump's first CHECKPOINT_DEVICES did the whole tree's step.
    tree_checkpointed: bool,
    /// Every task of this dump (PAUSE_DEVICES), for the step after it.
    paused: Vec<c_int>,
    /// The tasks whose CHECKPOINT_DEVICES went through, for
    /// [`PluginRun::tree_checkpointed`].
    checkpointed: Vec<c_int>,
}

/// What a restore's hooks saw.
#[derive(Debug, Default)]
struct RestoreSeen {
    /// Whether this restore's first RESUME_DEVICES_LATE did the whole tree's step.
    tree_resumed: bool,
    /// The tasks that step brought back: their own RESUME_DEVICES_LATE skip the helper.
    resumed_ahead: Vec<c_int>,
    /// The tasks RESUME_DEVICES_LATE was called for, and whether one failed.
    unresumed: Unresumed,
}

/// One CRIU run of the plugin, created by CRIU's `init` hook and dropped by its `exit`
/// hook ([`crate::hooks`]); tests make one with explicit settings and drive its hooks
/// as CRIU would.
pub struct PluginRun {
    /// The stage CRIU's `init` named (`gpucr_abi::plugin_abi::stage`).
    stage: c_int,
    /// Read at `init`: CRIU's environment, in engine mode completed by the settings file.
    settings: Settings,
    /// The hook ABI of the CRIU that loaded the plugin, or why it could not be told.
    abi: Result<HookAbi, String>,
    /// The helper and the plugin half, when the run is gpucr's (gpucr started CRIU, or
    /// engine mode started a helper); why the half could not be had, if so.
    served: Result<Option<Served>, HalfError>,
    engine: EngineMode,
    dump: DumpSeen,
    restore: RestoreSeen,
}

impl PluginRun {
    /// The run CRIU's `init` starts for `stage`, with `settings`, in a CRIU whose hook
    /// ABI is `abi`. Under gpucr (a connector in `settings`) the backend's plugin half
    /// is chosen now.
    pub fn new(stage: c_int, settings: Settings, abi: Result<HookAbi, String>) -> PluginRun {
        let served = match &settings.helper_fd {
            Some(fd) => served(
                Connector::named(fd.as_str()),
                settings.backend.as_deref(),
                &settings,
            ),
            None => Ok(None),
        };
        let late_hook = abi.as_ref().is_ok_and(|abi| abi.dump_devices_late());
        PluginRun {
            stage,
            settings,
            abi,
            served,
            engine: EngineMode::new(stage, late_hook),
            dump: DumpSeen::default(),
            restore: RestoreSeen::default(),
        }
    }

    /// A run of `stage` served by `half` and the helper behind `settings.helper_fd`, in
    /// no CRIU: for tests that drive a backend's hooks without CRIU (each restored task
    /// has a run of its own, as the copy CRIU's fork gives it).
    pub fn with_half(stage: c_int, settings: Settings, half: Arc<dyn PluginHalf>) -> PluginRun {
        let mut run = PluginRun::new(stage, settings, Err("not loaded by CRIU".into()));
        run.served = Ok(run.settings.helper_fd.as_ref().map(|fd| Served {
            helper: Connector::named(fd.as_str()),
            half,
        }));
        run
    }

    /// The helper and the plugin half, when the run is gpucr's.
    fn served(&self) -> Result<Option<Served>, HookFailure> {
        match &self.served {
            Ok(served) => Ok(served.clone()),
            Err(e) => Err(e.into()),
        }
    }

    /// Engine mode started a helper: it serves the run from now on.
    fn serve(&mut self, started: Started) {
        let backend = OsStr::new(&started.backend);
        self.served = served(started.connector, Some(backend), &self.settings);
    }

    /// Fail with an injected fault when `GPUCR_FAULT` names `step` (tests of the
    /// failure paths; see `gpucr_abi::fault`): a device failure, as a driver error or a
    /// broken device there would be.
    fn fault(&self, step: FaultStep) -> Result<(), HookFailure> {
        if self.settings.injects(step) {
            return Err(HookFailure {
                errno: libc::EIO,
                kind: PluginFailureKind::Device,
                message: step.message(),
            });
        }
        Ok(())
    }

    /// CRIU's `init`: claim the image's inventory entry (restore), complete the
    /// settings and start the helper in engine mode, and say what serves the run.
    pub fn init(&mut self) -> Result<c_int, HookFailure> {
        let stage_name = match self.stage {
            stage::DUMP => "dump",
            stage::PRE_DUMP => "pre-dump",
            stage::RESTORE => "restore",
            _ => "unknown stage",
        };
        let under_gpucr = self.settings.helper_fd.is_some();
        if self.stage == stage::RESTORE {
            // Claim our inventory entry (present when the image holds gpucr device
            // state) so CRIU does not refuse the restore.
            // Claim every entry: images may name the plugin more than once.
            let mut claimed = false;
            while criu::check_and_remove_inventory_plugin(PLUGIN_NAME) {
                claimed = true;
                if criu::inventory_is_legacy() {
                    break;
                }
            }
            criu::info(&format!(
                "plugin loaded ({stage_name}; image needs gpucr: {claimed}; {})",
                self.abi_line()
            ));
            if claimed && self.abi.is_err() {
                return Err(self.unknown_abi_failure());
            }
            if claimed && !under_gpucr {
                // A CRIU gpucr did not start (a container engine's): engine mode.
                self.settings = engine::load_settings();
                if let Some(started) = self.engine.start_restore(&self.settings)? {
                    self.serve(started);
                }
            }
        } else {
            criu::info(&format!(
                "plugin loaded ({stage_name}; {})",
                self.abi_line()
            ));
            if !under_gpucr {
                self.settings = engine::load_settings();
            }
        }
        if let Some(served) = self.served()? {
            criu::info(&format!("backend {} (plugin half)", served.half.name()));
        }
        Ok(0)
    }

    /// The hook ABI the descriptor was fitted to, for CRIU's log.
    fn abi_line(&self) -> String {
        match &self.abi {
            Ok(abi) => format!("hook ABI of {}, {} hooks", abi.releases(), abi.max_hooks()),
            Err(why) => format!("hook ABI unknown: {why}"),
        }
    }

    /// The failure of a restore that needs gpucr in a CRIU whose hook ABI is unknown.
    fn unknown_abi_failure(&self) -> HookFailure {
        let why = self
            .abi
            .as_ref()
            .err()
            .map_or("no reason recorded", String::as_str);
        HookFailure {
            errno: libc::EPROTO,
            kind: PluginFailureKind::Plugin,
            message: format!(
                "cannot tell this CRIU's plugin hook ABI, so gpucr cannot restore devices \
                 with it ({why}); gpucr supports CRIU 4.1, 4.2, 4.3 and criu-dev"
            ),
        }
    }

    /// CRIU's `exit`: the plugin half's and the helper's part, then engine mode's. The
    /// run ends here.
    pub fn exit(self, stage: c_int, ret: c_int) {
        let PluginRun {
            served,
            engine,
            dump,
            restore,
            settings,
            ..
        } = self;
        if let Ok(Some(served)) = &served {
            // A deferred give-back lets no restore thread run after a dump that
            // succeeded: the tree's memory is served as the image.
            let restore_threads = !(settings.defer_give_back && ret == 0);
            exit_served(served, (dump, restore), stage, ret, restore_threads);
        }
        engine.finish(stage, ret);
        stop_after_dump(&settings, stage, ret);
    }

    /// PAUSE_DEVICES(pid). In a CRIU gpucr did not start, engine mode's first look at
    /// the tree, which may start a helper.
    pub fn pause_devices(&mut self, pid: c_int) -> Result<c_int, HookFailure> {
        let served = match self.served()? {
            Some(served) => served,
            // A CRIU gpucr did not start: engine mode, when the tree holds a GPU.
            None => match self.engine.start_dump(pid, &self.settings)? {
                Some(started) => {
                    self.serve(started);
                    match self.served()? {
                        Some(served) => served,
                        None => return Ok(NOT_OURS),
                    }
                }
                None => return Ok(NOT_OURS),
            },
        };
        self.dump.paused.push(pid);
        served.half.pause(pid)?;
        self.fault(FaultStep::PluginPause)?;
        served
            .helper
            .call(request::Kind::PauseDevices(PauseDevices { pid }), &[])?;
        criu::info(&format!("PAUSE_DEVICES pid {pid}"));
        Ok(0)
    }

    /// CHECKPOINT_DEVICES(pid).
    pub fn checkpoint_devices(&mut self, pid: c_int) -> Result<c_int, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(NOT_OURS);
        };
        let half = &served.half;
        criu::info(&format!("CHECKPOINT_DEVICES pid {pid}"));
        if !std::mem::replace(&mut self.dump.tree_checkpointed, true) {
            half.checkpoint_tree()?;
            // The image holds GPU state even when no device file is dumped (a CUDA
            // process's driver releases its device files at the checkpoint): the
            // restore, in an engine's CRIU too, must know it needs gpucr.
            self.register_in_inventory();
        }
        let collected = half.checkpoint(pid)?;
        let (format, state, buffers, run_thread) = match collected {
            Some(c) => (c.format, c.state, c.buffers, c.run_thread),
            None => (String::new(), Vec::new(), Vec::new(), None),
        };
        self.fault(FaultStep::PluginCheckpoint)?;
        // Held until the gpucr half has taken the task over.
        let _running = run_thread.map(RunGuard::start).transpose()?.flatten();
        let fds = device::raw_fds_of(&buffers);
        let mut batches = fds.chunks(MAX_FDS);
        let kind = request::Kind::CheckpointDevices(CheckpointDevices {
            pid,
            format,
            state,
            buffer_count: fds.len() as u32,
        });
        served.helper.call(kind, batches.next().unwrap_or(&[]))?;
        for (n, batch) in batches.enumerate() {
            let kind = request::Kind::DumpBuffers(DumpBuffers {
                pid,
                first_index: ((n + 1) * MAX_FDS) as u32,
            });
            served.helper.call(kind, batch)?;
        }
        if !fds.is_empty() {
            criu::info(&format!(
                "CHECKPOINT_DEVICES pid {pid}: {} buffers handed to the helper",
                fds.len()
            ));
        }
        // The helper holds its own references; ours close here.
        drop(buffers);
        // Engine mode finishes the copy at the first device file CRIU dumps, the last
        // hook whose failure CRIU honours. A backend whose tasks keep no device file (a
        // CUDA process's driver releases them at the checkpoint) gets no such hook: the
        // copy is finished and the manifest's room taken once every task is
        // checkpointed, before CRIU dumps any memory, so that a full disk fails the dump
        // and the tree runs on. (Under gpucr's own CRIU the copy is finished at
        // post-dump: nothing to count.)
        if self.engine.active() && !half.dumps_device_files() && self.tree_checkpointed(pid) {
            self.engine.finish_copy_early()?;
        }
        Ok(0)
    }

    /// Record `pid` as checkpointed; true once every task PAUSE_DEVICES saw is, but
    /// those that have exited since (CRIU calls CHECKPOINT_DEVICES only for live tasks).
    fn tree_checkpointed(&mut self, pid: c_int) -> bool {
        let dump = &mut self.dump;
        dump.checkpointed.push(pid);
        dump.paused
            .iter()
            .all(|&paused| dump.checkpointed.contains(&paused) || procfs::has_exited(paused))
    }

    /// DUMP_EXT_FILE(fd, id): ask the helper whether the file behind `fd` is a device
    /// it carries.
    pub fn dump_ext_file(&mut self, fd: c_int, id: c_int) -> Result<c_int, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(NOT_OURS);
        };
        let kind = request::Kind::DumpFile(DumpFile { id: id as u32 });
        let reply = served.helper.call(kind, &[fd])?;
        if !reply.owned {
            return Ok(NOT_OURS);
        }
        self.register_in_inventory();
        criu::info(&format!(
            "DUMP_EXT_FILE id {id:#x}: device carried by gpucr"
        ));
        self.engine.finish_copy_early()?;
        Ok(0)
    }

    /// Name gpucr in CRIU's inventory, so that a restore (in any CRIU) knows the image
    /// needs this plugin. CRIU keeps every name it is given: once per dump.
    fn register_in_inventory(&mut self) {
        if !std::mem::replace(&mut self.dump.registered, true) {
            criu::add_inventory_plugin(PLUGIN_NAME);
        }
    }

    /// Whether this run named gpucr in CRIU's inventory.
    pub fn registered_in_inventory(&self) -> bool {
        self.dump.registered
    }

    /// HANDLE_DEVICE_VMA(fd, stat): 0 when the mapping is one of the backend's device
    /// mappings (CRIU then leaves its contents to the plugin), else "not mine".
    pub fn handle_device_vma(&self, stat: Option<&libc::stat>) -> Result<c_int, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(NOT_OURS);
        };
        let Some(stat) = stat else {
            return Ok(NOT_OURS);
        };
        Ok(if served.half.owns_vma(stat) {
            0
        } else {
            NOT_OURS
        })
    }

    /// UPDATE_VMA_MAP(path, addr, old_pgoff): the new offset and fd of a device mapping
    /// the plugin half recreated, or None ("not mine"; also without a `path`).
    pub fn update_vma_map(
        &self,
        path: Option<&CStr>,
        addr: u64,
        old_pgoff: u64,
    ) -> Result<Option<(u64, c_int)>, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(None);
        };
        let Some(path) = path else {
            return Ok(None);
        };
        Ok(served.half.update_vma(path, addr, old_pgoff))
    }

    /// RESTORE_EXT_FILE(id), inside the restored task: the device fd for CRIU.
    pub fn restore_ext_file(&self, id: c_int) -> Result<c_int, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(NOT_OURS);
        };
        let id = id as u32;
        let reply = match served.helper.call(
            request::Kind::RestoreFile(gpucr_abi::proto::RestoreFile { id }),
            &[],
        ) {
            Ok(reply) => reply,
            Err(HelperError::Refused(e)) if e.is_empty() => return Ok(NOT_OURS),
            Err(e) => return Err(e.into()),
        };
        let Some(spec) = reply.device else {
            return Ok(NOT_OURS);
        };
        let recreated = served.half.recreate(&spec)?;
        self.fault(FaultStep::PluginRecreate)?;
        let fds = device::raw_fds(&recreated.buffers);
        for (batch, chunk) in fds.chunks(MAX_FDS).enumerate() {
            let kind = request::Kind::BuffersReady(BuffersReady {
                id,
                first_index: (batch * MAX_FDS) as u32,
            });
            served.helper.call(kind, chunk)?;
        }
        // The helper holds its own references; ours close here.
        drop(recreated.buffers);
        criu::info(&format!(
            "RESTORE_EXT_FILE id {id:#x}: {} buffers handed to the helper, device fd {}",
            fds.len(),
            recreated.device_fd
        ));
        Ok(recreated.device_fd)
    }

    /// RESTORE_EXT_FILE for a CRIU whose hook ABI could not be told: a device of
    /// gpucr's is refused; `init` has already failed such a restore, saying why.
    pub fn restore_ext_file_unknown_abi(&self) -> Result<c_int, HookFailure> {
        match self.served()? {
            Some(_) => Err(self.unknown_abi_failure()),
            None => Ok(NOT_OURS),
        }
    }

    /// DUMP_DEVICES_LATE(pid), CRIU 4.3 and criu-dev: once every task of the tree rooted
    /// at `pid` is dumped, the last point at which a failure still fails the dump.
    /// Engine mode finishes the GPU copy and takes the manifest's room here (under
    /// `gpucr dump` that is post-dump's work, which gpucr is told of).
    pub fn dump_devices_late(&mut self, pid: c_int) -> Result<c_int, HookFailure> {
        if !self.engine.active() {
            return Ok(NOT_OURS);
        }
        self.engine.finish_copy()?;
        criu::info(&format!("DUMP_DEVICES_LATE pid {pid}: GPU copy finished"));
        Ok(0)
    }

    /// RESUME_DEVICES_LATE(pid). A task whose device does not come back is stopped with
    /// the whole tree, and killed at the `exit` hook ([`Unresumed`]).
    pub fn resume_devices_late(&mut self, pid: c_int) -> Result<c_int, HookFailure> {
        let Some(served) = self.served()? else {
            return Ok(NOT_OURS);
        };
        if !self.restore.unresumed.begin(pid) {
            return Err(HookFailure {
                errno: libc::ECANCELED,
                kind: PluginFailureKind::Device,
                message: format!(
                    "pid {pid} not resumed: another task of the tree did not get its device \
                     back"
                ),
            });
        }
        let resumed = self.resume_one(&served, pid);
        if resumed.is_err() {
            self.restore.unresumed.failed(pid);
        }
        resumed
    }

    /// RESUME_DEVICES_LATE for `pid`, which the tree's state allows.
    fn resume_one(&mut self, served: &Served, pid: c_int) -> Result<c_int, HookFailure> {
        let (half, helper) = (&served.half, &served.helper);
        if !std::mem::replace(&mut self.restore.tree_resumed, true) {
            // CRIU calls this hook once every task is restored and stopped: a backend
            // that brings the whole tree back at once does it now.
            let done = half.resume_tree(pid)?;
            self.restore.resumed_ahead.extend(done);
        }
        if !self.restore.resumed_ahead.contains(&pid) {
            let kind = request::Kind::ResumeDevices(ResumeDevices { pid });
            // The task's restore thread (if its backend has one) runs while the gpucr
            // half brings the device back.
            let _running = half
                .restore_thread(pid)
                .map(RunGuard::start)
                .transpose()?
                .flatten();
            helper.call(kind, &[])?;
        }
        let resumed = half
            .resume(pid)
            .map_err(HookFailure::from)
            .and_then(|()| self.fault(FaultStep::PluginResume));
        if let Err(e) = resumed {
            // CRIU goes on after this hook fails: the helper must know, so that the
            // task never runs without its device.
            let kind = request::Kind::ResumeFailed(ResumeFailed {
                pid,
                error: e.message.clone(),
            });
            if let Err(told) = helper.call(kind, &[]) {
                criu::error(&format!(
                    "RESUME_DEVICES_LATE pid {pid}: cannot tell the helper this failed: {told}"
                ));
            }
            return Err(e);
        }
        criu::info(&format!(
            "RESUME_DEVICES_LATE pid {pid}: device memory restored"
        ));
        Ok(0)
    }
}

/// The helper `helper` and the plugin half of `backend`, if the run names one.
fn served(
    helper: Connector,
    backend: Option<&OsStr>,
    settings: &Settings,
) -> Result<Option<Served>, HalfError> {
    let half = half::for_backend(backend, settings.sim_root.as_deref(), &helper)?;
    Ok(half.map(|half| Served {
        helper,
        half: Arc::from(half),
    }))
}

/// At the end of a dump that succeeded, with its devices given back, stop the tree
/// `GPUCR_STOP_AFTER_DUMP` names: CRIU still holds it, so each process takes SIGSTOP
/// pending and stops as CRIU lets it go (`gpucr migrate`). Not earlier: a restore thread
/// let run to give a device back would take the stop with it.
fn stop_after_dump(settings: &Settings, stage: c_int, ret: c_int) {
    if let (stage::DUMP, 0, Some(root)) = (stage, ret, settings.stop_after_dump) {
        let stopped = gpucr_abi::procfs::stop_tree(root);
        criu::info(&format!(
            "stopped the tree of pid {root} ({stopped} processes)"
        ));
    }
}

/// The plugin half's and the helper's part of the `exit` hook.
fn exit_served(
    served: &Served,
    (dump, restore): (DumpSeen, RestoreSeen),
    stage: c_int,
    ret: c_int,
    restore_threads: bool,
) {
    let half = &served.half;
    // The plugin half first (AMD's queues run again), then the gpucr half; what the
    // plugin half could not undo goes to the helper, which reports it.
    let plugin_errors = half.finish(stage, ret);
    if stage == stage::RESTORE {
        restore.unresumed.finish();
    }
    if stage != stage::DUMP {
        return;
    }
    // The tree is still stopped (CRIU lets it go after this hook): where it lives on,
    // the gpucr half gives every task its device back, with each task's restore thread
    // (if its backend has one) let run meanwhile.
    let mut running = Vec::new();
    for tid in dump
        .paused
        .iter()
        .filter(|_| restore_threads)
        .filter_map(|&pid| half.restore_thread(pid))
    {
        match RunGuard::start(tid) {
            Ok(guard) => running.extend(guard),
            Err(e) => criu::error(&format!("{PLUGIN_EXIT_STEP}{e}")),
        }
    }
    let kind = request::Kind::DumpFinished(gpucr_abi::proto::DumpFinished { ret, plugin_errors });
    if let Err(e) = served.helper.call(kind, &[]) {
        criu::error(&format!("{PLUGIN_EXIT_STEP}{e}"));
    }
    drop(running);
}
