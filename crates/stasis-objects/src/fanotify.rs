//! fanotify: a group with its `fanotify_init` flags and its marks (on
//! inodes, mounts and whole filesystems), each resolved at dump to a path
//! (an inode with `open_by_handle_at` on the filesystem it lives on, a
//! mount by its id, a filesystem by one of its mount points) and marked
//! again at restore with its mask, ignored mask and flags.
//!
//! Events queued at dump time are not part of the image (as with
//! inotify): the restored group starts with an empty queue. A mark on a
//! deleted file is refused. A group of a permission class
//! (`FAN_CLASS_CONTENT`, `FAN_CLASS_PRE_CONTENT`) comes back as it was;
//! while its process is frozen, every access its permission marks cover
//! waits for it, the dumper's own included (the image directory must not
//! be under such a mark).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use stasis_image::manifest::{FanotifyMark, FanotifyTarget, FdImage, FdKind};
use stasis_kernel::procfs::{parse_fanotify, FanotifyObject};
use stasis_kernel::{fdops, KernelError};

use crate::error::os_err;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// Saved with a mark on a symbolic link itself (not a flag the kernel
/// reports; the bit of `FAN_MARK_DONT_FOLLOW`, which marks it so again).
const ON_SYMLINK: u32 = libc::FAN_MARK_DONT_FOLLOW;

pub struct Fanotify;

impl Object for Fanotify {
    const NAME: &'static str = "fanotify";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[fanotify]");

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let (flags, event_flags, lines) =
            parse_fanotify(fd.info).map_err(|e| fd.unsupported(e.0))?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| fd.unsupported(format!("reading /proc/self/mountinfo: {e}")))?;
        let marks = lines
            .into_iter()
            .map(|m| mark(fd, &mounts, m))
            .collect::<Result<Vec<_>, _>>()?;
        // A mark on a deleted file: the tree must hold it open too (checked
        // once the tree is saved, as inotify's: `SaveCtx::check_ghost_watches`).
        for m in &marks {
            if let Some(id) = m.ghost {
                cx.ghost_watches.push((fd.pid, fd.fd, -1, id));
            }
        }
        Ok(Some(FdKind::Fanotify {
            flags,
            event_flags,
            marks,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Fanotify { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Fanotify {
            flags,
            event_flags,
            marks,
        } = &img.kind
        else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        // A mark on a deleted file goes on its rebuilt file, through the
        // restorer's own fd on it (followed: it is a magic link).
        let mut marks = marks.clone();
        for m in &mut marks {
            if let Some(id) = m.ghost {
                let k = crate::ghost::keeper_of_deleted(cx, id, &m.path)?;
                m.path = format!("/proc/self/fd/{}", k.as_raw_fd());
                m.mflags &= !ON_SYMLINK;
            }
        }
        restore(img.fd, img.flags, (*flags, *event_flags), &marks)
    }
}

/// The mount point of the filesystem with device `major:minor`, or of the
/// mount with id `mnt_id` (`/proc/self/mountinfo` fields 3 and 1); inotify
/// finds its watches' filesystems with it too.
pub(crate) fn mount_point(
    mounts: &str,
    dev: Option<(u32, u32)>,
    mnt_id: Option<u32>,
) -> Option<String> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let hit = match (dev, mnt_id) {
            (Some((major, minor)), _) => f.get(2) == Some(&format!("{major}:{minor}").as_str()),
            (None, Some(id)) => f.first() == Some(&id.to_string().as_str()),
            (None, None) => false,
        };
        hit.then(|| f.get(4).map(|m| m.to_string())).flatten()
    })
}

/// Kernel dev_t: major in the high 12 bits, minor in the low 20.
fn split_dev(sdev: u32) -> (u32, u32) {
    (sdev >> 20, sdev & 0xfffff)
}

/// One mark, its object found again by path.
fn mark(
    fd: &OpenFd<'_>,
    mounts: &str,
    m: stasis_kernel::procfs::FanotifyMark,
) -> Result<FanotifyMark, SaveError> {
    let n = fd.fd;
    let (on, path, extra) = match m.on {
        FanotifyObject::Mount { mnt_id } => {
            let p = mount_point(mounts, None, Some(mnt_id)).ok_or_else(|| {
                fd.unsupported(format!(
                    "fd {n}: a fanotify mark is on mount {mnt_id}, which is not mounted here"
                ))
            })?;
            (FanotifyTarget::Mount, p, 0)
        }
        FanotifyObject::Filesystem { sdev } => {
            let (major, minor) = split_dev(sdev);
            let p = mount_point(mounts, Some((major, minor)), None).ok_or_else(|| {
                fd.unsupported(format!(
                    "fd {n}: a fanotify mark is on a filesystem ({major}:{minor}) that is not mounted here"
                ))
            })?;
            (FanotifyTarget::Filesystem, p, 0)
        }
        FanotifyObject::Inode {
            sdev,
            handle_type,
            handle,
        } => {
            let (major, minor) = split_dev(sdev);
            let mount = mount_point(mounts, Some((major, minor)), None).ok_or_else(|| {
                fd.unsupported(format!(
                    "fd {n}: a fanotify mark is on a filesystem ({major}:{minor}) that is not mounted here"
                ))
            })?;
            let mfd = std::fs::File::open(&mount)
                .map_err(|e| fd.unsupported(format!("fd {n}: opening mount {mount}: {e}")))?;
            let o = fdops::open_by_handle(
                mfd.as_fd(),
                handle_type,
                &handle,
                libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
            .map_err(|e| {
                fd.unsupported(format!(
                    "fd {n}: the file a fanotify mark is on cannot be found again ({e}); was it deleted?"
                ))
            })?;
            let link = format!("/proc/self/fd/{}", o.as_raw_fd());
            let path = std::fs::read_link(&link)
                .map_err(|e| fd.unsupported(e.to_string()))?
                .to_string_lossy()
                .into_owned();
            if let Some(old) = path.strip_suffix(" (deleted)") {
                let ino = std::os::unix::fs::MetadataExt::ino(
                    &std::fs::metadata(&link).map_err(|e| fd.unsupported(e.to_string()))?,
                );
                return Ok(FanotifyMark {
                    on: FanotifyTarget::Inode,
                    path: old.to_string(),
                    mflags: m.mflags,
                    mask: m.mask,
                    ignored_mask: m.ignored_mask,
                    ghost: Some(ino),
                });
            }
            // The fd's own inode (the magic link resolves to it, a
            // symbolic link included).
            let symlink = std::fs::metadata(&link).is_ok_and(|md| md.file_type().is_symlink());
            (
                FanotifyTarget::Inode,
                path,
                if symlink { ON_SYMLINK } else { 0 },
            )
        }
    };
    Ok(FanotifyMark {
        on,
        path,
        mflags: m.mflags | extra,
        mask: m.mask,
        ignored_mask: m.ignored_mask,
        ghost: None,
    })
}

/// A fanotify group with its marks.
fn restore(
    fd: i32,
    status: u32,
    (flags, event_flags): (u32, u32),
    marks: &[FanotifyMark],
) -> Result<OwnedFd, RestoreError> {
    // The group's flags exactly as `fanotify_init` was given them: its
    // fdinfo shows them, FAN_CLOEXEC and FAN_NONBLOCK included (zdtm's
    // fanotify00 compares them). The fd's own flags are set apart: the
    // description's O_NONBLOCK as it is now (fcntl may have changed it
    // since), and close-on-exec here at once, the process's flag later.
    let g = fdops::fanotify_init(flags, event_flags).map_err(os_err("fanotify_init"))?;
    fdops::set_cloexec(g.as_fd()).map_err(os_err("setting close-on-exec"))?;
    let now = fdops::status_flags(g.as_fd()).map_err(os_err("reading the status flags"))?;
    let nonblock = libc::O_NONBLOCK;
    let want = if status & nonblock.unsigned_abs() != 0 {
        now | nonblock
    } else {
        now & !nonblock
    };
    if want != now {
        fdops::set_status_flags(g.as_fd(), want).map_err(os_err("setting O_NONBLOCK"))?;
    }
    // The kernel lists a group's marks newest first: added oldest first,
    // they are listed as they were.
    for m in marks.iter().rev() {
        let c = CString::new(m.path.as_str()).map_err(|_| {
            RestoreError::Inconsistent(format!("fanotify mark path {:?} has a NUL", m.path))
        })?;
        let base = libc::FAN_MARK_ADD
            | match m.on {
                FanotifyTarget::Inode => 0,
                FanotifyTarget::Mount => libc::FAN_MARK_MOUNT,
                FanotifyTarget::Filesystem => libc::FAN_MARK_FILESYSTEM,
            }
            | (m.mflags & (libc::FAN_MARK_EVICTABLE | ON_SYMLINK));
        let add = |flags: u32, mask: u64| {
            fdops::fanotify_mark(g.as_fd(), flags, mask, &c).map_err(|e| RestoreError::File {
                path: m.path.clone(),
                what: format!("fanotify mark of fd {fd} (mask {mask:#x}, flags {flags:#x})"),
                source: KernelError::Io {
                    what: "fanotify_mark".into(),
                    source: e,
                },
            })
        };
        if m.mask != 0 {
            add(base, m.mask)?;
        }
        if m.ignored_mask != 0 {
            let ignore = if m.mflags & libc::FAN_MARK_IGNORE == libc::FAN_MARK_IGNORE {
                libc::FAN_MARK_IGNORE
            } else {
                libc::FAN_MARK_IGNORED_MASK
            };
            add(
                base | ignore | (m.mflags & libc::FAN_MARK_IGNORED_SURV_MODIFY),
                m.ignored_mask,
            )?;
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
31 27 0:26 / /dev/shm rw - tmpfs tmpfs rw\n";

    #[test]
    fn marks_find_their_mount_points() {
        assert_eq!(
            mount_point(MOUNTS, None, Some(31)).as_deref(),
            Some("/dev/shm")
        );
        assert_eq!(
            mount_point(MOUNTS, Some((254, 0)), None).as_deref(),
            Some("/")
        );
        assert_eq!(
            mount_point(MOUNTS, Some((0, 26)), None).as_deref(),
            Some("/dev/shm")
        );
        assert_eq!(mount_point(MOUNTS, None, Some(99)), None);
        assert_eq!(split_dev(0xfe0_0000), (254, 0));
        assert_eq!(split_dev(0x1b), (0, 27));
    }
}
