//! TCP sockets by address pair, from the kernel's `sock_diag` interface, and
//! closing the orphaned ones.
//!
//! An *orphan* is a TCP socket no file refers to any more (inode 0): what a
//! connection of a process that exited or crashed becomes while it finishes
//! closing (`FIN_WAIT1`, `FIN_WAIT2`, `CLOSING`, `LAST_ACK`). It keeps its
//! address pair until then (up to `tcp_fin_timeout`, 60 s by default, after
//! which it may linger as a timewait socket), so a restore of that very
//! connection from a checkpoint cannot reconnect it: `connect` in repair mode
//! fails with `EADDRNOTAVAIL`. [`destroy_orphans`] closes such sockets with
//! `SOCK_DESTROY` (as `ss -K` does); sockets some process still holds are
//! never touched.
//!
//! Messages (`linux/inet_diag.h`): `nlmsghdr` (16 bytes) + `inet_diag_req_v2`
//! (56 bytes) out; `nlmsghdr` + `inet_diag_msg` (72 bytes) + attributes in.

use stasis_sys::inet_diag::SOCK_DESTROY;
use stasis_sys::inet_diag::{InetDiagMsg, InetDiagReqV2, InetDiagSockId};
use stasis_sys::net::{
    NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, SOCK_DIAG_BY_FAMILY,
    TCP_ESTABLISHED, TCP_LISTEN, TCP_SYN_SENT,
};

use crate::{KernelError, Result};

/// An address as `sock_diag` shows it: family, port and address bytes in
/// network order (IPv4 in the first four bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagAddr {
    pub family: u8,
    pub port: [u8; 2],
    pub addr: [u8; 16],
}

impl DiagAddr {
    /// From a raw `sockaddr_in`/`sockaddr_in6`; `None` for anything else.
    pub fn from_raw(raw: &[u8]) -> Option<DiagAddr> {
        let family = i32::from(u16::from_ne_bytes(raw.get(0..2)?.try_into().ok()?));
        let port = raw.get(2..4)?.try_into().ok()?;
        let mut addr = [0u8; 16];
        match family {
            libc::AF_INET => addr[..4].copy_from_slice(raw.get(4..8)?),
            libc::AF_INET6 => addr.copy_from_slice(raw.get(8..24)?),
            _ => return None,
        }
        Some(DiagAddr {
            family: u8::try_from(family).ok()?,
            port,
            addr,
        })
    }
}

impl DiagAddr {
    /// The raw `sockaddr_in`/`sockaddr_in6` of this address.
    pub fn to_raw(&self) -> Vec<u8> {
        let family = u16::from(self.family).to_ne_bytes();
        if i32::from(self.family) == libc::AF_INET {
            let mut raw = vec![0u8; 16];
            raw[..2].copy_from_slice(&family);
            raw[2..4].copy_from_slice(&self.port);
            raw[4..8].copy_from_slice(&self.addr[..4]);
            raw
        } else {
            let mut raw = vec![0u8; 28];
            raw[..2].copy_from_slice(&family);
            raw[2..4].copy_from_slice(&self.port);
            raw[8..24].copy_from_slice(&self.addr);
            raw
        }
    }
}

/// The peer a TCP socket of family `family` (its inode `inode`) is
/// connecting to: `getpeername` does not tell it before the connection is
/// established.
pub fn peer_of(family: u8, inode: u32) -> Result<Option<DiagAddr>> {
    let found = sockets_where(family, state_bit(TCP_SYN_SENT), |m| m.inode == inode)?;
    Ok(found.first().map(|t| DiagAddr {
        family,
        port: t.id.dport,
        addr: t.id.dst,
    }))
}

/// The address of every TCP listener of family `family` in this network
/// namespace (one per listener: listeners sharing a port through
/// `SO_REUSEPORT` appear once each).
pub fn listeners(family: u8) -> Result<Vec<DiagAddr>> {
    // Listeners only: the kernel then walks its listening hash alone, not
    // the established one (262144 buckets on a 24 GiB machine), which made
    // this a millisecond per listener of a frozen tree.
    Ok(
        sockets_where(family, state_bit(TCP_LISTEN), |m| m.state == TCP_LISTEN)?
            .into_iter()
            .map(|t| DiagAddr {
                family,
                port: t.id.sport,
                addr: t.id.src,
            })
            .collect(),
    )
}

/// The `sk_shutdown` of the socket of family `family`, protocol
/// `protocol` (TCP or UDP) and inode `inode` (1: its receive side is shut
/// down, 2: its send side); `None`: not found.
pub fn shutdown_of(family: u8, protocol: u8, inode: u32) -> Result<Option<u8>> {
    let req = InetDiagReqV2 {
        family,
        protocol,
        states: u32::MAX,
        ..Default::default()
    };
    let mut found = None;
    exchange(
        &encode(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, &req),
        |r| {
            if let Some(e) = r.error.filter(|e| *e != 0) {
                return Err(KernelError::io(
                    "sock_diag: listing inet sockets",
                    std::io::Error::from_raw_os_error(e),
                ));
            }
            for (m, sd) in r.msgs.iter().zip(&r.shutdowns) {
                if m.inode == inode {
                    found = Some(sd.unwrap_or(0));
                }
            }
            Ok(r.done)
        },
    )?;
    Ok(found)
}

/// One TCP socket the kernel reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSock {
    /// `TCP_ESTABLISHED` (1) ... `TCP_CLOSING` (11).
    pub state: u8,
    /// Socket inode; 0 for an orphan.
    pub inode: u32,
    /// The kernel's identity of the socket (with its cookie).
    pub id: InetDiagSockId,
}

impl TcpSock {
    /// No file refers to it and it is not a listener.
    pub fn is_orphan(&self) -> bool {
        self.inode == 0 && self.state != TCP_LISTEN
    }
}

fn encode(ty: u16, flags: u16, req: &InetDiagReqV2) -> Vec<u8> {
    let mut b = Vec::with_capacity(72);
    b.extend_from_slice(&72u32.to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes()); // seq
    b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    b.extend_from_slice(&[req.family, req.protocol, req.ext, req.pad]);
    b.extend_from_slice(&req.states.to_ne_bytes());
    encode_id(&mut b, &req.id);
    b
}

fn encode_id(b: &mut Vec<u8>, id: &InetDiagSockId) {
    b.extend_from_slice(&id.sport);
    b.extend_from_slice(&id.dport);
    b.extend_from_slice(&id.src);
    b.extend_from_slice(&id.dst);
    b.extend_from_slice(&id.ifindex.to_ne_bytes());
    b.extend_from_slice(&id.cookie[0].to_ne_bytes());
    b.extend_from_slice(&id.cookie[1].to_ne_bytes());
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn decode_msg(m: &[u8]) -> Option<InetDiagMsg> {
    if m.len() < std::mem::size_of::<InetDiagMsg>() {
        return None;
    }
    let id = InetDiagSockId {
        sport: m[4..6].try_into().ok()?,
        dport: m[6..8].try_into().ok()?,
        src: m[8..24].try_into().ok()?,
        dst: m[24..40].try_into().ok()?,
        ifindex: u32_at(m, 40),
        cookie: [u32_at(m, 44), u32_at(m, 48)],
    };
    Some(InetDiagMsg {
        family: m[0],
        state: m[1],
        timer: m[2],
        retrans: m[3],
        id,
        expires: u32_at(m, 52),
        rqueue: u32_at(m, 56),
        wqueue: u32_at(m, 60),
        uid: u32_at(m, 64),
        inode: u32_at(m, 68),
    })
}

/// `INET_DIAG_SHUTDOWN`: the socket's `sk_shutdown`, a `u8`.
const INET_DIAG_SHUTDOWN: u16 = 8;

/// The first byte of attribute `ty` after the `inet_diag_msg` of `m`.
fn attribute(m: &[u8], ty: u16) -> Option<u8> {
    let mut off = std::mem::size_of::<InetDiagMsg>();
    while off + 4 <= m.len() {
        let len = usize::from(u16::from_ne_bytes([m[off], m[off + 1]]));
        let t = u16::from_ne_bytes([m[off + 2], m[off + 3]]);
        if len < 4 {
            return None;
        }
        if t == ty {
            return m.get(off + 4).copied();
        }
        off += len.div_ceil(4) * 4;
    }
    None
}

/// What one reply buffer held.
#[derive(Debug, Default)]
pub struct Reply {
    pub msgs: Vec<InetDiagMsg>,
    /// The `INET_DIAG_SHUTDOWN` attribute of each message (`sk_shutdown`:
    /// 1 receive side, 2 send side), in the order of `msgs`.
    pub shutdowns: Vec<Option<u8>>,
    /// `NLMSG_DONE` seen.
    pub done: bool,
    /// The errno of an `NLMSG_ERROR` (0 is an acknowledgement).
    pub error: Option<i32>,
}

/// Parses the messages of one netlink reply buffer. Malformed input is
/// an error, never a panic.
pub fn parse_reply(buf: &[u8]) -> Result<Reply> {
    let bad = |why: String| KernelError::io("sock_diag reply", std::io::Error::other(why));
    let mut r = Reply::default();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32_at(buf, off) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < 16 || off + len > buf.len() {
            return Err(bad(format!("bad netlink message length {len}")));
        }
        let body = &buf[off + 16..off + len];
        match ty {
            NLMSG_DONE => {
                r.done = true;
                return Ok(r);
            }
            NLMSG_ERROR => {
                let e = body
                    .get(0..4)
                    .and_then(|s| s.try_into().ok())
                    .map(i32::from_ne_bytes)
                    .ok_or_else(|| bad("short netlink error".into()))?;
                r.error = Some(-e);
                return Ok(r);
            }
            SOCK_DIAG_BY_FAMILY => {
                r.msgs
                    .push(decode_msg(body).ok_or_else(|| bad("short inet_diag_msg".into()))?);
                r.shutdowns.push(attribute(body, INET_DIAG_SHUTDOWN));
            }
            _ => {}
        }
        off += len.div_ceil(4) * 4;
    }
    Ok(r)
}

/// [`crate::sockdiag::exchange`] with each reply buffer parsed.
fn exchange(req: &[u8], mut each: impl FnMut(Reply) -> Result<bool>) -> Result<()> {
    crate::sockdiag::exchange(req, |buf| each(parse_reply(buf)?))
}

/// Every TCP socket of this network namespace whose local and peer
/// addresses are `local` and `peer` (at most one live one, plus timewait
/// remnants).
pub fn sockets_of(local: DiagAddr, peer: DiagAddr) -> Result<Vec<TcpSock>> {
    sockets_where(local.family, u32::MAX, |m| {
        m.id.sport == local.port
            && m.id.dport == peer.port
            && m.id.src == local.addr
            && m.id.dst == peer.addr
    })
}

/// Every connection of family `family` waiting in a listener's accept
/// queue in this network namespace (established, no file refers to it
/// yet): its (local, peer) addresses, in one walk of the established
/// table (which the kernel walks whole, whatever the filter).
pub fn waiting_to_be_accepted(family: u8) -> Result<Vec<(DiagAddr, DiagAddr)>> {
    let found = sockets_where(family, state_bit(TCP_ESTABLISHED), |m| m.inode == 0)?;
    Ok(found
        .iter()
        .map(|t| {
            let at = |port, addr| DiagAddr { family, port, addr };
            (at(t.id.sport, t.id.src), at(t.id.dport, t.id.dst))
        })
        .collect())
}

/// The clients of the connections waiting in the accept queue of a
/// listener bound to `listener` (an unspecified address matches every
/// local one): the peer addresses of the established sockets on its port
/// that no file refers to yet.
pub fn waiting_clients(listener: DiagAddr) -> Result<Vec<DiagAddr>> {
    let any = listener.addr == [0u8; 16]
        || (i32::from(listener.family) == libc::AF_INET && listener.addr[..4] == [0; 4]);
    let found = sockets_where(listener.family, state_bit(TCP_ESTABLISHED), |m| {
        m.inode == 0 && m.id.sport == listener.port && (any || m.id.src == listener.addr)
    })?;
    Ok(found
        .iter()
        .map(|t| DiagAddr {
            family: listener.family,
            port: t.id.dport,
            addr: t.id.dst,
        })
        .collect())
}

/// The `idiag_states` bit of TCP state `state` (`TCPF_*`).
const fn state_bit(state: u8) -> u32 {
    1 << state
}

/// Every TCP socket of family `family` in this network namespace, in one
/// of the states of the mask `states` (`u32::MAX`: any), for which `keep`
/// holds.
fn sockets_where(
    family: u8,
    states: u32,
    keep: impl Fn(&InetDiagMsg) -> bool,
) -> Result<Vec<TcpSock>> {
    let req = InetDiagReqV2 {
        family,
        protocol: u8::try_from(libc::IPPROTO_TCP).unwrap_or(6),
        states,
        ..Default::default()
    };
    let mut out = Vec::new();
    exchange(
        &encode(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, &req),
        |r| {
            if let Some(e) = r.error.filter(|e| *e != 0) {
                return Err(KernelError::io(
                    "sock_diag: listing TCP sockets",
                    std::io::Error::from_raw_os_error(e),
                ));
            }
            out.extend(r.msgs.into_iter().filter(|m| keep(m)).map(|m| TcpSock {
                state: m.state,
                inode: m.inode,
                id: m.id,
            }));
            Ok(r.done)
        },
    )?;
    Ok(out)
}

/// Closes one socket by its identity (`SOCK_DESTROY`). One that is gone
/// already (it finished closing since it was listed) counts as closed.
pub fn destroy(family: u8, id: &InetDiagSockId) -> Result<()> {
    let req = InetDiagReqV2 {
        family,
        protocol: u8::try_from(libc::IPPROTO_TCP).unwrap_or(6),
        states: u32::MAX,
        id: *id,
        ..Default::default()
    };
    let mut res = Ok(());
    exchange(
        &encode(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, &req),
        |r| match r.error {
            // (ENOENT: it finished closing by itself since it was listed.)
            Some(0) | Some(libc::ENOENT) => Ok(true),
            Some(e) => {
                res = Err(KernelError::io(
                    "sock_diag: closing an orphaned TCP socket (SOCK_DESTROY; needs CAP_NET_ADMIN and CONFIG_INET_DIAG_DESTROY)",
                    std::io::Error::from_raw_os_error(e),
                ));
                Ok(true)
            }
            None => Ok(r.done),
        },
    )?;
    res
}

/// What [`destroy_orphans`] found for one address pair.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Orphans {
    /// Orphans closed.
    pub destroyed: usize,
    /// Sockets with that address pair some process holds (left alone).
    pub owned: usize,
}

/// Closes every orphaned TCP socket whose address pair is `local`/`peer`
/// (raw `sockaddr_in`/`sockaddr_in6`): the remnants of a connection whose
/// process is gone, which keep a restored copy of that connection from
/// reconnecting. Sockets a process holds are counted, never touched.
pub fn destroy_orphans(local: &[u8], peer: &[u8]) -> Result<Orphans> {
    let (Some(l), Some(p)) = (DiagAddr::from_raw(local), DiagAddr::from_raw(peer)) else {
        return Ok(Orphans::default());
    };
    let mut o = Orphans::default();
    for s in sockets_of(l, p)? {
        if s.is_orphan() {
            destroy(l.family, &s.id)?;
            o.destroyed += 1;
        } else {
            o.owned += 1;
        }
    }
    Ok(o)
}

/// Inodes of the sockets some process holds with the address pair
/// `local`/`peer` (raw `sockaddr_in`/`sockaddr_in6`), or, with `peer`
/// `None`, of the non-listening ones bound to the port of `local` on its
/// address: the sockets a holder of a killed tree's connections may keep
/// (`sock::release_holders`).
pub fn held_inodes(local: &[u8], peer: Option<&[u8]>) -> Result<Vec<u32>> {
    let Some(l) = DiagAddr::from_raw(local) else {
        return Ok(Vec::new());
    };
    let found = match peer.map(DiagAddr::from_raw) {
        Some(Some(p)) => sockets_of(l, p)?,
        Some(None) => return Ok(Vec::new()),
        None => sockets_where(l.family, u32::MAX, |m| {
            m.id.sport == l.port && m.state != TCP_LISTEN && m.id.src == l.addr
        })?,
    };
    Ok(found
        .into_iter()
        .filter(|s| s.inode != 0)
        .map(|s| s.inode)
        .collect())
}

/// Closes every orphaned TCP socket (a timewait remnant, or a connection
/// still closing) bound to the port of `local` (a raw `sockaddr_in` or
/// `sockaddr_in6`) on its address, or on any address if `local` is a
/// wildcard (for an IPv6 one, in both families: a dual-stack listener
/// conflicts with IPv4 sockets too). These are what a listener's accepted
/// connections leave when their process is killed: unless the listener
/// had `SO_REUSEADDR` (which they inherit), they keep the port from being
/// bound again for a minute. Sockets a process holds are never touched.
pub fn destroy_port_orphans(local: &[u8]) -> Result<Orphans> {
    let Some(l) = DiagAddr::from_raw(local) else {
        return Ok(Orphans::default());
    };
    let wildcard = l.addr.iter().all(|b| *b == 0);
    let v6 = u8::try_from(libc::AF_INET6).unwrap_or(10);
    let v4 = u8::try_from(libc::AF_INET).unwrap_or(2);
    let families: &[u8] = if wildcard && l.family == v6 {
        &[v4, v6]
    } else {
        std::slice::from_ref(&l.family)
    };
    let mut o = Orphans::default();
    for &family in families {
        let found = sockets_where(family, u32::MAX, |m| {
            m.id.sport == l.port && (wildcard || (family == l.family && m.id.src == l.addr))
        })?;
        for s in found.iter().filter(|s| s.state != TCP_LISTEN) {
            if s.is_orphan() {
                destroy(family, &s.id)?;
                o.destroyed += 1;
            } else {
                o.owned += 1;
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};

    fn sin(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = u16::try_from(libc::AF_INET).unwrap().to_ne_bytes().to_vec();
        b.extend_from_slice(&port.to_be_bytes());
        b.extend_from_slice(&ip);
        b.extend_from_slice(&[0; 8]);
        b
    }

    /// A listener bound with `SO_REUSEPORT` to `local` (raw address).
    fn reuseport_listener(local: &[u8]) -> OwnedFd {
        let s = crate::sock::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        crate::sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).unwrap();
        crate::sock::bind(s.as_fd(), local).unwrap();
        // SAFETY: listen(2) on a socket this test owns.
        assert_eq!(unsafe { libc::listen(s.as_raw_fd(), 4) }, 0);
        s
    }

    /// The listeners of the namespace bound to the raw address `local`.
    fn listeners_on(local: &[u8]) -> Result<usize> {
        let l = DiagAddr::from_raw(local).expect("an inet address");
        Ok(listeners(l.family)?.iter().filter(|a| **a == l).count())
    }

    /// `listeners` asks the kernel for listeners only: it counts the
    /// listeners sharing an address, not the connections accepted on it.
    #[test]
    fn listeners_sharing_a_port_are_counted_and_connections_are_not() {
        let first = reuseport_listener(&sin([127, 0, 0, 1], 0));
        let local = crate::sock::local_addr(first.as_fd()).unwrap();
        assert_eq!(listeners_on(&local).unwrap(), 1);
        let second = reuseport_listener(&local);
        let port = u16::from_be_bytes([local[2], local[3]]);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(listeners_on(&local).unwrap(), 2);
        drop((client, second));
        assert_eq!(listeners_on(&local).unwrap(), 1);
        drop(first);
        assert_eq!(listeners_on(&local).unwrap(), 0);
    }

    #[test]
    fn raw_addresses_are_read_in_network_order() {
        let a = DiagAddr::from_raw(&sin([127, 0, 0, 1], 6379)).unwrap();
        assert_eq!(a.family, 2);
        assert_eq!(a.port, 6379u16.to_be_bytes());
        assert_eq!(&a.addr[..4], &[127, 0, 0, 1]);
        assert!(a.addr[4..].iter().all(|b| *b == 0));
        assert_eq!(DiagAddr::from_raw(&[1, 0]), None);
        assert_eq!(DiagAddr::from_raw(&[]), None);
    }

    #[test]
    fn requests_have_the_kernel_layout() {
        let req = InetDiagReqV2 {
            family: 2,
            protocol: 6,
            states: u32::MAX,
            id: InetDiagSockId {
                sport: [1, 2],
                cookie: [7, 8],
                ..Default::default()
            },
            ..Default::default()
        };
        let b = encode(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, &req);
        assert_eq!(b.len(), 72);
        assert_eq!(u32_at(&b, 0), 72);
        assert_eq!(&b[16..20], &[2, 6, 0, 0]);
        assert_eq!(&b[24..26], &[1, 2]);
        assert_eq!(u32_at(&b, 64), 7);
        assert_eq!(u32_at(&b, 68), 8);
    }

    #[test]
    fn garbage_replies_are_errors_not_panics() {
        for junk in [
            &[0xffu8; 40][..],
            &[16, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(parse_reply(junk).is_err(), "{junk:?}");
        }
        let r = parse_reply(&[1, 2, 3]).unwrap();
        assert!(r.msgs.is_empty() && !r.done && r.error.is_none());
    }

    /// A real connection, then its server side orphaned: found, and closed.
    #[test]
    fn an_orphaned_connection_is_found_and_closed() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let sa = server.local_addr().unwrap();
        let pa = server.peer_addr().unwrap();
        let raw = |a: std::net::SocketAddr| match a {
            std::net::SocketAddr::V4(v) => sin(v.ip().octets(), v.port()),
            std::net::SocketAddr::V6(_) => unreachable!(),
        };
        let (local, peer) = (raw(sa), raw(pa));
        let live = sockets_of(
            DiagAddr::from_raw(&local).unwrap(),
            DiagAddr::from_raw(&peer).unwrap(),
        )
        .unwrap();
        assert_eq!(live.len(), 1, "{live:?}");
        assert!(!live[0].is_orphan());
        // A held socket is never closed.
        assert_eq!(
            destroy_orphans(&local, &peer).unwrap(),
            Orphans {
                destroyed: 0,
                owned: 1
            }
        );
        // Closing the server side with the client open leaves an orphan in
        // FIN_WAIT2 once the client acknowledges the FIN (seen as EOF).
        drop(server);
        let mut b = [0u8; 1];
        assert_eq!(client.read(&mut b).unwrap(), 0);
        let o = destroy_orphans(&local, &peer).unwrap();
        assert_eq!(
            o,
            Orphans {
                destroyed: 1,
                owned: 0
            }
        );
        let left = sockets_of(
            DiagAddr::from_raw(&local).unwrap(),
            DiagAddr::from_raw(&peer).unwrap(),
        )
        .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    /// Regression: the restore of Open MPI's PMIx listener (no
    /// `SO_REUSEADDR`) failed with "port taken" after the job was killed:
    /// its accepted connections' timewait sockets held the port. They are
    /// found by port and closed; the port can be bound again.
    #[test]
    fn timewait_remnants_of_a_listener_are_closed_by_port() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsFd;
        // A listener without SO_REUSEADDR (std's TcpListener sets it).
        let (inet, stream) = (libc::AF_INET, libc::SOCK_STREAM);
        let s = crate::sock::socket(inet, stream, 0).unwrap();
        crate::sock::bind(s.as_fd(), &sin([127, 0, 0, 1], 0)).unwrap();
        crate::fdops::listen(s.as_fd(), 8).unwrap();
        let l = TcpListener::from(s);
        let port = l.local_addr().unwrap().port();
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, _) = l.accept().unwrap();
        // The server side closes first: it ends in TIME_WAIT (or FIN_WAIT2).
        drop(server);
        let mut b = [0u8; 1];
        assert_eq!(client.read(&mut b).unwrap(), 0);
        drop(client);
        drop(l);
        let local = sin([127, 0, 0, 1], port);
        let a = DiagAddr::from_raw(&local).unwrap();
        let held = |a: DiagAddr| {
            sockets_where(a.family, u32::MAX, |m| m.id.sport == a.port)
                .unwrap()
                .into_iter()
                .filter(|s| s.is_orphan())
                .count()
        };
        assert!(held(a) >= 1, "no remnant on port {port}");
        // SO_REUSEADDR is not enough against a remnant that had none.
        let again = || {
            let s = crate::sock::socket(inet, stream, 0).unwrap();
            crate::sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).unwrap();
            crate::sock::bind(s.as_fd(), &local).map(|()| s)
        };
        assert_eq!(again().unwrap_err().raw_os_error(), Some(libc::EADDRINUSE));
        let o = destroy_port_orphans(&local).unwrap();
        assert!(o.destroyed >= 1 && o.owned == 0, "{o:?}");
        assert_eq!(held(a), 0);
        again().expect("the port, free again");
    }
}
