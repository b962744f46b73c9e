//! eventfd: its counter and semaphore mode (from fdinfo), made again with them.

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::fdops;

use crate::error::os_err;
use crate::restore::nonblock;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Eventfd;

impl Object for Eventfd {
    const NAME: &'static str = "eventfd";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[eventfd]");

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let (count, semaphore) =
            stasis_kernel::procfs::parse_eventfd(fd.info).map_err(|e| fd.bad_info(e))?;
        Ok(Some(FdKind::Eventfd { count, semaphore }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Eventfd { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Eventfd { count, semaphore } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let flags = libc::EFD_CLOEXEC
            | nonblock(img.flags)
            | if *semaphore { libc::EFD_SEMAPHORE } else { 0 };
        let init = u32::try_from(*count).unwrap_or(0);
        let e = fdops::eventfd(init, flags).map_err(os_err("eventfd"))?;
        if u64::from(init) != *count {
            // Counters beyond u32 are added with a write.
            let rest = count - u64::from(init);
            let _ = nix::unistd::write(e.as_fd(), &rest.to_ne_bytes());
        }
        Ok(e)
    }
}
