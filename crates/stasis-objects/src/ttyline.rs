//! Virtual consoles (`/dev/ttyN`) and serial lines (`/dev/ttySN`): devices
//! of the `tty` major (4) that live outside the tree, as CRIU has them.
//!
//! **Save.** An fd on one is saved by its path and device number, with
//! the line's termios (`TCGETS2`) and window size (`TIOCGWINSZ`), read
//! from a copy of the fd (`pidfd_getfd`: no open of the device of our
//! own). Bytes queued on the line (typed, or not yet sent) are the
//! device's, not the tree's, and are not saved. When the line is the
//! controlling terminal of a session (the census of the system says who
//! has it as theirs), that session must be the tree's (every process
//! that has the line as its terminal is in the tree): it is saved with its
//! foreground group. A line that is the terminal of a session outside
//! the tree is only reopened; one whose session the dump would split is
//! refused by name. A `/dev/tty` fd of a process whose controlling
//! terminal is a line is saved as [`FdKind::LineDevTty`]: the line (by the
//! path its device number names), its state and its session, under the
//! same rule.
//!
//! **Restore.** The path is opened again (`O_NOCTTY`, with the fd's access
//! mode and status flags), must still be the same device, and gets the
//! saved termios and window size. A virtual console forgets its termios
//! when its last fd closes (a serial line keeps it), so both are set
//! whatever they read then. A session's leader takes its line back as its
//! controlling terminal as soon as it is forked, and the line gets its
//! foreground group once the groups exist, as a pty does
//! ([`crate::pty::take_ctty`], [`crate::pty::restore_ctty`]). A `/dev/tty`
//! fd is made an fd on the line, then replaced by `/dev/tty` itself once
//! its process has its terminal (it may be the only fd holding the line).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, PtySession, PtyTermios};
use stasis_kernel::{tty as ktty, KernelError};
use stasis_sys::tty::Winsize;

use crate::error::file_err;
use crate::pty::{image_termios, termios2};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// The major of virtual consoles and serial lines.
const TTY_MAJOR: u32 = 4;

/// Whether `path` names a virtual console (`/dev/ttyN`) or a serial line
/// (`/dev/ttySN`).
pub(crate) fn is_line_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/dev/tty") else {
        return false;
    };
    let digits = rest.strip_prefix('S').unwrap_or(rest);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether device `rdev` is a virtual console (4:1-63) or a serial line
/// (4:64-255): what `/dev/tty` of a process reaches when its
/// controlling terminal is one.
pub(crate) fn is_line(rdev: u64) -> bool {
    libc::major(rdev) == TTY_MAJOR && (1..=255).contains(&libc::minor(rdev))
}

/// The path of virtual console or serial line `rdev` ([`is_line`]), as
/// the kernel names its devices.
fn line_path(rdev: u64) -> String {
    match libc::minor(rdev) {
        n @ 1..=63 => format!("/dev/tty{n}"),
        n => format!("/dev/ttyS{}", n - 64),
    }
}

fn kernel(what: String) -> impl FnOnce(std::io::Error) -> SaveError {
    move |source| SaveError::Kernel(KernelError::Io { what, source })
}

/// An fd on a virtual console or a serial line.
pub struct TtyLine;

impl Object for TtyLine {
    const NAME: &'static str = "virtual console or serial line";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        let rdev = fd.meta.rdev();
        if !is_line_path(fd.link)
            || !fd.meta.file_type().is_char_device()
            || libc::major(rdev) != TTY_MAJOR
        {
            return Ok(None);
        }
        let session = session_of(cx, fd, rdev)?;
        let (termios, winsize) = line_state(fd)?;
        Ok(Some(FdKind::TtyLine {
            path: fd.link.to_string(),
            rdev,
            termios,
            winsize,
            session,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::TtyLine { .. } | FdKind::LineDevTty { .. })
    }

    /// A `/dev/tty` fd ([`FdKind::LineDevTty`]) is made an fd on the line
    /// here, and replaced by `/dev/tty` itself once the process has its
    /// terminal back ([`crate::pty::restore_ctty`]).
    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let (FdKind::TtyLine {
            path,
            rdev,
            termios,
            winsize,
            ..
        }
        | FdKind::LineDevTty {
            path,
            rdev,
            termios,
            winsize,
            ..
        }) = &img.kind
        else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let flags = i32::try_from(img.flags).unwrap_or(0);
        let status = flags & (libc::O_NONBLOCK | libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC);
        let fd = open_line(
            path,
            *rdev,
            flags & libc::O_ACCMODE | libc::O_NOCTTY | status,
        )?;
        ktty::set_termios(fd.as_fd(), &termios2(termios)).map_err(file_err(
            path.clone(),
            Self::NAME,
            "TCSETS2",
        ))?;
        let w = Winsize {
            ws_row: winsize[0],
            ws_col: winsize[1],
            ws_xpixel: winsize[2],
            ws_ypixel: winsize[3],
        };
        ktty::set_winsize(fd.as_fd(), &w).map_err(file_err(
            path.clone(),
            Self::NAME,
            "TIOCSWINSZ",
        ))?;
        Ok(fd)
    }
}

/// The termios and window size of the line `fd` reaches, read from a
/// copy of it (`pidfd_getfd`).
fn line_state(fd: &OpenFd<'_>) -> Result<(PtyTermios, [u16; 4]), SaveError> {
    let copy = stasis_kernel::pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
    let t = ktty::termios(copy.as_fd())
        .map_err(kernel(format!("TCGETS2 of {} (fd {})", fd.link, fd.fd)))?;
    let w = ktty::winsize(copy.as_fd())
        .map_err(kernel(format!("TIOCGWINSZ of {} (fd {})", fd.link, fd.fd)))?;
    Ok((
        image_termios(&t),
        [w.ws_row, w.ws_col, w.ws_xpixel, w.ws_ypixel],
    ))
}

/// `/dev/tty` fd `fd` of a process whose controlling terminal is line
/// `rdev` ([`is_line`]): saved with the line's path, state and session,
/// which must be the tree's (as for an fd on the line itself).
pub(crate) fn save_dev_tty(
    cx: &mut SaveCtx,
    fd: &OpenFd<'_>,
    rdev: u64,
) -> Result<FdKind, SaveError> {
    let path = line_path(rdev);
    let Some(session) = session_of(cx, fd, rdev)? else {
        // The census saw no process with the line as its terminal, though
        // this one had it a moment ago: it was given up meanwhile.
        return Err(fd.unsupported(format!(
            "fd {} is /dev/tty on {path}, which no process has as its controlling terminal any more",
            fd.fd
        )));
    };
    let (termios, winsize) = line_state(fd)?;
    Ok(FdKind::LineDevTty {
        path,
        rdev,
        termios,
        winsize,
        session,
    })
}

/// The session whose controlling terminal line `rdev` (held by `fd`) is,
/// when it is the tree's: every process that has the line as its
/// terminal is in the tree, its leader among them. `None` when no process
/// has it, or only processes outside the tree (the line is reopened, not
/// made anyone's terminal); a session the dump would split is refused.
fn session_of(
    cx: &mut SaveCtx,
    fd: &OpenFd<'_>,
    rdev: u64,
) -> Result<Option<PtySession>, SaveError> {
    let holders = cx.ptys.census_now().ctty_holders(rdev);
    let tree = &cx.tree_pids;
    let inside = holders.iter().find(|h| tree.contains(&h.0));
    let outside = holders.iter().find(|h| !tree.contains(&h.0));
    let Some(&(_, sid, foreground)) = inside else {
        return Ok(None);
    };
    if let Some(&(out, _, _)) = outside {
        return Err(fd.unsupported(format!(
            "{} (fd {}) is the controlling terminal of session {sid}, which process {out} outside the dumped tree belongs to (dump the session's leader with it)",
            fd.link, fd.fd
        )));
    }
    if !tree.contains(&sid) {
        return Err(fd.unsupported(format!(
            "{} (fd {}) is the controlling terminal of session {sid}, whose leader is not in the dumped tree (dump it with the tree)",
            fd.link, fd.fd
        )));
    }
    Ok(Some(PtySession { sid, foreground }))
}

/// Opens virtual console or serial line `path` with `flags` (close-on-exec
/// added); it must still be device `rdev`.
pub(crate) fn open_line(path: &str, rdev: u64, flags: i32) -> Result<OwnedFd, RestoreError> {
    let access = flags & libc::O_ACCMODE;
    let f = std::fs::OpenOptions::new()
        .read(access != libc::O_WRONLY)
        .write(access != libc::O_RDONLY)
        .custom_flags(flags & !libc::O_ACCMODE | libc::O_CLOEXEC)
        .open(path)
        .map_err(file_err(path, TtyLine::NAME, "open"))?;
    let md = f
        .metadata()
        .map_err(file_err(path, TtyLine::NAME, "fstat"))?;
    if md.rdev() != rdev {
        return Err(file_err(
            path,
            format!(
                "{} (it is device {}:{} now, {}:{} at the dump)",
                TtyLine::NAME,
                libc::major(md.rdev()),
                libc::minor(md.rdev()),
                libc::major(rdev),
                libc::minor(rdev)
            ),
            "fstat",
        )(std::io::Error::from_raw_os_error(libc::ENODEV)));
    }
    Ok(OwnedFd::from(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consoles_and_serial_lines_are_known_by_path() {
        for p in ["/dev/tty1", "/dev/tty63", "/dev/ttyS0", "/dev/ttyS12"] {
            assert!(is_line_path(p), "{p}");
        }
        for p in [
            "/dev/tty",
            "/dev/ttyS",
            "/dev/ttyUSB0",
            "/dev/ttyAMA0",
            "/dev/pts/1",
            "/dev/tty1x",
        ] {
            assert!(!is_line_path(p), "{p}");
        }
    }

    #[test]
    fn a_line_reached_through_dev_tty_is_named_by_its_device() {
        for (minor, path) in [
            (1, "/dev/tty1"),
            (63, "/dev/tty63"),
            (64, "/dev/ttyS0"),
            (76, "/dev/ttyS12"),
        ] {
            let rdev = libc::makedev(TTY_MAJOR, minor);
            assert!(is_line(rdev), "{path}");
            assert_eq!(line_path(rdev), path);
            assert!(is_line_path(&line_path(rdev)));
        }
        // /dev/tty0 (the current console), ptys and /dev/tty itself are not lines.
        for rdev in [
            libc::makedev(4, 0),
            libc::makedev(136, 3),
            libc::makedev(5, 0),
        ] {
            assert!(!is_line(rdev));
        }
    }
}
