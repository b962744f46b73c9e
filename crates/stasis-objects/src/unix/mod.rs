//! Unix sockets: listening, connected (a pair inside the tree, a peer
//! reached by name, or a half whose peer was closed) and unconnected, with
//! their names, options and queued messages (with the credentials each
//! carried). A connected pair is made with `socketpair` and each end
//! refilled through the other; named sockets are bound again, relative
//! names from the process's working directory.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, UnixSocket, UnixState};
use stasis_kernel::sock::unixq::{self, UnixMsg};
use stasis_kernel::{fdops, sock, sockdiag, KernelError};

pub(crate) mod name;
mod scm;

use name::{bind_unix, connect_unix, forget_name, socket_file, Place};
pub(crate) use scm::{in_flight, link as link_in_flight};

use crate::socket::{save_options, set_options};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// Largest socket queue stasis saves.
pub(crate) const QUEUE_MAX: usize = 256 << 20;

pub struct Unix;

impl Object for Unix {
    const NAME: &'static str = "unix socket";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        match &fd.socket {
            Some(s) if s.domain == libc::AF_UNIX => save(cx, fd, s).map(Some),
            _ => Ok(None),
        }
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Unix(_))
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Unix(u) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let s = restore(cx, img.fd, u)?;
        // Best effort, as sockets always had it.
        let _ = fdops::set_status_flags(s.as_fd(), crate::restore::setfl_flags(img.flags));
        Ok(s)
    }
}

/// Reads the queue of unix socket `b` without consuming it. Once per dump
/// and socket: a zero-length datagram peeked once is skipped by every
/// later peek at an offset (the kernel marks it peeked), so a second
/// reading would lose it. A seqpacket socket shut for reading says end of
/// file with an empty read once its queue is read.
fn peek_queue(
    b: BorrowedFd<'_>,
    sock_type: i32,
    info: &sockdiag::UnixInfo,
) -> Result<Vec<UnixMsg>, KernelError> {
    let eof_after = (sock_type == libc::SOCK_SEQPACKET
        && info.shutdown & stasis_sys::net::RCV_SHUTDOWN != 0)
        .then(|| usize::try_from(info.rqueue).unwrap_or(usize::MAX));
    unixq::peek_queue(b, QUEUE_MAX, eof_after)
}

/// The files in flight in the queue of unix socket `b` (inode `ino`), if it
/// has a queue: copies of them, the queue peeked at and kept for the save
/// of the socket (see [`peek_queue`]). Sockets in flight among them are
/// peeked at too, `depth` levels down. Errors are left for the save to
/// report with its context.
pub(crate) fn files_in_flight(cx: &mut SaveCtx, b: BorrowedFd<'_>, depth: u32) -> Vec<OwnedFd> {
    let mut out = Vec::new();
    let Some(ino) = crate::socket::inode_of(b) else {
        return out;
    };
    let unix =
        sock::get_int(b, libc::SOL_SOCKET, libc::SO_DOMAIN).is_ok_and(|d| d == libc::AF_UNIX);
    if !unix || cx.unix_queues.contains_key(&ino) || sock::inq(b).unwrap_or(0) == 0 {
        return out;
    }
    if cx.unix.is_none() {
        let Ok(all) = sockdiag::unix_sockets() else {
            return out;
        };
        cx.unix = Some(all);
    }
    let Some(info) = cx.unix.as_ref().and_then(|all| all.get(&ino)) else {
        return out;
    };
    if info.state == sockdiag::STATE_LISTEN {
        return out;
    }
    let Ok(ty) = sock::get_int(b, libc::SOL_SOCKET, libc::SO_TYPE) else {
        return out;
    };
    let Ok(queue) = peek_queue(b, ty, info) else {
        return out;
    };
    for f in queue.iter().flat_map(|m| &m.fds) {
        if let Ok(c) = f.try_clone() {
            if depth > 0 {
                out.extend(files_in_flight(cx, c.as_fd(), depth - 1));
            }
            out.push(c);
        }
    }
    cx.unix_queues.insert(ino, queue);
    out
}

fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>, s: &crate::save::SocketFd) -> Result<FdKind, SaveError> {
    let (b, n, ino) = (s.sock.as_fd(), fd.fd, fd.meta.ino());
    let options = save_options(b);
    if cx.unix.is_none() {
        cx.unix = Some(sockdiag::unix_sockets()?);
    }
    let all = cx.unix.as_ref().map_or_else(HashMap::new, Clone::clone);
    let info = all.get(&ino).ok_or_else(|| {
        fd.unsupported(format!(
            "fd {n}: unix socket {ino} is not listed by sock_diag"
        ))
    })?;
    let state = match info.state {
        sockdiag::STATE_LISTEN => UnixState::Listening {
            backlog: info.wqueue,
        },
        // A datagram socket others connected to is "established" too
        // (Linux 5.x+), with no peer of its own.
        sockdiag::STATE_ESTABLISHED if s.sock_type == libc::SOCK_DGRAM && info.peer.is_none() => {
            UnixState::Unconnected
        }
        sockdiag::STATE_ESTABLISHED => match info.peer.filter(|p| *p != 0 && all.contains_key(p)) {
            Some(peer) => UnixState::Connected {
                peer,
                peer_name: all.get(&peer).and_then(|p| p.name.clone()),
            },
            // The other end was closed (a socketpair half kept, as
            // Java NIO does): peer 0.
            None => UnixState::Connected {
                peer: 0,
                peer_name: None,
            },
        },
        _ => UnixState::Unconnected,
    };
    // A stream or seqpacket socket never connected (or whose connect
    // failed) has nothing queued, and recv on it fails (EINVAL, ENOTCONN).
    let never_connected = matches!(state, UnixState::Unconnected)
        && s.sock_type != libc::SOCK_DGRAM
        && info.rqueue == 0;
    let peeked = if matches!(state, UnixState::Listening { .. }) || never_connected {
        Vec::new()
    } else {
        // A seqpacket socket shut for reading says end of file with an
        // empty read once its queue is read.
        let peeked = match cx.unix_queues.remove(&ino) {
            Some(q) => Ok(q),
            None => peek_queue(b, s.sock_type, info),
        };
        peeked.map_err(|e| match e {
            KernelError::Unsupported { feature, why } => fd.unsupported(format!(
                "fd {n} is a unix socket whose queue holds {feature} ({why}), which stasis cannot checkpoint"
            )),
            e => e.into(),
        })?
    };
    let stream = s.sock_type == libc::SOCK_STREAM;
    let mut queue = Vec::new();
    let mut queue_creds = Vec::new();
    let mut queue_fds = Vec::new();
    for m in group_stream(peeked, stream) {
        queue.push(m.data);
        queue_creds.push(m.creds);
        queue_fds.push(scm::save(cx, fd, m.fds)?);
    }
    while queue_fds.last().is_some_and(Vec::is_empty) {
        queue_fds.pop();
    }
    let file = info.name.as_deref().and_then(|n| socket_file(fd.pid, n));
    Ok(FdKind::Unix(UnixSocket {
        ino,
        sock_type: s.sock_type,
        name: info.name.clone(),
        state,
        queue,
        queue_creds,
        options,
        file_owner: file.and_then(Result::ok),
        file_deleted: matches!(file, Some(Err(()))),
        queue_fds,
        shutdown: info.shutdown,
        pending: pending(fd, info, &all)?,
    }))
}

/// The clients of a listener's connections waiting to be accepted; those
/// are made again by connecting them at restore, which only works for a
/// client still open (in the tree: see [`check_external`]) that has sent
/// nothing yet (its bytes wait in a socket nobody can read but by
/// accepting it).
fn pending(
    fd: &OpenFd<'_>,
    info: &sockdiag::UnixInfo,
    all: &HashMap<u64, sockdiag::UnixInfo>,
) -> Result<Vec<u64>, SaveError> {
    if info.state != sockdiag::STATE_LISTEN || info.rqueue == 0 {
        return Ok(Vec::new());
    }
    let n = fd.fd;
    let refuse = |why: &str| {
        Err(fd.unsupported(format!(
            "fd {n} is a listening unix socket with {} connection(s) waiting to be accepted, {why}, which stasis cannot checkpoint yet (accept it first)",
            info.rqueue
        )))
    };
    if info.icons.len() != info.rqueue as usize {
        return refuse("not all of them listed by sock_diag");
    }
    for c in &info.icons {
        match all.get(c) {
            None => return refuse("one of them from a client closed since"),
            Some(ci) if ci.wqueue > 0 => {
                return refuse("one of them with data sent and not read yet")
            }
            Some(_) => {}
        }
    }
    Ok(info.icons.clone())
}

/// A byte stream's chunks joined into runs, each ending at a chunk that
/// carries fds (they go with it; credentials cannot be told apart per
/// byte: a run keeps its first chunk's); messages of other types as they
/// are.
fn group_stream(peeked: Vec<UnixMsg>, stream: bool) -> Vec<UnixMsg> {
    if !stream {
        return peeked;
    }
    let mut out: Vec<UnixMsg> = Vec::new();
    for m in peeked {
        match out.last_mut() {
            Some(last) if last.fds.is_empty() => {
                last.data.extend_from_slice(&m.data);
                last.fds = m.fds;
            }
            _ => out.push(m),
        }
    }
    out
}

/// Refuses unix sockets connected to a peer outside the tree (the peer
/// would lose its connection); datagram sockets connected to a named
/// socket outside (syslog's /dev/log, say) are reconnected by name.
pub fn check_external(cx: &SaveCtx) -> Result<(), SaveError> {
    let flying = in_flight(cx.tables.iter().flatten());
    let inos: HashSet<u64> = cx
        .tables
        .iter()
        .flatten()
        .chain(flying.iter().copied())
        .filter_map(|f| match &f.kind {
            FdKind::Unix(u) => Some(u.ino),
            _ => None,
        })
        .collect();
    for (i, t) in cx.tables.iter().enumerate() {
        for f in t {
            let FdKind::Unix(u) = &f.kind else { continue };
            let UnixState::Connected { peer, peer_name } = &u.state else {
                continue;
            };
            let by_name = u.sock_type == libc::SOCK_DGRAM && peer_name.is_some();
            if *peer != 0 && !inos.contains(peer) && !by_name {
                return Err(SaveError::Unsupported { pid: cx.pid_of_table(i), what: format!("fd {} is a unix socket connected to a process outside the dumped tree (dump their common ancestor)", f.fd) });
            }
        }
    }
    for (i, t) in cx.tables.iter().enumerate() {
        for f in t {
            let FdKind::Unix(u) = &f.kind else { continue };
            if u.pending.iter().any(|c| !inos.contains(c)) {
                return Err(SaveError::Unsupported { pid: cx.pid_of_table(i), what: format!("fd {} is a listening unix socket with a connection waiting to be accepted from a process outside the dumped tree (dump their common ancestor)", f.fd) });
            }
        }
    }
    for f in flying {
        if let FdKind::Unix(UnixSocket {
            state: UnixState::Connected { peer, .. },
            ..
        }) = &f.kind
        {
            if *peer != 0 && !inos.contains(peer) {
                return Err(SaveError::Unsupported { pid: cx.pid_of_table(0), what: "a unix socket in flight (SCM_RIGHTS) is connected to a process outside the dumped tree (dump their common ancestor)".into() });
            }
        }
    }
    Ok(())
}

fn sock_err(fd: i32, w: &str) -> impl FnOnce(std::io::Error) -> RestoreError {
    let what = format!("{w} (unix socket of fd {fd})");
    move |source| RestoreError::Socket { what, source }
}

/// A new unix socket of `u`'s type with its options.
fn new_socket(u: &UnixSocket) -> Result<OwnedFd, RestoreError> {
    let s = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
    set_options(&s, &u.options);
    Ok(s)
}

/// The name of `u`, if it has one.
fn name_of(u: &UnixSocket) -> Option<&[u8]> {
    u.name.as_deref().filter(|n| !n.is_empty())
}

fn restore(cx: &mut RestoreCtx<'_>, fd: i32, u: &UnixSocket) -> Result<OwnedFd, RestoreError> {
    if let Some(s) = cx.pending_sockets.remove(&u.ino) {
        return Ok(s);
    }
    let waiting_on = cx
        .unix_images
        .values()
        .copied()
        .find(|l| l.pending.contains(&u.ino));
    if let Some(l) = waiting_on {
        // A connection waiting on a listener: made with the listener.
        return client(cx, fd, u, l);
    }
    let cwd = cx.place();
    let s = match &u.state {
        UnixState::Listening { backlog } => listener(cx, fd, u, *backlog)?,
        UnixState::Connected { peer, .. } if *peer == u.ino => self_connected(cx, fd, u, &cwd)?,
        UnixState::Connected { peer, .. } if cx.unix_images.contains_key(peer) => {
            let peer_img = cx.unix_images[peer];
            if one_way(u, peer_img) {
                return client(cx, fd, u, peer_img);
            }
            let (a, b) = pair(cx, fd, u, peer_img)?;
            cx.pending_sockets.insert(*peer, b);
            a
        }
        UnixState::Connected {
            peer_name: Some(n), ..
        } => {
            let s = new_socket(u)?;
            give_name(fd, &s, u, &cwd)?;
            connect_unix(&s, n, &cwd).map_err(sock_err(fd, "reconnecting to its peer by name"))?;
            shut(fd, &s, u)?;
            s
        }
        UnixState::Connected { peer: 0, .. } => {
            // Its peer was closed: a pair whose other end goes away once
            // it has delivered what was queued.
            let (a, b) = sock::unix_pair(u.sock_type)?;
            set_options(&a, &u.options);
            refill(cx, &b, u)?;
            drop(b);
            shut(fd, &a, u)?;
            a
        }
        UnixState::Connected { .. } => {
            return Err(RestoreError::Inconsistent(format!(
                "fd {fd}: unix socket {} is connected to a socket missing from the image",
                u.ino
            )))
        }
        UnixState::Unconnected => unconnected(cx, fd, u, &cwd)?,
    };
    Ok(s)
}

/// Both ends of a pair inside the tree, named and refilled: (`u`'s end,
/// its peer's).
fn pair(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    peer_img: &UnixSocket,
) -> Result<(OwnedFd, OwnedFd), RestoreError> {
    let cwd = &cx.place();
    let (a, b) = sock::unix_pair(u.sock_type)?;
    set_options(&a, &u.options);
    set_options(&b, &peer_img.options);
    for (s, img) in [(&a, u), (&b, peer_img)] {
        if let Err(e) = give_name(fd, s, img, cwd) {
            tracing::warn!(fd, "could not give a unix socket back its name: {e}");
        }
    }
    // What each end had queued arrives by its peer.
    for (from, img) in [(&b, u), (&a, peer_img)] {
        refill(cx, from, img)?;
    }
    shut(fd, &a, u)?;
    shut(fd, &b, peer_img)?;
    Ok((a, b))
}

/// An unconnected socket, bound to its name; a datagram socket's queue is
/// refilled by a throw-away socket connected to it, and the datagram
/// sockets of the image connected to it one way are connected again (they
/// wait in `pending_sockets`) before a name the program had unlinked goes.
fn unconnected(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    cwd: &Place,
) -> Result<OwnedFd, RestoreError> {
    let s = new_socket(u)?;
    if let Some(n) = name_of(u) {
        while_bound(fd, &s, u, n, cwd, || connect_clients(cx, fd, u, n, cwd))?;
    }
    shut(fd, &s, u)?;
    Ok(s)
}

/// While `u` has its name `n`: refills its queue through a throw-away
/// socket, and connects again the datagram sockets of the image that were
/// connected to it one way (they wait in `pending_sockets`).
fn connect_clients(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    n: &[u8],
    cwd: &Place,
) -> Result<(), RestoreError> {
    refill_by_name(cx, fd, u, n, cwd)?;
    let clients: Vec<&UnixSocket> = cx
        .unix_images
        .values()
        .copied()
        .filter(|c| {
            matches!(c.state, UnixState::Connected { peer, .. } if peer == u.ino)
                && one_way(c, u)
                && !cx.pending_sockets.contains_key(&c.ino)
        })
        .collect();
    for c in clients {
        let cs = new_socket(c)?;
        named_and_refilled(cx, fd, &cs, c, cwd)?;
        connect_unix(&cs, n, cwd).map_err(sock_err(fd, "connecting a client to it"))?;
        shut(fd, &cs, c)?;
        cx.pending_sockets.insert(c.ino, cs);
    }
    Ok(())
}

/// A listener, bound to its name, with the connections that were waiting
/// to be accepted made again by connecting their clients (they wait in
/// `pending_sockets`) before a name the program had unlinked goes.
fn listener(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    backlog: u32,
) -> Result<OwnedFd, RestoreError> {
    let cwd = cx.place();
    let s = new_socket(u)?;
    let name = u.name.as_deref().unwrap_or_default();
    while_bound(fd, &s, u, name, &cwd, || {
        fdops::listen(s.as_fd(), i32::try_from(backlog).unwrap_or(128))
            .map_err(sock_err(fd, "listening"))?;
        connect_waiting(cx, fd, u, name, &cwd)
    })?;
    // Its other clients are accepted connections, restored as pairs:
    // nothing connects to the name again.
    Ok(s)
}

/// Connects again the clients whose connections waited on listener `u`
/// (named `name`); they wait in `pending_sockets`.
fn connect_waiting(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    name: &[u8],
    cwd: &Place,
) -> Result<(), RestoreError> {
    for c in &u.pending {
        let img = cx.unix_images.get(c).copied().ok_or_else(|| {
            RestoreError::Inconsistent(format!(
                "fd {fd}: a connection waiting on unix socket {} comes from socket {c}, missing from the image",
                u.ino
            ))
        })?;
        let cs = new_socket(img)?;
        give_name(fd, &cs, img, cwd)?;
        connect_unix(&cs, name, cwd).map_err(sock_err(fd, "connecting a waiting client"))?;
        shut(fd, &cs, img)?;
        cx.pending_sockets.insert(img.ino, cs);
    }
    Ok(())
}

/// A datagram socket connected to itself (by its own name), its queue sent
/// by itself.
fn self_connected(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    cwd: &Place,
) -> Result<OwnedFd, RestoreError> {
    let s = new_socket(u)?;
    let n = name_of(u).ok_or_else(|| {
        RestoreError::Inconsistent(format!(
            "fd {fd}: unix socket {} is connected to itself without a name",
            u.ino
        ))
    })?;
    while_bound(fd, &s, u, n, cwd, || {
        connect_unix(&s, n, cwd).map_err(sock_err(fd, "connecting it to itself"))?;
        refill(cx, &s, u)
    })?;
    shut(fd, &s, u)?;
    Ok(s)
}

/// Whether datagram socket `u` is connected to `peer` one way (many may
/// send to one socket that is connected to none of them).
fn one_way(u: &UnixSocket, peer: &UnixSocket) -> bool {
    u.sock_type == libc::SOCK_DGRAM
        && !matches!(peer.state, UnixState::Connected { peer: p, .. } if p == u.ino)
}

/// A datagram socket connected one way to `server`, or a connection
/// waiting on listener `server`: made when the server is (with all its
/// clients, [`unconnected`], [`listener`]).
fn client(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    u: &UnixSocket,
    server: &UnixSocket,
) -> Result<OwnedFd, RestoreError> {
    if !cx.pending_sockets.contains_key(&u.ino) {
        let s = restore(cx, fd, server)?;
        cx.pending_sockets.insert(server.ino, s);
    }
    cx.pending_sockets.remove(&u.ino).ok_or_else(|| {
        RestoreError::Inconsistent(format!(
            "fd {fd}: unix socket {} is connected to socket {}, which is neither unconnected nor connected back",
            u.ino, server.ino
        ))
    })
}

/// A datagram socket not yet connected, bound to `img`'s name and given
/// its queue by a throw-away socket connected to that name (what a server
/// sent it by name; a socket without a name cannot have been sent any).
fn named_and_refilled(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    s: &OwnedFd,
    img: &UnixSocket,
    cwd: &Place,
) -> Result<(), RestoreError> {
    let Some(n) = name_of(img) else {
        if img.queue.is_empty() {
            return Ok(());
        }
        return Err(RestoreError::Inconsistent(format!(
            "fd {fd}: unix socket {} has messages queued but no name they could have been sent to",
            img.ino
        )));
    };
    while_bound(fd, s, img, n, cwd, || refill_by_name(cx, fd, img, n, cwd))
}

/// Binds `s` to `img`'s name, if it has one; a name the program had
/// unlinked (or whose directory is gone) is unlinked again at once.
fn give_name(fd: i32, s: &OwnedFd, img: &UnixSocket, cwd: &Place) -> Result<(), RestoreError> {
    let Some(n) = name_of(img) else {
        return Ok(());
    };
    while_bound(fd, s, img, n, cwd, || Ok(()))
}

/// Binds `s` to `img`'s name `n`, runs `while_named` (others connect to
/// the name meanwhile), then takes the name away again if the program had
/// unlinked it, or if the bind had to make its directory or move another
/// file aside.
fn while_bound<T>(
    fd: i32,
    s: &OwnedFd,
    img: &UnixSocket,
    n: &[u8],
    cwd: &Place,
    while_named: impl FnOnce() -> Result<T, RestoreError>,
) -> Result<T, RestoreError> {
    let dirs =
        bind_unix(s, n, cwd, img.file_owner, img.file_deleted).map_err(sock_err(fd, "binding"))?;
    let r = while_named()?;
    if img.file_deleted || dirs.made() {
        forget_name(n, cwd, dirs).map_err(sock_err(fd, "unlinking its socket file"))?;
    }
    Ok(r)
}

/// Refills `img`'s queue (if it had one) through a throw-away socket
/// connected to its name `n`.
fn refill_by_name(
    cx: &mut RestoreCtx<'_>,
    fd: i32,
    img: &UnixSocket,
    n: &[u8],
    cwd: &Place,
) -> Result<(), RestoreError> {
    if img.queue.is_empty() {
        return Ok(());
    }
    let tmp = sock::socket(libc::AF_UNIX, img.sock_type, 0)?;
    connect_unix(&tmp, n, cwd).map_err(sock_err(fd, "refilling"))?;
    refill(cx, &tmp, img)
}

/// Sends what `img` had queued (to read) through `from`, its peer, each
/// message with the credentials and the files in flight it carried.
fn refill(cx: &mut RestoreCtx<'_>, from: &OwnedFd, img: &UnixSocket) -> Result<(), RestoreError> {
    for (i, m) in img.queue.iter().enumerate() {
        let creds = img.queue_creds.get(i).copied().flatten();
        let files = match img.queue_fds.get(i) {
            Some(f) if !f.is_empty() => scm::make(cx, f)?,
            _ => Vec::new(),
        };
        match creds {
            _ if !files.is_empty() => {
                unixq::send_msg(from.as_fd(), m, creds, &scm::borrowed(&files))?;
            }
            Some(c) => sock::send_with_creds(from.as_fd(), m, c)?,
            None if m.is_empty() => sock::send_empty(from.as_fd())?,
            None => sock::send_all(from.as_fd(), m)?,
        }
    }
    Ok(())
}

/// Shuts `s` down as it was at dump (after its queue and its peer's were
/// refilled: a shut socket takes no more).
fn shut(fd: i32, s: &OwnedFd, img: &UnixSocket) -> Result<(), RestoreError> {
    use nix::sys::socket::Shutdown;
    use stasis_sys::net::{RCV_SHUTDOWN, SEND_SHUTDOWN};
    let how = match (
        img.shutdown & RCV_SHUTDOWN != 0,
        img.shutdown & SEND_SHUTDOWN != 0,
    ) {
        (false, false) => return Ok(()),
        (true, false) => Shutdown::Read,
        (false, true) => Shutdown::Write,
        (true, true) => Shutdown::Both,
    };
    nix::sys::socket::shutdown(std::os::fd::AsRawFd::as_raw_fd(s), how)
        .map_err(|e| sock_err(fd, "shutting it down")(e.into()))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use stasis_image::manifest::FdImage;

    use super::*;

    fn sock(ino: u64, ty: i32, name: Option<&str>, state: UnixState) -> UnixSocket {
        UnixSocket {
            ino,
            sock_type: ty,
            name: name.map(|n| n.as_bytes().to_vec()),
            state,
            queue: vec![],
            queue_creds: vec![],
            options: vec![],
            file_owner: None,
            file_deleted: false,
            queue_fds: vec![],
            shutdown: 0,
            pending: vec![],
        }
    }

    fn img(fd: i32, kind: FdKind) -> FdImage {
        FdImage {
            fd,
            flags: 0,
            cloexec: false,
            kind,
            shared_id: None,
            locks: vec![],
            owner: None,
        }
    }

    fn scratch(what: &str) -> String {
        let d = format!("/tmp/stasis-unix-test-{what}-{}", std::process::id());
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn restore_all(fds: &[FdImage]) -> Vec<OwnedFd> {
        let mut cx = RestoreCtx::new(&[], &[], fds.iter());
        cx.set_cwd("/");
        fds.iter()
            .map(|f| Unix::restore(&mut cx, f).unwrap())
            .collect()
    }

    fn connected(peer: u64) -> UnixState {
        UnixState::Connected {
            peer,
            peer_name: None,
        }
    }

    #[test]
    fn a_waiting_connection_comes_back_whichever_end_is_made_first() {
        let d = scratch("listen");
        let name = format!("{d}/l.sock");
        let mut l = sock(
            1,
            libc::SOCK_STREAM,
            Some(&name),
            UnixState::Listening { backlog: 4 },
        );
        l.pending = vec![2];
        l.file_deleted = true;
        let c = sock(2, libc::SOCK_STREAM, None, connected(0));
        // The client's fd comes first.
        let fds = [img(3, FdKind::Unix(c)), img(4, FdKind::Unix(l))];
        let made = restore_all(&fds);
        let a = nix::sys::socket::accept(made[1].as_raw_fd()).expect("a connection waits");
        nix::unistd::write(&made[0], b"hi").unwrap();
        let mut buf = [0u8; 2];
        nix::unistd::read(a, &mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        assert!(!std::path::Path::new(&name).exists(), "name unlinked again");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dgram_clients_reach_their_server_bound_in_a_directory_gone_since() {
        let d = scratch("dgram");
        let name = format!("{d}/gone/s.sock");
        let mut s = sock(1, libc::SOCK_DGRAM, Some(&name), UnixState::Unconnected);
        s.file_deleted = true;
        let c1 = sock(2, libc::SOCK_DGRAM, None, connected(1));
        let mut c2 = sock(
            3,
            libc::SOCK_DGRAM,
            Some(&format!("{d}/c2.sock")),
            connected(1),
        );
        // What the server had sent it by name.
        c2.queue = vec![b"to c2".to_vec()];
        c2.file_deleted = true;
        let fds = [
            img(3, FdKind::Unix(c1)),
            img(4, FdKind::Unix(s)),
            img(5, FdKind::Unix(c2)),
        ];
        let made = restore_all(&fds);
        for (c, m) in [(&made[0], b"1"), (&made[2], b"2")] {
            nix::unistd::write(c, m).unwrap();
            let mut buf = [0u8; 1];
            nix::unistd::read(made[1].as_raw_fd(), &mut buf).unwrap();
            assert_eq!(&buf, m);
        }
        let mut buf = [0u8; 8];
        let n = nix::unistd::read(made[2].as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"to c2");
        assert!(!std::path::Path::new(&format!("{d}/c2.sock")).exists());
        // The socket keeps its name; the directory made for it went again.
        let a: nix::sys::socket::UnixAddr =
            nix::sys::socket::getsockname(made[1].as_raw_fd()).unwrap();
        assert_eq!(a.path(), Some(std::path::Path::new(&name)));
        assert!(!std::path::Path::new(&format!("{d}/gone")).exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_in_flight_and_shutdown_are_made_again() {
        let mut a = sock(1, libc::SOCK_SEQPACKET, None, connected(2));
        a.queue = vec![b"m".to_vec(), b"n".to_vec()];
        a.queue_fds = vec![vec![img(
            -1,
            FdKind::Eventfd {
                count: 5,
                semaphore: false,
            },
        )]];
        let mut b = sock(2, libc::SOCK_SEQPACKET, None, connected(1));
        b.shutdown = stasis_sys::net::SEND_SHUTDOWN;
        let fds = [img(3, FdKind::Unix(a)), img(4, FdKind::Unix(b))];
        let made = restore_all(&fds);
        let q = unixq::peek_queue(made[0].as_fd(), 1 << 20, Some(2)).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].data, b"m");
        assert_eq!(q[0].fds.len(), 1);
        assert!(q[1].data == b"n" && q[1].fds.is_empty());
        let mut v = [0u8; 8];
        nix::unistd::read(q[0].fds[0].as_raw_fd(), &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), 5);
        // b was shut for sending: a reads end of file after its queue.
        let info = sockdiag::unix_sockets().unwrap();
        let ino = |f: &OwnedFd| {
            std::fs::metadata(format!("/proc/self/fd/{}", f.as_raw_fd()))
                .unwrap()
                .ino()
        };
        assert_eq!(
            info[&ino(&made[1])].shutdown,
            stasis_sys::net::SEND_SHUTDOWN
        );
        assert_eq!(info[&ino(&made[0])].shutdown, stasis_sys::net::RCV_SHUTDOWN);
    }

    #[test]
    fn stream_chunks_end_at_the_ones_carrying_fds() {
        let m = |d: &[u8], n: usize| UnixMsg {
            data: d.to_vec(),
            creds: None,
            fds: (0..n)
                .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
                .collect(),
        };
        let peeked = vec![
            m(b"ab", 0),
            m(b"cd", 1),
            m(b"ef", 0),
            m(b"gh", 2),
            m(b"ij", 0),
        ];
        let g = group_stream(peeked, true);
        let got: Vec<(&[u8], usize)> = g.iter().map(|m| (&m.data[..], m.fds.len())).collect();
        assert_eq!(
            got,
            vec![(&b"abcd"[..], 1), (&b"efgh"[..], 2), (&b"ij"[..], 0)]
        );
        let dgrams = group_stream(vec![m(b"a", 0), m(b"b", 0)], false);
        assert_eq!(dgrams.len(), 2);
    }
}
