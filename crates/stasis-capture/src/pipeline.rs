//! The path of a dump, stage by stage: **preflight** (nothing stopped) →
//! **freeze** → **collect** and **plan memory** ([`crate::collect`]) →
//! **copy** (the [`CopyStrategy`]: before the release, or after it) →
//! **commit** → **release** (or kill). Any failure before the commit puts
//! the tree back as it was and leaves no checkpoint behind.

use std::time::{Duration, Instant};

use stasis_image::ImageDir;
use stasis_kernel::priority::{Boost, FROZEN_NICE};

use crate::collect::{capture_frozen, Frame};
use crate::copy::Pending;
use crate::incremental::{self, Base, FullDump};
use crate::strategy::{self, CopyCx, CopyStrategy};
use crate::SaveError;
use crate::{
    cow, fds, freeze, memory, micros, proc, CaptureError, CowMethod, DumpOptions, DumpReport,
    Result, Stages, TrackerRef,
};

/// One attempt of a dump; `method` (`Uffd` or `Fork`) is how a concurrent
/// dump keeps its pages; `tracking`: write-protection kept between dumps.
pub fn dump_once(
    store: &ImageDir,
    opts: &DumpOptions,
    mut tracker: TrackerRef<'_>,
    method: CowMethod,
    mut tracking: Option<&mut cow::CowTracking>,
) -> Result<DumpReport> {
    let t0 = Instant::now();
    preflight(opts.pid)?;
    // The tree's sockets are read from inside its network namespace.
    let _netns = crate::ns::enter_net(opts.pid)?;
    // Its network namespace, if its own: its veths are removed once the
    // tree is killed.
    let tree_net = match &_netns {
        Some(_) => Some(stasis_kernel::ns::open_net_of(opts.pid)?),
        None => None,
    };
    // Before the strategy takes the protection `tracking` holds.
    let base = incremental_base(store, opts.pid, tracker.as_deref(), tracking.as_deref());
    let mut strategy = strategy::choose(opts, method, tracking.as_deref_mut())?;
    if strategy.method() == Some("fork") {
        crate::guard::start();
    }
    // TCP listeners take no new connection until the dump is over (the
    // queue drains meanwhile): a connection waiting to be accepted cannot
    // be checkpointed.
    let tree = proc::tree_pids(opts.pid);
    let gate = fds::AcceptGate::close(&tree);
    if !opts.skip_in_flight {
        gate.drain(BACKLOG_PATIENCE);
    }
    // Who else holds the tree's ptys: a walk of every process, taken while
    // nothing is frozen.
    let pty_census = stasis_objects::pty_census::Census::for_tree(&tree);
    // One part of a cut freezes with the others (nothing is frozen yet:
    // an abort here leaves nothing to put back but the listeners, which
    // the gate reopens as it goes).
    if let Some(c) = &opts.cut {
        c.ready().map_err(CaptureError::from)?;
    }
    // The tree's downtime is our working time: on a busy host, get the
    // CPU first (undone at the release, before a concurrent copy).
    let boost = Boost::raise(FROZEN_NICE);
    let (mut frozen, (frozen_at, cpu_at), fd_census) = freeze_without_backlog(opts.pid)?;
    let mut stages = Stages::new(frozen_at, cpu_at);
    stages.mark("seize");
    strategy.on_frozen(&mut frozen);
    if frozen.procs.first().is_none_or(|p| p.zombie.is_some()) {
        // It exited between the checks and the freeze: nothing to save.
        frozen.release()?;
        return Err(CaptureError::NoSuchProcess { pid: opts.pid });
    }
    if base.is_ok() {
        // Collecting re-arms the tracking: from here until the new
        // checkpoint is committed, the old one is no base for anything.
        if let Err(e) = stasis_track::state::clear(store.path()) {
            frozen.release()?;
            return Err(CaptureError::Track(e.to_string()));
        }
    }
    let (base, note) = match base {
        Ok(b) => (Some(b), None),
        Err(full) => (None, full.note()),
    };
    // TCP sockets in repair mode: closed silently after a kill (no FIN, no
    // RST reaches the peer), or taken out of repair when the tree runs on.
    let mut repaired = fds::Repairs::default();
    let mut frame = Frame {
        store,
        opts,
        t0,
        frozen_at,
        strategy: &mut *strategy,
        base,
        note,
        tracker: tracker.as_deref_mut(),
        stages: &mut stages,
        pty_census,
        fd_census,
    };
    let result = capture_frozen(&mut frame, &mut frozen, &mut repaired);
    drop(frame);
    let progress = opts.progress.as_deref();
    // Stop-the-world: the pages are copied while the tree is frozen.
    let result = result.and_then(|mut p| {
        if !strategy.concurrent() {
            let cx = CopyCx {
                root: opts.pid,
                tracker: tracker.as_deref_mut(),
                progress,
                cow_cap: 0,
            };
            strategy.copy(&mut p, cx)?;
            stages.mark("copy");
        }
        Ok(p)
    });
    let stages = Ends {
        store,
        opts,
        t0,
        stages,
        frozen,
        repaired,
        gate,
        boost,
        tree_net,
    };
    match result {
        Ok(pending) if opts.leave_running => {
            stages.release_then_commit(pending, &mut *strategy, tracker, tracking)
        }
        Ok(pending) => stages.commit_then_kill(pending),
        Err(e) => Err(stages.put_back_after("dump", e)),
    }
}

/// What the last stages (commit, release or kill) work on.
struct Ends<'a> {
    store: &'a ImageDir,
    opts: &'a DumpOptions,
    t0: Instant,
    stages: Stages,
    frozen: freeze::Frozen,
    repaired: fds::Repairs,
    gate: fds::AcceptGate,
    /// This thread's raised priority while the tree is frozen.
    boost: Option<Boost>,
    /// The tree's network namespace, if its own.
    tree_net: Option<std::os::fd::OwnedFd>,
}

impl Ends<'_> {
    /// The tree runs on while the checkpoint is copied (concurrent),
    /// synced and committed: if that fails, it runs on as if nothing
    /// happened. Its listeners take connections again at once.
    fn release_then_commit(
        mut self,
        mut pending: Pending,
        strategy: &mut dyn CopyStrategy,
        tracker: TrackerRef<'_>,
        tracking: Option<&mut cow::CowTracking>,
    ) -> Result<DumpReport> {
        let (store, opts, t0) = (self.store, self.opts, self.t0);
        if let Some(c) = &opts.cut {
            // Every part of the cut frozen before any is released.
            if let Err(e) = c.frozen() {
                return Err(self.put_back_after("cut", e.into()));
            }
            self.stages.mark("cut");
        }
        let mut frozen = self.frozen;
        let mut repaired = self.repaired;
        hold_again(&mut repaired, &mut frozen);
        fds::leave_repair(&mut repaired);
        let released = frozen.release();
        // The tree runs: its frozen time ends here (what follows does not
        // hold it; the guards' exits, say, are waited for).
        let mut stages = self.stages;
        stages.mark("release");
        let frozen_us = stages.elapsed_us();
        drop(self.gate);
        // The guard stays until every held thread is let go.
        fds::dismiss_guard(repaired, released.is_ok());
        released?;
        drop(self.boost);
        if strategy.concurrent() {
            let cx = CopyCx {
                root: opts.pid,
                tracker,
                progress: opts.progress.as_deref(),
                cow_cap: opts.cow_cap,
            };
            let copied = strategy.copy(&mut pending, cx);
            let reaped = strategy.after_copy(&mut pending, opts.pid);
            copied?;
            let reap_us = reaped?;
            if let Some(c) = pending.report.concurrent.as_mut() {
                c.reap_stop_us = reap_us;
            }
        }
        let mut report = pending.finish(store, opts.cut.as_deref())?;
        report.frozen_us = frozen_us;
        report.frozen_stages = stages.marks;
        report.total_us = micros(t0);
        if let (Some(t), Some((cow, procs))) = (tracking, strategy.take_kept()) {
            // Committed: writes from this freeze on are tracked.
            t.cow = Some(cow);
            t.armed_at = Some(report.checkpoint);
            t.procs = procs;
            report.armed = Some(cow::TRACK_NAME.into());
        }
        Ok(report)
    }

    /// Killed only once the checkpoint is committed.
    fn commit_then_kill(mut self, pending: Pending) -> Result<DumpReport> {
        if let Some(c) = &self.opts.cut {
            if let Err(e) = c.frozen() {
                return Err(self.put_back_after("cut", e.into()));
            }
            self.stages.mark("cut");
        }
        let mut report = match pending.finish(self.store, self.opts.cut.as_deref()) {
            Ok(r) => r,
            Err(e) => return Err(self.put_back_after("commit", e)),
        };
        stasis_sys::fault::die_at(stasis_sys::fault::Point::DieAfterCommit);
        // The processes whose connections are in repair mode die by the
        // hand of the socket guard: a dumper dying from here on cannot
        // leave them taken out of repair mode, ended for their peers.
        fds::kill_owners(self.repaired);
        stasis_sys::fault::die_at(stasis_sys::fault::Point::DieAfterKill);
        let mut frozen = self.frozen;
        frozen.kill();
        drop(self.gate);
        if let Some(ns) = &self.tree_net {
            crate::ns::remove_veths(ns);
        }
        report.killed = true;
        self.stages.mark("commit");
        report.frozen_us = self.stages.elapsed_us();
        report.frozen_stages = self.stages.marks;
        report.total_us = micros(self.t0);
        Ok(report)
    }

    /// Puts the tree back as it was after a failed `stage` (`dump` or
    /// `commit`); returns the original error.
    fn put_back_after(self, stage: &str, e: CaptureError) -> CaptureError {
        let pid = self.opts.pid;
        let mut frozen = self.frozen;
        let mut repaired = self.repaired;
        hold_again(&mut repaired, &mut frozen);
        fds::leave_repair(&mut repaired);
        let released = frozen.release();
        fds::dismiss_guard(repaired, released.is_ok());
        if let Err(re) = released {
            tracing::error!(
                pid,
                "could not resume the tree of {pid} after a failed {stage}: {re}"
            );
        }
        drop(self.gate);
        e
    }
}

/// The parent of an incremental dump, or why the dump is full: from the
/// tracker's recorded state, or from write-protection kept since the
/// latest checkpoint (`tracking`).
fn incremental_base(
    store: &ImageDir,
    root: i32,
    tracker: Option<&(dyn stasis_track::DirtyTracker + Send)>,
    tracking: Option<&cow::CowTracking>,
) -> std::result::Result<Base, FullDump> {
    let root_start = || {
        proc::read(root, "stat")
            .ok()
            .and_then(|s| proc::parse_stat(&s).ok())
            .map_or(0, |s| s.start_time)
    };
    match (tracker, tracking) {
        (None, Some(ct)) => ct.base(store, root, root_start()),
        (Some(t), _) => incremental::base(store, t, root, root_start()),
        (None, None) => Err(FullDump::Untracked),
    }
}

/// How long a dump keeps trying to find the tree with no connection
/// waiting to be accepted.
const BACKLOG_PATIENCE: Duration = Duration::from_secs(2);

/// Freezes the tree, and while a socket of it is in a transient state that
/// cannot be checkpointed (connections waiting to be accepted, a TCP
/// connection closing: a busy server deals with both within milliseconds),
/// lets it run a little and freezes it again. Gives up after
/// [`BACKLOG_PATIENCE`] and returns the tree frozen anyway: the socket is
/// then refused with a message. Returns the tree, the instant its first
/// thread was stopped and this process's CPU time then, and the frozen
/// tree's fds, listed once
/// for every pass of the dump (`None` if they could not be: each pass
/// then walks `/proc` itself, and meets the error if it lasts).
fn freeze_without_backlog(
    pid: i32,
) -> Result<(
    freeze::Frozen,
    (Instant, u64),
    Option<stasis_objects::fd_census::FdCensus>,
)> {
    stasis_sys::fault::delay(stasis_sys::fault::Slow::Freeze);
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        // The frozen time counts from here: the first thread stops in
        // `freeze_tree`.
        let frozen_at = Instant::now();
        let cpu_at = crate::own_cpu_us();
        let mut frozen = freeze::freeze_tree(pid)?;
        let pids = frozen.live_pids();
        let census = stasis_objects::fd_census::FdCensus::take(&pids).ok();
        match fds::transient_socket(census.as_ref(), &pids) {
            Some((p, fd, what)) if t0.elapsed() < BACKLOG_PATIENCE => {
                tracing::debug!(
                    pid = p,
                    fd,
                    what,
                    "a socket in a transient state: retrying the freeze"
                );
                frozen.release()?;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            _ => return Ok((frozen, (frozen_at, cpu_at), census)),
        }
    }
}

/// How long a dump waits for a lazy restore of the process to finish.
const LAZY_FILL_WAIT: Duration = Duration::from_secs(120);

/// A process still being filled by a lazy restore would be saved without
/// the pages it has not received yet: wait until its filler is done.
fn wait_lazy_fill(pid: i32) -> Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let name = stasis_kernel::lazy_fill_socket_name(pid);
    let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) else {
        return Ok(());
    };
    let t0 = Instant::now();
    loop {
        let filling = std::os::unix::net::UnixDatagram::unbound()
            .and_then(|s| s.connect_addr(&addr))
            .is_ok();
        if !filling {
            return Ok(());
        }
        if t0.elapsed() >= LAZY_FILL_WAIT {
            return Err(SaveError::Unsupported {
                pid,
                what: format!(
                    "its pages are still arriving from a lazy restore after {} s; wait for the restore's page filler to finish, then dump again",
                    LAZY_FILL_WAIT.as_secs()
                ),
            }.into());
        }
        if t0.elapsed() < Duration::from_millis(20) {
            tracing::info!(pid, "waiting for the lazy restore of the process to finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks what can be checked without stopping anything: the root exists
/// and is dumpable, and the fds and mappings of the tree (as far as it can be
/// seen while it runs) are of supported kinds.
fn preflight(pid: i32) -> Result<()> {
    if pid <= 0 || std::fs::metadata(format!("/proc/{pid}")).is_err() {
        return Err(CaptureError::NoSuchProcess { pid });
    }
    if pid == std::process::id() as i32 {
        return Err(SaveError::Unsupported {
            pid,
            what: "stasis cannot dump itself".into(),
        }
        .into());
    }
    let stat = proc::read_parsed(pid, "stat", proc::parse_stat)?;
    if stat.state == 'Z' || stat.state == 'X' {
        return Err(SaveError::Unsupported {
            pid,
            what: "it is a zombie (it has exited and waits to be reaped)".into(),
        }
        .into());
    }
    let mut queue = vec![pid];
    let mut tree = Vec::new();
    while let Some(p) = queue.pop() {
        tree.push(p);
        wait_lazy_fill(p)?;
        let Ok(maps) = proc::read(p, "maps") else {
            continue;
        };
        if maps.trim().is_empty() {
            if p == pid {
                return Err(SaveError::Unsupported {
                    pid,
                    what: "it is a kernel thread (it has no memory map)".into(),
                }
                .into());
            }
            continue; // a zombie child
        }
        preflight_process(p, &maps)?;
        queue.extend(proc::task_children(p));
    }
    crate::ns::check(pid, &tree)
}

/// The fds and areas of one running process are of supported kinds.
fn preflight_process(p: i32, maps: &str) -> Result<()> {
    for fd in fds::list_fds(p).unwrap_or_default() {
        let Ok(link) = proc::read_link(p, &format!("fd/{fd}")) else {
            continue;
        };
        if let Some(what) = fds::unsupported_reason(p, fd, &link) {
            return Err(SaveError::Unsupported { pid: p, what }.into());
        }
    }
    for m in proc::parse_maps(maps).map_err(|e| proc::format_err(p, "maps", e))? {
        memory::vma_kind(&m).map_err(|e| SaveError::Unsupported { pid: p, what: e.0 })?;
    }
    Ok(())
}

/// Holds the owners of the TCP connections again before the windows go
/// back through repair mode ([`fds::Repairs::hold_again`]); a failure is
/// logged (the thread is gone, or the dump goes on without the guard's
/// cover for that instant).
fn hold_again(repaired: &mut fds::Repairs, frozen: &mut crate::freeze::Frozen) {
    if let Err(e) = repaired.hold_again(&mut |p| Ok(frozen.hold(p)?)) {
        tracing::warn!("could not hold the owners of the TCP connections again: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tracking_or_parent_the_dump_is_full_without_a_note() {
        let dir = std::env::temp_dir().join(format!("stasis-capture-base-{}", std::process::id()));
        let store = ImageDir::create_or_open(&dir).unwrap();
        let root = i32::try_from(std::process::id()).unwrap();
        assert_eq!(
            incremental_base(&store, root, None, None).err(),
            Some(FullDump::Untracked)
        );
        // Protection kept by `stasis run`, but no checkpoint yet: the
        // first one is full by nature.
        let kept = cow::CowTracking::default();
        assert_eq!(
            incremental_base(&store, root, None, Some(&kept)).err(),
            Some(FullDump::Untracked)
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
