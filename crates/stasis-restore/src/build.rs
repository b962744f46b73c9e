//! Decisions of a restore, expressed as calls on a [`Remote`].
//!
//! Every function here is pure logic over the seam: it is unit-tested with
//! the recording fake in [`crate::remote`].

use stasis_image::manifest::{ITimer, MmImage, PosixTimer, SigAction, ThreadImage, Vma, VmaKind};
use stasis_image::RunEntry;
use stasis_kernel::sarg;
use stasis_sys::{self as sys, PrctlMmMap};

use crate::remote::Remote;
use crate::RestoreError;

/// Scratch layout (offsets into the scratch area).
pub const SCRATCH_PATH: usize = 0;
pub const SCRATCH_STRUCT: usize = 4096;
pub const SCRATCH_IOV: usize = 8192;
/// Most iovecs in one `preadv` (IOV_MAX), bounded by the scratch area.
pub const MAX_IOV: usize = 1024;

pub fn step(what: impl Into<String>) -> impl FnOnce(stasis_kernel::KernelError) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::Step { what, source }
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
            let writable_shared = vma.shared && vma.prot & libc::PROT_WRITE as u32 != 0;
            let mode = if writable_shared {
                libc::O_RDWR
            } else {
                libc::O_RDONLY
            } | libc::O_CLOEXEC;
            let p = r
                .put_cstr(SCRATCH_PATH, path)
                .map_err(step(format!("path {path}")))?;
            let fd = r
                .sys("open", libc::SYS_open, &[p, sarg(i64::from(mode)), 0])
                .map_err(|source| RestoreError::File {
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
        VmaKind::SysvShm { shmid } => {
            let mut flags = 0u64;
            if vma.prot & libc::PROT_WRITE.unsigned_abs() == 0 {
                flags |= u64::from(libc::SHM_RDONLY.unsigned_abs());
            }
            if vma.prot & libc::PROT_EXEC.unsigned_abs() != 0 {
                flags |= u64::from(libc::SHM_EXEC.unsigned_abs());
            }
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
        VmaKind::Ghost { name, offset, .. } => {
            // The caller handed the rebuilt file over as `file_fd`.
            let fd = file_fd.ok_or_else(|| {
                RestoreError::Inconsistent(format!("no file for the mapping of {name}"))
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
    };
    if at != vma.start {
        return Err(RestoreError::Layout(format!(
            "area {:#x}-{:#x} landed at {at:#x}",
            vma.start, vma.end
        )));
    }
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
    Ok(filled)
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
            return Err(RestoreError::Layout(format!(
                "short read of pages at {:#x}: {got} of {bytes} bytes (truncated pack?)",
                first.vaddr
            )));
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

/// The value to arm a saved timer with, or `None` if it was disarmed. A
/// periodic timer read between an expiry and its re-arm shows 0 time left,
/// yet it is armed: it gets the smallest value instead (0 would disarm it).
pub fn armed_value(value: u64, interval: u64) -> Option<u64> {
    (value != 0 || interval != 0).then_some(value.max(1))
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

/// Arms saved interval timers (disarmed ones are left alone).
pub fn restore_itimers<R: Remote>(r: &mut R, timers: &[ITimer]) -> Result<(), RestoreError> {
    for t in timers {
        let Some(value) = armed_value(t.value_us, t.interval_us) else {
            continue;
        };
        let addr = r
            .put(
                SCRATCH_STRUCT,
                &timer_words(t.interval_us, value, 1_000_000),
            )
            .map_err(step("itimerval"))?;
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
            return Err(RestoreError::Incompatible(format!(
                "POSIX timer {} came back as {got}{}",
                t.id,
                if by_id {
                    ""
                } else {
                    " (this kernel cannot choose timer IDs: PR_TIMER_CREATE_RESTORE_IDS needs Linux 6.15)"
                }
            )));
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
        let Some(value) = armed_value(t.value_ns, t.interval_ns) else {
            continue;
        };
        let a = r
            .put(
                SCRATCH_STRUCT,
                &timer_words(t.interval_ns, value, 1_000_000_000),
            )
            .map_err(step("itimerspec"))?;
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
            .map_err(|_| RestoreError::Layout("auxv too large".into()))?,
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
    // seccomp filters, oldest first. The tracer suspends them
    // (PTRACE_O_SUSPEND_SECCOMP) until it detaches, so the remote syscalls
    // still to come are not filtered.
    for (prog, flags) in &th.seccomp {
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
    let name = r
        .put_cstr(SCRATCH_PATH, &th.comm)
        .map_err(step("thread name"))?;
    r.sys("prctl", libc::SYS_prctl, &[libc::PR_SET_NAME as u64, name])
        .map_err(step(format!("naming thread {tid}")))?;
    Ok(())
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
    let got = r
        .sys("clone3", sys::SYS_CLONE3, &[a, bytes.len() as u64])
        .map_err(step(format!("creating {what} {tid}")))?;
    if got != sarg(i64::from(tid)) {
        return Err(RestoreError::Layout(format!(
            "{what} {tid} was created as {got}"
        )));
    }
    Ok(got)
}

/// Little-endian bytes of a list of words.
pub fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{Call, Recorder};

    fn anon(start: u64, end: u64, prot: i32) -> Vma {
        Vma {
            start,
            end,
            prot: prot.unsigned_abs(),
            shared: false,
            growsdown: false,
            name: String::new(),
            kind: VmaKind::Anon,
            shm: None,
        }
    }

    fn run(vaddr: u64, npages: u32, file_off: u64) -> RunEntry {
        RunEntry {
            vaddr,
            npages,
            flags: 0,
            file_off,
            checksum: 0,
        }
    }

    #[test]
    fn gap_avoids_busy_ranges_with_guards() {
        let busy = [
            (0x5555_0000_0000, 0x5555_0001_0000),
            (0x7fff_0000_0000, 0x7fff_ffff_f000),
        ];
        let g = find_gap(&busy, 0x8000).unwrap();
        assert!(
            g + 0x8000 + 4096 <= 0x7fff_0000_0000 && g >= 0x5555_0001_0000,
            "{g:#x}"
        );
        assert_eq!(g % 4096, 0);
        // The vsyscall page lies above the user range: never a gap's end.
        let g = find_gap(
            &[
                (0x7ffd_0000_0000, 0x7ffd_0001_0000),
                (0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000),
            ],
            0x8000,
        )
        .unwrap();
        assert!(g + 0x8000 < 0x7fff_ffff_f000, "{g:#x}");
        // Nothing fits when everything above 4 GiB is taken.
        assert_eq!(find_gap(&[(1 << 32, 0x7fff_ffff_f000)], 4096), None);
    }

    #[test]
    fn readonly_area_with_data_is_mapped_writable_filled_then_protected() {
        let mut r = Recorder::default();
        let v = anon(0x10000, 0x14000, libc::PROT_READ);
        let n = map_vma(
            &mut r,
            &v,
            &[(
                &[run(0x10000, 2, 4096), run(0x13000, 1, 4096 + 8192)][..],
                7,
            )],
            None,
        )
        .unwrap();
        assert_eq!(n, 3 * 4096);
        // Small runs are not pre-populated.
        assert_eq!(r.names(), vec!["mmap", "preadv", "mprotect"]);
        let mmap = &r.args_of("mmap")[0];
        assert_eq!(mmap[2], (libc::PROT_READ | libc::PROT_WRITE) as u64);
        assert_eq!(
            mmap[3],
            (libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64
        );
        // One preadv for both file-contiguous runs, at the first run's offset.
        let p = &r.args_of("preadv")[0];
        assert_eq!((p[0], p[2], p[3]), (7, 2, 4096));
        assert_eq!(
            r.args_of("mprotect")[0],
            vec![0x10000, 0x4000, libc::PROT_READ as u64]
        );
    }

    #[test]
    fn pages_of_a_chain_are_read_from_each_pack() {
        // An incremental checkpoint: page 1 from its own pack (fd 7), pages
        // 0 and 2 from its parent's (fd 8).
        let mut r = Recorder::default();
        let v = anon(0x10000, 0x13000, libc::PROT_READ | libc::PROT_WRITE);
        let own = [run(0x11000, 1, 4096)];
        let parent = [run(0x10000, 1, 4096), run(0x12000, 1, 3 * 4096)];
        let n = map_vma(&mut r, &v, &[(&own[..], 7), (&parent[..], 8)], None).unwrap();
        assert_eq!(n, 3 * 4096);
        let p = r.args_of("preadv");
        // One read from the child's pack; two from the parent's, whose runs
        // are not file-contiguous.
        assert_eq!(
            p.iter().map(|a| (a[0], a[2], a[3])).collect::<Vec<_>>(),
            vec![(7, 1, 4096), (8, 1, 4096), (8, 1, 3 * 4096)]
        );
    }

    #[test]
    fn empty_area_is_mapped_with_final_protection_and_not_filled() {
        let mut r = Recorder::default();
        map_vma(&mut r, &anon(0x10000, 0x12000, libc::PROT_NONE), &[], None).unwrap();
        assert_eq!(r.names(), vec!["mmap"]);
        assert_eq!(r.args_of("mmap")[0][2], 0);
    }

    #[test]
    fn runs_are_clipped_to_areas() {
        let all = [run(0x10000, 4, 4096), run(0x20000, 2, 5 * 4096)];
        assert_eq!(
            clip_runs(&all, 0x12000, 0x21000),
            vec![run(0x12000, 2, 3 * 4096), run(0x20000, 1, 5 * 4096)]
        );
        assert_eq!(clip_runs(&all, 0x14000, 0x20000), vec![]);
        assert_eq!(clip_runs(&all, 0x0, 0x100000), all.to_vec());
    }

    #[test]
    fn large_contiguous_stretches_are_populated_first() {
        let mut r = Recorder::default();
        fill(
            &mut r,
            &[
                run(0x100000, 8, 4096),
                run(0x108000, 8, 9 * 4096),
                run(0x200000, 2, 17 * 4096),
            ],
            3,
        )
        .unwrap();
        assert_eq!(r.names(), vec!["madvise", "preadv"]);
        assert_eq!(r.args_of("madvise")[0], vec![0x100000, 16 * 4096, 23]);
    }

    #[test]
    fn file_contiguity_breaks_preadv_batches() {
        let mut r = Recorder::default();
        fill(
            &mut r,
            &[run(0x10000, 1, 4096), run(0x20000, 1, 3 * 4096)],
            3,
        )
        .unwrap();
        assert_eq!(r.names(), vec!["preadv", "preadv"]);
    }

    #[test]
    fn private_file_mapping_opens_maps_and_closes() {
        let mut r = Recorder::default();
        let v = Vma {
            kind: VmaKind::File {
                path: "/lib/x.so".into(),
                offset: 0x2000,
                dev: 0,
                ino: 0,
            },
            ..anon(0x10000, 0x12000, libc::PROT_READ | libc::PROT_EXEC)
        };
        map_vma(&mut r, &v, &[], None).unwrap();
        assert_eq!(r.names(), vec!["open", "mmap", "close"]);
        assert_eq!(r.args_of("mmap")[0][4..], [100, 0x2000]);
        assert!(r
            .calls
            .iter()
            .any(|c| matches!(c, Call::Write { data, .. } if data == b"/lib/x.so\0")));
    }

    #[test]
    fn failing_open_names_the_file() {
        let mut r = Recorder {
            fail_on: Some(("open", libc::ENOENT)),
            ..Default::default()
        };
        let v = Vma {
            kind: VmaKind::File {
                path: "/gone".into(),
                offset: 0,
                dev: 0,
                ino: 0,
            },
            ..anon(0x10000, 0x12000, libc::PROT_READ)
        };
        let e = map_vma(&mut r, &v, &[], None).unwrap_err().to_string();
        assert!(e.contains("/gone"), "{e}");
    }

    #[test]
    fn only_armed_timers_are_set() {
        let mut r = Recorder::default();
        restore_itimers(
            &mut r,
            &[
                ITimer {
                    which: 0,
                    interval_us: 10_000,
                    value_us: 2_500_000,
                },
                ITimer {
                    which: 1,
                    interval_us: 0,
                    value_us: 0,
                },
            ],
        )
        .unwrap();
        assert_eq!(r.names(), vec!["setitimer"]);
        let w = r.writes()[0].clone();
        assert_eq!(w, words(&[0, 10_000, 2, 500_000]));
    }

    #[test]
    fn thread_state_sets_everything_in_order() {
        let mut r = Recorder::default();
        let th = ThreadImage {
            tid: 42,
            regs: vec![0; 27],
            xstate: vec![],
            sigmask: 0,
            pending: vec![],
            altstack: stasis_image::manifest::AltStack {
                sp: 0x7000,
                flags: libc::SS_ONSTACK,
                size: 8192,
            },
            comm: "worker".into(),
            rseq: Some(stasis_image::manifest::RseqConfig {
                ptr: 0x9000,
                size: 32,
                signature: 0x53053053,
            }),
            seccomp: vec![(vec![6, 0, 0, 0, 0, 0, 0xff, 0x7f], 2)],
            clear_child_tid: 0x5000,
            robust_list: 0x6000,
            robust_list_len: 24,
        };
        thread_state(&mut r, &th).unwrap();
        assert_eq!(
            r.names(),
            vec![
                "sigaltstack",
                "rseq",
                "set_robust_list",
                "set_tid_address",
                "seccomp",
                "prctl"
            ]
        );
        assert_eq!(r.args_of("rseq")[0], vec![0x9000, 32, 0, 0x53053053]);
        assert_eq!(r.args_of("set_robust_list")[0], vec![0x6000, 24]);
        assert_eq!(r.args_of("set_tid_address")[0], vec![0x5000]);
        // One instruction, flags passed through, sock_fprog in scratch.
        let sc = &r.args_of("seccomp")[0];
        assert_eq!((sc[0], sc[1]), (1, 2));
        // SS_ONSTACK is a state, not a flag one can set.
        let w = r.writes();
        assert_eq!(w[0], words(&[0x7000, 0, 8192]));
    }

    #[test]
    fn clone_thread_passes_set_tid() {
        let mut r = Recorder::default();
        // The recorder answers 0, not the TID: a mismatch is an error.
        assert!(clone_thread(&mut r, 77).is_err());
        let w = r.writes();
        assert_eq!(w[0], 77i32.to_le_bytes());
        assert_eq!(
            u64::from_le_bytes(w[1][0..8].try_into().unwrap()),
            THREAD_CLONE_FLAGS
        );
        assert_eq!(u64::from_le_bytes(w[1][72..80].try_into().unwrap()), 1);
        assert_eq!(r.args_of("clone3")[0][1], 88);
    }

    #[test]
    fn periodic_posix_timers_caught_at_expiry_stay_armed() {
        let mut r = Recorder::default();
        let t = |id, value_ns, interval_ns| PosixTimer {
            id,
            clockid: 1,
            notify: 0,
            signo: 10,
            tid: 0,
            value: 0,
            value_ns,
            interval_ns,
        };
        arm_posix_timers(&mut r, &[t(1, 0, 10_000_000), t(2, 0, 0), t(3, 5, 0)]).unwrap();
        let armed: Vec<u64> = r.args_of("timer_settime").iter().map(|a| a[0]).collect();
        assert_eq!(armed, vec![1, 3]);
        let w = r.writes();
        assert_eq!(w[0], words(&[0, 10_000_000, 0, 1]));
    }

    #[test]
    fn mm_map_struct_layout() {
        let mut r = Recorder::default();
        let mm = MmImage {
            start_code: 1,
            end_code: 2,
            brk: 6,
            auxv: vec![33, 44],
            ..Default::default()
        };
        restore_mm(&mut r, &mm, 5).unwrap();
        let p = &r.args_of("prctl")[0];
        assert_eq!((p[0], p[1], p[3]), (35, 14, 104));
        let data = r.writes();
        assert_eq!(data[0], words(&[33, 44]));
        let s = &data[1];
        assert_eq!(s.len(), 104);
        assert_eq!(u64::from_le_bytes(s[40..48].try_into().unwrap()), 6);
        assert_eq!(u32::from_le_bytes(s[96..100].try_into().unwrap()), 16);
        assert_eq!(u32::from_le_bytes(s[100..104].try_into().unwrap()), 5);
    }
}
