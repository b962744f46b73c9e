//! signalfd: its signal mask (from fdinfo), made again with it.

use std::os::fd::OwnedFd;

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::fdops;

use crate::error::os_err;
use crate::restore::nonblock;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Signalfd;

impl Object for Signalfd {
    const NAME: &'static str = "signalfd";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[signalfd]");

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let mask = stasis_kernel::procfs::parse_signalfd(fd.info).map_err(|e| fd.bad_info(e))?;
        Ok(Some(FdKind::Signalfd { mask }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Signalfd { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Signalfd { mask } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let s = fdops::signalfd(*mask, libc::SFD_CLOEXEC | nonblock(img.flags))
            .map_err(os_err("signalfd"))?;
        Ok(s)
    }
}
