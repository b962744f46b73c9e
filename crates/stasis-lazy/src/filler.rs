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
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::Serialize;
use stasis_kernel::uffd::{Event, Userfaultfd};

use crate::control::{self, Msg};
use crate::deliver::{
    claim_around, copier, deliver_locked, serve_zero, Delivered, DeliveryError, RunCache, Zeroed,
};
use crate::kill::{kill_tree, kill_unfinished};
use crate::source::{Catalog, RunSource};
use crate::state::{Owed, Space};
use crate::LazyError;

pub(crate) use crate::kill::kill_pids;

pub(crate) const PAGE: u64 = 4096;

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

impl Stats {
    /// The order pages faulted in, as a touch set: the best guess for the
    /// next restore of the same checkpoint. `None` when the fill was
    /// aborted or nothing faulted.
    pub fn fault_touch_set(&self) -> Option<stasis_image::touch::TouchSet> {
        if self.aborted || self.faults == 0 {
            return None;
        }
        let mut procs: Vec<(i32, Vec<(u64, u32)>)> = self
            .fault_order
            .iter()
            .map(|(pid, pages)| (*pid, stasis_image::touch::TouchSet::ranges_of(pages)))
            .collect();
        procs.sort_unstable_by_key(|p| p.0);
        Some(stasis_image::touch::TouchSet {
            source: stasis_image::touch::TouchSource::Faults,
            window_ms: 0,
            procs,
        })
    }

    /// What `--stats-file` holds for the filler's `result`: the statistics
    /// and `total_us`, or the error.
    pub fn report(result: &Result<Stats, LazyError>, total_us: u64) -> serde_json::Value {
        match result {
            Ok(s) => {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["total_us"] = total_us.into();
                v
            }
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        }
    }
}

pub(crate) struct Entry {
    pub(crate) uffd: Arc<Userfaultfd>,
    pub(crate) image_pid: i32,
    /// PID of a handed-over process (forked children have none: they are
    /// found as descendants when the tree must be killed).
    pub(crate) pid: Option<i32>,
    /// A pidfd of it, so that a late kill never hits a reused PID.
    pub(crate) pidfd: Option<OwnedFd>,
    pub(crate) space: Space,
    pub(crate) dead: bool,
    /// Next index into the touch order of `image_pid`.
    pub(crate) cursor: usize,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) entries: Vec<Entry>,
    /// No more work will come (the main loop is finishing).
    pub(crate) closing: bool,
    pub(crate) failure: Option<DeliveryError>,
    pub(crate) rr: usize,
}

pub(crate) struct Shared {
    pub(crate) st: Mutex<State>,
    pub(crate) cv: Condvar,
    pub(crate) catalog: Catalog,
    pub(crate) source: Box<dyn RunSource>,
    pub(crate) order: HashMap<i32, Vec<u64>>,
    pub(crate) streamed: AtomicU64,
    pub(crate) bandwidth: u64,
    pub(crate) started: Instant,
    /// Faults being fetched right now: copiers start no new fetch
    /// meanwhile, so a fault does not share the disk or link with them.
    pub(crate) faulting: AtomicUsize,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        match self.st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
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
) -> Result<Fault, DeliveryError> {
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
        Owed::Zero => match serve_zero(&*uffd, page)? {
            Zeroed::Filled => {
                stats.zero_faults += 1;
                Ok(Fault::Served)
            }
            Zeroed::Woken => Ok(Fault::Served),
            Zeroed::Later => Ok(Fault::Later),
            Zeroed::Gone => {
                let mut st = sh.lock();
                st.entries[i].dead = true;
                st.entries[i].space = Space::default();
                Ok(Fault::Served)
            }
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

/// The main loop's own state.
#[derive(Default)]
struct Loop {
    stats: Stats,
    /// Service time of every fault served with image pages.
    lat: Vec<u64>,
    cache: RunCache,
    control_open: bool,
    /// The restorer said the tree runs.
    done: bool,
    first_hand: Option<Instant>,
    /// Faults to serve: (entry, address, when first seen).
    later: Vec<(usize, u64, Instant)>,
    events: Vec<Event>,
    /// Busy markers of the handed-over processes (see [`busy_marker`]).
    markers: Vec<std::os::unix::net::UnixDatagram>,
}

fn main_loop(
    sh: &Arc<Shared>,
    control: &OwnedFd,
    guard: Option<&crate::guard::Guard>,
) -> Result<Stats, LazyError> {
    let mut lp = Loop {
        control_open: true,
        ..Loop::default()
    };
    loop {
        let failure = sh.lock().failure.as_ref().map(ToString::to_string);
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
        let ready = lp.wait_ready(control, &uffds)?;
        let mut k = 0;
        if lp.control_open {
            k = 1;
            if ready[0] {
                if let Some(stats) = lp.on_control(sh, control, guard)? {
                    return Ok(stats);
                }
            }
        }
        lp.on_events(sh, &uffds, &ready[k..], guard)?;
        lp.serve_faults(sh)?;
        if lp.done && lp.later.is_empty() {
            let st = sh.lock();
            if st.entries.iter().all(|e| e.dead || e.space.is_done()) {
                break;
            }
        }
    }
    Ok(lp.finish())
}

impl Loop {
    /// Polls the control socket (while open) and every userfaultfd; returns
    /// which are readable, in that order.
    fn wait_ready(
        &self,
        control: &OwnedFd,
        uffds: &[(usize, Arc<Userfaultfd>)],
    ) -> Result<Vec<bool>, LazyError> {
        let mut pfds = Vec::with_capacity(uffds.len() + 1);
        if self.control_open {
            pfds.push(PollFd::new(control.as_fd(), PollFlags::POLLIN));
        }
        pfds.extend(
            uffds
                .iter()
                .map(|(_, u)| PollFd::new(u.fd().as_fd(), PollFlags::POLLIN)),
        );
        let timeout = if self.later.is_empty() { 50u16 } else { 1 };
        match poll(&mut pfds, PollTimeout::from(timeout)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(LazyError::Control(format!("poll: {e}"))),
        }
        Ok(pfds.iter().map(|p| p.any().unwrap_or(false)).collect())
    }

    /// One frame from the restorer. `Some(stats)`: the filler is done (the
    /// restore was aborted).
    fn on_control(
        &mut self,
        sh: &Arc<Shared>,
        control: &OwnedFd,
        guard: Option<&crate::guard::Guard>,
    ) -> Result<Option<Stats>, LazyError> {
        match control::recv(control.as_fd())? {
            Some((Msg::Hand(h), Some(fd))) => self.on_hand(sh, h, fd, guard)?,
            Some((Msg::Done(_), _)) => {
                self.done = true;
                self.control_open = false;
            }
            Some((Msg::Abort(_), _)) => {
                // The restorer killed and reaped the tree itself.
                self.stats.aborted = true;
                return Ok(Some(std::mem::take(&mut self.stats)));
            }
            None => {
                // The restorer is gone (killed) without saying the tree
                // runs: what it had already let go of must not run on
                // half-filled.
                self.stats.aborted = true;
                let killed = kill_unfinished(sh);
                if killed.is_empty() {
                    return Ok(Some(std::mem::take(&mut self.stats)));
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
        Ok(None)
    }

    /// A process handed over with its userfaultfd: it is owed the image's
    /// data in its registered areas.
    fn on_hand(
        &mut self,
        sh: &Arc<Shared>,
        h: control::Hand,
        fd: OwnedFd,
        guard: Option<&crate::guard::Guard>,
    ) -> Result<(), LazyError> {
        self.first_hand.get_or_insert_with(Instant::now);
        let uffd = Userfaultfd::from_fd(fd, 0);
        if let Some(g) = guard {
            g.watch(Some(h.pid), &uffd)?;
        }
        // Dumps of this process wait while this is bound.
        self.markers.extend(busy_marker(h.pid));
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
        self.stats.processes += 1;
        drop(st);
        sh.cv.notify_all();
        Ok(())
    }

    /// Reads the events of every readable userfaultfd (`ready`, in the
    /// order of `uffds`): layout events are applied at once, faults queued.
    fn on_events(
        &mut self,
        sh: &Arc<Shared>,
        uffds: &[(usize, Arc<Userfaultfd>)],
        ready: &[bool],
        guard: Option<&crate::guard::Guard>,
    ) -> Result<(), LazyError> {
        for (j, (i, uffd)) in uffds.iter().enumerate() {
            if !ready[j] {
                continue;
            }
            self.events.clear();
            // Read and apply under the lock (see `deliver_locked`): the
            // kernel lets copies through again as soon as an event is
            // read, before it has been applied here.
            let mut st = sh.lock();
            if let Err(e) = uffd.read_events(&mut self.events) {
                tracing::debug!("userfaultfd of entry {i}: {e}");
                continue;
            }
            let now = Instant::now();
            let mut forked = false;
            // Layout events first: faults read in the same batch are served
            // against the layout that follows them.
            for ev in self.events.drain(..) {
                match ev {
                    Event::PageFault { addr, .. } => self.later.push((*i, addr, now)),
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
                        self.stats.forks += 1;
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
        Ok(())
    }

    /// Faults (new ones and those that had to wait).
    fn serve_faults(&mut self, sh: &Arc<Shared>) -> Result<(), LazyError> {
        let pending = std::mem::take(&mut self.later);
        for (i, addr, t0) in pending {
            match serve_fault(
                sh,
                &mut self.cache,
                &mut self.stats,
                &mut self.lat,
                i,
                addr,
                t0,
            ) {
                Ok(Fault::Served) => {}
                Ok(Fault::Later) => self.later.push((i, addr, t0)),
                Err(e) => return Err(fail(sh, &e.to_string())),
            }
        }
        Ok(())
    }

    /// The statistics once nothing is owed.
    fn finish(mut self) -> Stats {
        self.lat.sort_unstable();
        let lat = &self.lat;
        self.stats.fault_p50_us = percentile(lat, 0.5);
        self.stats.fault_p99_us = percentile(lat, 0.99);
        self.stats.fault_max_us = lat.last().copied().unwrap_or(0);
        self.stats.fill_us = self
            .first_hand
            .map(|t| u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        std::mem::take(&mut self.stats)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::LocalPacks;
    use std::os::unix::net::UnixStream;

    /// Runs the filler on one end of a socket pair with an empty catalog;
    /// `restorer` plays the restorer on the other end, after `ready`.
    fn run(restorer: impl FnOnce(&UnixStream)) -> Result<Stats, LazyError> {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let filler = std::thread::spawn(move || {
            let cfg = Config {
                threads: 2,
                ..Config::default()
            };
            let source = Box::new(LocalPacks {
                dir: "/none".into(),
            });
            serve(OwnedFd::from(theirs), Catalog::empty(), source, cfg)
        });
        let (ready, fd) = control::recv(ours.as_fd()).unwrap().unwrap();
        assert_eq!(ready, Msg::Ready { pages: 0 });
        assert!(fd.is_none());
        restorer(&ours);
        let out = filler.join().unwrap();
        drop(ours);
        out
    }

    #[test]
    fn done_with_nothing_owed_ends_the_fill() {
        let s = run(|c| control::send(c.as_fd(), &Msg::Done(true), None).unwrap()).unwrap();
        assert!(!s.aborted);
        assert_eq!((s.processes, s.faults, s.fill_us), (0, 0, 0));
    }

    #[test]
    fn an_abort_or_a_vanished_restorer_ends_it_aborted() {
        let s = run(|c| control::send(c.as_fd(), &Msg::Abort(true), None).unwrap()).unwrap();
        assert!(s.aborted);
        // The restorer gone without a word: nothing was handed over, so
        // nothing is killed and the filler ends quietly.
        let s = run(|c| c.shutdown(std::net::Shutdown::Both).unwrap()).unwrap();
        assert!(s.aborted);
    }

    #[test]
    fn an_unexpected_frame_is_a_control_error() {
        let e = run(|c| {
            control::send(c.as_fd(), &Msg::Ready { pages: 1 }, None).unwrap();
        })
        .unwrap_err();
        assert!(
            matches!(e, LazyError::Control(ref m) if m.contains("unexpected frame")),
            "{e}"
        );
    }

    #[test]
    fn the_fault_order_becomes_the_next_touch_set() {
        let mut s = Stats::default();
        assert!(s.fault_touch_set().is_none(), "no faults: no touch set");
        s.faults = 3;
        s.fault_order.insert(7, vec![0x3000, 0x4000, 0x1000]);
        s.fault_order.insert(5, vec![0x9000]);
        let ts = s.fault_touch_set().unwrap();
        assert_eq!(ts.source, stasis_image::touch::TouchSource::Faults);
        assert_eq!(
            ts.procs,
            vec![(5, vec![(0x9000, 1)]), (7, vec![(0x3000, 2), (0x1000, 1)])]
        );
        s.aborted = true;
        assert!(
            s.fault_touch_set().is_none(),
            "an aborted fill says nothing"
        );
        let v = Stats::report(&Ok(Stats::default()), 42);
        assert_eq!(
            (v["total_us"].as_u64(), v["faults"].as_u64()),
            (Some(42), Some(0))
        );
        let v = Stats::report(&Err(LazyError::Filler("gone".into())), 42);
        assert!(v["error"].as_str().unwrap().contains("gone"));
    }

    #[test]
    fn fault_latency_percentiles() {
        let lat: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&lat, 0.5), 51);
        assert_eq!(percentile(&lat, 0.99), 99);
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 0.99), 7);
    }
}
