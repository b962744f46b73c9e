//! Delivering pages: claiming the run around a page, copying what a claim
//! still owes into the process (`UFFDIO_COPY`), recording the outcome, and
//! the copier threads that stream what no fault asked for.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stasis_image::RunEntry;
use stasis_kernel::seam::Pages;
use stasis_kernel::uffd::{FillError, Userfaultfd};

use crate::filler::{Shared, State, PAGE};
use crate::source::ReadError;
use crate::state::{Owed, Space};

/// Why a page could not be delivered (the filler then kills the tree).
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("the image has no run for page {img:#x} of process {pid}")]
    NoRun { img: u64, pid: i32 },
    #[error("run {vaddr:#x} is shorter than the piece")]
    ShortRun { vaddr: u64 },
    #[error("{op} at {addr:#x}: {source}")]
    Uffd {
        op: &'static str,
        addr: u64,
        #[source]
        source: std::io::Error,
    },
}

/// A piece claimed for one copy.
pub(crate) struct Job {
    pub(crate) entry: usize,
    pub(crate) uffd: Arc<Userfaultfd>,
    pub(crate) id: u64,
    pub(crate) len: u64,
    pub(crate) pack: usize,
    pub(crate) run: RunEntry,
}

/// The last run read by a thread (faults and copies often hit the same run).
#[derive(Default)]
pub(crate) struct RunCache {
    key: Option<(usize, u64)>,
    buf: Vec<u8>,
}

impl RunCache {
    pub(crate) fn get(
        &mut self,
        sh: &Shared,
        pack: usize,
        run: &RunEntry,
    ) -> Result<&[u8], DeliveryError> {
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
pub(crate) fn claim_around(
    sh: &Shared,
    st: &mut State,
    i: usize,
    cur_page: u64,
) -> Result<Option<Job>, DeliveryError> {
    let e = &mut st.entries[i];
    let Owed::Image(p) = e.space.owed(cur_page) else {
        return Ok(None);
    };
    let img = p.img + (cur_page - p.start);
    let loc = sh
        .catalog
        .locate(e.image_pid, img)
        .ok_or(DeliveryError::NoRun {
            img,
            pid: e.image_pid,
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

#[derive(Debug)]
pub(crate) enum Delivered {
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
pub(crate) fn deliver_locked(
    st: &mut State,
    job: &Job,
    data: &[u8],
) -> Result<(Delivered, bool), DeliveryError> {
    let pieces = st.entries[job.entry].space.in_flight(job.id);
    let mut done = 0u64;
    let mut at = 0u64;
    let mut outcome = Delivered::Landed;
    for p in &pieces {
        let d = deliver_piece(&*job.uffd, job.run.vaddr, p, data)?;
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

/// Copies piece `p` from `data`, the bytes of the run that starts at
/// image address `run_vaddr`, through `pages`.
fn deliver_piece(
    pages: &dyn Pages,
    run_vaddr: u64,
    p: &crate::state::Piece,
    data: &[u8],
) -> Result<Delivered, DeliveryError> {
    let off = usize::try_from(p.img - run_vaddr).unwrap_or(usize::MAX);
    let len = usize::try_from(p.end - p.start).unwrap_or(0);
    let data = off
        .checked_add(len)
        .and_then(|end| data.get(off..end))
        .ok_or(DeliveryError::ShortRun { vaddr: run_vaddr })?;
    // One UFFDIO_COPY must stay inside one area: if the process split the
    // area (an mprotect on part of it) since, the copy is refused as if the
    // range were unmapped. Then go on page by page, and only a single page
    // that is refused is really gone.
    let page = usize::try_from(PAGE).unwrap_or(4096);
    let mut single = false;
    let mut pos = 0usize;
    while pos < len {
        let end = if single { (pos + page).min(len) } else { len };
        match pages.copy(p.start + pos as u64, &data[pos..end]) {
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
                        return Err(DeliveryError::Uffd {
                            op: "UFFDIO_COPY",
                            addr: p.start + pos as u64,
                            source: std::io::Error::from_raw_os_error(e),
                        })
                    }
                }
            }
        }
    }
    Ok(Delivered::Landed)
}

/// Outcome of serving a fault on a page owed zeros.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Zeroed {
    /// A zero page was mapped.
    Filled,
    /// Nothing to map (a page is there already, or the area moved or went
    /// away since the fault): the thread was woken to find what is there.
    Woken,
    /// An event is waiting to be read: try again after it.
    Later,
    /// The process's memory is gone.
    Gone,
}

/// Serves a fault at `page`, owed zeros, through `pages`.
pub(crate) fn serve_zero(pages: &dyn Pages, page: u64) -> Result<Zeroed, DeliveryError> {
    match pages.zeropage(page, PAGE) {
        Ok(()) => Ok(Zeroed::Filled),
        // There already, or moved or unmapped since the fault: the thread
        // retries and finds what is there now.
        Err(FillError {
            errno: libc::EEXIST | libc::ENOENT | libc::EINVAL | libc::EFAULT,
            ..
        }) => {
            let _ = pages.wake(page, PAGE);
            Ok(Zeroed::Woken)
        }
        Err(FillError {
            errno: libc::EAGAIN,
            ..
        }) => Ok(Zeroed::Later),
        Err(FillError {
            errno: libc::ESRCH, ..
        }) => Ok(Zeroed::Gone),
        Err(FillError { errno, .. }) => Err(DeliveryError::Uffd {
            op: "UFFDIO_ZEROPAGE",
            addr: page,
            source: std::io::Error::from_raw_os_error(errno),
        }),
    }
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

pub(crate) fn next_job(sh: &Shared, st: &mut State) -> Result<Option<Job>, DeliveryError> {
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

pub(crate) fn copier(sh: Arc<Shared>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Piece;
    use stasis_kernel::seam::{PageCall, PageRecorder};

    const P: u64 = PAGE;
    const BASE: u64 = 0x10_0000;

    /// A run of `pages` pages at image address 0x7000_0000, each page
    /// filled with its index.
    fn run(pages: u64) -> Vec<u8> {
        (0..pages)
            .flat_map(|i| vec![u8::try_from(i).unwrap(); 4096])
            .collect()
    }

    fn piece(first: u64, n: u64) -> Piece {
        Piece {
            start: BASE + first * P,
            end: BASE + (first + n) * P,
            img: 0x7000_0000 + first * P,
        }
    }

    /// The bytes copied to each page, by page address.
    fn copied(f: &PageRecorder) -> Vec<(u64, u8)> {
        let mut out = Vec::new();
        for c in f.calls() {
            if let PageCall::Copy { dst, data } = c {
                for (k, pg) in data.chunks(4096).enumerate() {
                    out.push((dst + k as u64 * P, pg[0]));
                }
            }
        }
        out
    }

    #[test]
    fn a_piece_over_a_split_area_is_copied_page_by_page() {
        // The process split the area in two since (an mprotect): one copy
        // of four pages is refused, four copies of one land.
        let f = PageRecorder::with_areas(&[(BASE, BASE + 2 * P), (BASE + 2 * P, BASE + 4 * P)]);
        let d = deliver_piece(&f, 0x7000_0000, &piece(0, 4), &run(4)).unwrap();
        assert!(matches!(d, Delivered::Landed));
        assert_eq!(f.filled(), (0..4).map(|i| BASE + i * P).collect::<Vec<_>>());
        assert_eq!(f.calls().len(), 5, "one refused copy, then one per page");
        // Each page got its own bytes.
        let last: Vec<(u64, u8)> = copied(&f).into_iter().skip(4).collect();
        assert_eq!(
            last,
            (0..4)
                .map(|i| (BASE + i * P, u8::try_from(i).unwrap()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn only_the_page_really_unmapped_is_reported_and_the_rest_lands() {
        let f = PageRecorder::with_areas(&[(BASE, BASE + 2 * P)]);
        let d = deliver_piece(&f, 0x7000_0000, &piece(0, 3), &run(3)).unwrap();
        assert!(matches!(d, Delivered::NotMapped(n) if n == 2 * P));
        assert_eq!(f.filled(), vec![BASE, BASE + P]);
    }

    #[test]
    fn a_page_there_already_is_skipped_and_the_rest_copied_with_its_own_bytes() {
        let f = PageRecorder::with_areas(&[(BASE, BASE + 8 * P)]);
        f.prefill(BASE + 3 * P, BASE + 4 * P);
        // Pages 2..6 of the run: page 3 is there (copied before a fork).
        let d = deliver_piece(&f, 0x7000_0000, &piece(2, 4), &run(6)).unwrap();
        assert!(matches!(d, Delivered::Landed));
        let c = copied(&f);
        // The first copy stops at page 3; the second starts at page 4 with
        // page 4's bytes, not page 3's.
        assert!(c.contains(&(BASE + 4 * P, 4)), "{c:?}");
        assert!(c.contains(&(BASE + 5 * P, 5)), "{c:?}");
        assert_eq!(f.filled(), (2..6).map(|i| BASE + i * P).collect::<Vec<_>>());
    }

    #[test]
    fn an_event_to_read_or_a_gone_process_stops_the_copy() {
        let f = PageRecorder::with_areas(&[(BASE, BASE + 4 * P)]);
        f.fail_once(libc::EAGAIN);
        let d = deliver_piece(&f, 0x7000_0000, &piece(0, 2), &run(2)).unwrap();
        assert!(matches!(d, Delivered::Again(0)));
        f.fail_always(libc::ESRCH);
        let d = deliver_piece(&f, 0x7000_0000, &piece(0, 2), &run(2)).unwrap();
        assert!(matches!(d, Delivered::Gone));
    }

    #[test]
    fn an_unexpected_errno_or_a_short_run_is_an_error() {
        let f = PageRecorder::with_areas(&[(BASE, BASE + 4 * P)]);
        let e = deliver_piece(&f, 0x7000_0000, &piece(0, 3), &run(2)).unwrap_err();
        assert!(matches!(e, DeliveryError::ShortRun { .. }), "{e}");
        f.fail_always(libc::EIO);
        let e = deliver_piece(&f, 0x7000_0000, &piece(0, 2), &run(2)).unwrap_err();
        assert!(e.to_string().contains("UFFDIO_COPY"), "{e}");
    }

    #[test]
    fn a_zero_fault_fills_or_wakes_or_waits() {
        let f = PageRecorder::with_areas(&[(BASE, BASE + 2 * P)]);
        assert_eq!(serve_zero(&f, BASE).unwrap(), Zeroed::Filled);
        // There already: woken, not filled twice.
        assert_eq!(serve_zero(&f, BASE).unwrap(), Zeroed::Woken);
        // Unmapped since the fault: woken, to find what is there now.
        assert_eq!(serve_zero(&f, BASE + 5 * P).unwrap(), Zeroed::Woken);
        let wakes = f
            .calls()
            .iter()
            .filter(|c| matches!(c, PageCall::Wake { .. }))
            .count();
        assert_eq!(wakes, 2);
        f.fail_once(libc::EAGAIN);
        assert_eq!(serve_zero(&f, BASE + P).unwrap(), Zeroed::Later);
        f.fail_always(libc::ESRCH);
        assert_eq!(serve_zero(&f, BASE + P).unwrap(), Zeroed::Gone);
    }
}
