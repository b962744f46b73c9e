//! What every socket kind shares: the options (and classic BPF filter)
//! saved and put back on all of them, the walk over a tree's sockets, the accept gate that keeps new
//! TCP connections out during a dump, and the check for sockets caught
//! mid-change (a connection opening or closing, one waiting to be accepted).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::SocketFilter;
use stasis_kernel::{pidfd, sock, sockdiag, KernelError};
use stasis_sys::net::{TCP_CLOSE, TCP_LISTEN};

use crate::save::{list_fds, socket_inode};
use crate::RestoreError;

/// Options saved and restored on every socket, where they apply.
const SOCK_OPTS: [(i32, i32); 14] = [
    (libc::SOL_SOCKET, libc::SO_PASSCRED),
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT),
    (libc::SOL_SOCKET, libc::SO_MARK),
    (libc::SOL_SOCKET, libc::SO_PASSSEC),
    (libc::SOL_SOCKET, libc::SO_DONTROUTE),
    (libc::SOL_SOCKET, libc::SO_NO_CHECK),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
];

/// Options of the IP layers and of TCP, saved where they apply.
const IPV4_OPTS: [(i32, i32); 4] = [
    (libc::IPPROTO_IP, libc::IP_FREEBIND),
    (libc::IPPROTO_IP, libc::IP_PKTINFO),
    (libc::IPPROTO_IP, libc::IP_TTL),
    (libc::IPPROTO_IP, libc::IP_TOS),
];
const IPV6_OPTS: [(i32, i32); 3] = [
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
    (libc::IPPROTO_IPV6, libc::IPV6_FREEBIND),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
];
/// A raw socket's: its own IP header (`IP_HDRINCL`, always on for
/// IPPROTO_RAW), and an ICMP one's type filter (a 32-bit mask).
const RAW4_OPTS: [(i32, i32); 2] = [
    (libc::IPPROTO_IP, libc::IP_HDRINCL),
    (libc::SOL_RAW, stasis_sys::net::ICMP_FILTER),
];
const RAW6_OPTS: [(i32, i32); 1] = [(libc::IPPROTO_IPV6, libc::IPV6_HDRINCL)];
const TCP_OPTS: [(i32, i32); 5] = [
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_CORK),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
];

fn ints<'a>(
    b: BorrowedFd<'a>,
    opts: &'a [(i32, i32)],
) -> impl Iterator<Item = (i32, i32, i32)> + 'a {
    opts.iter()
        .filter_map(move |&(level, opt)| Some((level, opt, sock::get_int(b, level, opt).ok()?)))
}

/// The values of [`SOCK_OPTS`] on `b` (those it has), then the device it
/// is bound to (`SO_BINDTOIFINDEX`), its `SO_LINGER` (saved as the linger
/// time, when on) and last its `SO_BUF_LOCK`: setting a buffer size locks
/// it, so the locks the program had are put back after the sizes.
pub(crate) fn save_options(b: BorrowedFd<'_>) -> Vec<(i32, i32, i32)> {
    let mut out: Vec<_> = ints(b, &SOCK_OPTS).collect();
    let sol = libc::SOL_SOCKET;
    if let Ok(ifindex @ 1..) = sock::get_int(b, sol, libc::SO_BINDTOIFINDEX) {
        out.push((sol, libc::SO_BINDTOIFINDEX, ifindex));
    }
    if let Ok(l) = sock::get_bytes(b, sol, libc::SO_LINGER, 8) {
        let word = |i: usize| {
            l.get(i..i + 4)
                .and_then(|w| w.try_into().ok())
                .map_or(0, i32::from_ne_bytes)
        };
        if word(0) != 0 {
            out.push((sol, libc::SO_LINGER, word(4)));
        }
    }
    if let Ok(lock) = sock::get_int(b, sol, libc::SO_BUF_LOCK) {
        out.push((sol, libc::SO_BUF_LOCK, lock));
    }
    out
}

/// The IP-level options of an inet socket of `domain` and type `ty`, with
/// TCP's of a stream one and a raw one's (to be restored before the
/// `SOL_SOCKET` ones' buffer locks: put them first).
pub(crate) fn save_inet_options(b: BorrowedFd<'_>, domain: i32, ty: i32) -> Vec<(i32, i32, i32)> {
    let v6 = domain == libc::AF_INET6;
    let ip: &[(i32, i32)] = if v6 { &IPV6_OPTS } else { &IPV4_OPTS };
    let more: &[(i32, i32)] = match ty {
        libc::SOCK_STREAM => &TCP_OPTS,
        libc::SOCK_RAW if v6 => &RAW6_OPTS,
        libc::SOCK_RAW => &RAW4_OPTS,
        _ => &[],
    };
    ints(b, ip).chain(ints(b, more)).collect()
}

/// The options of an inet socket whose value is not an int: a raw ICMPv6
/// socket's type filter (`ICMPV6_FILTER`; other sockets have none).
pub(crate) fn save_inet_byte_options(
    b: BorrowedFd<'_>,
    domain: i32,
    ty: i32,
) -> Vec<(i32, i32, Vec<u8>)> {
    let (level, opt) = (libc::IPPROTO_ICMPV6, stasis_sys::net::ICMPV6_FILTER);
    if domain != libc::AF_INET6 || ty != libc::SOCK_RAW {
        return Vec::new();
    }
    match sock::get_bytes(b, level, opt, stasis_sys::net::ICMP6_FILTER_LEN) {
        Ok(v) if v.len() == stasis_sys::net::ICMP6_FILTER_LEN => vec![(level, opt, v)],
        _ => Vec::new(),
    }
}

/// Applies saved options whose value is not an int (best effort, as
/// [`set_options`]).
pub(crate) fn set_byte_options(s: &OwnedFd, opts: &[(i32, i32, Vec<u8>)]) {
    for (level, opt, v) in opts {
        if let Err(e) = sock::set_bytes(s.as_fd(), *level, *opt, v) {
            tracing::warn!(level, opt, %e, "socket option not restored");
        }
    }
}

/// Applies saved socket options (best effort: a value the kernel clamps or
/// refuses is logged). Buffer sizes are halved: the kernel doubles them.
pub(crate) fn set_options(s: &OwnedFd, opts: &[(i32, i32, i32)]) {
    for &(level, opt, v) in opts {
        let res = if level == libc::SOL_SOCKET && opt == libc::SO_LINGER {
            let l: Vec<u8> = [1i32, v].iter().flat_map(|w| w.to_ne_bytes()).collect();
            sock::set_bytes(s.as_fd(), level, opt, &l)
        } else if level == libc::SOL_SOCKET && (opt == libc::SO_RCVBUF || opt == libc::SO_SNDBUF) {
            sock::set_int(s.as_fd(), level, opt, v / 2)
        } else {
            sock::set_int(s.as_fd(), level, opt, v)
        };
        if let Err(e) = res {
            tracing::debug!("socket option ({level}, {opt}) = {v}: {e}");
        }
    }
}

/// The socket's classic BPF filter and whether it is locked; `None`:
/// none, or only the drop-everything one a dump attaches (the network
/// lock, the accept gate), which is not the program's. An eBPF filter,
/// which cannot be read back, is refused.
pub(crate) fn save_filter(b: BorrowedFd<'_>) -> Result<Option<SocketFilter>, KernelError> {
    if !sock::has_filter(b) || sock::has_drop_all_filter(b) {
        return Ok(None);
    }
    let insns = sock::read_filter(b)?;
    if insns.is_empty() {
        return Ok(None);
    }
    let locked = sock::get_int(b, libc::SOL_SOCKET, libc::SO_LOCK_FILTER)? != 0;
    Ok(Some(SocketFilter { insns, locked }))
}

/// Attaches a saved filter (and locks it if it was).
pub(crate) fn restore_filter(
    fd: i32,
    s: &OwnedFd,
    f: &Option<SocketFilter>,
) -> Result<(), RestoreError> {
    let Some(f) = f else {
        return Ok(());
    };
    let step = |what: &str| {
        let what = format!("{what} of fd {fd}");
        move |source: KernelError| RestoreError::Step { what, source }
    };
    sock::attach_filter(s.as_fd(), &f.insns).map_err(step("attaching the socket filter"))?;
    if f.locked {
        sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_LOCK_FILTER, 1)
            .map_err(step("locking the socket filter"))?;
    }
    Ok(())
}

/// Whether `b` is an inet (v4 or v6) socket of protocol `proto`.
pub(crate) fn is_inet(b: BorrowedFd<'_>, proto: i32) -> bool {
    matches!(
        sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN),
        Ok(libc::AF_INET | libc::AF_INET6)
    ) && sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL).is_ok_and(|p| p == proto)
}

/// The inode number of the socket (or any file) `b`.
pub(crate) fn inode_of(b: BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(b.as_raw_fd()).ok().map(|s| s.st_ino)
}

/// Calls `f(pid, fd, inode, socket)` with every socket of `pids`: from
/// `census` when it lists them (a frozen tree), else walking `/proc` as
/// [`for_each_socket`] does.
pub(crate) fn each_socket(
    census: Option<&crate::fd_census::FdCensus>,
    pids: &[i32],
    mut f: impl FnMut(i32, i32, u64, BorrowedFd<'_>),
) {
    match census.filter(|c| c.covers(pids)) {
        Some(c) => c.sockets().for_each(|(p, fd, ino, s)| f(p, fd, ino, s)),
        None => for_each_socket(pids, |p, fd, ino, s| f(p, fd, ino, s.as_fd())),
    }
}

/// Calls `f(pid, fd, inode, socket)` with a copy of every socket fd of
/// `pids` (taken with `pidfd_getfd`; fds that vanish meanwhile are skipped).
pub(crate) fn for_each_socket(pids: &[i32], mut f: impl FnMut(i32, i32, u64, OwnedFd)) {
    for &pid in pids {
        let Ok(pfd) = pidfd::pidfd_open(pid) else {
            continue;
        };
        for fd in list_fds(pid).unwrap_or_default() {
            let Ok(link) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) else {
                continue;
            };
            let Some(ino) = socket_inode(&link.to_string_lossy()) else {
                continue;
            };
            if let Ok(s) = pidfd::pidfd_getfd(&pfd, fd) {
                f(pid, fd, ino, s);
            }
        }
    }
}

/// The TCP listeners of a tree, closed to new connections for the length
/// of a dump (see [`AcceptGate::close`]); opened again when dropped.
#[derive(Debug, Default)]
pub struct AcceptGate {
    socks: Vec<OwnedFd>,
    pids: Vec<i32>,
    /// Sockets (by inode) that had a drop-everything filter of their own
    /// before the gate closed: left as they are when it opens.
    own_filters: Vec<u64>,
    /// Opens the gate if the dumper dies first.
    guard: Option<sock::SocketGuard>,
}

impl AcceptGate {
    /// Attaches a drop-everything filter to every TCP listener of `pids`
    /// that has no filter of its own, so that no new connection completes
    /// its handshake (clients see a lost SYN and retransmit it): what is in
    /// the accept queue can then drain, since the program runs on until the
    /// freeze, and nothing refills it. Best effort.
    pub fn close(pids: &[i32]) -> AcceptGate {
        let mut g = AcceptGate {
            socks: Vec::new(),
            pids: pids.to_vec(),
            own_filters: Vec::new(),
            guard: None,
        };
        let mut listeners = Vec::new();
        for_each_socket(pids, |_, _, ino, s| {
            let b = s.as_fd();
            if sock::has_drop_all_filter(b) {
                g.own_filters.push(ino);
                return;
            }
            let tcp_listener = sock::get_int(b, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0)
                == 1
                && is_inet(b, libc::IPPROTO_TCP);
            if tcp_listener && !sock::has_filter(b) {
                listeners.push(s);
            }
        });
        if listeners.is_empty() {
            return g;
        }
        // The guard first: a dumper killed right after attaching a filter
        // must not leave the listener deaf.
        let guarded: Vec<sock::Guarded> = listeners
            .iter()
            .map(|s| sock::Guarded {
                fd: s.as_raw_fd(),
                detach_filter: true,
                leave_repair: false,
                reuseaddr: -1,
            })
            .collect();
        match sock::SocketGuard::spawn(&guarded, &[], &[]) {
            Ok(guard) => g.guard = Some(guard),
            Err(e) => {
                tracing::warn!(
                    "not closing the TCP listeners to new connections during the dump: {e}"
                );
                return g;
            }
        }
        for s in listeners {
            if sock::attach_drop_all(s.as_fd()).is_ok() {
                g.socks.push(s);
            }
        }
        g
    }

    /// Waits (up to `patience`) until no socket of the tree is in a
    /// transient state ([`transient_socket`]): queues drained, closing
    /// connections closed.
    pub fn drain(&self, patience: std::time::Duration) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < patience && transient_socket(None, &self.pids).is_some() {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for AcceptGate {
    fn drop(&mut self) {
        if self.socks.is_empty() {
            return;
        }
        for s in &self.socks {
            if let Err(e) = sock::detach_filter(s.as_fd()) {
                tracing::warn!("could not reopen a TCP listener to new connections: {e}");
            }
        }
        // A connection whose handshake completed just as the filter went
        // on inherited it: it would drop everything it receives.
        for_each_socket(&self.pids, |_, _, ino, s| {
            if !self.own_filters.contains(&ino) && sock::has_drop_all_filter(s.as_fd()) {
                let _ = sock::detach_filter(s.as_fd());
            }
        });
        if let Some(g) = self.guard.take() {
            g.dismiss();
        }
    }
}

/// Why socket `s` (inode `ino`) cannot be saved now but likely can in a
/// moment, if so. `unix` caches the namespace's unix sockets.
fn transient(
    s: BorrowedFd<'_>,
    ino: u64,
    unix: &mut Option<HashMap<u64, sockdiag::UnixInfo>>,
) -> Option<String> {
    let listening = sock::get_int(s, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0) == 1;
    match sock::get_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN) {
        Ok(libc::AF_UNIX) if listening => {
            if unix.is_none() {
                *unix = sockdiag::unix_sockets().ok();
            }
            let n = unix
                .as_ref()
                .and_then(|m| m.get(&ino))
                .map_or(0, |i| i.rqueue);
            (n > 0).then(|| format!("{n} connection(s) waiting to be accepted"))
        }
        Ok(libc::AF_INET | libc::AF_INET6)
            if sock::get_int(s, libc::SOL_SOCKET, libc::SO_TYPE)
                .is_ok_and(|t| t == libc::SOCK_STREAM) =>
        {
            match sock::tcp_info(s) {
                Ok(i) if listening && i.unacked > 0 => Some(format!(
                    "{} connection(s) waiting to be accepted",
                    i.unacked
                )),
                // Established or half-closed, listening, or closed (never
                // connected).
                Ok(i)
                    if matches!(i.state, TCP_CLOSE | TCP_LISTEN)
                        || crate::tcp::repairable(i.state) =>
                {
                    None
                }
                Ok(i) => Some(format!("TCP state {}", i.state)),
                Err(_) => None,
            }
        }
        _ => None,
    }
}

/// The first socket of `pids` that cannot be checkpointed now but likely
/// can in a moment: a listener with connections waiting to be accepted, or
/// a TCP connection opening. Returns `(pid, fd, what)`.
/// `census`: the tree's fds, if they were listed (frozen).
pub fn transient_socket(
    census: Option<&crate::fd_census::FdCensus>,
    pids: &[i32],
) -> Option<(i32, i32, String)> {
    let mut unix = None;
    let mut found = None;
    let mut quiet = None;
    each_socket(census, pids, |pid, fd, ino, s| {
        if found.is_none() {
            if let Some(w) = transient(s, ino, &mut unix) {
                if !waits_for_the_tree(s, census, pids, &mut quiet) {
                    found = Some((pid, fd, w));
                }
            }
        }
    });
    found
}

/// Whether `s` is a TCP listener whose every waiting connection comes from
/// a quiet client of the tree `pids` (they are saved with their clients:
/// [`crate::tcp::unaccepted`]). `quiet` caches those clients.
fn waits_for_the_tree(
    s: BorrowedFd<'_>,
    census: Option<&crate::fd_census::FdCensus>,
    pids: &[i32],
    quiet: &mut Option<
        Vec<(
            stasis_kernel::tcpdiag::DiagAddr,
            stasis_kernel::tcpdiag::DiagAddr,
        )>,
    >,
) -> bool {
    let listening = sock::get_int(s, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0) == 1;
    let Ok(info) = sock::tcp_info(s) else {
        return false;
    };
    if !listening || !is_inet(s, libc::IPPROTO_TCP) || info.unacked == 0 {
        return false;
    }
    let Ok(local) = sock::local_addr(s) else {
        return false;
    };
    let clients = quiet.get_or_insert_with(|| crate::tcp::unaccepted::quiet_clients(census, pids));
    crate::tcp::unaccepted::waiting_from(&local, clients)
        >= usize::try_from(info.unacked).unwrap_or(usize::MAX)
}
