//! epoll: its registrations (target fd, events, data; from fdinfo). The
//! instance is made by the restorer; the registrations are made by the
//! process itself ([`restore_targets`]), after all its fds exist, because
//! the kernel keys them by the registering process's fd numbers.

use std::os::fd::OwnedFd;

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

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let targets = stasis_kernel::procfs::parse_epoll(fd.info)
            .map_err(|e| fd.bad_info(e))?
            .into_iter()
            .map(|(fd, events, data)| EpollTarget { fd, events, data })
            .collect();
        Ok(Some(FdKind::Epoll { targets }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Epoll { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        if !matches!(img.kind, FdKind::Epoll { .. }) {
            return Err(crate::restore::not_mine(Self::NAME, img));
        }
        let e = fdops::epoll_create(libc::EPOLL_CLOEXEC).map_err(os_err("epoll_create1"))?;
        Ok(e)
    }
}

/// Registers the saved targets of the epoll instance `img` (run by the
/// process itself, after all its fds exist).
pub fn restore_targets<R: Remote>(
    r: &mut R,
    at: Scratch,
    img: &FdImage,
) -> Result<(), RestoreError> {
    let FdKind::Epoll { targets } = &img.kind else {
        return Ok(());
    };
    for t in targets {
        // struct epoll_event is packed on x86-64: u32 events, u64 data.
        let mut ev = Vec::with_capacity(EPOLL_EVENT_LEN);
        ev.extend_from_slice(&t.events.to_le_bytes());
        ev.extend_from_slice(&t.data.to_le_bytes());
        let a = r.put(at.structs, &ev).map_err(step("epoll_event"))?;
        r.sys(
            "epoll_ctl",
            libc::SYS_epoll_ctl,
            &[
                u64::from(img.fd.unsigned_abs()),
                libc::EPOLL_CTL_ADD.unsigned_abs().into(),
                u64::from(t.fd.unsigned_abs()),
                a,
            ],
        )
        .map_err(step(format!(
            "registering fd {} in epoll fd {}",
            t.fd, img.fd
        )))?;
    }
    Ok(())
}
