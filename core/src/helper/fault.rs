//! The helper's side of fault injection (`GPUCR_FAULT`, `gpucr_abi::fault`): a step
//! that fails after its own work, and copy sources and sinks that fail on their first
//! byte, so every failure path of a dump and a restore can be driven from a test.

use std::io;

pub use gpucr_abi::fault::FaultStep;

use super::HelperError;
use crate::cancel::Cancel;
use crate::transfer::{BufferSink, BufferSource};

/// Fail when `GPUCR_FAULT` names `step`.
pub fn check(step: FaultStep) -> Result<(), HelperError> {
    if step.injected() {
        return Err(HelperError::Device(step.message()));
    }
    Ok(())
}

/// `source`, or one whose every read fails when `GPUCR_FAULT=copy`.
pub fn source(source: Box<dyn BufferSource>) -> Box<dyn BufferSource> {
    if FaultStep::Copy.injected() {
        Box::new(Failing(source))
    } else {
        source
    }
}

/// `sink`, or one whose every write fails when `GPUCR_FAULT=fill`.
pub fn sink(sink: Box<dyn BufferSink>) -> Box<dyn BufferSink> {
    if FaultStep::Fill.injected() {
        Box::new(Failing(sink))
    } else {
        sink
    }
}

struct Failing<T: ?Sized>(Box<T>);

fn injected(step: FaultStep) -> io::Error {
    io::Error::other(step.message())
}

impl BufferSource for Failing<dyn BufferSource> {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn read_at(&self, _offset: u64, _buf: &mut [u8], _cancel: &Cancel) -> io::Result<()> {
        Err(injected(FaultStep::Copy))
    }
}

impl BufferSink for Failing<dyn BufferSink> {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn write_at(&self, _offset: u64, _data: &[u8], _cancel: &Cancel) -> io::Result<()> {
        Err(injected(FaultStep::Fill))
    }

    fn starts_zeroed(&self) -> bool {
        self.0.starts_zeroed()
    }

    fn queue(&self) -> u32 {
        self.0.queue()
    }
}
