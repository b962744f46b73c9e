//! `stasis agent -D s3://BUCKET/PREFIX`: an agent keeping the checkpoints
//! of its trees in an object store (docs/storage.md, "Cluster agents").
//!
//! The tree rooted at `PID` of job `JOB` on the agent named `HOST` is the
//! store `PREFIX/HOST/jobs/JOB/PID/` (commit records, as for `dump -D
//! s3://...`), whose chunks are in `PREFIX/chunks/`, shared by every tree,
//! job and host of `PREFIX`; each checkpoint holds its `cut.json`, whose round
//! `cluster inspect` and `cluster restore` read. Locally the agent keeps,
//! under `stasis_store::client_dir`, what a local agent keeps under its
//! `-D DIR` (`jobs/JOB/decision.json`, the page fillers' logs) and a
//! staging directory per tree (`jobs/JOB/PID/`), which its dumps write
//! into.
//!
//! The round's two-phase commit holds in the store: a tree's checkpoint is
//! uploaded (its chunks, no commit record: invisible) before the agent
//! votes yes, an upload that fails is a no vote, and its commit record is
//! created only once the decision is recorded, before the local commit.
//! An agent that dies after the decision creates the records it had not
//! when it starts again (`recover`); a round aborted, or never decided,
//! leaves only unnamed chunks, which readers ignore and gc collects.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use stasis_cluster::jobs;
use stasis_cluster::protocol::TreeRounds;
use stasis_cluster::storage::{RestoreSource, Storage};
use stasis_cluster::ClusterError;
use stasis_store::seal::SealOptions;
use stasis_store::{Location, S3Image, Staging};

/// Largest `cut.json` read.
const CUT_MAX: u64 = 4096;
/// Levels of a tree's store below `-D` (`HOST/jobs/JOB/PID`): where the
/// shared `chunks/` is.
const TREE_DEPTH: u32 = 4;
/// Trees whose store client is kept open.
const MAX_OPEN: usize = 64;

/// The store of a tree, then its replica stores.
type TreeStores = Arc<Vec<S3Image>>;

/// An agent's storage in an object store.
pub struct S3Agent {
    /// `-D`, as given.
    url: String,
    /// The store at `-D`.
    root: S3Image,
    seal: SealOptions,
    host: String,
    /// The agent's local directory.
    local: PathBuf,
    /// The replicas' roots (`--replica`), each laid out as the store.
    replicas: Vec<S3Image>,
    /// How many replicas must take a tree's checkpoint for a yes vote.
    min_replicas: usize,
    /// The store of each tree, then its replica stores, opened once.
    trees: Mutex<HashMap<(String, i32), TreeStores>>,
    /// The round of each checkpoint read (a commit record does not change
    /// its round).
    rounds: Mutex<HashMap<(String, i32, u32), Option<u64>>>,
}

impl S3Agent {
    /// The storage of the agent named `host` in `root` (with `replicas`,
    /// `min_replicas` of which must take each checkpoint); fails now if the
    /// store cannot be listed (down, credentials refused, no bucket).
    pub fn open(
        root: S3Image,
        (replicas, min_replicas): (Vec<S3Image>, usize),
        seal: SealOptions,
        host: &str,
    ) -> Result<S3Agent> {
        let plain = !host.is_empty()
            && host.len() <= 64
            && host != "."
            && host != ".."
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !plain {
            anyhow::bail!(
                "the agent's name {host:?} names its directory in the store: give a plain one with --name (letters, digits, '-', '_', '.')"
            );
        }
        if min_replicas > replicas.len() {
            anyhow::bail!(
                "--min-replicas {min_replicas} with {} replica(s): at most as many as --replica gives",
                replicas.len()
            );
        }
        // With replicas, a store down now is not fatal as long as one of
        // them answers: it may be back by the next round (whose stage then
        // fails while it is not), and a restore reads the others.
        let mut up = 0;
        for s in std::iter::once(&root).chain(&replicas) {
            match s.bucket.list_dirs(s.prefix()) {
                Ok(_) => up += 1,
                Err(e) if replicas.is_empty() => {
                    return Err(e).with_context(|| format!("listing {}", s.url))
                }
                Err(e) => eprintln!("stasis agent: warning: {}: {e}", s.url),
            }
        }
        if up == 0 {
            anyhow::bail!("none of the store and its replicas can be listed (each said why above)");
        }
        let local = stasis_store::client_dir(&root, host)?;
        Ok(S3Agent {
            url: root.url.clone(),
            root,
            seal,
            host: host.to_string(),
            local,
            replicas,
            min_replicas,
            trees: Mutex::default(),
            rounds: Mutex::default(),
        })
    }

    /// The agent's local directory.
    pub fn local_dir(&self) -> PathBuf {
        self.local.clone()
    }

    fn err(&self, e: impl std::fmt::Display) -> ClusterError {
        ClusterError::Store {
            url: self.url.clone(),
            message: e.to_string(),
        }
    }

    /// The store of the tree `pid` of `job`, then its replica stores.
    fn tree(&self, job: &str, pid: i32) -> Result<TreeStores, ClusterError> {
        let key = (job.to_string(), pid);
        let mut trees = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = trees.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(self.open_tree(job, pid)?);
        if trees.len() >= MAX_OPEN {
            // Each client holds a runtime's threads: not kept for ever.
            trees.clear();
        }
        trees.insert(key, t.clone());
        Ok(t)
    }

    /// Opens the store of the tree `pid` of `job`, then its replica stores.
    fn open_tree(&self, job: &str, pid: i32) -> Result<Vec<S3Image>, ClusterError> {
        jobs::check_job(job)?;
        let roots =
            std::iter::once(self.url.as_str()).chain(self.replicas.iter().map(|r| r.url.as_str()));
        roots
            .map(|root| {
                let url = format!(
                    "{}/{}/jobs/{job}/{pid}",
                    root.trim_end_matches('/'),
                    self.host
                );
                let loc = Location::parse(&url).map_err(|e| self.err(e))?;
                // `HOST/jobs/JOB/PID` below `-D` (or `--replica`): every
                // tree of every job and host shares `PREFIX/chunks/`
                // (records say so; older trees' records name their own
                // `chunks/`, still read).
                S3Image::open(&loc, self.seal.clone())
                    .and_then(|i| i.share_chunks(TREE_DEPTH))
                    .map_err(|e| self.err(e))
            })
            .collect()
    }

    /// The staging directory of the tree `pid` of `job`.
    fn staging(&self, job: &str, pid: i32, image: &S3Image) -> Result<Staging, ClusterError> {
        Staging::at(&jobs::tree_dir(&self.local, job, pid), image).map_err(|e| self.err(e))
    }

    /// The committed rounds of each tree of `job` in store `i` (0: the
    /// primary, then the replicas) whose root is `root`.
    fn rounds_in(
        &self,
        job: &str,
        i: usize,
        root: &S3Image,
    ) -> Result<Vec<TreeRounds>, ClusterError> {
        let dir = format!("{}{}/jobs/{job}/", root.prefix(), self.host);
        let err = |e: &dyn std::fmt::Display| ClusterError::Store {
            url: root.url.clone(),
            message: e.to_string(),
        };
        let mut pids: Vec<i32> = root
            .bucket
            .list_dirs(&dir)
            .map_err(|e| err(&e))?
            .iter()
            .filter_map(|d| d.parse().ok())
            .collect();
        pids.sort_unstable();
        let mut out = Vec::new();
        for pid in pids {
            let stores = self.tree(job, pid)?;
            let image = &stores[i];
            let mut rounds = Vec::new();
            for n in image.committed().map_err(|e| err(&e))? {
                if let Some(r) = self.round_of(job, pid, image, n)? {
                    rounds.push((r, n));
                }
            }
            out.push(TreeRounds { pid, rounds });
        }
        Ok(out)
    }

    /// The round of checkpoint `n` of a tree (`None`: not of `job`). A
    /// store that cannot be read fails the listing (rather than hide a
    /// round, which the next round would then number again).
    fn round_of(
        &self,
        job: &str,
        pid: i32,
        image: &S3Image,
        n: u32,
    ) -> Result<Option<u64>, ClusterError> {
        let key = (job.to_string(), pid, n);
        if let Some(r) = self.rounds.lock().ok().and_then(|g| g.get(&key).copied()) {
            return Ok(r);
        }
        let text = image
            .small_file(n, stasis_image::CUT_NAME, CUT_MAX)
            .map_err(|e| {
                self.err(format!(
                    "reading the round of checkpoint {n} of {}: {e}",
                    image.url
                ))
            })?;
        let round = text
            .and_then(|t: Vec<u8>| {
                serde_json::from_slice::<stasis_image::manifest::CutMark>(&t).ok()
            })
            .filter(|c| c.job == job)
            .map(|c| c.round);
        if let Ok(mut g) = self.rounds.lock() {
            g.insert(key, round);
        }
        Ok(round)
    }
}

impl Storage for S3Agent {
    fn describe(&self) -> String {
        self.url.clone()
    }

    /// From the store, else (it cannot be read) from the first replica
    /// that can, saying so.
    fn rounds(&self, job: &str) -> Result<Vec<TreeRounds>, ClusterError> {
        jobs::check_job(job)?;
        let mut failed = Vec::new();
        for (i, root) in std::iter::once(&self.root)
            .chain(&self.replicas)
            .enumerate()
        {
            match self.rounds_in(job, i, root) {
                Ok(out) => {
                    if i > 0 {
                        eprintln!(
                            "stasis agent: job {job}: rounds read from replica {} ({})",
                            root.url,
                            failed.join("; ")
                        );
                    }
                    return Ok(out);
                }
                Err(e) => failed.push(e.to_string()),
            }
        }
        Err(self.err(failed.join("; ")))
    }

    fn dump_dir(&self, job: &str, pid: i32) -> Result<PathBuf, ClusterError> {
        let stores = self.tree(job, pid)?;
        let image = &stores[0];
        let staging = self.staging(job, pid, image)?;
        if staging.sync(image).map_err(|e| self.err(e))? {
            // What tracking there was is relative to checkpoints no longer here.
            let _ = stasis_track::state::clear(staging.dir());
        }
        Ok(staging.dir().to_path_buf())
    }

    fn stage(&self, job: &str, pid: i32, n: u32) -> Result<(), ClusterError> {
        let stores = self.tree(job, pid)?;
        let (image, replicas) = (&stores[0], &stores[1..]);
        let (_, lines) = self
            .staging(job, pid, image)?
            .stage(image, (replicas, self.min_replicas), n)
            .map_err(|e| self.err(e))?;
        for l in lines.iter().filter(|l| !l.contains(": holds checkpoint ")) {
            eprintln!("stasis agent: job {job}, tree {pid}: {l}");
        }
        Ok(())
    }

    fn commit(
        &self,
        job: &str,
        pid: i32,
        n: u32,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        let stores = self.tree(job, pid)?;
        let (image, replicas) = (&stores[0], &stores[1..]);
        let (up, lines) = self
            .staging(job, pid, image)?
            .commit_staged(image, replicas, n)
            .map_err(|e| self.err(e))?;
        let mut v = serde_json::to_value(&up).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.insert("url".into(), image.url.clone().into());
            m.insert("encrypted".into(), self.seal.encrypts().into());
            if !replicas.is_empty() {
                m.insert("replicas".into(), lines.into());
            }
        }
        Ok(Some(v))
    }

    fn tidy(&self, job: &str, pid: i32, committed: bool) {
        let Ok(stores) = self.tree(job, pid) else {
            return;
        };
        let Ok(staging) = self.staging(job, pid, &stores[0]) else {
            return;
        };
        let r = if !committed {
            staging.unstage();
            Ok(())
        } else if self.seal.encrypts() {
            // An encrypted store's plaintext does not stay on local disk.
            staging.clear().map(|()| {
                let _ = stasis_track::state::clear(staging.dir());
            })
        } else {
            staging.trim()
        };
        if let Err(e) = r {
            eprintln!(
                "stasis agent: warning: tidying the staging directory of tree {pid} of job {job}: {e}"
            );
        }
    }

    fn restore_source(
        &self,
        job: &str,
        pid: i32,
        n: u32,
        lazy: bool,
    ) -> Result<RestoreSource, ClusterError> {
        let mut stores = self.open_tree(job, pid)?;
        let image = stores.remove(0);
        let mut filler_args = Vec::new();
        let t = if lazy {
            let (t, url) = crate::store::fetch_lazy(image, stores, Some(n))
                .map_err(|e| self.err(format!("{e:#}")))?;
            filler_args.extend(["--store".to_string(), url]);
            if let Some(k) = &self.seal.key {
                filler_args.push("--encrypt-key-file".into());
                filler_args.push(k.file.to_string_lossy().into_owned());
            }
            for f in self.seal.identities.iter().flat_map(|i| &i.files) {
                filler_args.push("--decrypt-identity".into());
                filler_args.push(f.to_string_lossy().into_owned());
            }
            t
        } else {
            crate::store::fetch(image, stores, Some(n)).map_err(|e| self.err(format!("{e:#}")))?
        };
        Ok(RestoreSource {
            dir: t.image(),
            checkpoint: n,
            filler_args,
            // The local copy is temporary: nothing to record faults into.
            record_faults: false,
            keep: Some(Box::new(t)),
        })
    }

    fn recover(&self) -> Result<Vec<String>, ClusterError> {
        let mut done = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.local.join("jobs")) else {
            return Ok(done);
        };
        let me = std::process::id();
        for e in rd.filter_map(Result::ok) {
            let Some(job) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if jobs::check_job(&job).is_err() {
                continue;
            }
            let decided = jobs::decision(&self.local, &job).map(|d| d.round);
            let Ok(trees) = std::fs::read_dir(e.path()) else {
                continue;
            };
            for t in trees.filter_map(Result::ok) {
                let Some(pid) = t.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                    continue;
                };
                let stores = self.tree(&job, pid)?;
                let (image, replicas) = (&stores[0], &stores[1..]);
                let staging = self.staging(&job, pid, image)?;
                let Ok(dir) = stasis_image::ImageDir::open(staging.dir()) else {
                    continue;
                };
                for p in dir.prepared_temps()? {
                    let round = p.manifest.cut.as_ref().map(|c| c.round);
                    if p.owner == me || round.is_none() || decided != round {
                        continue;
                    }
                    let (n, lines) = staging
                        .commit_left(image, replicas, &p)
                        .map_err(|e| self.err(e))?;
                    done.push(format!(
                        "job {job}: committed checkpoint {n} of tree {pid} in {} (round {}, decided before the agent stopped)",
                        image.url,
                        round.unwrap_or(0)
                    ));
                    done.extend(
                        lines
                            .into_iter()
                            .map(|l| format!("job {job}, tree {pid}: {l}")),
                    );
                }
                dir.remove_stale_temps()?;
                staging.unstage();
            }
        }
        Ok(done)
    }
}
