//! timerfd: clock, time to the next expiry, interval and pending
//! expirations (from fdinfo), armed again with them.

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::fdops;

use crate::error::{io_step, os_err};
use crate::restore::nonblock;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Timerfd;

/// The first expiry to arm a saved timer with (timerfd, POSIX timer or
/// itimer, in its own unit), or `None` if it was disarmed. A periodic timer
/// read between an expiry and its re-arm shows 0 time left, yet it is
/// armed: it gets the smallest value instead (0 would disarm it).
pub fn armed_value(value: u64, interval: u64) -> Option<u64> {
    (value != 0 || interval != 0).then_some(value.max(1))
}

impl Object for Timerfd {
    const NAME: &'static str = "timerfd";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[timerfd]");

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let (clockid, ticks, value_ns, interval_ns) =
            stasis_kernel::procfs::parse_timerfd(fd.info).map_err(|e| fd.bad_info(e))?;
        Ok(Some(FdKind::Timerfd {
            clockid,
            value_ns,
            interval_ns,
            ticks,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Timerfd { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Timerfd {
            clockid,
            value_ns,
            interval_ns,
            ticks,
        } = &img.kind
        else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fd = img.fd;
        let t = fdops::timerfd_create(*clockid, libc::TFD_CLOEXEC | nonblock(img.flags))
            .map_err(os_err("timerfd_create"))?;
        let value = armed_value(*value_ns, *interval_ns).unwrap_or(0);
        fdops::timerfd_settime(t.as_fd(), *interval_ns, value).map_err(io_step(
            format!("arming the timerfd of fd {fd}"),
            "timerfd_settime",
        ))?;
        if *ticks > 0 {
            if let Err(e) = fdops::timerfd_set_ticks(t.as_fd(), *ticks) {
                tracing::warn!(
                    fd,
                    "could not restore {ticks} pending expirations of a timerfd: {e}"
                );
            }
        }
        Ok(t)
    }
}
