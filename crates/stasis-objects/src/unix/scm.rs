//! File descriptors in flight in a unix socket's queue (`SCM_RIGHTS`).
//!
//! Save: peeking at the queue ([`stasis_kernel::sock::unixq`]) gives this
//! process a copy of every fd in flight, the queue left as it was. Each is
//! an ordinary open file, saved by its kind through `/proc/self/fd/N`
//! (a pipe, a file, another unix socket...) into the image of its message.
//! Restore: each message is sent again by the socket's peer with the files
//! made anew attached, in order, one `sendmsg` per message.
//!
//! An epoll in flight keeps its registrations: they name fds of the
//! socket's holder (see [`crate::epoll`]).
//!
//! Refused by name: a description in flight that is also open in a process
//! of the tree (except a pipe end, whose pipe is one object either way:
//! sharing of the description itself, its offset or flags, would be lost),
//! and kinds that only mean something inside a process (inotify,
//! terminals, TCP/UDP sockets).

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind};
use stasis_kernel::{fdops, pidfd};

use crate::restore::FdRef;
use crate::{OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// How deep sockets in flight may carry sockets in flight.
const MAX_NESTING: u32 = 4;

thread_local! {
    /// Sockets in flight being saved inside one another just now.
    static NESTING: Cell<u32> = const { Cell::new(0) };
}

/// Saves the files in flight of one queued message of `fd`'s socket.
pub(super) fn save(
    cx: &mut SaveCtx,
    fd: &OpenFd<'_>,
    fds: Vec<OwnedFd>,
) -> Result<Vec<FdImage>, SaveError> {
    if fds.is_empty() {
        return Ok(Vec::new());
    }
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let pfd = pidfd::pidfd_open(me)?;
    let mut out = Vec::with_capacity(fds.len());
    for f in fds {
        // Sent before (in this message, another one, another queue): the
        // same description, made once at restore.
        if let Some(img) = sent_before(cx, me, &f) {
            out.push(img);
            continue;
        }
        let raw = f.as_raw_fd();
        let (img, _) = NESTING.with(|d| {
            if d.get() >= MAX_NESTING {
                return Err(fd.unsupported(format!("fd {}: unix sockets in flight carry unix sockets in flight {MAX_NESTING} deep (a socket sent into its own queue?), which stasis cannot checkpoint", fd.fd)));
            }
            d.set(d.get() + 1);
            // An epoll in flight names fds of the socket's holder (for
            // one nested in a socket in flight: of the outermost's).
            let outer = cx.epoll_registrar;
            cx.epoll_registrar = Some(outer.unwrap_or(fd.pid));
            let r = cx.save_fd(&pfd, me, raw);
            cx.epoll_registrar = outer;
            d.set(d.get() - 1);
            r
        })?;
        check_kind(fd, &img)?;
        let mut img = FdImage {
            fd: -1,
            shared_id: None,
            ..img
        };
        if !matches!(img.kind, FdKind::Pipe { .. }) {
            if let Some((p, n)) = twin(cx, fd.pid, &f) {
                return Err(fd.unsupported(format!("fd {}: a unix socket's queue carries a file descriptor (SCM_RIGHTS) whose open file is also fd {n} of process {p}, which stasis cannot checkpoint yet", fd.fd)));
            }
            img.shared_id = Some(cx.new_shared_id());
            cx.in_flight.push((f, img.clone()));
        }
        out.push(img);
    }
    Ok(out)
}

/// The image of a file in flight saved before that `f` (a copy in this
/// process) is the same open file as, if any.
fn sent_before(cx: &SaveCtx, me: i32, f: &OwnedFd) -> Option<FdImage> {
    let m = std::fs::metadata(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()?;
    cx.in_flight.iter().find_map(|(g, img)| {
        let gm = std::fs::metadata(format!("/proc/self/fd/{}", g.as_raw_fd())).ok()?;
        (gm.dev() == m.dev()
            && gm.ino() == m.ino()
            && fdops::kcmp_same_file(me, f.as_raw_fd(), me, g.as_raw_fd()))
        .then(|| img.clone())
    })
}

/// Refuses the kinds that cannot travel as an image of their own.
fn check_kind(fd: &OpenFd<'_>, img: &FdImage) -> Result<(), SaveError> {
    let what = match &img.kind {
        FdKind::Inotify { .. } => "an inotify",
        FdKind::Fanotify { .. } => "a fanotify group",
        FdKind::PtyMaster(_) | FdKind::PtySlave { .. } | FdKind::PtyHungUp { .. } => "a terminal",
        FdKind::Inet(_) => "a TCP/UDP socket",
        _ => return Ok(()),
    };
    Err(fd.unsupported(format!(
        "fd {}: a unix socket's queue carries {what} in flight (SCM_RIGHTS), which stasis cannot checkpoint yet",
        fd.fd
    )))
}

/// An fd of process `pid` (or of a process saved before) that is the same
/// open file as `f`, by `kcmp`.
fn twin(cx: &SaveCtx, pid: i32, f: &OwnedFd) -> Option<(i32, i32)> {
    let me = i32::try_from(std::process::id()).ok()?;
    let m = std::fs::metadata(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()?;
    let own = crate::save::list_fds(pid)
        .unwrap_or_default()
        .into_iter()
        .map(|n| (pid, n));
    let earlier = cx.seen.iter().map(|s| (s.0, s.1));
    own.chain(earlier).find(|&(p, n)| {
        std::fs::metadata(format!("/proc/{p}/fd/{n}"))
            .is_ok_and(|o| o.dev() == m.dev() && o.ino() == m.ino())
            && fdops::kcmp_same_file(me, f.as_raw_fd(), p, n)
    })
}

/// Makes the files in flight of one message, in order.
pub(super) fn make(
    cx: &mut RestoreCtx<'_>,
    imgs: &[FdImage],
) -> Result<Vec<OwnedFd>, RestoreError> {
    imgs.iter()
        .map(|img| match cx.get(img)? {
            FdRef::Owned(o) => Ok(o),
            FdRef::Borrowed(b) => b
                .try_clone_to_owned()
                .map_err(|source| RestoreError::Socket {
                    what: "copying a file in flight".into(),
                    source,
                }),
        })
        .collect()
}

/// Every unix socket image in flight inside `imgs`' queues, nested ones
/// included.
pub(crate) fn in_flight<'a>(imgs: impl Iterator<Item = &'a FdImage>) -> Vec<&'a FdImage> {
    let mut out = Vec::new();
    let mut todo: Vec<&'a FdImage> = imgs.collect();
    while let Some(f) = todo.pop() {
        if let FdKind::Unix(u) = &f.kind {
            for inner in u.queue_fds.iter().flatten() {
                out.push(inner);
                todo.push(inner);
            }
        }
    }
    out
}

/// Borrowed views of made files, for `sendmsg`.
pub(super) fn borrowed(fds: &[OwnedFd]) -> Vec<std::os::fd::BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}
