//! Copy-on-write sharing between a parent and its children, kept across a
//! restore. Pure logic over the manifest (the remote side is in
//! [`crate::memory`]).
//!
//! A child is forked from its parent once the parent's memory is built, so
//! it starts with the parent's private pages shared copy-on-write, as it
//! did when the program forked it. Of the areas it inherits that way it
//! keeps those that [`inheritable`] says are the same area in both images
//! (the rest is unmapped and built as in any process). In a kept area the
//! child's saved pages are compared with the parent's saved pages at the
//! same addresses ([`patch`]): an equal page is left as it is, shared with
//! the parent; a different one, or one the parent has not, is written; one
//! only the parent has is dropped (`MADV_DONTNEED`: the child sees zeros,
//! or the file's content in a private file mapping, as when it had none).
//! The child's memory so ends exactly as if it were mapped fresh and
//! filled, and the pages it never wrote since the fork are one copy again.

use std::collections::HashMap;

use stasis_image::manifest::{ProcessImage, Vma, VmaKind};
use stasis_image::{PageSource, RunEntry};
use stasis_sys::vmflags;

/// Saved pages of one process at `[vaddr, vaddr + len)`, stored at
/// `file_off` of the pack of its source number `src`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub vaddr: u64,
    pub len: u64,
    pub src: usize,
    pub file_off: u64,
}

impl Piece {
    pub fn end(&self) -> u64 {
        self.vaddr + self.len
    }

    /// The part `[a, b)` of this piece (inside it).
    pub fn sub(&self, a: u64, b: u64) -> Piece {
        Piece {
            vaddr: a,
            len: b - a,
            src: self.src,
            file_off: self.file_off + (a - self.vaddr),
        }
    }

    /// As a pack run (for [`crate::build::fill`]).
    pub fn run(&self) -> RunEntry {
        RunEntry {
            vaddr: self.vaddr,
            npages: u32::try_from(self.len / stasis_sys::PAGE_SIZE).unwrap_or(0),
            flags: 0,
            file_off: self.file_off,
            checksum: 0,
        }
    }
}

/// The saved pages of a process in `[start, end)`, from every source of
/// its chain (they do not overlap), sorted by address.
pub(crate) fn pieces(sources: &[PageSource], start: u64, end: u64) -> Vec<Piece> {
    let mut out: Vec<Piece> = sources
        .iter()
        .enumerate()
        .flat_map(|(src, s)| {
            crate::build::clip_runs(&s.runs, start, end)
                .into_iter()
                .map(move |r| Piece {
                    vaddr: r.vaddr,
                    len: r.len(),
                    src,
                    file_off: r.file_off,
                })
        })
        .collect();
    out.sort_unstable_by_key(|p| p.vaddr);
    out
}

/// The `VmFlags` bits a child does not inherit (the kernel clears locking
/// at fork; the child locks its area again).
const NOT_INHERITED: u32 = vmflags::LOCKED | vmflags::LOCKONFAULT;

/// Whether the child's area `child` can be the one it inherits from its
/// parent's area `parent` at fork: the same range, private anonymous
/// memory or a private mapping of the same file, the same flags (but
/// locking) and name, no guard pages, nothing a fork leaves out or empties
/// (`MADV_DONTFORK`, `MADV_WIPEONFORK`, `MAP_DROPPABLE`), and in a lazy
/// restore not memory left to the filler (kept unshared there: the filler
/// serves each process's faults from its own pages).
pub(crate) fn inheritable(parent: &Vma, child: &Vma, lazy: bool) -> bool {
    let same_kind = match (&parent.kind, &child.kind) {
        (VmaKind::Anon, VmaKind::Anon) => true,
        (VmaKind::File { .. }, VmaKind::File { .. }) => parent.kind == child.kind,
        _ => false,
    };
    let private = |v: &Vma| !v.shared && v.shm.is_none() && v.guards.is_empty();
    let left_out = vmflags::DONTFORK | vmflags::WIPEONFORK | vmflags::DROPPABLE;
    same_kind
        && parent.start == child.start
        && parent.end == child.end
        && private(parent)
        && private(child)
        && parent.growsdown == child.growsdown
        && parent.flags & !NOT_INHERITED == child.flags & !NOT_INHERITED
        && parent.flags & left_out == 0
        && parent.name == child.name
        && !(lazy && (crate::left_to_filler(parent) || crate::left_to_filler(child)))
}

/// The areas process `child` keeps of those it inherits from `parent`:
/// each index into `child.vmas` with the index of the parent's area.
pub(crate) fn inherited(
    parent: &ProcessImage,
    child: &ProcessImage,
    lazy: bool,
) -> HashMap<usize, usize> {
    let by_start: HashMap<u64, usize> = parent
        .vmas
        .iter()
        .enumerate()
        .map(|(i, v)| (v.start, i))
        .collect();
    child
        .vmas
        .iter()
        .enumerate()
        .filter_map(|(ci, v)| {
            let pi = *by_start.get(&v.start)?;
            inheritable(&parent.vmas[pi], v, lazy).then_some((ci, pi))
        })
        .collect()
}

/// What to do in one inherited area to make the parent's pages the
/// child's.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Patch {
    /// Pages both saved: the child's and the parent's (same addresses), to
    /// compare; only those that differ are written.
    pub compare: Vec<(Piece, Piece)>,
    /// Pages only the child saved: written.
    pub write: Vec<Piece>,
    /// Pages only the parent saved: dropped in the child.
    pub drop: Vec<(u64, u64)>,
}

/// Works out [`Patch`] from the child's and the parent's saved pages in
/// one area (each sorted, non-overlapping).
pub(crate) fn patch(child: &[Piece], parent: &[Piece]) -> Patch {
    let mut out = Patch::default();
    let mut j = 0;
    for c in child {
        while j < parent.len() && parent[j].end() <= c.vaddr {
            j += 1;
        }
        let mut at = c.vaddr;
        let mut k = j;
        while k < parent.len() && parent[k].vaddr < c.end() {
            let p = &parent[k];
            let (a, b) = (p.vaddr.max(c.vaddr), p.end().min(c.end()));
            if a > at {
                out.write.push(c.sub(at, a));
            }
            out.compare.push((c.sub(a, b), p.sub(a, b)));
            at = b;
            k += 1;
        }
        if at < c.end() {
            out.write.push(c.sub(at, c.end()));
        }
    }
    let ranges = |v: &[Piece]| -> Vec<(u64, u64)> {
        stasis_image::chain::normalize(v.iter().map(|p| (p.vaddr, p.end())).collect())
    };
    out.drop = stasis_image::ranges::subtract(&ranges(parent), &ranges(child));
    out
}

/// Of two stretches of the same pages (`child`, `parent`: the bytes of
/// piece `of`), the parts whose pages differ, as parts of `of`.
pub(crate) fn differing(of: &Piece, child: &[u8], parent: &[u8]) -> Vec<Piece> {
    let page = usize::try_from(stasis_sys::PAGE_SIZE).unwrap_or(4096);
    let mut out: Vec<Piece> = Vec::new();
    for (i, (c, p)) in child.chunks(page).zip(parent.chunks(page)).enumerate() {
        if c == p {
            continue;
        }
        let a = of.vaddr + (i * page) as u64;
        let b = a + c.len() as u64;
        match out.last_mut() {
            Some(last) if last.end() == a => last.len += b - a,
            _ => out.push(of.sub(a, b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vma;

    const P: u64 = 4096;

    fn piece(page: u64, n: u64, src: usize, file_page: u64) -> Piece {
        Piece {
            vaddr: page * P,
            len: n * P,
            src,
            file_off: file_page * P,
        }
    }

    #[test]
    fn the_same_private_area_is_inherited_anything_else_is_not() {
        let anon = vma(0x10000, 0x20000, VmaKind::Anon, false);
        assert!(inheritable(&anon, &anon, false));
        // Another range, shared memory, a shmem object, guard pages.
        let mut other = anon.clone();
        other.end = 0x30000;
        assert!(!inheritable(&anon, &other, false));
        let shared = vma(0x10000, 0x20000, VmaKind::Anon, true);
        assert!(!inheritable(&shared, &shared, false));
        let mut shm = anon.clone();
        shm.shm = Some((7, 0));
        assert!(!inheritable(&shm, &shm, false));
        let mut guarded = anon.clone();
        guarded.guards = vec![(0x10000, 0x11000)];
        assert!(!inheritable(&anon, &guarded, false));
        // A fork leaves it out or empties it.
        for bit in [vmflags::DONTFORK, vmflags::WIPEONFORK, vmflags::DROPPABLE] {
            let mut a = anon.clone();
            a.flags = bit;
            assert!(!inheritable(&a, &a, false), "{bit:#x}");
        }
        // Locking is not inherited (the child locks again); advice is.
        let mut locked = anon.clone();
        locked.flags = vmflags::LOCKED;
        assert!(inheritable(&anon, &locked, false));
        let mut advised = anon.clone();
        advised.flags = vmflags::HUGEPAGE;
        assert!(!inheritable(&anon, &advised, false));
        // Another protection is fine (set after the patch).
        let mut ro = anon.clone();
        ro.prot = libc::PROT_READ.unsigned_abs();
        assert!(inheritable(&anon, &ro, false));
        // A private mapping of the same file at the same offset only.
        let file = |ino, offset| VmaKind::File {
            path: "/lib/x.so".into(),
            offset,
            dev: 1,
            ino,
        };
        let f = vma(0x10000, 0x20000, file(5, 0), false);
        assert!(inheritable(&f, &f, false));
        assert!(!inheritable(
            &f,
            &vma(0x10000, 0x20000, file(6, 0), false),
            false
        ));
        assert!(!inheritable(
            &f,
            &vma(0x10000, 0x20000, file(5, P), false),
            false
        ));
        assert!(!inheritable(&f, &anon, false));
        let vdso = vma(0x10000, 0x20000, VmaKind::Vdso, false);
        assert!(!inheritable(&vdso, &vdso, false));
        // Lazy: private anonymous memory is the filler's; a file mapping is not.
        assert!(!inheritable(&anon, &anon, true));
        assert!(inheritable(&f, &f, true));
        assert!(inheritable(&locked, &locked, true));
    }

    #[test]
    fn the_child_keeps_the_areas_that_match_by_address() {
        let mut parent = crate::testutil::image(100, 1, 100, 100);
        let mut child = crate::testutil::image(101, 100, 100, 100);
        parent.vmas = vec![
            vma(0x10000, 0x20000, VmaKind::Anon, false),
            vma(0x30000, 0x40000, VmaKind::Anon, false),
            vma(0x50000, 0x60000, VmaKind::Anon, true),
        ];
        child.vmas = vec![
            vma(0x8000, 0x9000, VmaKind::Anon, false),
            vma(0x10000, 0x20000, VmaKind::Anon, false),
            vma(0x30000, 0x38000, VmaKind::Anon, false),
            vma(0x50000, 0x60000, VmaKind::Anon, true),
        ];
        let got = inherited(&parent, &child, false);
        assert_eq!(got, HashMap::from([(1, 0)]));
    }

    #[test]
    fn equal_pages_are_compared_the_childs_own_written_the_parents_own_dropped() {
        // Child: pages 0-3 (source 0), 8-9 (source 1). Parent: 2-5, 9-10.
        let child = [piece(0, 4, 0, 10), piece(8, 2, 1, 20)];
        let parent = [piece(2, 4, 0, 50), piece(9, 2, 1, 60)];
        let p = patch(&child, &parent);
        assert_eq!(
            p.compare,
            vec![
                (piece(2, 2, 0, 12), piece(2, 2, 0, 50)),
                (piece(9, 1, 1, 21), piece(9, 1, 1, 60)),
            ]
        );
        assert_eq!(p.write, vec![piece(0, 2, 0, 10), piece(8, 1, 1, 20)]);
        assert_eq!(p.drop, vec![(4 * P, 6 * P), (10 * P, 11 * P)]);
        // One child run across several parent runs, with holes.
        let child = [piece(0, 10, 0, 0)];
        let parent = [piece(1, 1, 0, 0), piece(3, 2, 0, 1), piece(9, 3, 0, 3)];
        let p = patch(&child, &parent);
        assert_eq!(
            p.write,
            vec![piece(0, 1, 0, 0), piece(2, 1, 0, 2), piece(5, 4, 0, 5)]
        );
        assert_eq!(p.compare.len(), 3);
        assert_eq!(p.compare[2], (piece(9, 1, 0, 9), piece(9, 1, 0, 3)));
        assert_eq!(p.drop, vec![(10 * P, 12 * P)]);
        // Nothing saved on one side.
        assert_eq!(patch(&[], &parent).drop.len(), 3);
        assert_eq!(patch(&child, &[]).write, child.to_vec());
    }

    #[test]
    fn only_pages_that_differ_are_written() {
        let of = piece(4, 4, 1, 40);
        const PU: usize = 4096;
        let parent = vec![7u8; 4 * PU];
        let mut child = parent.clone();
        assert!(differing(&of, &child, &parent).is_empty());
        child[PU] = 1; // page 5
        child[2 * PU + 4095] = 1; // page 6
        child[3 * PU + 9] = 1; // page 7
        assert_eq!(differing(&of, &child, &parent), vec![piece(5, 3, 1, 41)]);
        child[2 * PU + 4095] = 7;
        assert_eq!(
            differing(&of, &child, &parent),
            vec![piece(5, 1, 1, 41), piece(7, 1, 1, 43)]
        );
    }
}
