//! THE range set of Stasis: sorted, disjoint `[start, end)` address ranges.
//!
//! Two forms, one definition each: [`Ranges`], a sorted vector for the set
//! operations of a dump or a chain ([`subtract`], [`intersect`],
//! [`normalize`], [`merge`]), and [`RangeSet`], a map for a set changed in
//! place while it is read (inserting and removing ranges one by one).
//! [`lengths`] and [`spans`] convert to and from the `(address, length)`
//! form a memory copy takes.

use std::collections::BTreeMap;

/// A sorted list of disjoint, page-aligned `[start, end)` ranges.
pub type Ranges = Vec<(u64, u64)>;

/// Sorts and merges arbitrary ranges into a [`Ranges`] list.
pub fn normalize(mut r: Vec<(u64, u64)>) -> Ranges {
    r.retain(|x| x.0 < x.1);
    r.sort_unstable();
    merge(r)
}

/// Merges overlapping and adjacent ranges from an address-ordered
/// iterator (empty ranges are dropped).
pub fn merge(it: impl IntoIterator<Item = (u64, u64)>) -> Ranges {
    let mut out: Ranges = Vec::new();
    for (s, e) in it {
        if s >= e {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Total bytes of `r`.
pub fn ranges_bytes(r: &[(u64, u64)]) -> u64 {
    r.iter().map(|x| x.1 - x.0).sum()
}

/// `[start, end)` ranges as `(address, length)` ranges.
pub fn lengths(spans: &[(u64, u64)]) -> Vec<(u64, usize)> {
    spans
        .iter()
        .map(|&(a, e)| (a, usize::try_from(e - a).unwrap_or(0)))
        .collect()
}

/// `(address, length)` ranges as sorted, merged `[start, end)` spans.
pub fn spans(ranges: &[(u64, usize)]) -> Ranges {
    normalize(ranges.iter().map(|&(a, n)| (a, a + n as u64)).collect())
}

/// `a` minus `b` (both sorted and disjoint).
pub fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while s < e {
            match b.get(k) {
                Some(&(bs, be)) if bs < e => {
                    if bs > s {
                        out.push((s, bs));
                    }
                    s = s.max(be);
                    k += 1;
                }
                _ => {
                    out.push((s, e));
                    break;
                }
            }
        }
    }
    out
}

/// `a` intersected with `b` (both sorted and disjoint).
pub fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let s = a[i].0.max(b[j].0);
        let e = a[i].1.min(b[j].1);
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// A set of disjoint, non-adjacent byte ranges `[start, end)`, changed in
/// place.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    pub fn from_spans(spans: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut s = Self::default();
        for (a, b) in spans {
            s.insert(a, b);
        }
        s
    }

    /// Adds `[a, b)` (merged with what it overlaps or touches).
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
    pub fn intersect(&self, a: u64, b: u64) -> Ranges {
        let mut out: Ranges = self
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

    /// Total bytes in the set.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// The set as a [`Ranges`] list.
    pub fn to_ranges(&self) -> Ranges {
        self.0.iter().map(|(&s, &e)| (s, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = crate::PAGE_SIZE;

    #[test]
    fn subtract_and_intersect() {
        let a = vec![(0, 10 * P), (20 * P, 30 * P)];
        let b = vec![(2 * P, 3 * P), (9 * P, 21 * P), (29 * P, 40 * P)];
        assert_eq!(
            subtract(&a, &b),
            vec![(0, 2 * P), (3 * P, 9 * P), (21 * P, 29 * P)]
        );
        assert_eq!(
            intersect(&a, &b),
            vec![
                (2 * P, 3 * P),
                (9 * P, 10 * P),
                (20 * P, 21 * P),
                (29 * P, 30 * P)
            ]
        );
        assert_eq!(subtract(&a, &[]), a);
        assert!(subtract(&a, &a).is_empty());
        assert!(intersect(&a, &[]).is_empty());
    }

    #[test]
    fn normalize_merges() {
        assert_eq!(
            normalize(vec![
                (5 * P, 6 * P),
                (0, 2 * P),
                (P, 3 * P),
                (3 * P, 4 * P),
                (7 * P, 7 * P)
            ]),
            vec![(0, 4 * P), (5 * P, 6 * P)]
        );
    }

    #[test]
    fn merge_joins_adjacent_and_overlapping() {
        assert_eq!(
            merge([
                (0, P),
                (P, 2 * P),
                (3 * P, 3 * P),
                (4 * P, 6 * P),
                (5 * P, 7 * P)
            ]),
            vec![(0, 2 * P), (4 * P, 7 * P)]
        );
    }

    #[test]
    fn lengths_and_spans_round_trip() {
        let r = vec![(P, 3 * P), (8 * P, 9 * P)];
        assert_eq!(lengths(&r), vec![(P, 8192), (8 * P, 4096)]);
        assert_eq!(spans(&lengths(&r)), r);
    }

    #[test]
    fn range_set_insert_intersect_remove() {
        let mut s = RangeSet::from_spans([(0x1000, 0x3000), (0x3000, 0x4000), (0x8000, 0x9000)]);
        assert_eq!(s.to_ranges(), vec![(0x1000, 0x4000), (0x8000, 0x9000)]);
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
