//! File descriptors: what each one is, which ones share an open file
//! description (across the tree), and the data sitting in pipes.
//!
//! Sharing is found by `kcmp(KCMP_FILE)` among fds whose targets have the
//! same device and inode (a cheap pre-filter: anonymous inodes all share one
//! inode, so `kcmp` has the last word). Pipe contents are copied with
//! `tee(2)` from a read end taken out of the process with `pidfd_getfd` (or
//! reopened through `/proc/PID/fd/N` when the process only holds the write
//! end), so the data stays in the pipe.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{
    EpollTarget, Extent, FdImage, FdKind, FileLock, GhostFile, InetSocket, InetState, InotifyWatch,
    LockKind, PipeImage, SysvShm, TcpRepair, UnixSocket, UnixState,
};
use stasis_kernel::sockdiag::{self, UnixInfo};
use stasis_kernel::{pidfd, sock};

use crate::{proc, CaptureError, Result};

/// The largest pipe stasis can recreate without CAP_SYS_RESOURCE.
const PIPE_MAX: usize = 1 << 20;

/// Why an fd cannot be checkpointed, or `None` if its kind is known.
pub fn unsupported_reason(pid: i32, fd: i32, link: &str) -> Option<String> {
    let kind = if link.starts_with("anon_inode:")
        && ![
            "anon_inode:[eventfd]",
            "anon_inode:[timerfd]",
            "anon_inode:[signalfd]",
            "anon_inode:[eventpoll]",
            "anon_inode:inotify",
        ]
        .contains(&link)
    {
        Some("an anonymous inode of a kind stasis does not know (userfaultfd, io_uring, pidfd, inotify...)")
    } else if link.starts_with("/dev/pts/")
        || link.starts_with("/dev/tty")
        || link == "/dev/console"
        || link.starts_with("/dev/ptmx")
    {
        Some("a terminal")
    } else if link.starts_with("pipe:")
        || link.starts_with("anon_inode:")
        || link.starts_with("socket:")
    {
        None
    } else if !link.starts_with('/') {
        Some("a special file")
    } else {
        None
    };
    if let Some(k) = kind {
        let hint = if k == "a terminal" {
            "; redirect the program's stdin/stdout/stderr to files (or /dev/null) to checkpoint it"
        } else {
            ""
        };
        return Some(format!(
            "fd {fd} is {k} ({link}), which this version of stasis cannot checkpoint yet{hint}"
        ));
    }
    if link.starts_with('/') {
        match std::fs::metadata(format!("/proc/{pid}/fd/{fd}")) {
            Ok(m) => {
                let ft = m.file_type();
                if !(ft.is_file() || ft.is_dir() || ft.is_char_device() || ft.is_fifo()) {
                    return Some(format!("fd {fd} ({link}) is a block device or special file, which this version of stasis cannot checkpoint yet"));
                }
            }
            Err(e) => return Some(format!("fd {fd} ({link}): {e}")),
        }
    }
    None
}

/// Calls `f(pid, fd, inode, socket)` with a copy of every socket fd of
/// `pids` (taken with `pidfd_getfd`; fds that vanish meanwhile are skipped).
fn for_each_socket(pids: &[i32], mut f: impl FnMut(i32, i32, u64, OwnedFd)) {
    for &pid in pids {
        let Ok(pfd) = pidfd::pidfd_open(pid) else {
            continue;
        };
        for fd in list_fds(pid).unwrap_or_default() {
            let Ok(link) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) else {
                continue;
            };
            let Some(ino) = link
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
            else {
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
                && matches!(
                    sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN),
                    Ok(libc::AF_INET | libc::AF_INET6)
                )
                && sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL)
                    .is_ok_and(|p| p == libc::IPPROTO_TCP);
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
        match sock::SocketGuard::spawn(&guarded) {
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
        while t0.elapsed() < patience && transient_socket(&self.pids).is_some() {
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

/// The first socket of `pids` that cannot be checkpointed now but likely
/// can in a moment: a listener with connections waiting to be accepted, or
/// a TCP connection opening or closing (a busy server closes a connection
/// its client closed within milliseconds). Returns `(pid, fd, what)`.
pub fn transient_socket(pids: &[i32]) -> Option<(i32, i32, String)> {
    let mut unix: Option<HashMap<u64, sockdiag::UnixInfo>> = None;
    let mut found = None;
    for_each_socket(pids, |pid, fd, ino, s| {
        if found.is_some() {
            return;
        }
        let b = s.as_fd();
        let listening = sock::get_int(b, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0) == 1;
        let what = match sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN) {
            Ok(libc::AF_UNIX) if listening => {
                if unix.is_none() {
                    unix = sockdiag::unix_sockets().ok();
                }
                let n = unix
                    .as_ref()
                    .and_then(|m| m.get(&ino))
                    .map_or(0, |i| i.rqueue);
                (n > 0).then(|| format!("{n} connection(s) waiting to be accepted"))
            }
            Ok(libc::AF_INET | libc::AF_INET6)
                if sock::get_int(b, libc::SOL_SOCKET, libc::SO_TYPE)
                    .is_ok_and(|t| t == libc::SOCK_STREAM) =>
            {
                match sock::tcp_info(b) {
                    Ok(i) if listening && i.unacked > 0 => Some(format!(
                        "{} connection(s) waiting to be accepted",
                        i.unacked
                    )),
                    // Established, listening, or closed (never connected).
                    Ok(i) if matches!(i.state, 1 | 7 | 10) => None,
                    Ok(i) => Some(format!("TCP state {}", i.state)),
                    Err(_) => None,
                }
            }
            _ => None,
        };
        if let Some(w) = what {
            found = Some((pid, fd, w));
        }
    });
    found
}

/// Lists the fd numbers of `pid`.
pub fn list_fds(pid: i32) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc::proc_path(pid, "fd"))
        .map_err(|e| CaptureError::from_proc(pid, "fd", e))?;
    let mut fds: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// Collects the fds of every process of a dump.
#[derive(Default)]
pub struct FdCollector {
    /// (pid, fd, dev, ino, index of the process, index in its fd list).
    seen: Vec<(i32, i32, u64, u64, usize, usize)>,
    /// Per process, in dump order.
    pub tables: Vec<Vec<FdImage>>,
    next_shared: u32,
    /// Pipe contents by pipe inode.
    pub pipes: HashMap<u64, PipeImage>,
    /// Deleted files and memfds by inode.
    pub ghosts: HashMap<u64, GhostFile>,
    /// System V segments.
    pub sysv: Vec<SysvShm>,
    /// Unix sockets of the namespace (queried on first need).
    unix: Option<HashMap<u64, UnixInfo>>,
    /// TCP sockets put in repair mode: kept open until the dump ends, then
    /// closed silently (process killed) or taken out of repair (left running,
    /// [`leave_repair`]).
    pub repaired: Repairs,
}

/// The connections a dump put in repair mode, and the guard that puts them
/// back if the dumper dies before [`leave_repair`] or the kill.
#[derive(Debug, Default)]
pub struct Repairs {
    socks: Vec<Repaired>,
    guard: Option<sock::SocketGuard>,
}

/// An established TCP connection of the tree put in repair mode by the
/// dump, through a copy of its fd, with what repair mode changes on it.
///
/// Entering repair mode forces address reuse on the socket (`sk_reuse =
/// SK_FORCE_REUSE`), and leaving it clears reuse (`SK_NO_REUSE`) whatever
/// `SO_REUSEADDR` the program had set: a connection left so would go to
/// TIME_WAIT, when the program dies, unwilling to share its port, and
/// keep the program's listener from binding that port again (a restart or
/// a restore) for a minute. So the program's `SO_REUSEADDR` is read before
/// and put back after. The network lock (a drop-everything filter) is the
/// other change, removed by [`FdCollector::unlock_tcp`] or
/// [`leave_repair`] when this dump attached it.
#[derive(Debug)]
pub struct Repaired {
    sock: OwnedFd,
    ino: u64,
    /// `SO_REUSEADDR` as the program had it (`None`: could not be read).
    reuseaddr: Option<i32>,
    /// Whether this dump attached the drop-everything filter.
    locked: bool,
    /// Whether entering repair mode succeeded.
    in_repair: bool,
}

impl Repaired {
    /// Takes the connection out of repair mode (no window probe: the peer
    /// has its state already) and puts back what repair mode changed.
    fn leave(mut self) {
        let b = self.sock.as_fd();
        if self.locked && sock::has_drop_all_filter(b) {
            // The filter `freeze_tcp` attached: packets flow again.
            let _ = sock::detach_filter(b);
            self.locked = false;
        }
        if !self.in_repair {
            return;
        }
        if let Err(e) = sock::set_int(
            b,
            libc::IPPROTO_TCP,
            sock::TCP_REPAIR,
            sock::TCP_REPAIR_OFF_NO_WP,
        ) {
            tracing::error!("could not take a TCP socket out of repair mode: {e}");
            return;
        }
        if let Some(v) = self.reuseaddr {
            if let Err(e) = sock::set_int(b, libc::SOL_SOCKET, libc::SO_REUSEADDR, v) {
                tracing::error!(
                    "could not put SO_REUSEADDR = {v} back on a TCP socket after repair mode: {e}"
                );
            }
        }
    }
}

/// Takes the connections `freeze_tcp` put in repair mode out of it, as the
/// program had them (the tree runs on, or a failed dump releases it).
/// (Dropping the [`Repairs`] instead closes them in repair mode, silently:
/// for a tree that is killed.)
pub fn leave_repair(mut r: Repairs) {
    for s in std::mem::take(&mut r.socks) {
        s.leave();
    }
    if let Some(g) = r.guard.take() {
        g.dismiss();
    }
}

/// Largest deleted file or memfd stasis saves (its content goes into the manifest).
const GHOST_MAX: u64 = 64 << 20;

/// Largest socket queue stasis saves.
const QUEUE_MAX: usize = 256 << 20;

/// Options saved and restored on every socket, where they apply.
const SOCK_OPTS: [(i32, i32); 7] = [
    (libc::SOL_SOCKET, libc::SO_PASSCRED),
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
];

fn kcmp_same_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> bool {
    const KCMP_FILE: i32 = 0;
    // SAFETY: kcmp takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1, fd2) };
    r == 0
}

impl FdCollector {
    /// Records every fd of process `pid` (the `index`-th of the dump).
    pub fn add_process(&mut self, pid: i32) -> Result<()> {
        let index = self.tables.len();
        let mut table: Vec<FdImage> = Vec::new();
        for fd in list_fds(pid)? {
            let link = proc::read_link(pid, &format!("fd/{fd}"))?;
            if let Some(what) = unsupported_reason(pid, fd, &link) {
                return Err(CaptureError::Unsupported { pid, what });
            }
            let info_name = format!("fdinfo/{fd}");
            let info = proc::read(pid, &info_name)?;
            let fmt = |w: proc::FormatError| CaptureError::ProcFormat {
                pid,
                file: info_name.clone(),
                what: w.0,
            };
            let (pos, flags) = proc::parse_fdinfo(&info).map_err(fmt)?;
            let meta = std::fs::metadata(proc::proc_path(pid, &format!("fd/{fd}")))
                .map_err(|e| CaptureError::from_proc(pid, &format!("fd/{fd}"), e))?;
            let kind = match link.as_str() {
                l if l.starts_with("socket:") => self.capture_socket(pid, fd, meta.ino())?,
                l if l.starts_with("pipe:") => {
                    self.capture_pipe(pid, fd, flags, meta.ino())?;
                    FdKind::Pipe {
                        id: meta.ino(),
                        write_end: flags & libc::O_ACCMODE.unsigned_abs()
                            == libc::O_WRONLY.unsigned_abs(),
                    }
                }
                "anon_inode:[eventfd]" => {
                    let (count, semaphore) = proc::parse_eventfd(&info).map_err(fmt)?;
                    FdKind::Eventfd { count, semaphore }
                }
                "anon_inode:[timerfd]" => {
                    let (clockid, ticks, value_ns, interval_ns) =
                        proc::parse_timerfd(&info).map_err(fmt)?;
                    FdKind::Timerfd {
                        clockid,
                        value_ns,
                        interval_ns,
                        ticks,
                    }
                }
                "anon_inode:[signalfd]" => FdKind::Signalfd {
                    mask: proc::parse_signalfd(&info).map_err(fmt)?,
                },
                "anon_inode:inotify" => FdKind::Inotify {
                    watches: inotify_watches(pid, fd, &info)
                        .map_err(|w| CaptureError::Unsupported { pid, what: w })?,
                },
                "anon_inode:[eventpoll]" => FdKind::Epoll {
                    targets: proc::parse_epoll(&info)
                        .map_err(fmt)?
                        .into_iter()
                        .map(|(fd, events, data)| EpollTarget { fd, events, data })
                        .collect(),
                },
                l if l.ends_with(" (deleted)") && meta.file_type().is_file() => {
                    self.capture_ghost(pid, fd)?;
                    let name = l.trim_end_matches(" (deleted)");
                    match name.strip_prefix("/memfd:") {
                        Some(n) => FdKind::Memfd {
                            name: n.to_string(),
                            id: meta.ino(),
                            pos,
                        },
                        None => FdKind::Ghost {
                            path: name.to_string(),
                            id: meta.ino(),
                            pos,
                        },
                    }
                }
                l if l.ends_with(" (deleted)") => {
                    return Err(CaptureError::Unsupported {
                        pid,
                        what: format!(
                            "fd {fd} is a deleted {} ({l}), which stasis cannot checkpoint yet",
                            if meta.is_dir() {
                                "directory"
                            } else {
                                "special file"
                            }
                        ),
                    })
                }
                _ if meta.file_type().is_fifo() => {
                    self.capture_pipe(pid, fd, flags, meta.ino())?;
                    FdKind::Fifo {
                        path: link.clone(),
                        id: meta.ino(),
                    }
                }
                _ => FdKind::Path {
                    path: link.clone(),
                    pos,
                    mode: meta.mode(),
                    size: meta.size(),
                },
            };
            let cloexec = flags & libc::O_CLOEXEC.unsigned_abs() != 0;
            let mut locks = Vec::new();
            for (k, write, start, len) in proc::parse_locks(&info).map_err(fmt)? {
                let kind = match k.as_str() {
                    "POSIX" => LockKind::Posix,
                    "FLOCK" => LockKind::Flock,
                    "OFDLCK" => LockKind::Ofd,
                    other => {
                        return Err(CaptureError::Unsupported {
                            pid,
                            what: format!(
                                "fd {fd} holds a {other} lock, which stasis cannot checkpoint yet"
                            ),
                        })
                    }
                };
                locks.push(FileLock {
                    kind,
                    write,
                    start,
                    len,
                });
            }
            let mut img = FdImage {
                fd,
                flags: flags & !libc::O_CLOEXEC.unsigned_abs(),
                cloexec,
                kind,
                shared_id: None,
                locks,
            };
            // Same open file description as an fd seen before?
            let twin = self
                .seen
                .iter()
                .find(|(p, f, dev, ino, _, _)| {
                    *dev == meta.dev() && *ino == meta.ino() && kcmp_same_file(*p, *f, pid, fd)
                })
                .map(|&(_, _, _, _, pi, fi)| (pi, fi));
            if let Some((pi, fi)) = twin {
                let existing = if pi == index {
                    table[fi].shared_id
                } else {
                    self.tables[pi][fi].shared_id
                };
                let id = existing.unwrap_or_else(|| {
                    self.next_shared += 1;
                    self.next_shared
                });
                if pi == index {
                    table[fi].shared_id = Some(id);
                } else {
                    self.tables[pi][fi].shared_id = Some(id);
                }
                img.shared_id = Some(id);
            }
            self.seen
                .push((pid, fd, meta.dev(), meta.ino(), index, table.len()));
            table.push(img);
        }
        self.tables.push(table);
        Ok(())
    }

    fn capture_socket(&mut self, pid: i32, fd: i32, ino: u64) -> Result<FdKind> {
        let unsupported = |what: String| CaptureError::Unsupported { pid, what };
        let pfd = pidfd::pidfd_open(pid)?;
        let s = pidfd::pidfd_getfd(&pfd, fd)?;
        let b = s.as_fd();
        let domain = sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
        let ty = sock::get_int(b, libc::SOL_SOCKET, libc::SO_TYPE)?;
        // A connection in repair mode (`freeze_tcp`) reads SO_REUSEADDR as
        // forced (2): the program's own value was read before.
        let repaired_reuse = self
            .repaired
            .socks
            .iter()
            .find(|r| r.ino == ino)
            .map(|r| r.reuseaddr);
        let mut options = Vec::new();
        for (level, opt) in SOCK_OPTS {
            let v = match repaired_reuse {
                Some(saved) if (level, opt) == (libc::SOL_SOCKET, libc::SO_REUSEADDR) => saved,
                _ => sock::get_int(b, level, opt).ok(),
            };
            if let Some(v) = v {
                options.push((level, opt, v));
            }
        }
        match domain {
            libc::AF_UNIX => {
                if self.unix.is_none() {
                    self.unix = Some(sockdiag::unix_sockets()?);
                }
                let all = self.unix.as_ref().map_or_else(HashMap::new, Clone::clone);
                let info = all.get(&ino).ok_or_else(|| unsupported(format!("fd {fd}: unix socket {ino} is not listed by sock_diag")))?;
                let state = match info.state {
                    sockdiag::STATE_LISTEN => {
                        if info.rqueue > 0 {
                            return Err(unsupported(format!("fd {fd} is a listening unix socket with {} connection(s) waiting to be accepted", info.rqueue)));
                        }
                        UnixState::Listening { backlog: info.wqueue }
                    }
                    sockdiag::STATE_ESTABLISHED => match info.peer.filter(|p| *p != 0 && all.contains_key(p)) {
                        Some(peer) => UnixState::Connected { peer, peer_name: all.get(&peer).and_then(|p| p.name.clone()) },
                        // The other end was closed (a socketpair half kept, as
                        // Java NIO does): peer 0.
                        None => UnixState::Connected { peer: 0, peer_name: None },
                    },
                    _ => UnixState::Unconnected,
                };
                let peeked = if matches!(state, UnixState::Listening { .. }) { Vec::new() } else { sock::peek_queue(b, QUEUE_MAX).map_err(|e| match e {
                        stasis_kernel::KernelError::Unsupported { .. } => unsupported(format!("fd {fd} is a unix socket with file descriptors in flight in its queue (SCM_RIGHTS), which stasis cannot checkpoint yet")),
                        e => e.into(),
                    })? };
                let (mut queue, mut queue_creds): (Vec<Vec<u8>>, Vec<_>) = peeked.into_iter().unzip();
                if ty == libc::SOCK_STREAM && queue.len() > 1 {
                    // A byte stream: one chunk (credentials cannot be told
                    // apart per byte; the first message's are kept).
                    queue = vec![queue.concat()];
                    queue_creds.truncate(1);
                }
                Ok(FdKind::Unix(UnixSocket { ino, sock_type: ty, name: info.name.clone(), state, queue, queue_creds, options }))
            }
            libc::AF_INET | libc::AF_INET6 => {
                let protocol = sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
                if domain == libc::AF_INET6 {
                    if let Ok(v) = sock::get_int(b, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) {
                        options.push((libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, v));
                    }
                }
                let local = sock::local_addr(b)?;
                let peer = sock::peer_addr(b)?;
                let mut datagrams = Vec::new();
                let state = if ty == libc::SOCK_STREAM {
                    if let Ok(v) = sock::get_int(b, libc::IPPROTO_TCP, libc::TCP_NODELAY) {
                        options.push((libc::IPPROTO_TCP, libc::TCP_NODELAY, v));
                    }
                    let info = sock::tcp_info(b)?;
                    match info.state {
                        10 => {
                            if info.unacked > 0 {
                                return Err(unsupported(format!("fd {fd} is a listening TCP socket with {} connection(s) waiting to be accepted", info.unacked)));
                            }
                            InetState::Listening { backlog: info.sacked }
                        }
                        1 => {
                            // Already in repair mode (`freeze_tcp`); the copy
                            // kept there keeps it so until the dump ends.
                            let r = capture_tcp(b, &info).map_err(|e| unsupported(format!("fd {fd}: saving an established TCP connection failed: {e}")))?;
                            InetState::Established(r)
                        }
                        7 => InetState::Plain,
                        st => return Err(unsupported(format!("fd {fd} is a TCP connection in state {st} (opening or closing); this version saves listening and established ones"))),
                    }
                } else {
                    let q = sock::inq(b).unwrap_or(0);
                    if q > 0 {
                        // IPv4 UDP: the datagrams are kept with their
                        // senders and delivered again at restore.
                        if domain != libc::AF_INET || protocol != libc::IPPROTO_UDP {
                            return Err(unsupported(format!("fd {fd} is an IPv6 or raw datagram socket with unread datagrams, which stasis cannot checkpoint yet")));
                        }
                        datagrams = sock::peek_datagrams(b, QUEUE_MAX).map_err(|e| unsupported(format!("fd {fd}: reading its unread datagrams: {e}")))?;
                    }
                    InetState::Plain
                };
                Ok(FdKind::Inet(InetSocket { family: domain, sock_type: ty, protocol, local, peer, state, options, datagrams }))
            }
            d => Err(unsupported(format!("fd {fd} is a socket of address family {d} (netlink, packet...), which stasis cannot checkpoint yet"))),
        }
    }

    /// Puts every established TCP connection of the tree in repair mode
    /// before any of them is read: two ends of a connection inside the tree
    /// must be frozen at the same instant, or bytes sent by the second
    /// after the first was read would be lost to both images.
    pub fn freeze_tcp(&mut self, pids: &[i32]) -> Result<()> {
        let mut found = Vec::new();
        for &pid in pids {
            let pfd = pidfd::pidfd_open(pid)?;
            for fd in list_fds(pid)? {
                let Ok(link) = proc::read_link(pid, &format!("fd/{fd}")) else {
                    continue;
                };
                let Some(ino) = link
                    .strip_prefix("socket:[")
                    .and_then(|r| r.strip_suffix(']'))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                let s = pidfd::pidfd_getfd(&pfd, fd)?;
                let b = s.as_fd();
                let tcp = matches!(
                    sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN),
                    Ok(libc::AF_INET | libc::AF_INET6)
                ) && sock::get_int(b, libc::SOL_SOCKET, libc::SO_PROTOCOL).ok()
                    == Some(libc::IPPROTO_TCP);
                if tcp && sock::tcp_info(b).ok().map(|i| i.state) == Some(1) {
                    found.push((pid, fd, ino, s));
                }
            }
        }
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
        let guard = sock::SocketGuard::spawn(&guarded).map_err(|e| CaptureError::Unsupported {
            pid: found[0].0,
            what: format!("cannot start the process that would put the TCP connections back if the dump died: {e}"),
        })?;
        self.repaired.guard = Some(guard);
        let mut locked = Vec::with_capacity(found.len());
        for ((_, _, _, s), (_, lock)) in found.iter().zip(&before) {
            locked.push(*lock && sock::attach_drop_all(s.as_fd()).is_ok());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        for (((pid, fd, ino, s), locked), (reuseaddr, _)) in
            found.into_iter().zip(locked).zip(before)
        {
            let r = sock::set_int(s.as_fd(), libc::IPPROTO_TCP, sock::TCP_REPAIR, 1);
            // Recorded even if it failed: the filter comes off all the same.
            self.repaired.socks.push(Repaired {
                sock: s,
                ino,
                reuseaddr,
                locked,
                in_repair: r.is_ok(),
            });
            r.map_err(|e| CaptureError::Unsupported { pid, what: format!("fd {fd}: cannot put a TCP connection in repair mode (needs CAP_NET_ADMIN): {e}") })?;
        }
        Ok(())
    }

    /// Lets packets reach the connections `freeze_tcp` locked again.
    pub fn unlock_tcp(&mut self) {
        for r in &mut self.repaired.socks {
            if r.locked && sock::has_drop_all_filter(r.sock.as_fd()) {
                let _ = sock::detach_filter(r.sock.as_fd());
            }
            r.locked = false;
        }
    }

    /// Refuses unix sockets connected to a peer outside the tree (the peer
    /// would lose its connection); datagram sockets connected to a named
    /// socket outside (syslog's /dev/log, say) are reconnected by name.
    pub fn check_external_sockets(&self) -> Result<()> {
        let inos: std::collections::HashSet<u64> = self
            .tables
            .iter()
            .flatten()
            .filter_map(|f| {
                if let FdKind::Unix(u) = &f.kind {
                    Some(u.ino)
                } else {
                    None
                }
            })
            .collect();
        for (i, t) in self.tables.iter().enumerate() {
            for f in t {
                if let FdKind::Unix(u) = &f.kind {
                    if let UnixState::Connected { peer, peer_name } = &u.state {
                        let by_name = u.sock_type == libc::SOCK_DGRAM && peer_name.is_some();
                        if *peer != 0 && !inos.contains(peer) && !by_name {
                            let pid = self.seen.iter().find(|s| s.4 == i).map_or(0, |s| s.0);
                            return Err(CaptureError::Unsupported { pid, what: format!("fd {} is a unix socket connected to a process outside the dumped tree (dump their common ancestor)", f.fd) });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Refuses pipes with an end held outside the tree (a shell pipeline
    /// around the dumped program, say): that process would lose its peer.
    pub fn check_external_pipes(&self, tree: &[i32]) -> Result<()> {
        let mut ends: HashMap<u64, (bool, bool)> = HashMap::new();
        for t in &self.tables {
            for f in t {
                if let FdKind::Pipe { id, write_end } = f.kind {
                    let e = ends.entry(id).or_default();
                    if write_end {
                        e.1 = true;
                    } else {
                        e.0 = true;
                    }
                }
            }
        }
        let half: Vec<u64> = ends
            .iter()
            .filter(|(_, (r, w))| !(*r && *w))
            .map(|(id, _)| *id)
            .collect();
        if half.is_empty() {
            return Ok(());
        }
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Ok(());
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|x| x.parse::<i32>().ok()) else {
                continue;
            };
            if tree.contains(&pid) || pid == std::process::id() as i32 {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(link) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let link = link.to_string_lossy();
                if let Some(id) = half.iter().find(|id| link == format!("pipe:[{id}]")) {
                    let holder = self
                        .seen
                        .iter()
                        .find(|s| s.3 == *id)
                        .map_or(tree[0], |s| s.0);
                    return Err(CaptureError::Unsupported {
                        pid: holder,
                        what: format!("it shares pipe:[{id}] with process {pid}, which is outside the dumped tree (dump their common ancestor, or redirect the program's input/output to files)"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Saves a System V segment `pid` attaches at `start..end` (once).
    pub fn capture_sysv(&mut self, pid: i32, shmid: i32, start: u64, end: u64) -> Result<()> {
        if self.sysv.iter().any(|s| s.shmid == shmid) {
            return Ok(());
        }
        let table =
            std::fs::read_to_string("/proc/sysvipc/shm").map_err(|e| CaptureError::Proc {
                pid,
                file: "../sysvipc/shm".into(),
                source: e,
            })?;
        // Columns: key shmid perms(octal) size cpid lpid nattch uid gid cuid cgid ...
        let row: Vec<u64> = table
            .lines()
            .skip(1)
            .map(|l| {
                l.split_whitespace()
                    .take(11)
                    .enumerate()
                    .filter_map(|(i, x)| if i == 2 { u64::from_str_radix(x, 8).ok() } else { x.parse::<u64>().ok() })
                    .collect::<Vec<u64>>()
            })
            .find(|f| f.len() == 11 && f[1] == u64::from(shmid.unsigned_abs()))
            .ok_or_else(|| CaptureError::Unsupported { pid, what: format!("System V segment {shmid} is not listed in /proc/sysvipc/shm (another IPC namespace?)") })?;
        let (key, mode, size, uid, gid) = (row[0], row[2], row[3], row[7], row[8]);
        if end - start != size.div_ceil(4096) * 4096 {
            return Err(CaptureError::Unsupported { pid, what: format!("area {start:#x}-{end:#x} maps part of System V segment {shmid} ({size} bytes); stasis restores whole attachments only") });
        }
        let name = format!("map_files/{start:x}-{end:x}");
        let (_, extents) = read_sparse(pid, &name, &format!("System V segment {shmid}"))?;
        let to32 = |v: u64| u32::try_from(v).unwrap_or(0);
        self.sysv.push(SysvShm {
            key: i32::from_ne_bytes(to32(key).to_ne_bytes()),
            shmid,
            mode: to32(mode),
            uid: to32(uid),
            gid: to32(gid),
            data: Vec::new(),
            size,
            extents,
        });
        Ok(())
    }

    /// Saves the content of a deleted file or memfd that `pid` maps at
    /// `start..end` (once per inode), through `/proc/PID/map_files`.
    pub fn capture_mapped_ghost(&mut self, pid: i32, start: u64, end: u64) -> Result<()> {
        self.save_ghost(
            pid,
            &format!("map_files/{start:x}-{end:x}"),
            &format!("area {start:#x}-{end:#x} maps"),
        )
    }

    /// Saves the content of a deleted file or memfd open as `pid`'s `fd`
    /// (once per inode).
    fn capture_ghost(&mut self, pid: i32, fd: i32) -> Result<()> {
        self.save_ghost(pid, &format!("fd/{fd}"), &format!("fd {fd} is"))
    }

    /// Reads the file behind `/proc/PID/<name>` into the ghost table.
    fn save_ghost(&mut self, pid: i32, name: &str, what: &str) -> Result<()> {
        let path = proc::proc_path(pid, name);
        let meta = std::fs::metadata(&path).map_err(|e| CaptureError::from_proc(pid, name, e))?;
        if self.ghosts.contains_key(&meta.ino()) {
            return Ok(());
        }
        let (size, extents) =
            read_sparse(pid, name, &format!("{what} a deleted file or memfd that"))?;
        let f = std::fs::File::open(&path).map_err(|e| CaptureError::from_proc(pid, name, e))?;
        // SAFETY: F_GET_SEALS on a file we opened; -1 (not a memfd) means none.
        let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
        self.ghosts.insert(
            meta.ino(),
            GhostFile {
                id: meta.ino(),
                mode: meta.mode(),
                data: Vec::new(),
                seals: u32::try_from(seals).unwrap_or(0),
                size,
                extents,
            },
        );
        Ok(())
    }

    /// Copies the unread bytes of the pipe behind `pid`'s `fd` (once per pipe).
    fn capture_pipe(&mut self, pid: i32, fd: i32, flags: u32, ino: u64) -> Result<()> {
        if self.pipes.contains_key(&ino) {
            return Ok(());
        }
        let err = |what: &str, e: std::io::Error| CaptureError::Proc {
            pid,
            file: format!("fd/{fd} ({what})"),
            source: e,
        };
        // A read end of the same pipe.
        let read_end: OwnedFd =
            if flags & libc::O_ACCMODE.unsigned_abs() == libc::O_WRONLY.unsigned_abs() {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(proc::proc_path(pid, &format!("fd/{fd}")))
                    .map_err(|e| err("reopening the pipe for reading", e))?
                    .into()
            } else {
                let pfd = pidfd::pidfd_open(pid)?;
                pidfd::pidfd_getfd(&pfd, fd)?
            };
        // SAFETY: fcntl F_GETPIPE_SZ on a pipe fd we own.
        let cap = unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let cap = usize::try_from(cap)
            .map_err(|_| err("F_GETPIPE_SZ", std::io::Error::last_os_error()))?;
        if cap > PIPE_MAX {
            return Err(CaptureError::Unsupported { pid, what: format!("fd {fd} is a pipe of {cap} bytes; stasis can recreate pipes of at most {PIPE_MAX} bytes (fs.pipe-max-size)") });
        }
        let mut p = [0i32; 2];
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(err("pipe2", std::io::Error::last_os_error()));
        }
        // SAFETY: pipe2 returned two new fds that we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        // SAFETY: fcntl on our own pipe.
        unsafe {
            libc::fcntl(
                w.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                i32::try_from(cap).unwrap_or(65536),
            )
        };
        // SAFETY: tee between two pipe fds we own; it copies without consuming.
        let n = unsafe {
            libc::tee(
                read_end.as_raw_fd(),
                w.as_raw_fd(),
                cap,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let n = if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                0
            } else {
                return Err(err("tee", e));
            }
        } else {
            usize::try_from(n).unwrap_or(0)
        };
        let mut data = vec![0u8; n];
        let mut got = 0;
        while got < n {
            // SAFETY: reading into our buffer from our pipe.
            let k = unsafe { libc::read(r.as_raw_fd(), data[got..].as_mut_ptr().cast(), n - got) };
            if k <= 0 {
                return Err(err("reading pipe data", std::io::Error::last_os_error()));
            }
            got += usize::try_from(k).unwrap_or(0);
        }
        self.pipes.insert(
            ino,
            PipeImage {
                id: ino,
                capacity: u32::try_from(cap).unwrap_or(65536),
                data,
            },
        );
        Ok(())
    }
}

/// Reads the data of the file behind `/proc/PID/<name>`, extent by extent
/// (`SEEK_DATA`/`SEEK_HOLE`): holes are neither read nor saved, so a large
/// shared memory segment with little in use costs what it uses, and its
/// holes stay holes after a restore. At most [`GHOST_MAX`] bytes of data.
/// Returns the file's size and its extents.
fn read_sparse(pid: i32, name: &str, what: &str) -> Result<(u64, Vec<Extent>)> {
    use std::os::unix::fs::FileExt;
    let path = proc::proc_path(pid, name);
    let f = std::fs::File::open(&path).map_err(|e| CaptureError::from_proc(pid, name, e))?;
    let size = f
        .metadata()
        .map_err(|e| CaptureError::from_proc(pid, name, e))?
        .size();
    let ranges = crate::memory::data_extents(&f, 0, size)
        .map_err(|e| CaptureError::from_proc(pid, &format!("{name} (SEEK_DATA)"), e))?;
    let data: u64 = ranges.iter().map(|(a, b)| b - a).sum();
    if data > GHOST_MAX {
        return Err(CaptureError::Unsupported { pid, what: format!("{what} holds {data} bytes of data ({size} bytes in all); stasis saves up to {GHOST_MAX} bytes of such content") });
    }
    let mut extents = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        let mut buf = vec![0u8; usize::try_from(b - a).unwrap_or(0)];
        f.read_exact_at(&mut buf, a)
            .map_err(|e| CaptureError::from_proc(pid, name, e))?;
        extents.push(Extent {
            offset: a,
            data: buf,
        });
    }
    Ok((size, extents))
}

/// Saves an established TCP connection; leaves the socket in repair mode.
fn capture_tcp(
    b: BorrowedFd<'_>,
    info: &sock::TcpInfo,
) -> std::result::Result<TcpRepair, stasis_kernel::KernelError> {
    sock::set_int(b, libc::IPPROTO_TCP, sock::TCP_REPAIR, 1)?;
    let (outq, unsent) = sock::outq(b)?;
    let inq = sock::inq(b)?;
    sock::set_int(
        b,
        libc::IPPROTO_TCP,
        sock::TCP_REPAIR_QUEUE,
        sock::TCP_SEND_QUEUE,
    )?;
    let snd_seq = sock::get_int(b, libc::IPPROTO_TCP, sock::TCP_QUEUE_SEQ)?;
    let send_queue = sock::peek_repair_queue(b, outq as usize)?;
    sock::set_int(
        b,
        libc::IPPROTO_TCP,
        sock::TCP_REPAIR_QUEUE,
        sock::TCP_RECV_QUEUE,
    )?;
    let rcv_seq = sock::get_int(b, libc::IPPROTO_TCP, sock::TCP_QUEUE_SEQ)?;
    let recv_queue = sock::peek_repair_queue(b, inq as usize)?;
    let mss = sock::get_int(b, libc::IPPROTO_TCP, libc::TCP_MAXSEG)?;
    let timestamp = sock::get_int(b, libc::IPPROTO_TCP, sock::TCP_TIMESTAMP)?;
    let w = sock::get_bytes(b, libc::IPPROTO_TCP, sock::TCP_REPAIR_WINDOW, 20)?;
    let mut window = [0u32; 5];
    for (i, c) in w.chunks_exact(4).take(5).enumerate() {
        window[i] = u32::from_ne_bytes(c.try_into().unwrap_or([0; 4]));
    }
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

/// The watches of an inotify fd, each resolved to a path with
/// `open_by_handle_at` on the filesystem it lives on.
fn inotify_watches(
    pid: i32,
    fd: i32,
    info: &str,
) -> std::result::Result<Vec<InotifyWatch>, String> {
    let lines = proc::parse_inotify(info).map_err(|e| e.0)?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (wd, sdev, mask, ty, handle) in lines {
        // Kernel dev_t: major in the high 12 bits, minor in the low 20.
        let (major, minor) = (sdev >> 20, sdev & 0xfffff);
        let mount = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&format!("{major}:{minor}").as_str())).then(|| f.get(4).map(|m| m.to_string())).flatten()
            })
            .ok_or_else(|| format!("fd {fd}: inotify watch {wd} is on a filesystem ({major}:{minor}) that is not mounted here"))?;
        let mfd = std::fs::File::open(&mount)
            .map_err(|e| format!("fd {fd}: opening mount {mount}: {e}"))?;
        let mut fh = Vec::with_capacity(8 + handle.len());
        fh.extend_from_slice(&u32::try_from(handle.len()).unwrap_or(0).to_ne_bytes());
        fh.extend_from_slice(&ty.to_ne_bytes());
        fh.extend_from_slice(&handle);
        // SAFETY: open_by_handle_at reads a struct file_handle of the
        // declared size from `fh`; it returns a new fd or -1.
        let r = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mfd.as_raw_fd(),
                fh.as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        };
        if r < 0 {
            return Err(format!("fd {fd}: the file watched by inotify watch {wd} cannot be found again ({}); was it deleted?", std::io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor nothing else owns.
        let o = unsafe { OwnedFd::from_raw_fd(i32::try_from(r).unwrap_or(-1)) };
        let path = std::fs::read_link(format!("/proc/self/fd/{}", o.as_raw_fd()))
            .map_err(|e| e.to_string())?;
        let path = path.to_string_lossy().into_owned();
        if path.ends_with(" (deleted)") {
            return Err(format!("fd {fd}: inotify watch {wd} is on a deleted file"));
        }
        out.push(InotifyWatch { wd, path, mask });
    }
    out.sort_by_key(|w| w.wd);
    let _ = pid;
    Ok(out)
}
