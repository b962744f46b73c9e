//! Creating a traced, stopped child: the restore stub and the probe child.
//!
//! The child is created with `clone3` (optionally at a chosen PID with
//! `set_tid`), calls `PTRACE_TRACEME` and stops itself with `SIGSTOP` before
//! running any Rust code. The parent then owns it as a [`Tracee`] with
//! `PTRACE_O_EXITKILL`, so if stasis dies the half-built child dies too.

use stasis_sys::{self as sys, CloneArgs};

use crate::ptrace::{describe_exit, wait_raw, StopKind};
use crate::{last_err, KernelError, Result, Tracee};

/// Errors specific to creating the child.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("PID {0} is already in use")]
    PidTaken(i32),
    #[error("creating a process at PID {pid} needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE)")]
    NoPermission {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Forks a child (at PID `set_tid` if given) that stops right away under our
/// trace. Returns it in its initial `SIGSTOP` signal-delivery stop, with the
/// address of the `syscall` instruction it stopped after recorded for remote
/// syscalls.
pub fn spawn_stopped(set_tid: Option<i32>) -> Result<Tracee, SpawnError> {
    let tid_arr = [set_tid.unwrap_or(0)];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: if set_tid.is_some() {
            tid_arr.as_ptr() as u64
        } else {
            0
        },
        set_tid_size: u64::from(set_tid.is_some()),
        ..Default::default()
    };
    // SAFETY: clone3 with a valid `clone_args` and no CLONE_VM duplicates
    // this process like fork. In the child only async-signal-safe raw
    // syscalls run before it stops and is taken over by the parent (it never
    // returns into Rust code on its own: _exit follows).
    let pid = unsafe {
        libc::syscall(
            sys::SYS_CLONE3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: child side; raw syscalls only, then _exit.
        unsafe {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            libc::kill(libc::getpid(), libc::SIGSTOP);
            libc::_exit(127);
        }
    }
    if pid < 0 {
        let e = last_err();
        let want = set_tid.unwrap_or(0);
        return Err(match e.raw_os_error() {
            Some(libc::EEXIST) => SpawnError::PidTaken(want),
            Some(libc::EPERM) => SpawnError::NoPermission {
                pid: want,
                source: e,
            },
            _ => SpawnError::Kernel(KernelError::io("clone3", e)),
        });
    }
    let pid = i32::try_from(pid)
        .map_err(|_| KernelError::io("clone3", std::io::Error::other("pid out of range")))?;
    let status = wait_raw(pid)?;
    if !libc::WIFSTOPPED(status) || libc::WSTOPSIG(status) != libc::SIGSTOP {
        return Err(KernelError::Died {
            pid,
            how: describe_exit(status),
        }
        .into());
    }
    let mut t = Tracee::adopt_traceme_child(pid, sys::PTRACE_O_EXITKILL)?;
    let regs = t.regs()?;
    t.set_syscall_insn(regs.rip - 2);
    Ok(t)
}

/// Kills a child created by [`spawn_stopped`] and reaps it.
pub fn kill_and_reap(mut t: Tracee) {
    let pid = t.pid();
    t.forget();
    // SAFETY: kill with a pid we created and have not reaped.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = wait_raw(pid);
}

/// Waits until the child is in a stop, skipping nothing else.
pub fn expect_stop(t: &mut Tracee, during: &'static str) -> Result<StopKind> {
    t.wait_stop(during)
}
