//! A small fixed-capacity bit set for the mapping search (sets of GPU or CPU indices).

/// A set of indices below the capacity it was made with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    /// An empty set able to hold `0..capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        BitSet {
            words: vec![0; capacity.div_ceil(64)],
        }
    }

    pub(crate) fn insert(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    pub(crate) fn remove(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
    }

    pub(crate) fn contains(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(crate) fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// Keeps only the members of `other`.
    pub(crate) fn intersect(&mut self, other: &BitSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= *b;
        }
    }

    /// Removes the members of `other`.
    pub(crate) fn subtract(&mut self, other: &BitSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !*b;
        }
    }

    /// Adds the members of `other`.
    pub(crate) fn union(&mut self, other: &BitSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= *b;
        }
    }

    /// The members, in increasing order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(w * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let mut a = BitSet::new(130);
        for i in [0, 63, 64, 129] {
            a.insert(i);
        }
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 63, 64, 129]);
        assert_eq!(a.len(), 4);
        assert!(a.contains(129) && !a.contains(128) && !a.contains(500));
        let mut b = BitSet::new(130);
        for i in 0..65 {
            b.insert(i);
        }
        b.intersect(&a);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![0, 63, 64]);
        a.subtract(&b);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![129]);
        a.union(&b);
        assert_eq!(a.len(), 4);
        a.remove(0);
        assert!(!a.contains(0));
        assert!(BitSet::new(10).is_empty());
    }
}
