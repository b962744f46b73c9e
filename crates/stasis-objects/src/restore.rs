//! The restore side: the context every kind's `restore` gets
//! ([`RestoreCtx`]), the dispatch over the [registry](crate::REGISTRY), and
//! the hand-over of a description to its process ([`plant`]).
//!
//! Every open file description is created once, *in the restorer*: files
//! are opened and seeked, pipes are created and refilled,
//! eventfds/timerfds/signalfds/epolls are made with their state. Each fd of
//! each process is then handed over ([`plant`]): the restorer sends the
//! description over a datagram socket whose other end every stub inherited
//! (`SCM_RIGHTS`), the process receives it with a remote `recvmsg` and
//! moves it to its number with `dup3`. Descriptions shared by several fds
//! (dup'd, inherited) are sent several times and so stay shared. Epoll
//! registrations and flock/POSIX locks are made last, by the process
//! itself ([`crate::epoll::restore_targets`], [`crate::locks`]).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::{FdImage, FdKind, GhostFile, LockKind, PipeImage, UnixSocket};
use stasis_kernel::remote::Remote;
use stasis_kernel::scm;
use stasis_sys::net::{CMSG_LEN_ONE_FD, CMSG_SPACE_ONE_FD};

use crate::error::step;
use crate::tcp::PendingTcp;
use crate::RestoreError;

type Result<T, E = RestoreError> = std::result::Result<T, E>;

/// Flags that can be changed on an open description with `F_SETFL`.
pub(crate) const SETFL_MASK: u32 =
    (libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME)
        .unsigned_abs();

/// The `F_SETFL` value for the saved status flags `flags`.
pub(crate) fn setfl_flags(flags: u32) -> i32 {
    i32::try_from(flags & SETFL_MASK).unwrap_or(0)
}

/// Flags to reopen a file with: what it had, minus the flags that only
/// acted when it was opened (creation, and `O_NOFOLLOW`: `shm_open` sets
/// it, and a reopen through `/proc/self/fd/N`, a symlink, would fail with
/// `ELOOP`).
pub fn reopen_flags(flags: u32) -> i32 {
    let strip = (libc::O_CREAT
        | libc::O_EXCL
        | libc::O_TRUNC
        | libc::O_NOCTTY
        | libc::O_NOFOLLOW
        | libc::O_CLOEXEC)
        .unsigned_abs();
    i32::try_from(flags & !strip).unwrap_or(0) | libc::O_CLOEXEC
}

/// `O_NONBLOCK` if the saved flags have it.
pub(crate) fn nonblock(flags: u32) -> i32 {
    if flags & libc::O_NONBLOCK.unsigned_abs() != 0 {
        libc::O_NONBLOCK
    } else {
        0
    }
}

/// Opens with the access mode of `flags` (`O_RDONLY`/`O_WRONLY`/`O_RDWR`).
pub(crate) fn open_with_mode(
    o: &mut std::fs::OpenOptions,
    path: &str,
    flags: u32,
) -> std::io::Result<std::fs::File> {
    let acc = flags & libc::O_ACCMODE.unsigned_abs();
    o.read(acc != libc::O_WRONLY.unsigned_abs())
        .write(acc != libc::O_RDONLY.unsigned_abs());
    if acc == libc::O_ACCMODE.unsigned_abs() {
        // O_PATH-like "3" access mode: no read/write.
        o.read(false).write(false);
    }
    o.open(path)
}

/// What the restore side keeps while it makes the descriptions of a tree.
pub struct RestoreCtx<'a> {
    shared: HashMap<u32, OwnedFd>,
    /// (read end, write end) by pipe id.
    pub(crate) pipes: HashMap<u64, (OwnedFd, OwnedFd)>,
    /// A read-write opener per FIFO, keeping its data alive while restoring.
    pub(crate) fifo_keepers: HashMap<u64, OwnedFd>,
    pub(crate) pipe_data: HashMap<u64, &'a PipeImage>,
    /// Every unix socket of the image, by inode (to find peers' queues).
    pub(crate) unix_images: HashMap<u64, &'a UnixSocket>,
    /// Sockets created as the peer of an earlier one, waiting for their fd.
    pub(crate) pending_sockets: HashMap<u64, OwnedFd>,
    pub(crate) ghost_data: HashMap<u64, &'a GhostFile>,
    /// Where the content of `ghost_data` is read from (`None`: inline
    /// only, see [`RestoreCtx::set_content`]).
    pub(crate) content: Option<&'a stasis_image::ContentSource>,
    /// One open fd per rebuilt deleted file or memfd (descriptions are
    /// reopened from it through /proc/self/fd).
    pub(crate) ghost_keepers: HashMap<u64, OwnedFd>,
    /// Memfds whose own first description (the one `memfd_create` made)
    /// went to a restored fd already.
    pub(crate) memfd_firsts: HashSet<u64>,
    /// Deleted directories made so far, by path: their keeper's id
    /// (a deleted working directory is the same directory).
    pub(crate) deleted_dirs: HashMap<String, u64>,
    /// TCP connections rebuilt in repair mode, made live at the end.
    pub(crate) pending_tcp: Vec<PendingTcp>,
    /// Clients whose connections were waiting to be accepted, connected
    /// again at the end.
    pub(crate) pending_connects: Vec<crate::tcp::PendingConnect>,
    /// Shared epoll descriptions already given their registrations.
    epolls_filled: HashSet<u32>,
    flocks_taken: HashSet<u32>,
    /// Working directory of the process whose fds are being made: unix
    /// socket names relative to it are bound and connected there, not in
    /// the restorer's own directory.
    pub(crate) cwd: String,
    /// Pseudo-terminal pairs, made when first needed.
    pub(crate) ptys: crate::pty::Made<'a>,
    /// PIDs and TIDs of the image (helper processes must not take them).
    pub(crate) reserved_pids: HashSet<i32>,
    /// A helper per exited process that pidfds point at, by pidfs inode.
    pub(crate) dead_pids: HashMap<u64, crate::pidfd::DeadPid>,
    /// Established TCP connections are made closed (ended), not rebuilt
    /// (`restore --tcp-close`).
    pub tcp_close: bool,
    /// Epolls in flight made with their queue, each waiting for its
    /// registrar (a PID of the image) to register its targets: (registrar,
    /// a copy of the epoll, its image).
    in_flight_epolls: Vec<(i32, OwnedFd, FdImage)>,
    /// io_uring instances made, by `shared_id`: (process, fd, the
    /// process's PID to the restorer).
    pub(crate) io_urings: HashMap<u32, (i32, i32, i32)>,
    /// The terminal a shell job is restored on (`restore --shell-job`):
    /// the restorer's own, by its device path.
    pub terminal: Option<std::path::PathBuf>,
    /// BPF maps made, by their id at the dump (fds and maps of maps that
    /// held one map hold one again); those of older images, without id.
    pub(crate) bpf_maps: HashMap<u32, OwnedFd>,
    pub(crate) bpf_maps_unnamed: Vec<OwnedFd>,
    /// POSIX message queues made again from an fd's image, by their inode
    /// at the dump: one open fd each, the tree's fds are opened from
    /// through /proc/self/fd ([`crate::mqueue`]).
    pub(crate) mqueues: HashMap<u64, OwnedFd>,
    /// A process of the tree (as the restorer sees it) whose mount
    /// namespace, the tree's own, files are opened in by path; `None`: the
    /// restorer's.
    pub mount_ns_of: Option<i32>,
    /// A process of the tree (as the restorer sees it) whose IPC
    /// namespace, the tree's own, POSIX message queues are opened in by
    /// name; `None`: the restorer's.
    pub ipc_ns_of: Option<i32>,
    /// A process of the tree (as the restorer sees it) whose namespaces
    /// fds on the tree's own namespace files are opened from; `None`: the
    /// restorer's.
    pub ns_of: Option<i32>,
    /// The restorer's own namespaces as it started (kind, an fd on it):
    /// fds on the dumper's are reopened from them.
    pub home_ns: Vec<(String, OwnedFd)>,
}

impl<'a> RestoreCtx<'a> {
    /// The checkpoint's content pack, opened and verified, from which the
    /// content of deleted files and memfds is read.
    pub fn set_content(&mut self, content: &'a stasis_image::ContentSource) {
        self.content = Some(content);
    }

    pub fn new(
        pipes: &'a [PipeImage],
        ghosts: &'a [GhostFile],
        fds: impl Iterator<Item = &'a FdImage>,
    ) -> Self {
        let fds: Vec<&'a FdImage> = fds.collect();
        let ptys = crate::pty::Made::new(fds.iter().copied());
        let flying = crate::unix::in_flight(fds.iter().copied());
        let unix_images = fds
            .into_iter()
            .chain(flying)
            .filter_map(|f| match &f.kind {
                FdKind::Unix(u) => Some((u.ino, u)),
                _ => None,
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
            content: None,
            ghost_keepers: HashMap::new(),
            memfd_firsts: HashSet::new(),
            deleted_dirs: HashMap::new(),
            pending_tcp: Vec::new(),
            pending_connects: Vec::new(),
            epolls_filled: HashSet::new(),
            flocks_taken: HashSet::new(),
            cwd: String::new(),
            ptys,
            reserved_pids: HashSet::new(),
            dead_pids: HashMap::new(),
            tcp_close: false,
            in_flight_epolls: Vec::new(),
            io_urings: HashMap::new(),
            terminal: None,
            bpf_maps: HashMap::new(),
            bpf_maps_unnamed: Vec::new(),
            mqueues: HashMap::new(),
            mount_ns_of: None,
            ipc_ns_of: None,
            ns_of: None,
            home_ns: Vec::new(),
        }
    }

    /// Runs `f` where the tree's paths are: on a thread in its mount
    /// namespace (see [`Self::mount_ns_of`]), or here.
    pub(crate) fn in_tree_mounts<T: Send>(
        &self,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, RestoreError> {
        in_ns_of(self.mount_ns_of, stasis_kernel::ns::NsKind::Mnt, f)
    }

    /// Runs `f` in the tree's IPC namespace (see [`Self::ipc_ns_of`]), or
    /// here.
    pub(crate) fn in_tree_ipc<T: Send>(
        &self,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, RestoreError> {
        in_ns_of(self.ipc_ns_of, stasis_kernel::ns::NsKind::Ipc, f)
    }

    /// Keeps a copy of an epoll in flight just made, for `registrar` to
    /// register its targets once its fds exist.
    pub(crate) fn add_in_flight_epoll(&mut self, registrar: i32, epoll: OwnedFd, img: FdImage) {
        self.in_flight_epolls.push((registrar, epoll, img));
    }

    /// The epolls in flight whose registrations `pid` makes (each planted
    /// in it for that moment, then closed there: the queue holds the
    /// epoll itself).
    pub fn take_in_flight_epolls(&mut self, pid: i32) -> Vec<(OwnedFd, FdImage)> {
        let (mine, rest) = std::mem::take(&mut self.in_flight_epolls)
            .into_iter()
            .partition(|(p, _, _)| *p == pid);
        self.in_flight_epolls = rest;
        mine.into_iter().map(|(_, fd, img)| (fd, img)).collect()
    }

    /// A registrar whose epolls in flight were made after its fds were
    /// restored (so their registrations were never made), if any.
    pub fn epolls_left_unregistered(&self) -> Option<i32> {
        self.in_flight_epolls.first().map(|(p, _, _)| *p)
    }

    /// Where the names of the current process's unix sockets resolve.
    pub(crate) fn place(&self) -> crate::unix::name::Place {
        crate::unix::name::Place {
            cwd: self.cwd.clone(),
            mnt: self.mount_ns_of,
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

    /// The description for `img`, created on first use when shared.
    pub fn get(&mut self, img: &FdImage) -> Result<FdRef<'_>> {
        if let Some(id) = img.shared_id {
            if !self.shared.contains_key(&id) {
                let fd = self.create(img)?;
                self.shared.insert(id, fd);
            }
            return Ok(FdRef::Borrowed(self.shared[&id].as_fd()));
        }
        Ok(FdRef::Owned(self.create(img)?))
    }

    /// Makes the description of `img`: its kind's `restore`, then the OFD
    /// locks (owned by the description: taken here, once. flock locks are
    /// too, but /proc shows who took them: the process takes them, see
    /// [`crate::locks::restore_flock`]).
    fn create(&mut self, img: &FdImage) -> Result<OwnedFd> {
        let made = self.restore_kind(img)?;
        crate::locks::take_ofd_locks(&made, img)?;
        Ok(made)
    }

    fn restore_kind(&mut self, img: &FdImage) -> Result<OwnedFd> {
        match crate::owner(&img.kind) {
            Some(kind) => (kind.restore)(self, img),
            None => Err(RestoreError::Inconsistent(format!(
                "fd {}: no kernel object kind restores it",
                img.fd
            ))),
        }
    }
}

/// The error of a kind asked to restore a saved fd of another kind (the
/// registry never does: [`crate::Object::owns`] chose it).
pub(crate) fn not_mine(kind: &str, img: &FdImage) -> RestoreError {
    RestoreError::Inconsistent(format!("fd {}: not a saved {kind}", img.fd))
}

/// A description from the context: owned (used once) or shared.
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

/// Offsets, from the struct area of the scratch page, of the remote
/// `recvmsg`'s pieces.
const MSG_IOV: usize = 64;
const MSG_BYTE: usize = 80;
const MSG_CMSG: usize = 96;
/// Room for the control message carrying one fd.
const CMSG_BUF: usize = 24;
const _: () = assert!(CMSG_BUF as u64 == CMSG_SPACE_ONE_FD);

/// Little-endian bytes of 64-bit words.
fn le_words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The `msghdr` + `iovec` for receiving one fd into the struct area at
/// `base` (an address in the process): (bytes of msghdr, bytes of iovec).
pub fn recv_layout(base: u64) -> (Vec<u8>, Vec<u8>) {
    let at = |off: usize| base + off as u64;
    let hdr = le_words(&[0, 0, at(MSG_IOV), 1, at(MSG_CMSG), CMSG_SPACE_ONE_FD, 0]);
    let iov = le_words(&[at(MSG_BYTE), 1]);
    (hdr, iov)
}

/// The fd number carried by a received `SCM_RIGHTS` control message.
pub fn parse_cmsg(c: &[u8]) -> Option<i32> {
    let len = u64::from_le_bytes(c.get(0..8)?.try_into().ok()?);
    let level = i32::from_le_bytes(c.get(8..12)?.try_into().ok()?);
    let ty = i32::from_le_bytes(c.get(12..16)?.try_into().ok()?);
    if len != CMSG_LEN_ONE_FD || level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS {
        return None;
    }
    Some(i32::from_le_bytes(c.get(16..20)?.try_into().ok()?))
}

/// Where a remote call finds its arguments: the offset of the struct
/// area in the scratch page of the process behind a [`Remote`].
#[derive(Debug, Clone, Copy)]
pub struct Scratch {
    pub structs: usize,
}

/// Hands `fd` to the process behind `r` as fd number `target`.
/// `transport` is the restorer's end of the socket whose other end the
/// process has as fd `remote_transport`.
pub fn plant<R: Remote>(
    r: &mut R,
    at: Scratch,
    transport: &OwnedFd,
    remote_transport: u64,
    (fd, target, cloexec): (BorrowedFd<'_>, i32, bool),
) -> Result<()> {
    scm::send_fd(transport, fd).map_err(step(format!("sending fd {target}")))?;
    let (hdr, iov) = recv_layout(r.scratch() + at.structs as u64);
    let h = r.put(at.structs, &hdr).map_err(step("msghdr"))?;
    r.put(at.structs + MSG_IOV, &iov).map_err(step("iovec"))?;
    r.put(at.structs + MSG_CMSG, &[0u8; CMSG_BUF])
        .map_err(step("cmsg"))?;
    let flags = if cloexec { libc::MSG_CMSG_CLOEXEC } else { 0 };
    r.sys(
        "recvmsg",
        libc::SYS_recvmsg,
        &[remote_transport, h, u64::from(flags.unsigned_abs())],
    )
    .map_err(step(format!("receiving fd {target}")))?;
    let mut c = [0u8; CMSG_BUF];
    let cmsg_at = r.scratch() + (at.structs + MSG_CMSG) as u64;
    r.read(cmsg_at, &mut c)
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

/// Runs `f` on a thread in namespace `kind` of process `of`, or here
/// (`None`: the tree has the restorer's).
fn in_ns_of<T: Send>(
    of: Option<i32>,
    kind: stasis_kernel::ns::NsKind,
    f: impl FnOnce() -> T + Send,
) -> Result<T, RestoreError> {
    match of {
        None => Ok(f()),
        Some(pid) => Ok(stasis_kernel::ns::in_namespaces_of(pid, &[kind], f)?),
    }
}

#[cfg(test)]
mod tests {
    use stasis_kernel::remote::{Call, Recorder};

    use super::*;

    #[test]
    fn plant_receives_by_recvmsg_and_refuses_when_no_fd_arrives() {
        let (ours, _theirs) = scm::dgram_pair().unwrap();
        let mut r = Recorder::default();
        let at = Scratch { structs: 4096 };
        let e = plant(&mut r, at, &ours, 9, (ours.as_fd(), 5, true)).unwrap_err();
        // The recorder hands back no control message: no fd arrived.
        assert!(e.to_string().contains("no fd arrived for fd 5"), "{e}");
        let base = r.scratch() + 4096;
        assert_eq!(
            r.args_of("recvmsg"),
            vec![vec![9, base, libc::MSG_CMSG_CLOEXEC.unsigned_abs().into()]]
        );
        // msghdr, iovec, then an emptied control message buffer.
        let writes: Vec<(u64, usize)> = r
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::Write { addr, data } => Some((*addr, data.len())),
                Call::Sys { .. } => None,
            })
            .collect();
        assert_eq!(
            writes,
            vec![
                (base, 56),
                (base + MSG_IOV as u64, 16),
                (base + MSG_CMSG as u64, CMSG_BUF)
            ]
        );
        assert!(r.args_of("dup3").is_empty());
    }

    #[test]
    fn status_flags_kept_are_the_settable_ones() {
        let f =
            (libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK | libc::O_CLOEXEC).unsigned_abs();
        assert_eq!(setfl_flags(f), libc::O_APPEND | libc::O_NONBLOCK);
        assert_eq!(nonblock(f), libc::O_NONBLOCK);
        assert_eq!(nonblock(0), 0);
    }
}
