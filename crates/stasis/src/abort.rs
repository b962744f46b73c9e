//! A dump stopped by SIGINT, SIGTERM or SIGHUP leaves no partial checkpoint.
//!
//! Those signals are blocked in every thread of the dump and taken by one
//! thread that removes this dump's temporary checkpoint directory, then
//! dies of the signal as it would have. The processes being dumped are
//! released exactly as when the dumper is SIGKILLed (each thread escapes by
//! itself, see `stasis_kernel::escape`); only the clean-up is added. A
//! committed checkpoint is never touched (it no longer has a temporary name).
//! The dump's own threads go on meanwhile (and fail, their directory gone);
//! `main` waits in [`settle`] so that the process does not exit before the
//! clean-up is done and the signal raised.

use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::signal::{self, SigSet, Signal};

/// Held by the signal thread from the signal until the process dies of it.
static CLEANING: Mutex<()> = Mutex::new(());

/// Returns at once, unless a signal's clean-up is under way: then never
/// (the process dies of the signal).
pub fn settle() {
    drop(CLEANING.lock());
}

/// Installs the clean-up for a dump into `dir`. Call it before any other
/// thread is started, so that they all inherit the blocked signals.
pub fn remove_temps_on_signal(dir: &Path) -> Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()
        .context("blocking SIGINT/SIGTERM/SIGHUP for the dump's clean-up")?;
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("abort".into())
        .spawn(move || {
            let Ok(sig) = set.wait() else { return };
            let _held = CLEANING.lock();
            stasis_image::remove_temps_of(&dir, std::process::id());
            // Die of the signal (its action is the default one: a dump
            // installs no handler), as without this thread.
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = one.thread_unblock();
            let _ = signal::raise(sig);
            std::process::exit(128 + sig as i32);
        })
        .context("starting the dump's signal thread")?;
    Ok(())
}
