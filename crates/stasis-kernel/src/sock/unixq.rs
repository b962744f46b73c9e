//! The receive queue of a unix socket, with the file descriptors in flight
//! in it (`SCM_RIGHTS`).
//!
//! Peeking (`MSG_PEEK`, stepping with `SO_PEEK_OFF`) at a message that
//! carries fds installs copies of them in this process, as a real receive
//! would, without taking them off the queue: they come back as
//! [`OwnedFd`]s, ordinary open files to save, and the queue is left as it
//! was (a process left running after the dump reads it intact). On the
//! restore side [`send_msg`] queues a message again with its fds and
//! credentials.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};

use super::{peek_each, Creds};
use crate::{KernelError, Result};

/// One queued message of a unix socket (for a stream: a chunk that ends
/// at the first message carrying fds).
#[derive(Debug)]
pub struct UnixMsg {
    pub data: Vec<u8>,
    /// Credentials it carries (`SO_PASSCRED` set on the socket).
    pub creds: Option<Creds>,
    /// The open files in flight with it, in the order they were sent.
    pub fds: Vec<OwnedFd>,
}

/// Reads the queue of unix socket `fd` without consuming it, message by
/// message (a stream in chunks), with each message's credentials and fds.
/// `limit` bounds the bytes read. `eof_after`: on a seqpacket socket whose
/// receiving side is shut down, an empty read is the end of the queue
/// once that many bytes were read (the kernel signals end of file so);
/// `None` where an empty message is data.
pub fn peek_queue(
    fd: BorrowedFd<'_>,
    limit: usize,
    eof_after: Option<usize>,
) -> Result<Vec<UnixMsg>> {
    let stream = super::get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)? == libc::SOCK_STREAM;
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut empty_in_a_row = 0usize;
    peek_each(fd, limit, 256 * 1024, "recv(MSG_PEEK)", |p| {
        let (creds, fds) = control(p.mh)?;
        if p.data.is_empty() && fds.is_empty() {
            if stream || eof_after.is_some_and(|n| total >= n) {
                return Ok(false);
            }
            empty_in_a_row += 1;
            if empty_in_a_row > 4096 {
                return Err(KernelError::Unsupported {
                    feature: "queues of more than 4096 empty datagrams",
                    why: "the peek offset does not advance past them".into(),
                });
            }
        } else {
            empty_in_a_row = 0;
        }
        total += p.data.len();
        out.push(UnixMsg {
            data: p.data.to_vec(),
            creds,
            fds,
        });
        Ok(true)
    })?;
    Ok(out)
}

/// The credentials and the fds among the control messages of a peeked
/// message; a truncated control buffer (more fds than fit) is refused.
fn control(mh: &libc::msghdr) -> Result<(Option<Creds>, Vec<OwnedFd>)> {
    let mut creds = None;
    let mut fds = Vec::new();
    if mh.msg_controllen == 0 {
        return Ok((None, fds));
    }
    // SAFETY: walking the control messages the kernel just wrote.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(mh) };
    while !c.is_null() {
        // SAFETY: `c` points into the control buffer (CMSG_FIRSTHDR/NXTHDR checked bounds).
        let (level, ty, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len) };
        if level == libc::SOL_SOCKET && ty == libc::SCM_CREDENTIALS {
            // SAFETY: an SCM_CREDENTIALS message carries a struct ucred
            // (possibly unaligned in the buffer).
            let u = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>()) };
            creds = Some((u.pid, u.uid, u.gid));
        }
        if level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is the header size.
            let data_len = len.saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
            for i in 0..data_len / 4 {
                // SAFETY: the data of an SCM_RIGHTS message is an array of
                // ints (possibly unaligned), `data_len / 4` of them.
                let f =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>().add(i)) };
                // SAFETY: the kernel just installed fd `f` for us; nobody
                // else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(f) });
            }
        }
        // SAFETY: advancing within the control buffer.
        c = unsafe { libc::CMSG_NXTHDR(mh, c) };
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(KernelError::Unsupported {
            feature: "a queued message with more file descriptors than fit",
            why: "its control data was truncated (MSG_CTRUNC)".into(),
        });
    }
    Ok((creds, fds))
}

/// Queues `data` again through `fd` (the receiver's peer, or a socket
/// connected to it) with the credentials and the fds it carried. A stream
/// message is sent whole (the fds go with its first bytes).
pub fn send_msg(
    fd: BorrowedFd<'_>,
    data: &[u8],
    creds: Option<Creds>,
    fds: &[BorrowedFd<'_>],
) -> Result<()> {
    let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let uc = creds.map(|(pid, uid, gid)| UnixCredentials::from(libc::ucred { pid, uid, gid }));
    let mut cmsg = Vec::with_capacity(2);
    if let Some(uc) = &uc {
        cmsg.push(ControlMessage::ScmCredentials(uc));
    }
    if !raw.is_empty() {
        cmsg.push(ControlMessage::ScmRights(&raw));
    }
    let iov = [IoSlice::new(data)];
    let n = loop {
        match sendmsg::<()>(fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r,
        }
    }
    .map_err(|e| {
        KernelError::io(
            format!(
                "sending a queued message of {} bytes with {} fds",
                data.len(),
                fds.len()
            ),
            e.into(),
        )
    })?;
    if n < data.len() {
        super::send_all(fd, &data[n..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn pair(ty: i32) -> (OwnedFd, OwnedFd) {
        crate::sock::unix_pair(ty).unwrap()
    }

    #[test]
    fn fds_in_flight_are_peeked_and_left_queued() {
        for ty in [libc::SOCK_DGRAM, libc::SOCK_SEQPACKET, libc::SOCK_STREAM] {
            let (a, b) = pair(ty);
            let (r, w) = nix::unistd::pipe().unwrap();
            send_msg(a.as_fd(), b"one", None, &[r.as_fd(), w.as_fd()]).unwrap();
            send_msg(a.as_fd(), b"two", None, &[]).unwrap();
            let q = peek_queue(b.as_fd(), 1 << 20, None).unwrap();
            assert_eq!(q.len(), 2, "type {ty}");
            assert_eq!(q[0].data, b"one");
            assert_eq!(q[0].fds.len(), 2);
            assert_eq!(q[1].data, b"two");
            assert!(q[1].fds.is_empty());
            // The peeked read end is the pipe's: what goes in the write end
            // comes out of it.
            nix::unistd::write(&w, b"x").unwrap();
            let mut c = [0u8; 1];
            nix::unistd::read(q[0].fds[0].as_raw_fd(), &mut c).unwrap();
            assert_eq!(&c, b"x");
            // Still queued: peeked again the same.
            let again = peek_queue(b.as_fd(), 1 << 20, None).unwrap();
            assert_eq!(again.len(), 2);
            assert_eq!(again[0].fds.len(), 2);
        }
    }

    #[test]
    fn a_shut_seqpacket_ends_at_its_eof_not_at_4096_empty_reads() {
        let (a, b) = pair(libc::SOCK_SEQPACKET);
        send_msg(a.as_fd(), b"abc", None, &[]).unwrap();
        nix::sys::socket::shutdown(a.as_raw_fd(), nix::sys::socket::Shutdown::Write).unwrap();
        let q = peek_queue(b.as_fd(), 1 << 20, Some(3)).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].data, b"abc");
        // Without the hint the end of file looks like endless empty messages.
        assert!(peek_queue(b.as_fd(), 1 << 20, None).is_err());
    }
}
