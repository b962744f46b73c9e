//! Safe wrappers over POSIX message queues (`mq_open`, `mq_getsetattr`,
//! `mq_timedsend`, `mq_timedreceive`) in the calling thread's IPC
//! namespace, and a detached mount of that namespace's mqueue file system
//! (`fsopen`/`fsmount`: its directory lists the namespace's queues, and
//! nothing is mounted anywhere).
//!
//! Names are given without their leading `/` (the system calls take them
//! so; `mq_open(3)` strips it).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use stasis_sys::net::{FSCONFIG_CMD_CREATE, FSMOUNT_CLOEXEC, FSOPEN_CLOEXEC};

/// What `mq_getattr` says of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MqAttr {
    /// `O_NONBLOCK` or 0 (of the open description).
    pub flags: i64,
    /// Most messages it holds.
    pub maxmsg: i64,
    /// Largest message it takes, in bytes.
    pub msgsize: i64,
    /// Messages queued now.
    pub curmsgs: i64,
}

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(r: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(check(r)?).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the system call just returned `fd`, a new descriptor that
    // nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn c_name(name: &str) -> io::Result<CString> {
    if name.is_empty() || name.contains('/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opens the queue `name` with `flags` (`O_RDONLY`/`O_WRONLY`/`O_RDWR`,
/// `O_NONBLOCK`); the descriptor is close-on-exec (the kernel makes every
/// one so).
pub fn open(name: &str, flags: i32) -> io::Result<OwnedFd> {
    let n = c_name(name)?;
    let flags = flags & (libc::O_ACCMODE | libc::O_NONBLOCK);
    // SAFETY: `n` is a NUL-terminated string that outlives the call; no
    // O_CREAT, so the mode and attribute arguments are not read.
    owned(unsafe { libc::syscall(libc::SYS_mq_open, n.as_ptr(), flags, 0, 0) })
}

/// Makes the queue `name` (it must not exist), read-write and
/// non-blocking, with permission bits `mode` (less the umask) and room for
/// `maxmsg` messages of at most `msgsize` bytes.
pub fn create(name: &str, mode: u32, maxmsg: i64, msgsize: i64) -> io::Result<OwnedFd> {
    let n = c_name(name)?;
    // SAFETY: mq_attr is plain data; zeroes are a valid value.
    let mut attr: libc::mq_attr = unsafe { std::mem::zeroed() };
    attr.mq_maxmsg = maxmsg;
    attr.mq_msgsize = msgsize;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NONBLOCK;
    // SAFETY: `n` and `attr` outlive the call, which reads one mq_attr.
    owned(unsafe {
        libc::syscall(
            libc::SYS_mq_open,
            n.as_ptr(),
            flags,
            mode & 0o7777,
            &attr as *const libc::mq_attr,
        )
    })
}

/// Removes the queue `name` (`mq_unlink`); fds on it keep it alive.
pub fn unlink(name: &str) -> io::Result<()> {
    let n = c_name(name)?;
    // SAFETY: `n` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::syscall(libc::SYS_mq_unlink, n.as_ptr()) })?;
    Ok(())
}

/// `mq_getattr` of the queue open on `fd`.
pub fn getattr(fd: BorrowedFd<'_>) -> io::Result<MqAttr> {
    // SAFETY: mq_attr is plain data; zeroes are a valid value.
    let mut attr: libc::mq_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one mq_attr into `attr`; no new attributes.
    check(unsafe {
        libc::syscall(
            libc::SYS_mq_getsetattr,
            fd.as_raw_fd(),
            std::ptr::null::<libc::mq_attr>(),
            &mut attr as *mut libc::mq_attr,
        )
    })?;
    Ok(MqAttr {
        flags: attr.mq_flags,
        maxmsg: attr.mq_maxmsg,
        msgsize: attr.mq_msgsize,
        curmsgs: attr.mq_curmsgs,
    })
}

/// Takes the first message (highest priority, oldest of it) off the queue
/// open on `fd` into `buf` (at least the queue's `msgsize` long): its
/// length and priority; `None` if the queue is empty and `fd` is
/// non-blocking.
pub fn receive(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, u32)>> {
    let mut prio: libc::c_uint = 0;
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf` and
    // one unsigned int into `prio`; no timeout.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mq_timedreceive,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut prio as *mut libc::c_uint,
            std::ptr::null::<libc::timespec>(),
        )
    };
    match check(r) {
        Ok(n) => Ok(Some((usize::try_from(n).unwrap_or(0), prio))),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Queues `data` with priority `prio` on the queue open on `fd`.
pub fn send(fd: BorrowedFd<'_>, data: &[u8], prio: u32) -> io::Result<()> {
    // SAFETY: the kernel reads `data.len()` bytes from `data`; no timeout.
    check(unsafe {
        libc::syscall(
            libc::SYS_mq_timedsend,
            fd.as_raw_fd(),
            data.as_ptr(),
            data.len(),
            libc::c_uint::from(prio),
            std::ptr::null::<libc::timespec>(),
        )
    })?;
    Ok(())
}

/// A mount of the calling thread's IPC namespace's mqueue file system,
/// attached nowhere: its root directory (reached through
/// `/proc/self/fd/N`) holds a file per queue of the namespace.
pub fn detached_mount() -> io::Result<OwnedFd> {
    let kind = c_name("mqueue")?;
    // SAFETY: `kind` is a NUL-terminated string that outlives the call.
    let ctx = owned(unsafe { libc::syscall(libc::SYS_fsopen, kind.as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: FSCONFIG_CMD_CREATE takes no key, value or aux argument.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    // SAFETY: `ctx` is an fs context fd with its superblock created.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), FSMOUNT_CLOEXEC, 0) })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn names_with_a_slash_or_empty_are_refused() {
        assert!(c_name("").is_err());
        assert!(c_name("a/b").is_err());
        assert!(c_name("q").is_ok());
    }

    #[test]
    fn a_queue_gives_back_its_messages_by_priority_and_lists_in_its_mount() {
        let name = format!("stasis-kernel-test-{}", std::process::id());
        let q = match create(&name, 0o600, 4, 16) {
            Ok(q) => q,
            // No mqueue support (or no room) here: nothing to test.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::ENOSPC)) => return,
            Err(e) => panic!("mq_open: {e}"),
        };
        send(q.as_fd(), b"low", 1).unwrap();
        send(q.as_fd(), b"high", 9).unwrap();
        send(q.as_fd(), b"low2", 1).unwrap();
        let a = getattr(q.as_fd()).unwrap();
        assert_eq!((a.maxmsg, a.msgsize, a.curmsgs), (4, 16, 3));
        let m = detached_mount().unwrap();
        let names: Vec<String> = std::fs::read_dir(format!("/proc/self/fd/{}", m.as_raw_fd()))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let mut buf = [0u8; 16];
        let mut got = Vec::new();
        while let Some((n, p)) = receive(q.as_fd(), &mut buf).unwrap() {
            got.push((buf[..n].to_vec(), p));
        }
        unlink(&name).unwrap();
        assert!(names.contains(&name), "{names:?}");
        assert_eq!(
            got,
            vec![
                (b"high".to_vec(), 9),
                (b"low".to_vec(), 1),
                (b"low2".to_vec(), 1)
            ]
        );
        assert!(open(&name, libc::O_RDONLY).is_err());
        assert!(unlink(&name).is_err());
    }
}
