//! The background stream's hold while a restored tree starts.
//!
//! A tree that has just resumed faults in what it needs first (its stack, its heap, the
//! hot set of its first request) and reads its programs' pages from disk. With a cold
//! page cache both go to the same disk as the background stream's large reads, and a
//! fault's block, or the tree's own read, waits behind them: at 4 GiB the first answer
//! of a server came 500-1000 ms after the restore started instead of 250 ms
//! (docs/benchmarks.md, "Time to ready"). So for a while after CRIU says every task is
//! restored the stream starts a block only once the tree has made no fault for
//! `quiet`; after `window` it no longer waits (a tree that never stops faulting still
//! gets its memory streamed), and a fill a step asked for (`TaskMemory::fill_task`)
//! never waits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::error::LazyError;

/// The variable that sets `quiet` in milliseconds (0: no hold).
pub const ENV_QUIET_MS: &str = "GPUCR_LAZY_QUIET_MS";
/// How long the tree must have made no fault before the stream starts a block.
pub const DEFAULT_QUIET: Duration = Duration::from_millis(100);
/// How long after every task is restored the stream waits for quiet at most.
pub const WINDOW: Duration = Duration::from_secs(1);

/// No time yet (the tree is not restored).
const NEVER: u64 = u64::MAX;

/// When the background stream may start a block ([`StartupHold::holds`]).
#[derive(Debug)]
pub struct StartupHold {
    quiet: Duration,
    window: Duration,
    epoch: Instant,
    /// Milliseconds since `epoch` when every task was restored, or `NEVER`.
    restored_ms: AtomicU64,
    /// Milliseconds since `epoch` when the last fault was served.
    last_fault_ms: AtomicU64,
    /// Fills a step waits for: the stream does not hold meanwhile.
    fills: AtomicUsize,
}

impl StartupHold {
    /// A hold of `quiet` (zero: none) for at most `window`.
    pub fn new(quiet: Duration, window: Duration) -> StartupHold {
        StartupHold {
            quiet,
            window,
            epoch: Instant::now(),
            restored_ms: AtomicU64::new(NEVER),
            last_fault_ms: AtomicU64::new(0),
            fills: AtomicUsize::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Every task is restored: the window starts, and so does the first quiet span.
    pub fn restored(&self) {
        let now = self.now_ms();
        self.last_fault_ms.store(now, Ordering::Release);
        self.restored_ms.store(now, Ordering::Release);
    }

    /// A batch of faults was served.
    pub fn fault_served(&self) {
        self.last_fault_ms.store(self.now_ms(), Ordering::Release);
    }

    /// A step waits for memory to be filled until the returned guard is dropped.
    pub fn filling(&self) -> Filling<'_> {
        self.fills.fetch_add(1, Ordering::AcqRel);
        Filling(self)
    }

    /// True while the stream should start no block: inside the window, no fill waited
    /// for, and a fault (or the restore's end) less than `quiet` ago.
    pub fn holds(&self) -> bool {
        if self.quiet.is_zero() || self.fills.load(Ordering::Acquire) > 0 {
            return false;
        }
        let restored = self.restored_ms.load(Ordering::Acquire);
        if restored == NEVER {
            return false;
        }
        let now = self.now_ms();
        let window = self.window.as_millis() as u64;
        let quiet = self.quiet.as_millis() as u64;
        now < restored.saturating_add(window)
            && now
                < self
                    .last_fault_ms
                    .load(Ordering::Acquire)
                    .saturating_add(quiet)
    }
}

/// A fill a step waits for ([`StartupHold::filling`]).
pub struct Filling<'a>(&'a StartupHold);

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.0.fills.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The quiet span [`ENV_QUIET_MS`] asks for, [`DEFAULT_QUIET`] where it is unset.
pub fn quiet_from_env() -> Result<Duration, LazyError> {
    match std::env::var(ENV_QUIET_MS) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_QUIET),
        Ok(text) => parse_quiet(&text),
        Err(std::env::VarError::NotUnicode(raw)) => Err(bad_quiet(&raw.to_string_lossy())),
    }
}

fn parse_quiet(text: &str) -> Result<Duration, LazyError> {
    match text.trim().parse::<u64>() {
        Ok(ms) if ms <= 10_000 => Ok(Duration::from_millis(ms)),
        _ => Err(bad_quiet(text)),
    }
}

fn bad_quiet(text: &str) -> LazyError {
    LazyError::Setting {
        variable: ENV_QUIET_MS,
        value: text.to_string(),
        expected: "milliseconds from 0 (no hold) to 10000",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_after_the_restore_within_the_window_and_until_quiet() {
        let hold = StartupHold::new(Duration::from_millis(200), Duration::from_secs(60));
        assert!(!hold.holds(), "nothing restored yet: no hold");
        hold.restored();
        assert!(hold.holds(), "just restored");
        {
            let _fill = hold.filling();
            assert!(!hold.holds(), "a step waits for a fill");
        }
        assert!(hold.holds());
        std::thread::sleep(Duration::from_millis(250));
        assert!(!hold.holds(), "quiet for longer than 200 ms");
        hold.fault_served();
        assert!(hold.holds(), "a fault starts the quiet span again");
    }

    #[test]
    fn the_window_ends_the_hold_even_while_the_tree_faults() {
        let hold = StartupHold::new(Duration::from_secs(60), Duration::from_millis(100));
        hold.restored();
        assert!(hold.holds());
        std::thread::sleep(Duration::from_millis(150));
        hold.fault_served();
        assert!(!hold.holds(), "past the window");
    }

    #[test]
    fn zero_quiet_never_holds() {
        let hold = StartupHold::new(Duration::ZERO, WINDOW);
        hold.restored();
        assert!(!hold.holds());
    }

    #[test]
    fn the_variable_takes_milliseconds_and_names_itself_when_wrong() {
        assert_eq!(parse_quiet("250").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_quiet("0").unwrap(), Duration::ZERO);
        for bad in ["", "1s", "-1", "10001"] {
            let e = parse_quiet(bad).unwrap_err().to_string();
            assert!(e.contains(ENV_QUIET_MS) && e.contains(bad), "{e}");
        }
    }
}
