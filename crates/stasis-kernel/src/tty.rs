//! Safe wrappers over the terminal ioctls that save and rebuild a
//! pseudo-terminal pair (`stasis_objects::pty`): its index, lock, packet and
//! exclusive modes, termios (`struct termios2`, the kernel's own view),
//! window size, the slave opened from its master (`TIOCGPTPEER`), bytes
//! pushed through a line discipline (`TIOCSTI`), and what a zero-timeout
//! `poll` says. Each takes a `BorrowedFd`, never a raw number.
//!
//! On a master, the termios, window size and lock ioctls act on the slave
//! (the kernel's `tty_pair_get_tty`): the pair has one termios, the slave's.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use stasis_sys::tty::{
    Termios2, Winsize, FIONREAD, TCFLSH, TCGETS2, TCSETS2, TCXONC, TIOCEXCL, TIOCGETD, TIOCGEXCL,
    TIOCGPKT, TIOCGPTLCK, TIOCGPTN, TIOCGPTPEER, TIOCGWINSZ, TIOCNXCL, TIOCPKT, TIOCSETD,
    TIOCSPTLCK, TIOCSTI, TIOCSWINSZ,
};

fn check(r: i32) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An ioctl that fills an `int`.
fn get_int(fd: BorrowedFd<'_>, req: u64) -> io::Result<i32> {
    let mut v: i32 = 0;
    // SAFETY: `req` is one of the `_IOR(.., int)` requests of this module,
    // which write one int to the pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), req, &raw mut v) })?;
    Ok(v)
}

/// An ioctl that reads an `int`.
fn set_int(fd: BorrowedFd<'_>, req: u64, v: i32) -> io::Result<()> {
    // SAFETY: `req` is one of the requests of this module that read one
    // int from the pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), req, &raw const v) }).map(drop)
}

/// An ioctl without argument.
fn no_arg(fd: BorrowedFd<'_>, req: u64) -> io::Result<()> {
    // SAFETY: `req` (TIOCEXCL, TIOCNXCL) takes no argument.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), req) }).map(drop)
}

/// Opens `/dev/ptmx`: a new pair, its master (`O_RDWR | O_NOCTTY |
/// O_CLOEXEC`, plus `flags`). The slave is locked until [`set_locked`].
pub fn open_ptmx(flags: i32) -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC | flags)
        .open("/dev/ptmx")?;
    Ok(f.into())
}

/// `TIOCGPTN`: the pts index of a master.
pub fn index(master: BorrowedFd<'_>) -> io::Result<u32> {
    let n = get_int(master, TIOCGPTN)?;
    u32::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `TIOCGPTLCK`: whether the slave of a master is locked.
pub fn locked(master: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(get_int(master, TIOCGPTLCK)? != 0)
}

/// `TIOCSPTLCK`: locks or unlocks the slave of a master.
pub fn set_locked(master: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(master, TIOCSPTLCK, i32::from(on))
}

/// `TIOCGPTPEER`: opens the slave of `master` with `flags` (`O_NOCTTY` is
/// always added: the caller never acquires it as its terminal).
pub fn open_peer(master: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let f = u64::from((flags | libc::O_NOCTTY).unsigned_abs());
    // SAFETY: TIOCGPTPEER takes the open flags as an integer argument and
    // returns a new descriptor.
    let fd = check(unsafe { libc::ioctl(master.as_raw_fd(), TIOCGPTPEER, f) })?;
    // SAFETY: a new descriptor just returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `TIOCGPKT`: whether packet mode is on (a master).
pub fn packet(master: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(get_int(master, TIOCGPKT)? != 0)
}

/// `TIOCPKT`: packet mode on or off (a master).
pub fn set_packet(master: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(master, TIOCPKT, i32::from(on))
}

/// `TIOCGEXCL`: whether exclusive mode is on (of this side of the pair).
pub fn exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(get_int(fd, TIOCGEXCL)? != 0)
}

/// `TIOCEXCL` / `TIOCNXCL`.
pub fn set_exclusive(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    no_arg(fd, if on { TIOCEXCL } else { TIOCNXCL })
}

/// `TCGETS2`: the termios (on a master: the slave's, the pair's).
pub fn termios(fd: BorrowedFd<'_>) -> io::Result<Termios2> {
    let mut t = Termios2::default();
    // SAFETY: TCGETS2 writes a `struct termios2`, which `Termios2` is
    // (size checked in stasis-sys).
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TCGETS2, &raw mut t) })?;
    Ok(t)
}

/// `TCSETS2`: sets the termios now.
pub fn set_termios(fd: BorrowedFd<'_>, t: &Termios2) -> io::Result<()> {
    // SAFETY: TCSETS2 reads a `struct termios2`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TCSETS2, std::ptr::from_ref(t)) }).map(drop)
}

/// `TIOCGWINSZ`.
pub fn winsize(fd: BorrowedFd<'_>) -> io::Result<Winsize> {
    let mut w = Winsize::default();
    // SAFETY: TIOCGWINSZ writes a `struct winsize`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TIOCGWINSZ, &raw mut w) })?;
    Ok(w)
}

/// `TIOCSWINSZ`.
pub fn set_winsize(fd: BorrowedFd<'_>, w: &Winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads a `struct winsize`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TIOCSWINSZ, std::ptr::from_ref(w)) }).map(drop)
}

/// `FIONREAD`: bytes a read would find (in canonical mode, those of
/// complete lines only).
pub fn queued(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let n = get_int(fd, FIONREAD)?;
    usize::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `TIOCSTI`, byte by byte: `data` enters the input of the terminal behind
/// `fd` (of the slave through a slave fd, of the master through a master
/// fd) through its line discipline, at once, with the termios in force.
pub fn inject(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    for b in data {
        // SAFETY: TIOCSTI reads one byte from the pointer.
        check(unsafe { libc::ioctl(fd.as_raw_fd(), TIOCSTI, std::ptr::from_ref(b)) })?;
    }
    Ok(())
}

/// An ioctl whose argument is an int value, not a pointer.
fn value_arg(fd: BorrowedFd<'_>, req: u64, v: i32) -> io::Result<()> {
    // SAFETY: `req` (TCFLSH, TCXONC) takes its int argument by value and
    // dereferences nothing.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), req, libc::c_long::from(v)) }).map(drop)
}

/// `TCFLSH`: flushes the terminal's input (`TCIFLUSH`) or output
/// (`TCOFLUSH`); on a slave whose master is in packet mode, the master gets
/// a `TIOCPKT_FLUSHREAD` / `TIOCPKT_FLUSHWRITE` status.
pub fn flush(fd: BorrowedFd<'_>, queue: i32) -> io::Result<()> {
    value_arg(fd, TCFLSH, queue)
}

/// `TCXONC`: stops (`TCOOFF`) or restarts (`TCOON`) the terminal's output.
pub fn flow(fd: BorrowedFd<'_>, action: i32) -> io::Result<()> {
    value_arg(fd, TCXONC, action)
}

/// `TIOCGETD`: the line discipline of this side of the pair.
pub fn ldisc(fd: BorrowedFd<'_>) -> io::Result<u8> {
    u8::try_from(get_int(fd, TIOCGETD)?).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `TIOCSETD`: gives this side of the pair line discipline `disc` (its
/// input queue is dropped).
pub fn set_ldisc(fd: BorrowedFd<'_>, disc: u8) -> io::Result<()> {
    set_int(fd, TIOCSETD, i32::from(disc))
}

/// What a zero-timeout `poll` says of a terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollState {
    pub readable: bool,
    /// `POLLPRI`: on a master in packet mode, a control status waits.
    pub priority: bool,
    /// `POLLHUP`: on a master, no slave is open (any more).
    pub hangup: bool,
}

/// `poll` with a zero timeout. For a terminal with nothing to read, the
/// kernel first waits for the bytes still on their way to the line
/// discipline (`tty_buffer_flush_work`), so the answer is not stale.
pub fn poll_now(fd: BorrowedFd<'_>) -> io::Result<PollState> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN | PollFlags::POLLPRI)];
    poll(&mut fds, PollTimeout::ZERO).map_err(io::Error::from)?;
    let got = fds[0].revents().unwrap_or(PollFlags::empty());
    Ok(PollState {
        readable: got.contains(PollFlags::POLLIN),
        priority: got.contains(PollFlags::POLLPRI),
        hangup: got.contains(PollFlags::POLLHUP),
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        let m = open_ptmx(0).unwrap();
        set_locked(m.as_fd(), false).unwrap();
        let s = open_peer(m.as_fd(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC).unwrap();
        (m, s)
    }

    #[test]
    fn a_pair_reports_and_takes_its_modes() {
        let m = open_ptmx(0).unwrap();
        assert!(locked(m.as_fd()).unwrap(), "a new pair is locked");
        assert!(open_peer(m.as_fd(), libc::O_RDWR).is_err(), "locked");
        set_locked(m.as_fd(), false).unwrap();
        let s = open_peer(m.as_fd(), libc::O_RDWR | libc::O_CLOEXEC).unwrap();
        let st = nix::sys::stat::fstat(s.as_raw_fd()).unwrap();
        let (maj, min) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
        assert_eq!(
            (maj - stasis_sys::tty::PTY_SLAVE_MAJOR) * 256 + min,
            index(m.as_fd()).unwrap()
        );
        assert!(!packet(m.as_fd()).unwrap());
        set_packet(m.as_fd(), true).unwrap();
        assert!(packet(m.as_fd()).unwrap());
        set_exclusive(s.as_fd(), true).unwrap();
        assert!(exclusive(s.as_fd()).unwrap());
        assert!(!exclusive(m.as_fd()).unwrap(), "per side");
        let w = Winsize {
            ws_row: 33,
            ws_col: 101,
            ws_xpixel: 7,
            ws_ypixel: 9,
        };
        set_winsize(m.as_fd(), &w).unwrap();
        assert_eq!(winsize(s.as_fd()).unwrap(), w, "one size, the slave's");
        let mut t = termios(s.as_fd()).unwrap();
        t.c_lflag &= !libc::ICANON;
        set_termios(m.as_fd(), &t).unwrap();
        assert_eq!(termios(s.as_fd()).unwrap(), t, "one termios, the slave's");
    }

    #[test]
    fn injected_bytes_are_queued_and_a_closed_slave_is_a_hangup() {
        let (m, s) = pair();
        assert_eq!(poll_now(m.as_fd()).unwrap(), PollState::default());
        inject(m.as_fd(), b"to the master").unwrap();
        assert_eq!(queued(m.as_fd()).unwrap(), 13);
        let mut t = termios(s.as_fd()).unwrap();
        t.c_lflag &= !(libc::ECHO | libc::ICANON);
        set_termios(s.as_fd(), &t).unwrap();
        inject(s.as_fd(), b"in").unwrap();
        assert_eq!(queued(s.as_fd()).unwrap(), 2);
        assert_eq!(queued(m.as_fd()).unwrap(), 13, "no echo");
        drop(s);
        assert!(poll_now(m.as_fd()).unwrap().hangup);
    }

    #[test]
    fn flushes_and_flow_raise_control_statuses_and_ldiscs_change() {
        let (m, s) = pair();
        set_packet(m.as_fd(), true).unwrap();
        assert!(!poll_now(m.as_fd()).unwrap().priority);
        flush(s.as_fd(), stasis_sys::tty::TCIFLUSH).unwrap();
        flush(s.as_fd(), stasis_sys::tty::TCOFLUSH).unwrap();
        flow(s.as_fd(), stasis_sys::tty::TCOOFF).unwrap();
        assert!(poll_now(m.as_fd()).unwrap().priority);
        let mut b = [0u8; 8];
        let n = nix::unistd::read(m.as_raw_fd(), &mut b).unwrap();
        use stasis_sys::tty::{TIOCPKT_FLUSHREAD, TIOCPKT_FLUSHWRITE, TIOCPKT_STOP};
        assert_eq!(
            &b[..n],
            &[TIOCPKT_FLUSHREAD | TIOCPKT_FLUSHWRITE | TIOCPKT_STOP]
        );
        flow(s.as_fd(), stasis_sys::tty::TCOON).unwrap();
        assert!(poll_now(m.as_fd()).unwrap().priority, "START");
        assert_eq!(ldisc(s.as_fd()).unwrap(), stasis_sys::tty::N_TTY);
        if set_ldisc(s.as_fd(), stasis_sys::tty::N_NULL).is_ok() {
            assert_eq!(ldisc(s.as_fd()).unwrap(), stasis_sys::tty::N_NULL);
            assert_eq!(ldisc(m.as_fd()).unwrap(), stasis_sys::tty::N_TTY);
        }
    }
}
