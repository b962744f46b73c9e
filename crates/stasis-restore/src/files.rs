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

use stasis_image::manifest::{
    FdImage, FdKind, FileLock, GhostFile, InetSocket, InetState, LockKind, PipeImage, TcpRepair,
    UnixSocket, UnixState,
};
use stasis_kernel::{scm, sock, tcpdiag, KernelError};

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
    /// Every unix socket of the image, by inode (to find peers' queues).
    unix_images: HashMap<u64, &'a UnixSocket>,
    /// Sockets created as the peer of an earlier one, waiting for their fd.
    pending_sockets: HashMap<u64, OwnedFd>,
    ghost_data: HashMap<u64, &'a GhostFile>,
    /// One open fd per rebuilt deleted file or memfd (descriptions are
    /// reopened from it through /proc/self/fd).
    ghost_keepers: HashMap<u64, OwnedFd>,
    /// TCP connections rebuilt in repair mode, made live at the end.
    pending_tcp: Vec<PendingTcp>,
    /// Shared epoll descriptions already given their registrations.
    epolls_filled: std::collections::HashSet<u32>,
    flocks_taken: std::collections::HashSet<u32>,
    /// Working directory of the process whose fds are being made: unix
    /// socket names relative to it are bound and connected there, not in
    /// the restorer's own directory.
    cwd: String,
}

impl<'a> FdFactory<'a> {
    pub fn new(
        pipes: &'a [PipeImage],
        ghosts: &'a [GhostFile],
        fds: impl Iterator<Item = &'a FdImage>,
    ) -> Self {
        let unix_images = fds
            .filter_map(|f| {
                if let FdKind::Unix(u) = &f.kind {
                    Some((u.ino, u))
                } else {
                    None
                }
            })
            .collect();
        Self {
            shared: HashMap::new(),
            pipes: HashMap::new(),
            fifo_keepers: HashMap::new(),
            pipe_data: pipes.iter().map(|p| (p.id, p)).collect(),
            unix_images,
            pending_sockets: HashMap::new(),
            ghost_data: ghosts.iter().map(|g| (g.id, g)).collect(),
            ghost_keepers: HashMap::new(),
            pending_tcp: Vec::new(),
            epolls_filled: std::collections::HashSet::new(),
            flocks_taken: std::collections::HashSet::new(),
            cwd: String::new(),
        }
    }

    /// Sets the working directory of the process whose fds come next.
    pub fn set_cwd(&mut self, cwd: &str) {
        self.cwd = cwd.to_string();
    }

    /// True the first time it is asked about an epoll description (always
    /// for an unshared one): its registrations are to be made then.
    pub fn claim_epoll(&mut self, img: &FdImage) -> bool {
        match (&img.kind, img.shared_id) {
            (FdKind::Epoll { .. }, Some(id)) => self.epolls_filled.insert(id),
            (FdKind::Epoll { .. }, None) => true,
            _ => false,
        }
    }

    /// Whether the process planting `img` should take its flock lock: once
    /// per open file description.
    pub fn claim_flock(&mut self, img: &FdImage) -> bool {
        if !img.locks.iter().any(|l| l.kind == LockKind::Flock) {
            return false;
        }
        match img.shared_id {
            Some(id) => self.flocks_taken.insert(id),
            None => true,
        }
    }

    /// Takes every rebuilt TCP connection out of repair mode, once all
    /// sockets of the tree exist (no packet may reach a missing peer).
    pub fn finish_tcp(&mut self) -> Result<(), RestoreError> {
        let pending = std::mem::take(&mut self.pending_tcp);
        // Queues refilled last (their retransmit timers start now), every
        // end out of repair next (a socket in repair mode drops what reaches
        // it), then the never-sent bytes.
        for p in &pending {
            p.fill()?;
        }
        for p in &pending {
            p.leave_repair()?;
        }
        for p in pending {
            p.send_unsent()?;
        }
        Ok(())
    }

    /// An fd on the rebuilt deleted file or memfd `id` (named `name` at
    /// dump: `/memfd:...` or a path), to map it.
    pub fn ghost_for_mapping(
        &mut self,
        id: u64,
        name: &str,
        writable: bool,
    ) -> Result<OwnedFd, RestoreError> {
        let memfd = name.strip_prefix("/memfd:");
        let keeper = self.ghost(id, if memfd.is_none() { Some(name) } else { None }, memfd)?;
        std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", keeper.as_raw_fd()))
            .map(OwnedFd::from)
            .map_err(|e| RestoreError::File {
                path: name.into(),
                what: "a mapped deleted file or memfd".into(),
                source: KernelError::Io {
                    what: "reopen".into(),
                    source: e,
                },
            })
    }

    /// The keeper fd of a deleted file (`path`) or memfd (`memfd` name),
    /// made on first use: created, filled, sealed or unlinked.
    fn ghost(
        &mut self,
        id: u64,
        path: Option<&str>,
        memfd: Option<&str>,
    ) -> Result<&OwnedFd, RestoreError> {
        if !self.ghost_keepers.contains_key(&id) {
            let g = *self.ghost_data.get(&id).ok_or_else(|| {
                RestoreError::Inconsistent(format!(
                    "no saved content for deleted file or memfd {id}"
                ))
            })?;
            let keeper = match memfd {
                Some(name) => {
                    let cname = std::ffi::CString::new(name).map_err(|_| {
                        RestoreError::Inconsistent(format!("memfd name {name:?} has a NUL"))
                    })?;
                    let sealable = g.seals & !libc::F_SEAL_SEAL.unsigned_abs() != 0 || g.seals == 0;
                    let flags =
                        libc::MFD_CLOEXEC | if sealable { libc::MFD_ALLOW_SEALING } else { 0 };
                    // SAFETY: memfd_create with a valid C string returns a new fd or -1.
                    let k = owned(
                        unsafe { libc::memfd_create(cname.as_ptr(), flags) },
                        "memfd_create",
                    )?;
                    write_sparse(&k, g)?;
                    if g.seals != 0 && sealable {
                        // SAFETY: F_ADD_SEALS on our memfd.
                        if unsafe {
                            libc::fcntl(
                                k.as_raw_fd(),
                                libc::F_ADD_SEALS,
                                i32::try_from(g.seals).unwrap_or(0),
                            )
                        } < 0
                        {
                            return Err(RestoreError::Step {
                                what: format!("sealing memfd {name}"),
                                source: os_err("F_ADD_SEALS"),
                            });
                        }
                    }
                    k
                }
                None => {
                    let path = path.unwrap_or("/tmp/stasis-ghost");
                    // Recreate it under its own name when that is free (so it
                    // shows as "PATH (deleted)" again), else next to it.
                    let mut target = std::path::PathBuf::from(path);
                    if target.exists() || !target.parent().is_some_and(std::path::Path::exists) {
                        let dir = target
                            .parent()
                            .filter(|d| d.exists())
                            .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf);
                        target = dir.join(format!(".stasis-ghost-{id}-{}", std::process::id()));
                    }
                    let k: OwnedFd = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .mode(g.mode & 0o7777)
                        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                        .open(&target)
                        .map_err(|e| RestoreError::File {
                            path: target.display().to_string(),
                            what: "recreating a deleted file".into(),
                            source: KernelError::Io {
                                what: "open".into(),
                                source: e,
                            },
                        })?
                        .into();
                    let filled = write_sparse(&k, g);
                    let _ = std::fs::remove_file(&target);
                    filled?;
                    k
                }
            };
            self.ghost_keepers.insert(id, keeper);
        }
        Ok(&self.ghost_keepers[&id])
    }

    fn unix_socket(&mut self, fd: i32, u: &UnixSocket) -> Result<OwnedFd, RestoreError> {
        if let Some(s) = self.pending_sockets.remove(&u.ino) {
            return Ok(s);
        }
        let what = |w: &str| format!("{w} (unix socket of fd {fd})");
        let s = match &u.state {
            UnixState::Listening { backlog } => {
                let s = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
                set_options(&s, &u.options);
                bind_unix(&s, u.name.as_deref().unwrap_or_default(), &self.cwd).map_err(|e| {
                    RestoreError::Socket {
                        what: what("binding"),
                        source: e,
                    }
                })?;
                // SAFETY: listen on a socket we own.
                if unsafe { libc::listen(s.as_raw_fd(), i32::try_from(*backlog).unwrap_or(128)) }
                    < 0
                {
                    return Err(RestoreError::Socket {
                        what: what("listening"),
                        source: std::io::Error::last_os_error(),
                    });
                }
                s
            }
            UnixState::Connected { peer, .. } if self.unix_images.contains_key(peer) => {
                let (a, b) = sock::unix_pair(u.sock_type)?;
                let peer_img = self.unix_images[peer];
                set_options(&a, &u.options);
                set_options(&b, &peer_img.options);
                for (s, img) in [(&a, u), (&b, peer_img)] {
                    if let Some(n) = img.name.as_deref().filter(|n| !n.is_empty()) {
                        if let Err(e) = bind_unix(s, n, &self.cwd) {
                            tracing::warn!(fd, "could not give a unix socket back its name: {e}");
                        }
                    }
                }
                // What each end had queued arrives by its peer.
                for (from, img) in [(&b, u), (&a, peer_img)] {
                    refill(from, img)?;
                }
                self.pending_sockets.insert(*peer, b);
                a
            }
            UnixState::Connected {
                peer_name: Some(n), ..
            } => {
                let s = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
                set_options(&s, &u.options);
                if let Some(own) = u.name.as_deref().filter(|n| !n.is_empty()) {
                    bind_unix(&s, own, &self.cwd).map_err(|e| RestoreError::Socket {
                        what: what("binding"),
                        source: e,
                    })?;
                }
                connect_unix(&s, n, &self.cwd).map_err(|e| RestoreError::Socket {
                    what: what("reconnecting to its peer by name"),
                    source: e,
                })?;
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
            UnixState::Unconnected => {
                let s = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
                set_options(&s, &u.options);
                if let Some(n) = u.name.as_deref().filter(|n| !n.is_empty()) {
                    bind_unix(&s, n, &self.cwd).map_err(|e| RestoreError::Socket {
                        what: what("binding"),
                        source: e,
                    })?;
                    if !u.queue.is_empty() {
                        let tmp = sock::socket(libc::AF_UNIX, u.sock_type, 0)?;
                        connect_unix(&tmp, n, &self.cwd).map_err(|e| RestoreError::Socket {
                            what: what("refilling"),
                            source: e,
                        })?;
                        refill(&tmp, u)?;
                    }
                }
                s
            }
        };
        Ok(s)
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
                let value = crate::build::armed_value(*value_ns, *interval_ns).unwrap_or(0);
                let spec = libc::itimerspec {
                    it_interval: ts(*interval_ns),
                    it_value: ts(value),
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
                let e = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
                owned(e, "epoll_create1")?
            }
            FdKind::Ghost { path, id, pos }
            | FdKind::Memfd {
                name: path,
                id,
                pos,
            } => {
                let memfd = matches!(img.kind, FdKind::Memfd { .. });
                let keeper = self.ghost(
                    *id,
                    (!memfd).then_some(path.as_str()),
                    memfd.then_some(path.as_str()),
                )?;
                let reopen = format!("/proc/self/fd/{}", keeper.as_raw_fd());
                let o: OwnedFd = std::fs::OpenOptions::new()
                    .custom_flags(reopen_flags(img.flags))
                    .open_with_mode(&reopen, img.flags)
                    .map_err(|e| RestoreError::File {
                        path: path.clone(),
                        what: format!("fd {fd} (deleted file or memfd)"),
                        source: KernelError::Io {
                            what: "reopen".into(),
                            source: e,
                        },
                    })?
                    .into();
                // SAFETY: lseek on an fd we own.
                if unsafe {
                    libc::lseek(
                        o.as_raw_fd(),
                        i64::try_from(*pos).unwrap_or(0),
                        libc::SEEK_SET,
                    )
                } < 0
                {
                    return Err(RestoreError::Step {
                        what: format!("seeking fd {fd} to {pos}"),
                        source: os_err("lseek"),
                    });
                }
                o
            }
            FdKind::Inotify { watches } => inotify(fd, img.flags, watches)?,
            FdKind::Unix(u) => self.unix_socket(fd, u)?,
            FdKind::Inet(i) => inet_socket(fd, i, &mut self.pending_tcp)?,
        };
        if matches!(img.kind, FdKind::Unix(_) | FdKind::Inet(_)) {
            // SAFETY: F_SETFL on a socket we own.
            unsafe {
                libc::fcntl(
                    made.as_raw_fd(),
                    libc::F_SETFL,
                    i32::try_from(img.flags & SETFL_MASK).unwrap_or(0),
                )
            };
        }
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
        // OFD locks are owned by the description: taken here, once. (flock
        // locks too, but /proc shows who took them: the process takes them,
        // see `restore_flock`.)
        for l in img.locks.iter().filter(|l| l.kind == LockKind::Ofd) {
            take_ofd_lock(&made, l).map_err(|e| RestoreError::Locked {
                fd,
                what: format!(
                    "{:?} {} lock",
                    l.kind,
                    if l.write { "write" } else { "read" }
                ),
                source: e,
            })?;
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

/// `struct flock` bytes for a lock.
pub fn flock_struct(l: &FileLock) -> Vec<u8> {
    let ty = if l.write {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&i16::try_from(ty).unwrap_or(0).to_le_bytes());
    b.extend_from_slice(&i16::try_from(libc::SEEK_SET).unwrap_or(0).to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&l.start.to_le_bytes());
    b.extend_from_slice(&l.len.to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    b
}

fn take_ofd_lock(f: &OwnedFd, l: &FileLock) -> std::io::Result<()> {
    let r = match l.kind {
        LockKind::Flock => {
            let op = if l.write {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            } | libc::LOCK_NB;
            // SAFETY: flock on an fd we own.
            unsafe { libc::flock(f.as_raw_fd(), op) }
        }
        _ => {
            let fl = flock_struct(l);
            // SAFETY: F_OFD_SETLK reads a struct flock (32 bytes) from the pointer.
            unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, fl.as_ptr()) }
        }
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes the flock lock of `img` from inside the process, so that `/proc`
/// names it as the holder (as it was at the dump).
pub fn restore_flock<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    for l in img.locks.iter().filter(|l| l.kind == LockKind::Flock) {
        let op = if l.write {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        } | libc::LOCK_NB;
        r.sys(
            "flock",
            libc::SYS_flock,
            &[u64::from(img.fd.unsigned_abs()), op.unsigned_abs().into()],
        )
        .map_err(|e| RestoreError::Step {
            what: format!(
                "taking back the flock lock on fd {} (is the file locked by another process?)",
                img.fd
            ),
            source: e,
        })?;
    }
    Ok(())
}

/// Takes the POSIX (process-owned) locks of `img` from inside the process.
pub fn restore_posix_locks<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    for l in img.locks.iter().filter(|l| l.kind == LockKind::Posix) {
        let a = r
            .put(SCRATCH_STRUCT, &flock_struct(l))
            .map_err(step("struct flock"))?;
        r.sys(
            "fcntl(F_SETLK)",
            libc::SYS_fcntl,
            &[
                u64::from(img.fd.unsigned_abs()),
                libc::F_SETLK.unsigned_abs().into(),
                a,
            ],
        )
        .map_err(|e| RestoreError::Step {
            what: format!(
                "taking back the POSIX lock on fd {} (is the file locked by another process?)",
                img.fd
            ),
            source: e,
        })?;
    }
    Ok(())
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
/// process is removed first.
fn bind_unix(s: &OwnedFd, name: &[u8], cwd: &str) -> std::io::Result<()> {
    at_cwd(name, cwd, || {
        if let Some(&first) = name.first() {
            if first != 0 {
                use std::os::unix::ffi::OsStrExt;
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&name[..end]));
                use std::os::unix::fs::FileTypeExt;
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        sock::bind(s.as_fd(), &sockaddr_un(name))
    })
}

fn connect_unix(s: &OwnedFd, name: &[u8], cwd: &str) -> std::io::Result<()> {
    at_cwd(name, cwd, || sock::connect(s.as_fd(), &sockaddr_un(name)))
}

/// Applies saved socket options (best effort: a value the kernel clamps or
/// refuses is logged). Buffer sizes are halved: the kernel doubles them.
fn set_options(s: &OwnedFd, opts: &[(i32, i32, i32)]) {
    for &(level, opt, v) in opts {
        let v = if level == libc::SOL_SOCKET && (opt == libc::SO_RCVBUF || opt == libc::SO_SNDBUF) {
            v / 2
        } else {
            v
        };
        if let Err(e) = sock::set_int(s.as_fd(), level, opt, v) {
            tracing::debug!("socket option ({level}, {opt}) = {v}: {e}");
        }
    }
}

fn inet_socket(
    fd: i32,
    i: &InetSocket,
    pending: &mut Vec<PendingTcp>,
) -> Result<OwnedFd, RestoreError> {
    let s = sock::socket(i.family, i.sock_type, i.protocol)?;
    let sock_err = |w: String, e: std::io::Error| RestoreError::Socket {
        what: format!("{w} (fd {fd})"),
        source: e,
    };
    // Options that must come before bind (V6ONLY, REUSEADDR, REUSEPORT...).
    set_options(&s, &i.options);
    match &i.state {
        InetState::Listening { backlog } => {
            let _ = sock::set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
            sock::bind(s.as_fd(), &i.local).map_err(|e| {
                if e.raw_os_error() == Some(libc::EADDRINUSE) {
                    RestoreError::PortTaken {
                        fd,
                        port: port_of(&i.local),
                    }
                } else {
                    sock_err("binding a listening socket".into(), e)
                }
            })?;
            // SAFETY: listen on a socket we own.
            if unsafe { libc::listen(s.as_raw_fd(), i32::try_from(*backlog).unwrap_or(128)) } < 0 {
                return Err(sock_err(
                    "listening".into(),
                    std::io::Error::last_os_error(),
                ));
            }
            set_options(&s, &i.options);
        }
        InetState::Established(r) => {
            restore_tcp(fd, &s, i, r)?;
            pending.push(PendingTcp {
                fd,
                sock: scm::dup_at_least(s.as_fd(), 3)?,
                repair: r.clone(),
                options: i.options.clone(),
            });
            return Ok(s);
        }
        InetState::Plain => {
            if !sock::port_is_zero(&i.local) {
                sock::bind(s.as_fd(), &i.local)
                    .map_err(|e| sock_err(format!("binding port {}", port_of(&i.local)), e))?;
            }
            if !i.peer.is_empty() {
                sock::connect(s.as_fd(), &i.peer).map_err(|e| sock_err("connecting".into(), e))?;
            }
            if !i.datagrams.is_empty() {
                requeue_datagrams(fd, &s, i)?;
            }
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
        sock::inject_udp_v4(from, &local, data).map_err(err)?;
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

/// The port of a raw inet address.
pub fn port_of(addr: &[u8]) -> u16 {
    addr.get(2..4)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// Rebuilds an established TCP connection with `TCP_REPAIR`: sequence
/// numbers, a handshake-less connect, negotiated options, window, the
/// queues, then out of repair mode (without a window probe) and the
/// never-sent bytes sent normally.
fn restore_tcp(fd: i32, s: &OwnedFd, i: &InetSocket, r: &TcpRepair) -> Result<(), RestoreError> {
    let b = s.as_fd();
    let tcp = libc::IPPROTO_TCP;
    let step_err = |w: &'static str| {
        move |e: KernelError| RestoreError::Step {
            what: format!("{w} of the TCP connection of fd {fd}"),
            source: e,
        }
    };
    sock::set_int(b, tcp, sock::TCP_REPAIR, 1)
        .map_err(step_err("entering repair mode (needs CAP_NET_ADMIN)"))?;
    // (Repair mode also forces address reuse: an accepted connection binds
    // the port its listener holds. SO_REUSEADDR must not be set after it.)
    let sent = r.send_queue.len() - (r.unsent as usize).min(r.send_queue.len());
    let seq = |v: u32, back: usize| v.wrapping_sub(u32::try_from(back).unwrap_or(0));
    // Each queue starts where its saved bytes begin.
    for (queue, next, len) in [
        (sock::TCP_SEND_QUEUE, r.snd_seq, r.send_queue.len()),
        (sock::TCP_RECV_QUEUE, r.rcv_seq, r.recv_queue.len()),
    ] {
        sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, queue)
            .map_err(step_err("selecting a queue"))?;
        sock::set_int(
            b,
            tcp,
            sock::TCP_QUEUE_SEQ,
            i32::from_ne_bytes(seq(next, len).to_ne_bytes()),
        )
        .map_err(step_err("setting a queue's sequence"))?;
    }
    // The segment size. The handshake-less connect computes it, once, from
    // the MSS clamp in force then (536 by default: no SYN-ACK brings the
    // peer's), and TCP_REPAIR_OPTIONS does not recompute it: 536-byte
    // segments on loopback overflow the receiver's buffer (each costs a
    // whole buffer's truesize), get dropped, and the connection stalls in
    // retransmit backoff. So the clamp is set, for the connect, to the size
    // the connection used (bounded, as it was, by half the largest window
    // seen: the peer's MSS itself would stall a peer with a small window
    // in sender-side silly-window avoidance), and cleared after it.
    let ts = if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        12
    } else {
        0
    };
    // (TCP_MAXSEG takes at most 32767: loopback's 64 KiB segments become
    // 32 KiB ones, still far from 536.)
    let seg = r.snd_mss.saturating_add(ts).min(32_767);
    if r.snd_mss > 0 {
        sock::set_int(b, tcp, libc::TCP_MAXSEG, i32::try_from(seg).unwrap_or(0))
            .map_err(step_err("setting the segment size"))?;
    }
    sock::bind(b, &i.local).map_err(|e| {
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            RestoreError::PortTaken {
                fd,
                port: port_of(&i.local),
            }
        } else {
            RestoreError::Socket {
                what: format!("binding the TCP connection of fd {fd}"),
                source: e,
            }
        }
    })?;
    reconnect(fd, b, i)?;
    let mut opts: Vec<u8> = Vec::new();
    let mut opt = |code: u32, val: u32| {
        opts.extend_from_slice(&code.to_ne_bytes());
        opts.extend_from_slice(&val.to_ne_bytes());
    };
    opt(sock::TCPOPT_MAXSEG, r.mss);
    if r.tcpi_options & sock::TCPI_OPT_WSCALE != 0 {
        opt(
            sock::TCPOPT_WINDOW,
            u32::from(r.snd_wscale) | (u32::from(r.rcv_wscale) << 16),
        );
    }
    if r.tcpi_options & sock::TCPI_OPT_SACK != 0 {
        opt(sock::TCPOPT_SACK_PERM, 0);
    }
    if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        opt(sock::TCPOPT_TIMESTAMP, 0);
    }
    sock::set_bytes(b, tcp, sock::TCP_REPAIR_OPTIONS, &opts)
        .map_err(step_err("restoring negotiated options"))?;
    if r.snd_mss > 0 {
        sock::set_int(b, tcp, libc::TCP_MAXSEG, 0)
            .map_err(step_err("clearing the segment size clamp"))?;
    }
    if r.tcpi_options & sock::TCPI_OPT_TIMESTAMPS != 0 {
        sock::set_int(
            b,
            tcp,
            sock::TCP_TIMESTAMP,
            i32::from_ne_bytes(r.timestamp.to_ne_bytes()),
        )
        .map_err(step_err("restoring the timestamp"))?;
    }
    // The queues are refilled later (`PendingTcp::fill`): data in the send
    // queue arms the retransmit timer, which must not fire before every
    // socket of the tree exists, or its peer would answer with a reset.
    let _ = sent;
    Ok(())
}

/// The handshake-less connect of a connection in repair mode. If the
/// address pair is still held by an orphan (the same connection of a
/// process that died since the checkpoint, still closing: `EADDRNOTAVAIL`),
/// the orphan is closed and the connect tried again; a socket some process
/// holds is never touched.
fn reconnect(fd: i32, b: BorrowedFd<'_>, i: &InetSocket) -> Result<(), RestoreError> {
    let fail = |e: std::io::Error| RestoreError::Socket {
        what: format!("reconnecting the TCP connection of fd {fd} in repair mode"),
        source: e,
    };
    let Err(e) = sock::connect(b, &i.peer) else {
        return Ok(());
    };
    if e.raw_os_error() != Some(libc::EADDRNOTAVAIL) {
        return Err(fail(e));
    }
    let orphans = tcpdiag::destroy_orphans(&i.local, &i.peer).map_err(|k| RestoreError::Step {
        what: format!(
            "closing the orphaned socket (of the process that died) that holds the address pair of the TCP connection of fd {fd}"
        ),
        source: k,
    })?;
    if orphans.destroyed == 0 {
        return Err(RestoreError::Socket {
            what: format!(
                "reconnecting the TCP connection of fd {fd} in repair mode: its address pair is held by a socket of another process ({} found)",
                orphans.owned
            ),
            source: e,
        });
    }
    tracing::info!(
        fd,
        ?orphans,
        "closed the orphaned copy of a restored TCP connection"
    );
    sock::connect(b, &i.peer).map_err(fail)
}

/// A TCP connection rebuilt in repair mode, waiting to go live.
pub struct PendingTcp {
    fd: i32,
    sock: OwnedFd,
    repair: TcpRepair,
    options: Vec<(i32, i32, i32)>,
}

impl PendingTcp {
    /// Refills both queues (still in repair mode: nothing is sent) and
    /// restores the window.
    fn fill(&self) -> Result<(), RestoreError> {
        let (b, r, tcp) = (self.sock.as_fd(), &self.repair, libc::IPPROTO_TCP);
        let err = |w: &str| {
            let what = format!("{w} of the TCP connection of fd {}", self.fd);
            move |e: KernelError| RestoreError::Step { what, source: e }
        };
        // Make room for the queues (SO_*BUFFORCE needs CAP_NET_ADMIN).
        let room = i32::try_from((r.send_queue.len().max(r.recv_queue.len()) * 2).max(65536))
            .unwrap_or(i32::MAX);
        let _ = sock::set_int(b, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, room);
        let _ = sock::set_int(b, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, room);
        sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_RECV_QUEUE)
            .map_err(err("selecting the receive queue"))?;
        for chunk in r.recv_queue.chunks(64 * 1024) {
            sock::send_all(b, chunk).map_err(err("refilling the receive queue"))?;
        }
        sock::set_int(b, tcp, sock::TCP_REPAIR_QUEUE, sock::TCP_SEND_QUEUE)
            .map_err(err("selecting the send queue"))?;
        for chunk in r.send_queue[..self.sent()].chunks(64 * 1024) {
            sock::send_all(b, chunk).map_err(err("refilling the send queue"))?;
        }
        let window: Vec<u8> = r.window.iter().flat_map(|w| w.to_ne_bytes()).collect();
        sock::set_bytes(b, tcp, sock::TCP_REPAIR_WINDOW, &window)
            .map_err(err("restoring the window"))
    }

    /// Bytes of the send queue that had been sent (the rest never was).
    fn sent(&self) -> usize {
        let r = &self.repair;
        r.send_queue.len() - (r.unsent as usize).min(r.send_queue.len())
    }

    /// Leaves repair mode. A window probe goes out, so each side learns the
    /// other's current window at once (both sides exist by now).
    fn leave_repair(&self) -> Result<(), RestoreError> {
        sock::set_int(self.sock.as_fd(), libc::IPPROTO_TCP, sock::TCP_REPAIR, 0).map_err(|e| {
            RestoreError::Step {
                what: format!(
                    "leaving repair mode of the TCP connection of fd {}",
                    self.fd
                ),
                source: e,
            }
        })
    }

    /// Queues the bytes that were never sent and puts the saved options back.
    fn send_unsent(self) -> Result<(), RestoreError> {
        send_waiting(&self.sock, &self.repair.send_queue[self.sent()..]).map_err(|e| {
            RestoreError::Step {
                what: format!(
                    "queueing the never-sent bytes of the TCP connection of fd {}",
                    self.fd
                ),
                source: e,
            }
        })?;
        set_options(&self.sock, &self.options);
        Ok(())
    }
}

/// Sends everything, waiting (up to 10 s per stall) when the socket is
/// non-blocking and its buffer is full.
fn send_waiting(s: &OwnedFd, data: &[u8]) -> Result<(), KernelError> {
    let mut off = 0;
    while off < data.len() {
        // SAFETY: sending from our buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                data[off..].as_ptr().cast(),
                data.len() - off,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            off += usize::try_from(n).unwrap_or(0);
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                let mut p = libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: poll on one pollfd we own.
                if unsafe { libc::poll(&mut p, 1, 10_000) } <= 0 {
                    return Err(KernelError::Io {
                        what: format!(
                            "sending {} bytes: the peer does not take them",
                            data.len() - off
                        ),
                        source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
                    });
                }
            }
            _ => {
                return Err(KernelError::Io {
                    what: format!("sending {} queued bytes", data.len()),
                    source: e,
                })
            }
        }
    }
    Ok(())
}

/// An inotify instance with its watches at their watch descriptors
/// (descriptors are allocated in increasing order, so gaps are skipped by
/// adding and removing a throw-away watch).
fn inotify(
    fd: i32,
    flags: u32,
    watches: &[stasis_image::manifest::InotifyWatch],
) -> Result<OwnedFd, RestoreError> {
    let nb = if flags & libc::O_NONBLOCK.unsigned_abs() != 0 {
        libc::IN_NONBLOCK
    } else {
        0
    };
    // SAFETY: inotify_init1 returns a new fd or -1.
    let i = owned(
        unsafe { libc::inotify_init1(libc::IN_CLOEXEC | nb) },
        "inotify_init1",
    )?;
    let add = |path: &str, mask: u32| -> Result<i32, RestoreError> {
        let c = std::ffi::CString::new(path)
            .map_err(|_| RestoreError::Inconsistent(format!("watch path {path:?} has a NUL")))?;
        // SAFETY: inotify_add_watch with a valid C string.
        let wd = unsafe { libc::inotify_add_watch(i.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(RestoreError::File {
                path: path.into(),
                what: format!("inotify watch of fd {fd}"),
                source: os_err("inotify_add_watch"),
            });
        }
        Ok(wd)
    };
    for w in watches {
        loop {
            let wd = add(&w.path, w.mask)?;
            if wd == w.wd {
                break;
            }
            if wd > w.wd {
                return Err(RestoreError::Inconsistent(format!(
                    "fd {fd}: inotify watch {} came back as {wd} (two watches on one file?)",
                    w.wd
                )));
            }
            // Burn this descriptor and try again.
            // SAFETY: removing a watch we just added.
            unsafe { libc::inotify_rm_watch(i.as_raw_fd(), wd) };
        }
    }
    // Drop the IN_IGNORED events the burnt descriptors queued (events that
    // were pending at dump time are not part of the image either).
    let mut buf = [0u8; 4096];
    // SAFETY: fcntl and read on our own inotify fd, into our buffer.
    unsafe {
        let fl = libc::fcntl(i.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(i.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        while libc::read(i.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) > 0 {}
        libc::fcntl(i.as_raw_fd(), libc::F_SETFL, fl);
    }
    Ok(i)
}

fn write_all(f: &OwnedFd, mut data: &[u8], what: &str) -> Result<(), RestoreError> {
    while !data.is_empty() {
        let source = match nix::unistd::write(f, data) {
            Ok(0) => std::io::ErrorKind::WriteZero.into(),
            Ok(n) => {
                data = &data[n..];
                continue;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => std::io::Error::from(e),
        };
        return Err(RestoreError::Step {
            what: what.into(),
            source: KernelError::Io {
                what: "write".into(),
                source,
            },
        });
    }
    Ok(())
}

/// Writes the content of a deleted file or memfd into the new, empty file
/// `f`: each data extent at its offset, then the size; the rest stays
/// holes, as it was.
fn write_sparse(f: &OwnedFd, g: &GhostFile) -> Result<(), RestoreError> {
    use std::os::unix::fs::FileExt;
    let what = "writing the content of a deleted file or memfd";
    let err = |e: std::io::Error| RestoreError::Step {
        what: what.into(),
        source: KernelError::Io {
            what: "pwrite".into(),
            source: e,
        },
    };
    let (size, extents) = g.content().map_err(RestoreError::Inconsistent)?;
    let file = std::fs::File::from(f.try_clone().map_err(err)?);
    for (off, data) in extents {
        file.write_all_at(data, off).map_err(err)?;
    }
    file.set_len(size).map_err(err)
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
    write_all(w, &img.data, "refilling a pipe")
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
    use crate::remote::Recorder;
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
    fn posix_locks_are_taken_by_the_process() {
        let mut r = Recorder::default();
        let img = FdImage {
            fd: 7,
            flags: 0,
            cloexec: false,
            shared_id: None,
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
        let ev = r.writes()[0].clone();
        assert_eq!(ev.len(), 12);
        assert_eq!(u64::from_le_bytes(ev[4..12].try_into().unwrap()), 0xabc);
    }
}
