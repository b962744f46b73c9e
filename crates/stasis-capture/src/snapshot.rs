//! Copy-on-write snapshots for concurrent dumps.
//!
//! While the tree is frozen, each process forks once, by a remote `clone`
//! run by its main thread: the child is a copy-on-write image of the
//! parent's memory at the freeze instant. The tree is then released and
//! runs on; the dumper reads the pages from the child, which never runs
//! (it is auto-attached by ptrace and stays in its first stop), and frees
//! them in the child as it goes (`MADV_DONTNEED` by a remote syscall), so a
//! page the process writes afterwards no longer needs a copy. The kernel
//! does the copy-before-write: a write costs the process one copy-on-write
//! fault, reads cost nothing.
//!
//! Why not a synchronous userfaultfd write-protect with a handler: the
//! kernel reports `munmap` to a userfaultfd only after the pages are gone,
//! so a process that unmaps memory during the copy would lose pages the
//! image needs. A fork snapshot keeps every page of the freeze instant,
//! whatever the process maps, unmaps, remaps or madvises meanwhile.
//!
//! The child:
//! * is created with `CLONE_FILES` (it shares the fd table, so it holds no
//!   extra reference on any file: a pipe closed by the process sees EOF as
//!   usual) and an exit signal of 0 (its parent gets no `SIGCHLD`, and
//!   `wait` without `__WALL` does not see it);
//! * has `PTRACE_O_EXITKILL`: if the dumper dies, so does the child;
//! * once killed, is reaped by its parent through a remote `wait4` during a
//!   brief second stop of the tree. If the dumper is killed first, the
//!   dump guard ([`crate::guard`]) does that instead.
//!
//! What a fork does not copy is read while the tree is frozen: shared
//! memory (the child shares it), areas with `MADV_DONTFORK` (`dc`) or
//! `MADV_WIPEONFORK` (`wf`).

use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::{KernelError, Tracee, UserRegs};
use stasis_sys as sys;

use crate::freeze::FrozenProcess;
use crate::Result;
use crate::SaveError;

/// A stopped copy-on-write child of a process of the tree.
pub struct Snapshot {
    /// The child's pid.
    pub pid: i32,
    /// The process it is a copy of.
    pub parent: i32,
    tracee: Tracee,
    regs: UserRegs,
    live: bool,
}

/// Bytes of memory only the snapshot `pid` holds now: pages the process
/// wrote since the freeze (`Private_Clean + Private_Dirty` of
/// `/proc/PID/smaps_rollup`; its page walk covers only what is not yet
/// saved, the rest being dropped as the copy goes).
pub fn private_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(stasis_kernel::procfs::path(pid, "smaps_rollup"))
        .map(|t| stasis_kernel::procfs::parse_private_bytes(&t))
        .unwrap_or(0)
}

/// Forks a snapshot of the frozen process `fp`.
pub fn take(fp: &mut FrozenProcess) -> Result<Snapshot> {
    let parent = fp.pid;
    let main = &mut fp.threads[0];
    let insn = main
        .tracee
        .syscall_insn()
        .ok_or(KernelError::NoSyscallInsn { pid: parent })?;
    main.tracee
        .set_options(sys::PTRACE_O_SUSPEND_SECCOMP | sys::PTRACE_O_TRACECLONE)?;
    let forked = main.tracee.syscall(
        &main.orig_regs,
        "clone (copy-on-write snapshot)",
        libc::SYS_clone,
        &[libc::CLONE_FILES as u64, 0, 0, 0, 0],
    );
    let restored = main.tracee.set_options(sys::PTRACE_O_SUSPEND_SECCOMP);
    forked?;
    restored?;
    let pid = main
        .tracee
        .take_new_task()
        .ok_or_else(|| SaveError::Unsupported {
            pid: parent,
            what: "the snapshot fork reported no child".into(),
        })?;
    crate::guard::snapshot_made(parent, pid);
    let mut tracee = Tracee::adopt_new_thread(pid)?;
    tracee.set_options(sys::PTRACE_O_EXITKILL | sys::PTRACE_O_SUSPEND_SECCOMP)?;
    tracee.set_syscall_insn(insn);
    let regs = tracee.regs()?;
    Ok(Snapshot {
        pid,
        parent,
        tracee,
        regs,
        live: true,
    })
}

impl Snapshot {
    /// The snapshot's memory (read through `/proc/PID/mem`, which does not
    /// unshare the pages it reads).
    pub fn memory(&self) -> Result<ProcessMemory> {
        Ok(ProcessMemory::open_for_snapshot(self.pid)?)
    }

    /// Frees the pages of `[start, start + len)` in the snapshot (they are
    /// saved): the process's next write there needs no copy.
    pub fn release_range(&mut self, start: u64, len: u64) -> Result<()> {
        self.tracee.syscall(
            &self.regs,
            "madvise (snapshot)",
            libc::SYS_madvise,
            &[start, len, libc::MADV_DONTNEED as u64],
        )?;
        Ok(())
    }

    /// Kills the snapshot and collects its exit as its tracer. Its parent
    /// still has to reap it ([`reap`]).
    pub fn kill(&mut self) {
        if !self.live {
            return;
        }
        self.live = false;
        // The stopped child this dump created.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = stasis_kernel::ptrace::wait_raw(self.pid);
        self.tracee.forget();
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reaps killed snapshots: stops the tree of `root` briefly and has each
/// parent `wait4` for its snapshot. Returns the time the tree was stopped,
/// in microseconds.
pub fn reap(root: i32, snapshots: &[(i32, i32)]) -> Result<u64> {
    if snapshots.is_empty() {
        return Ok(0);
    }
    let t0 = std::time::Instant::now();
    let mut f = crate::freeze::freeze_tree(root)?;
    let mut first_err = None;
    for fp in f.procs.iter_mut().filter(|p| p.zombie.is_none()) {
        let pid = fp.pid;
        for &(_, child) in snapshots.iter().filter(|(p, _)| *p == pid) {
            match wait_in(fp, child) {
                Ok(()) => crate::guard::snapshot_reaped(pid, child),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    f.release()?;
    let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
    first_err.map_or(Ok(us), Err)
}

fn wait_in(fp: &mut FrozenProcess, child: i32) -> Result<()> {
    let pid = fp.pid;
    let mem = ProcessMemory::open(pid)?;
    let maps = crate::proc::read_parsed(pid, "maps", crate::proc::parse_maps)?;
    fp.arm_remote(&mem, &maps)?;
    let main = &mut fp.threads[0];
    main.tracee.syscall(
        &main.orig_regs,
        "wait4 (snapshot)",
        libc::SYS_wait4,
        &[
            stasis_kernel::sarg(i64::from(child)),
            0,
            libc::__WALL as u64,
            0,
        ],
    )?;
    Ok(())
}
