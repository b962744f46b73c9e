//! Socket filters that hold packets off a socket for the length of a dump
//! (the network lock, the accept gate), and the guard process that takes
//! them (and repair mode) off again if the dumper dies.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use std::sync::atomic::{AtomicU32, Ordering};

use super::{err, set_int};
use crate::{KernelError, Result};
use stasis_sys::net::{TCP_REPAIR, TCP_REPAIR_OFF_NO_WP, TCP_REPAIR_WINDOW, TCP_REPAIR_WINDOW_LEN};

/// Attaches a one-instruction classic BPF filter (`ret #0`) that drops
/// every packet the socket receives. On a TCP listener this stops new
/// handshakes from completing (clients see a lost SYN and retry), so its
/// accept queue can drain; [`detach_filter`] lets them in again.
pub fn attach_drop_all(fd: BorrowedFd<'_>) -> Result<()> {
    let mut insn = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: 0,
    }];
    set_program(fd, &mut insn)
}

/// Removes the socket's filter (`SO_DETACH_FILTER`).
pub fn detach_filter(fd: BorrowedFd<'_>) -> Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_DETACH_FILTER, 0)
}

/// `SO_GET_FILTER` into `insns` (room for `insns.len() / 8`
/// instructions; none: just ask the length). Returns the instruction count,
/// or `None` if the kernel refuses (an eBPF filter cannot be read back).
fn get_filter(fd: BorrowedFd<'_>, insns: &mut [u8]) -> Option<u32> {
    // The length is a count of instructions (8 bytes each), not bytes.
    let mut len = libc::socklen_t::try_from(insns.len() / 8).unwrap_or(0);
    let buf = if insns.is_empty() {
        std::ptr::null_mut()
    } else {
        insns.as_mut_ptr().cast()
    };
    // SAFETY: SO_GET_FILTER copies at most `len` instructions of 8 bytes
    // into `buf` (nothing with a zero length: it then only reports the
    // count), or fails if the filter is longer.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            buf,
            &mut len,
        )
    };
    (r == 0).then_some(len)
}

/// The socket's classic BPF filter as `SO_GET_FILTER` gives it back (8
/// bytes an instruction); empty: none attached. An eBPF filter
/// (`SO_ATTACH_BPF`) cannot be read back: an error.
pub fn read_filter(fd: BorrowedFd<'_>) -> Result<Vec<u8>> {
    let Some(n) = get_filter(fd, &mut []) else {
        return Err(err("getsockopt(SO_GET_FILTER) (an eBPF filter?)".into()));
    };
    let mut insns = vec![0u8; n as usize * 8];
    match get_filter(fd, &mut insns) {
        Some(m) if m == n => Ok(insns),
        _ => Err(err("getsockopt(SO_GET_FILTER) of the instructions".into())),
    }
}

/// Attaches the classic BPF program `insns` (8 bytes an instruction, as
/// [`read_filter`] gives them).
pub fn attach_filter(fd: BorrowedFd<'_>, insns: &[u8]) -> Result<()> {
    let mut prog: Vec<libc::sock_filter> = insns
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    set_program(fd, &mut prog)
}

/// `SO_ATTACH_FILTER` of the classic BPF program `prog`.
fn set_program(fd: BorrowedFd<'_>, prog: &mut [libc::sock_filter]) -> Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| KernelError::Unsupported {
            feature: "socket filters this long",
            why: format!("{} instructions", prog.len()),
        })?,
        filter: prog.as_mut_ptr(),
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sock_fprog>()).unwrap_or(0);
    // SAFETY: SO_ATTACH_FILTER reads a `struct sock_fprog` whose `filter`
    // points at `len` live instructions (the kernel copies them).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            len,
        )
    };
    if r < 0 {
        return Err(err("setsockopt(SO_ATTACH_FILTER)".into()));
    }
    Ok(())
}

/// Whether the socket has a classic or eBPF filter attached already.
pub fn has_filter(fd: BorrowedFd<'_>) -> bool {
    get_filter(fd, &mut []) != Some(0)
}

/// Whether the socket's filter is exactly the one [`attach_drop_all`]
/// attaches (a connection accepted while its listener had it inherits it).
pub fn has_drop_all_filter(fd: BorrowedFd<'_>) -> bool {
    let mut insn = [0u8; 8];
    get_filter(fd, &mut insn) == Some(1) && insn == [0x06, 0, 0, 0, 0, 0, 0, 0]
}

/// What a [`SocketGuard`] puts back on one socket if the dumper dies.
#[derive(Debug, Clone, Copy)]
pub struct Guarded {
    /// The socket (a copy of the program's fd, open in this process).
    pub fd: i32,
    /// Remove a drop-everything filter ([`attach_drop_all`]) if it has one.
    pub detach_filter: bool,
    /// A TCP connection: taken out of `TCP_REPAIR` (without a window
    /// probe) if the dumper dies, put in it before the guard kills its
    /// owners ([`SocketGuard::kill_owners`]).
    pub leave_repair: bool,
    /// `SO_REUSEADDR` to set after that (negative: leave it).
    pub reuseaddr: i32,
}

/// A small process that holds copies of sockets a dump changes (network
/// lock and accept-gate filters, repair mode), and puts them back as they
/// were if the dumper dies before it does so itself: a SIGKILLed dumper
/// must not leave the program's connections frozen in repair mode, or its
/// listener deaf behind a filter. Forked from the dumper, in a session of
/// its own (`spawn` returns only once it has left the dumper's: a kill of
/// the dumper's process group, as a timeout or ^C sends, must not take the
/// guard too), it only waits for the end of a pipe: a byte ([`dismiss`],
/// `Drop`) means the dumper is done and it exits touching nothing; the end
/// of the pipe without one means the dumper died, and it puts every socket
/// back (with the send window the dumper held at zero, which it learns
/// through a shared page: [`WindowSlot::note`]; only while the owners are
/// held: [`SocketGuard::set_owners_held`]). Between the
/// fork and its exit it makes raw system calls only.
///
/// A dying tracer lets its tracees go at once (the kernel detaches them as
/// it exits), an instant before the guard, woken by the end of the pipe,
/// can put a socket back: a program let go while its connections are in
/// repair mode would see `recv` fail, or its `send` go to its own receive
/// queue. So the dumper *holds* the owners of the connections before it
/// puts any in repair mode ([`hold`]: it tells the guard, then queues a
/// SIGSTOP on each of their threads, which a traced thread only takes when
/// it is resumed): if it dies, every thread stops before it runs a single
/// instruction of the program, and the guard, once the sockets are back,
/// sends the `held` processes SIGCONT (which also cancels a SIGSTOP not
/// yet taken). The dumper takes its SIGSTOPs back itself when it lets the
/// threads go (`Tracee::detach`).
///
/// A dump that kills the tree once its checkpoint is committed hands the
/// kill to the guard ([`kill_owners`]): the guard puts the connections in
/// repair mode, SIGKILLs the owners through pidfds opened before its fork,
/// leaves its copies to a holder ([`raw_hold_connections`]) and exits; the
/// connections close in repair mode, silently, as the checkpoint needs,
/// when the restore ends the holder (or after [`HOLD_SECS`]). There is no instant at which a dying dumper leaves
/// either a live program running with its connections in repair mode, or
/// a dead one whose connections the guard took out of repair mode, so
/// that their peers see them end.
///
/// [`dismiss`]: SocketGuard::dismiss
/// [`kill_owners`]: SocketGuard::kill_owners
/// [`hold`]: SocketGuard::hold
#[derive(Debug)]
pub struct SocketGuard {
    pub(super) pid: i32,
    pub(super) tx: Option<OwnedFd>,
    windows: std::sync::Arc<HeldWindows>,
}

/// One guarded socket's slot of the windows the dump holds at zero
/// ([`SocketGuard::window_slot`]).
#[derive(Debug, Clone)]
pub struct WindowSlot {
    windows: std::sync::Arc<HeldWindows>,
    i: usize,
}

impl WindowSlot {
    /// The socket's send window is about to be held at zero by the dump,
    /// and was `Some(wnd)`: if the dumper dies, the guard gives it back
    /// before it takes the connection out of repair mode (noted before
    /// the window is zeroed). `None` once the dumper has given it back
    /// itself (before the connection is unlocked: the guard's read and
    /// write of the window must not race with packets).
    pub fn note(&self, wnd: Option<u32>) {
        if let Some(slot) = self.windows.slots().get(self.i) {
            slot.store(wnd.unwrap_or(NOT_HELD), Ordering::SeqCst);
        }
    }
}

/// The dumper's word to its guard: done, touch nothing.
const DISMISS: u8 = b'q';
/// The dumper's word to its guard: kill the owners, their connections in
/// repair mode.
const KILL: u8 = b'k';
/// The dumper's word to its guard: the held processes may be stopped by
/// now; if I die, continue them once the sockets are back.
const HOLD: u8 = b'h';

/// Whether `fd` has exactly the filter [`attach_drop_all`] attaches (raw
/// system calls only: used after a fork).
fn raw_has_drop_all(fd: i32) -> bool {
    let mut insn = [0u8; 8];
    let mut len: libc::socklen_t = 1;
    // SAFETY: SO_GET_FILTER copies at most `len` (1) instruction of 8
    // bytes into `insn`, or fails if the filter is longer.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            insn.as_mut_ptr().cast(),
            &mut len,
        )
    };
    r == 0 && len == 1 && insn == [0x06, 0, 0, 0, 0, 0, 0, 0]
}

/// Sets an int socket option (raw system calls only; best effort, errors
/// are ignored: nothing to report to).
fn raw_set(fd: i32, level: i32, opt: i32, v: i32) {
    // SAFETY: setsockopt reads an int from `v`.
    unsafe {
        libc::setsockopt(fd, level, opt, (&v as *const i32).cast(), 4);
    }
}

/// A slot of [`HeldWindows`] with no window to give back.
const NOT_HELD: u32 = u32::MAX;

/// The send windows a dump holds at zero while it reads the connections
/// (`hold_sends` in stasis-objects), one slot per guarded socket, in a
/// page shared with the guard (mapped `MAP_SHARED` before its fork): if
/// the dumper dies before it gives a window back, the guard does. A
/// connection left with a zero send window sends nothing new until its
/// peer happens to update the window: a peer waiting for a request would
/// wait for ever.
#[derive(Debug)]
struct HeldWindows {
    base: std::ptr::NonNull<AtomicU32>,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone and is only reached
// through atomics.
unsafe impl Send for HeldWindows {}
// SAFETY: as above.
unsafe impl Sync for HeldWindows {}

impl HeldWindows {
    /// `len` window slots, and after them the flag [`HeldWindows::held`].
    fn new(len: usize) -> Result<HeldWindows> {
        let bytes = (len + 1) * std::mem::size_of::<AtomicU32>();
        // SAFETY: a new anonymous shared mapping, no address hint; checked
        // below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err("mmap of the socket guard's window slots".into()));
        }
        let base = std::ptr::NonNull::new(p.cast::<AtomicU32>())
            .ok_or_else(|| err("mmap of the socket guard's window slots".into()))?;
        let w = HeldWindows { base, len };
        for slot in w.slots() {
            slot.store(NOT_HELD, Ordering::SeqCst);
        }
        w.held().store(0, Ordering::SeqCst);
        Ok(w)
    }

    /// The window slots and the flag after them.
    fn all(&self) -> &[AtomicU32] {
        // SAFETY: `len + 1` u32 slots (a mapping of at least one page),
        // page-aligned, mapped for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len + 1) }
    }

    fn slots(&self) -> &[AtomicU32] {
        &self.all()[..self.len]
    }

    /// 1 while every owner of the connections is held (a SIGSTOP of the
    /// dumper's queued on each of its threads, see [`SocketGuard::hold`])
    /// or stopped: only then may the guard put a connection in repair
    /// mode to give its window back (a running owner's `recv` there fails
    /// with `EPERM`). The dumper's remote syscalls take the holds, so it
    /// clears this before it runs any, and sets it again when it holds
    /// the owners anew.
    fn held(&self) -> &AtomicU32 {
        &self.all()[self.len]
    }
}

impl Drop for HeldWindows {
    fn drop(&mut self) {
        let bytes = (self.len + 1) * std::mem::size_of::<AtomicU32>();
        // SAFETY: unmapping the mapping made by `new`, reached by nothing
        // else once `self` is dropped.
        unsafe { libc::munmap(self.base.as_ptr().cast(), bytes) };
    }
}

/// Gives a connection its send window `wnd` back, in repair mode (raw
/// system calls only; [`raw_put_back`] takes it out again).
fn raw_give_window(fd: i32, wnd: u32) {
    raw_set(fd, libc::IPPROTO_TCP, TCP_REPAIR, 1);
    let mut w = [0u32; 5];
    let size = libc::socklen_t::try_from(TCP_REPAIR_WINDOW_LEN).unwrap_or(0);
    let mut len = size;
    // SAFETY: TCP_REPAIR_WINDOW writes at most `len` (20) bytes into `w`
    // (20 bytes); the set below reads as many from it.
    unsafe {
        if libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            TCP_REPAIR_WINDOW,
            w.as_mut_ptr().cast(),
            &mut len,
        ) != 0
            || len != size
        {
            return;
        }
        w[1] = wnd;
        w[2] = w[2].max(wnd);
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            TCP_REPAIR_WINDOW,
            w.as_ptr().cast(),
            size,
        );
    }
}

/// Pushes what a connection has queued (`TCP_CORK` set to 0 again, if the
/// program has it off: raw system calls only): with a zero send window,
/// the kernel then arms its window probe, whose answer brings the peer's
/// window back.
fn raw_push(fd: i32) {
    let mut cork: i32 = -1;
    let mut len: libc::socklen_t = 4;
    // SAFETY: getsockopt writes at most `len` (4) bytes into `cork`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&mut cork as *mut i32).cast(),
            &mut len,
        )
    };
    if r == 0 && cork == 0 {
        raw_set(fd, libc::IPPROTO_TCP, libc::TCP_CORK, 0);
    }
}

/// Puts one guarded socket back (raw system calls only): out of repair
/// mode while the lock still drops every packet (as the dumper does: no
/// segment is processed by a connection in repair mode), then unlocked.
fn raw_put_back(g: &Guarded) {
    if g.leave_repair {
        raw_set(g.fd, libc::IPPROTO_TCP, TCP_REPAIR, TCP_REPAIR_OFF_NO_WP);
    }
    if g.reuseaddr >= 0 {
        raw_set(g.fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, g.reuseaddr);
    }
    if g.detach_filter && raw_has_drop_all(g.fd) {
        raw_set(g.fd, libc::SOL_SOCKET, libc::SO_DETACH_FILTER, 0);
    }
}

/// What the forked guard works with (made before the fork).
struct GuardChild<'a> {
    socks: &'a [Guarded],
    /// A window to give back per socket ([`HeldWindows`]).
    windows: &'a [AtomicU32],
    /// Whether the owners are held now ([`HeldWindows::held`]).
    owners_held: &'a AtomicU32,
    /// Pidfds of the owners (killed on `KILL`), and of those held.
    owners: &'a [i32],
    held: &'a [i32],
    /// `/proc/PID/stat` of each of `held`, to see it stopped.
    held_stat: &'a [std::ffi::CString],
    /// The fd ranges to close (everything but the above and the pipes).
    gaps: &'a [(u32, u32)],
    /// The dumper's word, and where to say the guard has left its session.
    rx: i32,
    ready: i32,
}

/// Signals every pidfd of `fds` with `sig` (raw system calls only).
fn raw_signal_all(fds: &[i32], sig: i32) {
    for &pfd in fds {
        // SAFETY: pidfd_send_signal with integer arguments and no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pfd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            );
        }
    }
}

/// The name (`comm`) of the process that holds the connections of a
/// killed tree until its restore ([`release_holders`]).
pub const HOLDER_NAME: &str = "stasis-tcphold";
/// How long a holder keeps the connections of a killed tree when no
/// restore comes for them.
pub const HOLD_SECS: i64 = 30;

/// After the kill: forks a *holder* that keeps the guard's copies of the
/// connections (in repair mode, behind the drop-everything filter) for
/// [`HOLD_SECS`], or until a restore of the tree ends it
/// ([`release_holders`]). While a connection exists, what its peer sends
/// (a request retransmitted because the network lock dropped it) is
/// dropped, and retransmitted again later to the restored connection; with
/// no socket at all, the peer's kernel would be answered with a reset.
/// The guard itself exits at once, so that the dumper waiting for it goes
/// on. Raw system calls only.
fn raw_hold_connections() {
    // SAFETY: fork in the single-threaded guard; the child makes raw
    // system calls only (prctl with a NUL-terminated name of at most 16
    // bytes, nanosleep on our own timespec) and ends with _exit.
    unsafe {
        if libc::fork() != 0 {
            return;
        }
        libc::prctl(libc::PR_SET_NAME, c"stasis-tcphold".as_ptr(), 0, 0, 0);
        let mut left = libc::timespec {
            tv_sec: HOLD_SECS,
            tv_nsec: 0,
        };
        let mut rem = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while libc::nanosleep(&left, &mut rem) < 0 {
            left = rem;
        }
        // The copies close in repair mode: silently.
        libc::_exit(0);
    }
}

/// The holders ([`raw_hold_connections`], processes named
/// [`HOLDER_NAME`]) that keep one of the TCP sockets with inode in
/// `inodes`: each with a pidfd and its fds of those sockets.
fn holders_of(inodes: &[u32]) -> Vec<(i32, OwnedFd, Vec<i32>)> {
    let mut found = Vec::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() != HOLDER_NAME {
            continue;
        }
        let fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|f| {
                let fd = f.file_name().to_str()?.parse::<i32>().ok()?;
                let l = std::fs::read_link(f.path()).ok()?;
                let ino = l
                    .to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse::<u32>()
                    .ok()?;
                inodes.contains(&ino).then_some(fd)
            })
            .collect();
        if fds.is_empty() {
            continue;
        }
        // (Gone meanwhile: it held nothing more.)
        if let Ok(pfd) = crate::pidfd::pidfd_open(pid) {
            found.push((pid, pfd, fds));
        }
    }
    found
}

/// SIGKILLs the holder behind `pfd` and waits until it has exited (its
/// copies closed by then, silently: in repair mode).
fn end_holder(pid: i32, pfd: &OwnedFd) -> Result<()> {
    raw_signal_all(&[pfd.as_raw_fd()], libc::SIGKILL);
    // The pidfd becomes readable when the process has exited (its fds,
    // and so the sockets, closed by then).
    let mut p = libc::pollfd {
        fd: pfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd of ours, 5 s at most.
    let r = unsafe { libc::poll(&mut p, 1, 5000) };
    if r != 1 {
        return Err(err(format!(
            "the holder {pid} of a killed tree's connections did not exit"
        )));
    }
    Ok(())
}

/// Ends the holders ([`raw_hold_connections`]) that keep one of the TCP
/// sockets with inode in `inodes`, and waits until each is gone (its
/// sockets closed, silently, in repair mode); returns how many it ended.
/// Only processes named [`HOLDER_NAME`] are considered. This drops every
/// connection a holder keeps: a restore rebuilding connections one at a
/// time takes each over instead ([`take_held`]).
pub fn release_holders(inodes: &[u32]) -> Result<usize> {
    let holders = holders_of(inodes);
    for (pid, pfd, _) in &holders {
        end_holder(*pid, pfd)?;
    }
    Ok(holders.len())
}

/// Frees the address pair of the TCP sockets with inode in `inodes` that a
/// holder keeps, and only theirs: each is copied out of its holder
/// (`pidfd_getfd`) and disconnected, still in repair mode (silently: no
/// reset, no FIN), so that the restored connection can take the pair at
/// once. The holder's other connections stay held: ending it would leave
/// their pairs with no socket until their own restored ones exist, and a
/// peer's retransmission meanwhile would be answered with a reset. Returns
/// the pids of the holders, to end with [`end_holders`] once every
/// connection of the tree is rebuilt.
pub fn take_held(inodes: &[u32]) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for (pid, pfd, fds) in holders_of(inodes) {
        for fd in fds {
            // (Gone meanwhile: the holder ended on its own.)
            let Ok(copy) = crate::pidfd::pidfd_getfd(&pfd, fd) else {
                continue;
            };
            // Already in repair mode (the guard put it there); made sure
            // of, as the disconnect is silent only in it.
            set_int(copy.as_fd(), libc::IPPROTO_TCP, TCP_REPAIR, 1)?;
            super::disconnect(copy.as_fd()).map_err(|e| KernelError::Io {
                what: format!(
                    "disconnecting the held copy of a connection (holder {pid}, fd {fd})"
                ),
                source: e,
            })?;
        }
        pids.push(pid);
    }
    Ok(pids)
}

/// Ends the holders `pids` of [`take_held`] that are still there (a pid
/// reused meanwhile by another process is left alone: only processes
/// named [`HOLDER_NAME`] are ended).
pub fn end_holders(pids: &[i32]) -> Result<()> {
    for &pid in pids {
        let Ok(pfd) = crate::pidfd::pidfd_open(pid) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == HOLDER_NAME {
            end_holder(pid, &pfd)?;
        }
    }
    Ok(())
}

/// The forked guard: raw system calls only (no allocation, no lock: the
/// dumper may have threads); never returns.
fn guard_main(c: &GuardChild<'_>) -> ! {
    // SAFETY: close every fd but the sockets, the pidfds and the pipes,
    // leave the dumper's session, say so: raw system calls on our own fds.
    unsafe {
        for &(a, b) in c.gaps {
            libc::syscall(libc::SYS_close_range, a, b, 0u32);
        }
        libc::setsid();
        libc::write(c.ready, [b'r'].as_ptr().cast(), 1);
        libc::close(c.ready);
    }
    let mut b = 0u8;
    let mut holding = false;
    loop {
        // SAFETY: reading one byte into our buffer from our pipe.
        let n = unsafe { libc::read(c.rx, (&mut b as *mut u8).cast(), 1) };
        if n == 1 && b == HOLD {
            holding = true;
            continue;
        }
        if n == 1 && b == KILL {
            for g in c.socks.iter().filter(|g| g.leave_repair) {
                raw_set(g.fd, libc::IPPROTO_TCP, TCP_REPAIR, 1);
            }
            raw_signal_all(c.owners, libc::SIGKILL);
            // Named as the holder at once (not before the kill: a restore
            // ending holders must not end a guard that has not killed):
            // until it exits this process holds the copies too, and a
            // restore finds it by that name ([`release_holders`]).
            // SAFETY: prctl with a NUL-terminated name of at most 16 bytes.
            unsafe { libc::prctl(libc::PR_SET_NAME, c"stasis-tcphold".as_ptr(), 0, 0, 0) };
            raw_hold_connections();
            // SAFETY: _exit ends this forked child.
            unsafe { libc::_exit(0) };
        }
        if n == 1 {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        if n == 0 {
            break;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: as above.
            unsafe { libc::_exit(1) };
        }
    }
    // Repair mode only while no owner can run. Else the window stays zero
    // until the peer's next segment updates it, and a push arms the
    // window probe that asks for that segment if bytes wait to be sent.
    let give = holding && c.owners_held.load(Ordering::SeqCst) == 1;
    for (g, w) in c.socks.iter().zip(c.windows) {
        let wnd = w.load(Ordering::SeqCst);
        let held = g.leave_repair && wnd != NOT_HELD;
        if give && held {
            raw_give_window(g.fd, wnd);
        }
        raw_put_back(g);
        if held && !give {
            raw_push(g.fd);
        }
    }
    if holding {
        // After the sockets: a thread still on its way to its SIGSTOP has
        // it cancelled, a stopped one goes on.
        raw_signal_all(c.held, libc::SIGCONT);
        // The dumper's fds close (waking us) before the kernel detaches
        // its tracees: a thread caught in the stop of its hold as its
        // tracer died takes that SIGSTOP only once detached, after our
        // SIGCONT. Continue any held process seen stopped, for a while.
        let until = raw_now_ms() + 2000;
        while raw_now_ms() < until {
            let mut any = false;
            for (path, &pfd) in c.held_stat.iter().zip(c.held) {
                match raw_state(path) {
                    Some(b'T') => {
                        raw_signal_all(&[pfd], libc::SIGCONT);
                        any = true;
                    }
                    Some(b't') => any = true,
                    _ => {}
                }
            }
            if !any {
                break;
            }
            raw_sleep_ms(5);
        }
    }
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

/// Milliseconds on the monotonic clock (raw system call).
fn raw_now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// Sleeps `ms` milliseconds (raw system call).
fn raw_sleep_ms(ms: i64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: ms * 1_000_000,
    };
    // SAFETY: nanosleep reads our timespec; no remainder wanted.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// The state letter of the process whose `/proc/PID/stat` is `path`
/// (raw system calls, a stack buffer); `None` if it cannot be read.
fn raw_state(path: &std::ffi::CStr) -> Option<u8> {
    let mut buf = [0u8; 512];
    // SAFETY: open of a NUL-terminated path made before the fork; read
    // into our stack buffer; close of the fd we opened.
    let n = unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let n = usize::try_from(n).ok()?;
    let text = &buf[..n];
    let close = text.iter().rposition(|&b| b == b')')?;
    text.get(close + 2).copied()
}

impl SocketGuard {
    /// Forks the guard of `socks` (their fds stay open in this process),
    /// which belong to the processes `owners` (killed by
    /// [`SocketGuard::kill_owners`]); those of them in `held` are the ones
    /// [`SocketGuard::hold`] may stop.
    pub fn spawn(socks: &[Guarded], owners: &[i32], held: &[i32]) -> Result<SocketGuard> {
        // Pidfds of the owners, so the guard signals them and nothing that
        // may reuse their PIDs later.
        let owner_fds = owners
            .iter()
            .map(|&p| crate::pidfd::pidfd_open(p))
            .collect::<Result<Vec<OwnedFd>>>()?;
        let owner_raw: Vec<i32> = owner_fds.iter().map(AsRawFd::as_raw_fd).collect();
        let held_raw: Vec<i32> = owners
            .iter()
            .zip(&owner_raw)
            .filter(|(p, _)| held.contains(p))
            .map(|(_, &fd)| fd)
            .collect();
        let held_stat: Vec<std::ffi::CString> = owners
            .iter()
            .filter(|p| held.contains(p))
            .map(|p| std::ffi::CString::new(format!("/proc/{p}/stat")).unwrap_or_default())
            .collect();
        let pipe = || -> Result<(OwnedFd, OwnedFd)> {
            let mut p = [0i32; 2];
            // SAFETY: pipe2 writes two fds into the array.
            if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
                return Err(err("pipe2 for the socket guard".into()));
            }
            // SAFETY: pipe2 returned two new fds that we own.
            Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
        };
        let windows = std::sync::Arc::new(HeldWindows::new(socks.len())?);
        let (rx, tx) = pipe()?;
        // The guard says it has left our session (and process group) on
        // this one: until then a kill of our process group (a timeout, ^C)
        // would take it with us.
        let (ready_rx, ready_tx) = pipe()?;
        // Everything the child needs is made before the fork: the fds it
        // keeps, sorted, and the ranges between them that it closes.
        let mut keep: Vec<i32> = socks.iter().map(|g| g.fd).collect();
        keep.extend_from_slice(&owner_raw);
        keep.push(rx.as_raw_fd());
        keep.push(ready_tx.as_raw_fd());
        keep.sort_unstable();
        keep.dedup();
        let mut gaps: Vec<(u32, u32)> = Vec::with_capacity(keep.len() + 1);
        let mut next = 0u32;
        for &k in &keep {
            let k = k.unsigned_abs();
            if k > next {
                gaps.push((next, k - 1));
            }
            next = k + 1;
        }
        gaps.push((next, u32::MAX));
        let rx_fd = rx.as_raw_fd();
        let ready_fd = ready_tx.as_raw_fd();
        // SAFETY: fork; the child runs only raw system calls on data made
        // above (no allocation, no lock: the dumper may have threads) and
        // ends with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(err("fork of the socket guard".into()));
        }
        if pid == 0 {
            guard_main(&GuardChild {
                socks,
                windows: windows.slots(),
                owners_held: windows.held(),
                owners: &owner_raw,
                held: &held_raw,
                held_stat: &held_stat,
                gaps: &gaps,
                rx: rx_fd,
                ready: ready_fd,
            });
        }
        drop(rx);
        drop(owner_fds);
        drop(ready_tx);
        let mut guard = SocketGuard {
            pid,
            tx: Some(tx),
            windows,
        };
        let mut b = 0u8;
        let ready = loop {
            // SAFETY: reading one byte into our buffer from our pipe.
            let n = unsafe { libc::read(ready_rx.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
            if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break n == 1;
            }
        };
        if !ready {
            guard.stop(DISMISS);
            return Err(err("the socket guard died as it started".into()));
        }
        Ok(guard)
    }

    /// Tells the guard that the `held` processes are about to be stopped
    /// (a SIGSTOP queued on each of their threads, see the type's docs):
    /// if the dumper dies from now on, the guard continues them once the
    /// sockets are back. Fails if the guard is gone.
    pub fn hold(&self) -> Result<()> {
        let Some(tx) = &self.tx else {
            return Err(err("the socket guard was already stopped".into()));
        };
        // SAFETY: writing one byte from our buffer to our pipe.
        if unsafe { libc::write(tx.as_raw_fd(), [HOLD].as_ptr().cast(), 1) } != 1 {
            return Err(err(
                "telling the socket guard to continue held processes".into()
            ));
        }
        Ok(())
    }

    /// Says whether every owner is held (or stopped) now: see
    /// [`HeldWindows::held`].
    pub fn set_owners_held(&self, held: bool) {
        self.windows.held().store(u32::from(held), Ordering::SeqCst);
    }

    /// The window slot of socket `i` of those given to
    /// [`SocketGuard::spawn`].
    pub fn window_slot(&self, i: usize) -> WindowSlot {
        WindowSlot {
            windows: self.windows.clone(),
            i,
        }
    }

    /// The dumper is done with the sockets: the guard exits without
    /// touching them, and is reaped.
    pub fn dismiss(mut self) {
        self.stop(DISMISS);
    }

    /// The checkpoint is committed and the tree is to die: the guard puts
    /// the connections in repair mode, SIGKILLs the owners and leaves the
    /// connections to a holder until the restore (they close in repair
    /// mode, silently); returns once it has.
    pub fn kill_owners(mut self) {
        self.stop(KILL);
    }

    /// Lets the guard act as if the dumper had died (it puts the sockets
    /// back and continues held processes): for a dumper that could not
    /// let every held thread go. Returns once it has.
    pub fn abandon(mut self) {
        self.stop(0);
    }

    fn stop(&mut self, word: u8) {
        let Some(tx) = self.tx.take() else { return };
        if word != 0 {
            // SAFETY: writing one byte from our buffer to our pipe.
            unsafe { libc::write(tx.as_raw_fd(), [word].as_ptr().cast(), 1) };
        }
        drop(tx);
        let mut st = 0;
        // SAFETY: waiting for our own child.
        while unsafe { libc::waitpid(self.pid, &mut st, 0) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        self.stop(DISMISS);
    }
}
