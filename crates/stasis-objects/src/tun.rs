//! An fd on `/dev/net/tun` attached to a tun or tap device of the tree's
//! network namespace (`iff:` in its fdinfo).
//!
//! **Save.** The device's name from the fdinfo; the flags the fd attached
//! with from `TUNGETIFF` on a copy of it (`pidfd_getfd`): the kind, the
//! features (`IFF_VNET_HDR`, `IFF_MULTI_QUEUE`...), whether the device is
//! persistent, and `IFF_DETACH_QUEUE` for a detached queue. `TUNGETIFF`
//! gives `IFF_NOFILTER` in the bit of `IFF_NO_PI` (both 0x1000), so
//! `IFF_NO_PI` is the device's, from rtnetlink in the tree's namespace.
//! The device itself (name, flags, owner, MTU, addresses...) is saved with
//! the namespace (`stasis_capture::ns`) and made again before any fd, kept
//! persistent until its fds are attached. Packets queued in the fd are not
//! saved (as CRIU: they are lost, as a network may lose them). An fd on
//! `/dev/net/tun` attached to nothing is a plain [`crate::file`], reopened.
//!
//! **Restore.** `/dev/net/tun` opened by the restorer, which works in the
//! tree's new network namespace then (its devices are there), attached by
//! name with its flags (`TUNSETIFF`), its queue detached again if it was;
//! a device that was not persistent at the dump is made so again
//! (`TUNSETPERSIST` 0): it then lives as long as its fds, as before.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use stasis_image::manifest::{FdImage, FdKind, TunFile};
use stasis_kernel::ns::{self as kns, NsKind};
use stasis_kernel::{pidfd, tun};
use stasis_sys::tun as t;

use crate::error::io_step;
use crate::restore::nonblock;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Tun;

/// Whether `fd` is on the misc device `/dev/net/tun` (10:200).
fn is_tun_dev(fd: &OpenFd<'_>) -> bool {
    let rdev = fd.meta.rdev();
    fd.meta.file_type().is_char_device()
        && libc::major(rdev) == t::TUN_MAJOR
        && libc::minor(rdev) == t::TUN_MINOR
}

/// The device named on the `iff:` line of a tun fd's fdinfo (`None`:
/// attached to none).
pub fn iff_of(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("iff:"))
        .map(str::trim)
        .filter(|n| !n.is_empty())
}

/// The flags an fd attached with, from `TUNGETIFF`'s (`got`) and its
/// device's (`dev`, rtnetlink's): the features and kind, `IFF_NO_PI` as
/// the device has it (`TUNGETIFF` gives `IFF_NOFILTER` in its bit), a
/// detached queue.
pub fn attach_flags(got: u16, dev: u16) -> u16 {
    (got & (t::TUN_SET_FLAGS & !t::IFF_NO_PI | t::IFF_DETACH_QUEUE)) | (dev & t::IFF_NO_PI)
}

impl Object for Tun {
    const NAME: &'static str = "tun/tap";

    fn save(_: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.socket.is_some() || !is_tun_dev(fd) {
            return Ok(None);
        }
        let Some(iff) = iff_of(fd.info) else {
            return Ok(None);
        };
        let n = fd.fd;
        let copy = pidfd::pidfd_getfd(fd.pidfd, n)?;
        let dev_ns = tun::netns_of(copy.as_fd())
            .and_then(|ns| std::fs::File::from(ns).metadata())
            .map(|m| m.ino())
            .map_err(|e| {
                fd.unsupported(format!(
                    "fd {n}: finding the network namespace of its tun device {iff} (SIOCGSKNS): {e}"
                ))
            })?;
        if Some(dev_ns) == kns::own_ns_id(NsKind::Net) {
            return Err(fd.unsupported(format!(
                "fd {n} is attached to the tun device {iff} of the dumper's network namespace; stasis restores tun and tap devices of a network namespace of the tree's own (unshare --net)"
            )));
        }
        if Some(dev_ns) != kns::ns_id(fd.pid, NsKind::Net) {
            return Err(fd.unsupported(format!(
                "fd {n} is attached to the tun device {iff} of another network namespace than its process's; stasis restores tun and tap devices of the tree's network namespace"
            )));
        }
        let Some((name, got)) = tun::get_iff(copy.as_fd()).map_err(|e| {
            fd.unsupported(format!(
                "fd {n}: reading what its tun device is (TUNGETIFF): {e}"
            ))
        })?
        else {
            return Ok(None);
        };
        let pid = fd.pid;
        let links = kns::in_namespaces_of(pid, &[NsKind::Net], || {
            stasis_kernel::rtnl::Rtnl::open().and_then(|mut nl| nl.links())
        })??;
        let dev = links
            .iter()
            .find(|l| l.name == name)
            .and_then(|l| l.tun.clone())
            .ok_or_else(|| {
                fd.unsupported(format!(
                    "fd {n} is attached to the tun device {name}, which its network namespace does not list"
                ))
            })?;
        Ok(Some(FdKind::Tun(TunFile {
            iff: name,
            flags: u32::from(attach_flags(got, dev.flags)),
            persist: got & t::IFF_PERSIST != 0,
        })))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Tun(_))
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Tun(f) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let what = |s: &str| format!("fd {}: {s} the tun device {}", img.fd, f.iff);
        let flags = u16::try_from(f.flags).unwrap_or(0);
        let o = tun::open(nonblock(img.flags))
            .map_err(io_step(what("opening /dev/net/tun for"), "open"))?;
        tun::set_iff(o.as_fd(), &f.iff, flags & t::TUN_SET_FLAGS)
            .map_err(io_step(what("attaching to"), "TUNSETIFF"))?;
        if flags & t::IFF_DETACH_QUEUE != 0 {
            tun::detach_queue(o.as_fd())
                .map_err(io_step(what("detaching its queue of"), "TUNSETQUEUE"))?;
        }
        if !f.persist {
            tun::set_persist(o.as_fd(), false)
                .map_err(io_step(what("making not persistent"), "TUNSETPERSIST"))?;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_read_from_the_iff_line() {
        let info = "pos:\t0\nflags:\t02\nmnt_id:\t26\nino:\t1034\niff:\ttun0\n";
        assert_eq!(iff_of(info), Some("tun0"));
        assert_eq!(iff_of("pos:\t0\nflags:\t02\n"), None);
        assert_eq!(iff_of("pos:\t0\niff:\t\n"), None);
    }

    #[test]
    fn no_pi_is_the_devices_and_read_only_flags_are_dropped() {
        // TUNGETIFF: tap, vnet header, persistent, no filter (0x1000).
        let got = t::IFF_TAP | t::IFF_VNET_HDR | t::IFF_PERSIST | t::IFF_NOFILTER;
        assert_eq!(attach_flags(got, t::IFF_TAP), t::IFF_TAP | t::IFF_VNET_HDR);
        assert_eq!(
            attach_flags(
                t::IFF_TUN | t::IFF_DETACH_QUEUE | t::IFF_MULTI_QUEUE,
                t::IFF_TUN | t::IFF_NO_PI
            ),
            t::IFF_TUN | t::IFF_NO_PI | t::IFF_DETACH_QUEUE | t::IFF_MULTI_QUEUE
        );
    }
}
