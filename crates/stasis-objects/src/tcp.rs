//! Established TCP connections, with `TCP_REPAIR` (Linux 3.5+, needs
//! CAP_NET_ADMIN): in repair mode nothing is sent on the wire, so sequence
//! numbers, queues, negotiated options and window can be read, and a new
//! socket can be given them and "connected" without a handshake.
//!
//! At dump ([`SaveCtx::freeze_tcp`]), every connection of the tree is
//! first locked (a drop-all filter), then its owners are *held* (a SIGSTOP
//! queued on each thread, see `sock::SocketGuard`), then every connection
//! is put in repair mode, read, and taken out of it again, in one short
//! step with nothing else in it: the network lock alone keeps the state
//! still for the rest of the dump (no packet reaches the connections; the
//! program, frozen, sends nothing). After the dump the lock comes off
//! ([`leave_repair`]); a dump that kills the tree has the guard put the
//! connections back in repair mode and kill their owners
//! ([`kill_owners`]), and a holder keeps them, silent, until the restore
//! ends it ([`release_holders_of`]). At restore, each connection
//! is rebuilt in repair mode ([`restore`]) and made live once every
//! socket of the tree exists ([`RestoreCtx::finish_tcp`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::{InetSocket, TcpRepair};
use stasis_kernel::{fdops, pidfd, sock, tcpdiag, KernelError};
use stasis_sys::net::{
    MAX_TCP_WINDOW, TCPOLEN_TSTAMP_ALIGNED, TCP_ESTABLISHED, TCP_REPAIR_WINDOW_LEN,
};

use crate::save::{list_fds, read_link, socket_inode};
use crate::socket::{is_inet, set_options};
use crate::{RestoreCtx, RestoreError, SaveCtx, SaveError};

/// The connections a dump locked and read, and the guard that puts them
/// back (and continues their held owners) if the dumper dies first.
#[derive(Debug, Default)]
pub struct Repairs {
    socks: Vec<Repaired>,
    /// What repair mode read of each connection, by socket inode.
    saved: HashMap<u64, TcpRepair>,
    guard: Option<sock::SocketGuard>,
}

impl Repairs {
    /// What [`SaveCtx::freeze_tcp`] read of the connection with inode
    /// `ino`.
    pub(crate) fn saved(&self, ino: u64) -> Option<&TcpRepair> {
        self.saved.get(&ino)
    }
}

/// An established TCP connection of the tree locked by the dump, through
/// a copy of its fd, with what the dump changes on it.
///
/// Entering repair mode forces address reuse on the socket (`sk_reuse =
/// SK_FORCE_REUSE`), and leaving it clears reuse (`SK_NO_REUSE`) whatever
/// `SO_REUSEADDR` the program had set: a connection left so would go to
/// TIME_WAIT, when the program dies, unwilling to share its port, and
/// keep the program's listener from binding that port again (a restart or
/// a restore) for a minute. So the program's `SO_REUSEADDR` is read before
/// and put back after. The network lock (a drop-everything filter) is the
/// other change, removed by [`SaveCtx::unlock_tcp`] or [`leave_repair`]
/// when this dump attached it.
#[derive(Debug)]
pub struct Repaired {
    sock: OwnedFd,
    /// The owner and its fd (for messages).
    pid: i32,
    fd: i32,
    ino: u64,
    /// `SO_REUSEADDR` as the program had it (`None`: could not be read).
    reuseaddr: Option<i32>,
    /// Whether this dump attached the drop-everything filter.
    locked: bool,
    /// Whether the connection is in repair mode.
    in_repair: bool,
    /// The send window the program's connection had, while this dump
    /// holds it at zero (see [`hold_sends`]); put back on release.
    held_snd_wnd: Option<u32>,
}

impl Repaired {
    /// Takes the connection out of repair mode (no window probe: the peer
    /// has its state already) and puts back the `SO_REUSEADDR` repair mode
    /// changed.
    fn leave_repair(&mut self) {
        if !self.in_repair {
            return;
        }
        let b = self.sock.as_fd();
        if let Err(e) = sock::set_int(
            b,
            libc::IPPROTO_TCP,
            sock::TCP_REPAIR,
            sock::TCP_REPAIR_OFF_NO_WP,
        ) {
            tracing::error!("could not take a TCP socket out of repair mode: {e}");
            return;
        }
        self.in_repair = false;
        if let Some(v) = self.reuseaddr {
            if let Err(e) = sock::set_int(b, libc::SOL_SOCKET, libc::SO_REUSEADDR, v) {
                tracing::error!(
                    "could not put SO_REUSEADDR = {v} back on a TCP socket after repair mode: {e}"
                );
            }
        }
    }

    /// Packets flow again, if this dump stopped them (the filter
    /// `freeze_tcp` attached comes off), and new data may go again.
    fn unlock(&mut self) {
        self.release_sends();
        let b = self.sock.as_fd();
        if self.locked && sock::has_drop_all_filter(b) {
            let _ = sock::detach_filter(b);
        }
        self.locked = false;
    }

    /// Gives the connection back its send window (held at zero since it
    /// was read), through repair mode and out again, before the lock
    /// comes off (so no ack has updated it meanwhile). The rest of the
    /// window stays as it is now (a segment the connection sent since may
    /// have moved what it advertises).
    fn release_sends(&mut self) {
        let Some(snd_wnd) = self.held_snd_wnd.take() else {
            return;
        };
        let b = self.sock.as_fd();
        if let Err(e) = sock::set_int(b, libc::IPPROTO_TCP, sock::TCP_REPAIR, 1) {
            tracing::error!("could not give a TCP connection its send window back (repair mode: {e}); its first window probe will");
            return;
        }
        self.in_repair = true;
        let put = read_window(b).and_then(|mut w| {
            w[1] = snd_wnd;
            w[2] = w[2].max(snd_wnd);
            write_window(b, &w)
        });
        if let Err(e) = put {
            tracing::error!("could not give a TCP connection its send window back ({e}); its first window probe will");
        }
        self.leave_repair();
    }

    /// Out of repair mode, its send window back, and unlocked.
    fn put_back(&mut self) {
        self.leave_repair();
        self.unlock();
    }
}

/// `TCP_REPAIR_WINDOW`: snd_wl1, snd_wnd, max_window, rcv_wnd, rcv_wup.
fn read_window(b: BorrowedFd<'_>) -> Result<[u32; 5], KernelError> {
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
fn write_window(b: BorrowedFd<'_>, w: &[u32; 5]) -> Result<(), KernelError> {
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
/// probes (no data) still go. Returns the window as it was.
fn hold_sends(b: BorrowedFd<'_>) -> Result<[u32; 5], KernelError> {
    let w = read_window(b)?;
    let mut zero = w;
    zero[1] = 0;
    write_window(b, &zero)?;
    Ok(w)
}

/// Puts back what [`SaveCtx::freeze_tcp`] changed on the connections, as
/// the program had them (the tree runs on, or a failed dump releases it).
/// The guard stays: it is told by [`dismiss_guard`], once the tree is let
/// go. (Dropping the [`Repairs`] instead dismisses it.)
pub fn leave_repair(r: &mut Repairs) {
    for s in &mut r.socks {
        s.put_back();
    }
}

/// The tree is let go (`released`), or could not be: the guard is
/// dismissed, or left to put the sockets back and continue any held
/// process as if the dumper had died.
pub fn dismiss_guard(mut r: Repairs, released: bool) {
    if let Some(g) = r.guard.take() {
        if released {
            g.dismiss();
        } else {
            g.abandon();
        }
    }
}

/// After a committed dump that kills the tree: hands the kill to the
/// guard, which puts the connections in repair mode and SIGKILLs the
/// processes that own them; a holder keeps them, silent, until the restore
/// ends it ([`release_holders_of`]; see
/// [`sock::SocketGuard::kill_owners`]); returns once they are signalled.
/// The caller kills the rest of the tree and waits for it.
pub fn kill_owners(mut r: Repairs) {
    if let Some(g) = r.guard.take() {
        g.kill_owners();
    }
    // Our copies close in repair mode: nothing reaches the peers.
    r.socks.clear();
}

/// The established TCP connections of `pids`: (pid, fd, inode, a copy).
fn established(pids: &[i32]) -> Result<Vec<(i32, i32, u64, OwnedFd)>, SaveError> {
    let mut found = Vec::new();
    for &pid in pids {
        let pfd = pidfd::pidfd_open(pid)?;
        for fd in list_fds(pid)? {
            let Ok(link) = read_link(pid, &format!("fd/{fd}")) else {
                continue;
            };
            let Some(ino) = socket_inode(&link) else {
                continue;
            };
            let s = pidfd::pidfd_getfd(&pfd, fd)?;
            let b = s.as_fd();
            if is_inet(b, libc::IPPROTO_TCP)
                && sock::tcp_info(b).ok().map(|i| i.state) == Some(TCP_ESTABLISHED)
            {
                found.push((pid, fd, ino, s));
            }
        }
    }
    Ok(found)
}

impl SaveCtx {
    /// Locks every established TCP connection of the tree `pids`, holds
    /// their owners (`hold` is given those not in `stopped`, the processes
    /// already stopped before the dump, which stay so anyway), then puts
    /// every connection in repair mode, reads it and takes it out again.
    ///
    /// Every connection is locked and in repair mode before any of them is
    /// read: two ends of a connection inside the tree must be frozen at the
    /// same instant, or bytes sent by the second after the first was read
    /// would be lost to both images. Holding before repair mode means that
    /// a dumper killed at any instant never lets the program run with a
    /// connection in repair mode (see `sock::SocketGuard`).
    pub fn freeze_tcp(
        &mut self,
        pids: &[i32],
        stopped: &[i32],
        hold: &mut dyn FnMut(&[i32]) -> Result<(), SaveError>,
    ) -> Result<(), SaveError> {
        let found = established(pids)?;
        // Nothing may move between two connections' snapshots: a segment
        // processed after the receiver's queue was read but before the
        // sender's was (the sender then drops the bytes it sees acked)
        // would be in neither. Every connection first drops whatever
        // reaches it (peers retransmit it after the dump), like CRIU's
        // network lock; then, once packets already being processed are
        // through, each goes into repair mode and is read.
        if found.is_empty() {
            return Ok(());
        }
        // SO_REUSEADDR before repair mode forces it; which filters this
        // dump attaches; and the guard, before anything is changed.
        let before: Vec<(Option<i32>, bool)> = found
            .iter()
            .map(|(_, _, _, s)| {
                (
                    sock::get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).ok(),
                    !sock::has_filter(s.as_fd()),
                )
            })
            .collect();
        let guarded: Vec<sock::Guarded> = found
            .iter()
            .zip(&before)
            .map(|((_, _, _, s), (reuse, lock))| sock::Guarded {
                fd: s.as_raw_fd(),
                detach_filter: *lock,
                leave_repair: true,
                reuseaddr: reuse.unwrap_or(-1),
            })
            .collect();
        let mut owners: Vec<i32> = found.iter().map(|(pid, ..)| *pid).collect();
        owners.sort_unstable();
        owners.dedup();
        let held: Vec<i32> = owners
            .iter()
            .copied()
            .filter(|p| !stopped.contains(p))
            .collect();
        let guard = sock::SocketGuard::spawn(&guarded, &owners, &held).map_err(|e| SaveError::Unsupported {
            pid: found[0].0,
            what: format!("cannot start the process that would put the TCP connections back if the dump died: {e}"),
        })?;
        let told = guard.hold();
        self.repaired.guard = Some(guard);
        told.map_err(|e| SaveError::Unsupported {
            pid: found[0].0,
            what: format!(
                "the process that would put the TCP connections back if the dump died is gone: {e}"
            ),
        })?;
        hold(&held)?;
        let die = || stasis_sys::fault::die_at(stasis_sys::fault::Point::DieInTcpRepair);
        for ((pid, fd, ino, s), (reuseaddr, lock)) in found.into_iter().zip(before) {
            let locked = lock && sock::attach_drop_all(s.as_fd()).is_ok();
            self.repaired.socks.push(Repaired {
                sock: s,
                pid,
                fd,
                ino,
                reuseaddr,
                locked,
                in_repair: false,
                held_snd_wnd: None,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        die();
        let read = self.read_in_repair(die);
        // Out of repair mode whatever happened: the lock keeps them still.
        for r in &mut self.repaired.socks {
            r.leave_repair();
        }
        die();
        read
    }

    /// Puts every locked connection in repair mode, then reads each.
    /// (`die`: the test hook of `STASIS_FAULT=die-in-tcp-repair`.)
    fn read_in_repair(&mut self, die: impl Fn()) -> Result<(), SaveError> {
        for r in &mut self.repaired.socks {
            sock::set_int(r.sock.as_fd(), libc::IPPROTO_TCP, sock::TCP_REPAIR, 1).map_err(|e| SaveError::Unsupported { pid: r.pid, what: format!("fd {}: cannot put a TCP connection in repair mode (needs CAP_NET_ADMIN): {e}", r.fd) })?;
            r.in_repair = true;
        }
        die();
        for r in &mut self.repaired.socks {
            let b = r.sock.as_fd();
            let fail = |e: KernelError| SaveError::Unsupported {
                pid: r.pid,
                what: format!(
                    "fd {}: saving an established TCP connection failed: {e}",
                    r.fd
                ),
            };
            // New data held back first, so what is read as sent stays so.
            let window = hold_sends(b).map_err(fail)?;
            r.held_snd_wnd = Some(window[1]);
            let state = sock::tcp_info(b)
                .and_then(|info| save(b, &info, window))
                .map_err(fail)?;
            self.repaired.saved.insert(r.ino, state);
        }
        die();
        Ok(())
    }

    /// Lets packets reach the connections `freeze_tcp` locked again.
    pub fn unlock_tcp(&mut self) {
        for r in &mut self.repaired.socks {
            r.unlock();
        }
    }
}

/// Reads an established TCP connection in repair mode (it stays so),
/// whose `window` [`hold_sends`] read.
fn save(
    b: BorrowedFd<'_>,
    info: &sock::TcpInfo,
    window: [u32; 5],
) -> Result<TcpRepair, KernelError> {
    let tcp = libc::IPPROTO_TCP;
    sock::set_int(b, tcp, sock::TCP_REPAIR, 1)?;
    let (outq, unsent) = sock::outq(b)?;
    let inq = sock::inq(b)?;
    sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_SEND_QUEUE)?;
    let snd_seq = sock::get_int(b, tcp, sock::TCP_QUEUE_SEQ)?;
    let send_queue = sock::peek_repair_queue(b, outq as usize)?;
    sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_RECV_QUEUE)?;
    let rcv_seq = sock::get_int(b, tcp, sock::TCP_QUEUE_SEQ)?;
    let recv_queue = sock::peek_repair_queue(b, inq as usize)?;
    let mss = sock::get_int(b, tcp, libc::TCP_MAXSEG)?;
    let timestamp = sock::get_int(b, tcp, sock::TCP_TIMESTAMP)?;
    Ok(TcpRepair {
        snd_seq: u32::from_ne_bytes(snd_seq.to_ne_bytes()),
        rcv_seq: u32::from_ne_bytes(rcv_seq.to_ne_bytes()),
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
    })
}

/// Bytes of the send queue that had been sent (the rest never was).
fn sent(r: &TcpRepair) -> usize {
    r.send_queue.len() - (r.unsent as usize).min(r.send_queue.len())
}

/// Rebuilds an established TCP connection with `TCP_REPAIR`: sequence
/// numbers, a handshake-less connect, negotiated options, the receive
/// queue. The send queue, window and going live come later
/// ([`RestoreCtx::finish_tcp`]).
pub(crate) fn restore(
    fd: i32,
    s: &OwnedFd,
    i: &InetSocket,
    r: &TcpRepair,
) -> Result<(), RestoreError> {
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
    reconnect(fd, b, i)?;
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
    Ok(())
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
fn reconnect(fd: i32, b: BorrowedFd<'_>, i: &InetSocket) -> Result<(), RestoreError> {
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
    // this restore: ended, its copy closes silently.
    if release_holders_of(fd, &i.local, Some(&i.peer))? > 0 {
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
        set_options(&self.sock, &self.options);
        Ok(())
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
        for p in pending {
            p.send_unsent()?;
        }
        Ok(())
    }
}

/// Sends everything, waiting (up to 10 s per stall) when the socket is
/// non-blocking and its buffer is full.
fn send_waiting(s: &OwnedFd, data: &[u8]) -> Result<(), KernelError> {
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
