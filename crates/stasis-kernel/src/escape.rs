//! Remote syscalls that a dying tracer cannot turn into a crash.
//!
//! A remote syscall ([`crate::Tracee::syscall`]) points a stopped thread at
//! a `syscall` instruction with chosen registers and signals blocked. If the
//! tracer dies in the middle (SIGKILL, OOM), the kernel detaches the thread
//! where it stands: with the injected registers and the blocked mask it ran
//! on into code after the `syscall` it was never meant to reach, and the
//! process died (SIGSEGV/SIGBUS, seen in 6 of 14 kills of a dump).
//!
//! The hatch closes that window. Each process being dumped gets an *escape
//! block* written into the unused tail of its vDSO (the vDSO image is padded
//! with zeros to a page boundary; `/proc/PID/mem` writes there with
//! `FOLL_FORCE`, copying that one page for the process only). The block is
//! code followed by data:
//!
//! ```text
//!   block+0   syscall                      <- injected syscalls run here
//!   block+2   mov rsp, [tmp_rsp]           <- the "parked" position
//!             a snapshot fork in flight: the child exit_group(0)s, the
//!               parent wait4(child, __WALL)s it
//!             close(fd) of an fd an injected syscall created (userfaultfd)
//!             munmap(scratch_addr, scratch_len) if scratch_addr != 0
//!             rt_sigprocmask(SIG_SETMASK, &saved_mask, NULL, 8)
//!             push [saved_rflags]; popfq
//!             mov rax..r15, [saved_*]      (all general registers)
//!             mov rsp, [saved_rsp]
//!             jmp [saved_rip]
//!   block+320 the batch code: a table of syscalls, then
//!             tgkill(self, an ignored signal) at block+0 (see `batch_code`)
//!   block+448 saved mask, rflags, tmp_rsp, registers, rsp, rip;
//!             the scratch page's address and length; fd; fork
//! ```
//!
//! The scratch page (where remote syscalls write what they report) is
//! recorded in the block before it is mapped (at a free address, with
//! `MAP_FIXED_NOREPLACE`) and forgotten before it is unmapped, so a dumper
//! killed meanwhile leaves no mapping behind either.
//!
//! Before the first remote syscall on a thread, the hatch writes that
//! thread's own registers (set up to restart an interrupted syscall, and to
//! abort an interrupted rseq critical section, exactly as the kernel would on
//! resume) and signal mask into the data, and the thread is "parked": every
//! injected syscall runs at `block+0` and stops at its exit with `rip` at
//! `block+2`. Whatever instant the tracer dies at, the thread, once let go by
//! the kernel, finishes the syscall in flight, restores its own signal mask
//! and registers, and jumps back to where it was. Nothing touches its FPU
//! state (no sigreturn frame is needed).
//!
//! One thread per process is parked at a time (the data holds one thread):
//! parking another thread first puts the parked one back (mask first, then
//! registers, so a death in between still escapes). The capture code
//! releases every thread (mask, then registers) before the block is wiped
//! ([`EscapeHatch::remove`]).
//!
//! A process without a vDSO, or whose vDSO tail has no room or holds
//! something else, gets no hatch: its remote syscalls run as before.
//!
//! Order of operations that keeps every instant safe:
//! * park: write data, `SETREGS` (rip = block), then `SETSIGMASK`(all);
//! * unpark: `SETSIGMASK`(saved), then `SETREGS`(saved).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use stasis_sys::UserRegs;

use crate::ptrace::normalize_interrupted_syscall;
use crate::{KernelError, Result};

/// Size of an escape block (code, then data at [`DATA`]).
pub const BLOCK_LEN: usize = 640;
/// Offset of the batch code in the block (see [`batch_code`]).
pub const BATCH_OFFSET: usize = 320;
/// Offset of the data in the block.
const DATA: usize = 448;
// Data layout, in 8-byte slots after DATA.
const MASK: usize = 0;
const RFLAGS: usize = 1;
const TMP_RSP: usize = 2;
/// The general registers loaded by the code, in this order (slots 3..18).
const GPRS: [Gpr; 15] = [
    Gpr::Rax,
    Gpr::Rbx,
    Gpr::Rcx,
    Gpr::Rdx,
    Gpr::Rsi,
    Gpr::Rdi,
    Gpr::Rbp,
    Gpr::R8,
    Gpr::R9,
    Gpr::R10,
    Gpr::R11,
    Gpr::R12,
    Gpr::R13,
    Gpr::R14,
    Gpr::R15,
];
const RSP: usize = 18;
const RIP: usize = 19;
/// Slots 0..THREAD_SLOTS describe the parked thread; the two after them
/// the process's scratch page (address, length; 0 if none), which the
/// escape code unmaps.
const THREAD_SLOTS: usize = 20;
const SCRATCH_ADDR: usize = 20;
const SCRATCH_LEN: usize = 21;
/// An fd an injected syscall created in the process that the escape code
/// closes: -1 none, -2 the injected syscall's result (`rax`), else that fd.
const FD: usize = 22;
/// A snapshot fork in flight: 0 none; -2 the injected `clone`'s result
/// (`rax`: 0 in the child, which exits at once; the child's pid in the
/// parent, which reaps it); else the pid of the child to reap.
const FORK: usize = 23;
const SLOTS: usize = 24;
const _: () = assert!(DATA + SLOTS * 8 <= BLOCK_LEN);

#[derive(Clone, Copy)]
enum Gpr {
    Rax,
    Rbx,
    Rcx,
    Rdx,
    Rsi,
    Rdi,
    Rbp,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
}

impl Gpr {
    /// (REX prefix, ModRM byte) of `mov reg, [rip + disp32]`.
    fn mov_load(self) -> (u8, u8) {
        let (rex, reg) = match self {
            Gpr::Rax => (0x48, 0),
            Gpr::Rcx => (0x48, 1),
            Gpr::Rdx => (0x48, 2),
            Gpr::Rbx => (0x48, 3),
            Gpr::Rbp => (0x48, 5),
            Gpr::Rsi => (0x48, 6),
            Gpr::Rdi => (0x48, 7),
            Gpr::R8 => (0x4c, 0),
            Gpr::R9 => (0x4c, 1),
            Gpr::R10 => (0x4c, 2),
            Gpr::R11 => (0x4c, 3),
            Gpr::R12 => (0x4c, 4),
            Gpr::R13 => (0x4c, 5),
            Gpr::R14 => (0x4c, 6),
            Gpr::R15 => (0x4c, 7),
        };
        (rex, (reg << 3) | 5)
    }

    fn of(self, r: &UserRegs) -> u64 {
        match self {
            Gpr::Rax => r.rax,
            Gpr::Rbx => r.rbx,
            Gpr::Rcx => r.rcx,
            Gpr::Rdx => r.rdx,
            Gpr::Rsi => r.rsi,
            Gpr::Rdi => r.rdi,
            Gpr::Rbp => r.rbp,
            Gpr::R8 => r.r8,
            Gpr::R9 => r.r9,
            Gpr::R10 => r.r10,
            Gpr::R11 => r.r11,
            Gpr::R12 => r.r12,
            Gpr::R13 => r.r13,
            Gpr::R14 => r.r14,
            Gpr::R15 => r.r15,
        }
    }
}

/// Machine code of the block (position independent: data is addressed
/// relative to `rip`).
pub fn code() -> Vec<u8> {
    let mut c: Vec<u8> = Vec::with_capacity(DATA);
    // Appends `bytes` followed by the rip-relative displacement of `slot`.
    fn rel(c: &mut Vec<u8>, bytes: &[u8], slot: usize) {
        c.extend_from_slice(bytes);
        let next = c.len() + 4;
        let target = DATA + slot * 8;
        let disp = i32::try_from(target).unwrap_or(0) - i32::try_from(next).unwrap_or(0);
        c.extend_from_slice(&disp.to_le_bytes());
    }
    // A forward short jump: the opcode now, the target patched by `land`.
    fn jump(c: &mut Vec<u8>, op: u8) -> usize {
        c.extend_from_slice(&[op, 0]);
        c.len()
    }
    fn land(c: &mut [u8], from: &[usize]) {
        for &f in from {
            c[f - 1] = u8::try_from(c.len() - f).unwrap_or(0);
        }
    }
    c.extend_from_slice(&[0x0f, 0x05]); // syscall (the injected one)
    debug_assert_eq!(c.len() as u64, PARKED_OFFSET);
    rel(&mut c, &[0x48, 0x8b, 0x25], TMP_RSP); // mov rsp, [tmp_rsp]
                                               // A snapshot fork in flight.
    rel(&mut c, &[0x48, 0x8b, 0x3d], FORK); // mov rdi, [fork]
    c.extend_from_slice(&[0x48, 0x85, 0xff]); // test rdi, rdi
    let no_fork = jump(&mut c, 0x74); // jz no_fork
    c.extend_from_slice(&[0x48, 0x83, 0xff, 0xfe]); // cmp rdi, -2
    let reap = jump(&mut c, 0x75); // jne reap (rdi is the child)
    c.extend_from_slice(&[0x48, 0x85, 0xc0]); // test rax, rax
    let parent = jump(&mut c, 0x75); // jnz parent
    c.extend_from_slice(&[0x31, 0xff]); // xor edi, edi
    c.extend_from_slice(&[0xb8, 231, 0, 0, 0]); // mov eax, SYS_exit_group
    c.extend_from_slice(&[0x0f, 0x05]); // syscall (the child ends here)
    land(&mut c, &[parent]);
    c.extend_from_slice(&[0x48, 0x85, 0xc0]); // test rax, rax
    let failed = jump(&mut c, 0x78); // js no_fork (the clone failed)
    c.extend_from_slice(&[0x48, 0x89, 0xc7]); // mov rdi, rax
    land(&mut c, &[reap]);
    c.extend_from_slice(&[0x31, 0xf6]); // xor esi, esi
    c.extend_from_slice(&[0xba, 0, 0, 0, 0x40]); // mov edx, __WALL
    c.extend_from_slice(&[0x45, 0x31, 0xd2]); // xor r10d, r10d
    c.extend_from_slice(&[0xb8, 61, 0, 0, 0]); // mov eax, SYS_wait4
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    land(&mut c, &[no_fork, failed]);
    // An fd created in the process.
    rel(&mut c, &[0x48, 0x8b, 0x3d], FD); // mov rdi, [fd]
    c.extend_from_slice(&[0x48, 0x83, 0xff, 0xfe]); // cmp rdi, -2
    let close = jump(&mut c, 0x75); // jne close
    c.extend_from_slice(&[0x48, 0x89, 0xc7]); // mov rdi, rax
    land(&mut c, &[close]);
    c.extend_from_slice(&[0x48, 0x85, 0xff]); // test rdi, rdi
    let no_fd = jump(&mut c, 0x78); // js no_fd (none, or the syscall failed)
    c.extend_from_slice(&[0xb8, 3, 0, 0, 0]); // mov eax, SYS_close
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    land(&mut c, &[no_fd]);
    // The scratch page.
    rel(&mut c, &[0x48, 0x8b, 0x3d], SCRATCH_ADDR); // mov rdi, [scratch_addr]
    c.extend_from_slice(&[0x48, 0x85, 0xff]); // test rdi, rdi
    let no_scratch = jump(&mut c, 0x74); // jz no_scratch
    rel(&mut c, &[0x48, 0x8b, 0x35], SCRATCH_LEN); // mov rsi, [scratch_len]
    c.extend_from_slice(&[0xb8, 11, 0, 0, 0]); // mov eax, SYS_munmap
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    land(&mut c, &[no_scratch]);
    c.extend_from_slice(&[0xb8, 14, 0, 0, 0]); // mov eax, SYS_rt_sigprocmask
    c.extend_from_slice(&[0xbf, 2, 0, 0, 0]); // mov edi, SIG_SETMASK
    rel(&mut c, &[0x48, 0x8d, 0x35], MASK); // lea rsi, [mask]
    c.extend_from_slice(&[0x31, 0xd2]); // xor edx, edx
    c.extend_from_slice(&[0x41, 0xba, 8, 0, 0, 0]); // mov r10d, 8
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    rel(&mut c, &[0xff, 0x35], RFLAGS); // push [rflags]
    c.push(0x9d); // popfq
    for (i, g) in GPRS.iter().enumerate() {
        let (rex, modrm) = g.mov_load();
        rel(&mut c, &[rex, 0x8b, modrm], 3 + i);
    }
    rel(&mut c, &[0x48, 0x8b, 0x25], RSP); // mov rsp, [rsp slot]
    rel(&mut c, &[0xff, 0x25], RIP); // jmp [rip slot]
    debug_assert!(c.len() <= BATCH_OFFSET);
    c.resize(BATCH_OFFSET, 0xcc); // int3 padding
    c.extend_from_slice(&batch_code());
    debug_assert!(c.len() <= DATA);
    c.resize(DATA, 0xcc);
    c
}

/// Size of one entry of a batch table: the syscall number, six arguments
/// and the result, 8 bytes each.
pub const BATCH_ENTRY: usize = 64;

/// The batch code, at [`BATCH_OFFSET`]: several remote syscalls for the
/// price of one stop of the thread.
///
/// Entered with `rbx` = a table of `rbp` entries of [`BATCH_ENTRY`] bytes
/// (nr, six arguments, result), and `r12`, `r13`, `r14` = the thread's
/// tgid, tid and a signal whose action is to ignore it. It runs each
/// syscall and stores its result in the entry, then jumps to the block's
/// `syscall` with `tgkill(tgid, tid, signal)`: the thread returns at the
/// parked position with that signal pending. Traced, it stops there (a
/// signal-delivery stop, which the tracer suppresses); if the tracer died
/// meanwhile, the signal is discarded (its action is to ignore it, and the
/// tracer left it unblocked) and the thread escapes as after any injected
/// syscall. Only syscalls that change nothing belong in a batch: a thread
/// whose tracer died finishes the table.
fn batch_code() -> Vec<u8> {
    let mut c: Vec<u8> = Vec::new();
    let top = c.len();
    c.extend_from_slice(&[0x48, 0x85, 0xed]); // test rbp, rbp
    c.extend_from_slice(&[0x74, 0]); // jz done
    let done = c.len();
    c.extend_from_slice(&[0x48, 0x8b, 0x03]); // mov rax, [rbx]
    c.extend_from_slice(&[0x48, 0x8b, 0x7b, 0x08]); // mov rdi, [rbx + 8]
    c.extend_from_slice(&[0x48, 0x8b, 0x73, 0x10]); // mov rsi, [rbx + 16]
    c.extend_from_slice(&[0x48, 0x8b, 0x53, 0x18]); // mov rdx, [rbx + 24]
    c.extend_from_slice(&[0x4c, 0x8b, 0x53, 0x20]); // mov r10, [rbx + 32]
    c.extend_from_slice(&[0x4c, 0x8b, 0x43, 0x28]); // mov r8, [rbx + 40]
    c.extend_from_slice(&[0x4c, 0x8b, 0x4b, 0x30]); // mov r9, [rbx + 48]
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    c.extend_from_slice(&[0x48, 0x89, 0x43, 0x38]); // mov [rbx + 56], rax
    c.extend_from_slice(&[0x48, 0x83, 0xc3, 0x40]); // add rbx, 64
    c.extend_from_slice(&[0x48, 0xff, 0xcd]); // dec rbp
    let back =
        i8::try_from(i64::try_from(top).unwrap_or(0) - i64::try_from(c.len() + 2).unwrap_or(0))
            .unwrap_or(0);
    c.extend_from_slice(&[0xeb, back.to_le_bytes()[0]]); // jmp top
    c[done - 1] = u8::try_from(c.len() - done).unwrap_or(0);
    c.extend_from_slice(&[0xb8, 234, 0, 0, 0]); // mov eax, SYS_tgkill
    c.extend_from_slice(&[0x4c, 0x89, 0xe7]); // mov rdi, r12
    c.extend_from_slice(&[0x4c, 0x89, 0xee]); // mov rsi, r13
    c.extend_from_slice(&[0x4c, 0x89, 0xf2]); // mov rdx, r14
                                              // jmp block + 0 (the `syscall`), from BATCH_OFFSET + here.
    let next = i64::try_from(BATCH_OFFSET + c.len() + 5).unwrap_or(0);
    c.push(0xe9);
    c.extend_from_slice(&i32::try_from(-next).unwrap_or(0).to_le_bytes());
    c
}

/// Offset of the parked position (just after the injected `syscall`).
pub const PARKED_OFFSET: u64 = 2;

/// The data half of a block for a thread whose registers (already set up
/// for resumption) are `regs` and whose signal mask is `mask`.
pub fn data(regs: &UserRegs, mask: u64) -> [u8; THREAD_SLOTS * 8] {
    let mut d = [0u8; THREAD_SLOTS * 8];
    let mut put = |slot: usize, v: u64| d[slot * 8..slot * 8 + 8].copy_from_slice(&v.to_le_bytes());
    put(MASK, mask);
    put(RFLAGS, regs.eflags);
    // Below the red zone: what the code pushes (rflags), and a signal
    // delivered after the mask is restored, lands where a signal would.
    put(TMP_RSP, regs.rsp.wrapping_sub(256) & !15);
    for (i, g) in GPRS.iter().enumerate() {
        put(3 + i, g.of(regs));
    }
    put(RSP, regs.rsp);
    put(RIP, regs.rip);
    d
}

/// Where in a vDSO image of `len` bytes an escape block can go: the last
/// [`BLOCK_LEN`] bytes (64-aligned), if they lie past everything the ELF
/// image uses (program and section headers and what they describe).
pub fn block_offset(image: &[u8]) -> Option<usize> {
    let len = image.len();
    let start = len.checked_sub(BLOCK_LEN)? & !63;
    let used = elf_used_end(image)?;
    (used <= start).then_some(start)
}

fn u16_at(b: &[u8], o: usize) -> Option<usize> {
    Some(usize::from(u16::from_le_bytes(
        b.get(o..o + 2)?.try_into().ok()?,
    )))
}

fn u64_at(b: &[u8], o: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?)).ok()
}

/// End of the bytes an ELF64 image uses: its headers, what its program
/// headers load and what its sections hold.
fn elf_used_end(b: &[u8]) -> Option<usize> {
    if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 {
        return None;
    }
    let (phoff, shoff) = (u64_at(b, 0x20)?, u64_at(b, 0x28)?);
    let (phentsize, phnum) = (u16_at(b, 0x36)?, u16_at(b, 0x38)?);
    let (shentsize, shnum) = (u16_at(b, 0x3a)?, u16_at(b, 0x3c)?);
    let mut end = 64usize
        .max(phoff.checked_add(phentsize.checked_mul(phnum)?)?)
        .max(shoff.checked_add(shentsize.checked_mul(shnum)?)?);
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        end = end.max(u64_at(b, p + 8)?.checked_add(u64_at(b, p + 32)?)?);
    }
    for i in 0..shnum {
        let s = shoff + i * shentsize;
        let kind = u32::from_le_bytes(b.get(s + 4..s + 8)?.try_into().ok()?);
        if kind != stasis_sys::SHT_NOBITS {
            end = end.max(u64_at(b, s + 24)?.checked_add(u64_at(b, s + 32)?)?);
        }
    }
    Some(end)
}

/// Whether `rip` is inside where an escape block of the vDSO at
/// `[vdso_start, vdso_end)` would be: a thread there is parked, or running
/// its escape code after a dumper died.
pub fn in_block(rip: u64, vdso_start: u64, vdso_end: u64) -> bool {
    let len = usize::try_from(vdso_end.saturating_sub(vdso_start)).unwrap_or(0);
    match len.checked_sub(BLOCK_LEN) {
        Some(off) => rip >= vdso_start + (off & !63) as u64 && rip < vdso_end,
        None => false,
    }
}

/// The thread currently parked on a hatch.
#[derive(Debug, Clone, Copy)]
struct Parked {
    tid: i32,
    regs: UserRegs,
    mask: u64,
}

/// The escape block of one process (see the module docs).
#[derive(Debug)]
pub struct EscapeHatch {
    pid: i32,
    block: u64,
    mem: File,
    parked: Mutex<Option<Parked>>,
    /// The process's ID in its own PID namespace when that is not ours
    /// (`None`: IDs as we see them), read once.
    own_pid: std::sync::OnceLock<Option<i32>>,
}

impl EscapeHatch {
    /// Writes the escape code into the tail of `pid`'s vDSO at
    /// `[vdso_start, vdso_end)`. `None` if the tail has no room for it (or
    /// holds anything but zeros or an earlier block).
    pub fn install(pid: i32, vdso_start: u64, vdso_end: u64) -> Result<Option<Self>> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| KernelError::io(format!("open /proc/{pid}/mem"), e))?;
        let len = usize::try_from(vdso_end.saturating_sub(vdso_start)).unwrap_or(0);
        let mut image = vec![0u8; len];
        mem.read_exact_at(&mut image, vdso_start)
            .map_err(|source| KernelError::ReadMem {
                pid,
                addr: vdso_start,
                len: len as u64,
                source,
            })?;
        let Some(off) = block_offset(&image) else {
            return Ok(None);
        };
        let code = code();
        let tail = &image[off..off + BLOCK_LEN];
        // Zeros, or the code of a block an earlier (killed) dump left.
        if tail.iter().any(|&b| b != 0) && tail[..DATA] != code[..] {
            return Ok(None);
        }
        let block = vdso_start + off as u64;
        // Code, then the process-wide slots: no scratch page, no fd
        // (-1: fd 0 is a real fd), no fork.
        let mut init = code.clone();
        init.resize(BLOCK_LEN, 0);
        init[DATA + FD * 8..DATA + FD * 8 + 8].copy_from_slice(&(-1i64).to_le_bytes());
        let code = init;
        mem.write_all_at(&code, block)
            .map_err(|source| KernelError::WriteMem {
                pid,
                addr: block,
                len: code.len() as u64,
                source,
            })?;
        Ok(Some(Self {
            pid,
            block,
            mem,
            parked: Mutex::new(None),
            own_pid: std::sync::OnceLock::new(),
        }))
    }

    /// The thread group's and thread `tid`'s IDs in the process's own PID
    /// namespace (a thread signals itself by them). The status file that
    /// says is costly (the kernel sums the process's memory for it): read
    /// only when the process is in another PID namespace than ours, once
    /// for the process and once for each thread.
    pub fn ids_in_own_ns(&self, tid: i32) -> (i32, i32) {
        use crate::ns::{ns_id, own_ns_id, pid_in_own_ns, NsKind};
        let own = *self.own_pid.get_or_init(|| {
            let ours = own_ns_id(NsKind::Pid);
            if ours.is_some() && ns_id(self.pid, NsKind::Pid) == ours {
                None
            } else {
                pid_in_own_ns(self.pid, self.pid)
            }
        });
        match own {
            None => (self.pid, tid),
            Some(tgid) => (tgid, pid_in_own_ns(self.pid, tid).unwrap_or(tid)),
        }
    }

    /// Records the scratch page `[addr, addr + len)` (before it is
    /// mapped), or forgets it (`len == 0`, before it is unmapped): while it
    /// is recorded, a thread that escapes unmaps it.
    pub fn set_scratch(&self, addr: u64, len: u64) -> Result<()> {
        let addr = if len == 0 { 0 } else { addr };
        self.set_slot(SCRATCH_ADDR, crate::sarg_i64(addr))?;
        self.set_slot(SCRATCH_LEN, crate::sarg_i64(len))
    }

    fn set_slot(&self, slot: usize, v: i64) -> Result<()> {
        let at = self.block + (DATA + slot * 8) as u64;
        self.mem
            .write_all_at(&v.to_le_bytes(), at)
            .map_err(|source| KernelError::WriteMem {
                pid: self.pid,
                addr: at,
                len: 8,
                source,
            })
    }

    /// Records the resources an injected syscall is about to create or
    /// release, so that the escape code undoes what a dead dumper left:
    /// returns what to record once the syscall has returned `rax`.
    /// * `userfaultfd`: the fd slot says "close what this returns", then
    ///   the fd itself;
    /// * `close` of that fd: the slot is cleared *before* (from then on the
    ///   injected close runs even if we die: a death just before it leaks
    ///   the fd, never closes another one twice);
    /// * `clone` (a snapshot): the fork slot says "the child exits, the
    ///   parent reaps it", then the child's pid;
    /// * `wait4` of that child: cleared before, likewise.
    pub(crate) fn before_syscall(&self, nr: i64, args: &[u64]) -> Result<Option<(usize, bool)>> {
        let a0 = args.first().copied().map(crate::sarg_i64);
        let current = |slot: usize| -> Result<i64> {
            let mut b = [0u8; 8];
            self.mem
                .read_exact_at(&mut b, self.block + (DATA + slot * 8) as u64)
                .map_err(|source| KernelError::ReadMem {
                    pid: self.pid,
                    addr: self.block,
                    len: 8,
                    source,
                })?;
            Ok(i64::from_le_bytes(b))
        };
        match nr {
            n if n == stasis_sys::SYS_USERFAULTFD => {
                self.set_slot(FD, -2)?;
                Ok(Some((FD, false)))
            }
            libc::SYS_clone => {
                self.set_slot(FORK, -2)?;
                Ok(Some((FORK, true)))
            }
            libc::SYS_close if a0.is_some() && a0 == Some(current(FD)?) => {
                self.set_slot(FD, -1)?;
                Ok(None)
            }
            libc::SYS_wait4 if a0.is_some() && a0 == Some(current(FORK)?) => {
                self.set_slot(FORK, 0)?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Records what a syscall announced by [`EscapeHatch::before_syscall`]
    /// returned: the fd or child to undo, or nothing if it failed.
    pub(crate) fn after_syscall(&self, slot: (usize, bool), rax: i64) -> Result<()> {
        let (slot, fork) = slot;
        let none = if fork { 0 } else { -1 };
        self.set_slot(
            slot,
            if rax > 0 || (!fork && rax == 0) {
                rax
            } else {
                none
            },
        )
    }

    /// Address of the injected `syscall` instruction.
    pub fn syscall_addr(&self) -> u64 {
        self.block
    }

    /// The process the block belongs to.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Address of the batch code (see [`batch_code`]).
    pub fn batch_addr(&self) -> u64 {
        self.block + BATCH_OFFSET as u64
    }

    /// Makes sure `tid` is the parked thread, writing its saved state into
    /// the block if it is not yet (putting back another parked thread
    /// first). `base` are the registers the thread had when frozen.
    /// Returns true if the thread was newly parked: the caller then sets
    /// the injected registers, and only then blocks its signals.
    pub(crate) fn park(&self, tid: i32, base: &UserRegs) -> Result<bool> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = *parked {
            if p.tid == tid {
                return Ok(false);
            }
            put_back(&p)?;
            *parked = None;
        }
        let mask = crate::ptrace::sigmask_of(tid)?;
        let mut regs = *base;
        normalize_interrupted_syscall(&mut regs, true);
        rseq_abort_fixup(tid, &mut regs, &self.mem);
        let d = data(&regs, mask);
        let at = self.block + DATA as u64;
        self.mem
            .write_all_at(&d, at)
            .map_err(|source| KernelError::WriteMem {
                pid: self.pid,
                addr: at,
                len: d.len() as u64,
                source,
            })?;
        *parked = Some(Parked { tid, regs, mask });
        Ok(true)
    }

    /// Puts the parked thread (if it is `tid`) back where it was: its
    /// signal mask, then its registers.
    pub fn unpark(&self, tid: i32) -> Result<()> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = *parked {
            if p.tid == tid {
                *parked = None;
                put_back(&p)?;
            }
        }
        Ok(())
    }

    /// Forgets the parked thread (it was killed).
    pub fn forget(&self) {
        *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Wipes the block (zeros, as the vDSO tail was) once no thread is
    /// parked on it. Best effort: a process that died needs nothing.
    pub fn remove(&self) {
        if self.parked.lock().map(|p| p.is_some()).unwrap_or(true) {
            return;
        }
        let _ = self.mem.write_all_at(&[0u8; BLOCK_LEN], self.block);
    }
}

/// Mask first, then registers: a tracer death in between leaves the
/// thread at the parked position, which restores both again.
fn put_back(p: &Parked) -> Result<()> {
    crate::ptrace::set_sigmask_of(p.tid, p.mask)?;
    crate::ptrace::set_regs_of(p.tid, &p.regs)
}

/// If the thread was stopped inside an rseq critical section, resume it at
/// the section's abort handler, as the kernel does when it resumes a
/// preempted thread (the escape code's final jump is a plain user-space
/// jump, which the kernel does not look at). Best effort: any read error
/// leaves `regs` unchanged.
fn rseq_abort_fixup(tid: i32, regs: &mut UserRegs, mem: &File) {
    let Ok(Some(conf)) = crate::ptrace::rseq_config_of(tid) else {
        return;
    };
    let read = |addr: u64, n: usize| -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        mem.read_exact_at(&mut b, addr).ok()?;
        Some(b)
    };
    // struct rseq { u32 cpu_id_start; u32 cpu_id; u64 rseq_cs; ... }
    let Some(cs_ptr) = read(conf.rseq_abi_pointer + 8, 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
    else {
        return;
    };
    if cs_ptr == 0 {
        return;
    }
    // struct rseq_cs { u32 version; u32 flags; u64 start_ip;
    //                  u64 post_commit_offset; u64 abort_ip; }
    let Some(cs) = read(cs_ptr, 32) else { return };
    let w = |o: usize| u64::from_le_bytes(cs[o..o + 8].try_into().unwrap_or([0; 8]));
    let (start, len, abort) = (w(8), w(16), w(24));
    if regs.rip >= start && regs.rip - start < len {
        regs.rip = abort;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_fits_and_ends_with_the_jump() {
        let c = code();
        assert_eq!(c.len(), DATA);
        assert_eq!(&c[..2], &[0x0f, 0x05]);
        let end = c[..BATCH_OFFSET].iter().rposition(|&b| b != 0xcc).unwrap() + 1;
        // The last instruction is `jmp [rip + disp]` to the rip slot.
        assert_eq!(&c[end - 6..end - 4], &[0xff, 0x25]);
        let disp = i32::from_le_bytes(c[end - 4..end].try_into().unwrap());
        assert_eq!(end as i64 + i64::from(disp), (DATA + RIP * 8) as i64);
    }

    #[test]
    fn batch_code_loops_then_jumps_to_the_syscall() {
        let c = code();
        let b = &c[BATCH_OFFSET..];
        let end = b.iter().rposition(|&x| x != 0xcc).unwrap() + 1;
        // jz done lands on `mov eax, SYS_tgkill`.
        let done = 5 + usize::from(b[4]);
        assert_eq!(&b[done..done + 5], &[0xb8, 234, 0, 0, 0]);
        // The loop's jmp goes back to the top.
        assert_eq!(b[done - 2], 0xeb);
        assert_eq!(i64::from(b[done - 1] as i8) + done as i64, 0);
        // The last instruction jumps to the block's first byte.
        assert_eq!(b[end - 5], 0xe9);
        let disp = i32::from_le_bytes(b[end - 4..end].try_into().unwrap());
        assert_eq!((BATCH_OFFSET + end) as i64 + i64::from(disp), 0);
    }

    #[test]
    fn data_holds_registers_in_code_order() {
        let regs = UserRegs {
            rax: 1,
            r15: 15,
            rsp: 0x7000_0100,
            rip: 0x4000,
            eflags: 0x246,
            ..Default::default()
        };
        let d = data(&regs, 0xdead);
        let slot = |i: usize| u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(slot(MASK), 0xdead);
        assert_eq!(slot(RFLAGS), 0x246);
        assert_eq!(slot(TMP_RSP), 0x7000_0000);
        assert_eq!(slot(3), 1);
        assert_eq!(slot(3 + 14), 15);
        assert_eq!((slot(RSP), slot(RIP)), (0x7000_0100, 0x4000));
    }

    #[test]
    fn block_goes_past_everything_the_elf_uses() {
        let mut img = vec![0u8; 8192];
        img[..4].copy_from_slice(b"\x7fELF");
        img[4] = 2;
        // No program or section headers: only the 64-byte header is used.
        assert_eq!(block_offset(&img), Some((8192 - BLOCK_LEN) & !63));
        // Section headers reaching into the tail: no room.
        img[0x28..0x30].copy_from_slice(&(8000u64).to_le_bytes());
        img[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        img[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(block_offset(&img), None);
        // Not an ELF image.
        assert_eq!(block_offset(&[0u8; 8192]), None);
    }

    /// This machine's vDSO leaves room for a block (else no dump here
    /// would have a hatch, and the kill tests would say so less clearly).
    #[test]
    fn vdso_of_this_process_has_room() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let Some(line) = maps.lines().find(|l| l.ends_with("[vdso]")) else {
            return;
        };
        let (a, b) = line
            .split_whitespace()
            .next()
            .unwrap()
            .split_once('-')
            .unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mem = File::open("/proc/self/mem").unwrap();
        let mut img = vec![0u8; usize::try_from(b - a).unwrap()];
        mem.read_exact_at(&mut img, a).unwrap();
        let off = block_offset(&img).expect("room for an escape block in this vDSO");
        assert!(img[off..].iter().all(|&x| x == 0));
    }
}
