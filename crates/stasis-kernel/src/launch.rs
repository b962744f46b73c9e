//! Starting and signalling jobs from the command line: closing inherited
//! descriptors, forwarding termination signals to a child, and turning a
//! signal into a flag. The `unsafe` the binary would otherwise hold.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Closes every descriptor from 3 up (what a launcher's environment leaked
/// to this process: a job server's pipe, say).
pub fn close_inherited_fds() {
    // SAFETY: close_range on descriptors this process does not use; no
    // pointer arguments.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// Makes `cmd`'s child close every descriptor from 3 up before exec:
/// descriptors its parent inherited must not leak into it.
pub fn close_inherited_fds_on_exec(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only
    // calls close_range, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            close_inherited_fds();
            Ok(())
        })
    }
}

static FORWARD_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = FORWARD_PID.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// From now on SIGINT, SIGTERM and SIGHUP sent to this process go to `pid`
/// instead (the last call wins).
pub fn forward_signals_to(pid: i32) {
    FORWARD_PID.store(pid, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only loads an atomic and calls
        // kill, both async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                forward as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

static SIGTERM_SEEN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    SIGTERM_SEEN.store(true, Ordering::SeqCst);
}

/// Catches SIGTERM from now on: [`sigterm_seen`] then says whether one came.
pub fn catch_sigterm() {
    // SAFETY: installing a handler that only stores an atomic.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_term as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
}

/// Whether a SIGTERM arrived since [`catch_sigterm`].
pub fn sigterm_seen() -> bool {
    SIGTERM_SEEN.load(Ordering::SeqCst)
}

/// The running stasis binary, to start a helper of the very same version
/// (a guard, a page filler, a tracker's keeper): `/proc/self/exe`, which
/// still starts it after its file was replaced or deleted (an upgrade
/// while an agent runs), where the path `current_exe` names would not.
pub fn own_exe() -> std::path::PathBuf {
    std::path::PathBuf::from("/proc/self/exe")
}
