//! The properties of a memory area that `/proc/PID/smaps` shows in its
//! `VmFlags` line (`fs/proc/task_mmu.c`, `show_smap_vma_flags`) and that a
//! restore must set again: how the area was mapped, what `madvise` said of
//! it, whether it is locked. The bits are Stasis's own (they are stored in
//! images); each names its two-letter mnemonic.

/// `gd`: `MAP_GROWSDOWN` (a stack). Images keep it as `Vma::growsdown`.
pub const GROWSDOWN: u32 = 1 << 0;
/// `lo`: locked (`mlock`, `MAP_LOCKED`).
pub const LOCKED: u32 = 1 << 1;
/// `lf`: locked on fault (`mlock2(MLOCK_ONFAULT)`), with `lo`.
pub const LOCKONFAULT: u32 = 1 << 2;
/// `nr`: `MAP_NORESERVE`.
pub const NORESERVE: u32 = 1 << 3;
/// `dp`: `MAP_DROPPABLE` (Linux 6.11).
pub const DROPPABLE: u32 = 1 << 4;
/// `mw`: may be made writable (a shared file mapping whose file was opened
/// for writing, even if the area is read-only now).
pub const MAYWRITE: u32 = 1 << 5;
/// `sr`: `MADV_SEQUENTIAL`.
pub const SEQUENTIAL: u32 = 1 << 6;
/// `rr`: `MADV_RANDOM`.
pub const RANDOM: u32 = 1 << 7;
/// `dc`: `MADV_DONTFORK`.
pub const DONTFORK: u32 = 1 << 8;
/// `dd`: `MADV_DONTDUMP`.
pub const DONTDUMP: u32 = 1 << 9;
/// `mg`: `MADV_MERGEABLE` (KSM).
pub const MERGEABLE: u32 = 1 << 10;
/// `hg`: `MADV_HUGEPAGE`.
pub const HUGEPAGE: u32 = 1 << 11;
/// `nh`: `MADV_NOHUGEPAGE`.
pub const NOHUGEPAGE: u32 = 1 << 12;
/// `wf`: `MADV_WIPEONFORK`.
pub const WIPEONFORK: u32 = 1 << 13;
/// Registered with a userfaultfd of the program (`um`, `uw` or `ui`, with
/// the program holding one): set by the dump from the userfaultfd's image,
/// not from `VmFlags` (Stasis's own tracking registers areas too). A lazy
/// restore fills such an area itself (the program's userfaultfd takes it).
pub const USERFAULTFD: u32 = 1 << 14;

/// `MAP_DROPPABLE` (`<linux/mman.h>`, Linux 6.11): a mapping type, in place
/// of `MAP_PRIVATE`.
pub const MAP_DROPPABLE: i32 = 0x08;

/// Each bit and its mnemonic in `VmFlags`.
pub const MNEMONICS: [(&str, u32); 14] = [
    ("gd", GROWSDOWN),
    ("lo", LOCKED),
    ("lf", LOCKONFAULT),
    ("nr", NORESERVE),
    ("dp", DROPPABLE),
    ("mw", MAYWRITE),
    ("sr", SEQUENTIAL),
    ("rr", RANDOM),
    ("dc", DONTFORK),
    ("dd", DONTDUMP),
    ("mg", MERGEABLE),
    ("hg", HUGEPAGE),
    ("nh", NOHUGEPAGE),
    ("wf", WIPEONFORK),
];

/// The `madvise` advice that sets each advice bit again at restore.
pub const ADVICE: [(u32, i32); 8] = [
    (SEQUENTIAL, libc::MADV_SEQUENTIAL),
    (RANDOM, libc::MADV_RANDOM),
    (DONTFORK, libc::MADV_DONTFORK),
    (DONTDUMP, libc::MADV_DONTDUMP),
    (MERGEABLE, libc::MADV_MERGEABLE),
    (HUGEPAGE, libc::MADV_HUGEPAGE),
    (NOHUGEPAGE, libc::MADV_NOHUGEPAGE),
    (WIPEONFORK, libc::MADV_WIPEONFORK),
];

/// `MLOCK_ONFAULT` (`<linux/mman.h>`), for `mlock2`.
pub const MLOCK_ONFAULT: u64 = 1;

const _: () = assert!(libc::MADV_WIPEONFORK == 18 && libc::MADV_DONTDUMP == 16);
