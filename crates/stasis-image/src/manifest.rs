//! The manifest: everything about a checkpoint except page contents.
//!
//! These are plain data types. `stasis-capture` fills them from a live
//! process, `stasis-restore` consumes them; this crate only stores them. Field
//! names are part of the on-disk format (CBOR maps keyed by name), so renaming
//! one is a format change: add new fields with `#[serde(default)]` instead.

use serde::{Deserialize, Serialize};

mod files;
mod sockets;
pub use files::*;
pub use sockets::*;

/// Top-level manifest of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint number inside the image directory (1, 2, ...).
    pub checkpoint: u32,
    /// Parent checkpoint for incremental checkpoints (pages not in this
    /// checkpoint's packs are found there). `None` for a full checkpoint.
    #[serde(default)]
    pub parent: Option<u32>,
    /// Version of the stasis tool that wrote it (informational only).
    pub tool_version: String,
    /// Seconds since the Unix epoch when the process was frozen.
    pub created_unix: u64,
    /// Host facts needed to decide whether a restore can work here.
    pub host: HostInfo,
    /// PID given to `stasis dump` (root of the dumped tree).
    pub root_pid: i32,
    /// Every dumped process.
    pub processes: Vec<ProcessImage>,
    /// Timing and size figures of the dump (informational).
    #[serde(default)]
    pub stats: DumpStats,
    /// Contents of the pipes held by the processes (one entry per pipe).
    #[serde(default)]
    pub pipes: Vec<PipeImage>,
    /// Contents of deleted files and memfds still open (one per inode).
    #[serde(default)]
    pub ghosts: Vec<GhostFile>,
    /// System V shared memory segments attached by the processes.
    #[serde(default)]
    pub sysv_shm: Vec<SysvShm>,
    /// POSIX shared memory objects (files in `/dev/shm`) saved whole, as
    /// the dump was asked to (`--shm-file`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shm_files: Vec<ShmFile>,
    /// The cut across hosts this checkpoint is part of (`stasis cluster`),
    /// if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<CutMark>,
    /// The namespaces the tree had of its own (not the dumper's), and what
    /// of them is restored. `None`: the dumper's namespaces, as for every
    /// image written before this field (their manifests say format
    /// version 2; one with this field says [`NAMESPACES_MANIFEST_VERSION`]).
    /// With a PID namespace, every PID in the manifest is the one inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Namespaces>,
    /// The terminal of a shell job (`dump --shell-job`), if the tree is
    /// one: such a manifest says [`SHELL_JOB_MANIFEST_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell_job: Option<ShellJob>,
    /// The content pack (`content.pack`): the bytes of the data extents of
    /// `ghosts`, `sysv_shm`, `shm_files` and tmpfs files (see
    /// [`Extent::at`]). `None`
    /// when no object has data, and in images written before it, whose
    /// extents carry their bytes inline. A manifest with it says
    /// [`CONTENT_MANIFEST_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<PackRef>,
    /// The cgroups (v2) of a tree whose live processes were in several:
    /// each process's, and what the restore gives those it has to make.
    /// `None`: one cgroup for the whole tree (that of
    /// [`Namespaces::cgroup`] with namespaces of its own, else the
    /// restorer's). A manifest with it says [`CGROUPS_MANIFEST_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroups: Option<Cgroups>,
}

/// Manifest format version written when [`Manifest::namespaces`] is set, so
/// that a reader that predates it refuses the manifest instead of restoring
/// the tree in its own namespaces (with the in-namespace PIDs).
pub const NAMESPACES_MANIFEST_VERSION: u32 = 3;

/// Manifest format version written when the tree's IPC namespace has
/// message queues or semaphore sets ([`Namespaces::msg_queues`],
/// [`Namespaces::sem_sets`]), or its mount namespace mounts made later
/// ([`MountNamespace::later`]) or special files in a tmpfs, so that a
/// reader of version 3 refuses it instead of restoring the namespaces
/// without them.
pub const NAMESPACE_OBJECTS_MANIFEST_VERSION: u32 = 4;

/// Whether `n` has what a reader of version 3 would drop or refuse:
/// mounts made later, special files in a tmpfs.
/// Mounts that only [`FRESH_MOUNTS_MANIFEST_VERSION`] readers make.
fn fresh_mounts(n: Option<&Namespaces>) -> bool {
    n.and_then(|n| n.mnt.as_ref()).is_some_and(|m| {
        m.slave_copies
            || m.later.iter().any(|l| {
                l.propagation != 0
                    || match &l.what {
                        LaterKind::Ramfs { .. } => true,
                        LaterKind::Fresh { fstype, .. } => {
                            !matches!(fstype.as_str(), "sysfs" | "mqueue" | "devpts" | "cgroup2")
                        }
                        LaterKind::Tmpfs { .. }
                        | LaterKind::Bind { .. }
                        | LaterKind::Hugetlbfs { .. }
                        | LaterKind::Overlay { .. } => false,
                    }
            })
    })
}

fn later_mounts(n: &Namespaces) -> bool {
    n.mnt.as_ref().is_some_and(|m| {
        !m.later.is_empty()
            || m.tmpfs.iter().flat_map(|t| t.entries.iter()).any(|e| {
                e.rdev != 0 || !matches!(e.mode & 0o170000, 0o040000 | 0o100000 | 0o120000)
            })
    })
}

/// Manifest format version written when [`Manifest::shell_job`] is set, a
/// TCP socket is [`InetState::Unaccepted`], or a System V attachment is
/// partial (a reader that predates them would not know those fds' kind,
/// or attach the whole segment): the same as
/// [`NAMESPACE_OBJECTS_MANIFEST_VERSION`], both new in one release.
pub const SHELL_JOB_MANIFEST_VERSION: u32 = 4;

/// Manifest format version written when [`Manifest::content`] is set, so
/// that a reader that predates content packs refuses the manifest instead
/// of restoring every saved file as holes (its extents carry no bytes), and
/// when a tmpfs file is described by its size (an older reader would make
/// it empty).
pub const CONTENT_MANIFEST_VERSION: u32 = 5;

/// Manifest format version written when the tree's network namespace has
/// veth interfaces or routes ([`NetNamespace::veths`],
/// [`NetNamespace::routes`]), so that a reader that predates them refuses
/// the manifest instead of restoring the namespace with only `lo`.
pub const NET_DEVICES_MANIFEST_VERSION: u32 = 6;

/// Manifest format version written when the tree had a time namespace
/// of its own ([`Namespaces::time`]), so that a reader that predates it
/// refuses the manifest instead of restoring the tree with the host's
/// clocks (a jump of its monotonic and boot-time clocks, backwards too).
pub const TIME_NAMESPACE_MANIFEST_VERSION: u32 = 7;

/// Manifest format version written when [`Manifest::cgroups`] is set, so
/// that a reader that predates it refuses the manifest instead of putting
/// every process in the root's cgroup.
pub const CGROUPS_MANIFEST_VERSION: u32 = 8;

/// Manifest format version written when the tree's IPC namespace has
/// POSIX message queues ([`Namespaces::posix_queues`]), a process has
/// an fd on one ([`FdKind::Mqueue`]) or a pty pair is of a devpts instance
/// of the tree's own ([`PtyPair::devpts`]), so that a reader that predates them
/// refuses the manifest instead of restoring the namespace without its
/// queues.
pub const POSIX_QUEUES_MANIFEST_VERSION: u32 = 9;

/// Manifest format version written when the tree's network namespace has
/// tun or tap devices ([`NetNamespace::tuns`]) or the tree has fds on
/// `/dev/net/tun` attached to one ([`FdKind::Tun`]), so that a reader that
/// predates them refuses the manifest instead of restoring the namespace
/// without them and those fds unattached.
pub const TUN_MANIFEST_VERSION: u32 = 10;

/// Manifest format version written when the tree's mount namespace has a
/// root of its own ([`MountNamespace::root`], as `pivot_root` makes), so
/// that a reader that predates it refuses the manifest instead of
/// restoring the tree under the restorer's root.
pub const OWN_ROOT_MANIFEST_VERSION: u32 = 11;

/// Manifest format version written when an fd on a POSIX message queue
/// carries the queue itself ([`FdKind::Mqueue`]'s `queue`: one of the
/// dumper's IPC namespace, or one unlinked since it was opened), so that a
/// reader that predates it refuses the manifest instead of opening the
/// queue by name as it is then (or failing to: an unlinked one has none).
pub const HELD_QUEUE_MANIFEST_VERSION: u32 = 12;

/// Manifest format version written when a process had unshared a time
/// namespace no process was in yet ([`ProcessImage::pending_time`]), so
/// that a reader that predates it refuses the manifest instead of
/// restoring the process making its children in its own time namespace.
pub const PENDING_TIME_MANIFEST_VERSION: u32 = 13;

/// Manifest format version written when a thread was in another cgroup
/// than its process ([`Cgroups::threads`]) or a cgroup was threaded
/// ([`CgroupDir::threaded`]), so that a reader that predates them refuses
/// the manifest instead of restoring every thread in its process's
/// cgroup: the same as [`PENDING_TIME_MANIFEST_VERSION`], both new in
/// one release.
pub const THREADED_CGROUPS_MANIFEST_VERSION: u32 = 13;

/// Manifest format version written when the tree's mount namespace has a
/// mount made again from nothing other than sysfs, mqueue, devpts and
/// cgroup2 (another proc, hugetlbfs, tracefs...: [`LaterKind::Fresh`]),
/// a ramfs and its files ([`LaterKind::Ramfs`]), a mount whose
/// propagation is not private ([`LaterMount::propagation`]), or copies
/// of the dumper's mounts made slaves ([`MountNamespace::slave_copies`]),
/// so that a reader that predates them refuses the manifest instead of
/// mounting them in its own PID namespace, as tmpfs, or private.
pub const FRESH_MOUNTS_MANIFEST_VERSION: u32 = 14;

/// Manifest format version written when the tree's network namespace has
/// interfaces made inside it ([`NetNamespace::links`]) or ports of a
/// bridge of its own ([`NetInterface::master`]), an address with a point-to-point peer ([`NetAddress::peer`]), a route
/// of another table than main, with several next hops, an `onlink` flag
/// or metrics ([`NetRoute::table`], [`NetRoute::nexthops`],
/// [`NetRoute::flags`], [`NetRoute::attrs`]), or policy routing rules
/// other than the kernel's ([`NetNamespace::rules`]), so that a reader
/// that predates them refuses the manifest instead of restoring the
/// address without its peer, those routes into the main table with one
/// next hop, and the kernel's rules only, or refusing none of the
/// interfaces.
pub const NET_ROUTING_MANIFEST_VERSION: u32 = 15;

/// Manifest format version written when the tree's network namespace has
/// next-hop objects ([`NetNamespace::nexthops`]), a route through one
/// ([`NetRoute::nhid`]), with a source prefix ([`NetRoute::src`]), a
/// gateway of another family or an encapsulation (those
/// [`NET_HOP_ATTRS`] in [`NetRoute::attrs`] or [`NetNextHop::attrs`]),
/// or a macvlan in source mode with its list of source addresses
/// ([`IFLA_MACVLAN_MACADDR_DATA`] in [`NetLink::data`]), so that a reader
/// that predates them refuses the manifest instead of making those routes
/// without what they had (or not at all) and the macvlan without its
/// list.
pub const NET_NEXTHOPS_MANIFEST_VERSION: u32 = 16;

/// Manifest format version written when the tree's mount namespace has
/// a hugetlbfs holding files ([`LaterKind::Hugetlbfs`]) or an overlay
/// ([`LaterKind::Overlay`]), so that a reader that predates them refuses
/// the manifest instead of failing on the unknown mount kind halfway
/// through a restore.
pub const OWN_MOUNTS_MANIFEST_VERSION: u32 = 17;

/// Mounts that only [`OWN_MOUNTS_MANIFEST_VERSION`] readers make.
fn own_mounts(n: Option<&Namespaces>) -> bool {
    n.and_then(|n| n.mnt.as_ref()).is_some_and(|m| {
        m.later.iter().any(|l| {
            matches!(
                l.what,
                LaterKind::Hugetlbfs { .. } | LaterKind::Overlay { .. }
            )
        })
    })
}

/// Manifest format version written for a tree whose PID namespace's init
/// was not dumped ([`Namespaces::stand_in_init`]: the root keeps its PID
/// there, under a stand-in init), so that a reader that predates it
/// refuses the manifest instead of making the root PID 1.
pub const STAND_IN_INIT_MANIFEST_VERSION: u32 = 18;

/// Whose namespace an fd on a namespace file ([`FdKind::NsFile`]) is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NsFileOf {
    /// The holder's own (the tree's): reopened from the restored tree's.
    #[default]
    Own,
    /// The dumper's (the tree has a namespace of its own of that kind):
    /// reopened from the restorer's, which must be that namespace.
    Dumper,
    /// One bound to this path of the dumper's mount namespace (as `ip
    /// netns add` binds network namespaces under `/run/netns`): reopened
    /// from the path.
    Path(String),
}

impl NsFileOf {
    pub fn is_own(&self) -> bool {
        *self == NsFileOf::Own
    }
}

/// Manifest format version written when an fd is on the namespace of
/// the dumper or of a path ([`NsFileOf`]), so that a reader that predates
/// it refuses the manifest instead of reopening the tree's own namespace.
pub const NS_FILE_OF_MANIFEST_VERSION: u32 = 19;

/// Manifest format version written when a virtual console or serial
/// line is the controlling terminal of a session of the tree
/// (`FdKind::TtyLine`'s `session`), so that a reader that predates it
/// refuses the manifest instead of restoring the session without it.
pub const LINE_CTTY_MANIFEST_VERSION: u32 = 20;

/// Manifest format version written when a process holds `/dev/tty` on a
/// virtual console or serial line ([`FdKind::LineDevTty`]), so that a
/// reader that predates it refuses the manifest by its version.
pub const LINE_DEV_TTY_MANIFEST_VERSION: u32 = 21;

/// The newest manifest format version this reader knows.
pub const LATEST_MANIFEST_VERSION: u32 = LINE_DEV_TTY_MANIFEST_VERSION;

impl Manifest {
    /// The format version this manifest's content calls for: the oldest
    /// whose readers know everything it holds.
    pub fn format_version(&self) -> u32 {
        let ghost_marks = || {
            self.processes.iter().flat_map(|p| &p.fds).any(|f| {
                matches!(&f.kind, FdKind::Fanotify { marks, .. } if marks.iter().any(|m| m.ghost.is_some()))
            })
        };
        let uffd = || {
            self.processes
                .iter()
                .flat_map(|p| &p.fds)
                .any(|f| matches!(f.kind, FdKind::Userfaultfd(_)))
        };
        let partial_sysv = || {
            self.processes
                .iter()
                .flat_map(|p| &p.vmas)
                .any(|v| matches!(v.kind, VmaKind::SysvShm { partial: true, .. }))
        };
        let unaccepted = || {
            self.processes.iter().flat_map(|p| &p.fds).any(|f| {
                matches!(
                    &f.kind,
                    FdKind::Inet(InetSocket {
                        state: InetState::Unaccepted { .. },
                        ..
                    })
                )
            })
        };
        // A tmpfs file described by `size` (even one all holes) is one an
        // older reader would make empty.
        let sized_tmpfs = || {
            self.namespaces
                .iter()
                .filter_map(|n| n.mnt.as_ref())
                .flat_map(|m| m.tmpfs.iter())
                .flat_map(|t| t.entries.iter())
                .any(|e| e.size != 0)
        };
        let net_devices = self
            .namespaces
            .as_ref()
            .and_then(|n| n.net.as_ref())
            .is_some_and(|n| !n.veths.is_empty() || !n.routes.is_empty());
        let tun = || {
            self.namespaces
                .as_ref()
                .and_then(|n| n.net.as_ref())
                .is_some_and(|n| !n.tuns.is_empty())
                || self
                    .processes
                    .iter()
                    .flat_map(|p| &p.fds)
                    .any(|f| matches!(f.kind, FdKind::Tun(_)))
        };
        let posix_queues = || {
            self.namespaces
                .as_ref()
                .is_some_and(|n| n.posix_queues.is_some())
                || self.processes.iter().flat_map(|p| &p.fds).any(|f| {
                    matches!(f.kind, FdKind::Mqueue { .. })
                        || matches!(&f.kind, FdKind::PtyMaster(p) if p.devpts.is_some())
                })
        };
        let own_root = self
            .namespaces
            .iter()
            .filter_map(|n| n.mnt.as_ref())
            .any(|m| m.root.is_some());
        let held_queue = || {
            self.processes
                .iter()
                .flat_map(|p| &p.fds)
                .any(|f| matches!(&f.kind, FdKind::Mqueue { queue: Some(_), .. }))
        };
        let net_routing = self
            .namespaces
            .as_ref()
            .and_then(|n| n.net.as_ref())
            .is_some_and(NetNamespace::has_routing);
        let threaded = self
            .cgroups
            .as_ref()
            .is_some_and(|c| !c.threads.is_empty() || c.dirs.iter().any(|d| d.threaded));
        let net_nexthops = self
            .namespaces
            .as_ref()
            .and_then(|n| n.net.as_ref())
            .is_some_and(NetNamespace::has_nexthops);
        let ns_file_of = || {
            self.processes
                .iter()
                .flat_map(|p| &p.fds)
                .any(|f| matches!(&f.kind, FdKind::NsFile { of, .. } if !of.is_own()))
        };
        let line_ctty = || {
            self.processes.iter().flat_map(|p| &p.fds).any(|f| {
                matches!(
                    &f.kind,
                    FdKind::TtyLine {
                        session: Some(_),
                        ..
                    }
                )
            })
        };
        let line_dev_tty = || {
            self.processes
                .iter()
                .flat_map(|p| &p.fds)
                .any(|f| matches!(&f.kind, FdKind::LineDevTty { .. }))
        };
        if line_dev_tty() {
            LINE_DEV_TTY_MANIFEST_VERSION
        } else if line_ctty() {
            LINE_CTTY_MANIFEST_VERSION
        } else if ns_file_of() {
            NS_FILE_OF_MANIFEST_VERSION
        } else if self.namespaces.as_ref().is_some_and(|n| n.stand_in_init) {
            STAND_IN_INIT_MANIFEST_VERSION
        } else if own_mounts(self.namespaces.as_ref()) {
            OWN_MOUNTS_MANIFEST_VERSION
        } else if net_nexthops {
            NET_NEXTHOPS_MANIFEST_VERSION
        } else if net_routing {
            NET_ROUTING_MANIFEST_VERSION
        } else if fresh_mounts(self.namespaces.as_ref()) {
            FRESH_MOUNTS_MANIFEST_VERSION
        } else if threaded {
            THREADED_CGROUPS_MANIFEST_VERSION
        } else if self.processes.iter().any(|p| p.pending_time.is_some()) {
            PENDING_TIME_MANIFEST_VERSION
        } else if held_queue() {
            HELD_QUEUE_MANIFEST_VERSION
        } else if own_root {
            OWN_ROOT_MANIFEST_VERSION
        } else if tun() {
            TUN_MANIFEST_VERSION
        } else if posix_queues() {
            POSIX_QUEUES_MANIFEST_VERSION
        } else if self.cgroups.is_some() {
            CGROUPS_MANIFEST_VERSION
        } else if self.namespaces.as_ref().is_some_and(|n| n.time.is_some()) {
            TIME_NAMESPACE_MANIFEST_VERSION
        } else if net_devices {
            NET_DEVICES_MANIFEST_VERSION
        } else if self.content.is_some() || sized_tmpfs() {
            CONTENT_MANIFEST_VERSION
        } else if self.shell_job.is_some()
            || unaccepted()
            || partial_sysv()
            || uffd()
            || ghost_marks()
        {
            SHELL_JOB_MANIFEST_VERSION
        } else if self.namespaces.as_ref().is_some_and(|n| {
            !n.msg_queues.is_empty()
                || !n.sem_sets.is_empty()
                || n.user.is_some()
                || n.cgroup_ns.is_some()
                || later_mounts(n)
        }) {
            NAMESPACE_OBJECTS_MANIFEST_VERSION
        } else if self.namespaces.is_some() {
            NAMESPACES_MANIFEST_VERSION
        } else {
            crate::FORMAT_VERSION
        }
    }
}

/// The namespaces of a dumped tree that differ from the dumper's (every
/// process of the tree shares the root's). A kind absent here was the
/// dumper's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    /// A PID namespace of its own: the root is PID 1 again (its init), or
    /// with [`Namespaces::stand_in_init`] keeps its PID there.
    #[serde(default)]
    pub pid: bool,
    /// With `pid`: the namespace's init was not dumped (the root is a
    /// descendant of an init outside the tree, as a job under a
    /// container's shell). The restore makes a stand-in init, PID 1 of
    /// the new namespace, that forks the root at its PID and then only
    /// reaps. Manifest version 18.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stand_in_init: bool,
    /// A UTS namespace: its host and domain names.
    #[serde(default)]
    pub uts: Option<UtsNamespace>,
    /// An IPC namespace (its System V segments are in `sysv_shm`).
    #[serde(default)]
    pub ipc: bool,
    /// The System V message queues of that IPC namespace, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub msg_queues: Vec<SysvMsgQueue>,
    /// The System V semaphore sets of that IPC namespace, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sem_sets: Vec<SysvSemSet>,
    /// A network namespace: its loopback, veth interfaces and routes.
    #[serde(default)]
    pub net: Option<NetNamespace>,
    /// A mount namespace: the mounts it has that the dumper's has not.
    #[serde(default)]
    pub mnt: Option<MountNamespace>,
    /// A user namespace, owner of the others: its id maps. Every id in
    /// the manifest (credentials, owners) is as the dumper sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserNamespace>,
    /// The tree's cgroup (v2: the path after `0::` in `/proc/PID/cgroup`),
    /// where the restored tree is put (the directory is made if missing).
    #[serde(default)]
    pub cgroup: Option<String>,
    /// A cgroup namespace of its own: the cgroup (as the dumper sees it) at
    /// its root, which the restored root enters to make its new one (then
    /// goes on to `cgroup`). Manifest version 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_ns: Option<String>,
    /// The POSIX message queues of that IPC namespace (when it has any),
    /// with its queue limits. Manifest version 9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub posix_queues: Option<PosixQueues>,
    /// A time namespace of its own: its clocks at the dump, which the
    /// restored tree's new one continues from. Manifest version 7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<TimeNamespace>,
}

/// A time namespace of the tree's own. Its `CLOCK_MONOTONIC` and
/// `CLOCK_BOOTTIME` read, inside it, the host's plus its offsets; the
/// restore gives the new one the offsets that make them read, when it is
/// made, what they read at the dump (the time the tree spent dumped is
/// not seen: they never go backwards, nor jump). Nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeNamespace {
    /// `CLOCK_MONOTONIC` inside the namespace at the dump (tree frozen).
    pub monotonic: i64,
    /// `CLOCK_BOOTTIME` inside it, read at the same instant.
    pub boottime: i64,
    /// Its offsets at the dump (`/proc/PID/timens_offsets`), for the
    /// record: the restored namespace has others, as the host's clocks
    /// have moved on.
    pub monotonic_offset: i64,
    pub boottime_offset: i64,
}

/// The cgroups (v2) of a tree whose processes were in several, or with a
/// thread in another than its process's, their paths as the dumper saw
/// them (after `0::` in `/proc/PID/cgroup`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroups {
    /// The cgroup of each live process (zombies are left in their
    /// parent's), by PID: its main thread's.
    pub procs: Vec<ProcessCgroup>,
    /// The cgroups below the deepest one that holds all of `procs`' and
    /// `threads`' (that one excluded), down to each process's and
    /// thread's, parents first: what a restore that has to make one of
    /// them gives it.
    #[serde(default)]
    pub dirs: Vec<CgroupDir>,
    /// Each thread (not a main one) in another cgroup than its process's
    /// (a threaded cgroup, `cgroup.type` `threaded`, the thread moved by
    /// its TID to `cgroup.threads`), by TID. A manifest with any says
    /// [`THREADED_CGROUPS_MANIFEST_VERSION`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadCgroup>,
}

/// A thread in another cgroup than its process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCgroup {
    pub tid: i32,
    pub path: String,
}

/// The limits saved of a cgroup (those of its controllers that are
/// enabled in it), with the `hugetlb.<size>.max` ones: the only files a
/// restore writes of one it makes ([`is_cgroup_limit`]).
pub const CGROUP_LIMITS: [&str; 8] = [
    "cpu.max",
    "cpu.weight",
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "memory.swap.max",
    "pids.max",
];

/// Whether `file` is a cgroup interface file of a limit saved and
/// restored: one of [`CGROUP_LIMITS`], or `hugetlb.<size>.max` (`<size>`
/// as `2MB`, `1GB`).
pub fn is_cgroup_limit(file: &str) -> bool {
    if CGROUP_LIMITS.contains(&file) {
        return true;
    }
    let Some(size) = file
        .strip_prefix("hugetlb.")
        .and_then(|f| f.strip_suffix(".max"))
    else {
        return false;
    };
    let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &size[digits.len()..];
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && matches!(unit, "KB" | "MB" | "GB")
}

/// The cgroup of a process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessCgroup {
    pub pid: i32,
    pub path: String,
}

/// A cgroup below the tree's common one, with its settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupDir {
    pub path: String,
    /// The controllers it enabled for its children
    /// (`cgroup.subtree_control`).
    #[serde(default)]
    pub subtree_control: Vec<String>,
    /// Its limits (`memory.max`, `pids.max`, `cpu.max`, `cpu.weight`...),
    /// those of the controllers enabled in it.
    #[serde(default)]
    pub limits: Vec<CgroupLimit>,
    /// A threaded cgroup (`cgroup.type` `threaded`): made so again
    /// before its limits are written (its parent then reads `domain
    /// threaded`, or `threaded` too).
    #[serde(default, skip_serializing_if = "is_false")]
    pub threaded: bool,
}

/// One interface file of a cgroup and its content (trimmed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLimit {
    pub file: String,
    pub value: String,
}

/// The POSIX message queues of an IPC namespace and its limits
/// (`/proc/sys/fs/mqueue`, as a thread in it reads them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixQueues {
    pub msg_max: u64,
    pub msgsize_max: u64,
    pub queues_max: u64,
    pub msg_default: u64,
    pub msgsize_default: u64,
    /// By name.
    pub queues: Vec<PosixQueue>,
}

/// A POSIX message queue and the messages queued in it, in the order
/// they are received (highest priority first, oldest first within one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixQueue {
    /// Its name, without the leading `/`.
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`0o777`).
    pub mode: u32,
    /// Most messages it holds (`mq_maxmsg`).
    pub maxmsg: i64,
    /// Largest message it takes (`mq_msgsize`).
    pub msgsize: i64,
    pub messages: Vec<PosixMessage>,
}

/// A POSIX message queue saved with an fd on it ([`FdKind::Mqueue`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldQueue {
    /// Its inode at the dump: fds with the same one are on one queue.
    pub ino: u64,
    /// Unlinked since it was opened: made again under a name of its own,
    /// opened, and unlinked.
    pub deleted: bool,
    /// Its attributes and messages (`name`: the one it had).
    pub queue: PosixQueue,
}

/// One message of a POSIX queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixMessage {
    pub prio: u32,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Who a System V IPC object is: its id, key, owner and mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvIpcPerm {
    pub id: i32,
    pub key: i32,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`0o777`).
    pub mode: u32,
}

/// A System V message queue and the messages queued in it, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvMsgQueue {
    pub perm: SysvIpcPerm,
    /// Most bytes the queue holds (`msg_qbytes`).
    pub qbytes: u64,
    pub messages: Vec<SysvMessage>,
}

/// One message of a System V queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvMessage {
    /// Its type (`mtype`, positive).
    pub mtype: i64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A System V semaphore set and the value of each semaphore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvSemSet {
    pub perm: SysvIpcPerm,
    pub values: Vec<u16>,
}

/// The id maps of a user namespace, as the dumper's sees them: lines
/// `[first id inside, first id outside, count]` of `uid_map`, `gid_map`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserNamespace {
    pub uid_map: Vec<[u32; 3]>,
    pub gid_map: Vec<[u32; 3]>,
    /// `setgroups` denied in it (`/proc/PID/setgroups` says `deny`).
    pub setgroups_deny: bool,
}

impl UserNamespace {
    /// The id inside for `outside` by `map` (`None`: not mapped).
    pub fn inside(map: &[[u32; 3]], outside: u32) -> Option<u32> {
        map.iter().find_map(|&[i, o, n]| {
            let off = outside.checked_sub(o)?;
            (off < n).then(|| i.checked_add(off)).flatten()
        })
    }
}

/// What a UTS namespace holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtsNamespace {
    pub hostname: String,
    pub domainname: String,
}

/// What a network namespace holds: a loopback interface, veth interfaces
/// (as a container runtime gives one), and routes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetNamespace {
    /// Whether `lo` was up.
    pub lo_up: bool,
    /// Its veth interfaces, each with its peer in the dumper's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub veths: Vec<Veth>,
    /// The routes of its main table, but those the kernel makes itself
    /// from an address (protocol `kernel`), in the order the kernel listed
    /// them (IPv4 first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<NetRoute>,
    /// Its tun and tap devices. Manifest version 10.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tuns: Vec<TunDevice>,
    /// Its policy routing rules (`ip rule`, both families, in the order
    /// the kernel listed them), the kernel's own included; empty when they
    /// were only the kernel's (as a new namespace has them). Manifest
    /// version 15.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<NetRule>,
    /// Its interfaces made inside it by rtnetlink (bridges, ifbs,
    /// macvlans, vxlans, veth pairs with both ends in it), in the order
    /// the kernel listed them. Manifest version 15.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<NetLink>,
    /// Its next-hop objects (`ip nexthop`), in the kernel's order (by
    /// id). Manifest version 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nexthops: Vec<NetNexthopObject>,
}

/// A next-hop object (`RTM_NEWNEXTHOP`): its header (`struct nhmsg`), its
/// output interface by name, and its other attributes (`NHA_*`: its id,
/// gateway, encapsulation, group...) as the kernel dumped them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetNexthopObject {
    /// `AF_INET`, `AF_INET6`, or 0 (a group, a blackhole).
    pub family: u8,
    /// `RT_SCOPE_*`, as the kernel worked it out (not given to it).
    pub scope: u8,
    /// `RTPROT_*`.
    pub protocol: u8,
    /// `RTNH_F_ONLINK`.
    pub flags: u32,
    /// The interface it goes out of (`NHA_OIF`), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub attrs: Vec<NetAttr>,
    /// The interfaces its encapsulation names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encap_devs: Vec<EncapDev>,
}

/// An interface a `seg6local` encapsulation names (`SEG6_LOCAL_IIF`,
/// `SEG6_LOCAL_OIF`: `kind`), by name: the index in the saved
/// `RTA_ENCAP` or `NHA_ENCAP` is the dumped namespace's, replaced by the
/// interface's index at restore. Manifest version 16.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncapDev {
    pub kind: u16,
    pub dev: String,
}

/// `IFLA_MACVLAN_MACADDR_DATA`: a source-mode macvlan's list of source
/// addresses, in [`NetLink::data`] (manifest version 16).
pub const IFLA_MACVLAN_MACADDR_DATA: u16 = 5;

/// `RTA_VIA`, `RTA_ENCAP_TYPE` and `RTA_ENCAP`: the attributes of a route
/// or of one of its next hops that manifest version 16 added.
pub const NET_HOP_ATTRS: [u16; 3] = [18, 21, 22];

/// An interface made inside the tree's network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetLink {
    /// Its name, hardware address, MTU, up state, addresses and master.
    pub iface: NetInterface,
    /// `bridge`, `ifb`, `macvlan`, `vxlan` or `veth`.
    pub kind: String,
    pub txqlen: u32,
    /// The interface it is linked to, by name: a macvlan's or vxlan's
    /// lower device, a veth's other end.
    #[serde(default)]
    pub link: Option<String>,
    /// Its `IFLA_INFO_DATA` attributes that are its configuration (a
    /// bridge's STP state and timers, a macvlan's mode, a vxlan's id,
    /// addresses and ports; a vxlan's lower device is `link`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<NetAttr>,
}

impl NetNamespace {
    /// Whether it holds what [`NET_ROUTING_MANIFEST_VERSION`] added.
    pub fn has_routing(&self) -> bool {
        let ifaces = self
            .veths
            .iter()
            .flat_map(|v| [&v.inside, &v.peer])
            .chain(self.tuns.iter().map(|t| &t.iface));
        let ifaces = ifaces.chain(self.links.iter().map(|l| &l.iface));
        !self.rules.is_empty()
            || !self.links.is_empty()
            || ifaces.clone().any(|i| i.master.is_some())
            || ifaces.flat_map(|i| &i.addrs).any(|a| a.peer.is_some())
            || self.routes.iter().any(|r| {
                r.table != RT_TABLE_MAIN
                    || !r.nexthops.is_empty()
                    || r.flags != 0
                    || !r.attrs.is_empty()
            })
    }

    /// Whether it holds what [`NET_NEXTHOPS_MANIFEST_VERSION`] added.
    pub fn has_nexthops(&self) -> bool {
        let hop_attrs = |attrs: &[NetAttr]| attrs.iter().any(|a| NET_HOP_ATTRS.contains(&a.kind));
        !self.nexthops.is_empty()
            || self.links.iter().any(|l| {
                l.kind == "macvlan" && l.data.iter().any(|a| a.kind == IFLA_MACVLAN_MACADDR_DATA)
            })
            || self.routes.iter().any(|r| {
                r.src.is_some()
                    || r.nhid.is_some()
                    || hop_attrs(&r.attrs)
                    || r.nexthops.iter().any(|h| !h.attrs.is_empty())
            })
    }
}

/// `RT_TABLE_MAIN`, the table of a route saved before
/// [`NET_ROUTING_MANIFEST_VERSION`].
pub const RT_TABLE_MAIN: u32 = 254;

fn main_table() -> u32 {
    RT_TABLE_MAIN
}

/// A policy routing rule (a FIB rule, `RTM_NEWRULE`): its header
/// (`struct fib_rule_hdr`) and its attributes (`FRA_*`) as the kernel
/// dumped them, given back to it as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetRule {
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u8,
    pub dst_len: u8,
    pub src_len: u8,
    pub tos: u8,
    /// The table (`FRA_TABLE` has it too when above 255).
    pub table: u8,
    /// `FR_ACT_*`.
    pub action: u8,
    /// `FIB_RULE_*`.
    pub flags: u32,
    pub attrs: Vec<NetAttr>,
}

/// A netlink attribute as the kernel gave it: its type and value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetAttr {
    pub kind: u16,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// A tun or tap device of the tree's network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunDevice {
    /// Its name, MTU, hardware address (a tap's), up state and addresses.
    pub iface: NetInterface,
    /// `IFF_TUN` or `IFF_TAP`, with `IFF_NO_PI`, `IFF_VNET_HDR`,
    /// `IFF_MULTI_QUEUE` as it had them (`TUNSETIFF`'s flags).
    pub flags: u32,
    /// It outlived its fds (`TUNSETPERSIST`).
    pub persist: bool,
    /// The uid and gid allowed to attach to it (`None`: anyone).
    #[serde(default)]
    pub owner: Option<u32>,
    #[serde(default)]
    pub group: Option<u32>,
}

/// A veth pair: its end in the tree's network namespace, and its peer in
/// the dumper's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Veth {
    pub inside: NetInterface,
    pub peer: NetInterface,
    /// The bridge the peer was a port of (by name, in the dumper's
    /// namespace).
    #[serde(default)]
    pub master: Option<String>,
}

/// An interface: its name, hardware address, MTU, up state and addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetInterface {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    /// Its addresses, but IPv6 link-local ones and those of
    /// autoconfiguration (the kernel makes those itself).
    #[serde(default)]
    pub addrs: Vec<NetAddress>,
    /// The bridge of the tree's namespace it is a port of, by name (not
    /// a veth peer's: that is [`Veth::master`]). Manifest version 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// Its number as a port of `master` (the restore attaches the ports
    /// of a bridge in their numbers' order). Manifest version 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_no: Option<u16>,
}

/// An address of an interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetAddress {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
    /// Its IPv4 broadcast address, if it has one.
    #[serde(default)]
    pub broadcast: Option<std::net::IpAddr>,
    /// `IFA_F_NODAD` and `IFA_F_NOPREFIXROUTE`, the flags a user gives.
    #[serde(default)]
    pub flags: u32,
    /// `RT_SCOPE_*`.
    #[serde(default)]
    pub scope: u8,
    /// The other end of a point-to-point link (`ip addr add A peer B`:
    /// `IFA_ADDRESS`, where `addr` is `IFA_LOCAL`). Manifest version 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<std::net::IpAddr>,
}

/// A route (of any table, but the kernel's own: those it made from an
/// address or an interface).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetRoute {
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u8,
    /// `None`: the default route.
    pub dst: Option<std::net::IpAddr>,
    pub dst_len: u8,
    pub gateway: Option<std::net::IpAddr>,
    /// The interface it goes out of, by name.
    pub dev: Option<String>,
    pub metric: Option<u32>,
    /// Its preferred source address.
    #[serde(default)]
    pub prefsrc: Option<std::net::IpAddr>,
    /// `RTPROT_*`, `RT_SCOPE_*` and `RTN_*` (unicast, blackhole, ...).
    pub protocol: u8,
    pub scope: u8,
    pub kind: u8,
    /// Its table (`RT_TABLE_*` or any id). Manifest version 15, as all
    /// below.
    #[serde(default = "main_table")]
    pub table: u32,
    /// Its next hops when it has several (`RTA_MULTIPATH`; `gateway` and
    /// `dev` are then `None`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nexthops: Vec<NetNextHop>,
    /// `RTNH_F_ONLINK` of its single next hop (`rtm_flags`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub flags: u32,
    /// Its metrics (`RTA_METRICS`: `mtu`, `advmss`, ...), IPv6 preference
    /// (`RTA_PREF`) and realm (`RTA_FLOW`), as the kernel dumped them;
    /// and since manifest version 16 its gateway of another family
    /// (`RTA_VIA`) and encapsulation (`RTA_ENCAP_TYPE`, `RTA_ENCAP`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attrs: Vec<NetAttr>,
    /// Its source prefix (`from`, IPv6). Manifest version 16, as all
    /// below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub src_len: u8,
    /// The next-hop object it goes through (`nhid`: one of
    /// [`NetNamespace::nexthops`]; `gateway`, `dev` and `nexthops` are
    /// then `None` and empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nhid: Option<u32>,
    /// The interfaces its encapsulation names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encap_devs: Vec<EncapDev>,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// One next hop of a route with several.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetNextHop {
    pub gateway: Option<std::net::IpAddr>,
    /// The interface it goes out of, by name.
    pub dev: Option<String>,
    /// Its weight less one (`rtnh_hops`).
    pub hops: u8,
    /// `RTNH_F_ONLINK`.
    pub flags: u8,
    /// Its gateway of another family (`RTA_VIA`), encapsulation
    /// (`RTA_ENCAP_TYPE`, `RTA_ENCAP`) and realm (`RTA_FLOW`), as the
    /// kernel dumped them. Manifest version 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attrs: Vec<NetAttr>,
    /// The interfaces its encapsulation names. Manifest version 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encap_devs: Vec<EncapDev>,
}

/// The mounts of a mount namespace that the dumper's lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountNamespace {
    /// A proc file system of the tree's PID namespace mounted on `/proc`
    /// (as `unshare --mount-proc` does).
    pub proc: bool,
    /// tmpfs mounts, in the order they were mounted, with their content.
    #[serde(default)]
    pub tmpfs: Vec<TmpfsMount>,
    /// Bind mounts of paths of the dumper's mount namespace, in the order
    /// they were mounted (after the tmpfs mounts at restore).
    #[serde(default)]
    pub binds: Vec<BindMount>,
    /// Mounts made by the restorer inside the new namespace once the
    /// `tmpfs` mounts are filled and the `binds` made, in the order they
    /// were mounted: from the first mount the stub cannot make (one nested
    /// in another, read-only, or not tmpfs nor bind) on, every mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub later: Vec<LaterMount>,
    /// A root of its own (as `pivot_root` makes): the directory where the
    /// dumper sees the tree's root file system (`source`, a mount of the
    /// dumper's namespace holds it) and the flags of the mount on `/`
    /// (`target` is `/`). Every `target` above is then under that root: the
    /// restorer makes the mounts under `source`, then pivots into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<BindMount>,
    /// The mounts it copied from the dumper's were made slaves (as
    /// `unshare --propagation slave` or `mount --make-rslave /` do: those
    /// shared there receive the dumper's mounts): the restored namespace's
    /// copies are made slaves of the restorer's, not private.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slave_copies: bool,
}

/// A bind mount of a path the dumper sees (`source`) on `target`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    pub source: String,
    pub target: String,
    /// `MS_*` flags of the mount (`MS_RDONLY`, `MS_NOSUID`...).
    pub flags: u64,
}

/// A tmpfs mount of the tree's mount namespace and everything in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsMount {
    /// Where it is mounted (absolute).
    pub target: String,
    /// `MS_*` flags of the mount (`MS_RDONLY`, `MS_NOSUID`...).
    pub flags: u64,
    /// The file system's options (`size=`, `mode=`...), as `mount` takes them.
    pub options: String,
    /// Its source, as `mount` shows it (empty: `tmpfs`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Its directory, files and symbolic links, each after its directory;
    /// the first, with an empty path, is the mount's root.
    pub entries: Vec<TmpfsEntry>,
}

/// A mount made by the restorer in the tree's new mount namespace (its
/// mount point is made first if missing, as a directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaterMount {
    /// Where it is mounted (absolute).
    pub target: String,
    /// `MS_*` flags of the mount (`MS_RDONLY`, `MS_NOSUID`...); a
    /// read-only tmpfs is made read-only once filled.
    pub flags: u64,
    pub what: LaterKind,
    /// Its propagation, as `mount` takes it once made: `MS_SHARED`,
    /// `MS_SLAVE` or `MS_UNBINDABLE` (0: private, as every mount of the
    /// restored namespace is made).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub propagation: u64,
}

/// What a [`LaterMount`] is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LaterKind {
    /// A tmpfs and its content.
    Tmpfs {
        /// The file system's options, as `mount` takes them.
        options: String,
        entries: Vec<TmpfsEntry>,
        /// Its source, as `mount` shows it (empty: `tmpfs`).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        source: String,
    },
    /// A bind mount of a path of the dumper's mount namespace.
    Bind { source: String },
    /// A ramfs and its content (as a tmpfs's).
    Ramfs {
        source: String,
        /// The file system's options, as `mount` takes them.
        options: String,
        entries: Vec<TmpfsEntry>,
    },
    /// A hugetlbfs holding files, and its content (as a tmpfs's: a
    /// regular file's data extents are whole huge pages, a page all zeros
    /// left a hole; the restore writes them through a shared mapping, as
    /// hugetlbfs takes no `write`). An empty one is [`LaterKind::Fresh`].
    /// Manifest format version 17.
    Hugetlbfs {
        source: String,
        /// The file system's options (`pagesize=`, `size=`...), as
        /// `mount` takes them.
        options: String,
        entries: Vec<TmpfsEntry>,
    },
    /// An overlay whose directories the dumper sees: mounted again on
    /// them (its content is theirs: nothing of it is saved). Each path is
    /// as the dumper sees that directory (as a bind's source), resolved
    /// at restore as one is. Manifest format version 17.
    Overlay {
        source: String,
        /// Its lower layers, as `mount` takes them (`:` between layers,
        /// `::` before the data-only ones).
        lowerdir: String,
        /// Empty: a read-only overlay, of lower layers only.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        upperdir: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        workdir: String,
        /// Its other options (`redirect_dir=`, `index=`, `uuid=`...), as
        /// `mount` takes them.
        options: String,
    },
    /// A file system that holds nothing to save, mounted anew: `sysfs`,
    /// `mqueue` without queues, a `devpts` instance without terminals,
    /// a `proc` (of the tree's PID namespace), an empty `hugetlbfs`, and
    /// views of the kernel's own state (`tracefs`, `securityfs`,
    /// `debugfs`, `binfmt_misc`, `configfs`...).
    Fresh {
        fstype: String,
        source: String,
        /// The file system's options, as `mount` takes them.
        options: String,
    },
}

impl Default for LaterKind {
    fn default() -> Self {
        LaterKind::Bind {
            source: String::new(),
        }
    }
}

/// One inode of a [`TmpfsMount`] (a file with several links is saved once
/// per link).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsEntry {
    /// Path under the mount, without a leading `/` (empty: its root).
    pub path: String,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// A symbolic link's target; a regular file's content in images
    /// written before content packs (`size` 0, no `extents`).
    #[serde(default, with = "serde_bytes")]
    pub data: Vec<u8>,
    /// A regular file's size (its data is in `extents`; the rest is
    /// holes). 0 in older images.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// A regular file's data extents, in the content pack.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extents: Vec<Extent>,
    /// A device node's device number (`st_rdev`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rdev: u64,
}

impl TmpfsEntry {
    /// A regular file's size and data extents, in order (checked).
    pub fn content(&self) -> Result<Content<'_>, ContentError> {
        let (size, ext) = content(&self.data, self.size, &self.extents);
        check_extents(size, &ext, || format!("tmpfs file {}", self.path))?;
        Ok((size, ext))
    }
}

/// Where a checkpoint stands in a distributed application's history: the
/// job and the round of the cluster checkpoint that took it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutMark {
    pub job: String,
    pub round: u64,
}

/// Why one part of a cut across hosts was abandoned at a barrier (the
/// coordinator said so, or is gone): a dump or restore then fails as on
/// any error, leaving nothing behind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the cluster operation was abandoned: {0}")]
pub struct CutAbort(pub String);

/// A System V shared memory segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvShm {
    pub key: i32,
    pub shmid: i32,
    /// Mode bits, with `SHM_DEST` (0o1000) if it was removed while attached.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The whole content, in images written before sparse content
    /// (`size` 0 and no `extents`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Size of the segment in bytes.
    #[serde(default)]
    pub size: u64,
    /// The byte runs that hold data; the rest of the segment is holes
    /// (pages that did not exist: they read as zeros and stay unallocated).
    #[serde(default)]
    pub extents: Vec<Extent>,
}

/// A run of bytes of a sparse object (a System V segment, a deleted file or
/// memfd) that holds data. Between extents, the object has holes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// Byte offset in the object.
    pub offset: u64,
    /// The bytes, in images written before content packs (`len` 0);
    /// empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Length in bytes of an extent stored in the content pack
    /// ([`Manifest::content`]); 0 for inline `data`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub len: u64,
    /// Pack address of the extent's first byte (page aligned); its bytes
    /// are the `len` bytes from there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub at: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Extent {
    /// An extent with its bytes inline (images before content packs, and
    /// tests).
    pub fn inline(offset: u64, data: Vec<u8>) -> Extent {
        Extent {
            offset,
            data,
            len: 0,
            at: 0,
        }
    }

    /// Length of the extent in bytes, wherever they are.
    pub fn bytes(&self) -> u64 {
        if self.len != 0 {
            self.len
        } else {
            self.data.len() as u64
        }
    }
}

/// A POSIX shared memory object (`/dev/shm/NAME`, from `shm_open`) saved
/// with its content, holes left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmFile {
    /// Its name in `/dev/shm` (no `/`).
    pub name: String,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub extents: Vec<Extent>,
    /// Mapped or held open by the tree at the dump: its own, put back
    /// over whatever holds the name at restore (else only if missing).
    #[serde(default)]
    pub held: bool,
}

/// The content of a sparse object: its size and its data extents, in
/// order. Their bytes are read with [`crate::ContentSource::read_extent`].
pub type Content<'a> = (u64, std::borrow::Cow<'a, [Extent]>);

/// The content of a sparse object from the sparse fields, or from `data`
/// in an image written before them.
fn content<'a>(data: &'a [u8], size: u64, extents: &'a [Extent]) -> Content<'a> {
    if size == 0 && extents.is_empty() {
        let all = if data.is_empty() {
            Vec::new()
        } else {
            vec![Extent::inline(0, data.to_vec())]
        };
        (data.len() as u64, std::borrow::Cow::Owned(all))
    } else {
        (size, std::borrow::Cow::Borrowed(extents))
    }
}

/// The content of a sparse object does not hold together: an extent out
/// of order, overlapping another, past the object's size, or both inline
/// and in the content pack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: extent {offset}+{len} out of order, past the size {size}, or malformed")]
pub struct ContentError {
    /// The object ("System V segment N", "deleted file or memfd N").
    pub object: String,
    pub offset: u64,
    pub len: u64,
    pub size: u64,
}

/// Checks that extents lie inside `size`, in order, without overlap, each
/// either inline or in the pack at a page-aligned address.
fn check_extents(
    size: u64,
    extents: &[Extent],
    object: impl FnOnce() -> String,
) -> Result<(), ContentError> {
    let mut end = 0u64;
    for e in extents {
        let len = e.bytes();
        let well_formed = (e.len == 0 || e.data.is_empty()) && e.at % crate::PAGE_SIZE == 0;
        match e
            .offset
            .checked_add(len)
            .filter(|&x| well_formed && e.offset >= end && x <= size)
        {
            Some(x) => end = x,
            None => {
                return Err(ContentError {
                    object: object(),
                    offset: e.offset,
                    len,
                    size,
                })
            }
        }
    }
    Ok(())
}

impl SysvShm {
    /// Size of the segment and its data extents, in order (checked:
    /// inside the size, no overlap).
    pub fn content(&self) -> Result<Content<'_>, ContentError> {
        let (size, ext) = content(&self.data, self.size, &self.extents);
        check_extents(size, &ext, || format!("System V segment {}", self.shmid))?;
        Ok((size, ext))
    }
}

impl ShmFile {
    /// Size of the object and its data extents, in order (checked).
    pub fn content(&self) -> Result<Content<'_>, ContentError> {
        check_extents(self.size, &self.extents, || {
            format!("POSIX shared memory object {}", self.name)
        })?;
        Ok((self.size, std::borrow::Cow::Borrowed(&self.extents)))
    }
}

/// A pipe (or FIFO) and the bytes that were in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeImage {
    /// Pipe inode number at dump (identifies the pipe within the image).
    pub id: u64,
    /// Capacity in bytes (`F_GETPIPE_SZ`).
    pub capacity: u32,
    /// Unread data, in order.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Facts about the machine a checkpoint was taken on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel_release: String,
    /// XCR0 feature mask of the CPU (which xstate components exist).
    pub xfeatures: u64,
    pub page_size: u64,
}

/// Figures recorded by the dumper.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpStats {
    /// Time the process was frozen, in microseconds.
    pub frozen_us: u64,
    /// Wall time of the whole dump, in microseconds.
    pub total_us: u64,
    /// Pages written to packs by this checkpoint.
    pub pages_written: u64,
    /// Dirty-tracking backend that chose the pages of an incremental
    /// checkpoint (`uffd`, `soft-dirty`, `hash`), empty for a full one.
    #[serde(default)]
    pub track: String,
    /// Why a dump asked to be incremental was full instead (empty if not).
    #[serde(default)]
    pub note: String,
}

/// One process of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessImage {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// `comm` (task name, at most 15 bytes).
    pub comm: String,
    /// Path of the executable (`/proc/PID/exe`).
    pub exe: String,
    pub cwd: String,
    /// Its root directory (`chroot`), when it is not `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    pub umask: u32,
    pub personality: u32,
    pub creds: Credentials,
    pub rlimits: Vec<Rlimit>,
    pub mm: MmImage,
    pub vmas: Vec<Vma>,
    /// Its fd table (empty when it shares another process's:
    /// `fds_shared_with`).
    pub fds: Vec<FdImage>,
    /// Made with `clone(CLONE_FILES)`: it shares the fd table of this
    /// earlier process of the manifest (whose `fds` list it), as does its
    /// parent; restored by forking it with `CLONE_FILES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fds_shared_with: Option<i32>,
    /// Signal dispositions, one entry per signal 1..=64 except SIGKILL and SIGSTOP.
    pub sigactions: Vec<SigAction>,
    /// Process-wide (shared) pending signals.
    pub shared_pending: Vec<SigInfo>,
    pub itimers: Vec<ITimer>,
    pub threads: Vec<ThreadImage>,
    /// Name of this process's page pack inside the checkpoint directory.
    pub pack: Option<PackRef>,
    /// A zombie (exited, not yet reaped): its raw wait status. Such an
    /// entry has no memory, fds or threads.
    #[serde(default)]
    pub zombie: Option<i32>,
    /// POSIX timers (`timer_create`).
    #[serde(default)]
    pub posix_timers: Vec<PosixTimer>,
    /// `PR_SET_NO_NEW_PRIVS`.
    #[serde(default)]
    pub no_new_privs: bool,
    /// `PR_SET_PDEATHSIG` (0: none).
    #[serde(default)]
    pub pdeath_signal: i32,
    /// `PR_SET_CHILD_SUBREAPER`: orphaned descendants are re-parented here.
    #[serde(default)]
    pub child_subreaper: bool,
    /// Start time of the process (`/proc/PID/stat` field 22, clock ticks
    /// after boot). With the pid it tells one process from a later one that
    /// reused its pid, across the checkpoints of a chain. 0: unknown.
    #[serde(default)]
    pub start_time: u64,
    /// `/proc/PID/oom_score_adj`; `None` in images older than this field.
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    /// `PR_SET_THP_DISABLE` (`THP_enabled: 0` in `/proc/PID/status`).
    #[serde(default)]
    pub thp_disabled: bool,
    /// `/proc/PID/loginuid` (the audit login uid; `u32::MAX`: unset);
    /// `None` in images older than this field.
    #[serde(default)]
    pub loginuid: Option<u32>,
    /// `PR_GET_DUMPABLE` (0, 1, or 2 for `suid_dumpable`); `None` in
    /// images older than this field.
    #[serde(default)]
    pub dumpable: Option<u32>,
    /// Stopped by job control (a stop signal) when it was frozen: stopped
    /// again once restored.
    #[serde(default)]
    pub stopped: bool,
    /// The signal that stopped it (`SIGTSTP`, `SIGTTIN`, `SIGTTOU` or
    /// `SIGSTOP`: what its parent's `waitid` reports). `None`: `SIGSTOP`
    /// (images older than this field, or not seen).
    #[serde(default)]
    pub stop_signal: Option<i32>,
    /// `membarrier` registrations of its memory (a mask of the
    /// `MEMBARRIER_CMD_REGISTER_*` commands), registered again at restore.
    #[serde(default)]
    pub membarrier: u32,
    /// The AIO contexts whose ring held completed events not yet read
    /// (the others come back empty, as made by `io_setup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aio_rings: Vec<AioRing>,
    /// A time namespace it has unshared (`CLONE_NEWTIME`) that no process
    /// is in yet: its children are made there (its own is the tree's).
    /// The restore unshares a new one with the same offsets. A manifest
    /// with it says [`PENDING_TIME_MANIFEST_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_time: Option<PendingTimeNamespace>,
    /// Incremental checkpoints only: every page range (`[start, end)`,
    /// page-aligned, sorted, disjoint) of this process that holds saved
    /// data. Pages of these ranges that are not in this checkpoint's pack
    /// are in the pack of the same process in the nearest ancestor
    /// checkpoint that has them. `None`: exactly the pages of `pack`.
    #[serde(default)]
    pub data_ranges: Option<Vec<(u64, u64)>>,
}

/// The clock offsets of a time namespace a process unshared and no
/// process entered yet (`/proc/PID/timens_offsets` then shows them: its
/// `ns/time_for_children` is not its `ns/time`), against the host's
/// clocks, in nanoseconds. Nobody has read its clocks yet, so they are
/// kept as written (not moved on like [`TimeNamespace`]'s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTimeNamespace {
    pub monotonic_offset: i64,
    pub boottime_offset: i64,
    /// Its other threads make their children there too (made after it
    /// was unshared, they share it); else only its main thread does.
    #[serde(default, skip_serializing_if = "is_false")]
    pub threads: bool,
}

/// A POSIX timer, restored at the same timer ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixTimer {
    pub id: i32,
    pub clockid: i32,
    /// `sigev_notify`: `SIGEV_SIGNAL` (0), `SIGEV_NONE` (1), `SIGEV_THREAD`
    /// (2), or `SIGEV_SIGNAL | SIGEV_THREAD_ID` (4) for a timer directed at
    /// one thread (images before 2026-11-26 hold 0 for those: restored
    /// process-directed).
    pub notify: i32,
    pub signo: i32,
    /// Target thread for `SIGEV_THREAD_ID`.
    pub tid: i32,
    /// `sigev_value` passed with the signal.
    pub value: u64,
    /// Time to the next expiry and period, in nanoseconds (0: disarmed).
    pub value_ns: u64,
    pub interval_ns: u64,
}

/// Real, effective, saved and filesystem ids plus supplementary groups.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub uid: [u32; 4],
    pub gid: [u32; 4],
    pub groups: Vec<u32>,
    /// Capabilities and securebits; `None` in images older than this field.
    #[serde(default)]
    pub caps: Option<Capabilities>,
    /// The groups cannot be set (`setgroups` is denied in the process's
    /// user namespace): they are those it inherited, not restored.
    #[serde(default, skip_serializing_if = "is_false")]
    pub groups_fixed: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A process's capability sets (bit N: capability N) and its securebits
/// (`PR_GET_SECUREBITS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    pub bounding: u64,
    pub ambient: u64,
    pub securebits: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// The `mm_struct` fields restored with `PR_SET_MM_MAP`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmImage {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
    /// Raw auxiliary vector (`/proc/PID/auxv`), pairs of u64.
    pub auxv: Vec<u64>,
}

/// What backs a memory area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmaKind {
    /// Private or shared anonymous memory (heap, stack, bss, mmap).
    Anon,
    /// A file mapping, reopened by path on restore.
    File {
        path: String,
        /// Offset in the file, in bytes.
        offset: u64,
        dev: u64,
        ino: u64,
    },
    /// A System V shared memory segment attached (`shmat`); the segment is
    /// in `Manifest::sysv_shm`. `partial`: the area maps only part of it,
    /// from byte `offset` (what is left of an attachment the program
    /// unmapped in part, or moved): attached whole elsewhere, that part
    /// moved to the area, the rest detached. Manifest version 4.
    SysvShm {
        shmid: i32,
        #[serde(default, skip_serializing_if = "is_zero")]
        offset: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        partial: bool,
    },
    /// A mapping of a file without a name (deleted while mapped, or a
    /// memfd); its content is in `Manifest::ghosts` under `id`.
    Ghost {
        id: u64,
        /// Offset in the file, in bytes.
        offset: u64,
        /// The name it had (`/path` or `/memfd:name`), for messages.
        name: String,
    },
    /// `[vdso]`.
    Vdso,
    /// `[vvar]`.
    Vvar,
    /// `[vvar_vclock]` (kernels 6.13 and later).
    VvarVclock,
    /// The ring of an AIO context (`io_setup`; `/[aio]` in maps), whose
    /// address is the context's id. Its size gives the ring's capacity;
    /// a new context is made at restore and moved to this address.
    Aio,
    /// An area mapping the rings of a packet socket (`PACKET_RX_RING`,
    /// `PACKET_TX_RING`; `socket:[ino]` in maps), which is fd `fd` of the
    /// process: mapped again from that fd at offset `offset` once the
    /// process's fds exist (the socket's rings are set up again with it).
    /// The frames are not saved: the rings come back empty, as the
    /// socket's queue does.
    SocketRing { ino: u64, fd: i32, offset: u64 },
    /// An area mapping the rings of the io_uring instance with anonymous
    /// inode `ino` at mmap offset `offset`: mapped again, with its
    /// content, when the instance is made (its fd's `FdKind::IoUring`).
    IoUring { ino: u64, offset: u64 },
    /// A shared area mapping a `BPF_F_MMAPABLE` array at mmap offset
    /// `offset`, mapped again at restore from the process's fd `fd` on
    /// that map (made again with its values, `FdKind::BpfMap`): no pages
    /// saved, they are the map's. Added without a format version change:
    /// an older reader refuses the variant.
    BpfMap { fd: i32, offset: u64 },
}

/// The ring of an AIO context with completed events not yet read: its
/// `head` and `tail` and its event slots, so that the same events wait at
/// the same places after the restore (and the next completion lands at
/// `tail`, as before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioRing {
    /// The area's start: the context's id.
    pub start: u64,
    pub head: u32,
    pub tail: u32,
    /// Every event slot (`struct io_event`, 32 bytes each), the ring's
    /// capacity of them.
    #[serde(with = "serde_bytes")]
    pub events: Vec<u8>,
}

/// One memory area (`/proc/PID/maps` line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// PROT_* bits.
    pub prot: u32,
    /// MAP_SHARED (true) or MAP_PRIVATE (false).
    pub shared: bool,
    /// MAP_GROWSDOWN (a stack area).
    pub growsdown: bool,
    /// The rest of what `VmFlags` showed (`stasis_sys::vmflags` bits:
    /// advice, locking, `MAP_NORESERVE`...). `MAYWRITE` is kept for shared
    /// areas only (a private area may always be made writable).
    #[serde(default)]
    pub flags: u32,
    /// Guard pages (`MADV_GUARD_INSTALL`) in the area: page ranges
    /// `[start, end)`, installed again after the area is filled.
    #[serde(default)]
    pub guards: Vec<(u64, u64)>,
    /// Name shown in maps for special areas (`[heap]`, `[stack]`, ...).
    #[serde(default)]
    pub name: String,
    pub kind: VmaKind,
    /// Shared anonymous memory: the shmem object's inode and this area's
    /// byte offset in it. Areas of several processes with the same inode
    /// share memory; the first process (in manifest order) holds the pages.
    #[serde(default)]
    pub shm: Option<(u64, u64)>,
}

/// One file descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdImage {
    pub fd: i32,
    /// Open-file flags (`O_*`, from fdinfo, without `O_CLOEXEC`).
    pub flags: u32,
    pub cloexec: bool,
    pub kind: FdKind,
    /// Open file description shared with other fds of the image (dup'd or
    /// inherited): every fd with the same id refers to one description,
    /// restored once. `None`: not shared.
    #[serde(default)]
    pub shared_id: Option<u32>,
    /// File locks held through this fd.
    #[serde(default)]
    pub locks: Vec<FileLock>,
    /// Who gets the description's SIGIO, and which signal (`F_SETOWN_EX`,
    /// `F_SETSIG`); `None` when nobody was set.
    #[serde(default)]
    pub owner: Option<FileOwner>,
}

/// The signal owner of an open file description: `kind` as in
/// `f_owner_ex` (0 thread, 1 process, 2 process group), the id, and the
/// signal sent (0: SIGIO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOwner {
    pub kind: i32,
    pub pid: i32,
    pub signal: i32,
}

/// A file lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    pub kind: LockKind,
    pub write: bool,
    /// Byte range (POSIX and OFD locks); `len` 0 means to the end of file.
    pub start: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    /// `fcntl(F_SETLK)`: owned by the process.
    Posix,
    /// `flock()`: owned by the open file description.
    Flock,
    /// `fcntl(F_OFD_SETLK)`: owned by the open file description.
    Ofd,
    /// `fcntl(F_SETLEASE)`: a read or write lease, owned by the open file
    /// description (`start` and `len` 0).
    Lease,
    /// A lease being broken (another process opened the file): `write` is
    /// the lease held before the break, `to_read` whether the break only
    /// downgrades it to a read lease (a reader broke a write lease) rather
    /// than ends it.
    BreakingLease { to_read: bool },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FdKind {
    /// A regular file, directory or device node reopened by path.
    Path {
        path: String,
        pos: u64,
        /// File mode bits (type and permissions) seen at dump.
        mode: u32,
        /// Size at dump (regular files), for a sanity check at restore; a
        /// block device's device number (`st_rdev`), which the node at
        /// `path` must have at restore.
        size: u64,
    },
    /// One end of a pipe; its data is in `Manifest::pipes`.
    Pipe { id: u64, write_end: bool },
    /// A named pipe (FIFO) opened by path; its data is in `Manifest::pipes`.
    Fifo { path: String, id: u64 },
    /// An eventfd with its counter.
    Eventfd { count: u64, semaphore: bool },
    /// A timerfd: clock, the remaining time / interval when armed, and
    /// expirations not yet read.
    Timerfd {
        clockid: i32,
        value_ns: u64,
        interval_ns: u64,
        #[serde(default)]
        ticks: u64,
    },
    /// A signalfd and the signals it reads.
    Signalfd { mask: u64 },
    /// A BPF map (hash, LRU hash or array) with its elements.
    BpfMap(BpfMap),
    /// A packet socket (`AF_PACKET`).
    Packet(PacketSocket),
    /// An epoll instance and what is registered in it (fd numbers of this
    /// process).
    Epoll {
        targets: Vec<EpollTarget>,
        /// For an epoll in flight (`SCM_RIGHTS`, held by no process): the
        /// process whose fd numbers its registrations name, the holder of
        /// the socket whose queue carries it. It registers them at restore.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        registrar: Option<i32>,
    },
    /// A regular file deleted while open; its content is in
    /// `Manifest::ghosts`. `path` is where it lived.
    Ghost { path: String, id: u64, pos: u64 },
    /// A memfd (`memfd_create`); its content is in `Manifest::ghosts`.
    Memfd { name: String, id: u64, pos: u64 },
    /// A directory, FIFO or device node deleted while open (see
    /// [`DeletedNode`]).
    DeletedNode(DeletedNode),
    /// A pidfd on the process `pid` of the image; or, with `dead`, on a
    /// process that had exited and been reaped (`pid` -1): `dead` is the
    /// pidfs inode at dump, the same for every pidfd on one such process.
    Pidfd {
        pid: i32,
        #[serde(default)]
        dead: Option<u64>,
    },
    /// A namespace file (`/proc/PID/ns/KIND`), inode `ino` at dump: of the
    /// process's own namespace, or (`of`, manifest version 19) the
    /// dumper's or one bound to a path.
    NsFile {
        kind: String,
        ino: u64,
        #[serde(default, skip_serializing_if = "NsFileOf::is_own")]
        of: NsFileOf,
    },
    /// An inotify instance and its watches (by path, in watch-descriptor order).
    Inotify { watches: Vec<InotifyWatch> },
    /// A fanotify group: its `fanotify_init` flags, the open flags of the
    /// fds its events carry, and its marks.
    Fanotify {
        flags: u32,
        event_flags: u32,
        marks: Vec<FanotifyMark>,
    },
    /// A unix domain socket.
    Unix(UnixSocket),
    /// An IPv4/IPv6 socket (TCP or UDP).
    Inet(InetSocket),
    /// A netlink socket.
    Netlink(NetlinkSocket),
    /// The master end of a pseudo-terminal pair (`/dev/ptmx`), with the
    /// state of the pair (one master description per pair).
    PtyMaster(PtyPair),
    /// A slave end (`/dev/pts/N`) of the pair whose master, in the image,
    /// has this `index`.
    PtySlave { index: u32 },
    /// A slave of pty `index` whose master was closed (by every process:
    /// the terminal is hung up, reads and writes fail): a slave of a new
    /// pair whose master is closed once the restore ends. Every such fd of
    /// one index is a slave of the same new pair.
    PtyHungUp { index: u32 },
    /// `/dev/tty` opened by a session leader whose controlling terminal is
    /// the slave of the pair with this `index`: opened again once that is
    /// its terminal again.
    CurrentTty { index: u32 },
    /// An io_uring instance with no request in flight (`crate` docs of
    /// `stasis_objects::io_uring`).
    IoUring(IoUringRing),
    /// A userfaultfd of the program, with the areas it registers and the
    /// pages it write-protects (`stasis_objects::userfaultfd`). Manifest
    /// version 4.
    Userfaultfd(UffdImage),
    /// An fd on the terminal of a shell job ([`Manifest::shell_job`]):
    /// the controlling terminal of the tree's session, whose master and
    /// session leader are outside the tree. Opened again on the terminal
    /// of `stasis restore --shell-job`: its device (`current`: `/dev/tty`).
    ExternalTty { current: bool },
    /// A POSIX message queue, opened again by `name` (without its leading
    /// `/`) in the restored tree's IPC namespace (where its queues are made
    /// again, [`Namespaces::posix_queues`]), or in the restorer's when the
    /// tree had the dumper's. Manifest version 9.
    Mqueue {
        name: String,
        /// The queue itself, made again at restore (once for every fd on
        /// it) instead of opened as it is then: one of the dumper's IPC
        /// namespace, or one unlinked since it was opened (in the tree's).
        /// Manifest version 12.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<HeldQueue>,
    },
    /// A virtual console (`/dev/ttyN`) or serial line (`/dev/ttySN`),
    /// opened again by `path` (it must still be device `rdev`) and given
    /// its termios and window size (rows, columns, x and y pixels).
    /// Added without a format version change: an older reader refuses
    /// the variant.
    TtyLine {
        path: String,
        rdev: u64,
        termios: PtyTermios,
        winsize: [u16; 4],
        /// The session of the tree whose controlling terminal the line
        /// is, and its foreground group: its leader takes it back.
        /// Manifest version 20.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<PtySession>,
    },
    /// `/dev/tty` of a process whose controlling terminal is virtual
    /// console or serial line `path` (device `rdev`), the terminal of
    /// `session`, a session of the tree: the line is opened again with
    /// its termios and window size (it may be the only fd holding it) and
    /// the leader takes it back as a [`FdKind::TtyLine`] with a session
    /// does; once the process has its terminal, the fd is `/dev/tty` again.
    /// Manifest version 21.
    LineDevTty {
        path: String,
        rdev: u64,
        termios: PtyTermios,
        winsize: [u16; 4],
        session: PtySession,
    },
    /// An fd on `/dev/net/tun` attached to a tun or tap device of the
    /// tree's network namespace (`stasis_objects::tun`). Manifest
    /// version 10. (One attached to none is a [`FdKind::Path`].)
    Tun(TunFile),
}

/// An fd on `/dev/net/tun` attached to a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunFile {
    /// The device's name.
    pub iff: String,
    /// `TUNGETIFF`'s flags: the device's kind and the features this fd
    /// attached with (`IFF_NO_PI`, `IFF_VNET_HDR`, `IFF_MULTI_QUEUE`...),
    /// and `IFF_DETACH_QUEUE` for a detached queue of a multi-queue device.
    pub flags: u32,
    /// The device was persistent at the dump: if not, it is made so again
    /// once this fd is attached (it then lives as long as its fds).
    pub persist: bool,
}

/// A userfaultfd: what `UFFDIO_API` was given, the areas registered with
/// it and the pages write-protected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UffdImage {
    /// The features the program asked for (`UFFDIO_API`); `None`: it never
    /// made the handshake.
    pub features: Option<u64>,
    /// The areas registered: `(start, end, UFFDIO_REGISTER_MODE_* bits)`.
    pub ranges: Vec<(u64, u64, u64)>,
    /// The pages of its write-protect areas that were write-protected at
    /// the dump (`(start, end)`, page-aligned, sorted).
    pub protected: Vec<(u64, u64)>,
}

/// The terminal of a shell job (`dump --shell-job`): the tree runs in a
/// session led from outside it (a shell) whose controlling terminal is not
/// the tree's (a pts whose master a terminal emulator, sshd or tmux holds).
/// Its fds on that terminal are [`FdKind::ExternalTty`]; a restore puts the
/// tree on its own terminal with these settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShellJob {
    /// The terminal's termios at dump (set again on the new terminal).
    pub termios: PtyTermios,
    /// Its window size at dump: rows, columns, x pixels, y pixels (the new
    /// terminal keeps its own; the tree gets a `SIGWINCH` if they differ).
    pub winsize: [u16; 4],
    /// The tree's process group that was the terminal's foreground group,
    /// if one was: made the new terminal's foreground group again.
    pub foreground: Option<i32>,
}

/// An idle io_uring instance: what `io_uring_setup` needs to make it
/// again, the positions only the kernel can move, the areas of the
/// process that map its rings (with their content), and its registered
/// files and buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoUringRing {
    /// Its anonymous inode at dump (the areas of `VmaKind::IoUring` name it).
    pub ino: u64,
    pub sq_entries: u32,
    pub cq_entries: u32,
    /// `IORING_SETUP_*` flags to make it with (`IORING_SETUP_CQSIZE`).
    pub setup_flags: u32,
    /// The kernel's SQ head (entries it has taken) and CQ tail
    /// (completions it has posted): equal, as nothing is in flight.
    pub sq_head: u32,
    pub cq_tail: u32,
    /// The program's SQ tail and CQ head (also in `areas`), for messages.
    pub sq_tail: u32,
    pub cq_head: u32,
    /// Every area of the process mapping the ring, with its bytes.
    pub areas: Vec<IoUringArea>,
    /// Registered files: per slot, the fd of the process that is the
    /// file (`None`: an empty slot).
    pub files: Vec<Option<i32>>,
    /// Registered buffers: per slot, (address, length) (`None`: empty).
    pub buffers: Vec<Option<(u64, u64)>>,
    /// The thread (TID) that is the ring's single issuer
    /// (`IORING_SETUP_SINGLE_ISSUER` in `setup_flags`): it is made, or
    /// enabled, by that thread.
    #[serde(default)]
    pub issuer: Option<i32>,
    /// The CPU its SQ poll thread (`IORING_SETUP_SQPOLL` in
    /// `setup_flags`) is bound to (`IORING_SETUP_SQ_AFF`), if it is.
    #[serde(default)]
    pub sq_thread_cpu: Option<u32>,
    /// The ids of its registered personalities, each holding the
    /// process's credentials: registered again by the process once its
    /// credentials are back.
    #[serde(default)]
    pub personalities: Vec<u16>,
}

/// One area mapping an io_uring instance's rings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoUringArea {
    pub start: u64,
    pub end: u64,
    /// The mmap offset: `IORING_OFF_SQ_RING`, `_CQ_RING` or `_SQES`.
    pub offset: u64,
    pub prot: u32,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A pseudo-terminal pair, saved with its master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyPair {
    /// The pts index at dump: it ties slaves to their master in the image
    /// (a restore gets whatever index the kernel gives).
    pub index: u32,
    /// The pair's termios (the slave's: the master has no settable one).
    pub termios: PtyTermios,
    /// `struct winsize`: rows, columns, x pixels, y pixels.
    pub winsize: [u16; 4],
    /// `TIOCSPTLCK`: the slave cannot be opened.
    pub locked: bool,
    /// `TIOCPKT` on the master.
    pub packet: bool,
    /// `TIOCEXCL` of the master side and of the slave side.
    pub master_exclusive: bool,
    pub slave_exclusive: bool,
    /// No slave was open at dump (the master reads as hung up).
    pub slave_closed: bool,
    /// Canonical mode: the complete lines the slave reads next, each as
    /// one `read` returns it (its terminator included; empty: an
    /// end-of-file), as the line discipline holds them (input processing
    /// and echo already done).
    pub input_lines: Vec<Vec<u8>>,
    /// The rest of what the slave reads next: in canonical mode the line
    /// still being typed, otherwise everything.
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// What the master reads next (the slave's output, processed).
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    /// The session whose controlling terminal the slave is, if one of the
    /// image's.
    pub session: Option<PtySession>,
    /// The slave's `/dev/pts` node: owner and permission bits (`[uid, gid,
    /// mode]`; a program may `fchown`/`fchmod` its slave). `None`: older
    /// images, left as a new pair's (the restorer's, 0620).
    #[serde(default)]
    pub slave_node: Option<(u32, u32, u32)>,
    /// The control status a packet-mode master had not read yet
    /// (`TIOCPKT_*` bits; 0: none), raised again by the same events.
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub pkt_status: u8,
    /// With `TIOCPKT_STOP` pending: output was stopped by `TCOOFF`, not by
    /// the STOP character (`IXON`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_by_ioctl: bool,
    /// The slave's line discipline (`TIOCGETD`): N_TTY (0) or N_NULL (27).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub ldisc: u8,
    /// A pair of a devpts instance of the tree's own mount namespace: where
    /// that instance is mounted there (its `ptmx` makes the pair again, at
    /// the same index). `None`: the dumper's (`/dev/ptmx`, any index).
    /// Manifest version 9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devpts: Option<String>,
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}

/// `struct termios2`, field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyTermios {
    pub iflag: u32,
    pub oflag: u32,
    pub cflag: u32,
    pub lflag: u32,
    pub line: u8,
    /// `c_cc`: the kernel's 19 control characters.
    pub cc: Vec<u8>,
    pub ispeed: u32,
    pub ospeed: u32,
}

/// A session whose controlling terminal is a pty of the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySession {
    /// The session (its leader's pid).
    pub sid: i32,
    /// The foreground process group (`tcgetpgrp`).
    pub foreground: i32,
}

/// One inotify watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyWatch {
    pub wd: i32,
    pub path: String,
    pub mask: u32,
    /// On a deleted file the tree holds open (`path` is its old name): the
    /// id of its `GhostFile`, whose rebuilt file the watch goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ghost: Option<u64>,
}

/// One mark of a fanotify group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FanotifyMark {
    /// What the mark is on: an inode, a mount or a filesystem.
    pub on: FanotifyTarget,
    /// The path it is found at: the file (inodes), the mount point
    /// (mounts) or a mount point of the filesystem.
    pub path: String,
    /// `FAN_MARK_IGNORED_SURV_MODIFY`, `FAN_MARK_EVICTABLE`,
    /// `FAN_MARK_IGNORE`, as the kernel reports them.
    pub mflags: u32,
    pub mask: u64,
    pub ignored_mask: u64,
    /// An inode mark on a deleted file (its inode number at dump), which a
    /// process of the tree holds open: marked again on the rebuilt file
    /// (`path` is the name it had). Manifest version 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ghost: Option<u64>,
}

/// What a fanotify mark is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FanotifyTarget {
    Inode,
    Mount,
    Filesystem,
}

/// One registration of an epoll instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpollTarget {
    pub fd: i32,
    pub events: u32,
    pub data: u64,
    /// When fd `fd` is closed (or another file) since the registration:
    /// an fd of the process on the registered file, put at `fd` for the
    /// time of the registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<i32>,
}

/// One signal's disposition, as `struct kernel_sigaction`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigAction {
    pub signo: u32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// A queued signal: raw `siginfo_t` (128 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigInfo {
    pub signo: u32,
    #[serde(with = "serde_bytes")]
    pub raw: Vec<u8>,
}

/// An interval timer (`ITIMER_REAL`, `ITIMER_VIRTUAL`, `ITIMER_PROF`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ITimer {
    pub which: u32,
    pub interval_us: u64,
    pub value_us: u64,
}

/// One thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadImage {
    pub tid: i32,
    /// General registers, `struct user_regs_struct` (27 u64 on x86-64),
    /// already adjusted so that an interrupted syscall restarts.
    pub regs: Vec<u64>,
    /// Raw `NT_X86_XSTATE` regset (XSAVE area).
    #[serde(with = "serde_bytes")]
    pub xstate: Vec<u8>,
    /// Blocked signal mask.
    pub sigmask: u64,
    /// Thread-private pending signals.
    pub pending: Vec<SigInfo>,
    pub altstack: AltStack,
    pub comm: String,
    /// rseq registration (glibc registers one per thread), if any.
    #[serde(default)]
    pub rseq: Option<RseqConfig>,
    /// seccomp filters, oldest first: raw `sock_filter` programs and their
    /// `SECCOMP_FILTER_FLAG_*` flags.
    #[serde(default)]
    pub seccomp: Vec<(Vec<u8>, u64)>,
    /// In seccomp strict mode (`SECCOMP_MODE_STRICT`: read, write, exit
    /// and sigreturn only); entered again at restore.
    #[serde(default)]
    pub seccomp_strict: bool,
    /// `set_tid_address` value (cleared and futex-woken when the thread exits).
    #[serde(default)]
    pub clear_child_tid: u64,
    /// Robust futex list head and length (`set_robust_list`).
    #[serde(default)]
    pub robust_list: u64,
    #[serde(default)]
    pub robust_list_len: u64,
    /// Scheduling policy and parameters (`sched_getattr`); `None` in
    /// images older than this field (the thread keeps the restorer's).
    #[serde(default)]
    pub sched: Option<SchedImage>,
}

/// A thread's scheduling policy (`SCHED_*`), its flags (reset-on-fork,
/// deadline reclaim and overrun), nice value, real-time priority and
/// deadline parameters (ns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedImage {
    pub policy: u32,
    pub flags: u64,
    pub nice: i32,
    pub priority: u32,
    pub runtime: u64,
    pub deadline: u64,
    pub period: u64,
}

/// An rseq area registration (`PTRACE_GET_RSEQ_CONFIGURATION`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RseqConfig {
    pub ptr: u64,
    pub size: u32,
    pub signature: u32,
}

/// `stack_t` of `sigaltstack`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AltStack {
    pub sp: u64,
    pub flags: i32,
    pub size: u64,
}

/// Reference to a page pack file of this checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRef {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Total file size in bytes.
    pub size: u64,
    /// Number of pages stored.
    pub pages: u64,
    /// Checksum of the pack's index (also stored in the pack trailer).
    pub index_checksum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(data: Vec<u8>, size: u64, extents: Vec<(u64, Vec<u8>)>) -> SysvShm {
        SysvShm {
            key: 1,
            shmid: 2,
            mode: 0o600,
            uid: 0,
            gid: 0,
            data,
            size,
            extents: extents
                .into_iter()
                .map(|(offset, data)| Extent::inline(offset, data))
                .collect(),
        }
    }

    #[test]
    fn content_of_old_and_sparse_images() {
        // Written before sparse content: the whole segment in `data`.
        let old = seg(vec![7; 4096], 0, vec![]);
        let (size, ext) = old.content().unwrap();
        assert_eq!(
            (size, &ext[..]),
            (4096, &[Extent::inline(0, vec![7; 4096])][..])
        );
        // Sparse: holes between extents, an object with no data at all.
        let s = seg(
            vec![],
            3 << 20,
            vec![(0, vec![1; 10]), (1 << 20, vec![2; 4096])],
        );
        let (size, ext) = s.content().unwrap();
        assert_eq!(size, 3 << 20);
        assert_eq!(
            &ext[..],
            &[
                Extent::inline(0, vec![1; 10]),
                Extent::inline(1 << 20, vec![2; 4096])
            ][..]
        );
        let empty = seg(vec![], 1 << 30, vec![]);
        let (size, ext) = empty.content().unwrap();
        assert_eq!((size, ext.len()), (1 << 30, 0));
        // In the content pack: `len` bytes at page-aligned `at`.
        let mut packed = seg(vec![], 1 << 20, vec![]);
        packed.extents = vec![Extent {
            offset: 8192,
            data: vec![],
            len: 5000,
            at: 4096,
        }];
        assert_eq!(packed.content().unwrap().1[0].bytes(), 5000);
    }

    #[test]
    fn extents_out_of_order_overlapping_or_past_the_end_are_refused() {
        for bad in [
            vec![(4096, vec![1; 10]), (0, vec![1; 10])],
            vec![(0, vec![1; 4097]), (4096, vec![1; 10])],
            vec![(8190, vec![1; 10])],
            vec![(u64::MAX - 2, vec![1; 10])],
        ] {
            assert!(seg(vec![], 8192, bad.clone()).content().is_err(), "{bad:?}");
        }
        // Both inline and in the pack; in the pack at an unaligned address
        // or past the size.
        for (data, len, at) in [(vec![1], 10, 0), (vec![], 10, 100), (vec![], 8193, 0)] {
            let mut s = seg(vec![], 8192, vec![]);
            s.extents = vec![Extent {
                offset: 0,
                data,
                len,
                at,
            }];
            assert!(s.content().is_err(), "{:?}", s.extents);
        }
    }
}
