//! A shell job put on the restorer's terminal (`restore --shell-job`; the
//! save side is `stasis_objects::shell_job`).
//!
//! The restorer must have a controlling terminal (it is run from an
//! interactive shell): the tree, whose session was led from outside it,
//! is forked into the restorer's session, so that terminal is its
//! controlling terminal again. Its fds on the old terminal are opened on
//! this one (by the device of the restorer's fd 0, 1 or 2 that is it, or
//! `/dev/pts/N`), the saved termios is set on it before the tree runs,
//! and the tree's group, if it was the foreground group, is made so again
//! (`tcsetpgrp`, the restorer's `SIGTTOU` blocked meanwhile). If the
//! window size differs from the saved one, the tree gets a `SIGWINCH`
//! once it runs, as after a resize.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;
use stasis_image::manifest::{Manifest, ShellJob};
use stasis_kernel::tty;

use crate::{RestoreError, RestoreOptions, Result};

/// The restorer's terminal, for a shell job.
pub struct Terminal {
    /// Its device path (what the job's fds on it are opened as).
    pub path: PathBuf,
    fd: OwnedFd,
}

/// The restorer's terminal if the image is a shell job and the restore
/// was asked to take it (`--shell-job`); refused if only one of them is
/// so, or if the restorer has no terminal.
pub fn open(m: &Manifest, opts: &RestoreOptions) -> Result<Option<Terminal>> {
    match (&m.shell_job, opts.shell_job) {
        (None, _) => Ok(None),
        (Some(_), false) => Err(RestoreError::ShellJob(format!(
            "checkpoint {} is of a shell job (dumped with --shell-job): its fds were on a terminal held outside it; restore it with --shell-job, from a shell on the terminal to put it on",
            m.checkpoint
        ))),
        (Some(_), true) => find().map(Some),
    }
}

/// The controlling terminal of this process, opened read-write.
fn find() -> Result<Terminal> {
    let none = |why: &str| {
        RestoreError::ShellJob(format!(
            "restore --shell-job puts the job on the terminal of stasis itself, and {why}: run it from an interactive shell"
        ))
    };
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|_| none("/proc/self/stat cannot be read"))?;
    let tty_nr = stasis_objects::pty_census::ctty_fields(&stat)
        .map(|(_, t, _)| t)
        .unwrap_or(0);
    if tty_nr == 0 {
        return Err(none("it has no controlling terminal"));
    }
    let rdev = stasis_objects::pty_census::decode_dev(tty_nr);
    // The device path: the one of a standard fd on it, else the pts node.
    let path = (0..3)
        .filter_map(|n| {
            let p = std::fs::read_link(format!("/proc/self/fd/{n}")).ok()?;
            let meta = std::fs::metadata(&p).ok()?;
            (meta.file_type().is_char_device() && meta.rdev() == rdev).then_some(p)
        })
        .next()
        .or_else(|| match stasis_objects::pty::end_of(rdev) {
            Some(stasis_objects::pty::End::Slave(i)) => {
                Some(PathBuf::from(format!("/dev/pts/{i}")))
            }
            _ => None,
        })
        .ok_or_else(|| none("none of its fds 0-2 is its controlling terminal"))?;
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| none(&format!("{} cannot be opened ({e})", path.display())))?
        .into();
    Ok(Terminal { path, fd })
}

impl Terminal {
    /// Before the tree runs: the saved termios, and the foreground group.
    pub fn attach(&self, job: &ShellJob) -> Result<()> {
        let t = stasis_objects::pty::termios2(&job.termios);
        tty::set_termios(self.fd.as_fd(), &t).map_err(|e| {
            RestoreError::ShellJob(format!(
                "setting the job's terminal settings on {}: {e}",
                self.path.display()
            ))
        })?;
        if let Some(pgid) = job.foreground {
            // A process outside the foreground group that sets it gets
            // SIGTTOU (stopped) unless it blocks it.
            let mut ttou = SigSet::empty();
            ttou.add(Signal::SIGTTOU);
            let mut old = SigSet::empty();
            let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old));
            let r = nix::unistd::tcsetpgrp(&self.fd, Pid::from_raw(pgid));
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            r.map_err(|e| {
                RestoreError::ShellJob(format!(
                    "making process group {pgid} the foreground group of {}: {e}",
                    self.path.display()
                ))
            })?;
        }
        Ok(())
    }

    /// Once the tree runs: a `SIGWINCH` to its group (or its root) if the
    /// terminal's size is not the saved one.
    pub fn after_release(&self, job: &ShellJob, root: i32) {
        let Ok(ws) = tty::winsize(self.fd.as_fd()) else {
            return;
        };
        let now = [ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel];
        if now == job.winsize {
            return;
        }
        let to = job.foreground.map_or(root, |g| -g);
        let _ = nix::sys::signal::kill(Pid::from_raw(to), Signal::SIGWINCH);
    }
}
