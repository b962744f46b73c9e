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
}

/// Manifest format version written when [`Manifest::namespaces`] is set, so
/// that a reader that predates it refuses the manifest instead of restoring
/// the tree in its own namespaces (with the in-namespace PIDs).
pub const NAMESPACES_MANIFEST_VERSION: u32 = 3;

/// The namespaces of a dumped tree that differ from the dumper's (every
/// process of the tree shares the root's). A kind absent here was the
/// dumper's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    /// A PID namespace whose init is the root: the root is PID 1 again.
    #[serde(default)]
    pub pid: bool,
    /// A UTS namespace: its host and domain names.
    #[serde(default)]
    pub uts: Option<UtsNamespace>,
    /// An IPC namespace (its System V segments are in `sysv_shm`).
    #[serde(default)]
    pub ipc: bool,
    /// A network namespace (its loopback only).
    #[serde(default)]
    pub net: Option<NetNamespace>,
    /// A mount namespace: the mounts it has that the dumper's has not.
    #[serde(default)]
    pub mnt: Option<MountNamespace>,
    /// The tree's cgroup (v2: the path after `0::` in `/proc/PID/cgroup`),
    /// where the restored tree is put (the directory is made if missing).
    #[serde(default)]
    pub cgroup: Option<String>,
}

/// What a UTS namespace holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtsNamespace {
    pub hostname: String,
    pub domainname: String,
}

/// What a network namespace holds: only a loopback interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetNamespace {
    /// Whether `lo` was up.
    pub lo_up: bool,
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
    /// Its directory, files and symbolic links, each after its directory;
    /// the first, with an empty path, is the mount's root.
    pub entries: Vec<TmpfsEntry>,
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
    /// A regular file's content, or a symbolic link's target.
    #[serde(default, with = "serde_bytes")]
    pub data: Vec<u8>,
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
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
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

/// The content of a sparse object: its size and its data extents
/// `(offset, bytes)`, in order.
pub type Content<'a> = (u64, Vec<(u64, &'a [u8])>);

/// The content of a sparse object from the sparse fields, or from `data`
/// in an image written before them.
fn content<'a>(data: &'a [u8], size: u64, extents: &'a [Extent]) -> Content<'a> {
    if size == 0 && extents.is_empty() {
        let all = if data.is_empty() {
            Vec::new()
        } else {
            vec![(0, data)]
        };
        (data.len() as u64, all)
    } else {
        (
            size,
            extents
                .iter()
                .map(|e| (e.offset, e.data.as_slice()))
                .collect(),
        )
    }
}

/// The content of a sparse object does not hold together: an extent out
/// of order, overlapping another, or past the object's size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: extent {offset}+{len} out of order or past the size {size}")]
pub struct ContentError {
    /// The object ("System V segment N", "deleted file or memfd N").
    pub object: String,
    pub offset: u64,
    pub len: usize,
    pub size: u64,
}

/// Checks that extents lie inside `size`, in order, without overlap.
fn check_extents(
    size: u64,
    extents: &[(u64, &[u8])],
    object: impl FnOnce() -> String,
) -> Result<(), ContentError> {
    let mut end = 0u64;
    for &(off, d) in extents {
        match off
            .checked_add(d.len() as u64)
            .filter(|&e| off >= end && e <= size)
        {
            Some(e) => end = e,
            None => {
                return Err(ContentError {
                    object: object(),
                    offset: off,
                    len: d.len(),
                    size,
                })
            }
        }
    }
    Ok(())
}

impl SysvShm {
    /// Size of the segment and its data extents `(offset, bytes)`, in
    /// order (checked: inside the size, no overlap).
    pub fn content(&self) -> Result<Content<'_>, ContentError> {
        let (size, ext) = content(&self.data, self.size, &self.extents);
        check_extents(size, &ext, || format!("System V segment {}", self.shmid))?;
        Ok((size, ext))
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
    /// Incremental checkpoints only: every page range (`[start, end)`,
    /// page-aligned, sorted, disjoint) of this process that holds saved
    /// data. Pages of these ranges that are not in this checkpoint's pack
    /// are in the pack of the same process in the nearest ancestor
    /// checkpoint that has them. `None`: exactly the pages of `pack`.
    #[serde(default)]
    pub data_ranges: Option<Vec<(u64, u64)>>,
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
    /// A System V shared memory segment attached whole (`shmat`); the
    /// segment is in `Manifest::sysv_shm`.
    SysvShm { shmid: i32 },
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
        /// Size at dump (regular files), for a sanity check at restore.
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
    /// A namespace file (`/proc/PID/ns/KIND`) of the process's own
    /// namespace, inode `ino` at dump.
    NsFile { kind: String, ino: u64 },
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
                .map(|(offset, data)| Extent { offset, data })
                .collect(),
        }
    }

    #[test]
    fn content_of_old_and_sparse_images() {
        // Written before sparse content: the whole segment in `data`.
        let old = seg(vec![7; 4096], 0, vec![]);
        assert_eq!(old.content().unwrap(), (4096, vec![(0, &[7u8; 4096][..])]));
        // Sparse: holes between extents, an object with no data at all.
        let s = seg(
            vec![],
            3 << 20,
            vec![(0, vec![1; 10]), (1 << 20, vec![2; 4096])],
        );
        let (size, ext) = s.content().unwrap();
        assert_eq!(size, 3 << 20);
        assert_eq!(ext, vec![(0, &[1u8; 10][..]), (1 << 20, &[2u8; 4096][..])]);
        assert_eq!(
            seg(vec![], 1 << 30, vec![]).content().unwrap(),
            (1 << 30, vec![])
        );
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
    }
}
