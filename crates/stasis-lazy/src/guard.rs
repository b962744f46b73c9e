//! The guard: a second process that holds a copy of every userfaultfd the
//! filler serves, so that the filler dying (SIGKILL, the OOM killer) can
//! never let the restored tree read zeros.
//!
//! When the last reference to a userfaultfd goes, the kernel unregisters
//! its areas, and a page that never arrived then reads as a fresh zero
//! page. While the guard holds a reference, a fault the dead filler left
//! unanswered just waits; the guard sees the filler's end of their socket
//! close without a `done` frame, kills the tree (the processes it was told
//! of and their descendants), says so, and only then lets go. After a
//! `done` (nothing is owed any more) it exits quietly.
//!
//! It runs in a process group of its own, so one signal to the filler's
//! group does not take both.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Mutex;

use stasis_kernel::uffd::Userfaultfd;

use crate::control::{self, Hand, Msg};
use crate::LazyError;

/// The filler's end of the line to its guard.
#[derive(Debug)]
pub struct Guard {
    sock: Mutex<OwnedFd>,
}

impl Guard {
    /// Starts `exe __lazy-guard` on the other end of a socket pair.
    pub fn spawn(exe: &Path) -> Result<Guard, LazyError> {
        let (mine, theirs) =
            UnixStream::pair().map_err(|e| LazyError::Control(format!("socketpair: {e}")))?;
        std::process::Command::new(exe)
            .arg("__lazy-guard")
            .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| {
                LazyError::Control(format!("starting the guard {}: {e}", exe.display()))
            })?;
        Ok(Guard {
            sock: Mutex::new(OwnedFd::from(mine)),
        })
    }

    /// Gives the guard a copy of `uffd` (of process `pid`, if known).
    pub fn watch(&self, pid: Option<i32>, uffd: &Userfaultfd) -> Result<(), LazyError> {
        let s = self
            .sock
            .lock()
            .map_err(|_| LazyError::Control("poisoned".into()))?;
        let h = Hand {
            image_pid: 0,
            pid: pid.unwrap_or(0),
            areas: Vec::new(),
        };
        control::send(s.as_fd(), &Msg::Hand(h), Some(uffd.fd().as_fd()))
    }

    /// Nothing is owed any more: the guard may let go.
    pub fn done(&self) {
        if let Ok(s) = self.sock.lock() {
            let _ = control::send(s.as_fd(), &Msg::Done(true), None);
        }
    }
}

/// The guard's main loop (`stasis __lazy-guard`, its stdin the socket).
/// Returns the processes it had to kill.
pub fn run(sock: OwnedFd) -> Result<Vec<i32>, LazyError> {
    let mut held: Vec<OwnedFd> = Vec::new();
    let mut pids: Vec<i32> = Vec::new();
    loop {
        match control::recv(sock.as_fd()) {
            Ok(Some((Msg::Hand(h), fd))) => {
                held.extend(fd);
                if h.pid > 0 {
                    pids.push(h.pid);
                }
            }
            Ok(Some((Msg::Done(_), _))) => return Ok(Vec::new()),
            Ok(Some(_)) => {}
            // The filler is gone without saying done: kill the tree while
            // the userfaultfds are still held, then let go.
            Ok(None) | Err(_) => {
                let killed = crate::filler::kill_pids(&pids);
                drop(held);
                return Ok(killed);
            }
        }
    }
}
