//! The cuda backend's plugin half. The CUDA driver keeps a process's device memory and
//! does every step itself, through the process's restore thread; the one thing only
//! CRIU's process can do is let that thread run while the task is frozen (it is CRIU's
//! ptrace tracee). Which thread that is, the driver says, in gpucr's helper (the only
//! process that loads the driver): this half asks the helper.

use gpucr_abi::cuda::{Collected as CudaCollected, COLLECTED_FORMAT};
use gpucr_abi::proto::{request, RestoreThread};

use super::{Collected, HalfError, PluginHalf};
use crate::helper;

#[derive(Debug, Default)]
pub struct CudaHalf;

/// The restore thread of `pid` the driver names, if it is a CUDA process.
fn ask_restore_thread(pid: i32) -> Result<Option<i32>, HalfError> {
    let reply = helper::call(request::Kind::RestoreThread(RestoreThread { pid }), &[])
        .map_err(|e| HalfError::new(e.errno(), format!("pid {pid}: {e}")))?;
    Ok((reply.run_thread > 0).then_some(reply.run_thread))
}

impl PluginHalf for CudaHalf {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn checkpoint(&self, pid: i32) -> Result<Option<Collected>, HalfError> {
        let Some(tid) = ask_restore_thread(pid)? else {
            return Ok(None);
        };
        let state = CudaCollected { restore_tid: tid };
        Ok(Some(Collected {
            format: COLLECTED_FORMAT.into(),
            state: serde_json::to_vec(&state).expect("the collected state serialises"),
            buffers: Vec::new(),
            run_thread: Some(tid),
        }))
    }

    fn restore_thread(&self, pid: i32) -> Option<i32> {
        match ask_restore_thread(pid) {
            Ok(tid) => tid,
            Err(e) => {
                crate::criu::error(&format!("cannot find the restore thread: {}", e.message));
                None
            }
        }
    }
}
