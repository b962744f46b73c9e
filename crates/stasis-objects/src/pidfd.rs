//! pidfds (`pidfd_open`, `clone(CLONE_PIDFD)`) on a process of the dumped
//! tree: saved as the PID they refer to (the `Pid:` line of fdinfo),
//! opened again on the restored process (same PID), with their status
//! flags (`PIDFD_NONBLOCK` is `O_NONBLOCK`).
//!
//! Refused: a pidfd on a process that has exited and been reaped (its
//! `Pid:` is -1: nothing is left to point it at), on a process of another
//! PID namespace (0), or on a process outside the dumped tree (after a
//! restore its PID could be anybody's).

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::{fdops, pidfd};

use crate::error::{io_step, step};
use crate::restore::setfl_flags;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A pidfd.
pub struct Pidfd;

/// The `Pid:` line of a pidfd's fdinfo.
fn pid_of(info: &str) -> Option<i32> {
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
}

impl Object for Pidfd {
    const NAME: &'static str = "pidfd";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[pidfd]");

    fn save(_: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let pid = pid_of(fd.info).ok_or_else(|| {
            fd.bad_info(crate::save::BadFormat("a pidfd without a Pid: line".into()))
        })?;
        let why = match pid {
            -1 => Some("a process that has exited and been reaped".to_string()),
            0 => Some("a process of another PID namespace".to_string()),
            p if !crate::save::traced_by_us(p) => {
                Some(format!("process {p}, which is outside the dumped tree"))
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(fd.unsupported(format!(
                "fd {} is a pidfd on {why}, which stasis cannot checkpoint",
                fd.fd
            )));
        }
        Ok(Some(FdKind::Pidfd { pid }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Pidfd { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Pidfd { pid } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let p = pidfd::pidfd_open(*pid).map_err(step(format!(
            "opening the pidfd of fd {} on process {pid}",
            img.fd
        )))?;
        fdops::set_status_flags(p.as_fd(), setfl_flags(img.flags)).map_err(io_step(
            format!("setting the flags of fd {}", img.fd),
            "F_SETFL",
        ))?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_comes_from_the_fdinfo() {
        let info = "pos:\t0\nflags:\t02004002\nmnt_id:\t4\nino:\t1\nPid:\t5621\nNSpid:\t5621\n";
        assert_eq!(pid_of(info), Some(5621));
        assert_eq!(pid_of("Pid:\t-1\n"), Some(-1));
        assert_eq!(pid_of("pos:\t0\n"), None);
    }
}
