//! The application side of the simulator: what a "GPU program" does to get a device
//! context and buffers. Used by the sim workload (`examples/sim_workload.rs`).
//!
//! Opening the device creates a context directory; each allocation creates a buffer
//! file of the requested size in it, maps it MAP_SHARED, and rewrites `context.json`.
//!
//! With the `nvidia` driver model the process's driver can also move a buffer into the
//! process's own memory and back ([`MappedBuffer::move_to_host`],
//! [`MappedBuffer::move_to_device`]), at the same address, as CUDA's checkpoint API does.

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
    /// the root, with the default (`kfd`) driver model.
    pub fn open(root: &SimRoot, device_path: &Path, name: &str) -> Result<SimDevice, GpuError> {
        Self::open_with_driver(root, device_path, name, "")
    }

    /// [`SimDevice::open`] with the driver model `driver` ("" or "kfd", or "nvidia").
    pub fn open_with_driver(
        root: &SimRoot,
        device_path: &Path,
        name: &str,
        driver: &str,
    ) -> Result<SimDevice, GpuError> {
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
            driver: driver.to_owned(),
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

    /// Move the buffer into the process's own memory at the same address: its contents
    /// are copied out, the shared file mapping is replaced by private anonymous memory,
    /// the contents are copied back, and the buffer's file `path` (device memory) is
    /// removed. The caller makes sure nothing touches the buffer meanwhile.
    pub fn move_to_host(&self, path: &Path) -> std::io::Result<()> {
        if self.len == 0 {
            return fs::remove_file(path);
        }
        let saved = self.as_slice().to_vec();
        // SAFETY: replaces exactly this value's own mapping (same address and length)
        // with fresh anonymous memory; no reference into it is held across the call.
        let ptr = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the range is this value's mapping again, now private and writable.
        unsafe { std::ptr::copy_nonoverlapping(saved.as_ptr(), self.ptr.as_ptr(), self.len) };
        fs::remove_file(path)
    }

    /// Move the buffer back into device memory: a new buffer file `path` gets the
    /// contents and is mapped MAP_SHARED over the same address.
    pub fn move_to_device(&self, path: &Path) -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        std::io::Write::write_all(&mut file, self.as_slice())?;
        if self.len == 0 {
            return Ok(());
        }
        // SAFETY: maps the file over exactly this value's own range (same address and
        // length); the file holds the same bytes, so readers see no change.
        let ptr = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
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

    #[test]
    fn buffers_move_to_host_memory_and_back_at_the_same_address() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SimRoot::new(tmp.path());
        let mut dev =
            SimDevice::open_with_driver(&root, Path::new("/dev/null"), "ctx-nv", "nvidia").unwrap();
        let mut b = dev.alloc("b0", 7, 3 * 4096, "vram").unwrap();
        b.as_mut_slice()[5000] = 9;
        let file = dev.dir().join("b0");
        let addr = b.as_slice().as_ptr();
        b.move_to_host(&file).unwrap();
        assert!(!file.exists(), "device memory released");
        assert_eq!(b.as_slice()[5000], 9);
        b.as_mut_slice()[6000] = 3;
        b.move_to_device(&file).unwrap();
        assert_eq!(b.as_slice().as_ptr(), addr);
        let on_device = fs::read(&file).unwrap();
        assert_eq!((on_device[5000], on_device[6000]), (9, 3));
        b.as_mut_slice()[7000] = 1;
        assert_eq!(
            fs::read(&file).unwrap()[7000],
            1,
            "shared with the file again"
        );
        let ctx = super::super::root::read_context(dev.dir()).unwrap();
        assert!(ctx.is_nvidia());
    }
}
