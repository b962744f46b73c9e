//! Freezing a process tree, and letting it go unchanged.
//!
//! Every thread of every process is seized and interrupted. Processes are
//! discovered from the root through `/proc/PID/task/TID/children` *after*
//! their parent is frozen (a frozen process cannot fork), and each process's
//! threads are listed until no new one appears, so the set converges.

use std::sync::Arc;

use stasis_kernel::escape::EscapeHatch;
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::ptrace::normalize_interrupted_syscall;
use stasis_kernel::{KernelError, Tracee, UserRegs};

use crate::SaveError;
use crate::{proc, CaptureError, Result};

/// One frozen thread and what is needed to let it go unchanged.
pub struct FrozenThread {
    pub tracee: Tracee,
    pub orig_regs: UserRegs,
    pub orig_mask: u64,
}

/// One process of the tree: its threads (main first), or a zombie.
pub struct FrozenProcess {
    pub pid: i32,
    pub ppid: i32,
    pub threads: Vec<FrozenThread>,
    /// Raw wait status of a zombie (its threads list is empty).
    pub zombie: Option<i32>,
    /// Stopped (a group stop: SIGSTOP, SIGTSTP...) before it was frozen.
    pub stopped: bool,
    /// The signal that stopped it, as its main thread's interrupt stop
    /// showed it (`None`: not stopped, or not shown).
    pub stop_signal: Option<i32>,
}

/// The frozen tree, root first, parents before children.
pub struct Frozen {
    pub procs: Vec<FrozenProcess>,
    done: bool,
}

fn list_dir_numbers(pid: i32, dir: &str) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc::proc_path(pid, dir))
        .map_err(|e| CaptureError::from_proc(pid, dir, e))?;
    let mut v: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// Children of every thread of `pid`.
fn children(pid: i32) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for tid in list_dir_numbers(pid, "task")? {
        let text =
            match std::fs::read_to_string(proc::proc_path(pid, &format!("task/{tid}/children"))) {
                Ok(t) => t,
                Err(_) => continue, // the thread exited meanwhile
            };
        out.extend(
            text.split_whitespace()
                .filter_map(|x| x.parse::<i32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn stat_of(pid: i32) -> Result<proc::Stat> {
    proc::read_parsed(pid, "stat", proc::parse_stat)
}

/// Whether thread `tid` of `pid` has exited or is exiting (its stat gone,
/// or in state `Z` or `X`).
fn thread_exiting(pid: i32, tid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) {
        Err(_) => true,
        Ok(st) => st
            .rfind(')')
            .and_then(|i| st[i + 1..].split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X"),
    }
}

/// A process whose threads were asked to stop, not yet all waited for.
struct Stopping {
    fp: FrozenProcess,
    asked: Vec<Tracee>,
    failed: Option<CaptureError>,
}

/// Seizes every thread of `pid` and asks each to stop; [`Stopping::finish`]
/// waits for them. The processes of a tree are all asked before any is
/// waited for, so that they stop together.
fn begin_freeze(pid: i32) -> Result<Stopping> {
    let stat = stat_of(pid)?;
    let mut s = Stopping {
        fp: FrozenProcess {
            pid,
            ppid: stat.ppid,
            threads: Vec::new(),
            zombie: None,
            stopped: stat.state == 'T',
            stop_signal: None,
        },
        asked: Vec::new(),
        failed: None,
    };
    if stat.state == 'Z' || stat.state == 'X' {
        s.fp.zombie = Some(stat.exit_code);
        return Ok(s);
    }
    s.ask_new();
    Ok(s)
}

impl Stopping {
    /// Asks every thread not yet traced to stop.
    fn ask_new(&mut self) {
        let pid = self.fp.pid;
        let tids = match list_dir_numbers(pid, "task") {
            Ok(t) => t,
            Err(e) => {
                self.failed = Some(e);
                return;
            }
        };
        for tid in tids {
            let known = |t: &Tracee| t.pid() == tid;
            if self.fp.threads.iter().any(|t| known(&t.tracee)) || self.asked.iter().any(known) {
                continue;
            }
            if tid != pid && stasis_kernel::procfs::is_io_worker(pid, tid) {
                continue;
            }
            let first = self.fp.threads.is_empty() && self.asked.is_empty();
            match ask_thread(pid, tid, first) {
                Ok(Asked::Thread(t)) => self.asked.push(t),
                Ok(Asked::Gone) => {}
                Ok(Asked::Zombie(code)) => {
                    self.fp.zombie = Some(code);
                    return;
                }
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            }
        }
    }

    /// Waits for every thread asked; asks the threads started meanwhile,
    /// until there is none.
    fn finish(mut self) -> Result<FrozenProcess> {
        let pid = self.fp.pid;
        while !self.asked.is_empty() || self.failed.is_some() {
            for tracee in std::mem::take(&mut self.asked) {
                let tid = tracee.pid();
                match settle(tracee) {
                    Ok(t) => self.fp.threads.push(t),
                    // A thread may exit between seize and interrupt: not part of the image.
                    Err(KernelError::Died { .. }) if tid != pid => {}
                    Err(e) => {
                        self.failed.get_or_insert(e.into());
                    }
                }
            }
            if let Some(e) = self.failed.take() {
                release_process(&mut self.fp);
                return Err(e);
            }
            if self.fp.zombie.is_some() {
                // Its threads, if any were asked, go back: a zombie has none.
                release_process(&mut self.fp);
                self.fp.threads.clear();
                return Ok(self.fp);
            }
            self.ask_new();
        }
        let mut fp = self.fp;
        if fp.zombie.is_some() {
            return Ok(fp);
        }
        // `/proc` said running, but its interrupt stop was a group stop: it
        // was on its way back into one (released a moment ago by another
        // freeze, e.g. a concurrent dump's preparation).
        fp.stop_signal = fp
            .threads
            .iter()
            .find(|t| t.tracee.pid() == pid)
            .and_then(|t| t.tracee.group_stop_signal());
        fp.stopped |= fp.stop_signal.is_some();
        fp.threads
            .sort_by_key(|t| (t.tracee.pid() != pid, t.tracee.pid()));
        if fp.threads.first().map(|t| t.tracee.pid()) != Some(pid) {
            release_process(&mut fp);
            return Err(SaveError::Unsupported {
                pid,
                what: "its main thread has exited while other threads run".into(),
            }
            .into());
        }
        Ok(fp)
    }
}

/// What asking one thread to stop found.
enum Asked {
    Thread(Tracee),
    /// A thread that exited meanwhile: not part of the image.
    Gone,
    /// The process itself had just exited (asked of its first thread).
    Zombie(i32),
}

/// Seizes `tid` of process `pid` and asks it to stop (`first`: no thread
/// of the process is traced yet).
fn ask_thread(pid: i32, tid: i32, first: bool) -> Result<Asked> {
    let mut tracee = match Tracee::seize(tid, stasis_sys::PTRACE_O_SUSPEND_SECCOMP) {
        Ok(t) => t,
        Err(KernelError::NoSuchProcess { .. }) if tid != pid => return Ok(Asked::Gone),
        // A thread on its way out (a zombie or dead thread cannot be
        // traced: EPERM, even for root): not part of the image either,
        // rather than a dump refused for want of a privilege.
        Err(KernelError::Seize { .. }) if tid != pid && thread_exiting(pid, tid) => {
            return Ok(Asked::Gone)
        }
        Err(e) if tid == pid && first => {
            // The process may have just exited: then it is a zombie.
            let st = stat_of(pid)?;
            if st.state == 'Z' {
                return Ok(Asked::Zombie(st.exit_code));
            }
            return Err(match e {
                KernelError::NoSuchProcess { pid } => CaptureError::NoSuchProcess { pid },
                e => e.into(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    match tracee.ask_stop() {
        Ok(()) => Ok(Asked::Thread(tracee)),
        Err(KernelError::Died { .. }) if tid != pid => Ok(Asked::Gone),
        Err(e) => Err(e.into()),
    }
}

/// Waits for a thread asked to stop, and reads what its release needs.
fn settle(mut tracee: Tracee) -> Result<FrozenThread, KernelError> {
    tracee.wait_interrupted()?;
    // The mask stays as it is: a thread is blocked only while it runs
    // remote syscalls (see `FrozenProcess::arm_remote`), so a dumper that
    // dies leaves every other thread untouched.
    let orig_mask = tracee.sigmask()?;
    let orig_regs = tracee.regs()?;
    Ok(FrozenThread {
        tracee,
        orig_regs,
        orig_mask,
    })
}

/// A process that exited while it was being frozen, as the zombie it
/// becomes (`None` if it is already reaped).
fn zombie_after_exit(pid: i32) -> Option<FrozenProcess> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_millis(500) {
        let st = stat_of(pid).ok()?;
        if st.state == 'Z' || st.state == 'X' {
            return Some(FrozenProcess {
                pid,
                ppid: st.ppid,
                threads: Vec::new(),
                zombie: Some(st.exit_code),
                stopped: false,
                stop_signal: None,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

/// Freezes `root` and all its descendants.
pub fn freeze_tree(root: i32) -> Result<Frozen> {
    freeze_tree_except(root, &[])
}

/// Like [`freeze_tree`], leaving out the processes in `except` (and their
/// descendants): the snapshots of a concurrent dump, already traced.
pub fn freeze_tree_except(root: i32, except: &[i32]) -> Result<Frozen> {
    let mut f = Frozen {
        procs: Vec::new(),
        done: false,
    };
    let mut queue = vec![root];
    while !queue.is_empty() {
        // One generation at a time: every process of it asked to stop,
        // then each waited for (a parent stopped forks no more children).
        let mut begun = Vec::new();
        let mut failed = None;
        for pid in queue {
            if f.procs.iter().any(|p| p.pid == pid) || except.contains(&pid) {
                continue;
            }
            match begin_freeze(pid) {
                Ok(s) => begun.push(s),
                // A child that vanished (reaped meanwhile) is not part of the tree.
                Err(CaptureError::NoSuchProcess { .. }) if pid != root => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let mut next = Vec::new();
        for s in begun {
            let pid = s.fp.pid;
            let fp = match s.finish() {
                Ok(fp) => fp,
                Err(CaptureError::NoSuchProcess { .. }) if pid != root => continue,
                // A child that was exiting while it was frozen: it is a
                // zombie now (its parent has not reaped it), or gone.
                Err(CaptureError::Kernel(KernelError::Died { .. })) if pid != root => {
                    match zombie_after_exit(pid) {
                        Some(fp) => fp,
                        None => continue,
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            if fp.zombie.is_none() && failed.is_none() {
                match children(pid) {
                    Ok(c) => next.extend(c),
                    Err(e) => failed = Some(e),
                }
            }
            f.procs.push(fp);
        }
        if let Some(e) = failed {
            // Everything frozen so far goes back (`Frozen`'s drop).
            return Err(e);
        }
        queue = next;
    }
    Ok(f)
}

/// How long a process stopped by job control may take to be back in its
/// group stop after its release.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Puts every thread back (signal mask first, then registers: a thread
/// parked on the escape hatch escapes by itself if we die in between) and
/// detaches; then wipes the hatch, which no thread uses any more.
fn release_process(p: &mut FrozenProcess) -> Option<KernelError> {
    let mut first_err = None;
    for t in &mut p.threads {
        let mut regs = t.orig_regs;
        normalize_interrupted_syscall(&mut regs, true);
        let r = t
            .tracee
            .set_sigmask(t.orig_mask)
            .and_then(|()| t.tracee.set_regs(&regs))
            .and_then(|()| t.tracee.detach());
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    if first_err.is_none() {
        if let Some(h) = p.threads.first().and_then(|t| t.tracee.hatch()) {
            h.forget();
            h.remove();
        }
    }
    first_err
}

impl FrozenProcess {
    /// Makes the process ready for remote syscalls: the `syscall`
    /// instruction to use and, where its vDSO has room, an escape hatch
    /// (`stasis_kernel::escape`) for every thread, so that a dumper killed
    /// at any instant leaves the process as it was. Without a hatch, every
    /// thread's signals are blocked until release, as before.
    pub fn arm_remote(&mut self, mem: &ProcessMemory, maps: &[proc::MapsEntry]) -> Result<()> {
        let Some(first) = self.threads.first() else {
            return Ok(());
        };
        if first.tracee.syscall_insn().is_some() {
            return Ok(());
        }
        let pid = self.pid;
        let vdso = maps.iter().find(|m| m.name == "[vdso]");
        // A thread of a killed dump may still be running its escape code
        // (it waits for a snapshot to die, say): installing a hatch now
        // would rewrite the code under it.
        if let Some(v) = vdso {
            if self
                .threads
                .iter()
                .any(|t| stasis_kernel::escape::in_block(t.orig_regs.rip, v.start, v.end))
            {
                return Err(CaptureError::Escaping { pid });
            }
        }
        let insn = crate::memory::find_syscall_insn(mem, maps)
            .ok_or(KernelError::NoSyscallInsn { pid })?;
        let hatch = match vdso {
            Some(v) => EscapeHatch::install(pid, v.start, v.end)?.map(Arc::new),
            None => None,
        };
        if hatch.is_none() {
            tracing::debug!(
                pid,
                "no room for an escape hatch in the vDSO: signals blocked"
            );
        }
        for t in &mut self.threads {
            t.tracee.set_syscall_insn(insn);
            match &hatch {
                Some(h) => t.tracee.set_hatch(Arc::clone(h)),
                None => {
                    t.tracee.block_all_signals()?;
                }
            }
        }
        Ok(())
    }
}

impl Frozen {
    /// The pids of the processes that are not zombies.
    pub fn live_pids(&self) -> Vec<i32> {
        self.procs
            .iter()
            .filter(|p| p.zombie.is_none())
            .map(|p| p.pid)
            .collect()
    }

    /// The live processes that were stopped before they were frozen.
    pub fn stopped_pids(&self) -> Vec<i32> {
        self.procs
            .iter()
            .filter(|p| p.zombie.is_none() && p.stopped)
            .map(|p| p.pid)
            .collect()
    }

    /// Holds every thread of the processes `pids` ([`Tracee::hold`]): a
    /// dumper that dies from now on lets them go only to stop, until the
    /// socket guard continues them. The release takes the holds back.
    ///
    /// [`Tracee::hold`]: stasis_kernel::Tracee::hold
    pub fn hold(&mut self, pids: &[i32]) -> Result<(), KernelError> {
        for p in self.procs.iter_mut().filter(|p| pids.contains(&p.pid)) {
            for t in &mut p.threads {
                t.tracee.hold(p.pid)?;
            }
        }
        Ok(())
    }

    /// Puts every thread back as it was (an interrupted syscall set up to
    /// restart) and detaches.
    pub fn release(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut first_err = None;
        // Children first, so a parent never runs while its children are
        // stopped; and those stopped by job control before all, each seen
        // back in its group stop (a detached thread re-enters it only when
        // next scheduled) before the others run and may look at it.
        let stopped = self.stopped_pids();
        for pass_stopped in [true, false] {
            for p in self.procs.iter_mut().rev() {
                if stopped.contains(&p.pid) != pass_stopped {
                    continue;
                }
                if let Some(e) = release_process(p) {
                    first_err.get_or_insert(e);
                }
            }
            if pass_stopped && first_err.is_none() {
                for pid in stasis_kernel::procfs::wait_group_stopped(&stopped, STOP_WAIT) {
                    tracing::warn!(pid, "not seen back in its group stop after the release");
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Kills every process of the tree (after a committed dump) and waits
    /// until each is really dead (a zombie or gone), so that the caller can
    /// restore at the same PIDs right away.
    pub fn kill(&mut self) {
        self.done = true;
        for p in &mut self.procs {
            if p.zombie.is_none() {
                // The process we just dumped (a failure: it is gone already).
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            for t in &mut p.threads {
                t.tracee.forget();
            }
        }
        let t0 = std::time::Instant::now();
        // Our traced threads' zombies wait for us: reaped here, the other
        // threads before their leader, whose exit then goes on to its
        // parent (unless that is us, the caller, which reaps it).
        let deadline = t0 + std::time::Duration::from_secs(10);
        let me = std::process::id();
        // Descendants first: the init of a PID namespace (a root in one of
        // its own) finishes exiting only once every process in it is
        // reaped, and ours are reaped by us.
        for p in self.procs.iter().rev().filter(|p| p.zombie.is_none()) {
            let ours = stasis_kernel::procfs::stat(p.pid)
                .is_ok_and(|s| u32::try_from(s.ppid).ok() == Some(me));
            for t in p.threads.iter().rev() {
                if t.tracee.pid() != p.pid || !ours {
                    stasis_kernel::ptrace::reap_killed(t.tracee.pid(), deadline);
                }
            }
        }
        for p in self.procs.iter().filter(|p| p.zombie.is_none()) {
            while t0.elapsed() < std::time::Duration::from_secs(10) {
                if stasis_kernel::procfs::gone_or_zombie(p.pid) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.release();
        }
    }
}
