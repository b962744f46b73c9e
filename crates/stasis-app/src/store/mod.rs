//! Checkpoint targets: where the bytes of a checkpoint go and come back
//! from. A target commits a [`Snapshot`] atomically (a checkpoint killed
//! half-way never replaces the previous version) and gives back, for a
//! version, the snapshots to apply in order (oldest first; the last one's
//! region table is the version's).

pub mod dir;
pub mod pmem;

use crate::error::{AppError, Result};
use crate::format::{Meta, Snapshot};

/// A checkpoint target.
pub trait Target: Send {
    /// Whether a checkpoint of `name` may be a delta on the previous one
    /// (what the target needs to restore it is its own business).
    fn takes_deltas(&self) -> bool;
    /// Writes a checkpoint and makes it the newest version of `name`.
    /// Returns the bytes written.
    fn commit(&mut self, name: &str, meta: &Meta, snap: &Snapshot) -> Result<u64>;
    /// The newest version of `name` that restores completely.
    fn latest(&self, name: &str) -> Result<Option<i32>>;
    /// What to apply, oldest first, to restore `name` at `version`.
    fn load(&self, name: &str, version: i32) -> Result<(Meta, Vec<Snapshot>)>;
}

/// Checks a checkpoint name: 1 to 128 of `[A-Za-z0-9_.-]`, not starting
/// with a dot (it names files).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
        return Err(AppError::Invalid(format!(
            "checkpoint name {name:?}: use 1 to 128 letters, digits, '_', '.', '-', not starting with '.'"
        )));
    }
    Ok(())
}

/// Removes the temporary files (`.NAME....tmp.PID`) of writers that are
/// dead: what a checkpoint killed before its rename left behind.
pub fn remove_stale_temporaries(dir: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some((_, pid)) = n.rsplit_once(".tmp.") else {
            continue;
        };
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if n.starts_with('.') && !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Holds a commit forever before it becomes visible, when the environment
/// asks for it (`STASIS_APP_TEST_HOLD_COMMIT=PATH:N`: at the Nth commit of
/// this process, create PATH and wait to be killed). For the tests that
/// kill a program during a checkpoint.
pub fn test_hold(commits: u64) {
    let Ok(v) = std::env::var("STASIS_APP_TEST_HOLD_COMMIT") else {
        return;
    };
    let Some((path, n)) = v.rsplit_once(':') else {
        return;
    };
    if n.parse::<u64>().ok() != Some(commits) {
        return;
    }
    let _ = std::fs::write(path, commits.to_string());
    loop {
        std::thread::park();
    }
}
