//! Custom storage (CUDA 13.4): the driver maps a process's device memory into gpucr's
//! helper, which copies it itself through the transfer engine, and the operation is
//! completed only once the copy is in the image (the driver has no way to abandon one,
//! and completing a checkpoint drops the GPU memory).
//!
//! A region of an operation is a copy source on dump ([`RegionSource`]) and a copy sink
//! on restore ([`RegionSink`]); every copy runs with a context of the helper's current
//! in the copying thread, as the driver requires.

use std::io;
use std::sync::Arc;

use gpucr_cuda_driver::{Context, DeviceRegion, Driver};

use crate::cancel::Cancel;
use crate::transfer::{BufferSink, BufferSource};

/// Which way a dump moves a CUDA process's device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Staging {
    /// The driver moves it into the process's own memory, which CRIU dumps.
    #[default]
    Host,
    /// The driver maps it into gpucr's helper, which copies it into `gpu/`.
    Custom,
}

impl Staging {
    /// "host" or "custom", as the manifest and `--cuda-staging` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Staging::Host => "host",
            Staging::Custom => "custom",
        }
    }

    /// From its name.
    pub fn parse(text: &str) -> Option<Staging> {
        match text {
            "host" => Some(Staging::Host),
            "custom" => Some(Staging::Custom),
            _ => None,
        }
    }
}

/// The driver and the context the helper copies with.
#[derive(Debug, Clone)]
pub struct Copier {
    pub driver: Arc<Driver>,
    pub context: Context,
}

impl Copier {
    fn current(&self) -> io::Result<()> {
        self.driver
            .ctx_set_current(self.context)
            .map_err(io::Error::other)
    }

    fn check(region: &DeviceRegion, offset: u64, n: usize) -> io::Result<usize> {
        match offset.checked_add(n as u64) {
            Some(end) if end <= region.size as u64 => Ok(offset as usize),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {offset}..+{n} are outside the GPU region ({} bytes)",
                    region.size
                ),
            )),
        }
    }

    /// Copy region bytes at `offset` into `buf`.
    pub fn read(&self, region: &DeviceRegion, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = Self::check(region, offset, buf.len())?;
        self.current()?;
        self.driver
            .memcpy_dtoh(buf, region.dev_ptr.offset(at))
            .map_err(io::Error::other)
    }

    /// Copy `data` into the region at `offset`.
    pub fn write(&self, region: &DeviceRegion, offset: u64, data: &[u8]) -> io::Result<()> {
        let at = Self::check(region, offset, data.len())?;
        self.current()?;
        self.driver
            .memcpy_htod(region.dev_ptr.offset(at), data)
            .map_err(io::Error::other)
    }
}

/// One GPU region of a custom-storage checkpoint, read into the image.
#[derive(Debug)]
pub struct RegionSource {
    pub copier: Copier,
    pub region: DeviceRegion,
}

impl BufferSource for RegionSource {
    fn len(&self) -> u64 {
        self.region.size as u64
    }

    /// A driver copy cannot be interrupted: the token is looked at before it.
    fn read_at(&self, offset: u64, buf: &mut [u8], cancel: &Cancel) -> io::Result<()> {
        cancel.check()?;
        self.copier.read(&self.region, offset, buf)
    }
}

/// One GPU region of a custom-storage restore, filled from the image. The driver
/// recreates the memory empty, so the image's all-zero chunks are skipped.
#[derive(Debug)]
pub struct RegionSink {
    pub copier: Copier,
    pub region: DeviceRegion,
    /// The copy queue: the region's GPU, in the task's order.
    pub queue: u32,
}

impl BufferSink for RegionSink {
    fn len(&self) -> u64 {
        self.region.size as u64
    }

    /// A driver copy cannot be interrupted: the token is looked at before it.
    fn write_at(&self, offset: u64, data: &[u8], cancel: &Cancel) -> io::Result<()> {
        cancel.check()?;
        self.copier.write(&self.region, offset, data)
    }

    fn starts_zeroed(&self) -> bool {
        true
    }

    fn queue(&self) -> u32 {
        self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_round_trip() {
        for s in [Staging::Host, Staging::Custom] {
            assert_eq!(Staging::parse(s.name()), Some(s));
        }
        assert_eq!(Staging::parse("device"), None);
    }
}
