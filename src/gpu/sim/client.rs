//! The application side of the simulator: what a "GPU program" does to get a device
//! context and buffers. Used by the sim workload (`examples/sim_workload.rs`).
//!
//! Opening the device creates a context directory; each allocation creates a buffer
//! file of the requested size in it, maps it MAP_SHARED, and rewrites `context.json`.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::root::{Context, ContextBuffer, SimRoot, CONTEXT_FILE};
use crate::gpu::GpuError;

/// An open sim device: one context of one process.
#[derive(Debug)]
pub struct SimDevice {
    device: File,
    dir: PathBuf,
    context: Context,
}

/// A device buffer mapped into the process (MAP_SHARED over its file).
#[derive(Debug)]
pub struct MappedBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; access from other
// threads goes through `&`/`&mut` borrows like any byte slice.
unsafe impl Send for MappedBuffer {}
// SAFETY: see above; `&MappedBuffer` only hands out `&[u8]`.
unsafe impl Sync for MappedBuffer {}

impl SimDevice {
    /// Open `device_path` (the sim device node) and create a context named `name` under
    /// the root.
    pub fn open(root: &SimRoot, device_path: &Path, name: &str) -> Result<SimDevice, GpuError> {
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device_path)
            .map_err(GpuError::io(device_path))?;
        let dir = root.contexts_dir().join(name);
        fs::create_dir_all(&dir).map_err(GpuError::io(&dir))?;
        let context = Context {
            device_path: device_path.display().to_string(),
            device_fd: device.as_raw_fd(),
            buffers: Vec::new(),
        };
        let dev = SimDevice {
            device,
            dir,
            context,
        };
        dev.write_context()?;
        Ok(dev)
    }

    /// The context directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The device fd's number (recorded in the context).
    pub fn device_fd(&self) -> i32 {
        self.device.as_raw_fd()
    }

    /// Allocate a zeroed buffer of `size` bytes on `gpu_id` and map it.
    pub fn alloc(
        &mut self,
        name: &str,
        gpu_id: u32,
        size: u64,
        kind: &str,
    ) -> Result<MappedBuffer, GpuError> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(GpuError::io(&path))?;
        file.set_len(size).map_err(GpuError::io(&path))?;
        let buffer = MappedBuffer::map(&file, size as usize).map_err(GpuError::io(&path))?;
        self.context.buffers.push(ContextBuffer {
            name: name.to_owned(),
            gpu_id,
            size,
            kind: kind.to_owned(),
        });
        self.write_context()?;
        Ok(buffer)
    }

    fn write_context(&self) -> Result<(), GpuError> {
        let path = self.dir.join(CONTEXT_FILE);
        let text = serde_json::to_vec_pretty(&self.context).expect("context serialises");
        fs::write(&path, text).map_err(GpuError::io(&path))
    }
}

impl MappedBuffer {
    fn map(file: &File, len: usize) -> std::io::Result<MappedBuffer> {
        if len == 0 {
            return Ok(MappedBuffer {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh shared mapping of a file we opened read-write and sized to
        // `len`; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap never returns NULL on success");
        Ok(MappedBuffer { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our live mapping (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping exactly the mapping this value owns; no borrow outlives it.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_creates_a_shared_buffer_and_records_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SimRoot::new(tmp.path());
        let mut dev = SimDevice::open(&root, Path::new("/dev/null"), "ctx-test").unwrap();
        let mut b = dev.alloc("b0", 7, 8192, "vram").unwrap();
        b.as_mut_slice()[100] = 42;
        assert_eq!(
            fs::read(dev.dir().join("b0")).unwrap()[100],
            42,
            "MAP_SHARED writes reach the file"
        );
        let ctx = super::super::root::read_context(dev.dir()).unwrap();
        assert_eq!(ctx.buffers.len(), 1);
        assert_eq!(ctx.buffers[0].size, 8192);
        assert_eq!(ctx.device_fd, dev.device_fd());
        assert!(dev.alloc("b0", 7, 10, "vram").is_err(), "names are unique");
    }
}
