//! File locks held through an fd (from the `lock:` lines of fdinfo). OFD
//! locks and leases belong to the open file description: the restorer
//! takes them when it makes it ([`take_ofd_locks`]; a lease's type is
//! read with `F_GETLEASE`, and a lease being broken is refused). flock locks belong to it too,
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

/// The lease held through `fd` (not one being broken: the breaker waits
/// on it, which an image cannot hold).
fn save_lease(fd: &OpenFd<'_>) -> Result<FileLock, SaveError> {
    let breaking = fd
        .info
        .lines()
        .any(|l| l.starts_with("lock:") && l.contains("LEASE") && !l.contains("ACTIVE"));
    if breaking {
        return Err(fd.unsupported(format!(
            "fd {} holds a lease that is being broken (another process opened the file), which stasis cannot checkpoint; dump again once the holder has given it up",
            fd.fd
        )));
    }
    let copy = pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
    let ty = fdops::lease(copy.as_fd()).map_err(|source| SaveError::Proc {
        pid: fd.pid,
        file: format!("fd/{} (F_GETLEASE)", fd.fd),
        source,
    })?;
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
    let mine = |l: &&FileLock| matches!(l.kind, LockKind::Ofd | LockKind::Lease);
    for l in img.locks.iter().filter(mine) {
        let taken = if l.kind == LockKind::Lease {
            let ty = if l.write {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            };
            fdops::set_lease(made.as_fd(), ty)
        } else {
            fdops::ofd_setlk(made.as_fd(), &flock_struct(l))
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
}
