//! Write monitoring of the protected regions, in one of four modes.
//!
//! * `full`: nothing is monitored; every checkpoint copies every byte.
//! * `page`: each region's pages are made read-only (`mprotect`); the first
//!   write to a page faults, the `SIGSEGV` handler ([`on_fault`]) marks it
//!   dirty and makes it writable again. One fault per written page.
//! * `acck`: as `page`, but each fault is also told to the region's
//!   [`AcckPolicy`], which may release a whole run of pieces at once (they
//!   count as dirty); optionally a released run of 512+ pages is collapsed
//!   into huge pages.
//! * `uffd`: a userfaultfd with `WP_ASYNC` protects the regions; the kernel
//!   records writes itself; `PAGEMAP_SCAN` reads them back.
//!
//! After each checkpoint every page is monitored again. The monitor lives
//! in one process-wide mutex ([`MON`]) that the fault handler also takes:
//! code holding it never writes protected memory, so the handler cannot
//! wait on its own thread. Nothing in the fault path allocates.

use std::cell::Cell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use stasis_kernel::selfmon::region::{collapse_huge, release_huge, set_writable, HUGE_PAGE_SIZE};
use stasis_kernel::selfmon::{page_floor, segv, AppRegion, PAGE_SIZE};

use crate::bits::Bits;
use crate::config::Mode;
use crate::error::{AppError, Result};
use crate::format::{RegionData, Snapshot};
use crate::policy::{AcckParams, AcckPolicy, Action};
use crate::selfuffd::SelfUffd;

/// Counters of the monitor (cumulated since `stasis_init`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub faults: u64,
    pub pieces_released: u64,
    pub pages_released: u64,
    pub huge_collapsed: u64,
    pub huge_failed: u64,
    pub monitor_ns: u64,
    pub bytes_copied: u64,
    pub copy_ns: u64,
    /// Pages of a checkpoint in progress copied by the program's first
    /// write to them (before the background copy reached them).
    pub cow_copies: u64,
}

/// One page of a region (clipped to it) to copy into a snapshot at `at`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    addr: usize,
    len: usize,
    region: usize,
    off: usize,
    at: usize,
}

/// A checkpoint whose pages are being copied out while the program runs.
#[derive(Debug)]
struct Pending {
    /// Sorted by address.
    pieces: Vec<Piece>,
    copied: Bits,
    next: usize,
    snap: Snapshot,
}

impl Pending {
    fn copy(&mut self, regions: &[Tracked], i: usize) {
        let p = self.pieces[i];
        regions[p.region]
            .mem
            .copy_out(p.off, &mut self.snap.data[p.at..p.at + p.len]);
        self.copied.set_range(i, i + 1, true);
    }

    /// Copies the pieces of `[start, end)` not copied yet (signal context:
    /// no allocation).
    fn copy_range(&mut self, regions: &[Tracked], start: usize, end: usize) -> u64 {
        let mut i = self.pieces.partition_point(|p| p.addr + p.len <= start);
        let mut n = 0;
        while i < self.pieces.len() && self.pieces[i].addr < end {
            if !self.copied.get(i) {
                self.copy(regions, i);
                n += 1;
            }
            i += 1;
        }
        n
    }
}

/// One protected region and its monitoring state.
#[derive(Debug)]
struct Tracked {
    id: i32,
    mem: AppRegion,
    span_start: usize,
    span_pages: usize,
    /// Pages written (or released) since the last checkpoint.
    dirty: Bits,
    /// Pages we made read-only and that did not fault yet.
    armed: Bits,
    policy: Option<AcckPolicy>,
    /// Copy every byte at the next checkpoint (new, or after a failure).
    whole: bool,
    /// Some of the span was collapsed into huge pages this interval.
    huge: bool,
}

impl Tracked {
    fn span_end(&self) -> usize {
        self.span_start + self.span_pages * PAGE_SIZE
    }
}

/// The monitor of all protected regions.
#[derive(Debug)]
pub struct Monitor {
    mode: Mode,
    /// Sorted by address; disjoint byte ranges (spans may share a page).
    regions: Vec<Tracked>,
    uffd: Option<SelfUffd>,
    acck: AcckParams,
    huge: bool,
    /// Why the last huge-page collapse failed, if one did.
    pub huge_note: Option<std::io::Error>,
    /// A checkpoint being copied out (copy-on-write).
    pending: Option<Pending>,
    /// The data buffer of the last checkpoint, given back once written:
    /// the next one copies into it (its pages are already mapped, where a
    /// new buffer takes a page fault per 4 KiB).
    spare: Vec<u8>,
    pub c: Counters,
}

/// The process's monitor; taken by API calls and by the fault handler.
pub static MON: Mutex<Option<Monitor>> = Mutex::new(None);

thread_local! {
    /// This thread holds [`MON`] (through a [`MonGuard`]).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// Pages made writable by faults of a thread that held [`MON`] (the
/// library's own allocations can write heap metadata that shares a page
/// with a small protected region); folded in when the guard drops.
static PENDING: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static PENDING_N: AtomicUsize = AtomicUsize::new(0);

/// [`MON`] held by this thread.
pub struct MonGuard(MutexGuard<'static, Option<Monitor>>);

impl Deref for MonGuard {
    type Target = Option<Monitor>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for MonGuard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for MonGuard {
    fn drop(&mut self) {
        if let Some(m) = self.0.as_mut() {
            m.fold_pending();
        }
        HOLDING.with(|h| h.set(false));
    }
}

/// Locks [`MON`] (a panic elsewhere does not disable it).
pub fn lock() -> MonGuard {
    let g = MON.lock().unwrap_or_else(PoisonError::into_inner);
    HOLDING.with(|h| h.set(true));
    MonGuard(g)
}

/// A fault in a thread that holds [`MON`]: the monitor may be half-way
/// through a change, so it is not read; the page is made writable and
/// remembered for [`Monitor::fold_pending`].
fn reentrant_fault(page: usize) -> bool {
    if set_writable(page, 1, true).is_err() {
        return false;
    }
    let n = PENDING_N.fetch_add(1, Ordering::SeqCst);
    if let Some(slot) = PENDING.get(n) {
        slot.store(page, Ordering::SeqCst);
    }
    true
}

/// The `SIGSEGV` callback: whether the fault at `addr` was a first write
/// to a page we protect (now writable again).
pub fn on_fault(addr: usize) -> bool {
    if HOLDING.with(Cell::get) {
        return reentrant_fault(page_floor(addr));
    }
    let t0 = Instant::now();
    let mut g = lock();
    let Some(m) = g.as_mut() else { return false };
    let ours = m.fault(page_floor(addr));
    if ours {
        m.c.monitor_ns += u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    }
    ours
}

fn monitor_err(mode: Mode) -> impl FnOnce(stasis_kernel::KernelError) -> AppError {
    move |source| AppError::Monitor {
        mode: mode.name(),
        source,
    }
}

impl Monitor {
    /// A monitor in `mode` (the signal handler or the userfaultfd is set
    /// up here, so a mode that cannot work fails at `stasis_init`).
    pub fn new(mode: Mode, acck: AcckParams, huge: bool) -> Result<Self> {
        let uffd = match mode {
            Mode::Uffd => Some(SelfUffd::open().map_err(monitor_err(mode))?),
            Mode::Page | Mode::Acck => {
                segv::install(on_fault).map_err(monitor_err(mode))?;
                None
            }
            Mode::Full => None,
        };
        Ok(Self {
            mode,
            regions: Vec::new(),
            uffd,
            acck,
            huge: huge && mode == Mode::Acck,
            huge_note: None,
            pending: None,
            spare: Vec::new(),
            c: Counters::default(),
        })
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The protected regions as (id, length).
    pub fn regions(&self) -> Vec<(i32, usize)> {
        self.regions.iter().map(|r| (r.id, r.mem.len())).collect()
    }

    /// Starts protecting `mem` as region `id` (replacing a region of the same id).
    pub fn add(&mut self, id: i32, mem: AppRegion) -> Result<()> {
        if self.regions.iter().any(|r| r.id == id) {
            self.remove(id)?;
        }
        let (a, e) = (mem.addr(), mem.addr() + mem.len());
        if let Some(o) = self
            .regions
            .iter()
            .find(|r| r.mem.addr() < e && a < r.mem.addr() + r.mem.len())
        {
            return Err(AppError::Overlap {
                id,
                addr: a,
                len: mem.len(),
                other: o.id,
            });
        }
        let pages = mem.span_pages();
        let t = Tracked {
            id,
            span_start: mem.span_start(),
            span_pages: pages,
            dirty: Bits::new(pages),
            armed: Bits::new(pages),
            policy: (self.mode == Mode::Acck).then(|| AcckPolicy::new(pages, self.acck)),
            whole: true,
            huge: false,
            mem,
        };
        let at = self.regions.partition_point(|r| r.mem.addr() < a);
        self.regions.insert(at, t);
        if let Err(e) = self.arm(at) {
            self.regions.remove(at);
            return Err(e);
        }
        Ok(())
    }

    /// Stops protecting region `id` (its pages are writable again).
    pub fn remove(&mut self, id: i32) -> Result<()> {
        let at = self
            .regions
            .iter()
            .position(|r| r.id == id)
            .ok_or(AppError::UnknownRegion(id))?;
        let (s, n) = (self.regions[at].span_start, self.regions[at].span_pages);
        self.unprotect(s, n)?;
        self.regions.remove(at);
        Ok(())
    }

    /// Lifts our protection of `[start, +pages)`: writable, and dirty in
    /// every region that shares those pages.
    fn unprotect(&mut self, start: usize, pages: usize) -> Result<()> {
        match self.mode {
            Mode::Page | Mode::Acck => {
                set_writable(start, pages, true).map_err(monitor_err(self.mode))?
            }
            Mode::Uffd => {
                if let Some(u) = &self.uffd {
                    // Regions freed meanwhile are no longer registered: ignore.
                    let _ = u.protect(start, pages, false);
                }
            }
            Mode::Full => {}
        }
        self.mark_unprotected(start, pages);
        Ok(())
    }

    /// Indices of the regions whose span overlaps `[start, end)`.
    fn overlapping(&self, start: usize, end: usize) -> Range<usize> {
        let hi = self.regions.partition_point(|r| r.span_start < end);
        let mut lo = hi;
        // Span ends never decrease along the (disjoint, sorted) regions.
        while lo > 0 && self.regions[lo - 1].span_end() > start {
            lo -= 1;
        }
        lo..hi
    }

    fn mark_unprotected(&mut self, start: usize, pages: usize) {
        let end = start + pages * PAGE_SIZE;
        for i in self.overlapping(start, end) {
            let r = &mut self.regions[i];
            let s = (start.max(r.span_start) - r.span_start) / PAGE_SIZE;
            let e = (end.min(r.span_end()) - r.span_start) / PAGE_SIZE;
            r.dirty.set_range(s, e, true);
            r.armed.set_range(s, e, false);
        }
    }

    /// Monitors every page of region `i` again, nothing dirty.
    fn arm(&mut self, i: usize) -> Result<()> {
        let mode = self.mode;
        let r = &mut self.regions[i];
        match mode {
            Mode::Page | Mode::Acck => {
                if r.huge {
                    let _ = release_huge(r.span_start, r.span_pages * PAGE_SIZE);
                    r.huge = false;
                }
                set_writable(r.span_start, r.span_pages, false).map_err(monitor_err(mode))?;
                r.armed.fill(true);
            }
            Mode::Uffd => {
                let u = self
                    .uffd
                    .as_ref()
                    .ok_or_else(|| AppError::Internal("uffd mode without a userfaultfd".into()))?;
                u.arm(r.span_start, r.span_pages)
                    .map_err(monitor_err(mode))?;
            }
            Mode::Full => {}
        }
        r.dirty.fill(false);
        if let Some(p) = &mut r.policy {
            p.reset();
        }
        Ok(())
    }

    /// The fault path (signal context: no allocation).
    fn fault(&mut self, page: usize) -> bool {
        let hits = self.overlapping(page, page + PAGE_SIZE);
        if hits.is_empty() || !matches!(self.mode, Mode::Page | Mode::Acck) {
            return false;
        }
        let owner = hits.clone().find(|&i| {
            let r = &self.regions[i];
            r.armed.get((page - r.span_start) / PAGE_SIZE)
        });
        // Unprotected meanwhile by another thread's fault: run again.
        let Some(o) = owner else { return true };
        let r = &mut self.regions[o];
        let idx = (page - r.span_start) / PAGE_SIZE;
        let (start, pages, released) = match r.policy.as_mut().map(|p| p.on_write(idx)) {
            Some(Action::Release { pages, pieces }) => (
                r.span_start + pages.start * PAGE_SIZE,
                pages.len(),
                pieces.len(),
            ),
            _ => (page, 1, 0),
        };
        if let Some(p) = self.pending.as_mut() {
            self.c.cow_copies += p.copy_range(&self.regions, start, start + pages * PAGE_SIZE);
        }
        if set_writable(start, pages, true).is_err() {
            return false;
        }
        self.mark_unprotected(start, pages);
        self.c.faults += 1;
        if released > 0 {
            self.c.pieces_released += released as u64;
            self.c.pages_released += pages as u64;
            if self.huge && pages >= HUGE_PAGE_SIZE / PAGE_SIZE {
                self.collapse(o, start, start + pages * PAGE_SIZE);
            }
        }
        true
    }

    /// Collapses the 2 MiB-aligned part of a released run into huge pages.
    fn collapse(&mut self, i: usize, start: usize, end: usize) {
        let a = start.next_multiple_of(HUGE_PAGE_SIZE);
        let b = end & !(HUGE_PAGE_SIZE - 1);
        if b <= a {
            return;
        }
        self.regions[i].huge = true;
        match collapse_huge(a, b - a) {
            Ok(()) => self.c.huge_collapsed += ((b - a) / HUGE_PAGE_SIZE) as u64,
            Err(e) => {
                self.c.huge_failed += 1;
                if self.huge_note.is_none() {
                    self.huge_note = Some(e);
                }
            }
        }
    }

    /// The page runs of region `i` to copy at this checkpoint (relative to
    /// its span); `uffd` protects them again in the same walk.
    fn dirty_runs(&mut self, i: usize) -> Result<Vec<(usize, usize)>> {
        let r = &self.regions[i];
        let runs = match self.mode {
            Mode::Full => vec![(0, r.span_pages)],
            Mode::Page | Mode::Acck => r.dirty.runs(),
            Mode::Uffd => {
                let u = self
                    .uffd
                    .as_ref()
                    .ok_or_else(|| AppError::Internal("uffd mode without a userfaultfd".into()))?;
                u.take_written(r.span_start, r.span_pages)
                    .map_err(monitor_err(self.mode))?
            }
        };
        Ok(if r.whole {
            vec![(0, r.span_pages)]
        } else {
            runs
        })
    }

    /// What to copy at this checkpoint: the snapshot's table with its data
    /// zeroed at full size, and one piece per page (clipped to its region).
    fn plan(&mut self) -> Result<(Snapshot, Vec<Piece>)> {
        let mut all = Vec::with_capacity(self.regions.len());
        for i in 0..self.regions.len() {
            match self.dirty_runs(i) {
                Ok(r) => all.push(r),
                Err(e) => {
                    self.mark_all_whole();
                    return Err(e);
                }
            }
        }
        let mut snap = Snapshot {
            regions: Vec::with_capacity(self.regions.len()),
            data: Vec::new(),
        };
        let mut pieces = Vec::new();
        let mut at = 0usize;
        for (i, runs) in all.into_iter().enumerate() {
            let r = &self.regions[i];
            let (addr, len) = (r.mem.addr(), r.mem.len());
            let mut rd = RegionData {
                id: r.id,
                len: len as u64,
                whole: r.whole || self.mode == Mode::Full,
                chunks: Vec::with_capacity(runs.len()),
            };
            for (s, e) in runs {
                let a = (r.span_start + s * PAGE_SIZE).max(addr);
                let b = (r.span_start + e * PAGE_SIZE).min(addr + len);
                if b <= a {
                    continue;
                }
                rd.chunks.push(((a - addr) as u64, (b - a) as u64));
                let mut p = a;
                while p < b {
                    let q = (page_floor(p) + PAGE_SIZE).min(b);
                    pieces.push(Piece {
                        addr: p,
                        len: q - p,
                        region: i,
                        off: p - addr,
                        at,
                    });
                    at += q - p;
                    p = q;
                }
            }
            snap.regions.push(rd);
        }
        // Every byte of [0, at) is a piece's and is copied before the
        // snapshot is handed out: a reused buffer is not cleared first.
        snap.data = std::mem::take(&mut self.spare);
        snap.data.truncate(at);
        snap.data.resize(at, 0);
        Ok((snap, pieces))
    }

    /// Takes back a written checkpoint's data buffer for the next one.
    /// A buffer more than twice as large as this one's data is dropped (a
    /// checkpoint that copied much less does not keep the memory of one
    /// that copied everything forever).
    pub fn give_back(&mut self, data: Vec<u8>) {
        let used = data.len();
        if self.spare.capacity() < data.capacity() {
            self.spare = data;
        }
        if self.spare.capacity() > 2 * used.max(1 << 20) {
            self.spare = Vec::new();
        }
    }

    /// Copies what changed since the last checkpoint out of every region,
    /// then monitors everything again.
    pub fn snapshot(&mut self) -> Result<Snapshot> {
        self.snapshot_begin(false)?;
        loop {
            if let Some(s) = self.snapshot_step(usize::MAX) {
                return Ok(s);
            }
        }
    }

    /// Starts a checkpoint. With `cow` in `page` and `acck` modes nothing
    /// is copied yet: every region is protected again at once, and each
    /// page still to copy is copied before its first write lets the
    /// program change it ([`Monitor::fault`]) or by [`Monitor::snapshot_step`],
    /// whichever comes first. Otherwise everything is copied now.
    pub fn snapshot_begin(&mut self, cow: bool) -> Result<()> {
        if self.pending.is_some() {
            return Err(AppError::Busy);
        }
        let (snap, pieces) = self.plan()?;
        self.c.bytes_copied += snap.data.len() as u64;
        let copied = Bits::new(pieces.len());
        self.pending = Some(Pending {
            pieces,
            copied,
            next: 0,
            snap,
        });
        if !(cow && matches!(self.mode, Mode::Page | Mode::Acck)) {
            self.copy_pending(usize::MAX);
        }
        let t1 = Instant::now();
        let armed = self.rearm_all();
        self.c.monitor_ns += u64::try_from(t1.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if let Err(e) = armed {
            self.pending = None;
            return Err(e);
        }
        Ok(())
    }

    /// Copies up to `max` more pages of the checkpoint in progress; returns
    /// its snapshot once every page is copied.
    pub fn snapshot_step(&mut self, max: usize) -> Option<Snapshot> {
        if self.copy_pending(max) {
            return self.pending.take().map(|p| p.snap);
        }
        None
    }

    /// Copies up to `max` pages not copied yet; whether all are.
    fn copy_pending(&mut self, max: usize) -> bool {
        let t0 = Instant::now();
        let Some(p) = self.pending.as_mut() else {
            return true;
        };
        let mut n = 0;
        while p.next < p.pieces.len() && n < max {
            let i = p.next;
            if !p.copied.get(i) {
                p.copy(&self.regions, i);
                n += 1;
            }
            p.next += 1;
        }
        self.c.copy_ns += u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        p.next >= p.pieces.len()
    }

    /// Monitors every region again from a clean state. In `uffd` mode the
    /// protection was renewed by the scan (or by [`Monitor::rescan`]).
    pub fn rearm_all(&mut self) -> Result<()> {
        for i in 0..self.regions.len() {
            self.regions[i].whole = false;
            if self.mode == Mode::Uffd {
                self.regions[i].dirty.fill(false);
                continue;
            }
            if let Err(e) = self.arm(i) {
                self.mark_all_whole();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Makes every protected page writable (before the library itself
    /// writes them, on restart). `uffd` needs nothing: it records our
    /// writes, which [`Monitor::rescan`] then forgets.
    pub fn disarm_all(&mut self) -> Result<()> {
        if matches!(self.mode, Mode::Page | Mode::Acck) {
            for i in 0..self.regions.len() {
                let (s, n) = (self.regions[i].span_start, self.regions[i].span_pages);
                self.unprotect(s, n)?;
            }
        }
        Ok(())
    }

    /// `uffd`: reads and drops the written set, protecting it again.
    pub fn rescan(&mut self) -> Result<()> {
        if self.mode == Mode::Uffd {
            for i in 0..self.regions.len() {
                self.dirty_runs(i)?;
            }
        }
        Ok(())
    }

    /// Accounts for the pages [`reentrant_fault`] made writable.
    fn fold_pending(&mut self) {
        let n = PENDING_N.swap(0, Ordering::SeqCst);
        if n > PENDING.len() {
            // Some were not recorded: no page of ours can be trusted.
            self.mark_all_whole();
            for i in 0..self.regions.len() {
                let r = &mut self.regions[i];
                r.armed.fill(false);
            }
        }
        for slot in PENDING.iter().take(n) {
            let page = slot.swap(0, Ordering::SeqCst);
            if page != 0 {
                self.mark_unprotected(page, 1);
            }
        }
    }

    /// The next checkpoint copies every byte of region `id`.
    pub fn mark_whole(&mut self, id: i32) {
        self.regions
            .iter_mut()
            .filter(|r| r.id == id)
            .for_each(|r| r.whole = true);
    }

    /// The next checkpoint copies every byte (after a failed one).
    pub fn mark_all_whole(&mut self) {
        self.regions.iter_mut().for_each(|r| r.whole = true);
    }

    /// Copies `src` into region `id` at `off` (monitoring must be off).
    pub fn write_region(&self, id: i32, off: usize, src: &[u8]) -> Result<()> {
        let r = self
            .regions
            .iter()
            .find(|r| r.id == id)
            .ok_or(AppError::UnknownRegion(id))?;
        if off.checked_add(src.len()).is_none_or(|e| e > r.mem.len()) {
            return Err(AppError::Internal(format!("write past region {id}")));
        }
        r.mem.copy_in(off, src);
        Ok(())
    }

    /// Lifts all protection (finalize).
    pub fn release_all(&mut self) -> Result<()> {
        let ids: Vec<i32> = self.regions.iter().map(|r| r.id).collect();
        for id in ids {
            self.remove(id)?;
        }
        Ok(())
    }
}
