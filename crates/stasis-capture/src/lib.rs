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

pub mod fds;
pub mod freeze;
pub mod incremental;
pub mod memory;
pub mod proc;
pub mod process;

use std::collections::HashSet;
use std::time::Instant;

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
    tracker: TrackerRef<'_>,
) -> Result<DumpReport> {
    let t0 = Instant::now();
    preflight(opts.pid)?;
    let base = match &tracker {
        Some(t) => {
            let start = proc::read(opts.pid, "stat")
                .ok()
                .and_then(|s| proc::parse_stat(&s).ok())
                .map_or(0, |s| s.start_time);
            incremental::base(store, &**t, opts.pid, start)
        }
        None => Err(String::new()),
    };
    if base.is_ok() {
        // Collecting re-arms the tracking: from here until the new
        // checkpoint is committed, the old one is no base for anything.
        stasis_track::state::clear(store.path()).map_err(|e| CaptureError::Track(e.to_string()))?;
    }
    let mut frozen = freeze::freeze_tree(opts.pid)?;
    let frozen_at = Instant::now();
    // TCP sockets in repair mode: closed silently after a kill (no FIN, no
    // RST reaches the peer), or taken out of repair when the tree runs on.
    let mut repaired = Vec::new();
    let result = capture_frozen(
        store,
        opts,
        &mut frozen,
        (t0, frozen_at),
        &mut repaired,
        (base, tracker),
    );
    let unrepair = |socks: Vec<std::os::fd::OwnedFd>| {
        for s in socks {
            use std::os::fd::AsFd;
            if let Err(e) = stasis_kernel::sock::set_int(
                s.as_fd(),
                libc::IPPROTO_TCP,
                stasis_kernel::sock::TCP_REPAIR,
                stasis_kernel::sock::TCP_REPAIR_OFF_NO_WP,
            ) {
                tracing::error!("could not take a TCP socket out of repair mode: {e}");
            }
        }
    };
    match result {
        Ok(pending) if opts.leave_running => {
            // The tree runs on while the checkpoint is synced and committed:
            // if that fails, it runs on as if nothing happened.
            unrepair(repaired);
            frozen.release()?;
            let frozen_us = micros(frozen_at);
            let mut report = pending.finish(store)?;
            report.frozen_us = frozen_us;
            report.total_us = micros(t0);
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

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
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
    let stat =
        proc::parse_stat(&proc::read(pid, "stat")?).map_err(|w| CaptureError::ProcFormat {
            pid,
            file: "stat".into(),
            what: w,
        })?;
    if stat.state == 'Z' || stat.state == 'X' {
        return Err(CaptureError::Unsupported {
            pid,
            what: "it is a zombie (it has exited and waits to be reaped)".into(),
        });
    }
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
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
        for m in proc::parse_maps(&maps).map_err(|w| CaptureError::ProcFormat {
            pid: p,
            file: "maps".into(),
            what: w,
        })? {
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
    opts: &DumpOptions,
    f: &mut freeze::Frozen,
    times: (Instant, Instant),
    repaired: &mut Vec<std::os::fd::OwnedFd>,
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
    opts: &DumpOptions,
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
            areas_of.push(Vec::new());
            selections.push(None);
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
        let growsdown = match parent_proc.and_then(|pp| incremental::same_layout(pp, &maps)) {
            Some(g) => g,
            None => proc::parse_smaps_growsdown(&proc::read(fp.pid, "smaps")?),
        };
        let mut plan = memory::plan(fp.pid, &maps, &growsdown, &mut seen_shm)?;
        tracing::debug!(pid = fp.pid, ms = ms(frozen_at), "pages with data found");
        let areas = incremental::areas(&plan.vmas);
        let mut selection = None;
        if let (Some(b), Some(t), Some(pp)) = (&base, tracker.as_mut(), parent_proc) {
            let me = (image.pid, image.start_time);
            if b.state.procs.contains(&me) {
                let parent_data = stasis_image::chain::data_ranges(&b.parent, pp)?;
                let data = stasis_image::chain::normalize(
                    plan.ranges
                        .iter()
                        .map(|&(a, l)| (a, a + l as u64))
                        .collect(),
                );
                let sel = incremental::select(&mut **t, image.pid, &areas, &data, &parent_data)?;
                tracing::debug!(pid = fp.pid, ms = ms(frozen_at), "dirty pages found");
                let lost = t.backend() == stasis_track::Backend::Uffd
                    && sel.tracked == 0
                    && areas.iter().any(|a| a.private_anon);
                if lost {
                    if note.is_none() {
                        note = Some(format!(
                            "tracking is no longer armed in process {}: no area of it is registered (it called exec, or the holder of its userfaultfd exited); its pages are all saved",
                            image.pid
                        ));
                    }
                } else {
                    plan.ranges = sel
                        .read
                        .iter()
                        .map(|&(a, e)| (a, usize::try_from(e - a).unwrap_or(0)))
                        .collect();
                    image.data_ranges = Some(data);
                    selection = Some(sel);
                }
            }
        }
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
        plans.push(Some(plan));
        collector.add_process(fp.pid)?;
        images.push(image);
        mems.push(Some(mem));
    }

    tracing::debug!(
        ms = ms(frozen_at),
        "state and memory plan of every process read"
    );
    let tree: Vec<i32> = images.iter().map(|p| p.pid).collect();
    collector.check_external_pipes(&tree)?;
    collector.check_external_sockets()?;

    // Pages, streamed through a bounded pipeline, one pack per process.
    let mut ck = store.begin_checkpoint()?;
    let total: u64 = plans
        .iter()
        .flatten()
        .flat_map(|p| p.ranges.iter())
        .map(|r| r.1 as u64)
        .sum();
    let mut done = 0u64;
    let (mut pages, mut bytes) = (0, 0);
    let incremental = base.is_some() && selections.iter().any(Option::is_some);
    for (((image, plan), mem), sel) in images.iter_mut().zip(plans).zip(&mems).zip(&selections) {
        let (Some(plan), Some(mem)) = (plan, mem) else {
            continue;
        };
        let mut pack = ck.create_pack(image.pid)?;
        let size: u64 = plan.ranges.iter().map(|r| r.1 as u64).sum();
        let pid = image.pid;
        let mut filter = |addr: u64, page: &[u8]| -> bool {
            let changed = tracker
                .as_mut()
                .is_none_or(|t| t.page_changed(pid, addr, page));
            match sel {
                Some(s) if s.by_content => changed || incremental::contains(&s.forced, addr),
                _ => true,
            }
        };
        memory::copy_pages(
            mem,
            plan.ranges,
            &mut pack,
            (done, total, opts.progress.as_deref()),
            by_content.then_some(&mut filter as memory::PageFilter<'_>),
        )?;
        done += size;
        pages += pack.pages();
        bytes += pack.bytes();
        image.pack = Some(pack.finish()?);
        image.vmas = plan.vmas;
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
    tracing::debug!(ms = ms(frozen_at), pages, "pages copied");
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
    let track_name = tracker.as_ref().map(|t| t.backend().name().to_string());
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
            pages_written: pages,
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
    Ok(Pending {
        ck,
        manifest,
        state,
        report: DumpReport {
            checkpoint,
            pid: opts.pid,
            processes,
            threads,
            pages,
            bytes,
            frozen_us: 0,
            total_us: 0,
            killed: false,
            parent,
            track: parent.and(track_name),
            armed,
            note,
        },
    })
}

/// A checkpoint written but not yet committed, and what to record once it
/// is.
struct Pending {
    ck: stasis_image::CheckpointBuilder,
    manifest: Manifest,
    state: Option<stasis_track::state::TrackState>,
    report: DumpReport,
}

impl Pending {
    /// Commits the checkpoint, then records the tracking state (or clears
    /// it: without a committed checkpoint to be incremental against, the
    /// next dump must be full).
    fn finish(self, store: &ImageDir) -> Result<DumpReport> {
        let Pending {
            ck,
            manifest,
            state,
            mut report,
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
        let main = &mut fp.threads[0];
        let mut remote = incremental::FrozenRemote {
            tracee: &mut main.tracee,
            base: &main.orig_regs,
        };
        t.arm(fp.pid, areas, &mut remote)
            .map_err(|e| CaptureError::Track(e.to_string()))?;
        procs.push((img.pid, img.start_time));
    }
    t.finish_arm()
        .map_err(|e| CaptureError::Track(e.to_string()))?;
    Ok(procs)
}
