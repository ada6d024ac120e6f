//! The userfaultfd a restored task's CRIU opened: its messages and the ioctls that fill
//! its memory (UFFDIO_COPY, UFFDIO_ZEROPAGE, UFFDIO_UNREGISTER).
//!
//! The kernel's structures are declared here by hand (linux/userfaultfd.h; the libc
//! crate has none) with their sizes and offsets asserted. CRIU has already done
//! UFFDIO_API (features EVENT_FORK, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP) and the
//! restorer registered the lazy areas: this side only reads and fills.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `struct uffd_msg`: an 8-byte header and a 24-byte union, packed to 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdMsgRaw {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}
const _: () = assert!(size_of::<UffdMsgRaw>() == 32);
const _: () = assert!(offset_of!(UffdMsgRaw, event) == 0);
const _: () = assert!(offset_of!(UffdMsgRaw, arg) == 8);

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}
const _: () = assert!(size_of::<UffdioRange>() == 16);
const _: () = assert!(offset_of!(UffdioRange, len) == 8);

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
const _: () = assert!(size_of::<UffdioCopy>() == 40);
const _: () = assert!(offset_of!(UffdioCopy, src) == 8);
const _: () = assert!(offset_of!(UffdioCopy, len) == 16);
const _: () = assert!(offset_of!(UffdioCopy, mode) == 24);
const _: () = assert!(offset_of!(UffdioCopy, copy) == 32);

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
const _: () = assert!(size_of::<UffdioZeropage>() == 32);
const _: () = assert!(offset_of!(UffdioZeropage, mode) == 16);
const _: () = assert!(offset_of!(UffdioZeropage, zeropage) == 24);

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_FORK: u8 = 0x13;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

/// `_IOC(dir, 0xAA, nr, size)` as asm-generic encodes it.
const fn uffd_ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const UFFDIO_UNREGISTER: u64 = uffd_ioc(IOC_READ, 0x01, size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = uffd_ioc(IOC_READ | IOC_WRITE, 0x03, size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = uffd_ioc(IOC_READ | IOC_WRITE, 0x04, size_of::<UffdioZeropage>());
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_COPY == 0xC028_AA03);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xC020_AA04);

/// One message read from a userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread touched `address` (not page-aligned) and waits for it.
    PageFault { address: u64 },
    /// The task forked: the child's memory has its own userfaultfd, installed in this
    /// process by the read.
    Fork { uffd: OwnedFd },
    /// mremap moved `len` bytes from `from` to `to`.
    Remap { from: u64, to: u64, len: u64 },
    /// madvise(MADV_DONTNEED or MADV_REMOVE) dropped `start..end`: it reads as zeros now.
    Remove { start: u64, end: u64 },
    /// munmap (or a mapping over it) took `start..end` away.
    Unmap { start: u64, end: u64 },
    /// A message this server does not know.
    Unknown { event: u8 },
}

/// What a fill ioctl did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// All of it was placed.
    Done,
    /// `placed` bytes were placed, then a page that already holds data stopped it.
    Exists { placed: u64 },
    /// The memory changed shape under it (an event waits to be read): try again later.
    Again { placed: u64 },
    /// The task's memory is gone (it exited).
    Gone,
    /// No mapping registered with this userfaultfd is there (any more).
    Unregistered,
}

/// A userfaultfd, owned.
#[derive(Debug)]
pub struct Uffd(OwnedFd);

impl Uffd {
    pub fn new(fd: OwnedFd) -> Uffd {
        Uffd(fd)
    }

    /// Read one message. None when none is waiting (the fd is non-blocking).
    pub fn read_event(&self) -> io::Result<Option<Event>> {
        let mut raw = UffdMsgRaw::default();
        // SAFETY: `raw` is a plain-old-data buffer of exactly size_of::<UffdMsgRaw>()
        // bytes, valid for writes for the duration of the call.
        let n = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut raw as *mut UffdMsgRaw).cast(),
                size_of::<UffdMsgRaw>(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(err),
            };
        }
        if n as usize != size_of::<UffdMsgRaw>() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short userfaultfd message ({n} bytes)"),
            ));
        }
        Ok(Some(decode(&raw)))
    }

    /// UFFDIO_COPY `src` to `dst` (page-aligned, one mapping), waking the threads that
    /// wait on it.
    pub fn copy(&self, dst: u64, src: &[u8]) -> io::Result<Fill> {
        let mut arg = UffdioCopy {
            dst,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: `arg` is a valid uffdio_copy; the kernel reads `len` bytes from `src`,
        // which the borrowed slice keeps alive and readable during the call, and writes
        // only `arg.copy`.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), UFFDIO_COPY as _, &mut arg) };
        fill_result(rc, arg.copy)
    }

    /// UFFDIO_ZEROPAGE `len` bytes at `dst`.
    pub fn zero(&self, dst: u64, len: u64) -> io::Result<Fill> {
        let mut arg = UffdioZeropage {
            range: UffdioRange { start: dst, len },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `arg` is a valid uffdio_zeropage the kernel reads and whose `zeropage`
        // field it writes; no user memory of ours is touched.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), UFFDIO_ZEROPAGE as _, &mut arg) };
        fill_result(rc, arg.zeropage)
    }

    /// UFFDIO_UNREGISTER `start..start+len`. Ok(false) when the task's memory is gone.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<bool> {
        let mut arg = UffdioRange { start, len };
        // SAFETY: `arg` is a valid uffdio_range the kernel only reads.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut arg) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENOMEM) | Some(libc::ESRCH) => Ok(false),
            _ => Err(err),
        }
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

fn fill_result(rc: libc::c_int, done: i64) -> io::Result<Fill> {
    if rc == 0 {
        return Ok(Fill::Done);
    }
    let err = io::Error::last_os_error();
    let placed = done.max(0) as u64;
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(Fill::Exists { placed }),
        Some(libc::EAGAIN) => Ok(Fill::Again { placed }),
        Some(libc::ESRCH) | Some(libc::ENOSPC) => Ok(Fill::Gone),
        Some(libc::ENOENT) => Ok(Fill::Unregistered),
        _ => Err(err),
    }
}

fn decode(raw: &UffdMsgRaw) -> Event {
    let [a, b, c] = raw.arg;
    match raw.event {
        UFFD_EVENT_PAGEFAULT => Event::PageFault { address: b },
        UFFD_EVENT_FORK => {
            // The union's first member is a __u32 on a little-endian machine.
            let fd = (a & 0xffff_ffff) as u32 as RawFd;
            // SAFETY: the kernel installed this descriptor in our table for this
            // message and nothing else owns it.
            let uffd = unsafe { OwnedFd::from_raw_fd(fd) };
            Event::Fork { uffd }
        }
        UFFD_EVENT_REMAP => Event::Remap {
            from: a,
            to: b,
            len: c,
        },
        UFFD_EVENT_REMOVE => Event::Remove { start: a, end: b },
        UFFD_EVENT_UNMAP => Event::Unmap { start: a, end: b },
        other => Event::Unknown { event: other },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode_by_event() {
        let mut raw = UffdMsgRaw {
            event: UFFD_EVENT_PAGEFAULT,
            arg: [0, 0x7f00_1234, 0],
            ..UffdMsgRaw::default()
        };
        assert!(matches!(
            decode(&raw),
            Event::PageFault {
                address: 0x7f00_1234
            }
        ));
        raw.event = UFFD_EVENT_REMAP;
        raw.arg = [1, 2, 3];
        assert!(matches!(
            decode(&raw),
            Event::Remap {
                from: 1,
                to: 2,
                len: 3
            }
        ));
        raw.event = UFFD_EVENT_REMOVE;
        assert!(matches!(decode(&raw), Event::Remove { start: 1, end: 2 }));
        raw.event = UFFD_EVENT_UNMAP;
        assert!(matches!(decode(&raw), Event::Unmap { start: 1, end: 2 }));
        raw.event = 0x99;
        assert!(matches!(decode(&raw), Event::Unknown { event: 0x99 }));
    }

    #[test]
    fn fill_errors_are_classified() {
        // SAFETY: errno is thread-local; setting it models a failed ioctl.
        unsafe { *libc::__errno_location() = libc::EEXIST };
        assert_eq!(
            fill_result(-1, 8192).unwrap(),
            Fill::Exists { placed: 8192 }
        );
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = libc::ESRCH };
        assert_eq!(fill_result(-1, -3).unwrap(), Fill::Gone);
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        assert!(fill_result(-1, 0).is_err());
        assert_eq!(fill_result(0, 4096).unwrap(), Fill::Done);
    }
}
