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

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.link != "anon_inode:[signalfd]" {
            return Ok(None);
        }
        let mask = cx.procfs().signalfd(fd.info).map_err(|e| fd.bad_info(e))?;
        Ok(Some(FdKind::Signalfd { mask }))
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<Option<OwnedFd>, RestoreError> {
        let FdKind::Signalfd { mask } = &img.kind else {
            return Ok(None);
        };
        let s = fdops::signalfd(*mask, libc::SFD_CLOEXEC | nonblock(img.flags))
            .map_err(os_err("signalfd"))?;
        Ok(Some(s))
    }
}
