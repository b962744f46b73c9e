//! The stub and the tree: the root stub's clean slate (control page, no
//! mappings, no fds but the transport), every process forked by its parent,
//! sessions, process groups, and zombies.

use stasis_image::manifest::ProcessImage;
use stasis_kernel::{sarg, KernelError, Tracee};
use stasis_sys as sys;

use crate::build::{self, step};
use crate::pipeline::{Build, Record, Transport};
use crate::proc::{Proc, CTL_SIZE, TASK_TOP};
use crate::remote::Remote;
use crate::ObjectError;
use crate::{files, tree, Result};

/// The root stub: traced with every option, signals blocked, CPU features
/// checked, the control page mapped, then a clean slate.
pub(crate) fn prepare_root(b: &mut Build<'_>) -> Result<()> {
    let m = b.m;
    let h = b.transport.h;
    let setsid = b.plan.setsid[0];
    let root = b.root()?;
    root.t
        .set_options(
            sys::PTRACE_O_EXITKILL
                | sys::PTRACE_O_TRACECLONE
                | sys::PTRACE_O_TRACEFORK
                | sys::PTRACE_O_SUSPEND_SECCOMP,
        )
        .map_err(step("tracing process and thread creation"))?;
    root.t
        .set_sigmask(!0)
        .map_err(step("blocking signals in the stub"))?;

    // CPU features: the image may only use what this CPU has.
    let cpu_x = stasis_kernel::probe::xfeatures_of(&root.t.xstate()?);
    let img_x = m.host.xfeatures;
    if img_x & !cpu_x != 0 {
        return Err(ObjectError::Incompatible(format!(
            "the image uses CPU state components {:#x} that this CPU lacks (it has {cpu_x:#x})",
            img_x & !cpu_x
        ))
        .into());
    }

    // Control area, free in the stub's layout and in every process's.
    let mut busy: Vec<(u64, u64)> = stasis_kernel::procfs::maps(root.t.pid())
        .map_err(KernelError::from)?
        .iter()
        .map(|m| (m.start, m.end))
        .collect();
    busy.extend(
        m.processes
            .iter()
            .flat_map(|p| p.vmas.iter().map(|v| (v.start, v.end))),
    );
    let ctl = build::find_gap(&busy, CTL_SIZE)
        .ok_or_else(|| ObjectError::Layout("no free address range for the control page".into()))?;
    map_control_page(root, ctl)?;
    root.mem
        .write(ctl, &[0x0f, 0x05, 0xcc])
        .map_err(step("writing the syscall instruction"))?;
    root.t.set_syscall_insn(ctl);
    root.ctl = ctl;

    // The stub inherited stasis's rseq registration; its area is about to
    // be unmapped, and the kernel would fault writing to it.
    if let Some(c) = root.t.rseq_config()? {
        root.sys(
            "rseq",
            libc::SYS_rseq,
            &[
                c.rseq_abi_pointer,
                u64::from(c.rseq_abi_size),
                sys::RSEQ_FLAG_UNREGISTER,
                u64::from(c.signature),
            ],
        )
        .map_err(step("unregistering the stub's rseq area"))?;
    }
    clean_slate(root, ctl, h)?;
    if setsid {
        root.sys("setsid", libc::SYS_setsid, &[])
            .map_err(step("becoming a session leader"))?;
    }
    Ok(())
}

/// Maps the control area (RWX, never over anything) at `ctl`.
fn map_control_page<R: Remote>(r: &mut R, ctl: u64) -> Result<()> {
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let fl = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    let got = r
        .sys(
            "mmap",
            libc::SYS_mmap,
            &[ctl, CTL_SIZE, rwx, fl, u64::MAX, 0],
        )
        .map_err(step("mapping the control page"))?;
    if got != ctl {
        return Err(
            ObjectError::Layout(format!("control page landed at {got:#x}, not {ctl:#x}")).into(),
        );
    }
    Ok(())
}

/// Clean slate: no mappings but the control area at `ctl`, no fds but the
/// transport at `h`.
pub(crate) fn clean_slate<R: Remote>(r: &mut R, ctl: u64, h: u64) -> Result<()> {
    r.sys("munmap", libc::SYS_munmap, &[0, ctl])
        .map_err(step("unmapping the stub below the control page"))?;
    r.sys(
        "munmap",
        libc::SYS_munmap,
        &[ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE],
    )
    .map_err(step("unmapping the stub above the control page"))?;
    r.sys("close_range", sys::SYS_CLOSE_RANGE, &[0, h - 1, 0])
        .map_err(step("closing the stub's fds"))?;
    r.sys(
        "close_range",
        sys::SYS_CLOSE_RANGE,
        &[h + 1, u64::from(u32::MAX), 0],
    )
    .map_err(step("closing the stub's fds"))?;
    Ok(())
}

/// A fresh stub holds only the transport at `h`: the next number is free.
pub(crate) fn spare_fd(h: u64) -> Result<i32> {
    Ok(i32::try_from(h + 1).map_err(|_| ObjectError::Layout("fd number overflow".into()))?)
}

/// Process `i` of the tree (not the root), forked by its parent (sharing
/// its fd table where it did: `CLONE_FILES`) once the parent's memory is
/// built, so that it starts with the parent's pages (see
/// [`crate::inherit`]). A session leader calls `setsid()` at once, and
/// takes its controlling terminal (a saved pty) before it forks the
/// members of its session, which so have it too.
pub(crate) fn fork_one(
    records: &mut [Record<'_>],
    plan: &tree::Plan,
    transport: &Transport,
    i: usize,
    factory: &mut files::FdFactory<'_>,
) -> Result<()> {
    let img = records[i].img;
    let h = transport.h;
    let spare = spare_fd(h)?;
    // Its parent, or the sibling whose fd table it shares (CLONE_PARENT).
    let parent =
        plan.forker.get(i).copied().flatten().ok_or_else(|| {
            ObjectError::Inconsistent(format!("process {} has no parent", img.pid))
        })?;
    let ppid = records[parent].img.pid;
    let parent_proc = records[parent]
        .proc
        .as_mut()
        .ok_or_else(|| ObjectError::Inconsistent(format!("process {ppid} was not created")))?;
    let ctl = parent_proc.ctl;
    parent_proc.cur = None;
    if plan.by_sibling(i) {
        build::fork_sibling_sharing_files(parent_proc, img.pid)?;
    } else if plan.share_files[i] {
        // (A relay too: it unshares once every process is forked.)
        build::fork_process_sharing_files(parent_proc, img.pid)?;
    } else {
        build::fork_process(parent_proc, img.pid)?;
    }
    let outer = parent_proc.t.take_new_task().unwrap_or(img.pid);
    let t = Tracee::adopt_new_thread(outer)
        .map_err(step(format!("taking over new process {}", img.pid)))?;
    // Recorded at once: a failure from here on kills it with the tree.
    let p = records[i].proc.insert(Proc::adopt(t, ctl, img.pid)?);
    if plan.setsid[i] {
        p.sys("setsid", libc::SYS_setsid, &[])
            .map_err(step(format!("making process {} a session leader", img.pid)))?;
        // Its terminal now, before it forks the session's members.
        factory.take_ctty(p, img.pid, (&transport.sock, h, spare))?;
    }
    Ok(())
}

/// Relays ([`tree::Plan::relay`]) take their own fd tables back, once
/// every process is forked (copies: no fd is made yet).
pub(crate) fn unshare_relays(records: &mut [Record<'_>], plan: &tree::Plan) -> Result<()> {
    for (i, r) in records.iter_mut().enumerate() {
        if !plan.relay[i] {
            continue;
        }
        let pid = r.img.pid;
        r.proc_mut()?
            .sys("unshare", libc::SYS_unshare, &[libc::CLONE_FILES as u64])
            .map_err(step(format!("giving process {pid} its own fd table back")))?;
    }
    Ok(())
}

/// A process forked from its built parent: everything unmapped but the
/// control area at `ctl` and the areas it keeps (`keep`, sorted).
pub(crate) fn keep_only<R: Remote>(r: &mut R, ctl: u64, keep: &[(u64, u64)]) -> Result<()> {
    let mut kept = keep.to_vec();
    kept.push((ctl, ctl + CTL_SIZE));
    kept.sort_unstable();
    kept.push((TASK_TOP, TASK_TOP));
    let mut at = 0;
    for (a, b) in kept {
        if a > at {
            r.sys("munmap", libc::SYS_munmap, &[at, a - at])
                .map_err(step(format!(
                    "unmapping {at:#x}-{a:#x} of what the process inherited"
                )))?;
        }
        at = at.max(b);
    }
    Ok(())
}

/// Process groups, once the whole tree exists: leaders first (with a
/// helper at the PID of each leader that had exited), then members; then
/// the helpers exit and are reaped.
pub(crate) fn set_groups(b: &mut Build<'_>) -> Result<()> {
    let m = b.m;
    let mut helpers = Vec::new();
    for &(pgid, forker) in &b.plan.helpers {
        helpers.push((group_helper(b, pgid, forker)?, forker));
    }
    for pass in 0..2 {
        for i in 0..b.records.len() {
            let group = b.plan.group[i];
            let p = b.proc_mut(i)?;
            let pid = p.pid;
            group_call(p, pid, pass, group)?;
        }
    }
    for (mut h, forker) in helpers {
        let pgid = h.pid;
        make_zombie(&mut h, 0)?;
        let f = b.proc_mut(forker)?;
        f.cur = None;
        f.sys("wait4", libc::SYS_wait4, &[sarg(i64::from(pgid)), 0, 0, 0])
            .map_err(step(format!("reaping the helper that led group {pgid}")))?;
        drop_sigchld(f, &m.processes[forker])?;
    }
    Ok(())
}

/// A helper process at PID `pgid`, forked by process `forker` (a member of
/// group `pgid`, whose leader had exited), leading a new group `pgid`.
fn group_helper(b: &mut Build<'_>, pgid: i32, forker: usize) -> Result<Proc> {
    let ctl = b.root()?.ctl;
    let f = b.proc_mut(forker)?;
    f.cur = None;
    build::fork_process(f, pgid)?;
    let outer = f.t.take_new_task().unwrap_or(pgid);
    let t = Tracee::adopt_new_thread(outer)
        .map_err(step(format!("taking over the helper for group {pgid}")))?;
    let mut h = Proc::adopt(t, ctl, pgid)?;
    h.sys("setpgid", libc::SYS_setpgid, &[0, 0])
        .map_err(step(format!("making the helper lead group {pgid}")))?;
    Ok(h)
}

/// What process `pid` does about its group in `pass` (0: leaders, 1:
/// members).
pub(crate) fn group_call<R: Remote>(
    r: &mut R,
    pid: i32,
    pass: u32,
    group: tree::Group,
) -> Result<()> {
    match (pass, group) {
        (0, tree::Group::Own) => {
            r.sys("setpgid", libc::SYS_setpgid, &[0, 0])
                .map_err(step(format!("making process {pid} a group leader")))?;
        }
        (1, tree::Group::Join(g)) => {
            r.sys("setpgid", libc::SYS_setpgid, &[0, sarg(i64::from(g))])
                .map_err(step(format!("moving process {pid} into group {g}")))?;
        }
        _ => {}
    }
    Ok(())
}

/// Zombies: exit with the saved status (their parents reap them later).
pub(crate) fn make_zombies(b: &mut Build<'_>) -> Result<()> {
    let m = b.m;
    for (i, img) in m.processes.iter().enumerate() {
        if let Some(status) = img.zombie {
            make_zombie(b.proc_mut(i)?, status)?;
            let parent = b.plan.parent[i].unwrap_or(0);
            drop_sigchld(b.proc_mut(parent)?, &m.processes[parent])?;
        }
    }
    Ok(())
}

/// How a zombie-to-be ends: the syscall, its arguments, and what it is
/// called in messages. Dying of a signal first needs the preparation of
/// [`prepare_signal_death`].
pub(crate) fn zombie_exit(pid: i32, status: i32) -> (i64, Vec<u64>, &'static str) {
    if libc::WIFSIGNALED(status) {
        (
            libc::SYS_kill,
            vec![
                sarg(i64::from(pid)),
                sarg(i64::from(libc::WTERMSIG(status))),
            ],
            "killing a zombie-to-be",
        )
    } else {
        (
            libc::SYS_exit_group,
            vec![sarg(i64::from(libc::WEXITSTATUS(status)))],
            "exiting a zombie-to-be",
        )
    }
}

/// To die of signal `sig`: no core dump, the default action.
pub(crate) fn prepare_signal_death<R: Remote>(r: &mut R, sig: i32) -> Result<()> {
    let a = r
        .put(build::SCRATCH_STRUCT, &build::words(&[0, 0]))
        .map_err(step("rlimit"))?;
    r.sys(
        "prlimit64",
        libc::SYS_prlimit64,
        &[0, libc::RLIMIT_CORE.into(), a, 0],
    )
    .map_err(step("disabling core dumps of a zombie"))?;
    if sig == libc::SIGKILL || sig == libc::SIGSTOP {
        // Always at their default action (rt_sigaction refuses them).
        return Ok(());
    }
    let act = r
        .put(build::SCRATCH_STRUCT, &build::words(&[0, 0, 0, 0]))
        .map_err(step("sigaction"))?;
    r.sys(
        "rt_sigaction",
        libc::SYS_rt_sigaction,
        &[sarg(i64::from(sig)), act, 0, 8],
    )
    .map_err(step("resetting a signal"))?;
    Ok(())
}

/// Makes a stub exit with the wait status `status` (a zombie until its
/// parent reaps it).
fn make_zombie(p: &mut Proc, status: i32) -> Result<()> {
    p.live = false;
    if libc::WIFSIGNALED(status) {
        prepare_signal_death(p, libc::WTERMSIG(status))?;
        p.t.set_sigmask(0)
            .map_err(step("unblocking signals of a zombie"))?;
    }
    let (nr, args, what) = zombie_exit(p.pid, status);
    match p.t.syscall_raw(&p.base, nr, &args) {
        Err(KernelError::Died { .. }) => {
            p.t.forget();
            Ok(())
        }
        // The stop at the exit of `kill` comes before the signal is taken
        // (its delivery would be one more ptrace stop): let go, the thread
        // takes it and dies.
        Ok(_) if libc::WIFSIGNALED(status) => {
            p.t.detach()
                .map_err(step(format!("letting zombie-to-be {} die", p.pid)))?;
            wait_zombie(p.pid)
        }
        Ok(r) => Err(ObjectError::Layout(format!(
            "{what} {}: it did not exit (result {r})",
            p.pid
        ))
        .into()),
        Err(e) => Err(ObjectError::Step {
            what: format!("{what} {}", p.pid),
            source: e,
        }
        .into()),
    }
}

/// Waits (up to 5 s) for `pid` to be a zombie.
fn wait_zombie(pid: i32) -> Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        if state == Some('Z') {
            return Ok(());
        }
        if t0.elapsed() > std::time::Duration::from_secs(5) {
            return Err(ObjectError::Layout(format!(
                "zombie-to-be {pid} did not die of its signal (state {state:?})"
            ))
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether a parent whose child was made a zombie keeps that child's
/// SIGCHLD: only if it had one pending in the image.
pub(crate) fn keeps_sigchld(img: &ProcessImage) -> bool {
    let chld = libc::SIGCHLD.unsigned_abs();
    img.shared_pending
        .iter()
        .chain(img.threads.iter().flat_map(|t| t.pending.iter()))
        .any(|s| s.signo == chld)
}

/// Consumes the SIGCHLD a rebuilt zombie sent to its parent, unless the
/// parent had one pending in the image.
fn drop_sigchld(parent: &mut Proc, img: &ProcessImage) -> Result<()> {
    if keeps_sigchld(img) {
        return Ok(());
    }
    let chld = libc::SIGCHLD.unsigned_abs();
    parent.cur = None;
    let set = parent
        .put(build::SCRATCH_STRUCT, &(1u64 << (chld - 1)).to_le_bytes())
        .map_err(step("sigset"))?;
    let ts = parent
        .put(build::SCRATCH_STRUCT + 64, &build::words(&[0, 0]))
        .map_err(step("timespec"))?;
    // EAGAIN when nothing is pending is fine.
    let _ = parent
        .t
        .syscall_raw(&parent.base, libc::SYS_rt_sigtimedwait, &[set, 0, ts, 8]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;
    use stasis_image::manifest::SigInfo;

    #[test]
    fn clean_slate_keeps_only_the_control_area_and_the_transport() {
        let mut r = Recorder::default();
        let ctl = 0x5000_0000_0000;
        clean_slate(&mut r, ctl, 40).unwrap();
        assert_eq!(
            r.names(),
            ["munmap", "munmap", "close_range", "close_range"]
        );
        assert_eq!(
            r.args_of("munmap"),
            [
                vec![0, ctl],
                vec![ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE]
            ]
        );
        assert_eq!(
            r.args_of("close_range"),
            [vec![0, 39, 0], vec![41, u64::from(u32::MAX), 0]]
        );
    }

    #[test]
    fn a_forked_child_keeps_only_its_inherited_areas_and_the_control_area() {
        let mut r = Recorder::default();
        let ctl = 0x5000_0000_0000;
        keep_only(
            &mut r,
            ctl,
            &[(0x1000, 0x3000), (0x3000, 0x4000), (0x7000, 0x9000)],
        )
        .unwrap();
        assert_eq!(
            r.args_of("munmap"),
            [
                vec![0, 0x1000],
                vec![0x4000, 0x3000],
                vec![0x9000, ctl - 0x9000],
                vec![ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE]
            ]
        );
        // Nothing kept: the clean slate of the root.
        let mut r = Recorder::default();
        keep_only(&mut r, ctl, &[]).unwrap();
        assert_eq!(
            r.args_of("munmap"),
            [
                vec![0, ctl],
                vec![ctl + CTL_SIZE, TASK_TOP - ctl - CTL_SIZE]
            ]
        );
        let mut r = Recorder {
            fail_on: Some(("munmap", libc::EINVAL)),
            ..Recorder::default()
        };
        let e = keep_only(&mut r, ctl, &[]).unwrap_err();
        assert!(e.to_string().contains("what the process inherited"), "{e}");
    }

    #[test]
    fn clean_slate_failure_names_the_step() {
        let mut r = Recorder {
            fail_on: Some(("close_range", libc::EBADF)),
            ..Recorder::default()
        };
        let e = clean_slate(&mut r, 0x5000_0000_0000, 40).unwrap_err();
        assert!(e.to_string().contains("closing the stub's fds"), "{e}");
    }

    #[test]
    fn leaders_form_their_groups_in_the_first_pass_members_join_in_the_second() {
        let mut r = Recorder::default();
        for pass in 0..2 {
            group_call(&mut r, 101, pass, tree::Group::Own).unwrap();
            group_call(&mut r, 102, pass, tree::Group::Join(101)).unwrap();
            group_call(&mut r, 103, pass, tree::Group::Keep).unwrap();
        }
        assert_eq!(r.args_of("setpgid"), [vec![0, 0], vec![0, 101]]);
        let mut r = Recorder {
            fail_on: Some(("setpgid", libc::EPERM)),
            ..Recorder::default()
        };
        let e = group_call(&mut r, 102, 1, tree::Group::Join(101)).unwrap_err();
        assert!(
            e.to_string().contains("moving process 102 into group 101"),
            "{e}"
        );
    }

    #[test]
    fn a_zombie_exits_with_its_status_or_dies_of_its_signal() {
        // exit(3): wait status 3 << 8.
        let (nr, args, _) = zombie_exit(200, 3 << 8);
        assert_eq!((nr, args), (libc::SYS_exit_group, vec![3]));
        // Killed by SIGTERM: the process signals itself.
        let (nr, args, what) = zombie_exit(200, libc::SIGTERM);
        assert_eq!(nr, libc::SYS_kill);
        assert_eq!(args, vec![200, libc::SIGTERM as u64]);
        assert!(what.contains("killing"));
        // Before that: no core dump, the signal's default action.
        let mut r = Recorder::default();
        prepare_signal_death(&mut r, libc::SIGTERM).unwrap();
        assert_eq!(r.names(), ["prlimit64", "rt_sigaction"]);
        assert_eq!(r.args_of("prlimit64")[0][1], libc::RLIMIT_CORE as u64);
        assert_eq!(r.args_of("rt_sigaction")[0][0], libc::SIGTERM as u64);
        assert_eq!(r.writes()[0], vec![0; 16]);
        // Killed by SIGKILL: its action cannot (and need not) be reset.
        let mut r = Recorder::default();
        prepare_signal_death(&mut r, libc::SIGKILL).unwrap();
        assert_eq!(r.names(), ["prlimit64"]);
    }

    #[test]
    fn a_parent_keeps_a_sigchld_only_if_it_had_one_pending() {
        let mut img = crate::testutil::image(100, 1, 100, 100);
        img.threads.push(crate::testutil::thread(100));
        assert!(!keeps_sigchld(&img));
        let chld = SigInfo {
            signo: libc::SIGCHLD.unsigned_abs(),
            raw: vec![0; 128],
        };
        img.threads[0].pending.push(chld.clone());
        assert!(keeps_sigchld(&img));
        img.threads[0].pending.clear();
        img.shared_pending.push(chld);
        assert!(keeps_sigchld(&img));
    }
}
