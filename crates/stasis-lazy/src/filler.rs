//! The filler: serves the page faults of lazily restored processes and
//! streams the rest of their pages in behind them.
//!
//! One thread (the caller of [`serve`]) reads the control socket and every
//! userfaultfd: a fault is served at once, with the whole pack run around
//! the page (one checksum-verified read, a few hundred pages mapped in one
//! `UFFDIO_COPY`); layout events update the bookkeeping ([`Space`]).
//! Copier threads take what is still pending, touch-set pages first, then
//! in address order, and map it the same way. A page is never left missing:
//! the filler exits only when every space owes nothing, and if a run cannot
//! be read (the page server went away, a checksum fails) it kills the
//! restored tree rather than let the kernel hand out zero pages.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::Serialize;
use stasis_image::RunEntry;
use stasis_kernel::uffd::{Event, FillError, Userfaultfd};

use crate::control::{self, Msg};
use crate::source::{Catalog, RunSource};
use crate::state::{Owed, Space};
use crate::LazyError;

const PAGE: u64 = 4096;

/// How the filler runs.
#[derive(Debug, Default)]
pub struct Config {
    /// Copier threads (at least 1).
    pub threads: usize,
    /// Image pages to send first, per image pid, in order (a touch set).
    pub order: HashMap<i32, Vec<u64>>,
    /// Cap on the background streaming rate, bytes per second (0: none).
    /// Faults are never held back.
    pub bandwidth: u64,
    /// The guard to give each userfaultfd to (see [`crate::guard`]).
    pub guard: Option<crate::guard::Guard>,
}

/// What the filler did, for `--stats-file` and the benchmarks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub processes: usize,
    pub forks: u64,
    /// Faults served with image pages, and their service time.
    pub faults: u64,
    pub fault_p50_us: u64,
    pub fault_p99_us: u64,
    pub fault_max_us: u64,
    /// Faults on pages the image holds nothing for (zero pages).
    pub zero_faults: u64,
    pub pages_by_fault: u64,
    pub pages_streamed: u64,
    /// Microseconds from the first hand-over until nothing was owed.
    pub fill_us: u64,
    /// Image pages of each process in the order they first faulted.
    #[serde(skip)]
    pub fault_order: HashMap<i32, Vec<u64>>,
    pub aborted: bool,
}

struct Entry {
    uffd: Arc<Userfaultfd>,
    image_pid: i32,
    /// PID of a handed-over process (forked children have none: they are
    /// found as descendants when the tree must be killed).
    pid: Option<i32>,
    /// A pidfd of it, so that a late kill never hits a reused PID.
    pidfd: Option<OwnedFd>,
    space: Space,
    dead: bool,
    /// Next index into the touch order of `image_pid`.
    cursor: usize,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// No more work will come (the main loop is finishing).
    closing: bool,
    failure: Option<String>,
    rr: usize,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
    catalog: Catalog,
    source: Box<dyn RunSource>,
    order: HashMap<i32, Vec<u64>>,
    streamed: AtomicU64,
    bandwidth: u64,
    started: Instant,
    /// Faults being fetched right now: copiers start no new fetch
    /// meanwhile, so a fault does not share the disk or link with them.
    faulting: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// A piece claimed for one copy.
struct Job {
    entry: usize,
    uffd: Arc<Userfaultfd>,
    id: u64,
    len: u64,
    pack: usize,
    run: RunEntry,
}

/// The last run read by a thread (faults and copies often hit the same run).
#[derive(Default)]
struct RunCache {
    key: Option<(usize, u64)>,
    buf: Vec<u8>,
}

impl RunCache {
    fn get(&mut self, sh: &Shared, pack: usize, run: &RunEntry) -> Result<&[u8], String> {
        if self.key != Some((pack, run.file_off)) {
            self.key = None;
            self.buf.resize(usize::try_from(run.len()).unwrap_or(0), 0);
            sh.source.read_run(&sh.catalog, pack, run, &mut self.buf)?;
            self.key = Some((pack, run.file_off));
        }
        Ok(&self.buf)
    }
}

/// Claims the part of pending piece around image address `img` that one
/// run provides.
fn claim_around(
    sh: &Shared,
    st: &mut State,
    i: usize,
    cur_page: u64,
) -> Result<Option<Job>, String> {
    let e = &mut st.entries[i];
    let Owed::Image(p) = e.space.owed(cur_page) else {
        return Ok(None);
    };
    let img = p.img + (cur_page - p.start);
    let loc = sh.catalog.locate(e.image_pid, img).ok_or_else(|| {
        format!(
            "the image has no run for page {img:#x} of process {}",
            e.image_pid
        )
    })?;
    let a = loc.lo.max(p.img);
    let b = loc.hi.min(p.img + (p.end - p.start));
    let cur = p.start + (a - p.img);
    let Some((id, piece)) = e.space.claim(cur, cur + (b - a)) else {
        return Ok(None);
    };
    Ok(Some(Job {
        entry: i,
        uffd: e.uffd.clone(),
        id,
        len: piece.end - piece.start,
        pack: loc.pack,
        run: loc.run,
    }))
}

enum Delivered {
    Landed,
    /// An event is waiting to be read: try again after it.
    Again(u64),
    /// The process's memory is gone.
    Gone,
    /// The range is not registered (any more) at that address.
    NotMapped(u64),
}

/// Copies what flight `job` still owes (its piece less what the process
/// dropped meanwhile) from `data`, the run's bytes, and records the
/// outcome. Runs under the state lock, which the main loop also holds from
/// reading layout events until they are applied: a `MADV_DONTNEED` either
/// is still unread (the kernel then refuses the copy with `EAGAIN`) or is
/// already taken out of the flight, so no page the process dropped is ever
/// filled again with stale image data.
fn deliver_locked(st: &mut State, job: &Job, data: &[u8]) -> Result<(Delivered, bool), String> {
    let pieces = st.entries[job.entry].space.in_flight(job.id);
    let mut done = 0u64;
    let mut at = 0u64;
    let mut outcome = Delivered::Landed;
    for p in &pieces {
        let d = deliver_piece(job, p, data)?;
        match d {
            Delivered::Landed => done += p.end - p.start,
            Delivered::Again(n) => {
                outcome = Delivered::Again(done + n);
                break;
            }
            Delivered::NotMapped(n) => {
                outcome = Delivered::NotMapped(done + n);
                at = p.start + n;
                break;
            }
            Delivered::Gone => {
                outcome = Delivered::Gone;
                break;
            }
        }
    }
    let landed = settle(st, job, &outcome, at);
    Ok((outcome, landed))
}

fn deliver_piece(job: &Job, p: &crate::state::Piece, data: &[u8]) -> Result<Delivered, String> {
    let off = usize::try_from(p.img - job.run.vaddr).unwrap_or(usize::MAX);
    let len = usize::try_from(p.end - p.start).unwrap_or(0);
    let data = off
        .checked_add(len)
        .and_then(|end| data.get(off..end))
        .ok_or_else(|| format!("run {:#x} is shorter than the piece", job.run.vaddr))?;
    // One UFFDIO_COPY must stay inside one area: if the process split the
    // area (an mprotect on part of it) since, the copy is refused as if the
    // range were unmapped. Then go on page by page, and only a single page
    // that is refused is really gone.
    let page = usize::try_from(PAGE).unwrap_or(4096);
    let mut single = false;
    let mut pos = 0usize;
    while pos < len {
        let end = if single { (pos + page).min(len) } else { len };
        match job.uffd.copy(p.start + pos as u64, &data[pos..end]) {
            Ok(()) => pos = end,
            Err(FillError { done, errno }) => {
                pos += usize::try_from(done).unwrap_or(0);
                match errno {
                    // That page is there already (copied before a fork):
                    // skip it.
                    libc::EEXIST => pos += page,
                    libc::EAGAIN => return Ok(Delivered::Again(pos as u64)),
                    libc::ESRCH => return Ok(Delivered::Gone),
                    libc::ENOENT | libc::EINVAL | libc::EFAULT if !single && len - pos > page => {
                        single = true;
                    }
                    libc::ENOENT | libc::EINVAL | libc::EFAULT => {
                        return Ok(Delivered::NotMapped(pos as u64))
                    }
                    e => {
                        return Err(format!(
                            "UFFDIO_COPY at {:#x}: {}",
                            p.start + pos as u64,
                            std::io::Error::from_raw_os_error(e)
                        ))
                    }
                }
            }
        }
    }
    Ok(Delivered::Landed)
}

/// Records the outcome of a copy. Returns true if it landed.
/// `at`: for `NotMapped`, the address of the page that was refused.
fn settle(st: &mut State, job: &Job, d: &Delivered, at: u64) -> bool {
    let e = &mut st.entries[job.entry];
    match *d {
        Delivered::Landed => {
            e.space.landed(job.id);
            true
        }
        Delivered::Again(done) => {
            e.space.failed(job.id, done);
            false
        }
        Delivered::Gone => {
            e.dead = true;
            e.space = Space::default();
            false
        }
        Delivered::NotMapped(done) => {
            e.space.failed(job.id, done);
            // Not moved by a remap meanwhile: that page is gone, and no
            // fault will ever come for it (the rest is tried again).
            if let Owed::Image(p) = e.space.owed(at) {
                if p.start == at {
                    e.space.remove(at, at + PAGE);
                }
            }
            false
        }
    }
}

fn next_job(sh: &Shared, st: &mut State) -> Result<Option<Job>, String> {
    let n = st.entries.len();
    for k in 0..n {
        let i = (st.rr + k) % n;
        let e = &mut st.entries[i];
        if e.dead || !e.space.has_pending() {
            continue;
        }
        let mut target = None;
        if let Some(order) = sh.order.get(&e.image_pid) {
            while e.cursor < order.len() && target.is_none() {
                let img = order[e.cursor];
                e.cursor += 1;
                target = e
                    .space
                    .pending_for_img(img)
                    .map(|p| p.start + (img - p.img));
            }
        }
        let target = match target.or_else(|| e.space.first_pending().map(|p| p.start)) {
            Some(t) => t,
            None => continue,
        };
        st.rr = i + 1;
        if let Some(job) = claim_around(sh, st, i, target)? {
            return Ok(Some(job));
        }
    }
    Ok(None)
}

fn copier(sh: Arc<Shared>) {
    let mut cache = RunCache::default();
    loop {
        let job = {
            let mut st = sh.lock();
            loop {
                if st.closing || st.failure.is_some() {
                    return;
                }
                match next_job(&sh, &mut st) {
                    Ok(Some(j)) => break j,
                    Ok(None) => {
                        st = match sh.cv.wait_timeout(st, Duration::from_millis(50)) {
                            Ok((g, _)) => g,
                            Err(p) => p.into_inner().0,
                        };
                    }
                    Err(msg) => {
                        st.failure = Some(msg);
                        return;
                    }
                }
            }
        };
        // Faults first: start no fetch (for up to a second) while one is
        // being fetched.
        let t_wait = Instant::now();
        while sh.faulting.load(Ordering::Acquire) > 0 && t_wait.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let (d, landed) = match cache
            .get(&sh, job.pack, &job.run)
            .and_then(|data| deliver_locked(&mut sh.lock(), &job, data))
        {
            Ok(x) => x,
            Err(msg) => {
                let mut st = sh.lock();
                st.entries[job.entry].space.failed(job.id, 0);
                st.failure.get_or_insert(msg);
                return;
            }
        };
        if landed {
            let pages = sh.streamed.fetch_add(job.len / PAGE, Ordering::Relaxed) + job.len / PAGE;
            if sh.bandwidth > 0 {
                // Stay under the cap: sleep until the bytes sent so far
                // are due at that rate.
                #[allow(clippy::cast_precision_loss)]
                let due = Duration::from_secs_f64((pages * PAGE) as f64 / sh.bandwidth as f64);
                if let Some(wait) = due.checked_sub(sh.started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        } else if matches!(d, Delivered::Again(_)) {
            // Let the main thread read the event first.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Kills every handed-over process and its descendants.
fn kill_tree(st: &State) -> Vec<i32> {
    let roots: Vec<i32> = st.entries.iter().filter_map(|e| e.pid).collect();
    kill_pids(&roots)
}

/// Kills the handed-over processes that still live, and their
/// descendants (the restorer ended without saying the tree runs).
fn kill_unfinished(sh: &Shared) -> Vec<i32> {
    use stasis_kernel::pidfd::pidfd_send_signal;
    let st = sh.lock();
    let live: Vec<(i32, &OwnedFd)> = st
        .entries
        .iter()
        .filter_map(|e| Some((e.pid?, e.pidfd.as_ref()?)))
        .filter(|(pid, fd)| pidfd_send_signal(fd, *pid, 0).is_ok())
        .collect();
    let roots: Vec<i32> = live.iter().map(|(p, _)| *p).collect();
    let killed = kill_pids(&roots);
    for (pid, fd) in live {
        let _ = pidfd_send_signal(fd, pid, libc::SIGKILL);
    }
    killed
}

/// SIGKILLs `roots` and all their descendants; returns who was signalled.
pub(crate) fn kill_pids(roots: &[i32]) -> Vec<i32> {
    let mut todo: Vec<i32> = roots.to_vec();
    let mut all = Vec::new();
    while let Some(pid) = todo.pop() {
        if all.contains(&pid) {
            continue;
        }
        all.push(pid);
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                todo.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<i32>().ok()),
                );
            }
        }
    }
    for &pid in &all {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    all
}

/// Outcome of serving one fault.
enum Fault {
    Served,
    /// Try again after the pending events (or wait for the copy in flight).
    Later,
}

fn serve_fault(
    sh: &Shared,
    cache: &mut RunCache,
    stats: &mut Stats,
    lat: &mut Vec<u64>,
    i: usize,
    addr: u64,
    t0: Instant,
) -> Result<Fault, String> {
    let page = addr & !(PAGE - 1);
    // One look under the lock: what the page is owed, and for image
    // content the run around it, claimed.
    let (owed, job, uffd, image_pid) = {
        let mut st = sh.lock();
        let e = &st.entries[i];
        if e.dead {
            return Ok(Fault::Served);
        }
        let (owed, uffd, image_pid) = (e.space.owed(page), e.uffd.clone(), e.image_pid);
        let job = match owed {
            Owed::Image(_) => claim_around(sh, &mut st, i, page)?,
            _ => None,
        };
        (owed, job, uffd, image_pid)
    };
    match owed {
        Owed::InFlight => Ok(Fault::Later),
        Owed::Zero => match uffd.zeropage(page, PAGE) {
            Ok(()) => {
                stats.zero_faults += 1;
                Ok(Fault::Served)
            }
            Err(FillError {
                errno: libc::EEXIST,
                ..
            }) => {
                let _ = uffd.wake(page, PAGE);
                Ok(Fault::Served)
            }
            Err(FillError {
                errno: libc::EAGAIN,
                ..
            }) => Ok(Fault::Later),
            // Moved or unmapped since the fault: the thread retries and
            // finds what is there now.
            Err(FillError {
                errno: libc::ENOENT | libc::EINVAL | libc::EFAULT,
                ..
            }) => {
                let _ = uffd.wake(page, PAGE);
                Ok(Fault::Served)
            }
            Err(FillError {
                errno: libc::ESRCH, ..
            }) => {
                let mut st = sh.lock();
                st.entries[i].dead = true;
                st.entries[i].space = Space::default();
                Ok(Fault::Served)
            }
            Err(FillError { errno, .. }) => Err(format!(
                "UFFDIO_ZEROPAGE at {page:#x}: {}",
                std::io::Error::from_raw_os_error(errno)
            )),
        },
        Owed::Image(p) => {
            let Some(job) = job else {
                return Ok(Fault::Later);
            };
            sh.faulting.fetch_add(1, Ordering::AcqRel);
            let fetched = cache
                .get(sh, job.pack, &job.run)
                .and_then(|data| deliver_locked(&mut sh.lock(), &job, data));
            sh.faulting.fetch_sub(1, Ordering::AcqRel);
            let (d, landed) = match fetched {
                Ok(x) => x,
                Err(msg) => {
                    sh.lock().entries[i].space.failed(job.id, 0);
                    return Err(msg);
                }
            };
            if landed {
                let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                lat.push(us);
                stats.faults += 1;
                stats.pages_by_fault += job.len / PAGE;
                let img = p.img + (page - p.start);
                stats.fault_order.entry(image_pid).or_default().push(img);
                Ok(Fault::Served)
            } else if matches!(d, Delivered::Gone | Delivered::NotMapped(_)) {
                Ok(Fault::Served)
            } else {
                Ok(Fault::Later)
            }
        }
    }
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let k = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[k.min(sorted.len() - 1)]
}

/// Serves the restorer on `control` until the restored tree owes nothing
/// (or the restore is aborted). Sends `ready` first.
pub fn serve(
    control: OwnedFd,
    catalog: Catalog,
    source: Box<dyn RunSource>,
    cfg: Config,
) -> Result<Stats, LazyError> {
    let pages: u64 = catalog.packs.iter().map(|p| p.reader.pages()).sum();
    control::send(control.as_fd(), &Msg::Ready { pages }, None)?;
    let sh = Arc::new(Shared {
        st: Mutex::new(State::default()),
        cv: Condvar::new(),
        catalog,
        source,
        order: cfg.order,
        streamed: AtomicU64::new(0),
        bandwidth: cfg.bandwidth,
        started: Instant::now(),
        faulting: AtomicUsize::new(0),
    });
    let copiers: Vec<_> = (0..cfg.threads.max(1))
        .map(|_| {
            let sh = sh.clone();
            std::thread::spawn(move || copier(sh))
        })
        .collect();
    let guard = cfg.guard;
    let result = main_loop(&sh, &control, guard.as_ref());
    if let Err(e @ LazyError::Fetch { .. }) = &result {
        // A restorer still building the tree learns why it died (it may
        // be gone already: then this goes nowhere).
        let _ = control::send(control.as_fd(), &Msg::Error(e.to_string()), None);
    }
    {
        let mut st = sh.lock();
        st.closing = true;
    }
    sh.cv.notify_all();
    for c in copiers {
        let _ = c.join();
    }
    if let Some(g) = &guard {
        // Nothing is owed, or the tree is being killed (by us after a
        // failed fetch, by the restorer after an abort): let go.
        g.done();
    }
    let mut stats = result?;
    stats.pages_streamed = sh.streamed.load(Ordering::Relaxed);
    Ok(stats)
}

fn main_loop(
    sh: &Arc<Shared>,
    control: &OwnedFd,
    guard: Option<&crate::guard::Guard>,
) -> Result<Stats, LazyError> {
    let mut stats = Stats::default();
    let mut lat = Vec::new();
    let mut cache = RunCache::default();
    let mut control_open = true;
    let mut done = false;
    let mut first_hand: Option<Instant> = None;
    // (entry, address, when first seen)
    let mut later: Vec<(usize, u64, Instant)> = Vec::new();
    let mut events = Vec::new();
    let mut markers = Vec::new();
    loop {
        let failure = sh.lock().failure.clone();
        if let Some(msg) = failure {
            return Err(fail(sh, &msg));
        }
        let uffds: Vec<(usize, Arc<Userfaultfd>)> = sh
            .lock()
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.dead)
            .map(|(i, e)| (i, e.uffd.clone()))
            .collect();
        let ready: Vec<bool> = {
            let mut pfds = Vec::with_capacity(uffds.len() + 1);
            if control_open {
                pfds.push(PollFd::new(control.as_fd(), PollFlags::POLLIN));
            }
            pfds.extend(
                uffds
                    .iter()
                    .map(|(_, u)| PollFd::new(u.fd().as_fd(), PollFlags::POLLIN)),
            );
            let timeout = if later.is_empty() { 50u16 } else { 1 };
            match poll(&mut pfds, PollTimeout::from(timeout)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(LazyError::Control(format!("poll: {e}"))),
            }
            pfds.iter().map(|p| p.any().unwrap_or(false)).collect()
        };
        let mut k = 0;
        if control_open {
            k = 1;
            if ready[0] {
                match control::recv(control.as_fd())? {
                    Some((Msg::Hand(h), Some(fd))) => {
                        first_hand.get_or_insert_with(Instant::now);
                        let uffd = Userfaultfd::from_fd(fd, 0);
                        if let Some(g) = guard {
                            g.watch(Some(h.pid), &uffd)?;
                        }
                        // Dumps of this process wait while this is bound.
                        markers.extend(busy_marker(h.pid));
                        let owed = stasis_image::chain::intersect(
                            &stasis_image::chain::normalize(h.areas.clone()),
                            &sh.catalog.data_ranges(h.image_pid),
                        );
                        let mut st = sh.lock();
                        st.entries.push(Entry {
                            uffd: Arc::new(uffd),
                            image_pid: h.image_pid,
                            pid: Some(h.pid),
                            pidfd: stasis_kernel::pidfd::pidfd_open(h.pid).ok(),
                            space: Space::new(&owed),
                            dead: false,
                            cursor: 0,
                        });
                        stats.processes += 1;
                        drop(st);
                        sh.cv.notify_all();
                    }
                    Some((Msg::Done(_), _)) => {
                        done = true;
                        control_open = false;
                    }
                    Some((Msg::Abort(_), _)) => {
                        // The restorer killed and reaped the tree itself.
                        stats.aborted = true;
                        return Ok(stats);
                    }
                    None => {
                        // The restorer is gone (killed) without saying the
                        // tree runs: what it had already let go of must not
                        // run on half-filled.
                        stats.aborted = true;
                        let killed = kill_unfinished(sh);
                        if killed.is_empty() {
                            return Ok(stats);
                        }
                        return Err(LazyError::Filler(format!(
                            "the restorer ended before the restore was complete; the restored tree ({} processes: {killed:?}) was killed, since it had not received all of its memory",
                            killed.len()
                        )));
                    }
                    Some((other, _)) => {
                        return Err(LazyError::Control(format!("unexpected frame {other:?}")))
                    }
                }
            }
        }
        for (j, (i, uffd)) in uffds.iter().enumerate() {
            if !ready[k + j] {
                continue;
            }
            events.clear();
            // Read and apply under the lock (see `deliver_locked`): the
            // kernel lets copies through again as soon as an event is
            // read, before it has been applied here.
            let mut st = sh.lock();
            if let Err(e) = uffd.read_events(&mut events) {
                tracing::debug!("userfaultfd of entry {i}: {e}");
                continue;
            }
            let now = Instant::now();
            let mut forked = false;
            // Layout events first: faults read in the same batch are served
            // against the layout that follows them.
            for ev in events.drain(..) {
                match ev {
                    Event::PageFault { addr, .. } => later.push((*i, addr, now)),
                    Event::Fork(child) => {
                        if let Some(g) = guard {
                            g.watch(None, &child)?;
                        }
                        let parent = &st.entries[*i];
                        let e = Entry {
                            uffd: Arc::new(child),
                            image_pid: parent.image_pid,
                            pid: None,
                            pidfd: None,
                            space: parent.space.forked(),
                            dead: false,
                            cursor: parent.cursor,
                        };
                        st.entries.push(e);
                        stats.forks += 1;
                        forked = true;
                    }
                    Event::Remap { from, to, len } => st.entries[*i].space.remap(from, to, len),
                    Event::Remove { start, end } | Event::Unmap { start, end } => {
                        st.entries[*i].space.remove(start, end);
                    }
                    Event::Unknown(code) => tracing::warn!("unknown userfaultfd event {code:#x}"),
                }
            }
            drop(st);
            if forked {
                sh.cv.notify_all();
            }
        }
        // Faults (new ones and those that had to wait).
        let pending = std::mem::take(&mut later);
        for (i, addr, t0) in pending {
            match serve_fault(sh, &mut cache, &mut stats, &mut lat, i, addr, t0) {
                Ok(Fault::Served) => {}
                Ok(Fault::Later) => later.push((i, addr, t0)),
                Err(msg) => return Err(fail(sh, &msg)),
            }
        }
        if done && later.is_empty() {
            let st = sh.lock();
            if st.entries.iter().all(|e| e.dead || e.space.is_done()) {
                break;
            }
        }
    }
    lat.sort_unstable();
    stats.fault_p50_us = percentile(&lat, 0.5);
    stats.fault_p99_us = percentile(&lat, 0.99);
    stats.fault_max_us = lat.last().copied().unwrap_or(0);
    stats.fill_us = first_hand
        .map(|t| u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Ok(stats)
}

/// Binds the abstract socket that tells a dump the process is still being
/// filled (released when the filler exits).
fn busy_marker(pid: i32) -> Option<std::os::unix::net::UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let name = stasis_kernel::lazy_fill_socket_name(pid);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    std::os::unix::net::UnixDatagram::bind_addr(&addr).ok()
}

/// A page cannot be delivered: kill the tree (never let it read zeros).
fn fail(sh: &Shared, msg: &str) -> LazyError {
    let st = sh.lock();
    let killed = kill_tree(&st);
    LazyError::Fetch {
        from: sh.source.describe(),
        why: msg.to_string(),
        killed,
    }
}
