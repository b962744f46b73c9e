//! Where an agent keeps the checkpoints of its trees: its local directory
//! (`-D DIR`, [`LocalStorage`], laid out as in [`crate::jobs`]) or an
//! object store (`-D s3://...`, implemented by the `stasis` crate's glue
//! with `stasis-store`).
//!
//! Every tree is dumped into a local image directory ([`Storage::dump_dir`])
//! with the round's two-phase commit: its checkpoint is prepared there
//! (tentative), then [`Storage::stage`] stores it without making it
//! visible (an object store: every object uploaded, no commit record), and
//! only then does the agent vote yes (`Written`); a failure to stage is a
//! no vote. Once the decision is recorded, [`Storage::commit`] makes it
//! visible (an object store: its commit record), then the local checkpoint
//! is committed. A restore reads a local copy ([`Storage::restore_source`]).

use std::path::{Path, PathBuf};

use crate::protocol::TreeRounds;
use crate::{jobs, ClusterError};

/// An agent's storage of its jobs.
pub trait Storage: Send + Sync {
    /// The directory or URL, for messages.
    fn describe(&self) -> String;

    /// The committed rounds of each tree of `job` it holds.
    fn rounds(&self, job: &str) -> Result<Vec<TreeRounds>, ClusterError>;

    /// The local image directory a dump of the tree `pid` of `job` writes
    /// into (called before each of its dumps).
    fn dump_dir(&self, job: &str, pid: i32) -> Result<PathBuf, ClusterError>;

    /// Checkpoint `n` of the tree is prepared in its dump directory: keeps
    /// it, invisible to readers until [`commit`](Self::commit). An error is
    /// a no vote.
    fn stage(&self, _job: &str, _pid: i32, _n: u32) -> Result<(), ClusterError> {
        Ok(())
    }

    /// The round of checkpoint `n` is decided: makes it visible, before the
    /// local commit. Returns what it stored, for the tree's report.
    fn commit(
        &self,
        _job: &str,
        _pid: i32,
        _n: u32,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        Ok(None)
    }

    /// The dump of the tree ended (`committed` or not).
    fn tidy(&self, _job: &str, _pid: i32, _committed: bool) {}

    /// A local image holding checkpoint `n` of the tree, for a restore
    /// (`lazy`: what a lazy restore needs before the tree runs).
    fn restore_source(
        &self,
        job: &str,
        pid: i32,
        n: u32,
        lazy: bool,
    ) -> Result<RestoreSource, ClusterError>;

    /// Finishes the commits of rounds decided before the agent stopped,
    /// drops the tentative checkpoints of the others; one line per commit.
    fn recover(&self) -> Result<Vec<String>, ClusterError>;
}

/// What a tree is restored from.
pub struct RestoreSource {
    /// A local image directory holding the checkpoint.
    pub dir: PathBuf,
    pub checkpoint: u32,
    /// Further arguments of a lazy restore's page filler (where it reads
    /// the pages that are not in `dir`).
    pub filler_args: Vec<String>,
    /// Whether the filler records the fault order into `dir` (not into a
    /// temporary copy).
    pub record_faults: bool,
    /// Keeps a temporary copy until the restore is done.
    pub keep: Option<Box<dyn Send>>,
}

/// `-D DIR`: the checkpoints in a local directory ([`crate::jobs`]).
pub struct LocalStorage {
    pub dir: PathBuf,
}

impl Storage for LocalStorage {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn rounds(&self, job: &str) -> Result<Vec<TreeRounds>, ClusterError> {
        jobs::rounds(&self.dir, job)
    }

    fn dump_dir(&self, job: &str, pid: i32) -> Result<PathBuf, ClusterError> {
        Ok(jobs::tree_dir(&self.dir, job, pid))
    }

    fn restore_source(
        &self,
        job: &str,
        pid: i32,
        n: u32,
        _lazy: bool,
    ) -> Result<RestoreSource, ClusterError> {
        Ok(RestoreSource {
            dir: jobs::tree_dir(&self.dir, job, pid),
            checkpoint: n,
            filler_args: Vec::new(),
            record_faults: true,
            keep: None,
        })
    }

    fn recover(&self) -> Result<Vec<String>, ClusterError> {
        jobs::recover(&self.dir)
    }
}

impl LocalStorage {
    pub fn new(dir: &Path) -> LocalStorage {
        LocalStorage {
            dir: dir.to_path_buf(),
        }
    }
}

impl std::fmt::Debug for dyn Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}
