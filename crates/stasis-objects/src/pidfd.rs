//! pidfds (`pidfd_open`, `clone(CLONE_PIDFD)`) on a process of the dumped
//! tree: saved as the PID they refer to (the `Pid:` line of fdinfo),
//! opened again on the restored process (same PID), with their status
//! flags (`PIDFD_NONBLOCK` is `O_NONBLOCK`).
//!
//! A pidfd on a process that has exited and been reaped (its `Pid:` is
//! -1) is saved with its pidfs inode (fdinfo `ino:`). At restore, one
//! helper process per such inode is made (stopped, at a PID that no
//! process or thread of the image needs), every pidfd of that inode is
//! opened on it, and once every fd of the tree exists the helpers are
//! killed and reaped ([`RestoreCtx::finish_pidfds`]): the pidfds are then
//! pidfds on one dead process each, as before (signals fail with ESRCH,
//! `poll` says it exited, pidfds of one process share an inode).
//!
//! Refused: a pidfd on a process of another PID namespace (0), or on a
//! process outside the dumped tree (after a restore its PID could be
//! anybody's).

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::{child, fdops, pidfd, Tracee};

use crate::error::{io_step, step};
use crate::restore::setfl_flags;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A pidfd.
pub struct Pidfd;

/// The `Pid:` line of a pidfd's fdinfo.
fn pid_of(info: &str) -> Option<i32> {
    field(info, "Pid:")
}

/// A number field (`Pid:`, `ino:`) of a pidfd's fdinfo.
fn field<T: std::str::FromStr>(info: &str, name: &str) -> Option<T> {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

/// A stopped helper process whose pidfds are to be dead ones: killed and
/// reaped when dropped.
pub(crate) struct DeadPid(Option<Tracee>);

impl Drop for DeadPid {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            child::kill_and_reap(t);
        }
    }
}

impl RestoreCtx<'_> {
    /// A pidfd on the helper standing for dead process `ino`, made on first
    /// use at a PID no process or thread of the image needs.
    fn dead_pidfd(&mut self, ino: u64, fd: i32) -> Result<OwnedFd, RestoreError> {
        if !self.dead_pids.contains_key(&ino) {
            let mut rejected = Vec::new();
            let helper = loop {
                let t = child::spawn_stopped(None).map_err(|source| RestoreError::Spawn {
                    what: format!(
                        "making a process for the pidfd of fd {fd} to point at (it pointed at a process that had exited)"
                    ),
                    source,
                })?;
                if self.reserved_pids.contains(&t.pid()) {
                    // Kept until one fits, so the next try gets another PID.
                    rejected.push(DeadPid(Some(t)));
                    continue;
                }
                break t;
            };
            drop(rejected);
            self.dead_pids.insert(ino, DeadPid(Some(helper)));
        }
        let pid = self.dead_pids[&ino].0.as_ref().map_or(0, Tracee::pid);
        pidfd::pidfd_open(pid).map_err(step(format!(
            "opening the pidfd of fd {fd} (on a process that had exited)"
        )))
    }

    /// Makes every pidfd on an exited process point at a dead one: kills
    /// and reaps the helpers. Called once every fd of the tree exists,
    /// before any process runs.
    pub fn finish_pidfds(&mut self) {
        self.dead_pids.clear();
    }

    /// The PIDs and TIDs of the image: no helper may take one.
    pub fn reserve_pids(&mut self, pids: impl Iterator<Item = i32>) {
        self.reserved_pids.extend(pids);
    }
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
        if pid == -1 {
            let ino = field(fd.info, "ino:").ok_or_else(|| {
                fd.bad_info(crate::save::BadFormat(
                    "a pidfd on an exited process without an ino: line".into(),
                ))
            })?;
            return Ok(Some(FdKind::Pidfd {
                pid,
                dead: Some(ino),
            }));
        }
        let why = match pid {
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
        Ok(Some(FdKind::Pidfd { pid, dead: None }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Pidfd { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Pidfd { pid, dead } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let p = match dead {
            Some(ino) => cx.dead_pidfd(*ino, img.fd)?,
            None => pidfd::pidfd_open(*pid).map_err(step(format!(
                "opening the pidfd of fd {} on process {pid}",
                img.fd
            )))?,
        };
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
        assert_eq!(field::<u64>(info, "ino:"), Some(1));
    }
}
