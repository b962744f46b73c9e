//! Packet sockets (`AF_PACKET`: `SOCK_RAW`, `SOCK_DGRAM`, and the old
//! `SOCK_PACKET`): their protocol, the device they are bound to, their
//! `SOL_PACKET` options, fanout group, memberships and rings (zdtm's
//! packet_sock, packet_sock_spkt).
//!
//! **Save.** From the socket itself: `getsockname` (a
//! `sockaddr_ll`, or a `SOCK_PACKET` socket's device name), the
//! `SOL_PACKET` options `getsockopt` gives, `PACKET_FANOUT`; from
//! `sock_diag` (`packet_diag`), the protocol (`SO_PROTOCOL` says 0 for
//! packet sockets), the memberships and the ring settings, which nothing
//! else shows. A ring mapped in the process (`socket:[N]` in maps) is an
//! area of its own kind (`VmaKind::SocketRing`), mapped again from the
//! socket's fd once the fds exist (`stasis_restore::build::map_socket_rings`).
//! Frames not yet read are not saved: they are lost, as a network may lose
//! them (CRIU does the same); the rings come back empty.
//! **Restore.** A socket of the type with protocol 0 (it receives nothing
//! yet; a `SOCK_PACKET` one, whose bind keeps the protocol it was made
//! with, with its own), the options (the version and reserve before the rings), the
//! rings, the bind (device and protocol), the fanout group, and each
//! membership as many times as it was added. Needs CAP_NET_RAW.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, PacketSocket};
use stasis_kernel::{fdops, sock, sockdiag, KernelError};

use crate::socket::{save_options, set_options};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// `SOCK_PACKET`, the obsolete type (device names, no options).
const SOCK_PACKET: i32 = 10;

/// The `SOL_PACKET` options saved, in the order they are set again: the
/// version and the reserve first (the rings depend on them).
const PACKET_OPTS: [i32; 9] = [
    libc::PACKET_VERSION,
    libc::PACKET_RESERVE,
    libc::PACKET_AUXDATA,
    libc::PACKET_ORIGDEV,
    libc::PACKET_VNET_HDR,
    libc::PACKET_LOSS,
    libc::PACKET_TIMESTAMP,
    libc::PACKET_QDISC_BYPASS,
    libc::PACKET_TX_HAS_OFF,
];

/// `struct sockaddr_ll`.
const SOCKADDR_LL_LEN: usize = std::mem::size_of::<libc::sockaddr_ll>();

/// `TPACKET_V3`: its rings take a `tpacket_req3`.
const TPACKET_V3: i32 = 2;

pub struct Packet;

impl Object for Packet {
    const NAME: &'static str = "packet socket";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        match &fd.socket {
            Some(s) if s.domain == libc::AF_PACKET => save(cx, fd, s).map(Some),
            _ => Ok(None),
        }
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Packet(_))
    }

    fn restore(_cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Packet(p) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let s = restore(img.fd, p)?;
        // Best effort, as sockets always had it.
        let _ = fdops::set_status_flags(s.as_fd(), crate::restore::setfl_flags(img.flags));
        Ok(s)
    }
}

fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>, s: &crate::save::SocketFd) -> Result<FdKind, SaveError> {
    let (b, n, ty) = (s.sock.as_fd(), fd.fd, s.sock_type);
    let mut bound = sock::local_addr(b)?;
    if cx.packet.is_none() {
        cx.packet = Some(sockdiag::packet_sockets()?);
    }
    let diag = cx
        .packet
        .as_ref()
        .and_then(|all| all.get(&fd.meta.ino()).cloned())
        .ok_or_else(|| {
            fd.unsupported(format!(
                "fd {n}: sock_diag does not list this packet socket"
            ))
        })?;
    // (SO_PROTOCOL says 0 for packet sockets: the protocol is sock_diag's,
    // which gives it in host order; socket(2) takes it in network order.)
    let protocol = i32::from(diag.num.to_be());
    let (packet_options, fanout) = if ty == SOCK_PACKET {
        // A device name of all NULs: not bound.
        if bound
            .get(2..)
            .is_none_or(|name| name.iter().all(|&c| c == 0))
        {
            bound.clear();
        }
        (Vec::new(), None)
    } else {
        let opts = PACKET_OPTS
            .iter()
            .filter_map(|&o| Some((o, sock::get_int(b, libc::SOL_PACKET, o).ok()?)))
            .collect();
        let fanout = sock::get_int(b, libc::SOL_PACKET, libc::PACKET_FANOUT)
            .ok()
            .filter(|&v| v != 0)
            .map(i32::unsigned_abs);
        (opts, fanout)
    };
    let q = sock::inq(b).unwrap_or(0);
    if q > 0 {
        tracing::warn!(
            pid = fd.pid,
            fd = n,
            "the unread frames of a packet socket are not saved: lost, as on a network"
        );
    }
    Ok(FdKind::Packet(PacketSocket {
        sock_type: ty,
        protocol,
        bound,
        packet_options,
        fanout,
        memberships: diag.mclist,
        rx_ring: diag.rx_ring,
        tx_ring: diag.tx_ring,
        options: save_options(b),
    }))
}

fn restore(fd: i32, p: &PacketSocket) -> Result<OwnedFd, RestoreError> {
    let step = |what: String| {
        move |e: KernelError| RestoreError::Step {
            what: format!("{what} (the packet socket of fd {fd}; needs CAP_NET_RAW)"),
            source: e,
        }
    };
    // A SOCK_PACKET socket has no options to set first, and its bind
    // keeps the protocol it was made with: made with it.
    let proto = if p.sock_type == SOCK_PACKET {
        p.protocol
    } else {
        0
    };
    let s =
        sock::socket(libc::AF_PACKET, p.sock_type, proto).map_err(step("creating it".into()))?;
    let b = s.as_fd();
    set_options(&s, &p.options);
    // (All default to 0: only the others are set; some are refused on
    // sockets they do not apply to, even to set 0.)
    for &(o, v) in p.packet_options.iter().filter(|&&(_, v)| v != 0) {
        if let Err(e) = sock::set_int(b, libc::SOL_PACKET, o, v) {
            // As other options: a value this kernel refuses is logged.
            tracing::warn!(fd, option = o, value = v, %e, "packet socket option not restored");
        }
    }
    let version = p
        .packet_options
        .iter()
        .find(|&&(o, _)| o == libc::PACKET_VERSION)
        .map_or(0, |&(_, v)| v);
    for (opt, ring) in [
        (libc::PACKET_RX_RING, &p.rx_ring),
        (libc::PACKET_TX_RING, &p.tx_ring),
    ] {
        if let Some(r) = ring {
            // tpacket_req (four words) or, for TPACKET_V3, tpacket_req3.
            let words = if version == TPACKET_V3 { 7 } else { 4 };
            let req: Vec<u8> = r[..words].iter().flat_map(|w| w.to_ne_bytes()).collect();
            sock::set_bytes(b, libc::SOL_PACKET, opt, &req)
                .map_err(step("setting up its ring again".into()))?;
        }
    }
    bind(fd, b, p)?;
    if let Some(f) = p.fanout {
        sock::set_int(
            b,
            libc::SOL_PACKET,
            libc::PACKET_FANOUT,
            i32::from_ne_bytes(f.to_ne_bytes()),
        )
        .map_err(step(format!("joining its fanout group {f:#x}")))?;
    }
    for (ifindex, count, ty, addr) in &p.memberships {
        let mut mreq = [0u8; stasis_sys::net::PACKET_MREQ_LEN];
        let alen = addr.len().min(8);
        mreq[0..4].copy_from_slice(&ifindex.to_ne_bytes());
        mreq[4..6].copy_from_slice(&ty.to_ne_bytes());
        mreq[6..8].copy_from_slice(&u16::try_from(alen).unwrap_or(0).to_ne_bytes());
        mreq[8..8 + alen].copy_from_slice(&addr[..alen]);
        for _ in 0..*count {
            sock::set_bytes(b, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq).map_err(
                step(format!(
                    "adding its membership of type {ty} on interface {ifindex}"
                )),
            )?;
        }
    }
    Ok(s)
}

/// Binds as it was: a device and a protocol (the protocol alone, on every
/// device, for one never bound but made with a protocol); nothing for a
/// socket of protocol 0 never bound, or a `SOCK_PACKET` one not bound.
fn bind(fd: i32, b: BorrowedFd<'_>, p: &PacketSocket) -> Result<(), RestoreError> {
    if p.bound.is_empty() {
        return Ok(());
    }
    if p.sock_type != SOCK_PACKET {
        // sockaddr_ll: family, protocol (2 bytes), ifindex (4 bytes).
        let ifindex = p
            .bound
            .get(4..8)
            .map_or(0, |w| i32::from_ne_bytes(w.try_into().unwrap_or([0; 4])));
        let proto = p
            .bound
            .get(2..4)
            .map_or(0, |w| u16::from_ne_bytes(w.try_into().unwrap_or([0; 2])));
        if ifindex == 0 && proto == 0 {
            return Ok(());
        }
    }
    // `getsockname` gives a `sockaddr_ll` cut after its hardware address;
    // `bind` wants it whole.
    let mut addr = p.bound.clone();
    if p.sock_type != SOCK_PACKET && addr.len() < SOCKADDR_LL_LEN {
        addr.resize(SOCKADDR_LL_LEN, 0);
    }
    sock::bind(b, &addr).map_err(|e| RestoreError::Socket {
        what: format!("binding the packet socket of fd {fd} to its device again"),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn ino(s: &OwnedFd) -> u64 {
        let mut path = std::path::PathBuf::from("/proc/self/fd");
        path.push(s.as_raw_fd().to_string());
        std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
    }

    /// Memberships and rings are visible only through sock_diag: a socket
    /// made from an image has them back, each membership as many times.
    #[test]
    fn memberships_rings_and_fanout_come_back() {
        // The loopback device is interface 1 in every network namespace.
        let lo = 1i32;
        // sockaddr_ll: family, ETH_P_IP (network order), lo.
        let mut bound = vec![0u8; SOCKADDR_LL_LEN];
        bound[0..2].copy_from_slice(&u16::try_from(libc::AF_PACKET).unwrap().to_ne_bytes());
        bound[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
        bound[4..8].copy_from_slice(&lo.to_ne_bytes());
        let img = PacketSocket {
            sock_type: libc::SOCK_DGRAM,
            protocol: i32::from(0x0800u16.to_be()),
            bound,
            packet_options: vec![(libc::PACKET_VERSION, 1), (libc::PACKET_RESERVE, 32)],
            fanout: Some(91 | (1 << 16)),
            memberships: vec![
                (
                    lo,
                    2,
                    u16::try_from(libc::PACKET_MR_PROMISC).unwrap(),
                    vec![],
                ),
                (
                    lo,
                    1,
                    u16::try_from(libc::PACKET_MR_UNICAST).unwrap(),
                    vec![2, 0, 0, 0, 0, 9],
                ),
            ],
            rx_ring: Some([4096, 2, 2048, 4, 0, 0, 0]),
            tx_ring: None,
            options: vec![],
        };
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs CAP_NET_RAW (root)");
            return;
        }
        let s = restore(3, &img).unwrap();
        let diag = sockdiag::packet_sockets()
            .unwrap()
            .remove(&ino(&s))
            .unwrap();
        let mut got = diag.mclist.clone();
        got.sort();
        let mut want = img.memberships.clone();
        want.sort();
        assert_eq!(got, want, "memberships, with their counts");
        assert_eq!(
            diag.rx_ring.map(|r| r[..4].to_vec()),
            Some(vec![4096, 2, 2048, 4])
        );
        assert_eq!(diag.tx_ring, None);
        let b = s.as_fd();
        assert_eq!(
            sock::get_int(b, libc::SOL_PACKET, libc::PACKET_FANOUT).unwrap(),
            91 | (1 << 16)
        );
        assert_eq!(
            sock::get_int(b, libc::SOL_PACKET, libc::PACKET_VERSION).unwrap(),
            1
        );
        assert_eq!(
            sock::get_int(b, libc::SOL_PACKET, libc::PACKET_RESERVE).unwrap(),
            32
        );
    }
}
