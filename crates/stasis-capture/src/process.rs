//! The state of one frozen process: threads, signal state, /proc facts.

use stasis_image::manifest::{
    AltStack, ProcessImage, RseqConfig, SchedImage, SigInfo, ThreadImage,
};
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::ptrace::normalize_interrupted_syscall;
use stasis_kernel::robust_list::get_robust_list;
use stasis_sys as sys;

use crate::freeze::FrozenProcess;
use crate::SaveError;
use crate::{memory, proc, Result};

fn siginfo(raw: &[u8; sys::SIGINFO_SIZE]) -> SigInfo {
    let signo = u32::from_le_bytes(raw[0..4].try_into().unwrap_or([0; 4]));
    SigInfo {
        signo,
        raw: raw.to_vec(),
    }
}

/// The image of a zombie: identity and exit status only.
pub fn zombie_image(pid: i32, status: i32) -> Result<ProcessImage> {
    let stat = proc::read_parsed(pid, "stat", proc::parse_stat)?;
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
        oom_score_adj: None,
        thp_disabled: false,
        loginuid: None,
        dumpable: None,
        stopped: false,
        stop_signal: None,
        membarrier: 0,
        aio_rings: Vec::new(),
        pending_time: None,
        fds_shared_with: None,
        root: None,
    })
}

/// One thread of a frozen process: its image and its XCR0 features.
/// `status`: the process's (its main thread's) `/proc/PID/status`.
fn thread_image(
    pid: i32,
    t: &crate::freeze::FrozenThread,
    (altstack, clear_child_tid): &(AltStack, u64),
    status: &str,
) -> Result<(ThreadImage, u64)> {
    let tid = t.tracee.pid();
    let mut regs = t.orig_regs;
    normalize_interrupted_syscall(&mut regs, false);
    let xstate = t.tracee.xstate()?;
    let xfeatures = stasis_kernel::probe::xfeatures_of(&xstate);
    let (robust_list, robust_list_len) = get_robust_list(tid)?;
    let mut seccomp = t.tracee.seccomp_filters()?;
    seccomp.reverse();
    // Strict mode (`SECCOMP_MODE_STRICT`, "Seccomp: 1"): no filter to
    // read, the thread's status says.
    let seccomp_strict = seccomp.is_empty() && {
        let own;
        let st = if tid == pid {
            status
        } else {
            own = proc::read(pid, &format!("task/{tid}/status"))?;
            &own
        };
        st.lines()
            .any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('1'))
    };
    let th = ThreadImage {
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
        seccomp,
        seccomp_strict,
        clear_child_tid: *clear_child_tid,
        robust_list,
        robust_list_len,
        sched: Some(sched_of(pid, tid)?),
    };
    Ok((th, xfeatures))
}

/// Everything of a live frozen process except its fds and page pack, plus
/// the parsed maps (`maps`, read since the freeze: for the memory plan)
/// and its XCR0.
pub fn capture(
    f: &mut FrozenProcess,
    mem: &ProcessMemory,
    maps: Vec<proc::MapsEntry>,
) -> Result<(ProcessImage, Vec<proc::MapsEntry>, u64)> {
    let pid = f.pid;
    let t0 = std::time::Instant::now();
    for m in &maps {
        memory::vma_kind(m).map_err(|e| SaveError::Unsupported { pid, what: e.0 })?;
    }
    let check_us = t0.elapsed().as_micros();
    f.arm_remote(mem, &maps)?;
    let arm_us = t0.elapsed().as_micros();
    let remote = crate::remote_state::read(f, mem, &maps)?;
    let remote_us = t0.elapsed().as_micros();
    let shared_pending = f.threads[0].tracee.pending_siginfo(true)?;
    let status = proc::read(pid, "status")?;
    let mut threads = Vec::new();
    let mut xfeatures = 0;
    for (t, remote_thread) in f.threads.iter().zip(&remote.threads) {
        let (th, x) = thread_image(pid, t, remote_thread, &status)?;
        xfeatures = x;
        threads.push(th);
    }
    tracing::debug!(
        pid,
        areas = maps.len(),
        threads = threads.len(),
        check_us,
        arm_us,
        remote_us,
        threads_us = t0.elapsed().as_micros(),
        "process state read (cumulative µs)"
    );
    let stat = proc::read_parsed(pid, "stat", proc::parse_stat)?;
    let no_new_privs = status
        .lines()
        .any(|l| l.starts_with("NoNewPrivs:") && l.trim_end().ends_with('1'));
    let (umask, creds) =
        proc::parse_status(&status).map_err(|e| proc::format_err(pid, "status", e))?;
    let rlimits = proc::rlimits(proc::read_parsed(pid, "limits", proc::parse_limits)?);
    let personality =
        u32::from_str_radix(proc::read(pid, "personality")?.trim(), 16).map_err(|_| {
            SaveError::ProcFormat {
                pid,
                file: "personality".into(),
                what: "not a hex number".into(),
            }
        })?;
    let auxv_bytes = proc::read_bytes(pid, "auxv")?;
    let mut mm = proc::mm_image(&stat.mm);
    mm.brk = remote.brk;
    mm.auxv = stasis_kernel::mem::le_u64s(&auxv_bytes);
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
        creds: proc::credentials(creds, remote.securebits),
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
        oom_score_adj: Some(oom_score_adj(pid)?),
        thp_disabled: status
            .lines()
            .any(|l| l.starts_with("THP_enabled:") && l.trim_end().ends_with('0')),
        loginuid: loginuid(pid)?,
        dumpable: Some(remote.dumpable),
        stopped: f.stopped,
        stop_signal: f.stop_signal.filter(|_| f.stopped),
        membarrier: remote.membarrier,
        aio_rings: Vec::new(),
        pending_time: crate::ns::pending_time(pid)?,
        fds_shared_with: None,
        root: root_dir(pid)?,
    };
    Ok((image, maps, xfeatures))
}

/// Thread `tid`'s scheduling policy and parameters.
fn sched_of(pid: i32, tid: i32) -> Result<SchedImage> {
    let a = stasis_kernel::sched::get(tid).map_err(|source| SaveError::Proc {
        pid,
        file: format!("task/{tid} (sched_getattr)"),
        source,
    })?;
    Ok(SchedImage {
        policy: a.sched_policy,
        flags: a.sched_flags & sys::SCHED_FLAGS_KEPT,
        nice: a.sched_nice,
        priority: a.sched_priority,
        runtime: a.sched_runtime,
        deadline: a.sched_deadline,
        period: a.sched_period,
    })
}

/// `/proc/PID/oom_score_adj`.
fn oom_score_adj(pid: i32) -> Result<i32> {
    let text = proc::read(pid, "oom_score_adj")?;
    text.trim().parse().map_err(|_| {
        SaveError::ProcFormat {
            pid,
            file: "oom_score_adj".into(),
            what: format!("not a number: {text:?}"),
        }
        .into()
    })
}

/// Its root directory (`/proc/PID/root`), when it is not `/` (`chroot`);
/// a deleted one is refused: it cannot be entered again.
fn root_dir(pid: i32) -> Result<Option<String>> {
    let root = proc::read_link(pid, "root")?;
    if root == "/" {
        return Ok(None);
    }
    if root.ends_with(" (deleted)") {
        return Err(SaveError::Unsupported {
            pid,
            what: format!(
                "its root directory (chroot) {root} was removed, and cannot be entered again"
            ),
        }
        .into());
    }
    Ok(Some(root))
}

/// `/proc/PID/loginuid` (`None` on a kernel without audit).
fn loginuid(pid: i32) -> Result<Option<u32>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/loginuid")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && proc::read(pid, "stat").is_ok() => {
            return Ok(None)
        }
        Err(e) => return Err(crate::CaptureError::from_proc(pid, "loginuid", e)),
    };
    text.trim().parse().map(Some).map_err(|_| {
        SaveError::ProcFormat {
            pid,
            file: "loginuid".into(),
            what: format!("not a number: {text:?}"),
        }
        .into()
    })
}
