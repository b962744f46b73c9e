//! Directories, FIFOs, device nodes and symbolic links (`O_PATH`) deleted
//! while open (`/proc` shows "PATH (deleted)"), and a deleted working
//! directory; made again in the tree's mount namespace (on its own tmpfs
//! and bind mounts, where it had one).
//!
//! **Save.** The node's type, permissions, owner and device number, and a
//! FIFO's queued bytes (as any FIFO's, [`crate::pipe`]).
//!
//! **Restore.** One *keeper* per node, made on first use: the node is
//! made again at its old path when that name is free (so `/proc` shows
//! the same "PATH (deleted)"), else next to it or in the temporary
//! directory (`mkdir`, `mkfifo`, `symlink`, `mknod`: a device node needs
//! `CAP_MKNOD`), given its owner and mode, opened (a FIFO read-write and
//! refilled, a device node `O_PATH`: opening a device can act on it, a
//! link `O_PATH | O_NOFOLLOW`, its fds share that description) and
//! removed at once. Every fd on it is a new description opened through
//! the keeper (`/proc/self/fd/N`), with its own flags. A process whose
//! working directory was deleted gets the directory of an fd on the same
//! path if the tree has one (one inode, as at the dump), else a new
//! empty one ([`RestoreCtx::deleted_cwd`]).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use stasis_image::manifest::{DeletedNode, FdImage, FdKind};
use stasis_kernel::fdops;

use crate::error::{file_err, io_step};
use crate::ghost::{ghost_names, name_unusable};
use crate::restore::{open_with_mode, reopen_flags, setfl_flags};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A deleted directory, FIFO or device node.
pub struct Deleted;

impl Object for Deleted {
    const NAME: &'static str = "deleted directory, FIFO or device node";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        let Some(path) = fd.link.strip_suffix(" (deleted)") else {
            return Ok(None);
        };
        let ft = fd.meta.file_type();
        if fd.socket.is_some() || ft.is_file() {
            return Ok(None);
        }
        let special = ft.is_char_device() || ft.is_block_device();
        if !(ft.is_dir() || ft.is_fifo() || special || ft.is_symlink()) {
            return Err(fd.unsupported(format!(
                "fd {} is a deleted special file ({}), which stasis cannot checkpoint yet",
                fd.fd, fd.link
            )));
        }
        // A pty slave whose node is gone (its devpts entry went when the
        // master was closed): the pty module's (`crate::pty`), which
        // restores it hung up, as a slave of a new pair.
        if ft.is_char_device()
            && (path.starts_with("/dev/pts/") || (136..=143).contains(&libc::major(fd.meta.rdev())))
        {
            return Ok(None);
        }
        if ft.is_fifo() {
            crate::pipe::save_content(cx, fd)?;
        }
        let target = if ft.is_symlink() {
            Some(link_target(fd)?)
        } else {
            None
        };
        let m = fd.meta;
        Ok(Some(FdKind::DeletedNode(DeletedNode {
            path: path.to_string(),
            id: m.ino(),
            mode: m.mode(),
            rdev: m.rdev(),
            uid: m.uid(),
            gid: m.gid(),
            pos: fd.pos,
            target,
        })))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::DeletedNode(_))
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::DeletedNode(node) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fifo = node.mode & libc::S_IFMT == libc::S_IFIFO;
        let keeper = node_keeper(cx, node)?;
        if node.mode & libc::S_IFMT == libc::S_IFLNK {
            // O_PATH on the link itself: the keeper's own kind of fd.
            return keeper.try_clone().map_err(io_step(
                format!("fd {} on the deleted symbolic link {}", img.fd, node.path),
                "dup",
            ));
        }
        let reopen = format!("/proc/self/fd/{}", keeper.as_raw_fd());
        let extra = if fifo { libc::O_NONBLOCK } else { 0 };
        let made: OwnedFd = open_with_mode(
            std::fs::OpenOptions::new().custom_flags(reopen_flags(img.flags) | extra),
            &reopen,
            img.flags,
        )
        .map_err(file_err(
            node.path.clone(),
            format!("fd {} ({})", img.fd, Self::NAME),
            "reopen",
        ))?
        .into();
        if fifo {
            fdops::set_status_flags(made.as_fd(), setfl_flags(img.flags)).map_err(io_step(
                format!("setting the flags of fd {}", img.fd),
                "F_SETFL",
            ))?;
        }
        Ok(made)
    }
}

impl RestoreCtx<'_> {
    /// The directory a process whose working directory `cwd` (as `/proc`
    /// showed it) had been deleted goes into, owned by `uid`/`gid`; `None`
    /// when it was not deleted. The node of an fd of the tree on the same
    /// path if one was made, else a new empty directory, removed.
    pub fn deleted_cwd(
        &mut self,
        cwd: &str,
        (uid, gid): (u32, u32),
    ) -> Result<Option<OwnedFd>, RestoreError> {
        let Some(path) = cwd.strip_suffix(" (deleted)") else {
            return Ok(None);
        };
        let id = match self.deleted_dirs.get(path) {
            Some(id) => *id,
            None => {
                // Not an inode number of the image: the top of the u64 range.
                let id = u64::MAX - self.deleted_dirs.len() as u64;
                let node = DeletedNode {
                    path: path.to_string(),
                    id,
                    mode: libc::S_IFDIR | 0o700,
                    rdev: 0,
                    uid,
                    gid,
                    pos: 0,
                    target: None,
                };
                node_keeper(self, &node)?;
                id
            }
        };
        let dir = self.ghost_keepers[&id].try_clone().map_err(io_step(
            format!("the deleted working directory {path}"),
            "dup",
        ))?;
        Ok(Some(dir))
    }
}

/// The keeper of `node`, made on first use.
fn node_keeper<'c>(
    cx: &'c mut RestoreCtx<'_>,
    node: &DeletedNode,
) -> Result<&'c OwnedFd, RestoreError> {
    if !cx.ghost_keepers.contains_key(&node.id) {
        // Made where the tree's paths are: a node of a tmpfs or bind
        // mount of its own mount namespace is made again on that mount.
        let keeper = cx.in_tree_mounts(|| make_node(node))??;
        if node.mode & libc::S_IFMT == libc::S_IFIFO {
            if let Some(data) = cx.pipe_data.get(&node.id) {
                crate::pipe::fill(&keeper, data)?;
            }
        }
        if node.mode & libc::S_IFMT == libc::S_IFDIR {
            cx.deleted_dirs.insert(node.path.clone(), node.id);
        }
        cx.ghost_keepers.insert(node.id, keeper);
    }
    Ok(&cx.ghost_keepers[&node.id])
}

/// Makes `node` at the first usable of its names, opens it and removes it.
fn make_node(node: &DeletedNode) -> Result<OwnedFd, RestoreError> {
    let what = describe(node.mode);
    let mut last = None;
    for target in ghost_names(&node.path, node.id) {
        match create(&target, node) {
            Ok(()) => {
                let opened = attributes(&target, node).and_then(|()| open_node(&target, node));
                let removed = if node.mode & libc::S_IFMT == libc::S_IFDIR {
                    std::fs::remove_dir(&target)
                } else {
                    std::fs::remove_file(&target)
                };
                let keeper = opened?;
                removed.map_err(file_err(
                    target.display().to_string(),
                    format!("removing a rebuilt deleted {what}"),
                    "unlink",
                ))?;
                return Ok(keeper);
            }
            Err(e) if name_unusable(&e) && e.raw_os_error() != Some(libc::EPERM) => {
                last = Some((target, e));
            }
            Err(e) => {
                let hint = if e.raw_os_error() == Some(libc::EPERM) {
                    " (making a device node needs CAP_MKNOD)"
                } else {
                    ""
                };
                return Err(file_err(
                    target.display().to_string(),
                    format!("recreating a deleted {what}{hint}"),
                    "mknod",
                )(e));
            }
        }
    }
    let (target, e) = last.unwrap_or_else(|| {
        (
            node.path.clone().into(),
            std::io::ErrorKind::NotFound.into(),
        )
    });
    Err(file_err(
        target.display().to_string(),
        format!("recreating a deleted {what} (no usable name next to it nor in the temporary directory)"),
        "mknod",
    )(e))
}

/// What the symbolic link `fd` (an `O_PATH` fd) points to.
fn link_target(fd: &OpenFd<'_>) -> Result<String, SaveError> {
    let copy = stasis_kernel::pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
    nix::fcntl::readlinkat(Some(copy.as_raw_fd()), "")
        .map(|t| t.to_string_lossy().into_owned())
        .map_err(|e| SaveError::Proc {
            pid: fd.pid,
            file: format!("fd/{} (readlinkat)", fd.fd),
            source: e.into(),
        })
}

/// What a node of mode `mode` is, for messages.
fn describe(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFIFO => "FIFO",
        libc::S_IFLNK => "symbolic link",
        _ => "device node",
    }
}

/// Makes the node, private to its owner until its attributes are set.
fn create(target: &Path, node: &DeletedNode) -> std::io::Result<()> {
    use nix::sys::stat::{mknod, Mode, SFlag};
    let private = Mode::from_bits_truncate(0o600);
    let r = match node.mode & libc::S_IFMT {
        libc::S_IFDIR => nix::unistd::mkdir(target, Mode::from_bits_truncate(0o700)),
        libc::S_IFIFO => nix::unistd::mkfifo(target, private),
        libc::S_IFLNK => nix::unistd::symlinkat(node.target.as_deref().unwrap_or(""), None, target),
        kind => mknod(target, SFlag::from_bits_truncate(kind), private, node.rdev),
    };
    r.map_err(std::io::Error::from)
}

/// Owner then mode (`chown` clears set-id bits) of the node just made.
fn attributes(target: &Path, node: &DeletedNode) -> Result<(), RestoreError> {
    let err = |op: &str| {
        file_err(
            target.display().to_string(),
            format!(
                "giving a rebuilt deleted {} its owner and mode",
                describe(node.mode)
            ),
            op,
        )
    };
    std::os::unix::fs::lchown(target, Some(node.uid), Some(node.gid)).map_err(err("chown"))?;
    if node.mode & libc::S_IFMT == libc::S_IFLNK {
        // A link's own mode is always 0777.
        return Ok(());
    }
    std::fs::set_permissions(
        target,
        std::os::unix::fs::PermissionsExt::from_mode(node.mode & 0o7777),
    )
    .map_err(err("chmod"))
}

/// The keeper's open: a directory read-only, a FIFO read-write (it holds
/// the queued bytes, and lets any end open without waiting), a device
/// node `O_PATH`.
fn open_node(target: &Path, node: &DeletedNode) -> Result<OwnedFd, RestoreError> {
    let mut o = std::fs::OpenOptions::new();
    let flags = libc::O_CLOEXEC | libc::O_NOFOLLOW;
    match node.mode & libc::S_IFMT {
        libc::S_IFDIR => o.read(true).custom_flags(flags | libc::O_DIRECTORY),
        libc::S_IFIFO => o
            .read(true)
            .write(true)
            .custom_flags(flags | libc::O_NONBLOCK),
        // A device node, a symbolic link (O_NOFOLLOW: the link itself).
        _ => o.read(true).custom_flags(flags | libc::O_PATH),
    };
    o.open(target).map(OwnedFd::from).map_err(file_err(
        target.display().to_string(),
        format!("opening a rebuilt deleted {}", describe(node.mode)),
        "open",
    ))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    use stasis_image::manifest::PipeImage;

    use super::*;

    fn node(path: &Path, id: u64, mode: u32) -> FdImage {
        FdImage {
            fd: 5,
            flags: libc::O_NONBLOCK.unsigned_abs(),
            cloexec: false,
            kind: FdKind::DeletedNode(DeletedNode {
                path: path.display().to_string(),
                id,
                mode,
                rdev: 0,
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                pos: 0,
                target: None,
            }),
            shared_id: None,
            locks: vec![],
            owner: None,
        }
    }

    fn meta(fd: &FdRef<'_>) -> std::fs::Metadata {
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())).unwrap()
    }

    use crate::FdRef;

    // A deleted FIFO comes back deleted, at its path, with its bytes and
    // mode; a deleted working directory is the node of an fd on it.
    #[test]
    fn a_deleted_fifo_keeps_its_bytes_and_a_deleted_cwd_is_the_fds_directory() {
        let dir = std::env::temp_dir().join(format!("stasis-deleted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pipes = [PipeImage {
            id: 7,
            capacity: 65536,
            data: b"queued".to_vec(),
        }];
        let mut cx = RestoreCtx::new(&pipes, &[], std::iter::empty());
        let fifo = cx
            .get(&node(&dir.join("f"), 7, libc::S_IFIFO | 0o640))
            .unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fifo.as_fd().as_raw_fd()));
        assert_eq!(
            link.unwrap().display().to_string(),
            format!("{} (deleted)", dir.join("f").display())
        );
        let m = meta(&fifo);
        assert_eq!((m.mode(), m.nlink()), (libc::S_IFIFO | 0o640, 0));
        let mut buf = [0u8; 16];
        let n = nix::unistd::read(fifo.as_fd().as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"queued");
        drop(fifo);
        let d = cx
            .get(&node(&dir.join("d"), 8, libc::S_IFDIR | 0o750))
            .unwrap();
        let (ino, mode) = (meta(&d).ino(), meta(&d).mode());
        drop(d);
        assert_eq!(mode, libc::S_IFDIR | 0o750);
        let cwd = format!("{} (deleted)", dir.join("d").display());
        let c = cx.deleted_cwd(&cwd, (0, 0)).unwrap().unwrap();
        assert_eq!(
            std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
                .unwrap()
                .ino(),
            ino
        );
        // Another deleted working directory is a new, empty, removed one.
        let other = format!("{} (deleted)", dir.join("gone").display());
        let o = cx.deleted_cwd(&other, (0, 0)).unwrap().unwrap();
        let om = std::fs::metadata(format!("/proc/self/fd/{}", o.as_raw_fd())).unwrap();
        assert!(om.is_dir() && om.nlink() == 0 && om.ino() != ino);
        assert!(cx.deleted_cwd("/srv", (0, 0)).unwrap().is_none());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing left behind"
        );
        std::fs::remove_dir(&dir).unwrap();
    }
}
