//! How the pages of a dump are copied: one [`CopyStrategy`] per method.
//!
//! * [`stop::StopTheWorld`]: while the tree is frozen (every dump that
//!   kills the tree, and `--leave-running` without `--concurrent`);
//! * [`wp::WriteProtect`]: after the release, from memory kept as it was at
//!   the freeze by userfaultfd write-protection ([`crate::cow`]);
//! * [`fork::ForkSnapshot`]: after the release, from copy-on-write fork
//!   snapshots ([`crate::snapshot`]).
//!
//! The pipeline ([`crate::pipeline`]) calls the same hooks in the same
//! order whatever the method; dirty tracking (`stasis-track`) is handled
//! by the pipeline around them (the strategies only see its selection).

pub mod fork;
pub mod stop;
pub mod wp;

use std::time::Instant;

use stasis_image::manifest::{Manifest, ProcessImage};

use crate::copy::{Pending, ProcCopy};
use crate::freeze::{Frozen, FrozenProcess};
use crate::incremental::{Base, Selection};
use crate::{cow, proc, CaptureError, CowMethod, DumpOptions, Result};

/// One live frozen process to plan, and what its memory plan needs from
/// the dump.
pub struct PlanCx<'a> {
    pub fp: &'a mut FrozenProcess,
    pub image: &'a mut ProcessImage,
    pub maps: &'a [proc::MapsEntry],
    pub frozen_at: Instant,
    /// The parent checkpoint of an incremental dump.
    pub base: Option<&'a Base>,
    /// The parent checkpoint's image of this process, if it is the same process.
    pub parent_proc: Option<&'a ProcessImage>,
    pub tracker: Option<&'a mut (dyn stasis_track::DirtyTracker + Send + 'static)>,
    /// Why the dump is full although tracking was asked for.
    pub note: &'a mut Option<String>,
    /// Shared memory objects whose pages are saved already.
    pub seen_shm: &'a mut crate::memory::SeenShm,
}

impl PlanCx<'_> {
    /// Whether the incremental base covers this process (same pid and
    /// start time tracked since the parent).
    pub fn tracked(&self) -> bool {
        let (pid, start) = (self.image.pid, self.image.start_time);
        self.base
            .is_some_and(|b| b.state.procs.contains(&(pid, start)))
    }
}

/// The memory plan of one process.
pub struct Planned {
    pub plan: crate::memory::MemoryPlan,
    /// Areas (by start) that a fork does not copy.
    pub no_fork: Vec<u64>,
    /// The process's areas as the tracker sees them.
    pub areas: Vec<stasis_track::Area>,
    /// Incremental: what to save.
    pub selection: Option<Selection>,
    /// Fork snapshots: the part of the plan made after the release.
    pub deferred: Option<crate::copy::Deferred>,
}

/// Where the progress and the copy-on-write cap of a copy come from.
pub struct CopyCx<'a, 't> {
    pub root: i32,
    pub tracker: crate::TrackerRef<'t>,
    pub progress: Option<&'a (dyn Fn(u64, u64) + Send)>,
    pub cow_cap: u64,
}

/// One way of copying the pages of a dump. The pipeline calls, in order:
/// [`on_frozen`](Self::on_frozen), [`plan`](Self::plan) for each live
/// process, [`before_release`](Self::before_release), then
/// [`copy`](Self::copy) (before the release if not
/// [`concurrent`](Self::concurrent), else after it) and
/// [`after_copy`](Self::after_copy).
pub trait CopyStrategy {
    /// `ConcurrentStats::method` of the report; `None`: stop-the-world.
    fn method(&self) -> Option<&'static str>;
    /// Whether the pages are copied after the tree is released.
    fn concurrent(&self) -> bool {
        self.method().is_some()
    }
    /// The tree was just frozen (the checkpoint's instant).
    fn on_frozen(&mut self, _f: &mut Frozen) {}
    /// Plans what to save of one live frozen process.
    fn plan(&mut self, cx: PlanCx<'_>) -> Result<Planned>;
    /// The tracking an incremental dump of this method relies on, if it
    /// brings its own (write-protection kept between dumps).
    fn track_name(&self) -> Option<&'static str> {
        None
    }
    /// Still frozen, the manifest written: reads what cannot wait, and
    /// readies the copy.
    fn before_release(
        &mut self,
        _copies: &mut [ProcCopy],
        _manifest: &Manifest,
        _f: &mut Frozen,
    ) -> Result<()> {
        Ok(())
    }
    /// Copies every process's pages into its pack.
    fn copy(&mut self, p: &mut Pending, cx: CopyCx<'_, '_>) -> Result<()>;
    /// After a concurrent copy, whether it worked or not: frees what the
    /// copy held in the tree; returns how long the tree was stopped for it
    /// (microseconds).
    fn after_copy(&mut self, _p: &mut Pending, _root: i32) -> Result<u64> {
        Ok(0)
    }
    /// Write-protection kept for the next dump, and the (pid, start time)
    /// of the processes it covers (taken once, after the commit).
    fn take_kept(&mut self) -> Option<(cow::Cow, Vec<(i32, u64)>)> {
        None
    }
}

/// The three methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stop,
    WriteProtect,
    Fork,
}

/// Which method a dump uses: `Uffd` and `Fork` only for concurrent dumps
/// that leave the tree running (else stop-the-world); write-protection
/// also whenever it is `kept` from the last dump.
pub fn decide(opts: &DumpOptions, method: CowMethod, kept: bool) -> Kind {
    let concurrent = opts.concurrent && opts.leave_running;
    if kept || (concurrent && method == CowMethod::Uffd) {
        Kind::WriteProtect
    } else if concurrent && method == CowMethod::Fork {
        Kind::Fork
    } else {
        Kind::Stop
    }
}

/// The strategy [`decide`] picks; write-protection is prepared now
/// (before the freeze) unless `tracking` kept it from the last dump.
pub fn choose(
    opts: &DumpOptions,
    method: CowMethod,
    tracking: Option<&mut cow::CowTracking>,
) -> Result<Box<dyn CopyStrategy>> {
    let tracked = tracking.is_some();
    let kept = tracking.and_then(|t| t.cow.take());
    Ok(match decide(opts, method, kept.is_some()) {
        Kind::WriteProtect => Box::new(wp::WriteProtect::new(
            kept,
            tracked,
            opts.pid,
            opts.cow_cap,
        )?),
        Kind::Fork => Box::new(fork::ForkSnapshot),
        Kind::Stop => Box::new(stop::StopTheWorld),
    })
}

/// A failed preparation of write-protection, as the error that makes an
/// `auto` dump fall back to a fork snapshot.
pub(crate) fn cow_lost(pid: i32, e: CaptureError) -> CaptureError {
    match e {
        e @ CaptureError::NoSuchProcess { .. } => e,
        e => CaptureError::CowLost(cow::CowLost {
            pid,
            why: format!("write-protecting its memory failed: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(concurrent: bool, leave_running: bool) -> DumpOptions {
        DumpOptions {
            pid: 1,
            concurrent,
            leave_running,
            ..Default::default()
        }
    }

    #[test]
    fn concurrent_methods_only_when_the_tree_runs_on() {
        use CowMethod::{Fork, Uffd};
        assert_eq!(decide(&opts(true, true), Uffd, false), Kind::WriteProtect);
        assert_eq!(decide(&opts(true, true), Fork, false), Kind::Fork);
        // A dump that kills the tree copies while it is frozen.
        assert_eq!(decide(&opts(true, false), Uffd, false), Kind::Stop);
        assert_eq!(decide(&opts(true, false), Fork, false), Kind::Stop);
        assert_eq!(decide(&opts(false, true), Uffd, false), Kind::Stop);
        // Protection kept from the last dump is used whatever was asked.
        assert_eq!(decide(&opts(false, true), Fork, true), Kind::WriteProtect);
    }

    #[test]
    fn a_failed_preparation_falls_back_unless_the_process_is_gone() {
        let e = cow_lost(7, CaptureError::Concurrent("no room".into()));
        assert!(
            matches!(&e, CaptureError::CowLost(l) if l.pid == 7 && l.why.contains("no room")),
            "{e}"
        );
        let e = cow_lost(7, CaptureError::NoSuchProcess { pid: 7 });
        assert!(matches!(e, CaptureError::NoSuchProcess { pid: 7 }));
    }
}
