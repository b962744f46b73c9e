//! Half-closed connections: a FIN sent, received, or both.
//!
//! A FIN takes a sequence number but is no byte of a queue, and
//! `TCP_REPAIR` has no way to set a connection's state. So the dump saves
//! the data alone (the queues' lengths and sequence numbers without the
//! FINs, [`data_only`]) and the state; the restore rebuilds the connection
//! established, with its data, and then plays its FINs again
//! ([`PendingTcp::replay_in_repair`], [`PendingTcp::replay_after`]):
//!
//! | state at dump | in repair mode (filter off) | after leaving it |
//! |---|---|---|
//! | `FIN_WAIT2` (own FIN acked) | `shutdown` with the send queue selected (the FIN counts as sent), then the peer's ack of it, hand-made | |
//! | `FIN_WAIT1` (own FIN not acked) | | never-sent bytes, then `shutdown` (the FIN goes out, after them) |
//! | `CLOSE_WAIT` (peer's FIN in) | the peer's FIN, hand-made | |
//! | `LAST_ACK` (peer's FIN, then own FIN not acked) | the peer's FIN | never-sent bytes, then `shutdown` |
//! | `CLOSING` (own FIN, then the peer's; own not acked) | `shutdown` (nothing goes: no queue selected), then the peer's FIN; with never-sent bytes, as `LAST_ACK` (it ends `LAST_ACK`) | |
//!
//! The hand-made segments (through a raw socket, as CRIU's libsoccr does)
//! are what the peer sent before the checkpoint and will not send again:
//! its FIN was acknowledged, its ack of our FIN has arrived. Each is
//! waited for until the state it brings (a second at most).

use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use stasis_image::manifest::TcpRepair;
use stasis_kernel::{sock, KernelError};
use stasis_sys::net::{
    TCPI_OPT_WSCALE, TCP_CLOSE, TCP_CLOSE_WAIT, TCP_CLOSING, TCP_ESTABLISHED, TCP_FIN_WAIT1,
    TCP_FIN_WAIT2, TCP_LAST_ACK, TH_ACK, TH_FIN,
};

use super::repair::PendingTcp;
use crate::RestoreError;

/// The states whose connection the dump reads in repair mode and the
/// restore rebuilds.
pub(crate) fn repairable(state: u8) -> bool {
    matches!(
        state,
        TCP_ESTABLISHED
            | TCP_FIN_WAIT1
            | TCP_FIN_WAIT2
            | TCP_CLOSE_WAIT
            | TCP_LAST_ACK
            | TCP_CLOSING
    )
}

/// The connection sent its FIN (`shutdown(SHUT_WR)` or `close`).
fn fin_sent(state: u8) -> bool {
    matches!(
        state,
        TCP_FIN_WAIT1 | TCP_FIN_WAIT2 | TCP_CLOSING | TCP_LAST_ACK
    )
}

/// The peer's FIN came in.
fn fin_received(state: u8) -> bool {
    matches!(state, TCP_CLOSE_WAIT | TCP_LAST_ACK | TCP_CLOSING)
}

/// `SIOCOUTQ` and `SIOCOUTQNSD` without the connection's own FIN (counted
/// while not acked; while never sent, by both).
pub(super) fn queue_lengths(state: u8, outq: u32, unsent: u32) -> (u32, u32) {
    if fin_sent(state) {
        (outq.saturating_sub(1), unsent.saturating_sub(1))
    } else {
        (outq, unsent)
    }
}

/// Takes the FINs out of what repair mode read: the send queue's sequence
/// counts the connection's FIN, the receive queue's the peer's, and an
/// ack of the peer's FIN moved the receive window's start past it.
pub(super) fn data_only(r: &mut TcpRepair) {
    if fin_sent(r.state) {
        r.snd_seq = r.snd_seq.wrapping_sub(1);
    }
    if fin_received(r.state) {
        let with_fin = r.rcv_seq;
        r.rcv_seq = with_fin.wrapping_sub(1);
        // (The rebuilt connection refuses a window starting past its
        // rcv_nxt; the right edge stays where it was.)
        if r.window[4] == with_fin {
            r.window[4] = r.rcv_seq;
            r.window[3] = r.window[3].wrapping_add(1);
        }
    }
}

/// `CLOSING` is rebuilt with its own FIN first only when no byte waits
/// to be sent before it.
fn fin_first(r: &TcpRepair) -> bool {
    r.state == TCP_CLOSING && r.unsent == 0
}

impl PendingTcp {
    /// What is played again while the connection is still in repair mode
    /// (unlocked: the hand-made segments must reach it).
    pub(super) fn replay_in_repair(&self) -> Result<(), RestoreError> {
        let (b, r) = (self.sock.as_fd(), &self.repair);
        let step = |w: &str| {
            let what = format!(
                "{w} of the half-closed TCP connection of fd {} (state {})",
                self.fd, r.state
            );
            move |e: KernelError| RestoreError::Step { what, source: e }
        };
        if r.state == TCP_FIN_WAIT2 {
            // Its FIN as sent, then acked.
            sock::set_int(
                b,
                libc::IPPROTO_TCP,
                sock::TCP_REPAIR_QUEUE,
                sock::TCP_SEND_QUEUE,
            )
            .map_err(step("selecting the send queue"))?;
            sock::shutdown(b, libc::SHUT_WR).map_err(step("queueing its FIN as sent"))?;
            sock::set_int(b, libc::IPPROTO_TCP, sock::TCP_REPAIR_QUEUE, 0)
                .map_err(step("unselecting the send queue"))?;
            let ack = r.snd_seq.wrapping_add(1);
            self.inject(TH_ACK, ack)
                .map_err(step("giving it the peer's ack of its FIN"))?;
            return wait_state(b, TCP_FIN_WAIT2).map_err(step("waiting for the ack of its FIN"));
        }
        if fin_first(r) {
            sock::shutdown(b, libc::SHUT_WR).map_err(step("queueing its FIN"))?;
        }
        if fin_received(r.state) {
            self.inject(TH_FIN | TH_ACK, snd_una(r))
                .map_err(step("giving it the peer's FIN"))?;
            let want = if fin_first(r) {
                TCP_CLOSING
            } else {
                TCP_CLOSE_WAIT
            };
            wait_state(b, want).map_err(step("waiting for the peer's FIN"))?;
        }
        Ok(())
    }

    /// What is played again once out of repair mode, after the never-sent
    /// bytes are queued: the connection's own FIN, not acked at the dump,
    /// goes out (again) behind them.
    pub(super) fn replay_after(&self) -> Result<(), RestoreError> {
        let r = &self.repair;
        if !fin_sent(r.state) || r.state == TCP_FIN_WAIT2 || fin_first(r) {
            return Ok(());
        }
        sock::shutdown(self.sock.as_fd(), libc::SHUT_WR).map_err(|e| RestoreError::Step {
            what: format!(
                "sending the FIN of the half-closed TCP connection of fd {} again",
                self.fd
            ),
            source: e,
        })
    }

    /// Delivers a segment from the peer at the connection's receive
    /// sequence, acknowledging `ack`.
    fn inject(&self, flags: u8, ack: u32) -> Result<(), KernelError> {
        let b = self.sock.as_fd();
        let local = sock::local_addr(b)?;
        let peer = sock::peer_addr(b)?;
        let r = &self.repair;
        let scale = if r.tcpi_options & TCPI_OPT_WSCALE != 0 {
            r.snd_wscale
        } else {
            0
        };
        let window = u16::try_from(r.window[1] >> scale).unwrap_or(u16::MAX);
        let seg = sock::Segment {
            seq: r.rcv_seq,
            ack,
            flags,
            window,
        };
        sock::inject_tcp(&peer, &local, seg)
    }
}

/// A TCP socket whose connection ended both ways (`TCP_CLOSE`, both
/// sides shut down): one end of a loopback connection made and closed
/// for it.
pub(crate) fn ended(fd: i32, family: i32) -> Result<OwnedFd, RestoreError> {
    let fail = |e: std::io::Error| RestoreError::Socket {
        what: format!("making the ended TCP connection of fd {fd}"),
        source: e,
    };
    let at = if family == libc::AF_INET6 {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    };
    let l = TcpListener::bind(at).map_err(fail)?;
    let mut c = TcpStream::connect(l.local_addr().map_err(fail)?).map_err(fail)?;
    let (mut a, _) = l.accept().map_err(fail)?;
    c.shutdown(Shutdown::Write).map_err(fail)?;
    a.shutdown(Shutdown::Write).map_err(fail)?;
    // Each reads the other's end of file; the accepted end's FIN is
    // acked: it is closed.
    let mut sink = Vec::new();
    c.read_to_end(&mut sink).map_err(fail)?;
    a.read_to_end(&mut sink).map_err(fail)?;
    let s = OwnedFd::from(a);
    wait_state(s.as_fd(), TCP_CLOSE).map_err(|e| RestoreError::Step {
        what: format!("closing the ended TCP connection of fd {fd}"),
        source: e,
    })?;
    Ok(s)
}

/// The first sequence number not acknowledged (the saved send queue
/// starts there).
fn snd_una(r: &TcpRepair) -> u32 {
    r.snd_seq
        .wrapping_sub(u32::try_from(r.send_queue.len()).unwrap_or(0))
}

/// Waits (5 s at most: the kernel handles the segment at once, but a busy
/// machine may not run us for a while) until the socket is in `state`.
fn wait_state(b: BorrowedFd<'_>, state: u8) -> Result<(), KernelError> {
    let t0 = Instant::now();
    loop {
        let now = sock::tcp_info(b)?.state;
        if now == state {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(5) {
            return Err(KernelError::Io {
                what: format!("the connection is in state {now}, not {state}"),
                source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(state: u8, rcv_wup: u32) -> TcpRepair {
        TcpRepair {
            snd_seq: 100,
            rcv_seq: 500,
            state,
            send_queue: vec![1; 10],
            unsent: 0,
            recv_queue: vec![2; 4],
            mss: 1460,
            snd_mss: 1448,
            snd_wscale: 7,
            rcv_wscale: 7,
            tcpi_options: 0,
            timestamp: 0,
            window: [0, 0, 0, 1000, rcv_wup],
        }
    }

    #[test]
    fn established_connections_keep_what_repair_mode_read() {
        let mut r = read(TCP_ESTABLISHED, 500);
        data_only(&mut r);
        assert_eq!(r, read(TCP_ESTABLISHED, 500));
        assert_eq!(queue_lengths(TCP_ESTABLISHED, 5, 2), (5, 2));
    }

    #[test]
    fn own_fin_leaves_the_send_side() {
        for st in [TCP_FIN_WAIT1, TCP_FIN_WAIT2, TCP_LAST_ACK, TCP_CLOSING] {
            let mut r = read(st, 500);
            data_only(&mut r);
            assert_eq!(r.snd_seq, 99, "state {st}");
        }
        // An acked FIN is in neither queue; an unsent one in both.
        assert_eq!(queue_lengths(TCP_FIN_WAIT2, 0, 0), (0, 0));
        assert_eq!(queue_lengths(TCP_FIN_WAIT1, 11, 0), (10, 0));
        assert_eq!(queue_lengths(TCP_FIN_WAIT1, 11, 4), (10, 3));
    }

    #[test]
    fn peers_fin_leaves_the_receive_side_and_window() {
        for st in [TCP_CLOSE_WAIT, TCP_LAST_ACK, TCP_CLOSING] {
            let mut r = read(st, 500);
            data_only(&mut r);
            assert_eq!((r.rcv_seq, r.window[4], r.window[3]), (499, 499, 1001));
        }
        // A window not yet moved past the FIN (its ack not sent) stays.
        let mut r = read(TCP_CLOSE_WAIT, 480);
        data_only(&mut r);
        assert_eq!((r.rcv_seq, r.window[4], r.window[3]), (499, 480, 1000));
    }

    #[test]
    fn closing_replays_its_fin_first_unless_bytes_wait() {
        let mut r = read(TCP_CLOSING, 500);
        assert!(fin_first(&r));
        r.unsent = 3;
        assert!(!fin_first(&r));
        assert!(!fin_first(&read(TCP_LAST_ACK, 500)));
    }

    #[test]
    fn injected_segments_ack_the_first_unacknowledged_byte() {
        assert_eq!(snd_una(&read(TCP_CLOSE_WAIT, 500)), 90);
    }
}
