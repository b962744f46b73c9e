//! inotify: its watches, each resolved at dump to a path (with
//! `open_by_handle_at` on the filesystem it lives on) and added again at
//! restore at its watch descriptor.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, InotifyWatch};
use stasis_kernel::{fdops, KernelError};

use crate::error::os_err;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Inotify;

impl Object for Inotify {
    const NAME: &'static str = "inotify";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:inotify");

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let watches = watches(fd)?;
        for w in &watches {
            if let Some(id) = w.ghost {
                cx.ghost_watches.push((fd.pid, fd.fd, w.wd, id));
            }
        }
        Ok(Some(FdKind::Inotify { watches }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Inotify { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Inotify { watches } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        // A watch on a deleted file goes on its rebuilt file, through the
        // restorer's own fd on it.
        let mut paths = Vec::with_capacity(watches.len());
        for w in watches {
            paths.push(match w.ghost {
                Some(id) => {
                    let k = crate::ghost::keeper_of_deleted(cx, id, &w.path)?;
                    format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(k))
                }
                None => w.path.clone(),
            });
        }
        restore(img.fd, img.flags, watches, &paths)
    }
}

/// The watches of an inotify fd, each resolved to a path.
fn watches(fd: &OpenFd<'_>) -> Result<Vec<InotifyWatch>, SaveError> {
    let n = fd.fd;
    let lines = stasis_kernel::procfs::parse_inotify(fd.info).map_err(|e| fd.unsupported(e.0))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| fd.unsupported(e.to_string()))?;
    let mut out = Vec::new();
    for (wd, sdev, mask, ty, handle) in lines {
        // Kernel dev_t: major in the high 12 bits, minor in the low 20.
        let (major, minor) = (sdev >> 20, sdev & 0xfffff);
        let mount = crate::fanotify::mount_point(&mounts, Some((major, minor)), None).ok_or_else(|| fd.unsupported(format!("fd {n}: inotify watch {wd} is on a filesystem ({major}:{minor}) that is not mounted here")))?;
        let mfd = std::fs::File::open(&mount)
            .map_err(|e| fd.unsupported(format!("fd {n}: opening mount {mount}: {e}")))?;
        let o = fdops::open_by_handle(mfd.as_fd(), ty, &handle, libc::O_PATH | libc::O_CLOEXEC)
            .map_err(|e| fd.unsupported(format!("fd {n}: the file watched by inotify watch {wd} cannot be found again ({e}); was it deleted?")))?;
        let path = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&o)
        ))
        .map_err(|e| fd.unsupported(e.to_string()))?;
        let path = path.to_string_lossy().into_owned();
        // A deleted file: the tree must hold it open too (checked once the
        // tree is saved, `SaveCtx::check_ghost_watches`), so that it is
        // rebuilt.
        let (path, ghost) = match path.strip_suffix(" (deleted)") {
            Some(old) => {
                let ino = std::fs::metadata(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&o)
                ))
                .map_err(|e| fd.unsupported(e.to_string()))?
                .ino();
                (old.to_string(), Some(ino))
            }
            None => (path, None),
        };
        out.push(InotifyWatch {
            wd,
            path,
            mask,
            ghost,
        });
    }
    out.sort_by_key(|w| w.wd);
    Ok(out)
}

/// An inotify instance with its watches at their watch descriptors
/// (descriptors are allocated in increasing order, so gaps are skipped by
/// adding and removing a throw-away watch).
fn restore(
    fd: i32,
    flags: u32,
    watches: &[InotifyWatch],
    paths: &[String],
) -> Result<OwnedFd, RestoreError> {
    let nb = if flags & libc::O_NONBLOCK.unsigned_abs() != 0 {
        libc::IN_NONBLOCK
    } else {
        0
    };
    let i = fdops::inotify_init(libc::IN_CLOEXEC | nb).map_err(os_err("inotify_init1"))?;
    let add = |path: &str, mask: u32| -> Result<i32, RestoreError> {
        let c = CString::new(path)
            .map_err(|_| RestoreError::Inconsistent(format!("watch path {path:?} has a NUL")))?;
        fdops::inotify_add_watch(i.as_fd(), &c, mask).map_err(|e| RestoreError::File {
            path: path.into(),
            what: format!("inotify watch of fd {fd}"),
            source: KernelError::Io {
                what: "inotify_add_watch".into(),
                source: e,
            },
        })
    };
    for (w, path) in watches.iter().zip(paths) {
        // Through /proc/self/fd a watch must follow the link.
        let mask = if w.ghost.is_some() {
            w.mask & !libc::IN_DONT_FOLLOW
        } else {
            w.mask
        };
        loop {
            let wd = add(path, mask)?;
            if wd == w.wd {
                break;
            }
            if wd > w.wd {
                return Err(RestoreError::Inconsistent(format!(
                    "fd {fd}: inotify watch {} came back as {wd} (two watches on one file?)",
                    w.wd
                )));
            }
            // Burn this descriptor and try again.
            let _ = fdops::inotify_rm_watch(i.as_fd(), wd);
        }
    }
    drain(&i);
    Ok(i)
}

/// Drops the IN_IGNORED events the burnt descriptors queued (events that
/// were pending at dump time are not part of the image either).
fn drain(i: &OwnedFd) {
    let Ok(fl) = fdops::status_flags(i.as_fd()) else {
        return;
    };
    let _ = fdops::set_status_flags(i.as_fd(), fl | libc::O_NONBLOCK);
    let mut buf = [0u8; 4096];
    while nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(i), &mut buf).is_ok_and(|n| n > 0) {}
    let _ = fdops::set_status_flags(i.as_fd(), fl);
}
