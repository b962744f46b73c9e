//! Open file descriptions of the restored tree.
//!
//! Each kind of kernel object is made by its own module of
//! `stasis-objects` (`pipe.rs`, `unix.rs`, `tcp/`...; see
//! [`stasis_objects::REGISTRY`]); this module adapts them to the
//! restore: the layout of the stub's scratch page.
//! Every open file description is created once, in the restorer
//! ([`FdFactory`]), then handed to each process that holds it ([`plant`]);
//! epoll registrations and flock/POSIX locks are made last, by the
//! process itself.

use std::os::fd::{BorrowedFd, OwnedFd};

use stasis_image::manifest::{FdImage, GhostFile, PipeImage};
use stasis_objects as objects;

pub use objects::inet::port_of;
pub use objects::locks::flock_struct;
pub use objects::restore::{parse_cmsg, reopen_flags};
pub use objects::tcp::PendingTcp;
pub use objects::FdRef;

use crate::build::SCRATCH_STRUCT;
use crate::remote::Remote;
use crate::RestoreError;

/// Where remote calls of the objects put their structures.
const AT: objects::Scratch = objects::Scratch {
    structs: SCRATCH_STRUCT,
};

/// Creates the open file descriptions of the tree in the restorer.
pub struct FdFactory<'a>(objects::RestoreCtx<'a>);

impl<'a> FdFactory<'a> {
    pub fn new(
        pipes: &'a [PipeImage],
        ghosts: &'a [GhostFile],
        fds: impl Iterator<Item = &'a FdImage>,
    ) -> Self {
        Self(objects::RestoreCtx::new(pipes, ghosts, fds))
    }

    /// See [`objects::RestoreCtx::set_content`].
    pub fn set_content(&mut self, content: &'a stasis_image::ContentSource) {
        self.0.set_content(content);
    }

    /// Files are opened by path in the mount namespace of process `pid`
    /// (the restored tree's own).
    pub fn set_mount_ns_of(&mut self, pid: i32) {
        self.0.mount_ns_of = Some(pid);
    }

    /// POSIX message queues are opened by name in the IPC namespace of
    /// process `pid` (the restored tree's own).
    pub fn set_ipc_ns_of(&mut self, pid: i32) {
        self.0.ipc_ns_of = Some(pid);
    }

    /// Fds on the tree's own namespace files are opened from process
    /// `pid`'s namespaces.
    pub fn set_ns_of(&mut self, pid: i32) {
        self.0.ns_of = Some(pid);
    }

    /// The restorer's own namespaces (kind, an fd on it), opened before
    /// any thread of it entered the tree's.
    pub fn set_home_ns(&mut self, home: Vec<(String, OwnedFd)>) {
        self.0.home_ns = home;
    }

    /// Established TCP connections are made closed (`--tcp-close`).
    pub fn set_tcp_close(&mut self, close: bool) {
        self.0.tcp_close = close;
    }

    /// The terminal a shell job's fds are opened on (`--shell-job`).
    pub fn set_terminal(&mut self, path: Option<std::path::PathBuf>) {
        self.0.terminal = path;
    }

    /// See [`objects::RestoreCtx::set_cwd`].
    pub fn set_cwd(&mut self, cwd: &str) {
        self.0.set_cwd(cwd);
    }

    /// See [`objects::RestoreCtx::deleted_cwd`].
    pub fn deleted_cwd(
        &mut self,
        cwd: &str,
        owner: (u32, u32),
    ) -> Result<Option<OwnedFd>, RestoreError> {
        Ok(self.0.deleted_cwd(cwd, owner)?)
    }

    /// See [`objects::RestoreCtx::claim_epoll`].
    pub fn claim_epoll(&mut self, img: &FdImage) -> bool {
        self.0.claim_epoll(img)
    }

    /// See [`objects::RestoreCtx::take_in_flight_epolls`].
    pub fn take_in_flight_epolls(&mut self, pid: i32) -> Vec<(OwnedFd, FdImage)> {
        self.0.take_in_flight_epolls(pid)
    }

    /// Refuses epolls in flight left without their registrations (their
    /// registrar was built before their queue was made, which the order of
    /// the build rules out: it holds that queue's socket).
    pub fn check_in_flight_epolls(&self) -> Result<(), RestoreError> {
        match self.0.epolls_left_unregistered() {
            None => Ok(()),
            Some(pid) => Err(RestoreError::from(crate::ObjectError::Inconsistent(format!(
                "an epoll in flight whose registrations process {pid} makes was made after that process's files"
            )))),
        }
    }

    /// See [`objects::RestoreCtx::claim_flock`].
    pub fn claim_flock(&mut self, img: &FdImage) -> bool {
        self.0.claim_flock(img)
    }

    /// See [`objects::RestoreCtx::reserve_pids`].
    pub fn reserve_pids(&mut self, pids: impl Iterator<Item = i32>) {
        self.0.reserve_pids(pids);
    }

    /// See [`objects::RestoreCtx::finish_pidfds`].
    pub fn finish_pidfds(&mut self) {
        self.0.finish_pidfds();
    }

    /// See [`objects::RestoreCtx::finish_tcp`].
    pub fn finish_tcp(&mut self) -> Result<(), RestoreError> {
        Ok(self.0.finish_tcp()?)
    }

    /// See [`objects::RestoreCtx::ghost_for_mapping`].
    pub fn ghost_for_mapping(
        &mut self,
        id: u64,
        name: &str,
        writable: bool,
    ) -> Result<OwnedFd, RestoreError> {
        Ok(self.0.ghost_for_mapping(id, name, writable)?)
    }

    /// [`objects::pty::take_ctty`] with the stub's scratch layout.
    pub fn take_ctty<R: Remote>(
        &mut self,
        r: &mut R,
        sid: i32,
        transport: (&OwnedFd, u64, i32),
    ) -> Result<(), RestoreError> {
        Ok(objects::pty::take_ctty(&mut self.0, r, AT, sid, transport)?)
    }

    /// [`objects::pty::restore_ctty`] with the stub's scratch layout.
    pub fn restore_ctty<R: Remote>(
        &self,
        r: &mut R,
        p: &stasis_image::manifest::ProcessImage,
    ) -> Result<(), RestoreError> {
        Ok(objects::pty::restore_ctty(
            &self.0,
            r,
            AT,
            (p.pid, p.pgid, p.sid),
            &p.fds,
        )?)
    }

    /// Makes io_uring fd `img` in process `pid` (behind `r`; `host` to
    /// the restorer), by the process itself
    /// ([`objects::io_uring::restore_in`]; disabled, to be enabled by its
    /// single issuer, with `later`); another fd of an instance it made
    /// already is a `dup3` of it; one another process made is taken from
    /// it, and its areas mapped from that one's memory (planted through
    /// `transport` at `spare`, a free fd number:
    /// [`objects::io_uring::share_in`]).
    pub fn io_uring<R: Remote>(
        &mut self,
        r: &mut R,
        (pid, host): (i32, i32),
        img: &FdImage,
        later: bool,
        transport: (&OwnedFd, u64),
        spare: i32,
    ) -> Result<(), RestoreError> {
        match self.0.claim_io_uring(pid, host, img)? {
            objects::io_uring::Claim::Make => Ok(objects::io_uring::restore_in(r, AT, img, later)?),
            objects::io_uring::Claim::Dup(src) => {
                let cl = if img.cloexec { libc::O_CLOEXEC } else { 0 };
                let (s, t) = (
                    u64::from(src.unsigned_abs()),
                    u64::from(img.fd.unsigned_abs()),
                );
                r.sys(
                    "dup3",
                    libc::SYS_dup3,
                    &[s, t, u64::from(cl.unsigned_abs())],
                )
                .map_err(crate::build::step(format!(
                    "io_uring fd {}: a dup of fd {src}",
                    img.fd
                )))?;
                Ok(())
            }
            objects::io_uring::Claim::Share {
                pid: from,
                host,
                fd,
            } => {
                objects::io_uring::share_in(r, img, (from, host, fd), &mut |r, m| {
                    objects::plant(r, AT, transport.0, transport.1, (m, spare, true))?;
                    Ok(u64::from(spare.unsigned_abs()))
                })?;
                Ok(())
            }
        }
    }

    /// See [`objects::RestoreCtx::get`].
    pub fn get(&mut self, img: &FdImage) -> Result<FdRef<'_>, RestoreError> {
        Ok(self.0.get(img)?)
    }
}

/// The `msghdr` + `iovec` for receiving one fd, laid out for `scratch`
/// (the scratch address): returned as (bytes of msghdr, bytes of iovec).
pub fn recv_layout(scratch: u64) -> (Vec<u8>, Vec<u8>) {
    objects::restore::recv_layout(scratch + SCRATCH_STRUCT as u64)
}

/// [`objects::plant`] with the stub's scratch layout.
pub fn plant<R: Remote>(
    r: &mut R,
    transport: &OwnedFd,
    remote_transport: u64,
    fd: BorrowedFd<'_>,
    target: i32,
    cloexec: bool,
) -> Result<(), RestoreError> {
    Ok(objects::plant(
        r,
        AT,
        transport,
        remote_transport,
        (fd, target, cloexec),
    )?)
}

/// [`objects::epoll::restore_targets`] with the stub's scratch layout.
pub fn restore_epoll<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    Ok(objects::epoll::restore_targets(r, AT, img)?)
}

/// See [`objects::locks::restore_flock`].
pub fn restore_flock<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    Ok(objects::locks::restore_flock(r, img)?)
}

/// [`objects::locks::restore_posix_locks`] with the stub's scratch layout.
pub fn restore_posix_locks<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    Ok(objects::locks::restore_posix_locks(r, AT, img)?)
}

/// The signal owner of `img`'s description (`F_SETOWN_EX`, `F_SETSIG`),
/// set by the process itself: its ids are those of its PID namespace. And
/// for an `O_ASYNC` file, `O_ASYNC` set again by the process: the kernel
/// records the fd number its signals carry (`si_fd`) when the flag is
/// set, which the restorer did on an fd of its own.
pub fn restore_owner<R: Remote>(s: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    let fd = u64::from(img.fd.unsigned_abs());
    let step = |what: String| crate::build::step(what);
    if let Some(o) = img.owner {
        let mut ex = o.kind.to_le_bytes().to_vec();
        ex.extend_from_slice(&o.pid.to_le_bytes());
        let what = || {
            format!(
                "giving fd {} its signal owner {} (signal {})",
                img.fd, o.pid, o.signal
            )
        };
        let a = s.put(SCRATCH_STRUCT, &ex).map_err(step(what()))?;
        s.sys(
            "fcntl(F_SETOWN_EX)",
            libc::SYS_fcntl,
            &[fd, stasis_sys::F_SETOWN_EX as u64, a],
        )
        .map_err(step(what()))?;
        s.sys(
            "fcntl(F_SETSIG)",
            libc::SYS_fcntl,
            &[
                fd,
                stasis_sys::F_SETSIG as u64,
                u64::from(o.signal.unsigned_abs()),
            ],
        )
        .map_err(step(what()))?;
    }
    let async_flag = libc::O_ASYNC.unsigned_abs();
    if img.flags & async_flag != 0 {
        let settable =
            (libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME).unsigned_abs();
        let without = u64::from(img.flags & settable);
        let what = || format!("setting O_ASYNC again on fd {}", img.fd);
        let setfl = libc::F_SETFL as u64;
        s.sys("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, setfl, without])
            .map_err(step(what()))?;
        s.sys(
            "fcntl(F_SETFL)",
            libc::SYS_fcntl,
            &[fd, setfl, without | u64::from(async_flag)],
        )
        .map_err(step(what()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;
    use stasis_image::manifest::{EpollTarget, FdKind, FileLock, LockKind};

    #[test]
    fn reopen_flags_strip_creation_and_add_cloexec() {
        let f = reopen_flags(
            (libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_TRUNC).unsigned_abs(),
        );
        assert_eq!(f, libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC);
    }

    /// Regression: Open MPI's deleted `/dev/shm/open_mpi.0000` (from
    /// `shm_open`, so `O_NOFOLLOW`) was reopened through `/proc/self/fd/N`
    /// with `O_NOFOLLOW`, which fails with `ELOOP` on that symlink.
    #[test]
    fn reopen_flags_strip_nofollow() {
        let saved =
            (libc::O_RDWR | libc::O_NOFOLLOW | libc::O_LARGEFILE | libc::O_CLOEXEC).unsigned_abs();
        let f = reopen_flags(saved);
        assert_eq!(f & libc::O_NOFOLLOW, 0);
        assert_eq!(f, libc::O_RDWR | libc::O_LARGEFILE | libc::O_CLOEXEC);
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(format!("stasis-nofollow-{}", std::process::id()));
        let keep = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let via = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&keep));
        let reopen = |flags| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(&via)
        };
        let e = reopen(reopen_flags(saved) | libc::O_NOFOLLOW).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        reopen(reopen_flags(saved)).expect("a deleted file reopened with the saved flags");
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
    fn the_owner_then_o_async_again_by_the_process() {
        let mut img = FdImage {
            fd: 5,
            flags: (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_ASYNC).unsigned_abs(),
            cloexec: false,
            shared_id: None,
            owner: None,
            locks: vec![],
            kind: stasis_image::manifest::FdKind::Pipe {
                id: 1,
                write_end: false,
            },
        };
        let mut r = Recorder::default();
        restore_owner(&mut r, &img).unwrap();
        let nb = libc::O_NONBLOCK as u64;
        assert_eq!(
            r.args_of("fcntl(F_SETFL)"),
            [
                vec![5, libc::F_SETFL as u64, nb],
                vec![5, libc::F_SETFL as u64, nb | libc::O_ASYNC as u64]
            ]
        );
        img.flags = 0;
        img.owner = Some(stasis_image::manifest::FileOwner {
            kind: 2,
            pid: 77,
            signal: 40,
        });
        let mut r = Recorder::default();
        restore_owner(&mut r, &img).unwrap();
        assert_eq!(r.names(), ["fcntl(F_SETOWN_EX)", "fcntl(F_SETSIG)"]);
        assert!(r.writes().contains(&[2, 0, 0, 0, 77, 0, 0, 0].to_vec()));
        assert_eq!(r.args_of("fcntl(F_SETSIG)")[0][2], 40);
    }

    #[test]
    fn posix_locks_are_taken_by_the_process() {
        let mut r = Recorder::default();
        let img = FdImage {
            fd: 7,
            flags: 0,
            cloexec: false,
            shared_id: None,
            owner: None,
            locks: vec![
                FileLock {
                    kind: LockKind::Posix,
                    write: true,
                    start: 5,
                    len: 10,
                },
                FileLock {
                    kind: LockKind::Flock,
                    write: false,
                    start: 0,
                    len: 0,
                },
            ],
            kind: FdKind::Path {
                path: "/x".into(),
                pos: 0,
                mode: libc::S_IFREG,
                size: 0,
            },
        };
        restore_posix_locks(&mut r, &img).unwrap();
        // Only the POSIX lock here; the flock one is taken by `restore_flock`.
        assert_eq!(r.args_of("fcntl(F_SETLK)").len(), 1);
        assert!(r.args_of("flock").is_empty());
        restore_flock(&mut r, &img).unwrap();
        assert_eq!(
            r.args_of("flock"),
            vec![vec![7, (libc::LOCK_SH | libc::LOCK_NB) as u64]]
        );
        assert_eq!(
            r.args_of("fcntl(F_SETLK)")[0][..2],
            [7, libc::F_SETLK as u64]
        );
        let fl = flock_struct(&img.locks[0]);
        assert_eq!(fl.len(), 32);
        assert_eq!(
            i16::from_le_bytes([fl[0], fl[1]]),
            i16::try_from(libc::F_WRLCK).unwrap()
        );
        assert_eq!(u64::from_le_bytes(fl[8..16].try_into().unwrap()), 5);
        assert_eq!(u64::from_le_bytes(fl[16..24].try_into().unwrap()), 10);
    }

    #[test]
    fn epoll_targets_are_registered_by_number() {
        let mut r = Recorder::default();
        let img = FdImage {
            fd: 5,
            flags: 0,
            cloexec: true,
            shared_id: None,
            locks: vec![],
            owner: None,
            kind: FdKind::Epoll {
                targets: vec![
                    EpollTarget {
                        fd: 3,
                        events: 1,
                        data: 0xabc,
                        source: None,
                    },
                    EpollTarget {
                        fd: 4,
                        events: 4,
                        data: 9,
                        source: None,
                    },
                ],
                registrar: None,
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
        let ev = r.writes()[0].clone();
        assert_eq!(ev.len(), 12);
        assert_eq!(u64::from_le_bytes(ev[4..12].try_into().unwrap()), 0xabc);
    }
}
