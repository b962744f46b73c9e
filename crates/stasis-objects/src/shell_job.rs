//! The terminal of a shell job (`dump --shell-job`, `restore --shell-job`,
//! CRIU's option of the same name).
//!
//! A program started from an interactive shell runs in the shell's session,
//! in a process group of its own, with fds 0-2 (and maybe `/dev/tty`) on the
//! shell's terminal: a pts whose master a terminal emulator, sshd or tmux
//! holds, outside the tree. That terminal is not the tree's to save (its
//! settings and queues belong to the program holding the master) and its
//! number may name another terminal by the restore. With `--shell-job` the
//! dump saves such fds as [`FdKind::ExternalTty`], and the terminal's
//! termios, window size and whether the tree's group was in the foreground
//! ([`ShellJob`]); the restore, run from a shell on some terminal, reopens
//! those fds on *its* terminal, the tree joining its session (the restorer's
//! session is the one a tree whose session leader is outside it gets
//! anyway), sets the saved termios there and makes the tree's group the
//! foreground group again.
//!
//! **Save** ([`mark_external`], called with the pty checks once every
//! process is saved): the root's session must be led from outside the tree
//! and have a pts as its controlling terminal whose master the tree does not
//! hold; every slave and `/dev/tty` fd of the tree on that terminal becomes
//! an `ExternalTty`. Other terminals stay refused by the pty checks.
//!
//! **Restore** ([`ShellJobTty`]): an fd on the device of the restorer's
//! terminal ([`RestoreCtx::terminal`]), opened with the saved flags, or
//! `/dev/tty` itself; `stasis_restore` sets the termios and the foreground
//! group before the tree runs.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use stasis_image::manifest::{FdImage, FdKind, ShellJob};
use stasis_kernel::{fdops, tty};

use crate::error::io_step;
use crate::pty::{end_of, End};
use crate::restore::{not_mine, reopen_flags, setfl_flags};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// An fd on the terminal of a shell job.
pub struct ShellJobTty;

impl Object for ShellJobTty {
    const NAME: &'static str = "shell job terminal";

    /// Never chosen by an fd's look: [`mark_external`] turns pty fds into
    /// this kind once the whole tree is known.
    fn save(_cx: &mut SaveCtx, _fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        Ok(None)
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::ExternalTty { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::ExternalTty { current } = img.kind else {
            return Err(not_mine(Self::NAME, img));
        };
        let Some(terminal) = &cx.terminal else {
            return Err(RestoreError::Inconsistent(format!(
                "fd {} is on the terminal of a shell job (dumped with --shell-job): restore it with --shell-job, from a shell on the terminal to put it on",
                img.fd
            )));
        };
        let path = if current {
            std::path::Path::new("/dev/tty")
        } else {
            terminal.as_path()
        };
        let flags = reopen_flags(img.flags);
        let mode = flags & libc::O_ACCMODE;
        let fd: OwnedFd = std::fs::OpenOptions::new()
            .read(mode != libc::O_WRONLY)
            .write(mode != libc::O_RDONLY)
            .custom_flags((flags & !libc::O_ACCMODE) | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path)
            .map_err(io_step(
                format!("opening {} for fd {}", path.display(), img.fd),
                "open",
            ))?
            .into();
        fdops::set_status_flags(fd.as_fd(), setfl_flags(img.flags)).map_err(io_step(
            format!("setting the flags of fd {}", img.fd),
            "F_SETFL",
        ))?;
        Ok(fd)
    }
}

/// With `--shell-job`: the fds of the tree on its session's terminal,
/// held from outside, become [`FdKind::ExternalTty`], and the terminal's
/// settings are read ([`SaveCtx::take_shell_job`]). Nothing without the
/// option, or when the tree leads its session or its terminal is a pair it
/// holds (saved as such) or not a pts (refused by the pty checks).
pub(crate) fn mark_external(cx: &mut SaveCtx, tree: &[i32]) -> Result<(), SaveError> {
    if !cx.shell_job {
        return Ok(());
    }
    let Some(&root) = tree.first() else {
        return Ok(());
    };
    let stat = std::fs::read_to_string(format!("/proc/{root}/stat")).map_err(|source| {
        SaveError::Proc {
            pid: root,
            file: "stat".into(),
            source,
        }
    })?;
    let Some((sid, tty_nr, tpgid)) = crate::pty_census::ctty_fields(&stat) else {
        return Ok(());
    };
    let rdev = crate::pty_census::decode_dev(tty_nr);
    let Some(End::Slave(index)) = (tty_nr != 0).then(|| end_of(rdev)).flatten() else {
        return Err(SaveError::Unsupported {
            pid: root,
            what: "--shell-job: its controlling terminal is not a pseudo-terminal (a pts) or it has none; stasis restores shell jobs of pts terminals only".into(),
        });
    };
    if tree.contains(&sid) {
        return Err(SaveError::Unsupported {
            pid: root,
            what: format!("--shell-job: the tree leads its own session ({sid}), it is not a job of a shell outside it; dump it without --shell-job"),
        });
    }
    // (None if the tree holds the pair: saved as such.)
    let fds = cx.ptys.take_external(index);
    for &(pid, fd, current) in &fds {
        if let Some(img) = cx.fd_image_mut(pid, fd) {
            img.kind = FdKind::ExternalTty { current };
        }
    }
    let path = format!("/dev/pts/{index}");
    let t: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| SaveError::Proc {
            pid: root,
            file: format!("its terminal {path}"),
            source,
        })?
        .into();
    let io = |what: &'static str| {
        move |source: std::io::Error| SaveError::Proc {
            pid: root,
            file: format!("its terminal /dev/pts/{index} ({what})"),
            source,
        }
    };
    let termios = tty::termios(t.as_fd()).map_err(io("TCGETS2"))?;
    let ws = tty::winsize(t.as_fd()).map_err(io("TIOCGWINSZ"))?;
    let pgids: Vec<i32> = tree
        .iter()
        .filter_map(|&p| stasis_kernel::procfs::stat(p).ok().map(|s| s.pgrp))
        .collect();
    cx.shell_job_terminal = Some(ShellJob {
        termios: crate::pty::image_termios(&termios),
        winsize: [ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel],
        foreground: pgids.contains(&tpgid).then_some(tpgid),
    });
    Ok(())
}
