//! Memory mappings with an owner: anonymous private memory (host staging, dumped by CRIU
//! with the process) and shared file mappings (the control file, and a target's device
//! memory mapped into a controlling process).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A mapping, unmapped on drop. Zero-length mappings map nothing.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&self`
// (shared reads, or writes the caller synchronises) and `&mut self`.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes of private anonymous memory, zeroed.
    pub fn anonymous(len: usize) -> io::Result<Self> {
        Self::map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }

    /// The first `len` bytes of `file`, shared and writable.
    pub fn shared(file: &File, len: usize) -> io::Result<Self> {
        Self::map(len, libc::MAP_SHARED, file.as_raw_fd())
    }

    fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> io::Result<Self> {
        if len == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a new mapping at an address the kernel chooses; `fd` is open (or -1
        // for anonymous memory) and the mapping does not outlive this value's use of it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its bytes.
    /// Whether every page of the mapping is resident (`mincore`): a page of private
    /// memory still to come through a userfaultfd is not.
    pub fn resident(&self) -> io::Result<bool> {
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let mut vec = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: the range is this mapping (page-aligned, `len` bytes, mapped as long
        // as `self`), and `vec` has one byte per page of it.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().all(|v| v & 1 == 1))
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes are mapped readable at `ptr` (or `len` is 0 and the
        // pointer is dangling but aligned) for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr`/`len` are exactly the mapping this value made, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}
