//! A modelled copy engine: each simulated GPU moves bytes at a fixed rate
//! (`GPUCR_SIM_COPY_BW`, e.g. 1.6 GB/s, the SDMA rate AMD reported), one transfer after
//! another, so what the simulator measures is what a real device would allow.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::transfer::{BufferSink, BufferSource, FileRange};

/// One GPU's copy engine: transfers are serialised at `bytes_per_sec`.
#[derive(Debug)]
pub struct CopyEngine {
    bytes_per_sec: f64,
    busy_until: Mutex<Instant>,
}

impl CopyEngine {
    pub fn new(bytes_per_sec: f64) -> CopyEngine {
        CopyEngine {
            bytes_per_sec,
            busy_until: Mutex::new(Instant::now()),
        }
    }

    /// Reserve the engine for `bytes` and wait until that transfer would be done.
    pub fn transfer(&self, bytes: usize) {
        let duration = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        let done = {
            let mut busy = self.busy_until.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*busy).max(Instant::now());
            *busy = start + duration;
            *busy
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
    }
}

/// A buffer file accessed through a (possibly throttled) copy engine.
#[derive(Debug)]
pub struct EngineBuffer {
    range: FileRange,
    engine: Option<Arc<CopyEngine>>,
}

impl EngineBuffer {
    pub fn new(range: FileRange, engine: Option<Arc<CopyEngine>>) -> EngineBuffer {
        EngineBuffer { range, engine }
    }

    fn pace(&self, bytes: usize) {
        if let Some(engine) = &self.engine {
            engine.transfer(bytes);
        }
    }
}

impl BufferSource for EngineBuffer {
    fn len(&self) -> u64 {
        BufferSource::len(&self.range)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.pace(buf.len());
        BufferSource::read_at(&self.range, offset, buf)
    }
}

impl BufferSink for EngineBuffer {
    fn len(&self) -> u64 {
        BufferSink::len(&self.range)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.pace(data.len());
        BufferSink::write_at(&self.range, offset, data)
    }
    fn starts_zeroed(&self) -> bool {
        self.range.starts_zeroed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_paced_and_serialised() {
        let engine = Arc::new(CopyEngine::new(100e6)); // 100 MB/s
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let e = engine.clone();
                s.spawn(move || e.transfer(2_000_000)); // 20 ms each
            }
        });
        // Two 20 ms transfers on one engine take at least 40 ms in all.
        assert!(
            start.elapsed() >= Duration::from_millis(39),
            "{:?}",
            start.elapsed()
        );
    }
}
