//! Remote syscalls in batches: several getters for one stop of the
//! thread, through its escape hatch's batch code
//! ([`crate::escape`]'s `batch_code`).

use super::{is_stop_signal, StopKind, Tracee};
use crate::{KernelError, Result, UserRegs};
use stasis_sys as sys;

impl Tracee {
    /// Runs the `n` syscalls of the batch table at `table` (entries of
    /// [`crate::escape::BATCH_ENTRY`] bytes: nr, six arguments, result,
    /// written by the caller into the process's memory) in one stop of
    /// the thread, through its escape hatch's batch code; each result is
    /// left in its entry. `stop_sig` is a signal the process does not
    /// catch whose default action is to ignore it (SIGURG, SIGWINCH): the
    /// batch ends by sending it to the thread itself, and the thread stops
    /// on it. `base` as for [`Tracee::syscall_raw`]. Needs a hatch; only
    /// syscalls that change nothing belong in a batch (a thread whose
    /// tracer dies runs the rest of the table before it escapes).
    pub fn syscall_batch(
        &mut self,
        base: &UserRegs,
        table: u64,
        n: usize,
        stop_sig: i32,
    ) -> Result<()> {
        let Some(h) = self.hatch.clone() else {
            return Err(KernelError::NoSyscallInsn { pid: self.pid });
        };
        h.park(self.pid, base)?;
        self.injected_fault()?;
        // The thread signals itself: by its IDs in its own PID namespace.
        let (tgid, tid) = h.ids_in_own_ns(self.pid);
        let mut r = *base;
        r.orig_rax = u64::MAX;
        r.rip = h.batch_addr();
        r.rbx = table;
        r.rbp = n as u64;
        r.r12 = crate::sarg(i64::from(tgid));
        r.r13 = crate::sarg(i64::from(tid));
        r.r14 = crate::sarg(i64::from(stop_sig));
        let die = || sys::fault::die_at(sys::fault::Point::DieInRemoteSyscall);
        self.set_regs(&r)?;
        die();
        // Every signal blocked but the stop signal (a thread newly parked
        // gets its mask blocked only now, as for a single syscall).
        self.set_sigmask(!(1u64 << (stop_sig - 1)))?;
        die();
        let parked = h.syscall_addr() + crate::escape::PARKED_OFFSET;
        self.resume_raw(libc::PTRACE_CONT, 0)?;
        // (A death here leaves the thread in the middle of its table.)
        die();
        let mut group_stops = 0;
        loop {
            match self.wait_stop("a batch of syscalls")? {
                // As in `syscall_raw`: a thread stopped by job control
                // reports its group stop again when first resumed.
                StopKind::EventStop if group_stops < 4 => {
                    group_stops += 1;
                    self.resume_raw(libc::PTRACE_CONT, 0)?;
                }
                // Ours: sent at the end of the table (an earlier one, from
                // outside, stops the thread elsewhere; it is ignored by
                // the process anyway, and suppressed).
                StopKind::Signal(sig) if sig == stop_sig => {
                    if self.regs()?.rip == parked {
                        break;
                    }
                    self.resume_raw(libc::PTRACE_CONT, 0)?;
                }
                // As in `syscall_raw`.
                StopKind::Signal(sig) if is_stop_signal(sig) => {
                    self.suppress_stop(sig, libc::PTRACE_CONT)?;
                }
                other => {
                    return Err(KernelError::UnexpectedStop {
                        pid: self.pid,
                        what: format!("{other:?}"),
                        during: "a batch of syscalls",
                    });
                }
            }
        }
        die();
        self.set_sigmask(!0u64)
    }
}
