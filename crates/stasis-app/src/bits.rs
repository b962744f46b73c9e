//! A fixed-size bit set of pages (allocated once, never in a signal handler).

/// One bit per page.
#[derive(Debug, Clone, Default)]
pub struct Bits {
    words: Vec<u64>,
    len: usize,
}

impl Bits {
    /// `len` bits, all clear.
    pub fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bit `i` (false outside the set).
    pub fn get(&self, i: usize) -> bool {
        i < self.len && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Sets or clears bits `[start, end)` (clipped to the set).
    pub fn set_range(&mut self, start: usize, end: usize, v: bool) {
        for i in start..end.min(self.len) {
            if v {
                self.words[i / 64] |= 1 << (i % 64);
            } else {
                self.words[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    /// Sets or clears every bit.
    pub fn fill(&mut self, v: bool) {
        let len = self.len;
        self.words.iter_mut().for_each(|w| *w = 0);
        if v {
            self.set_range(0, len, true);
        }
    }

    /// Number of bits set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The runs of set bits, as `[start, end)` ranges in order.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.len {
            if self.words[i / 64] == 0 && i % 64 == 0 {
                i += 64;
                continue;
            }
            if self.get(i) {
                let s = i;
                while i < self.len && self.get(i) {
                    i += 1;
                }
                out.push((s, i));
            } else {
                i += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    #[test]
    fn runs_and_ranges() {
        let mut b = Bits::new(200);
        b.set_range(3, 5, true);
        b.set_range(64, 130, true);
        b.set_range(199, 300, true);
        assert_eq!(b.runs(), vec![(3, 5), (64, 130), (199, 200)]);
        assert_eq!(b.count(), 2 + 66 + 1);
        b.set_range(100, 110, false);
        assert_eq!(b.runs(), vec![(3, 5), (64, 100), (110, 130), (199, 200)]);
        b.fill(true);
        assert_eq!(b.runs(), vec![(0, 200)]);
        b.fill(false);
        assert!(b.runs().is_empty() && !b.get(5) && !b.get(1000));
    }
}
