//! The fault handler of one write-protected process: reads its
//! userfaultfd, saves the pages a write would change, lets the writer go.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::uffd::{Event, Userfaultfd};
use stasis_kernel::KernelError;
use stasis_sys as sys;

use super::{errno_err, still_protected, CowLost, Mode, Shared, State, GRAIN, HUGE, MAX_SAMPLES};
use crate::{CaptureError, Result};

/// The fault handler of one process.
pub(super) struct Handler<'a> {
    pub(super) idx: usize,
    pub(super) pid: i32,
    pub(super) shared: &'a Shared,
    pub(super) uffd: &'a Userfaultfd,
    pub(super) mem: &'a ProcessMemory,
    pub(super) pagemap: &'a Pagemap,
    /// Faults read but not yet served, with the time they were read.
    pub(super) queue: std::cell::RefCell<std::collections::VecDeque<(u64, Instant)>>,
    /// Other events read while the state lock was held.
    pub(super) later: std::cell::RefCell<Vec<Event>>,
}

impl Handler<'_> {
    pub(super) fn run(&self) {
        loop {
            let stopping = self.shared.stop.load(Ordering::SeqCst);
            if self.queue.borrow().is_empty() {
                match self.uffd.wait_readable(if stopping { 0 } else { 20 }) {
                    Ok(true) => {}
                    // Nothing queued: done if asked to stop.
                    Ok(false) if stopping => return,
                    Ok(false) => continue,
                    Err(e) => return self.broken(e.to_string()),
                }
                if let Err(e) = self.read(false) {
                    return self.broken(e.to_string());
                }
                if stopping && self.queue.borrow().is_empty() {
                    return;
                }
            }
            let later = std::mem::take(&mut *self.later.borrow_mut());
            for ev in later {
                self.event(ev);
            }
            let next = self.queue.borrow_mut().pop_front();
            if let Some((addr, t0)) = next {
                self.fault(addr, t0);
            }
        }
    }

    /// Reads what the userfaultfd holds: events are dealt with at once,
    /// faults queued.
    /// `locked`: the caller holds the state lock, so events other than
    /// faults are kept for later (dealing with them takes the lock).
    fn read(&self, locked: bool) -> std::result::Result<(), KernelError> {
        let mut events = Vec::new();
        self.uffd.read_events(&mut events)?;
        let now = Instant::now();
        for ev in events {
            match ev {
                Event::PageFault { addr, .. } => self.queue.borrow_mut().push_back((addr, now)),
                ev if locked => self.later.borrow_mut().push(ev),
                ev => self.event(ev),
            }
        }
        Ok(())
    }

    /// An event other than a fault.
    fn event(&self, ev: Event) {
        match ev {
            Event::PageFault { .. } | Event::Fork(_) | Event::Unknown(_) => {}
            Event::Unmap { start, end } => self.gone(start, end, "unmapped"),
            Event::Remove { start, end } => {
                self.gone(start, end, "discarded (MADV_DONTNEED or MADV_REMOVE)")
            }
            Event::Remap { from, to, len } => {
                self.moved(to, len);
                self.gone(from, from + len, "moved (mremap)");
            }
        }
    }

    /// Lifts the protection of `[a, b)` (and wakes its writers); while an
    /// event waits to be read (`EAGAIN`), reads it first (`locked`: the
    /// caller holds the state lock). Returns false if part of the range is
    /// not registered (`ENOENT`: the kernel stops at the first such area).
    fn lift(&self, a: u64, b: u64, locked: bool) -> Result<bool> {
        let t0 = Instant::now();
        loop {
            match self.uffd.write_protect(a, b - a, false) {
                Ok(()) => return Ok(true),
                Err(libc::ENOENT | libc::ESRCH) => return Ok(false),
                Err(libc::EAGAIN) if t0.elapsed() < Duration::from_secs(10) => {
                    self.read(locked)
                        .map_err(|e| CaptureError::Concurrent(e.to_string()))?;
                    std::thread::yield_now();
                }
                Err(errno) => {
                    return Err(errno_err(
                        format!("lifting the write-protection of [{a:#x}, {b:#x})"),
                        errno,
                    ))
                }
            }
        }
    }

    /// Lifts the grain `[g0, g1)` of a fault at `page`, and the page alone
    /// if the grain reaches outside the registered areas (one ioctl, one
    /// TLB flush, in the common case). On failure the writer is woken
    /// anyway (never left stuck) and the copy is given up.
    fn lift_grain(&self, (g0, g1): (u64, u64), page: u64, locked: bool) -> bool {
        let r = self.lift(g0, g1, locked).and_then(|whole| {
            if whole {
                Ok(true)
            } else {
                self.lift(page, page + sys::PAGE_SIZE, locked)
            }
        });
        match r {
            Ok(_) => true,
            Err(e) => {
                let _ = self.uffd.wake(page, sys::PAGE_SIZE);
                if !locked {
                    self.shared.lock().broken.get_or_insert(e.to_string());
                }
                false
            }
        }
    }

    /// What a write at `page` lifts, of its grain `[g0, g1)`. Without
    /// tracking, the grain. With tracking, the lifted pages are the next
    /// checkpoint's dirty set: the page alone, unless a page next to it
    /// in the grain was written since the grain was protected. So a
    /// scattered writer's checkpoints save what it wrote, not 16 times
    /// that, and a sequential writer pays two faults per grain, not
    /// sixteen. A huge page is always lifted whole.
    fn lift_span(&self, (g0, g1): (u64, u64), page: u64) -> (u64, u64) {
        if !self.shared.tracking || g1 - g0 != GRAIN {
            return (g0, g1);
        }
        let next = page + sys::PAGE_SIZE;
        // Only the two neighbours in the grain are looked at (the page
        // itself is protected: it faulted).
        let (a, b) = (
            page.saturating_sub(sys::PAGE_SIZE).max(g0),
            (next + sys::PAGE_SIZE).min(g1),
        );
        match self.pagemap.scan(a, b, ScanQuery::written()) {
            Ok(r) if r.is_empty() => (page, next),
            _ => (g0, g1),
        }
    }

    fn broken(&self, why: String) {
        let mut st = self.shared.lock();
        st.broken.get_or_insert(format!(
            "the fault handler of process {} stopped: {why}",
            self.pid
        ));
    }

    /// Pages of `[start, end)` left the process: lost if any was unsaved.
    /// Tracking: pages moved to `[to, to + len)` keep their protection
    /// there, but they are not what the parent checkpoint had at that
    /// address: they lose it, so the next dump counts them as written. (If
    /// that happens while the tree is being frozen, the dump is abandoned:
    /// the dirty set may already have been read.)
    fn moved(&self, to: u64, len: u64) {
        if !self.shared.tracking {
            return;
        }
        let mut st = self.shared.lock();
        if st.procs[self.idx].mode == Mode::Hold {
            st.lost.get_or_insert(CowLost {
                pid: self.pid,
                why: format!(
                    "it moved memory to [{to:#x}, {:#x}) as it was being frozen",
                    to + len
                ),
            });
            return;
        }
        if let Err(e) = self.lift(to, to + len, true) {
            st.broken.get_or_insert(e.to_string());
        }
    }

    fn gone(&self, start: u64, end: u64, how: &str) {
        let mut st = self.shared.lock();
        let ps = &mut st.procs[self.idx];
        if ps.mode != Mode::Armed {
            return;
        }
        let owed = ps.unsaved.intersect(start, end);
        if owed.is_empty() {
            return;
        }
        ps.unsaved.remove(start, end);
        let bytes: u64 = owed.iter().map(|(a, b)| b - a).sum();
        st.lost.get_or_insert(CowLost {
            pid: self.pid,
            why: format!(
                "it {how} [{start:#x}, {end:#x}) while {bytes} bytes of it were not yet saved"
            ),
        });
        self.shared.room.notify_all();
    }

    /// Saves the unsaved `parts` (`need` bytes) of a grain into the side
    /// buffer, under the state lock; on failure the copy is lost.
    fn save(&self, st: &mut State, parts: &[(u64, u64)], need: u64) {
        let mut saved = Vec::with_capacity(parts.len());
        for &(s, e) in parts {
            let mut data = vec![0u8; usize::try_from(e - s).unwrap_or(0)];
            if let Err(err) = self.mem.read_forced(s, &mut data) {
                st.lost.get_or_insert(CowLost {
                    pid: self.pid,
                    why: format!("reading [{s:#x}, {e:#x}) on a write fault failed ({err})"),
                });
                return;
            }
            saved.push((s, data));
        }
        if let Some(why) = still_protected(self.pagemap, parts) {
            st.lost.get_or_insert(CowLost { pid: self.pid, why });
            return;
        }
        let ps = &mut st.procs[self.idx];
        for (s, data) in saved {
            ps.unsaved.remove(s, s + data.len() as u64);
            ps.side.insert(s, data);
        }
        st.side_bytes += need;
        st.side_peak = st.side_peak.max(st.side_bytes);
    }

    /// A write to the protected page at `addr`: save the unsaved pages of
    /// its grain, then let the writer through.
    fn fault(&self, addr: u64, read_at: Instant) {
        let page = addr & !(sys::PAGE_SIZE - 1);
        let huge = self
            .pagemap
            .scan(page, page + sys::PAGE_SIZE, ScanQuery::huge())
            .is_ok_and(|r| !r.is_empty());
        // (Unless the side buffer could never hold a huge page.)
        let cap = self.shared.cap;
        let grain = if huge && (cap == 0 || cap >= HUGE) {
            HUGE
        } else {
            GRAIN
        };
        let g0 = page & !(grain - 1);
        let g1 = g0 + grain;
        let (l0, l1) = self.lift_span((g0, g1), page);
        let mut waited: Option<Instant> = None;
        let mut counted = false;
        let mut st = self.shared.lock();
        loop {
            if st.lost.is_some() || self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            match st.procs[self.idx].mode {
                mode @ (Mode::Prepare | Mode::Hold) => {
                    // Let it through, under the lock (the freeze's switch
                    // to Hold, and arming, wait for this). The whole grain:
                    // tracking is coarse (64 KiB) rather than cost a
                    // fault per page of a sequential writer.
                    if !self.lift_grain((l0, l1), page, true) {
                        st.broken
                            .get_or_insert(format!("lifting the protection at {page:#x} failed"));
                    }
                    if mode == Mode::Hold {
                        st.procs[self.idx].touched.insert(l0, l1);
                    }
                    return;
                }
                Mode::Armed => {}
            }
            if !counted {
                counted = true;
                st.faults += 1;
            }
            if st.procs[self.idx]
                .claimed
                .is_some_and(|(a, b)| a < g1 && g0 < b)
            {
                // The copier is reading this grain: wait for it to finish
                // (then the pages are saved and nothing is owed here).
                st = self.shared.wait_room(st, Duration::from_millis(20));
                continue;
            }
            let parts = st.procs[self.idx].unsaved.intersect(g0, g1);
            if parts.is_empty() {
                break;
            }
            let need: u64 = parts.iter().map(|(a, b)| b - a).sum();
            let cap = self.shared.cap;
            if cap > 0 && st.side_bytes > 0 && st.side_bytes + need > cap {
                // Full: the writer waits until the copier drains some (or
                // reaches these pages itself).
                if waited.is_none() {
                    waited = Some(Instant::now());
                    st.waits += 1;
                }
                st = self.shared.wait_room(st, Duration::from_millis(50));
                continue;
            }
            self.save(&mut st, &parts, need);
            break;
        }
        if let Some(w) = waited {
            st.wait_ns += u64::try_from(w.elapsed().as_nanos()).unwrap_or(u64::MAX);
        }
        drop(st);
        // The whole grain (or the page alone, see `lift_span`): pages in
        // it that were never protected are untouched by this.
        if !self.lift_grain((l0, l1), page, false) {
            return;
        }
        let ns = u64::try_from(read_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut st = self.shared.lock();
        if st.latencies_ns.len() < MAX_SAMPLES {
            st.latencies_ns.push(ns);
        }
    }
}
