//! The process-wide `SIGSEGV` handler of application-level monitoring.
//!
//! [`install`] puts one handler in place (once per process) and keeps the
//! action the program had before. On every `SIGSEGV` the handler reads the
//! faulting address and asks the registered [`FaultCallback`]; if it
//! answers `true` the fault was ours (a first write to a protected page,
//! now writable again) and the faulting instruction simply runs again.
//! Otherwise the fault goes to the program's previous handler exactly as
//! the kernel would have delivered it (`SA_SIGINFO` or not); if there was
//! none, the default action is put back and the instruction re-run, so the
//! process dies of the `SIGSEGV` with the usual core dump.
//!
//! The callback runs in signal context: it must not allocate, and may only
//! take locks that the faulting thread cannot be holding.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::{last_err, KernelError, Result};

/// Decides whether a fault at an address was ours (and made it writable).
pub type FaultCallback = fn(addr: usize) -> bool;

static CALLBACK: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs the handler (first call) and sets the callback (every call).
pub fn install(cb: FaultCallback) -> Result<()> {
    CALLBACK.store(cb as usize, Ordering::SeqCst);
    if PREVIOUS.get().is_some() {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid value (no handler, empty mask).
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction =
        handler as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live sigaction values; the handler is an
    // `extern "C"` function with the SA_SIGINFO signature.
    let r = unsafe { libc::sigaction(libc::SIGSEGV, &new, &mut old) };
    if r != 0 {
        return Err(KernelError::io("sigaction(SIGSEGV)", last_err()));
    }
    // A second racing installer would have saved our own handler as the
    // previous one; `stasis_init` is serialised by its caller's lock.
    let _ = PREVIOUS.set(old);
    Ok(())
}

/// Whether our handler is still the one the kernel calls (a program that
/// replaced it after `stasis_init` would break page monitoring).
pub fn is_current() -> bool {
    // SAFETY: a zeroed sigaction is valid; sigaction with a null new action
    // only reads the current one.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `cur` is a live sigaction to write into.
    let r = unsafe { libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut cur) };
    r == 0
        && cur.sa_sigaction
            == handler as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize
}

extern "C" fn handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler;
    // si_addr is the faulting address for SIGSEGV.
    let addr = unsafe { (*info).si_addr() } as usize;
    let cb = CALLBACK.load(Ordering::SeqCst);
    if cb != 0 {
        // SAFETY: CALLBACK only ever holds a `FaultCallback` stored by
        // `install`, converted to usize; fn pointers round-trip through usize.
        let f: FaultCallback = unsafe { std::mem::transmute::<usize, FaultCallback>(cb) };
        if f(addr) {
            return;
        }
    }
    chain(sig, info, ctx);
}

fn chain(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(prev) = PREVIOUS.get() else {
        return reset_default(sig);
    };
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => reset_default(sig),
        h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed `h` as an SA_SIGINFO handler, so
            // it has this signature; we pass what the kernel gave us.
            let f = unsafe {
                std::mem::transmute::<
                    usize,
                    extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void),
                >(h)
            };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: a handler installed without SA_SIGINFO takes the
            // signal number only.
            let f = unsafe { std::mem::transmute::<usize, extern "C" fn(i32)>(h) };
            f(sig);
        }
    }
}

/// Puts the default action back: the faulting instruction runs again and
/// the kernel kills the process with `SIGSEGV`, as without us.
fn reset_default(sig: i32) {
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `dfl` is a live sigaction; sigaction is async-signal-safe.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
}
