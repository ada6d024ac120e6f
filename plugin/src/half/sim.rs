//! The simulator's plugin half. At CHECKPOINT_DEVICES it finds the device context a
//! frozen task maps its buffers from, checks that the task holds the device the context
//! names, and opens each buffer read-only, the way a DMABUF export hands device memory
//! to another process; the gpucr half copies through those fds. At restore the default
//! recreation (directories, files, sized buffers beneath the sim root) is all it needs.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpucr_abi::sim::{
    Collected as SimCollected, CollectedBuffer, Context, COLLECTED_FORMAT, CONTEXTS_DIR,
    CONTEXT_FILE, ENV_ROOT, RESTORE_THREAD,
};

use super::{Collected, HalfError, PluginHalf};

#[derive(Debug)]
pub struct SimHalf {
    contexts: PathBuf,
}

impl SimHalf {
    /// The half beneath the simulator's root (`GPUCR_SIM_ROOT`), which must be set.
    pub fn at(root: Option<&Path>) -> Result<SimHalf, HalfError> {
        let root =
            root.ok_or_else(|| HalfError::new(libc::EINVAL, format!("{ENV_ROOT} is not set")))?;
        Ok(SimHalf::new(root))
    }

    pub fn new(root: &Path) -> SimHalf {
        SimHalf {
            contexts: root.join(CONTEXTS_DIR),
        }
    }

    /// The context directories `pid` maps files from.
    fn mapped_contexts(&self, pid: i32) -> Result<BTreeSet<PathBuf>, HalfError> {
        let files = gpucr_abi::procfs::mapped_files(pid).map_err(|e| {
            let path = gpucr_abi::procfs::maps_path(pid);
            proc_error(&path.display().to_string(), e)
        })?;
        Ok(files
            .iter()
            .filter_map(|file| {
                let rel = file.strip_prefix(&self.contexts).ok()?;
                Some(self.contexts.join(rel.components().next()?))
            })
            .collect())
    }
}

/// A file of /proc about the task: failing to read it is the plugin's failure.
fn read(path: &str) -> Result<String, HalfError> {
    fs::read_to_string(path).map_err(|e| proc_error(path, e))
}

fn proc_error(path: &str, e: std::io::Error) -> HalfError {
    HalfError::new(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("{path}: {e}"),
    )
}

/// A file of the simulated device (its context, a buffer) cannot be read: the device's
/// failure.
fn io_error(path: &Path, e: std::io::Error) -> HalfError {
    HalfError::device(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("{}: {e}", path.display()),
    )
}

/// The simulated device's state of `pid` is not what its driver keeps: the device's
/// failure.
fn bad(pid: i32, detail: String) -> HalfError {
    HalfError::device(libc::EINVAL, format!("pid {pid}: {detail}"))
}

impl PluginHalf for SimHalf {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn checkpoint(&self, pid: i32) -> Result<Option<Collected>, HalfError> {
        let contexts = self.mapped_contexts(pid)?;
        let Some(ctx_dir) = contexts.iter().next() else {
            return Ok(None);
        };
        if contexts.len() > 1 {
            return Err(bad(
                pid,
                format!(
                    "maps {} sim device contexts; one per process is supported",
                    contexts.len()
                ),
            ));
        }
        let context_path = ctx_dir.join(CONTEXT_FILE);
        let context_text =
            fs::read_to_string(&context_path).map_err(|e| io_error(&context_path, e))?;
        let context_mode = fs::metadata(&context_path)
            .map_err(|e| io_error(&context_path, e))?
            .mode()
            & 0o7777;
        let ctx: Context = serde_json::from_str(&context_text)
            .map_err(|e| bad(pid, format!("{}: {e}", context_path.display())))?;
        let fd_link = format!("/proc/{pid}/fd/{}", ctx.device_fd);
        if fs::read_link(&fd_link).map_or(true, |t| t != Path::new(&ctx.device_path)) {
            return Err(bad(
                pid,
                format!(
                    "context {} says the device is fd {}, which is not {} in this process",
                    ctx_dir.display(),
                    ctx.device_fd,
                    ctx.device_path
                ),
            ));
        }
        let device_flags = fd_flags(pid, ctx.device_fd)?;
        // The nvidia model's driver moves the memory into the process itself, through
        // its restore thread, which must run while the gpucr half asks it to: no buffer
        // to hand over. Otherwise every buffer is opened, as a DMABUF export would be.
        let (buffers, fds, run_thread) = if ctx.is_nvidia() {
            let Some(tid) = crate::thread::find_named(pid, RESTORE_THREAD) else {
                return Err(bad(
                    pid,
                    format!("nvidia-model context without its {RESTORE_THREAD} thread"),
                ));
            };
            (Vec::new(), Vec::new(), Some(tid))
        } else {
            let (buffers, fds) = open_buffers(pid, ctx_dir, &ctx)?;
            (buffers, fds, None)
        };
        let collected = SimCollected {
            context_dir: ctx_dir.display().to_string(),
            context: context_text,
            context_mode,
            device_path: ctx.device_path,
            device_flags,
            buffers,
        };
        Ok(Some(Collected {
            format: COLLECTED_FORMAT.into(),
            state: serde_json::to_vec(&collected).expect("the collected state serialises"),
            buffers: fds,
            run_thread,
        }))
    }

    fn restore_thread(&self, pid: i32) -> Option<i32> {
        crate::thread::find_named(pid, RESTORE_THREAD)
    }
}

/// Open every buffer of `ctx` (in `ctx_dir`) read-only, checking each size.
fn open_buffers(
    pid: i32,
    ctx_dir: &Path,
    ctx: &Context,
) -> Result<(Vec<CollectedBuffer>, Vec<OwnedFd>), HalfError> {
    let mut buffers = Vec::with_capacity(ctx.buffers.len());
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(ctx.buffers.len());
    for b in &ctx.buffers {
        let path = ctx_dir.join(&b.name);
        let file = File::open(&path).map_err(|e| io_error(&path, e))?;
        let meta = file.metadata().map_err(|e| io_error(&path, e))?;
        if meta.len() != b.size {
            return Err(bad(
                pid,
                format!(
                    "{}: buffer is {} bytes, its context says {}",
                    path.display(),
                    meta.len(),
                    b.size
                ),
            ));
        }
        buffers.push(CollectedBuffer {
            path: path.display().to_string(),
            size: b.size,
            gpu_id: b.gpu_id,
            kind: b.kind.clone(),
            mode: meta.mode() & 0o7777,
        });
        fds.push(file.into());
    }
    Ok((buffers, fds))
}

/// The open flags of `pid`'s fd (from /proc/PID/fdinfo): access mode and O_NONBLOCK.
fn fd_flags(pid: i32, fd: i32) -> Result<i32, HalfError> {
    let path = gpucr_abi::procfs::fdinfo_path(pid, fd);
    let text = read(&path)?;
    let flags = gpucr_abi::procfs::parse_fd_flags(&text)
        .ok_or_else(|| bad(pid, format!("{path}: no flags line")))?;
    Ok(flags & (libc::O_ACCMODE | libc::O_NONBLOCK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_a_sim_context_is_not_ours() {
        let root = std::env::temp_dir().join(format!("gpucr-sim-half-{}", std::process::id()));
        let half = SimHalf::new(&root);
        let me = std::process::id() as i32;
        assert!(half.checkpoint(me).unwrap().is_none());
        let err = half.checkpoint(-1).unwrap_err();
        assert_eq!(err.errno, libc::ENOENT, "{err}");
    }
}
