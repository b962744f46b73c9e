//! File locks held through an fd (from the `lock:` lines of fdinfo). OFD
//! locks and leases belong to the open file description: the restorer
//! takes them when it makes it ([`take_ofd_locks`]; a lease's type is
//! read with `F_GETLEASE`; a lease being broken is taken and broken again
//! at restore, by an open of the restorer's, without a signal). flock locks belong to it too,
//! but `/proc` names the process that took them, and POSIX locks belong
//! to the process: both are taken by the process itself, over a
//! [`Remote`] ([`restore_flock`], [`restore_posix_locks`]).

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{FdImage, FileLock, LockKind};
use stasis_kernel::remote::Remote;
use stasis_kernel::{fdops, pidfd};
use stasis_sys::net::FLOCK_LEN;

use crate::error::step;
use crate::{OpenFd, RestoreError, SaveError, Scratch};

/// The locks held through `fd`.
pub fn save(fd: &OpenFd<'_>) -> Result<Vec<FileLock>, SaveError> {
    let mut locks = Vec::new();
    for (k, write, start, len) in
        stasis_kernel::procfs::parse_locks(fd.info).map_err(|e| fd.bad_info(e))?
    {
        let kind = match k.as_str() {
            "POSIX" => LockKind::Posix,
            "FLOCK" => LockKind::Flock,
            "OFDLCK" => LockKind::Ofd,
            "LEASE" => {
                locks.push(save_lease(fd)?);
                continue;
            }
            other => {
                return Err(fd.unsupported(format!(
                    "fd {} holds a {other} lock, which stasis cannot checkpoint yet",
                    fd.fd
                )))
            }
        };
        locks.push(FileLock {
            kind,
            write,
            start,
            len,
        });
    }
    Ok(locks)
}

/// The lease held through `fd`. One being broken (another process opened
/// the file) is saved with the lease held before the break and the type
/// it is broken to (what `F_GETLEASE` returns meanwhile): a reader breaks
/// a write lease to a read lease; a writer breaks any lease to none, and
/// the lease held was then a read lease if the description is read-only
/// (a read lease needs that), else a write lease. The process waiting in
/// its open (if it did not open with `O_NONBLOCK`) is not part of the
/// image; the break starts again at restore, its time-out anew.
fn save_lease(fd: &OpenFd<'_>) -> Result<FileLock, SaveError> {
    let breaking = fd
        .info
        .lines()
        .find(|l| l.starts_with("lock:") && l.contains("LEASE") && l.contains("BREAKING"));
    let copy = pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
    let ty = fdops::lease(copy.as_fd()).map_err(|source| SaveError::Proc {
        pid: fd.pid,
        file: format!("fd/{} (F_GETLEASE)", fd.fd),
        source,
    })?;
    if breaking.is_some() {
        let to_read = ty == libc::F_RDLCK;
        let read_only = fd.flags & libc::O_ACCMODE.unsigned_abs() == libc::O_RDONLY.unsigned_abs();
        return Ok(FileLock {
            kind: LockKind::BreakingLease { to_read },
            write: to_read || !read_only,
            start: 0,
            len: 0,
        });
    }
    Ok(FileLock {
        kind: LockKind::Lease,
        write: ty == libc::F_WRLCK,
        start: 0,
        len: 0,
    })
}

/// `struct flock` bytes for a lock.
pub fn flock_struct(l: &FileLock) -> [u8; FLOCK_LEN] {
    let ty = if l.write {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    let mut b = [0u8; FLOCK_LEN];
    b[0..2].copy_from_slice(&i16::try_from(ty).unwrap_or(0).to_le_bytes());
    b[2..4].copy_from_slice(&i16::try_from(libc::SEEK_SET).unwrap_or(0).to_le_bytes());
    b[8..16].copy_from_slice(&l.start.to_le_bytes());
    b[16..24].copy_from_slice(&l.len.to_le_bytes());
    b
}

/// The `flock(2)` operation for a lock (never blocking).
fn flock_op(l: &FileLock) -> i32 {
    (if l.write {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    }) | libc::LOCK_NB
}

/// Takes the OFD locks and the lease of `img` on the description `made`
/// (a lease makes this process the file's SIGIO owner: the owner saved
/// with the fd is set again later, by the process).
pub fn take_ofd_locks(made: &OwnedFd, img: &FdImage) -> Result<(), RestoreError> {
    let mine = |l: &&FileLock| {
        matches!(
            l.kind,
            LockKind::Ofd | LockKind::Lease | LockKind::BreakingLease { .. }
        )
    };
    for l in img.locks.iter().filter(mine) {
        let ty = if l.write {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        let taken = match l.kind {
            LockKind::Lease => fdops::set_lease(made.as_fd(), ty),
            LockKind::BreakingLease { to_read } => {
                fdops::set_lease(made.as_fd(), ty).and_then(|()| break_lease(made, to_read))
            }
            _ => fdops::ofd_setlk(made.as_fd(), &flock_struct(l)),
        };
        taken.map_err(|e| RestoreError::Locked {
            fd: img.fd,
            what: format!(
                "{:?} {} lock",
                l.kind,
                if l.write { "write" } else { "read" }
            ),
            source: e,
        })?;
    }
    Ok(())
}

/// Starts breaking the lease just taken on `made`, as a process opening
/// the file would (for reading if `to_read`, else for writing), without
/// waiting: the open fails with `EWOULDBLOCK` and the lease is being
/// broken. No SIGIO is sent for it (no owner until the process's own is
/// set again): the process had its signal before the dump.
fn break_lease(made: &OwnedFd, to_read: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    fdops::set_owner(made.as_fd(), 0)?;
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(made));
    let opened = std::fs::OpenOptions::new()
        .read(to_read)
        .write(!to_read)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    match opened {
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
        Err(e) => return Err(e),
        Ok(_) => {
            return Err(std::io::Error::other(
                "the open that should break the lease did not conflict with it",
            ))
        }
    }
    let now = fdops::lease(made.as_fd())?;
    let want = if to_read {
        libc::F_RDLCK
    } else {
        libc::F_UNLCK
    };
    if now != want {
        return Err(std::io::Error::other(format!(
            "the lease being broken reads as type {now}, not {want}"
        )));
    }
    Ok(())
}

/// Takes the flock lock of `img` from inside the process, so that `/proc`
/// names it as the holder (as it was at the dump).
pub fn restore_flock<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    for l in img.locks.iter().filter(|l| l.kind == LockKind::Flock) {
        r.sys(
            "flock",
            libc::SYS_flock,
            &[
                u64::from(img.fd.unsigned_abs()),
                flock_op(l).unsigned_abs().into(),
            ],
        )
        .map_err(step(format!(
            "taking back the flock lock on fd {} (is the file locked by another process?)",
            img.fd
        )))?;
    }
    Ok(())
}

/// Takes the POSIX (process-owned) locks of `img` from inside the process.
pub fn restore_posix_locks<R: Remote>(
    r: &mut R,
    at: Scratch,
    img: &FdImage,
) -> Result<(), RestoreError> {
    for l in img.locks.iter().filter(|l| l.kind == LockKind::Posix) {
        let a = r
            .put(at.structs, &flock_struct(l))
            .map_err(step("struct flock"))?;
        r.sys(
            "fcntl(F_SETLK)",
            libc::SYS_fcntl,
            &[
                u64::from(img.fd.unsigned_abs()),
                libc::F_SETLK.unsigned_abs().into(),
                a,
            ],
        )
        .map_err(step(format!(
            "taking back the POSIX lock on fd {} (is the file locked by another process?)",
            img.fd
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A saved lease is taken again on the description the restorer made.
    #[test]
    fn a_lease_is_taken_on_the_new_description() {
        let path = std::env::temp_dir().join(format!("stasis-lease-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let made: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let img = FdImage {
            fd: 4,
            flags: 0,
            cloexec: false,
            kind: stasis_image::manifest::FdKind::Signalfd { mask: 0 },
            shared_id: None,
            locks: vec![FileLock {
                kind: LockKind::Lease,
                write: false,
                start: 0,
                len: 0,
            }],
            owner: None,
        };
        take_ofd_locks(&made, &img).unwrap();
        assert_eq!(fdops::lease(made.as_fd()).unwrap(), libc::F_RDLCK);
        // A write lease on a read-only description is refused, naming the fd.
        let mut w = img.clone();
        w.locks[0].write = true;
        let other: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let e = take_ofd_locks(&other, &w).unwrap_err().to_string();
        assert!(e.contains("fd 4") && e.contains("Lease write"), "{e}");
        std::fs::remove_file(&path).unwrap();
    }

    /// The kernel's view of the lease on `fd`: its fdinfo `lock:` line.
    fn lease_line(fd: &OwnedFd) -> String {
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            std::os::fd::AsRawFd::as_raw_fd(fd)
        ))
        .unwrap();
        info.lines()
            .find(|l| l.starts_with("lock:") && l.contains("LEASE"))
            .unwrap_or_default()
            .to_string()
    }

    // A lease being broken is taken and broken again: to none (a read
    // lease, a writer), or to a read lease (a write lease, a reader).
    #[test]
    fn a_lease_being_broken_is_broken_again() {
        for (to_read, write) in [(false, false), (true, true)] {
            let path = std::env::temp_dir().join(format!(
                "stasis-lease-break-{}-{to_read}",
                std::process::id()
            ));
            std::fs::write(&path, b"x").unwrap();
            let made: OwnedFd = std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(&path)
                .unwrap()
                .into();
            let img = FdImage {
                fd: 5,
                flags: 0,
                cloexec: false,
                kind: stasis_image::manifest::FdKind::Signalfd { mask: 0 },
                shared_id: None,
                locks: vec![FileLock {
                    kind: LockKind::BreakingLease { to_read },
                    write,
                    start: 0,
                    len: 0,
                }],
                owner: None,
            };
            take_ofd_locks(&made, &img).unwrap();
            let want = if to_read {
                libc::F_RDLCK
            } else {
                libc::F_UNLCK
            };
            assert_eq!(fdops::lease(made.as_fd()).unwrap(), want);
            let line = lease_line(&made);
            assert!(line.contains("BREAKING"), "{line}");
            // No process gets the break's SIGIO.
            assert_eq!(fdops::owner(made.as_fd()).unwrap().0.pid, 0);
            std::fs::remove_file(&path).unwrap();
        }
    }
}
