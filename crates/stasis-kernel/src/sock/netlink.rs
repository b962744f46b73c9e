//! Netlink sockets: whether one has messages waiting to be read.

use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{KernelError, Result};

/// Whether a message waits in the receive queue of `fd` (peeked, left
/// queued).
pub fn has_unread(fd: BorrowedFd<'_>) -> Result<bool> {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: receiving at most one byte into a local buffer, without
        // consuming the message (MSG_PEEK).
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                b.as_mut_ptr().cast(),
                b.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(false),
            _ => return Err(KernelError::io("recv(MSG_PEEK) on a netlink socket", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_fresh_netlink_socket_has_nothing_to_read() {
        let s = crate::sock::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE).unwrap();
        assert!(!has_unread(s.as_fd()).unwrap());
    }
}
