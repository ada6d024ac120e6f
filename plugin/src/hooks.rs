//! The C entry points: trampolines that find the current run ([`PluginRun`]), call its
//! hook, catch panics and turn results into the return values CRIU expects (>= 0
//! success, negative errno failure, -ENOTSUP "not mine").
//!
//! CRIU's C plugin ABI passes a hook no context, so the run CRIU's `init` starts is kept
//! in [`RUN`], the plugin's one global, until its `exit`; a hook called with no run
//! (before `init`, after `exit`) says "not mine". When CRIU was not started by gpucr (no
//! helper), every hook of the run says "not mine" too, but in engine mode.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpucr_abi::plugin_abi::HookAbi;

use crate::run::{HookFailure, PluginRun};
use crate::settings::Settings;
use crate::{criu, NOT_OURS};

/// The run CRIU's `init` started and its `exit` ends.
static RUN: Mutex<Option<PluginRun>> = Mutex::new(None);

/// The current run, if any (a hook that panicked left it as it was).
fn current() -> MutexGuard<'static, Option<PluginRun>> {
    RUN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Run `f` and map its outcome to a C return value: a failure becomes its negative
/// errno, a panic -EIO.
fn guard(name: &str, f: impl FnOnce() -> Result<c_int, HookFailure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(ret)) => ret,
        Ok(Err(failure)) => {
            criu::failure(failure.kind, &format!("{name}: {}", failure.message));
            -failure.errno.max(1)
        }
        Err(_) => {
            criu::error(&format!("{name}: internal error (panic)"));
            -libc::EIO
        }
    }
}

/// Hook `name` on the current run; "not mine" without one.
fn with_run(name: &str, f: impl FnOnce(&mut PluginRun) -> Result<c_int, HookFailure>) -> c_int {
    guard(name, || match current().as_mut() {
        Some(run) => f(run),
        None => Ok(NOT_OURS),
    })
}

/// CRIU's `init` for `stage`, in a CRIU whose hook ABI is `abi` (the descriptor's entry
/// passes the ABI it was fitted to): a new run, with the settings CRIU's environment
/// gives.
pub fn init(stage: c_int, abi: Result<HookAbi, &str>) -> c_int {
    start(|| {
        PluginRun::new(
            stage,
            Settings::from_environment(),
            abi.map_err(str::to_owned),
        )
    })
}

/// Start the run `make` makes (a run an `init` without `exit` left ends here) and do
/// its `init`. The run stays whatever its `init` answers: CRIU calls `exit` after a
/// failed `init` too.
fn start(make: impl FnOnce() -> PluginRun) -> c_int {
    guard("init", || current().insert(make()).init())
}

pub unsafe extern "C" fn exit(stage: c_int, ret: c_int) {
    guard("exit", || {
        let run = current().take();
        if let Some(run) = run {
            run.exit(stage, ret);
        }
        criu::info(&format!("plugin finished (stage {stage}, result {ret})"));
        Ok(0)
    });
}

pub unsafe extern "C" fn pause_devices(pid: c_int) -> c_int {
    with_run("PAUSE_DEVICES", |run| run.pause_devices(pid))
}

pub unsafe extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    with_run("CHECKPOINT_DEVICES", |run| run.checkpoint_devices(pid))
}

pub unsafe extern "C" fn dump_ext_file(fd: c_int, id: c_int) -> c_int {
    with_run("DUMP_EXT_FILE", |run| run.dump_ext_file(fd, id))
}

/// HANDLE_DEVICE_VMA(fd, stat): 0 when the mapping is one of the backend's device
/// mappings (CRIU then leaves its contents to the plugin), else "not mine".
pub unsafe extern "C" fn handle_device_vma(_fd: c_int, stat: *const libc::stat) -> c_int {
    with_run("HANDLE_DEVICE_VMA", |run| {
        // SAFETY: CRIU passes null or a pointer to a `struct stat` it filled, valid for
        // the call.
        let stat = unsafe { stat.as_ref() };
        run.handle_device_vma(stat)
    })
}

/// UPDATE_VMA_MAP(path, addr, old_pgoff, &new_pgoff, &plugin_fd): 1 with the new offset
/// and fd of a device mapping the plugin half recreated, else "not mine".
pub unsafe extern "C" fn update_vma_map(
    path: *const c_char,
    addr: u64,
    old_pgoff: u64,
    new_pgoff: *mut u64,
    plugin_fd: *mut c_int,
) -> c_int {
    with_run("UPDATE_VMA_MAP", |run| {
        let pointers = !path.is_null() && !new_pgoff.is_null() && !plugin_fd.is_null();
        // SAFETY: CRIU passes the mapping's NUL-terminated file name, valid for the
        // call; read only when not null.
        let path = pointers.then(|| unsafe { CStr::from_ptr(path) });
        let Some((pgoff, fd)) = run.update_vma_map(path, addr, old_pgoff)? else {
            return Ok(NOT_OURS);
        };
        // SAFETY: both out-pointers were checked non-null (an answer needs a path,
        // given only then) and point to CRIU's locals.
        unsafe {
            *new_pgoff = pgoff;
            *plugin_fd = fd;
        }
        Ok(1)
    })
}

/// RESTORE_EXT_FILE(id), CRIU 4.1 and 4.2.
pub unsafe extern "C" fn restore_ext_file(id: c_int) -> c_int {
    restore_ext_file_guarded(id)
}

fn restore_ext_file_guarded(id: c_int) -> c_int {
    with_run("RESTORE_EXT_FILE", |run| run.restore_ext_file(id))
}

/// RESTORE_EXT_FILE(id, &retry_needed), CRIU 4.3 and criu-dev: gpucr restores a device
/// file in one call, so it never asks CRIU to call again. CRIU reads `*retry_needed`
/// whenever a plugin returns a descriptor, and leaves it uninitialised itself.
pub unsafe extern "C" fn restore_ext_file_retry(id: c_int, retry_needed: *mut bool) -> c_int {
    let ret = restore_ext_file_guarded(id);
    if !retry_needed.is_null() {
        // SAFETY: CRIU passes the address of its own `bool` local, valid for the call.
        unsafe { *retry_needed = false };
    }
    ret
}

/// RESTORE_EXT_FILE for a CRIU whose hook ABI could not be told: what CRIU passes beyond
/// `id` is unknown, so a device of gpucr's is refused (a failure CRIU reads nothing
/// more of); `init` has already failed such a restore, saying why.
pub unsafe extern "C" fn restore_ext_file_unknown_abi(_id: c_int) -> c_int {
    with_run("RESTORE_EXT_FILE", |run| run.restore_ext_file_unknown_abi())
}

/// DUMP_DEVICES_LATE(pid), CRIU 4.3 and criu-dev ([`PluginRun::dump_devices_late`]).
pub unsafe extern "C" fn dump_devices_late(pid: c_int) -> c_int {
    with_run("DUMP_DEVICES_LATE", |run| run.dump_devices_late(pid))
}

pub unsafe extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    with_run("RESUME_DEVICES_LATE", |run| run.resume_devices_late(pid))
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    use gpucr_abi::plugin_abi::stage;
    use gpucr_abi::proto::{request, Reply, Request};
    use gpucr_abi::wire;
    use gpucr_abi::PluginFailureKind;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    use super::*;
    use crate::half::{Collected, HalfError, PluginHalf};
    use crate::helper::HelperError;

    /// The tests that start runs (the one global) take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every hook, with arguments gpucr's never are: each says "not mine".
    fn every_hook_says_not_ours() {
        // SAFETY: the hooks take plain integers and null pointers, which they check;
        // fd -1 is never used.
        unsafe {
            assert_eq!(pause_devices(1), NOT_OURS);
            assert_eq!(checkpoint_devices(1), NOT_OURS);
            assert_eq!(dump_ext_file(-1, 1), NOT_OURS);
            assert_eq!(handle_device_vma(-1, std::ptr::null()), NOT_OURS);
            assert_eq!(
                update_vma_map(
                    std::ptr::null(),
                    0,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                NOT_OURS
            );
            assert_eq!(restore_ext_file(1), NOT_OURS);
            assert_eq!(restore_ext_file_unknown_abi(1), NOT_OURS);
            assert_eq!(dump_devices_late(1), NOT_OURS);
            let mut retry = true;
            assert_eq!(restore_ext_file_retry(1, &mut retry), NOT_OURS);
            assert!(!retry, "retry_needed is always answered");
            assert_eq!(resume_devices_late(1), NOT_OURS);
        }
    }

    #[test]
    fn hooks_without_a_run_or_without_gpucr_say_not_ours() {
        let _serial = serial();
        assert!(current().is_none());
        every_hook_says_not_ours();
        // A restore whose image does not need gpucr, in a CRIU gpucr did not start.
        let no_abi = Err("not loaded by CRIU".to_owned());
        assert_eq!(
            start(|| PluginRun::new(stage::RESTORE, Settings::default(), no_abi)),
            0
        );
        every_hook_says_not_ours();
        // SAFETY: plain integers.
        unsafe { exit(stage::RESTORE, 0) };
        assert!(current().is_none());
    }

    #[test]
    fn errors_keep_their_errno_and_panics_become_eio() {
        let failure = |errno| HookFailure {
            errno,
            kind: PluginFailureKind::Device,
            message: "boom".into(),
        };
        assert_eq!(guard("t", || Err(failure(libc::ENOSPC))), -libc::ENOSPC);
        assert_eq!(
            guard("t", || Err(
                HelperError::Connect(nix::Error::ECONNREFUSED).into()
            )),
            -libc::ECONNREFUSED
        );
        assert_eq!(
            guard("t", || Err(HalfError::new(libc::EPERM, "no").into())),
            -libc::EPERM
        );
        assert_eq!(guard("t", || panic!("boom")), -libc::EIO);
        assert_eq!(guard("t", || Ok(5)), 5);
    }

    /// A plugin half that counts its tree steps, and whose device does not come back
    /// while `fail_resume` is set.
    #[derive(Default)]
    struct TestHalf {
        tree_checkpoints: AtomicUsize,
        tree_resumes: AtomicUsize,
        fail_resume: AtomicBool,
    }

    impl PluginHalf for TestHalf {
        fn name(&self) -> &'static str {
            "test"
        }

        fn checkpoint_tree(&self) -> Result<(), HalfError> {
            self.tree_checkpoints.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }

        fn checkpoint(&self, _pid: i32) -> Result<Option<Collected>, HalfError> {
            Ok(None)
        }

        fn resume_tree(&self, _root: i32) -> Result<Vec<i32>, HalfError> {
            self.tree_resumes.fetch_add(1, Ordering::SeqCst);
            Ok(Vec::new())
        }

        fn resume(&self, pid: i32) -> Result<(), HalfError> {
            if self.fail_resume.load(Ordering::SeqCst) {
                return Err(HalfError::device(
                    libc::EIO,
                    format!("pid {pid}: no device"),
                ));
            }
            Ok(())
        }
    }

    /// A helper that answers every request with "ok": the connector's plugin end (which
    /// `GPUCR_HELPER_FD` would name), and the requests it answered, once that end is
    /// closed.
    fn fake_helper() -> (OwnedFd, JoinHandle<Vec<Request>>) {
        let (helper_end, plugin_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let serve = std::thread::spawn(move || {
            let mut answered = Vec::new();
            while let Ok((_connect, fds)) = wire::recv_msg::<Request>(helper_end.as_fd()) {
                let connection = fds.into_iter().next().expect("a connection");
                let (request, _fds): (Request, Vec<OwnedFd>) =
                    wire::recv_msg(connection.as_fd()).unwrap();
                let reply = Reply {
                    ok: true,
                    ..Reply::default()
                };
                wire::send(connection.as_fd(), &reply, &[]).unwrap();
                answered.push(request);
            }
            answered
        });
        (plugin_end, serve)
    }

    fn asked(requests: &[Request], which: fn(&request::Kind) -> bool) -> usize {
        requests
            .iter()
            .filter(|r| r.kind.as_ref().is_some_and(which))
            .count()
    }

    /// Each run starts from nothing: the tree's steps run and the inventory is named
    /// once per run, not once per process, and a task whose device did not come back in
    /// one restore stops no task of the next.
    #[test]
    fn a_run_starts_from_nothing_and_leaves_nothing_behind() {
        let _serial = serial();
        let (plugin_end, helper) = fake_helper();
        let settings = Settings {
            helper_fd: Some(plugin_end.as_raw_fd().to_string()),
            ..Settings::default()
        };
        let half = Arc::new(TestHalf::default());
        let start_run = |stage| {
            let (settings, half) = (settings.clone(), half.clone());
            assert_eq!(start(|| PluginRun::with_half(stage, settings, half)), 0);
        };
        let registered = || current().as_ref().unwrap().registered_in_inventory();
        // This process is never stopped or killed, even named.
        let me = std::process::id() as c_int;

        for dump in 1..=2 {
            start_run(stage::DUMP);
            assert!(!registered(), "dump {dump}");
            // SAFETY: plain integers.
            unsafe {
                assert_eq!(checkpoint_devices(me), 0);
                assert_eq!(checkpoint_devices(me), 0);
            }
            assert!(registered());
            assert_eq!(half.tree_checkpoints.load(Ordering::SeqCst), dump);
            // SAFETY: plain integers.
            unsafe { exit(stage::DUMP, 0) };
        }

        start_run(stage::RESTORE);
        half.fail_resume.store(true, Ordering::SeqCst);
        // SAFETY: plain integers.
        unsafe {
            assert_eq!(resume_devices_late(me), -libc::EIO);
            // The rest of this restore's tree is not resumed.
            assert_eq!(resume_devices_late(me), -libc::ECANCELED);
            exit(stage::RESTORE, -1);
        }
        half.fail_resume.store(false, Ordering::SeqCst);
        start_run(stage::RESTORE);
        // SAFETY: plain integers.
        unsafe {
            assert_eq!(resume_devices_late(me), 0);
            exit(stage::RESTORE, 0);
        }
        assert_eq!(half.tree_resumes.load(Ordering::SeqCst), 2);
        // SAFETY: plain integers.
        let after_exit = unsafe { checkpoint_devices(me) };
        assert_eq!(after_exit, NOT_OURS, "no run after exit");

        drop(plugin_end);
        let requests = helper.join().unwrap();
        let finished = |k: &request::Kind| matches!(k, request::Kind::DumpFinished(_));
        assert_eq!(asked(&requests, finished), 2, "one DumpFinished per dump");
        let failed = |k: &request::Kind| matches!(k, request::Kind::ResumeFailed(_));
        assert_eq!(asked(&requests, failed), 1);
    }
}
