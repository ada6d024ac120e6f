//! Engine mode's restore: the helper `gpucr restore` runs, set up before CRIU touches
//! anything (the plugin's init hook waits for it) and driven by the plugin's hooks.
//!
//! * Set-up: the whole image is verified, the topology checked and the device state
//!   mapped onto this machine's GPUs; a failure fails CRIU's restore before it starts.
//! * The GPU image streams from the start, while CRIU restores memory; each task's
//!   buffers are filled before its RESTORE_EXT_FILE returns, the last hook whose
//!   failure CRIU honours (it then kills what it restored).
//! * RESTORE_DONE, from the plugin's exit hook: the image is closed and the helper ends.

use std::os::fd::OwnedFd;

use gpucr_abi::proto::engine_step::Step;

use super::events::{events, Event};
use super::{log_step, EngineError, EngineSettings, StatusPipe, LAST_REPLY_LIMIT};
use crate::helper::{EngineCall, GpuRestore, RestoreSettings, Session};
use crate::progress::Progress;
use crate::restore::{load_verified, prepare_gpu, Loaded, RestoreOptions};

/// Serve the restore of the image in `args.images_dir`.
pub fn serve(
    args: &super::EngineRun,
    connector: OwnedFd,
    status: &mut StatusPipe,
) -> Result<(), EngineError> {
    let settings = EngineSettings::from_env()?;
    let dir = args.images_dir.clone();
    let Loaded { manifest, topology } = load_verified(&dir, None)?;
    let opts = RestoreOptions {
        dir: dir.clone(),
        device_timeout: settings.device_timeout,
        transfer: settings.transfer.clone(),
        cuda_visible_devices: settings.cuda_visible_devices.clone(),
        ..RestoreOptions::default()
    };
    let Some((gpu, backend)) = prepare_gpu(&opts, &manifest, topology)? else {
        status.none();
        return Ok(());
    };
    let progress = Progress::silent();
    let name = backend.name();
    let restore = GpuRestore::start(
        Session::engine(connector, name),
        &dir,
        &gpu,
        backend,
        RestoreSettings {
            transfer: settings.transfer,
            parallel: true,
            device_timeout: settings.device_timeout,
            fill_at_hand_over: true,
            process_memory: None,
        },
        progress.gpu_events(),
        &opts.cancel,
    )?;
    let steps = events(restore.engine_steps(), args.criu_pid);
    status.ready(name);
    loop {
        let call = match steps.recv() {
            Ok(Event::Step(call)) => call,
            Ok(Event::CriuGone) | Err(_) => return Ok(()),
        };
        let EngineCall { step, ret, reply } = call;
        let started = std::time::Instant::now();
        match step {
            Step::RestoreDone => {
                let answer = if ret == 0 {
                    restore
                        .check_resumed()
                        .and_then(|()| restore.finish().map(|_| ()))
                        .map_err(|e| e.to_string())
                } else {
                    Ok(())
                };
                log_step(step, started, &answer);
                let _ = reply.send(answer);
                restore.drain_replies(LAST_REPLY_LIMIT);
                return Ok(());
            }
            Step::FinishCopy | Step::DumpDone => {
                let _ = reply.send(Err(format!("{step:?} during a restore")));
            }
        }
    }
}
