//! Lazy restore (`stasis restore --lazy`): the restored tree runs before its
//! private memory has arrived.
//!
//! The restorer maps every private anonymous area that holds image data
//! without filling it, registers it with a userfaultfd (missing mode, with
//! the fork, remap, remove and unmap events) created inside the process,
//! and hands that userfaultfd to the *filler* ([`control`]), a process of
//! its own that outlives `restore --detach`. The filler ([`filler`]) maps
//! each faulting page's run at once and streams everything else in behind
//! (touch-set order, then address order), reading runs from local packs or
//! a page server ([`source`]) and checking each against its checksum. The
//! bookkeeping of what each address space is still owed is [`state`]. A
//! [`guard`] process holds a copy of every userfaultfd, so that the filler
//! dying kills the tree instead of letting it read zeros.
//!
//! Other areas (file-backed, shared, System V) are filled before the tree
//! runs, as in a full restore: a userfaultfd in missing mode cannot serve
//! private file mappings, and shared memory is small and shared.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

pub mod control;
mod deliver;
pub mod eager;
pub mod filler;
pub mod guard;
mod kill;
pub mod source;
pub mod state;

pub use control::{Filler, FillerArgs, FillerSink, Hand};
pub use eager::fill_eager;
pub use filler::{serve, Config, Stats};
pub use source::{open_source, Catalog, LocalPacks, PageServerRuns, ReadError, RunSource};

/// userfaultfd features a lazy restore asks for: every layout change of the
/// process is reported before a copy can race with it.
pub const FEATURES: u64 = stasis_sys::UFFD_FEATURE_EVENT_FORK
    | stasis_sys::UFFD_FEATURE_EVENT_REMAP
    | stasis_sys::UFFD_FEATURE_EVENT_REMOVE
    | stasis_sys::UFFD_FEATURE_EVENT_UNMAP;

/// Errors of a lazy restore.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error("lazy restore: the image could not be read: {0}")]
    Image(String),
    #[error("lazy restore: the page filler's control channel failed: {0}")]
    Control(String),
    #[error("lazy restore: the page filler failed: {0}")]
    Filler(String),
    #[error(transparent)]
    PageServer(#[from] stasis_pageserver::PageServerError),
    #[error("fetching the eagerly restored pages of process {pid}")]
    EagerFetch {
        pid: i32,
        #[source]
        source: stasis_pageserver::PageServerError,
    },
    #[error(
        "lazy restore: pages could not be fetched from {from}: {why}; the restored tree ({} processes: {killed:?}) was killed, since running on would have meant reading zeros instead of its memory",
        killed.len()
    )]
    Fetch {
        from: String,
        why: String,
        killed: Vec<i32>,
    },
}

impl From<stasis_image::ImageError> for LazyError {
    fn from(e: stasis_image::ImageError) -> Self {
        LazyError::Image(e.to_string())
    }
}
