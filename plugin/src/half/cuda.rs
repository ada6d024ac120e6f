//! The cuda backend's plugin half. The CUDA driver keeps a process's device memory and
//! does every step itself, through the process's restore thread; the one thing only
//! CRIU's process can do is let that thread run while the task is frozen (it is CRIU's
//! ptrace tracee). Which thread that is, the driver says, in gpucr's helper (the only
//! process that loads the driver): this half asks the helper.

use gpucr_abi::cuda::{Collected as CudaCollected, COLLECTED_FORMAT};
use gpucr_abi::proto::{
    request, CheckpointTree, RestoreThread, ResumeTree, ResumeTreeThreads, TreeThreads,
};

use super::{Collected, HalfError, PluginHalf};
use crate::helper::{Connector, HelperError};
use crate::thread::RunGuard;

#[derive(Debug)]
pub struct CudaHalf {
    /// The run's connector to the helper, which asks the driver.
    pub helper: Connector,
}

fn half_error(what: &str) -> impl FnOnce(HelperError) -> HalfError + '_ {
    move |e| HalfError::new(e.errno(), format!("{what}: {e}"))
}

/// The restore thread of `pid` the driver names, if it is a CUDA process.
fn ask_restore_thread(helper: &Connector, pid: i32) -> Result<Option<i32>, HalfError> {
    let reply = helper
        .call(request::Kind::RestoreThread(RestoreThread { pid }), &[])
        .map_err(half_error(&format!("pid {pid}")))?;
    Ok((reply.run_thread > 0).then_some(reply.run_thread))
}

impl PluginHalf for CudaHalf {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn dumps_device_files(&self) -> bool {
        false
    }

    fn checkpoint_tree(&self) -> Result<(), HalfError> {
        let reply = self
            .helper
            .call(request::Kind::TreeThreads(TreeThreads {}), &[])
            .map_err(half_error("the tree's restore threads"))?;
        if reply.run_threads.is_empty() {
            return Ok(());
        }
        // Every restore thread runs while the helper checkpoints the tasks in parallel.
        let running = RunGuard::start_all(&reply.run_threads)?;
        self.helper
            .call(request::Kind::CheckpointTree(CheckpointTree {}), &[])
            .map_err(half_error("checkpointing the tree"))?;
        crate::criu::info(&format!(
            "CHECKPOINT_DEVICES: {} CUDA processes checkpointed at once",
            reply.run_threads.len()
        ));
        drop(running);
        Ok(())
    }

    fn resume_tree(&self, root: i32) -> Result<Vec<i32>, HalfError> {
        let reply = self
            .helper
            .call(
                request::Kind::ResumeTreeThreads(ResumeTreeThreads { root }),
                &[],
            )
            .map_err(half_error("the restored tree's restore threads"))?;
        if reply.pids.is_empty() {
            return Ok(Vec::new());
        }
        // Every restore thread runs while the helper brings the tasks back in parallel.
        let running = RunGuard::start_all(&reply.run_threads)?;
        let pids = reply.pids;
        let done = self
            .helper
            .call(request::Kind::ResumeTree(ResumeTree { pids }), &[])
            .map_err(half_error("bringing the restored tree back"))?;
        crate::criu::info(&format!(
            "RESUME_DEVICES_LATE: {} CUDA processes brought back at once",
            done.pids.len()
        ));
        drop(running);
        Ok(done.pids)
    }

    fn checkpoint(&self, pid: i32) -> Result<Option<Collected>, HalfError> {
        let Some(tid) = ask_restore_thread(&self.helper, pid)? else {
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
        match ask_restore_thread(&self.helper, pid) {
            Ok(tid) => tid,
            Err(e) => {
                crate::criu::error(&format!("cannot find the restore thread: {}", e.message));
                None
            }
        }
    }
}
