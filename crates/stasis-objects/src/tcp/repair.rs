//! Reading a connection in repair mode, and rebuilding it so.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::{InetSocket, SocketFilter, TcpRepair};
use stasis_kernel::{fdops, sock, tcpdiag, KernelError};
use stasis_sys::net::{MAX_TCP_WINDOW, TCPOLEN_TSTAMP_ALIGNED, TCP_REPAIR_WINDOW_LEN};

use super::states;
use crate::socket::{restore_filter, set_options};
use crate::{RestoreCtx, RestoreError};

/// `TCP_REPAIR_WINDOW`: snd_wl1, snd_wnd, max_window, rcv_wnd, rcv_wup.
pub(super) fn read_window(b: BorrowedFd<'_>) -> Result<[u32; 5], KernelError> {
    let w = sock::get_bytes(
        b,
        libc::IPPROTO_TCP,
        sock::TCP_REPAIR_WINDOW,
        TCP_REPAIR_WINDOW_LEN,
    )?;
    let mut window = [0u32; 5];
    for (i, c) in w.chunks_exact(4).take(5).enumerate() {
        window[i] = u32::from_ne_bytes(c.try_into().unwrap_or([0; 4]));
    }
    Ok(window)
}

/// Sets `TCP_REPAIR_WINDOW` (the connection is in repair mode).
pub(super) fn write_window(b: BorrowedFd<'_>, w: &[u32; 5]) -> Result<(), KernelError> {
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_ne_bytes()).collect();
    sock::set_bytes(b, libc::IPPROTO_TCP, sock::TCP_REPAIR_WINDOW, &bytes)
}

/// Holds back new data: the connection's send window becomes zero (in
/// repair mode), so from now on it sends no byte past what the dump reads
/// as sent. Without it a locked, frozen connection still sends: a tail
/// loss probe (10 ms after its last segment, acks being dropped by the
/// lock), pacing and small-queue timers send queued bytes the image says
/// were never sent; a peer not yet locked (another host's agent freezes
/// later) takes them, and after a restore it acknowledges bytes the
/// sender never sent, which the sender drops as acks of unsent data,
/// while the peer drops the sender's segments as old: the link stalls
/// for good. Retransmissions (of bytes the image has as sent) and window
/// probes (no data) still go. `w` is the window as [`read_window`] read it.
pub(super) fn hold_sends(b: BorrowedFd<'_>, w: [u32; 5]) -> Result<(), KernelError> {
    let mut zero = w;
    zero[1] = 0;
    write_window(b, &zero)
}

/// Reads an established or half-closed TCP connection in repair mode (it stays so),
/// whose `window` [`hold_sends`] read.
pub(super) fn save(
    b: BorrowedFd<'_>,
    info: &sock::TcpInfo,
    window: [u32; 5],
) -> Result<TcpRepair, KernelError> {
    let tcp = libc::IPPROTO_TCP;
    sock::set_int(b, tcp, sock::TCP_REPAIR, 1)?;
    let (outq, unsent) = sock::outq(b)?;
    // (Without the FINs: they are in `state`.)
    let (outq, unsent) = states::queue_lengths(info.state, outq, unsent);
    let inq = sock::inq(b)?;
    sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_SEND_QUEUE)?;
    let snd_seq = sock::get_int(b, tcp, sock::TCP_QUEUE_SEQ)?;
    let send_queue = sock::peek_repair_queue(b, outq as usize)?;
    sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_RECV_QUEUE)?;
    let rcv_seq = sock::get_int(b, tcp, sock::TCP_QUEUE_SEQ)?;
    let recv_queue = sock::peek_repair_queue(b, inq as usize)?;
    let mss = sock::get_int(b, tcp, libc::TCP_MAXSEG)?;
    let timestamp = sock::get_int(b, tcp, sock::TCP_TIMESTAMP)?;
    let mut r = TcpRepair {
        snd_seq: u32::from_ne_bytes(snd_seq.to_ne_bytes()),
        rcv_seq: u32::from_ne_bytes(rcv_seq.to_ne_bytes()),
        state: info.state,
        send_queue,
        unsent,
        recv_queue,
        mss: mss.unsigned_abs(),
        snd_mss: info.snd_mss,
        snd_wscale: info.snd_wscale,
        rcv_wscale: info.rcv_wscale,
        tcpi_options: info.options,
        timestamp: u32::from_ne_bytes(timestamp.to_ne_bytes()),
        window,
    };
    states::data_only(&mut r);
    Ok(r)
}

/// Bytes of the send queue that had been sent (the rest never was).
pub(super) fn sent(r: &TcpRepair) -> usize {
    r.send_queue.len() - (r.unsent as usize).min(r.send_queue.len())
}

/// Rebuilds an established TCP connection with `TCP_REPAIR`: sequence
/// numbers, a handshake-less connect, negotiated options, the receive
/// queue. The send queue, window and going live come later
/// ([`RestoreCtx::finish_tcp`]). Returns the pids of the holders the
/// connection was taken from ([`sock::take_held`]), to end once every
/// connection is rebuilt.
pub(crate) fn restore(
    fd: i32,
    s: &OwnedFd,
    i: &InetSocket,
    r: &TcpRepair,
) -> Result<Vec<i32>, RestoreError> {
    let b = s.as_fd();
    let tcp = libc::IPPROTO_TCP;
    let step_err = |w: &'static str| {
        move |e: KernelError| RestoreError::Step {
            what: format!("{w} of the TCP connection of fd {fd}"),
            source: e,
        }
    };
    sock::set_int(b, tcp, sock::TCP_REPAIR, 1)
        .map_err(step_err("entering repair mode (needs CAP_NET_ADMIN)"))?;
    // Locked (drops whatever reaches it) until every socket of the tree,
    // and of every host of a cut, exists and is filled: a segment of the
    // dead process's orphaned connection, still closing on the peer's
    // host (orphans are closed there only when that host rebuilds its
    // end), must not reach the rebuilt one (`PendingTcp::leave_repair`).
    sock::attach_drop_all(b).map_err(step_err("locking it until the restore is done"))?;
    // (Repair mode also forces address reuse: an accepted connection binds
    // the port its listener holds. SO_REUSEADDR must not be set after it.)
    let seq = |v: u32, back: usize| v.wrapping_sub(u32::try_from(back).unwrap_or(0));
    // Each queue starts where its saved bytes begin.
    for (queue, next, len) in [
        (sock::TCP_SEND_QUEUE, r.snd_seq, r.send_queue.len()),
        (sock::TCP_RECV_QUEUE, r.rcv_seq, r.recv_queue.len()),
    ] {
        sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, queue)
            .map_err(step_err("selecting a queue"))?;
        sock::set_int(
            b,
            tcp,
            sock::TCP_QUEUE_SEQ,
            i32::from_ne_bytes(seq(next, len).to_ne_bytes()),
        )
        .map_err(step_err("setting a queue's sequence"))?;
    }
    // The segment size. The handshake-less connect computes it, once, from
    // the MSS clamp in force then (536 by default: no SYN-ACK brings the
    // peer's), and TCP_REPAIR_OPTIONS does not recompute it: 536-byte
    // segments on loopback overflow the receiver's buffer (each costs a
    // whole buffer's truesize), get dropped, and the connection stalls in
    // retransmit backoff. So the clamp is set, for the connect, to the size
    // the connection used (bounded, as it was, by half the largest window
    // seen: the peer's MSS itself would stall a peer with a small window
    // in sender-side silly-window avoidance), and cleared after it.
    let ts = if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        TCPOLEN_TSTAMP_ALIGNED
    } else {
        0
    };
    // (TCP_MAXSEG takes at most 32767: loopback's 64 KiB segments become
    // 32 KiB ones, still far from 536.)
    let seg = r.snd_mss.saturating_add(ts).min(MAX_TCP_WINDOW);
    if r.snd_mss > 0 {
        sock::set_int(b, tcp, libc::TCP_MAXSEG, i32::try_from(seg).unwrap_or(0))
            .map_err(step_err("setting the segment size"))?;
    }
    crate::inet::bind(fd, s, i, format!("binding the TCP connection of fd {fd}"))?;
    let mut holders = Vec::new();
    reconnect(fd, b, i, &mut holders)?;
    stasis_sys::fault::delay(stasis_sys::fault::Slow::TcpReconnect);
    sock::set_bytes(b, tcp, sock::TCP_REPAIR_OPTIONS, &repair_options(r))
        .map_err(step_err("restoring negotiated options"))?;
    if r.snd_mss > 0 {
        sock::set_int(b, tcp, libc::TCP_MAXSEG, 0)
            .map_err(step_err("clearing the segment size clamp"))?;
    }
    if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        sock::set_int(
            b,
            tcp,
            sock::TCP_TIMESTAMP,
            i32::from_ne_bytes(r.timestamp.to_ne_bytes()),
        )
        .map_err(step_err("restoring the timestamp"))?;
    }
    // The receive queue is refilled now, before the process registers the
    // socket in its epoll instances: refilling it in repair mode wakes no
    // one (`tcp_send_rcvq` queues without `sk_data_ready`), so an epoll
    // registered before would never report the bytes (a server whose
    // client's request was queued at the dump waited for good). The send
    // queue is refilled later (`PendingTcp::fill`): data in it arms the
    // retransmit timer, which must not fire before every socket of the
    // tree exists, or its peer would answer with a reset.
    make_room(b, r);
    sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_RECV_QUEUE)
        .map_err(step_err("selecting the receive queue"))?;
    for chunk in r.recv_queue.chunks(64 * 1024) {
        sock::send_all(b, chunk).map_err(step_err("refilling the receive queue"))?;
    }
    Ok(holders)
}

/// Makes room in the socket's buffers for the saved queues
/// (`SO_*BUFFORCE` needs CAP_NET_ADMIN; without it the default stays).
fn make_room(b: BorrowedFd<'_>, r: &TcpRepair) {
    let room = i32::try_from((r.send_queue.len().max(r.recv_queue.len()) * 2).max(65536))
        .unwrap_or(i32::MAX);
    let _ = sock::set_int(b, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, room);
    let _ = sock::set_int(b, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, room);
}

/// The handshake-less connect of a connection in repair mode. If the
/// address pair is still held by an orphan (the same connection of a
/// process that died since the checkpoint, still closing: `EADDRNOTAVAIL`),
/// the orphan is closed and the connect tried again; a socket some process
/// holds is never touched.
pub(crate) fn reconnect(
    fd: i32,
    b: BorrowedFd<'_>,
    i: &InetSocket,
    holders: &mut Vec<i32>,
) -> Result<(), RestoreError> {
    let fail = |e: std::io::Error| RestoreError::Socket {
        what: format!("reconnecting the TCP connection of fd {fd} in repair mode"),
        source: e,
    };
    let Err(e) = sock::connect(b, &i.peer) else {
        return Ok(());
    };
    if e.raw_os_error() != Some(libc::EADDRNOTAVAIL) {
        return Err(fail(e));
    }
    // The connection of the killed tree, kept by the dump's holder until
    // this restore: taken over and disconnected, silently, in repair mode
    // (the holder keeps the tree's other connections until they too are
    // rebuilt; it is ended by `finish_tcp`).
    let held = tcpdiag::held_inodes(&i.local, Some(&i.peer))
        .and_then(|inodes| sock::take_held(&inodes))
        .map_err(|k| RestoreError::Step {
            what: format!(
                "taking the TCP connection of fd {fd} over from the holder of the killed tree's connections"
            ),
            source: k,
        })?;
    if !held.is_empty() {
        holders.extend_from_slice(&held);
        let Err(e) = sock::connect(b, &i.peer) else {
            return Ok(());
        };
        if e.raw_os_error() != Some(libc::EADDRNOTAVAIL) {
            return Err(fail(e));
        }
    }
    let orphans = tcpdiag::destroy_orphans(&i.local, &i.peer).map_err(|k| RestoreError::Step {
        what: format!(
            "closing the orphaned socket (of the process that died) that holds the address pair of the TCP connection of fd {fd}"
        ),
        source: k,
    })?;
    if orphans.destroyed == 0 {
        return Err(RestoreError::Socket {
            what: format!(
                "reconnecting the TCP connection of fd {fd} in repair mode: its address pair is held by a socket of another process ({} found)",
                orphans.owned
            ),
            source: e,
        });
    }
    tracing::info!(
        fd,
        ?orphans,
        "closed the orphaned copy of a restored TCP connection"
    );
    sock::connect(b, &i.peer).map_err(fail)
}

/// Ends the holders ([`sock::release_holders`]) of the sockets with the
/// address pair `local`/`peer` (with `peer` `None`: on the port of
/// `local`); returns how many it ended.
pub(crate) fn release_holders_of(
    fd: i32,
    local: &[u8],
    peer: Option<&[u8]>,
) -> Result<usize, RestoreError> {
    let step = |k: KernelError| RestoreError::Step {
        what: format!("ending the holder of the killed tree's connections (for fd {fd})"),
        source: k,
    };
    let held = tcpdiag::held_inodes(local, peer).map_err(step)?;
    let n = sock::release_holders(&held).map_err(step)?;
    if n > 0 {
        tracing::info!(
            fd,
            holders = n,
            "ended the holder of the killed tree's connections"
        );
    }
    Ok(n)
}

/// The `struct tcp_repair_opt` list of the negotiated options.
fn repair_options(r: &TcpRepair) -> Vec<u8> {
    let mut opts: Vec<u8> = Vec::new();
    let mut opt = |code: u32, val: u32| {
        opts.extend_from_slice(&code.to_ne_bytes());
        opts.extend_from_slice(&val.to_ne_bytes());
    };
    opt(sock::TCPOPT_MAXSEG, r.mss);
    if r.tcpi_options & sock::TCPI_OPT_WSCALE != 0 {
        opt(
            sock::TCPOPT_WINDOW,
            u32::from(r.snd_wscale) | (u32::from(r.rcv_wscale) << 16),
        );
    }
    if r.tcpi_options & sock::TCPI_OPT_SACK != 0 {
        opt(sock::TCPOPT_SACK_PERM, 0);
    }
    if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        opt(sock::TCPOPT_TIMESTAMP, 0);
    }
    opts
}

/// A TCP connection rebuilt in repair mode, waiting to go live.
pub struct PendingTcp {
    pub(crate) fd: i32,
    pub(crate) sock: OwnedFd,
    pub(crate) repair: TcpRepair,
    pub(crate) options: Vec<(i32, i32, i32)>,
    /// The program's socket filter, attached once the restore's lock is off.
    pub(crate) filter: Option<SocketFilter>,
    /// The holders it was taken from ([`restore`]).
    pub(crate) holders: Vec<i32>,
}

impl PendingTcp {
    /// Refills the send queue (still in repair mode: nothing is sent; the
    /// receive queue was refilled by [`restore`]) and restores the window.
    fn fill(&self) -> Result<(), RestoreError> {
        let (b, r, tcp) = (self.sock.as_fd(), &self.repair, libc::IPPROTO_TCP);
        let err = |w: &str| {
            let what = format!("{w} of the TCP connection of fd {}", self.fd);
            move |e: KernelError| RestoreError::Step { what, source: e }
        };
        sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_SEND_QUEUE)
            .map_err(err("selecting the send queue"))?;
        for chunk in r.send_queue[..sent(r)].chunks(64 * 1024) {
            sock::send_all(b, chunk).map_err(err("refilling the send queue"))?;
        }
        write_window(b, &r.window).map_err(err("restoring the window"))
    }

    /// Unlocks it and leaves repair mode. A window probe goes out, so each
    /// side learns the other's current window at once (both sides exist
    /// by now).
    fn leave_repair(&self) -> Result<(), RestoreError> {
        sock::detach_filter(self.sock.as_fd()).map_err(|e| RestoreError::Step {
            what: format!(
                "unlocking the TCP connection of fd {} after the restore",
                self.fd
            ),
            source: e,
        })?;
        self.replay_in_repair()?;
        sock::set_int(self.sock.as_fd(), libc::IPPROTO_TCP, sock::TCP_REPAIR, 0).map_err(|e| {
            RestoreError::Step {
                what: format!(
                    "leaving repair mode of the TCP connection of fd {}",
                    self.fd
                ),
                source: e,
            }
        })
    }

    /// Queues the bytes that were never sent and puts the saved options back.
    fn send_unsent(self) -> Result<(), RestoreError> {
        send_waiting(&self.sock, &self.repair.send_queue[sent(&self.repair)..]).map_err(|e| {
            RestoreError::Step {
                what: format!(
                    "queueing the never-sent bytes of the TCP connection of fd {}",
                    self.fd
                ),
                source: e,
            }
        })?;
        self.replay_after()?;
        set_options(&self.sock, &self.options);
        restore_filter(self.fd, &self.sock, &self.filter)
    }
}

impl RestoreCtx<'_> {
    /// Takes every rebuilt TCP connection out of repair mode, once all
    /// sockets of the tree exist (no packet may reach a missing peer).
    pub fn finish_tcp(&mut self) -> Result<(), RestoreError> {
        let pending = std::mem::take(&mut self.pending_tcp);
        // Queues refilled last (their retransmit timers start now), every
        // end out of repair next (a socket in repair mode drops what reaches
        // it), then the never-sent bytes.
        for p in &pending {
            p.fill()?;
        }
        for p in &pending {
            p.leave_repair()?;
        }
        let mut holders: Vec<i32> = pending.iter().flat_map(|p| p.holders.clone()).collect();
        for p in pending {
            p.send_unsent()?;
        }
        // Connections that were waiting to be accepted: their listeners
        // exist now.
        for c in std::mem::take(&mut self.pending_connects) {
            holders.extend(c.connect()?);
        }
        // The holders whose connections were taken over keep nothing of
        // use now (the killed tree's other connections, if this is an
        // older checkpoint, close silently with them).
        holders.sort_unstable();
        holders.dedup();
        if let Err(e) = sock::end_holders(&holders) {
            tracing::warn!(%e, "ending the holder of the killed tree's connections");
        }
        Ok(())
    }
}

/// Sends everything, waiting (up to 10 s per stall) when the socket is
/// non-blocking and its buffer is full.
pub(crate) fn send_waiting(s: &OwnedFd, data: &[u8]) -> Result<(), KernelError> {
    let mut off = 0;
    while off < data.len() {
        let e = match fdops::send_nonblocking(s.as_fd(), &data[off..]) {
            Ok(n) => {
                off += n;
                continue;
            }
            Err(e) => e,
        };
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                if !fdops::wait_writable(s.as_fd(), 10_000).unwrap_or(false) {
                    return Err(KernelError::Io {
                        what: format!(
                            "sending {} bytes: the peer does not take them",
                            data.len() - off
                        ),
                        source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
                    });
                }
            }
            _ => {
                return Err(KernelError::Io {
                    what: format!("sending {} queued bytes", data.len()),
                    source: e,
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repair(options: u8) -> TcpRepair {
        TcpRepair {
            snd_seq: 0,
            rcv_seq: 0,
            state: 1,
            send_queue: vec![1; 10],
            unsent: 4,
            recv_queue: vec![],
            mss: 1460,
            snd_mss: 1448,
            snd_wscale: 7,
            rcv_wscale: 9,
            tcpi_options: options,
            timestamp: 0,
            window: [0; 5],
        }
    }

    fn pairs(b: &[u8]) -> Vec<(u32, u32)> {
        b.chunks_exact(8)
            .map(|c| {
                (
                    u32::from_ne_bytes(c[0..4].try_into().unwrap()),
                    u32::from_ne_bytes(c[4..8].try_into().unwrap()),
                )
            })
            .collect()
    }

    #[test]
    fn negotiated_options_follow_tcpi_options() {
        assert_eq!(pairs(&repair_options(&repair(0))), vec![(2, 1460)]);
        let all = sock::TCPI_OPT_WSCALE | sock::TCPI_OPT_SACK | sock::TCPI_OPT_TIMESTAMPS;
        assert_eq!(
            pairs(&repair_options(&repair(all))),
            vec![(2, 1460), (3, 7 | 9 << 16), (4, 0), (8, 0)]
        );
    }

    #[test]
    fn sent_bytes_are_the_queue_minus_the_unsent_tail() {
        let mut r = repair(0);
        assert_eq!(sent(&r), 6);
        r.unsent = 99;
        assert_eq!(sent(&r), 0);
    }
}
