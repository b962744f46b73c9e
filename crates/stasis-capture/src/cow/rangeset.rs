//! A set of byte ranges, the bookkeeping of the pages a write-protected
//! copy still owes.

use std::collections::BTreeMap;

/// A set of disjoint, non-adjacent byte ranges `[start, end)`.
#[derive(Debug, Default, Clone)]
pub struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    pub fn from_spans(spans: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut s = Self::default();
        for (a, b) in spans {
            s.insert(a, b);
        }
        s
    }

    pub fn insert(&mut self, mut a: u64, mut b: u64) {
        if a >= b {
            return;
        }
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=b)
            .rev()
            .take_while(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.0.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.0.insert(a, b);
    }

    /// The parts of `[a, b)` in the set, in order.
    pub fn intersect(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .0
            .range(..b)
            .rev()
            .take_while(|(_, &e)| e > a)
            .map(|(&s, &e)| (s.max(a), e.min(b)))
            .collect();
        out.reverse();
        out
    }

    /// Takes `[a, b)` out of the set.
    pub fn remove(&mut self, a: u64, b: u64) {
        for (s, e) in self
            .0
            .range(..b)
            .rev()
            .take_while(|(_, &e)| e > a)
            .map(|(&s, &e)| (s, e))
            .collect::<Vec<_>>()
        {
            self.0.remove(&s);
            if s < a {
                self.0.insert(s, a);
            }
            if e > b {
                self.0.insert(b, e);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;

    #[test]
    fn range_set_insert_intersect_remove() {
        let mut s = RangeSet::from_spans([(0x1000, 0x3000), (0x3000, 0x4000), (0x8000, 0x9000)]);
        assert_eq!(
            s.intersect(0, u64::MAX),
            vec![(0x1000, 0x4000), (0x8000, 0x9000)]
        );
        assert_eq!(
            s.intersect(0x2000, 0x8800),
            vec![(0x2000, 0x4000), (0x8000, 0x8800)]
        );
        assert!(s.intersect(0x4000, 0x8000).is_empty());
        s.remove(0x2000, 0x3000);
        assert_eq!(
            s.intersect(0, u64::MAX),
            vec![(0x1000, 0x2000), (0x3000, 0x4000), (0x8000, 0x9000)]
        );
        s.remove(0, 0x8800);
        assert_eq!(s.intersect(0, u64::MAX), vec![(0x8800, 0x9000)]);
        assert_eq!(s.bytes(), 0x800);
        s.remove(0x8800, 0x9000);
        assert!(s.is_empty());
    }
}
