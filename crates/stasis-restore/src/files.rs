//! Open file descriptions of the restored tree.
//!
//! Every open file description is created once, *in the restorer*
//! ([`FdFactory`]): files are opened and seeked, pipes are created and
//! refilled, eventfds/timerfds/signalfds/epolls are made with their state.
//! Each fd of each process is then handed over ([`plant`]): the restorer
//! sends the description over a datagram socket whose other end every stub
//! inherited (`SCM_RIGHTS`), the process receives it with a remote `recvmsg`
//! and moves it to its number with `dup3`. Descriptions shared by several
//! fds (dup'd, inherited) are sent several times and so stay shared.
//! Epoll registrations are made last, by the process itself, because the
//! kernel keys them by the registering process's fd numbers.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use stasis_image::manifest::{FdImage, FdKind, PipeImage};
use stasis_kernel::{scm, KernelError};

use crate::build::{step, words, SCRATCH_STRUCT};
use crate::remote::Remote;
use crate::RestoreError;

/// Flags that can be changed on an open description with `F_SETFL`.
const SETFL_MASK: u32 =
    (libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME)
        .unsigned_abs();

/// Flags to reopen a file with: what it had, minus creation flags.
pub fn reopen_flags(flags: u32) -> i32 {
    let strip = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_CLOEXEC)
        .unsigned_abs();
    i32::try_from(flags & !strip).unwrap_or(0) | libc::O_CLOEXEC
}

fn os_err(what: impl Into<String>) -> KernelError {
    KernelError::Io {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

fn owned(fd: i32, what: &str) -> Result<OwnedFd, KernelError> {
    if fd < 0 {
        return Err(os_err(what));
    }
    // SAFETY: a new descriptor returned by the kernel that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates the open file descriptions of the tree in the restorer.
pub struct FdFactory<'a> {
    shared: HashMap<u32, OwnedFd>,
    /// (read end, write end) by pipe id.
    pipes: HashMap<u64, (OwnedFd, OwnedFd)>,
    /// A read-write opener per FIFO, keeping its data alive while restoring.
    fifo_keepers: HashMap<u64, OwnedFd>,
    pipe_data: HashMap<u64, &'a PipeImage>,
}

impl<'a> FdFactory<'a> {
    pub fn new(pipes: &'a [PipeImage]) -> Self {
        Self {
            shared: HashMap::new(),
            pipes: HashMap::new(),
            fifo_keepers: HashMap::new(),
            pipe_data: pipes.iter().map(|p| (p.id, p)).collect(),
        }
    }

    /// The description for `img`, created on first use when shared.
    pub fn get(&mut self, img: &FdImage) -> Result<FdRef<'_>, RestoreError> {
        if let Some(id) = img.shared_id {
            if !self.shared.contains_key(&id) {
                let fd = self.create(img)?;
                self.shared.insert(id, fd);
            }
            return Ok(FdRef::Borrowed(self.shared[&id].as_fd()));
        }
        Ok(FdRef::Owned(self.create(img)?))
    }

    fn pipe(&mut self, id: u64) -> Result<&(OwnedFd, OwnedFd), RestoreError> {
        if !self.pipes.contains_key(&id) {
            let mut p = [0i32; 2];
            // SAFETY: pipe2 writes two fds into the array.
            let r = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) };
            if r < 0 {
                return Err(RestoreError::Step {
                    what: "creating a pipe".into(),
                    source: os_err("pipe2"),
                });
            }
            let (rd, wr) = (owned(p[0], "pipe2")?, owned(p[1], "pipe2")?);
            if let Some(img) = self.pipe_data.get(&id) {
                fill_pipe(&wr, img)?;
            }
            self.pipes.insert(id, (rd, wr));
        }
        Ok(&self.pipes[&id])
    }

    fn create(&mut self, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let fd = img.fd;
        let nonblock = if img.flags & libc::O_NONBLOCK.unsigned_abs() != 0 {
            libc::O_NONBLOCK
        } else {
            0
        };
        let made = match &img.kind {
            FdKind::Path {
                path,
                pos,
                mode,
                size,
            } => {
                let f = std::fs::OpenOptions::new()
                    .read(true) // access mode comes from custom_flags below
                    .custom_flags(reopen_flags(img.flags))
                    .open_with_mode(path, img.flags)
                    .map_err(|e| RestoreError::File {
                        path: path.clone(),
                        what: format!("fd {fd}"),
                        source: KernelError::Io {
                            what: "open".into(),
                            source: e,
                        },
                    })?;
                let o: OwnedFd = f.into();
                let kind = mode & libc::S_IFMT;
                if kind == libc::S_IFREG || kind == libc::S_IFDIR {
                    if kind == libc::S_IFREG && pos > size {
                        tracing::warn!(
                            fd,
                            "{path}: offset {pos} is beyond the size it had at dump ({size})"
                        );
                    }
                    let off = i64::try_from(*pos).unwrap_or(i64::MAX);
                    // SAFETY: lseek on an fd we own.
                    if unsafe { libc::lseek(o.as_raw_fd(), off, libc::SEEK_SET) } < 0 {
                        return Err(RestoreError::Step {
                            what: format!("seeking {path} to {pos}"),
                            source: os_err("lseek"),
                        });
                    }
                }
                o
            }
            FdKind::Pipe { id, write_end } => {
                let (r, w) = self.pipe(*id)?;
                let end = if *write_end { w } else { r };
                scm::dup_at_least(end.as_fd(), 3)?
            }
            FdKind::Fifo { path, id } => {
                if !self.fifo_keepers.contains_key(id) {
                    let keeper: OwnedFd = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                        .open(path)
                        .map_err(|e| RestoreError::File {
                            path: path.clone(),
                            what: format!("FIFO of fd {fd}"),
                            source: KernelError::Io {
                                what: "open".into(),
                                source: e,
                            },
                        })?
                        .into();
                    if let Some(img) = self.pipe_data.get(id) {
                        fill_pipe(&keeper, img)?;
                    }
                    self.fifo_keepers.insert(*id, keeper);
                }
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(reopen_flags(img.flags) | libc::O_NONBLOCK)
                    .open_with_mode(path, img.flags)
                    .map_err(|e| RestoreError::File {
                        path: path.clone(),
                        what: format!("fd {fd}"),
                        source: KernelError::Io {
                            what: "open".into(),
                            source: e,
                        },
                    })?
                    .into()
            }
            FdKind::Eventfd { count, semaphore } => {
                let flags =
                    libc::EFD_CLOEXEC | nonblock | if *semaphore { libc::EFD_SEMAPHORE } else { 0 };
                let init = u32::try_from(*count).unwrap_or(0);
                // SAFETY: eventfd returns a new fd or -1.
                let e = owned(unsafe { libc::eventfd(init, flags) }, "eventfd")?;
                if u64::from(init) != *count {
                    // Counters beyond u32 are added with a write.
                    let rest = count - u64::from(init);
                    // SAFETY: writing 8 bytes from a local u64 to our eventfd.
                    unsafe { libc::write(e.as_raw_fd(), (&rest as *const u64).cast(), 8) };
                }
                e
            }
            FdKind::Timerfd {
                clockid,
                value_ns,
                interval_ns,
                ticks,
            } => {
                // SAFETY: timerfd_create returns a new fd or -1.
                let t = owned(
                    unsafe { libc::timerfd_create(*clockid, libc::TFD_CLOEXEC | nonblock) },
                    "timerfd_create",
                )?;
                let ts = |ns: u64| libc::timespec {
                    tv_sec: i64::try_from(ns / 1_000_000_000).unwrap_or(0),
                    tv_nsec: i64::try_from(ns % 1_000_000_000).unwrap_or(0),
                };
                let spec = libc::itimerspec {
                    it_interval: ts(*interval_ns),
                    it_value: ts(*value_ns),
                };
                // SAFETY: timerfd_settime with a valid itimerspec.
                if unsafe { libc::timerfd_settime(t.as_raw_fd(), 0, &spec, std::ptr::null_mut()) }
                    < 0
                {
                    return Err(RestoreError::Step {
                        what: format!("arming the timerfd of fd {fd}"),
                        source: os_err("timerfd_settime"),
                    });
                }
                if *ticks > 0 {
                    const TFD_IOC_SET_TICKS: u64 = 0x4008_5400;
                    // SAFETY: TFD_IOC_SET_TICKS reads a u64 from the pointer.
                    if unsafe {
                        libc::ioctl(t.as_raw_fd(), TFD_IOC_SET_TICKS as _, ticks as *const u64)
                    } < 0
                    {
                        tracing::warn!(
                            fd,
                            "could not restore {ticks} pending expirations of a timerfd: {}",
                            std::io::Error::last_os_error()
                        );
                    }
                }
                t
            }
            FdKind::Signalfd { mask } => {
                // SAFETY: signalfd with a kernel sigset of 8 bytes (raw syscall).
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_signalfd4,
                        -1,
                        mask as *const u64,
                        8usize,
                        libc::SFD_CLOEXEC | nonblock,
                    )
                };
                owned(i32::try_from(r).unwrap_or(-1), "signalfd")?
            }
            FdKind::Epoll { .. } => {
                // SAFETY: epoll_create1 returns a new fd or -1.
                owned(
                    unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
                    "epoll_create1",
                )?
            }
        };
        // Status flags of the description (O_NONBLOCK, O_APPEND...), for
        // kinds created without them.
        if matches!(img.kind, FdKind::Pipe { .. } | FdKind::Fifo { .. }) {
            // SAFETY: F_SETFL on an fd we own.
            if unsafe {
                libc::fcntl(
                    made.as_raw_fd(),
                    libc::F_SETFL,
                    i32::try_from(img.flags & SETFL_MASK).unwrap_or(0),
                )
            } < 0
            {
                return Err(RestoreError::Step {
                    what: format!("setting the flags of fd {fd}"),
                    source: os_err("F_SETFL"),
                });
            }
        }
        Ok(made)
    }
}

trait OpenWithMode {
    fn open_with_mode(&mut self, path: &str, flags: u32) -> std::io::Result<std::fs::File>;
}

impl OpenWithMode for std::fs::OpenOptions {
    /// Opens with the access mode of `flags` (`O_RDONLY`/`O_WRONLY`/`O_RDWR`).
    fn open_with_mode(&mut self, path: &str, flags: u32) -> std::io::Result<std::fs::File> {
        let acc = flags & libc::O_ACCMODE.unsigned_abs();
        self.read(acc != libc::O_WRONLY.unsigned_abs())
            .write(acc != libc::O_RDONLY.unsigned_abs());
        if acc == libc::O_ACCMODE.unsigned_abs() {
            // O_PATH-like "3" access mode: no read/write.
            self.read(false).write(false);
        }
        self.open(path)
    }
}

fn fill_pipe(w: &OwnedFd, img: &PipeImage) -> Result<(), RestoreError> {
    // SAFETY: F_SETPIPE_SZ on a pipe we own.
    let r = unsafe {
        libc::fcntl(
            w.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            i32::try_from(img.capacity).unwrap_or(65536),
        )
    };
    if r < 0 {
        return Err(RestoreError::Step {
            what: format!(
                "sizing a pipe to {} bytes (fs.pipe-max-size may be lower)",
                img.capacity
            ),
            source: os_err("F_SETPIPE_SZ"),
        });
    }
    let mut off = 0;
    while off < img.data.len() {
        // SAFETY: writing from our buffer to our pipe.
        let n = unsafe {
            libc::write(
                w.as_raw_fd(),
                img.data[off..].as_ptr().cast(),
                img.data.len() - off,
            )
        };
        if n <= 0 {
            return Err(RestoreError::Step {
                what: "refilling a pipe".into(),
                source: os_err("write"),
            });
        }
        off += usize::try_from(n).unwrap_or(0);
    }
    Ok(())
}

/// A description from the factory: owned (used once) or shared.
pub enum FdRef<'a> {
    Owned(OwnedFd),
    Borrowed(BorrowedFd<'a>),
}

impl FdRef<'_> {
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            FdRef::Owned(o) => o.as_fd(),
            FdRef::Borrowed(b) => *b,
        }
    }
}

/// Offsets inside the scratch struct area for the remote `recvmsg`.
const MSG_HDR: usize = SCRATCH_STRUCT;
const MSG_IOV: usize = SCRATCH_STRUCT + 64;
const MSG_BYTE: usize = SCRATCH_STRUCT + 80;
const MSG_CMSG: usize = SCRATCH_STRUCT + 96;
const CMSG_SPACE_ONE_FD: u64 = 24;

/// The `msghdr` + `iovec` for receiving one fd, laid out for `base` (the
/// scratch address): returned as (bytes of msghdr, bytes of iovec).
pub fn recv_layout(scratch: u64) -> (Vec<u8>, Vec<u8>) {
    let at = |off: usize| scratch + off as u64;
    let hdr = words(&[0, 0, at(MSG_IOV), 1, at(MSG_CMSG), CMSG_SPACE_ONE_FD, 0]);
    let iov = words(&[at(MSG_BYTE), 1]);
    (hdr, iov)
}

/// The fd number carried by a received `SCM_RIGHTS` control message.
pub fn parse_cmsg(c: &[u8]) -> Option<i32> {
    let len = u64::from_le_bytes(c.get(0..8)?.try_into().ok()?);
    let level = i32::from_le_bytes(c.get(8..12)?.try_into().ok()?);
    let ty = i32::from_le_bytes(c.get(12..16)?.try_into().ok()?);
    if len != 20 || level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS {
        return None;
    }
    Some(i32::from_le_bytes(c.get(16..20)?.try_into().ok()?))
}

/// Hands `fd` to the process behind `r` as fd number `target`.
/// `transport` is the restorer's end of the socket whose other end the
/// process has as fd `remote_transport`.
pub fn plant<R: Remote>(
    r: &mut R,
    transport: &OwnedFd,
    remote_transport: u64,
    fd: BorrowedFd<'_>,
    target: i32,
    cloexec: bool,
) -> Result<(), RestoreError> {
    scm::send_fd(transport, fd).map_err(step(format!("sending fd {target}")))?;
    let (hdr, iov) = recv_layout(r.scratch());
    let h = r.put(MSG_HDR, &hdr).map_err(step("msghdr"))?;
    r.put(MSG_IOV, &iov).map_err(step("iovec"))?;
    r.put(MSG_CMSG, &[0u8; 24]).map_err(step("cmsg"))?;
    let flags = if cloexec { libc::MSG_CMSG_CLOEXEC } else { 0 };
    r.sys(
        "recvmsg",
        libc::SYS_recvmsg,
        &[remote_transport, h, u64::from(flags.unsigned_abs())],
    )
    .map_err(step(format!("receiving fd {target}")))?;
    let mut c = [0u8; 24];
    let at = r.scratch() + MSG_CMSG as u64;
    r.read(at, &mut c)
        .map_err(step("reading the control message"))?;
    let got = parse_cmsg(&c)
        .ok_or_else(|| RestoreError::Layout(format!("no fd arrived for fd {target}")))?;
    if got != target {
        let t = u64::from(target.unsigned_abs());
        let g = u64::from(got.unsigned_abs());
        let cl = if cloexec {
            libc::O_CLOEXEC.unsigned_abs()
        } else {
            0
        };
        r.sys("dup3", libc::SYS_dup3, &[g, t, u64::from(cl)])
            .map_err(step(format!("moving fd {got} to {target}")))?;
        r.sys("close", libc::SYS_close, &[g])
            .map_err(step("closing a temporary fd"))?;
    }
    Ok(())
}

/// Registers the saved targets of the epoll instance at `epfd` (run by the
/// process itself, after all its fds exist).
pub fn restore_epoll<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    let FdKind::Epoll { targets } = &img.kind else {
        return Ok(());
    };
    for t in targets {
        // struct epoll_event is packed on x86-64: u32 events, u64 data.
        let mut ev = Vec::with_capacity(12);
        ev.extend_from_slice(&t.events.to_le_bytes());
        ev.extend_from_slice(&t.data.to_le_bytes());
        let a = r.put(SCRATCH_STRUCT, &ev).map_err(step("epoll_event"))?;
        r.sys(
            "epoll_ctl",
            libc::SYS_epoll_ctl,
            &[
                u64::from(img.fd.unsigned_abs()),
                libc::EPOLL_CTL_ADD.unsigned_abs().into(),
                u64::from(t.fd.unsigned_abs()),
                a,
            ],
        )
        .map_err(step(format!(
            "registering fd {} in epoll fd {}",
            t.fd, img.fd
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{Call, Recorder};
    use stasis_image::manifest::EpollTarget;

    #[test]
    fn reopen_flags_strip_creation_and_add_cloexec() {
        let f = reopen_flags(
            (libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_TRUNC).unsigned_abs(),
        );
        assert_eq!(f, libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC);
    }

    #[test]
    fn cmsg_parsing() {
        let mut c = [0u8; 24];
        c[0..8].copy_from_slice(&20u64.to_le_bytes());
        c[8..12].copy_from_slice(&libc::SOL_SOCKET.to_le_bytes());
        c[12..16].copy_from_slice(&libc::SCM_RIGHTS.to_le_bytes());
        c[16..20].copy_from_slice(&7i32.to_le_bytes());
        assert_eq!(parse_cmsg(&c), Some(7));
        c[12] = 2;
        assert_eq!(parse_cmsg(&c), None);
        assert_eq!(parse_cmsg(&[0u8; 4]), None);
    }

    #[test]
    fn recv_layout_points_into_scratch() {
        let (hdr, iov) = recv_layout(0x1000);
        assert_eq!(hdr.len(), 56);
        let w = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let s = 0x1000 + SCRATCH_STRUCT as u64;
        assert_eq!(
            (w(&hdr, 2), w(&hdr, 3), w(&hdr, 4), w(&hdr, 5)),
            (s + 64, 1, s + 96, 24)
        );
        assert_eq!((w(&iov, 0), w(&iov, 1)), (s + 80, 1));
    }

    #[test]
    fn epoll_targets_are_registered_by_number() {
        let mut r = Recorder::default();
        let img = FdImage {
            fd: 5,
            flags: 0,
            cloexec: true,
            shared_id: None,
            kind: FdKind::Epoll {
                targets: vec![
                    EpollTarget {
                        fd: 3,
                        events: 1,
                        data: 0xabc,
                    },
                    EpollTarget {
                        fd: 4,
                        events: 4,
                        data: 9,
                    },
                ],
            },
        };
        restore_epoll(&mut r, &img).unwrap();
        assert_eq!(
            r.args_of("epoll_ctl")
                .iter()
                .map(|a| (a[0], a[1], a[2]))
                .collect::<Vec<_>>(),
            vec![(5, 1, 3), (5, 1, 4)]
        );
        let ev = r
            .calls
            .iter()
            .find_map(|c| {
                if let Call::Write { data, .. } = c {
                    Some(data.clone())
                } else {
                    None
                }
            })
            .unwrap();
        assert_eq!(ev.len(), 12);
        assert_eq!(u64::from_le_bytes(ev[4..12].try_into().unwrap()), 0xabc);
    }
}
