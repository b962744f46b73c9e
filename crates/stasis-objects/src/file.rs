//! Regular files, directories and character devices: reopened at their
//! path with their access mode and status flags, seeked to their offset.
//! An `O_PATH` fd (no offset) on a symbolic link is opened with
//! `O_NOFOLLOW`, as it must have been. A tree with a mount namespace of
//! its own has its files opened there (its tmpfs and bind mounts).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

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
        Ok(Some(FdKind::Path {
            path: fd.link.to_string(),
            pos: fd.pos,
            mode: fd.meta.mode(),
            size: fd.meta.size(),
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
        let o_path = img.flags & libc::O_PATH.unsigned_abs() != 0;
        if (kind == libc::S_IFREG || kind == libc::S_IFDIR) && !o_path {
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
