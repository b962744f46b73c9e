//! An agent's storage of the jobs it checkpoints, under its `-D DIR`:
//!
//! ```text
//! DIR/jobs/JOB/PID/            one image directory per tree (root PID), its
//!                              checkpoints marked with the job and round
//! DIR/jobs/JOB/decision.json   the last commit decision of the job: round and
//!                              the checkpoint of each tree (atomic, synced)
//! DIR/jobs/JOB/lazy-PID.log    the page filler's messages of the last lazy
//!                              restore of the tree
//! ```
//!
//! A checkpoint is *tentative* (a temporary name, prepared: complete and
//! synced) until the decision of its round is recorded; then it is renamed
//! into place. [`recover`] finishes the commits an agent that died after
//! recording a decision had not done.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stasis_image::ImageDir;

use crate::protocol::TreeRounds;
use crate::ClusterError;

/// The decision to commit one round, as recorded before any commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub round: u64,
    /// (tree root PID, checkpoint number) of every tree of this host.
    pub checkpoints: Vec<(i32, u32)>,
}

/// Whether `job` is a usable job name (it names a directory).
pub fn check_job(job: &str) -> Result<(), ClusterError> {
    let ok = !job.is_empty()
        && job.len() <= 64
        && job != "."
        && job != ".."
        && job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ClusterError::BadJob(job.into()))
    }
}

/// The directory of job `job`.
pub fn job_dir(root: &Path, job: &str) -> PathBuf {
    root.join("jobs").join(job)
}

/// The image directory of the tree rooted at `pid` in job `job`.
pub fn tree_dir(root: &Path, job: &str, pid: i32) -> PathBuf {
    job_dir(root, job).join(pid.to_string())
}

/// Where the page filler of a lazy restore of the tree `pid` of `job`
/// logs.
pub fn filler_log(root: &Path, job: &str, pid: i32) -> PathBuf {
    job_dir(root, job).join(format!("lazy-{pid}.log"))
}

/// Records the decision of a round, atomically and synced.
pub fn record_decision(root: &Path, job: &str, d: &Decision) -> Result<(), ClusterError> {
    let dir = job_dir(root, job);
    std::fs::create_dir_all(&dir).map_err(|source| ClusterError::Io {
        what: "create",
        path: dir.clone(),
        source,
    })?;
    let body = serde_json::to_vec_pretty(d).map_err(|e| ClusterError::Io {
        what: "encode the decision for",
        path: dir.clone(),
        source: std::io::Error::other(e),
    })?;
    stasis_image::write_atomic_file(&dir.join("decision.json"), &body)?;
    Ok(())
}

/// The last decision recorded for `job`, if any.
pub fn decision(root: &Path, job: &str) -> Option<Decision> {
    let text = std::fs::read(job_dir(root, job).join("decision.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The roots of the trees of `job` this agent holds: those whose image
/// directory holds a checkpoint or did (marked). A tree whose first dump
/// stopped before its first checkpoint (an aborted round, an agent killed)
/// left an empty, unmarked directory: it holds nothing.
pub fn trees(root: &Path, job: &str) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir(job_dir(root, job)) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            !matches!(
                ImageDir::open(&e.path()),
                Err(stasis_image::ImageError::NotImageDir { .. })
            )
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The committed rounds of each tree of `job` (oldest first).
pub fn rounds(root: &Path, job: &str) -> Result<Vec<TreeRounds>, ClusterError> {
    let mut out = Vec::new();
    for pid in trees(root, job) {
        let image = ImageDir::open(&tree_dir(root, job, pid))?;
        let mut rounds = Vec::new();
        for n in image.checkpoints()? {
            if let Some(c) = image.cut_mark(n).filter(|c| c.job == job) {
                rounds.push((c.round, n));
            }
        }
        out.push(TreeRounds { pid, rounds });
    }
    Ok(out)
}

/// Finishes what an agent that died left: in every job, the tentative
/// checkpoints of its last decided round are committed; the other
/// tentative checkpoints (rounds never decided) are removed. Returns one
/// line per checkpoint committed.
pub fn recover(root: &Path) -> Result<Vec<String>, ClusterError> {
    let mut done = Vec::new();
    let Ok(rd) = std::fs::read_dir(root.join("jobs")) else {
        return Ok(done);
    };
    let me = std::process::id();
    for e in rd.filter_map(Result::ok) {
        let Some(job) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let decided = decision(root, &job);
        for pid in trees(root, &job) {
            let image = ImageDir::open(&tree_dir(root, &job, pid))?;
            for t in image.prepared_temps()? {
                let round = t.manifest.cut.as_ref().map(|c| c.round);
                if t.owner == me || decided.as_ref().map(|d| d.round) != round {
                    continue;
                }
                let n = image.commit_left_prepared(&t)?;
                done.push(format!(
                    "job {job}: committed checkpoint {n} of tree {pid} (round {}, decided before the agent stopped)",
                    round.unwrap_or(0)
                ));
            }
            image.remove_stale_temps()?;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names_that_are_not_plain_directory_names_are_refused() {
        for ok in ["mesh", "job-1", "a.b_c"] {
            check_job(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "x y", &"j".repeat(65)] {
            assert!(check_job(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_tree_whose_first_dump_stopped_early_is_no_tree() {
        let d = tempfile::tempdir().unwrap();
        // 7: a checkpoint begun (marked); 8: only its directory made.
        let marked = ImageDir::create_or_open(&tree_dir(d.path(), "j", 7)).unwrap();
        drop(marked.begin_checkpoint().unwrap());
        ImageDir::create_or_open(&tree_dir(d.path(), "j", 8)).unwrap();
        assert_eq!(trees(d.path(), "j"), vec![7]);
        let r = rounds(d.path(), "j").unwrap();
        assert_eq!((r.len(), r[0].pid, r[0].rounds.len()), (1, 7, 0));
        assert!(recover(d.path()).unwrap().is_empty());
    }

    #[test]
    fn decisions_round_trip() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(decision(d.path(), "j"), None);
        let dec = Decision {
            round: 4,
            checkpoints: vec![(100, 7), (200, 2)],
        };
        record_decision(d.path(), "j", &dec).unwrap();
        assert_eq!(decision(d.path(), "j"), Some(dec));
        assert!(trees(d.path(), "j").is_empty());
    }
}
