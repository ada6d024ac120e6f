//! A modelled copy engine: each simulated GPU moves bytes at a fixed rate
//! (`GPUCR_SIM_COPY_BW`, e.g. 1.6 GB/s, the SDMA rate AMD reported), one transfer after
//! another, so what the simulator measures is what a real device would allow.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cancel::{Cancel, Cancelled};
use crate::transfer::{BufferSink, BufferSource, FileRange};

/// How far a transfer may start before the engine's clock: the time a sleeping thread
/// may wake up late. Late wake-ups do not slow the engine below its rate; an idle engine
/// does not save up more than this for a burst.
const WAKEUP_LATENESS: Duration = Duration::from_millis(1);

/// One GPU's copy engine: one transfer at a time, each taking at least its bytes at
/// `bytes_per_sec`. The simulator's own copy of the bytes happens inside that time, the
/// way a DMA engine moves them while its transfer is in flight; a copy slower than the
/// modelled rate makes the transfer last as long as the copy.
#[derive(Debug)]
pub struct CopyEngine {
    bytes_per_sec: f64,
    /// When the last transfer ends on the engine's clock; held during each transfer.
    last_end: Mutex<Instant>,
}

impl CopyEngine {
    pub fn new(bytes_per_sec: f64) -> CopyEngine {
        CopyEngine {
            bytes_per_sec,
            last_end: Mutex::new(Instant::now()),
        }
    }

    /// Move `bytes` with `copy`: wait for the engine, run `copy`, and hold the engine
    /// until the modelled transfer time has passed. Given up at `cancel`: nothing is
    /// copied once it is cancelled (also while the engine was busy with another
    /// transfer), and the modelled time ends at the cancellation (Err then, though the
    /// bytes moved: the engine stays busy for their time).
    pub fn transfer<T>(
        &self,
        bytes: usize,
        cancel: &Cancel,
        copy: impl FnOnce() -> T,
    ) -> Result<T, Cancelled> {
        cancel.check()?;
        let mut last_end = self.last_end.lock().unwrap_or_else(|e| e.into_inner());
        cancel.check()?;
        let duration = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        let end = transfer_end(*last_end, Instant::now(), duration);
        let result = copy();
        let copied = Instant::now();
        *last_end = end.max(copied);
        if end > copied {
            cancel.sleep(end - copied)?;
        }
        Ok(result)
    }
}

/// When a transfer of `duration` asked for at `now` ends on an engine whose last
/// transfer ended at `last_end`: back to back with that one if its end was missed only
/// by a late wake-up, else from now.
fn transfer_end(last_end: Instant, now: Instant, duration: Duration) -> Instant {
    let start = last_end.max(now.checked_sub(WAKEUP_LATENESS).unwrap_or(now));
    start + duration
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

    fn through_engine(
        &self,
        bytes: usize,
        cancel: &Cancel,
        copy: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        match &self.engine {
            Some(engine) => engine.transfer(bytes, cancel, copy)?,
            None => copy(),
        }
    }
}

impl BufferSource for EngineBuffer {
    fn len(&self) -> u64 {
        BufferSource::len(&self.range)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8], cancel: &Cancel) -> io::Result<()> {
        self.through_engine(buf.len(), cancel, || {
            BufferSource::read_at(&self.range, offset, buf, cancel)
        })
    }
}

impl BufferSink for EngineBuffer {
    fn len(&self) -> u64 {
        BufferSink::len(&self.range)
    }
    fn write_at(&self, offset: u64, data: &[u8], cancel: &Cancel) -> io::Result<()> {
        self.through_engine(data.len(), cancel, || {
            BufferSink::write_at(&self.range, offset, data, cancel)
        })
    }
    fn starts_zeroed(&self) -> bool {
        self.range.starts_zeroed()
    }
    fn queue(&self) -> u32 {
        BufferSink::queue(&self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_wake_ups_do_not_slow_the_engine_and_idle_time_is_not_banked() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The previous transfer ended at t0; the thread woke up 0.5 ms late.
        let late = t0 + Duration::from_micros(500);
        assert_eq!(transfer_end(t0, late, ms(2)), t0 + ms(2));
        // Busy engine: the transfer queues behind the previous one.
        assert_eq!(transfer_end(t0 + ms(3), t0, ms(2)), t0 + ms(5));
        // Idle for 10 ms: at most 1 ms is made up.
        assert_eq!(transfer_end(t0, t0 + ms(10), ms(2)), t0 + ms(11));
    }

    #[test]
    fn transfers_are_paced_and_serialised() {
        let engine = Arc::new(CopyEngine::new(100e6)); // 100 MB/s
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let e = engine.clone();
                s.spawn(move || e.transfer(2_000_000, &Cancel::new(), || ())); // 20 ms each
            }
        });
        // Two 20 ms transfers on one engine take at least 40 ms in all.
        assert!(
            start.elapsed() >= Duration::from_millis(39),
            "{:?}",
            start.elapsed()
        );
    }

    /// A transfer's modelled time ends at its cancellation, and a transfer whose token
    /// is cancelled copies nothing.
    #[test]
    fn a_cancelled_transfer_ends_early_and_copies_nothing() {
        let engine = Arc::new(CopyEngine::new(1e6)); // 1 MB/s: 10 MB take 10 s
        let cancel = Cancel::new();
        let c = cancel.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            c.cancel("the request timed out");
        });
        let start = Instant::now();
        let copied = engine.transfer(10_000_000, &cancel, || 7);
        canceller.join().unwrap();
        assert_eq!(copied, Err(Cancelled("the request timed out".into())));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let mut ran = false;
        assert!(engine.transfer(1, &cancel, || ran = true).is_err());
        assert!(!ran, "a cancelled transfer copied");
    }
}
