//! Per process, memory: the vDSO at its address, then every saved area
//! mapped and filled by `preadv` inside the process straight from the page
//! packs; shared anonymous memory mapped again through the first mapper's
//! `/proc/PID/map_files`; for a lazy restore, private anonymous memory
//! mapped empty and registered with a userfaultfd handed to the filler
//! (once the process's children are forked). A child keeps the private
//! areas it inherited from its parent, patched where its pages differ
//! ([`crate::inherit`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use stasis_image::manifest::{ProcessImage, Vma, VmaKind};
use stasis_image::{PageSource, RunEntry};
use stasis_kernel::uffd_remote::{create_in, UffdRemoteError};
use stasis_kernel::KernelError;
use stasis_sys as sys;

use crate::build::{self, step};
use crate::inherit::{self, Piece};
use crate::pipeline::Transport;
use crate::proc::Proc;
use crate::process::TreeCtx;
use crate::remote::Remote;
use crate::ObjectError;
use crate::{files, LazySink, RestoreError, Result};

/// What a child forked from its built parent keeps of the parent's memory.
pub(crate) struct Inherit<'a> {
    /// The parent and where its pages are.
    pub parent: &'a ProcessImage,
    pub sources: &'a [PageSource],
    /// Each area of the child it keeps (index into its `vmas`), with the
    /// parent's area it is (index into the parent's `vmas`).
    pub areas: HashMap<usize, usize>,
}

impl<'a> Inherit<'a> {
    /// What `child` keeps of the memory of `parent` (`sources`: the
    /// parent's pages).
    pub fn new(
        parent: &'a ProcessImage,
        sources: &'a [PageSource],
        child: &ProcessImage,
        lazy: bool,
    ) -> Self {
        Inherit {
            parent,
            sources,
            areas: inherit::inherited(parent, child, lazy),
        }
    }

    /// The address ranges of `child` that stay mapped, sorted.
    pub fn kept(&self, child: &ProcessImage) -> Vec<(u64, u64)> {
        let mut r: Vec<(u64, u64)> = self
            .areas
            .keys()
            .filter_map(|&i| child.vmas.get(i))
            .map(|v| (v.start, v.end))
            .collect();
        r.sort_unstable();
        r
    }
}

/// An area through which a shared anonymous object is mapped, once it
/// exists: (the PID as stasis sees it, start, end). Its
/// `/proc/PID/map_files` entry opens the whole object.
pub(crate) type ShmFirst = (i32, u64, u64);

/// What is done with one saved area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AreaAction {
    /// Shared anonymous memory (object inode, offset in it): its object
    /// made by the first area, mapped again by the others; each fills
    /// the pages saved with it.
    Shared { ino: u64, off: u64 },
    /// Mapped empty, left to the lazy filler.
    Lazy,
    /// A deleted file rebuilt by the fd factory, mapped and filled.
    Ghost,
    /// Mapped and filled from the packs.
    Plain,
}

/// Decides what to do with area `v` holding `data` bytes of image pages.
pub(crate) fn area_action(v: &Vma, data: u64, lazy: bool) -> AreaAction {
    if let Some((ino, off)) = v.shm {
        return AreaAction::Shared { ino, off };
    }
    if lazy && data > 0 && crate::left_to_filler(v) {
        return AreaAction::Lazy;
    }
    if matches!(v.kind, VmaKind::Ghost { .. }) {
        AreaAction::Ghost
    } else {
        AreaAction::Plain
    }
}

/// Maps and fills (or leaves to the filler) every area of process `p`.
/// Returns the bytes of image pages it covers.
pub(crate) fn restore_memory(
    s: &mut Proc,
    p: &ProcessImage,
    sources: &[PageSource],
    inherit: Option<&Inherit<'_>>,
    cx: &mut TreeCtx<'_, '_>,
) -> Result<u64> {
    // Every pack holding pages of this process is handed to it (one for a
    // full checkpoint, several along an incremental chain).
    let pack_fds = open_packs(s, sources, cx.transport)?;
    let mut filled = 0u64;
    let mut last = Instant::now();
    let mut lazy_areas = Vec::new();
    for (i, v) in p.vmas.iter().enumerate() {
        if let Some((h, from)) = inherit.and_then(|h| {
            let pi = *h.areas.get(&i)?;
            Some((h, h.parent.vmas.get(pi)?))
        }) {
            filled += patch_inherited(s, v, from, (sources, h.sources), &pack_fds)?;
            continue;
        }
        let runs: Vec<Vec<RunEntry>> = sources
            .iter()
            .map(|src| build::clip_runs(&src.runs, v.start, v.end))
            .collect();
        let fills: Vec<build::Fill<'_>> = runs
            .iter()
            .zip(&pack_fds)
            .map(|(r, fd)| (r.as_slice(), *fd))
            .collect();
        let data: u64 = runs.iter().flatten().map(RunEntry::len).sum();
        match area_action(v, data, cx.opts.lazy.is_some()) {
            AreaAction::Shared { ino, off } => {
                filled += map_shared(s, p, v, (ino, off), &fills, cx)?
            }
            AreaAction::Lazy => {
                // Mapped with its final protection and left empty: the filler
                // maps each page in (UFFDIO_COPY needs no write permission).
                build::map_vma(s, v, &[], None)?;
                lazy_areas.push((v.start, v.end));
                filled += data;
                cx.lazy_bytes += data;
                continue;
            }
            AreaAction::Ghost => filled += map_ghost(s, v, &fills, cx)?,
            AreaAction::Plain => filled += build::map_vma(s, v, &fills, None)?,
        }
        if let Some(cb) = &cx.opts.progress {
            if last.elapsed() >= Duration::from_millis(100) {
                cb(cx.filled + filled, cx.total);
                last = Instant::now();
            }
        }
    }
    for fd in pack_fds {
        s.sys("close", libc::SYS_close, &[fd])
            .map_err(step("closing a pack"))?;
    }
    for ring in &p.aio_rings {
        build::aio_refill(s, ring)?;
    }
    if !lazy_areas.is_empty() {
        cx.lazy_areas.insert(p.pid, lazy_areas);
    }
    Ok(filled)
}

/// Hands the areas of process `p` left to the lazy filler over (after its
/// children are forked: a fork of a process registered with a userfaultfd
/// would wait for the filler).
pub(crate) fn arm_lazy_areas(
    s: &mut Proc,
    p: &ProcessImage,
    cx: &mut TreeCtx<'_, '_>,
) -> Result<()> {
    let Some(areas) = cx.lazy_areas.remove(&p.pid) else {
        return Ok(());
    };
    match &cx.opts.lazy {
        Some(sink) => arm_lazy(s, p.pid, &areas, sink.as_ref()),
        None => Ok(()),
    }
}

/// Makes area `v` of a child, inherited from its parent's area `from`
/// (mapped, with the parent's pages), the child's: its pages that differ
/// from the parent's, or that the parent has not, are written from its
/// packs (`fds`: their fds in the process, one per source); the pages only
/// the parent has are dropped; equal pages stay shared. `(mine, theirs)`:
/// the child's and the parent's sources. Returns the bytes of the child's
/// pages in the area.
fn patch_inherited(
    s: &mut Proc,
    v: &Vma,
    from: &Vma,
    (mine, theirs): (&[PageSource], &[PageSource]),
    fds: &[u64],
) -> Result<u64> {
    let child = inherit::pieces(mine, v.start, v.end);
    let plan = inherit::patch(&child, &inherit::pieces(theirs, v.start, v.end));
    let mut writes = plan.write;
    let mut bufs = (Vec::new(), Vec::new());
    for (c, p) in &plan.compare {
        writes.extend(differing_pages(c, p, (mine, theirs), &mut bufs)?);
    }
    writes.sort_unstable_by_key(|p| p.vaddr);
    let what = |w: &str| format!("{w} {:#x}-{:#x} inherited from the parent", v.start, v.end);
    for &(a, b) in &plan.drop {
        s.sys(
            "madvise",
            libc::SYS_madvise,
            &[
                a,
                b - a,
                stasis_kernel::sarg(i64::from(libc::MADV_DONTNEED)),
            ],
        )
        .map_err(step(what("dropping the parent's pages of")))?;
    }
    let len = v.end - v.start;
    let rw = (libc::PROT_READ | libc::PROT_WRITE).unsigned_abs();
    let opened = !writes.is_empty() && from.prot & rw != rw;
    if opened {
        s.sys(
            "mprotect",
            libc::SYS_mprotect,
            &[v.start, len, u64::from(from.prot | rw)],
        )
        .map_err(step(what("making writable")))?;
    }
    for (src, fd) in fds.iter().enumerate() {
        let runs: Vec<RunEntry> = writes
            .iter()
            .filter(|p| p.src == src)
            .map(Piece::run)
            .collect();
        if !runs.is_empty() {
            build::fill(s, &runs, *fd)?;
        }
    }
    if opened || v.prot != from.prot {
        s.sys(
            "mprotect",
            libc::SYS_mprotect,
            &[v.start, len, u64::from(v.prot)],
        )
        .map_err(step(what("protecting")))?;
    }
    build::lock(s, v)?;
    Ok(child.iter().map(|p| p.len).sum())
}

/// Bytes compared at once.
const COMPARE_CHUNK: u64 = 1 << 20;

/// The parts of the child's pages `c` that differ from the parent's pages
/// `p` at the same addresses (both read from their packs, `(mine,
/// theirs)`, into `bufs`, kept from one call to the next: a fresh buffer
/// of a MiB costs more in page faults than the reads).
fn differing_pages(
    c: &Piece,
    p: &Piece,
    (mine, theirs): (&[PageSource], &[PageSource]),
    (a, b): &mut (Vec<u8>, Vec<u8>),
) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut at = c.vaddr;
    while at < c.end() {
        let end = (at + COMPARE_CHUNK).min(c.end());
        let (cs, ps) = (c.sub(at, end), p.sub(at, end));
        let n = usize::try_from(end - at).unwrap_or(0);
        a.resize(n, 0);
        b.resize(n, 0);
        read_piece(&cs, mine, a)?;
        read_piece(&ps, theirs, b)?;
        out.extend(inherit::differing(&cs, a, b));
        at = end;
    }
    Ok(out)
}

/// Reads the bytes of piece `p` from its pack (checked by the verifier
/// that runs alongside the restore).
fn read_piece(p: &Piece, sources: &[PageSource], buf: &mut [u8]) -> Result<()> {
    let src = sources.get(p.src).ok_or_else(|| {
        ObjectError::Inconsistent(format!("no page source {} for {:#x}", p.src, p.vaddr))
    })?;
    src.pack
        .file()
        .read_exact_at(buf, p.file_off)
        .map_err(|source| {
            stasis_image::ImageError::Io {
                action: "read",
                path: src.pack.path().to_path_buf(),
                source,
            }
            .into()
        })
}

/// Hands every pack of `sources` (as the restorer opened it) to the
/// process, each at its lowest free fd (close-on-exec), as an `open`
/// there would: the process may not see the image directory (under a root
/// of its own, pivoted into before its memory is made). Returns its fds
/// there.
pub(crate) fn open_packs<R: Remote>(
    s: &mut R,
    sources: &[PageSource],
    transport: &Transport,
) -> Result<Vec<u64>> {
    let h = transport.h;
    let tmp = i32::try_from(h + 1).map_err(|_| ObjectError::Layout("fd number overflow".into()))?;
    let mut pack_fds = Vec::with_capacity(sources.len());
    for src in sources {
        let path = src.pack.path().display().to_string();
        files::plant(s, &transport.sock, h, src.pack.file().as_fd(), tmp, true)?;
        let fd = s.sys(
            "fcntl",
            libc::SYS_fcntl,
            &[h + 1, libc::F_DUPFD_CLOEXEC as u64, 0],
        );
        s.sys("close", libc::SYS_close, &[h + 1])
            .map_err(step(format!("closing the handed-over page pack {path}")))?;
        pack_fds.push(fd.map_err(step(format!("giving the page pack {path} a low fd")))?);
    }
    Ok(pack_fds)
}

/// Maps an area of a deleted file: the rebuilt file is handed over just
/// above the transport, mapped, and closed.
fn map_ghost(
    s: &mut Proc,
    v: &Vma,
    fills: &[build::Fill<'_>],
    cx: &mut TreeCtx<'_, '_>,
) -> Result<u64> {
    let VmaKind::Ghost { id, name, .. } = &v.kind else {
        return build::map_vma(s, v, fills, None);
    };
    let h = cx.transport.h;
    let file = cx
        .factory
        .ghost_for_mapping(*id, name, build::may_write_shared(v))?;
    let tmp = i32::try_from(h + 1).map_err(|_| ObjectError::Layout("fd number overflow".into()))?;
    files::plant(s, &cx.transport.sock, h, file.as_fd(), tmp, true)?;
    let r = build::map_vma(s, v, fills, Some(h + 1));
    s.sys("close", libc::SYS_close, &[h + 1])
        .map_err(step("closing a mapped file"))?;
    r
}

/// Creates a userfaultfd inside the process, registers `areas` with it in
/// missing mode, and hands it to the lazy filler.
fn arm_lazy(s: &mut Proc, image_pid: i32, areas: &[(u64, u64)], sink: &dyn LazySink) -> Result<()> {
    let pid = s.t.pid();
    let u = create_in(s, pid, "userfaultfd", sink.features()).map_err(|e| match e {
        UffdRemoteError::Missing {
            wanted, granted, ..
        } => ObjectError::Incompatible(format!(
            "this kernel's userfaultfd lacks the events a lazy restore needs ({:?}); restore without --lazy",
            stasis_kernel::uffd::feature_names(wanted & !granted)
        ))
        .into(),
        UffdRemoteError::Create { source, .. } => {
            step("creating a userfaultfd for the lazy restore")(source)
        }
        UffdRemoteError::Close { source, .. } => {
            step("closing the process's copy of its userfaultfd")(source)
        }
        UffdRemoteError::Take { source, .. } | UffdRemoteError::Handshake { source, .. } => {
            source.into()
        }
    })?;
    for &(a, b) in areas {
        u.register(a, b - a, sys::UFFDIO_REGISTER_MODE_MISSING)?;
    }
    sink.hand(image_pid, pid, areas, u.fd())
        .map_err(|source| RestoreError::LazyHand { image_pid, source })
}

/// Maps shared anonymous area `v` (of object `ino`, at offset `off` in it;
/// or a private mapping of such an object, which reads it where it has not
/// copied on write) and fills the pages saved with it. The first area of an object makes
/// it: an anonymous shared mapping when the area covers the whole object,
/// else the object at its full size (the furthest any area of the tree
/// reaches) in a free range, this area mapped from it, the range unmapped.
/// Later areas map the same object through the first one's
/// `/proc/PID/map_files` entry, so all share the same pages.
fn map_shared(
    s: &mut Proc,
    p: &ProcessImage,
    v: &Vma,
    (ino, off): (u64, u64),
    fills: &[build::Fill<'_>],
    cx: &mut TreeCtx<'_, '_>,
) -> Result<u64> {
    let len = v.end - v.start;
    let size = cx.shm_sizes.get(&ino).copied().unwrap_or(0).max(off + len);
    if let Some((fpid, fstart, fend)) = cx.shm_first.get(&ino).copied() {
        let path = format!("/proc/{fpid}/map_files/{fstart:x}-{fend:x}");
        return map_from_object(s, v, &path, fills, cx.transport);
    }
    cx.shm_first.insert(ino, (s.t.pid(), v.start, v.end));
    if v.shared && off == 0 && len == size {
        return build::map_vma(s, v, fills, None);
    }
    let mut busy: Vec<(u64, u64)> = stasis_kernel::procfs::maps(s.t.pid())
        .map_err(KernelError::from)?
        .iter()
        .map(|m| (m.start, m.end))
        .chain(p.vmas.iter().map(|v| (v.start, v.end)))
        .collect();
    busy.sort_unstable();
    let at = build::find_gap(&busy, size).ok_or_else(|| {
        ObjectError::Layout(format!(
            "no free address range of {size} bytes to make the shared memory of {:#x}-{:#x} in",
            v.start, v.end
        ))
    })?;
    let made = s
        .sys(
            "mmap",
            libc::SYS_mmap,
            &[
                at,
                size,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        )
        .map_err(step(format!(
            "making the shared memory of {:#x}-{:#x} ({size} bytes)",
            v.start, v.end
        )))?;
    let path = format!("/proc/{}/map_files/{made:x}-{:x}", s.t.pid(), made + size);
    let r = map_from_object(s, v, &path, fills, cx.transport);
    let unmapped = s.sys("munmap", libc::SYS_munmap, &[made, size]);
    let filled = r?;
    unmapped.map_err(step("unmapping the whole shared object"))?;
    Ok(filled)
}

/// Maps area `v` from the shared object at `path` (a `map_files` entry):
/// handed over at the first number above the transport, mapped, filled,
/// closed.
fn map_from_object(
    s: &mut Proc,
    v: &Vma,
    path: &str,
    fills: &[build::Fill<'_>],
    transport: &Transport,
) -> Result<u64> {
    let h = transport.h;
    let writable = build::may_write_shared(v) || fills.iter().any(|f| !f.0.is_empty());
    let file: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(path)
        .map_err(|e| ObjectError::File {
            path: path.to_string(),
            what: "shared memory".into(),
            source: KernelError::Io {
                what: "open".into(),
                source: e,
            },
        })?
        .into();
    let tmp = i32::try_from(h + 1).map_err(|_| ObjectError::Layout("fd number overflow".into()))?;
    files::plant(s, &transport.sock, h, file.as_fd(), tmp, true)?;
    let r = build::map_vma(s, v, fills, Some(h + 1));
    s.sys("close", libc::SYS_close, &[h + 1])
        .map_err(step("closing a shared-memory fd"))?;
    r
}

/// The vDSO (and vvar) at their saved addresses; refused if this kernel's
/// layout differs.
pub(crate) fn restore_vdso(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    let find = |k: fn(&VmaKind) -> bool| p.vmas.iter().find(|v| k(&v.kind));
    let Some(vdso) = find(|k| matches!(k, VmaKind::Vdso)) else {
        return Ok(());
    };
    let vvar = find(|k| matches!(k, VmaKind::Vvar));
    let start = vvar.map_or(vdso.start, |v| v.start);
    s.sys(
        "arch_prctl",
        libc::SYS_arch_prctl,
        &[sys::ARCH_MAP_VDSO_64, start],
    )
    .map_err(step("mapping the vDSO"))?;
    let now = stasis_kernel::procfs::maps(s.t.pid()).map_err(KernelError::from)?;
    let placed = |name: &str, want: Option<&Vma>| match want {
        None => true,
        Some(w) => now
            .iter()
            .any(|m| m.name == name && m.start == w.start && m.end == w.end),
    };
    let vclock = find(|k| matches!(k, VmaKind::VvarVclock));
    if !(placed("[vdso]", Some(vdso)) && placed("[vvar]", vvar) && placed("[vvar_vclock]", vclock))
    {
        return Err(ObjectError::Incompatible(
            "this kernel's vDSO layout differs from the one in the image (it was dumped under another kernel); restore on the kernel that made it".into(),
        ).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vma;

    #[test]
    fn each_area_is_mapped_again_left_to_the_filler_or_filled() {
        let anon = vma(0x1000, 0x2000, VmaKind::Anon, false);
        // Shared anonymous memory: made or mapped again, lazy or not.
        let mut shm = vma(0x1000, 0x2000, VmaKind::Anon, true);
        shm.shm = Some((77, 0x3000));
        assert_eq!(
            area_action(&shm, 4096, true),
            AreaAction::Shared {
                ino: 77,
                off: 0x3000
            }
        );
        // Private anonymous with data: the filler's, only in a lazy restore.
        assert_eq!(area_action(&anon, 4096, true), AreaAction::Lazy);
        assert_eq!(area_action(&anon, 4096, false), AreaAction::Plain);
        // Locked: filled now (locking populates it).
        let mut locked = anon.clone();
        locked.flags = stasis_sys::vmflags::LOCKED;
        assert_eq!(area_action(&locked, 4096, true), AreaAction::Plain);
        // No data: nothing for the filler to owe; mapped (empty) now.
        assert_eq!(area_action(&anon, 0, true), AreaAction::Plain);
        // Shared anonymous and ghost file areas are filled before the tree runs.
        let shared = vma(0x1000, 0x2000, VmaKind::Anon, true);
        assert_eq!(area_action(&shared, 4096, true), AreaAction::Plain);
        let ghost = VmaKind::Ghost {
            id: 1,
            offset: 0,
            name: "/tmp/gone (deleted)".into(),
        };
        let ghost = vma(0x1000, 0x2000, ghost, false);
        assert_eq!(area_action(&ghost, 4096, true), AreaAction::Ghost);
        assert_eq!(area_action(&ghost, 4096, false), AreaAction::Ghost);
    }
}
