//! Rebuild a process tree from a Stasis image, from the outside, at its
//! saved PIDs.
//!
//! # The path of a restore
//! Explicit stages over one state struct (`pipeline::Build`, one record
//! per process): load → verify (in parallel) → build tree (`stub`) → per
//! process memory (`memory`), files and attributes (`process`), threads
//! (`threads`) → jump. In detail:
//! 1. **Load and check** the checkpoint: manifest (verified by
//!    `stasis-image`), the tree's shape ([`tree::plan`]), CPU features (the
//!    image's XCR0 must be a subset of this CPU's), every saved PID and TID
//!    free (waiting out zombies that init reaps late).
//! 2. **Root stub**: `clone3` with `set_tid` creates a child of stasis at the
//!    root's PID; it stops itself under our trace (`PTRACE_O_EXITKILL`: if
//!    stasis dies, so does the half-built tree). Every signal is blocked. It
//!    inherits one end of a datagram socket (the fd transport of [`files`]).
//!    It is moved into the tree's cgroup (v2), made first if missing
//!    (`cgroup`); a tree whose processes were in several has each child
//!    moved into its own as soon as it is forked.
//! 3. **Control page**: a small RWX area at an address free in the stub's
//!    and in every image process's layout holds a `syscall` instruction and
//!    scratch space. Every remote syscall runs there.
//! 4. **Clean slate**: the stub's rseq area is unregistered, everything but
//!    the control page is unmapped, every fd but the transport is closed.
//! 5. **The tree and the memory**, top-down: the root's memory is built on
//!    its clean slate, then each process is forked by its parent (`clone3`
//!    with `set_tid`, auto-attached by `PTRACE_O_TRACEFORK`) once the
//!    parent's memory is built, so that it starts with the parent's pages
//!    shared copy-on-write; session leaders call `setsid()` at once. A
//!    child keeps the private areas it inherited that are the same in both
//!    images, patched where its pages differ (`inherit`), and has the
//!    rest unmapped; then its memory is built: vDSO at its address
//!    (`ARCH_MAP_VDSO_64`), every other area mapped and filled by `preadv`
//!    *inside the process* straight from the page pack (shared anonymous
//!    memory is mapped by later processes through `/proc/PID/map_files` of
//!    the first, so it stays shared). Process groups are set once all
//!    exist ([`tree`]).
//! 6. **Per process**: the lazy filler's areas handed over; mm fields;
//!    cwd, umask, personality; fds handed over from the restorer's
//!    [`files::FdFactory`]; epoll registrations; rlimits; signal handlers;
//!    threads (`clone3` with `set_tid`); per-thread state; credentials;
//!    pending signals; interval timers. Zombies are made to exit with their
//!    saved status. Meanwhile a thread of stasis verifies every pack checksum.
//! 7. **Jump**: if verification passed, each process (children first) gets
//!    its threads' registers back; its last remote syscall unmaps the control
//!    page, and at that syscall-exit stop the main thread's registers are
//!    loaded. Once every process is ready, all are detached in one short
//!    loop (the root last). Any failure before this kills the whole
//!    half-built tree and reaps every task of it (the restorer is a child
//!    subreaper meanwhile) before the error is returned: nothing is left
//!    running, no zombie holds a saved PID. A restorer killed before the
//!    detach loop takes the stopped tree with it (`PTRACE_O_EXITKILL`);
//!    one killed during it, the [`guard`] kills what was let go.

pub mod build;
mod caps;
mod cgroup;
pub mod files;
pub mod guard;
mod inherit;
mod memory;
mod ns;
mod pipeline;
mod proc;
mod process;
mod reap;
pub mod shell_job;
/// The kernel seam restore decides over (moved to `stasis_kernel::remote`).
pub use stasis_kernel::remote;
mod stub;
pub mod sysv;
mod threads;
pub mod tree;

use std::os::fd::OwnedFd;
use std::time::Duration;

use stasis_image::areas::private_anon;
use stasis_image::manifest::Vma;
use stasis_image::ImageError;
use stasis_kernel::KernelError;

pub use pipeline::{load, restore};

#[cfg(test)]
mod testutil;
pub use reap::wait_pid_free;

/// Errors of a restore. After any of them no restored process is left.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Cut(#[from] stasis_image::manifest::CutAbort),
    #[error("PID {pid} is in use by a running process ({by}): stop it first, then restore again")]
    PidTaken { pid: i32, by: String },
    #[error("PID {pid} is still held by a zombie after {waited:?}: its parent has not reaped it; wait or reap it, then restore again")]
    PidZombie { pid: i32, waited: Duration },
    #[error("restoring at PID {pid} is not permitted (run stasis as root)")]
    NoPermission {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("this version of stasis cannot restore the image: {0}")]
    Unsupported(String),
    #[error("{0}")]
    ShellJob(String),
    /// A restore step failed (one definition of those messages, in
    /// `stasis-objects`: incompatible image, missing file, failed step,
    /// ports taken, locks, memory layout, inconsistent image...).
    #[error(transparent)]
    Object(stasis_objects::RestoreError),
    #[error("memory layout could not be rebuilt: handing process {image_pid} to the lazy filler: {source}")]
    LazyHand {
        image_pid: i32,
        #[source]
        source: LazyHandError,
    },
    #[error("this version of stasis cannot restore the image: {0}")]
    Tree(#[from] tree::TreeError),
    #[error("the image is corrupt: {0}; the restore was abandoned and nothing was started")]
    Corrupt(ImageError),
    #[error("the release guard (stasis __restore-guard): {what}; nothing was restored")]
    Guard {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// The step errors restore shares with the kernel objects.
pub use stasis_objects::RestoreError as ObjectError;

impl From<stasis_objects::RestoreError> for RestoreError {
    fn from(e: stasis_objects::RestoreError) -> Self {
        match e {
            stasis_objects::RestoreError::Kernel(k) => RestoreError::Kernel(k),
            e => RestoreError::Object(e),
        }
    }
}

pub(crate) type Result<T, E = RestoreError> = std::result::Result<T, E>;

/// Why a [`LazySink`] could not take a process.
pub type LazyHandError = Box<dyn std::error::Error + Send + Sync>;

/// Receives the userfaultfd of each lazily restored process
/// (`restore --lazy`): from the moment it is handed over, something must
/// serve its faults, since the restore itself goes on touching the process
/// (rseq, signal frames).
pub trait LazySink: Send + Sync {
    /// userfaultfd features to ask for.
    fn features(&self) -> u64;
    /// `uffd` was created in process `pid` (image PID `image_pid`) and
    /// `areas` are registered with it in missing mode, unfilled.
    fn hand(
        &self,
        image_pid: i32,
        pid: i32,
        areas: &[(u64, u64)],
        uffd: &OwnedFd,
    ) -> Result<(), LazyHandError>;
}

/// The eager half of a lazy restore: the ranges of `vmas` filled before the
/// tree runs (every area but those [`left_to_filler`]), sorted and merged.
pub fn eager_ranges<'a>(vmas: impl IntoIterator<Item = &'a Vma>) -> Vec<(u64, u64)> {
    stasis_image::chain::normalize(
        vmas.into_iter()
            .filter(|v| !left_to_filler(v))
            .map(|v| (v.start, v.end))
            .collect(),
    )
}

/// Whether a lazy restore leaves area `v` to the filler: private anonymous
/// memory ([`private_anon`]; a userfaultfd in missing mode cannot serve
/// file mappings, and shared memory is filled once for every process) that
/// is not locked (locking an area populates it, and it must stay resident
/// anyway), nor registered with a userfaultfd of the program (which it
/// gets back: an area has one userfaultfd).
pub fn left_to_filler(v: &Vma) -> bool {
    private_anon(v)
        && v.flags & (stasis_sys::vmflags::LOCKED | stasis_sys::vmflags::USERFAULTFD) == 0
}

/// What to restore and how.
pub struct RestoreOptions {
    /// Checkpoint number; `None` = latest.
    pub checkpoint: Option<u32>,
    /// How long to wait for a zombie holding a PID to be reaped.
    pub pid_wait: Duration,
    /// Called with (bytes restored, bytes to restore).
    pub progress: Option<Box<dyn Fn(u64, u64) + Send>>,
    /// Restore into a new PID namespace (when the saved PIDs are taken here).
    pub new_pidns: bool,
    /// Lazy restore: private anonymous memory is left to this sink's filler.
    pub lazy: Option<Box<dyn LazySink>>,
    /// This restore is one part of a cut across hosts: it waits at the
    /// barrier before anything of the tree reaches the network or runs.
    pub cut: Option<std::sync::Arc<dyn RestoreCut>>,
    /// Established TCP connections come back closed (no `TCP_REPAIR`, no
    /// port or peer needed): for a tree moved where its peers are not.
    pub tcp_close: bool,
    /// A shell job's fds on its terminal are reopened on the restorer's
    /// controlling terminal (`--shell-job`, see [`shell_job`]).
    pub shell_job: bool,
}

/// A restore that is one part of a restore of a whole application over
/// several hosts (`stasis-cluster`).
pub trait RestoreCut: Send + Sync {
    /// Every process of the tree is built and stopped, its TCP connections
    /// rebuilt in repair mode (which drops what reaches them): returns
    /// once every part is, to let them go; an error kills the tree.
    fn built(&self) -> std::result::Result<(), stasis_image::manifest::CutAbort>;
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            checkpoint: None,
            pid_wait: Duration::from_secs(10),
            progress: None,
            new_pidns: false,
            lazy: None,
            cut: None,
            tcp_close: false,
            shell_job: false,
        }
    }
}

/// A restored, running tree (its root is a child of the caller).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub checkpoint: u32,
    /// PID of the root process (as seen from where stasis runs).
    pub pid: i32,
    /// With `--new-pidns` or a PID namespace of the tree's own: the root's
    /// PID inside its namespace (the saved one).
    pub pid_in_namespace: Option<i32>,
    /// With `--new-pidns`, or a tree whose namespace's init was not dumped
    /// (a stand-in init): the namespace's init (a child of the caller; it
    /// exits with the root's status).
    pub init_pid: Option<i32>,
    pub processes: usize,
    pub threads: usize,
    pub pages: u64,
    pub bytes: u64,
    /// Of `bytes`, those left to the lazy filler.
    pub lazy_bytes: u64,
    pub total_us: u64,
    /// Part of `total_us` spent waiting for zombies to release PIDs.
    pub pid_wait_us: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_image::manifest::VmaKind;

    fn vma(start: u64, end: u64, kind: VmaKind, shared: bool) -> Vma {
        crate::testutil::vma(start, end, kind, shared)
    }

    #[test]
    fn lazy_restores_leave_only_private_anonymous_memory_to_the_filler() {
        let ghost = VmaKind::Ghost {
            id: 1,
            offset: 0,
            name: "/memfd:x".into(),
        };
        let mut shm = vma(0x9000, 0xa000, VmaKind::Anon, false);
        shm.shm = Some((7, 0));
        let vmas = [
            vma(0x1000, 0x3000, VmaKind::Anon, false),
            vma(0x3000, 0x4000, VmaKind::Anon, true),
            vma(0x4000, 0x6000, ghost, false),
            vma(0x6000, 0x8000, VmaKind::Anon, false),
            vma(0x8000, 0x9000, VmaKind::Vdso, false),
            shm,
        ];
        let lazy: Vec<bool> = vmas.iter().map(left_to_filler).collect();
        assert_eq!(lazy, [true, false, false, true, false, false]);
        // The eager ranges are the others, merged where they touch.
        assert_eq!(
            eager_ranges(&vmas),
            vec![(0x3000, 0x6000), (0x8000, 0xa000)]
        );
        // A locked private area is filled before the tree runs.
        let mut locked = vma(0xb000, 0xc000, VmaKind::Anon, false);
        locked.flags = stasis_sys::vmflags::LOCKED;
        assert!(!left_to_filler(&locked));
        assert_eq!(eager_ranges([&locked]), vec![(0xb000, 0xc000)]);
        assert!(eager_ranges(&vmas[..1]).is_empty());
    }
}
