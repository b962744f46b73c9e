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

    /// The descriptor, given up.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
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

/// A failed or partial `UFFDIO_COPY` / `UFFDIO_ZEROPAGE`: how many bytes
/// were done before the error, and the errno (`EEXIST`: a page is already
/// there; `EAGAIN`: a non-cooperative event is waiting to be read; `ESRCH`:
/// the process's memory is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillError {
    pub done: u64,
    pub errno: i32,
}

impl Userfaultfd {
    /// `UFFDIO_COPY`: atomically maps a copy of `src` at `dst` (page
    /// aligned, whole pages) in the userfaultfd's process and wakes the
    /// threads waiting on that range.
    pub fn copy(&self, dst: u64, src: &[u8]) -> std::result::Result<(), FillError> {
        let len = src.len() as u64;
        let mut c = sys::UffdioCopy {
            dst,
            src: src.as_ptr() as u64,
            len,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads `len` bytes at `src` (a live slice of
        // exactly that length) and writes the result into `c`.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), sys::UFFDIO_COPY as _, &mut c) };
        if r == 0 {
            return Ok(());
        }
        let errno = last_err().raw_os_error().unwrap_or(libc::EIO);
        Err(FillError {
            done: u64::try_from(c.copy).unwrap_or(0),
            errno,
        })
    }

    /// `UFFDIO_ZEROPAGE`: maps zero pages over `[start, start + len)` and
    /// wakes the threads waiting on it.
    pub fn zeropage(&self, start: u64, len: u64) -> std::result::Result<(), FillError> {
        let mut z = sys::UffdioZeropage {
            range: sys::UffdioRange { start, len },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a `struct uffdio_zeropage`, which `z` is.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), sys::UFFDIO_ZEROPAGE as _, &mut z) };
        if r == 0 {
            return Ok(());
        }
        let errno = last_err().raw_os_error().unwrap_or(libc::EIO);
        Err(FillError {
            done: u64::try_from(z.zeropage).unwrap_or(0),
            errno,
        })
    }

    /// `UFFDIO_WAKE`: wakes the threads waiting on `[start, start + len)`.
    pub fn wake(&self, start: u64, len: u64) -> Result<()> {
        let mut w = sys::UffdioRange { start, len };
        // SAFETY: UFFDIO_WAKE reads a `struct uffdio_range`, which `w` is.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), sys::UFFDIO_WAKE as _, &mut w) };
        if r < 0 {
            return Err(KernelError::io("UFFDIO_WAKE", last_err()));
        }
        Ok(())
    }

    /// `UFFDIO_WRITEPROTECT`: write-protects `[start, start + len)`
    /// (`protect`), or lifts the protection and wakes the threads waiting
    /// on the range. Errors give the errno: `EAGAIN` while a
    /// non-cooperative event (unmap, remap, remove) waits to be read,
    /// `ENOENT` if part of the range is no longer registered.
    pub fn write_protect(
        &self,
        start: u64,
        len: u64,
        protect: bool,
    ) -> std::result::Result<(), i32> {
        let mut w = sys::UffdioWriteprotect {
            range: sys::UffdioRange { start, len },
            mode: if protect {
                sys::UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            },
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads a `struct uffdio_writeprotect`, which `w` is.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), sys::UFFDIO_WRITEPROTECT as _, &mut w) };
        if r < 0 {
            return Err(last_err().raw_os_error().unwrap_or(libc::EIO));
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` for the userfaultfd to have something to
    /// read. Returns whether it has.
    pub fn wait_readable(&self, timeout_ms: i32) -> Result<bool> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll() reads and writes one `pollfd`, which `p` is.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r < 0 {
            let e = last_err();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(KernelError::io("poll on a userfaultfd", e));
        }
        Ok(r > 0 && p.revents & libc::POLLIN != 0)
    }

    /// Reads the events waiting on a non-blocking userfaultfd (none when
    /// it would block) and appends them to `out`.
    pub fn read_events(&self, out: &mut Vec<Event>) -> Result<()> {
        let mut buf = [sys::UffdMsg::default(); 64];
        // SAFETY: read() writes at most size_of_val(&buf) bytes into `buf`,
        // an array of plain-old-data messages.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
            )
        };
        if n < 0 {
            let e = last_err();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(());
            }
            return Err(KernelError::io("reading userfaultfd messages", e));
        }
        let count = usize::try_from(n).unwrap_or(0) / std::mem::size_of::<sys::UffdMsg>();
        for m in &buf[..count] {
            let a = m.arg;
            out.push(match m.event {
                sys::UFFD_EVENT_PAGEFAULT => Event::PageFault {
                    addr: a[1],
                    write: a[0] & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0,
                    wp: a[0] & sys::UFFD_PAGEFAULT_FLAG_WP != 0,
                },
                sys::UFFD_EVENT_FORK => {
                    let raw = (a[0] & 0xffff_ffff) as i32;
                    // SAFETY: for a fork event the kernel installed a new
                    // userfaultfd (the child's) in our table under this
                    // number; this message is its only owner.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    Event::Fork(Userfaultfd::from_fd(fd, self.features))
                }
                sys::UFFD_EVENT_REMAP => Event::Remap {
                    from: a[0],
                    to: a[1],
                    len: a[2],
                },
                sys::UFFD_EVENT_REMOVE => Event::Remove {
                    start: a[0],
                    end: a[1],
                },
                sys::UFFD_EVENT_UNMAP => Event::Unmap {
                    start: a[0],
                    end: a[1],
                },
                other => Event::Unknown(other),
            });
        }
        Ok(())
    }
}

/// What a userfaultfd reports (`struct uffd_msg`, decoded).
#[derive(Debug)]
pub enum Event {
    /// A thread waits for the page at `addr`.
    PageFault {
        addr: u64,
        write: bool,
        /// A write to a write-protected page (`UFFDIO_REGISTER_MODE_WP`).
        wp: bool,
    },
    /// The process forked; the child's userfaultfd (registered like the
    /// parent's) is handed to us.
    Fork(Userfaultfd),
    /// `mremap` moved `[from, from + len)` to `to`.
    Remap {
        from: u64,
        to: u64,
        len: u64,
    },
    /// `MADV_DONTNEED`/`MADV_REMOVE` dropped `[start, end)`.
    Remove {
        start: u64,
        end: u64,
    },
    /// `munmap` (or a mapping over it) removed `[start, end)`.
    Unmap {
        start: u64,
        end: u64,
    },
    Unknown(u8),
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
