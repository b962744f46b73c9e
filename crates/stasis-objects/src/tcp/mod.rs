//! Established and half-closed TCP connections (the FINs: `states.rs`),
//! with `TCP_REPAIR` (Linux 3.5+, needs
//! CAP_NET_ADMIN): in repair mode nothing is sent on the wire, so sequence
//! numbers, queues, negotiated options and window can be read, and a new
//! socket can be given them and "connected" without a handshake.
//!
//! At dump ([`SaveCtx::freeze_tcp`]), every connection of the tree is
//! first locked (a drop-all filter), then its owners are *held* (a SIGSTOP
//! queued on each thread, see `sock::SocketGuard`). Once packets already
//! past the lock are through (2 ms after it, which the dump spends reading
//! the processes' areas: [`SaveCtx::read_tcp`]), every connection is put
//! in repair mode, read, and taken out of it again, in one short step with
//! nothing else in it: the network lock
//! alone keeps the state
//! still for the rest of the dump (no packet reaches the connections; the
//! program, frozen, sends nothing). After the dump the lock comes off
//! ([`leave_repair`]); a dump that kills the tree has the guard put the
//! connections back in repair mode and kill their owners
//! ([`kill_owners`]), and a holder keeps them, silent, until the restore
//! ends it ([`release_holders_of`]). At restore, each connection
//! is rebuilt in repair mode ([`restore`]) and made live once every
//! socket of the tree exists ([`RestoreCtx::finish_tcp`]).

mod repair;
mod states;
pub(crate) mod unaccepted;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use stasis_image::manifest::TcpRepair;
use stasis_kernel::{pidfd, sock, KernelError};

use crate::save::{list_fds, read_link, socket_inode};
use crate::socket::is_inet;
use crate::{SaveCtx, SaveError};

pub use repair::PendingTcp;
use repair::{hold_sends, read_window, save, write_window};
pub(crate) use repair::{release_holders_of, restore};
pub(crate) use states::{ended, repairable};
pub use unaccepted::PendingConnect;

/// The connections a dump locked and read, and the guard that puts them
/// back (and continues their held owners) if the dumper dies first.
#[derive(Debug, Default)]
pub struct Repairs {
    socks: Vec<Repaired>,
    /// What repair mode read of each connection, by socket inode.
    saved: HashMap<u64, TcpRepair>,
    guard: Option<sock::SocketGuard>,
    /// When the connections were locked, until they are read
    /// ([`SaveCtx::read_tcp`]).
    locked_at: Option<std::time::Instant>,
    /// The owners [`SaveCtx::freeze_tcp`] held (those not stopped).
    held: Vec<i32>,
}

impl Repairs {
    /// Holds the owners of the connections again (`hold`: the freezer's
    /// [`SaveCtx::freeze_tcp`] was given), before the dump puts any back
    /// in repair mode (to give its send window back): the remote syscalls
    /// run since [`SaveCtx::read_tcp`] took the first holds, and a dumper
    /// dying in repair mode must not let an owner run there. Tells the
    /// guard, which may then give the windows back itself.
    pub fn hold_again(
        &mut self,
        hold: &mut dyn FnMut(&[i32]) -> Result<(), SaveError>,
    ) -> Result<(), SaveError> {
        let Some(g) = &self.guard else {
            return Ok(());
        };
        if self.socks.iter().all(|s| s.held_snd_wnd.is_none()) {
            return Ok(());
        }
        hold(&self.held)?;
        g.set_owners_held(true);
        Ok(())
    }

    /// What [`SaveCtx::freeze_tcp`] read of the connection with inode
    /// `ino`.
    pub(crate) fn saved(&self, ino: u64) -> Option<&TcpRepair> {
        self.saved.get(&ino)
    }
}

/// An established TCP connection of the tree locked by the dump, through
/// a copy of its fd, with what the dump changes on it.
///
/// Entering repair mode forces address reuse on the socket (`sk_reuse =
/// SK_FORCE_REUSE`), and leaving it clears reuse (`SK_NO_REUSE`) whatever
/// `SO_REUSEADDR` the program had set: a connection left so would go to
/// TIME_WAIT, when the program dies, unwilling to share its port, and
/// keep the program's listener from binding that port again (a restart or
/// a restore) for a minute. So the program's `SO_REUSEADDR` is read before
/// and put back after. The network lock (a drop-everything filter) is the
/// other change, removed by [`SaveCtx::unlock_tcp`] or [`leave_repair`]
/// when this dump attached it.
#[derive(Debug)]
pub struct Repaired {
    sock: OwnedFd,
    /// The owner and its fd (for messages).
    pid: i32,
    fd: i32,
    ino: u64,
    /// `SO_REUSEADDR` as the program had it (`None`: could not be read).
    reuseaddr: Option<i32>,
    /// Whether this dump attached the drop-everything filter.
    locked: bool,
    /// Whether the connection is in repair mode.
    in_repair: bool,
    /// The send window the program's connection had, while this dump
    /// holds it at zero (see [`hold_sends`]); put back on release.
    held_snd_wnd: Option<u32>,
    /// Where the guard learns that window, to give it back if we die.
    window_slot: Option<sock::WindowSlot>,
}

impl Repaired {
    /// Takes the connection out of repair mode (no window probe: the peer
    /// has its state already) and puts back the `SO_REUSEADDR` repair mode
    /// changed.
    fn leave_repair(&mut self) {
        if !self.in_repair {
            return;
        }
        let b = self.sock.as_fd();
        if let Err(e) = sock::set_int(
            b,
            libc::IPPROTO_TCP,
            sock::TCP_REPAIR,
            sock::TCP_REPAIR_OFF_NO_WP,
        ) {
            tracing::error!("could not take a TCP socket out of repair mode: {e}");
            return;
        }
        self.in_repair = false;
        if let Some(v) = self.reuseaddr {
            if let Err(e) = sock::set_int(b, libc::SOL_SOCKET, libc::SO_REUSEADDR, v) {
                tracing::error!(
                    "could not put SO_REUSEADDR = {v} back on a TCP socket after repair mode: {e}"
                );
            }
        }
    }

    /// Packets flow again, if this dump stopped them (the filter
    /// `freeze_tcp` attached comes off), and new data may go again.
    fn unlock(&mut self) {
        self.release_sends();
        let b = self.sock.as_fd();
        if self.locked && sock::has_drop_all_filter(b) {
            let _ = sock::detach_filter(b);
        }
        self.locked = false;
    }

    /// Gives the connection back its send window (held at zero since it
    /// was read), through repair mode and out again, before the lock
    /// comes off (so no ack has updated it meanwhile). The rest of the
    /// window stays as it is now (a segment the connection sent since may
    /// have moved what it advertises).
    fn release_sends(&mut self) {
        let Some(snd_wnd) = self.held_snd_wnd.take() else {
            return;
        };
        let b = self.sock.as_fd();
        if let Err(e) = sock::set_int(b, libc::IPPROTO_TCP, sock::TCP_REPAIR, 1) {
            tracing::error!("could not give a TCP connection its send window back (repair mode: {e}); its first window probe will");
            return;
        }
        self.in_repair = true;
        let put = read_window(b).and_then(|mut w| {
            w[1] = snd_wnd;
            w[2] = w[2].max(snd_wnd);
            write_window(b, &w)
        });
        if let Err(e) = put {
            tracing::error!("could not give a TCP connection its send window back ({e}); its first window probe will");
        } else if let Some(slot) = &self.window_slot {
            // Given back, while the lock still keeps packets away.
            slot.note(None);
        }
        self.leave_repair();
    }

    /// Out of repair mode, its send window back, and unlocked.
    fn put_back(&mut self) {
        self.leave_repair();
        self.unlock();
    }
}

/// Puts back what [`SaveCtx::freeze_tcp`] changed on the connections, as
/// the program had them (the tree runs on, or a failed dump releases it).
/// The guard stays: it is told by [`dismiss_guard`], once the tree is let
/// go. (Dropping the [`Repairs`] instead dismisses it.)
pub fn leave_repair(r: &mut Repairs) {
    for s in &mut r.socks {
        s.put_back();
    }
}

/// The tree is let go (`released`), or could not be: the guard is
/// dismissed, or left to put the sockets back and continue any held
/// process as if the dumper had died.
pub fn dismiss_guard(mut r: Repairs, released: bool) {
    if let Some(g) = r.guard.take() {
        if released {
            g.dismiss();
        } else {
            g.abandon();
        }
    }
}

/// After a committed dump that kills the tree: hands the kill to the
/// guard, which puts the connections in repair mode and SIGKILLs the
/// processes that own them; a holder keeps them, silent, until the restore
/// ends it ([`release_holders_of`]; see
/// [`sock::SocketGuard::kill_owners`]); returns once they are signalled.
/// The caller kills the rest of the tree and waits for it.
pub fn kill_owners(mut r: Repairs) {
    if let Some(g) = r.guard.take() {
        g.kill_owners();
    }
    // Our copies close in repair mode: nothing reaches the peers.
    r.socks.clear();
}

/// The established and half-closed TCP connections of `pids`: (pid, fd, inode, a copy).
fn established(
    census: Option<&crate::fd_census::FdCensus>,
    pids: &[i32],
) -> Result<Vec<(i32, i32, u64, OwnedFd)>, SaveError> {
    let mut found: Vec<(i32, i32, u64, OwnedFd)> = Vec::new();
    if let Some(c) = census.filter(|c| c.covers(pids)) {
        for (pid, fd, ino, b) in c.sockets() {
            if is_inet(b, libc::IPPROTO_TCP)
                && sock::tcp_info(b).is_ok_and(|i| states::repairable(i.state))
                && !found.iter().any(|x| x.2 == ino)
            {
                let s = b.try_clone_to_owned().map_err(|source| SaveError::Proc {
                    pid,
                    file: format!("fd/{fd} (a copy)"),
                    source,
                })?;
                found.push((pid, fd, ino, s));
            }
        }
        return Ok(found);
    }
    for &pid in pids {
        let pfd = pidfd::pidfd_open(pid)?;
        for fd in list_fds(pid)? {
            let Ok(link) = read_link(pid, &format!("fd/{fd}")) else {
                continue;
            };
            let Some(ino) = socket_inode(&link) else {
                continue;
            };
            let s = pidfd::pidfd_getfd(&pfd, fd)?;
            let b = s.as_fd();
            if is_inet(b, libc::IPPROTO_TCP)
                && sock::tcp_info(b).is_ok_and(|i| states::repairable(i.state))
            {
                // (Also in flight in a queue read before: once.)
                if !found.iter().any(|x| x.2 == ino) {
                    found.push((pid, fd, ino, s));
                }
            }
        }
    }
    Ok(found)
}

impl SaveCtx {
    /// Locks every established TCP connection of the tree `pids`, holds
    /// their owners (`hold` is given those not in `stopped`, the processes
    /// already stopped before the dump, which stay so anyway). They are
    /// read later, by [`SaveCtx::read_tcp`] (the first
    /// [`SaveCtx::add_process`] calls it, if the caller has not), at least
    /// 2 ms after the lock. The caller may read other state of the frozen
    /// tree meanwhile, but must not run anything in its processes (a
    /// remote syscall): resuming a held thread uses up its SIGSTOP, and a
    /// dumper dying while a connection is in repair mode would then let it
    /// run, its `send` and `recv` failing on that connection.
    ///
    /// Every connection is locked and in repair mode before any of them is
    /// read: two ends of a connection inside the tree must be frozen at the
    /// same instant, or bytes sent by the second after the first was read
    /// would be lost to both images. Holding before repair mode means that
    /// a dumper killed at any instant never lets the program run with a
    /// connection in repair mode (see `sock::SocketGuard`).
    pub fn freeze_tcp(
        &mut self,
        pids: &[i32],
        stopped: &[i32],
        hold: &mut dyn FnMut(&[i32]) -> Result<(), SaveError>,
    ) -> Result<(), SaveError> {
        self.tree_pids = pids.to_vec();
        // The files in flight (`SCM_RIGHTS`) in the queues of the tree's
        // unix sockets, peeked at once (`crate::unix::files_in_flight`).
        let mut flying = Vec::new();
        let census = self.fd_census.take();
        crate::socket::each_socket(census.as_ref(), pids, |pid, fd, _, s| {
            for f in crate::unix::files_in_flight(self, s, 4) {
                flying.push((pid, fd, f));
            }
        });
        self.fd_census = census;
        // A pty slave in flight is open though no process holds it.
        for (_, _, f) in &flying {
            let rdev = nix::sys::stat::fstat(f.as_raw_fd()).map_or(0, |s| s.st_rdev);
            if let Some(crate::pty::End::Slave(i)) = crate::pty::end_of(rdev) {
                self.ptys.in_flight_slaves.insert(i);
            }
        }
        if self.tcp_close {
            // Saved as closed: nothing to stop or read.
            return Ok(());
        }
        let mut found = established(self.fd_census.as_ref(), pids)?;
        // Connections in flight are the tree's too: locked and read with
        // the others, in the name of the socket's holder.
        for (pid, fd, f) in flying {
            let c = f.as_fd();
            if !is_inet(c, libc::IPPROTO_TCP)
                || !sock::tcp_info(c).is_ok_and(|i| states::repairable(i.state))
            {
                continue;
            }
            if let Some(ino) = crate::socket::inode_of(c) {
                if !found.iter().any(|x| x.2 == ino) {
                    found.push((pid, fd, ino, f));
                }
            }
        }
        // Nothing may move between two connections' snapshots: a segment
        // processed after the receiver's queue was read but before the
        // sender's was (the sender then drops the bytes it sees acked)
        // would be in neither. Every connection first drops whatever
        // reaches it (peers retransmit it after the dump), like CRIU's
        // network lock; then, once packets already being processed are
        // through, each goes into repair mode and is read.
        if found.is_empty() {
            return Ok(());
        }
        // SO_REUSEADDR before repair mode forces it; which filters this
        // dump attaches; and the guard, before anything is changed.
        let before: Vec<(Option<i32>, bool)> = found
            .iter()
            .map(|(_, _, _, s)| {
                (
                    sock::get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).ok(),
                    !sock::has_filter(s.as_fd()),
                )
            })
            .collect();
        let guarded: Vec<sock::Guarded> = found
            .iter()
            .zip(&before)
            .map(|((_, _, _, s), (reuse, lock))| sock::Guarded {
                fd: s.as_raw_fd(),
                detach_filter: *lock,
                leave_repair: true,
                reuseaddr: reuse.unwrap_or(-1),
            })
            .collect();
        let mut owners: Vec<i32> = found.iter().map(|(pid, ..)| *pid).collect();
        owners.sort_unstable();
        owners.dedup();
        let held: Vec<i32> = owners
            .iter()
            .copied()
            .filter(|p| !stopped.contains(p))
            .collect();
        let guard = sock::SocketGuard::spawn(&guarded, &owners, &held).map_err(|e| SaveError::Unsupported {
            pid: found[0].0,
            what: format!("cannot start the process that would put the TCP connections back if the dump died: {e}"),
        })?;
        let told = guard.hold();
        self.repaired.guard = Some(guard);
        told.map_err(|e| SaveError::Unsupported {
            pid: found[0].0,
            what: format!(
                "the process that would put the TCP connections back if the dump died is gone: {e}"
            ),
        })?;
        hold(&held)?;
        if let Some(g) = &self.repaired.guard {
            g.set_owners_held(true);
        }
        self.repaired.held = held;
        for ((pid, fd, ino, s), (reuseaddr, lock)) in found.into_iter().zip(before) {
            let locked = lock && sock::attach_drop_all(s.as_fd()).is_ok();
            self.repaired.socks.push(Repaired {
                sock: s,
                pid,
                fd,
                ino,
                reuseaddr,
                locked,
                in_repair: false,
                held_snd_wnd: None,
                window_slot: None,
            });
        }
        self.repaired.locked_at = Some(std::time::Instant::now());
        Ok(())
    }

    /// Reads the connections [`SaveCtx::freeze_tcp`] locked, once (later
    /// calls do nothing): first waits until 2 ms have passed since the
    /// lock, so that packets already past it (on another CPU) are through,
    /// then puts every connection in repair mode, reads each, and takes
    /// them all out of repair mode again, whatever happened.
    pub fn read_tcp(&mut self) -> Result<(), SaveError> {
        let Some(at) = self.repaired.locked_at.take() else {
            return Ok(());
        };
        let quiet = std::time::Duration::from_millis(2);
        std::thread::sleep(quiet.saturating_sub(at.elapsed()));
        let die = || stasis_sys::fault::die_at(stasis_sys::fault::Point::DieInTcpRepair);
        die();
        let read = self.read_in_repair(die);
        // Out of repair mode whatever happened: the lock keeps them still.
        for r in &mut self.repaired.socks {
            r.leave_repair();
        }
        die();
        // Remote syscalls may follow, and take the holds.
        if let Some(g) = &self.repaired.guard {
            g.set_owners_held(false);
        }
        read
    }

    /// Puts every locked connection in repair mode, then reads each.
    /// (`die`: the test hook of `STASIS_FAULT=die-in-tcp-repair`.)
    fn read_in_repair(&mut self, die: impl Fn()) -> Result<(), SaveError> {
        for r in &mut self.repaired.socks {
            sock::set_int(r.sock.as_fd(), libc::IPPROTO_TCP, sock::TCP_REPAIR, 1).map_err(|e| SaveError::Unsupported { pid: r.pid, what: format!("fd {}: cannot put a TCP connection in repair mode (needs CAP_NET_ADMIN): {e}", r.fd) })?;
            r.in_repair = true;
        }
        die();
        for (i, r) in self.repaired.socks.iter_mut().enumerate() {
            let b = r.sock.as_fd();
            let fail = |e: KernelError| SaveError::Unsupported {
                pid: r.pid,
                what: format!(
                    "fd {}: saving an established TCP connection failed: {e}",
                    r.fd
                ),
            };
            // New data held back first, so what is read as sent stays so;
            // the guard told the window first, to give it back if we die.
            let window = read_window(b).map_err(fail)?;
            if let Some(g) = &self.repaired.guard {
                let slot = g.window_slot(i);
                slot.note(Some(window[1]));
                r.window_slot = Some(slot);
            }
            r.held_snd_wnd = Some(window[1]);
            hold_sends(b, window).map_err(fail)?;
            let state = sock::tcp_info(b)
                .and_then(|info| save(b, &info, window))
                .map_err(fail)?;
            self.repaired.saved.insert(r.ino, state);
        }
        die();
        Ok(())
    }

    /// Lets packets reach the connections `freeze_tcp` locked again.
    pub fn unlock_tcp(&mut self) {
        for r in &mut self.repaired.socks {
            r.unlock();
        }
    }
}
