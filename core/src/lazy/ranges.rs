//! Which addresses of one task's memory still wait for their bytes, and where in the
//! pages file each lies. Events move and drop ranges (mremap, madvise, munmap); a fork
//! copies the whole set to the child.

use std::collections::{BTreeMap, BTreeSet};

/// `start..end` of the task's memory, whose first byte is at `offset` of the pages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
}

impl Segment {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// The part `lo..hi` of it (clipped to it), with its offset moved along.
    fn part(&self, lo: u64, hi: u64) -> Segment {
        let start = lo.max(self.start);
        let end = hi.min(self.end);
        Segment {
            start,
            end: end.max(start),
            offset: self.offset + (start - self.start),
        }
    }
}

/// Segments that do not overlap, by address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    segments: BTreeMap<u64, Segment>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Add `segment`, replacing what overlapped it.
    pub fn insert(&mut self, segment: Segment) {
        if segment.is_empty() {
            return;
        }
        self.take(segment.start, segment.end);
        self.segments.insert(segment.start, segment);
    }

    /// Drop `start..end`; what was in it, in address order.
    pub fn take(&mut self, start: u64, end: u64) -> Vec<Segment> {
        let hit: Vec<Segment> = self
            .segments
            .range(..end)
            .rev()
            .take_while(|(_, s)| s.end > start)
            .map(|(_, s)| *s)
            .collect();
        let mut taken = Vec::with_capacity(hit.len());
        for s in hit.into_iter().rev() {
            self.segments.remove(&s.start);
            let left = s.part(s.start, start);
            let right = s.part(end, s.end);
            for keep in [left, right] {
                if !keep.is_empty() {
                    self.segments.insert(keep.start, keep);
                }
            }
            taken.push(s.part(start, end));
        }
        taken
    }

    /// mremap moved `from..from+len` to `to..to+len`.
    pub fn remap(&mut self, from: u64, to: u64, len: u64) {
        let moved = self.take(from, from.saturating_add(len));
        self.take(to, to.saturating_add(len));
        for s in moved {
            let start = s.start - from + to;
            self.segments.insert(
                start,
                Segment {
                    start,
                    end: start + s.len(),
                    offset: s.offset,
                },
            );
        }
    }

    /// The segment holding `addr`.
    pub fn find(&self, addr: u64) -> Option<Segment> {
        let (_, s) = self.segments.range(..=addr).next_back()?;
        (addr < s.end).then_some(*s)
    }

    /// The parts whose bytes lie in `lo..hi` of the pages file.
    pub fn in_file(&self, lo: u64, hi: u64) -> Vec<Segment> {
        self.segments
            .values()
            .filter(|s| s.offset < hi && s.offset + s.len() > lo)
            .map(|s| {
                let skip_front = lo.saturating_sub(s.offset);
                let end_off = (s.offset + s.len()).min(hi);
                Segment {
                    start: s.start + skip_front,
                    end: s.start + (end_off - s.offset),
                    offset: s.offset + skip_front,
                }
            })
            .collect()
    }

    /// The indices of the `block`-sized pieces of the pages file it still needs.
    pub fn blocks(&self, block: u64) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        for s in self.segments.values() {
            out.extend(s.offset / block..=(s.offset + s.len() - 1) / block);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Bytes still waiting.
    pub fn bytes(&self) -> u64 {
        self.segments.values().map(Segment::len).sum()
    }

    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    fn seg(start: u64, end: u64, offset: u64) -> Segment {
        Segment { start, end, offset }
    }

    fn set(segments: &[Segment]) -> RangeSet {
        let mut s = RangeSet::new();
        for x in segments {
            s.insert(*x);
        }
        s
    }

    fn all(s: &RangeSet) -> Vec<Segment> {
        s.segments().copied().collect()
    }

    #[test]
    fn taking_the_middle_keeps_both_ends_with_their_offsets() {
        let mut s = set(&[seg(10 * P, 20 * P, 0)]);
        let taken = s.take(12 * P, 15 * P);
        assert_eq!(taken, vec![seg(12 * P, 15 * P, 2 * P)]);
        assert_eq!(
            all(&s),
            vec![seg(10 * P, 12 * P, 0), seg(15 * P, 20 * P, 5 * P)]
        );
        assert_eq!(s.bytes(), 7 * P);
    }

    #[test]
    fn remove_over_several_segments_and_holes() {
        let mut s = set(&[
            seg(0, 4 * P, 0),
            seg(8 * P, 12 * P, 4 * P),
            seg(20 * P, 24 * P, 8 * P),
        ]);
        s.take(2 * P, 21 * P);
        assert_eq!(all(&s), vec![seg(0, 2 * P, 0), seg(21 * P, 24 * P, 9 * P)]);
        assert!(s.find(10 * P).is_none());
        assert_eq!(s.find(22 * P + 5), Some(seg(21 * P, 24 * P, 9 * P)));
        s.take(0, 100 * P);
        assert!(s.is_empty());
    }

    #[test]
    fn remap_moves_the_bytes_with_the_addresses_and_replaces_the_target() {
        let mut s = set(&[seg(0, 4 * P, 0), seg(100 * P, 102 * P, 40 * P)]);
        s.remap(2 * P, 101 * P, 2 * P);
        assert_eq!(
            all(&s),
            vec![
                seg(0, 2 * P, 0),
                seg(100 * P, 101 * P, 40 * P),
                seg(101 * P, 103 * P, 2 * P)
            ]
        );
    }

    #[test]
    fn a_fork_copy_is_independent() {
        let parent = set(&[seg(0, 8 * P, 0)]);
        let mut child = parent.clone();
        child.take(0, 4 * P);
        assert_eq!(parent.bytes(), 8 * P);
        assert_eq!(child.bytes(), 4 * P);
    }

    #[test]
    fn file_blocks_and_their_parts() {
        let block = 4 * P;
        let s = set(&[seg(0, 3 * P, 0), seg(10 * P, 16 * P, 3 * P)]);
        assert_eq!(
            s.blocks(block).into_iter().collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // Block 0 is file bytes 0..4P: the first segment and the first page of the second.
        assert_eq!(
            s.in_file(0, block),
            vec![seg(0, 3 * P, 0), seg(10 * P, 11 * P, 3 * P)]
        );
        assert_eq!(
            s.in_file(block, 2 * block),
            vec![seg(11 * P, 15 * P, 4 * P)]
        );
        assert_eq!(
            s.in_file(2 * block, 3 * block),
            vec![seg(15 * P, 16 * P, 8 * P)]
        );
    }
}
