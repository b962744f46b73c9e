//! `pidfd_open`, `pidfd_getfd` and `pidfd_send_signal`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{last_err, KernelError, Result};

/// Opens a pidfd for `pid`. Fails with [`KernelError::NoSuchProcess`] if it is gone.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(stasis_sys::SYS_PIDFD_OPEN, pid, 0) };
    if fd < 0 {
        let e = last_err();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Err(KernelError::NoSuchProcess { pid });
        }
        return Err(KernelError::io(format!("pidfd_open({pid})"), e));
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("fd fits in i32")) })
}

/// Duplicates file descriptor `target_fd` of the process behind `pidfd` into
/// this process (`pidfd_getfd`, needs ptrace access to it).
pub fn pidfd_getfd(pidfd: &OwnedFd, target_fd: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, an fd number and flags; returns a new fd or -1.
    let fd = unsafe { libc::syscall(stasis_sys::SYS_PIDFD_GETFD, pidfd.as_raw_fd(), target_fd, 0) };
    if fd < 0 {
        return Err(KernelError::io(
            format!("pidfd_getfd(fd {target_fd})"),
            last_err(),
        ));
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("fd fits in i32")) })
}

/// Sends `sig` (0: only check that it lives) to the process behind `pidfd`:
/// unlike `kill`, never to a later process that reused its PID. Fails with
/// [`KernelError::NoSuchProcess`] once it has exited.
pub fn pidfd_send_signal(pidfd: &OwnedFd, pid: i32, sig: i32) -> Result<()> {
    // SAFETY: pidfd_send_signal takes a pidfd, a signal number, a null
    // siginfo pointer (the kernel fills in a SI_USER one) and flags.
    let r = unsafe {
        libc::syscall(
            stasis_sys::SYS_PIDFD_SEND_SIGNAL,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let e = last_err();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Err(KernelError::NoSuchProcess { pid });
        }
        return Err(KernelError::io(format!("pidfd_send_signal({pid})"), e));
    }
    Ok(())
}
