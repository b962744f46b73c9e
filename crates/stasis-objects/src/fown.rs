//! The signal owner of an open file description (`F_SETOWN_EX`,
//! `F_SETSIG`): who gets its SIGIO (or the signal chosen instead) when the
//! file has `O_ASYNC`, or urgent data arrives on a socket.
//!
//! **Save.** Read from a copy of the fd (`pidfd_getfd`: the same
//! description, so the same owner). **Restore** is done by the restored
//! process itself, once its fds exist (`stasis-restore`'s `restore_files`):
//! the ids are then those of its own PID namespace.

use std::os::fd::AsFd;

use stasis_image::manifest::FileOwner;
use stasis_kernel::{fdops, pidfd};

use crate::{OpenFd, SaveError};

/// The owner of `fd`'s description, if one was set.
pub(crate) fn save(fd: &OpenFd<'_>) -> Result<Option<FileOwner>, SaveError> {
    // An O_PATH fd has no owner: fcntl(F_GETOWN_EX) fails on it (EBADF).
    if fd.flags & libc::O_PATH.unsigned_abs() != 0 {
        return Ok(None);
    }
    let read = |b: std::os::fd::BorrowedFd<'_>| {
        fdops::owner(b).map_err(|source| SaveError::Proc {
            pid: fd.pid,
            file: format!("fd/{} (F_GETOWN_EX)", fd.fd),
            source,
        })
    };
    let (o, signal) = match &fd.socket {
        Some(s) => read(s.sock.as_fd())?,
        None => {
            let copy = pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
            read(copy.as_fd())?
        }
    };
    Ok((o.pid != 0 || signal != 0).then_some(FileOwner {
        kind: o.kind,
        pid: o.pid,
        signal,
    }))
}
