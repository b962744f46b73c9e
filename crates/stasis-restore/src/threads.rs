//! Per process, last: threads (`clone3` with `set_tid`), process-wide
//! prctls, per-thread state, credentials and pending signals; then the
//! final jump and release.

use stasis_image::manifest::{ProcessImage, SchedImage, ThreadImage};
use stasis_kernel::{sarg, Tracee, UserRegs};

use crate::build::{self, step};
use crate::caps;
use crate::proc::{Proc, CTL_SIZE};
use crate::remote::Remote;
use crate::ObjectError;
use crate::Result;

/// Threads, while stasis may still choose TIDs (set_tid needs
/// CAP_SYS_ADMIN, which credentials may drop later).
pub(crate) fn create_threads(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    for th in &p.threads[1..] {
        s.cur = None;
        build::clone_thread(s, th.tid)?;
        let tid = s.t.take_new_task().unwrap_or(th.tid);
        let mut t =
            Tracee::adopt_new_thread(tid).map_err(step(format!("taking over new thread {tid}")))?;
        t.set_syscall_insn(s.ctl);
        let mut base = t
            .regs()
            .map_err(step(format!("registers of new thread {tid}")))?;
        base.rsp = 0;
        s.threads.push((t, base));
    }
    Ok(())
}

/// Process-wide prctls: child subreaper, parent-death signal; after the
/// main thread's credentials (a change of credentials clears the
/// parent-death signal, so a process restored under zdtm's uid lost it).
/// The root's
/// parent is the restorer now, which may exit (--detach): its parent-death
/// signal would kill it for no reason, so only the other processes (whose
/// parents are restored with them) get theirs back.
pub(crate) fn process_prctls<R: Remote>(s: &mut R, p: &ProcessImage, is_root: bool) -> Result<()> {
    if p.child_subreaper {
        s.sys(
            "prctl(PR_SET_CHILD_SUBREAPER)",
            libc::SYS_prctl,
            &[libc::PR_SET_CHILD_SUBREAPER as u64, 1],
        )
        .map_err(step("making the process a child subreaper again"))?;
    }
    if is_root {
        // The root stub was made to die with the restorer until
        // PTRACE_O_EXITKILL held (see `spawn_stopped`): it outlives it.
        s.sys(
            "prctl(PR_SET_PDEATHSIG)",
            libc::SYS_prctl,
            &[libc::PR_SET_PDEATHSIG as u64, 0],
        )
        .map_err(step("clearing the root's parent-death signal"))?;
    } else if p.pdeath_signal != 0 {
        s.sys(
            "prctl(PR_SET_PDEATHSIG)",
            libc::SYS_prctl,
            &[
                libc::PR_SET_PDEATHSIG as u64,
                sarg(i64::from(p.pdeath_signal)),
            ],
        )
        .map_err(step("restoring the parent-death signal"))?;
    }
    Ok(())
}

/// The dumpable flag, once every thread has its credentials (changing
/// them resets it to `fs.suid_dumpable`). 2 (`suid_dumpable`'s "suidsafe")
/// cannot be set by a process: it is left as the credentials made it.
pub(crate) fn restore_dumpable<R: Remote>(s: &mut R, p: &ProcessImage) -> Result<()> {
    let Some(d @ (0 | 1)) = p.dumpable else {
        return Ok(());
    };
    s.sys(
        "prctl(PR_SET_DUMPABLE)",
        libc::SYS_prctl,
        &[libc::PR_SET_DUMPABLE as u64, u64::from(d)],
    )
    .map_err(step("restoring the dumpable flag"))?;
    Ok(())
}

/// Per-thread state, credentials (per thread in the kernel) and
/// thread-directed pending signals, each run by the thread itself (a
/// thread may queue kernel-style siginfo only to itself). First, the
/// io_uring instances a thread other than the main one is the single
/// issuer of, which the main thread made disabled, are enabled and
/// filled by it ([`io_urings_of`]); last, it registers the personalities
/// of those it is to (their issuer, or the main thread).
pub(crate) fn per_thread(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    let pid = s.pid;
    for (i, th) in p.threads.iter().enumerate() {
        s.cur = i.checked_sub(1);
        let main = p.threads.first().map_or(p.pid, |t| t.tid);
        for img in io_urings_of(p, |f| {
            stasis_objects::io_uring::enabled_by(f, main) == Some(th.tid)
        }) {
            stasis_objects::io_uring::finish_in(s, img)?;
        }
        thread_attributes(s, pid, p, th)?;
        // With the process's credentials back.
        for img in io_urings_of(p, |f| {
            stasis_objects::io_uring::personalities_by(f, main) == Some(th.tid)
        }) {
            stasis_objects::io_uring::register_personalities(s, img)?;
        }
    }
    Ok(())
}

/// The io_uring instances of `p` that `which` picks (by the fds of the
/// thread that finishes them): the first fd of each (the one
/// `restore_files` made; the others are dups of it).
fn io_urings_of(
    p: &ProcessImage,
    which: impl Fn(&stasis_image::manifest::FdImage) -> bool,
) -> Vec<&stasis_image::manifest::FdImage> {
    let mut seen = Vec::new();
    p.fds
        .iter()
        .filter(|f| which(f))
        .filter(|f| match f.shared_id {
            Some(id) if seen.contains(&id) => false,
            Some(id) => {
                seen.push(id);
                true
            }
            None => true,
        })
        .collect()
}

/// What one thread (the one running the remote syscalls) gets back.
pub(crate) fn thread_attributes<R: Remote>(
    s: &mut R,
    pid: i32,
    p: &ProcessImage,
    th: &ThreadImage,
) -> Result<()> {
    build::thread_state_inheriting(s, th, build::shared_seccomp(p))?;
    // Before the credentials: raising a priority takes root's privilege.
    restore_sched(s, th)?;
    restore_creds(s, p)?;
    if p.no_new_privs {
        s.sys(
            "prctl(PR_SET_NO_NEW_PRIVS)",
            libc::SYS_prctl,
            &[libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0],
        )
        .map_err(step("restoring no_new_privs"))?;
    }
    for si in &th.pending {
        let a = s
            .put(build::SCRATCH_STRUCT, &si.raw)
            .map_err(step("siginfo"))?;
        s.sys(
            "rt_tgsigqueueinfo",
            libc::SYS_rt_tgsigqueueinfo,
            &[
                sarg(i64::from(pid)),
                sarg(i64::from(th.tid)),
                u64::from(si.signo),
                a,
            ],
        )
        .map_err(step(format!(
            "queueing pending signal {} of thread {}",
            si.signo, th.tid
        )))?;
    }
    Ok(())
}

/// Signals pending for the whole process.
pub(crate) fn shared_signals<R: Remote>(s: &mut R, pid: i32, p: &ProcessImage) -> Result<()> {
    for si in &p.shared_pending {
        let a = s
            .put(build::SCRATCH_STRUCT, &si.raw)
            .map_err(step("siginfo"))?;
        s.sys(
            "rt_sigqueueinfo",
            libc::SYS_rt_sigqueueinfo,
            &[sarg(i64::from(pid)), u64::from(si.signo), a],
        )
        .map_err(step(format!("queueing pending signal {}", si.signo)))?;
    }
    Ok(())
}

/// The calling thread's scheduling policy and parameters
/// (`sched_setattr(0, ...)`); nothing for an image without them.
pub(crate) fn restore_sched<R: Remote>(s: &mut R, th: &ThreadImage) -> Result<()> {
    let Some(sc) = &th.sched else {
        return Ok(());
    };
    let attr = sched_attr_bytes(sc);
    let a = s
        .put(build::SCRATCH_STRUCT, &attr)
        .map_err(step("sched_attr"))?;
    s.sys("sched_setattr", libc::SYS_sched_setattr, &[0, a, 0])
        .map_err(step(format!(
            "giving thread {} its scheduling policy {} (nice {}, priority {})",
            th.tid, sc.policy, sc.nice, sc.priority
        )))?;
    let fair = [libc::SCHED_OTHER, libc::SCHED_BATCH].map(|p| p.unsigned_abs());
    if sc.nice != 0 && !fair.contains(&sc.policy) {
        // sched_setattr applies the nice value of the fair policies only;
        // the others keep theirs (it counts again once reset to normal).
        let prio = libc::PRIO_PROCESS as u64;
        s.sys(
            "setpriority",
            libc::SYS_setpriority,
            &[prio, 0, sarg(i64::from(sc.nice))],
        )
        .map_err(step(format!(
            "giving thread {} its nice value {}",
            th.tid, sc.nice
        )))?;
    }
    Ok(())
}

/// `struct sched_attr` (`stasis_sys::SchedAttr`, 56 bytes) as the kernel
/// reads it; the utilization clamps are left alone.
fn sched_attr_bytes(sc: &SchedImage) -> Vec<u8> {
    let mut b = Vec::with_capacity(56);
    b.extend_from_slice(&56u32.to_le_bytes());
    b.extend_from_slice(&sc.policy.to_le_bytes());
    b.extend_from_slice(&(sc.flags & stasis_sys::SCHED_FLAGS_KEPT).to_le_bytes());
    b.extend_from_slice(&sc.nice.to_le_bytes());
    b.extend_from_slice(&sc.priority.to_le_bytes());
    b.extend_from_slice(&sc.runtime.to_le_bytes());
    b.extend_from_slice(&sc.deadline.to_le_bytes());
    b.extend_from_slice(&sc.period.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    debug_assert_eq!(b.len(), std::mem::size_of::<stasis_sys::SchedAttr>());
    b
}

/// Groups, then gids, then uids (once the uids are dropped, the gids could
/// no longer be set), with the capabilities around them (`caps.rs`).
/// Nothing to do for root with no groups and every capability.
pub(crate) fn restore_creds<R: Remote>(s: &mut R, p: &ProcessImage) -> Result<()> {
    let own = caps::Own::read();
    let Some(k) = caps::to_set(&p.creds, &own) else {
        return restore_ids(s, p);
    };
    caps::before_ids(s, &k, own.all)?;
    restore_ids(s, p)?;
    caps::after_ids(s, &k, own.all)
}

/// Groups, gids, uids.
fn restore_ids<R: Remote>(s: &mut R, p: &ProcessImage) -> Result<()> {
    let c = &p.creds;
    if c.uid == [0; 4] && c.gid == [0; 4] && (c.groups.is_empty() || c.groups_fixed) {
        return Ok(());
    }
    // Fixed groups (setgroups denied in its user namespace) are inherited.
    if !c.groups_fixed {
        let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
        let a = s
            .put(build::SCRATCH_STRUCT, &groups)
            .map_err(step("groups"))?;
        s.sys(
            "setgroups",
            libc::SYS_setgroups,
            &[c.groups.len() as u64, a],
        )
        .map_err(step("setgroups"))?;
    }
    s.sys(
        "setresgid",
        libc::SYS_setresgid,
        &[
            u64::from(c.gid[0]),
            u64::from(c.gid[1]),
            u64::from(c.gid[2]),
        ],
    )
    .map_err(step("setresgid"))?;
    s.sys("setfsgid", libc::SYS_setfsgid, &[u64::from(c.gid[3])])
        .map_err(step("setfsgid"))?;
    s.sys(
        "setresuid",
        libc::SYS_setresuid,
        &[
            u64::from(c.uid[0]),
            u64::from(c.uid[1]),
            u64::from(c.uid[2]),
        ],
    )
    .map_err(step("setresuid"))?;
    s.sys("setfsuid", libc::SYS_setfsuid, &[u64::from(c.uid[3])])
        .map_err(step("setfsuid"))?;
    Ok(())
}

/// Final step for one process: other threads' state, then the main
/// thread's xstate; unmap the control page; at that syscall-exit stop load
/// the main thread's mask and registers. It stays stopped until
/// [`release`].
pub(crate) fn jump(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    let regs_of = |th: &ThreadImage| {
        UserRegs::from_words(&th.regs).ok_or_else(|| {
            ObjectError::Inconsistent(format!(
                "thread {} has {} register words",
                th.tid,
                th.regs.len()
            ))
        })
    };
    for ((t, _), th) in s.threads.iter_mut().zip(&p.threads[1..]) {
        let regs = regs_of(th)?;
        t.set_xstate(&th.xstate).map_err(step(format!(
            "restoring FPU/SSE/AVX state of thread {}",
            th.tid
        )))?;
        t.set_sigmask(th.sigmask).map_err(step(format!(
            "restoring the signal mask of thread {}",
            th.tid
        )))?;
        t.set_regs(&regs)
            .map_err(step(format!("loading the registers of thread {}", th.tid)))?;
    }
    let th = &p.threads[0];
    let regs = regs_of(th)?;
    s.t.set_xstate(&th.xstate)
        .map_err(step("restoring FPU/SSE/AVX state"))?;
    // Unmap the control page with every signal still blocked (an armed
    // timer may have fired); its syscall-exit stop is where the process gets
    // its own mask and registers back (the instruction after `syscall` is gone).
    s.cur = None;
    s.sys("munmap", libc::SYS_munmap, &[s.ctl, CTL_SIZE])
        .map_err(step("unmapping the control page"))?;
    s.t.set_sigmask(th.sigmask)
        .map_err(step("restoring the signal mask"))?;
    s.t.set_regs(&regs)
        .map_err(step("loading the saved registers"))?;
    Ok(())
}

/// A process stopped by job control at the dump is sent its stop signal
/// again before it is let go: the signal waits while it is traced, and it
/// stops before it runs an instruction of its own (its parent sees it stop,
/// with the same signal, as it did). The whole tree exists by then, so its
/// process group is judged as the kernel will judge it at delivery: an
/// orphaned group ignores SIGTSTP, SIGTTIN and SIGTTOU, and is sent
/// SIGSTOP instead (it must not run).
pub(crate) fn stop_again(s: &mut Proc, img: &ProcessImage) -> Result<()> {
    use nix::sys::signal::Signal;
    let sig = match img.stop_signal.and_then(|n| Signal::try_from(n).ok()) {
        Some(sig @ (Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU))
            if !stasis_kernel::procfs::pgrp_orphaned(img.pgid) =>
        {
            sig
        }
        _ => Signal::SIGSTOP,
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.pid), sig).map_err(|e| {
        step("stopping the process again")(stasis_kernel::KernelError::Io {
            what: format!("kill({sig})"),
            source: e.into(),
        })
    })
}

/// Lets a process that [`jump`] made ready run: detaches its threads.
pub(crate) fn release(s: &mut Proc) -> Result<()> {
    for (t, _) in &mut s.threads {
        t.detach().map_err(step("detaching a thread"))?;
    }
    s.t.detach().map_err(step("detaching"))?;
    s.live = false;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;
    use stasis_image::manifest::SigInfo;

    fn img() -> ProcessImage {
        let mut p = crate::testutil::image(100, 1, 100, 100);
        p.threads.push(crate::testutil::thread(100));
        p
    }

    #[test]
    fn the_root_never_gets_a_parent_death_signal_back_the_others_do() {
        let mut p = img();
        p.pdeath_signal = libc::SIGTERM;
        p.child_subreaper = true;
        let mut r = Recorder::default();
        process_prctls(&mut r, &p, true).unwrap();
        let set = libc::PR_SET_PDEATHSIG as u64;
        assert_eq!(
            r.args_of("prctl(PR_SET_PDEATHSIG)"),
            [vec![set, 0]],
            "the root's is cleared"
        );
        assert_eq!(
            r.args_of("prctl(PR_SET_CHILD_SUBREAPER)"),
            [vec![libc::PR_SET_CHILD_SUBREAPER as u64, 1]]
        );
        let mut r = Recorder::default();
        process_prctls(&mut r, &p, false).unwrap();
        assert_eq!(
            r.args_of("prctl(PR_SET_PDEATHSIG)"),
            [vec![set, libc::SIGTERM as u64]]
        );
        // None saved, not the root: nothing to do.
        p.pdeath_signal = 0;
        p.child_subreaper = false;
        let mut r = Recorder::default();
        process_prctls(&mut r, &p, false).unwrap();
        assert!(r.names().is_empty());
    }

    #[test]
    fn the_dumpable_flag_is_set_back_unless_unknown_or_suidsafe() {
        let mut p = img();
        let set = libc::PR_SET_DUMPABLE as u64;
        for (saved, want) in [
            (Some(0), vec![vec![set, 0]]),
            (Some(1), vec![vec![set, 1]]),
            (Some(2), vec![]),
            (None, vec![]),
        ] {
            p.dumpable = saved;
            let mut r = Recorder::default();
            restore_dumpable(&mut r, &p).unwrap();
            assert_eq!(r.args_of("prctl(PR_SET_DUMPABLE)"), want, "{saved:?}");
        }
    }

    #[test]
    fn a_thread_gets_its_policy_back_before_its_credentials() {
        let mut p = img();
        p.creds.uid = [1000; 4];
        let mut th = crate::testutil::thread(101);
        let mut r = Recorder::default();
        thread_attributes(&mut r, 100, &p, &th).unwrap();
        assert!(
            r.args_of("sched_setattr").is_empty(),
            "an old image: nothing"
        );
        th.sched = Some(SchedImage {
            policy: libc::SCHED_FIFO as u32,
            flags: 0x01 | 0x20,
            nice: 0,
            priority: 10,
            ..SchedImage::default()
        });
        let mut r = Recorder::default();
        thread_attributes(&mut r, 100, &p, &th).unwrap();
        let names = r.names();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(at("sched_setattr") < at("setresuid"), "{names:?}");
        assert_eq!(r.args_of("sched_setattr")[0][0], 0, "the calling thread");
        let written = r
            .calls
            .iter()
            .find_map(|c| match c {
                crate::remote::Call::Write { data, .. } if data.len() == 56 => Some(data.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(&written[0..4], &56u32.to_le_bytes());
        assert_eq!(&written[4..8], &(libc::SCHED_FIFO as u32).to_le_bytes());
        // Reset-on-fork kept, a utilization-clamp flag dropped.
        assert_eq!(&written[8..16], &1u64.to_le_bytes());
        assert_eq!(&written[20..24], &10u32.to_le_bytes());
        assert!(r.args_of("setpriority").is_empty(), "nice 0");
        // A nice value kept under SCHED_IDLE is set on its own.
        th.sched = Some(SchedImage {
            policy: libc::SCHED_IDLE as u32,
            nice: 3,
            ..SchedImage::default()
        });
        let mut r = Recorder::default();
        thread_attributes(&mut r, 100, &p, &th).unwrap();
        assert_eq!(
            r.args_of("setpriority"),
            [vec![libc::PRIO_PROCESS as u64, 0, 3]]
        );
    }

    #[test]
    fn credentials_groups_then_gids_then_uids() {
        let mut p = img();
        let mut r = Recorder::default();
        restore_creds(&mut r, &p).unwrap();
        assert!(r.names().is_empty(), "root with no groups: nothing");
        p.creds.uid = [1000, 1000, 1000, 1000];
        p.creds.gid = [100, 100, 100, 100];
        p.creds.groups = vec![100, 27];
        let mut r = Recorder::default();
        restore_creds(&mut r, &p).unwrap();
        assert_eq!(
            r.names(),
            [
                "setgroups",
                "setresgid",
                "setfsgid",
                "setresuid",
                "setfsuid"
            ]
        );
        assert_eq!(r.args_of("setgroups")[0][0], 2);
        assert_eq!(r.args_of("setresuid"), [vec![1000, 1000, 1000]]);
    }

    #[test]
    fn pending_signals_are_queued_per_thread_and_per_process() {
        let mut p = img();
        let si = |signo: i32| SigInfo {
            signo: signo.unsigned_abs(),
            raw: vec![u8::try_from(signo).unwrap(); 128],
        };
        let mut th = crate::testutil::thread(101);
        th.pending.push(si(libc::SIGUSR1));
        p.no_new_privs = true;
        p.shared_pending.push(si(libc::SIGUSR2));
        let mut r = Recorder::default();
        thread_attributes(&mut r, 100, &p, &th).unwrap();
        let q = r.args_of("rt_tgsigqueueinfo");
        assert_eq!(q.len(), 1);
        assert_eq!(&q[0][..3], [100, 101, libc::SIGUSR1 as u64]);
        assert_eq!(r.args_of("prctl(PR_SET_NO_NEW_PRIVS)").len(), 1);
        let mut r = Recorder::default();
        shared_signals(&mut r, 100, &p).unwrap();
        let q = r.args_of("rt_sigqueueinfo");
        assert_eq!(q.len(), 1);
        assert_eq!(&q[0][..2], [100, libc::SIGUSR2 as u64]);
        assert_eq!(
            r.writes()[0],
            vec![u8::try_from(libc::SIGUSR2).unwrap(); 128]
        );
    }
}
