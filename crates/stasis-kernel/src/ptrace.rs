//! A traced thread: freeze, registers, signal state and remote syscalls.
//!
//! # Remote syscalls
//! A stopped tracee can be made to run one syscall on our behalf: point its
//! `rip` at a `syscall` instruction that exists in its address space, load
//! `rax` and the argument registers, resume with `PTRACE_SYSCALL` to the
//! syscall-entry stop and again to the syscall-exit stop, and read `rax`.
//! `orig_rax` is set to -1 in the injected registers so that the kernel's
//! syscall-restart logic never rewrites them. The caller saves the thread's
//! own registers first and puts them back at the end ([`Tracee::set_regs`]).
//!
//! Signals must not disturb an injected syscall: [`Tracee::block_all_signals`]
//! sets the thread's mask to "everything blocked" through `PTRACE_SETSIGMASK`
//! (signals that arrive meanwhile stay pending and are part of the state we
//! record), and the caller restores the original mask when done.

use std::io;

use nix::errno::Errno;
use stasis_sys::{self as sys, UserRegs};

use crate::escape::EscapeHatch;
use crate::{last_err, KernelError, Result};
use std::sync::Arc;

mod batch;

/// Why a tracee is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// `PTRACE_EVENT_STOP` (after `PTRACE_INTERRUPT`, or a group stop).
    EventStop,
    /// Syscall entry or exit stop (`SIGTRAP | 0x80`).
    Syscall,
    /// Signal-delivery stop for this signal.
    Signal(i32),
    /// Another ptrace event (`status >> 16`).
    Event(i32),
}

/// A thread under `ptrace`. Detaches on drop (leaving it running) unless
/// [`Tracee::detach`] or [`Tracee::forget`] was called.
#[derive(Debug)]
pub struct Tracee {
    pid: i32,
    syscall_insn: Option<u64>,
    attached: bool,
    /// `PTRACE_GETEVENTMSG` of the last fork/clone event met during a
    /// remote syscall: the new task's id as seen by the tracer.
    last_event_msg: Option<u64>,
    /// The escape block remote syscalls run from (see [`crate::escape`]).
    hatch: Option<Arc<EscapeHatch>>,
    /// A SIGSTOP of ours is queued on the thread ([`Tracee::hold`]).
    held: bool,
    /// The signal of the last `PTRACE_EVENT_STOP`: a stop signal for a
    /// group stop (job control), SIGTRAP for our interrupt.
    event_stop_sig: i32,
}

/// Calls `ptrace(op, pid, addr, data)`, mapping -1 to an error naming `name`.
fn ptrace_raw(op: u32, pid: i32, addr: u64, data: u64, name: &'static str) -> Result<i64> {
    // Errno must be cleared: PEEK requests return data, -1 may be valid.
    Errno::clear();
    // SAFETY: every caller passes `addr`/`data` that are either plain integers
    // or pointers to live buffers sized for the request `op`.
    let r = unsafe {
        libc::ptrace(
            op as _,
            pid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 && Errno::last_raw() != 0 {
        let e = last_err();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Err(KernelError::Ptrace {
                op: name,
                pid,
                source: io::Error::new(io::ErrorKind::NotFound, "thread is gone or not stopped"),
            });
        }
        return Err(KernelError::Ptrace {
            op: name,
            pid,
            source: e,
        });
    }
    Ok(r)
}

/// The blocked-signal mask of thread `tid` (bit n-1 for signal n).
pub(crate) fn sigmask_of(tid: i32) -> Result<u64> {
    let mut mask = 0u64;
    ptrace_raw(
        sys::PTRACE_GETSIGMASK,
        tid,
        8,
        &mut mask as *mut u64 as u64,
        "GETSIGMASK",
    )?;
    Ok(mask)
}

/// Sets the blocked-signal mask of thread `tid`.
pub(crate) fn set_sigmask_of(tid: i32, mask: u64) -> Result<()> {
    ptrace_raw(
        sys::PTRACE_SETSIGMASK,
        tid,
        8,
        &mask as *const u64 as u64,
        "SETSIGMASK",
    )
    .map(|_| ())
}

/// Sets the general registers of thread `tid`.
pub(crate) fn set_regs_of(tid: i32, regs: &UserRegs) -> Result<()> {
    ptrace_raw(
        libc::PTRACE_SETREGS,
        tid,
        0,
        regs as *const UserRegs as u64,
        "SETREGS",
    )
    .map(|_| ())
}

/// The rseq registration of thread `tid` (`None` if it has none).
pub(crate) fn rseq_config_of(tid: i32) -> Result<Option<sys::PtraceRseqConfiguration>> {
    let mut c = sys::PtraceRseqConfiguration::default();
    ptrace_raw(
        sys::PTRACE_GET_RSEQ_CONFIGURATION,
        tid,
        std::mem::size_of::<sys::PtraceRseqConfiguration>() as u64,
        &mut c as *mut _ as u64,
        "GET_RSEQ_CONFIGURATION",
    )?;
    Ok((c.rseq_abi_pointer != 0).then_some(c))
}

/// `waitpid(pid, __WALL)`, retried on EINTR.
pub fn wait_raw(pid: i32) -> Result<i32> {
    loop {
        let mut status = 0i32;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            return Ok(status);
        }
        let e = last_err();
        if e.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return Err(KernelError::Wait { pid, source: e });
    }
}

/// Reaps `tid`, a thread of ours (traced) that was SIGKILLed: waits for
/// its exit and takes it, so that a traced thread's zombie does not keep
/// its thread group from being reaped by its parent (a leader's exit goes
/// on to its real parent then). Gives up at `deadline` (a thread stuck in
/// the kernel) or when it is not ours to wait for any more.
pub fn reap_killed(tid: i32, deadline: std::time::Instant) {
    loop {
        let mut status = 0i32;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid && (libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
            return;
        }
        if r < 0 && last_err().raw_os_error() != Some(libc::EINTR) {
            return;
        }
        if std::time::Instant::now() >= deadline {
            return;
        }
        if r == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Describes a wait status that is not a stop, for error messages.
pub fn describe_exit(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

impl Tracee {
    /// `PTRACE_SEIZE`s `pid` with `PTRACE_O_TRACESYSGOOD` (plus `extra_options`).
    /// The thread keeps running until [`Tracee::interrupt`].
    pub fn seize(pid: i32, extra_options: u64) -> Result<Self> {
        let opts = sys::PTRACE_O_TRACESYSGOOD | extra_options;
        ptrace_raw(sys::PTRACE_SEIZE, pid, 0, opts, "SEIZE").map_err(|e| match e {
            KernelError::Ptrace { source, .. } => {
                if source.kind() == io::ErrorKind::NotFound {
                    KernelError::NoSuchProcess { pid }
                } else {
                    KernelError::Seize { pid, source }
                }
            }
            other => other,
        })?;
        Ok(Self {
            pid,
            syscall_insn: None,
            attached: true,
            last_event_msg: None,
            hatch: None,
            held: false,
            event_stop_sig: 0,
        })
    }

    /// Adopts a child that called `PTRACE_TRACEME` and is now in a
    /// signal-delivery stop; sets our options on it.
    pub fn adopt_traceme_child(pid: i32, options: u64) -> Result<Self> {
        let t = Self {
            pid,
            syscall_insn: None,
            attached: true,
            last_event_msg: None,
            hatch: None,
            held: false,
            event_stop_sig: 0,
        };
        ptrace_raw(
            libc::PTRACE_SETOPTIONS,
            pid,
            0,
            sys::PTRACE_O_TRACESYSGOOD | options,
            "SETOPTIONS",
        )?;
        Ok(t)
    }

    /// Adopts a thread that was auto-attached to us (`PTRACE_O_TRACECLONE`)
    /// and waits for its first stop.
    pub fn adopt_new_thread(tid: i32) -> Result<Self> {
        let mut t = Self {
            pid: tid,
            syscall_insn: None,
            attached: true,
            last_event_msg: None,
            hatch: None,
            held: false,
            event_stop_sig: 0,
        };
        match t.wait_stop("new thread start")? {
            StopKind::Signal(libc::SIGSTOP) | StopKind::EventStop => Ok(t),
            other => Err(KernelError::UnexpectedStop {
                pid: tid,
                what: format!("{other:?}"),
                during: "new thread start",
            }),
        }
    }

    /// The id (in the tracer's PID namespace) of the task created by the
    /// last remote `clone3`/`fork`, taken from its ptrace event; cleared.
    pub fn take_new_task(&mut self) -> Option<i32> {
        self.last_event_msg
            .take()
            .and_then(|m| i32::try_from(m).ok())
    }

    /// Replaces the ptrace options (`PTRACE_O_TRACESYSGOOD` is always set).
    pub fn set_options(&self, options: u64) -> Result<()> {
        ptrace_raw(
            libc::PTRACE_SETOPTIONS,
            self.pid,
            0,
            sys::PTRACE_O_TRACESYSGOOD | options,
            "SETOPTIONS",
        )
        .map(|_| ())
    }

    /// The thread id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Stops the thread with `PTRACE_INTERRUPT` and waits for the stop.
    /// Signal-delivery stops met on the way are recorded as pending again by
    /// re-queuing nothing: they are simply suppressed only if `keep` says so.
    pub fn interrupt(&mut self) -> Result<()> {
        self.ask_stop()?;
        self.wait_interrupted()
    }

    /// `PTRACE_INTERRUPT` alone: the thread stops on its own time, which
    /// [`Tracee::wait_interrupted`] waits for. Asking every thread of a
    /// process first and waiting after lets them stop together: a busy
    /// machine then makes the freeze wait once, not once per thread.
    pub fn ask_stop(&mut self) -> Result<()> {
        ptrace_raw(sys::PTRACE_INTERRUPT, self.pid, 0, 0, "INTERRUPT").map(|_| ())
    }

    /// Waits for the stop [`Tracee::ask_stop`] asked for.
    pub fn wait_interrupted(&mut self) -> Result<()> {
        loop {
            match self.wait_stop("interrupt")? {
                StopKind::EventStop => return Ok(()),
                // A signal arrived before our interrupt: let it be delivered as
                // it would have been, then wait for the interrupt stop.
                StopKind::Signal(sig) => self.resume_raw(libc::PTRACE_CONT, sig)?,
                StopKind::Syscall | StopKind::Event(_) => self.resume_raw(libc::PTRACE_CONT, 0)?,
            }
        }
    }

    /// Waits for the next stop of this thread.
    pub fn wait_stop(&mut self, during: &'static str) -> Result<StopKind> {
        let status = wait_raw(self.pid)?;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.attached = false;
            return Err(KernelError::Died {
                pid: self.pid,
                how: describe_exit(status),
                status,
            });
        }
        if !libc::WIFSTOPPED(status) {
            return Err(KernelError::UnexpectedStop {
                pid: self.pid,
                what: format!("status {status:#x}"),
                during,
            });
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if event == sys::PTRACE_EVENT_STOP {
            self.event_stop_sig = sig;
        }
        Ok(if sig == libc::SIGTRAP | 0x80 {
            StopKind::Syscall
        } else if event == sys::PTRACE_EVENT_STOP {
            StopKind::EventStop
        } else if event != 0 {
            StopKind::Event(event)
        } else {
            StopKind::Signal(sig)
        })
    }

    fn resume_raw(&self, op: u32, sig: i32) -> Result<()> {
        ptrace_raw(op, self.pid, 0, crate::sarg(i64::from(sig)), "resume").map(|_| ())
    }

    /// General registers.
    pub fn regs(&self) -> Result<UserRegs> {
        let mut regs = UserRegs::default();
        ptrace_raw(
            libc::PTRACE_GETREGS,
            self.pid,
            0,
            &mut regs as *mut UserRegs as u64,
            "GETREGS",
        )?;
        Ok(regs)
    }

    /// Sets the general registers.
    pub fn set_regs(&self, regs: &UserRegs) -> Result<()> {
        set_regs_of(self.pid, regs)
    }

    /// The XSAVE area (`NT_X86_XSTATE`), as long as the kernel reports it.
    pub fn xstate(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; sys::XSTATE_MAX];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        ptrace_raw(
            sys::PTRACE_GETREGSET,
            self.pid,
            u64::from(sys::NT_X86_XSTATE),
            &mut iov as *mut libc::iovec as u64,
            "GETREGSET(XSTATE)",
        )?;
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    /// Writes back an XSAVE area.
    pub fn set_xstate(&self, xstate: &[u8]) -> Result<()> {
        let mut copy = xstate.to_vec();
        let mut iov = libc::iovec {
            iov_base: copy.as_mut_ptr().cast(),
            iov_len: copy.len(),
        };
        ptrace_raw(
            sys::PTRACE_SETREGSET,
            self.pid,
            u64::from(sys::NT_X86_XSTATE),
            &mut iov as *mut libc::iovec as u64,
            "SETREGSET(XSTATE)",
        )?;
        Ok(())
    }

    /// The blocked-signal mask (bit n-1 for signal n).
    pub fn sigmask(&self) -> Result<u64> {
        sigmask_of(self.pid)
    }

    /// Sets the blocked-signal mask (SIGKILL and SIGSTOP are ignored by the kernel).
    pub fn set_sigmask(&self, mask: u64) -> Result<()> {
        set_sigmask_of(self.pid, mask)
    }

    /// Blocks every signal; returns the previous mask.
    pub fn block_all_signals(&self) -> Result<u64> {
        let old = self.sigmask()?;
        self.set_sigmask(!0u64)?;
        Ok(old)
    }

    /// Queued signals of the thread (`shared == false`) or of the whole
    /// process (`shared == true`), as raw 128-byte `siginfo_t`s.
    pub fn pending_siginfo(&self, shared: bool) -> Result<Vec<[u8; sys::SIGINFO_SIZE]>> {
        let mut out = Vec::new();
        let mut buf = [[0u8; sys::SIGINFO_SIZE]; 32];
        loop {
            let args = sys::PtracePeekSiginfoArgs {
                off: out.len() as u64,
                flags: if shared {
                    sys::PTRACE_PEEKSIGINFO_SHARED
                } else {
                    0
                },
                nr: 32,
            };
            let n = ptrace_raw(
                sys::PTRACE_PEEKSIGINFO,
                self.pid,
                &args as *const _ as u64,
                buf.as_mut_ptr() as u64,
                "PEEKSIGINFO",
            )?;
            let n = usize::try_from(n).unwrap_or(0);
            out.extend_from_slice(&buf[..n.min(buf.len())]);
            if n < buf.len() {
                return Ok(out);
            }
        }
    }

    /// The thread's rseq registration (`None` if it has none).
    pub fn rseq_config(&self) -> Result<Option<sys::PtraceRseqConfiguration>> {
        rseq_config_of(self.pid)
    }

    /// The thread's seccomp filters, newest first, as raw `sock_filter`
    /// arrays (8 bytes per instruction), with their flags.
    pub fn seccomp_filters(&self) -> Result<Vec<(Vec<u8>, u64)>> {
        let mut out = Vec::new();
        for index in 0u64.. {
            let n = match ptrace_raw(
                sys::PTRACE_SECCOMP_GET_FILTER,
                self.pid,
                index,
                0,
                "SECCOMP_GET_FILTER",
            ) {
                Ok(n) => usize::try_from(n).unwrap_or(0),
                Err(KernelError::Ptrace { source, .. })
                    if source.raw_os_error() == Some(libc::ENOENT)
                        || source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    break
                }
                Err(e) => return Err(e),
            };
            let mut prog = vec![0u8; n * 8];
            ptrace_raw(
                sys::PTRACE_SECCOMP_GET_FILTER,
                self.pid,
                index,
                prog.as_mut_ptr() as u64,
                "SECCOMP_GET_FILTER",
            )?;
            // struct seccomp_metadata { u64 filter_off; u64 flags; }
            let mut meta = [index, 0u64];
            ptrace_raw(
                sys::PTRACE_SECCOMP_GET_METADATA,
                self.pid,
                16,
                meta.as_mut_ptr() as u64,
                "SECCOMP_GET_METADATA",
            )?;
            out.push((prog, meta[1]));
        }
        Ok(out)
    }

    /// Runs this thread's remote syscalls from `hatch` (see [`crate::escape`]).
    pub fn set_hatch(&mut self, hatch: Arc<EscapeHatch>) {
        self.hatch = Some(hatch);
    }

    /// The escape hatch remote syscalls run from, if any.
    pub fn hatch(&self) -> Option<&Arc<EscapeHatch>> {
        self.hatch.as_ref()
    }

    /// Records the address of a `syscall` instruction to use for remote syscalls.
    pub fn set_syscall_insn(&mut self, addr: u64) {
        self.syscall_insn = Some(addr);
    }

    /// The address used for remote syscalls, if set.
    pub fn syscall_insn(&self) -> Option<u64> {
        self.syscall_insn
    }

    /// Runs `nr(args...)` inside the stopped tracee and returns the raw
    /// result (negative errno on failure). Clobbers the registers: the
    /// caller restores them. `base` supplies segment registers and flags.
    ///
    /// With an escape hatch ([`Tracee::set_hatch`]) the syscall runs from the
    /// hatch's block, and `base` must be the registers the thread had when
    /// it was frozen: the thread is parked on the hatch (signals blocked)
    /// until [`crate::escape::EscapeHatch::unpark`] or the caller's own
    /// mask-then-registers restore, and escapes by itself if we die.
    pub fn syscall_raw(&mut self, base: &UserRegs, nr: i64, args: &[u64]) -> Result<i64> {
        let mut undo = None;
        let (insn, newly_parked) = match &self.hatch {
            Some(h) => {
                let parked = h.park(self.pid, base)?;
                undo = h.before_syscall(nr, args)?;
                (h.syscall_addr(), parked)
            }
            None => (
                self.syscall_insn
                    .ok_or(KernelError::NoSyscallInsn { pid: self.pid })?,
                false,
            ),
        };
        self.injected_fault()?;
        let mut r = *base;
        let a = |i: usize| args.get(i).copied().unwrap_or(0);
        r.rax = crate::sarg(nr);
        r.orig_rax = u64::MAX;
        r.rdi = a(0);
        r.rsi = a(1);
        r.rdx = a(2);
        r.r10 = a(3);
        r.r8 = a(4);
        r.r9 = a(5);
        r.rip = insn;
        let die = || sys::fault::die_at(sys::fault::Point::DieInRemoteSyscall);
        self.set_regs(&r)?;
        die();
        if newly_parked {
            // Only now: until rip points into the hatch, a death here would
            // leave the thread running with every signal blocked.
            self.set_sigmask(!0u64)?;
        }
        die();
        // A thread of a process stopped by job control before the freeze
        // reports its group stop again (`PTRACE_EVENT_STOP`) when resumed
        // the first time: resumed again, it runs the syscall.
        let mut group_stops = 0;
        for phase in ["syscall entry", "syscall exit"] {
            self.resume_raw(libc::PTRACE_SYSCALL, 0)?;
            loop {
                match self.wait_stop(phase)? {
                    StopKind::EventStop if group_stops < 4 => {
                        group_stops += 1;
                        self.resume_raw(libc::PTRACE_SYSCALL, 0)?;
                    }
                    StopKind::Syscall => {
                        die();
                        break;
                    }
                    // Only unblockable signals can get here (we block the
                    // rest); a SIGSTOP from outside is suppressed, and so
                    // is our own hold (queued on the thread, it comes
                    // before any other SIGSTOP): it is taken.
                    StopKind::Signal(sig) if is_stop_signal(sig) => {
                        self.suppress_stop(sig, libc::PTRACE_SYSCALL)?;
                    }
                    // A clone event (the tracee ran clone3 for us with
                    // PTRACE_O_TRACECLONE set): the syscall goes on.
                    StopKind::Event(_) => {
                        let mut msg = 0u64;
                        ptrace_raw(
                            libc::PTRACE_GETEVENTMSG,
                            self.pid,
                            0,
                            &mut msg as *mut u64 as u64,
                            "GETEVENTMSG",
                        )?;
                        self.last_event_msg = Some(msg);
                        self.resume_raw(libc::PTRACE_SYSCALL, 0)?;
                    }
                    other => {
                        return Err(KernelError::UnexpectedStop {
                            pid: self.pid,
                            what: format!("{other:?}"),
                            during: phase,
                        });
                    }
                }
            }
        }
        let out = self.regs()?;
        let rax = crate::sarg_i64(out.rax);
        if let (Some(h), Some(slot)) = (&self.hatch, undo) {
            h.after_syscall(slot, rax)?;
        }
        Ok(rax)
    }

    /// The remote-syscall failure a test asked for (`STASIS_FAULT`).
    fn injected_fault(&self) -> Result<()> {
        sys::fault::check(sys::fault::Point::RemoteSyscall).map_err(|source| {
            KernelError::RemoteSyscall {
                name: "injected fault",
                pid: self.pid,
                source,
            }
        })
    }

    /// Resumes (with `op`) a thread stopped on a stop signal while it ran
    /// a remote syscall, the signal suppressed; our own hold, if that
    /// was it, is taken.
    fn suppress_stop(&mut self, sig: i32, op: u32) -> Result<()> {
        if sig == libc::SIGSTOP {
            self.held = false;
        }
        self.resume_raw(op, 0)
    }

    /// Like [`Tracee::syscall_raw`], mapping a negative result to an error
    /// that names the syscall.
    pub fn syscall(
        &mut self,
        base: &UserRegs,
        name: &'static str,
        nr: i64,
        args: &[u64],
    ) -> Result<u64> {
        let r = self.syscall_raw(base, nr, args)?;
        if (-4095..0).contains(&r) {
            return Err(KernelError::RemoteSyscall {
                name,
                pid: self.pid,
                source: io::Error::from_raw_os_error(i32::try_from(-r).unwrap_or(libc::EIO)),
            });
        }
        Ok(crate::sarg(r))
    }

    /// Queues a SIGSTOP on this stopped thread of process `tgid`. A traced
    /// thread takes a signal only when it is resumed, so the SIGSTOP waits;
    /// but should the tracer die, the kernel lets the thread go and it
    /// stops before it runs a single instruction of its own (what
    /// `sock::SocketGuard` needs while connections are in repair mode).
    /// [`Tracee::detach`] takes it back unseen; a remote syscall consumes
    /// it.
    pub fn hold(&mut self, tgid: i32) -> Result<()> {
        // SAFETY: tgkill takes three integers; the thread is ours (traced).
        let r = unsafe { libc::syscall(libc::SYS_tgkill, tgid, self.pid, libc::SIGSTOP) };
        if r != 0 {
            return Err(KernelError::Ptrace {
                op: "tgkill(SIGSTOP) to hold",
                pid: self.pid,
                source: io::Error::last_os_error(),
            });
        }
        self.held = true;
        Ok(())
    }

    /// Whether the thread's last `PTRACE_EVENT_STOP` was a group stop (its
    /// process stopped by job control), not only our interrupt: so even a
    /// process caught on its way back into a group stop (`/proc` still says
    /// running) counts as stopped.
    pub fn in_group_stop(&self) -> bool {
        is_stop_signal(self.event_stop_sig)
    }

    /// The signal of the group stop [`Tracee::in_group_stop`] saw
    /// (`SIGSTOP`, `SIGTSTP`, `SIGTTIN` or `SIGTTOU`: what the parent's
    /// `waitid` reports).
    pub fn group_stop_signal(&self) -> Option<i32> {
        self.in_group_stop().then_some(self.event_stop_sig)
    }

    /// Whether a SIGSTOP of [`Tracee::hold`] is still queued.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Detaches, letting the thread run on.
    pub fn detach(&mut self) -> Result<()> {
        if !self.attached {
            return Ok(());
        }
        if self.held {
            return self.detach_held();
        }
        self.attached = false;
        ptrace_raw(libc::PTRACE_DETACH, self.pid, 0, 0, "DETACH").map(|_| ())
    }

    /// Detaches a held thread: resumed, it takes its queued SIGSTOP in a
    /// signal-delivery stop before it returns to its own code, and is
    /// detached from that stop with the signal suppressed. A signal of its
    /// own met first is delivered, as it would have been on a plain
    /// release (a handler's frame is set up, the handler runs after).
    fn detach_held(&mut self) -> Result<()> {
        self.held = false;
        self.resume_raw(libc::PTRACE_CONT, 0)?;
        loop {
            match self.wait_stop("release of a held thread") {
                // Killed by a signal of its own, or by someone else.
                Err(KernelError::Died { .. }) => return Ok(()),
                Err(e) => return Err(e),
                Ok(StopKind::Signal(libc::SIGSTOP)) => break,
                Ok(StopKind::Signal(sig)) => self.resume_raw(libc::PTRACE_CONT, sig)?,
                // A group stop (a stop signal of someone else's, delivered
                // first): detached, it stays stopped; the SIGCONT that
                // ends it also cancels our SIGSTOP.
                Ok(StopKind::EventStop) => break,
                Ok(StopKind::Syscall | StopKind::Event(_)) => {
                    self.resume_raw(libc::PTRACE_CONT, 0)?;
                }
            }
        }
        self.attached = false;
        ptrace_raw(libc::PTRACE_DETACH, self.pid, 0, 0, "DETACH").map(|_| ())
    }

    /// Forgets the thread without detaching (it was killed or reaped).
    pub fn forget(&mut self) {
        self.attached = false;
        self.held = false;
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        if self.attached && self.held {
            // Best effort, as below.
            let _ = self.detach_held();
        } else if self.attached {
            // Best effort: an error here means the thread is already gone.
            let _ = ptrace_raw(libc::PTRACE_DETACH, self.pid, 0, 0, "DETACH");
        }
    }
}

/// Adjusts registers captured at a stop inside an interrupted syscall so that
/// resuming them (in this process or in a restored one) restarts the syscall
/// the way the kernel would have. Returns `true` if an adjustment was made.
///
/// * `-ERESTARTSYS`, `-ERESTARTNOINTR`, `-ERESTARTNOHAND`: re-execute the
///   syscall (`rax = orig_rax`, `rip -= 2`).
/// * `-ERESTART_RESTARTBLOCK` (sleeps and polls with timeouts): the kernel's
///   per-task restart block does not survive a restore, so with
///   `same_task == false` the original syscall is re-executed with its
///   original arguments (a relative timeout starts over, never shorter); with
///   `same_task == true` (`--leave-running`) `restart_syscall` resumes it exactly.
/// * `-EINTR` from `io_uring_enter`: it turns an interruption into `-EINTR`
///   itself, and only when it took no entry (else it returns how many it
///   took), so it was waiting: it is re-executed, as the others are. (A
///   real signal arriving at the same instant then restarts it too, as
///   with `SA_RESTART`.)
///
/// `orig_rax` is then set to -1 so the kernel does not adjust them again.
pub fn normalize_interrupted_syscall(regs: &mut UserRegs, same_task: bool) -> bool {
    if (regs.orig_rax as i64) < 0 {
        return false;
    }
    let rax = regs.rax as i64;
    let adjusted = match -rax {
        sys::ERESTARTSYS | sys::ERESTARTNOINTR | sys::ERESTARTNOHAND => {
            regs.rax = regs.orig_rax;
            true
        }
        sys::ERESTART_RESTARTBLOCK => {
            regs.rax = if same_task {
                sys::SYS_RESTART_SYSCALL as u64
            } else {
                regs.orig_rax
            };
            true
        }
        e if e == i64::from(libc::EINTR)
            && regs.orig_rax == libc::SYS_io_uring_enter.unsigned_abs() =>
        {
            regs.rax = regs.orig_rax;
            true
        }
        _ => false,
    };
    if adjusted {
        regs.rip = regs.rip.wrapping_sub(2);
    }
    regs.orig_rax = u64::MAX;
    adjusted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_syscall(nr: u64, rax: i64) -> UserRegs {
        UserRegs {
            orig_rax: nr,
            rax: crate::sarg(rax),
            rip: 0x1002,
            ..Default::default()
        }
    }

    #[test]
    fn restart_codes_rewind_rip_and_restore_nr() {
        for code in [sys::ERESTARTSYS, sys::ERESTARTNOINTR, sys::ERESTARTNOHAND] {
            let mut r = in_syscall(35, -code);
            assert!(normalize_interrupted_syscall(&mut r, false));
            assert_eq!((r.rax, r.rip, r.orig_rax), (35, 0x1000, u64::MAX));
        }
    }

    #[test]
    fn restart_block_depends_on_task_identity() {
        let mut r = in_syscall(230, -sys::ERESTART_RESTARTBLOCK);
        normalize_interrupted_syscall(&mut r, true);
        assert_eq!((r.rax, r.rip), (sys::SYS_RESTART_SYSCALL as u64, 0x1000));
        let mut r = in_syscall(230, -sys::ERESTART_RESTARTBLOCK);
        normalize_interrupted_syscall(&mut r, false);
        assert_eq!((r.rax, r.rip), (230, 0x1000));
    }

    // A program waiting for completions in io_uring_enter saw -EINTR
    // after every dump (and after a restore): the freeze interrupted it.
    #[test]
    fn an_interrupted_io_uring_wait_is_restarted() {
        let nr = libc::SYS_io_uring_enter.unsigned_abs();
        let mut r = in_syscall(nr, -i64::from(libc::EINTR));
        assert!(normalize_interrupted_syscall(&mut r, true));
        assert_eq!((r.rax, r.rip, r.orig_rax), (nr, 0x1000, u64::MAX));
        // Another syscall's -EINTR is its answer.
        let mut r = in_syscall(0, -i64::from(libc::EINTR));
        assert!(!normalize_interrupted_syscall(&mut r, true));
        assert_eq!(r.rip, 0x1002);
    }

    #[test]
    fn completed_syscalls_and_user_code_are_left_alone() {
        let mut r = in_syscall(0, 5);
        assert!(!normalize_interrupted_syscall(&mut r, false));
        assert_eq!((r.rax, r.rip), (5, 0x1002));
        let mut r = in_syscall(0, -i64::from(libc::EAGAIN));
        assert!(!normalize_interrupted_syscall(&mut r, false));
        let mut r = UserRegs {
            orig_rax: u64::MAX,
            rax: crate::sarg(-sys::ERESTARTSYS),
            rip: 7,
            ..Default::default()
        };
        assert!(!normalize_interrupted_syscall(&mut r, false));
        assert_eq!(r.rip, 7);
    }
}

#[cfg(test)]
mod hold_tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn state_of(pid: i32) -> char {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        st[st.rfind(')').unwrap() + 2..].chars().next().unwrap()
    }

    fn tracer_of(pid: i32) -> i32 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    }

    /// Waits (up to a minute) until `pid` is untraced and its state
    /// satisfies `ok`; returns the state.
    fn settle(pid: i32, ok: impl Fn(char) -> bool) -> char {
        let t0 = Instant::now();
        loop {
            let s = state_of(pid);
            if (tracer_of(pid) == 0 && ok(s)) || t0.elapsed() > Duration::from_secs(60) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Seizes and stops `pid` on a thread of its own and holds it; then
    /// that thread either detaches or just ends, as a killed tracer does.
    fn hold_then(pid: i32, detach: bool) {
        std::thread::spawn(move || {
            let mut t = Tracee::seize(pid, 0).unwrap();
            t.interrupt().unwrap();
            t.hold(pid).unwrap();
            assert!(t.is_held());
            if detach {
                t.detach().unwrap();
            } else {
                // The tracer "dies": the kernel lets the thread go.
                t.forget();
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_held_thread_stops_when_its_tracer_dies_and_runs_on_when_detached() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        hold_then(pid, false);
        assert_eq!(
            settle(pid, |s| s == 'T'),
            'T',
            "not stopped after its tracer died"
        );
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        assert_eq!(settle(pid, |s| s == 'S'), 'S');
        hold_then(pid, true);
        // Back asleep in its nanosleep (it may be seen running an instant
        // first, on a busy machine); a stop would last the whole minute.
        assert_eq!(
            settle(pid, |s| s == 'S'),
            'S',
            "a detached held thread stopped"
        );
        // Nothing is left to stop it later: no SIGSTOP pending.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        for key in ["SigPnd:", "ShdPnd:"] {
            let v = status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap();
            assert_eq!(v & (1 << (libc::SIGSTOP - 1)), 0, "{key} {v:#x}");
        }
        assert_eq!(state_of(pid), 'S');
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// A signal whose default action stops the process.
fn is_stop_signal(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}
