//! Decisions of a restore, expressed as calls on a [`Remote`].
//!
//! Every function here is pure logic over the seam: it is unit-tested with
//! the recording fake in [`crate::remote`].

use stasis_image::manifest::{
    AioRing, ITimer, MmImage, PosixTimer, ProcessImage, SigAction, ThreadImage, Vma, VmaKind,
};
use stasis_image::RunEntry;
use stasis_kernel::sarg;
use stasis_objects::timerfd::armed_value;
use stasis_sys::{self as sys, vmflags, PrctlMmMap};

use crate::remote::Remote;
use crate::ObjectError;
use crate::RestoreError;

/// Scratch layout (offsets into the scratch area).
pub const SCRATCH_PATH: usize = 0;
pub const SCRATCH_STRUCT: usize = 4096;
pub const SCRATCH_IOV: usize = 8192;
/// Most iovecs in one `preadv` (IOV_MAX), bounded by the scratch area.
pub const MAX_IOV: usize = 1024;

pub fn step(what: impl Into<String>) -> impl FnOnce(stasis_kernel::KernelError) -> RestoreError {
    let what = what.into();
    move |source| ObjectError::Step { what, source }.into()
}

/// Opens `path` read-only (close-on-exec) inside the process; `what` (with
/// the step of putting the path in scratch) names it in errors. Returns the
/// fd there.
pub fn open_in<R: Remote>(r: &mut R, path: &str, what: &str) -> Result<u64, RestoreError> {
    let a = r
        .put_cstr(SCRATCH_PATH, path)
        .map_err(step(format!("{what} path")))?;
    r.sys(
        "open",
        libc::SYS_open,
        &[a, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0],
    )
    .map_err(|source| {
        ObjectError::File {
            path: path.to_string(),
            what: what.to_string(),
            source,
        }
        .into()
    })
}

/// Finds a free, page-aligned range of `size` bytes above 4 GiB (below the
/// 47-bit user limit) that overlaps none of `busy` (half-open ranges).
pub fn find_gap(busy: &[(u64, u64)], size: u64) -> Option<u64> {
    const LOW: u64 = 1 << 32;
    const HIGH: u64 = 0x7fff_ffff_f000;
    let mut b: Vec<(u64, u64)> = busy.iter().copied().filter(|r| r.1 > r.0).collect();
    b.sort_unstable();
    // Search downwards from the top so the gap sits far from brk and binaries,
    // but keep a guard page on both sides.
    let mut candidates = Vec::new();
    let mut prev_end = LOW;
    for &(s, e) in &b {
        let s = s.min(HIGH);
        if s > prev_end {
            candidates.push((prev_end, s));
        }
        prev_end = prev_end.max(e);
    }
    if prev_end < HIGH {
        candidates.push((prev_end, HIGH));
    }
    candidates
        .iter()
        .rev()
        .filter(|(s, e)| e.saturating_sub(*s) >= size + 2 * sys::PAGE_SIZE)
        .map(|(_, e)| e - size - sys::PAGE_SIZE)
        .next()
}

/// Flags and protection used to map a saved area before it is filled.
pub fn map_flags(vma: &Vma, needs_fill: bool) -> (u64, u64) {
    let mut flags = libc::MAP_FIXED
        | if vma.shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
    if matches!(vma.kind, VmaKind::Anon) {
        flags |= libc::MAP_ANONYMOUS;
    }
    if vma.growsdown {
        flags |= libc::MAP_GROWSDOWN;
    }
    if vma.flags & vmflags::NORESERVE != 0 {
        flags |= libc::MAP_NORESERVE;
    }
    if vma.flags & vmflags::DROPPABLE != 0 && !vma.shared {
        flags = (flags & !libc::MAP_PRIVATE) | vmflags::MAP_DROPPABLE;
    }
    let mut prot = vma.prot as i32;
    if needs_fill {
        prot |= libc::PROT_READ | libc::PROT_WRITE;
    }
    (sarg(i64::from(prot)), sarg(i64::from(flags)))
}

/// Pages to read into an area from one page pack: the pack entries inside
/// the area (sorted) and the pack's fd number inside the process.
pub type Fill<'a> = (&'a [RunEntry], u64);

/// Maps one saved area at its address and fills it from page packs (an
/// incremental checkpoint's pages come from several packs of its chain,
/// each open inside the process).
pub fn map_vma<R: Remote>(
    r: &mut R,
    vma: &Vma,
    fills: &[Fill<'_>],
    file_fd: Option<u64>,
) -> Result<u64, RestoreError> {
    let len = vma.end - vma.start;
    let needs_fill = fills.iter().any(|f| !f.0.is_empty());
    let (prot, flags) = map_flags(vma, needs_fill);
    let at = match &vma.kind {
        // Shared anonymous memory whose object the caller handed over as
        // `file_fd` (made at its full size, or by an earlier area).
        VmaKind::Anon if file_fd.is_some() && vma.shm.is_some() => {
            let fd = file_fd.unwrap_or(u64::MAX);
            let off = vma.shm.map_or(0, |(_, off)| off);
            let flags = flags & !(libc::MAP_ANONYMOUS as u64);
            r.sys(
                "mmap",
                libc::SYS_mmap,
                &[vma.start, len, prot, flags, fd, off],
            )
            .map_err(step(format!(
                "sharing memory at {:#x}-{:#x}",
                vma.start, vma.end
            )))?
        }
        VmaKind::Anon => r
            .sys(
                "mmap",
                libc::SYS_mmap,
                &[vma.start, len, prot, flags, u64::MAX, 0],
            )
            .map_err(step(format!(
                "mapping anonymous area {:#x}-{:#x}",
                vma.start, vma.end
            )))?,
        VmaKind::File { path, offset, .. } => {
            let mode = if may_write_shared(vma) {
                libc::O_RDWR
            } else {
                libc::O_RDONLY
            } | libc::O_CLOEXEC;
            let p = r
                .put_cstr(SCRATCH_PATH, path)
                .map_err(step(format!("path {path}")))?;
            let fd = r
                .sys("open", libc::SYS_open, &[p, sarg(i64::from(mode)), 0])
                .map_err(|source| ObjectError::File {
                    path: path.clone(),
                    what: format!("mapped at {:#x}-{:#x}", vma.start, vma.end),
                    source,
                })?;
            let res = r.sys(
                "mmap",
                libc::SYS_mmap,
                &[vma.start, len, prot, flags, fd, *offset],
            );
            r.sys("close", libc::SYS_close, &[fd])
                .map_err(step("closing a mapped file"))?;
            res.map_err(step(format!(
                "mapping {path} at {:#x}-{:#x}",
                vma.start, vma.end
            )))?
        }
        VmaKind::SysvShm {
            shmid,
            offset,
            partial,
        } => {
            let mut flags = 0u64;
            if vma.prot & libc::PROT_WRITE.unsigned_abs() == 0 {
                flags |= u64::from(libc::SHM_RDONLY.unsigned_abs());
            }
            if vma.prot & libc::PROT_EXEC.unsigned_abs() != 0 {
                flags |= u64::from(libc::SHM_EXEC.unsigned_abs());
            }
            if *partial {
                attach_part(r, vma, (*shmid, *offset), flags)?
            } else {
                r.sys(
                    "shmat",
                    libc::SYS_shmat,
                    &[sarg(i64::from(*shmid)), vma.start, flags],
                )
                .map_err(step(format!(
                    "attaching System V segment {shmid} at {:#x}",
                    vma.start
                )))?
            }
        }
        VmaKind::Ghost { name, offset, .. } => {
            // The caller handed the rebuilt file over as `file_fd`.
            let fd = file_fd.ok_or_else(|| {
                ObjectError::Inconsistent(format!("no file for the mapping of {name}"))
            })?;
            r.sys(
                "mmap",
                libc::SYS_mmap,
                &[vma.start, len, prot, flags, fd, *offset],
            )
            .map_err(step(format!(
                "mapping {name} (deleted) at {:#x}-{:#x}",
                vma.start, vma.end
            )))?
        }
        VmaKind::Vdso | VmaKind::Vvar | VmaKind::VvarVclock => return Ok(0),
        VmaKind::Aio => return aio_ring(r, vma).map(|()| 0),
        // Held empty until mapped from its socket once the fds exist
        // (`map_socket_rings`).
        VmaKind::SocketRing { .. } => return reserve(r, vma).map(|()| 0),
        // Held empty until the instance is made with the files (its
        // restore maps its rings over this).
        VmaKind::IoUring { .. } => return reserve(r, vma).map(|()| 0),
        // Held empty until mapped from the map's fd once the fds exist
        // (`map_socket_rings`).
        VmaKind::BpfMap { .. } => return reserve(r, vma).map(|()| 0),
    };
    landed(vma, at)?;
    advise(r, vma)?;
    let mut filled = 0;
    for (runs, pack_fd) in fills {
        filled += fill(r, runs, *pack_fd)?;
    }
    if needs_fill && prot != u64::from(vma.prot) {
        r.sys(
            "mprotect",
            libc::SYS_mprotect,
            &[vma.start, len, u64::from(vma.prot)],
        )
        .map_err(step(format!("protecting {:#x}-{:#x}", vma.start, vma.end)))?;
    }
    install_guards(r, vma)?;
    lock(r, vma)?;
    Ok(filled)
}

/// Part of System V segment `shmid`, from byte `offset`, at the area of
/// `vma`: the segment attached whole where the kernel finds room, that
/// part moved to the area (`mremap`), the rest detached (`shmdt` at the
/// attachment's address takes what is left of it there). Returns the
/// area's address.
fn attach_part<R: Remote>(
    r: &mut R,
    vma: &Vma,
    (shmid, offset): (i32, u64),
    flags: u64,
) -> Result<u64, RestoreError> {
    let what = || {
        format!(
            "attaching bytes {offset}.. of System V segment {shmid} at {:#x}-{:#x}",
            vma.start, vma.end
        )
    };
    let len = vma.end - vma.start;
    let at = r
        .sys(
            "shmat",
            libc::SYS_shmat,
            &[sarg(i64::from(shmid)), 0, flags],
        )
        .map_err(step(what()))?;
    let moved = r.sys(
        "mremap",
        libc::SYS_mremap,
        &[
            at + offset,
            len,
            len,
            u64::from((libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED).unsigned_abs()),
            vma.start,
        ],
    );
    // What is left of the attachment at `at` (nothing if the part was all
    // of its start and end: then `shmdt` finds none, which is fine).
    let _ = r.sys("shmdt", libc::SYS_shmdt, &[at]);
    moved.map_err(step(what()))
}

/// Maps the areas of `vmas` that map a socket's rings from the socket's
/// fd (planted already), at their addresses.
pub fn map_socket_rings<R: Remote>(r: &mut R, vmas: &[Vma]) -> Result<(), RestoreError> {
    for vma in vmas {
        let (fd, offset, what) = match vma.kind {
            VmaKind::SocketRing { fd, offset, .. } => (fd, offset, "the rings of the socket"),
            VmaKind::BpfMap { fd, offset } => (fd, offset, "the BPF map"),
            _ => continue,
        };
        let share = if vma.shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        let flags = u64::from((share | libc::MAP_FIXED).unsigned_abs());
        map_fixed(
            r,
            vma,
            [
                u64::from(vma.prot),
                flags,
                u64::from(fd.unsigned_abs()),
                offset,
            ],
            &format!("mapping {what} of fd {fd}"),
        )?;
    }
    Ok(())
}

/// `mmap(vma.start, its length, prot, flags, fd, offset)` in the
/// process (`args`: the last four); refused if it lands elsewhere.
fn map_fixed<R: Remote>(
    r: &mut R,
    vma: &Vma,
    [prot, flags, fd, offset]: [u64; 4],
    what: &str,
) -> Result<(), RestoreError> {
    let len = vma.end - vma.start;
    let at = r
        .sys(
            "mmap",
            libc::SYS_mmap,
            &[vma.start, len, prot, flags, fd, offset],
        )
        .map_err(step(format!("{what} at {:#x}-{:#x}", vma.start, vma.end)))?;
    landed(vma, at)
}

/// Refuses a mapping of `vma` that the kernel put at `at`, not at its
/// address.
fn landed(vma: &Vma, at: u64) -> Result<(), RestoreError> {
    if at == vma.start {
        return Ok(());
    }
    Err(ObjectError::Layout(format!(
        "area {:#x}-{:#x} landed at {at:#x}",
        vma.start, vma.end
    ))
    .into())
}

/// An inaccessible placeholder at the area's place, so that nothing else
/// lands there before what belongs there is mapped over it.
fn reserve<R: Remote>(r: &mut R, vma: &Vma) -> Result<(), RestoreError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
    map_fixed(
        r,
        vma,
        [
            u64::from(libc::PROT_NONE.unsigned_abs()),
            sarg(i64::from(flags)),
            u64::MAX,
            0,
        ],
        "reserving the place of the rings mapped there (io_uring, packet socket)",
    )
}

/// `sizeof(struct aio_ring)` and `sizeof(struct io_event)`.
const AIO_RING_HEADER: u64 = sys::aio::AIO_RING_HEADER_LEN as u64;
const AIO_EVENT: u64 = sys::aio::IO_EVENT_LEN as u64;

/// The events an AIO ring of `len` bytes holds (`ring->nr`: what the
/// kernel fits in its pages after the header).
pub fn aio_ring_events(len: u64) -> u64 {
    len.saturating_sub(AIO_RING_HEADER) / AIO_EVENT
}

/// The `io_setup` argument whose ring is `len` bytes, as the kernel sizes
/// it (`ioctx_alloc`, `aio_setup_ring`): `max(n, 4 * possible CPUs)`,
/// doubled, plus 2 events, rounded up to whole pages. `n` below gives
/// `2n + 2` events, between `nr - 1` and `nr` (the ring's capacity):
/// the same pages, unless this machine's CPUs push the minimum higher.
pub fn aio_setup_arg(len: u64) -> u64 {
    (aio_ring_events(len).saturating_sub(2) / 2).max(1)
}

/// An AIO context: made with `io_setup` for a ring of the area's size and
/// moved to its address (`mremap`: the kernel follows its ring, and the
/// context id the program holds is that address).
fn aio_ring<R: Remote>(r: &mut R, vma: &Vma) -> Result<(), RestoreError> {
    let len = vma.end - vma.start;
    let what = |w: &str| format!("{w} the AIO context at {:#x}", vma.start);
    let ctx_p = r
        .put(SCRATCH_STRUCT, &0u64.to_ne_bytes())
        .map_err(step(what("making room for")))?;
    r.sys("io_setup", libc::SYS_io_setup, &[aio_setup_arg(len), ctx_p])
        .map_err(step(what("creating")))?;
    let mut b = [0u8; 8];
    r.read(ctx_p, &mut b)
        .map_err(step(what("reading the id of")))?;
    let ctx = u64::from_ne_bytes(b);
    r.read(ctx + sys::aio::AIO_RING_NR as u64, &mut b[..4])
        .map_err(step(what("reading the ring of")))?;
    let nr = u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    if nr != aio_ring_events(len) {
        return Err(ObjectError::Layout(format!(
            "the AIO context at {:#x} held {} events; io_setup here gives {nr} (another number of CPUs?)",
            vma.start,
            aio_ring_events(len)
        ))
        .into());
    }
    if ctx != vma.start {
        let at = r
            .sys(
                "mremap",
                libc::SYS_mremap,
                &[
                    ctx,
                    len,
                    len,
                    u64::from((libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED).unsigned_abs()),
                    vma.start,
                ],
            )
            .map_err(step(what("moving the ring of")))?;
        if at != vma.start {
            return Err(ObjectError::Layout(format!(
                "the ring of the AIO context at {:#x} landed at {at:#x}",
                vma.start
            ))
            .into());
        }
    }
    Ok(())
}

/// Puts back the completed events an AIO context's ring held unread (the
/// context made again empty by [`aio_ring`] at the ring's address): the
/// kernel's own tail, which the next completion uses, is not writable, so
/// real requests get it there. Reads of `/dev/null` (complete at once)
/// are submitted and reaped until head and tail are at the saved head,
/// then as many more as were waiting are submitted and left unread: head
/// and tail are the saved ones. Last the saved event slots are written
/// over the ring's, so the waiting events are the saved ones, in place.
pub fn aio_refill<R: Remote>(r: &mut R, ring: &AioRing) -> Result<(), RestoreError> {
    const BATCH: u64 = 32;
    const IOCB: u64 = sys::aio::IOCB_LEN as u64;
    let what = |w: &str| {
        format!(
            "{w} the completed events of the AIO context at {:#x}",
            ring.start
        )
    };
    let nr = ring.events.len() as u64 / AIO_EVENT;
    let mut b = [0u8; 16];
    r.read(ring.start, &mut b)
        .map_err(step(what("reading the ring of")))?;
    let word = |b: &[u8; 16], i: usize| {
        u64::from(u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]))
    };
    let (now_nr, head0, tail0) = (
        word(&b, sys::aio::AIO_RING_NR),
        word(&b, sys::aio::AIO_RING_HEAD),
        word(&b, sys::aio::AIO_RING_TAIL),
    );
    let (head, tail) = (u64::from(ring.head), u64::from(ring.tail));
    if now_nr != nr || head >= nr || tail >= nr || head0 != tail0 {
        return Err(ObjectError::Layout(format!(
            "the AIO context at {:#x}: a ring of {now_nr} events (head {head0}, tail {tail0}) to hold {nr} with head {head}, tail {tail}",
            ring.start
        ))
        .into());
    }
    let waiting = (tail + nr - head) % nr;
    let to_skip = (head + nr - tail0) % nr;
    // The scratch page: BATCH iocbs, their pointers, BATCH events.
    let base = r.scratch() + SCRATCH_STRUCT as u64;
    let (ptrs, evs) = (base + BATCH * IOCB, base + BATCH * IOCB + BATCH * 8);
    let fd = open_in(r, "/dev/null", "an AIO request's file")?;
    let mut iocbs = Vec::new();
    let mut pointers = Vec::new();
    for i in 0..BATCH {
        // A read of nothing: it completes at once.
        let c = sys::aio::Iocb {
            aio_lio_opcode: sys::aio::IOCB_CMD_PREAD,
            aio_fildes: u32::try_from(fd).unwrap_or(0),
            aio_buf: evs,
            ..Default::default()
        };
        iocbs.extend_from_slice(&c.to_bytes());
        pointers.extend_from_slice(&(base + i * IOCB).to_ne_bytes());
    }
    r.write(base, &iocbs)
        .and_then(|()| r.write(ptrs, &pointers))
        .map_err(step(what("preparing the requests that put back")))?;
    let submit = |r: &mut R, n: u64, reap: bool| -> Result<(), RestoreError> {
        let got = r
            .sys("io_submit", libc::SYS_io_submit, &[ring.start, n, ptrs])
            .map_err(step(what("submitting requests to put back")))?;
        if got != n {
            return Err(ObjectError::Layout(format!(
                "the AIO context at {:#x} took {got} of {n} requests",
                ring.start
            ))
            .into());
        }
        if reap {
            r.sys(
                "io_getevents",
                libc::SYS_io_getevents,
                &[ring.start, n, n, evs, 0],
            )
            .map_err(step(what("reaping requests made to put back")))?;
        }
        Ok(())
    };
    let mut left = to_skip;
    while left > 0 {
        let n = left.min(BATCH);
        submit(r, n, true)?;
        left -= n;
    }
    let mut left = waiting;
    while left > 0 {
        let n = left.min(BATCH);
        submit(r, n, false)?;
        left -= n;
    }
    r.sys("close", libc::SYS_close, &[fd])
        .map_err(step("closing /dev/null"))?;
    r.read(ring.start, &mut b)
        .map_err(step(what("reading the ring of")))?;
    if (
        word(&b, sys::aio::AIO_RING_HEAD),
        word(&b, sys::aio::AIO_RING_TAIL),
    ) != (head, tail)
    {
        return Err(ObjectError::Layout(format!(
            "the AIO context at {:#x} has head {} and tail {} after the refill, not {head} and {tail}",
            ring.start,
            word(&b, sys::aio::AIO_RING_HEAD),
            word(&b, sys::aio::AIO_RING_TAIL)
        ))
        .into());
    }
    r.write(ring.start + AIO_RING_HEADER, &ring.events)
        .map_err(step(what("writing")))
}

/// Puts the area's guard pages back (`MADV_GUARD_INSTALL`): a touch of one
/// kills with SIGSEGV, as before.
pub fn install_guards<R: Remote>(r: &mut R, vma: &Vma) -> Result<(), RestoreError> {
    for &(a, b) in &vma.guards {
        r.sys(
            "madvise",
            libc::SYS_madvise,
            &[a, b - a, sarg(i64::from(sys::MADV_GUARD_INSTALL))],
        )
        .map_err(step(format!(
            "installing the guard pages {a:#x}-{b:#x} again (MADV_GUARD_INSTALL, Linux 6.13)"
        )))?;
    }
    Ok(())
}

/// A shared area whose file must be opened for writing: writable now, or
/// `mw` (the program may `mprotect` it writable later).
pub fn may_write_shared(vma: &Vma) -> bool {
    vma.shared
        && (vma.prot & libc::PROT_WRITE.unsigned_abs() != 0 || vma.flags & vmflags::MAYWRITE != 0)
}

/// Gives a freshly mapped area the `madvise` advice it had (before it is
/// filled, so that `MADV_HUGEPAGE` applies to the fill).
pub fn advise<R: Remote>(r: &mut R, vma: &Vma) -> Result<(), RestoreError> {
    for (bit, advice) in vmflags::ADVICE {
        if vma.flags & bit != 0 {
            r.sys(
                "madvise",
                libc::SYS_madvise,
                &[vma.start, vma.end - vma.start, sarg(i64::from(advice))],
            )
            .map_err(step(format!(
                "giving {:#x}-{:#x} its advice {advice} (madvise)",
                vma.start, vma.end
            )))?;
        }
    }
    Ok(())
}

/// Locks a filled area again if it was locked (`mlock`, or `mlock2` with
/// `MLOCK_ONFAULT`). It fails as the program's own `mlock` would: beyond
/// `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`.
pub fn lock<R: Remote>(r: &mut R, vma: &Vma) -> Result<(), RestoreError> {
    if vma.flags & vmflags::LOCKED == 0 {
        return Ok(());
    }
    let onfault = if vma.flags & vmflags::LOCKONFAULT != 0 {
        vmflags::MLOCK_ONFAULT
    } else {
        0
    };
    r.sys(
        "mlock2",
        libc::SYS_mlock2,
        &[vma.start, vma.end - vma.start, onfault],
    )
    .map_err(step(format!(
        "locking {:#x}-{:#x} in memory as it was (mlock2; the restoring user may lack CAP_IPC_LOCK or RLIMIT_MEMLOCK)",
        vma.start, vma.end
    )))?;
    Ok(())
}

/// Runs of at least this many address-contiguous pages are populated with
/// `MADV_POPULATE_WRITE` before they are read into: faulting pages in one
/// batch is several times cheaper than faulting them one by one inside the
/// kernel's copy loop.
pub const POPULATE_MIN_PAGES: u64 = 16;
const MADV_POPULATE_WRITE: u64 = 23;

/// Reads `runs` from the pack straight into the process with `preadv`,
/// one call per file-contiguous batch of up to [`MAX_IOV`] runs.
pub fn fill<R: Remote>(r: &mut R, runs: &[RunEntry], pack_fd: u64) -> Result<u64, RestoreError> {
    populate(r, runs);
    let max_iov = MAX_IOV.min((r.scratch_len() - SCRATCH_IOV) / 16);
    let mut total = 0u64;
    let mut i = 0;
    while i < runs.len() {
        let first = runs[i];
        let mut iov = Vec::with_capacity(16 * 64);
        let mut next_off = first.file_off;
        let mut bytes = 0u64;
        while i < runs.len() && iov.len() / 16 < max_iov && runs[i].file_off == next_off {
            iov.extend_from_slice(&runs[i].vaddr.to_le_bytes());
            iov.extend_from_slice(&runs[i].len().to_le_bytes());
            next_off += runs[i].len();
            bytes += runs[i].len();
            i += 1;
        }
        let n = iov.len() / 16;
        let a = r.put(SCRATCH_IOV, &iov).map_err(step("writing iovecs"))?;
        let got = r
            .sys(
                "preadv",
                libc::SYS_preadv,
                &[pack_fd, a, n as u64, first.file_off, 0],
            )
            .map_err(step(format!(
                "reading pages at {:#x} from the pack",
                first.vaddr
            )))?;
        if got != bytes {
            return Err(ObjectError::Layout(format!(
                "short read of pages at {:#x}: {got} of {bytes} bytes (truncated pack?)",
                first.vaddr
            ))
            .into());
        }
        total += bytes;
    }
    Ok(total)
}

/// Pre-faults the large address-contiguous stretches of `runs` (best
/// effort: an old kernel without `MADV_POPULATE_WRITE` just skips it).
fn populate<R: Remote>(r: &mut R, runs: &[RunEntry]) {
    let mut i = 0;
    while i < runs.len() {
        let start = runs[i].vaddr;
        let mut end = runs[i].end();
        i += 1;
        while i < runs.len() && runs[i].vaddr == end {
            end = runs[i].end();
            i += 1;
        }
        if (end - start) / sys::PAGE_SIZE >= POPULATE_MIN_PAGES
            && r.sys(
                "madvise",
                libc::SYS_madvise,
                &[start, end - start, MADV_POPULATE_WRITE],
            )
            .is_err()
        {
            return;
        }
    }
}

/// The parts of pack runs (sorted, non-overlapping) that fall inside
/// `[start, end)`, as runs of their own (a run written across two adjacent
/// areas is split at the boundary).
pub fn clip_runs(all: &[RunEntry], start: u64, end: u64) -> Vec<RunEntry> {
    let first = all.partition_point(|r| r.end() <= start);
    all[first..]
        .iter()
        .take_while(|r| r.vaddr < end)
        .map(|r| {
            let s = r.vaddr.max(start);
            let e = r.end().min(end);
            RunEntry {
                vaddr: s,
                npages: u32::try_from((e - s) / sys::PAGE_SIZE).unwrap_or(0),
                flags: r.flags,
                file_off: r.file_off + (s - r.vaddr),
                checksum: r.checksum,
            }
        })
        .collect()
}

/// Sets every signal's disposition.
pub fn restore_sigactions<R: Remote>(r: &mut R, acts: &[SigAction]) -> Result<(), RestoreError> {
    for a in acts {
        let ka = sys::KernelSigaction {
            handler: a.handler,
            flags: a.flags,
            restorer: a.restorer,
            mask: a.mask,
        };
        let addr = r
            .put(
                SCRATCH_STRUCT,
                &words(&[ka.handler, ka.flags, ka.restorer, ka.mask]),
            )
            .map_err(step("sigaction"))?;
        r.sys(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            &[u64::from(a.signo), addr, 0, 8],
        )
        .map_err(step(format!("setting the handler of signal {}", a.signo)))?;
    }
    Ok(())
}

/// `[interval, value]` split into (seconds, fraction) words, as
/// `struct itimerval` (fraction in µs) or `struct itimerspec` (in ns) want.
fn timer_words(interval: u64, value: u64, per_second: u64) -> Vec<u8> {
    words(&[
        interval / per_second,
        interval % per_second,
        value / per_second,
        value % per_second,
    ])
}

/// Puts a saved timer in scratch as a `what` (`struct itimerval` or
/// `struct itimerspec`, fractions of `1 / per_second`), its value as
/// [`armed_value`] says; returns the address, or `None` if it was disarmed.
fn put_timer<R: Remote>(
    r: &mut R,
    interval: u64,
    value: u64,
    per_second: u64,
    what: &str,
) -> Result<Option<u64>, RestoreError> {
    let Some(value) = armed_value(value, interval) else {
        return Ok(None);
    };
    r.put(SCRATCH_STRUCT, &timer_words(interval, value, per_second))
        .map(Some)
        .map_err(step(what))
}

/// Arms saved interval timers (disarmed ones are left alone).
pub fn restore_itimers<R: Remote>(r: &mut R, timers: &[ITimer]) -> Result<(), RestoreError> {
    for t in timers {
        let Some(addr) = put_timer(r, t.interval_us, t.value_us, 1_000_000, "itimerval")? else {
            continue;
        };
        r.sys(
            "setitimer",
            libc::SYS_setitimer,
            &[u64::from(t.which), addr, 0],
        )
        .map_err(step(format!("arming interval timer {}", t.which)))?;
    }
    Ok(())
}

/// `prctl` that makes `timer_create` take the timer ID from its output
/// argument (Linux 6.15+, made for checkpoint/restore).
const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;

/// Creates the POSIX timers at their saved IDs (disarmed; see
/// [`arm_posix_timers`]).
pub fn create_posix_timers<R: Remote>(
    r: &mut R,
    timers: &[PosixTimer],
) -> Result<(), RestoreError> {
    if timers.is_empty() {
        return Ok(());
    }
    let by_id = r
        .sys(
            "prctl(PR_TIMER_CREATE_RESTORE_IDS)",
            libc::SYS_prctl,
            &[PR_TIMER_CREATE_RESTORE_IDS, 1, 0, 0, 0],
        )
        .is_ok();
    let mut sorted: Vec<&PosixTimer> = timers.iter().collect();
    sorted.sort_by_key(|t| t.id);
    for t in sorted {
        // struct sigevent: sigev_value, sigev_signo, sigev_notify, _tid, padding to 64 bytes.
        let mut sev = Vec::with_capacity(64);
        sev.extend_from_slice(&t.value.to_le_bytes());
        sev.extend_from_slice(&t.signo.to_le_bytes());
        sev.extend_from_slice(&t.notify.to_le_bytes());
        sev.extend_from_slice(&t.tid.to_le_bytes());
        sev.resize(64, 0);
        let sev_addr = r.put(SCRATCH_STRUCT, &sev).map_err(step("sigevent"))?;
        let id_addr = r
            .put(SCRATCH_STRUCT + 256, &t.id.to_le_bytes())
            .map_err(step("timer id"))?;
        r.sys(
            "timer_create",
            libc::SYS_timer_create,
            &[sarg(i64::from(t.clockid)), sev_addr, id_addr],
        )
        .map_err(step(format!("creating POSIX timer {}", t.id)))?;
        let mut got = [0u8; 4];
        r.read(id_addr, &mut got)
            .map_err(step("reading a timer id"))?;
        let got = i32::from_le_bytes(got);
        if got != t.id {
            return Err(ObjectError::Incompatible(format!(
                "POSIX timer {} came back as {got}{}",
                t.id,
                if by_id {
                    ""
                } else {
                    " (this kernel cannot choose timer IDs: PR_TIMER_CREATE_RESTORE_IDS needs Linux 6.15)"
                }
            )).into());
        }
    }
    if by_id {
        r.sys(
            "prctl(PR_TIMER_CREATE_RESTORE_IDS)",
            libc::SYS_prctl,
            &[PR_TIMER_CREATE_RESTORE_IDS, 0, 0, 0, 0],
        )
        .map_err(step("leaving timer-ID restore mode"))?;
    }
    Ok(())
}

/// Arms the POSIX timers that were armed (last, like interval timers).
pub fn arm_posix_timers<R: Remote>(r: &mut R, timers: &[PosixTimer]) -> Result<(), RestoreError> {
    for t in timers {
        let Some(a) = put_timer(r, t.interval_ns, t.value_ns, 1_000_000_000, "itimerspec")? else {
            continue;
        };
        r.sys(
            "timer_settime",
            libc::SYS_timer_settime,
            &[u64::from(t.id.unsigned_abs()), 0, a, 0],
        )
        .map_err(step(format!("arming POSIX timer {}", t.id)))?;
    }
    Ok(())
}

/// `PR_SET_MM_MAP` with the saved `mm` fields, auxv and exe file (`exe_fd`).
pub fn restore_mm<R: Remote>(r: &mut R, mm: &MmImage, exe_fd: u64) -> Result<(), RestoreError> {
    let auxv: Vec<u8> = words(&mm.auxv);
    let auxv_addr = r.put(SCRATCH_STRUCT + 256, &auxv).map_err(step("auxv"))?;
    let m = PrctlMmMap {
        start_code: mm.start_code,
        end_code: mm.end_code,
        start_data: mm.start_data,
        end_data: mm.end_data,
        start_brk: mm.start_brk,
        brk: mm.brk,
        start_stack: mm.start_stack,
        arg_start: mm.arg_start,
        arg_end: mm.arg_end,
        env_start: mm.env_start,
        env_end: mm.env_end,
        auxv: auxv_addr,
        auxv_size: u32::try_from(auxv.len())
            .map_err(|_| ObjectError::Layout("auxv too large".into()))?,
        exe_fd: u32::try_from(exe_fd).unwrap_or(u32::MAX),
    };
    let bytes = words(&[
        m.start_code,
        m.end_code,
        m.start_data,
        m.end_data,
        m.start_brk,
        m.brk,
        m.start_stack,
        m.arg_start,
        m.arg_end,
        m.env_start,
        m.env_end,
        m.auxv,
        u64::from(m.auxv_size) | (u64::from(m.exe_fd) << 32),
    ]);
    debug_assert_eq!(bytes.len(), std::mem::size_of::<PrctlMmMap>());
    let addr = r
        .put(SCRATCH_STRUCT, &bytes)
        .map_err(step("prctl_mm_map"))?;
    r.sys(
        "prctl",
        libc::SYS_prctl,
        &[
            sys::PR_SET_MM as u64,
            sys::PR_SET_MM_MAP,
            addr,
            bytes.len() as u64,
            0,
        ],
    )
    .map_err(step("restoring mm fields (PR_SET_MM_MAP)"))?;
    Ok(())
}

/// Size of `struct robust_list_head`, the only length `set_robust_list` takes.
const ROBUST_LIST_HEAD_LEN: u64 = 24;

/// Per-thread state, set by the thread itself: alternate signal stack,
/// rseq registration, robust futex list, clear_child_tid and name.
pub fn thread_state<R: Remote>(r: &mut R, th: &ThreadImage) -> Result<(), RestoreError> {
    thread_state_inheriting(r, th, 0)
}

/// [`thread_state`] for a thread that inherited the first `inherited` of
/// its seccomp filters from the thread that created it.
pub fn thread_state_inheriting<R: Remote>(
    r: &mut R,
    th: &ThreadImage,
    inherited: usize,
) -> Result<(), RestoreError> {
    let tid = th.tid;
    let ss = &th.altstack;
    let a = r
        .put(
            SCRATCH_STRUCT,
            &words(&[
                ss.sp,
                sarg(i64::from(ss.flags & !libc::SS_ONSTACK)),
                ss.size,
            ]),
        )
        .map_err(step("stack_t"))?;
    r.sys("sigaltstack", libc::SYS_sigaltstack, &[a, 0])
        .map_err(step(format!(
            "restoring the alternate signal stack of thread {tid}"
        )))?;
    if let Some(q) = &th.rseq {
        r.sys(
            "rseq",
            libc::SYS_rseq,
            &[q.ptr, u64::from(q.size), 0, u64::from(q.signature)],
        )
        .map_err(step(format!("registering the rseq area of thread {tid}")))?;
    }
    let len = if th.robust_list_len == 0 {
        ROBUST_LIST_HEAD_LEN
    } else {
        th.robust_list_len
    };
    r.sys(
        "set_robust_list",
        libc::SYS_set_robust_list,
        &[th.robust_list, len],
    )
    .map_err(step(format!(
        "restoring the robust futex list of thread {tid}"
    )))?;
    r.sys(
        "set_tid_address",
        libc::SYS_set_tid_address,
        &[th.clear_child_tid],
    )
    .map_err(step(format!("restoring clear_child_tid of thread {tid}")))?;
    install_seccomp(r, tid, th.seccomp.get(inherited..).unwrap_or_default())?;
    if th.seccomp_strict {
        // Suspended like filters until the tracer detaches: the remote
        // syscalls still to come run as before.
        const SECCOMP_MODE_STRICT: u64 = 1;
        r.sys(
            "prctl(PR_SET_SECCOMP)",
            libc::SYS_prctl,
            &[libc::PR_SET_SECCOMP as u64, SECCOMP_MODE_STRICT],
        )
        .map_err(step(format!("putting thread {tid} in seccomp strict mode")))?;
    }
    let name = r
        .put_cstr(SCRATCH_PATH, &th.comm)
        .map_err(step("thread name"))?;
    r.sys("prctl", libc::SYS_prctl, &[libc::PR_SET_NAME as u64, name])
        .map_err(step(format!("naming thread {tid}")))?;
    Ok(())
}

/// Installs seccomp `filters` (oldest first) in the thread behind `r`
/// (thread `tid`). The tracer suspends them (PTRACE_O_SUSPEND_SECCOMP)
/// until it detaches, so the remote syscalls still to come are not
/// filtered.
pub fn install_seccomp<R: Remote>(
    r: &mut R,
    tid: i32,
    filters: &[(Vec<u8>, u64)],
) -> Result<(), RestoreError> {
    for (prog, flags) in filters {
        let max = r.scratch_len() - SCRATCH_STRUCT - 64;
        if prog.len() > max || prog.len() % 8 != 0 {
            return Err(RestoreError::Unsupported(format!("thread {tid} has a seccomp filter of {} bytes; stasis restores filters up to {max} bytes", prog.len())));
        }
        let f = r
            .put(SCRATCH_STRUCT + 64, prog)
            .map_err(step("seccomp filter"))?;
        let fprog = words(&[(prog.len() / 8) as u64, f]);
        let a = r.put(SCRATCH_STRUCT, &fprog).map_err(step("sock_fprog"))?;
        const SECCOMP_SET_MODE_FILTER: u64 = 1;
        r.sys(
            "seccomp",
            libc::SYS_seccomp,
            &[SECCOMP_SET_MODE_FILTER, *flags, a],
        )
        .map_err(step(format!("installing a seccomp filter in thread {tid}")))?;
    }
    Ok(())
}

/// How many seccomp filters, oldest first, every thread of `p` has in
/// common: installed once in the main thread before the others are
/// created, which inherit them. The threads so share one filter tree, as
/// they did (a later `SECCOMP_FILTER_FLAG_TSYNC` needs that).
pub fn shared_seccomp(p: &ProcessImage) -> usize {
    let Some((first, rest)) = p.threads.split_first() else {
        return 0;
    };
    rest.iter().fold(first.seccomp.len(), |n, th| {
        first
            .seccomp
            .iter()
            .zip(&th.seccomp)
            .take(n)
            .take_while(|(a, b)| a == b)
            .count()
    })
}

/// `clone3` flags of a thread of the restored process.
pub const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM) as u64;

/// Creates a thread at TID `tid` (`clone3` with `set_tid`) from the calling
/// thread; the new thread inherits the caller's registers and stops at once
/// under the tracer (`PTRACE_O_TRACECLONE`). Returns its TID.
pub fn clone_thread<R: Remote>(r: &mut R, tid: i32) -> Result<u64, RestoreError> {
    clone_task(r, tid, THREAD_CLONE_FLAGS, 0)
}

/// Forks a child process at PID `pid` (`clone3` with `set_tid`, like
/// `fork`); it stops at once under the tracer (`PTRACE_O_TRACEFORK`).
pub fn fork_process<R: Remote>(r: &mut R, pid: i32) -> Result<u64, RestoreError> {
    clone_task(r, pid, 0, libc::SIGCHLD.unsigned_abs().into())
}

/// [`fork_process`], the child sharing the caller's fd table
/// (`CLONE_FILES`).
pub fn fork_process_sharing_files<R: Remote>(r: &mut R, pid: i32) -> Result<u64, RestoreError> {
    clone_task(
        r,
        pid,
        libc::CLONE_FILES as u64,
        libc::SIGCHLD.unsigned_abs().into(),
    )
}

/// [`fork_process_sharing_files`], the child a sibling of the caller
/// (`CLONE_PARENT`): the caller's parent is its parent, and its exit
/// signal the caller's (`clone3` takes none with `CLONE_PARENT`).
pub fn fork_sibling_sharing_files<R: Remote>(r: &mut R, pid: i32) -> Result<u64, RestoreError> {
    clone_task(r, pid, (libc::CLONE_FILES | libc::CLONE_PARENT) as u64, 0)
}

fn clone_task<R: Remote>(
    r: &mut R,
    tid: i32,
    flags: u64,
    exit_signal: u64,
) -> Result<u64, RestoreError> {
    let tid_addr = r
        .put(SCRATCH_STRUCT + 512, &tid.to_le_bytes())
        .map_err(step("set_tid array"))?;
    let args = sys::CloneArgs {
        flags,
        exit_signal,
        set_tid: tid_addr,
        set_tid_size: 1,
        ..Default::default()
    };
    let bytes = words(&[
        args.flags,
        args.pidfd,
        args.child_tid,
        args.parent_tid,
        args.exit_signal,
        args.stack,
        args.stack_size,
        args.tls,
        args.set_tid,
        args.set_tid_size,
        args.cgroup,
    ]);
    let a = r.put(SCRATCH_STRUCT, &bytes).map_err(step("clone_args"))?;
    let what = if flags & THREAD_CLONE_FLAGS != 0 {
        "thread"
    } else {
        "process"
    };
    // Free when the restore began (checked). Taken since by a process
    // /proc shows: refused, named as such. Held by a task /proc does not
    // show (one being created, or ending): retried for up to a second.
    let mut tries = 0;
    let got = loop {
        match r.sys("clone3", sys::SYS_CLONE3, &[a, bytes.len() as u64]) {
            Ok(got) => break got,
            Err(stasis_kernel::KernelError::RemoteSyscall { source, .. })
                if source.raw_os_error() == Some(libc::EEXIST) =>
            {
                let by = stasis_kernel::procfs::stat(tid).ok().map(|st| st.comm);
                if by.is_none() && tries < 50 {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                return Err(RestoreError::PidTaken {
                    pid: tid,
                    by: match by {
                        Some(comm) => format!("{comm}, which appeared during the restore"),
                        None => "a task the kernel still held after 1 s, which /proc does not show (one being created or ending)".into(),
                    },
                });
            }
            Err(e) => return Err(step(format!("creating {what} {tid}"))(e)),
        }
    };
    if got != sarg(i64::from(tid)) {
        return Err(ObjectError::Layout(format!("{what} {tid} was created as {got}")).into());
    }
    Ok(got)
}

/// Little-endian bytes of a list of words.
pub fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
