//! The ACCK policy: which pages stay monitored, as a pure state machine.
//!
//! From the paper (seed 002, section 3.2): a region is split into `2^n`
//! pieces (at least one page each). Every piece starts monitored. A piece
//! turns *hot* when at least `hot_percent` of the pages of its sampling
//! window were written (the window is the whole piece by default; the
//! paper's variant samples its first 10%). A hot piece is released
//! (unprotected) together with the pieces after it, at a pace that grows
//! while hot pieces keep following a released run: 1 piece, then 2, 4, ...,
//! `2^(n-3)`, then 1 again ("to prevent over coarse granularity"). A piece
//! that turns hot just *before* a released run extends it backwards the
//! same way (the paper's any-order pattern). After each checkpoint
//! everything is monitored again ([`AcckPolicy::reset`]).
//!
//! The policy knows pages by index in the region's span and is told about
//! first writes (faults) only; it answers which pages to unprotect. The
//! monitor applies the answer with `mprotect`.

use std::ops::Range;

/// Parameters of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcckParams {
    /// `n`: a region is split into `2^n` pieces.
    pub n: u32,
    /// A piece is hot when this percentage of its window was written.
    pub hot_percent: u32,
    /// The window: this percentage of the piece's first pages (100: all).
    pub window_percent: u32,
}

impl Default for AcckParams {
    fn default() -> Self {
        Self {
            n: 6,
            hot_percent: 80,
            window_percent: 100,
        }
    }
}

/// What the monitor must do after a first write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Unprotect the faulting page only.
    Page(usize),
    /// A run of pieces is released: unprotect these pages (they include
    /// the faulting page) and count all of them as written.
    Release {
        pages: Range<usize>,
        pieces: Range<usize>,
    },
}

/// The ACCK state of one region.
#[derive(Debug, Clone)]
pub struct AcckPolicy {
    pages: usize,
    piece_pages: usize,
    pieces: usize,
    max_level: u8,
    window: usize,
    threshold: usize,
    /// First writes seen in each piece's window since the last reset.
    written: Vec<u32>,
    /// Release level of each piece (`None`: monitored).
    level: Vec<Option<u8>>,
}

impl AcckPolicy {
    /// The policy of a region of `pages` pages.
    pub fn new(pages: usize, p: AcckParams) -> Self {
        let n = p.n.min(20);
        let pieces_wanted = 1usize << n;
        let piece_pages = pages.div_ceil(pieces_wanted).max(1);
        let pieces = pages.div_ceil(piece_pages);
        let window = (piece_pages * p.window_percent.clamp(1, 100) as usize).div_ceil(100);
        let threshold = (window * p.hot_percent.clamp(1, 100) as usize).div_ceil(100);
        let max_level = u8::try_from(n.saturating_sub(3)).unwrap_or(u8::MAX);
        Self {
            pages,
            piece_pages,
            pieces,
            max_level,
            window: window.max(1),
            threshold: threshold.max(1),
            written: vec![0; pieces],
            level: vec![None; pieces],
        }
    }

    /// Pages per piece.
    pub fn piece_pages(&self) -> usize {
        self.piece_pages
    }

    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.pieces
    }

    /// Whether piece `i` is released (unmonitored).
    pub fn is_released(&self, i: usize) -> bool {
        self.level.get(i).is_some_and(Option::is_some)
    }

    /// Everything monitored again (after a checkpoint).
    pub fn reset(&mut self) {
        self.written.iter_mut().for_each(|w| *w = 0);
        self.level.iter_mut().for_each(|l| *l = None);
    }

    /// The pages of pieces `r`.
    pub fn piece_range_pages(&self, r: &Range<usize>) -> Range<usize> {
        r.start * self.piece_pages..(r.end * self.piece_pages).min(self.pages)
    }

    /// A first write to page `page` (which was monitored). Returns what to
    /// unprotect.
    pub fn on_write(&mut self, page: usize) -> Action {
        let piece = page / self.piece_pages;
        if piece >= self.pieces || self.is_released(piece) {
            return Action::Page(page);
        }
        if page - piece * self.piece_pages < self.window {
            self.written[piece] += 1;
        }
        if (self.written[piece] as usize) < self.threshold {
            return Action::Page(page);
        }
        let pieces = self.release_from(piece);
        Action::Release {
            pages: self.piece_range_pages(&pieces),
            pieces,
        }
    }

    /// Releases the run that starts (or ends) at hot piece `p`; returns the
    /// pieces released by this step.
    fn release_from(&mut self, p: usize) -> Range<usize> {
        let left = p.checked_sub(1).and_then(|l| self.level[l]);
        let right = self.level.get(p + 1).copied().flatten();
        let next = |l: u8| if l >= self.max_level { 0 } else { l + 1 };
        let (lvl, forward) = match (left, right) {
            (Some(l), _) => (next(l), true),
            (None, Some(r)) => (next(r), false),
            (None, None) => (0, true),
        };
        let count = 1usize << lvl;
        let run = if forward {
            p..(p + count).min(self.pieces)
        } else {
            (p + 1).saturating_sub(count)..p + 1
        };
        // Stop at an already released piece: a run never jumps over one.
        let run = if forward {
            let end = (run.start + 1..run.end)
                .find(|&i| self.is_released(i))
                .unwrap_or(run.end);
            run.start..end
        } else {
            let start = (run.start..run.end - 1)
                .rev()
                .find(|&i| self.is_released(i))
                .map_or(run.start, |i| i + 1);
            start..run.end
        };
        for i in run.clone() {
            self.level[i] = Some(lvl);
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes every page in order; returns the released piece runs and the
    /// number of faults taken (first writes to monitored pages).
    fn in_order(pages: usize, p: AcckParams) -> (Vec<Range<usize>>, usize) {
        let mut pol = AcckPolicy::new(pages, p);
        let mut monitored = vec![true; pages];
        let (mut runs, mut faults) = (Vec::new(), 0);
        for page in 0..pages {
            if !monitored[page] {
                continue;
            }
            faults += 1;
            match pol.on_write(page) {
                Action::Page(q) => monitored[q] = false,
                Action::Release { pages, pieces } => {
                    pages.for_each(|q| monitored[q] = false);
                    runs.push(pieces);
                }
            }
        }
        (runs, faults)
    }

    #[test]
    fn in_order_writes_release_at_the_papers_pace() {
        // 64 pieces of 10 pages; hot at 8 first writes of a piece.
        let (runs, faults) = in_order(640, AcckParams::default());
        let sizes: Vec<usize> = runs.iter().map(|r| r.len()).collect();
        assert_eq!(sizes[..8], [1, 2, 4, 8, 1, 2, 4, 8]);
        assert_eq!(runs[0], 0..1);
        assert_eq!(runs[1], 1..3);
        assert_eq!(runs[2], 3..7);
        assert_eq!(runs[3], 7..15);
        assert_eq!(runs[4], 15..16);
        // Runs tile the region with no gap.
        let mut next = 0;
        for r in &runs {
            assert_eq!(r.start, next);
            next = r.end;
        }
        assert_eq!(next, 64);
        // Hot pieces: 0,1,3,7 of every 15, the tail 60,61,63: 19 hot
        // pieces, each detected after 8 faults, against 640 faults page by page.
        assert_eq!(runs.len(), 19);
        assert_eq!(faults, 19 * 8);
    }

    #[test]
    fn the_papers_window_detects_hot_pieces_after_fewer_faults() {
        let p = AcckParams {
            window_percent: 10,
            ..AcckParams::default()
        };
        // 64 pieces of 100 pages: window 10 pages, hot at 8.
        let (runs, faults) = in_order(6400, p);
        assert_eq!(runs.len(), 19);
        assert_eq!(faults, 19 * 8);
    }

    #[test]
    fn n_bounds_the_pace() {
        let p = AcckParams {
            n: 4,
            ..AcckParams::default()
        };
        // 16 pieces of 1 page, hot at the first write; max run 2^(4-3) = 2.
        let (runs, _) = in_order(16, p);
        let sizes: Vec<usize> = runs.iter().map(|r| r.len()).collect();
        assert_eq!(sizes, [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1]);
    }

    #[test]
    fn scattered_writes_release_nothing() {
        // One write in every piece: no piece reaches 80%.
        let mut pol = AcckPolicy::new(640, AcckParams::default());
        for piece in 0..64 {
            assert_eq!(pol.on_write(piece * 10 + 3), Action::Page(piece * 10 + 3));
        }
        assert!((0..64).all(|i| !pol.is_released(i)));
    }

    #[test]
    fn a_hot_piece_before_a_run_extends_it_backwards() {
        let mut pol = AcckPolicy::new(640, AcckParams::default());
        // Piece 10 hot: released alone.
        let mut last = None;
        for q in 100..108 {
            last = Some(pol.on_write(q));
        }
        assert_eq!(
            last,
            Some(Action::Release {
                pages: 100..110,
                pieces: 10..11
            })
        );
        // Piece 9 hot, right neighbour released at level 0: 2 pieces backwards.
        for q in 90..98 {
            last = Some(pol.on_write(q));
        }
        assert_eq!(
            last,
            Some(Action::Release {
                pages: 80..100,
                pieces: 8..10
            })
        );
    }

    #[test]
    fn runs_stop_at_released_pieces_and_reset_monitors_all() {
        let mut pol = AcckPolicy::new(640, AcckParams::default());
        for q in (20..28).chain(0..8).chain(10..18) {
            pol.on_write(q);
        }
        // Piece 2 was released first; piece 0 then 1 (level 1 wants 1..3,
        // stops before 2).
        assert!(pol.is_released(0) && pol.is_released(1) && pol.is_released(2));
        assert!(!pol.is_released(3));
        pol.reset();
        assert!((0..64).all(|i| !pol.is_released(i)));
        assert_eq!(pol.on_write(0), Action::Page(0));
    }

    #[test]
    fn small_regions_have_one_page_pieces() {
        let pol = AcckPolicy::new(5, AcckParams::default());
        assert_eq!((pol.pieces(), pol.piece_pages()), (5, 1));
        let pol = AcckPolicy::new(1 << 20, AcckParams::default());
        assert_eq!((pol.pieces(), pol.piece_pages()), (64, 1 << 14));
    }
}
