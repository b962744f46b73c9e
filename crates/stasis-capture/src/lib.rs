//! Freeze a process tree, read its state and memory, and write a Stasis image.
//!
//! # The path of a dump
//! An explicit pipeline ([`pipeline`]), one record per process:
//! 1. **Preflight**, nothing stopped: the root exists, and every fd and
//!    mapping of the tree is of a supported kind. Anything unsupported is
//!    refused here, before any process is even stopped. The copy strategy
//!    is chosen ([`strategy`]); write-protection is prepared now.
//! 2. **Freeze** the tree ([`freeze`]): every thread of every process
//!    (children are found after their parent is frozen, threads are listed
//!    until no new one appears): `PTRACE_SEIZE` + `PTRACE_INTERRUPT`.
//! 3. **Collect** ([`collect`]): registers (normalised so an interrupted
//!    syscall restarts) and the XSAVE area; remote syscalls through the
//!    escape hatch ([`remote_state`]: signal actions, timers, `brk`...);
//!    `/proc` ([`proc`]); fds ([`fds`]).
//! 4. **Plan memory**: the [`strategy::CopyStrategy`] decides which pages
//!    to save and where to read them (`PAGEMAP_SCAN`; an incremental dump
//!    keeps only what the tracker reports written).
//! 5. **Copy** ([`copy`]) the pages into the page packs: stop-the-world
//!    while frozen, or after the release from write-protected memory
//!    ([`cow`]) or fork snapshots ([`snapshot`]).
//! 6. **Commit** the checkpoint atomically.
//! 7. **Release** (`leave_running`: before the commit, the tree does not
//!    wait for the fsyncs) or **kill** (only after the commit).
//!
//! Any failure before the commit puts the process back exactly as it was
//! and leaves no checkpoint behind.

pub mod cgroup;
pub mod collect;
pub mod copy;
pub mod cow;
pub mod fds;
pub mod freeze;
pub mod guard;
pub mod incremental;
pub mod memory;
pub mod ns;
pub mod pipeline;
pub mod proc;
pub mod process;
pub mod remote;
pub mod remote_state;
pub mod snapshot;
pub mod strategy;

use std::time::Instant;

use stasis_image::{ImageDir, ImageError};
use stasis_kernel::KernelError;
pub use stasis_objects::SaveError;
pub use stasis_track::DirtyTracker;

use pipeline::dump_once;

/// Errors of a dump. Each leaves the target running as it was.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("process {pid} does not exist: check the PID (`ps -p {pid}`)")]
    NoSuchProcess { pid: i32 },
    #[error("process {pid} is still putting itself back after a dump that was killed: try again in a moment")]
    Escaping { pid: i32 },
    #[error("cannot trace process {pid}: permission denied reading /proc/{pid}/{file} (run stasis as root, or as the process's owner with CAP_SYS_PTRACE)")]
    Permission { pid: i32, file: String },
    /// Saving failed where the kernel objects' save side reports it too
    /// (one definition of those messages: unsupported, `/proc` errors).
    #[error(transparent)]
    Save(SaveError),
    #[error(transparent)]
    Cut(#[from] CutAbort),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("writing the image failed: {0}")]
    Image(#[from] ImageError),
    #[error("dirty tracking failed: {0}")]
    Track(String),
    #[error("concurrent copy of process {}: {} (the dump was abandoned; dump again, or with --cow-method fork)", .0.pid, .0.why)]
    CowLost(cow::CowLost),
    #[error("concurrent copy failed: {0}")]
    Concurrent(String),
}

impl CaptureError {
    pub(crate) fn from_proc(pid: i32, file: &str, e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound
            && std::fs::metadata(format!("/proc/{pid}")).is_err()
        {
            CaptureError::NoSuchProcess { pid }
        } else if e.kind() == std::io::ErrorKind::PermissionDenied {
            CaptureError::Permission {
                pid,
                file: file.into(),
            }
        } else {
            CaptureError::Save(SaveError::Proc {
                pid,
                file: file.into(),
                source: e,
            })
        }
    }
}

impl From<SaveError> for CaptureError {
    fn from(e: SaveError) -> Self {
        match e {
            SaveError::Proc { pid, file, source } => CaptureError::from_proc(pid, &file, source),
            SaveError::Kernel(k) => CaptureError::Kernel(k),
            e => CaptureError::Save(e),
        }
    }
}

type Result<T, E = CaptureError> = std::result::Result<T, E>;

/// What to dump and how.
#[derive(Default)]
pub struct DumpOptions {
    /// Root of the tree to dump.
    pub pid: i32,
    /// Let the processes run on after the dump instead of killing them.
    pub leave_running: bool,
    /// Called with (bytes saved, bytes to save) while memory is written.
    pub progress: Option<Box<dyn Fn(u64, u64) + Send>>,
    /// With `leave_running`: copy memory after the tree is released, from
    /// copy-on-write snapshots ([`snapshot`]), so the tree stops only while
    /// its state is read.
    pub concurrent: bool,
    /// Concurrent dumps: if the pages the tree may have copied on write
    /// (and the snapshot still holds) exceed this many bytes, the tree is
    /// stopped until the copy is done. 0: no cap.
    pub cow_cap: u64,
    /// How a concurrent dump keeps the freeze instant's pages.
    pub cow_method: CowMethod,
    /// This dump is one part of a cut across hosts: it waits at the cut's
    /// two barriers (see [`Cut`]).
    pub cut: Option<std::sync::Arc<dyn Cut>>,
    /// Established TCP connections are saved as closed, without being
    /// stopped or read in repair mode (CRIU's `--tcp-close`).
    pub tcp_close: bool,
    /// Connections waiting in a TCP listener's accept queue are left out
    /// (CRIU's `--skip-in-flight`) instead of refused.
    pub skip_in_flight: bool,
    /// Shell patterns of POSIX shared memory objects (names in
    /// `/dev/shm`) saved whole with the checkpoint and put back at restore
    /// (`stasis_objects::posix_shm`).
    pub shm_files: Vec<String>,
    /// The tree is a job of a shell on a terminal the tree does not hold
    /// (`--shell-job`): its fds on that terminal are saved as the shell
    /// job's terminal, to be reopened on the terminal of the restore.
    pub shell_job: bool,
}

/// A dump that is one part of a consistent cut of an application over
/// several hosts (`stasis-cluster`): it stops at three barriers, where the
/// coordinator decides. An error at any aborts the dump as any failure
/// does: the tree is put back as it was (or runs on, after the release)
/// and the checkpoint, never committed, is removed.
pub trait Cut: Send + Sync {
    /// The job and round recorded in the checkpoint's manifest.
    fn mark(&self) -> stasis_image::manifest::CutMark;
    /// Everything the dump does before the freeze is done (checks, the
    /// census of who holds the tree's ptys and pipes, listeners closed):
    /// returns once every part of the cut is, so that every part freezes
    /// at the same instant, and none waits frozen for a part still
    /// preparing.
    fn ready(&self) -> std::result::Result<(), CutAbort> {
        Ok(())
    }
    /// The tree is frozen, its connections locked and in repair mode, its
    /// state read (and, stop-the-world, its pages): returns once every part
    /// of the cut is, to release the tree (or, for a dump that kills, to go
    /// on to the commit).
    fn frozen(&self) -> std::result::Result<(), CutAbort>;
    /// The checkpoint is written and synced but not committed: returns
    /// once the coordinator decided to commit, its decision recorded.
    fn written(&self, checkpoint: u32) -> std::result::Result<(), CutAbort>;
}

pub use stasis_image::manifest::CutAbort;

/// How a concurrent dump keeps the pages of the freeze instant while the
/// tree runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CowMethod {
    /// userfaultfd write-protection ([`cow`]); a fork snapshot with dirty
    /// tracking, or if the process gives back memory not yet saved.
    #[default]
    Auto,
    /// userfaultfd write-protection only (fails rather than fall back).
    Uffd,
    /// A copy-on-write fork snapshot ([`snapshot`]).
    Fork,
}

impl CowMethod {
    /// The method a concurrent dump uses for this request: a fork snapshot
    /// with a dirty tracker (its userfaultfd already holds the areas), or
    /// when asked; else write-protection. `Uffd` with a tracker is refused.
    pub fn concurrent(self, tracked: bool) -> Result<CowMethod> {
        match (self, tracked) {
            (CowMethod::Uffd, true) => Err(CaptureError::Concurrent(
                "--cow-method uffd cannot be used with dirty tracking (the tracker's userfaultfd already holds the areas): use --cow-method auto or fork".into(),
            )),
            (CowMethod::Fork, _) | (CowMethod::Auto, true) => Ok(CowMethod::Fork),
            _ => Ok(CowMethod::Uffd),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CowMethod::Auto => "auto",
            CowMethod::Uffd => "uffd",
            CowMethod::Fork => "fork",
        }
    }
}

/// What a dump did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DumpReport {
    pub checkpoint: u32,
    pub pid: i32,
    /// Processes in the tree (zombies included).
    pub processes: usize,
    pub threads: usize,
    pub pages: u64,
    pub bytes: u64,
    pub frozen_us: u64,
    pub total_us: u64,
    pub killed: bool,
    /// Parent checkpoint of an incremental dump.
    pub parent: Option<u32>,
    /// Backend that chose the pages of an incremental dump.
    pub track: Option<String>,
    /// Backend left armed for the next dump.
    pub armed: Option<String>,
    /// Why tracking was asked for but the dump is full, or re-arming failed.
    pub note: Option<String>,
    /// Figures of a concurrent dump.
    pub concurrent: Option<ConcurrentStats>,
    /// Where the frozen time went: when each stage ended.
    pub frozen_stages: Vec<StageMark>,
}

/// The end of one stage of the frozen part of a dump, in microseconds
/// from the moment the tree's first thread was stopped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageMark {
    pub stage: &'static str,
    pub end_us: u64,
    /// CPU time (user and system, every thread) the dumping process had
    /// spent since the first thread was stopped: with several dumps
    /// frozen at once on few cores (a cluster round), what each host's
    /// freeze costs whatever the others take.
    pub cpu_us: u64,
}

/// The clock of the frozen part of a dump: started as the first thread
/// is stopped, marked as each stage ends (logged, and reported in
/// [`DumpReport::frozen_stages`]).
#[derive(Debug, Clone)]
pub struct Stages {
    pub since: std::time::Instant,
    pub marks: Vec<StageMark>,
    cpu_since: u64,
}

/// CPU time (user and system) of this process, in microseconds.
pub(crate) fn own_cpu_us() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |v: nix::sys::time::TimeVal| {
                u64::try_from(v.tv_sec()).unwrap_or(0) * 1_000_000
                    + u64::try_from(v.tv_usec()).unwrap_or(0)
            };
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0)
}

impl Stages {
    /// A clock started at `since`, when this process's CPU time was
    /// `cpu_since` ([`own_cpu_us`]).
    pub fn new(since: std::time::Instant, cpu_since: u64) -> Stages {
        Stages {
            since,
            marks: Vec::new(),
            cpu_since,
        }
    }

    /// `stage` has just ended.
    pub fn mark(&mut self, stage: &'static str) {
        let end_us = micros(self.since);
        let cpu_us = own_cpu_us().saturating_sub(self.cpu_since);
        tracing::debug!(
            stage,
            ms = end_us as f64 / 1e3,
            cpu_ms = cpu_us as f64 / 1e3,
            "frozen stage ended"
        );
        self.marks.push(StageMark {
            stage,
            end_us,
            cpu_us,
        });
    }

    /// Microseconds since the first thread was stopped.
    pub fn elapsed_us(&self) -> u64 {
        micros(self.since)
    }
}

/// Dumps the process tree rooted at `opts.pid` into `store` as a new checkpoint.
pub fn dump(store: &ImageDir, opts: &DumpOptions) -> Result<DumpReport> {
    dump_tracked(store, opts, None)
}

/// Called with (bytes saved, bytes to save) while memory is written.
pub type ProgressFn<'a> = Option<&'a (dyn Fn(u64, u64) + Send)>;

/// A dirty tracker lent to a dump.
pub type TrackerRef<'a> = Option<&'a mut (dyn DirtyTracker + Send + 'static)>;

/// Like [`dump`], with a dirty tracker: the dump is incremental against the
/// latest checkpoint if the same tracker was armed right after it (else it
/// is full, with a note saying why), and with `leave_running` the tracker
/// is armed again for the next dump.
pub fn dump_tracked(
    store: &ImageDir,
    opts: &DumpOptions,
    mut tracker: TrackerRef<'_>,
) -> Result<DumpReport> {
    if !(opts.concurrent && opts.leave_running) {
        return dump_once(store, opts, tracker, CowMethod::Fork, None);
    }
    let method = opts.cow_method.concurrent(tracker.is_some())?;
    match dump_once(store, opts, tracker.as_deref_mut(), method, None) {
        Err(CaptureError::CowLost(lost)) if opts.cow_method == CowMethod::Auto => {
            dump_from_fork(store, opts, tracker, &lost)
        }
        other => other,
    }
}

/// The process gave back memory a write-protected copy had not saved yet:
/// dumps again from a fork snapshot, which keeps every page whatever the
/// process does, and says why in the report.
fn dump_from_fork(
    store: &ImageDir,
    opts: &DumpOptions,
    tracker: TrackerRef<'_>,
    lost: &cow::CowLost,
) -> Result<DumpReport> {
    tracing::info!(
        pid = lost.pid,
        "write-protected copy abandoned ({}); dumping again from a fork snapshot",
        lost.why
    );
    let mut r = dump_once(store, opts, tracker, CowMethod::Fork, None)?;
    if let Some(c) = r.concurrent.as_mut() {
        c.fallback = Some(format!("process {}: {}", lost.pid, lost.why));
    }
    Ok(r)
}

/// A concurrent dump (`opts.concurrent`, `opts.leave_running`) by
/// write-protection kept from one dump to the next ([`cow::CowTracking`]):
/// incremental against the previous one if it was made this way and
/// committed, else full. If the process gives back memory not yet saved,
/// the dump is made again from a fork snapshot (full; the next one starts
/// tracking over).
pub fn dump_concurrent_tracked(
    store: &ImageDir,
    opts: &DumpOptions,
    tracking: &mut cow::CowTracking,
) -> Result<DumpReport> {
    match dump_once(store, opts, None, CowMethod::Uffd, Some(tracking)) {
        Ok(r) => Ok(r),
        Err(CaptureError::CowLost(lost)) => {
            *tracking = cow::CowTracking::default();
            let mut r = dump_from_fork(store, opts, None, &lost)?;
            r.note = Some("write-protection was lost, the next dump is full".into());
            Ok(r)
        }
        Err(e) => {
            *tracking = cow::CowTracking::default();
            Err(e)
        }
    }
}

/// Figures of a concurrent dump.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ConcurrentStats {
    /// How the freeze instant's pages were kept: `uffd` (write-protection
    /// and fault handlers, [`cow`]) or `fork` (a copy-on-write snapshot,
    /// [`snapshot`]).
    pub method: String,
    /// Pages copied after the tree was released.
    pub pages_after_release: u64,
    /// `uffd`: write faults handled during the copy (exact). `fork`: minor
    /// faults the tree took during the copy (an upper bound on its
    /// copy-on-write faults).
    pub write_faults: u64,
    /// Peak of the memory held for pages the tree wrote before they were
    /// saved, in bytes. `uffd`: the side buffer. `fork`: the snapshots'
    /// private memory (sampled after a 32 MiB piece at most every 50 ms,
    /// and after every piece near the cap).
    pub cow_peak_bytes: u64,
    /// `uffd`: time from reading a write fault to waking its writer,
    /// median, 99th percentile and worst, in microseconds.
    pub fault_p50_us: Option<f64>,
    pub fault_p99_us: Option<f64>,
    pub fault_max_us: Option<f64>,
    /// `uffd`: write faults that waited for room in the full side buffer,
    /// and how long they waited in all, in microseconds.
    pub writer_waits: u64,
    pub writer_wait_us: u64,
    /// `fork`: times the tree was stopped because the copy-on-write memory
    /// exceeded the cap.
    pub paused: u32,
    /// How long it was stopped for that, in microseconds.
    pub paused_us: u64,
    /// `fork`: time the tree was stopped to reap the snapshots, in
    /// microseconds.
    pub reap_stop_us: u64,
    /// `uffd`: time the tree was stopped before the checkpoint's freeze to
    /// be given its userfaultfds, in microseconds (a downtime too).
    pub prepare_stop_us: u64,
    /// Why a write-protected copy was abandoned and the dump made again
    /// from a fork snapshot (`--cow-method auto`).
    pub fallback: Option<String>,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_method_per_request() {
        assert_eq!(CowMethod::Auto.concurrent(false).unwrap(), CowMethod::Uffd);
        assert_eq!(CowMethod::Auto.concurrent(true).unwrap(), CowMethod::Fork);
        assert_eq!(CowMethod::Fork.concurrent(false).unwrap(), CowMethod::Fork);
        assert_eq!(CowMethod::Uffd.concurrent(false).unwrap(), CowMethod::Uffd);
        let e = CowMethod::Uffd.concurrent(true).unwrap_err();
        assert!(e.to_string().contains("--cow-method auto or fork"), "{e}");
    }
}
