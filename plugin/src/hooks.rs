//! The C entry points: trampolines that catch panics and turn results into the return
//! values CRIU expects (>= 0 success, negative errno failure, -ENOTSUP "not mine").

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use gpucr_abi::plugin_abi::stage;
use gpucr_abi::proto::{request, BuffersReady, CheckpointDevices, DumpFile, ResumeDevices};
use gpucr_abi::wire::MAX_FDS;
use gpucr_abi::PLUGIN_NAME;

use crate::helper::{self, HelperError};
use crate::{criu, device, NOT_OURS};

/// Whether this dump already named the plugin in CRIU's inventory.
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Why a hook failed: the message for CRIU's log and the errno CRIU gets back (the
/// cause's own errno where there is one, so CRIU's log and exit say what happened).
#[derive(Debug)]
pub struct HookFailure {
    errno: i32,
    message: String,
}

impl From<HelperError> for HookFailure {
    fn from(e: HelperError) -> Self {
        HookFailure {
            errno: e.errno(),
            message: e.to_string(),
        }
    }
}

impl From<device::DeviceError> for HookFailure {
    fn from(e: device::DeviceError) -> Self {
        HookFailure {
            errno: e.source.raw_os_error().unwrap_or(libc::EIO),
            message: e.to_string(),
        }
    }
}

/// Run `f` and map its outcome to a C return value: a failure becomes its negative
/// errno, a panic -EIO.
fn guard(name: &str, f: impl FnOnce() -> Result<c_int, HookFailure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(ret)) => ret,
        Ok(Err(failure)) => {
            criu::error(&format!("{name}: {}", failure.message));
            -failure.errno.max(1)
        }
        Err(_) => {
            criu::error(&format!("{name}: internal error (panic)"));
            -libc::EIO
        }
    }
}

pub unsafe extern "C" fn init(stage: c_int) -> c_int {
    guard("init", || {
        let stage_name = match stage {
            stage::DUMP => "dump",
            stage::PRE_DUMP => "pre-dump",
            stage::RESTORE => "restore",
            _ => "unknown stage",
        };
        if stage == stage::RESTORE {
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
                "plugin loaded ({stage_name}; image needs gpucr: {claimed})"
            ));
        } else {
            criu::info(&format!("plugin loaded ({stage_name})"));
        }
        Ok(0)
    })
}

pub unsafe extern "C" fn exit(stage: c_int, ret: c_int) {
    guard("exit", || {
        criu::info(&format!("plugin finished (stage {stage}, result {ret})"));
        Ok(0)
    });
}

pub unsafe extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    guard("CHECKPOINT_DEVICES", || {
        if !helper::configured() {
            return Ok(NOT_OURS);
        }
        criu::info(&format!("CHECKPOINT_DEVICES pid {pid}"));
        let kind = request::Kind::CheckpointDevices(CheckpointDevices { pid });
        helper::call(kind, &[])?;
        Ok(0)
    })
}

pub unsafe extern "C" fn dump_ext_file(fd: c_int, id: c_int) -> c_int {
    guard("DUMP_EXT_FILE", || {
        if !helper::configured() {
            return Ok(NOT_OURS);
        }
        let kind = request::Kind::DumpFile(DumpFile { id: id as u32 });
        let reply = helper::call(kind, &[fd])?;
        if !reply.owned {
            return Ok(NOT_OURS);
        }
        let name = if reply.plugin_name.is_empty() {
            PLUGIN_NAME
        } else {
            &reply.plugin_name
        };
        // CRIU keeps every name it is given: register once per dump, not once per file.
        if !REGISTERED.swap(true, Ordering::SeqCst) {
            criu::add_inventory_plugin(name);
        }
        criu::info(&format!(
            "DUMP_EXT_FILE id {id:#x}: device carried by gpucr"
        ));
        Ok(0)
    })
}

pub unsafe extern "C" fn restore_ext_file(id: c_int) -> c_int {
    guard("RESTORE_EXT_FILE", || {
        if !helper::configured() {
            return Ok(NOT_OURS);
        }
        let id = id as u32;
        let reply = match helper::call(
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
        let buffers = device::recreate(&spec)?;
        let fds = device::raw_fds(&buffers);
        for (batch, chunk) in fds.chunks(MAX_FDS).enumerate() {
            let kind = request::Kind::BuffersReady(BuffersReady {
                id,
                first_index: (batch * MAX_FDS) as u32,
            });
            helper::call(kind, chunk)?;
        }
        // The helper holds its own references; ours close here.
        drop(buffers);
        let fd = device::open_device(&spec)?;
        criu::info(&format!(
            "RESTORE_EXT_FILE id {id:#x}: {} buffers handed to the helper, device fd {fd}",
            fds.len()
        ));
        Ok(fd)
    })
}

pub unsafe extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    guard("RESUME_DEVICES_LATE", || {
        if !helper::configured() {
            return Ok(NOT_OURS);
        }
        let kind = request::Kind::ResumeDevices(ResumeDevices { pid });
        helper::call(kind, &[])?;
        criu::info(&format!(
            "RESUME_DEVICES_LATE pid {pid}: device memory restored"
        ));
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_without_gpucr_say_not_ours() {
        if helper::configured() {
            return;
        }
        // SAFETY: the hooks take plain integers; fd -1 is never used when unconfigured.
        unsafe {
            assert_eq!(checkpoint_devices(1), NOT_OURS);
            assert_eq!(dump_ext_file(-1, 1), NOT_OURS);
            assert_eq!(restore_ext_file(1), NOT_OURS);
            assert_eq!(resume_devices_late(1), NOT_OURS);
        }
    }

    #[test]
    fn errors_keep_their_errno_and_panics_become_eio() {
        let failure = |errno| HookFailure {
            errno,
            message: "boom".into(),
        };
        assert_eq!(guard("t", || Err(failure(libc::ENOSPC))), -libc::ENOSPC);
        assert_eq!(
            guard("t", || Err(
                HelperError::Connect(nix::Error::ECONNREFUSED).into()
            )),
            -libc::ECONNREFUSED
        );
        assert_eq!(guard("t", || panic!("boom")), -libc::EIO);
        assert_eq!(guard("t", || Ok(5)), 5);
    }
}
