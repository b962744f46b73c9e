//! Safe wrappers over the plain file-descriptor syscalls that save and
//! rebuild kernel objects (pipes, eventfd, timerfd, signalfd, epoll,
//! inotify, memfd, locks, `kcmp`, `tee`...). Each takes and returns
//! `OwnedFd`/`BorrowedFd`, never a raw number it would have to trust.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use stasis_sys as sys;
use stasis_sys::net::{FLOCK_LEN, KCMP_EPOLL_TFD, KCMP_FILE, KCMP_FILES, TFD_IOC_SET_TICKS};

/// A new descriptor from a syscall's return value (`-1`: the error).
fn owned(r: i64) -> io::Result<OwnedFd> {
    let fd = i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor just returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks a syscall's return value; returns it when not negative.
fn check(r: i64) -> io::Result<i64> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `pipe2(flags)`: (read end, write end).
pub fn pipe2(flags: i32) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut p = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array.
    check(unsafe { libc::pipe2(p.as_mut_ptr(), flags) }.into())?;
    Ok((owned(p[0].into())?, owned(p[1].into())?))
}

/// `fcntl(F_GETPIPE_SZ)`.
pub fn pipe_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: F_GETPIPE_SZ takes no argument.
    let r = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) }.into())?;
    usize::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fcntl(F_SETPIPE_SZ)`.
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: i32) -> io::Result<()> {
    // SAFETY: F_SETPIPE_SZ takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) }.into()).map(drop)
}

/// `fcntl(F_GETFL)`.
pub fn status_flags(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GETFL takes no argument.
    let r = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }.into())?;
    i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fcntl(F_SETFL)`.
pub fn set_status_flags(fd: BorrowedFd<'_>, flags: i32) -> io::Result<()> {
    // SAFETY: F_SETFL takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) }.into()).map(drop)
}

/// Sets `FD_CLOEXEC` on `fd` (`fcntl(F_SETFD)`; the fd's own flag, not
/// the description's).
pub fn set_cloexec(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_SETFD takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) }.into()).map(drop)
}

/// Who gets the description's SIGIO (`F_GETOWN_EX`), and which signal
/// (`F_GETSIG`; 0 is SIGIO).
pub fn owner(fd: BorrowedFd<'_>) -> io::Result<(sys::FOwnerEx, i32)> {
    let mut o = sys::FOwnerEx::default();
    let p = &mut o as *mut sys::FOwnerEx;
    // SAFETY: F_GETOWN_EX writes one f_owner_ex, which `p` points to.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), sys::F_GETOWN_EX, p) };
    check(r.into())?;
    // SAFETY: F_GETSIG takes no argument.
    let sig = check(unsafe { libc::fcntl(fd.as_raw_fd(), sys::F_GETSIG) }.into())?;
    Ok((o, i32::try_from(sig).unwrap_or(0)))
}

/// `fcntl(F_SETOWN, pid)` (0: no process gets the description's SIGIO).
pub fn set_owner(fd: BorrowedFd<'_>, pid: i32) -> io::Result<()> {
    // SAFETY: F_SETOWN takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETOWN, pid) }.into()).map(drop)
}

/// `fcntl(F_GETLEASE)`: `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
pub fn lease(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GETLEASE takes no argument.
    let r = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLEASE) }.into())?;
    i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fcntl(F_SETLEASE, ty)`.
pub fn set_lease(fd: BorrowedFd<'_>, ty: i32) -> io::Result<()> {
    // SAFETY: F_SETLEASE takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, ty) }.into()).map(drop)
}

/// `fcntl(F_GET_SEALS)` (an error for files that are not memfds).
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GET_SEALS takes no argument.
    let r = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) }.into())?;
    i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fcntl(F_ADD_SEALS)`.
pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }.into()).map(drop)
}

/// `lseek(off, SEEK_SET)`.
pub fn seek_to(fd: BorrowedFd<'_>, off: i64) -> io::Result<()> {
    // SAFETY: lseek takes integers only.
    check(unsafe { libc::lseek(fd.as_raw_fd(), off, libc::SEEK_SET) }).map(drop)
}

/// `memfd_create(name, flags)`.
pub fn memfd_create(name: &CStr, flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create reads a NUL-terminated string.
    owned(unsafe { libc::memfd_create(name.as_ptr(), flags) }.into())
}

/// A shared mapping of a whole file, to write its content through it a
/// piece at a time ([`SharedMap::write_at`]): for files that take no
/// `write` (hugetlbfs). Unmapped on drop.
#[derive(Debug)]
pub struct SharedMap {
    p: *mut libc::c_void,
    len: usize,
}

impl SharedMap {
    /// Sizes the file `fd` to `size` bytes (`ftruncate`) and maps it
    /// shared, read-write (nothing is mapped for an empty file).
    pub fn open(fd: BorrowedFd<'_>, size: u64) -> io::Result<SharedMap> {
        let off_len =
            libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: ftruncate takes an fd and a length.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), off_len) }.into())?;
        Self::range(fd, 0, size)
    }

    /// Maps bytes `offset..offset + len` of the file `fd` shared,
    /// read-write, leaving its size as it is (a hugetlbfs file's: both
    /// whole huge pages, inside its size, else `EINVAL` or `SIGBUS` at the
    /// write; a hugetlbfs mapping reserves its pages, `ENOMEM` when the
    /// pool lacks them). [`SharedMap::write_at`]'s offsets are then from
    /// `offset`.
    pub fn range(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<SharedMap> {
        let big = || io::Error::from_raw_os_error(libc::EFBIG);
        let len = usize::try_from(len).map_err(|_| big())?;
        let off = libc::off_t::try_from(offset).map_err(|_| big())?;
        if len == 0 {
            return Ok(SharedMap {
                p: std::ptr::null_mut(),
                len,
            });
        }
        // SAFETY: a new shared mapping of `len` bytes of our own fd, at an
        // address the kernel picks; checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap { p, len })
    }

    /// Copies `data` to offset `off` of the file (`EINVAL` if it does not
    /// fit in it).
    pub fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        let at = usize::try_from(off)
            .ok()
            .filter(|o| o.checked_add(data.len()).is_some_and(|e| e <= self.len))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `at + data.len() <= len` (checked above), and len > 0 so
        // the mapping exists: the copy stays inside it, which nothing else
        // aliases.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.p.cast::<u8>().add(at), data.len());
        }
        Ok(())
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made by `open`, unmapped once.
            unsafe { libc::munmap(self.p, self.len) };
        }
    }
}

/// `eventfd(init, flags)`.
pub fn eventfd(init: u32, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes integers only.
    owned(unsafe { libc::eventfd(init, flags) }.into())
}

/// `timerfd_create(clock, flags)`.
pub fn timerfd_create(clockid: i32, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: timerfd_create takes integers only.
    owned(unsafe { libc::timerfd_create(clockid, flags) }.into())
}

/// `timerfd_settime` (relative) with an interval and a first expiry, in ns.
pub fn timerfd_settime(fd: BorrowedFd<'_>, interval_ns: u64, value_ns: u64) -> io::Result<()> {
    let ts = |ns: u64| libc::timespec {
        tv_sec: i64::try_from(ns / 1_000_000_000).unwrap_or(0),
        tv_nsec: i64::try_from(ns % 1_000_000_000).unwrap_or(0),
    };
    let spec = libc::itimerspec {
        it_interval: ts(interval_ns),
        it_value: ts(value_ns),
    };
    // SAFETY: timerfd_settime reads an itimerspec; the old value is not wanted.
    check(unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) }.into())
        .map(drop)
}

/// `ioctl(TFD_IOC_SET_TICKS)`: sets the pending expirations of a timerfd.
pub fn timerfd_set_ticks(fd: BorrowedFd<'_>, ticks: u64) -> io::Result<()> {
    // SAFETY: TFD_IOC_SET_TICKS reads a u64 from the pointer.
    check(
        unsafe { libc::ioctl(fd.as_raw_fd(), TFD_IOC_SET_TICKS as _, &ticks as *const u64) }.into(),
    )
    .map(drop)
}

/// `signalfd4(-1, mask, flags)` with a kernel signal set (8 bytes).
pub fn signalfd(mask: u64, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: signalfd4 reads an 8-byte kernel sigset from the pointer.
    owned(unsafe { libc::syscall(libc::SYS_signalfd4, -1, &mask as *const u64, 8usize, flags) })
}

/// `epoll_create1(flags)`.
pub fn epoll_create(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes an int.
    owned(unsafe { libc::epoll_create1(flags) }.into())
}

/// `inotify_init1(flags)`.
pub fn inotify_init(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes an int.
    owned(unsafe { libc::inotify_init1(flags) }.into())
}

/// `fanotify_init(flags, event_f_flags)`.
pub fn fanotify_init(flags: u32, event_f_flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: fanotify_init takes integers only.
    owned(unsafe { libc::fanotify_init(flags, event_f_flags) }.into())
}

/// `fanotify_mark(fd, flags, mask, AT_FDCWD, path)`.
pub fn fanotify_mark(fd: BorrowedFd<'_>, flags: u32, mask: u64, path: &CStr) -> io::Result<()> {
    // SAFETY: fanotify_mark reads a NUL-terminated path relative to the
    // working directory.
    check(
        unsafe { libc::fanotify_mark(fd.as_raw_fd(), flags, mask, libc::AT_FDCWD, path.as_ptr()) }
            .into(),
    )
    .map(drop)
}

/// `inotify_add_watch`: the watch descriptor.
pub fn inotify_add_watch(fd: BorrowedFd<'_>, path: &CStr, mask: u32) -> io::Result<i32> {
    // SAFETY: inotify_add_watch reads a NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
    check(wd.into()).map(|_| wd)
}

/// `inotify_rm_watch`.
pub fn inotify_rm_watch(fd: BorrowedFd<'_>, wd: i32) -> io::Result<()> {
    // SAFETY: inotify_rm_watch takes integers only.
    check(unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) }.into()).map(drop)
}

/// `listen(backlog)`.
pub fn listen(fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
    // SAFETY: listen takes integers only.
    check(unsafe { libc::listen(fd.as_raw_fd(), backlog) }.into()).map(drop)
}

/// One non-blocking `send` (`MSG_NOSIGNAL | MSG_DONTWAIT`): bytes taken.
pub fn send_nonblocking(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<usize> {
    // SAFETY: send reads `data.len()` bytes from `data`.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Waits up to `timeout_ms` for `fd` to be writable: false on timeout.
pub fn wait_writable(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll on one pollfd of ours.
    let r = check(unsafe { libc::poll(&mut p, 1, timeout_ms) }.into())?;
    Ok(r > 0)
}

/// `flock(op)`.
pub fn flock(fd: BorrowedFd<'_>, op: i32) -> io::Result<()> {
    // SAFETY: flock takes integers only.
    check(unsafe { libc::flock(fd.as_raw_fd(), op) }.into()).map(drop)
}

/// `fcntl(F_OFD_SETLK)` with the bytes of a `struct flock`.
pub fn ofd_setlk(fd: BorrowedFd<'_>, flock: &[u8; FLOCK_LEN]) -> io::Result<()> {
    // SAFETY: F_OFD_SETLK reads a struct flock (FLOCK_LEN bytes, checked
    // against libc's in stasis-sys) from the pointer.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, flock.as_ptr()) }.into())
        .map(drop)
}

/// `kcmp(KCMP_FILE)`: whether `fd1` of `pid1` and `fd2` of `pid2` are the
/// same open file description (false when it cannot tell).
pub fn kcmp_same_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> bool {
    // SAFETY: kcmp takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1, fd2) };
    r == 0
}

/// `kcmp(KCMP_FILES)`: whether `pid1` and `pid2` share one file
/// descriptor table (`clone(CLONE_FILES)`; false when it cannot tell).
pub fn kcmp_same_fd_table(pid1: i32, pid2: i32) -> bool {
    // SAFETY: kcmp takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILES, 0, 0) };
    r == 0
}

/// `kcmp(KCMP_EPOLL_TFD)`: whether `fd` of `pid` is the file registered
/// in `pid`'s epoll instance `efd` as its `toff`-th registration of fd
/// number `tfd` (false when it cannot tell).
pub fn kcmp_epoll_target(pid: i32, fd: i32, efd: i32, tfd: i32, toff: u32) -> bool {
    kcmp_epoll_target_of(pid, fd, (pid, efd), tfd, toff)
}

/// As [`kcmp_epoll_target`], with the epoll instance held by another
/// process: fd `efd` of `epoll_pid` (an epoll in flight, say, held by the
/// dumper while the registrations name fds of `pid`).
pub fn kcmp_epoll_target_of(
    pid: i32,
    fd: i32,
    (epoll_pid, efd): (i32, i32),
    tfd: i32,
    toff: u32,
) -> bool {
    // struct kcmp_epoll_slot { __u32 efd, tfd, toff; }
    let slot: [u32; 3] = [efd.unsigned_abs(), tfd.unsigned_abs(), toff];
    // SAFETY: kcmp reads one kcmp_epoll_slot from the pointer, which
    // points to three u32s that live across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            epoll_pid,
            KCMP_EPOLL_TFD,
            fd,
            slot.as_ptr(),
        )
    };
    r == 0
}

/// `tee(from, to, len, SPLICE_F_NONBLOCK)`: bytes copied (0 when empty).
pub fn tee_nonblocking(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: tee takes integers only; it copies between two pipes.
    let n = unsafe {
        libc::tee(
            from.as_raw_fd(),
            to.as_raw_fd(),
            len,
            libc::SPLICE_F_NONBLOCK,
        )
    };
    match usize::try_from(n) {
        Ok(n) => Ok(n),
        Err(_) => {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                Ok(0)
            } else {
                Err(e)
            }
        }
    }
}

/// `open_by_handle_at(mount, handle, flags)`, with the handle given as its
/// type and bytes (`struct file_handle` is built here).
pub fn open_by_handle(
    mount: BorrowedFd<'_>,
    handle_type: i32,
    handle: &[u8],
    flags: i32,
) -> io::Result<OwnedFd> {
    let mut fh = Vec::with_capacity(8 + handle.len());
    let len =
        u32::try_from(handle.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    fh.extend_from_slice(&len.to_ne_bytes());
    fh.extend_from_slice(&handle_type.to_ne_bytes());
    fh.extend_from_slice(handle);
    // SAFETY: open_by_handle_at reads a struct file_handle whose declared
    // size (`len`) matches the bytes that follow its header in `fh`.
    owned(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            fh.as_ptr(),
            flags,
        )
    })
}

/// The byte ranges of `[from, to)` of a file that hold data
/// (`SEEK_DATA`/`SEEK_HOLE`): for shared memory, the pages that exist,
/// resident or swapped out. The holes between them hold no page at all.
pub fn data_extents(f: &std::fs::File, from: u64, to: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let at = |v: u64| {
        i64::try_from(v).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let start = match lseek(f.as_raw_fd(), at(pos)?, Whence::SeekData) {
            Ok(s) => s.unsigned_abs(),
            // No data from `pos` to the end of the file.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if start >= to {
            break;
        }
        let end = match lseek(f.as_raw_fd(), at(start)?, Whence::SeekHole) {
            Ok(e) => e.unsigned_abs().min(to),
            // Truncated meanwhile.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if end <= start {
            break;
        }
        out.push((start, end));
        pos = end;
    }
    Ok(out)
}

/// `fnmatch(pattern, name, 0)`: whether `name` matches the shell pattern
/// (`*`, `?`, `[...]`) `pattern`. False for strings holding a NUL.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (
        std::ffi::CString::new(pattern),
        std::ffi::CString::new(name),
    ) else {
        return false;
    };
    // SAFETY: both are NUL-terminated strings that live across the call;
    // fnmatch only reads them.
    unsafe { libc::fnmatch(p.as_ptr(), n.as_ptr(), 0) == 0 }
}

/// `io_uring_enter(fd, 0, 0, flags, NULL, 0)` with `flags` 0 or
/// `IORING_ENTER_GETEVENTS`: submits nothing and waits for nothing (no
/// completion asked for). It tells whether the ring is disabled
/// (`EBADFD`: made with `IORING_SETUP_R_DISABLED` and not enabled yet)
/// and, asked for completions, whether they are posted only to another
/// task (`EEXIST`: `IORING_SETUP_DEFER_TASKRUN`, whose single issuer the
/// caller is not); it changes nothing in the ring.
pub fn io_uring_enter_nothing(fd: BorrowedFd<'_>, getevents: bool) -> io::Result<()> {
    let null: *const libc::c_void = std::ptr::null();
    let flags = if getevents {
        sys::io_uring::IORING_ENTER_GETEVENTS
    } else {
        0
    };
    // SAFETY: integers and a null argument pointer with size 0: the kernel
    // reads no memory of ours.
    check(unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            fd.as_raw_fd(),
            0u32,
            0u32,
            flags,
            null,
            0usize,
        )
    })
    .map(drop)
}

/// `io_uring_register(fd, op, NULL, 1)` for `IORING_REGISTER_PROBE`,
/// `IORING_REGISTER_RESTRICTIONS` or `IORING_REGISTER_EVENTFD`: a
/// request the kernel turns down (no buffer) after checking who may
/// register: it fails with `EEXIST` when the ring's single issuer
/// (`IORING_SETUP_SINGLE_ISSUER`) is another task, `EACCES` when the
/// ring's restrictions do not allow the operation, `EBUSY` when it has
/// restrictions already (on a ring still disabled) or an eventfd
/// registered, with another error otherwise; it changes nothing in the
/// ring.
pub fn io_uring_register_nothing(fd: BorrowedFd<'_>, op: u32) -> io::Error {
    use sys::io_uring::{
        IORING_REGISTER_EVENTFD, IORING_REGISTER_PROBE, IORING_REGISTER_RESTRICTIONS,
    };
    if !matches!(
        op,
        IORING_REGISTER_PROBE | IORING_REGISTER_RESTRICTIONS | IORING_REGISTER_EVENTFD
    ) {
        return io::Error::from_raw_os_error(libc::EINVAL);
    }
    let null: *const libc::c_void = std::ptr::null();
    // SAFETY: a null argument pointer: the kernel copies nothing from it
    // (it fails with EFAULT or EINVAL) and writes nothing.
    let r = unsafe { libc::syscall(libc::SYS_io_uring_register, fd.as_raw_fd(), op, null, 1u32) };
    if r < 0 {
        io::Error::last_os_error()
    } else {
        io::Error::from_raw_os_error(0)
    }
}
