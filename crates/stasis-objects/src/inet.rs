//! TCP and UDP sockets (v4 and v6): listening sockets, unconnected and
//! closed ones, UDP sockets with their unread datagrams (delivered again
//! from their original senders). Established TCP connections are
//! the business of [`crate::tcp`].

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, InetSocket, InetState};
use stasis_kernel::{fdops, scm, sock, tcpdiag, KernelError};
use stasis_sys::net::{TCP_CLOSE, TCP_LISTEN, TCP_SYN_SENT};

use crate::socket::{
    restore_filter, save_filter, save_inet_byte_options, save_inet_options, save_options,
    set_byte_options, set_options,
};
use crate::tcp::{self, PendingTcp};
use crate::unix::QUEUE_MAX;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

pub struct Inet;

impl Object for Inet {
    const NAME: &'static str = "inet socket";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        match &fd.socket {
            Some(s) if matches!(s.domain, libc::AF_INET | libc::AF_INET6) => {
                save(cx, fd, s).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Inet(_))
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Inet(i) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let s = restore(cx, img.fd, i)?;
        // Best effort, as sockets always had it.
        let _ = fdops::set_status_flags(s.as_fd(), crate::restore::setfl_flags(img.flags));
        Ok(s)
    }
}

fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>, s: &crate::save::SocketFd) -> Result<FdKind, SaveError> {
    let (b, n, domain, ty) = (s.sock.as_fd(), fd.fd, s.domain, s.sock_type);
    // (Repair mode, which forces SO_REUSEADDR, is over: `freeze_tcp` put
    // the program's own value back.)
    let mut options = save_inet_options(b, domain, ty);
    let byte_options = save_inet_byte_options(b, domain, ty);
    options.extend(save_options(b));
    let protocol = sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    let local = sock::local_addr(b)?;
    let mut peer = sock::peer_addr(b)?;
    let filter = save_filter(b)
        .map_err(|e| fd.unsupported(format!("fd {n}: its socket filter cannot be read back ({e}): it is an eBPF program (SO_ATTACH_BPF): the kernel gives no way to find which program a socket holds (SO_GET_FILTER refuses an eBPF one, no socket diagnostic names it), and keeps no loadable copy of a program: BPF_OBJ_GET_INFO_BY_FD gives only the instructions its verifier rewrote (context reads turned into struct sk_buff offsets, helper calls into kernel addresses, map lookups inlined), which it would not load again; detach the filter before the dump, or attach a classic BPF one (SO_ATTACH_FILTER), which stasis saves")))?;
    let mut datagrams = Vec::new();
    let mut shutdown = 0;
    let state = if ty == libc::SOCK_STREAM {
        let info = sock::tcp_info(b)?;
        match info.state {
            TCP_LISTEN => {
                // (Those from the tree's own quiet clients come back with
                // them: `tcp::unaccepted`.)
                let waiting = if info.unacked > 0 {
                    let from_tree = tcp::unaccepted::waiting_from(&local, cx.quiet_clients());
                    info.unacked.saturating_sub(u32::try_from(from_tree).unwrap_or(u32::MAX))
                } else {
                    0
                };
                if waiting > 0 && !cx.skip_in_flight {
                    return Err(fd.unsupported(format!("fd {n} is a listening TCP socket with {waiting} connection(s) waiting to be accepted that do not come from a process of the tree with nothing sent yet (dump with --skip-in-flight to leave them out)")));
                }
                InetState::Listening {
                    backlog: info.sacked,
                    shares_port: cx.listeners_on(&local).unwrap_or(0) > 1,
                }
            }
            // Saved as closed at the user's request (`--tcp-close`).
            st if tcp::repairable(st) && cx.tcp_close => InetState::Ended,
            st if tcp::repairable(st) => {
                // Established or half-closed: read in repair mode by
                // `SaveCtx::freeze_tcp`, with every other connection of
                // the tree.
                let r = cx.repaired.saved(fd.meta.ino()).cloned().ok_or_else(|| {
                    fd.unsupported(format!("fd {n} is a TCP connection established while the tree was frozen (it was opening when the dump began); dump again"))
                })?;
                if st == stasis_sys::net::TCP_ESTABLISHED
                    && tcp::unaccepted::nothing_acked(info.bytes_acked)
                    && r.recv_queue.is_empty()
                    && cx.waits(&local, &peer)
                {
                    InetState::Unaccepted {
                        queued: r.send_queue,
                    }
                } else {
                    InetState::Established(r)
                }
            }
            TCP_CLOSE
                if sock::poll_now(b, libc::POLLRDHUP)? & libc::POLLRDHUP != 0 =>
            {
                InetState::Ended
            }
            TCP_CLOSE => InetState::Plain,
            TCP_SYN_SENT => {
                let to = u8::try_from(domain).ok().zip(u32::try_from(fd.meta.ino()).ok())
                    .and_then(|(f, ino)| tcpdiag::peer_of(f, ino).ok().flatten())
                    .ok_or_else(|| fd.unsupported(format!("fd {n} is a TCP connect in progress whose peer address sock_diag does not tell; dump again once it is connected")))?;
                peer = to.to_raw();
                InetState::Connecting
            }
            st => return Err(fd.unsupported(format!("fd {n} is a TCP connection in state {st} (being accepted); this version saves listening, connecting, established and half-closed ones: dump again"))),
        }
    } else {
        let q = sock::inq(b).unwrap_or(0);
        let udp = ty == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP;
        if q > 0 && udp {
            // UDP: the datagrams are kept with their senders and
            // delivered again at restore.
            datagrams = sock::peek_datagrams(b, QUEUE_MAX).map_err(|e| {
                fd.unsupported(format!("fd {n}: reading its unread datagrams: {e}"))
            })?;
        } else if q > 0 {
            // A raw socket's packets (copies of whatever the host got of
            // its protocol, for whoever it was meant), or a ping socket's
            // replies: they cannot be read without being taken from the
            // program, nor given back to this socket alone. The restored
            // socket starts empty, as if the network had lost them (what
            // IP allows, and what CRIU does).
            tracing::warn!(
                pid = fd.pid,
                fd = n,
                bytes = q,
                "the unread packets of a raw or ping socket are not saved: lost, as on a network"
            );
        }
        if udp {
            shutdown = udp_shutdown(domain, fd.meta.ino()).map_err(|e| {
                fd.unsupported(format!(
                    "fd {n}: reading whether the UDP socket was shut down: {e}"
                ))
            })?;
        }
        InetState::Plain
    };
    Ok(FdKind::Inet(InetSocket {
        family: domain,
        sock_type: ty,
        protocol,
        local,
        peer,
        state,
        options,
        datagrams,
        filter,
        shutdown,
        byte_options,
    }))
}

/// A UDP socket's `sk_shutdown`, from `sock_diag` (nothing else tells it).
fn udp_shutdown(domain: i32, ino: u64) -> Result<u8, KernelError> {
    let (Ok(family), Ok(ino)) = (u8::try_from(domain), u32::try_from(ino)) else {
        return Ok(0);
    };
    let udp = u8::try_from(libc::IPPROTO_UDP).unwrap_or(17);
    Ok(tcpdiag::shutdown_of(family, udp, ino)?.unwrap_or(0))
}

/// Shuts the socket down as it was (`how`: an `sk_shutdown`). An
/// unconnected datagram socket takes it too, with `ENOTCONN`.
fn restore_shutdown(fd: i32, s: &OwnedFd, how: u8) -> Result<(), RestoreError> {
    let how = match how & 3 {
        0 => return Ok(()),
        1 => libc::SHUT_RD,
        2 => libc::SHUT_WR,
        _ => libc::SHUT_RDWR,
    };
    match sock::shutdown(s.as_fd(), how) {
        Err(KernelError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOTCONN) => {
            Ok(())
        }
        r => r.map_err(|e| RestoreError::Step {
            what: format!("shutting the socket of fd {fd} down as it was"),
            source: e,
        }),
    }
}

/// The port of a raw inet address.
pub fn port_of(addr: &[u8]) -> u16 {
    addr.get(2..4)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// `bind` to `i.local`; a port held by another process is reported so.
pub(crate) fn bind(fd: i32, s: &OwnedFd, i: &InetSocket, what: String) -> Result<(), RestoreError> {
    sock::bind(s.as_fd(), &i.local).map_err(|e| {
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            RestoreError::PortTaken {
                fd,
                port: port_of(&i.local),
            }
        } else {
            RestoreError::Socket { what, source: e }
        }
    })
}

/// Binds a listener to its port. If the port is taken, the orphaned sockets
/// on it (timewait remnants of the connections it had accepted when its
/// process was killed: without `SO_REUSEADDR` on the listener, which they
/// inherit, they hold the port for a minute) are closed and the bind tried
/// again; a port some process holds stays taken.
fn bind_listener(fd: i32, s: &OwnedFd, i: &InetSocket) -> Result<(), RestoreError> {
    let what = || format!("binding a listening socket (fd {fd})");
    match bind(fd, s, i, what()) {
        Err(RestoreError::PortTaken { .. }) => {
            // The accepted connections of the killed tree, kept by the
            // dump's holder until this restore. A guard that has just
            // killed the tree is named a holder a moment later, and forks
            // the holder that outlives it: looked for again for up to 2 s
            // while the port stays taken.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                let ended = tcp::release_holders_of(fd, &i.local, None)?;
                match bind(fd, s, i, what()) {
                    Err(RestoreError::PortTaken { .. }) => {}
                    r => return r,
                }
                if ended == 0 {
                    if std::time::Instant::now() >= until {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            let o = tcpdiag::destroy_port_orphans(&i.local).map_err(|k| RestoreError::Step {
                what: format!(
                    "closing the orphaned sockets (of the processes that died) on the port of the listener of fd {fd}"
                ),
                source: k,
            })?;
            if o.destroyed > 0 {
                tracing::info!(
                    fd,
                    port = port_of(&i.local),
                    closed = o.destroyed,
                    "closed the orphaned sockets holding a listener's port"
                );
            }
            bind(fd, s, i, what())
        }
        r => r,
    }
}

fn restore(cx: &mut RestoreCtx<'_>, fd: i32, i: &InetSocket) -> Result<OwnedFd, RestoreError> {
    let s = sock::socket(i.family, i.sock_type, i.protocol)?;
    let sock_err = |w: String| {
        move |e: std::io::Error| RestoreError::Socket {
            what: format!("{w} (fd {fd})"),
            source: e,
        }
    };
    // Options that must come before bind (V6ONLY, REUSEADDR, REUSEPORT...).
    set_options(&s, &i.options);
    set_byte_options(&s, &i.byte_options);
    // An address bound with IP_FREEBIND may not be local (yet): the bind
    // is made with it whatever the program's value, which comes back with
    // the options after the bind.
    let freebind = if i.family == libc::AF_INET6 {
        (libc::IPPROTO_IPV6, libc::IPV6_FREEBIND)
    } else {
        (libc::IPPROTO_IP, libc::IP_FREEBIND)
    };
    let _ = sock::set_int(s.as_fd(), freebind.0, freebind.1, 1);
    match &i.state {
        InetState::Listening {
            backlog,
            shares_port,
        } => {
            let _ = sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
            if *shares_port {
                // The port's bind bucket remembers it was bound so: the
                // other listeners bind with it still (`fastreuseport`).
                let _ = sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1);
            }
            bind_listener(fd, &s, i)?;
            fdops::listen(s.as_fd(), i32::try_from(*backlog).unwrap_or(128))
                .map_err(sock_err("listening".into()))?;
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
        }
        // Restored closed at the user's request (`restore --tcp-close`).
        InetState::Established(_) if cx.tcp_close => {
            let s = tcp::ended(fd, i.family)?;
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
            return Ok(s);
        }
        InetState::Established(r) => {
            let holders = tcp::restore(fd, &s, i, r)?;
            cx.pending_tcp.push(PendingTcp {
                fd,
                sock: scm::dup_at_least(s.as_fd(), 3)?,
                repair: r.clone(),
                options: i.options.clone(),
                filter: i.filter.clone(),
                holders,
            });
        }
        InetState::Unaccepted { .. } if cx.tcp_close => {
            let s = tcp::ended(fd, i.family)?;
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
            return Ok(s);
        }
        InetState::Unaccepted { queued } => {
            // Bound now (its address may still be the killed client's,
            // whose socket is held in repair mode: reuse lets both bind;
            // the program's own value comes back with the options),
            // connected once the listener exists.
            let _ = sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
            bind(
                fd,
                &s,
                i,
                format!(
                    "binding the TCP socket of fd {fd} (its connection was waiting to be accepted)"
                ),
            )?;
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
            cx.pending_connects.push(tcp::PendingConnect {
                fd,
                sock: scm::dup_at_least(s.as_fd(), 3)?,
                socket: i.clone(),
                queued: queued.clone(),
            });
        }
        InetState::Ended => {
            let s = tcp::ended(fd, i.family)?;
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
            return Ok(s);
        }
        InetState::Connecting => {
            bind(
                fd,
                &s,
                i,
                format!("binding the connecting TCP socket of fd {fd}"),
            )?;
            // (Its own flags come after: blocking or not, it connects now.)
            fdops::set_status_flags(s.as_fd(), libc::O_NONBLOCK).map_err(sock_err(
                "making the connecting TCP socket non-blocking".into(),
            ))?;
            match sock::connect(s.as_fd(), &i.peer) {
                Err(e) if e.raw_os_error() != Some(libc::EINPROGRESS) => {
                    return Err(sock_err("connecting again".into())(e))
                }
                _ => {}
            }
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
        }
        InetState::Plain => {
            if !sock::port_is_zero(&i.local) {
                sock::bind(s.as_fd(), &i.local)
                    .map_err(sock_err(format!("binding port {}", port_of(&i.local))))?;
            }
            if !i.peer.is_empty() {
                sock::connect(s.as_fd(), &i.peer).map_err(sock_err("connecting".into()))?;
            }
            if !i.datagrams.is_empty() {
                requeue_datagrams(fd, &s, i)?;
            }
            set_options(&s, &i.options);
            restore_filter(fd, &s, &i.filter)?;
            restore_shutdown(fd, &s, i.shutdown)?;
        }
    }
    Ok(s)
}

/// Sends a UDP socket's saved datagrams to it again, each from its
/// original sender's address, and waits until all are queued.
fn requeue_datagrams(fd: i32, s: &OwnedFd, i: &InetSocket) -> Result<(), RestoreError> {
    let err = |e: KernelError| RestoreError::Step {
        what: format!("queueing the unread datagrams of fd {fd} again"),
        source: e,
    };
    let local = sock::local_addr(s.as_fd()).map_err(err)?;
    for (from, data) in &i.datagrams {
        if i.family == libc::AF_INET6 {
            sock::inject_udp_v6(from, &local, data).map_err(err)?;
        } else {
            sock::inject_udp_v4(from, &local, data).map_err(err)?;
        }
    }
    // Loopback delivers from a softirq: wait (up to a second) for them all.
    let t0 = std::time::Instant::now();
    loop {
        let queued = sock::peek_datagrams(s.as_fd(), usize::MAX).map_err(err)?;
        if queued.len() >= i.datagrams.len() {
            return if queued == i.datagrams {
                Ok(())
            } else {
                Err(RestoreError::Inconsistent(format!(
                    "the datagrams queued again on fd {fd} differ from the saved ones"
                )))
            };
        }
        if t0.elapsed() > std::time::Duration::from_secs(1) {
            return Err(RestoreError::Inconsistent(format!(
                "only {} of the {} datagrams queued again on fd {fd} arrived",
                queued.len(),
                i.datagrams.len()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
