//! One module per kernel object: how each is saved and how it is rebuilt,
//! side by side (as CRIU keeps `pipes.c`, `sk-unix.c`, `sk-tcp.c`...).
//!
//! Every kind of open file implements [`Object`]: `save` looks at one fd of
//! a process being dumped ([`OpenFd`], in a [`SaveCtx`]) and, if it is of
//! its kind, says what to keep ([`FdKind`]); `restore` looks at one saved
//! fd ([`FdImage`], in a [`RestoreCtx`]) and, if it is of its kind, makes
//! the open file description again. [`REGISTRY`] lists the kinds: the
//! save side asks them in order, the first that recognises an fd saves it.
//!
//! | object | module |
//! |---|---|
//! | regular file, directory, device | [`file`] |
//! | deleted file, memfd | [`ghost`] |
//! | pipe, FIFO | [`pipe`] |
//! | eventfd | [`eventfd`] |
//! | timerfd | [`timerfd`] |
//! | signalfd | [`signalfd`] |
//! | epoll | [`epoll`] |
//! | inotify | [`inotify`] |
//! | unix socket | [`unix`] |
//! | TCP/UDP socket | [`inet`] (listening, UDP), [`tcp`] (established: `TCP_REPAIR`) |
//! | socket options, the accept gate | [`socket`] |
//! | flock/POSIX/OFD locks | [`locks`] |
//! | System V shared memory | [`sysv`] |
//!
//! Adding a kind: a new module implementing [`Object`], its variant in
//! `stasis_image::manifest::FdKind`, and one line in [`REGISTRY`].

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::os::fd::OwnedFd;

use stasis_image::manifest::{FdImage, FdKind};

pub mod epoll;
pub mod error;
pub mod eventfd;
pub mod file;
pub mod ghost;
pub mod inet;
pub mod inotify;
pub mod locks;
pub mod pipe;
pub mod restore;
pub mod save;
pub mod signalfd;
pub mod socket;
pub mod sysv;
pub mod tcp;
pub mod timerfd;
pub mod unix;

pub use error::{RestoreError, SaveError};
pub use restore::{plant, FdRef, RestoreCtx, Scratch};
pub use save::{OpenFd, ProcSource, SaveCtx};

/// A kind of kernel object reachable through an fd.
pub trait Object {
    /// What it is, for diagnostics and the docs.
    const NAME: &'static str;

    /// Saves `fd` if it is of this kind (`None`: not this kind).
    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError>;

    /// Makes the description of `img` again if it is of this kind
    /// (`None`: not this kind).
    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<Option<OwnedFd>, RestoreError>;
}

/// Saves an fd if it is of the entry's kind.
pub type SaveFn = fn(&mut SaveCtx, &OpenFd<'_>) -> Result<Option<FdKind>, SaveError>;
/// Restores a saved fd if it is of the entry's kind.
pub type RestoreFn = fn(&mut RestoreCtx<'_>, &FdImage) -> Result<Option<OwnedFd>, RestoreError>;

/// One registered kind.
pub struct Entry {
    pub name: &'static str,
    pub save: SaveFn,
    pub restore: RestoreFn,
}

/// The registry entry of kind `O`.
pub const fn entry<O: Object>() -> Entry {
    Entry {
        name: O::NAME,
        save: O::save,
        restore: O::restore,
    }
}

/// Every kind, in the order the save side tries them (sockets and
/// anonymous inodes first, deleted files before FIFOs, plain files last:
/// [`file::File`] takes whatever is left).
pub const REGISTRY: &[Entry] = &[
    entry::<unix::Unix>(),
    entry::<inet::Inet>(),
    entry::<pipe::Pipe>(),
    entry::<eventfd::Eventfd>(),
    entry::<timerfd::Timerfd>(),
    entry::<signalfd::Signalfd>(),
    entry::<inotify::Inotify>(),
    entry::<epoll::Epoll>(),
    entry::<ghost::Ghost>(),
    entry::<pipe::Fifo>(),
    entry::<file::File>(),
];
