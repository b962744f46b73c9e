//! State only the process itself can report, read by remote syscalls in a
//! scratch page: signal actions, interval and POSIX timers, `brk`, the
//! parent-death signal, the subreaper and dumpable flags, and per thread the alternate
//! signal stack and `clear_child_tid`.
//!
//! The scratch page is the one mapping a dump adds to a process. With an
//! escape hatch it is recorded in the hatch *before* it is mapped (at a
//! free address, `MAP_FIXED_NOREPLACE`) and forgotten only *after* it is
//! unmapped, so a dumper killed at any instant leaves no page behind (the
//! escaping thread unmaps it).

use stasis_image::manifest::{AltStack, ITimer, PosixTimer, SigAction};
use stasis_kernel::escape::EscapeHatch;
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::remote::Remote;
use stasis_sys as sys;

use crate::freeze::{FrozenProcess, FrozenThread};
use crate::remote::{read_u64s, ThreadRemote, SCRATCH_LEN};
use crate::{proc, CaptureError, Result};

/// What the remote syscalls reported.
pub struct RemoteState {
    pub sigactions: Vec<SigAction>,
    pub posix_timers: Vec<PosixTimer>,
    pub pdeath_signal: i32,
    pub child_subreaper: bool,
    /// `PR_GET_DUMPABLE`.
    pub dumpable: u32,
    /// `PR_GET_SECUREBITS`.
    pub securebits: u32,
    pub itimers: Vec<ITimer>,
    pub brk: u64,
    /// Per thread, in `FrozenProcess::threads` order: altstack and clear_child_tid.
    pub threads: Vec<(AltStack, u64)>,
}

/// Maps the scratch page, runs the remote syscalls (process-wide ones in
/// the main thread, per-thread ones in each thread), and unmaps it.
pub fn read(
    f: &mut FrozenProcess,
    mem: &ProcessMemory,
    maps: &[proc::MapsEntry],
) -> Result<RemoteState> {
    let hatch = f.threads[0].tracee.hatch().cloned();
    let scratch = map_scratch(&mut f.threads[0], hatch.as_deref(), maps)?;
    let res = read_with(f, mem, scratch);
    let unmap = unmap_scratch(&mut f.threads[0], hatch.as_deref(), scratch);
    let st = res?;
    unmap?;
    Ok(st)
}

fn map_scratch(
    main: &mut FrozenThread,
    hatch: Option<&EscapeHatch>,
    maps: &[proc::MapsEntry],
) -> Result<u64> {
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let mut flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let len = SCRATCH_LEN as u64;
    // With an escape hatch, the scratch page goes at an address recorded
    // in the hatch first, so that a dumper killed at any point leaves no
    // page behind (the escaping thread unmaps it).
    let mut at = 0;
    if let (Some(h), Some(free)) = (hatch, free_page(maps)) {
        h.set_scratch(free, len)?;
        at = free;
        flags |= libc::MAP_FIXED_NOREPLACE as u64;
    }
    let mapped = main.tracee.syscall(
        &main.orig_regs,
        "mmap",
        libc::SYS_mmap,
        &[at, len, rw, flags, u64::MAX, 0],
    );
    mapped.map_err(|e| {
        if let Some(h) = hatch {
            let _ = h.set_scratch(0, 0);
        }
        e.into()
    })
}

/// Still recorded while it is unmapped, and forgotten only then: a
/// dumper killed in between makes the escaping thread unmap it again,
/// which is harmless (the page sits at the bottom of the largest free gap,
/// where no allocation of the process lands); forgetting it first left the
/// page behind when the dumper was killed just before the unmap (seen once
/// in 150 kills of concurrent dumps).
fn unmap_scratch(main: &mut FrozenThread, hatch: Option<&EscapeHatch>, scratch: u64) -> Result<()> {
    let t = &mut main.tracee;
    let base = &main.orig_regs;
    let args = [scratch, SCRATCH_LEN as u64];
    // Tried twice: a page left here would stay in the process.
    t.syscall(base, "munmap", libc::SYS_munmap, &args)
        .or_else(|_| t.syscall(base, "munmap", libc::SYS_munmap, &args))
        .map_err(CaptureError::from)
        .and_then(|_| {
            hatch
                .map_or(Ok(()), |h| h.set_scratch(0, 0))
                .map_err(CaptureError::from)
        })?;
    Ok(())
}

fn read_with(f: &mut FrozenProcess, mem: &ProcessMemory, scratch: u64) -> Result<RemoteState> {
    let pid = f.pid;
    let status = proc::read(pid, "status")?;
    let mut r = ThreadRemote::with_memory(&mut f.threads[0], mem, scratch);
    let sigactions = sigactions(&mut r, asked_signals(&status))?;
    let itimers = itimers(&mut r)?;
    let brk = r.sys("brk", libc::SYS_brk, &[0])?;
    let (pdeath_signal, child_subreaper, dumpable) = prctls(&mut r)?;
    let securebits = r.sys(
        "prctl(PR_GET_SECUREBITS)",
        libc::SYS_prctl,
        &[libc::PR_GET_SECUREBITS as u64],
    )?;
    let timers = proc::read_parsed(pid, "timers", proc::parse_timers)?;
    let posix_timers = posix_timers(&mut r, &timers)?;
    let mut threads = Vec::new();
    for th in &mut f.threads {
        threads.push(thread_state(&mut ThreadRemote::with_memory(
            th, mem, scratch,
        ))?);
    }
    Ok(RemoteState {
        sigactions,
        posix_timers,
        pdeath_signal,
        child_subreaper,
        dumpable,
        securebits: u32::try_from(securebits).unwrap_or(0),
        itimers,
        brk,
        threads,
    })
}

/// The signals whose action is asked of the process: a remote syscall
/// costs two ptrace stops (~0.1 ms), so only those caught or ignored
/// (`SigCgt`, `SigIgn` of `status`) and SIGCHLD (whose flags matter even at
/// SIG_DFL); the rest are at SIG_DFL, and saved so. All if `status` lacks
/// the masks.
pub fn asked_signals(status: &str) -> u64 {
    let mask_of = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    match (mask_of("SigCgt:"), mask_of("SigIgn:")) {
        (Some(c), Some(i)) => c | i | (1u64 << (libc::SIGCHLD - 1)),
        _ => u64::MAX,
    }
}

/// The action of every signal but SIGKILL and SIGSTOP (those in `asked`
/// by `rt_sigaction`, the others SIG_DFL).
pub fn sigactions(r: &mut dyn Remote, asked: u64) -> Result<Vec<SigAction>> {
    let scratch = r.scratch();
    let mut out = Vec::new();
    for sig in 1..=64u32 {
        if sig == libc::SIGKILL.unsigned_abs() || sig == libc::SIGSTOP.unsigned_abs() {
            continue;
        }
        if asked & (1u64 << (sig - 1)) == 0 {
            out.push(SigAction {
                signo: sig,
                handler: 0,
                flags: 0,
                restorer: 0,
                mask: 0,
            });
            continue;
        }
        r.sys(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            &[u64::from(sig), 0, scratch, 8],
        )?;
        let w = read_u64s(r, scratch, 4)?;
        out.push(SigAction {
            signo: sig,
            handler: w[0],
            flags: w[1],
            restorer: w[2],
            mask: w[3],
        });
    }
    Ok(out)
}

/// `getitimer` of the three interval timers.
fn itimers(r: &mut dyn Remote) -> Result<Vec<ITimer>> {
    let scratch = r.scratch();
    let mut out = Vec::new();
    for which in 0..3u32 {
        let args = [u64::from(which), scratch];
        let (interval_us, value_us) =
            interval_and_value(r, ("getitimer", libc::SYS_getitimer), &args, 1_000_000)?;
        out.push(ITimer {
            which,
            interval_us,
            value_us,
        });
    }
    Ok(out)
}

/// Runs a syscall that writes an interval and a value (two pairs of
/// seconds and sub-seconds, `per_sec` of them a second) to the scratch
/// page; returns both in sub-second units.
fn interval_and_value(
    r: &mut dyn Remote,
    (name, nr): (&'static str, i64),
    args: &[u64],
    per_sec: u64,
) -> Result<(u64, u64)> {
    r.sys(name, nr, args)?;
    let scratch = r.scratch();
    let w = read_u64s(r, scratch, 4)?;
    Ok((w[0] * per_sec + w[1], w[2] * per_sec + w[3]))
}

/// The parent-death signal, the child-subreaper flag and the dumpable flag.
fn prctls(r: &mut dyn Remote) -> Result<(i32, bool, u32)> {
    let scratch = r.scratch();
    r.sys(
        "prctl(PR_GET_PDEATHSIG)",
        libc::SYS_prctl,
        &[libc::PR_GET_PDEATHSIG as u64, scratch],
    )?;
    let pdeath_signal = i32::try_from(read_u64s(r, scratch, 1)?[0] & 0xffff_ffff).unwrap_or(0);
    r.sys(
        "prctl(PR_GET_CHILD_SUBREAPER)",
        libc::SYS_prctl,
        &[libc::PR_GET_CHILD_SUBREAPER as u64, scratch],
    )?;
    let child_subreaper = read_u64s(r, scratch, 1)?[0] & 0xffff_ffff != 0;
    let dumpable = r.sys(
        "prctl(PR_GET_DUMPABLE)",
        libc::SYS_prctl,
        &[libc::PR_GET_DUMPABLE as u64],
    )?;
    Ok((
        pdeath_signal,
        child_subreaper,
        u32::try_from(dumpable).unwrap_or(1),
    ))
}

/// `timer_gettime` of every POSIX timer `/proc/PID/timers` lists.
fn posix_timers(r: &mut dyn Remote, timers: &[proc::TimerLine]) -> Result<Vec<PosixTimer>> {
    let scratch = r.scratch();
    let mut out = Vec::new();
    for &(id, signo, value, notify, tid, clockid) in timers {
        let args = [u64::from(id.unsigned_abs()), scratch];
        let (interval_ns, value_ns) = interval_and_value(
            r,
            ("timer_gettime", libc::SYS_timer_gettime),
            &args,
            1_000_000_000,
        )?;
        out.push(PosixTimer {
            id,
            clockid,
            notify,
            signo,
            tid,
            value,
            interval_ns,
            value_ns,
        });
    }
    Ok(out)
}

/// One thread's alternate signal stack and `clear_child_tid`.
fn thread_state(r: &mut dyn Remote) -> Result<(AltStack, u64)> {
    let scratch = r.scratch();
    r.sys("sigaltstack", libc::SYS_sigaltstack, &[0, scratch])?;
    let w = read_u64s(r, scratch, 3)?;
    let altstack = AltStack {
        sp: w[0],
        flags: i32::try_from(w[1] & 0x7fff_ffff).unwrap_or(0),
        size: w[2],
    };
    r.sys(
        "prctl(PR_GET_TID_ADDRESS)",
        libc::SYS_prctl,
        &[
            sys::prctl::PR_GET_TID_ADDRESS.unsigned_abs().into(),
            scratch,
        ],
    )?;
    let tid_address = read_u64s(r, scratch, 1)?[0];
    Ok((altstack, tid_address))
}

/// A free page of the address space with a free page on each side (so the
/// scratch page merges with no neighbour), in the largest gap below the
/// highest mapping; `None` if there is none.
pub fn free_page(maps: &[proc::MapsEntry]) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_kernel::remote::Recorder;

    #[test]
    fn only_caught_ignored_signals_and_sigchld_are_asked() {
        let asked =
            asked_signals("Name:\tx\nSigIgn:\t0000000000000001\nSigCgt:\t0000000000000200\n");
        // SIGHUP ignored, SIGUSR1 (10) caught, SIGCHLD always.
        assert_eq!(asked, 1 | (1 << 9) | (1 << 16));
        assert_eq!(asked_signals("Name:\tx\n"), u64::MAX);
        let mut r = Recorder::default();
        let acts = sigactions(&mut r, asked).unwrap();
        assert_eq!(acts.len(), 62, "every signal but SIGKILL and SIGSTOP");
        let scratch = r.scratch();
        assert_eq!(
            r.args_of("rt_sigaction"),
            vec![
                vec![1, 0, scratch, 8],
                vec![10, 0, scratch, 8],
                vec![17, 0, scratch, 8]
            ]
        );
        let mut r = Recorder::default();
        sigactions(&mut r, u64::MAX).unwrap();
        assert_eq!(r.args_of("rt_sigaction").len(), 62);
    }

    #[test]
    fn a_failed_remote_syscall_stops_the_reading() {
        let mut r = Recorder {
            fail_on: Some(("getitimer", libc::EFAULT)),
            ..Default::default()
        };
        assert!(itimers(&mut r).is_err());
        assert_eq!(r.names(), vec!["getitimer"]);
        let mut r = Recorder::default();
        let (alt, tid_addr) = thread_state(&mut r).unwrap();
        assert_eq!((alt.sp, tid_addr), (0, 0));
        assert_eq!(r.names(), vec!["sigaltstack", "prctl(PR_GET_TID_ADDRESS)"]);
        assert_eq!(r.args_of("prctl(PR_GET_TID_ADDRESS)")[0][0], 40);
    }

    fn area(start: u64, end: u64) -> proc::MapsEntry {
        proc::parse_maps(&format!("{start:x}-{end:x} rw-p 00000000 00:00 0\n"))
            .unwrap()
            .remove(0)
    }

    #[test]
    fn scratch_page_goes_in_the_largest_gap_away_from_neighbours() {
        let maps = [
            area(0x40_0000, 0x50_0000),
            area(0x60_0000, 0x61_0000),
            area(0x7000_0000, 0x7000_1000),
            area(0x7000_3000, 0x7000_4000),
        ];
        // Largest gap: 0x61_0000..0x7000_0000; one free page left below.
        assert_eq!(free_page(&maps), Some(0x61_1000));
        // Gaps of two pages or less take no scratch page.
        assert_eq!(
            free_page(&[area(0x1_0000, 0x2_0000), area(0x2_2000, 0x3_0000)]),
            None
        );
    }
}
