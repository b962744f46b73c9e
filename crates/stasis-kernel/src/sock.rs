//! Socket primitives for saving and rebuilding sockets: options, addresses,
//! non-destructive reads of receive queues, and `TCP_REPAIR`.
//!
//! `TCP_REPAIR` (Linux 3.5+, needs CAP_NET_ADMIN) puts a TCP socket in a
//! mode where nothing is sent on the wire: its sequence numbers, queues,
//! negotiated options and window can be read, and a new socket can be given
//! them and "connected" without a handshake. Closing a socket in repair mode
//! sends neither FIN nor RST.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::{KernelError, Result};

// The constants live in `stasis-sys` (`net`); re-exported here where
// callers have always found them.
use stasis_sys::net::{SIOCINQ, SIOCOUTQ, SIOCOUTQNSD};

mod filter;
pub mod netlink;
mod packet;
pub mod unixq;
pub use filter::{
    attach_drop_all, attach_filter, detach_filter, end_holders, has_drop_all_filter, has_filter,
    read_filter, release_holders, take_held, Guarded, SocketGuard, WindowSlot, HOLDER_NAME,
    HOLD_SECS,
};
pub use packet::{inject_tcp, Segment};
pub use stasis_sys::net::{
    SO_PEEK_OFF, TCPI_OPT_SACK, TCPI_OPT_TIMESTAMPS, TCPI_OPT_WSCALE, TCPOPT_MAXSEG,
    TCPOPT_SACK_PERM, TCPOPT_TIMESTAMP, TCPOPT_WINDOW, TCP_QUEUE_SEQ, TCP_RECV_QUEUE, TCP_REPAIR,
    TCP_REPAIR_OFF_NO_WP, TCP_REPAIR_OPTIONS, TCP_REPAIR_QUEUE, TCP_REPAIR_WINDOW, TCP_SEND_QUEUE,
    TCP_TIMESTAMP,
};

fn err(what: String) -> KernelError {
    KernelError::io(what, std::io::Error::last_os_error())
}

/// `getsockopt` of an int option.
pub fn get_int(fd: BorrowedFd<'_>, level: i32, opt: i32) -> Result<i32> {
    let mut v = 0i32;
    let mut len: libc::socklen_t = 4;
    // SAFETY: getsockopt writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(err(format!("getsockopt({level}, {opt})")));
    }
    Ok(v)
}

/// `setsockopt` with raw bytes.
pub fn set_bytes(fd: BorrowedFd<'_>, level: i32, opt: i32, val: &[u8]) -> Result<()> {
    let len = libc::socklen_t::try_from(val.len()).unwrap_or(0);
    // SAFETY: setsockopt reads `len` bytes from `val`.
    let r = unsafe { libc::setsockopt(fd.as_raw_fd(), level, opt, val.as_ptr().cast(), len) };
    if r < 0 {
        return Err(err(format!("setsockopt({level}, {opt})")));
    }
    Ok(())
}

/// `setsockopt` of an int option.
pub fn set_int(fd: BorrowedFd<'_>, level: i32, opt: i32, v: i32) -> Result<()> {
    set_bytes(fd, level, opt, &v.to_ne_bytes())
}

/// `getsockopt` into a byte buffer; returns the bytes the kernel wrote.
pub fn get_bytes(fd: BorrowedFd<'_>, level: i32, opt: i32, max: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut len = libc::socklen_t::try_from(max).unwrap_or(0);
    // SAFETY: getsockopt writes at most `len` bytes into `buf`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(err(format!("getsockopt({level}, {opt})")));
    }
    buf.truncate(len as usize);
    Ok(buf)
}

fn addr_of(fd: BorrowedFd<'_>, peer: bool) -> Result<Vec<u8>> {
    // SAFETY: sockaddr_storage is plain data; zeroes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len =
        libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_storage>()).unwrap_or(128);
    let p = (&mut ss as *mut libc::sockaddr_storage).cast();
    // SAFETY: the kernel writes at most `len` bytes into `ss`.
    let r = unsafe {
        if peer {
            libc::getpeername(fd.as_raw_fd(), p, &mut len)
        } else {
            libc::getsockname(fd.as_raw_fd(), p, &mut len)
        }
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if peer && e.raw_os_error() == Some(libc::ENOTCONN) {
            return Ok(Vec::new());
        }
        return Err(KernelError::io(
            if peer { "getpeername" } else { "getsockname" },
            e,
        ));
    }
    // SAFETY: `ss` is at least `len` bytes long; we copy exactly those.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&ss as *const libc::sockaddr_storage).cast::<u8>(),
            len as usize,
        )
    };
    Ok(bytes.to_vec())
}

/// Local address as raw sockaddr bytes.
pub fn local_addr(fd: BorrowedFd<'_>) -> Result<Vec<u8>> {
    addr_of(fd, false)
}

/// Peer address as raw sockaddr bytes (empty when not connected).
pub fn peer_addr(fd: BorrowedFd<'_>) -> Result<Vec<u8>> {
    addr_of(fd, true)
}

/// True if the raw inet address has port 0 (unbound).
pub fn port_is_zero(addr: &[u8]) -> bool {
    addr.len() < 4 || addr[2] == 0 && addr[3] == 0
}

fn sockaddr_call(fd: BorrowedFd<'_>, addr: &[u8], connect: bool) -> Result<(), std::io::Error> {
    let len = libc::socklen_t::try_from(addr.len()).unwrap_or(0);
    // SAFETY: bind/connect read `len` bytes of the address buffer.
    let r = unsafe {
        if connect {
            libc::connect(fd.as_raw_fd(), addr.as_ptr().cast(), len)
        } else {
            libc::bind(fd.as_raw_fd(), addr.as_ptr().cast(), len)
        }
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `bind` to a raw address.
pub fn bind(fd: BorrowedFd<'_>, addr: &[u8]) -> Result<(), std::io::Error> {
    sockaddr_call(fd, addr, false)
}

/// `connect` to a raw address.
pub fn connect(fd: BorrowedFd<'_>, addr: &[u8]) -> Result<(), std::io::Error> {
    sockaddr_call(fd, addr, true)
}

/// `connect` to `AF_UNSPEC`: disconnects the socket (for a TCP
/// connection in repair mode, silently: its address pair is freed, and
/// nothing is sent to its peer).
pub fn disconnect(fd: BorrowedFd<'_>) -> Result<(), std::io::Error> {
    sockaddr_call(fd, &[0u8; 16], true)
}

/// A new socket (close-on-exec).
pub fn socket(family: i32, ty: i32, proto: i32) -> Result<OwnedFd> {
    // SAFETY: socket returns a new fd or -1.
    let fd = unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(err(format!("socket({family}, {ty}, {proto})")));
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected pair of unix sockets (close-on-exec).
pub fn unix_pair(ty: i32) -> Result<(OwnedFd, OwnedFd)> {
    let mut p = [0i32; 2];
    // SAFETY: socketpair writes two fds into the array.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, p.as_mut_ptr()) } < 0 {
        return Err(err(format!("socketpair(AF_UNIX, {ty})")));
    }
    // SAFETY: two new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

fn ioctl_int(fd: BorrowedFd<'_>, req: u64) -> Result<u32> {
    let mut v = 0i32;
    // SAFETY: these ioctls write one int.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req as _, &mut v as *mut i32) } < 0 {
        return Err(err(format!("ioctl({req:#x})")));
    }
    Ok(v.unsigned_abs())
}

/// Bytes queued to read (`SIOCINQ`).
pub fn inq(fd: BorrowedFd<'_>) -> Result<u32> {
    ioctl_int(fd, SIOCINQ)
}

/// Bytes in the send queue (`SIOCOUTQ`) and of those not yet sent (`SIOCOUTQNSD`).
pub fn outq(fd: BorrowedFd<'_>) -> Result<(u32, u32)> {
    Ok((ioctl_int(fd, SIOCOUTQ)?, ioctl_int(fd, SIOCOUTQNSD)?))
}

/// Credentials of a unix socket message: pid, uid, gid.
pub type Creds = (i32, u32, u32);

/// One message peeked at by [`peek_each`].
struct Peeked<'a> {
    data: &'a [u8],
    /// The sender's raw address (empty where the socket gives none).
    addr: &'a [u8],
    /// For the control messages and `msg_flags`.
    mh: &'a libc::msghdr,
}

/// Steps through the queue of `fd` without consuming it, one message (for
/// a stream: one chunk) at a time into a buffer of `buf_len` bytes, using
/// `SO_PEEK_OFF` from 0; the socket's own peek offset is put back. Stops at
/// an empty queue or once `limit` bytes were read. `each` sees every
/// message and says whether to go on; `what` names a failed `recvmsg`.
fn peek_each(
    fd: BorrowedFd<'_>,
    limit: usize,
    buf_len: usize,
    what: &str,
    mut each: impl FnMut(Peeked<'_>) -> Result<bool>,
) -> Result<()> {
    let saved = get_int(fd, libc::SOL_SOCKET, SO_PEEK_OFF).unwrap_or(-1);
    set_int(fd, libc::SOL_SOCKET, SO_PEEK_OFF, 0)?;
    let mut total = 0usize;
    let mut buf = vec![0u8; buf_len];
    let res = loop {
        if total >= limit {
            break Ok(());
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for SCM_MAX_FD (253) fds and credentials.
        let mut cbuf = [0u64; 160];
        // SAFETY: sockaddr_storage is plain data; zeroes are valid.
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: msghdr is plain data; zeroes are a valid value.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
        mh.msg_namelen = libc::socklen_t::try_from(std::mem::size_of_val(&from)).unwrap_or(0);
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: receiving into our buffers without consuming (MSG_PEEK);
        // the kernel writes at most iov_len data bytes, msg_namelen bytes
        // of address and controllen control bytes. Fds passed in the
        // message are installed in this process close-on-exec
        // (MSG_CMSG_CLOEXEC); `each` closes them.
        let n = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut mh,
                libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                break Ok(());
            }
            break Err(KernelError::io(what, e));
        }
        let n = usize::try_from(n).unwrap_or(0);
        let alen = usize::try_from(mh.msg_namelen)
            .unwrap_or(0)
            .min(std::mem::size_of_val(&from));
        // SAFETY: the kernel wrote `alen` bytes of address into `from`.
        let addr = unsafe {
            std::slice::from_raw_parts((&from as *const libc::sockaddr_storage).cast::<u8>(), alen)
        };
        match each(Peeked {
            data: &buf[..n],
            addr,
            mh: &mh,
        }) {
            Ok(true) => total += n,
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let _ = set_int(fd, libc::SOL_SOCKET, SO_PEEK_OFF, saved);
    res
}

/// The `poll` events (of `events`) the socket has now, without waiting.
pub fn poll_now(fd: BorrowedFd<'_>, events: i16) -> Result<i16> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one live pollfd.
    if unsafe { libc::poll(&mut p, 1, 0) } < 0 {
        return Err(err("poll".into()));
    }
    Ok(p.revents)
}

/// `shutdown(2)`: `how` is `SHUT_RD`, `SHUT_WR` or `SHUT_RDWR`.
pub fn shutdown(fd: BorrowedFd<'_>, how: i32) -> Result<()> {
    // SAFETY: shutdown takes no pointer; an invalid fd or `how` fails.
    if unsafe { libc::shutdown(fd.as_raw_fd(), how) } < 0 {
        return Err(err(format!("shutdown({how})")));
    }
    Ok(())
}

/// Reads `len` bytes of the current repair queue without consuming them.
pub fn peek_repair_queue(fd: BorrowedFd<'_>, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    // SAFETY: receiving into our buffer without consuming (MSG_PEEK).
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            len,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if usize::try_from(n).ok() != Some(len) {
        return Err(KernelError::io(
            format!("reading a TCP repair queue of {len} bytes (got {n})"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(buf)
}

/// Sends one message carrying the credentials `creds` (pid, uid, gid):
/// root may speak for another process, as the original sender did.
pub fn send_with_creds(fd: BorrowedFd<'_>, data: &[u8], creds: (i32, u32, u32)) -> Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};
    let ucred = libc::ucred {
        pid: creds.0,
        uid: creds.1,
        gid: creds.2,
    };
    let uc = UnixCredentials::from(ucred);
    let cmsg = [ControlMessage::ScmCredentials(&uc)];
    let iov = [std::io::IoSlice::new(data)];
    sendmsg::<()>(fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(|e| {
        KernelError::io(
            format!(
                "sending a queued message with the credentials of pid {}",
                creds.0
            ),
            e.into(),
        )
    })?;
    Ok(())
}

/// Sends one empty message (a datagram or seqpacket record of 0 bytes).
pub fn send_empty(fd: BorrowedFd<'_>) -> Result<()> {
    loop {
        // SAFETY: a zero-length send reads no memory.
        let n = unsafe { libc::send(fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(KernelError::io("sending an empty queued message", e));
        }
    }
}

/// Sends all of `data` (blocking socket or not: retries until done).
pub fn send_all(fd: BorrowedFd<'_>, data: &[u8]) -> Result<()> {
    let mut off = 0;
    while off < data.len() {
        // SAFETY: sending from our buffer.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                data[off..].as_ptr().cast(),
                data.len() - off,
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(KernelError::io(
                format!("sending {} queued bytes", data.len()),
                e,
            ));
        }
        off += usize::try_from(n).unwrap_or(0);
    }
    Ok(())
}

/// The first bytes of `struct tcp_info` that stasis uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpInfo {
    pub state: u8,
    pub options: u8,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    /// The segment size in use (`mss_cache`: the peer's MSS bounded by the
    /// path and by half the largest window seen, minus options).
    pub snd_mss: u32,
    /// For a listener: connections waiting to be accepted.
    pub unacked: u32,
    /// For a listener: its backlog.
    pub sacked: u32,
    /// Bytes the peer acknowledged (`tcpi_bytes_acked`; `u64::MAX` on a
    /// kernel whose `tcp_info` is too short to say).
    pub bytes_acked: u64,
}

/// `TCP_INFO`.
pub fn tcp_info(fd: BorrowedFd<'_>) -> Result<TcpInfo> {
    let b = get_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, 256)?;
    if b.len() < 32 {
        return Err(KernelError::io(
            "TCP_INFO",
            std::io::Error::other("short struct tcp_info"),
        ));
    }
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
    Ok(TcpInfo {
        state: b[0],
        options: b[5],
        snd_wscale: b[6] & 0xf,
        rcv_wscale: b[6] >> 4,
        snd_mss: u32_at(16),
        unacked: u32_at(24),
        sacked: u32_at(28),
        bytes_acked: b
            .get(120..128)
            .and_then(|x| x.try_into().ok())
            .map_or(u64::MAX, u64::from_ne_bytes),
    })
}

/// Reads the datagrams queued on a UDP socket without consuming them, each
/// with its sender's raw address (`SO_PEEK_OFF` steps through the queue;
/// the socket's own peek offset is put back).
pub fn peek_datagrams(fd: BorrowedFd<'_>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    const WHAT: &str = "peeking at a datagram";
    let mut out = Vec::new();
    peek_each(fd, limit, 65536, WHAT, |p| {
        if p.mh.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(KernelError::io(
                WHAT,
                std::io::Error::other("a datagram larger than 64 KiB"),
            ));
        }
        if p.data.is_empty() {
            // An empty datagram does not move the peek offset: the ones
            // behind it cannot be reached without consuming it.
            return Err(KernelError::io(
                WHAT,
                std::io::Error::other("an empty datagram in the queue"),
            ));
        }
        out.push((p.addr.to_vec(), p.data.to_vec()));
        Ok(true)
    })?;
    Ok(out)
}

/// Delivers `data` to the local IPv4 UDP address `to` as if `from` had
/// sent it: one packet with a hand-made IP and UDP header through a raw
/// socket (needs CAP_NET_RAW). Both are raw `sockaddr_in`.
pub fn inject_udp_v4(from: &[u8], to: &[u8], data: &[u8]) -> Result<()> {
    let field = |a: &[u8], r: std::ops::Range<usize>| a.get(r).map(<[u8]>::to_vec);
    let (Some(sport), Some(sip), Some(dport), Some(dip)) = (
        field(from, 2..4),
        field(from, 4..8),
        field(to, 2..4),
        field(to, 4..8),
    ) else {
        return Err(KernelError::io(
            "a datagram's addresses",
            std::io::Error::other("not IPv4"),
        ));
    };
    // An unspecified destination (bound to 0.0.0.0) is reached on loopback.
    let dip = if dip == [0, 0, 0, 0] {
        vec![127, 0, 0, 1]
    } else {
        dip
    };
    let udp_len = u16::try_from(8 + data.len())
        .map_err(|_| KernelError::io("a datagram", std::io::Error::other("too large")))?;
    let total = udp_len
        .checked_add(20)
        .ok_or_else(|| KernelError::io("a datagram", std::io::Error::other("too large")))?;
    let mut p = Vec::with_capacity(usize::from(total));
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total.to_be_bytes());
    // No fragment, DF, TTL 64, protocol 17 (UDP), checksum by the kernel.
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&sip);
    p.extend_from_slice(&dip);
    // UDP header; checksum 0 means "none" for IPv4.
    p.extend_from_slice(&sport);
    p.extend_from_slice(&dport);
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(data);
    // The kernel fills in the IP checksum and id for IP_HDRINCL.
    let mut dst = Vec::from(to.get(..16).unwrap_or(to));
    dst.resize(16, 0);
    dst[2..4].copy_from_slice(&[0, 0]);
    dst[4..8].copy_from_slice(&dip);
    send_raw(libc::AF_INET, &p, &dst, "a queued datagram")
}

/// Delivers `data` to the local IPv6 UDP address `to` as if `from` had
/// sent it: one packet with a hand-made IPv6 and UDP header (the UDP
/// checksum, mandatory over IPv6, computed here) through a raw socket
/// (needs CAP_NET_RAW; an IPv6 `IPPROTO_RAW` socket sends the header it is
/// given). Both are raw `sockaddr_in6`. A sender with an IPv4-mapped
/// address (a dual-stack socket's IPv4 peer) is sent over IPv4, to
/// 127.0.0.1 if `to` is unspecified or to its IPv4-mapped address.
pub fn inject_udp_v6(from: &[u8], to: &[u8], data: &[u8]) -> Result<()> {
    let bad = || KernelError::io("a datagram's addresses", std::io::Error::other("not IPv6"));
    let (sport, sip) = (
        from.get(2..4).ok_or_else(bad)?,
        from.get(8..24).ok_or_else(bad)?,
    );
    let (dport, dip) = (
        to.get(2..4).ok_or_else(bad)?,
        to.get(8..24).ok_or_else(bad)?,
    );
    let mapped = |a: &[u8]| a[..10].iter().all(|b| *b == 0) && a[10..12] == [0xff, 0xff];
    if mapped(sip) {
        let dst4: [u8; 4] = if mapped(dip) {
            [dip[12], dip[13], dip[14], dip[15]]
        } else if dip.iter().all(|b| *b == 0) {
            [127, 0, 0, 1]
        } else {
            return Err(KernelError::io(
                "a datagram's addresses",
                std::io::Error::other("an IPv4 sender to an IPv6-only address"),
            ));
        };
        let v4 = |port: &[u8], ip: &[u8]| {
            let mut a = vec![0u8; 16];
            a[..2].copy_from_slice(&AF_INET_U16.to_ne_bytes());
            a[2..4].copy_from_slice(port);
            a[4..8].copy_from_slice(ip);
            a
        };
        return inject_udp_v4(&v4(sport, &sip[12..16]), &v4(dport, &dst4), data);
    }
    // An unspecified destination (bound to ::) is reached on loopback.
    let mut dst = [0u8; 16];
    dst.copy_from_slice(dip);
    if dst == [0; 16] {
        dst[15] = 1;
    }
    let udp_len = u16::try_from(8 + data.len())
        .map_err(|_| KernelError::io("a datagram", std::io::Error::other("too large")))?;
    let mut udp = Vec::with_capacity(usize::from(udp_len));
    udp.extend_from_slice(sport);
    udp.extend_from_slice(dport);
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(data);
    let sum = udp6_checksum(sip, &dst, &udp);
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    let mut p = Vec::with_capacity(40 + udp.len());
    // Version 6, no traffic class or flow label; next header 17 (UDP),
    // hop limit 64.
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[17, 64]);
    p.extend_from_slice(sip);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&udp);
    // sendto wants the port 0 for a raw socket.
    let mut to6 = vec![0u8; 28];
    to6[..2].copy_from_slice(&AF_INET6_U16.to_ne_bytes());
    to6[8..24].copy_from_slice(&dst);
    // A link-local destination needs its interface (sin6_scope_id).
    if let Some(scope) = to.get(24..28) {
        to6[24..28].copy_from_slice(scope);
    }
    send_raw(libc::AF_INET6, &p, &to6, "a queued datagram")
}

/// `sa_family` values, as the 16 bits a `sockaddr` holds them in (2 and
/// 10 on Linux, asserted).
const AF_INET_U16: u16 = 2;
const AF_INET6_U16: u16 = 10;
const _: () = assert!(libc::AF_INET == AF_INET_U16 as i32);
const _: () = assert!(libc::AF_INET6 == AF_INET6_U16 as i32);

/// The UDP checksum over IPv6 (RFC 8200 8.1): the pseudo-header (source,
/// destination, length, next header) and the UDP header and data, with
/// 0 sent as 0xffff.
fn udp6_checksum(src: &[u8], dst: &[u8], udp: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(src);
    add(dst);
    add(&u32::try_from(udp.len()).unwrap_or(u32::MAX).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // Folded: fits in 16 bits.
    match !u16::try_from(sum).unwrap_or(u16::MAX) {
        0 => 0xffff,
        c => c,
    }
}

/// Sends the packet `p` (its IP header included: `IPPROTO_RAW`) through a
/// raw socket of `family` to the address `dst` (a `sockaddr_in` or
/// `sockaddr_in6`); `what` names it in errors.
pub(crate) fn send_raw(family: i32, p: &[u8], dst: &[u8], what: &str) -> Result<()> {
    let s = socket(family, libc::SOCK_RAW, libc::IPPROTO_RAW)?;
    let dlen = libc::socklen_t::try_from(dst.len()).unwrap_or(0);
    // SAFETY: sendto reads `p.len()` bytes from `p` and `dlen` bytes of
    // address from `dst`, both live buffers.
    let n = unsafe {
        libc::sendto(
            s.as_raw_fd(),
            p.as_ptr().cast(),
            p.len(),
            0,
            dst.as_ptr().cast(),
            dlen,
        )
    };
    if n < 0 {
        return Err(err(format!("sendto(SOCK_RAW) of {what}")));
    }
    Ok(())
}

#[cfg(test)]
mod gate_tests {
    use super::*;
    use std::os::fd::AsFd;

    /// An accepted connection with SO_REUSEADDR (inherited), locked and in
    /// repair mode as a dump leaves it, and its guard.
    fn repaired_connection(
        owners: &[i32],
    ) -> (std::net::TcpStream, std::net::TcpStream, SocketGuard) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_int(l.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        assert_eq!(
            get_int(a.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).unwrap(),
            1
        );
        let guard = SocketGuard::spawn(
            &[Guarded {
                fd: a.as_raw_fd(),
                detach_filter: true,
                leave_repair: true,
                reuseaddr: 1,
            }],
            owners,
            owners,
        )
        .unwrap();
        attach_drop_all(a.as_fd()).unwrap();
        set_int(a.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR, 1).unwrap();
        assert_eq!(
            get_int(a.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).unwrap(),
            2
        );
        (a, c, guard)
    }

    #[test]
    fn a_guard_puts_sockets_back_when_the_dumper_is_gone() {
        let (a, mut c, mut guard) = repaired_connection(&[]);
        // The dumper "dies": its end of the pipe closes without a word.
        drop(guard.tx.take());
        let mut st = 0;
        // SAFETY: waiting for the guard, our child.
        assert_eq!(unsafe { libc::waitpid(guard.pid, &mut st, 0) }, guard.pid);
        assert_eq!(
            get_int(a.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR).unwrap(),
            0
        );
        assert_eq!(
            get_int(a.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).unwrap(),
            1
        );
        assert!(!has_filter(a.as_fd()));
        // The connection works again both ways.
        use std::io::{Read, Write};
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        (&a).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        (&a).write_all(b"pong").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong");
    }

    /// After the hand-over of the kill, the connections are in repair mode
    /// (the dump took them out of it once they were read) behind their
    /// filter, and the owner dies: closed, they say nothing to their peer.
    #[test]
    fn a_guard_told_to_kill_repairs_the_sockets_and_kills_the_owners() {
        let mut owner = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = i32::try_from(owner.id()).unwrap();
        let (a, mut c, guard) = repaired_connection(&[pid]);
        set_int(
            a.as_fd(),
            libc::IPPROTO_TCP,
            TCP_REPAIR,
            TCP_REPAIR_OFF_NO_WP,
        )
        .unwrap();
        guard.kill_owners();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(owner.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(
            get_int(a.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR).unwrap(),
            1
        );
        assert!(has_drop_all_filter(a.as_fd()));
        drop(a);
        // Nothing reached the peer: no FIN, no reset.
        c.set_nonblocking(true).unwrap();
        use std::io::Read;
        let mut b = [0u8; 1];
        let r = c.read(&mut b);
        assert_eq!(
            r.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "the peer saw the connection end"
        );
    }

    /// After the kill, the connection is not closed but held (in repair
    /// mode) by a process named `stasis-tcphold`: what the peer sends then
    /// is dropped, not answered with a reset, until a restore ends the
    /// holder, which closes it silently.
    #[test]
    fn a_killed_trees_connection_is_held_until_released() {
        let mut owner = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = i32::try_from(owner.id()).unwrap();
        let (a, mut c, guard) = repaired_connection(&[pid]);
        let ino = {
            use std::os::unix::fs::MetadataExt;
            let link = std::fs::read_link(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
            let m = std::fs::metadata(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
            assert!(link.to_string_lossy().starts_with("socket:["), "{link:?}");
            u32::try_from(m.ino()).unwrap()
        };
        guard.kill_owners();
        let _ = owner.wait();
        drop(a);
        // Sent now, while the tree is down: dropped, no reset comes back.
        use std::io::{Read, Write};
        c.write_all(b"request").unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_millis(700)))
            .unwrap();
        let mut b = [0u8; 1];
        let r = c.read(&mut b).map_err(|e| e.kind());
        assert!(
            matches!(
                r,
                Err(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
            ),
            "the peer saw the held connection end: {r:?}"
        );
        assert_eq!(release_holders(&[ino]).unwrap(), 1, "one holder ended");
        assert_eq!(release_holders(&[ino]).unwrap(), 0, "and gone");
    }

    fn state_of(pid: i32) -> char {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        st[st.rfind(')').unwrap() + 2..].chars().next().unwrap()
    }

    /// Waits (up to a minute) until `pid`'s state satisfies `ok`.
    fn wait_state(pid: i32, ok: impl Fn(char) -> bool) -> char {
        let t0 = std::time::Instant::now();
        loop {
            let s = state_of(pid);
            if ok(s) || t0.elapsed() > std::time::Duration::from_secs(60) {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// A held owner stopped when its dumper died is continued, once the
    /// sockets are back; one never held is left alone.
    #[test]
    fn a_guard_continues_held_owners_after_the_sockets_are_back() {
        for told in [true, false] {
            let mut owner = std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap();
            let pid = i32::try_from(owner.id()).unwrap();
            let (a, _c, mut guard) = repaired_connection(&[pid]);
            if told {
                guard.hold().unwrap();
            }
            // SAFETY: signalling our own child.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
            assert_eq!(wait_state(pid, |s| s == 'T'), 'T');
            drop(guard.tx.take());
            let mut st = 0;
            // SAFETY: waiting for the guard, our child.
            assert_eq!(unsafe { libc::waitpid(guard.pid, &mut st, 0) }, guard.pid);
            assert_eq!(
                get_int(a.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR).unwrap(),
                0
            );
            if told {
                assert_ne!(
                    wait_state(pid, |s| s != 'T'),
                    'T',
                    "the held owner stayed stopped"
                );
            } else {
                assert_eq!(state_of(pid), 'T', "an owner never held was continued");
            }
            owner.kill().unwrap();
            owner.wait().unwrap();
        }
    }

    #[test]
    fn a_dismissed_guard_touches_nothing() {
        let (a, _c, guard) = repaired_connection(&[]);
        guard.dismiss();
        assert_eq!(
            get_int(a.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR).unwrap(),
            1
        );
        assert!(has_drop_all_filter(a.as_fd()));
        // Closed in repair mode, silently, as after a dump that kills.
        drop(a);
    }

    #[test]
    fn drop_all_filter_stops_handshakes_until_detached() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert!(!has_filter(l.as_fd()));
        attach_drop_all(l.as_fd()).unwrap();
        assert!(has_filter(l.as_fd()) && has_drop_all_filter(l.as_fd()));
        let t = std::time::Duration::from_millis(300);
        assert!(
            std::net::TcpStream::connect_timeout(&addr, t).is_err(),
            "a handshake completed through the drop-all filter"
        );
        detach_filter(l.as_fd()).unwrap();
        assert!(!has_filter(l.as_fd()) && !has_drop_all_filter(l.as_fd()));
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(60))
            .expect("connect after detaching");
    }

    #[test]
    fn datagrams_are_peeked_with_their_senders_and_delivered_again() {
        use std::net::UdpSocket;
        let r = UdpSocket::bind("127.0.0.1:0").unwrap();
        let s1 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let s2 = UdpSocket::bind("127.0.0.1:0").unwrap();
        s1.send_to(&[1u8; 300], r.local_addr().unwrap()).unwrap();
        s2.send_to(&[2u8; 5000], r.local_addr().unwrap()).unwrap();
        let q = peek_until(r.as_fd(), 2);
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].1.len(), q[1].1.len()), (300, 5000));
        assert_eq!(port_of_raw(&q[0].0), s1.local_addr().unwrap().port());
        assert_eq!(port_of_raw(&q[1].0), s2.local_addr().unwrap().port());
        // Nothing was consumed.
        assert_eq!(peek_datagrams(r.as_fd(), usize::MAX).unwrap(), q);
        // Delivered again, elsewhere, from the same senders.
        let r2 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = local_addr(r2.as_fd()).unwrap();
        for (from, data) in &q {
            inject_udp_v4(from, &to, data).unwrap();
        }
        assert_eq!(peek_until(r2.as_fd(), 2), q);
        let mut b = [0u8; 8192];
        let (n, from) = r2.recv_from(&mut b).unwrap();
        assert_eq!((n, from), (300, s1.local_addr().unwrap()));
    }

    /// The datagrams queued on `fd`, once there are at least `n` (waits up
    /// to a minute: loopback may deliver from a softirq later).
    fn peek_until(fd: BorrowedFd<'_>, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let t0 = std::time::Instant::now();
        loop {
            let q = peek_datagrams(fd, usize::MAX).unwrap();
            if q.len() >= n || t0.elapsed() > std::time::Duration::from_secs(60) {
                return q;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn port_of_raw(a: &[u8]) -> u16 {
        u16::from_be_bytes([a[2], a[3]])
    }
}

#[cfg(test)]
mod udp6_tests {
    use super::udp6_checksum;

    #[test]
    fn udp_over_ipv6_checksums_its_pseudo_header() {
        let lo = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mut udp = vec![0x9c, 0x40, 0, 53, 0, 13, 0, 0];
        udp.extend_from_slice(b"hello");
        // Worked out independently (Python, RFC 8200 8.1).
        let sum = udp6_checksum(&lo, &lo, &udp);
        assert_eq!(sum, 0x1f8b);
        // A packet that carries its checksum sums to all ones.
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(udp6_checksum(&lo, &lo, &udp), 0xffff);
        // Another source: another checksum.
        let mut other = lo;
        other[0] = 0xfe;
        udp[6..8].copy_from_slice(&[0, 0]);
        assert_ne!(udp6_checksum(&other, &lo, &udp), sum);
    }
}
