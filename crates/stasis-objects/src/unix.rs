//! Unix sockets: listening, connected (a pair inside the tree, a peer
//! reached by name, or a half whose peer was closed) and unconnected, with
//! their names, options and queued messages (with the credentials each
//! carried). A connected pair is made with `socketpair` and each end
//! refilled through the other; named sockets are bound again, relative
//! names from the process's working directory.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, UnixSocket, UnixState};
use stasis_kernel::{fdops, sock, sockdiag, KernelError};

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
        sockdiag::STATE_LISTEN => {
            if info.rqueue > 0 {
                return Err(fd.unsupported(format!("fd {n} is a listening unix socket with {} connection(s) waiting to be accepted", info.rqueue)));
            }
            UnixState::Listening {
                backlog: info.wqueue,
            }
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
        sock::peek_queue(b, QUEUE_MAX).map_err(|e| match e {
            KernelError::Unsupported { .. } => fd.unsupported(format!("fd {n} is a unix socket with file descriptors in flight in its queue (SCM_RIGHTS), which stasis cannot checkpoint yet")),
            e => e.into(),
        })?
    };
    let (mut queue, mut queue_creds): (Vec<Vec<u8>>, Vec<_>) = peeked.into_iter().unzip();
    let file = info.name.as_deref().and_then(|n| socket_file(fd.pid, n));
    if s.sock_type == libc::SOCK_STREAM && queue.len() > 1 {
        // A byte stream: one chunk (credentials cannot be told
        // apart per byte; the first message's are kept).
        queue = vec![queue.concat()];
        queue_creds.truncate(1);
    }
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
    }))
}

/// Owner, group and mode of the socket file of path name `name`, as the
/// process `pid` sees it (a relative name from its working directory);
/// `Err` if there is no file there any more, `None` for an abstract name
/// or another kind of file.
fn socket_file(pid: i32, name: &[u8]) -> Option<Result<(u32, u32, u32), ()>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let (&first, _) = name.split_first()?;
    if first == 0 {
        return None;
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let name = std::ffi::OsStr::from_bytes(&name[..end]);
    let mut path = std::path::PathBuf::from(format!(
        "/proc/{pid}/{}",
        if first == b'/' { "root" } else { "cwd" }
    ));
    path.push(
        std::path::Path::new(name)
            .strip_prefix("/")
            .unwrap_or(name.as_ref()),
    );
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Err(())),
        Err(_) => return None,
    };
    m.file_type()
        .is_socket()
        .then(|| Ok((m.uid(), m.gid(), m.mode() & 0o7777)))
}

/// Refuses unix sockets connected to a peer outside the tree (the peer
/// would lose its connection); datagram sockets connected to a named
/// socket outside (syslog's /dev/log, say) are reconnected by name.
pub fn check_external(cx: &SaveCtx) -> Result<(), SaveError> {
    let inos: HashSet<u64> = cx
        .tables
        .iter()
        .flatten()
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
    let cwd = cx.cwd.clone();
    let s = match &u.state {
        UnixState::Listening { backlog } => {
            let s = new_socket(u)?;
            let name = u.name.as_deref().unwrap_or_default();
            bind_unix(&s, name, &cwd, u.file_owner).map_err(sock_err(fd, "binding"))?;
            fdops::listen(s.as_fd(), i32::try_from(*backlog).unwrap_or(128))
                .map_err(sock_err(fd, "listening"))?;
            if u.file_deleted {
                // Its clients are accepted connections, restored as pairs:
                // nothing connects to the name again.
                unlink_name(name, &cwd).map_err(sock_err(fd, "unlinking its socket file"))?;
            }
            s
        }
        UnixState::Connected { peer, .. } if cx.unix_images.contains_key(peer) => {
            let peer_img = cx.unix_images[peer];
            let (a, b) = pair(fd, u, peer_img, &cwd)?;
            cx.pending_sockets.insert(*peer, b);
            a
        }
        UnixState::Connected {
            peer_name: Some(n), ..
        } => {
            let s = new_socket(u)?;
            if let Some(own) = name_of(u) {
                bind_unix(&s, own, &cwd, u.file_owner).map_err(sock_err(fd, "binding"))?;
            }
            connect_unix(&s, n, &cwd).map_err(sock_err(fd, "reconnecting to its peer by name"))?;
            s
        }
        UnixState::Connected { peer: 0, .. } => {
            // Its peer was closed: a pair whose other end goes away once
            // it has delivered what was queued.
            let (a, b) = sock::unix_pair(u.sock_type)?;
            set_options(&a, &u.options);
            refill(&b, u)?;
            drop(b);
            a
        }
        UnixState::Connected { .. } => {
            return Err(RestoreError::Inconsistent(format!(
                "fd {fd}: unix socket {} is connected to a socket missing from the image",
                u.ino
            )))
        }
        UnixState::Unconnected => unconnected(fd, u, &cwd)?,
    };
    Ok(s)
}

/// Both ends of a pair inside the tree, named and refilled: (`u`'s end,
/// its peer's).
fn pair(
    fd: i32,
    u: &UnixSocket,
    peer_img: &UnixSocket,
    cwd: &str,
) -> Result<(OwnedFd, OwnedFd), RestoreError> {
    let (a, b) = sock::unix_pair(u.sock_type)?;
    set_options(&a, &u.options);
    set_options(&b, &peer_img.options);
    for (s, img) in [(&a, u), (&b, peer_img)] {
        if let Some(n) = name_of(img) {
            if let Err(e) = bind_unix(s, n, cwd, img.file_owner) {
                tracing::warn!(fd, "could not give a unix socket back its name: {e}");
            } else if img.file_deleted {
                unlink_name(n, cwd).map_err(sock_err(fd, "unlinking its socket file"))?;
            }
        }
    }
    // What each end had queued arrives by its peer.
    for (from, img) in [(&b, u), (&a, peer_img)] {
        refill(from, img)?;
    }
    Ok((a, b))
}

/// An unconnected socket, bound to its name; a datagram socket's queue is
/// refilled by a throw-away socket connected to it.
fn unconnected(fd: i32, u: &UnixSocket, cwd: &str) -> Result<OwnedFd, RestoreError> {
    let s = new_socket(u)?;
    if let Some(n) = name_of(u) {
        bind_unix(&s, n, cwd, u.file_owner).map_err(sock_err(fd, "binding"))?;
        if !u.queue.is_empty() {
            let tmp = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
            connect_unix(&tmp, n, cwd).map_err(sock_err(fd, "refilling"))?;
            refill(&tmp, u)?;
        }
    }
    Ok(s)
}

/// Sends what `img` had queued (to read) through `from`, its peer, each
/// message with the credentials it carried.
fn refill(from: &OwnedFd, img: &UnixSocket) -> Result<(), RestoreError> {
    for (i, m) in img.queue.iter().enumerate() {
        match img.queue_creds.get(i).copied().flatten() {
            Some(c) => sock::send_with_creds(from.as_fd(), m, c)?,
            None if m.is_empty() => sock::send_empty(from.as_fd())?,
            None => sock::send_all(from.as_fd(), m)?,
        }
    }
    Ok(())
}

fn sockaddr_un(name: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(2 + name.len());
    a.extend_from_slice(&u16::try_from(libc::AF_UNIX).unwrap_or(1).to_ne_bytes());
    a.extend_from_slice(name);
    a
}

/// Runs `f` with `name` resolvable: a relative path name is used from
/// `cwd` (the process's working directory), in a thread with its own
/// working directory (`unshare(CLONE_FS)`), so the socket keeps the very
/// name the process gave it.
fn at_cwd<T>(
    name: &[u8],
    cwd: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T>
where
    T: Send,
{
    let relative = matches!(name.first(), Some(&c) if c != 0 && c != b'/');
    if !relative || cwd.is_empty() {
        return f();
    }
    std::thread::scope(|sc| {
        sc.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
            nix::unistd::chdir(cwd)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("socket thread panicked")))
    })
}

/// Binds a unix socket; a stale socket file left at the path by the dumped
/// process is removed first, and the new one gets the owner and mode the
/// file had at dump (`owner`), or else the stale one's (made by the
/// restorer, it would be root's: another user's process could no longer
/// connect to it).
fn bind_unix(
    s: &OwnedFd,
    name: &[u8],
    cwd: &str,
    owner: Option<(u32, u32, u32)>,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    at_cwd(name, cwd, || {
        let path = match name.first() {
            Some(&first) if first != 0 => {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
                    &name[..end],
                )))
            }
            _ => None,
        };
        let stale = path.as_ref().and_then(|p| {
            std::fs::symlink_metadata(p)
                .ok()
                .filter(|m| m.file_type().is_socket())
                .map(|m| (p, m))
        });
        if let Some((p, _)) = &stale {
            std::fs::remove_file(p)?;
        }
        sock::bind(s.as_fd(), &sockaddr_un(name))?;
        let owner = owner.or_else(|| {
            stale
                .as_ref()
                .map(|(_, m)| (m.uid(), m.gid(), m.mode() & 0o7777))
        });
        if let (Some(p), Some((uid, gid, mode))) = (&path, owner) {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    })
}

/// Removes the socket file of path name `name` (the program had unlinked it).
fn unlink_name(name: &[u8], cwd: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    if end == 0 {
        return Ok(());
    }
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&name[..end]));
    at_cwd(name, cwd, || std::fs::remove_file(&path))
}

fn connect_unix(s: &OwnedFd, name: &[u8], cwd: &str) -> std::io::Result<()> {
    at_cwd(name, cwd, || sock::connect(s.as_fd(), &sockaddr_un(name)))
}
