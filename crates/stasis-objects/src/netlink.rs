//! Netlink sockets (`NETLINK_ROUTE`, `NETLINK_KOBJECT_UEVENT`...): their
//! protocol, port id, multicast groups and the address they are connected
//! to, all read from the socket itself (`getsockname`, `getpeername`,
//! `NETLINK_LIST_MEMBERSHIPS`). One with messages waiting to be read is
//! refused: a kernel reply or event cannot be queued again.
//!
//! Restore: a new socket of the protocol bound to the same port id (the
//! dumped process's is free again once it is gone), joined to each group
//! (`NETLINK_ADD_MEMBERSHIP`), connected again.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind, NetlinkSocket};
use stasis_kernel::{fdops, sock};

use crate::socket::{save_options, set_options};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// Largest group bitmap read, in bytes (32768 groups).
const GROUPS_MAX: usize = 4096;

pub struct Netlink;

impl Object for Netlink {
    const NAME: &'static str = "netlink socket";

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        match &fd.socket {
            Some(s) if s.domain == libc::AF_NETLINK => save(fd, s).map(Some),
            _ => Ok(None),
        }
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Netlink(_))
    }

    fn restore(_cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Netlink(n) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let s = restore(img.fd, n)?;
        // Best effort, as sockets always had it.
        let _ = fdops::set_status_flags(s.as_fd(), crate::restore::setfl_flags(img.flags));
        Ok(s)
    }
}

/// (port id, groups) of a raw `sockaddr_nl`.
fn parse_addr(a: &[u8]) -> (u32, u32) {
    let word = |o: usize| {
        a.get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_ne_bytes)
    };
    (word(4), word(8))
}

/// A raw `sockaddr_nl`.
fn sockaddr_nl(portid: u32, groups: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(12);
    a.extend_from_slice(&u16::try_from(libc::AF_NETLINK).unwrap_or(16).to_ne_bytes());
    a.extend_from_slice(&[0, 0]);
    a.extend_from_slice(&portid.to_ne_bytes());
    a.extend_from_slice(&groups.to_ne_bytes());
    a
}

fn save(fd: &OpenFd<'_>, s: &crate::save::SocketFd) -> Result<FdKind, SaveError> {
    let b = s.sock.as_fd();
    if sock::netlink::has_unread(b)? {
        return Err(fd.unsupported(format!(
            "fd {} is a netlink socket with messages waiting to be read, which stasis cannot checkpoint (they cannot be queued again)",
            fd.fd
        )));
    }
    let protocol = sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    let (portid, _) = parse_addr(&sock::local_addr(b)?);
    let (dst_portid, dst_group) = parse_addr(&sock::peer_addr(b)?);
    let groups = sock::get_bytes(
        b,
        libc::SOL_NETLINK,
        libc::NETLINK_LIST_MEMBERSHIPS,
        GROUPS_MAX,
    )?
    .chunks_exact(4)
    .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
    .collect();
    Ok(FdKind::Netlink(NetlinkSocket {
        sock_type: s.sock_type,
        protocol,
        portid,
        groups,
        dst_portid,
        dst_group,
        options: save_options(b),
    }))
}

/// The group numbers (from 1) set in bitmap `words`.
fn group_numbers(words: &[u32]) -> impl Iterator<Item = u32> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        (0..32u32)
            .filter(move |bit| w & (1 << bit) != 0)
            .map(move |bit| u32::try_from(i).unwrap_or(0) * 32 + bit + 1)
    })
}

fn restore(fd: i32, n: &NetlinkSocket) -> Result<OwnedFd, RestoreError> {
    let err = |what: &str| {
        let what = format!("{what} (netlink socket of fd {fd})");
        move |source| RestoreError::Socket { what, source }
    };
    let s = sock::socket(libc::AF_NETLINK, n.sock_type, n.protocol)?;
    set_options(&s, &n.options);
    if n.portid != 0 {
        sock::bind(s.as_fd(), &sockaddr_nl(n.portid, 0))
            .map_err(err(&format!("binding port id {}", n.portid)))?;
    }
    for g in group_numbers(&n.groups) {
        join(s.as_fd(), g).map_err(err(&format!("joining group {g}")))?;
    }
    if n.dst_portid != 0 || n.dst_group != 0 {
        sock::connect(s.as_fd(), &sockaddr_nl(n.dst_portid, n.dst_group))
            .map_err(err("connecting"))?;
    }
    Ok(s)
}

fn join(s: BorrowedFd<'_>, group: u32) -> std::io::Result<()> {
    let g = i32::try_from(group).map_err(std::io::Error::other)?;
    sock::set_int(s, libc::SOL_NETLINK, libc::NETLINK_ADD_MEMBERSHIP, g)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_numbered_from_one_across_words() {
        let g: Vec<u32> = group_numbers(&[0b101, 0, 1 << 31]).collect();
        assert_eq!(g, vec![1, 3, 96]);
    }

    #[test]
    fn a_bound_socket_comes_back_with_its_port_id_and_groups() {
        let n = NetlinkSocket {
            sock_type: libc::SOCK_RAW,
            protocol: libc::NETLINK_ROUTE,
            portid: 0x7fff_0000 + std::process::id(),
            // RTNLGRP_LINK (1) and RTNLGRP_IPV4_ROUTE (7).
            groups: vec![(1 << 0) | (1 << 6)],
            dst_portid: 0,
            dst_group: 0,
            options: vec![],
        };
        let s = restore(3, &n).unwrap();
        let (portid, groups) = parse_addr(&sock::local_addr(s.as_fd()).unwrap());
        assert_eq!(portid, n.portid);
        assert_eq!(groups, n.groups[0]);
        let listed = sock::get_bytes(
            s.as_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_LIST_MEMBERSHIPS,
            GROUPS_MAX,
        )
        .unwrap();
        assert_eq!(&listed[..4], &n.groups[0].to_ne_bytes());
    }
}
