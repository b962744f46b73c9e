//! THE way to give Stasis a userfaultfd over another process's memory.
//!
//! A userfaultfd registers the memory of the process that created it, so
//! it is created inside the target by a remote `userfaultfd()` (over a
//! [`Remote`]), taken out with `pidfd_getfd`, and the target's copy closed
//! again; then the API handshake asks for the features the caller needs.
//! The remote syscalls go through the target's escape hatch where it has
//! one (a dumper killed after the `userfaultfd()` leaves no fd behind).

use crate::remote::Remote;
use crate::uffd::{self, Userfaultfd};
use crate::{pidfd, KernelError};

/// What failed while taking a userfaultfd out of a process.
#[derive(Debug, thiserror::Error)]
pub enum UffdRemoteError {
    #[error("creating a userfaultfd inside process {pid}: {source}")]
    Create {
        pid: i32,
        #[source]
        source: KernelError,
    },
    #[error("taking the userfaultfd out of process {pid} (pidfd_getfd): {source}")]
    Take {
        pid: i32,
        #[source]
        source: KernelError,
    },
    #[error("closing process {pid}'s copy of its userfaultfd: {source}")]
    Close {
        pid: i32,
        #[source]
        source: KernelError,
    },
    #[error("the userfaultfd handshake for process {pid}: {source}")]
    Handshake {
        pid: i32,
        #[source]
        source: KernelError,
    },
    #[error("process {pid}: the kernel granted userfaultfd features {granted:#x}, not all of {wanted:#x}")]
    Missing { pid: i32, wanted: u64, granted: u64 },
}

impl UffdRemoteError {
    /// The kernel error underneath, if there is one.
    pub fn into_kernel(self) -> KernelError {
        match self {
            Self::Create { source, .. }
            | Self::Take { source, .. }
            | Self::Close { source, .. }
            | Self::Handshake { source, .. } => source,
            Self::Missing {
                pid,
                wanted,
                granted,
            } => KernelError::Unsupported {
                feature: "userfaultfd features",
                why: format!(
                    "process {pid}: the kernel granted {granted:#x}, not all of {wanted:#x} ({:?} missing)",
                    uffd::feature_names(wanted & !granted)
                ),
            },
        }
    }
}

/// Creates a userfaultfd (`O_CLOEXEC | O_NONBLOCK`) inside process `pid`
/// through `remote` (the remote syscall is named `name`), takes it out,
/// closes the process's copy, and asks for `features` (all of them, else
/// [`UffdRemoteError::Missing`]). The copy is closed whether or not taking
/// it out worked.
pub fn create_in(
    remote: &mut dyn Remote,
    pid: i32,
    name: &'static str,
    features: u64,
) -> Result<Userfaultfd, UffdRemoteError> {
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK).unsigned_abs();
    let n = remote
        .sys(name, stasis_sys::SYS_USERFAULTFD, &[u64::from(flags)])
        .map_err(|source| UffdRemoteError::Create { pid, source })?;
    let fdnum = i32::try_from(n).unwrap_or(-1);
    let taken = pidfd::pidfd_open(pid).and_then(|p| pidfd::pidfd_getfd(&p, fdnum));
    let closed = remote.sys("close (userfaultfd)", libc::SYS_close, &[n]);
    let fd = taken.map_err(|source| UffdRemoteError::Take { pid, source })?;
    closed.map_err(|source| UffdRemoteError::Close { pid, source })?;
    let granted =
        uffd::api(&fd, features).map_err(|source| UffdRemoteError::Handshake { pid, source })?;
    if granted & features != features {
        return Err(UffdRemoteError::Missing {
            pid,
            wanted: features,
            granted,
        });
    }
    Ok(Userfaultfd::from_fd(fd, granted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;

    #[test]
    fn a_failed_create_runs_nothing_else() {
        let mut r = Recorder {
            fail_on: Some(("userfaultfd (test)", libc::EPERM)),
            ..Default::default()
        };
        let e = create_in(&mut r, 1, "userfaultfd (test)", 0).unwrap_err();
        assert!(matches!(e, UffdRemoteError::Create { pid: 1, .. }), "{e}");
        assert_eq!(r.names(), vec!["userfaultfd (test)"]);
        assert_eq!(r.args_of("userfaultfd (test)"), vec![vec![0o2004000]]);
    }

    #[test]
    fn the_copy_is_closed_even_when_taking_it_fails() {
        // The recorder hands out fd 0 in no real process: pidfd_getfd of
        // pid -1 fails, and the close is still issued.
        let mut r = Recorder::default();
        let e = create_in(&mut r, -1, "userfaultfd (test)", 0).unwrap_err();
        assert!(matches!(e, UffdRemoteError::Take { .. }), "{e}");
        assert_eq!(r.names(), vec!["userfaultfd (test)", "close (userfaultfd)"]);
    }
}
