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

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.link != "anon_inode:[eventfd]" {
            return Ok(None);
        }
        let (count, semaphore) = cx.procfs().eventfd(fd.info).map_err(|e| fd.bad_info(e))?;
        Ok(Some(FdKind::Eventfd { count, semaphore }))
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<Option<OwnedFd>, RestoreError> {
        let FdKind::Eventfd { count, semaphore } = &img.kind else {
            return Ok(None);
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
        Ok(Some(e))
    }
}
