//! The stages run while the tree is frozen: **collect** (registers,
//! process state, fds), **plan memory** (by the copy strategy), and the
//! manifest of the checkpoint, with tracking re-armed and the strategy
//! readied for the copy. The result is a [`Pending`] checkpoint.

use std::time::Instant;

use stasis_image::manifest::{DumpStats, HostInfo, Manifest, ProcessImage, VmaKind};
use stasis_image::ImageDir;
use stasis_kernel::mem::ProcessMemory;
use stasis_sys as sys;

use crate::copy::{Pending, ProcCopy};
use crate::freeze::{Frozen, FrozenProcess};
use crate::incremental::Base;
use crate::strategy::{CopyStrategy, PlanCx, Planned};
use crate::{
    fds, micros, ms, process, remote, CaptureError, DirtyTracker, DumpOptions, DumpReport, Result,
    Stages, TrackerRef,
};

/// The state of a dump while the tree is frozen.
pub struct Frame<'a, 't> {
    pub store: &'a ImageDir,
    pub opts: &'a DumpOptions,
    pub t0: Instant,
    pub frozen_at: Instant,
    pub strategy: &'a mut dyn CopyStrategy,
    /// The parent of an incremental dump.
    pub base: Option<Base>,
    /// Why tracking was asked for but the dump is full, or re-arming failed.
    pub note: Option<String>,
    pub tracker: TrackerRef<'t>,
    /// Where the frozen time goes.
    pub stages: &'a mut Stages,
    /// Who holds ptys, read before the freeze (when the tree has one).
    pub pty_census: Option<stasis_objects::pty_census::Census>,
    /// The frozen tree's fds, listed once ([`stasis_objects::fd_census`]).
    pub fd_census: Option<stasis_objects::fd_census::FdCensus>,
}

/// One process of the dump: its image, and for a live one its memory
/// and what to save of it.
struct ProcRecord {
    image: ProcessImage,
    live: Option<(ProcessMemory, Planned)>,
}

/// Collects the state of the frozen tree, plans its memory, and writes
/// the manifest; the TCP sockets put in repair mode go to `repaired`
/// whatever happens.
pub fn capture_frozen(
    fr: &mut Frame<'_, '_>,
    f: &mut Frozen,
    repaired: &mut fds::Repairs,
) -> Result<Pending> {
    let mut collector = fds::FdCollector::default();
    collector.tcp_close = fr.opts.tcp_close;
    collector.skip_in_flight = fr.opts.skip_in_flight;
    collector.shell_job = fr.opts.shell_job;
    collector.fd_census = fr.fd_census.take();
    let r = capture_with(fr, f, &mut collector);
    // Sockets put in repair mode go back to the caller whatever happened.
    *repaired = std::mem::take(&mut collector.repaired);
    r
}

fn capture_with(
    fr: &mut Frame<'_, '_>,
    f: &mut Frozen,
    collector: &mut fds::FdCollector,
) -> Result<Pending> {
    let (records, xfeatures) = collect(fr, f, collector)?;
    fr.stages.mark("processes");
    if fr.opts.leave_running && fr.opts.cut.is_none() {
        // Every connection's state is read: packets may flow again (the
        // tree runs on; what they change is after the checkpoint's
        // instant). A dump that kills the tree keeps them out until the
        // end: a peer outside the tree must not see data acknowledged that
        // the image does not hold. Nor may one part of a cut before every
        // part is frozen (`Cut::frozen`): a peer on another host, not yet
        // frozen, would see acknowledged bytes that neither image holds.
        // Held again first: the windows go back through repair mode.
        if let Err(e) = collector.repaired.hold_again(&mut |p| Ok(f.hold(p)?)) {
            tracing::warn!("could not hold the owners of the TCP connections again: {e}");
        }
        collector.unlock_tcp();
    }
    let tree: Vec<i32> = records.iter().map(|r| r.image.pid).collect();
    collector.check_external_pipes(&tree)?;
    collector.check_external_ptys(&tree)?;
    collector.link_in_flight();
    collector.check_external_sockets()?;
    collector.check_ghost_watches()?;
    // Objects in /dev/shm the job names: read while it cannot change them.
    let shm_files = if fr.opts.shm_files.is_empty() {
        Vec::new()
    } else {
        stasis_objects::posix_shm::save(&fr.opts.shm_files, &held_paths(&records, collector))?
    };
    if shm_files.is_empty() && !fr.opts.shm_files.is_empty() {
        tracing::warn!(
            patterns = ?fr.opts.shm_files,
            "no object in /dev/shm matches --shm-file"
        );
    }
    let areas_of: Vec<Vec<stasis_track::Area>> = records
        .iter()
        .map(|r| {
            r.live
                .as_ref()
                .map(|l| l.1.areas.clone())
                .unwrap_or_default()
        })
        .collect();
    let mut pending = write_manifest(fr, records, collector, (xfeatures, shm_files))?;
    fr.stages.mark("manifest");
    // Re-arm tracking while still frozen. It is recorded as armed only
    // once the checkpoint is committed (`Pending::finish`), so a failed
    // commit leaves no state claiming a parent that does not exist.
    rearm(fr, f, &mut pending, &areas_of);
    fr.stages.mark("rearm");
    fr.strategy
        .before_release(&mut pending.copies, &pending.manifest, f)?;
    fr.stages.mark("protect");
    Ok(pending)
}

/// The paths of the files the tree maps or holds open.
fn held_paths(
    records: &[ProcRecord],
    collector: &fds::FdCollector,
) -> std::collections::HashSet<String> {
    let mapped = records
        .iter()
        .filter_map(|r| r.live.as_ref())
        .flat_map(|(_, p)| p.plan.vmas.iter())
        .filter_map(|v| match &v.kind {
            VmaKind::File { path, .. } => Some(path.clone()),
            _ => None,
        });
    let open = collector
        .tables
        .iter()
        .flatten()
        .filter_map(|f| match &f.kind {
            stasis_image::manifest::FdKind::Path { path, .. } => Some(path.clone()),
            _ => None,
        });
    mapped.chain(open).collect()
}

/// Reads every process of the tree: registers and state, its memory plan
/// (by the strategy), its fds. Returns the records (tree order) and the
/// XSAVE features in use.
fn collect(
    fr: &mut Frame<'_, '_>,
    f: &mut Frozen,
    collector: &mut fds::FdCollector,
) -> Result<(Vec<ProcRecord>, u64)> {
    collector.freeze_tcp(f)?;
    // While packets already past the connections' lock settle (2 ms):
    // every live process's areas. Nothing may run in a process before its
    // connections are read: a remote syscall would use up the SIGSTOP
    // that holds it, should the dumper die while a connection is in
    // repair mode (see `SaveCtx::freeze_tcp`).
    let mut maps = f
        .procs
        .iter()
        .map(|fp| match fp.zombie {
            Some(_) => Ok(Vec::new()),
            None => crate::proc::read_parsed(fp.pid, "maps", crate::proc::parse_maps),
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter();
    collector.read_tcp()?;
    fr.stages.mark("tcp");
    if let Some(c) = fr.pty_census.take() {
        collector.use_pty_census(c, &f.live_pids());
    }
    let mut records = Vec::new();
    let mut seen_shm = crate::memory::SeenShm::new();
    let mut xfeatures = 0;
    let forked = forked_pairs(&f.procs);
    for fp in &mut f.procs {
        let maps = maps.next().unwrap_or_default();
        if let Some(status) = fp.zombie {
            records.push(ProcRecord {
                image: process::zombie_image(fp.pid, status)?,
                live: None,
            });
            collector.add_zombie(fp.pid);
            continue;
        }
        let shares = forked.contains(&fp.pid);
        let (record, x) = collect_live(fr, fp, maps, collector, &mut seen_shm, shares)?;
        xfeatures = x;
        records.push(record);
    }
    Ok((records, xfeatures))
}

/// The live processes of the tree that have a live parent or child in it:
/// those whose private pages may be shared copy-on-write with another.
fn forked_pairs(procs: &[FrozenProcess]) -> std::collections::HashSet<i32> {
    let live: std::collections::HashSet<i32> = procs
        .iter()
        .filter(|p| p.zombie.is_none())
        .map(|p| p.pid)
        .collect();
    procs
        .iter()
        .filter(|p| p.zombie.is_none() && live.contains(&p.ppid))
        .flat_map(|p| [p.pid, p.ppid])
        .collect()
}

/// One live process: its state, its memory plan, the kernel objects its
/// areas and fds hold. The memory of one that `shares` pages copy-on-write
/// with another process of the tree is read through `/proc/PID/mem` only:
/// `process_vm_readv` pins the pages it reads, and the kernel gives the
/// process its own copy of a shared page before it is pinned (a tree left
/// running would come out of the dump with the memory its processes shared
/// copied for each; see [`ProcessMemory::open_for_snapshot`]).
fn collect_live(
    fr: &mut Frame<'_, '_>,
    fp: &mut FrozenProcess,
    maps: Vec<crate::proc::MapsEntry>,
    collector: &mut fds::FdCollector,
    seen_shm: &mut crate::memory::SeenShm,
    shares: bool,
) -> Result<(ProcRecord, u64)> {
    let mem = if shares {
        ProcessMemory::open_for_snapshot(fp.pid)?
    } else {
        ProcessMemory::open(fp.pid)?
    };
    // (process::capture logs its own times.)
    let (mut image, maps, xfeatures) = process::capture(fp, &mem, maps)?;
    // VmFlags (for "grows down") come from smaps, whose page walk costs
    // milliseconds per GiB: an incremental dump reuses the parent's
    // when the process has exactly the same areas.
    let parent_proc = fr.base.as_ref().and_then(|b| {
        if b.parent.manifest.namespaces.as_ref().is_some_and(|n| n.pid) {
            // The parent names the tree's processes by their PIDs in its
            // PID namespace.
            let inner = stasis_kernel::ns::pid_in_own_ns(fp.pid, fp.pid)?;
            b.parent.manifest.processes.iter().find(|q| {
                q.pid == inner
                    && q.zombie.is_none()
                    && (q.start_time == 0
                        || image.start_time == 0
                        || q.start_time == image.start_time)
            })
        } else {
            stasis_image::chain::same_process(&b.parent, &image)
        }
    });
    let cx = PlanCx {
        fp: &mut *fp,
        image: &mut image,
        maps: &maps,
        frozen_at: fr.frozen_at,
        base: fr.base.as_ref(),
        parent_proc,
        tracker: fr.tracker.as_deref_mut(),
        note: &mut fr.note,
        seen_shm,
    };
    let t_plan = Instant::now();
    let mut planned = fr.strategy.plan(cx)?;
    socket_ring_fds(fp.pid, &mut planned.plan.vmas)?;
    bpf_map_fds(fp.pid, &mut planned.plan.vmas)?;
    let plan_us = t_plan.elapsed().as_micros();
    for v in planned
        .plan
        .vmas
        .iter()
        .filter(|v| matches!(v.kind, VmaKind::Ghost { .. }))
    {
        collector.capture_mapped_ghost(fp.pid, v.start, v.end)?;
    }
    for v in planned
        .plan
        .vmas
        .iter()
        .filter(|v| matches!(v.kind, VmaKind::Aio))
    {
        if let Some(ring) = waiting_aio_events(fp.pid, &mem, v.start, v.end)? {
            image.aio_rings.push(ring);
        }
    }
    let maps_ring = planned
        .plan
        .vmas
        .iter()
        .any(|v| matches!(v.kind, VmaKind::IoUring { .. }));
    if maps_ring {
        stasis_objects::io_uring::check_areas(fp.pid)?;
    }
    for v in &mut planned.plan.vmas {
        if let VmaKind::SysvShm {
            shmid,
            offset,
            ref mut partial,
        } = v.kind
        {
            *partial = collector.capture_sysv(fp.pid, shmid, (v.start, v.end), offset)?;
        }
    }
    io_uring_issuers(fp, &image, collector, maps_ring)?;
    collector.add_process(fp.pid)?;
    // A userfaultfd of the program: its areas are filled by the restore
    // itself (no lazy filler), and Stasis's own userfaultfd (tracking,
    // write-protected copies) cannot share them.
    let uffd = collector.uffd_ranges(fp.pid);
    if !uffd.is_empty() {
        let ours = fr
            .tracker
            .as_ref()
            .is_some_and(|t| t.backend().name() == "uffd")
            || fr.strategy.method() == Some("uffd")
            || fr.strategy.track_name() == Some("uffd");
        if ours {
            return Err(stasis_objects::SaveError::Unsupported {
                pid: fp.pid,
                what: "it has a userfaultfd of its own over its memory, which stasis's userfaultfd write tracking or write-protected copy cannot share: dump it with --track hash (or soft-dirty, where the kernel keeps it) and --cow-method fork".into(),
            }
            .into());
        }
        for v in &mut planned.plan.vmas {
            if uffd.iter().any(|&(s, e)| s < v.end && v.start < e) {
                v.flags |= stasis_sys::vmflags::USERFAULTFD;
            }
        }
    }
    tracing::debug!(
        pid = fp.pid,
        plan_us,
        fds_us = t_plan.elapsed().as_micros() - plan_us,
        ms = ms(fr.frozen_at),
        "memory planned and fds saved"
    );
    Ok((
        ProcRecord {
            image,
            live: Some((mem, planned)),
        },
        xfeatures,
    ))
}

/// `BPF_MAP_TYPE_ARRAY`, and the map kinds a process may map
/// (`RINGBUF`, `USER_RINGBUF`, `ARENA`; an array with `BPF_F_MMAPABLE`).
const BPF_ARRAY: u64 = 2;
const BPF_MAPPABLE_KINDS: [u64; 3] = [27, 31, 33];
const BPF_F_MMAPABLE: u64 = 0x400;

/// What the fdinfo of a BPF map fd says: (map id, type, flags, bytes of
/// its values: `value_size * max_entries`).
fn bpf_fdinfo(text: &str) -> Option<(u64, u64, u64, u64)> {
    let field = |k: &str| -> Option<u64> {
        let v = text.lines().find_map(|l| l.strip_prefix(k))?.trim();
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
    };
    Some((
        field("map_id:")?,
        field("map_type:")?,
        field("map_flags:")?,
        field("value_size:")?.checked_mul(field("max_entries:")?)?,
    ))
}

/// Finds, for each area mapping a BPF map, the fd of the process on that
/// map (it is mapped again from it at restore). The kernel does not say
/// which map an area maps (they share one anonymous inode), so the
/// process must hold fds on one mappable map only, a `BPF_F_MMAPABLE`
/// array that the area fits in; other cases are refused.
fn bpf_map_fds(pid: i32, vmas: &mut [stasis_image::manifest::Vma]) -> Result<()> {
    let mut areas = vmas
        .iter_mut()
        .filter_map(|v| match &mut v.kind {
            VmaKind::BpfMap { fd, offset } => Some((v.start, v.end, *offset, fd)),
            _ => None,
        })
        .peekable();
    if areas.peek().is_none() {
        return Ok(());
    }
    let refuse = |what: String| -> crate::CaptureError {
        crate::SaveError::Unsupported { pid, what }.into()
    };
    // (fd, map id, type, flags, bytes) of its fds on mappable maps.
    let mut maps = Vec::new();
    for n in stasis_objects::save::list_fds(pid)? {
        let link = std::fs::read_link(format!("/proc/{pid}/fd/{n}")).unwrap_or_default();
        if link.as_os_str() != "anon_inode:bpf-map" {
            continue;
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{n}")).unwrap_or_default();
        let Some((id, t, flags, bytes)) = bpf_fdinfo(&text) else {
            return Err(refuse(format!(
                "fd {n} is a BPF map whose fdinfo does not say its id, type, flags and size: {text:?}"
            )));
        };
        if BPF_MAPPABLE_KINDS.contains(&t) || (t == BPF_ARRAY && flags & BPF_F_MMAPABLE != 0) {
            maps.push((n, id, t, flags, bytes));
        }
    }
    let mut ids: Vec<u64> = maps.iter().map(|m| m.1).collect();
    ids.sort_unstable();
    ids.dedup();
    for (start, end, offset, fd) in areas {
        let area = format!("area {start:#x}-{end:#x}");
        let [id] = ids[..] else {
            return Err(refuse(format!(
                "{area} maps a BPF map, and the process holds fds on {} maps it could be (the kernel does not say which); stasis maps one BPF_F_MMAPABLE array again, held by an fd of the process",
                ids.len()
            )));
        };
        let Some(&(n, _, t, _, bytes)) = maps.iter().find(|m| m.1 == id) else {
            continue;
        };
        if t != BPF_ARRAY {
            return Err(refuse(format!(
                "{area} maps the BPF map of fd {n}, of type {t} (a ring buffer or arena); stasis maps BPF_F_MMAPABLE arrays again only"
            )));
        }
        let page = 4096u64;
        let size = bytes.div_ceil(page) * page;
        if offset.saturating_add(end - start) > size {
            return Err(refuse(format!(
                "{area} maps beyond the values ({bytes} bytes) of the BPF array of fd {n}, the only one it could map"
            )));
        }
        *fd = n;
    }
    Ok(())
}

/// Finds, for each area mapping a socket's rings, an fd of the process on
/// that socket (it is mapped again from it at restore). None is refused.
fn socket_ring_fds(pid: i32, vmas: &mut [stasis_image::manifest::Vma]) -> Result<()> {
    let mut rings = vmas
        .iter_mut()
        .filter_map(|v| match &mut v.kind {
            VmaKind::SocketRing { ino, fd, .. } => Some((v.start, v.end, *ino, fd)),
            _ => None,
        })
        .peekable();
    if rings.peek().is_none() {
        return Ok(());
    }
    let fds = stasis_objects::save::list_fds(pid)?;
    for (start, end, ino, fd) in rings {
        let link = format!("socket:[{ino}]");
        *fd = fds
            .iter()
            .copied()
            .find(|n| {
                std::fs::read_link(format!("/proc/{pid}/fd/{n}"))
                    .is_ok_and(|l| l.as_os_str() == link.as_str())
            })
            .ok_or_else(|| crate::SaveError::Unsupported {
                pid,
                what: format!(
                    "area {start:#x}-{end:#x} maps the rings of {link}, which no fd of the process holds any more, which stasis cannot checkpoint"
                ),
            })?;
    }
    Ok(())
}

/// The ring of the AIO context at `start` if it holds completed events the
/// program has not read (its `head` and `tail` differ): they are restored
/// in place (`stasis_restore::build::aio_refill`); an empty ring needs
/// nothing but a new context of the same size at the same address.
/// Requests still in flight are not visible from outside: see the README.
fn waiting_aio_events(
    pid: i32,
    mem: &ProcessMemory,
    start: u64,
    end: u64,
) -> Result<Option<stasis_image::manifest::AioRing>> {
    let mut h = [0u8; 16];
    mem.read(start, &mut h)?;
    let word = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let (nr, head, tail) = (
        word(stasis_sys::aio::AIO_RING_NR),
        word(stasis_sys::aio::AIO_RING_HEAD),
        word(stasis_sys::aio::AIO_RING_TAIL),
    );
    if head == tail {
        return Ok(None);
    }
    // The kernel's own header (`nr`) must agree with the area's size.
    let len = u64::from(nr) * AIO_EVENT;
    if head >= nr || tail >= nr || AIO_RING_HEADER + len > end - start {
        return Err(crate::SaveError::Unsupported {
            pid,
            what: format!(
                "its AIO context {start:#x} has a ring header that does not fit its area (nr {nr}, head {head}, tail {tail})"
            ),
        }
        .into());
    }
    let mut events = vec![0u8; usize::try_from(len).unwrap_or(0)];
    mem.read(start + AIO_RING_HEADER, &mut events)?;
    Ok(Some(stasis_image::manifest::AioRing {
        start,
        head,
        tail,
        events,
    }))
}

/// `struct aio_ring`'s header, and one `struct io_event`.
const AIO_RING_HEADER: u64 = stasis_sys::aio::AIO_RING_HEADER_LEN as u64;
const AIO_EVENT: u64 = stasis_sys::aio::IO_EVENT_LEN as u64;

/// What to copy of each process (the copy itself runs later: before the
/// release, or after it), and the manifest.
fn write_manifest(
    fr: &mut Frame<'_, '_>,
    records: Vec<ProcRecord>,
    collector: &mut fds::FdCollector,
    (xfeatures, shm_files): (
        u64,
        Vec<(
            stasis_image::manifest::ShmFile,
            stasis_objects::content::PendingContent,
        )>,
    ),
) -> Result<Pending> {
    let mut ck = fr.store.begin_checkpoint()?;
    let incremental = fr.base.is_some()
        && records
            .iter()
            .filter_map(|r| r.live.as_ref())
            .any(|(_, p)| {
                p.selection.is_some() || p.deferred.as_ref().is_some_and(|d| d.collected.is_some())
            });
    let mut images = Vec::new();
    let mut copies = Vec::new();
    for (idx, r) in records.into_iter().enumerate() {
        let mut image = r.image;
        if let Some((mem, planned)) = r.live {
            copies.push(proc_copy(idx, &mut image, mem, planned));
        }
        images.push(image);
    }
    let shared = std::mem::take(&mut collector.shared_with);
    for ((image, table), with) in images
        .iter_mut()
        .zip(std::mem::take(&mut collector.tables))
        .zip(shared)
    {
        image.fds = table;
        image.fds_shared_with = with;
    }
    let mut ghosts: Vec<_> = std::mem::take(&mut collector.ghosts)
        .into_values()
        .collect();
    ghosts.sort_by_key(|g| g.id);
    // The data of the files saved whole, read while the tree is frozen,
    // a buffer at a time, into the content pack.
    let mut cw = ck.content_writer();
    for g in &mut ghosts {
        if let Some(c) = collector.ghost_content.remove(&g.id) {
            g.extents = c.write(&mut cw)?;
        }
    }
    let mut sysv_shm = std::mem::take(&mut collector.sysv);
    for s in &mut sysv_shm {
        if let Some(c) = collector.sysv_content.remove(&s.shmid) {
            s.extents = c.write(&mut cw)?;
        }
    }
    let mut shm = Vec::with_capacity(shm_files.len());
    for (mut f, c) in shm_files {
        f.extents = c.write(&mut cw)?;
        shm.push(f);
    }

    let mut pipes: Vec<_> = std::mem::take(&mut collector.pipes).into_values().collect();
    pipes.sort_by_key(|p| p.id);
    let threads = images.iter().map(|p| p.threads.len()).sum();
    let ns = crate::ns::describe(fr.opts.pid, &images, &mut cw)?;
    let cgroups = crate::cgroup::describe(&images)?;
    let content = cw.finish()?;
    // A user namespace that denies setgroups: the groups are inherited.
    if ns
        .as_ref()
        .and_then(|n| n.namespaces.user.as_ref())
        .is_some_and(|u| u.setgroups_deny)
    {
        for image in &mut images {
            image.creds.groups_fixed = true;
        }
    }
    if !incremental {
        for image in &mut images {
            image.data_ranges = None;
        }
    }
    let parent = match &fr.base {
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
    let track_name = fr
        .tracker
        .as_ref()
        .map(|t| t.backend().name().to_string())
        .or_else(|| {
            fr.base
                .is_some()
                .then(|| fr.strategy.track_name().map(str::to_string))
                .flatten()
        });
    let manifest = Manifest {
        checkpoint: ck.number(),
        parent,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        host: host_info(xfeatures),
        root_pid: fr.opts.pid,
        processes: images,
        stats: DumpStats {
            frozen_us: micros(fr.frozen_at),
            total_us: micros(fr.t0),
            pages_written: 0,
            track: if parent.is_some() {
                track_name.clone().unwrap_or_default()
            } else {
                String::new()
            },
            note: fr.note.clone().unwrap_or_default(),
        },
        pipes,
        ghosts,
        sysv_shm,
        shm_files: shm,
        cut: fr.opts.cut.as_ref().map(|c| c.mark()),
        namespaces: ns.as_ref().map(|n| n.namespaces.clone()),
        shell_job: collector.take_shell_job(),
        content,
        cgroups,
    };
    // PIDs are the namespace's only with a PID namespace of its own (a tree
    // whose other namespaces differ keeps the dumper's PIDs: one started by
    // `ip netns exec` has a mount namespace of its own, say).
    let ns_pids = ns.filter(|n| n.namespaces.pid).map(|n| {
        ck.set_pack_pids(n.pids.clone());
        n.pids
    });
    let report = DumpReport {
        checkpoint: ck.number(),
        pid: fr.opts.pid,
        processes: manifest.processes.len(),
        threads,
        pages: 0,
        bytes: 0,
        frozen_us: 0,
        total_us: 0,
        killed: false,
        parent,
        track: parent.and(track_name),
        armed: None,
        note: None,
        concurrent: None,
        frozen_stages: Vec::new(),
    };
    Ok(Pending {
        ck,
        manifest,
        state: None,
        copies,
        by_content: fr
            .tracker
            .as_ref()
            .is_some_and(|t| t.backend() == stasis_track::Backend::Hash),
        report,
        ns_pids,
    })
}

/// The copy of one live process; its areas go into its image.
fn proc_copy(idx: usize, image: &mut ProcessImage, mem: ProcessMemory, p: Planned) -> ProcCopy {
    let Planned {
        mut plan,
        no_fork,
        selection,
        mut deferred,
        ..
    } = p;
    image.vmas = plan.vmas;
    // Ranges a fork would not copy: shared memory, MADV_DONTFORK and
    // MADV_WIPEONFORK areas.
    let unforked: Vec<(u64, u64)> = image
        .vmas
        .iter()
        .filter(|v| v.shared || no_fork.contains(&v.start))
        .map(|v| (v.start, v.end))
        .collect();
    let snapshot = deferred.as_mut().and_then(|d| d.snapshot.take());
    ProcCopy {
        idx,
        pid: image.pid,
        ranges: plan.ranges,
        mem,
        snapshot,
        unforked,
        preread: Vec::new(),
        selection,
        deferred,
        cow: None,
        unprotected: std::mem::take(&mut plan.unprotected),
    }
}

fn host_info(xfeatures: u64) -> HostInfo {
    HostInfo {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string(),
        kernel_release: stasis_kernel::probe::kernel_release(),
        xfeatures,
        page_size: sys::PAGE_SIZE,
    }
}

/// Re-arms the tracker on the frozen tree (with `leave_running`): the
/// state to record once committed, or a note saying why the next dump
/// will be full.
fn rearm(
    fr: &mut Frame<'_, '_>,
    f: &mut Frozen,
    p: &mut Pending,
    areas_of: &[Vec<stasis_track::Area>],
) {
    p.report.note = fr.note.clone();
    let Some(t) = fr.tracker.as_mut().filter(|_| fr.opts.leave_running) else {
        return;
    };
    match arm_all(&mut **t, f, &p.manifest, areas_of) {
        Ok(procs) => {
            p.state = Some(stasis_track::state::TrackState {
                backend: t.backend(),
                armed_at: p.report.checkpoint,
                root_pid: fr.opts.pid,
                procs,
            });
            p.report.armed = Some(t.backend().name().to_string());
        }
        Err(e) => {
            p.report.note = Some(format!(
                "tracking could not be re-armed, the next dump will be full: {e}"
            ));
        }
    }
}

/// The single issuer of each io_uring instance of the process that has
/// one (`IORING_SETUP_SINGLE_ISSUER`): the thread in which a register
/// probe is not turned down ([`stasis_objects::io_uring::is_issuer`]),
/// by its TID in the image; `None` when no thread is. That thread also
/// tells whether the ring has an eventfd registered (no other may ask).
/// A process using io_uring whose threads have rings registered
/// (`IORING_REGISTER_RING_FDS`) is refused first.
/// The fds are saved next, with them
/// ([`stasis_objects::SaveCtx::io_uring_issuers`]).
fn io_uring_issuers(
    fp: &mut FrozenProcess,
    image: &ProcessImage,
    collector: &mut fds::FdCollector,
    maps_ring: bool,
) -> Result<()> {
    if !stasis_objects::io_uring::uses_io_uring(fp.pid, maps_ring, collector.fd_census.as_ref()) {
        return Ok(());
    }
    for (t, th) in fp.threads.iter_mut().zip(&image.threads) {
        stasis_objects::io_uring::check_ring_fds(
            &mut remote::ThreadRemote::new(t),
            fp.pid,
            th.tid,
        )?;
    }
    for fd in stasis_objects::io_uring::single_issuer_rings(fp.pid)? {
        let mut issuer = None;
        for (t, th) in fp.threads.iter_mut().zip(&image.threads) {
            let mut r = remote::ThreadRemote::new(t);
            if stasis_objects::io_uring::is_issuer(&mut r, fd)? {
                issuer = Some(th.tid);
                if stasis_objects::io_uring::has_eventfd_in(&mut r, fd)? {
                    collector.io_uring_eventfds.insert((fp.pid, fd));
                }
                break;
            }
        }
        collector.io_uring_issuers.insert((fp.pid, fd), issuer);
    }
    Ok(())
}

/// Arms the tracker on every live process of the frozen tree; returns the
/// (pid, start time) of each.
fn arm_all(
    t: &mut (dyn DirtyTracker + Send),
    f: &mut Frozen,
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
