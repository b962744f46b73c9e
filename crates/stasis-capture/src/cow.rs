//! Concurrent dumps by userfaultfd write-protection (`--cow-method uffd`,
//! the default without dirty tracking).
//!
//! Write-protecting memory changes every page-table entry (about 21 ms per
//! GiB of 4 KiB pages on the reference VM), so it is done *before* the
//! checkpoint's freeze, while the tree runs:
//!
//! 1. **Prepare** ([`Cow::prepare`]). A brief stop of the tree gives each
//!    process a synchronous userfaultfd (created inside it by a remote
//!    syscall, taken out with `pidfd_getfd`, closed in it again) with its
//!    private anonymous areas registered in write-protect mode; the tree
//!    runs on while the dumper write-protects them and reads their
//!    `VmFlags`. Meanwhile a write to a protected page is simply let
//!    through by the handler (and the page stays unprotected).
//! 2. **Freeze** (the checkpoint's instant). Handlers hold every fault
//!    ([`Cow::enter_checkpoint`]); the memory plan's page-table walk also
//!    reports which pages with data lost their protection in step 1 (or
//!    belong to areas mapped since), and only those are protected again
//!    ([`Cow::arm_frozen`]): the freeze costs one walk, not a rewrite of
//!    every entry. Everything else a dump saves is read in the freeze as
//!    usual.
//! 3. **Copy.** The tree is released, and two kinds of thread share the
//!    pages still to save (the *unsaved* set, under one lock):
//!
//! * **The copier** (the dumper's thread) walks the plan in address order,
//!   in pieces of [`PIECE`] bytes (aligned). Under the lock it takes the
//!   piece's pages out of the side buffer and claims the unsaved ones
//!   (a write fault in a claimed piece waits); it reads them outside the
//!   lock (they are protected, so they hold the freeze instant), then lifts
//!   the protection of the piece (later writes there cost nothing; with
//!   [`CowTracking`] it stays, to see the next write) and writes it to the
//!   pack.
//! * **A handler per process** reads the userfaultfd. A write to a
//!   protected page stops the writing thread until the handler has copied
//!   the unsaved pages of the page's aligned [`GRAIN`] (the whole huge page
//!   in a THP, [`HUGE`]) into the side buffer and lifted their protection
//!   (which wakes the writer). Reads never
//!   stop. When the side buffer holds `cap` bytes, the handler waits for
//!   the copier to drain it (so the writer waits), instead of growing.
//!   The time from reading a fault to waking its writer is recorded.
//!
//! Every page is saved exactly once, by whichever comes first, and always
//! while still protected: its content is that of the freeze instant.
//!
//! **Memory the process gives back.** The kernel tells a userfaultfd about
//! `munmap` only after the pages are gone, and about `MADV_DONTNEED` or a
//! moving `mremap` in a way that races with the change. If such an event
//! covers a page not yet saved, that page is lost: the dump is abandoned
//! ([`CowLost`]), the protection dropped, nothing committed, and the
//! caller dumps again with a fork snapshot (`crate::snapshot`), which
//! keeps every page whatever the process does. Each piece and grain read
//! is also checked, after the read, to be still registered and protected
//! (`PAGEMAP_SCAN`): a page unmapped and replaced by a new mapping before
//! its event is read is caught the same way.
//!
//! **Failure.** Whatever ends the copy (an error, the process dying, the
//! dumper killed), the userfaultfds are closed; the kernel then unregisters
//! the areas, clears the protection and wakes any waiting writer, so the
//! process runs on as if nothing happened.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::seam::Pages;
use stasis_kernel::uffd::Userfaultfd;
use stasis_kernel::KernelError;
use stasis_sys as sys;

use crate::freeze::FrozenProcess;
use stasis_image::manifest::VmaKind;
#[cfg(doc)]
use stasis_image::{areas::private_anon, manifest::Vma};

mod handler;
mod tracking;

use crate::{CaptureError, Result};
use handler::Handler;
pub use stasis_image::ranges::RangeSet;
pub use tracking::{CowTracking, TRACK_NAME};

/// Bytes the copier saves per step (aligned: a grain never straddles two;
/// a transparent huge page is lifted whole, not split).
pub const PIECE: u64 = HUGE;
/// Bytes a write fault saves (aligned, the unsaved pages in it); a fault in
/// a transparent huge page saves and lifts the huge page ([`HUGE`]), so as
/// not to split it.
pub const GRAIN: u64 = 16 * sys::PAGE_SIZE;
/// A PMD-mapped transparent huge page.
pub const HUGE: u64 = 2 << 20;
/// Fault latencies kept for the percentiles (the rest are counted only).
const MAX_SAMPLES: usize = 1 << 20;

/// Features asked of each userfaultfd: the events that say the process
/// gave memory back or moved it.
const FEATURES: u64 =
    sys::UFFD_FEATURE_EVENT_UNMAP | sys::UFFD_FEATURE_EVENT_REMOVE | sys::UFFD_FEATURE_EVENT_REMAP;

/// The process discarded or moved pages not yet saved: this dump cannot
/// hold them. Carried in [`CaptureError::CowLost`].
#[derive(Debug, Clone)]
pub struct CowLost {
    pub pid: i32,
    pub why: String,
}

/// What is shared between the copier and the handlers, per process.
#[derive(Default)]
struct ProcState {
    mode: Mode,
    /// Grains let through in [`Mode::Hold`], to protect again when armed.
    touched: RangeSet,
    unsaved: RangeSet,
    /// The piece the copier is reading (out of `unsaved` already).
    claimed: Option<(u64, u64)>,
    /// Pages saved by handlers, by address (each piece inside one grain).
    side: BTreeMap<u64, Vec<u8>>,
}

/// What a handler does with a write fault.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the checkpoint: let the write through (lift the protection).
    #[default]
    Prepare,
    /// The tree is frozen (a fault comes from the dumper's own remote
    /// syscalls, or the kernel on their way back): let it through, and
    /// remember the grain, protected again when armed.
    Hold,
    /// After the checkpoint instant: save the original, then let it through.
    Armed,
}

#[derive(Default)]
struct State {
    procs: Vec<ProcState>,
    side_bytes: u64,
    side_peak: u64,
    lost: Option<CowLost>,
    faults: u64,
    latencies_ns: Vec<u64>,
    /// Faults whose writer waited for room in the side buffer, and for how
    /// long in total.
    waits: u64,
    wait_ns: u64,
    /// A handler could not read its userfaultfd.
    broken: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when the side buffer shrinks or the copy ends.
    room: Condvar,
    cap: u64,
    stop: AtomicBool,
    /// The protection also tracks writes between checkpoints
    /// ([`CowTracking`]): pages the copier saved stay protected.
    tracking: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler that panicked left consistent data behind (every
        // update is made whole under the lock).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` for [`Shared::room`] to be signalled (the side
    /// buffer shrank, a claim ended or the copy ended).
    fn wait_room<'a>(&self, st: MutexGuard<'a, State>, timeout: Duration) -> MutexGuard<'a, State> {
        self.room
            .wait_timeout(st, timeout)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }
}

struct Proc {
    pid: i32,
    uffd: Arc<Userfaultfd>,
    mem: Arc<ProcessMemory>,
    pagemap: Arc<Pagemap>,
    handler: Option<JoinHandle<()>>,
    /// The areas `(start, end)` with `VmFlags` bits, and all areas, read in
    /// the prepare step (so that the freeze need not walk `smaps`). Advice
    /// given to a whole area between the prepare step and the freeze is
    /// not seen.
    vmflags: Vec<((u64, u64), u32)>,
    layout: Vec<(u64, u64)>,
    /// Armed in the checkpoint's freeze.
    armed: bool,
}

/// Figures of a write-protected concurrent copy.
#[derive(Debug, Clone, Default)]
pub struct CowFigures {
    pub faults: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub side_peak: u64,
    pub waits: u64,
    pub wait_us: u64,
    pub prepare_stop_us: u64,
}

/// The write-protection of a frozen tree, its handlers, and the pages
/// still owed.
pub struct Cow {
    shared: Arc<Shared>,
    procs: Vec<Proc>,
    /// How long the prepare step stopped the tree, in microseconds.
    prepare_stop_us: u64,
    /// Threads the prepare step found in a syscall interrupted with
    /// `ERESTART_RESTARTBLOCK` (tid -> syscall number): released, they run
    /// `restart_syscall`, which a restored process cannot continue.
    restarts: std::collections::HashMap<i32, u64>,
}

/// Starts of the `MAP_DROPPABLE` areas of `pid` (from `smaps`: read only
/// when a registration failed).
fn droppable_starts(pid: i32) -> Result<Vec<u64>> {
    let smaps = crate::proc::read(pid, "smaps")?;
    Ok(crate::proc::parse_smaps_vmflags(&smaps)
        .into_iter()
        .filter(|f| f.1 & stasis_sys::vmflags::DROPPABLE != 0)
        .map(|f| f.0)
        .collect())
}

/// The areas of `maps` that [`private_anon`] accepts as a [`Vma`]: private
/// anonymous memory (the kernel refuses to write-protect private file
/// mappings; a dump reads those, and shared memory, in the freeze).
/// `MapsEntry` has no `shm`: the capture sets it only on shared areas.
fn protectable_maps(maps: &[crate::proc::MapsEntry]) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| !m.shared)
        .filter(|m| matches!(crate::memory::vma_kind(m), Ok(Some(VmaKind::Anon))))
        .map(|m| (m.start, m.end))
        .collect()
}

impl Cow {
    /// `cap`: most bytes the side buffer holds (0: no cap).
    pub fn new(cap: u64) -> Self {
        Self::with_tracking(cap, false)
    }

    fn with_tracking(cap: u64, tracking: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                room: Condvar::new(),
                cap,
                stop: AtomicBool::new(false),
                tracking,
            }),
            procs: Vec::new(),
            prepare_stop_us: 0,
            restarts: std::collections::HashMap::new(),
        }
    }

    /// Step 1: a brief stop of the tree rooted at `root` to give each
    /// process a userfaultfd with its private anonymous areas registered;
    /// then, while the tree runs, write-protects them and reads their
    /// `VmFlags`.
    pub fn prepare(&mut self, root: i32) -> Result<()> {
        let probe = Pagemap::open(std::process::id() as i32)?;
        let here = std::ptr::addr_of!(probe) as u64 & !(sys::PAGE_SIZE - 1);
        probe.scan(here, here + sys::PAGE_SIZE, ScanQuery::wp_protected())?;
        let boost = stasis_kernel::priority::Boost::raise(stasis_kernel::priority::FROZEN_NICE);
        let stop0 = Instant::now();
        let mut f = crate::freeze::freeze_tree(root)?;
        let mut registered: Vec<(usize, Vec<(u64, u64)>)> = Vec::new();
        for t in f.procs.iter().flat_map(|p| p.threads.iter()) {
            let r = t.orig_regs;
            if (r.orig_rax as i64) >= 0 && r.rax as i64 == -sys::ERESTART_RESTARTBLOCK {
                self.restarts.insert(t.tracee.pid(), r.orig_rax);
            }
        }
        let r = (|| -> Result<()> {
            for fp in f.procs.iter_mut().filter(|p| p.zombie.is_none()) {
                let maps = crate::proc::read_parsed(fp.pid, "maps", crate::proc::parse_maps)?;
                let mut areas = protectable_maps(&maps);
                fp.arm_remote(&ProcessMemory::open(fp.pid)?, &maps)?;
                let uffd = create_in(fp)?;
                let mut droppable = None;
                let mut i = 0;
                while i < areas.len() {
                    let (a, b) = areas[i];
                    match uffd.register(a, b - a, sys::UFFDIO_REGISTER_MODE_WP) {
                        Ok(()) => i += 1,
                        // userfaultfd refuses MAP_DROPPABLE areas, of which
                        // nothing is saved: they need no protection.
                        Err(e) => {
                            let d = match &droppable {
                                Some(d) => d,
                                None => droppable.insert(droppable_starts(fp.pid)?),
                            };
                            if !d.contains(&a) {
                                return Err(e.into());
                            }
                            areas.remove(i);
                        }
                    }
                }
                let idx = self.start(fp.pid, uffd)?;
                self.procs[idx].layout = maps.iter().map(|m| (m.start, m.end)).collect();
                registered.push((idx, areas));
            }
            Ok(())
        })();
        let released = f.release();
        drop(boost);
        self.prepare_stop_us = u64::try_from(stop0.elapsed().as_micros()).unwrap_or(u64::MAX);
        r?;
        released?;
        for (idx, areas) in registered {
            let p = &self.procs[idx];
            for (a, b) in areas {
                wp_retry(&*p.uffd, &self.shared.stop, a, b, true)?;
            }
            let smaps = crate::proc::read(p.pid, "smaps")?;
            let flags = crate::proc::parse_smaps_vmflags(&smaps);
            let with_flags: Vec<((u64, u64), u32)> = self.procs[idx]
                .layout
                .iter()
                .filter_map(|&(s, e)| {
                    let i = flags.binary_search_by_key(&s, |f| f.0).ok()?;
                    Some(((s, e), flags[i].1))
                })
                .collect();
            self.procs[idx].vmflags = with_flags;
        }
        Ok(())
    }

    /// The checkpoint's freeze can find a thread about to run, or in,
    /// `restart_syscall`, because the prepare step's brief stop interrupted
    /// its sleep (`nanosleep`, `poll`, `clock_nanosleep`...). The image must
    /// name the syscall itself (its arguments are still in the registers): a
    /// restored process, a new task, has nothing to restart and would get
    /// `EINTR`. (Left running, the thread then issues the syscall again
    /// rather than restart it: the same as after a restore, a relative
    /// timeout starts over.)
    pub fn name_restarted_syscalls(&self, f: &mut crate::freeze::Frozen) {
        for t in f.procs.iter_mut().flat_map(|p| p.threads.iter_mut()) {
            let r = &mut t.orig_regs;
            let Some(&nr) = self.restarts.get(&t.tracee.pid()) else {
                continue;
            };
            if r.orig_rax == sys::SYS_RESTART_SYSCALL as u64
                && r.rax as i64 == -sys::ERESTART_RESTARTBLOCK
            {
                // Inside restart_syscall, interrupted again.
                r.orig_rax = nr;
            } else if (r.orig_rax as i64) < 0 && r.rax == sys::SYS_RESTART_SYSCALL as u64 {
                // Not yet in it: at the syscall instruction as the prepare
                // step's release left it. Issue the syscall itself.
                r.rax = nr;
            }
        }
    }

    /// Step 2 begins (the tree is frozen): handlers stop letting writes
    /// through; they hold them until [`Cow::arm_frozen`]. Returns once no
    /// handler is lifting a protection any more.
    pub fn enter_checkpoint(&self) {
        let mut st = self.shared.lock();
        for p in &mut st.procs {
            p.mode = Mode::Hold;
        }
    }

    /// The `VmFlags` bits of `pid`'s areas `maps` (read in the freeze),
    /// from the prepare step, sorted by start; `None` if the layout changed
    /// in a way that needs `smaps` again.
    pub fn vmflags(&self, pid: i32, maps: &[crate::proc::MapsEntry]) -> Option<Vec<(u64, u32)>> {
        let p = self.procs.iter().find(|p| p.pid == pid)?;
        let mut out = Vec::new();
        for m in maps.iter().filter(|m| m.name != "[vsyscall]") {
            if p.layout.binary_search(&(m.start, m.end)).is_ok() {
                if let Ok(i) = p.vmflags.binary_search_by_key(&(m.start, m.end), |f| f.0) {
                    out.push((m.start, p.vmflags[i].1));
                }
            } else if let Some(f) = p
                .vmflags
                .iter()
                .find(|f| f.1 & stasis_sys::vmflags::GROWSDOWN != 0 && f.0 .1 == m.end)
            {
                // A stack that grew down since.
                out.push((m.start, f.1));
            } else {
                return None;
            }
        }
        Some(out)
    }

    /// Step 2 for one frozen process: registers `areas` (areas mapped since
    /// the prepare step are new), protects `unprotected` (pages with data
    /// that lost their protection, or were never given one), and from now
    /// on `data` (page-aligned spans, inside `areas`) is owed. A process the
    /// prepare step did not see (or whose userfaultfd no longer reaches its
    /// memory: it called exec) gets a userfaultfd now. Returns its index
    /// for [`Cow::take_piece`].
    pub fn arm_frozen(
        &mut self,
        fp: &mut FrozenProcess,
        areas: &[(u64, u64)],
        data: &[(u64, u64)],
        unprotected: &[(u64, u64)],
    ) -> Result<usize> {
        let prepared = self.procs.iter().position(|p| p.pid == fp.pid && !p.armed);
        let reuse = prepared.filter(|&i| {
            areas.iter().all(|&(a, b)| {
                self.procs[i]
                    .uffd
                    .register(a, b - a, sys::UFFDIO_REGISTER_MODE_WP)
                    .is_ok()
            })
        });
        if let (Some(i), None) = (prepared, reuse) {
            // Its userfaultfd no longer reaches its memory (it called exec,
            // or the pid is another process's now): forget it.
            self.procs[i].pid = 0;
        }
        let (idx, protect) = match reuse {
            Some(i) => (i, unprotected.to_vec()),
            None => {
                let uffd = create_in(fp)?;
                for &(a, b) in areas {
                    uffd.register(a, b - a, sys::UFFDIO_REGISTER_MODE_WP)?;
                }
                (self.start(fp.pid, uffd)?, data.to_vec())
            }
        };
        self.procs[idx].armed = true;
        // Armed first (no write happens meanwhile: the tree is frozen and
        // the dumper runs nothing in this process any more), then the
        // protection: what step 1 left unprotected, and what the dumper's
        // own remote syscalls made the handler let through.
        let touched = {
            let mut st = self.shared.lock();
            let ps = &mut st.procs[idx];
            ps.unsaved = RangeSet::from_spans(data.iter().copied());
            ps.mode = Mode::Armed;
            std::mem::take(&mut ps.touched)
        };
        let mut protect = RangeSet::from_spans(protect);
        for (a, b) in touched.to_ranges() {
            protect.insert(a, b);
        }
        let data = RangeSet::from_spans(data.iter().copied());
        for (a, b) in protect.to_ranges() {
            for (s, e) in data.intersect(a, b) {
                wp_retry(&*self.procs[idx].uffd, &self.shared.stop, s, e, true)?;
            }
        }
        Ok(idx)
    }

    /// Starts the handler of a process's userfaultfd.
    fn start(&mut self, pid: i32, uffd: Userfaultfd) -> Result<usize> {
        let idx = self.procs.len();
        self.shared.lock().procs.push(ProcState::default());
        let uffd = Arc::new(uffd);
        let mem = Arc::new(ProcessMemory::open_for_snapshot(pid)?);
        let pagemap = Arc::new(Pagemap::open(pid)?);
        let handler = {
            let (shared, uffd, mem, pagemap) = (
                self.shared.clone(),
                uffd.clone(),
                mem.clone(),
                pagemap.clone(),
            );
            std::thread::Builder::new()
                .name(format!("cow-{pid}"))
                .spawn(move || {
                    let h = Handler {
                        idx,
                        pid,
                        shared: &shared,
                        uffd: &uffd,
                        mem: &mem,
                        pagemap: &pagemap,
                        queue: Default::default(),
                        later: Default::default(),
                    };
                    h.run();
                })
                .map_err(|e| CaptureError::Concurrent(format!("starting a fault handler: {e}")))?
        };
        self.procs.push(Proc {
            pid,
            uffd,
            mem,
            pagemap,
            handler: Some(handler),
            vmflags: Vec::new(),
            layout: Vec::new(),
            armed: false,
        });
        Ok(idx)
    }

    /// Takes the page-aligned piece `[a, b)` of process `idx` (inside one
    /// [`PIECE`], every page of it in the plan): the pages handlers saved,
    /// and the unsaved ones read now. Then lifts the piece's protection.
    pub fn take_piece(&self, idx: usize, a: u64, b: u64) -> Result<Vec<u8>> {
        let p = &self.procs[idx];
        let mut buf = vec![0u8; usize::try_from(b - a).unwrap_or(0)];
        // Under the lock: what handlers saved, and a claim on the rest (a
        // write fault in the piece waits for the claim; others go on).
        let (parts, mut covered, freed) = {
            let mut st = self.shared.lock();
            if let Some(l) = &st.lost {
                return Err(CaptureError::CowLost(l.clone()));
            }
            if let Some(b) = &st.broken {
                return Err(CaptureError::Concurrent(b.clone()));
            }
            let (mut covered, mut freed) = (0u64, 0u64);
            let ps = &mut st.procs[idx];
            let side: Vec<u64> = ps.side.range(a..b).map(|(&s, _)| s).collect();
            for s in side {
                if let Some(data) = ps.side.remove(&s) {
                    let off = usize::try_from(s - a).unwrap_or(0);
                    buf[off..off + data.len()].copy_from_slice(&data);
                    covered += data.len() as u64;
                    freed += data.len() as u64;
                }
            }
            let parts = ps.unsaved.intersect(a, b);
            for &(s, e) in &parts {
                ps.unsaved.remove(s, e);
            }
            ps.claimed = Some((a, b));
            (parts, covered, freed)
        };
        // The claimed pages are protected and no handler lifts that until
        // the claim ends: they read as at the freeze.
        let mut failed = None;
        for &(s, e) in &parts {
            let off = usize::try_from(s - a).unwrap_or(0);
            let len = usize::try_from(e - s).unwrap_or(0);
            if let Err(err) = p.mem.read_forced(s, &mut buf[off..off + len]) {
                failed = Some(format!(
                    "reading [{s:#x}, {e:#x}) failed ({err}): the process unmapped it during the copy"
                ));
                break;
            }
            covered += e - s;
        }
        let failed = failed.or_else(|| still_protected(&p.pagemap, &parts));
        {
            let mut st = self.shared.lock();
            st.procs[idx].claimed = None;
            st.side_bytes -= freed;
            self.shared.room.notify_all();
            if let Some(why) = failed {
                return Err(self.lose(&mut st, p.pid, why));
            }
            if covered != b - a {
                let why = format!(
                    "pages of [{a:#x}, {b:#x}) were discarded by the process before they were saved"
                );
                return Err(self.lose(&mut st, p.pid, why));
            }
        }
        if !self.shared.tracking {
            wp_retry(&*p.uffd, &self.shared.stop, a, b, false)?;
        }
        Ok(buf)
    }

    fn lose(&self, st: &mut State, pid: i32, why: String) -> CaptureError {
        let l = st.lost.get_or_insert(CowLost { pid, why }).clone();
        self.shared.room.notify_all();
        CaptureError::CowLost(l)
    }

    /// Ends the copy: stops the handlers (each reads what is queued first)
    /// and closes the userfaultfds, which lifts every protection left.
    /// Returns an error if the process discarded a page not yet saved.
    pub fn finish(mut self) -> Result<CowFigures> {
        self.stop();
        self.figures()
    }

    fn figures(&self) -> Result<CowFigures> {
        let st = self.shared.lock();
        if let Some(l) = &st.lost {
            return Err(CaptureError::CowLost(l.clone()));
        }
        if let Some(b) = &st.broken {
            return Err(CaptureError::Concurrent(b.clone()));
        }
        let owed: u64 = st.procs.iter().map(|p| p.unsaved.bytes()).sum();
        if owed > 0 {
            return Err(CaptureError::Concurrent(format!(
                "{owed} bytes were neither copied nor saved on write (an internal error)"
            )));
        }
        let mut lat = st.latencies_ns.clone();
        lat.sort_unstable();
        // Nearest rank: the sample at or below which `pct`% of them lie.
        let pct = |pct: usize| -> f64 {
            match lat.len() {
                0 => 0.0,
                n => lat[((n - 1) * pct).div_ceil(100).min(n - 1)] as f64 / 1000.0,
            }
        };
        Ok(CowFigures {
            faults: st.faults,
            p50_us: pct(50),
            p99_us: pct(99),
            max_us: pct(100),
            side_peak: st.side_peak,
            waits: st.waits,
            wait_us: st.wait_ns / 1000,
            prepare_stop_us: self.prepare_stop_us,
        })
    }

    /// Tracking ([`CowTracking`]): ends the copy but keeps the
    /// protection and the handlers, which go back to letting writes
    /// through (each written page loses its protection: the next dump's
    /// dirty set). Errors as [`Cow::finish`].
    pub fn end_copy(&mut self) -> Result<CowFigures> {
        let figures = self.figures()?;
        let mut st = self.shared.lock();
        for p in &mut st.procs {
            *p = ProcState::default();
        }
        st.side_bytes = 0;
        st.side_peak = 0;
        st.faults = 0;
        st.latencies_ns.clear();
        st.waits = 0;
        st.wait_ns = 0;
        self.shared.room.notify_all();
        drop(st);
        for p in &mut self.procs {
            p.armed = false;
        }
        self.prepare_stop_us = 0;
        self.restarts.clear();
        Ok(figures)
    }

    /// Whether the protection is kept between dumps ([`CowTracking`]).
    pub fn is_tracking(&self) -> bool {
        self.shared.tracking
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.room.notify_all();
        for p in &mut self.procs {
            if let Some(h) = p.handler.take() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Cow {
    fn drop(&mut self) {
        // Handlers first (they hold the descriptors), then the
        // descriptors: closing the last one unregisters everything.
        self.stop();
    }
}

/// Checks, after a read, that the pages of `parts` are still registered
/// and write-protected (so what was read is the freeze instant's content,
/// not a new mapping put there after an unmap). Returns why not.
fn still_protected(pm: &Pagemap, parts: &[(u64, u64)]) -> Option<String> {
    for &(s, e) in parts {
        match pm.scan(s, e, ScanQuery::wp_protected()) {
            Ok(r) if r.len() == 1 && r[0].start == s && r[0].end == e => {}
            Ok(_) => {
                return Some(format!(
                    "[{s:#x}, {e:#x}) lost its protection before it was saved: the process unmapped or moved it"
                ))
            }
            Err(err) => {
                return Some(format!(
                    "[{s:#x}, {e:#x}) could not be checked ({err}): the process unmapped it"
                ))
            }
        }
    }
    None
}

/// Sets (`protect`) or lifts the protection of `[a, b)` (lifting wakes
/// its writers). `EAGAIN` (an event waits to be read by the handler) is
/// retried until `stop`; `ENOENT` (part of the range is no longer
/// registered: unmapped, which the handler judges) and `ESRCH` (the
/// process is gone) are not errors.
fn wp_retry(pages: &dyn Pages, stop: &AtomicBool, a: u64, b: u64, protect: bool) -> Result<()> {
    let t0 = Instant::now();
    loop {
        match pages.write_protect(a, b - a, protect) {
            Ok(()) => return Ok(()),
            Err(libc::EAGAIN) if t0.elapsed() < Duration::from_secs(10) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            Err(libc::ENOENT | libc::ESRCH) => return Ok(()),
            Err(errno) => {
                return Err(errno_err(
                    format!("lifting the write-protection of [{a:#x}, {b:#x})"),
                    errno,
                ))
            }
        }
    }
}

fn errno_err(what: String, errno: i32) -> CaptureError {
    CaptureError::Concurrent(format!(
        "{what}: {}",
        std::io::Error::from_raw_os_error(errno)
    ))
}

/// Creates a userfaultfd inside the frozen process and takes it out
/// ([`stasis_kernel::uffd_remote`]).
fn create_in(fp: &mut FrozenProcess) -> Result<Userfaultfd> {
    use stasis_kernel::uffd_remote::{self, UffdRemoteError};
    let pid = fp.pid;
    let mut remote = crate::remote::ThreadRemote::new(&mut fp.threads[0]);
    uffd_remote::create_in(&mut remote, pid, "userfaultfd (concurrent dump)", FEATURES).map_err(
        |e| match e {
            UffdRemoteError::Missing { granted, .. } => KernelError::Unsupported {
                feature: "userfaultfd unmap/remove/remap events",
                why: format!("process {pid}: the kernel granted {granted:#x}"),
            }
            .into(),
            e => e.into_kernel().into(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_kernel::seam::{PageCall, PageRecorder};

    #[test]
    fn protection_is_retried_past_an_event_and_an_unmapped_range_is_no_error() {
        let f = PageRecorder::default();
        let stop = AtomicBool::new(false);
        f.fail_once(libc::EAGAIN);
        wp_retry(&f, &stop, 0x1000, 0x3000, true).unwrap();
        assert_eq!(
            f.calls(),
            vec![
                PageCall::Protect {
                    start: 0x1000,
                    len: 0x2000,
                    protect: true
                };
                2
            ]
        );
        f.fail_always(libc::ENOENT);
        wp_retry(&f, &stop, 0x1000, 0x3000, false).unwrap();
        let f = PageRecorder::default();
        f.fail_always(libc::EIO);
        let e = wp_retry(&f, &stop, 0x1000, 0x3000, false).unwrap_err();
        assert!(e.to_string().contains("[0x1000, 0x3000)"), "{e}");
    }

    #[test]
    fn a_stopped_copy_gives_up_retrying() {
        let f = PageRecorder::default();
        f.fail_always(libc::EAGAIN);
        let stop = AtomicBool::new(true);
        wp_retry(&f, &stop, 0, 0x1000, true).unwrap();
        assert_eq!(f.calls().len(), 1);
    }
}
