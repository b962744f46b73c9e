//! Freeze a process tree, read its state and memory, and write a Stasis image.
//!
//! # The path of a dump
//! 1. **Pre-flight, untouched**: the root process exists, and every fd and
//!    mapping of the tree is of a supported kind. Anything unsupported is
//!    refused here, before any process is even stopped.
//! 2. **Freeze** the tree ([`freeze`]): every thread of every process
//!    (children are found after their parent is frozen, threads are listed
//!    until no new one appears): `PTRACE_SEIZE` + `PTRACE_INTERRUPT`; every signal is
//!    blocked through `PTRACE_SETSIGMASK` so remote syscalls cannot be
//!    disturbed (signals arriving meanwhile stay pending and are recorded).
//! 3. **Registers**: general registers (normalised so an interrupted syscall
//!    restarts) and the XSAVE area.
//! 4. **Remote syscalls** (a `syscall` instruction found in the vDSO): a
//!    scratch page is mapped, `rt_sigaction` of every signal, `sigaltstack`,
//!    `getitimer` and `brk(0)` are run inside the process, and the page is
//!    unmapped again.
//! 5. **/proc**: maps, stat, status, limits, auxv, fds and fdinfo
//!    ([`fds`]: fds sharing one open file description across the tree are
//!    found with `kcmp`; pipe contents are copied with `tee`).
//! 6. **Memory**: `PAGEMAP_SCAN` finds the pages that hold private data; they
//!    are read with `process_vm_readv` in large batches and streamed into the
//!    page pack.
//! 7. **Commit** the checkpoint atomically, then kill the process; or, with
//!    `leave_running`, put its registers and mask back, detach, and then
//!    commit (the process does not wait for the fsyncs).
//!
//! Any failure before the commit puts the process back exactly as it was
//! and leaves no checkpoint behind.

pub mod cow;
pub mod fds;
pub mod freeze;
pub mod guard;
pub mod incremental;
pub mod memory;
pub mod proc;
pub mod process;
pub mod remote;
pub mod remote_state;
pub mod snapshot;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use stasis_image::manifest::{DumpStats, HostInfo, Manifest};
use stasis_image::{ImageDir, ImageError};
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::KernelError;
use stasis_sys as sys;
pub use stasis_track::DirtyTracker;

/// Errors of a dump. Each leaves the target running as it was.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("process {pid} does not exist: check the PID (`ps -p {pid}`)")]
    NoSuchProcess { pid: i32 },
    #[error("cannot dump process {pid}: {what}")]
    Unsupported { pid: i32, what: String },
    #[error("process {pid} is still putting itself back after a dump that was killed: try again in a moment")]
    Escaping { pid: i32 },
    #[error("cannot trace process {pid}: permission denied reading /proc/{pid}/{file} (run stasis as root, or as the process's owner with CAP_SYS_PTRACE)")]
    Permission { pid: i32, file: String },
    #[error("reading /proc/{pid}/{file} failed")]
    Proc {
        pid: i32,
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected content in /proc/{pid}/{file}: {what}")]
    ProcFormat {
        pid: i32,
        file: String,
        what: String,
    },
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
            CaptureError::Proc {
                pid,
                file: file.into(),
                source: e,
            }
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
}

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
}

/// Dumps the process tree rooted at `opts.pid` into `store` as a new checkpoint.
pub fn dump(store: &ImageDir, opts: &DumpOptions) -> Result<DumpReport> {
    dump_tracked(store, opts, None)
}

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
    let method = match (opts.cow_method, tracker.is_some()) {
        (CowMethod::Uffd, true) => {
            return Err(CaptureError::Concurrent(
                "--cow-method uffd cannot be used with dirty tracking (the tracker's userfaultfd already holds the areas): use --cow-method auto or fork".into(),
            ))
        }
        (CowMethod::Fork, _) | (CowMethod::Auto, true) => CowMethod::Fork,
        _ => CowMethod::Uffd,
    };
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

/// One attempt of [`dump_tracked`]; `method` (`Uffd` or `Fork`) is how a
/// concurrent dump keeps its pages; `tracking`: write-protection kept
/// between dumps ([`dump_concurrent_tracked`]).
fn dump_once(
    store: &ImageDir,
    opts: &DumpOptions,
    mut tracker: TrackerRef<'_>,
    method: CowMethod,
    mut tracking: Option<&mut cow::CowTracking>,
) -> Result<DumpReport> {
    let t0 = Instant::now();
    preflight(opts.pid)?;
    let root_start = || {
        proc::read(opts.pid, "stat")
            .ok()
            .and_then(|s| proc::parse_stat(&s).ok())
            .map_or(0, |s| s.start_time)
    };
    let base = match (&tracker, tracking.as_deref()) {
        (None, Some(ct)) => ct.base(store, opts.pid, root_start()),
        _ => match &tracker {
            Some(t) => incremental::base(store, &**t, opts.pid, root_start()),
            None => Err(String::new()),
        },
    };
    // TCP listeners take no new connection until the dump is over (the
    // queue drains meanwhile): a connection waiting to be accepted cannot
    // be checkpointed.
    // Write-protected concurrent dumps protect memory before the freeze.
    let mut cow = tracking.as_deref_mut().and_then(|t| t.cow.take());
    if opts.concurrent && opts.leave_running && method == CowMethod::Uffd && cow.is_none() {
        let mut c = if tracking.is_some() {
            cow::CowTracking::new_cow(opts.cow_cap)
        } else {
            cow::Cow::new(opts.cow_cap)
        };
        match c.prepare(opts.pid) {
            Ok(()) => cow = Some(c),
            Err(e @ CaptureError::NoSuchProcess { .. }) => return Err(e),
            Err(e) => {
                return Err(CaptureError::CowLost(cow::CowLost {
                    pid: opts.pid,
                    why: format!("write-protecting its memory failed: {e}"),
                }))
            }
        }
    }
    let gate = fds::AcceptGate::close(&proc::tree_pids(opts.pid));
    gate.drain(BACKLOG_PATIENCE);
    let (mut frozen, frozen_at) = freeze_without_backlog(opts.pid)?;
    if let Some(c) = &cow {
        c.name_restarted_syscalls(&mut frozen);
        c.enter_checkpoint();
    }
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
    // TCP sockets in repair mode: closed silently after a kill (no FIN, no
    // RST reaches the peer), or taken out of repair when the tree runs on.
    let mut repaired = fds::Repairs::default();
    let result = capture_frozen(
        store,
        (opts, method, &mut cow),
        &mut frozen,
        (t0, frozen_at),
        &mut repaired,
        (base, tracker.as_deref_mut()),
    );
    let unrepair = fds::leave_repair;
    let progress = opts.progress.as_deref();
    // Stop-the-world: the pages are copied while the tree is frozen.
    let result = result.and_then(|mut p| {
        if !p.concurrent() {
            p.copy(opts.pid, tracker.as_deref_mut(), progress, 0)?;
            tracing::debug!(ms = ms(frozen_at), "pages copied");
        }
        Ok(p)
    });
    match result {
        Ok(mut pending) if opts.leave_running => {
            // The tree runs on while the checkpoint is copied (concurrent),
            // synced and committed: if that fails, it runs on as if nothing
            // happened. Its listeners take connections again at once.
            unrepair(repaired);
            frozen.release()?;
            drop(gate);
            let frozen_us = micros(frozen_at);
            if pending.concurrent() {
                let copied = pending.copy(opts.pid, tracker, progress, opts.cow_cap);
                let reaped = pending.drop_snapshots(opts.pid);
                copied?;
                let reap_us = reaped?;
                if let Some(c) = pending.report.concurrent.as_mut() {
                    c.reap_stop_us = reap_us;
                }
            }
            let kept = pending.kept.take();
            let mut report = pending.finish(store)?;
            report.frozen_us = frozen_us;
            report.total_us = micros(t0);
            if let (Some(t), Some((cow, procs))) = (tracking, kept) {
                // Committed: writes from this freeze on are tracked.
                t.cow = Some(cow);
                t.armed_at = Some(report.checkpoint);
                t.procs = procs;
                report.armed = Some(cow::TRACK_NAME.into());
            }
            Ok(report)
        }
        Ok(pending) => {
            // Killed only once the checkpoint is committed.
            let mut report = match pending.finish(store) {
                Ok(r) => r,
                Err(e) => {
                    unrepair(repaired);
                    if let Err(re) = frozen.release() {
                        tracing::error!(
                            "could not resume the tree of {} after a failed commit: {re}",
                            opts.pid
                        );
                    }
                    return Err(e);
                }
            };
            frozen.kill();
            drop(repaired);
            report.killed = true;
            report.frozen_us = micros(frozen_at);
            report.total_us = micros(t0);
            Ok(report)
        }
        Err(e) => {
            // Put the tree back as it was; report the original error.
            unrepair(repaired);
            if let Err(re) = frozen.release() {
                tracing::error!(
                    pid = opts.pid,
                    "could not resume the tree of {} after a failed dump: {re}",
                    opts.pid
                );
            }
            Err(e)
        }
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
/// then refused with a message.
fn freeze_without_backlog(pid: i32) -> Result<(freeze::Frozen, Instant)> {
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let mut frozen = freeze::freeze_tree(pid)?;
        let frozen_at = Instant::now();
        let pids: Vec<i32> = frozen
            .procs
            .iter()
            .filter(|p| p.zombie.is_none())
            .map(|p| p.pid)
            .collect();
        match fds::transient_socket(&pids) {
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
            _ => return Ok((frozen, frozen_at)),
        }
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
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
            return Err(CaptureError::Unsupported {
                pid,
                what: format!(
                    "its pages are still arriving from a lazy restore after {} s; wait for the restore's page filler to finish, then dump again",
                    LAZY_FILL_WAIT.as_secs()
                ),
            });
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
        return Err(CaptureError::Unsupported {
            pid,
            what: "stasis cannot dump itself".into(),
        });
    }
    let stat = proc::read_parsed(pid, "stat", proc::parse_stat)?;
    if stat.state == 'Z' || stat.state == 'X' {
        return Err(CaptureError::Unsupported {
            pid,
            what: "it is a zombie (it has exited and waits to be reaped)".into(),
        });
    }
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        wait_lazy_fill(p)?;
        let Ok(maps) = proc::read(p, "maps") else {
            continue;
        };
        if maps.trim().is_empty() {
            if p == pid {
                return Err(CaptureError::Unsupported {
                    pid,
                    what: "it is a kernel thread (it has no memory map)".into(),
                });
            }
            continue; // a zombie child
        }
        for fd in fds::list_fds(p).unwrap_or_default() {
            let Ok(link) = proc::read_link(p, &format!("fd/{fd}")) else {
                continue;
            };
            if let Some(what) = fds::unsupported_reason(p, fd, &link) {
                return Err(CaptureError::Unsupported { pid: p, what });
            }
        }
        for m in proc::parse_maps(&maps).map_err(|e| proc::format_err(p, "maps", e))? {
            memory::vma_kind(&m).map_err(|what| CaptureError::Unsupported { pid: p, what })?;
        }
        if let Ok(tasks) = std::fs::read_dir(proc::proc_path(p, "task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    queue.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
                }
            }
        }
    }
    Ok(())
}

/// The incremental base (or why there is none) and the tracker.
type Tracking<'a> = (
    std::result::Result<incremental::Base, String>,
    TrackerRef<'a>,
);

fn capture_frozen(
    store: &ImageDir,
    opts: (&DumpOptions, CowMethod, &mut Option<cow::Cow>),
    f: &mut freeze::Frozen,
    times: (Instant, Instant),
    repaired: &mut fds::Repairs,
    tracking: Tracking<'_>,
) -> Result<Pending> {
    let mut collector = fds::FdCollector::default();
    let r = capture_with(store, opts, f, times, &mut collector, tracking);
    // Sockets put in repair mode go back to the caller whatever happened.
    *repaired = std::mem::take(&mut collector.repaired);
    r
}

fn capture_with(
    store: &ImageDir,
    (opts, method, cow_slot): (&DumpOptions, CowMethod, &mut Option<cow::Cow>),
    f: &mut freeze::Frozen,
    (t0, frozen_at): (Instant, Instant),
    collector: &mut fds::FdCollector,
    (base, mut tracker): Tracking<'_>,
) -> Result<Pending> {
    let (base, mut note) = match base {
        Ok(b) => (Some(b), None),
        Err(why) => (None, (!why.is_empty()).then_some(why)),
    };
    let by_content = tracker
        .as_ref()
        .is_some_and(|t| t.backend() == stasis_track::Backend::Hash);
    // Per live process: its areas as the tracker sees them, and what to
    // save in an incremental dump.
    let mut areas_of: Vec<Vec<stasis_track::Area>> = Vec::new();
    let mut selections: Vec<Option<incremental::Selection>> = Vec::new();
    // State of every process.
    let mut images = Vec::new();
    let mut plans = Vec::new();
    let mut mems = Vec::new();
    let mut seen_shm = HashSet::new();
    let mut deferred: Vec<Option<Deferred>> = Vec::new();
    // Per process: pages with data not write-protected (write-protected
    // concurrent dumps).
    let mut unprotected_of: Vec<Vec<(u64, u64)>> = Vec::new();
    let mut xfeatures = 0;
    let live: Vec<i32> = f
        .procs
        .iter()
        .filter(|p| p.zombie.is_none())
        .map(|p| p.pid)
        .collect();
    collector.freeze_tcp(&live)?;
    for fp in &mut f.procs {
        if let Some(status) = fp.zombie {
            images.push(process::zombie_image(fp.pid, status)?);
            deferred.push(None);
            areas_of.push(Vec::new());
            selections.push(None);
            unprotected_of.push(Vec::new());
            plans.push(None);
            mems.push(None);
            collector.tables.push(Vec::new());
            continue;
        }
        let mem = ProcessMemory::open(fp.pid)?;
        let (mut image, maps, x) = process::capture(fp, &mem)?;
        tracing::debug!(
            pid = fp.pid,
            ms = ms(frozen_at),
            "registers and process state read"
        );
        xfeatures = x;
        // VmFlags (for "grows down") come from smaps, whose page walk costs
        // milliseconds per GiB: an incremental dump reuses the parent's
        // when the process has exactly the same areas.
        let parent_proc = base
            .as_ref()
            .and_then(|b| stasis_image::chain::same_process(&b.parent, &image));
        let fork = opts.concurrent && opts.leave_running && method == CowMethod::Fork;
        let mut selection = None;
        let (mut plan, no_fork, areas) = if fork {
            // The snapshot first: the pages are looked for in it after the
            // release; only what a fork does not copy is planned now.
            let snap = snapshot::take(fp)?;
            let child_maps = proc::read_parsed(snap.pid, "maps", proc::parse_maps)?;
            let no_fork: Vec<u64> = maps
                .iter()
                .filter(|m| m.name != "[vsyscall]")
                .filter(|m| {
                    !child_maps
                        .iter()
                        .any(|c| c.start == m.start && c.end == m.end)
                })
                .map(|m| m.start)
                .collect();
            let mut plan =
                memory::plan_with(fp.pid, &maps, &[], &mut seen_shm, memory::Scan::None)?;
            let unforked: Vec<proc::MapsEntry> = maps
                .iter()
                .filter(|m| !m.shared && no_fork.contains(&m.start))
                .cloned()
                .collect();
            plan.ranges
                .extend(memory::plan(fp.pid, &unforked, &[], &mut HashSet::new())?.ranges);
            plan.ranges.sort_unstable();
            let areas = incremental::areas(&plan.vmas);
            let mut collected = None;
            if let (Some(b), Some(t), Some(pp)) = (&base, tracker.as_mut(), parent_proc) {
                if b.state.procs.contains(&(image.pid, image.start_time)) {
                    let c = incremental::collect(&mut **t, image.pid, &areas)?;
                    if incremental::tracking_lost(t.backend(), &c) {
                        note.get_or_insert_with(|| lost_note(image.pid));
                    } else {
                        let parent_data = stasis_image::chain::data_ranges(&b.parent, pp)?;
                        collected = Some((c, parent_data));
                    }
                }
            }
            let shm_seen: HashSet<u64> = maps.iter().filter(|m| m.shared).map(|m| m.ino).collect();
            deferred.push(Some(Deferred {
                snapshot: Some(snap),
                maps: maps.clone(),
                collected,
                shm_seen,
            }));
            (plan, no_fork, areas)
        } else {
            deferred.push(None);
            // VmFlags (for "grows down") come from smaps, whose page walk
            // costs milliseconds per GiB: an incremental dump reuses the
            // parent's when the process has exactly the same areas.
            // A write-protected concurrent dump read them before the freeze.
            let reuse = parent_proc
                .and_then(|pp| incremental::same_layout(pp, &maps))
                .or_else(|| cow_slot.as_ref().and_then(|c| c.growsdown(fp.pid, &maps)));
            let growsdown = match reuse {
                Some(g) => g,
                None => proc::parse_smaps_growsdown(&proc::read(fp.pid, "smaps")?),
            };
            let scan = if cow_slot.is_some() {
                memory::Scan::DataAndProtection
            } else {
                memory::Scan::Data
            };
            let mut plan = memory::plan_with(fp.pid, &maps, &growsdown, &mut seen_shm, scan)?;
            tracing::debug!(pid = fp.pid, ms = ms(frozen_at), "pages with data found");
            let areas = incremental::areas(&plan.vmas);
            if let (Some(b), Some(t), Some(pp)) = (&base, tracker.as_mut(), parent_proc) {
                if b.state.procs.contains(&(image.pid, image.start_time)) {
                    let parent_data = stasis_image::chain::data_ranges(&b.parent, pp)?;
                    let data = memory::spans(&plan.ranges);
                    let collected = incremental::collect(&mut **t, image.pid, &areas)?;
                    tracing::debug!(pid = fp.pid, ms = ms(frozen_at), "dirty pages found");
                    if incremental::tracking_lost(t.backend(), &collected) {
                        note.get_or_insert_with(|| lost_note(image.pid));
                    } else {
                        let sel = incremental::select_collected(&collected, &data, &parent_data);
                        plan.ranges = memory::lengths(&sel.read);
                        image.data_ranges = Some(data);
                        selection = Some(sel);
                    }
                }
            } else if let (Some(b), Some(_), Some(pp)) = (&base, cow_slot.as_ref(), parent_proc) {
                // Write-protection kept since the parent: the pages with
                // data that lost their protection are those written since.
                if b.state.procs.contains(&(image.pid, image.start_time)) {
                    let parent_data = stasis_image::chain::data_ranges(&b.parent, pp)?;
                    let data = memory::spans(&plan.ranges);
                    let collected: Vec<(stasis_track::Area, stasis_track::Dirty)> = areas
                        .iter()
                        .map(|a| {
                            let d = if a.private_anon {
                                stasis_track::Dirty::Ranges(stasis_image::chain::intersect(
                                    &plan.unprotected,
                                    &[(a.start, a.end)],
                                ))
                            } else {
                                stasis_track::Dirty::All
                            };
                            (*a, d)
                        })
                        .collect();
                    let sel = incremental::select_collected(&collected, &data, &parent_data);
                    plan.ranges = memory::lengths(&sel.read);
                    image.data_ranges = Some(data);
                    selection = Some(sel);
                }
            }
            (plan, Vec::new(), areas)
        };
        areas_of.push(areas);
        selections.push(selection);
        for v in plan
            .vmas
            .iter()
            .filter(|v| matches!(v.kind, stasis_image::manifest::VmaKind::Ghost { .. }))
        {
            collector.capture_mapped_ghost(fp.pid, v.start, v.end)?;
        }
        for v in &plan.vmas {
            if let stasis_image::manifest::VmaKind::SysvShm { shmid } = v.kind {
                collector.capture_sysv(fp.pid, shmid, v.start, v.end)?;
            }
        }
        unprotected_of.push(std::mem::take(&mut plan.unprotected));
        plans.push(Some((plan, no_fork)));
        collector.add_process(fp.pid)?;
        images.push(image);
        mems.push(Some(mem));
    }

    tracing::debug!(
        ms = ms(frozen_at),
        "state and memory plan of every process read"
    );
    if opts.leave_running {
        // Every connection's state is read: packets may flow again (the
        // tree runs on; what they change is after the checkpoint's
        // instant). A dump that kills the tree keeps them out until the
        // end: a peer outside the tree must not see data acknowledged that
        // the image does not hold.
        collector.unlock_tcp();
    }
    let tree: Vec<i32> = images.iter().map(|p| p.pid).collect();
    collector.check_external_pipes(&tree)?;
    collector.check_external_sockets()?;

    // What to copy of each process (the copy itself runs later: before
    // the release, or after it from snapshots).
    let ck = store.begin_checkpoint()?;
    let incremental = base.is_some()
        && (selections.iter().any(Option::is_some)
            || deferred.iter().flatten().any(|d| d.collected.is_some()));
    let mut copies = Vec::new();
    for (idx, ((image, plan), mem)) in images.iter_mut().zip(plans).zip(mems).enumerate() {
        let (Some((plan, no_fork)), Some(mem)) = (plan, mem) else {
            continue;
        };
        image.vmas = plan.vmas;
        // Ranges a fork would not copy: shared memory, MADV_DONTFORK and
        // MADV_WIPEONFORK areas.
        let unforked: Vec<(u64, u64)> = image
            .vmas
            .iter()
            .filter(|v| v.shared || no_fork.contains(&v.start))
            .map(|v| (v.start, v.end))
            .collect();
        let mut deferred = deferred[idx].take();
        let snapshot = deferred.as_mut().and_then(|d| d.snapshot.take());
        copies.push(ProcCopy {
            idx,
            pid: image.pid,
            ranges: plan.ranges,
            mem,
            snapshot,
            unforked,
            preread: Vec::new(),
            selection: selections[idx].take(),
            deferred,
            cow: None,
            unprotected: std::mem::take(&mut unprotected_of[idx]),
        });
    }
    for (image, table) in images.iter_mut().zip(std::mem::take(&mut collector.tables)) {
        image.fds = table;
    }
    let mut ghosts: Vec<_> = std::mem::take(&mut collector.ghosts)
        .into_values()
        .collect();
    ghosts.sort_by_key(|g| g.id);
    let mut pipes: Vec<_> = std::mem::take(&mut collector.pipes).into_values().collect();
    pipes.sort_by_key(|p| p.id);

    let threads = images.iter().map(|p| p.threads.len()).sum();
    if !incremental {
        for image in &mut images {
            image.data_ranges = None;
        }
    }
    let parent = match &base {
        Some(b) if incremental => {
            if ck.number() <= b.parent.number {
                return Err(CaptureError::Track(format!(
                    "checkpoint {} would be older than its parent {}",
                    ck.number(),
                    b.parent.number
                )));
            }
            Some(b.parent.number)
        }
        _ => None,
    };
    let track_name = tracker
        .as_ref()
        .map(|t| t.backend().name().to_string())
        .or_else(|| (base.is_some() && cow_slot.is_some()).then(|| cow::TRACK_NAME.to_string()));
    let manifest = Manifest {
        checkpoint: ck.number(),
        parent,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        host: HostInfo {
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim()
                .to_string(),
            kernel_release: stasis_kernel::probe::kernel_release(),
            xfeatures,
            page_size: sys::PAGE_SIZE,
        },
        root_pid: opts.pid,
        processes: images,
        stats: DumpStats {
            frozen_us: micros(frozen_at),
            total_us: micros(t0),
            pages_written: 0,
            track: if parent.is_some() {
                track_name.clone().unwrap_or_default()
            } else {
                String::new()
            },
            note: note.clone().unwrap_or_default(),
        },
        pipes,
        ghosts,
        sysv_shm: std::mem::take(&mut collector.sysv),
    };
    let processes = manifest.processes.len();
    let checkpoint = ck.number();

    // Re-arm tracking while still frozen. It is recorded as armed only
    // once the checkpoint is committed (`Pending::finish`), so a failed
    // commit leaves no state claiming a parent that does not exist.
    let mut armed = None;
    let mut state = None;
    match tracker.as_mut() {
        Some(t) if opts.leave_running => match arm_all(&mut **t, f, &manifest, &areas_of) {
            Ok(procs) => {
                state = Some(stasis_track::state::TrackState {
                    backend: t.backend(),
                    armed_at: checkpoint,
                    root_pid: opts.pid,
                    procs,
                });
                armed = track_name.clone();
            }
            Err(e) => {
                note = Some(format!(
                    "tracking could not be re-armed, the next dump will be full: {e}"
                ));
            }
        },
        _ => {}
    }
    tracing::debug!(ms = ms(frozen_at), "tracking re-armed");

    // Concurrent: what a fork does not copy is read now; the snapshots
    // hold the rest.
    for c in copies.iter_mut().filter(|c| c.snapshot.is_some()) {
        let unforked = stasis_image::chain::normalize(c.unforked.clone());
        c.preread(&unforked)?;
    }
    // Concurrent, write-protected: private anonymous pages are protected
    // (those the prepare step left unprotected) and copied after the
    // release; the rest is read now.
    let mut cow = cow_slot.take();
    if let Some(armed) = cow.as_mut() {
        for c in copies.iter_mut() {
            let areas = stasis_image::chain::normalize(
                manifest.processes[c.idx]
                    .vmas
                    .iter()
                    .filter(|v| cow::protectable(v))
                    .map(|v| (v.start, v.end))
                    .collect(),
            );
            let spans = memory::spans(&c.ranges);
            let rest = stasis_image::chain::subtract(&spans, &areas);
            c.preread(&rest)?;
            let protect = memory::spans(&c.ranges);
            let used: Vec<(u64, u64)> = areas
                .iter()
                .filter(|a| protect.iter().any(|r| r.0 < a.1 && r.1 > a.0))
                .copied()
                .collect();
            let Some(fp) = f.procs.iter_mut().find(|p| p.pid == c.pid) else {
                continue;
            };
            let unprotected = stasis_image::chain::intersect(&c.unprotected, &protect);
            c.cow = Some(armed.arm_frozen(fp, &used, &protect, &unprotected)?);
        }
        tracing::debug!(ms = ms(frozen_at), "memory write-protected");
    }
    tracing::debug!(ms = ms(frozen_at), "ready to release");
    Ok(Pending {
        ck,
        manifest,
        state,
        copies,
        cow,
        kept: None,
        by_content,
        report: DumpReport {
            checkpoint,
            pid: opts.pid,
            processes,
            threads,
            pages: 0,
            bytes: 0,
            frozen_us: 0,
            total_us: 0,
            killed: false,
            parent,
            track: parent.and(track_name),
            armed,
            note,
            concurrent: None,
        },
    })
}

/// The pages of one process to save, and where to read them.
struct ProcCopy {
    /// Index of the process in the manifest.
    idx: usize,
    pid: i32,
    /// Ranges to save, in address order.
    ranges: Vec<(u64, usize)>,
    /// The process itself (stop-the-world, and what the snapshot lacks).
    mem: ProcessMemory,
    snapshot: Option<snapshot::Snapshot>,
    /// Areas a fork does not copy.
    unforked: Vec<(u64, u64)>,
    /// Their pages, read while frozen (concurrent dumps).
    preread: Vec<(u64, Vec<u8>)>,
    selection: Option<incremental::Selection>,
    /// Concurrent dumps: what is planned after the release.
    deferred: Option<Deferred>,
    /// Write-protected concurrent dumps: the process's index in the
    /// [`cow::Cow`], and its pages with data the prepare step left
    /// unprotected.
    cow: Option<usize>,
    unprotected: Vec<(u64, u64)>,
}

/// The part of a concurrent dump's memory plan made after the release,
/// from the snapshot: which pages hold data, `VmFlags`, and the dirty set.
struct Deferred {
    snapshot: Option<snapshot::Snapshot>,
    maps: Vec<proc::MapsEntry>,
    /// Incremental: what the tracker collected in the freeze, and the
    /// parent's data ranges of this process.
    collected: Option<Collected>,
    /// Shared memory objects (read in the freeze, not from the snapshot).
    shm_seen: HashSet<u64>,
}

/// What a tracker collected for each area, and the parent's data ranges.
type Collected = (
    Vec<(stasis_track::Area, stasis_track::Dirty)>,
    stasis_image::chain::Ranges,
);

impl ProcCopy {
    /// Concurrent dumps: plans the pages to copy from the snapshot, and
    /// fixes the process's areas (with `VmFlags` from the snapshot's smaps)
    /// and data ranges in the manifest.
    fn plan_from_snapshot(&mut self, image: &mut stasis_image::ProcessImage) -> Result<()> {
        let (Some(mut d), Some(snap)) = (self.deferred.take(), self.snapshot.as_ref()) else {
            return Ok(());
        };
        let smaps = proc::read(snap.pid, "smaps")?;
        if let Some(a) = proc::parse_smaps_flagged(&smaps, "wf").first() {
            return Err(CaptureError::Unsupported {
                pid: self.pid,
                what: format!(
                    "area {a:#x} is MADV_WIPEONFORK, which a copy-on-write snapshot does not keep: dump it without --concurrent"
                ),
            });
        }
        let growsdown = proc::parse_smaps_growsdown(&smaps);
        let plan = memory::plan(snap.pid, &d.maps, &growsdown, &mut d.shm_seen)?;
        // Shared memory and areas not mapped in the snapshot
        // (MADV_DONTFORK) were read in the freeze.
        let pre = stasis_image::chain::normalize(
            self.preread
                .iter()
                .map(|(a, b)| (*a, *a + b.len() as u64))
                .collect(),
        );
        let mut data = memory::spans(&plan.ranges);
        data.extend(pre.iter().copied());
        let data = stasis_image::chain::normalize(data);
        let read = match &d.collected {
            Some((collected, parent_data)) => {
                let sel = incremental::select_collected(collected, &data, parent_data);
                let read = sel.read.clone();
                image.data_ranges = Some(data);
                self.selection = Some(sel);
                read
            }
            None => memory::spans(&plan.ranges),
        };
        // The pre-read pieces are written whole, from their buffers.
        self.ranges = memory::lengths(&stasis_image::chain::subtract(&read, &pre));
        image.vmas = plan.vmas;
        Ok(())
    }

    /// Reads the ranges that lie in `now` (normalized spans) at once;
    /// the rest stays to copy.
    fn preread(&mut self, now: &[(u64, u64)]) -> Result<()> {
        use stasis_image::chain;
        let ranges = memory::spans(&self.ranges);
        for (a, e) in chain::intersect(&ranges, now) {
            let mut buf = vec![0u8; usize::try_from(e - a).unwrap_or(0)];
            stasis_kernel::mem::read_ranges(&self.mem, &[(a, buf.len())], &mut buf)?;
            self.preread.push((a, buf));
        }
        self.preread.sort_by_key(|p| p.0);
        self.ranges = memory::lengths(&chain::subtract(&ranges, now));
        Ok(())
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

/// Size of the pieces a concurrent dump copies, then frees in the snapshot.
const SNAPSHOT_CHUNK: usize = 32 << 20;

/// Splits ranges longer than `max` bytes.
fn split_ranges(ranges: Vec<(u64, usize)>, max: usize) -> Vec<(u64, usize)> {
    let mut out = Vec::with_capacity(ranges.len());
    for (mut a, mut l) in ranges {
        while l > max {
            out.push((a, max));
            a += max as u64;
            l -= max;
        }
        out.push((a, l));
    }
    out
}

fn lost_note(pid: i32) -> String {
    format!(
        "tracking is no longer armed in process {pid}: no area of it is registered (it called exec, or the holder of its userfaultfd exited); its pages are all saved"
    )
}

/// Minor faults of the live processes of a tree (`/proc/PID/stat` field 10).
fn minor_faults(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|p| proc::read(*p, "stat").ok())
        .filter_map(|s| {
            let close = s.rfind(')')?;
            s[close + 1..]
                .split_whitespace()
                .nth(7)?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A checkpoint written but not yet committed, and what to record once it
/// is.
struct Pending {
    ck: stasis_image::CheckpointBuilder,
    manifest: Manifest,
    state: Option<stasis_track::state::TrackState>,
    copies: Vec<ProcCopy>,
    /// Write-protected concurrent dumps: the protection and its handlers.
    cow: Option<cow::Cow>,
    /// Tracking ([`cow::CowTracking`]): the protection kept after the
    /// copy, and the processes it covers, for the next dump.
    kept: Option<(cow::Cow, Vec<(i32, u64)>)>,
    by_content: bool,
    report: DumpReport,
}

impl Pending {
    fn concurrent(&self) -> bool {
        self.cow.is_some() || self.copies.iter().any(|c| c.snapshot.is_some())
    }

    /// Copies every process's pages into its pack (from the snapshots if
    /// there are any, else from the frozen processes), then lets the
    /// tracker finish arming.
    fn copy(
        &mut self,
        root: i32,
        tracker: TrackerRef<'_>,
        progress: Option<&(dyn Fn(u64, u64) + Send)>,
        cow_cap: u64,
    ) -> Result<()> {
        if self.cow.is_some() {
            return self.copy_protected(progress);
        }
        let mut tracker = tracker;
        // Concurrent dumps plan from the snapshots first.
        for c in &mut self.copies {
            c.plan_from_snapshot(&mut self.manifest.processes[c.idx])?;
        }
        let total = self.total_bytes();
        let live: Vec<i32> = self.copies.iter().map(|c| c.pid).collect();
        let concurrent = self.concurrent();
        let snapshot_pids: Vec<i32> = self
            .copies
            .iter()
            .filter_map(|c| c.snapshot.as_ref().map(|s| s.pid))
            .collect();
        let faults0 = if concurrent { minor_faults(&live) } else { 0 };
        let mut stats = ConcurrentStats {
            method: "fork".into(),
            ..Default::default()
        };
        let mut paused: Option<(freeze::Frozen, Instant)> = None;
        let mut last_sample = Instant::now();
        let mut held_now = 0u64;
        let mut remaining = total / sys::PAGE_SIZE;
        let mut done = 0u64;
        let (mut pages, mut bytes) = (0, 0);
        let by_content = self.by_content;
        let result = (|| -> Result<()> {
            for c in &mut self.copies {
                let mut pack = self.ck.create_pack(c.pid)?;
                let pid = c.pid;
                let sel = c.selection.as_ref();
                let mut filter = |addr: u64, page: &[u8]| -> bool {
                    let changed = tracker
                        .as_mut()
                        .is_none_or(|t| t.page_changed(pid, addr, page));
                    match sel {
                        Some(s) if s.by_content => {
                            changed || incremental::contains(&s.forced, addr)
                        }
                        _ => true,
                    }
                };
                // From the snapshot, or from the frozen process itself.
                let snap_mem = c.snapshot.as_ref().map(|s| s.memory()).transpose()?;
                let src = snap_mem.as_ref().unwrap_or(&c.mem);
                // Address order: pre-read pieces between the copied ranges.
                // From a snapshot, in chunks: each chunk saved is freed in
                // the snapshot, and the copy-on-write cap is checked.
                let mut pre = std::mem::take(&mut c.preread).into_iter().peekable();
                let chunk = if c.snapshot.is_some() {
                    SNAPSHOT_CHUNK
                } else {
                    usize::MAX
                };
                let mut ranges = split_ranges(std::mem::take(&mut c.ranges), chunk)
                    .into_iter()
                    .peekable();
                loop {
                    let next_pre = pre.peek().map(|p| p.0);
                    let next_range = ranges.peek().map(|r| r.0);
                    match (next_pre, next_range) {
                        (None, None) => break,
                        (Some(a), r) if r.is_none_or(|r| a < r) => {
                            let (a, data) = pre.next().unwrap_or_default();
                            if by_content {
                                let mut f: memory::PageFilter<'_> = &mut filter;
                                memory::write_filtered(&mut pack, &mut f, a, &data)?;
                            } else {
                                pack.write_run(a, &data)?;
                            }
                            done += data.len() as u64;
                        }
                        _ => {
                            // Every range up to the next pre-read piece.
                            let mut batch = Vec::new();
                            let mut batch_len = 0usize;
                            while let Some(&(a, l)) = ranges.peek() {
                                if next_pre.is_some_and(|p| p < a)
                                    || (batch_len > 0 && batch_len + l > chunk)
                                {
                                    break;
                                }
                                batch.push((a, l));
                                batch_len += l;
                                ranges.next();
                            }
                            let size: u64 = batch.iter().map(|r| r.1 as u64).sum();
                            memory::copy_pages(
                                src,
                                batch.clone(),
                                &mut pack,
                                (done, total, progress),
                                by_content.then_some(&mut filter as memory::PageFilter<'_>),
                            )?;
                            done += size;
                            if let Some(s) = c.snapshot.as_mut() {
                                // Saved: the snapshot's copies can go.
                                for &(a, l) in &batch {
                                    s.release_range(a, l as u64)?;
                                }
                                remaining = remaining.saturating_sub(size / sys::PAGE_SIZE);
                                if paused.is_none() {
                                    // A cheap upper bound first (the tree's
                                    // minor faults since the snapshot); the
                                    // snapshots' page walk only near the cap.
                                    // (and every 50 ms at most, for the figure).
                                    let faults = minor_faults(&live).saturating_sub(faults0);
                                    let bound = faults * sys::PAGE_SIZE;
                                    let near_cap = cow_cap > 0 && bound > cow_cap;
                                    let sample_due =
                                        last_sample.elapsed() >= Duration::from_millis(50);
                                    if near_cap || sample_due {
                                        last_sample = Instant::now();
                                        let held: u64 = snapshot_pids
                                            .iter()
                                            .map(|p| snapshot::private_bytes(*p))
                                            .sum();
                                        stats.cow_peak_bytes = stats.cow_peak_bytes.max(held);
                                        held_now = held;
                                    }
                                    let held = if near_cap { held_now } else { 0 };
                                    if cow_cap > 0 && held > cow_cap && remaining > 0 {
                                        paused = Some((
                                            freeze::freeze_tree_except(root, &snapshot_pids)?,
                                            Instant::now(),
                                        ));
                                        stats.paused += 1;
                                    }
                                }
                            }
                        }
                    }
                }
                pages += pack.pages();
                bytes += pack.bytes();
                self.manifest.processes[c.idx].pack = Some(pack.finish()?);
            }
            Ok(())
        })();
        if concurrent {
            stats.write_faults = minor_faults(&live).saturating_sub(faults0);
            stats.pages_after_release = pages;
        }
        if let Some((mut p, since)) = paused {
            p.release()?;
            stats.paused_us = micros(since);
        }
        result?;
        self.manifest.stats.pages_written = pages;
        self.report.pages = pages;
        self.report.bytes = bytes;
        if let Some(t) = tracker.as_mut() {
            if self.state.is_some() {
                if let Err(e) = t.finish_arm() {
                    self.state = None;
                    self.report.armed = None;
                    self.report.note = Some(format!(
                        "tracking could not be re-armed, the next dump will be full: {e}"
                    ));
                }
            }
        }
        if concurrent {
            self.report.concurrent = Some(stats);
        }
        Ok(())
    }

    /// Bytes to save: the ranges to copy and what was read in the freeze.
    fn total_bytes(&self) -> u64 {
        self.copies
            .iter()
            .flat_map(|c| {
                c.ranges
                    .iter()
                    .map(|r| r.1 as u64)
                    .chain(c.preread.iter().map(|p| p.1.len() as u64))
            })
            .sum()
    }

    /// Copies every process's pages into its pack while the tree runs,
    /// from the write-protected processes ([`cow`]), in address order.
    fn copy_protected(&mut self, progress: Option<&(dyn Fn(u64, u64) + Send)>) -> Result<()> {
        let total = self.total_bytes();
        let (mut pages, mut bytes, mut done) = (0u64, 0u64, 0u64);
        let Some(cow) = self.cow.as_ref() else {
            return Ok(());
        };
        for c in &mut self.copies {
            let mut pack = self.ck.create_pack(c.pid)?;
            // What was read in the freeze, and the pieces to take now
            // (aligned on PIECE, so that no grain straddles two).
            let mut pieces: Vec<(u64, u64, Option<Vec<u8>>)> = std::mem::take(&mut c.preread)
                .into_iter()
                .map(|(a, d)| (a, a + d.len() as u64, Some(d)))
                .collect();
            for (a, e) in memory::spans(&c.ranges) {
                let mut s = a;
                while s < e {
                    let end = ((s / cow::PIECE + 1) * cow::PIECE).min(e);
                    pieces.push((s, end, None));
                    s = end;
                }
            }
            pieces.sort_by_key(|p| p.0);
            for (a, e, data) in pieces {
                let data = match (data, c.cow) {
                    (Some(d), _) => d,
                    (None, Some(i)) => cow.take_piece(i, a, e)?,
                    (None, None) => {
                        let mut d = vec![0u8; usize::try_from(e - a).unwrap_or(0)];
                        stasis_kernel::mem::read_ranges(&c.mem, &[(a, d.len())], &mut d)?;
                        d
                    }
                };
                pack.write_run(a, &data)?;
                done += e - a;
                if let Some(p) = progress {
                    p(done, total);
                }
            }
            pages += pack.pages();
            bytes += pack.bytes();
            self.manifest.processes[c.idx].pack = Some(pack.finish()?);
        }
        let figures = match self.cow.take() {
            Some(mut cow) if cow.is_tracking() => {
                let procs: Vec<(i32, u64)> = self
                    .copies
                    .iter()
                    .filter(|c| c.cow.is_some())
                    .map(|c| {
                        let p = &self.manifest.processes[c.idx];
                        (p.pid, p.start_time)
                    })
                    .collect();
                let f = cow.end_copy()?;
                self.kept = Some((cow, procs));
                f
            }
            Some(cow) => cow.finish()?,
            None => cow::CowFigures::default(),
        };
        self.manifest.stats.pages_written = pages;
        self.report.pages = pages;
        self.report.bytes = bytes;
        self.report.concurrent = Some(ConcurrentStats {
            method: "uffd".into(),
            pages_after_release: pages,
            write_faults: figures.faults,
            cow_peak_bytes: figures.side_peak,
            fault_p50_us: Some(figures.p50_us),
            fault_p99_us: Some(figures.p99_us),
            fault_max_us: Some(figures.max_us),
            writer_waits: figures.waits,
            writer_wait_us: figures.wait_us,
            prepare_stop_us: figures.prepare_stop_us,
            ..Default::default()
        });
        Ok(())
    }

    /// Kills the snapshots and has their parents reap them.
    fn drop_snapshots(&mut self, root: i32) -> Result<u64> {
        let mut reap = Vec::new();
        for c in &mut self.copies {
            if let Some(mut s) = c.snapshot.take() {
                s.kill();
                reap.push((s.parent, s.pid));
            }
        }
        snapshot::reap(root, &reap)
    }

    /// Commits the checkpoint, then records the tracking state (or clears
    /// it: without a committed checkpoint to be incremental against, the
    /// next dump must be full).
    fn finish(self, store: &ImageDir) -> Result<DumpReport> {
        let Pending {
            ck,
            manifest,
            state,
            mut report,
            ..
        } = self;
        if let Err(e) = ck.commit(&manifest) {
            let _ = stasis_track::state::clear(store.path());
            return Err(e.into());
        }
        match state {
            Some(s) => {
                if let Err(e) = stasis_track::state::save(store.path(), &s) {
                    report.armed = None;
                    report.note = Some(format!("tracking could not be recorded: {e}"));
                }
            }
            None => {
                let _ = stasis_track::state::clear(store.path());
            }
        }
        Ok(report)
    }
}

/// Arms the tracker on every live process of the frozen tree; returns the
/// (pid, start time) of each.
fn arm_all(
    t: &mut (dyn DirtyTracker + Send),
    f: &mut freeze::Frozen,
    manifest: &Manifest,
    areas_of: &[Vec<stasis_track::Area>],
) -> Result<Vec<(i32, u64)>> {
    let mut procs = Vec::new();
    for ((fp, img), areas) in f.procs.iter_mut().zip(&manifest.processes).zip(areas_of) {
        if fp.zombie.is_some() {
            continue;
        }
        let mut remote = remote::ThreadRemote::new(&mut fp.threads[0]);
        t.arm(fp.pid, areas, &mut remote)
            .map_err(|e| CaptureError::Track(e.to_string()))?;
        procs.push((img.pid, img.start_time));
    }
    Ok(procs)
}
