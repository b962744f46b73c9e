//! Which pages of one address space still have to come from the image.
//!
//! A [`Space`] is the bookkeeping of one userfaultfd: the *pending* ranges
//! (missing in the process, their content is the image's at `img`), and the
//! ranges *in flight* (taken by a copier, `UFFDIO_COPY` not yet returned).
//! Everything else registered with the userfaultfd is zero: holes of the
//! image, memory the process dropped (`MADV_DONTNEED`, `munmap`), or memory
//! it grew since.
//!
//! The process changes its layout while pages stream in, and the kernel
//! reports each change before it lets a copy race with it (a pending event
//! makes `UFFDIO_COPY` fail with `EAGAIN`):
//! - `REMOVE`/`UNMAP` `[s, e)`: those pages are zero from now on;
//! - `REMAP from -> to`: the pages moved, and so does what is owed them;
//! - `FORK`: the child lacks what the parent lacked, so its space starts as
//!   the parent's pending plus in-flight pages (a page that did arrive in
//!   both is refused with `EEXIST`, which is harmless; a page owed and never
//!   sent would be a zero page, which is not).
//!
//! So a page is only ever removed from the pending set by a copy that
//! succeeded or by the process dropping it.

use std::collections::{BTreeMap, HashMap};

/// A pending or in-flight piece: `[start, end)` in the process, whose
/// content is the image's at `img..img + (end - start)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    pub img: u64,
}

impl Piece {
    fn len(&self) -> u64 {
        self.end - self.start
    }
    /// The part of the piece inside `[s, e)`.
    fn clip(&self, s: u64, e: u64) -> Option<Piece> {
        let a = self.start.max(s);
        let b = self.end.min(e);
        (a < b).then(|| Piece {
            start: a,
            end: b,
            img: self.img + (a - self.start),
        })
    }
    /// The parts of the piece outside `[s, e)`.
    fn minus(&self, s: u64, e: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        if let Some(p) = self.clip(self.start, s.min(self.end)) {
            out.push(p);
        }
        if let Some(p) = self.clip(e.max(self.start), self.end) {
            out.push(p);
        }
        out
    }
}

/// What the page at an address is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owed {
    /// Image content, pending: the pending piece containing it.
    Image(Piece),
    /// Being copied right now; the copy wakes whoever waits on it.
    InFlight,
    /// Nothing from the image: a zero page.
    Zero,
}

/// The pages of one address space still owed from the image.
#[derive(Debug, Clone, Default)]
pub struct Space {
    /// start -> piece, disjoint.
    pending: BTreeMap<u64, Piece>,
    /// flight id -> the pieces it carries (several after a partial remap).
    inflight: HashMap<u64, Vec<Piece>>,
    next_id: u64,
    /// Some piece was moved by a remap (else every piece is at its image
    /// address).
    moved: bool,
}

impl Space {
    /// A space owed `ranges` (`[start, end)`, image address = address).
    pub fn new(ranges: &[(u64, u64)]) -> Space {
        let mut s = Space::default();
        for &(a, b) in ranges.iter().filter(|(a, b)| a < b) {
            s.insert(Piece {
                start: a,
                end: b,
                img: a,
            });
        }
        s
    }

    fn insert(&mut self, p: Piece) {
        if p.start < p.end {
            self.pending.insert(p.start, p);
        }
    }

    /// Bytes still pending (not counting those in flight).
    pub fn pending_bytes(&self) -> u64 {
        self.pending.values().map(Piece::len).sum()
    }

    /// Whether some piece is still pending (not counting those in flight).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// True when nothing is owed any more.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && self.inflight.is_empty()
    }

    /// What the page at `addr` is owed.
    pub fn owed(&self, addr: u64) -> Owed {
        if let Some((_, p)) = self.pending.range(..=addr).next_back() {
            if addr < p.end {
                return Owed::Image(*p);
            }
        }
        if self
            .inflight
            .values()
            .flatten()
            .any(|p| p.start <= addr && addr < p.end)
        {
            return Owed::InFlight;
        }
        Owed::Zero
    }

    /// The lowest pending piece.
    pub fn first_pending(&self) -> Option<Piece> {
        self.pending.values().next().copied()
    }

    /// The pending piece holding image address `img`, if any (the process
    /// address of that page is `piece.start + (img - piece.img)`).
    pub fn pending_for_img(&self, img: u64) -> Option<Piece> {
        if let Owed::Image(p) = self.owed(img) {
            if p.img <= img && img < p.img + p.len() {
                return Some(p);
            }
        }
        if !self.moved {
            // Every piece is at its image address: the lookup was exact.
            return None;
        }
        self.pending
            .values()
            .find(|p| p.img <= img && img < p.img + p.len())
            .copied()
    }

    /// Takes `[start, end)` (which must lie inside one pending piece) out
    /// of the pending set and puts it in flight. Returns the flight id and
    /// the piece, or `None` if it is not (all) pending any more.
    pub fn claim(&mut self, start: u64, end: u64) -> Option<(u64, Piece)> {
        let (&k, &p) = self.pending.range(..=start).next_back()?;
        if start >= p.end || end > p.end || start >= end {
            return None;
        }
        self.pending.remove(&k);
        for rest in p.minus(start, end) {
            self.insert(rest);
        }
        let piece = p.clip(start, end)?;
        let id = self.next_id;
        self.next_id += 1;
        self.inflight.insert(id, vec![piece]);
        Some((id, piece))
    }

    /// What flight `id` still has to copy: its piece, less what the
    /// process dropped since, at wherever it moved it.
    pub fn in_flight(&self, id: u64) -> Vec<Piece> {
        self.inflight.get(&id).cloned().unwrap_or_default()
    }

    /// The copy of flight `id` is done (or abandoned for good).
    pub fn landed(&mut self, id: u64) {
        self.inflight.remove(&id);
    }

    /// The copy of flight `id` failed before the kernel mapped `done`
    /// bytes of it: what it did not map is pending again, wherever the
    /// process moved it meanwhile.
    pub fn failed(&mut self, id: u64, done: u64) {
        let Some(pieces) = self.inflight.remove(&id) else {
            return;
        };
        let mut skip = done;
        for p in pieces {
            let n = skip.min(p.len());
            skip -= n;
            if n < p.len() {
                self.insert(Piece {
                    start: p.start + n,
                    end: p.end,
                    img: p.img + n,
                });
            }
        }
    }

    /// The process dropped `[s, e)` (`MADV_DONTNEED`, `munmap`): zero from
    /// now on.
    pub fn remove(&mut self, s: u64, e: u64) {
        let hit: Vec<u64> = self
            .pending
            .range(..e)
            .filter(|(_, p)| p.end > s)
            .map(|(k, _)| *k)
            .collect();
        for k in hit {
            if let Some(p) = self.pending.remove(&k) {
                for rest in p.minus(s, e) {
                    self.insert(rest);
                }
            }
        }
        for pieces in self.inflight.values_mut() {
            *pieces = pieces.iter().flat_map(|p| p.minus(s, e)).collect();
        }
    }

    /// The process moved `[from, from + len)` to `to` (`mremap`).
    pub fn remap(&mut self, from: u64, to: u64, len: u64) {
        self.moved = true;
        let end = from.saturating_add(len);
        let moved = |p: Piece| Piece {
            start: p.start - from + to,
            end: p.end - from + to,
            img: p.img,
        };
        let hit: Vec<u64> = self
            .pending
            .range(..end)
            .filter(|(_, p)| p.end > from)
            .map(|(k, _)| *k)
            .collect();
        let mut add = Vec::new();
        for k in hit {
            if let Some(p) = self.pending.remove(&k) {
                add.extend(p.minus(from, end));
                if let Some(inside) = p.clip(from, end) {
                    add.push(moved(inside));
                }
            }
        }
        // Whatever was at the destination is gone (mremap unmaps it first).
        self.remove(to, to.saturating_add(len));
        for p in add {
            self.insert(p);
        }
        for pieces in self.inflight.values_mut() {
            *pieces = pieces
                .iter()
                .flat_map(|p| {
                    let mut v = p.minus(from, end);
                    v.extend(p.clip(from, end).map(moved));
                    v
                })
                .collect();
        }
    }

    /// The space of a child forked now: owed what is pending or in flight.
    pub fn forked(&self) -> Space {
        let mut s = Space {
            moved: self.moved,
            ..Space::default()
        };
        for p in self
            .pending
            .values()
            .chain(self.inflight.values().flatten())
        {
            s.insert(*p);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    fn pend(s: &Space) -> Vec<(u64, u64, u64)> {
        s.pending
            .values()
            .map(|p| (p.start / P, p.end / P, p.img / P))
            .collect()
    }

    #[test]
    fn claim_splits_and_failure_requeues_the_rest() {
        let mut s = Space::new(&[(10 * P, 20 * P)]);
        let (id, p) = s.claim(12 * P, 15 * P).unwrap();
        assert_eq!((p.start, p.end, p.img), (12 * P, 15 * P, 12 * P));
        assert_eq!(pend(&s), vec![(10, 12, 10), (15, 20, 15)]);
        assert_eq!(s.owed(13 * P), Owed::InFlight);
        assert_eq!(s.owed(25 * P), Owed::Zero);
        assert!(s.claim(11 * P, 13 * P).is_none(), "crosses into the flight");
        s.failed(id, P);
        assert_eq!(pend(&s), vec![(10, 12, 10), (13, 15, 13), (15, 20, 15)]);
        assert_eq!(s.owed(12 * P), Owed::Zero, "the page that landed");
        let (id2, _) = s.claim(10 * P, 12 * P).unwrap();
        s.landed(id2);
        assert_eq!(s.owed(10 * P), Owed::Zero);
        assert_eq!(s.pending_bytes(), 7 * P);
    }

    #[test]
    fn remove_makes_pages_zero_including_in_flight_ones() {
        let mut s = Space::new(&[(0, 10 * P)]);
        let (id, _) = s.claim(0, 4 * P).unwrap();
        s.remove(2 * P, 6 * P);
        assert_eq!(pend(&s), vec![(6, 10, 6)]);
        // The copy fails: only what was not removed comes back.
        s.failed(id, 0);
        assert_eq!(pend(&s), vec![(0, 2, 0), (6, 10, 6)]);
        assert_eq!(s.owed(3 * P), Owed::Zero);
    }

    #[test]
    fn remap_moves_what_is_owed_and_forgets_the_destination() {
        let mut s = Space::new(&[(0, 10 * P), (100 * P, 104 * P)]);
        let (id, _) = s.claim(4 * P, 6 * P).unwrap();
        // Move pages 2..8 to 100..106 (overwriting 100..104).
        s.remap(2 * P, 100 * P, 6 * P);
        assert_eq!(
            pend(&s),
            vec![(0, 2, 0), (8, 10, 8), (100, 102, 2), (104, 106, 6)]
        );
        s.failed(id, 0);
        assert_eq!(
            pend(&s),
            vec![
                (0, 2, 0),
                (8, 10, 8),
                (100, 102, 2),
                (102, 104, 4),
                (104, 106, 6)
            ]
        );
        let p = s.pending_for_img(5 * P).unwrap();
        assert_eq!(p.start + (5 * P - p.img), 103 * P);
        assert!(s.pending_for_img(3 * P).is_some());
        assert!(s.pending_for_img(12 * P).is_none());
    }

    #[test]
    fn a_fork_owes_the_child_what_was_pending_or_in_flight() {
        let mut s = Space::new(&[(0, 8 * P)]);
        let (id, _) = s.claim(0, 2 * P).unwrap();
        let c = s.forked();
        assert_eq!(pend(&c), vec![(0, 2, 0), (2, 8, 2)]);
        s.landed(id);
        assert_eq!(pend(&s), vec![(2, 8, 2)]);
        assert!(!c.is_done());
    }
}
