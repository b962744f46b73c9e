//! Killing the restored tree when it must not run on: a page could not be
//! delivered, or the restorer ended before the tree was complete.

use std::os::fd::OwnedFd;

use crate::filler::{Shared, State};

/// Kills every handed-over process and its descendants.
pub(crate) fn kill_tree(st: &State) -> Vec<i32> {
    let roots: Vec<i32> = st.entries.iter().filter_map(|e| e.pid).collect();
    kill_pids(&roots)
}

/// Kills the handed-over processes that still live, and their
/// descendants (the restorer ended without saying the tree runs).
pub(crate) fn kill_unfinished(sh: &Shared) -> Vec<i32> {
    use stasis_kernel::pidfd::pidfd_send_signal;
    let st = sh.lock();
    let live: Vec<(i32, &OwnedFd)> = st
        .entries
        .iter()
        .filter_map(|e| Some((e.pid?, e.pidfd.as_ref()?)))
        .filter(|(pid, fd)| pidfd_send_signal(fd, *pid, 0).is_ok())
        .collect();
    let roots: Vec<i32> = live.iter().map(|(p, _)| *p).collect();
    let killed = kill_pids(&roots);
    for (pid, fd) in live {
        let _ = pidfd_send_signal(fd, pid, libc::SIGKILL);
    }
    killed
}

/// SIGKILLs `roots` and all their descendants; returns who was signalled.
pub(crate) fn kill_pids(roots: &[i32]) -> Vec<i32> {
    let all = stasis_kernel::procfs::tree_pids(roots);
    for &pid in &all {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    all
}
