//! The staging bound of a restore: bytes of decompressed chunks held (or being
//! decompressed) for buffers that are not handed over yet.

/// Counts staged bytes against a limit and remembers the peak.
#[derive(Debug)]
pub struct Staging {
    limit: u64,
    used: u64,
    peak: u64,
}

impl Staging {
    pub fn new(limit: u64) -> Staging {
        Staging {
            limit,
            used: 0,
            peak: 0,
        }
    }

    /// Reserve `n` bytes if they fit under the limit.
    pub fn try_reserve(&mut self, n: u64) -> bool {
        match self.used.checked_add(n) {
            Some(total) if total <= self.limit => {
                self.used = total;
                self.peak = self.peak.max(total);
                true
            }
            _ => false,
        }
    }

    /// Give back `n` reserved bytes.
    pub fn release(&mut self, n: u64) {
        debug_assert!(
            n <= self.used,
            "releasing {n} of {} staged bytes",
            self.used
        );
        self.used = self.used.saturating_sub(n);
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// The most bytes ever reserved at once.
    pub fn peak(&self) -> u64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_exceeds_the_limit() {
        let mut s = Staging::new(10);
        assert!(s.try_reserve(6));
        assert!(!s.try_reserve(5));
        assert!(s.try_reserve(4));
        assert!(!s.try_reserve(1));
        s.release(6);
        assert_eq!(s.used(), 4);
        assert!(s.try_reserve(6));
        assert_eq!(s.peak(), 10);
        assert!(!Staging::new(0).try_reserve(1));
        assert!(!s.try_reserve(u64::MAX));
    }
}
