//! The release guard: a process of its own that kills a restored tree
//! whose restorer died while letting it go.
//!
//! Until the jump stage every process of the tree is a stopped tracee of
//! the restorer, with `PTRACE_O_EXITKILL`: a killed restorer takes them all
//! with it. The jump lets them go one after another (children first, the
//! root last), so a restorer killed in the middle of that loop left the
//! processes already let go running without the others: a half-restored
//! tree. Before the first is let go, the guard is handed a pidfd of every
//! process of the tree (and of its PID namespace's init, if stasis made
//! one); if its line to the restorer closes before `commit`, it kills each
//! (through the pidfd: never a process that took a freed PID since) and
//! says so. After `commit` (every process let go) or `abort` (the restorer
//! killed the tree itself) it exits quietly.
//!
//! It is started near the beginning of a restore (an exec of stasis, a
//! few milliseconds of CPU while the image loads), in a process group of
//! its own so that one signal to the restorer's group does not take both.
//!
//! The line is a `SOCK_SEQPACKET` pair, the guard's end its stdin. Packets
//! from the restorer: `P` and the process's PID (4 bytes, native order)
//! with its pidfd attached; `C` (commit); `A` (abort). Nothing goes back.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use stasis_kernel::{pidfd, scm};

use crate::build::step;
use crate::{RestoreError, Result};

/// The restorer's end of the line to its guard. Dropped without
/// [`Guard::commit`] or [`Guard::abort`] (an error return, a panic), it
/// closes the line as a dying restorer would: the guard kills what it was
/// handed.
pub(crate) struct Guard {
    /// Taken by `Drop`, to be reaped aside.
    child: Option<Child>,
    sock: OwnedFd,
}

impl Guard {
    /// Starts `stasis __restore-guard`. A guard that took one of the
    /// saved PIDs (`taken`) is let go and another started.
    pub(crate) fn start(taken: impl Fn(i32) -> bool) -> Result<Guard> {
        let mut tries = 0;
        loop {
            let (mine, theirs) = scm::seqpacket_pair().map_err(step("the release guard's line"))?;
            let child = Command::new(stasis_kernel::launch::own_exe())
                .arg("__restore-guard")
                .stdin(Stdio::from(theirs))
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
                .map_err(|source| RestoreError::Guard {
                    what: "starting it".into(),
                    source,
                })?;
            tries += 1;
            let pid = i32::try_from(child.id()).unwrap_or(0);
            let g = Guard {
                child: Some(child),
                sock: mine,
            };
            if !taken(pid) || tries == 3 {
                return Ok(g);
            }
            g.abort();
        }
    }

    /// Hands over process `pid` (as the restorer sees it), still a stopped
    /// tracee: from now on it dies if the restorer dies before `commit`.
    pub(crate) fn watch(&self, pid: i32) -> Result<()> {
        let fd = pidfd::pidfd_open(pid).map_err(step(format!("pidfd of process {pid}")))?;
        let mut msg = [0u8; 5];
        msg[0] = b'P';
        msg[1..].copy_from_slice(&pid.to_ne_bytes());
        scm::send_with_fd(self.sock.as_fd(), &msg, fd.as_fd()).map_err(step(format!(
            "handing process {pid} to the release guard (did it die?)"
        )))
    }

    /// Every process is let go: the guard exits without killing any.
    pub(crate) fn commit(self) {
        self.finish(b'C');
    }

    /// The restorer killed the tree itself: the guard exits quietly.
    pub(crate) fn abort(self) {
        self.finish(b'A');
    }

    fn finish(self, what: u8) {
        let _ = nix::sys::socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&self.sock),
            &[what],
            nix::sys::socket::MsgFlags::empty(),
        );
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The line closes as `self` goes, right after this; the guard
        // then exits (or first kills what it holds). Reaped aside: a
        // restorer that runs on (an agent) keeps no zombie, and a restore
        // does not wait for the guard to be scheduled.
        if let Some(mut c) = self.child.take() {
            std::thread::spawn(move || {
                let _ = c.wait();
            });
        }
    }
}

/// What the guard did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `commit` or `abort` came, or nothing had been handed over.
    Quiet,
    /// The line closed first: these processes were killed.
    Killed(Vec<i32>),
}

/// The guard's main loop (`stasis __restore-guard`, its stdin the line).
pub fn run(sock: OwnedFd) -> Result<Outcome> {
    let mut held: Vec<(i32, OwnedFd)> = Vec::new();
    loop {
        let mut buf = [0u8; 16];
        let (n, fd) = scm::recv_with_fd(sock.as_fd(), &mut buf)
            .map_err(step("reading the line to the restorer"))?;
        match (&buf[..n], fd) {
            ([], _) => break,
            ([b'C'] | [b'A'], _) => return Ok(Outcome::Quiet),
            ([b'P', pid @ ..], Some(fd)) if pid.len() == 4 => {
                let pid = i32::from_ne_bytes([pid[0], pid[1], pid[2], pid[3]]);
                held.push((pid, fd));
            }
            _ => {}
        }
    }
    if held.is_empty() {
        return Ok(Outcome::Quiet);
    }
    let mut killed = Vec::new();
    for (pid, fd) in &held {
        if pidfd::pidfd_send_signal(fd, *pid, libc::SIGKILL).is_ok() {
            killed.push(*pid);
        }
    }
    Ok(Outcome::Killed(killed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The restorer's side of the line, on a thread (`guard::run` reads
    /// the other end here), and a child to guard.
    fn line(last: Option<u8>) -> (Outcome, Child) {
        let (mine, theirs) = scm::seqpacket_pair().unwrap();
        let mut child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let fd = pidfd::pidfd_open(pid).unwrap();
        let mut msg = [b'P', 0, 0, 0, 0];
        msg[1..].copy_from_slice(&pid.to_ne_bytes());
        scm::send_with_fd(mine.as_fd(), &msg, fd.as_fd()).unwrap();
        if let Some(b) = last {
            nix::sys::socket::send(
                std::os::fd::AsRawFd::as_raw_fd(&mine),
                &[b],
                nix::sys::socket::MsgFlags::empty(),
            )
            .unwrap();
        }
        drop(mine);
        let out = run(theirs).unwrap();
        if out == Outcome::Quiet {
            assert_eq!(child.try_wait().unwrap(), None, "a guarded child let go");
            child.kill().unwrap();
        }
        (out, child)
    }

    #[test]
    fn a_line_closed_before_commit_kills_what_was_handed_over() {
        let (out, mut child) = line(None);
        assert_eq!(
            out,
            Outcome::Killed(vec![i32::try_from(child.id()).unwrap()])
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn commit_or_abort_lets_everything_be() {
        for b in [b'C', b'A'] {
            let (out, mut child) = line(Some(b));
            assert_eq!(out, Outcome::Quiet);
            child.wait().unwrap();
        }
    }

    #[test]
    fn nothing_handed_over_nothing_killed() {
        let (mine, theirs) = scm::seqpacket_pair().unwrap();
        drop(mine);
        assert_eq!(run(theirs).unwrap(), Outcome::Quiet);
    }
}
