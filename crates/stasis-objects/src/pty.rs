//! Pseudo-terminal pairs: a master (`/dev/ptmx`) and its slave
//! (`/dev/pts/N`), with their settings and the bytes queued each way.
//!
//! **Save.** A pair is saved with its master, which is always one open file
//! description: the master of a pair is opened once, by `/dev/ptmx`. A copy
//! of it is taken with `pidfd_getfd`, and a slave of our own is opened from
//! it (`TIOCGPTPEER`, unlocking for that instant if it was locked). Then:
//! - termios (`TCGETS2`, the slave's: the master has none of its own),
//!   window size, lock, packet mode, exclusive mode of each side, and
//!   whether a slave was open at all (`POLLHUP` on the master);
//! - the session whose controlling terminal the slave is (`tty_nr` of
//!   `/proc/*/stat`) and its foreground group (`tpgid`);
//! - the bytes the master will read next, read with `FIONREAD` + `read`
//!   (the master's line discipline is always raw), and the bytes the slave
//!   will read next, read from our slave: in canonical mode line by line
//!   (each `read` returns one line, its terminator included, nothing for an
//!   end-of-file), then the line still being typed with `ICANON` off. None
//!   of this can be peeked, so it is **put back at once** (dump or not), in
//!   a way that does not pass the bytes through the line discipline again:
//!   `TIOCSTI` pushes each byte into the slave's input under a termios
//!   ([`inject_termios`]) with echo, signals and input mapping off, and
//!   every data byte escaped by `VLNEXT`, so only the saved terminators act
//!   as terminators; the master's bytes are pushed into its raw input.
//!   Flow control bits are kept as they were, so a packet-mode master gets
//!   no control status from these termios changes.
//! - In `EXTPROC` or raw mode the slave's line discipline takes input as
//!   it comes (no lines, no echo): its bytes are read whole and pushed back
//!   raw, without a termios change (which would raise `TIOCPKT_IOCTL`).
//! - More than a line discipline holds (4095 bytes; the kernel keeps the
//!   rest in the pair's flip buffers, which each read moves on): the
//!   master's input (its line discipline is always raw) is read whole, the
//!   first 4095 bytes pushed back, the rest written through the slave with
//!   output processing off for that moment; the slave's in raw or
//!   `EXTPROC` mode the same way through the master.
//! - A slave with line discipline N_NULL holds nothing; it gets N_NULL
//!   again (`TIOCSETD`) once its pair is made.
//! - A control status waiting on a packet-mode master (`POLLPRI`) cannot be
//!   peeked: it is read, then raised again by the events that raise it
//!   (`raise_before` while the queues are empty: an input flush for
//!   `FLUSHREAD`, an output flush for `FLUSHWRITE`, an `EXTPROC` termios
//!   change for `IOCTL`; `raise_after` once the bytes are back: a flow
//!   control change and back for `DOSTOP`/`NOSTOP`, output stopped and
//!   restarted for `START`, restarted and stopped for `STOP`, by the
//!   START/STOP characters or by `TCOON`/`TCOOFF` as it had been), on the
//!   dumped pair at once and on the new pair after its packet mode.
//!
//! **Refused**, naming the process and fd: a slave whose master is outside
//! the tree (an interactive terminal, say), a pair or a controlling
//! terminal shared with a process outside the tree, a session leader that
//! holds no slave fd of its controlling terminal, a slave never opened (its
//! queue can only be read through a slave, and the last slave's close
//! hangs the master up: `TTY_OTHER_CLOSED`, undone only by a new open), a
//! line discipline other than N_TTY and N_NULL (SLIP, PPP, HDLC, GSM...:
//! state of their own the kernel does not give back), a control status on
//! an N_NULL pair (no flush, flow or termios ioctl to raise it again),
//! more input than the slave's line discipline holds (4095 bytes) in a
//! mode that processes input (canonical, echo, signals...: the rest waits
//! unprocessed in the flip buffers and cannot be read without processing
//! it), more than the master's while the slave's output is stopped, a
//! master not opened read-write.
//!
//! A slave whose master no process holds any more (closed: the terminal is
//! hung up, its `/dev/pts/N` node gone; zdtm's pty04) is saved as
//! [`FdKind::PtyHungUp`] (the census of the system says no one holds the
//! master) and restored as a slave of a new pair whose master is closed
//! when the restore ends: hung up again, every such fd of one terminal on
//! one new terminal.
//!
//! A slave whose master is outside the tree (an interactive program's
//! terminal, fds 0-2 of a shell's child) is refused rather than reopened
//! by its `/dev/pts/N` path at restore: its settings and queues belong to
//! the program holding the master, which stasis must not read, and the
//! number may name another terminal by then (CRIU takes such "external"
//! terminals only when told to, `--shell-job`/`--external tty`).
//!
//! **Restore.** The pair is made once, in the restorer, when its master or
//! one of its slaves is first needed: `/dev/ptmx`, unlock, a slave kept
//! until the end of the restore; queued bytes pushed back as above; then
//! termios, window size, exclusive modes, packet mode and the lock. The pts
//! index is whatever the kernel gives: slaves are opened from the new
//! master (`TIOCGPTPEER`). A pair of a devpts instance of the tree's own
//! mount namespace (a container's `/dev/pts`: the slave's device is that
//! instance's, [`PtyPair::devpts`] its mount point there) is made from
//! that instance's `ptmx` in the restored mount namespace, at its index:
//! a new instance gives the lowest free one, so masters are opened until
//! one has it, those below kept as spares until the restore ends (as
//! CRIU's `tty.c` does); its `/dev/pts/N` inside is the same. An index
//! names a pair of one instance only: the census that finds holders
//! outside the tree tells instances apart ([`crate::pty_census`]: a
//! slave's device, the instance a master was opened from, the one a
//! process sees on `/dev/pts` for its controlling terminal, which
//! `/proc/PID/stat` gives by index alone). The controlling terminal is taken back by the
//! session leader itself as soon as it is forked, before the members of its
//! session ([`take_ctty`]: `TIOCSCTTY` on a slave opened for that moment);
//! once its fds exist, `TIOCSPGRP` gives it another foreground group, and
//! its `/dev/tty` fds are opened again ([`restore_ctty`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, PtyPair, PtySession, PtyTermios};
use stasis_kernel::remote::Remote;
use stasis_kernel::{fdops, pidfd, tty};
use stasis_sys::tty::{
    Termios2, Winsize, N_NULL, N_TTY, N_TTY_BUF_SIZE, PTMX_MAJOR, PTMX_MINOR, PTY_SLAVE_MAJOR,
    PTY_SLAVE_MAJOR_COUNT, TCIFLUSH, TCOFLUSH, TCOOFF, TCOON, TIOCPKT_DOSTOP, TIOCPKT_FLUSHREAD,
    TIOCPKT_FLUSHWRITE, TIOCPKT_IOCTL, TIOCPKT_NOSTOP, TIOCPKT_START, TIOCPKT_STOP, TIOCSCTTY,
    TIOCSPGRP,
};

use crate::error::{io_step, step};
use crate::pty_census::Census;
use crate::restore::{not_mine, reopen_flags, setfl_flags};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError, Scratch};

/// A pseudo-terminal end: master or slave.
pub struct Pty;

/// Which end of a pair a character device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Master,
    /// A slave, with its pts index.
    Slave(u32),
}

/// The end of a pair whose device number is `rdev`, if it is one.
pub fn end_of(rdev: u64) -> Option<End> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if (major, minor) == (PTMX_MAJOR, PTMX_MINOR) {
        return Some(End::Master);
    }
    let k = major.checked_sub(PTY_SLAVE_MAJOR)?;
    (k < PTY_SLAVE_MAJOR_COUNT).then_some(End::Slave(k * 256 + minor))
}

/// The device number of slave `index`.
pub fn slave_rdev(index: u32) -> u64 {
    libc::makedev(PTY_SLAVE_MAJOR + index / 256, index % 256)
}

/// What the save side keeps of the ptys of a dump.
#[derive(Default)]
pub struct Saved {
    /// Pairs saved with their master, by index.
    pairs: HashMap<u32, PtyPair>,
    /// The devpts instance of each (its device; see
    /// [`crate::pty_census::instance_of_end`]), by index.
    instances: HashMap<u32, u64>,
    /// Every slave fd of the tree: (pid, fd, index).
    slaves: Vec<(i32, i32, u32)>,
    /// Every `/dev/tty` fd of the tree: (pid, fd, index of its terminal).
    current_ttys: Vec<(i32, i32, u32)>,
    /// Processes whose controlling terminal is a saved pair's slave, by index.
    ctty_of: HashMap<u32, Vec<i32>>,
    /// Who else holds ptys: given by the dump ([`Saved::use_census`]), or
    /// taken with the first master saved.
    census: Option<Census>,
    /// Slaves in flight in the tree's unix sockets (`SCM_RIGHTS`), by
    /// index: open, though no process holds them.
    pub(crate) in_flight_slaves: std::collections::HashSet<u32>,
}

impl Saved {
    /// A census taken before the freeze, brought up to date for the
    /// frozen processes `tree`.
    /// `fds`: the frozen tree's, if they were listed.
    pub fn use_census(
        &mut self,
        mut census: Census,
        tree: &[i32],
        fds: Option<&crate::fd_census::FdCensus>,
    ) {
        census.refresh(tree, fds);
        self.census = Some(census);
    }

    /// The census, if the dump gave one or a master's save took one.
    pub(crate) fn census(&self) -> Option<&Census> {
        self.census.as_ref()
    }

    /// The census: the dump's, or one taken now.
    pub(crate) fn census_now(&mut self) -> &Census {
        self.census.get_or_insert_with(Census::take)
    }

    /// Takes out of the dump's slave and `/dev/tty` fds those on terminal
    /// `index` when no saved pair is it (a shell job's terminal, see
    /// [`crate::shell_job`]): (pid, fd, whether a `/dev/tty` fd).
    pub(crate) fn take_external(&mut self, index: u32) -> Vec<(i32, i32, bool)> {
        if self.pairs.contains_key(&index) {
            return Vec::new();
        }
        let mut out: Vec<(i32, i32, bool)> = Vec::new();
        self.slaves.retain(|&(pid, fd, i)| {
            let mine = i == index;
            if mine {
                out.push((pid, fd, false));
            }
            !mine
        });
        self.current_ttys.retain(|&(pid, fd, i)| {
            let mine = i == index;
            if mine {
                out.push((pid, fd, true));
            }
            !mine
        });
        out
    }
}

impl Object for Pty {
    const NAME: &'static str = "pty";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.socket.is_some() || !fd.meta.file_type().is_char_device() {
            return Ok(None);
        }
        if fd.meta.rdev() == libc::makedev(TTY_MAJOR, 0) {
            let ctty = current_tty(fd)?;
            if crate::ttyline::is_line(ctty) {
                return crate::ttyline::save_dev_tty(cx, fd, ctty).map(Some);
            }
            let Some(End::Slave(index)) = end_of(ctty) else {
                return Err(fd.unsupported(format!(
                    "fd {} is /dev/tty, but the process's controlling terminal is neither a pseudo-terminal slave, a virtual console nor a serial line (device {}:{})",
                    fd.fd,
                    libc::major(ctty),
                    libc::minor(ctty)
                )));
            };
            cx.ptys.current_ttys.push((fd.pid, fd.fd, index));
            return Ok(Some(FdKind::CurrentTty { index }));
        }
        match end_of(fd.meta.rdev()) {
            None => Ok(None),
            Some(End::Slave(index)) => {
                cx.ptys.slaves.push((fd.pid, fd.fd, index));
                Ok(Some(FdKind::PtySlave { index }))
            }
            Some(End::Master) => Ok(Some(FdKind::PtyMaster(save_master(cx, fd)?))),
        }
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(
            kind,
            FdKind::PtyMaster(_)
                | FdKind::PtySlave { .. }
                | FdKind::PtyHungUp { .. }
                | FdKind::CurrentTty { .. }
        )
    }

    /// A `/dev/tty` fd is made a slave of its pair here, and replaced by
    /// `/dev/tty` itself once the process has its terminal back
    /// ([`restore_ctty`]).
    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let (index, pair) = match &img.kind {
            FdKind::PtyHungUp { index } => return cx.ptys.hung_up_slave(*index, img),
            FdKind::PtyMaster(p) => (p.index, Some(p)),
            FdKind::PtySlave { index } | FdKind::CurrentTty { index } => (*index, None),
            _ => return Err(not_mine(Self::NAME, img)),
        };
        let mnt = cx.mount_ns_of;
        let made = cx.ptys.pair(index, pair, img.fd, mnt)?;
        let fd = if pair.is_some() {
            stasis_kernel::scm::dup_at_least(made.master.as_fd(), 3)?
        } else {
            made.open_slave(img)?
        };
        fdops::set_status_flags(fd.as_fd(), setfl_flags(img.flags)).map_err(io_step(
            format!("setting the flags of fd {}", img.fd),
            "F_SETFL",
        ))?;
        Ok(fd)
    }
}

/// The major number of `/dev/tty` (5, 0).
const TTY_MAJOR: u32 = 5;

/// The controlling terminal (its device) of the process holding
/// `/dev/tty` fd `fd`: what that fd reads and writes.
fn current_tty(fd: &OpenFd<'_>) -> Result<u64, SaveError> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", fd.pid)).map_err(|source| {
        SaveError::Proc {
            pid: fd.pid,
            file: "stat".into(),
            source,
        }
    })?;
    crate::pty_census::ctty_fields(&stat)
        .map(|(_, tty_nr, _)| crate::pty_census::decode_dev(tty_nr))
        .filter(|&dev| dev != 0)
        .ok_or_else(|| {
            fd.unsupported(format!(
                "fd {} is /dev/tty, but the process has no controlling terminal any more",
                fd.fd
            ))
        })
}

/// A pair made again by the restore.
pub struct MadePair {
    pub master: OwnedFd,
    /// A slave held until the restore ends (the pair is never without one
    /// meanwhile; closed then, it leaves the master hung up if no restored
    /// process holds a slave, as at the dump).
    _keeper: OwnedFd,
    locked: bool,
}

impl MadePair {
    /// A new slave description with the saved fd's flags.
    fn open_slave(&self, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        self.open_slave_as(
            reopen_flags(img.flags),
            format!("opening the slave of fd {}", img.fd),
        )
    }

    /// A new slave description with open flags `flags`.
    fn open_slave_with(&self, flags: i32) -> Result<OwnedFd, RestoreError> {
        self.open_slave_as(
            flags,
            "opening a slave to set a controlling terminal".into(),
        )
    }

    fn open_slave_as(&self, flags: i32, what: String) -> Result<OwnedFd, RestoreError> {
        let m = self.master.as_fd();
        if self.locked {
            tty::set_locked(m, false).map_err(io_step(what.clone(), "TIOCSPTLCK"))?;
        }
        let s = tty::open_peer(m, flags);
        if self.locked {
            tty::set_locked(m, true).map_err(io_step(what.clone(), "TIOCSPTLCK"))?;
        }
        s.map_err(io_step(what, "TIOCGPTPEER"))
    }
}

#[cfg(test)]
impl MadePair {
    fn keeper_for_tests(&self) -> BorrowedFd<'_> {
        self._keeper.as_fd()
    }
}

/// What the restore side keeps of the ptys of a tree.
#[derive(Default)]
pub struct Made<'a> {
    /// Every saved pair, by its index at dump.
    images: HashMap<u32, &'a PtyPair>,
    /// The virtual consoles and serial lines that are a session's
    /// controlling terminal: (path, device, session).
    lines: Vec<(&'a str, u64, &'a PtySession)>,
    /// An fd on each line a session took back, held until the restore
    /// ends: the kernel takes a terminal from its session when its last
    /// fd closes, and the tree's own are not made yet.
    lines_held: Vec<OwnedFd>,
    made: HashMap<u32, MadePair>,
    /// The masters of the pairs made for hung-up slaves, by index at dump:
    /// closed when the restore ends, which hangs the slaves up.
    hung: HashMap<u32, OwnedFd>,
    /// Masters opened in a devpts instance of the tree's own only to take
    /// the indexes below a pair's (by `ptmx` path and index), closed when
    /// the restore ends (or when a pair wants their index).
    spares: Vec<(String, u32, OwnedFd)>,
}

impl<'a> Made<'a> {
    /// The pairs of the saved fds `fds`.
    pub fn new(fds: impl Iterator<Item = &'a FdImage>) -> Self {
        let mut images = HashMap::new();
        let mut lines = Vec::new();
        for f in fds {
            match &f.kind {
                FdKind::PtyMaster(p) => {
                    images.insert(p.index, p);
                }
                FdKind::TtyLine {
                    path,
                    rdev,
                    session: Some(s),
                    ..
                }
                | FdKind::LineDevTty {
                    path,
                    rdev,
                    session: s,
                    ..
                } => lines.push((path.as_str(), *rdev, s)),
                _ => {}
            }
        }
        Self {
            images,
            lines,
            lines_held: Vec::new(),
            made: HashMap::new(),
            hung: HashMap::new(),
            spares: Vec::new(),
        }
    }

    /// A slave of the new pair standing for hung-up pair `index` (made on
    /// first use; its master is closed when the restore ends).
    fn hung_up_slave(&mut self, index: u32, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let what = |w: &str| format!("{w} for fd {} (pty {index}, hung up)", img.fd);
        let m = match self.hung.entry(index) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let m = tty::open_ptmx(0).map_err(io_step(what("opening /dev/ptmx"), "open"))?;
                tty::set_locked(m.as_fd(), false)
                    .map_err(io_step(what("unlocking"), "TIOCSPTLCK"))?;
                v.insert(m)
            }
        };
        let s = tty::open_peer(m.as_fd(), reopen_flags(img.flags))
            .map_err(io_step(what("opening a slave"), "TIOCGPTPEER"))?;
        fdops::set_status_flags(s.as_fd(), setfl_flags(img.flags)).map_err(io_step(
            format!("setting the flags of fd {}", img.fd),
            "F_SETFL",
        ))?;
        Ok(s)
    }

    /// Pair `index`, made on first use.
    fn pair(
        &mut self,
        index: u32,
        img: Option<&PtyPair>,
        fd: i32,
        mnt: Option<i32>,
    ) -> Result<&MadePair, RestoreError> {
        if !self.made.contains_key(&index) {
            let pair = img
                .or_else(|| self.images.get(&index).copied())
                .ok_or_else(|| {
                    RestoreError::Inconsistent(format!(
                        "fd {fd} is the slave of pty {index}, whose master is not in the image"
                    ))
                })?;
            let master = match &pair.devpts {
                None => tty::open_ptmx(0).map_err(io_step(
                    format!("opening /dev/ptmx for pty {index} (new pair)"),
                    "open",
                ))?,
                Some(at) => self.open_at_index(&format!("{at}/ptmx"), index, mnt)?,
            };
            let made = make_pair(pair, master)?;
            self.made.insert(index, made);
        }
        Ok(&self.made[&index])
    }
}

/// The kernel's `struct termios2` of a saved termios.
pub fn termios2(t: &PtyTermios) -> Termios2 {
    let mut c_cc = [0u8; stasis_sys::tty::KERNEL_NCCS];
    c_cc.iter_mut().zip(&t.cc).for_each(|(d, s)| *d = *s);
    Termios2 {
        c_iflag: t.iflag,
        c_oflag: t.oflag,
        c_cflag: t.cflag,
        c_lflag: t.lflag,
        c_line: t.line,
        c_cc,
        c_ispeed: t.ispeed,
        c_ospeed: t.ospeed,
    }
}

pub(crate) fn image_termios(t: &Termios2) -> PtyTermios {
    PtyTermios {
        iflag: t.c_iflag,
        oflag: t.c_oflag,
        cflag: t.c_cflag,
        lflag: t.c_lflag,
        line: t.c_line,
        cc: t.c_cc.to_vec(),
        ispeed: t.c_ispeed,
        ospeed: t.c_ospeed,
    }
}

impl Made<'_> {
    /// A new master of index `index` from `ptmx`, the `ptmx` of a devpts
    /// instance of the tree's own (in the mount namespace of `mnt`): a new
    /// instance gives the lowest free index, so masters are opened, and
    /// those below `index` kept as spares, until one has it (as CRIU
    /// does); a spare of ours holding it gives it up first.
    fn open_at_index(
        &mut self,
        ptmx: &str,
        index: u32,
        mnt: Option<i32>,
    ) -> Result<OwnedFd, RestoreError> {
        let what = format!("opening {ptmx} for pty {index} (new pair, at its index)");
        self.spares.retain(|(p, i, _)| !(p == ptmx && *i == index));
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
                .open(ptmx)
                .map(OwnedFd::from)
        };
        loop {
            let m = match mnt {
                None => open(),
                Some(pid) => stasis_kernel::ns::in_namespaces_of(
                    pid,
                    &[stasis_kernel::ns::NsKind::Mnt],
                    open,
                )?,
            }
            .map_err(io_step(what.clone(), "open"))?;
            let got = tty::index(m.as_fd()).map_err(io_step(what.clone(), "TIOCGPTN"))?;
            if got == index {
                return Ok(m);
            }
            if got > index {
                return Err(RestoreError::Incompatible(format!(
                    "pty {index} of the devpts instance on {ptmx} is taken (the new master got {got})"
                )));
            }
            self.spares.push((ptmx.to_string(), got, m));
        }
    }
}

/// Makes a new pair in the state of `p` from its new master.
fn make_pair(p: &PtyPair, master: OwnedFd) -> Result<MadePair, RestoreError> {
    let what = |w: &str| format!("{w} of pty {} (new pair)", p.index);
    let m = master.as_fd();
    tty::set_locked(m, false).map_err(io_step(what("unlocking"), "TIOCSPTLCK"))?;
    let keeper = tty::open_peer(m, libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .map_err(io_step(what("opening the slave"), "TIOCGPTPEER"))?;
    let s = keeper.as_fd();
    let t = termios2(&p.termios);
    // The termios, then packet mode, before anything that raises a
    // control status: only the saved one is raised again.
    tty::set_termios(s, &t).map_err(io_step(what("termios"), "TCSETS2"))?;
    tty::set_packet(m, p.packet).map_err(io_step(what("packet mode"), "TIOCPKT"))?;
    raise_before(s, &t, p.pkt_status)
        .map_err(io_step(what("raising its control status"), "ioctl"))?;
    put_back(m, s, &t, (&p.input_lines, &p.input), &p.output)
        .map_err(|e| io_step(what("queueing the saved bytes"), "TIOCSTI")(e))?;
    if p.ldisc != N_TTY {
        tty::set_ldisc(s, p.ldisc).map_err(io_step(what("line discipline"), "TIOCSETD"))?;
    }
    let [ws_row, ws_col, ws_xpixel, ws_ypixel] = p.winsize;
    let ws = Winsize {
        ws_row,
        ws_col,
        ws_xpixel,
        ws_ypixel,
    };
    tty::set_winsize(m, &ws).map_err(io_step(what("window size"), "TIOCSWINSZ"))?;
    tty::set_exclusive(s, p.slave_exclusive)
        .map_err(io_step(what("exclusive mode"), "TIOCEXCL"))?;
    tty::set_exclusive(m, p.master_exclusive)
        .map_err(io_step(what("exclusive mode"), "TIOCEXCL"))?;
    raise_after(s, &t, p.pkt_status, Some(p.stopped_by_ioctl))
        .map_err(io_step(what("raising its control status"), "ioctl"))?;
    tty::set_locked(m, p.locked).map_err(io_step(what("lock"), "TIOCSPTLCK"))?;
    if let Some((uid, gid, mode)) = p.slave_node {
        // The owner first: `fchown` clears set-id bits.
        nix::unistd::fchown(
            s.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(|e| io_step(what("its slave's owner"), "fchown")(e.into()))?;
        nix::sys::stat::fchmod(
            s.as_raw_fd(),
            nix::sys::stat::Mode::from_bits_truncate(mode),
        )
        .map_err(|e| io_step(what("its slave's mode"), "fchmod")(e.into()))?;
    }
    Ok(MadePair {
        master,
        _keeper: keeper,
        locked: p.locked,
    })
}

/// The termios under which saved bytes are pushed into the slave's input
/// (canonical, whatever the saved mode), and the `VLNEXT` byte that escapes
/// each data byte: echo, signals, input mapping and stripping off; flow
/// control bits and characters as saved (changing them would queue a
/// control status on a packet-mode master, or restart stopped output);
/// erase, kill, word-erase and reprint set to a byte never pushed raw; the
/// terminators (`\n`, `VEOF`, `VEOL`, `VEOL2`) as saved.
pub fn inject_termios(t: &Termios2) -> (Termios2, u8) {
    let cc = |i: usize| t.c_cc[i];
    let taken = [
        b'\n',
        cc(libc::VEOF),
        cc(libc::VEOL),
        cc(libc::VEOL2),
        cc(libc::VSTART),
        cc(libc::VSTOP),
    ];
    let mut free = (1u8..=255).filter(|b| !taken.contains(b));
    let (lnext, other) = (free.next().unwrap_or(1), free.next().unwrap_or(2));
    let mut x = *t;
    x.c_iflag &= libc::IXON | libc::IXOFF;
    x.c_lflag &= !(libc::ECHO
        | libc::ECHOE
        | libc::ECHOK
        | libc::ECHONL
        | libc::ECHOCTL
        | libc::ECHOPRT
        | libc::ECHOKE
        | libc::ISIG);
    x.c_lflag |= libc::ICANON | libc::IEXTEN;
    x.c_cc[libc::VLNEXT] = lnext;
    for i in [
        libc::VERASE,
        libc::VKILL,
        libc::VWERASE,
        libc::VREPRINT,
        libc::VDISCARD,
    ] {
        x.c_cc[i] = other;
    }
    (x, lnext)
}

/// The termios under which the rest of the slave's input is read: not
/// canonical, nothing to wait for, nothing mapped.
pub fn drain_termios(t: &Termios2) -> Termios2 {
    let (mut x, _) = inject_termios(t);
    x.c_lflag &= !libc::ICANON;
    x.c_cc[libc::VMIN] = 0;
    x.c_cc[libc::VTIME] = 0;
    x
}

/// The bytes to push, under [`inject_termios`], so that the slave reads
/// `lines` (each as one read returned it) then `rest`: data bytes escaped,
/// terminators raw, an end-of-file for a line without terminator.
pub fn input_plan(t: &Termios2, lnext: u8, lines: &[Vec<u8>], rest: &[u8]) -> Vec<u8> {
    let cc = |i: usize| t.c_cc[i];
    let ends_line = |b: u8| {
        b == b'\n' || b == cc(libc::VEOL) || (b == cc(libc::VEOL2) && t.c_lflag & libc::IEXTEN != 0)
    };
    let mut out = Vec::new();
    let escaped = |data: &[u8], out: &mut Vec<u8>| {
        for &b in data {
            out.extend_from_slice(&[lnext, b]);
        }
    };
    for l in lines {
        match l.split_last() {
            Some((&end, body)) if ends_line(end) => {
                escaped(body, &mut out);
                out.push(end);
            }
            _ => {
                escaped(l, &mut out);
                out.push(cc(libc::VEOF));
            }
        }
    }
    escaped(rest, &mut out);
    out
}

/// Puts saved bytes back: the slave's input (under [`inject_termios`],
/// then the saved termios `t`), and the master's input (raw).
fn put_back(
    m: BorrowedFd<'_>,
    s: BorrowedFd<'_>,
    t: &Termios2,
    (lines, rest): (&[Vec<u8>], &[u8]),
    output: &[u8],
) -> std::io::Result<()> {
    put_back_output(m, s, t, output)?;
    if lines.is_empty() && rest.is_empty() {
        // The termios is the saved one already (and N_NULL, which takes
        // no termios ioctl, holds nothing).
        return Ok(());
    }
    if as_it_comes(t) {
        // The line discipline takes input as it comes (`n_tty`'s
        // `__receive_buf`: raw, or `L_EXTPROC && !preops`; stripping and
        // lower case, the "preops", give the same bytes twice): no line
        // structure, no echo, and no termios change, which on a
        // packet-mode master would raise `TIOCPKT_IOCTL`. What the line
        // discipline cannot hold goes on through the master, into the
        // flip buffers, as it came.
        if !same_termios(&tty::termios(s)?, t) {
            tty::set_termios(s, t)?;
        }
        let all: Vec<u8> = lines.iter().flatten().chain(rest).copied().collect();
        let (held, more) = all.split_at(all.len().min(LDISC_HOLDS));
        tty::inject(s, held)?;
        return write_nonblocking(m, more);
    }
    let (inj, lnext) = inject_termios(t);
    tty::set_termios(s, &inj)?;
    let pushed = tty::inject(s, &input_plan(t, lnext, lines, rest));
    tty::set_termios(s, t)?;
    pushed
}

/// Puts the master's saved input back: what its line discipline holds
/// pushed in (`TIOCSTI`: the master's is always raw), the rest written
/// through the slave with output processing off for that moment, into
/// the master's flip buffers behind it.
fn put_back_output(
    m: BorrowedFd<'_>,
    s: BorrowedFd<'_>,
    t: &Termios2,
    output: &[u8],
) -> std::io::Result<()> {
    let (held, more) = output.split_at(output.len().min(LDISC_HOLDS));
    tty::inject(m, held)?;
    if more.is_empty() {
        return Ok(());
    }
    if t.c_oflag & libc::OPOST == 0 {
        return write_nonblocking(s, more);
    }
    let mut raw = *t;
    raw.c_oflag &= !libc::OPOST;
    tty::set_termios(s, &raw)?;
    let written = write_nonblocking(s, more);
    tty::set_termios(s, t)?;
    written
}

/// Writes all of `data` to `fd` without blocking (its description made
/// non-blocking for that moment if it was not): the bytes must fit in the
/// pair's flip buffers, as they did at the dump.
fn write_nonblocking(fd: BorrowedFd<'_>, data: &[u8]) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let flags = fdops::status_flags(fd)?;
    if flags & libc::O_NONBLOCK == 0 {
        fdops::set_status_flags(fd, flags | libc::O_NONBLOCK)?;
    }
    let mut rest = data;
    let written = loop {
        if rest.is_empty() {
            break Ok(());
        }
        match nix::unistd::write(fd, rest) {
            Ok(0) | Err(nix::errno::Errno::EAGAIN) => {
                break Err(std::io::Error::other(format!(
                    "no room for {} more queued bytes in the pair's buffers",
                    rest.len()
                )))
            }
            Ok(k) => rest = &rest[k..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => break Err(e.into()),
        }
    };
    if flags & libc::O_NONBLOCK == 0 {
        fdops::set_status_flags(fd, flags)?;
    }
    written
}

/// Most bytes a line discipline holds (`N_TTY_BUF_SIZE - 1`).
const LDISC_HOLDS: usize = N_TTY_BUF_SIZE - 1;

/// Most bytes saved each way (the line discipline's and the flip
/// buffers').
const QUEUE_MAX: usize = 1 << 20;

/// Whether the slave's line discipline takes input as it comes, each byte
/// as itself (`n_tty`: `EXTPROC`, or raw: no input processing, no
/// canonical mode, signals, echo or flow control), so that what waits
/// beyond what it holds can be read and written back unchanged.
fn as_it_comes(t: &Termios2) -> bool {
    let processed_i = libc::ISTRIP
        | libc::IUCLC
        | libc::IGNCR
        | libc::ICRNL
        | libc::INLCR
        | libc::IXON
        | libc::PARMRK;
    let processed_l = libc::ICANON | libc::ISIG | libc::ECHO;
    t.c_lflag & libc::EXTPROC != 0 || (t.c_iflag & processed_i == 0 && t.c_lflag & processed_l == 0)
}

fn same_termios(a: &Termios2, b: &Termios2) -> bool {
    (
        a.c_iflag, a.c_oflag, a.c_cflag, a.c_lflag, a.c_line, a.c_cc, a.c_ispeed, a.c_ospeed,
    ) == (
        b.c_iflag, b.c_oflag, b.c_cflag, b.c_lflag, b.c_line, b.c_cc, b.c_ispeed, b.c_ospeed,
    )
}

/// Whether the kernel counts `t` as flow control for packet mode
/// (`pty_set_termios`: `IXON` with ^S and ^Q).
fn flow_on(t: &Termios2) -> bool {
    t.c_iflag & libc::IXON != 0 && t.c_cc[libc::VSTOP] == 0o23 && t.c_cc[libc::VSTART] == 0o21
}

/// Raises the control statuses of `status` that must come while the
/// queues are empty (a packet-mode master; termios `t` in force):
/// `TIOCPKT_FLUSHREAD` by flushing the slave's input, `TIOCPKT_FLUSHWRITE`
/// its output (the master's flip buffers), `TIOCPKT_IOCTL` by a
/// termios change in `EXTPROC` mode (turned on and off again if off: that
/// resets the line state of the empty input only).
fn raise_before(s: BorrowedFd<'_>, t: &Termios2, status: u8) -> std::io::Result<()> {
    if status & TIOCPKT_FLUSHREAD != 0 {
        tty::flush(s, TCIFLUSH)?;
    }
    if status & TIOCPKT_FLUSHWRITE != 0 {
        // Drops what waits in the master's flip buffers: empty now.
        tty::flush(s, TCOFLUSH)?;
    }
    if status & TIOCPKT_IOCTL != 0 {
        if t.c_lflag & libc::EXTPROC != 0 {
            tty::set_termios(s, t)?;
        } else {
            let mut x = *t;
            x.c_lflag |= libc::EXTPROC;
            tty::set_termios(s, &x)?;
            tty::set_termios(s, t)?;
        }
    }
    Ok(())
}

/// Raises the rest of `status` (its queues put back):
/// `TIOCPKT_DOSTOP`/`NOSTOP` by a flow control change and back, `TIOCPKT_START` by stopping and restarting
/// output, `TIOCPKT_STOP` by restarting and stopping it: with the START
/// and STOP characters (`IXON`), or with `TCOON`/`TCOOFF` (`by_ioctl`:
/// which one; `None`: on the dumped pair, stopped one way or the other,
/// whichever restarts it). Returns whether `TCOOFF` stopped it.
fn raise_after(
    s: BorrowedFd<'_>,
    t: &Termios2,
    status: u8,
    by_ioctl: Option<bool>,
) -> std::io::Result<bool> {
    if status & (TIOCPKT_DOSTOP | TIOCPKT_NOSTOP) != 0 {
        // The status says the flow control the termios has now.
        let mut x = *t;
        if flow_on(t) {
            x.c_cc[libc::VSTOP] = 0;
        } else {
            x.c_iflag |= libc::IXON;
            x.c_cc[libc::VSTART] = 0o21;
            x.c_cc[libc::VSTOP] = 0o23;
        }
        tty::set_termios(s, &x)?;
        tty::set_termios(s, t)?;
    }
    if status & TIOCPKT_START != 0 {
        tty::flow(s, TCOOFF)?;
        tty::flow(s, TCOON)?;
    }
    let mut stopped_by_ioctl = false;
    if status & TIOCPKT_STOP != 0 {
        let (start, stop) = (t.c_cc[libc::VSTART], t.c_cc[libc::VSTOP]);
        let chars = t.c_iflag & libc::IXON != 0
            && t.c_lflag & libc::EXTPROC == 0
            && start != 0
            && stop != 0
            && start != stop;
        let mut done = false;
        if chars && by_ioctl != Some(true) {
            // Restarted by the START character unless `TCOOFF` stopped it.
            tty::inject(s, &[start])?;
            if by_ioctl == Some(false) || writable(s)? {
                tty::inject(s, &[stop])?;
                done = true;
            }
        }
        if !done {
            // Stopped the other way: TCOOFF (a no-op if it was), TCOON
            // restarts it (START), TCOOFF stops it (STOP).
            tty::flow(s, TCOOFF)?;
            tty::flow(s, TCOON)?;
            tty::flow(s, TCOOFF)?;
            stopped_by_ioctl = true;
        }
    }
    Ok(stopped_by_ioctl)
}

/// Whether the slave's output is not stopped (`POLLOUT`: a stopped pty has
/// no room).
fn writable(s: BorrowedFd<'_>) -> std::io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(s, PollFlags::POLLOUT)];
    poll(&mut fds, PollTimeout::ZERO).map_err(std::io::Error::from)?;
    Ok(fds[0]
        .revents()
        .unwrap_or(PollFlags::empty())
        .contains(PollFlags::POLLOUT))
}

/// The `tty-index:` line of a master's fdinfo.
pub fn master_index(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.strip_prefix("tty-index:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Saves the pair of the master `fd` (once; a second fd of the same
/// master gets the same image).
fn save_master(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<PtyPair, SaveError> {
    let n = fd.fd;
    let refuse = |why: String| fd.unsupported(format!("fd {n} is a pty master: {why}"));
    if fd.flags & libc::O_ACCMODE.unsigned_abs() != libc::O_RDWR.unsigned_abs() {
        return Err(refuse("it is not open read-write".into()));
    }
    let master = pidfd::pidfd_getfd(fd.pidfd, n)?;
    let m = master.as_fd();
    let io = |what: &'static str| {
        let pid = fd.pid;
        move |source: std::io::Error| SaveError::Proc {
            pid,
            file: format!("fd/{n} ({what})"),
            source,
        }
    };
    let index = tty::index(m).map_err(io("TIOCGPTN"))?;
    if let Some(p) = cx.ptys.pairs.get(&index) {
        return Ok(p.clone());
    }
    let t = tty::termios(m).map_err(io("TCGETS2"))?;
    let state = tty::poll_now(m).map_err(io("poll"))?;
    let packet = tty::packet(m).map_err(io("TIOCGPKT"))?;
    let master_ldisc = tty::ldisc(m).map_err(io("TIOCGETD"))?;
    if master_ldisc != N_TTY {
        return Err(refuse(format!("it uses line discipline {master_ldisc}; a master stasis restores uses N_TTY (0), the only one a master's reads and writes go through")));
    }
    // The devpts instance of the pair: its index means a pair of it only.
    let inst = crate::pty_census::instance_of_end(
        fd.pid,
        &crate::save::proc_path(fd.pid, &format!("fd/{n}")),
        fd.link,
        fd.meta,
    );
    let census = cx.ptys.census.get_or_insert_with(Census::take);
    let slave_held = cx.ptys.in_flight_slaves.contains(&index)
        || census
            .holders_in(index, inst, &[])
            .iter()
            .any(|h| matches!(h.2, End::Slave(_)));
    if !state.hangup && !slave_held {
        return Err(refuse(format!("its slave /dev/pts/{index} has never been opened: the bytes queued to it can only be read through a slave, and the kernel hangs the master up when the last slave closes (TTY_OTHER_CLOSED, undone only by opening a slave again), so the dump would change the pair; dump once the slave is open")));
    }
    if stasis_kernel::probe::effective_caps() & (1 << stasis_sys::CAP_SYS_ADMIN) == 0 {
        // Without it TIOCSTI fails, and bytes read could not be put back.
        return Err(refuse(
            "putting its queued bytes back (TIOCSTI) needs CAP_SYS_ADMIN; run stasis as root"
                .into(),
        ));
    }
    let locked = tty::locked(m).map_err(io("TIOCGPTLCK"))?;
    if locked {
        tty::set_locked(m, false).map_err(io("TIOCSPTLCK"))?;
    }
    let slave = tty::open_peer(m, libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC);
    if locked {
        tty::set_locked(m, true).map_err(io("TIOCSPTLCK"))?;
    }
    let slave = slave.map_err(io("TIOCGPTPEER"))?;
    let s = slave.as_fd();
    let node =
        nix::sys::stat::fstat(s.as_raw_fd()).map_err(|e| io("fstat")(std::io::Error::from(e)))?;
    let devpts = instance_of(fd.pid, node.st_dev).map_err(&refuse)?;
    let ldisc = tty::ldisc(s).map_err(io("TIOCGETD"))?;
    if ldisc != N_TTY && ldisc != N_NULL {
        return Err(refuse(format!("its slave uses line discipline {ldisc}; stasis restores N_TTY (0) and N_NULL (27): the others (SLIP, PPP, HDLC, GSM...) hold state of their own (network devices, channels, frames) that the kernel does not give back")));
    }
    let ws = tty::winsize(m).map_err(io("TIOCGWINSZ"))?;
    let master_exclusive = tty::exclusive(m).map_err(io("TIOCGEXCL"))?;
    let slave_exclusive = tty::exclusive(s).map_err(io("TIOCGEXCL"))?;
    if ldisc == N_NULL && packet && state.priority {
        return Err(refuse("a packet-mode control status waits to be read, and its slave uses N_NULL, which takes none of the flush, flow and termios ioctls that would raise it again; read it and dump again".into()));
    }
    // A control status waiting on a packet-mode master is read first (it
    // cannot be peeked, and it comes before any data), then raised again
    // by the same events once the queues are back.
    let pkt_status = if packet && state.priority {
        let b = read_some(m, 1).map_err(io("reading the control status"))?;
        b.and_then(|b| b.first().copied()).unwrap_or(0)
    } else {
        0
    };
    let wanted_flow = pkt_status & (TIOCPKT_DOSTOP | TIOCPKT_NOSTOP);
    let flow_mismatch = wanted_flow != 0
        && (wanted_flow == TIOCPKT_DOSTOP | TIOCPKT_NOSTOP
            || (wanted_flow == TIOCPKT_DOSTOP) != flow_on(&t));
    let stop_start = pkt_status & (TIOCPKT_STOP | TIOCPKT_START) == TIOCPKT_STOP | TIOCPKT_START;
    // More than the master's line discipline holds goes back through the
    // slave: refused before anything is read if it cannot.
    let out_full = tty::queued(m).map_err(io("FIONREAD"))? >= LDISC_HOLDS;
    if out_full && !writable(s).map_err(io("poll"))? {
        return Err(refuse(format!("{LDISC_HOLDS} bytes or more are queued to the master while its slave's output is stopped (or the pair's buffers are full), so what its line discipline cannot hold could not be written back: let the program read them, then dump")));
    }
    if out_full && packet && t.c_lflag & libc::EXTPROC != 0 && t.c_oflag & libc::OPOST != 0 {
        return Err(refuse(format!("{LDISC_HOLDS} bytes or more are queued to a packet-mode master in EXTPROC mode: writing back what its line discipline cannot hold needs a termios change, which would raise TIOCPKT_IOCTL; let the program read them, then dump")));
    }
    let queues = take_queues(m, s, &t, packet, ldisc, pkt_status);
    let raised = queues
        .as_ref()
        .ok()
        .map(|_| raise_after(s, &t, pkt_status, None));
    let (lines, rest, output) = queues.map_err(io("reading queued bytes"))?;
    let stopped_by_ioctl = raised
        .transpose()
        .map_err(io("raising the control status again"))?
        .unwrap_or(false);
    if flow_mismatch || stop_start {
        return Err(refuse(format!("its control status {pkt_status:#x} does not match its termios (flow control on: {}), so it cannot be raised again the same way", flow_on(&t))));
    }
    let held = lines.iter().map(Vec::len).sum::<usize>() + rest.len();
    if held >= LDISC_HOLDS && !as_it_comes(&t) {
        return Err(refuse(format!("{held} bytes are queued to the slave, in a mode that processes input (canonical, echo, signals, flow control or input mapping); its line discipline holds at most {LDISC_HOLDS} and the kernel keeps the rest unprocessed in the pair's flip buffers, which cannot be read without processing (echoing, signalling) them: let the program read them, then dump")));
    }
    if held > QUEUE_MAX || output.len() > QUEUE_MAX {
        return Err(refuse(format!("{held} bytes are queued to the slave and {} to the master; stasis saves at most {QUEUE_MAX} each way", output.len())));
    }
    let holders = cx
        .ptys
        .census
        .get_or_insert_with(Census::take)
        .ctty_holders_in(slave_rdev(index), inst);
    let session = holders.first().map(|&(_, sid, fg)| PtySession {
        sid,
        foreground: fg,
    });
    cx.ptys
        .ctty_of
        .insert(index, holders.iter().map(|h| h.0).collect());
    let pair = PtyPair {
        index,
        termios: image_termios(&t),
        winsize: [ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel],
        locked,
        packet,
        master_exclusive,
        slave_exclusive,
        slave_closed: state.hangup,
        input_lines: lines,
        input: rest,
        output,
        session,
        slave_node: Some((node.st_uid, node.st_gid, node.st_mode & 0o7777)),
        pkt_status,
        stopped_by_ioctl,
        ldisc,
        devpts,
    };
    cx.ptys.pairs.insert(index, pair.clone());
    cx.ptys.instances.insert(index, inst);
    Ok(pair)
}

/// The devpts instance whose device is `dev` (a slave's `st_dev`): `None`
/// if it is the dumper's, else where it is mounted in the mount namespace
/// of `pid` (a devpts of the tree's own, made again there at restore); an
/// instance mounted in neither is refused (why).
fn instance_of(pid: i32, dev: u64) -> Result<Option<String>, String> {
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let point = |info: &str| {
        info.lines().find_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split_whitespace().collect();
            (b.split_whitespace().next() == Some("devpts")
                && f.get(2) == Some(&want.as_str())
                && f.get(3) == Some(&"/"))
            .then(|| f.get(4).map(|s| s.to_string()))
            .flatten()
        })
    };
    let mine = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if point(&mine).is_some() {
        return Ok(None);
    }
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    match point(&theirs) {
        Some(at) => Ok(Some(at)),
        None => Err(format!("its devpts instance (device {want}) is mounted neither in the dumper's mount namespace nor in the tree's; stasis makes a pair again from the ptmx of one of those")),
    }
}

/// Reads the bytes queued each way (the slave's input: canonical lines and
/// the rest; the master's input) and puts them back at once.
#[allow(clippy::type_complexity)]
fn take_queues(
    m: BorrowedFd<'_>,
    s: BorrowedFd<'_>,
    t: &Termios2,
    packet: bool,
    ldisc: u8,
    pkt_status: u8,
) -> std::io::Result<(Vec<Vec<u8>>, Vec<u8>, Vec<u8>)> {
    if ldisc == N_NULL || as_it_comes(t) {
        // N_NULL holds nothing (its reads fail). In EXTPROC or raw mode
        // input is taken as it comes and read whole without a termios
        // change; each read moves on what waits in the flip buffers.
        let mut rest = Vec::new();
        if ldisc != N_NULL {
            while let Some(b) = read_some(s, N_TTY_BUF_SIZE)? {
                if b.is_empty() || rest.len() > QUEUE_MAX {
                    break;
                }
                rest.extend_from_slice(&b);
            }
        }
        let output = read_master(m, packet);
        raise_before(s, t, pkt_status)?;
        let back = put_back(m, s, t, (&[], &rest), output.as_deref().unwrap_or(&[]));
        let output = output?;
        back?;
        return Ok((Vec::new(), rest, output));
    }
    let mut lines = Vec::new();
    if t.c_lflag & libc::ICANON != 0 {
        // One line per read; an empty one is an end-of-file.
        while let Some(l) = read_some(s, N_TTY_BUF_SIZE)? {
            lines.push(l);
            if lines.len() > N_TTY_BUF_SIZE {
                break;
            }
        }
    }
    tty::set_termios(s, &drain_termios(t))?;
    let mut rest = Vec::new();
    while let Some(b) = read_some(s, N_TTY_BUF_SIZE).transpose() {
        let b = b?;
        if b.is_empty() || rest.len() > N_TTY_BUF_SIZE {
            break;
        }
        rest.extend_from_slice(&b);
    }
    let output = read_master(m, packet);
    // Back under the saved termios for the statuses that need the input
    // empty (a flush, an EXTPROC change), then the bytes.
    tty::set_termios(s, t)?;
    raise_before(s, t, pkt_status)?;
    let back = put_back(m, s, t, (&lines, &rest), output.as_deref().unwrap_or(&[]));
    let output = output?;
    back?;
    Ok((lines, rest, output))
}

/// One `read` of up to `max` bytes (`None`: nothing to read, `EAGAIN`).
fn read_some(fd: BorrowedFd<'_>, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; max];
    loop {
        match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut buf) {
            Ok(k) => {
                buf.truncate(k);
                return Ok(Some(buf));
            }
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The bytes the master reads next (without the packet-mode status byte
/// of each read). The master's description is the program's, maybe
/// blocking: only what `FIONREAD` says is there is read.
fn read_master(m: BorrowedFd<'_>, packet: bool) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    while tty::poll_now(m)?.readable {
        let n = tty::queued(m)?;
        if n == 0 || out.len() > QUEUE_MAX {
            break;
        }
        let Some(b) = read_some(m, n + usize::from(packet))? else {
            break;
        };
        out.extend_from_slice(if packet {
            b.get(1..).unwrap_or(&[])
        } else {
            &b
        });
    }
    Ok(out)
}

/// Refuses what a restore could not rebuild: a slave whose master is
/// outside the tree, a pair or controlling terminal shared with a process
/// outside it, a session leader without a slave fd of its terminal.
pub fn check_external(cx: &mut SaveCtx, tree: &[i32]) -> Result<(), SaveError> {
    mark_hung_up(cx);
    crate::shell_job::mark_external(cx, tree)?;
    let p = &cx.ptys;
    for &(pid, fd, index) in &p.slaves {
        if !p.pairs.contains_key(&index) {
            return Err(SaveError::Unsupported {
                pid,
                what: format!("fd {fd} is /dev/pts/{index}, a terminal whose master is not held by the dumped tree (an interactive terminal, say); dump it with --shell-job if it is its shell's job on that terminal (the restore then puts it on its own terminal), redirect the program's stdin/stdout/stderr to files (or /dev/null), or dump the process holding the master (/dev/ptmx) with it"),
            });
        }
    }
    let holder_of = |index: u32| {
        p.slaves
            .iter()
            .find(|s| s.2 == index)
            .map_or(tree[0], |s| s.0)
    };
    let census = p.census.as_ref();
    for (index, pair) in &p.pairs {
        let inst = p.instances.get(index).copied().unwrap_or(0);
        let outsiders = census
            .map(|c| c.holders_in(*index, inst, tree))
            .unwrap_or_default();
        if let Some(&(pid, fd, _)) = outsiders.first() {
            return Err(SaveError::Unsupported {
                pid: holder_of(*index),
                what: format!("pty {index} is also held by process {pid} (fd {fd}), which is outside the dumped tree (dump their common ancestor)"),
            });
        }
        let outside = p
            .ctty_of
            .get(index)
            .and_then(|v| v.iter().find(|x| !tree.contains(x)));
        if let (Some(out), Some(s)) = (outside, &pair.session) {
            return Err(SaveError::Unsupported {
                pid: holder_of(*index),
                what: format!("pty {index} is the controlling terminal of session {}, which process {out} outside the dumped tree belongs to (dump the session's leader with it)", s.sid),
            });
        }
    }
    for &(pid, fd, index) in &p.current_ttys {
        if !p.pairs.contains_key(&index) {
            return Err(SaveError::Unsupported {
                pid,
                what: format!("fd {fd} is /dev/tty, whose terminal (pts {index}) has its master outside the dumped tree (an interactive terminal, say); dump it with --shell-job if it is its shell's job on that terminal, or dump the process holding the master with it"),
            });
        }
    }
    Ok(())
}

/// Slaves of pairs whose master no process holds (closed: the terminal
/// is hung up, zdtm's pty04) become [`FdKind::PtyHungUp`]. A census of
/// the system says who holds masters (the one the dump took, or one taken
/// now: only when the tree holds a slave without its master).
fn mark_hung_up(cx: &mut SaveCtx) {
    let orphans: Vec<(i32, i32, u32)> = cx
        .ptys
        .slaves
        .iter()
        .copied()
        .filter(|s| !cx.ptys.pairs.contains_key(&s.2))
        .collect();
    if orphans.is_empty() {
        return;
    }
    if cx.ptys.census.is_none() {
        cx.ptys.census = Some(Census::take());
    }
    let Some(census) = cx.ptys.census.as_ref() else {
        return;
    };
    let closed: Vec<u32> = orphans
        .iter()
        .map(|s| s.2)
        .filter(|&i| !census.holders(i, &[]).iter().any(|h| h.2 == End::Master))
        .collect();
    let mut marked = Vec::new();
    for &(pid, fd, index) in orphans.iter().filter(|s| closed.contains(&s.2)) {
        if let Some(img) = cx.fd_image_mut(pid, fd) {
            img.kind = FdKind::PtyHungUp { index };
            marked.push((pid, fd));
        }
    }
    // (One not found stays a slave without its master: refused.)
    cx.ptys.slaves.retain(|s| !marked.contains(&(s.0, s.1)));
}

/// The session of a saved pty that process `pid` leads, if any.
fn session_led_by<'i>(cx: &'i RestoreCtx<'_>, pid: i32) -> Option<(Ctty<'i>, &'i PtySession)> {
    let pair = cx.ptys.images.iter().find_map(|(i, pair)| {
        pair.session
            .as_ref()
            .filter(|s| s.sid == pid)
            .map(|s| (Ctty::Pair(*i), s))
    });
    pair.or_else(|| {
        cx.ptys
            .lines
            .iter()
            .find(|l| l.2.sid == pid)
            .map(|&(path, rdev, s)| (Ctty::Line { path, rdev }, s))
    })
}

/// A session's controlling terminal.
enum Ctty<'i> {
    /// A saved pair, by index.
    Pair(u32),
    /// A virtual console or serial line (`crate::ttyline`).
    Line { path: &'i str, rdev: u64 },
}

/// The session leader `p` took its terminal back when it was forked
/// ([`take_ctty`]); once its fds exist (and the process groups), the
/// terminal gets back its foreground group when it was another than the
/// leader's (`TIOCSPGRP` through `/dev/tty`). The `/dev/tty` fds of
/// every process of a session whose terminal came back (slaves of the
/// pair, or fds on the line, until now) are opened again as `/dev/tty`:
/// the members were forked after their leader took it, so it is theirs.
///
/// `pid`, `pgid`, `sid`: the process's; `fds`: its saved fds.
pub fn restore_ctty<R: Remote>(
    cx: &RestoreCtx<'_>,
    r: &mut R,
    at: Scratch,
    (pid, pgid, sid): (i32, i32, i32),
    fds: &[FdImage],
) -> Result<(), RestoreError> {
    if pid != sid {
        if session_led_by(cx, sid).is_some() {
            reopen_current_ttys(r, at, fds)?;
        }
        return Ok(());
    }
    let Some((_, s)) = session_led_by(cx, pid) else {
        return Ok(());
    };
    if s.foreground != pgid && s.foreground > 0 {
        let g = s.foreground;
        let what = || format!("setting the foreground group {g} of its terminal");
        let n = open_dev_tty(r, at, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC)
            .map_err(step(what()))?;
        let set = r
            .put(at.structs, &g.to_le_bytes())
            .and_then(|a| r.sys("ioctl(TIOCSPGRP)", libc::SYS_ioctl, &[n, TIOCSPGRP, a]));
        let closed = r.sys("close", libc::SYS_close, &[n]);
        set.map_err(step(what()))?;
        closed.map_err(step(what()))?;
    }
    reopen_current_ttys(r, at, fds)
}

/// Opens `/dev/tty` (the process's controlling terminal) in the process
/// behind `r`; returns the fd there.
fn open_dev_tty<R: Remote>(
    r: &mut R,
    at: Scratch,
    flags: i32,
) -> Result<u64, stasis_kernel::KernelError> {
    let path = r.put(at.structs, b"/dev/tty\0")?;
    r.sys(
        "openat",
        libc::SYS_openat,
        &[
            stasis_kernel::sarg(i64::from(libc::AT_FDCWD)),
            path,
            u64::from(flags.unsigned_abs()),
        ],
    )
}

/// Makes the saved pty (or virtual console, or serial line) whose session
/// process `sid` led its controlling terminal, right after it made its
/// session (in the tree's creation, before it forks: the processes it
/// forks then have the terminal as theirs too, as in a session whose
/// members were forked after the leader took it). Through a slave (or
/// the line) opened for that moment, at `spare`. Nothing when it led no
/// session of a saved terminal.
pub fn take_ctty<R: Remote>(
    cx: &mut RestoreCtx<'_>,
    r: &mut R,
    at: Scratch,
    sid: i32,
    (transport, remote_transport, spare): (&OwnedFd, u64, i32),
) -> Result<(), RestoreError> {
    let Some((ctty, _)) = session_led_by(cx, sid) else {
        return Ok(());
    };
    let is_line = matches!(ctty, Ctty::Line { .. });
    let slave = match ctty {
        Ctty::Pair(index) => cx
            .ptys
            .pair(index, None, spare, cx.mount_ns_of)?
            .open_slave_with(libc::O_RDWR | libc::O_NOCTTY)?,
        Ctty::Line { path, rdev } => {
            crate::ttyline::open_line(path, rdev, libc::O_RDWR | libc::O_NOCTTY)?
        }
    };
    crate::restore::plant(
        r,
        at,
        transport,
        remote_transport,
        (slave.as_fd(), spare, true),
    )?;
    let n = u64::from(spare.unsigned_abs());
    let set = r
        .sys("ioctl(TIOCSCTTY)", libc::SYS_ioctl, &[n, TIOCSCTTY, 0])
        .map_err(step("making the pty the controlling terminal"));
    let closed = r.sys("close", libc::SYS_close, &[n]);
    set?;
    closed.map_err(step(
        "closing the slave opened to set the controlling terminal",
    ))?;
    if is_line {
        cx.ptys.lines_held.push(slave);
    }
    Ok(())
}

/// Each `/dev/tty` fd of `p` (a slave of its pair, or an fd on the line,
/// until now) opened again as `/dev/tty`, now that the process has its
/// terminal back, at its number.
fn reopen_current_ttys<R: Remote>(
    r: &mut R,
    at: Scratch,
    fds: &[FdImage],
) -> Result<(), RestoreError> {
    for f in fds.iter().filter(|f| {
        matches!(
            f.kind,
            FdKind::CurrentTty { .. } | FdKind::LineDevTty { .. }
        )
    }) {
        let what = || format!("opening /dev/tty again as fd {}", f.fd);
        let flags = reopen_flags(f.flags) | libc::O_NOCTTY | libc::O_CLOEXEC;
        let n = open_dev_tty(r, at, flags).map_err(step(what()))?;
        let cloexec = if f.cloexec { libc::O_CLOEXEC } else { 0 };
        let target = u64::from(f.fd.unsigned_abs());
        let duped = r.sys(
            "dup3",
            libc::SYS_dup3,
            &[n, target, u64::from(cloexec.unsigned_abs())],
        );
        let closed = r.sys("close", libc::SYS_close, &[n]);
        duped.map_err(step(what()))?;
        closed.map_err(step(what()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::pty_census::{ctty_fields, encode_dev};
    use stasis_kernel::remote::Recorder;

    use super::*;

    fn live_pair() -> (OwnedFd, OwnedFd) {
        let m = tty::open_ptmx(libc::O_NONBLOCK).unwrap();
        tty::set_locked(m.as_fd(), false).unwrap();
        let s =
            tty::open_peer(m.as_fd(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC).unwrap();
        (m, s)
    }

    fn read_all(fd: BorrowedFd<'_>) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| read_some(fd, N_TTY_BUF_SIZE).unwrap()).collect()
    }

    #[test]
    fn ends_devices_and_proc_fields() {
        assert_eq!(end_of(libc::makedev(5, 2)), Some(End::Master));
        assert_eq!(end_of(libc::makedev(5, 0)), None, "/dev/tty");
        assert_eq!(end_of(libc::makedev(4, 1)), None, "/dev/tty1");
        for i in [0, 7, 255, 256, 2047] {
            assert_eq!(end_of(slave_rdev(i)), Some(End::Slave(i)));
        }
        assert_eq!(end_of(libc::makedev(144, 0)), None);
        // /dev/pts/0 is tty_nr 34816 in /proc/PID/stat; /dev/pts/300 too.
        assert_eq!(encode_dev(slave_rdev(0)), 34816);
        assert_eq!(encode_dev(slave_rdev(300)), (137 << 8) | 44);
        let stat = "42 (a (b) c) S 1 40 40 34817 41 4194560 9 0";
        assert_eq!(ctty_fields(stat), Some((40, 34817, 41)));
        assert_eq!(ctty_fields("42 (x) S 1 40"), None);
        let info = "pos:\t0\nflags:\t02\nmnt_id:\t25\nino:\t2\ntty-index:\t17\n";
        assert_eq!(master_index(info), Some(17));
        assert_eq!(master_index("pos:\t0\n"), None);
    }

    #[test]
    fn injection_escapes_data_and_keeps_terminators_and_flow_control() {
        let mut t = Termios2 {
            c_lflag: libc::ICANON | libc::ECHO | libc::ECHOE | libc::ISIG,
            c_iflag: libc::ICRNL | libc::IXON | libc::ISTRIP,
            ..Termios2::default()
        };
        t.c_cc[libc::VEOF] = 4;
        t.c_cc[libc::VEOL] = b'#';
        t.c_cc[libc::VEOL2] = b'@';
        t.c_cc[libc::VSTART] = 0o21;
        t.c_cc[libc::VSTOP] = 0o23;
        t.c_cc[libc::VERASE] = 0o177;
        let (x, lnext) = inject_termios(&t);
        assert_eq!(x.c_lflag, libc::ICANON | libc::IEXTEN, "echo, signals off");
        assert_eq!(x.c_iflag, libc::IXON, "only flow control kept");
        assert_eq!(x.c_cc[libc::VLNEXT], lnext);
        assert!(![b'\n', 4, b'#', b'@', 0o21, 0o23].contains(&lnext));
        let erase = x.c_cc[libc::VERASE];
        assert!(erase != lnext && ![b'\n', 4, b'#', b'@'].contains(&erase));
        assert_eq!(drain_termios(&t).c_lflag & libc::ICANON, 0);
        // '@' is no terminator without IEXTEN: an end-of-file follows it.
        let lines = [b"a\n".to_vec(), b"b#".to_vec(), vec![], b"c@".to_vec()];
        let plan = input_plan(&t, lnext, &lines, b"d\n");
        let l = lnext;
        assert_eq!(
            plan,
            [l, b'a', b'\n', l, b'b', b'#', 4, l, b'c', l, b'@', 4, l, b'd', l, b'\n']
        );
    }

    #[test]
    fn queued_bytes_are_read_and_put_back_exactly() {
        let (m, s) = live_pair();
        let mut t = tty::termios(s.as_fd()).unwrap();
        t.c_cc[libc::VEOL] = b'#';
        tty::set_termios(s.as_fd(), &t).unwrap();
        // Typed at the terminal (processed now, with echo): lines ended by
        // '\n', EOF (twice: an empty line), VEOL; an escaped '\n' (^V) in a
        // line; an erase; a line still being typed.
        tty::inject(s.as_fd(), b"one\ntwo\x04\x04three#esc\x16\naped\nhalx\x7f").unwrap();
        tty::inject(s.as_fd(), b"f").unwrap();
        // The master holds the echo (read to the end, which waits for it
        // all, and pushed back) and then more.
        let mut queued = read_all(m.as_fd()).concat();
        assert!(queued.starts_with(b"one\r\n"), "{queued:?}");
        queued.extend_from_slice(b"from the slave");
        tty::inject(m.as_fd(), &queued).unwrap();
        let (lines, rest, output) = take_queues(m.as_fd(), s.as_fd(), &t, false, N_TTY, 0).unwrap();
        let want: Vec<&[u8]> = vec![b"one\n", b"two", b"", b"three#", b"esc\naped\n"];
        assert_eq!(lines, want);
        assert_eq!(rest, b"half");
        assert_eq!(output, queued);
        // Put back: the same reads again, no new echo, the termios as it was.
        assert_eq!(tty::termios(s.as_fd()).unwrap(), t);
        assert_eq!(read_all(s.as_fd()), want);
        assert_eq!(read_all(m.as_fd()).concat(), output, "no new echo");
        tty::inject(s.as_fd(), b"\n").unwrap();
        assert_eq!(read_all(s.as_fd()), [b"half\n"]);
    }

    fn image(t: &Termios2) -> PtyPair {
        PtyPair {
            index: 9,
            termios: image_termios(t),
            winsize: [40, 132, 1, 2],
            locked: true,
            packet: true,
            master_exclusive: false,
            slave_exclusive: true,
            slave_closed: false,
            input_lines: vec![],
            input: b"raw\x03\x11bytes".to_vec(),
            output: b"to the master".to_vec(),
            session: None,
            slave_node: Some((4242, 4343, 0o600)),
            pkt_status: 0,
            stopped_by_ioctl: false,
            ldisc: 0,
            devpts: None,
        }
    }

    #[test]
    fn a_pair_is_made_in_its_saved_state() {
        let (_m, s) = live_pair();
        let mut t = tty::termios(s.as_fd()).unwrap();
        t.c_lflag &= !(libc::ICANON | libc::ECHO);
        t.c_cc[libc::VMIN] = 1;
        let p = image(&t);
        let made = make_pair(&p, tty::open_ptmx(0).unwrap()).unwrap();
        let m = made.master.as_fd();
        fdops::set_status_flags(m, libc::O_NONBLOCK).unwrap();
        assert!(tty::locked(m).unwrap() && tty::packet(m).unwrap());
        let img = FdImage {
            fd: 0,
            flags: libc::O_RDWR.unsigned_abs() | libc::O_NONBLOCK.unsigned_abs(),
            cloexec: false,
            shared_id: None,
            locks: vec![],
            owner: None,
            kind: FdKind::PtySlave { index: 9 },
        };
        let s = made.open_slave(&img).unwrap();
        assert!(tty::locked(m).unwrap(), "locked again");
        assert_eq!(tty::termios(s.as_fd()).unwrap(), t);
        let ws = tty::winsize(s.as_fd()).unwrap();
        assert_eq!(
            [ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel],
            p.winsize
        );
        assert!(tty::exclusive(s.as_fd()).unwrap() && !tty::exclusive(m).unwrap());
        // The slave's node has its saved owner and mode (zdtm's pty01).
        let st = nix::sys::stat::fstat(s.as_raw_fd()).unwrap();
        assert_eq!(
            (st.st_uid, st.st_gid, st.st_mode & 0o7777),
            (4242, 4343, 0o600)
        );
        // ^C and ^Q reached the input as data: no signal, no flow control.
        assert_eq!(read_all(s.as_fd()).concat(), p.input);
        let mut packet = vec![0u8];
        packet.extend_from_slice(&p.output);
        assert_eq!(read_all(m).concat(), packet, "TIOCPKT_DATA, then the bytes");
    }

    #[test]
    fn canonical_lines_come_back_line_by_line() {
        let (_m, s) = live_pair();
        let t = tty::termios(s.as_fd()).unwrap();
        let mut p = image(&t);
        (p.locked, p.packet) = (false, false);
        p.input_lines = vec![b"a\n".to_vec(), vec![], b"b".to_vec()];
        p.input = b"c".to_vec();
        let made = make_pair(&p, tty::open_ptmx(0).unwrap()).unwrap();
        let s = made.keeper_for_tests();
        assert_eq!(read_all(s), [&b"a\n"[..], b"", b"b"]);
        tty::inject(s, b"\n").unwrap();
        assert_eq!(read_all(s), [b"c\n"]);
    }

    #[test]
    fn a_session_leader_takes_its_terminal_back() {
        let t = Termios2::default();
        let mut p = image(&t);
        p.session = Some(PtySession {
            sid: 100,
            foreground: 102,
        });
        let fd = |n: i32, kind: FdKind| FdImage {
            fd: n,
            flags: 2,
            cloexec: false,
            shared_id: None,
            locks: vec![],
            owner: None,
            kind,
        };
        let fds = [
            fd(3, FdKind::PtyMaster(p.clone())),
            fd(0, FdKind::PtySlave { index: 9 }),
        ];
        let cx = RestoreCtx::new(&[], &[], fds.iter());
        let in_session = |sid, pid, pgid, fds: &[FdImage]| {
            let mut r = Recorder::default();
            restore_ctty(&cx, &mut r, Scratch { structs: 64 }, (pid, pgid, sid), fds).unwrap();
            r
        };
        let leader = |pid, pgid, fds: &[FdImage]| in_session(100, pid, pgid, fds);
        // The leader, another group in the foreground: TIOCSPGRP through
        // /dev/tty, with or without a slave fd of its own.
        for held in [&fds[1..], &fds[..1]] {
            let r = leader(100, 100, held);
            assert_eq!(r.names(), ["openat", "ioctl(TIOCSPGRP)", "close"]);
            assert_eq!(r.writes()[0], b"/dev/tty\0");
            let a = r.scratch() + 64;
            let tty = r.args_of("ioctl(TIOCSPGRP)")[0][0];
            assert_eq!(r.args_of("ioctl(TIOCSPGRP)"), [vec![tty, TIOCSPGRP, a]]);
            assert_eq!(r.writes()[1], 102i32.to_le_bytes());
        }
        // Its own group in the foreground, or not the leader: nothing.
        assert!(leader(100, 102, &fds[1..]).names().is_empty());
        assert!(leader(101, 101, &fds[1..]).names().is_empty());
        // A member of the session holding /dev/tty: opened again at its
        // number (the terminal is its own too); in another session, whose
        // terminal was not saved, nothing.
        let dev_tty = [fd(5, FdKind::CurrentTty { index: 9 })];
        let r = in_session(100, 101, 101, &dev_tty);
        assert_eq!(r.names(), ["openat", "dup3", "close"]);
        assert_eq!(r.writes()[0], b"/dev/tty\0");
        assert_eq!(r.args_of("dup3")[0][1], 5);
        assert!(in_session(200, 201, 201, &dev_tty).names().is_empty());
    }
}
