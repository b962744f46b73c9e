//! The save side: what every kind's `save` gets ([`SaveCtx`], [`OpenFd`]),
//! and the walk over a process's fds that hands each to the first kind of
//! the [registry](crate::REGISTRY) that recognises it.
//!
//! Sharing is found by `kcmp(KCMP_FILE)` among fds whose targets have the
//! same device and inode (a cheap pre-filter: anonymous inodes all share
//! one inode, so `kcmp` has the last word).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use stasis_image::manifest::{FdImage, FdKind, GhostFile, PipeImage, SysvShm};
use stasis_kernel::sockdiag::UnixInfo;
use stasis_kernel::{fdops, pidfd, procfs, sock};

use crate::tcp::Repairs;
use crate::SaveError;

type Result<T, E = SaveError> = std::result::Result<T, E>;

/// A `/proc` text that did not parse (what was wrong with it).
pub use stasis_kernel::procfs::FormatError as BadFormat;
/// One inotify watch line of an fdinfo.
pub use stasis_kernel::procfs::InotifyLine;

/// A socket fd, taken out of its process (`pidfd_getfd`) once for every kind.
pub struct SocketFd {
    pub sock: OwnedFd,
    pub domain: i32,
    pub sock_type: i32,
}

/// One fd of a process being saved, with what `/proc` says of it.
pub struct OpenFd<'a> {
    pub pid: i32,
    pub fd: i32,
    /// Target of `/proc/PID/fd/N` (`pipe:[..]`, `anon_inode:..`, a path...).
    pub link: &'a str,
    /// `/proc/PID/fdinfo/N`.
    pub info: &'a str,
    pub pos: u64,
    /// Status flags (`O_*`), `O_CLOEXEC` included.
    pub flags: u32,
    pub meta: &'a std::fs::Metadata,
    /// The socket itself, for a socket.
    pub socket: Option<SocketFd>,
    /// A pidfd of the process (to copy its fds with `pidfd_getfd`).
    pub pidfd: &'a OwnedFd,
}

impl OpenFd<'_> {
    /// An "fdinfo does not parse" error.
    pub fn bad_info(&self, e: BadFormat) -> SaveError {
        SaveError::ProcFormat {
            pid: self.pid,
            file: format!("fdinfo/{}", self.fd),
            what: e.0,
        }
    }

    /// A "stasis cannot save this" error.
    pub fn unsupported(&self, what: impl Into<String>) -> SaveError {
        SaveError::Unsupported {
            pid: self.pid,
            what: what.into(),
        }
    }
}

/// What the save side collects over every process of a dump.
pub struct SaveCtx {
    /// (pid, fd, dev, ino, index of the process, index in its fd list).
    pub(crate) seen: Vec<(i32, i32, u64, u64, usize, usize)>,
    /// Per process, in dump order.
    pub tables: Vec<Vec<FdImage>>,
    /// Per process, in dump order: the earlier process whose fd table it
    /// shares (`clone(CLONE_FILES)`; its own entry of `tables` is empty).
    pub shared_with: Vec<Option<i32>>,
    /// Processes that pass on a table they do not share (see
    /// `table_owner`), with its first holder.
    relays: HashMap<i32, i32>,
    /// Per process, in dump order: its PID.
    table_pids: Vec<i32>,
    next_shared: u32,
    /// Pipe contents by pipe inode.
    pub pipes: HashMap<u64, PipeImage>,
    /// Deleted files and memfds by inode.
    pub ghosts: HashMap<u64, GhostFile>,
    /// System V segments.
    pub sysv: Vec<SysvShm>,
    /// The data of the deleted files and memfds of `ghosts`, by inode, and
    /// of the System V segments of `sysv`, by id: written into the content
    /// pack with the manifest (their `extents` are filled then).
    pub ghost_content: HashMap<u64, crate::content::PendingContent>,
    pub sysv_content: HashMap<i32, crate::content::PendingContent>,
    /// Unix sockets of the namespace (queried on first need).
    pub(crate) unix: Option<HashMap<u64, UnixInfo>>,
    /// The live processes of the tree (given to `freeze_tcp`).
    pub(crate) tree_pids: Vec<i32>,
    /// Its TCP clients with nothing acknowledged
    /// ([`crate::tcp::unaccepted`]), once asked for.
    /// The fds of the frozen tree, listed once after the freeze (when the
    /// dump took them: [`crate::fd_census`]).
    pub fd_census: Option<crate::fd_census::FdCensus>,
    /// The connections waiting in accept queues of its network namespace,
    /// by family, once asked for ([`SaveCtx::waits`]).
    pub(crate) waiting_accept: HashMap<
        u8,
        Vec<(
            stasis_kernel::tcpdiag::DiagAddr,
            stasis_kernel::tcpdiag::DiagAddr,
        )>,
    >,
    pub(crate) quiet_clients: Option<
        Vec<(
            stasis_kernel::tcpdiag::DiagAddr,
            stasis_kernel::tcpdiag::DiagAddr,
        )>,
    >,
    /// Unix socket queues already peeked at during this dump, by socket
    /// inode ([`crate::unix::peek`]).
    pub(crate) unix_queues: HashMap<u64, Vec<stasis_kernel::sock::unixq::UnixMsg>>,
    /// Packet sockets of the namespace, as `sock_diag` sees them (queried
    /// on first need).
    pub(crate) packet: Option<HashMap<u64, stasis_kernel::sockdiag::PacketDiag>>,
    /// TCP sockets put in repair mode: kept open until the dump ends, then
    /// closed silently (process killed) or taken out of repair (left
    /// running, [`crate::tcp::leave_repair`]).
    pub repaired: Repairs,
    /// Pseudo-terminal pairs and slaves seen so far.
    pub(crate) ptys: crate::pty::Saved,
    /// Established TCP connections are saved as closed (ended), neither
    /// stopped nor read in repair mode.
    pub tcp_close: bool,
    /// Connections waiting to be accepted by a TCP listener are left out,
    /// not refused.
    pub skip_in_flight: bool,
    /// The tree is a shell job (`--shell-job`): its fds on its session's
    /// terminal, held from outside, are saved as that terminal
    /// ([`crate::shell_job`]).
    pub shell_job: bool,
    /// What [`crate::shell_job::mark_external`] found of that terminal.
    pub(crate) shell_job_terminal: Option<stasis_image::manifest::ShellJob>,
    /// inotify watches on deleted files: (pid, fd, watch, inode), each to
    /// be on a deleted file the tree holds open
    /// ([`SaveCtx::check_ghost_watches`]).
    pub(crate) ghost_watches: Vec<(i32, i32, i32, u64)>,
    /// While a unix socket's files in flight are saved: the process that
    /// holds that socket, whose fd numbers the registrations of an epoll
    /// in flight name (see [`crate::epoll`]).
    pub(crate) epoll_registrar: Option<i32>,
    /// Files in flight saved so far (other than pipe ends), kept open to
    /// recognise one sent again (in another message, or another queue):
    /// each is one description at restore, through its `shared_id`.
    pub(crate) in_flight: Vec<(OwnedFd, FdImage)>,
    /// The TCP listeners of the network namespace, by family, asked once
    /// per dump ([`SaveCtx::listeners_on`]).
    listeners: HashMap<u8, Vec<stasis_kernel::tcpdiag::DiagAddr>>,
    /// The single issuer of io_uring instances, by (pid, fd): the TID of
    /// the thread of the process that is (`None`: none is), found by the
    /// capture, which can run syscalls in each thread
    /// ([`crate::io_uring::issuer_of`]).
    pub io_uring_issuers: HashMap<(i32, i32), Option<i32>>,
    /// Of those, the ones with an eventfd registered, as their issuer
    /// found ([`crate::io_uring::has_eventfd_in`]: no other may ask).
    pub io_uring_eventfds: std::collections::HashSet<(i32, i32)>,
    /// POSIX message queues saved with an fd on them, by inode (each is
    /// read once: [`crate::mqueue`]).
    pub(crate) mqueues: HashMap<u64, stasis_image::manifest::PosixQueue>,
}

/// `/proc/PID/<name>`.
pub fn proc_path(pid: i32, name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/{pid}/{name}"))
}

fn proc_err(pid: i32, file: &str) -> impl FnOnce(std::io::Error) -> SaveError {
    let file = file.to_string();
    move |source| SaveError::Proc { pid, file, source }
}

/// Lists the fd numbers of `pid`.
pub fn list_fds(pid: i32) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc_path(pid, "fd")).map_err(proc_err(pid, "fd"))?;
    let mut fds: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// The target of `/proc/PID/<name>`.
pub(crate) fn read_link(pid: i32, name: &str) -> Result<String> {
    std::fs::read_link(proc_path(pid, name))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(proc_err(pid, name))
}

pub(crate) use stasis_kernel::procfs::net::socket_inode;

/// Why an fd cannot be checkpointed, or `None` if its kind is known.
pub fn unsupported_reason(pid: i32, fd: i32, link: &str) -> Option<String> {
    let known_anon = crate::REGISTRY.iter().any(|e| e.anon_inode == Some(link));
    let kind = if link.starts_with("anon_inode:") && !known_anon {
        Some("an anonymous inode of a kind stasis does not know (perf_event, a KVM vm...)")
    } else if (link.starts_with("/dev/tty")
        && link != "/dev/tty"
        && !crate::ttyline::is_line_path(link))
        || link == "/dev/console"
    {
        // Pseudo-terminals (/dev/ptmx, /dev/pts/N) are `crate::pty`'s,
        // virtual consoles and serial lines `crate::ttyline`'s.
        Some("a terminal")
    } else if link.starts_with("pipe:")
        || link.starts_with("anon_inode:")
        || link.starts_with("socket:")
    {
        None
    } else if !link.starts_with('/') && crate::nsfile::parse(link).is_none() {
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
                if !(ft.is_file()
                    || ft.is_dir()
                    || ft.is_char_device()
                    || ft.is_fifo()
                    || ft.is_symlink()
                    || ft.is_block_device())
                {
                    return Some(format!("fd {fd} ({link}) is a special file, which this version of stasis cannot checkpoint yet"));
                }
            }
            // Closed since it was listed: a running process (the
            // preflight) may do that; a frozen one cannot, and reading
            // its fdinfo next reports it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Some(format!("fd {fd} ({link}): {e}")),
        }
    }
    None
}

impl Default for SaveCtx {
    /// An empty context.
    fn default() -> Self {
        Self {
            seen: Vec::new(),
            tables: Vec::new(),
            shared_with: Vec::new(),
            relays: HashMap::new(),
            table_pids: Vec::new(),
            next_shared: 0,
            pipes: HashMap::new(),
            ghosts: HashMap::new(),
            sysv: Vec::new(),
            ghost_content: HashMap::new(),
            sysv_content: HashMap::new(),
            unix: None,
            unix_queues: HashMap::new(),
            tree_pids: Vec::new(),
            quiet_clients: None,
            waiting_accept: HashMap::new(),
            fd_census: None,
            packet: None,
            repaired: Repairs::default(),
            ptys: crate::pty::Saved::default(),
            tcp_close: false,
            skip_in_flight: false,
            shell_job: false,
            shell_job_terminal: None,
            ghost_watches: Vec::new(),
            epoll_registrar: None,
            in_flight: Vec::new(),
            listeners: HashMap::new(),
            io_uring_issuers: HashMap::new(),
            io_uring_eventfds: std::collections::HashSet::new(),
            mqueues: HashMap::new(),
        }
    }
}

impl SaveCtx {
    /// How many TCP listeners of the network namespace are bound to the
    /// raw socket address `local` (more than one: they share it through
    /// `SO_REUSEPORT`), from one look at the namespace's listeners per
    /// dump and family (the tree is frozen: its listeners do not change).
    pub(crate) fn listeners_on(&mut self, local: &[u8]) -> Result<usize> {
        use stasis_kernel::tcpdiag::{listeners, DiagAddr};
        let Some(l) = DiagAddr::from_raw(local) else {
            return Ok(0);
        };
        let all = match self.listeners.entry(l.family) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(listeners(l.family)?),
        };
        Ok(all.iter().filter(|a| **a == l).count())
    }

    /// Records every fd of process `pid` (the next process of the dump).
    pub fn add_process(&mut self, pid: i32) -> Result<()> {
        // The connections' state first (their fds are saved from it).
        self.read_tcp()?;
        let index = self.tables.len();
        // Processes made with clone(CLONE_FILES) share one table: saved
        // once, with the first of them; the others are forked with
        // CLONE_FILES at restore, by a parent that shares it too.
        if let Some(owner) = self.table_owner(pid)? {
            self.tables.push(Vec::new());
            self.shared_with.push(Some(owner));
            self.table_pids.push(pid);
            return Ok(());
        }
        let mut table: Vec<FdImage> = Vec::new();
        // One pidfd for every fd of the process (copies of its fds).
        let pfd = pidfd::pidfd_open(pid)?;
        let listed: Vec<(i32, Option<String>)> =
            match self.fd_census.as_ref().and_then(|c| c.fds_of(pid)) {
                Some(entries) => entries
                    .iter()
                    .map(|e| (e.fd, Some(e.link.clone())))
                    .collect(),
                None => list_fds(pid)?.into_iter().map(|fd| (fd, None)).collect(),
            };
        for (fd, link) in listed {
            let (img, meta) = self.save_fd(&pfd, pid, fd, link)?;
            let mut img = img;
            self.find_twin(&mut table, &mut img, index, (pid, fd), &meta);
            self.seen
                .push((pid, fd, meta.dev(), meta.ino(), index, table.len()));
            table.push(img);
        }
        self.tables.push(table);
        self.shared_with.push(None);
        self.table_pids.push(pid);
        Ok(())
    }

    /// A zombie of the dump: no fd table.
    pub fn add_zombie(&mut self, pid: i32) {
        self.tables.push(Vec::new());
        self.shared_with.push(None);
        self.table_pids.push(pid);
    }

    /// The earlier process of the dump whose fd table `pid` shares (the
    /// first that holds it), if any. The restore forks `pid` from its
    /// parent sharing it (`CLONE_FILES`); if the parent does not share it
    /// (it unshared it since, or `pid` was made with `CLONE_PARENT`), from
    /// that first holder when it is a sibling of `pid` (`CLONE_PARENT`),
    /// or else through its ancestors up to one that holds it: each is
    /// forked sharing it, to pass it on, and unshares it before its own
    /// fds are made (a relay: it must have a table of its own that nobody
    /// shares). Other shapes are refused.
    fn table_owner(&mut self, pid: i32) -> Result<Option<i32>> {
        let Some(i) = (0..self.tables.len()).find(|&i| {
            self.shared_with[i].is_none() && fdops::kcmp_same_fd_table(self.table_pids[i], pid)
        }) else {
            return Ok(None);
        };
        let owner = self.table_pids[i];
        let refuse = |why: String| {
            SaveError::Unsupported {
            pid,
            what: format!("it shares its file descriptor table with process {owner} (clone with CLONE_FILES), {why}; stasis rebuilds a shared table only through the processes' parents or a sibling"),
        }
        };
        if let Some(other) = self.relays.get(&owner) {
            return Err(refuse(format!(
                "whose own table it rebuilds by passing on process {other}'s"
            )));
        }
        let ppid_of = |p: i32| {
            stasis_kernel::procfs::stat(p)
                .map(|s| s.ppid)
                .map_err(stasis_kernel::KernelError::from)
        };
        let ppid = ppid_of(pid)?;
        let sibling = || ppid_of(owner).is_ok_and(|o| o == ppid);
        if ppid == owner || fdops::kcmp_same_fd_table(ppid, pid) || sibling() {
            return Ok(Some(owner));
        }
        let mut chain = Vec::new();
        let mut k = ppid;
        while !(k == owner
            || fdops::kcmp_same_fd_table(k, pid)
            || self.relays.get(&k) == Some(&owner))
        {
            let Some(at) = self.table_pids.iter().position(|&p| p == k) else {
                return Err(refuse(
                    "and no ancestor of it in the tree holds that table".into(),
                ));
            };
            if self.shared_with[at].is_some()
                || self.relays.contains_key(&k)
                || self.shared_with.contains(&Some(k))
            {
                return Err(refuse(format!(
                    "which its ancestor {k} does not hold, and {k}'s own table is shared too"
                )));
            }
            chain.push(k);
            k = ppid_of(k)?;
        }
        for k in chain {
            self.relays.insert(k, owner);
        }
        Ok(Some(owner))
    }

    /// Saves `pid`'s `fd`: the first kind of the registry that recognises
    /// it says what it is; then its locks.
    pub(crate) fn save_fd(
        &mut self,
        pfd: &OwnedFd,
        pid: i32,
        fd: i32,
        link: Option<String>,
    ) -> Result<(FdImage, std::fs::Metadata)> {
        let link = match link {
            Some(l) => l,
            None => read_link(pid, &format!("fd/{fd}"))?,
        };
        if let Some(what) = unsupported_reason(pid, fd, &link) {
            return Err(SaveError::Unsupported { pid, what });
        }
        let info_name = format!("fdinfo/{fd}");
        let info = std::fs::read_to_string(proc_path(pid, &info_name))
            .map_err(proc_err(pid, &info_name))?;
        let fmt = |e: BadFormat| SaveError::ProcFormat {
            pid,
            file: info_name.clone(),
            what: e.0,
        };
        let (pos, flags) = procfs::parse_fdinfo(&info).map_err(fmt)?;
        let fd_name = format!("fd/{fd}");
        let meta = std::fs::metadata(proc_path(pid, &fd_name)).map_err(proc_err(pid, &fd_name))?;
        let socket = if link.starts_with("socket:") {
            let s = pidfd::pidfd_getfd(pfd, fd)?;
            let domain = sock::get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN)?;
            let sock_type = sock::get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_TYPE)?;
            Some(SocketFd {
                sock: s,
                domain,
                sock_type,
            })
        } else {
            None
        };
        let open = OpenFd {
            pid,
            fd,
            link: &link,
            info: &info,
            pos,
            flags,
            meta: &meta,
            socket,
            pidfd: pfd,
        };
        let kind = self.save_kind(&open)?;
        let locks = crate::locks::save(&open)?;
        let owner = crate::fown::save(&open)?;
        let img = FdImage {
            fd,
            flags: flags & !libc::O_CLOEXEC.unsigned_abs(),
            cloexec: flags & libc::O_CLOEXEC.unsigned_abs() != 0,
            kind,
            shared_id: None,
            locks,
            owner,
        };
        Ok((img, meta))
    }

    /// What the first kind that recognises `fd` saves of it.
    fn save_kind(&mut self, fd: &OpenFd<'_>) -> Result<FdKind> {
        for kind in crate::REGISTRY {
            if let Some(k) = (kind.save)(self, fd)? {
                return Ok(k);
            }
        }
        Err(match &fd.socket {
            Some(s) => fd.unsupported(format!(
                "fd {} is {} (address family {}), which stasis cannot checkpoint yet",
                fd.fd,
                match s.domain {
                    libc::AF_ALG => "a crypto API socket",
                    libc::AF_VSOCK => "a vsock socket",
                    libc::AF_BLUETOOTH => "a Bluetooth socket",
                    _ => "a socket of a kind stasis does not know",
                },
                s.domain
            )),
            None => fd.unsupported(format!(
                "fd {} ({}) is of a kind stasis cannot checkpoint yet",
                fd.fd, fd.link
            )),
        })
    }

    /// A process saved before `fd`'s (or before it in its own table) that
    /// holds `fd`'s open file, if any other than `fd`'s own process.
    pub(crate) fn holder_of_file(&self, fd: &OpenFd<'_>) -> Option<i32> {
        self.seen_holder((fd.pid, fd.fd), fd.meta, |p| p != fd.pid)
            .map(|s| s.0)
    }

    /// The first fd saved so far (of a process `keep` accepts) that is the
    /// same open file as `fd` of `pid` (same inode, then `kcmp`).
    fn seen_holder(
        &self,
        (pid, fd): (i32, i32),
        meta: &std::fs::Metadata,
        keep: impl Fn(i32) -> bool,
    ) -> Option<&(i32, i32, u64, u64, usize, usize)> {
        self.seen.iter().find(|(p, f, dev, ino, _, _)| {
            keep(*p)
                && *dev == meta.dev()
                && *ino == meta.ino()
                && fdops::kcmp_same_file(*p, *f, pid, fd)
        })
    }

    /// The areas that the userfaultfd of process `pid` (saved) registers.
    pub fn uffd_ranges(&self, pid: i32) -> Vec<(u64, u64)> {
        let Some(i) = self.table_pids.iter().position(|&p| p == pid) else {
            return Vec::new();
        };
        self.tables[i]
            .iter()
            .filter_map(|f| match &f.kind {
                FdKind::Userfaultfd(u) => Some(u.ranges.iter().map(|r| (r.0, r.1))),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// A new `shared_id`, of no fd yet.
    pub(crate) fn new_shared_id(&mut self) -> u32 {
        self.next_shared += 1;
        self.next_shared
    }

    /// Gives `img` and an earlier fd the same `shared_id` when they are
    /// the same open file description.
    fn find_twin(
        &mut self,
        table: &mut [FdImage],
        img: &mut FdImage,
        index: usize,
        (pid, fd): (i32, i32),
        meta: &std::fs::Metadata,
    ) {
        let twin = self
            .seen_holder((pid, fd), meta, |_| true)
            .map(|&(_, _, _, _, pi, fi)| (pi, fi));
        let Some((pi, fi)) = twin else {
            return;
        };
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

    /// Every inotify watch (and fanotify mark, `wd` -1) on a deleted file
    /// is on one the tree holds open
    /// (and so saved, to be rebuilt): else it could not be made again.
    pub fn check_ghost_watches(&self) -> Result<()> {
        for &(pid, fd, wd, ino) in &self.ghost_watches {
            if !self.ghosts.contains_key(&ino) {
                let what = if wd < 0 {
                    "a fanotify mark".to_string()
                } else {
                    format!("inotify watch {wd}")
                };
                return Err(SaveError::Unsupported {
                    pid,
                    what: format!("fd {fd}: {what} is on a deleted file that no process of the tree holds open, which stasis cannot make again"),
                });
            }
        }
        Ok(())
    }

    /// The pid that holds fd table `index` (0 if unknown).
    pub(crate) fn pid_of_table(&self, index: usize) -> i32 {
        self.table_pids.get(index).copied().unwrap_or(0)
    }

    /// Saves the content of a deleted file or memfd that `pid` maps at
    /// `start..end` (once per inode), through `/proc/PID/map_files`.
    pub fn capture_mapped_ghost(
        &mut self,
        pid: i32,
        start: u64,
        end: u64,
    ) -> Result<(), SaveError> {
        crate::ghost::save_mapped(self, pid, start, end)
    }

    /// Links the files in flight that a process of the tree holds too to
    /// that fd, once every process is saved ([`crate::unix::link_in_flight`]).
    pub fn link_in_flight(&mut self) {
        crate::unix::link_in_flight(self);
    }

    /// The terminal of the shell job, if the tree is one (see
    /// [`SaveCtx::shell_job`]).
    pub fn take_shell_job(&mut self) -> Option<stasis_image::manifest::ShellJob> {
        self.shell_job_terminal.take()
    }

    /// Refuses unix sockets connected outside the tree ([`crate::unix::check_external`]).
    pub fn check_external_sockets(&self) -> Result<(), SaveError> {
        crate::unix::check_external(self)
    }

    /// Refuses pipes shared with a process outside the tree ([`crate::pipe::check_external`]).
    pub fn check_external_pipes(&self, tree: &[i32]) -> Result<(), SaveError> {
        crate::pipe::check_external(self, tree)
    }

    /// A census of pty holders taken before the freeze
    /// ([`crate::pty_census::Census::for_tree`]), read again for the frozen
    /// processes `tree`.
    pub fn use_pty_census(&mut self, census: crate::pty_census::Census, tree: &[i32]) {
        self.ptys.use_census(census, tree, self.fd_census.as_ref());
    }

    /// The saved image of fd `fd` of process `pid` (its own table, not one
    /// it shares).
    pub(crate) fn fd_image_mut(&mut self, pid: i32, fd: i32) -> Option<&mut FdImage> {
        let i = self.table_pids.iter().position(|&p| p == pid)?;
        self.tables.get_mut(i)?.iter_mut().find(|f| f.fd == fd)
    }

    /// Refuses ptys shared with a process outside the tree ([`crate::pty::check_external`]).
    pub fn check_external_ptys(&mut self, tree: &[i32]) -> Result<(), SaveError> {
        crate::pty::check_external(self, tree)
    }
}

/// Whether process `pid` is a fork snapshot of this dump (traced by one of
/// our threads, made with exit signal 0). It shares its process's fd
/// table and session: it is no holder of its own.
pub(crate) fn is_snapshot(pid: i32) -> bool {
    traced_by_us(pid) && exits_silently(pid)
}

/// A fork snapshot's exit signal is 0 (`/proc/PID/stat` field 38), which
/// no process of a tree has (they are made by `fork`, `SIGCHLD`).
fn exits_silently(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(35)?.parse::<i32>().ok()
        })
        == Some(0)
}

/// Whether process `pid` is traced by one of our threads.
pub(crate) fn traced_by_us(pid: i32) -> bool {
    let tracer = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse::<i32>().ok())
        })
        .unwrap_or(0);
    tracer != 0 && std::path::Path::new(&format!("/proc/self/task/{tracer}")).exists()
}
