//! Unix socket facts from the kernel's `sock_diag` netlink interface.
//!
//! A unix socket's peer (the other end of a socketpair or of an accepted
//! connection) is only visible here: the request dumps every unix socket of
//! the network namespace with its name, peer inode, state and queue length.
//!
//! Message layout (little-endian, `linux/sock_diag.h`, `linux/unix_diag.h`):
//! `nlmsghdr` (16 bytes) + `unix_diag_req` (24 bytes) out; `nlmsghdr` +
//! `unix_diag_msg` (16 bytes) + `rtattr`s in, until `NLMSG_DONE`.

use std::collections::HashMap;
use std::os::fd::AsRawFd;

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};

use crate::{KernelError, Result};

use stasis_sys::net::{
    NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP, NLM_F_REQUEST, SOCK_DIAG_BY_FAMILY, UDIAG_SHOW_ICONS,
    UDIAG_SHOW_NAME, UDIAG_SHOW_PEER, UDIAG_SHOW_RQLEN, UNIX_DIAG_ICONS, UNIX_DIAG_NAME,
    UNIX_DIAG_PEER, UNIX_DIAG_RQLEN, UNIX_DIAG_SHUTDOWN,
};

/// Socket state values used by unix sockets (the TCP state numbers).
pub use stasis_sys::net::{
    TCP_CLOSE as STATE_CLOSE, TCP_ESTABLISHED as STATE_ESTABLISHED, TCP_LISTEN as STATE_LISTEN,
};

/// What the kernel says about one unix socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnixInfo {
    pub ino: u64,
    /// `SOCK_STREAM`, `SOCK_DGRAM` or `SOCK_SEQPACKET`.
    pub sock_type: u8,
    pub state: u8,
    /// Bound name (`sun_path` bytes; a leading NUL means abstract).
    pub name: Option<Vec<u8>>,
    pub peer: Option<u64>,
    /// Listening: connections waiting; otherwise bytes queued to read.
    pub rqueue: u32,
    /// Listening: the backlog; otherwise bytes queued to send.
    pub wqueue: u32,
    /// `sk_shutdown`: `RCV_SHUTDOWN` (1) and `SEND_SHUTDOWN` (2) bits, set
    /// by the socket's own `shutdown` or mirrored from its peer's.
    pub shutdown: u8,
    /// Listening: the client inode of each connection waiting to be
    /// accepted, in accept order (0: its client is closed).
    pub icons: Vec<u64>,
}

/// A `sock_diag` reply that cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("bad netlink message length {0}")]
    Length(usize),
    #[error("sock_diag error {}", std::io::Error::from_raw_os_error(*.0))]
    Kernel(i32),
    #[error("short unix_diag_msg")]
    Short,
}

/// Hands the payload (after the `nlmsghdr`) of each `SOCK_DIAG_BY_FAMILY`
/// message of one netlink reply buffer to `each`; `true` once
/// `NLMSG_DONE` is seen. Shared by the unix and packet queries.
fn for_each_message(
    buf: &[u8],
    mut each: impl FnMut(&[u8]) -> Result<(), ReplyError>,
) -> Result<bool, ReplyError> {
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = le32(buf, off) as usize;
        let ty = le16(buf, off + 4);
        if len < 16 || off + len > buf.len() {
            return Err(ReplyError::Length(len));
        }
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = i32::from_le_bytes(le32(buf, off + 16).to_le_bytes());
                return Err(ReplyError::Kernel(-errno));
            }
            SOCK_DIAG_BY_FAMILY => each(&buf[off + 16..off + len])?,
            _ => {}
        }
        off += len.div_ceil(4) * 4;
    }
    Ok(false)
}

/// Hands each `rtattr` (type, data) of `buf` to `each`.
fn for_each_attr(buf: &[u8], mut each: impl FnMut(u16, &[u8])) {
    let mut a = 0;
    while a + 4 <= buf.len() {
        let alen = usize::from(le16(buf, a));
        if alen < 4 || a + alen > buf.len() {
            break;
        }
        each(le16(buf, a + 2), &buf[a + 4..a + alen]);
        a += alen.div_ceil(4) * 4;
    }
}

/// The little-endian u32 / u16 at `o` of `b` (0 past its end).
fn le32(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
fn le16(b: &[u8], o: usize) -> u16 {
    b.get(o..o + 2)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

/// Parses the messages of one netlink reply buffer into `out`; returns
/// `true` once `NLMSG_DONE` is seen.
pub fn parse_reply(buf: &[u8], out: &mut HashMap<u64, UnixInfo>) -> Result<bool, ReplyError> {
    for_each_message(buf, |m| {
        if m.len() < 16 {
            return Err(ReplyError::Short);
        }
        let mut info = UnixInfo {
            sock_type: m[1],
            state: m[2],
            ino: u64::from(le32(m, 4)),
            ..Default::default()
        };
        for_each_attr(&m[16..], |aty, data| match aty {
            UNIX_DIAG_NAME => info.name = Some(data.to_vec()),
            UNIX_DIAG_PEER if data.len() >= 4 => info.peer = Some(u64::from(le32(data, 0))),
            UNIX_DIAG_RQLEN if data.len() >= 8 => {
                info.rqueue = le32(data, 0);
                info.wqueue = le32(data, 4);
            }
            UNIX_DIAG_ICONS => {
                info.icons = data
                    .chunks_exact(4)
                    .map(|c| u64::from(le32(c, 0)))
                    .collect();
            }
            UNIX_DIAG_SHUTDOWN if !data.is_empty() => info.shutdown = data[0],
            _ => {}
        });
        out.insert(info.ino, info);
        Ok(())
    })
}

/// Every unix socket of this network namespace, by inode.
pub fn unix_sockets() -> Result<HashMap<u64, UnixInfo>> {
    let mut req = Vec::with_capacity(40);
    req.extend_from_slice(&40u32.to_le_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_le_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_le_bytes());
    req.extend_from_slice(&1u32.to_le_bytes()); // seq
    req.extend_from_slice(&0u32.to_le_bytes()); // pid
    req.push(1); // AF_UNIX
    req.push(0);
    req.extend_from_slice(&0u16.to_le_bytes());
    req.extend_from_slice(&u32::MAX.to_le_bytes()); // all states
    req.extend_from_slice(&0u32.to_le_bytes()); // ino
    req.extend_from_slice(
        &(UDIAG_SHOW_NAME | UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN | UDIAG_SHOW_ICONS).to_le_bytes(),
    );
    req.extend_from_slice(&[0u8; 8]); // cookie
    let mut out = HashMap::new();
    exchange(&req, |buf| {
        parse_reply(buf, &mut out)
            .map_err(|e| KernelError::io("sock_diag", std::io::Error::other(e)))
    })?;
    Ok(out)
}

/// What `sock_diag` says of one packet socket that `getsockopt` cannot:
/// its protocol, its multicast and promiscuous memberships and its rings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PacketDiag {
    /// Its protocol (an ethertype, in host byte order: `socket(2)` takes
    /// it in network order), which `SO_PROTOCOL` does not tell for packet
    /// sockets.
    pub num: u16,
    /// (ifindex, count, type, address) of each membership.
    pub mclist: Vec<(i32, u32, u16, Vec<u8>)>,
    /// The receive and transmit rings (`struct packet_diag_ring`: block
    /// size and count, frame size and count, retire timeout, private
    /// size, features), if set up.
    pub rx_ring: Option<[u32; 7]>,
    pub tx_ring: Option<[u32; 7]>,
}

/// Parses one reply buffer of a packet `sock_diag` dump into `out` (by
/// inode); `true` once `NLMSG_DONE` is seen.
pub fn parse_packet_reply(
    buf: &[u8],
    out: &mut HashMap<u64, PacketDiag>,
) -> Result<bool, ReplyError> {
    use stasis_sys::net::{
        PACKET_DIAG_MCLIST, PACKET_DIAG_MCLIST_LEN, PACKET_DIAG_MSG_LEN, PACKET_DIAG_RING_LEN,
        PACKET_DIAG_RX_RING, PACKET_DIAG_TX_RING,
    };
    let ring = |data: &[u8]| {
        let mut r = [0u32; 7];
        for (i, w) in r.iter_mut().enumerate() {
            *w = le32(data, i * 4);
        }
        r
    };
    for_each_message(buf, |m| {
        if m.len() < PACKET_DIAG_MSG_LEN {
            return Err(ReplyError::Short);
        }
        let mut d = PacketDiag {
            num: le16(m, 2),
            ..Default::default()
        };
        for_each_attr(&m[PACKET_DIAG_MSG_LEN..], |aty, data| match aty {
            PACKET_DIAG_MCLIST => {
                for c in data.chunks_exact(PACKET_DIAG_MCLIST_LEN) {
                    let alen = usize::from(le16(c, 10)).min(32);
                    d.mclist.push((
                        i32::from_le_bytes(le32(c, 0).to_le_bytes()),
                        le32(c, 4),
                        le16(c, 8),
                        c[12..12 + alen].to_vec(),
                    ));
                }
            }
            PACKET_DIAG_RX_RING if data.len() >= PACKET_DIAG_RING_LEN => {
                d.rx_ring = Some(ring(data))
            }
            PACKET_DIAG_TX_RING if data.len() >= PACKET_DIAG_RING_LEN => {
                d.tx_ring = Some(ring(data))
            }
            _ => {}
        });
        out.insert(u64::from(le32(m, 4)), d);
        Ok(())
    })
}

/// Every packet socket of this network namespace, by inode: memberships
/// and rings.
pub fn packet_sockets() -> Result<HashMap<u64, PacketDiag>> {
    use stasis_sys::net::{PACKET_DIAG_REQ_LEN, PACKET_SHOW_MCLIST, PACKET_SHOW_RING_CFG};
    let total = 16 + PACKET_DIAG_REQ_LEN;
    let mut req = Vec::with_capacity(total);
    req.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_le_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_le_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_le_bytes());
    req.extend_from_slice(&1u32.to_le_bytes()); // seq
    req.extend_from_slice(&0u32.to_le_bytes()); // pid
    req.push(u8::try_from(libc::AF_PACKET).unwrap_or(17));
    req.push(0); // protocol
    req.extend_from_slice(&0u16.to_le_bytes());
    req.extend_from_slice(&0u32.to_le_bytes()); // ino
    req.extend_from_slice(&(PACKET_SHOW_MCLIST | PACKET_SHOW_RING_CFG).to_le_bytes());
    req.extend_from_slice(&[0u8; 8]); // cookie
    let mut out = HashMap::new();
    exchange(&req, |buf| {
        parse_packet_reply(buf, &mut out)
            .map_err(|e| KernelError::io("sock_diag (packet)", std::io::Error::other(e)))
    })?;
    Ok(out)
}

/// Sends one `sock_diag` request on a new netlink socket and hands each
/// reply buffer to `each` until it returns `true` (done) or the kernel
/// sends nothing more. Shared by the unix and the TCP queries.
pub(crate) fn exchange(req: &[u8], mut each: impl FnMut(&[u8]) -> Result<bool>) -> Result<()> {
    let s = socket::socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(|e| KernelError::io("sock_diag: socket(AF_NETLINK)", e.into()))?;
    socket::send(s.as_raw_fd(), req, MsgFlags::empty())
        .map_err(|e| KernelError::io("sock_diag: send", e.into()))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket::recv(s.as_raw_fd(), &mut buf, MsgFlags::empty())
            .map_err(|e| KernelError::io("sock_diag: recv", e.into()))?;
        if n == 0 || each(&buf[..n])? {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_socketpair_and_its_peer() {
        let (a, b) = crate::scm::dgram_pair().unwrap();
        let ino = |fd: &std::os::fd::OwnedFd| {
            // SAFETY: libc::stat is plain data; zeroes are a valid value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat into a local struct.
            unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
            st.st_ino
        };
        let all = unix_sockets().unwrap();
        let ia = all.get(&ino(&a)).expect("socket a listed");
        assert_eq!(ia.peer, Some(ino(&b)));
        assert_eq!(ia.sock_type, 2u8);
    }

    #[test]
    fn garbage_replies_are_errors_not_panics() {
        let mut out = HashMap::new();
        assert!(parse_reply(&[0xff; 40], &mut out).is_err());
        assert_eq!(parse_reply(&[0u8; 8], &mut out), Ok(false));
    }
}
