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
//! A description in flight that a process of the tree holds too is made
//! once, for both ([`link`]); so is one sent several times. A TCP
//! connection in flight is locked and read with the tree's others
//! ([`super::files_in_flight`], called by `SaveCtx::freeze_tcp`), and a
//! pty slave in flight counts as open (`crate::pty`).

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
            let r = cx.save_fd(&pfd, me, raw, None);
            cx.epoll_registrar = outer;
            d.set(d.get() - 1);
            r
        })?;
        let mut img = FdImage {
            fd: -1,
            shared_id: None,
            ..img
        };
        if !matches!(img.kind, FdKind::Pipe { .. }) {
            // One description with any fd of the tree that is this open
            // file too: linked once the whole tree is saved ([`link`]).
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

/// Gives each file in flight that a process of the tree holds too (the
/// same open file description, by `kcmp`) that fd's `shared_id`, so that
/// the restore makes it once: its offset, flags and locks stay one. Called
/// once every process is saved.
pub(crate) fn link(cx: &mut SaveCtx) {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut renames: Vec<(u32, u32)> = Vec::new();
    for (f, img) in &cx.in_flight {
        let Some(mine) = img.shared_id else { continue };
        let Ok(m) = std::fs::metadata(format!("/proc/self/fd/{}", f.as_raw_fd())) else {
            continue;
        };
        let twin = cx.seen.iter().find(|s| {
            s.2 == m.dev() && s.3 == m.ino() && fdops::kcmp_same_file(me, f.as_raw_fd(), s.0, s.1)
        });
        let Some(&(_, _, _, _, ti, tf)) = twin else {
            continue;
        };
        let held = &mut cx.tables[ti][tf];
        match held.shared_id {
            Some(theirs) => renames.push((mine, theirs)),
            None => held.shared_id = Some(mine),
        }
    }
    for (from, to) in renames {
        for table in &mut cx.tables {
            for img in table.iter_mut() {
                rename_in_flight(img, from, to);
            }
        }
        for (_, img) in &mut cx.in_flight {
            if img.shared_id == Some(from) {
                img.shared_id = Some(to);
            }
        }
    }
}

/// Renames `shared_id` `from` to `to` in every file in flight inside
/// `img`'s queue, nested ones included.
fn rename_in_flight(img: &mut FdImage, from: u32, to: u32) {
    if let FdKind::Unix(u) = &mut img.kind {
        for inner in u.queue_fds.iter_mut().flatten() {
            if inner.shared_id == Some(from) {
                inner.shared_id = Some(to);
            }
            rename_in_flight(inner, from, to);
        }
    }
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
