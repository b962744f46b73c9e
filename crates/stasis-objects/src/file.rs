//! Regular files, directories, character and block devices: reopened at
//! their path with their access mode and status flags, seeked to their
//! offset (a block device only if the node there is the same device).
//! An `O_PATH` fd (no offset) on a symbolic link is opened with
//! `O_NOFOLLOW`, as it must have been. A tree with a mount namespace of
//! its own has its files opened there (its tmpfs and bind mounts).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::fdops;

use crate::error::{file_err, io_step};
use crate::restore::{open_with_mode, reopen_flags};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A file opened by path (the last kind tried: it takes whatever is left).
pub struct File;

impl Object for File {
    const NAME: &'static str = "file";

    fn save(_: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.socket.is_some() {
            return Ok(None);
        }
        // A block device: its device number, checked at restore (a
        // node's size is 0).
        let size = if fd.meta.file_type().is_block_device() {
            fd.meta.rdev()
        } else {
            fd.meta.size()
        };
        Ok(Some(FdKind::Path {
            path: fd.link.to_string(),
            pos: fd.pos,
            mode: fd.meta.mode(),
            size,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Path { .. })
    }

    fn restore(ctx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Path {
            path,
            pos,
            mode,
            size,
        } = &img.kind
        else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fd = img.fd;
        let kind = mode & libc::S_IFMT;
        // An O_PATH fd on a symbolic link was opened with O_NOFOLLOW.
        let nofollow = if kind == libc::S_IFLNK {
            libc::O_NOFOLLOW
        } else {
            0
        };
        // In the tree's mount namespace, where its own mounts are.
        let f = ctx
            .in_tree_mounts(|| {
                open_with_mode(
                    std::fs::OpenOptions::new()
                        .read(true) // access mode comes from custom_flags below
                        .custom_flags(reopen_flags(img.flags) | nofollow),
                    path,
                    img.flags,
                )
            })?
            .map_err(file_err(path.clone(), format!("fd {fd}"), "open"))?;
        let o: OwnedFd = f.into();
        if kind == libc::S_IFBLK {
            // Another device at that path now: not the disk it was.
            let now = std::fs::File::from(
                o.try_clone()
                    .map_err(io_step(format!("fd {fd} on {path}"), "dup"))?,
            )
            .metadata()
            .map_err(io_step(format!("fd {fd} on {path}"), "fstat"))?;
            if !now.file_type().is_block_device() || now.rdev() != *size {
                return Err(RestoreError::Incompatible(format!(
                    "fd {fd}: {path} is {} here, not the block device {}:{} as at the dump; make that device's node there again (or restore where it is)",
                    if now.file_type().is_block_device() {
                        format!(
                            "the block device {}:{}",
                            libc::major(now.rdev()),
                            libc::minor(now.rdev())
                        )
                    } else {
                        "not a block device".to_string()
                    },
                    libc::major(*size),
                    libc::minor(*size)
                )));
            }
        }
        let o_path = img.flags & libc::O_PATH.unsigned_abs() != 0;
        if matches!(kind, libc::S_IFREG | libc::S_IFDIR | libc::S_IFBLK) && !o_path {
            if kind == libc::S_IFREG && pos > size {
                tracing::warn!(
                    fd,
                    "{path}: offset {pos} is beyond the size it had at dump ({size})"
                );
            }
            let off = i64::try_from(*pos).unwrap_or(i64::MAX);
            fdops::seek_to(o.as_fd(), off)
                .map_err(io_step(format!("seeking {path} to {pos}"), "lseek"))?;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn blk(path: &str, rdev: u64) -> FdImage {
        FdImage {
            fd: 3,
            flags: libc::O_RDONLY.unsigned_abs(),
            cloexec: false,
            kind: FdKind::Path {
                path: path.into(),
                pos: 0,
                mode: libc::S_IFBLK | 0o600,
                size: rdev,
            },
            shared_id: None,
            locks: vec![],
            owner: None,
        }
    }

    // A block device fd is reopened at its path only if the node there is
    // the device it was (its number, saved in `size`).
    #[test]
    fn a_block_device_is_reopened_only_as_the_same_device() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("blk");
        let rdev = libc::makedev(7, 0);
        if nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            rdev,
        )
        .is_err()
        {
            eprintln!("skipped: mknod needs CAP_MKNOD");
            return;
        }
        let path = node.display().to_string();
        let mut cx = RestoreCtx::new(&[], &[], std::iter::empty());
        // (loop0: an unbound loop device opens; reading it fails.)
        match cx.get(&blk(&path, rdev)) {
            Ok(f) => {
                let m =
                    std::fs::metadata(format!("/proc/self/fd/{}", f.as_fd().as_raw_fd())).unwrap();
                assert_eq!(m.rdev(), rdev);
            }
            Err(e) => assert!(!e.to_string().contains("as at the dump"), "{e}"),
        }
        let e = cx
            .get(&blk(&path, libc::makedev(7, 1)))
            .map(|_| ())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is the block device 7:0 here, not the block device 7:1"),
            "{e}"
        );
    }
}
