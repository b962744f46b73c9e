//! Raw Linux kernel ABI used by Stasis, and nothing else.
//!
//! This crate holds ioctl numbers, `#[repr(C)]` structures and constants that
//! the `libc` crate does not provide (or provides only for some targets). Each
//! structure has a compile-time size assertion against the kernel's
//! definition, so a layout mistake fails the build instead of corrupting a
//! process. There is no logic here: safe wrappers live in `stasis-kernel`.
//! (One exception, not ABI: [`fault`], the test hook for fault injection,
//! lives here so that every crate can reach it.)
//!
//! Only x86-64 is supported for now.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

pub mod aio;
pub mod bpf;
pub mod fault;
pub mod inet_diag;
pub mod io_uring;
pub mod mount;
pub mod net;
pub mod prctl;
pub mod tty;
pub mod tun;
pub mod vmflags;

use core::mem::size_of;

/// Page size of x86-64 (4 KiB). Huge pages are multiples of it.
pub const PAGE_SIZE: u64 = 4096;

/// `O_LARGEFILE` as the kernel reports it in `/proc/PID/fdinfo` flags on
/// x86-64: `open` sets it, `pipe2` does not, `F_SETFL` cannot change it
/// (userspace headers define it as 0 on 64-bit targets).
pub const O_LARGEFILE: u32 = 0o100_000;

// ---------------------------------------------------------------------------
// ioctl number encoding (asm-generic/ioctl.h)
// ---------------------------------------------------------------------------

const IOC_NRBITS: u64 = 8;
const IOC_TYPEBITS: u64 = 8;
const IOC_SIZEBITS: u64 = 14;
const IOC_NRSHIFT: u64 = 0;
const IOC_TYPESHIFT: u64 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u64 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u64 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> u64 {
    (dir << IOC_DIRSHIFT)
        | (ty << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
        | ((size as u64) << IOC_SIZESHIFT)
}
const fn iowr(ty: u64, nr: u64, size: usize) -> u64 {
    ioc(IOC_READ | IOC_WRITE, ty, nr, size)
}
const fn ior(ty: u64, nr: u64, size: usize) -> u64 {
    ioc(IOC_READ, ty, nr, size)
}

// ---------------------------------------------------------------------------
// Registers (asm/user.h, elf.h)
// ---------------------------------------------------------------------------

/// `struct user_regs_struct` of x86-64, as read by `PTRACE_GETREGS` /
/// `PTRACE_GETREGSET(NT_PRSTATUS)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}
/// Number of u64 words in [`UserRegs`].
pub const USER_REGS_WORDS: usize = 27;
const _: () = assert!(size_of::<UserRegs>() == USER_REGS_WORDS * 8);
const _: () = assert!(size_of::<UserRegs>() == size_of::<libc::user_regs_struct>());

impl UserRegs {
    /// The registers as an array of words, in kernel order.
    pub fn to_words(&self) -> [u64; USER_REGS_WORDS] {
        [
            self.r15,
            self.r14,
            self.r13,
            self.r12,
            self.rbp,
            self.rbx,
            self.r11,
            self.r10,
            self.r9,
            self.r8,
            self.rax,
            self.rcx,
            self.rdx,
            self.rsi,
            self.rdi,
            self.orig_rax,
            self.rip,
            self.cs,
            self.eflags,
            self.rsp,
            self.ss,
            self.fs_base,
            self.gs_base,
            self.ds,
            self.es,
            self.fs,
            self.gs,
        ]
    }

    /// The inverse of [`UserRegs::to_words`]; `None` if the slice has the wrong length.
    pub fn from_words(w: &[u64]) -> Option<Self> {
        if w.len() != USER_REGS_WORDS {
            return None;
        }
        Some(Self {
            r15: w[0],
            r14: w[1],
            r13: w[2],
            r12: w[3],
            rbp: w[4],
            rbx: w[5],
            r11: w[6],
            r10: w[7],
            r9: w[8],
            r8: w[9],
            rax: w[10],
            rcx: w[11],
            rdx: w[12],
            rsi: w[13],
            rdi: w[14],
            orig_rax: w[15],
            rip: w[16],
            cs: w[17],
            eflags: w[18],
            rsp: w[19],
            ss: w[20],
            fs_base: w[21],
            gs_base: w[22],
            ds: w[23],
            es: w[24],
            fs: w[25],
            gs: w[26],
        })
    }
}

/// Capability bit numbers (`linux/capability.h`), for `CapEff` masks.
pub const CAP_SETUID: u32 = 7;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYS_NICE: u32 = 23;
pub const CAP_SYS_RESOURCE: u32 = 24;
pub const CAP_CHECKPOINT_RESTORE: u32 = 40;
/// ELF section type of a section without file contents (`.bss`).
pub const SHT_NOBITS: u32 = 8;
/// ELF note type of the general registers regset.
pub const NT_PRSTATUS: u32 = 1;
/// ELF note type of the x86 XSAVE area regset.
pub const NT_X86_XSTATE: u32 = 0x202;
/// Largest XSAVE area we accept (AMX tile data makes it ~11 KiB today).
pub const XSTATE_MAX: usize = 64 * 1024;
/// Offset of the software-reserved bytes of the XSAVE legacy area. In an
/// area read with `PTRACE_GETREGSET(NT_X86_XSTATE)` the kernel stores XCR0 in
/// its first u64 (`USER_XSTATE_XCR0_WORD`).
pub const XSAVE_SW_BYTES_OFFSET: usize = 464;
/// Offset of the XSAVE header (`xstate_bv` is its first u64).
pub const XSAVE_HEADER_OFFSET: usize = 512;

// ---------------------------------------------------------------------------
// ptrace (linux/ptrace.h)
// ---------------------------------------------------------------------------

pub const PTRACE_GETREGSET: u32 = 0x4204;
pub const PTRACE_SETREGSET: u32 = 0x4205;
pub const PTRACE_SEIZE: u32 = 0x4206;
pub const PTRACE_INTERRUPT: u32 = 0x4207;
pub const PTRACE_LISTEN: u32 = 0x4208;
pub const PTRACE_PEEKSIGINFO: u32 = 0x4209;
pub const PTRACE_GETSIGMASK: u32 = 0x420a;
pub const PTRACE_SETSIGMASK: u32 = 0x420b;
pub const PTRACE_GET_RSEQ_CONFIGURATION: u32 = 0x420f;

pub const PTRACE_O_TRACESYSGOOD: u64 = 1;
pub const PTRACE_O_EXITKILL: u64 = 1 << 20;
pub const PTRACE_O_TRACECLONE: u64 = 1 << 3;
pub const PTRACE_O_TRACEFORK: u64 = 1 << 1;
/// Suspends the tracee's seccomp filters while it is traced (CAP_SYS_ADMIN).
pub const PTRACE_O_SUSPEND_SECCOMP: u64 = 1 << 21;
pub const PTRACE_SECCOMP_GET_FILTER: u32 = 0x420c;
pub const PTRACE_SECCOMP_GET_METADATA: u32 = 0x420d;

pub const PTRACE_EVENT_STOP: i32 = 128;
/// `PTRACE_PEEKSIGINFO` flag: read the process-wide (shared) queue.
pub const PTRACE_PEEKSIGINFO_SHARED: u32 = 1;

/// `struct ptrace_peeksiginfo_args`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtracePeekSiginfoArgs {
    pub off: u64,
    pub flags: u32,
    pub nr: i32,
}
const _: () = assert!(size_of::<PtracePeekSiginfoArgs>() == 16);

/// `struct ptrace_rseq_configuration`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtraceRseqConfiguration {
    pub rseq_abi_pointer: u64,
    pub rseq_abi_size: u32,
    pub signature: u32,
    pub flags: u32,
    pub pad: u32,
}
const _: () = assert!(size_of::<PtraceRseqConfiguration>() == 24);
/// `rseq()` flag to unregister.
pub const RSEQ_FLAG_UNREGISTER: u64 = 1;

/// Size of `siginfo_t` on every Linux architecture.
pub const SIGINFO_SIZE: usize = 128;

// ---------------------------------------------------------------------------
// Signals (asm/signal.h)
// ---------------------------------------------------------------------------

/// `struct sigaction` as the `rt_sigaction` syscall sees it (not glibc's).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelSigaction {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}
const _: () = assert!(size_of::<KernelSigaction>() == 32);

/// `stack_t` for `sigaltstack`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackT {
    pub ss_sp: u64,
    pub ss_flags: i32,
    pub pad: i32,
    pub ss_size: u64,
}
const _: () = assert!(size_of::<StackT>() == 24);
const _: () = assert!(size_of::<StackT>() == size_of::<libc::stack_t>());

/// `struct itimerval` (two `struct timeval`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItimerVal {
    pub interval_sec: i64,
    pub interval_usec: i64,
    pub value_sec: i64,
    pub value_usec: i64,
}
const _: () = assert!(size_of::<ItimerVal>() == size_of::<libc::itimerval>());

/// Kernel-internal return values of interrupted syscalls (never seen by user
/// space in a running program, but visible in `rax` at a ptrace stop).
pub const ERESTARTSYS: i64 = 512;
pub const ERESTARTNOINTR: i64 = 513;
pub const ERESTARTNOHAND: i64 = 514;
pub const ERESTART_RESTARTBLOCK: i64 = 516;

// ---------------------------------------------------------------------------
// clone3 (linux/sched.h)
// ---------------------------------------------------------------------------

/// `struct clone_args` (version 2, with `cgroup`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}
const _: () = assert!(size_of::<CloneArgs>() == 88);

// ---------------------------------------------------------------------------
// prctl / arch_prctl
// ---------------------------------------------------------------------------

pub const PR_SET_MM: i32 = 35;
pub const PR_SET_MM_MAP: u64 = 14;
pub const PR_SET_MM_MAP_SIZE: u64 = 15;

/// `struct prctl_mm_map`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PrctlMmMap {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
    pub auxv: u64,
    pub auxv_size: u32,
    pub exe_fd: u32,
}
const _: () = assert!(size_of::<PrctlMmMap>() == 104);

pub const ARCH_GET_XCOMP_SUPP: u64 = 0x1021;
pub const ARCH_GET_XCOMP_PERM: u64 = 0x1022;
pub const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
pub const ARCH_MAP_VDSO_64: u64 = 0x2003;

// ---------------------------------------------------------------------------
// userfaultfd (linux/userfaultfd.h)
// ---------------------------------------------------------------------------

pub const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;

pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const UFFD_FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const UFFD_FEATURE_MISSING_HUGETLBFS: u64 = 1 << 4;
pub const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
pub const UFFD_FEATURE_MINOR_HUGETLBFS: u64 = 1 << 9;
pub const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
pub const UFFD_FEATURE_EXACT_ADDRESS: u64 = 1 << 11;
pub const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub const UFFD_FEATURE_POISON: u64 = 1 << 14;
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;

/// Names of the userfaultfd feature bits, in bit order.
pub const UFFD_FEATURE_NAMES: [&str; 17] = [
    "PAGEFAULT_FLAG_WP",
    "EVENT_FORK",
    "EVENT_REMAP",
    "EVENT_REMOVE",
    "MISSING_HUGETLBFS",
    "MISSING_SHMEM",
    "EVENT_UNMAP",
    "SIGBUS",
    "THREAD_ID",
    "MINOR_HUGETLBFS",
    "MINOR_SHMEM",
    "EXACT_ADDRESS",
    "WP_HUGETLBFS_SHMEM",
    "WP_UNPOPULATED",
    "POISON",
    "WP_ASYNC",
    "MOVE",
];

pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;
pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

/// `/dev/userfaultfd` ioctl that creates a userfaultfd.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(0, UFFDIO, 0x00, 0);

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}
const _: () = assert!(size_of::<UffdioApi>() == 24);

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}
const _: () = assert!(size_of::<UffdioRange>() == 16);

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}
const _: () = assert!(size_of::<UffdioRegister>() == 32);

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioCopy {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub copy: i64,
}
const _: () = assert!(size_of::<UffdioCopy>() == 40);

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}
const _: () = assert!(size_of::<UffdioWriteprotect>() == 24);

/// `struct uffd_msg` (a union in C; we keep the raw argument words).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdMsg {
    pub event: u8,
    pub reserved1: u8,
    pub reserved2: u16,
    pub reserved3: u32,
    pub arg: [u64; 3],
}
const _: () = assert!(size_of::<UffdMsg>() == 32);

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioZeropage {
    pub range: UffdioRange,
    pub mode: u64,
    pub zeropage: i64,
}
const _: () = assert!(size_of::<UffdioZeropage>() == 32);

pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_FORK: u8 = 0x13;
pub const UFFD_EVENT_REMAP: u8 = 0x14;
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
pub const UFFD_EVENT_UNMAP: u8 = 0x16;
/// `uffd_msg.arg.pagefault.flags`: the fault was a write.
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// `uffd_msg.arg.pagefault.flags`: the page was write-protected.
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

pub const UFFDIO_API: u64 = iowr(UFFDIO, 0x3F, size_of::<UffdioApi>());
pub const UFFDIO_REGISTER: u64 = iowr(UFFDIO, 0x00, size_of::<UffdioRegister>());
pub const UFFDIO_UNREGISTER: u64 = ior(UFFDIO, 0x01, size_of::<UffdioRange>());
pub const UFFDIO_WAKE: u64 = ior(UFFDIO, 0x02, size_of::<UffdioRange>());
pub const UFFDIO_COPY: u64 = iowr(UFFDIO, 0x03, size_of::<UffdioCopy>());
pub const UFFDIO_ZEROPAGE: u64 = iowr(UFFDIO, 0x04, size_of::<UffdioZeropage>());
pub const UFFDIO_WRITEPROTECT: u64 = iowr(UFFDIO, 0x06, size_of::<UffdioWriteprotect>());

// Values from the kernel headers, checked so a typo in the encoder shows up.
const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_aa01);
const _: () = assert!(UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xc020_aa04);
const _: () = assert!(UFFDIO_WAKE == 0x8010_aa02);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);
const _: () = assert!(USERFAULTFD_IOC_NEW == 0xaa00);

// ---------------------------------------------------------------------------
// PAGEMAP_SCAN (linux/fs.h, since 6.7)
// ---------------------------------------------------------------------------

pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
pub const PAGE_IS_HUGE: u64 = 1 << 6;
pub const PAGE_IS_SOFT_DIRTY: u64 = 1 << 7;

pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// `struct page_region`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}
const _: () = assert!(size_of::<PageRegion>() == 24);

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PmScanArg {
    pub size: u64,
    pub flags: u64,
    pub start: u64,
    pub end: u64,
    pub walk_end: u64,
    pub vec: u64,
    pub vec_len: u64,
    pub max_pages: u64,
    pub category_inverted: u64,
    pub category_mask: u64,
    pub category_anyof_mask: u64,
    pub return_mask: u64,
}
const _: () = assert!(size_of::<PmScanArg>() == 96);

pub const PAGEMAP_SCAN: u64 = iowr(b'f' as u64, 16, size_of::<PmScanArg>());
const _: () = assert!(PAGEMAP_SCAN == 0xc060_6610);

/// `/proc/PID/pagemap` entry bits (Documentation/admin-guide/mm/pagemap.rst).
pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAPPED: u64 = 1 << 62;
pub const PM_FILE_OR_SHARED_ANON: u64 = 1 << 61;
pub const PM_SOFT_DIRTY: u64 = 1 << 55;
/// A guard region page (`MADV_GUARD_INSTALL`, Linux 6.13; shown since
/// 6.14), a PTE marker too.
pub const PM_GUARD_REGION: u64 = 1 << 58;
/// `MADV_GUARD_INSTALL` (`<asm-generic/mman-common.h>`, Linux 6.13).
pub const MADV_GUARD_INSTALL: i32 = 102;
/// Swap type of a swapped entry (bits 0-4, shown to CAP_SYS_ADMIN).
pub const PM_SWAP_TYPE_MASK: u64 = 0x1f;
/// The swap type of a PTE marker (a userfaultfd write-protect marker on an
/// empty entry): the last of the 32 types (`include/linux/swap.h`).
pub const SWP_PTE_MARKER: u64 = 31;

// ---------------------------------------------------------------------------
// Syscall numbers not in every libc release.
// ---------------------------------------------------------------------------

pub const SYS_CLONE3: i64 = 435;

/// `membarrier` commands (`<linux/membarrier.h>`).
pub const MEMBARRIER_CMD_QUERY: u64 = 0;
/// The registrations of the calling process's mm, as a mask of the
/// `REGISTER` commands (Linux 6.3).
pub const MEMBARRIER_CMD_GET_REGISTRATIONS: u64 = 1 << 9;
/// Every `MEMBARRIER_CMD_REGISTER_*` command: global expedited, private
/// expedited, private expedited sync-core, private expedited rseq.
pub const MEMBARRIER_REGISTER_CMDS: [u64; 4] = [1 << 2, 1 << 4, 1 << 6, 1 << 8];
pub const SYS_PIDFD_OPEN: i64 = 434;
pub const SYS_PIDFD_GETFD: i64 = 438;
pub const SYS_PIDFD_SEND_SIGNAL: i64 = 424;
pub const SYS_CLOSE_RANGE: i64 = 436;
pub const SYS_USERFAULTFD: i64 = 323;
pub const SYS_RESTART_SYSCALL: i64 = 219;

/// `struct sched_attr` (include/uapi/linux/sched/types.h), the 56-byte
/// version 1 (with utilization clamps) of `sched_getattr`/`sched_setattr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedAttr {
    pub size: u32,
    pub sched_policy: u32,
    pub sched_flags: u64,
    pub sched_nice: i32,
    pub sched_priority: u32,
    pub sched_runtime: u64,
    pub sched_deadline: u64,
    pub sched_period: u64,
    pub sched_util_min: u32,
    pub sched_util_max: u32,
}
/// `sizeof(struct sched_attr)`, version 1.
pub const SCHED_ATTR_SIZE: u32 = 56;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE as usize);
/// `SCHED_FLAG_RESET_ON_FORK`, `SCHED_FLAG_RECLAIM`, `SCHED_FLAG_DL_OVERRUN`:
/// the flags that are part of a thread's policy (the utilization-clamp
/// flags only say which clamp fields a call sets).
pub const SCHED_FLAGS_KEPT: u64 = 0x01 | 0x02 | 0x04;

/// `fcntl` commands for a file's signal owner (include/uapi/asm-generic/fcntl.h).
pub const F_SETSIG: i32 = 10;
pub const F_GETSIG: i32 = 11;
pub const F_SETOWN_EX: i32 = 15;
pub const F_GETOWN_EX: i32 = 16;

/// `struct f_owner_ex`: who gets a file's SIGIO (`F_OWNER_TID` 0,
/// `F_OWNER_PID` 1, `F_OWNER_PGRP` 2) and its id.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FOwnerEx {
    pub kind: i32,
    pub pid: i32,
}
const _: () = assert!(std::mem::size_of::<FOwnerEx>() == 8);
