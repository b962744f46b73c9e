//! THE classes of memory areas, one definition each. Dump, tracking, the
//! copy-on-write copy and lazy restore all ask these, so they agree on
//! which areas they may treat as the process's own anonymous memory.

use crate::manifest::{Vma, VmaKind};

/// Private anonymous memory (heap, stack, bss, anonymous `mmap`): the pages
/// belong to this process alone. Shared memory (a `MAP_SHARED` area or a
/// shmem object, `shm`) never is, whatever else the image says. Only such
/// areas can be write-protected by a userfaultfd (the kernel refuses
/// private file mappings) or filled lazily (a missing-mode userfaultfd
/// cannot serve file mappings; shared memory is filled once for every
/// process that maps it).
pub fn private_anon(v: &Vma) -> bool {
    matches!(v.kind, VmaKind::Anon) && !v.shared && v.shm.is_none()
}

/// Private anonymous memory that dirty tracking registers: not
/// `PROT_NONE` (often huge reservations, whose write-protection would fill
/// page tables with markers; one that gets data later is saved whole).
pub fn tracked_anon(v: &Vma) -> bool {
    private_anon(v) && v.prot != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vma(kind: VmaKind, shared: bool, shm: Option<(u64, u64)>, prot: u32) -> Vma {
        Vma {
            start: 0x1000,
            end: 0x3000,
            prot,
            shared,
            growsdown: false,
            flags: 0,
            guards: Vec::new(),
            name: String::new(),
            kind,
            shm,
        }
    }

    #[test]
    fn classes() {
        let rw = 3;
        assert!(private_anon(&vma(VmaKind::Anon, false, None, rw)));
        assert!(tracked_anon(&vma(VmaKind::Anon, false, None, rw)));
        assert!(private_anon(&vma(VmaKind::Anon, false, None, 0)));
        assert!(!tracked_anon(&vma(VmaKind::Anon, false, None, 0)));
        assert!(!private_anon(&vma(VmaKind::Anon, true, Some((7, 0)), rw)));
        assert!(!private_anon(&vma(VmaKind::Anon, true, None, rw)));
        assert!(!private_anon(&vma(VmaKind::Anon, false, Some((7, 0)), rw)));
        assert!(!private_anon(&vma(VmaKind::Vdso, false, None, rw)));
    }
}
