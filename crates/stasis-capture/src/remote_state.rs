//! State only the process itself can report, read by remote syscalls in a
//! scratch page: signal actions, interval and POSIX timers, `brk`, the
//! parent-death signal, the subreaper and dumpable flags, the securebits,
//! and per thread the alternate
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
use stasis_kernel::remote::{Remote, Syscall, BATCH_TABLE};
use stasis_sys as sys;

use crate::freeze::{FrozenProcess, FrozenThread};
use crate::remote::{batch_signal, read_u64s, ThreadRemote, SCRATCH_LEN};
use crate::{proc, CaptureError, Result};

/// What the remote syscalls reported.
pub struct RemoteState {
    pub sigactions: Vec<SigAction>,
    pub posix_timers: Vec<PosixTimer>,
    pub pdeath_signal: i32,
    pub child_subreaper: bool,
    pub itimers: Vec<ITimer>,
    pub brk: u64,
    /// `PR_GET_DUMPABLE`.
    pub dumpable: u32,
    /// `PR_GET_SECUREBITS`.
    pub securebits: u32,
    /// `membarrier` registrations (a mask of its `REGISTER` commands; 0
    /// on a kernel that cannot tell them).
    pub membarrier: u32,
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
    let sig = batch_signal(&status);
    let mut r = ThreadRemote::with_memory(&mut f.threads[0], mem, scratch).batching(sig);
    let sigactions = sigactions(&mut r, asked_signals(&status))?;
    let timers = proc::read_parsed(pid, "timers", proc::parse_timers)?;
    let w = process_wide(&mut r)?;
    let posix_timers = posix_timers(&mut r, &timers)?;
    let mut threads = Vec::new();
    for th in &mut f.threads {
        threads.push(thread_state(
            &mut ThreadRemote::with_memory(th, mem, scratch).batching(sig),
        )?);
    }
    Ok(RemoteState {
        sigactions,
        posix_timers,
        pdeath_signal: w.pdeath_signal,
        child_subreaper: w.child_subreaper,
        itimers: w.itimers,
        brk: w.brk,
        dumpable: w.dumpable,
        securebits: w.securebits,
        membarrier: w.membarrier,
        threads,
    })
}

/// The signals whose action is asked of the process: only those caught or
/// ignored (`SigCgt`, `SigIgn` of `status`) and SIGCHLD (whose flags matter
/// even at SIG_DFL); the rest are at SIG_DFL, and saved so. All if `status`
/// lacks the masks.
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

/// Bytes of the scratch page each batched syscall below reports in.
const OUT: usize = 32;

/// The action of every signal but SIGKILL and SIGSTOP (those in `asked`
/// by `rt_sigaction`, in one batch; the others SIG_DFL).
pub fn sigactions(r: &mut dyn Remote, asked: u64) -> Result<Vec<SigAction>> {
    let scratch = r.scratch();
    let sigs: Vec<u32> = (1..=64u32)
        .filter(|&s| s != libc::SIGKILL.unsigned_abs() && s != libc::SIGSTOP.unsigned_abs())
        .collect();
    let wanted: Vec<u32> = sigs
        .iter()
        .copied()
        .filter(|s| asked & (1u64 << (s - 1)) != 0)
        .collect();
    // (62 signals of 32 bytes fit below the batch table.)
    let calls: Vec<Syscall> = wanted
        .iter()
        .enumerate()
        .map(|(i, &sig)| {
            let out = scratch + (i * OUT) as u64;
            Syscall::new(
                "rt_sigaction",
                libc::SYS_rt_sigaction,
                &[u64::from(sig), 0, out, 8],
            )
        })
        .collect();
    r.batch(&calls)?;
    let w = read_u64s(r, scratch, 4 * wanted.len())?;
    let mut out = Vec::new();
    for sig in sigs {
        let at = wanted.iter().position(|&s| s == sig);
        let word = |k: usize| at.map_or(0, |i| w[i * 4 + k]);
        out.push(SigAction {
            signo: sig,
            handler: word(0),
            flags: word(1),
            restorer: word(2),
            mask: word(3),
        });
    }
    Ok(out)
}

/// What [`process_wide`] reads.
struct ProcessWide {
    itimers: Vec<ITimer>,
    brk: u64,
    pdeath_signal: i32,
    child_subreaper: bool,
    dumpable: u32,
    securebits: u32,
    membarrier: u32,
}

/// In one batch: `getitimer` of the three interval timers, `brk`, the
/// parent-death signal, the child-subreaper and dumpable flags, the
/// securebits and the `membarrier` registrations (on a kernel that tells
/// them).
fn process_wide(r: &mut dyn Remote) -> Result<ProcessWide> {
    let s = r.scratch();
    let at = |i: usize| s + (i * OUT) as u64;
    let mut calls: Vec<Syscall> = (0..3u8)
        .map(|which| {
            Syscall::new(
                "getitimer",
                libc::SYS_getitimer,
                &[u64::from(which), at(usize::from(which))],
            )
        })
        .collect();
    let prctl = |name, op: i32, args: &[u64]| {
        let mut a = vec![op.unsigned_abs().into()];
        a.extend_from_slice(args);
        Syscall::new(name, libc::SYS_prctl, &a)
    };
    calls.extend([
        Syscall::new("brk", libc::SYS_brk, &[0]),
        prctl("prctl(PR_GET_PDEATHSIG)", libc::PR_GET_PDEATHSIG, &[at(3)]),
        prctl(
            "prctl(PR_GET_CHILD_SUBREAPER)",
            libc::PR_GET_CHILD_SUBREAPER,
            &[at(4)],
        ),
        prctl("prctl(PR_GET_DUMPABLE)", libc::PR_GET_DUMPABLE, &[]),
        prctl("prctl(PR_GET_SECUREBITS)", libc::PR_GET_SECUREBITS, &[]),
    ]);
    if stasis_kernel::probe::membarrier_registrations() {
        calls.push(Syscall::new(
            "membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS)",
            libc::SYS_membarrier,
            &[stasis_sys::MEMBARRIER_CMD_GET_REGISTRATIONS, 0, 0],
        ));
    }
    let res = r.batch(&calls)?;
    let w = read_u64s(r, s, 5 * OUT / 8)?;
    let itimers = (0..3u32)
        .map(|which| {
            let (interval_us, value_us) = interval_and_value(&w[which as usize * 4..], 1_000_000);
            ITimer {
                which,
                interval_us,
                value_us,
            }
        })
        .collect();
    Ok(ProcessWide {
        itimers,
        brk: res[3],
        pdeath_signal: i32::try_from(w[12] & 0xffff_ffff).unwrap_or(0),
        child_subreaper: w[16] & 0xffff_ffff != 0,
        dumpable: u32::try_from(res[6]).unwrap_or(1),
        securebits: u32::try_from(res[7]).unwrap_or(0),
        membarrier: res.get(8).map_or(0, |&m| u32::try_from(m).unwrap_or(0)),
    })
}

/// An interval and a value (two pairs of seconds and sub-seconds,
/// `per_sec` of them a second) in sub-second units.
fn interval_and_value(w: &[u64], per_sec: u64) -> (u64, u64) {
    (w[0] * per_sec + w[1], w[2] * per_sec + w[3])
}

/// `timer_gettime` of every POSIX timer `/proc/PID/timers` lists (in
/// batches that fit below the batch table).
fn posix_timers(r: &mut dyn Remote, timers: &[proc::TimerLine]) -> Result<Vec<PosixTimer>> {
    let scratch = r.scratch();
    let mut out = Vec::new();
    for group in timers.chunks(BATCH_TABLE / OUT) {
        let calls: Vec<Syscall> = group
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let out = scratch + (i * OUT) as u64;
                Syscall::new(
                    "timer_gettime",
                    libc::SYS_timer_gettime,
                    &[u64::from(t.0.unsigned_abs()), out],
                )
            })
            .collect();
        r.batch(&calls)?;
        let w = read_u64s(r, scratch, 4 * group.len())?;
        for (i, &(id, signo, value, notify, tid, clockid)) in group.iter().enumerate() {
            let (interval_ns, value_ns) = interval_and_value(&w[i * 4..], 1_000_000_000);
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
    }
    Ok(out)
}

/// One thread's alternate signal stack and `clear_child_tid`, in one batch.
fn thread_state(r: &mut dyn Remote) -> Result<(AltStack, u64)> {
    let scratch = r.scratch();
    let tid_at = scratch + OUT as u64;
    r.batch(&[
        Syscall::new("sigaltstack", libc::SYS_sigaltstack, &[0, scratch]),
        Syscall::new(
            "prctl(PR_GET_TID_ADDRESS)",
            libc::SYS_prctl,
            &[sys::prctl::PR_GET_TID_ADDRESS.unsigned_abs().into(), tid_at],
        ),
    ])?;
    let w = read_u64s(r, scratch, 5)?;
    let altstack = AltStack {
        sp: w[0],
        flags: i32::try_from(w[1] & 0x7fff_ffff).unwrap_or(0),
        size: w[2],
    };
    Ok((altstack, w[4]))
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
            // Each reports in its own 32 bytes (one batch).
            vec![
                vec![1, 0, scratch, 8, 0, 0],
                vec![10, 0, scratch + 32, 8, 0, 0],
                vec![17, 0, scratch + 64, 8, 0, 0]
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
        assert!(process_wide(&mut r).is_err());
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
