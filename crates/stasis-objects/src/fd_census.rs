//! The fds of a frozen tree, listed once per freeze.
//!
//! Several passes of a dump look at every fd of every process while the
//! tree is frozen: the sockets in a transient state (which retry the
//! freeze), the files in flight in unix queues, the TCP connections to
//! lock, the io_uring rings, and the save of each fd. Each used to walk
//! `/proc/PID/fd` on its own (a directory listing, a `readlink` per fd and
//! a `pidfd_getfd` per socket), five walks of the same frozen tables: a
//! tenth of a cluster host's frozen CPU. A frozen process's table cannot
//! change but by the dump itself, and the dump's remote syscalls close
//! what they open: one [`FdCensus`] taken right after the freeze serves
//! them all. Passes that run without one (other freeze paths, tests) walk
//! `/proc` as before.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use stasis_kernel::pidfd;
use stasis_kernel::procfs::net::socket_inode;

use crate::save::{list_fds, read_link};
use crate::SaveError;

/// One fd of a process of the tree.
#[derive(Debug)]
pub struct FdEntry {
    pub fd: i32,
    /// The target of `/proc/PID/fd/N`.
    pub link: String,
    /// A socket's inode and a copy of it (the same open file description).
    pub socket: Option<(u64, OwnedFd)>,
}

/// Every fd of every live process of a frozen tree.
#[derive(Debug, Default)]
pub struct FdCensus {
    procs: Vec<(i32, Vec<FdEntry>)>,
}

impl FdCensus {
    /// Lists the fds of `pids` (frozen).
    pub fn take(pids: &[i32]) -> Result<FdCensus, SaveError> {
        let mut procs = Vec::with_capacity(pids.len());
        for &pid in pids {
            let pfd = pidfd::pidfd_open(pid)?;
            let mut entries = Vec::new();
            for fd in list_fds(pid)? {
                let link = read_link(pid, &format!("fd/{fd}"))?;
                let socket = match socket_inode(&link) {
                    Some(ino) => Some((ino, pidfd::pidfd_getfd(&pfd, fd)?)),
                    None => None,
                };
                entries.push(FdEntry { fd, link, socket });
            }
            procs.push((pid, entries));
        }
        Ok(FdCensus { procs })
    }

    /// The fds of process `pid`, if it was listed.
    pub fn fds_of(&self, pid: i32) -> Option<&[FdEntry]> {
        self.procs
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, e)| e.as_slice())
    }

    /// Every socket: (pid, fd, inode, a copy of it).
    pub fn sockets(&self) -> impl Iterator<Item = (i32, i32, u64, BorrowedFd<'_>)> {
        self.procs.iter().flat_map(|(pid, entries)| {
            entries.iter().filter_map(move |e| {
                e.socket
                    .as_ref()
                    .map(|(ino, s)| (*pid, e.fd, *ino, s.as_fd()))
            })
        })
    }

    /// Whether it lists exactly the processes `pids`.
    pub fn covers(&self, pids: &[i32]) -> bool {
        self.procs.len() == pids.len() && pids.iter().all(|p| self.fds_of(*p).is_some())
    }
}
