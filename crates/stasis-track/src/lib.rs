//! Dirty-page tracking for incremental checkpoints.
//!
//! After a checkpoint, a tracker is *armed* on every process of the tree;
//! at the next checkpoint it tells which pages changed since, so that only
//! those are saved. Three backends sit behind one trait, [`DirtyTracker`]:
//!
//! * [`uffd::UffdTracker`]: a `userfaultfd` with `WP_ASYNC` and
//!   `WP_UNPOPULATED`, created *inside* the target by a remote syscall and
//!   taken out with `pidfd_getfd`. Private anonymous areas are registered for
//!   write-protect; the first write to a protected page costs the process a
//!   minor fault that the kernel resolves by itself (no handler thread). At
//!   the checkpoint, `PAGEMAP_SCAN` returns the written ranges
//!   (`PAGE_IS_WRITTEN`), and after the commit a second scan with
//!   `PM_SCAN_WP_MATCHING` protects them again.
//! * [`softdirty::SoftDirtyTracker`]: `clear_refs` + bit 55 of
//!   `/proc/PID/pagemap`, where the kernel has `CONFIG_MEM_SOFT_DIRTY`.
//! * [`hash::HashTracker`]: a 64-bit hash of every page, compared with the
//!   previous checkpoint's. Nothing runs in the process between
//!   checkpoints; the dumper reads every page at each checkpoint.
//!
//! # Rules that keep an incremental checkpoint exact
//! * A page counts as dirty unless the tracker can prove it was not
//!   written since the parent checkpoint was frozen. Areas a tracker does
//!   not cover ([`Dirty::All`]) are saved whole: shared memory, private
//!   file mappings (uffd-wp cannot register them), areas created, moved
//!   (`mremap` drops the registration) or re-created since the last arm,
//!   every area after an `exec`, every area of a process forked since.
//! * Tracking is re-armed only after the checkpoint is committed, while the
//!   tree is still frozen. A dump that fails leaves the old protection in
//!   place, so the next one still sees everything written since the last
//!   committed checkpoint (a superset is safe; a subset never happens).
//! * The kernel is the source of truth for whether an area is tracked:
//!   `PAGEMAP_SCAN` with `PM_SCAN_CHECK_WPASYNC` fails with `EPERM` on an
//!   area not registered for write-protect-async. If the holder of the
//!   userfaultfd dies, the kernel unregisters the areas and they count as
//!   untracked.
//! * Granularity: base pages. With uffd the kernel splits a protected
//!   transparent huge page at its first write (`WP_ASYNC` resolves write
//!   faults per 4 KiB page); an intact huge page is reported whole.

pub mod hash;
pub mod keeper;
pub mod softdirty;
pub mod state;
pub mod touch;
pub mod uffd;

use serde::{Deserialize, Serialize};
use stasis_kernel::KernelError;

pub use stasis_image::ranges::{merge as merge_ranges, Ranges};

/// Errors of dirty tracking.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error("dirty tracking with {backend} is not available here: {why}; use --track auto to pick one that is")]
    Unsupported { backend: &'static str, why: String },
    #[error("unknown tracking backend {0:?}: use auto, uffd, soft-dirty or hash")]
    UnknownBackend(String),
    #[error("dirty tracking of process {pid} failed while {what}")]
    Process {
        pid: i32,
        what: String,
        #[source]
        source: KernelError,
    },
    #[error("tracking state {path} is unusable: {what}; delete it to start a new chain")]
    State { path: String, what: String },
    #[error("{what} {path} failed")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the tracking keeper failed: {0}")]
    Keeper(String),
    #[error(transparent)]
    Image(#[from] stasis_image::ImageError),
    #[error("every process of checkpoint {checkpoint} exited during the touch window")]
    AllExited { checkpoint: u32 },
}

pub type Result<T, E = TrackError> = std::result::Result<T, E>;

/// A tracking backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Uffd,
    SoftDirty,
    Hash,
}

impl Backend {
    /// The name used on the command line and in images.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uffd => "uffd",
            Backend::SoftDirty => "soft-dirty",
            Backend::Hash => "hash",
        }
    }

    /// Parses a backend name; `auto` gives `None`.
    pub fn parse(s: &str) -> Result<Option<Backend>> {
        Ok(Some(match s {
            "auto" => return Ok(None),
            "uffd" => Backend::Uffd,
            "soft-dirty" | "softdirty" => Backend::SoftDirty,
            "hash" => Backend::Hash,
            other => return Err(TrackError::UnknownBackend(other.into())),
        }))
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Picks a backend: the one asked for if it works here, or for `None`
/// (auto) the first that works of uffd, soft-dirty, hash.
pub fn choose(want: Option<Backend>) -> Result<Backend> {
    let check = |b: Backend| -> Result<()> {
        match b {
            Backend::Uffd => uffd::probe(),
            Backend::SoftDirty => softdirty::probe(),
            Backend::Hash => Ok(()),
        }
    };
    match want {
        Some(b) => check(b).map(|()| b),
        None => {
            for b in [Backend::Uffd, Backend::SoftDirty] {
                match check(b) {
                    Ok(()) => return Ok(b),
                    Err(e) => tracing::info!("tracking backend {b} unavailable: {e}"),
                }
            }
            Ok(Backend::Hash)
        }
    }
}

/// [`choose`] for dumps of the tree of `pid`: the userfaultfd backend
/// creates its descriptor inside each process, which the kernel refuses
/// in a user namespace other than the initial one (it wants
/// `CAP_SYS_PTRACE` there) unless `vm.unprivileged_userfaultfd` is 1. For
/// such a tree `auto` goes on to the next backend, and `uffd` is refused
/// with the reason.
pub fn choose_for(want: Option<Backend>, pid: i32) -> Result<Backend> {
    let uffd_here = uffd::allowed_in(pid);
    match (want, uffd_here) {
        (Some(Backend::Uffd), Err(why)) => Err(TrackError::Unsupported {
            backend: "uffd",
            why,
        }),
        (None, Err(why)) => {
            tracing::info!("tracking backend uffd unavailable for process {pid}: {why}");
            match softdirty::probe() {
                Ok(()) => Ok(Backend::SoftDirty),
                Err(e) => {
                    tracing::info!("tracking backend soft-dirty unavailable: {e}");
                    Ok(Backend::Hash)
                }
            }
        }
        _ => choose(want),
    }
}

/// A memory area of a process, as the dumper sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    pub start: u64,
    pub end: u64,
    /// Private anonymous memory (heap, stack, anonymous mmap): the only
    /// kind the userfaultfd backend can track.
    pub private_anon: bool,
}

/// What changed in an area since the tracker was armed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dirty {
    /// Not tracked: every page with data counts as changed.
    All,
    /// These ranges may have changed; nothing else did.
    Ranges(Ranges),
    /// Decided page by page from content ([`DirtyTracker::page_changed`]).
    ByContent,
}

/// Runs syscalls inside a frozen process: THE seam of Stasis,
/// [`stasis_kernel::remote::Remote`] (trackers use [`Remote::sys`] only).
pub use stasis_kernel::remote::Remote;

/// What arming did for one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArmReport {
    /// Areas newly registered (uffd).
    pub registered: usize,
    /// Areas that could not be tracked (saved whole next time).
    pub untracked: usize,
}

/// One dirty-tracking backend.
pub trait DirtyTracker {
    fn backend(&self) -> Backend;

    /// What of `area` of process `pid` (frozen) changed since the tracker
    /// was last armed on it.
    fn dirty(&mut self, pid: i32, area: &Area) -> Result<Dirty>;

    /// For [`Dirty::ByContent`]: whether the page at `addr` changed. Called
    /// for every saved page of the process, in address order.
    fn page_changed(&mut self, _pid: i32, _addr: u64, _page: &[u8]) -> bool {
        true
    }

    /// Arms (or re-arms) tracking on process `pid` right after a committed
    /// checkpoint, while it is still frozen. `areas` are all its areas.
    fn arm(&mut self, pid: i32, areas: &[Area], remote: &mut dyn Remote) -> Result<ArmReport>;

    /// Called once every process is armed (persist state).
    fn finish_arm(&mut self) -> Result<()> {
        Ok(())
    }

    /// Descriptors that keep tracking armed while they are held (pid,
    /// fd), handed to the caller: whoever holds them keeps the tracking.
    fn take_held(&mut self) -> Vec<(i32, std::os::fd::OwnedFd)> {
        Vec::new()
    }
}

/// Builds the tracker for `backend`. `state_dir` is where trackers that
/// keep state between dumps (hashes) keep it.
pub fn tracker(backend: Backend, state_dir: &std::path::Path) -> Box<dyn DirtyTracker + Send> {
    match backend {
        Backend::Uffd => Box::new(uffd::UffdTracker::new()),
        Backend::SoftDirty => Box::new(softdirty::SoftDirtyTracker::new(softdirty::ProcOps)),
        Backend::Hash => Box::new(hash::HashTracker::new(state_dir)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip() {
        for b in [Backend::Uffd, Backend::SoftDirty, Backend::Hash] {
            assert_eq!(Backend::parse(b.name()).unwrap(), Some(b));
        }
        assert_eq!(Backend::parse("auto").unwrap(), None);
        assert!(Backend::parse("dirty").is_err());
    }

    #[test]
    fn hash_is_always_available() {
        assert_eq!(choose(Some(Backend::Hash)).unwrap(), Backend::Hash);
    }
}
