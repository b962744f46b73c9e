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
    let timers = proc::read_parsed(pid, "timers", proc::parse_timers)?;
    let (main, others) = f
        .threads
        .split_first_mut()
        .ok_or(CaptureError::NoSuchProcess { pid })?;
    let mut r = ThreadRemote::with_memory(main, mem, scratch).batching(sig);
    let (sigactions, w, posix_timers, main_state) =
        main_thread(&mut r, asked_signals(&status), &timers)?;
    let mut threads = vec![main_state];
    for th in others {
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

/// Output slots of [`OUT`] bytes below the batch table.
const SLOTS: usize = BATCH_TABLE / OUT;

/// What [`main_thread`] reads.
type MainThread = (
    Vec<SigAction>,
    ProcessWide,
    Vec<PosixTimer>,
    (AltStack, u64),
);

/// What the main thread reports: the signal actions, the process-wide
/// state, the POSIX timers and its own thread state; in one batch (one
/// stop of the thread) when their outputs fit below the batch table, as
/// they do unless the process catches most signals or has many timers.
fn main_thread(r: &mut dyn Remote, asked: u64, timers: &[proc::TimerLine]) -> Result<MainThread> {
    let wanted = wanted_signals(asked);
    let (k, t) = (wanted.len(), timers.len());
    if k + WIDE_SLOTS + t + THREAD_SLOTS > SLOTS {
        return Ok((
            sigactions(r, asked)?,
            process_wide(r)?,
            posix_timers(r, timers)?,
            thread_state(r)?,
        ));
    }
    let s = r.scratch();
    let mut calls = sigaction_calls(s, 0, &wanted);
    calls.extend(process_wide_calls(s, k));
    let wide_end = calls.len();
    calls.extend(timer_calls(s, k + WIDE_SLOTS, timers));
    calls.extend(thread_calls(s, k + WIDE_SLOTS + t));
    let res = r.batch(&calls)?;
    let words = read_u64s(r, s, (k + WIDE_SLOTS + t + THREAD_SLOTS) * OUT / 8)?;
    let at = |slot: usize| &words[slot * OUT / 8..];
    Ok((
        sigactions_from(at(0), &wanted),
        process_wide_from(&res[k..wide_end], at(k)),
        timers_from(at(k + WIDE_SLOTS), timers),
        thread_from(at(k + WIDE_SLOTS + t)),
    ))
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

/// Every signal but SIGKILL and SIGSTOP.
fn all_signals() -> impl Iterator<Item = u32> {
    (1..=64u32).filter(|&s| s != libc::SIGKILL.unsigned_abs() && s != libc::SIGSTOP.unsigned_abs())
}

/// The signals of [`all_signals`] in `asked`.
fn wanted_signals(asked: u64) -> Vec<u32> {
    all_signals()
        .filter(|s| asked & (1u64 << (s - 1)) != 0)
        .collect()
}

/// `rt_sigaction` of each of `wanted`, reporting in slots from `first`.
fn sigaction_calls(scratch: u64, first: usize, wanted: &[u32]) -> Vec<Syscall> {
    wanted
        .iter()
        .enumerate()
        .map(|(i, &sig)| {
            let out = scratch + ((first + i) * OUT) as u64;
            Syscall::new(
                "rt_sigaction",
                libc::SYS_rt_sigaction,
                &[u64::from(sig), 0, out, 8],
            )
        })
        .collect()
}

/// Every signal's action from the slots of [`sigaction_calls`] (`w`
/// starts at its first); the signals not in `wanted` are at SIG_DFL.
fn sigactions_from(w: &[u64], wanted: &[u32]) -> Vec<SigAction> {
    all_signals()
        .map(|sig| {
            let at = wanted.iter().position(|&s| s == sig);
            let word = |k: usize| at.map_or(0, |i| w[i * 4 + k]);
            SigAction {
                signo: sig,
                handler: word(0),
                flags: word(1),
                restorer: word(2),
                mask: word(3),
            }
        })
        .collect()
}

/// The action of every signal but SIGKILL and SIGSTOP (those in `asked`
/// by `rt_sigaction`, in one batch; the others SIG_DFL).
pub fn sigactions(r: &mut dyn Remote, asked: u64) -> Result<Vec<SigAction>> {
    let scratch = r.scratch();
    let wanted = wanted_signals(asked);
    // (62 signals of 32 bytes fit below the batch table.)
    r.batch(&sigaction_calls(scratch, 0, &wanted))?;
    let w = read_u64s(r, scratch, 4 * wanted.len())?;
    Ok(sigactions_from(&w, &wanted))
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

/// Output slots of [`process_wide_calls`].
const WIDE_SLOTS: usize = 5;

/// `getitimer` of the three interval timers, `brk`, the parent-death
/// signal, the child-subreaper and dumpable flags, the securebits and the
/// `membarrier` registrations (on a kernel that tells them), reporting
/// in [`WIDE_SLOTS`] slots from `first`.
fn process_wide_calls(scratch: u64, first: usize) -> Vec<Syscall> {
    let at = |i: usize| scratch + ((first + i) * OUT) as u64;
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
    calls
}

/// [`ProcessWide`] from the results of [`process_wide_calls`] and its
/// slots (`w` starts at its first).
fn process_wide_from(res: &[u64], w: &[u64]) -> ProcessWide {
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
    ProcessWide {
        itimers,
        brk: res[3],
        pdeath_signal: i32::try_from(w[12] & 0xffff_ffff).unwrap_or(0),
        child_subreaper: w[16] & 0xffff_ffff != 0,
        dumpable: u32::try_from(res[6]).unwrap_or(1),
        securebits: u32::try_from(res[7]).unwrap_or(0),
        membarrier: res.get(8).map_or(0, |&m| u32::try_from(m).unwrap_or(0)),
    }
}

/// [`process_wide_calls`] in one batch.
fn process_wide(r: &mut dyn Remote) -> Result<ProcessWide> {
    let s = r.scratch();
    let res = r.batch(&process_wide_calls(s, 0))?;
    let w = read_u64s(r, s, WIDE_SLOTS * OUT / 8)?;
    Ok(process_wide_from(&res, &w))
}

/// An interval and a value (two pairs of seconds and sub-seconds,
/// `per_sec` of them a second) in sub-second units.
fn interval_and_value(w: &[u64], per_sec: u64) -> (u64, u64) {
    (w[0] * per_sec + w[1], w[2] * per_sec + w[3])
}

/// `timer_gettime` of each of `timers`, reporting in slots from `first`.
fn timer_calls(scratch: u64, first: usize, timers: &[proc::TimerLine]) -> Vec<Syscall> {
    timers
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let out = scratch + ((first + i) * OUT) as u64;
            Syscall::new(
                "timer_gettime",
                libc::SYS_timer_gettime,
                &[u64::from(t.0.unsigned_abs()), out],
            )
        })
        .collect()
}

/// The timers from the slots of [`timer_calls`] (`w` starts at its first).
fn timers_from(w: &[u64], timers: &[proc::TimerLine]) -> Vec<PosixTimer> {
    timers
        .iter()
        .enumerate()
        .map(|(i, &(id, signo, value, notify, tid, clockid))| {
            let (interval_ns, value_ns) = interval_and_value(&w[i * 4..], 1_000_000_000);
            PosixTimer {
                id,
                clockid,
                notify,
                signo,
                tid,
                value,
                interval_ns,
                value_ns,
            }
        })
        .collect()
}

/// `timer_gettime` of every POSIX timer `/proc/PID/timers` lists (in
/// batches that fit below the batch table).
fn posix_timers(r: &mut dyn Remote, timers: &[proc::TimerLine]) -> Result<Vec<PosixTimer>> {
    let scratch = r.scratch();
    let mut out = Vec::new();
    for group in timers.chunks(SLOTS) {
        r.batch(&timer_calls(scratch, 0, group))?;
        let w = read_u64s(r, scratch, 4 * group.len())?;
        out.extend(timers_from(&w, group));
    }
    Ok(out)
}

/// Output slots of [`thread_calls`].
const THREAD_SLOTS: usize = 2;

/// `sigaltstack` and `PR_GET_TID_ADDRESS`, reporting in slots from `first`.
fn thread_calls(scratch: u64, first: usize) -> [Syscall; 2] {
    let at = |i: usize| scratch + ((first + i) * OUT) as u64;
    [
        Syscall::new("sigaltstack", libc::SYS_sigaltstack, &[0, at(0)]),
        Syscall::new(
            "prctl(PR_GET_TID_ADDRESS)",
            libc::SYS_prctl,
            &[sys::prctl::PR_GET_TID_ADDRESS.unsigned_abs().into(), at(1)],
        ),
    ]
}

/// The alternate signal stack and `clear_child_tid` from the slots of
/// [`thread_calls`] (`w` starts at its first).
fn thread_from(w: &[u64]) -> (AltStack, u64) {
    let altstack = AltStack {
        sp: w[0],
        flags: i32::try_from(w[1] & 0x7fff_ffff).unwrap_or(0),
        size: w[2],
    };
    (altstack, w[4])
}

/// One thread's alternate signal stack and `clear_child_tid`, in one batch.
fn thread_state(r: &mut dyn Remote) -> Result<(AltStack, u64)> {
    let scratch = r.scratch();
    r.batch(&thread_calls(scratch, 0))?;
    let w = read_u64s(r, scratch, THREAD_SLOTS * OUT / 8)?;
    Ok(thread_from(&w))
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

    #[test]
    fn the_main_thread_reports_everything_in_one_batch_when_it_fits() {
        // SIGHUP ignored, SIGUSR1 caught (+ SIGCHLD): 3 actions, 5 slots of
        // process-wide state, 1 timer, 2 slots of thread state.
        let asked = asked_signals("SigIgn:\t0000000000000001\nSigCgt:\t0000000000000200\n");
        let timers: Vec<proc::TimerLine> = vec![(7, 14, 1, 0, 0, 1)];
        let mut r = Recorder::default();
        let s = r.scratch();
        // What the kernel would write: SIGUSR1's handler (slot 1), the
        // virtual itimer's interval (slot 3 + 1), the parent-death signal
        // (slot 3 + 3), the timer's value (slot 8), the altstack (slot 9)
        // and clear_child_tid (slot 10).
        let mut words = vec![0u64; 11 * 4];
        words[4] = 0x0040_1111;
        words[4 * 4] = 2;
        words[6 * 4] = 9;
        words[8 * 4 + 2] = 3;
        words[9 * 4] = 0x7000_0000;
        words[9 * 4 + 2] = 8192;
        words[10 * 4] = 0x7fff_1234;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        r.write(s, &bytes).unwrap();
        let (acts, wide, posix, (alt, tid)) = main_thread(&mut r, asked, &timers).unwrap();
        assert_eq!(acts.len(), 62);
        assert_eq!(
            acts.iter().find(|a| a.signo == 10).unwrap().handler,
            0x0040_1111
        );
        assert_eq!(acts.iter().find(|a| a.signo == 1).unwrap().handler, 0);
        assert_eq!(wide.itimers[1].interval_us, 2_000_000);
        assert_eq!(wide.pdeath_signal, 9);
        assert_eq!(posix[0].value_ns, 3_000_000_000);
        assert_eq!((alt.sp, alt.size, tid), (0x7000_0000, 8192, 0x7fff_1234));
        // Each call reports in its own slot, all below the batch table.
        let slot = |name: &str, i: usize| r.args_of(name)[0][i];
        assert_eq!(r.args_of("rt_sigaction")[2][2], s + 2 * 32);
        assert_eq!(r.args_of("getitimer")[0][1], s + 3 * 32);
        assert_eq!(slot("timer_gettime", 1), s + 8 * 32);
        assert_eq!(slot("sigaltstack", 1), s + 9 * 32);
        assert_eq!(slot("prctl(PR_GET_TID_ADDRESS)", 1), s + 10 * 32);
        // A process catching every signal: the actions take every slot,
        // so each part reports from the start of the scratch page again.
        let mut r = Recorder::default();
        main_thread(&mut r, u64::MAX, &timers).unwrap();
        assert_eq!(r.args_of("rt_sigaction").len(), 62);
        assert_eq!(r.args_of("getitimer")[0][1], s);
        assert_eq!(r.args_of("sigaltstack")[0][1], s);
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
