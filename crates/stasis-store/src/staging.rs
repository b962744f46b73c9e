//! A dump into an object store is written into a local *staging* image
//! directory by the ordinary capture code, and uploaded from there
//! between its `prepare` and its local commit (the `Cut::written` hook):
//! a dump whose upload fails fails, so a dump that kills its tree kills it
//! only once the checkpoint is committed in the store.
//!
//! The staging directory persists per store (`$STASIS_S3_STAGING`, else
//! `/var/tmp/stasis-s3`, then a hash of endpoint, bucket and prefix): it
//! keeps the chain of the latest checkpoint (an incremental dump is
//! planned against its manifests and reads its parent's packs) and the
//! dirty-tracking state; older local checkpoints are deleted once
//! uploaded. With an encryption key nothing stays: every local checkpoint
//! is deleted once uploaded ([`Staging::clear`]), so the plaintext of an
//! encrypted store's checkpoints is on local disk only while its dump
//! runs, and the next dump is full (the store's shared chunks keep it from
//! storing unchanged data again). Local checkpoint numbers
//! are mapped to the store's in `remote.json`; if the store's latest
//! checkpoint is not the one this staging directory uploaded last (another
//! host dumped, or the staging directory was lost), the staging directory
//! is emptied and the next dump is full.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stasis_image::{checkpoint_dir_name, ImageDir, CHECKPOINTS_DIR, LATEST_NAME, TEMP_PREFIX};

use crate::record::Record;
use crate::s3image::{read_file, S3Image, Uploaded};
use crate::StoreError;

const MAP_NAME: &str = "remote.json";
/// A checkpoint uploaded and not committed ([`Staging::stage`]).
const STAGED_NAME: &str = "staged.json";

/// What [`Staging::stage`] uploaded: the commit record to create once the
/// checkpoint is to be committed.
#[derive(Debug, Serialize, Deserialize)]
struct Staged {
    /// The staging directory's number of the checkpoint.
    local: u32,
    record: Record,
    up: Uploaded,
    /// The same checkpoint uploaded to each replica that took it.
    #[serde(default)]
    replicas: Vec<StagedCopy>,
    /// Why each other replica did not take it.
    #[serde(default)]
    failed: Vec<String>,
}

/// A checkpoint uploaded to a replica and not committed there.
#[derive(Debug, Serialize, Deserialize)]
struct StagedCopy {
    url: String,
    record: Record,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RemoteMap {
    url: String,
    /// Local checkpoint number -> the store's.
    map: BTreeMap<u32, u32>,
}

/// A manifest renumbered for a store.
struct Renumbered {
    bytes: Vec<u8>,
    /// The parent, in the store's numbers.
    parent: Option<u32>,
    /// The parent, in the staging directory's numbers.
    local_parent: Option<u32>,
}

/// The staging directory of one store.
pub struct Staging {
    /// The staging image directory (`BASE/image`).
    dir: PathBuf,
    /// `BASE`: holds `remote.json` and `image/`.
    base: PathBuf,
    url: String,
}

impl Staging {
    /// The staging directory for `image`, created 0700 if missing.
    pub fn for_image(image: &S3Image) -> Result<Staging, StoreError> {
        let root = std::env::var_os("STASIS_S3_STAGING")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/stasis-s3"));
        let id = blake3::hash(format!("{}\n{}", image.bucket.endpoint, image.url).as_bytes());
        let base = root.join(&id.to_hex()[..24]);
        let dir = base.join("image");
        fs::create_dir_all(&dir).map_err(StoreError::local("create directory", &dir))?;
        use std::os::unix::fs::PermissionsExt;
        for d in [&root, &base, &dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))
                .map_err(StoreError::local("chmod 700", d))?;
        }
        Ok(Staging {
            dir,
            base,
            url: image.url.clone(),
        })
    }

    /// The local image directory the capture writes into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn load_map(&self) -> RemoteMap {
        read_file(&self.base.join(MAP_NAME))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn save_map(&self, m: &RemoteMap) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(m).unwrap_or_default();
        stasis_image::write_atomic_file(&self.base.join(MAP_NAME), &bytes)?;
        Ok(())
    }

    /// The store's number of local checkpoint `n`, once uploaded.
    pub fn remote_number(&self, n: u32) -> Option<u32> {
        let m = self.load_map();
        (m.url == self.url)
            .then(|| m.map.get(&n).copied())
            .flatten()
    }

    /// Before a dump: empties the staging directory unless its latest
    /// checkpoint is the store's latest. Returns whether it was emptied
    /// (the caller then drops the tracking state).
    pub fn sync(&self, image: &S3Image) -> Result<bool, StoreError> {
        if image.seal.encrypts() {
            // An encrypted store's staging checkpoints are deleted after
            // each dump (and freed as they are uploaded): whatever a dump
            // killed before that left is never a parent.
            self.clear()?;
            return Ok(true);
        }
        let remote_latest = image.committed()?.last().copied();
        let m = self.load_map();
        let local_latest = ImageDir::open(&self.dir)
            .ok()
            .and_then(|d| d.latest().ok().flatten());
        let same = m.url == self.url
            && local_latest.and_then(|l| m.map.get(&l).copied()) == remote_latest
            && remote_latest.is_some();
        if same {
            return Ok(false);
        }
        self.clear()?;
        Ok(true)
    }

    /// Uploads the prepared (not yet committed) local checkpoint `n` as the
    /// store's next checkpoint and commits it there: first to each replica
    /// (with the ancestors it lacks, from this staging directory), then,
    /// if at least `min_replicas` of them hold it, to the primary, whose
    /// commit record is the commit point. Returns the primary's report
    /// and one line per replica.
    pub fn upload_prepared(
        &self,
        image: &S3Image,
        (replicas, min_replicas): (&[S3Image], usize),
        n: u32,
    ) -> Result<(Uploaded, Vec<String>), StoreError> {
        let temp = self.prepared_dir(n)?;
        let mut m = self.load_map();
        let remote_n = image.committed()?.last().copied().unwrap_or(0) + 1;
        let Renumbered {
            bytes,
            parent,
            local_parent,
        } = self.renumbered(&temp, n, remote_n, &m)?;
        let mut lines = Vec::new();
        let mut held = 0;
        for r in replicas {
            match self.replicate(
                r,
                &temp,
                (bytes.clone(), remote_n, parent),
                local_parent,
                &m,
            ) {
                Ok(()) => {
                    held += 1;
                    lines.push(format!("replica {}: holds checkpoint {remote_n}", r.url));
                }
                Err(e) => lines.push(format!("replica {}: failed: {e}", r.url)),
            }
        }
        if held < min_replicas {
            return Err(StoreError::Replicas {
                url: self.url.clone(),
                held,
                needed: min_replicas,
                detail: lines.join("; "),
            });
        }
        // With a key, the staging checkpoint is deleted once uploaded (its
        // plaintext does not stay on local disk): freed as it is read.
        let skip = [stasis_image::CUT_NAME];
        let up = if image.seal.encrypts() {
            image.upload_consuming(&temp, (remote_n, parent), bytes, &skip)?
        } else {
            image.upload(&temp, (remote_n, parent), bytes, &skip)?
        };
        m.url = self.url.clone();
        m.map.insert(n, remote_n);
        self.save_map(&m)?;
        Ok((up, lines))
    }

    /// The temporary directory of the prepared local checkpoint `n`.
    fn prepared_dir(&self, n: u32) -> Result<PathBuf, StoreError> {
        let cps = self.dir.join(CHECKPOINTS_DIR);
        let want = format!(
            "{TEMP_PREFIX}{}-{}-",
            checkpoint_dir_name(n),
            std::process::id()
        );
        fs::read_dir(&cps)
            .map_err(StoreError::local("list", &cps))?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().starts_with(&want))
            .map(|e| e.path())
            .ok_or_else(|| StoreError::Local {
                action: "find the prepared checkpoint",
                path: cps.join(&want),
                source: std::io::ErrorKind::NotFound.into(),
            })
    }

    /// The manifest of local checkpoint `n` in `dir` renumbered as the
    /// store's `remote_n`.
    fn renumbered(
        &self,
        dir: &Path,
        n: u32,
        remote_n: u32,
        m: &RemoteMap,
    ) -> Result<Renumbered, StoreError> {
        let mpath = dir.join(stasis_image::MANIFEST_NAME);
        let mut manifest = stasis_image::decode_manifest(&read_file(&mpath)?, n, &mpath)?;
        let local_parent = manifest.parent;
        let parent = match local_parent {
            Some(p) => Some(*m.map.get(&p).ok_or(StoreError::BrokenChain {
                url: self.url.clone(),
                checkpoint: remote_n,
                parent: p,
            })?),
            None => None,
        };
        manifest.checkpoint = remote_n;
        manifest.parent = parent;
        // The cut mark was only the hook that brought us here.
        manifest.cut = None;
        Ok(Renumbered {
            bytes: stasis_image::encode_manifest(&manifest)?,
            parent,
            local_parent,
        })
    }

    /// Uploads a checkpoint to a replica, after the ancestors it lacks.
    fn replicate(
        &self,
        r: &S3Image,
        temp: &Path,
        (bytes, remote_n, parent): (Vec<u8>, u32, Option<u32>),
        local_parent: Option<u32>,
        m: &RemoteMap,
    ) -> Result<(), StoreError> {
        let skip = [stasis_image::CUT_NAME];
        self.replicate_ancestors(r, remote_n, local_parent, m, &skip)?;
        r.upload(temp, (remote_n, parent), bytes, &skip)?;
        Ok(())
    }

    /// Uploads and commits to replica `r` the ancestors of checkpoint
    /// `remote_n` (local parent `local_parent`) it lacks, oldest first,
    /// from this staging directory (which holds the chain), leaving out
    /// the files named in `skip`.
    fn replicate_ancestors(
        &self,
        r: &S3Image,
        remote_n: u32,
        mut local_parent: Option<u32>,
        m: &RemoteMap,
        skip: &[&str],
    ) -> Result<(), StoreError> {
        let committed = r.committed()?;
        let local = ImageDir::open(&self.dir)?;
        let mut missing = Vec::new();
        while let Some(lp) = local_parent {
            let rp = *m.map.get(&lp).ok_or(StoreError::BrokenChain {
                url: r.url.clone(),
                checkpoint: remote_n,
                parent: lp,
            })?;
            if committed.contains(&rp) {
                break;
            }
            missing.push((lp, rp));
            local_parent = local.load(Some(lp))?.manifest.parent;
        }
        for (lp, rp) in missing.into_iter().rev() {
            let dir = self.dir.join(CHECKPOINTS_DIR).join(checkpoint_dir_name(lp));
            let x = self.renumbered(&dir, lp, rp, m)?;
            r.upload(&dir, (rp, x.parent), x.bytes, skip)?;
        }
        Ok(())
    }

    /// Deletes every local checkpoint (the next dump starts over, full):
    /// after a dump into an encrypted store, or when the store moved on.
    pub fn clear(&self) -> Result<(), StoreError> {
        let cps = self.dir.join(CHECKPOINTS_DIR);
        if cps.exists() {
            fs::remove_dir_all(&cps).map_err(StoreError::local("remove", &cps))?;
        }
        let _ = fs::remove_file(self.dir.join(LATEST_NAME));
        self.save_map(&RemoteMap {
            url: self.url.clone(),
            map: BTreeMap::new(),
        })
    }

    /// After a dump: drops the local checkpoints outside the chain of the
    /// latest one (an incremental dump reads its parent's packs, so the
    /// chain stays whole).
    pub fn trim(&self) -> Result<(), StoreError> {
        let image = ImageDir::open(&self.dir)?;
        let chain: Vec<u32> = match image.latest()? {
            Some(n) => stasis_image::load_chain(&image, Some(n))?
                .iter()
                .map(|c| c.number)
                .collect(),
            None => Vec::new(),
        };
        let cps = self.dir.join(CHECKPOINTS_DIR);
        for n in image.checkpoints()? {
            let d = cps.join(checkpoint_dir_name(n));
            if !chain.contains(&n) {
                fs::remove_dir_all(&d).map_err(StoreError::local("remove", &d))?;
            }
        }
        let mut m = self.load_map();
        m.map.retain(|k, _| chain.contains(k));
        self.save_map(&m)
    }

    /// The staging directory at `base` (created 0700 if missing; its
    /// image directory is `base/image`), for a caller that keeps the
    /// staging directories of several stores under a directory of its own
    /// (an agent: one per tree of a job).
    pub fn at(base: &Path, image: &S3Image) -> Result<Staging, StoreError> {
        let dir = base.join("image");
        fs::create_dir_all(&dir).map_err(StoreError::local("create directory", &dir))?;
        use std::os::unix::fs::PermissionsExt;
        for d in [base, &dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))
                .map_err(StoreError::local("chmod 700", d))?;
        }
        Ok(Staging {
            dir,
            base: base.to_path_buf(),
            url: image.url.clone(),
        })
    }

    /// The first phase of a commit in two (a part of a cut across hosts):
    /// uploads the prepared (not yet committed) local checkpoint `n` as the
    /// store's next checkpoint, every file of it (its `cut.json` too: the
    /// rounds of a job are read from it), without creating its commit
    /// record, which is saved (synced) in the staging directory until
    /// [`commit_staged`](Self::commit_staged). Until then the store's
    /// readers ignore what was uploaded (and gc collects it if it is never
    /// committed).
    ///
    /// With `replicas`, the checkpoint is first uploaded the same way to
    /// each replica (under the primary's number, after the ancestors the
    /// replica lacks, which are committed there: their rounds were
    /// decided); if fewer than `min_replicas` take it, the stage fails.
    /// Returns the primary's report and one line per replica.
    pub fn stage(
        &self,
        image: &S3Image,
        replicas: (&[S3Image], usize),
        n: u32,
    ) -> Result<(Uploaded, Vec<String>), StoreError> {
        let temp = self.prepared_dir(n)?;
        self.stage_at(image, replicas, &temp, n)
    }

    fn stage_at(
        &self,
        image: &S3Image,
        (replicas, min_replicas): (&[S3Image], usize),
        temp: &Path,
        n: u32,
    ) -> Result<(Uploaded, Vec<String>), StoreError> {
        let m = self.load_map();
        let remote_n = image.committed()?.last().copied().unwrap_or(0) + 1;
        let Renumbered {
            bytes,
            parent,
            local_parent,
        } = self.renumbered(temp, n, remote_n, &m)?;
        let mut copies = Vec::new();
        let (mut lines, mut failed) = (Vec::new(), Vec::new());
        for r in replicas {
            let copy = self
                .replicate_ancestors(r, remote_n, local_parent, &m, &[])
                .and_then(|()| r.upload_data(temp, (remote_n, parent), bytes.clone(), &[]));
            match copy {
                Ok((record, _)) => {
                    lines.push(format!("replica {}: holds checkpoint {remote_n}", r.url));
                    copies.push(StagedCopy {
                        url: r.url.clone(),
                        record,
                    });
                }
                Err(e) => {
                    let l = format!("replica {}: failed: {e}", r.url);
                    lines.push(l.clone());
                    failed.push(l);
                }
            }
        }
        if copies.len() < min_replicas {
            return Err(StoreError::Replicas {
                url: self.url.clone(),
                held: copies.len(),
                needed: min_replicas,
                detail: lines.join("; "),
            });
        }
        let (record, up) = image.upload_data(temp, (remote_n, parent), bytes, &[])?;
        let staged = Staged {
            local: n,
            record,
            up: up.clone(),
            replicas: copies,
            failed,
        };
        let text = serde_json::to_vec(&staged).unwrap_or_default();
        stasis_image::write_atomic_file(&self.base.join(STAGED_NAME), &text)?;
        Ok((up, lines))
    }

    /// The second phase: creates the commit record [`stage`](Self::stage)
    /// saved for local checkpoint `n` (the commit point in the store; the
    /// caller commits the local checkpoint after it). A record already
    /// there with the same files is this one, created by a run that died
    /// before its local commit.
    ///
    /// The copies staged in `replicas` are committed first; a replica that
    /// fails then is reported in its line (the round is decided: the
    /// primary commits whatever the replicas say). Returns the primary's
    /// report and one line per replica.
    pub fn commit_staged(
        &self,
        image: &S3Image,
        replicas: &[S3Image],
        n: u32,
    ) -> Result<(Uploaded, Vec<String>), StoreError> {
        let path = self.base.join(STAGED_NAME);
        let staged: Staged = read_file(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|s: &Staged| s.local == n)
            .ok_or_else(|| StoreError::Local {
                action: "find the staged checkpoint in",
                path: path.clone(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        let remote_n = staged.record.checkpoint;
        let mut lines = staged.failed;
        for copy in staged.replicas {
            let Some(r) = replicas.iter().find(|r| r.url == copy.url) else {
                lines.push(format!(
                    "replica {}: not committed (not a replica of this run)",
                    copy.url
                ));
                continue;
            };
            lines.push(match commit_record(r, copy.record, Uploaded::default()) {
                Ok(_) => format!("replica {}: holds checkpoint {remote_n}", r.url),
                Err(e) => format!(
                    "replica {}: failed to commit checkpoint {remote_n}: {e}",
                    r.url
                ),
            });
        }
        let up = commit_record(image, staged.record, staged.up)?;
        let mut m = self.load_map();
        m.url = self.url.clone();
        m.map.insert(n, remote_n);
        self.save_map(&m)?;
        let _ = fs::remove_file(&path);
        Ok((up, lines))
    }

    /// Forgets what [`stage`](Self::stage) saved (its round was aborted):
    /// the uploaded chunks stay unnamed, for gc.
    pub fn unstage(&self) {
        let _ = fs::remove_file(self.base.join(STAGED_NAME));
    }

    /// Finishes the commit of the prepared checkpoint `t` that a process
    /// which died left in the staging directory, the decision to commit it
    /// having been recorded: stages it again unless it was, commits it in
    /// the store (unless it was: mapped already), then locally. Returns the
    /// store's number of it.
    pub fn commit_left(
        &self,
        image: &S3Image,
        replicas: &[S3Image],
        t: &stasis_image::PreparedTemp,
    ) -> Result<(u32, Vec<String>), StoreError> {
        if let Some(&remote) = self.load_map().map.get(&t.number) {
            // Committed in the store already; not yet locally.
            ImageDir::open(&self.dir)?.commit_left_prepared(t)?;
            return Ok((remote, Vec::new()));
        }
        let staged = read_file(&self.base.join(STAGED_NAME))
            .ok()
            .and_then(|b| serde_json::from_slice::<Staged>(&b).ok())
            .is_some_and(|s| s.local == t.number);
        if !staged {
            // The round is decided: the replicas that take it hold it.
            self.stage_at(image, (replicas, 0), &t.path, t.number)?;
        }
        let (up, lines) = self.commit_staged(image, replicas, t.number)?;
        ImageDir::open(&self.dir)?.commit_left_prepared(t)?;
        Ok((up.checkpoint, lines))
    }
}

/// Creates the commit record `record` in `image`; a record already there
/// with the same files is this one (created by a run that died before it
/// could say so).
fn commit_record(image: &S3Image, record: Record, up: Uploaded) -> Result<Uploaded, StoreError> {
    let n = record.checkpoint;
    let files = record.files.clone();
    let wrapped = record.wrapped_key.clone();
    // Under age recipients this host may hold no identity to read the
    // record: it is its own if it has the same wrapped key (that of a
    // random data key).
    let own = |r: Result<Record, StoreError>| {
        r.is_ok_and(|r| r.files == files && r.wrapped_key == wrapped)
    };
    match image.commit_uploaded((record, up.clone())) {
        Err(StoreError::CommitRace { .. })
            if own(match &wrapped {
                Some(_) => image.record_as_stored(n),
                None => image.record(n),
            }) =>
        {
            Ok(up)
        }
        r => r,
    }
}

/// A private local directory (created 0700) for a long-running client of
/// the store `image` named `who` (an agent: the staging directories of its
/// trees, the decisions of its rounds): `$STASIS_S3_STAGING` (else
/// `/var/tmp/stasis-s3`), then `agent-` and a hash of endpoint, URL and
/// name.
pub fn client_dir(image: &S3Image, who: &str) -> Result<PathBuf, StoreError> {
    let root = std::env::var_os("STASIS_S3_STAGING")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/stasis-s3"));
    let id = blake3::hash(format!("{}\n{}\n{who}", image.bucket.endpoint, image.url).as_bytes());
    let dir = root.join(format!("agent-{}", &id.to_hex()[..24]));
    fs::create_dir_all(&dir).map_err(StoreError::local("create directory", &dir))?;
    use std::os::unix::fs::PermissionsExt;
    for d in [&root, &dir] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o700))
            .map_err(StoreError::local("chmod 700", d))?;
    }
    Ok(dir)
}
