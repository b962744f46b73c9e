//! epoll: its registrations (target fd, events, data; from fdinfo). The
//! instance is made by the restorer; the registrations are made by the
//! process itself ([`restore_targets`]), after all its fds exist, because
//! the kernel keys them by the registering process's fd numbers.
//!
//! A registration outlives the fd it was made with: the fd may be closed
//! since, or its number reused by another file (registered again: one
//! number, several registrations). `kcmp(KCMP_EPOLL_TFD)` tells whether
//! an fd of the process is a registration's file; when the fd of its
//! number is not, another fd on that file (same inode, and `kcmp` says
//! so) is saved as its `source`, and the restore puts it at the number
//! for the time of the registration (what held the number is moved
//! aside and put back).
//!
//! An epoll in flight (sent with `SCM_RIGHTS`, in a unix socket's queue,
//! held by no process) is saved from the dumper's copy of it; its
//! registrations name fds of the process that holds that socket (its
//! `registrar`, the one that will receive it), matched there by
//! `kcmp(KCMP_EPOLL_TFD)` across the two processes. The restore makes it
//! with the queue, and the registrar registers the targets once its own
//! fds exist, through a copy planted for that moment
//! ([`crate::RestoreCtx::take_in_flight_epolls`]).

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{EpollTarget, FdImage, FdKind};
use stasis_kernel::fdops;
use stasis_kernel::remote::Remote;
use stasis_sys::net::EPOLL_EVENT_LEN;

use crate::error::{os_err, step};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError, Scratch};

pub struct Epoll;

impl Object for Epoll {
    const NAME: &'static str = "epoll";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[eventpoll]");

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let registrar = cx.epoll_registrar;
        let parsed = stasis_kernel::procfs::parse_epoll(fd.info).map_err(|e| fd.bad_info(e))?;
        let inos = target_inodes(fd.info);
        let mut targets: Vec<EpollTarget> = Vec::with_capacity(parsed.len());
        for (i, (tfd, events, data)) in parsed.into_iter().enumerate() {
            let toff = targets.iter().filter(|t| t.fd == tfd).count();
            let toff = u32::try_from(toff).unwrap_or(u32::MAX);
            let ino = inos.get(i).copied().flatten();
            let source = find_source(fd, registrar, (tfd, toff), ino)?;
            targets.push(EpollTarget {
                fd: tfd,
                events,
                data,
                source,
            });
        }
        Ok(Some(FdKind::Epoll { targets, registrar }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Epoll { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Epoll { registrar, .. } = img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let e = fdops::epoll_create(libc::EPOLL_CLOEXEC).map_err(os_err("epoll_create1"))?;
        if let Some(pid) = registrar {
            let copy = e.try_clone().map_err(os_err("dup of an epoll in flight"))?;
            cx.add_in_flight_epoll(pid, copy, img.clone());
        }
        Ok(e)
    }
}

/// The `ino:` (hex) of each `tfd:` line of an epoll fdinfo, in order.
fn target_inodes(info: &str) -> Vec<Option<u64>> {
    info.lines()
        .filter(|l| l.starts_with("tfd:"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("ino:"))
                .and_then(|v| u64::from_str_radix(v, 16).ok())
        })
        .collect()
}

/// `None` when fd `tfd` of the process whose numbers the registrations
/// name (the epoll's holder, or `registrar` for one in flight) is the file
/// of the `toff`-th registration of `tfd` (or the kernel cannot tell);
/// else another fd of that process on that file (inode `ino`). None at
/// all is refused.
fn find_source(
    fd: &OpenFd<'_>,
    registrar: Option<i32>,
    (tfd, toff): (i32, u32),
    ino: Option<u64>,
) -> Result<Option<i32>, SaveError> {
    let pid = registrar.unwrap_or(fd.pid);
    let is_target = |cand: i32| fdops::kcmp_epoll_target_of(pid, cand, (fd.pid, fd.fd), tfd, toff);
    if is_target(tfd) {
        return Ok(None);
    }
    let same_inode = |cand: i32| {
        std::fs::metadata(crate::save::proc_path(pid, &format!("fd/{cand}")))
            .is_ok_and(|m| Some(m.ino()) == ino)
    };
    let fds = crate::save::list_fds(pid)?;
    if let Some(s) = fds.into_iter().find(|&c| same_inode(c) && is_target(c)) {
        return Ok(Some(s));
    }
    // kcmp cannot tell (CONFIG_CHECKPOINT_RESTORE off): as before.
    if std::fs::metadata(crate::save::proc_path(pid, &format!("fd/{tfd}")))
        .is_ok_and(|m| Some(m.ino()) == ino)
    {
        return Ok(None);
    }
    Err(match registrar {
        None => fd.unsupported(format!(
            "epoll fd {} has a registration of fd {tfd}, which was closed since and whose file no fd of the process holds, which stasis cannot checkpoint",
            fd.fd
        )),
        Some(pid) => SaveError::Unsupported {
            pid,
            what: format!("an epoll in flight (SCM_RIGHTS) in the queue of one of its sockets has a registration of fd {tfd}, whose file no fd of this process holds, which stasis cannot checkpoint"),
        },
    })
}

/// Registers the saved targets of the epoll instance `img` (run by the
/// process itself, after all its fds exist).
pub fn restore_targets<R: Remote>(
    r: &mut R,
    at: Scratch,
    img: &FdImage,
) -> Result<(), RestoreError> {
    let FdKind::Epoll { targets, .. } = &img.kind else {
        return Ok(());
    };
    for t in targets {
        // struct epoll_event is packed on x86-64: u32 events, u64 data.
        let mut ev = Vec::with_capacity(EPOLL_EVENT_LEN);
        ev.extend_from_slice(&t.events.to_le_bytes());
        ev.extend_from_slice(&t.data.to_le_bytes());
        let a = r.put(at.structs, &ev).map_err(step("epoll_event"))?;
        let (efd, tfd) = (
            u64::from(img.fd.unsigned_abs()),
            u64::from(t.fd.unsigned_abs()),
        );
        let what = || format!("registering fd {} in epoll fd {}", t.fd, img.fd);
        let Some(src) = t.source else {
            let add = libc::EPOLL_CTL_ADD.unsigned_abs().into();
            r.sys("epoll_ctl", libc::SYS_epoll_ctl, &[efd, add, tfd, a])
                .map_err(step(what()))?;
            continue;
        };
        register_through(r, (efd, tfd, a), u64::from(src.unsigned_abs())).map_err(step(what()))?;
    }
    Ok(())
}

/// Registers the file of fd `src` under fd number `tfd` in epoll `efd`
/// (event at `ev`): whatever holds `tfd` is moved aside (with its
/// close-on-exec flag) and put back after.
fn register_through<R: Remote>(
    r: &mut R,
    (efd, tfd, ev): (u64, u64, u64),
    src: u64,
) -> Result<(), stasis_kernel::KernelError> {
    let fcntl = |r: &mut R, fd: u64, cmd: i32, arg: u64| {
        r.sys(
            "fcntl",
            libc::SYS_fcntl,
            &[fd, cmd.unsigned_abs().into(), arg],
        )
    };
    // What holds the number now, if anything (EBADF: nothing).
    let held = match fcntl(r, tfd, libc::F_GETFD, 0) {
        Ok(fl) => Some((fcntl(r, tfd, libc::F_DUPFD_CLOEXEC, 0)?, fl)),
        Err(_) => None,
    };
    r.sys("dup3", libc::SYS_dup3, &[src, tfd, 0])?;
    let add = libc::EPOLL_CTL_ADD.unsigned_abs().into();
    let added = r.sys("epoll_ctl", libc::SYS_epoll_ctl, &[efd, add, tfd, ev]);
    match held {
        Some((aside, fl)) => {
            let cloexec = if fl & 1 != 0 { libc::O_CLOEXEC } else { 0 };
            r.sys(
                "dup3",
                libc::SYS_dup3,
                &[aside, tfd, cloexec.unsigned_abs().into()],
            )?;
            r.sys("close", libc::SYS_close, &[aside])?;
        }
        None => {
            r.sys("close", libc::SYS_close, &[tfd])?;
        }
    }
    added.map(drop)
}

#[cfg(test)]
mod tests {
    use stasis_kernel::remote::Recorder;

    use super::*;

    fn epoll(targets: Vec<EpollTarget>) -> FdImage {
        FdImage {
            fd: 5,
            flags: 0,
            cloexec: false,
            kind: FdKind::Epoll {
                targets,
                registrar: None,
            },
            shared_id: None,
            locks: vec![],
            owner: None,
        }
    }

    fn target(fd: i32, source: Option<i32>) -> EpollTarget {
        EpollTarget {
            fd,
            events: 1,
            data: 7,
            source,
        }
    }

    // zdtm epoll: fd 999 registered, then closed; its file is still held
    // as fd 701: it is put at 999 for the registration, then closed.
    #[test]
    fn a_registration_of_a_closed_fd_goes_through_its_file() {
        let mut r = Recorder {
            fail_on: Some(("fcntl", libc::EBADF)),
            ..Recorder::default()
        };
        let img = epoll(vec![target(3, None), target(999, Some(701))]);
        restore_targets(&mut r, Scratch { structs: 0 }, &img).unwrap();
        assert_eq!(
            r.names(),
            ["epoll_ctl", "fcntl", "dup3", "epoll_ctl", "close"]
        );
        assert_eq!(r.args_of("dup3"), [vec![701, 999, 0]]);
        let ctl: Vec<_> = r
            .args_of("epoll_ctl")
            .iter()
            .map(|a| (a[0], a[2]))
            .collect();
        assert_eq!(ctl, [(5, 3), (5, 999)]);
        assert_eq!(r.args_of("close"), [vec![999]]);
    }

    // zdtm epoll01: the number now holds another file: it is moved aside
    // and put back, with its close-on-exec flag.
    #[test]
    fn a_number_held_by_another_file_is_put_back() {
        let mut r = Recorder::default();
        let img = epoll(vec![target(702, Some(4))]);
        restore_targets(&mut r, Scratch { structs: 0 }, &img).unwrap();
        assert_eq!(
            r.names(),
            ["fcntl", "fcntl", "dup3", "epoll_ctl", "dup3", "close"]
        );
        let fcntls: Vec<_> = r.args_of("fcntl").iter().map(|a| (a[0], a[1])).collect();
        assert_eq!(
            fcntls,
            [
                (702, libc::F_GETFD.unsigned_abs().into()),
                (702, libc::F_DUPFD_CLOEXEC.unsigned_abs().into())
            ]
        );
        // The recorder's F_DUPFD_CLOEXEC gives 0 (the fd put aside).
        assert_eq!(r.args_of("dup3"), [vec![4, 702, 0], vec![0, 702, 0]]);
        assert_eq!(r.args_of("close"), [vec![0]]);
    }

    #[test]
    fn target_inodes_are_read_in_order() {
        let info = "pos:\t0\ntfd:      999 events:       19 data:                0  pos:0 ino:1a sdev:e\ntfd:        4 events: 1 data: 1 pos:0 ino:ff sdev:e\n";
        assert_eq!(target_inodes(info), [Some(0x1a), Some(0xff)]);
    }
}
