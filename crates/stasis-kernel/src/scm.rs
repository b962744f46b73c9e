//! Passing file descriptors over unix sockets (`SCM_RIGHTS`).
//!
//! The restorer creates open file descriptions (pipes, eventfds, files...)
//! in its own process and hands them to the processes it rebuilds through a
//! datagram socket pair whose other end they inherited.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::sys::socket::{
    self, sendmsg, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};

use crate::{KernelError, Result};

/// A datagram socket pair (both ends close-on-exec).
pub fn dgram_pair() -> Result<(OwnedFd, OwnedFd)> {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| KernelError::io("socketpair(AF_UNIX, SOCK_DGRAM)", e.into()))
}

/// A sequenced-packet socket pair (both ends close-on-exec): datagrams
/// that keep their boundaries, on a line whose end the other side sees.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| KernelError::io("socketpair(AF_UNIX, SOCK_SEQPACKET)", e.into()))
}

/// Sends `fd` as one datagram (one byte of payload) over `sock`.
pub fn send_fd(sock: &OwnedFd, fd: BorrowedFd<'_>) -> Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(b"F")];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(|e| KernelError::io("sendmsg(SCM_RIGHTS)", e.into()))?;
    Ok(())
}

/// Sends `payload` with `fd` attached over a connected socket.
pub fn send_with_fd(sock: BorrowedFd<'_>, payload: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(payload)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(|e| KernelError::io("sendmsg(SCM_RIGHTS)", e.into()))?;
    Ok(())
}

/// Receives up to `buf.len()` bytes and at most one attached fd
/// (close-on-exec). Returns the byte count (0 at end of stream) and the fd.
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| KernelError::io("recvmsg(SCM_RIGHTS)", e.into()))?;
    let mut got = None;
    for c in msg
        .cmsgs()
        .map_err(|e| KernelError::io("recvmsg control data", e.into()))?
    {
        if let socket::ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just installed this descriptor in our
                // table for this message; nothing else owns it.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                if got.is_none() {
                    got = Some(fd);
                }
            }
        }
    }
    Ok((msg.bytes, got))
}

/// Duplicates `fd` to the lowest free number >= `min` (close-on-exec).
pub fn dup_at_least(fd: BorrowedFd<'_>, min: i32) -> Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd or -1.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if n < 0 {
        return Err(KernelError::io(
            format!("F_DUPFD_CLOEXEC >= {min}"),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}
