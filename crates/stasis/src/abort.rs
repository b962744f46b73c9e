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

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{self, SigSet, Signal};
use stasis_image::{CHECKPOINTS_DIR, TEMP_PREFIX};

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
    let cps = dir.join(CHECKPOINTS_DIR);
    std::thread::Builder::new()
        .name("abort".into())
        .spawn(move || {
            let Ok(sig) = set.wait() else { return };
            let _held = CLEANING.lock();
            remove_own_temps(&cps, std::process::id());
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

/// Removes the temporary checkpoint directories of process `pid` (named
/// `.tmp-NUMBER-PID-NANOS`) under `cps`. First renamed, so that the
/// dump's writers, still running, cannot add to them by their path.
fn remove_own_temps(cps: &Path, pid: u32) {
    let Ok(rd) = std::fs::read_dir(cps) else {
        return;
    };
    let mark = format!("-{pid}-");
    let ours: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(TEMP_PREFIX) && n.contains(&mark) && !n.ends_with("-aborted"))
        .map(|n| cps.join(n))
        .collect();
    for p in ours {
        let gone = p.with_file_name(format!(
            "{}-aborted",
            p.file_name().unwrap_or_default().to_string_lossy()
        ));
        let p = if std::fs::rename(&p, &gone).is_ok() {
            gone
        } else {
            p
        };
        // A writer may still create a file in it (by an open directory
        // fd) until it notices: try again for a while; whatever is left has
        // a temporary name and the next dump removes it.
        let t0 = Instant::now();
        while std::fs::remove_dir_all(&p).is_err()
            && p.exists()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
