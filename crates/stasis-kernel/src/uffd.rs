//! userfaultfd: creation in this process and the API handshake.
//!
//! Tracking a *target's* memory needs a userfaultfd created inside the target
//! (a remote syscall) and pulled out with `pidfd_getfd`; that lives with the
//! trackers. Here: the local primitives and the feature query used by the
//! probe.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use stasis_sys as sys;

use crate::{last_err, KernelError, Result};

/// A userfaultfd owned by this process.
#[derive(Debug)]
pub struct Userfaultfd {
    fd: OwnedFd,
    features: u64,
}

/// How a userfaultfd was obtained (for `stasis check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdSource {
    Syscall,
    DevUserfaultfd,
}

/// Creates a userfaultfd (syscall first, then `/dev/userfaultfd`).
pub fn create_raw() -> Result<(OwnedFd, UffdSource)> {
    // SAFETY: userfaultfd(flags) returns a new fd or -1.
    let fd = unsafe { libc::syscall(sys::SYS_USERFAULTFD, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd >= 0 {
        // SAFETY: new descriptor owned by nobody else.
        return Ok((
            unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) },
            UffdSource::Syscall,
        ));
    }
    let syscall_err = last_err();
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .map_err(|e| KernelError::Unsupported {
            feature: "userfaultfd",
            why: format!("syscall: {syscall_err}; /dev/userfaultfd: {e}"),
        })?;
    // SAFETY: USERFAULTFD_IOC_NEW takes flags by value and returns a new fd.
    let fd = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            sys::USERFAULTFD_IOC_NEW as _,
            libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(KernelError::Unsupported {
            feature: "userfaultfd",
            why: format!("USERFAULTFD_IOC_NEW: {}", last_err()),
        });
    }
    // SAFETY: new descriptor owned by nobody else.
    Ok((
        unsafe { OwnedFd::from_raw_fd(fd) },
        UffdSource::DevUserfaultfd,
    ))
}

/// Performs the `UFFDIO_API` handshake asking for `features` (0 = query).
/// Returns the features the kernel granted (with 0: all it supports).
pub fn api(fd: &OwnedFd, features: u64) -> Result<u64> {
    let mut a = sys::UffdioApi {
        api: sys::UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `a` is.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), sys::UFFDIO_API as _, &mut a) };
    if r < 0 {
        return Err(KernelError::Unsupported {
            feature: "userfaultfd API handshake",
            why: last_err().to_string(),
        });
    }
    Ok(a.features)
}

impl Userfaultfd {
    /// Creates a userfaultfd in this process with the given features.
    pub fn new(features: u64) -> Result<Self> {
        let (fd, _) = create_raw()?;
        let features = api(&fd, features)?;
        Ok(Self { fd, features })
    }

    /// Wraps a userfaultfd taken from another process (already handshaken).
    pub fn from_fd(fd: OwnedFd, features: u64) -> Self {
        Self { fd, features }
    }

    /// Features granted.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Registers `[start, start + len)` of the userfaultfd's process with
    /// `mode` (`UFFDIO_REGISTER_MODE_*`).
    pub fn register(&self, start: u64, len: u64, mode: u64) -> Result<()> {
        let mut r = sys::UffdioRegister {
            range: sys::UffdioRange { start, len },
            mode,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `r` is.
        let n = unsafe { libc::ioctl(self.fd.as_raw_fd(), sys::UFFDIO_REGISTER as _, &mut r) };
        if n < 0 {
            return Err(KernelError::io(
                format!("UFFDIO_REGISTER [{start:#x}, {:#x})", start + len),
                last_err(),
            ));
        }
        Ok(())
    }
}

/// Names of the feature bits set in `features`.
pub fn feature_names(features: u64) -> Vec<&'static str> {
    sys::UFFD_FEATURE_NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| features & (1u64 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}
