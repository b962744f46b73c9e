//! `pidfd_open` and `pidfd_getfd`.

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
