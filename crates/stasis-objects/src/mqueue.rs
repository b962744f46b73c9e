//! POSIX message queues: the queues of a tree's IPC namespace, and fds on
//! them.
//!
//! A queue belongs to an IPC namespace and outlives every fd on it, as a
//! System V queue does ([`crate::sysv_ipc`]): when the tree has an IPC
//! namespace of its own, every queue of it is the tree's and is saved
//! ([`save_namespace`], on a thread in the namespace, the tree frozen):
//! listed in a mount of the namespace's mqueue file system attached
//! nowhere (`fsopen`/`fsmount`, so nothing of the tree's mounts is
//! touched), then each its name, owner, mode, `mq_maxmsg`, `mq_msgsize`
//! and queued messages with their priorities. POSIX queues have no peek:
//! the messages are received (highest priority first, oldest first within
//! one) and sent again at once, in that order, with their priorities,
//! which queues them exactly as they were, before the next queue is read;
//! so a tree left running, or a dump that fails later, finds them as they
//! were (their times changed). A queue with a notification registered
//! (`mq_notify`) is refused by name: the kernel would send it when the
//! emptied queue is refilled, and a notification cannot be registered for
//! another process at restore. The namespace's limits
//! (`/proc/sys/fs/mqueue`) are saved with them.
//!
//! [`restore_namespace`] (on a thread in the new namespace, before the
//! tree's fds are made and before it runs) sets the limits that differ,
//! makes each queue with its attributes, queues its messages in order,
//! then gives it its owner and mode.
//!
//! An fd on a queue ([`Mqueue`], recognised by the file system of its
//! file) is saved by the queue's name and its flags. On a named queue of
//! the tree's own IPC namespace (saved with it), it is opened again by
//! name (`mq_open`). On a queue of the dumper's IPC namespace, or one
//! unlinked since it was opened, the queue is saved with the fd
//! ([`HeldQueue`], read through `/proc/PID/fd/N` as above, once per
//! queue: by inode): the restore makes it again (a named one over
//! whatever holds its name then, an unlinked one under a name of its own,
//! unlinked at once) and opens every fd on it from the one fd it keeps
//! (`/proc/self/fd/N`: a new description, as `mq_open` gives). The
//! dumper's queues that no fd of the tree names are neither saved nor
//! made again: the restored tree finds them as they are then.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, HeldQueue, PosixMessage, PosixQueue, PosixQueues};
use stasis_kernel::{mqueue as kmq, KernelError};
use stasis_sys::net::{MQUEUE_MAGIC, MQUEUE_SYSCTL_DIR};

use crate::error::{file_err, io_step};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// The namespace limits saved, by their file under `/proc/sys/fs/mqueue`,
/// in the order they are set again.
const LIMITS: [&str; 5] = [
    "msg_max",
    "msgsize_max",
    "queues_max",
    "msg_default",
    "msgsize_default",
];

fn limits_of(q: &PosixQueues) -> [u64; 5] {
    [
        q.msg_max,
        q.msgsize_max,
        q.queues_max,
        q.msg_default,
        q.msgsize_default,
    ]
}

/// The pid of the process registered for a notification (`NOTIFY_PID:` of
/// the text a queue's file reads as; 0: none).
fn notify_pid(text: &str) -> Option<i64> {
    let rest = &text[text.find("NOTIFY_PID:")? + "NOTIFY_PID:".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Whether process `pid` is in the calling thread's IPC namespace (the
/// dumper's), whose queues are not saved with the tree's namespaces.
fn in_dumpers_ipc(pid: i32) -> bool {
    let ino = |p: String| std::fs::metadata(p).map(|m| m.ino()).ok();
    let theirs = ino(format!("/proc/{pid}/ns/ipc"));
    theirs.is_some() && theirs == ino("/proc/thread-self/ns/ipc".into())
}

fn kernel(what: String) -> impl FnOnce(std::io::Error) -> SaveError {
    move |source| SaveError::Kernel(KernelError::Io { what, source })
}

/// A mount of the calling thread's IPC namespace's mqueue attached
/// nowhere, and the names of its queues, sorted.
fn queues_here() -> Result<(OwnedFd, Vec<String>), SaveError> {
    let mnt = kmq::detached_mount().map_err(kernel(
        "mounting the mqueue file system of the tree's IPC namespace (fsopen, fsmount)".into(),
    ))?;
    let dir = format!("/proc/self/fd/{}", mnt.as_raw_fd());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(kernel(
            "listing the POSIX message queues of the tree's IPC namespace".into(),
        ))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok((mnt, names))
}

/// Refuses, before anything is stopped, what [`save_namespace`] would
/// refuse of the queues of the calling thread's IPC namespace (the
/// tree's, whose root is `pid`): a notification registered. Nothing is
/// read off them.
pub fn check_namespace(pid: i32) -> Result<(), SaveError> {
    let (mnt, names) = queues_here()?;
    let dir = format!("/proc/self/fd/{}", mnt.as_raw_fd());
    for name in &names {
        let mut f = std::fs::File::open(format!("{dir}/{name}"))
            .map_err(kernel(format!("opening POSIX message queue /{name}")))?;
        check_notify(pid, name, &mut f)?;
    }
    Ok(())
}

/// Refuses queue `name` (open on `f`) if a notification is registered.
fn check_notify(pid: i32, name: &str, f: &mut std::fs::File) -> Result<(), SaveError> {
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(kernel(format!(
        "reading the state of POSIX message queue /{name}"
    )))?;
    match notify_pid(&text) {
        Some(0) => Ok(()),
        Some(p) => Err(SaveError::Unsupported {
            pid,
            what: format!("its POSIX message queue /{name} has a notification registered (mq_notify, by process {p}); stasis cannot register it again at restore: remove it (mq_notify(q, NULL)) before the dump"),
        }),
        None => Err(SaveError::ProcFormat {
            pid,
            file: format!("(mqueue)/{name}"),
            what: format!("no NOTIFY_PID in {text:?}"),
        }),
    }
}

/// The POSIX message queues of the calling thread's IPC namespace (the
/// tree's, whose root is `pid`), each left as it was; `None` if it has
/// none.
pub fn save_namespace(pid: i32) -> Result<Option<PosixQueues>, SaveError> {
    let (mnt, names) = queues_here()?;
    let dir = format!("/proc/self/fd/{}", mnt.as_raw_fd());
    if names.is_empty() {
        return Ok(None);
    }
    let mut limits = [0u64; 5];
    for (v, f) in limits.iter_mut().zip(LIMITS) {
        let path = format!("{MQUEUE_SYSCTL_DIR}/{f}");
        let text = std::fs::read_to_string(&path).map_err(kernel(format!("reading {path}")))?;
        *v = text.trim().parse().map_err(|_| SaveError::ProcFormat {
            pid,
            file: format!("../sys/fs/mqueue/{f}"),
            what: format!("{:?} is not a number", text.trim()),
        })?;
    }
    let [msg_max, msgsize_max, queues_max, msg_default, msgsize_default] = limits;
    let queues = names
        .iter()
        .map(|n| save_queue(pid, &dir, n))
        .collect::<Result<_, _>>()?;
    Ok(Some(PosixQueues {
        msg_max,
        msgsize_max,
        queues_max,
        msg_default,
        msgsize_default,
        queues,
    }))
}

/// Queue `name` of the mqueue mount whose root is `dir`: its attributes
/// and messages, received and sent again in order.
fn save_queue(pid: i32, dir: &str, name: &str) -> Result<PosixQueue, SaveError> {
    save_queue_at(pid, &format!("{dir}/{name}"), name)
}

/// The queue `name` whose file is at `path` (in a mount, or an fd's
/// `/proc/PID/fd/N`): as [`save_queue`].
fn save_queue_at(pid: i32, path: &str, name: &str) -> Result<PosixQueue, SaveError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(kernel(format!(
            "opening POSIX message queue /{name} ({path})"
        )))?;
    let md = f
        .metadata()
        .map_err(kernel(format!("stat of POSIX message queue /{name}")))?;
    check_notify(pid, name, &mut f)?;
    let attr = kmq::getattr(f.as_fd())
        .map_err(kernel(format!("mq_getattr of POSIX message queue /{name}")))?;
    let size = usize::try_from(attr.msgsize).unwrap_or(0);
    let mut buf = vec![0u8; size];
    let mut messages = Vec::new();
    let mut failed = None;
    loop {
        match kmq::receive(f.as_fd(), &mut buf) {
            Ok(Some((n, prio))) => messages.push(PosixMessage {
                prio,
                data: buf[..n.min(size)].to_vec(),
            }),
            Ok(None) => break,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // Every message taken goes back, in the order taken, whatever failed.
    for (i, m) in messages.iter().enumerate() {
        kmq::send(f.as_fd(), &m.data, m.prio).map_err(kernel(format!(
            "queueing message {i} of {} again on POSIX message queue /{name} (the messages from it on are lost)",
            messages.len()
        )))?;
    }
    if let Some(e) = failed {
        return Err(kernel(format!(
            "reading the messages of POSIX message queue /{name}"
        ))(e));
    }
    if i64::try_from(messages.len()).ok() != Some(attr.curmsgs) {
        return Err(SaveError::Unsupported {
            pid,
            what: format!(
                "its POSIX message queue /{name} held {} messages, {} were read: a process outside the tree uses it",
                attr.curmsgs,
                messages.len()
            ),
        });
    }
    Ok(PosixQueue {
        name: name.to_string(),
        uid: md.uid(),
        gid: md.gid(),
        mode: md.mode() & 0o777,
        maxmsg: attr.maxmsg,
        msgsize: attr.msgsize,
        messages,
    })
}

/// Makes the queues of `q` again in the calling thread's IPC namespace (a
/// new one: none of their names is taken), after its limits.
pub fn restore_namespace(q: &PosixQueues) -> Result<(), RestoreError> {
    for (f, v) in LIMITS.into_iter().zip(limits_of(q)) {
        let path = format!("{MQUEUE_SYSCTL_DIR}/{f}");
        let now = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        if now != Some(v) {
            std::fs::write(&path, format!("{v}\n")).map_err(io_step(
                format!("setting {path} to {v} (as the tree's IPC namespace had it)"),
                "write",
            ))?;
        }
    }
    for queue in &q.queues {
        make_queue(queue)?;
    }
    Ok(())
}

fn make_queue(q: &PosixQueue) -> Result<(), RestoreError> {
    make_queue_as(&q.name, q).map(drop)
}

/// Makes queue `q` under `name` (free), with its messages, owner and mode.
fn make_queue_as(name: &str, q: &PosixQueue) -> Result<OwnedFd, RestoreError> {
    let fd: OwnedFd = kmq::create(name, 0o600, q.maxmsg, q.msgsize).map_err(io_step(
        format!(
            "making POSIX message queue /{name} ({} messages of {} bytes at most)",
            q.maxmsg, q.msgsize
        ),
        "mq_open",
    ))?;
    for (i, m) in q.messages.iter().enumerate() {
        kmq::send(fd.as_fd(), &m.data, m.prio).map_err(io_step(
            format!(
                "queueing message {i} ({} bytes, priority {}) on POSIX message queue /{name}",
                m.data.len(),
                m.prio
            ),
            "mq_timedsend",
        ))?;
    }
    nix::unistd::fchown(
        fd.as_raw_fd(),
        Some(nix::unistd::Uid::from_raw(q.uid)),
        Some(nix::unistd::Gid::from_raw(q.gid)),
    )
    .map_err(|e| {
        io_step(
            format!("giving POSIX message queue /{name} its owner"),
            "fchown",
        )(e.into())
    })?;
    nix::sys::stat::fchmod(
        fd.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(q.mode & 0o777),
    )
    .map_err(|e| {
        io_step(
            format!("giving POSIX message queue /{name} its mode"),
            "fchmod",
        )(e.into())
    })?;
    Ok(fd)
}

/// Makes a queue saved with an fd ([`HeldQueue`]) again in the calling
/// thread's IPC namespace: a named one in place of whatever holds its
/// name (it is the tree's, as it was at the dump), an unlinked one under a
/// name of its own, unlinked at once. The fd returned keeps it.
fn make_held(h: &HeldQueue) -> Result<OwnedFd, RestoreError> {
    let name = &h.queue.name;
    if h.deleted {
        let tmp = format!("stasis-restore-{}-{}", std::process::id(), h.ino);
        // A leftover of a restore killed here would be of another pid.
        let fd = make_queue_as(&tmp, &h.queue)?;
        kmq::unlink(&tmp).map_err(io_step(
            format!("unlinking POSIX message queue /{tmp}, made again for /{name} (deleted)"),
            "mq_unlink",
        ))?;
        return Ok(fd);
    }
    match kmq::unlink(name) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
            return Err(io_step(
                format!("removing POSIX message queue /{name} to make the tree's again"),
                "mq_unlink",
            )(e))
        }
        _ => {}
    }
    make_queue_as(name, &h.queue)
}

/// An fd on a POSIX message queue.
pub struct Mqueue;

impl Object for Mqueue {
    const NAME: &'static str = "POSIX message queue";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if !fd.link.starts_with('/') || !fd.meta.is_file() {
            return Ok(None);
        }
        let path = format!("/proc/{}/fd/{}", fd.pid, fd.fd);
        match nix::sys::statfs::statfs(path.as_str()) {
            Ok(s) if s.filesystem_type().0 == MQUEUE_MAGIC => {}
            _ => return Ok(None),
        }
        let link = fd.link.strip_suffix(" (deleted)");
        let deleted = link.is_some();
        // `/NAME` (opened with mq_open) or a path in an mqueue mount.
        let name = link
            .unwrap_or(fd.link)
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        // A named queue of the tree's own IPC namespace is saved with it
        // (`save_namespace`); one of the dumper's, or an unlinked one, is
        // saved here, once for all the fds on it.
        if !deleted && !in_dumpers_ipc(fd.pid) {
            return Ok(Some(FdKind::Mqueue { name, queue: None }));
        }
        let ino = fd.meta.ino();
        let queue = match cx.mqueues.get(&ino) {
            Some(q) => q.clone(),
            None => {
                let at = format!("/proc/{}/fd/{}", fd.pid, fd.fd);
                let q = save_queue_at(fd.pid, &at, &name)?;
                cx.mqueues.insert(ino, q.clone());
                q
            }
        };
        Ok(Some(FdKind::Mqueue {
            name,
            queue: Some(HeldQueue {
                ino,
                deleted,
                queue,
            }),
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Mqueue { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Mqueue { name, queue } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let flags = i32::try_from(img.flags).unwrap_or(0);
        let Some(h) = queue else {
            return cx.in_tree_ipc(|| kmq::open(name, flags))?.map_err(file_err(
                format!("/{name}"),
                "a POSIX message queue of the tree's IPC namespace",
                "mq_open",
            ));
        };
        if !cx.mqueues.contains_key(&h.ino) {
            let made = cx.in_tree_ipc(|| make_held(h))??;
            cx.mqueues.insert(h.ino, made);
        }
        let keep = cx.mqueues[&h.ino].as_raw_fd();
        // A new description of the queue made, as mq_open gives one.
        let path = format!("/proc/self/fd/{keep}");
        let access = flags & libc::O_ACCMODE;
        std::fs::OpenOptions::new()
            .read(access != libc::O_WRONLY)
            .write(access != libc::O_RDONLY)
            .custom_flags(libc::O_CLOEXEC | (flags & libc::O_NONBLOCK))
            .open(&path)
            .map(OwnedFd::from)
            .map_err(file_err(
                format!("/{name}"),
                "a POSIX message queue made again",
                "open",
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notifying_pid_is_read_from_the_queue_text() {
        let t = "QSIZE:5          NOTIFY:0     SIGNO:0     NOTIFY_PID:0     \n";
        assert_eq!(notify_pid(t), Some(0));
        let t = "QSIZE:0          NOTIFY:0     SIGNO:10    NOTIFY_PID:4242  \n";
        assert_eq!(notify_pid(t), Some(4242));
        assert_eq!(notify_pid("QSIZE:0"), None);
    }

    #[test]
    fn limits_are_set_in_their_saved_order() {
        let q = PosixQueues {
            msg_max: 1,
            msgsize_max: 2,
            queues_max: 3,
            msg_default: 4,
            msgsize_default: 5,
            queues: Vec::new(),
        };
        assert_eq!(limits_of(&q), [1, 2, 3, 4, 5]);
        assert_eq!(LIMITS[0], "msg_max");
    }
}
