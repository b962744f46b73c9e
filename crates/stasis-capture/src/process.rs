//! The state of one frozen process: threads, signal state, /proc facts.

use stasis_image::manifest::{
    AltStack, ITimer, PosixTimer, ProcessImage, RseqConfig, SigAction, SigInfo, ThreadImage,
};
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::ptrace::normalize_interrupted_syscall;
use stasis_kernel::KernelError;
use stasis_sys as sys;

use crate::freeze::FrozenProcess;
use crate::{memory, proc, CaptureError, Result};

struct RemoteState {
    sigactions: Vec<SigAction>,
    posix_timers: Vec<PosixTimer>,
    pdeath_signal: i32,
    child_subreaper: bool,
    itimers: Vec<ITimer>,
    brk: u64,
    /// Per thread, in `FrozenProcess::threads` order: altstack and clear_child_tid.
    threads: Vec<(AltStack, u64)>,
}

const PR_GET_TID_ADDRESS: u64 = 40;

/// Runs the remote syscalls that read state only the process can report:
/// process-wide ones in the main thread, per-thread ones in each thread.
fn remote_state(
    f: &mut FrozenProcess,
    mem: &ProcessMemory,
    maps: &[proc::MapsEntry],
) -> Result<RemoteState> {
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let mut flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let main_base = f.threads[0].orig_regs;
    let f_pid = f.pid;
    // With an escape hatch, the scratch page goes at an address recorded
    // in the hatch first, so that a dumper killed at any point leaves no
    // page behind (the escaping thread unmaps it).
    let hatch = f.threads[0].tracee.hatch().cloned();
    let mut at = 0;
    if let (Some(h), Some(free)) = (&hatch, free_page(maps)) {
        h.set_scratch(free, 4096)?;
        at = free;
        flags |= libc::MAP_FIXED_NOREPLACE as u64;
    }
    let mapped = f.threads[0].tracee.syscall(
        &main_base,
        "mmap",
        libc::SYS_mmap,
        &[at, 4096, rw, flags, u64::MAX, 0],
    );
    let scratch = match mapped {
        Ok(a) => a,
        Err(e) => {
            if let Some(h) = &hatch {
                let _ = h.set_scratch(0, 0);
            }
            return Err(e.into());
        }
    };
    let res = (|| -> Result<RemoteState> {
        let main = &mut f.threads[0];
        let (t, base) = (&mut main.tracee, &main.orig_regs);
        // A remote syscall costs two ptrace stops (~0.1 ms): only the
        // signals that are caught or ignored (`SigCgt`, `SigIgn`), and
        // SIGCHLD (whose flags matter even at SIG_DFL), are asked; the rest
        // are at SIG_DFL, and saved so.
        let status = crate::proc::read(f_pid, "status")?;
        let mask_of = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        };
        let asked = match (mask_of("SigCgt:"), mask_of("SigIgn:")) {
            (Some(c), Some(i)) => c | i | (1u64 << (libc::SIGCHLD - 1)),
            _ => u64::MAX,
        };
        let mut sigactions = Vec::new();
        for sig in 1..=64u32 {
            if sig == libc::SIGKILL.unsigned_abs() || sig == libc::SIGSTOP.unsigned_abs() {
                continue;
            }
            if asked & (1u64 << (sig - 1)) == 0 {
                sigactions.push(SigAction {
                    signo: sig,
                    handler: 0,
                    flags: 0,
                    restorer: 0,
                    mask: 0,
                });
                continue;
            }
            t.syscall(
                base,
                "rt_sigaction",
                libc::SYS_rt_sigaction,
                &[u64::from(sig), 0, scratch, 8],
            )?;
            let w = mem.read_u64s(scratch, 4)?;
            sigactions.push(SigAction {
                signo: sig,
                handler: w[0],
                flags: w[1],
                restorer: w[2],
                mask: w[3],
            });
        }
        let mut itimers = Vec::new();
        for which in 0..3u32 {
            t.syscall(
                base,
                "getitimer",
                libc::SYS_getitimer,
                &[u64::from(which), scratch],
            )?;
            let w = mem.read_u64s(scratch, 4)?;
            itimers.push(ITimer {
                which,
                interval_us: w[0] * 1_000_000 + w[1],
                value_us: w[2] * 1_000_000 + w[3],
            });
        }
        let brk = t.syscall(base, "brk", libc::SYS_brk, &[0])?;
        t.syscall(
            base,
            "prctl(PR_GET_PDEATHSIG)",
            libc::SYS_prctl,
            &[libc::PR_GET_PDEATHSIG as u64, scratch],
        )?;
        let pdeath_signal = i32::try_from(mem.read_u64s(scratch, 1)?[0] & 0xffff_ffff).unwrap_or(0);
        t.syscall(
            base,
            "prctl(PR_GET_CHILD_SUBREAPER)",
            libc::SYS_prctl,
            &[libc::PR_GET_CHILD_SUBREAPER as u64, scratch],
        )?;
        let child_subreaper = mem.read_u64s(scratch, 1)?[0] & 0xffff_ffff != 0;
        let mut posix_timers = Vec::new();
        let pid = t.pid();
        let text = proc::read(pid, "timers")?;
        for (id, signo, value, notify, tid, clockid) in
            proc::parse_timers(&text).map_err(fmt_err(pid, "timers"))?
        {
            t.syscall(
                base,
                "timer_gettime",
                libc::SYS_timer_gettime,
                &[u64::from(id.unsigned_abs()), scratch],
            )?;
            let w = mem.read_u64s(scratch, 4)?;
            posix_timers.push(PosixTimer {
                id,
                clockid,
                notify,
                signo,
                tid,
                value,
                interval_ns: w[0] * 1_000_000_000 + w[1],
                value_ns: w[2] * 1_000_000_000 + w[3],
            });
        }
        let mut threads = Vec::new();
        for th in &mut f.threads {
            let (t, base) = (&mut th.tracee, &th.orig_regs);
            t.syscall(base, "sigaltstack", libc::SYS_sigaltstack, &[0, scratch])?;
            let w = mem.read_u64s(scratch, 3)?;
            let altstack = AltStack {
                sp: w[0],
                flags: i32::try_from(w[1] & 0x7fff_ffff).unwrap_or(0),
                size: w[2],
            };
            t.syscall(
                base,
                "prctl(PR_GET_TID_ADDRESS)",
                libc::SYS_prctl,
                &[PR_GET_TID_ADDRESS, scratch],
            )?;
            let tid_address = mem.read_u64s(scratch, 1)?[0];
            threads.push((altstack, tid_address));
        }
        Ok(RemoteState {
            sigactions,
            posix_timers,
            pdeath_signal,
            child_subreaper,
            itimers,
            brk,
            threads,
        })
    })();
    // Still recorded while it is unmapped, and forgotten only then: a
    // dumper killed in between makes the escaping thread unmap it again,
    // which is harmless (the page sits at the bottom of the largest free gap, where no
    // allocation of the process lands); forgetting it first left the page
    // behind when the dumper was killed just before the unmap (seen once in
    // 150 kills of concurrent dumps).
    let unmap = {
        let t = &mut f.threads[0].tracee;
        let args = [scratch, 4096];
        // Tried twice: a page left here would stay in the process.
        t.syscall(&main_base, "munmap", libc::SYS_munmap, &args)
            .or_else(|_| t.syscall(&main_base, "munmap", libc::SYS_munmap, &args))
            .map_err(CaptureError::from)
            .and_then(|_| {
                hatch
                    .as_ref()
                    .map_or(Ok(()), |h| h.set_scratch(0, 0))
                    .map_err(CaptureError::from)
            })
    };
    let st = res?;
    unmap?;
    Ok(st)
}

/// A free page of the address space with a free page on each side (so the
/// scratch page merges with no neighbour), in the largest gap below the
/// highest mapping; `None` if there is none.
fn free_page(maps: &[proc::MapsEntry]) -> Option<u64> {
    const MIN: u64 = 0x1_0000; // vm.mmap_min_addr's default
    let mut spans: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.start < 0x8000_0000_0000)
        .map(|m| (m.start, m.end))
        .collect();
    spans.sort_unstable();
    let mut prev_end = MIN;
    let mut best: Option<(u64, u64)> = None;
    for (start, end) in spans {
        if start > prev_end && start - prev_end >= 3 * 4096 {
            let gap = start - prev_end;
            let larger = match best {
                Some((_, g)) => gap > g,
                None => true,
            };
            if larger {
                best = Some((prev_end + 4096, gap));
            }
        }
        prev_end = prev_end.max(end);
    }
    best.map(|(a, _)| a)
}

/// `get_robust_list` of another thread (head, length).
fn robust_list(tid: i32) -> Result<(u64, u64)> {
    let mut head = 0u64;
    let mut len = 0usize;
    // SAFETY: get_robust_list writes a pointer and a size to the two valid
    // out-pointers we pass.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            tid,
            &mut head as *mut u64,
            &mut len as *mut usize,
        )
    };
    if r < 0 {
        return Err(KernelError::Io {
            what: format!("get_robust_list({tid})"),
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    Ok((head, len as u64))
}

fn siginfo(raw: &[u8; sys::SIGINFO_SIZE]) -> SigInfo {
    let signo = u32::from_le_bytes(raw[0..4].try_into().unwrap_or([0; 4]));
    SigInfo {
        signo,
        raw: raw.to_vec(),
    }
}

fn fmt_err(pid: i32, file: &str) -> impl FnOnce(String) -> CaptureError + '_ {
    move |w| CaptureError::ProcFormat {
        pid,
        file: file.into(),
        what: w,
    }
}

/// The image of a zombie: identity and exit status only.
pub fn zombie_image(pid: i32, status: i32) -> Result<ProcessImage> {
    let stat = proc::parse_stat(&proc::read(pid, "stat")?).map_err(fmt_err(pid, "stat"))?;
    Ok(ProcessImage {
        pid,
        ppid: stat.ppid,
        pgid: stat.pgrp,
        sid: stat.session,
        comm: stat.comm,
        exe: String::new(),
        cwd: String::new(),
        umask: 0,
        personality: 0,
        creds: Default::default(),
        rlimits: Vec::new(),
        mm: Default::default(),
        vmas: Vec::new(),
        fds: Vec::new(),
        sigactions: Vec::new(),
        shared_pending: Vec::new(),
        itimers: Vec::new(),
        threads: Vec::new(),
        pack: None,
        zombie: Some(status),
        posix_timers: Vec::new(),
        no_new_privs: false,
        pdeath_signal: 0,
        child_subreaper: false,
        start_time: stat.start_time,
        data_ranges: None,
    })
}

/// Everything of a live frozen process except its fds and page pack, plus
/// the parsed maps (for the memory plan) and its XCR0.
pub fn capture(
    f: &mut FrozenProcess,
    mem: &ProcessMemory,
) -> Result<(ProcessImage, Vec<proc::MapsEntry>, u64)> {
    let pid = f.pid;
    let maps = proc::parse_maps(&proc::read(pid, "maps")?).map_err(fmt_err(pid, "maps"))?;
    for m in &maps {
        memory::vma_kind(m).map_err(|what| CaptureError::Unsupported { pid, what })?;
    }
    f.arm_remote(mem, &maps)?;
    let remote = remote_state(f, mem, &maps)?;
    let shared_pending = f.threads[0].tracee.pending_siginfo(true)?;
    let mut threads = Vec::new();
    let mut xfeatures = 0;
    for (t, (altstack, clear_child_tid)) in f.threads.iter().zip(&remote.threads) {
        let tid = t.tracee.pid();
        let mut regs = t.orig_regs;
        normalize_interrupted_syscall(&mut regs, false);
        let xstate = t.tracee.xstate()?;
        xfeatures = stasis_kernel::probe::xfeatures_of(&xstate);
        let (robust_list, robust_list_len) = robust_list(tid)?;
        threads.push(ThreadImage {
            tid,
            regs: regs.to_words().to_vec(),
            xstate,
            sigmask: t.orig_mask,
            pending: t
                .tracee
                .pending_siginfo(false)?
                .iter()
                .map(siginfo)
                .collect(),
            altstack: altstack.clone(),
            comm: proc::read(pid, &format!("task/{tid}/comm"))?
                .trim_end_matches('\n')
                .to_string(),
            rseq: t.tracee.rseq_config()?.map(|c| RseqConfig {
                ptr: c.rseq_abi_pointer,
                size: c.rseq_abi_size,
                signature: c.signature,
            }),
            seccomp: {
                let mut f = t.tracee.seccomp_filters()?;
                f.reverse();
                f
            },
            clear_child_tid: *clear_child_tid,
            robust_list,
            robust_list_len,
        });
    }
    let stat = proc::parse_stat(&proc::read(pid, "stat")?).map_err(fmt_err(pid, "stat"))?;
    let status = proc::read(pid, "status")?;
    let no_new_privs = status
        .lines()
        .any(|l| l.starts_with("NoNewPrivs:") && l.trim_end().ends_with('1'));
    if status
        .lines()
        .any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('1'))
    {
        return Err(CaptureError::Unsupported {
            pid,
            what: "it runs in seccomp strict mode, which stasis cannot checkpoint".into(),
        });
    }
    let (umask, creds) = proc::parse_status(&status).map_err(fmt_err(pid, "status"))?;
    let rlimits =
        proc::parse_limits(&proc::read(pid, "limits")?).map_err(fmt_err(pid, "limits"))?;
    let personality =
        u32::from_str_radix(proc::read(pid, "personality")?.trim(), 16).map_err(|_| {
            CaptureError::ProcFormat {
                pid,
                file: "personality".into(),
                what: "not a hex number".into(),
            }
        })?;
    let auxv_bytes = proc::read_bytes(pid, "auxv")?;
    let mut mm = stat.mm.clone();
    mm.brk = remote.brk;
    mm.auxv = auxv_bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let image = ProcessImage {
        pid,
        ppid: stat.ppid,
        pgid: stat.pgrp,
        sid: stat.session,
        comm: proc::read(pid, "comm")?.trim_end_matches('\n').to_string(),
        exe: proc::read_link(pid, "exe")?,
        cwd: proc::read_link(pid, "cwd")?,
        umask,
        personality,
        creds,
        rlimits,
        mm,
        vmas: Vec::new(),
        fds: Vec::new(),
        sigactions: remote.sigactions,
        shared_pending: shared_pending.iter().map(siginfo).collect(),
        itimers: remote.itimers,
        threads,
        pack: None,
        zombie: None,
        posix_timers: remote.posix_timers,
        no_new_privs,
        pdeath_signal: remote.pdeath_signal,
        child_subreaper: remote.child_subreaper,
        start_time: stat.start_time,
        data_ranges: None,
    };
    Ok((image, maps, xfeatures))
}
