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
//! never waits. When the image's pages are in the page cache there is no disk to share,
//! and no hold ([`quiet_for`]).

use std::path::Path;
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

    /// Whether a step waits for a fill now.
    pub fn filling_now(&self) -> bool {
        self.fills.load(Ordering::Acquire) > 0
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

/// The quiet span for a restore of the image in `dir`: what [`ENV_QUIET_MS`] asks for;
/// where it is unset, none when the image's memory pages are in the page cache (the
/// stream then reads nothing from the disk, and holding it back would only delay the
/// rest of the memory), else [`DEFAULT_QUIET`].
pub fn quiet_for(dir: &Path) -> Result<Duration, LazyError> {
    match std::env::var(ENV_QUIET_MS) {
        Err(std::env::VarError::NotPresent) if pages_cached(dir) => Ok(Duration::ZERO),
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_QUIET),
        Ok(text) => parse_quiet(&text),
        Err(std::env::VarError::NotUnicode(raw)) => Err(bad_quiet(&raw.to_string_lossy())),
    }
}

/// Samples of each pages file looked at by [`pages_cached`].
const SAMPLES_PER_FILE: u64 = 16;

/// Whether the memory pages files of the image in `dir` are in the page cache: a page
/// at each of [`SAMPLES_PER_FILE`] places spread over each file read without waiting
/// for the disk (`RWF_NOWAIT`), and at least 9 in 10 of them there.
pub fn pages_cached(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let (mut looked, mut cached) = (0u64, 0u64);
    let mut page = [0u8; 4096];
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("pages-") || !name.ends_with(".img") {
            continue;
        }
        let Ok(file) = std::fs::File::open(entry.path()) else {
            continue;
        };
        let size = file.metadata().map_or(0, |m| m.len());
        let pages = size / page.len() as u64;
        if pages == 0 {
            continue;
        }
        for i in 0..SAMPLES_PER_FILE.min(pages) {
            let offset = (pages * i / SAMPLES_PER_FILE.min(pages)) * page.len() as u64;
            looked += 1;
            if read_cached(&file, &mut page, offset) {
                cached += 1;
            }
        }
    }
    looked > 0 && cached * 10 >= looked * 9
}

/// Read `buf` at `offset` of `file` only from the page cache: true when it all was.
fn read_cached(file: &std::fs::File, buf: &mut [u8], offset: u64) -> bool {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the iovec points at `buf`, which lives and is not otherwise borrowed for
    // the call; the descriptor is `file`'s, open for the call's length.
    let n = unsafe {
        libc::preadv2(
            std::os::fd::AsRawFd::as_raw_fd(file),
            &iov,
            1,
            offset as libc::off_t,
            libc::RWF_NOWAIT,
        )
    };
    n == buf.len() as isize
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
    fn pages_just_written_are_cached_and_dropped_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!pages_cached(dir.path()), "no pages files: nothing to say");
        let path = dir.path().join("pages-1.img");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        assert!(pages_cached(dir.path()), "just written");
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        // The kernel may keep a page that another CPU's LRU batch still holds through
        // one DONTNEED; asking again after a moment drops it.
        let dropped = (0..20).any(|_| {
            nix::fcntl::posix_fadvise(
                &file,
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .unwrap();
            let gone = !pages_cached(dir.path());
            if !gone {
                std::thread::sleep(Duration::from_millis(25));
            }
            gone
        });
        assert!(dropped, "dropped from the page cache");
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
