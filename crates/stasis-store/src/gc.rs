//! `stasis gc -D s3://...`: keep the newest N checkpoints of a store, and
//! delete the chunks no checkpoint needs (reachability).
//!
//! 1. A kept checkpoint whose parent is not kept is merged, as a local gc
//!    does: its chain is downloaded into a private temporary directory,
//!    merged there into a full checkpoint (`ImageDir::gc`), its chunks are
//!    uploaded (most exist already) and its commit record is replaced (one
//!    atomic overwrite: the name holds the old chain or the equivalent
//!    full checkpoint, never neither). A cluster agent's checkpoint keeps
//!    its `cut.json` (its round).
//! 2. Older checkpoints are deleted newest first (their commit records),
//!    so every checkpoint still listed keeps its whole chain.
//!    Their touch sets (`touch.rs`) are deleted next.
//! 3. Sweep, by reachability, of each chunk root the store's records use
//!    (its own `chunks/`, and the shared `chunks/` of an ancestor prefix
//!    for a cluster agent's trees, format 3): the chunks there that no
//!    commit record of *any* store under that root names (every tree, job
//!    and host sharing it) and older than [`SWEEP_AGE_S`] are deleted. A
//!    dump running meanwhile (into this store or any other sharing the
//!    root) is safe: it writes every chunk it needs unless the root has it
//!    younger than `REFRESH_AGE_S` (half of `SWEEP_AGE_S`), so a chunk it
//!    relies on cannot be swept before its commit unless that commit comes
//!    more than half an hour after the dump listed the chunks.
//!
//! A crash at any step leaves every listed checkpoint restorable, and a
//! second gc finishes the job. [`gc_under`] collects every store under a
//! prefix that is not itself one (all the trees of a job, of a host, or of
//! an agent's store), then sweeps each chunk root once.

pub use stasis_image::GcReport;
use stasis_image::ImageDir;

use crate::s3image::S3Image;
use crate::StoreError;

/// Unnamed chunks younger than this may belong to a running dump.
pub const SWEEP_AGE_S: i64 = 2 * crate::s3image::REFRESH_AGE_S;

/// Chunks deleted by a gc's sweep.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Swept {
    pub chunks: u64,
    pub bytes: u64,
}

/// Keeps the newest `keep` checkpoints (`keep >= 1`), then sweeps the
/// chunks unnamed for at least `sweep_age_s` ([`SWEEP_AGE_S`] unless a
/// caller knows no dump runs).
pub fn gc(image: &S3Image, keep: usize, sweep_age_s: i64) -> Result<(GcReport, Swept), StoreError> {
    let (report, roots) = collect(image, keep)?;
    Ok((report, sweep(image, &roots, sweep_age_s)?))
}

/// [`gc`] of every store under `image`'s prefix (each keeps its newest
/// `keep`), then one sweep of each chunk root they use: for a prefix
/// holding several stores (a cluster agent's `PREFIX`, `PREFIX/HOST`,
/// `PREFIX/HOST/jobs/JOB`). Returns each store's URL and report.
pub fn gc_under(
    image: &S3Image,
    keep: usize,
    sweep_age_s: i64,
) -> Result<(Vec<(String, GcReport)>, Swept), StoreError> {
    let mut reports = Vec::new();
    let mut roots = Vec::new();
    for prefix in image.stores_under()? {
        let store = image.sibling(&prefix);
        let (report, r) = collect(&store, keep)?;
        roots.extend(r);
        reports.push((store.url.clone(), report));
    }
    Ok((reports, sweep(image, &roots, sweep_age_s)?))
}

fn sweep(image: &S3Image, roots: &[String], sweep_age_s: i64) -> Result<Swept, StoreError> {
    let mut roots = roots.to_vec();
    roots.sort();
    roots.dedup();
    let mut swept = Swept::default();
    for root in roots {
        let (chunks, bytes) = image.sweep_root(&root, sweep_age_s)?;
        swept.chunks += chunks;
        swept.bytes += bytes;
    }
    Ok(swept)
}

/// Steps 1 and 2 of one store; returns the chunk roots its records use
/// (its own prefix always: chunks written before they were shared).
fn collect(image: &S3Image, keep: usize) -> Result<(GcReport, Vec<String>), StoreError> {
    let keep = keep.max(1);
    let all = image.committed()?;
    let split = all.len().saturating_sub(keep);
    let (old, kept) = all.split_at(split);
    let mut report = GcReport {
        kept: kept.to_vec(),
        deleted: Vec::new(),
        merged: Vec::new(),
        stale_temps_removed: 0,
    };
    let mut roots = vec![image.prefix().to_string()];
    for &k in kept {
        let r = image.record(k)?;
        roots.push(image.chunk_root(&r)?);
        match r.parent {
            Some(p) if !kept.contains(&p) => {}
            _ => continue,
        }
        let tmp = crate::fetch_to_temp(image, Some(k))?;
        let local = ImageDir::open(&tmp.image())?;
        // A cluster agent's checkpoint names its round in `cut.json`,
        // which the local merge does not carry over: kept.
        let cut_path = local.load(Some(k))?.dir().join(stasis_image::CUT_NAME);
        let cut = std::fs::read(&cut_path).ok();
        let merged = local.gc(1)?;
        let dir = local.load(Some(k))?.dir().to_path_buf();
        if let Some(c) = &cut {
            let p = dir.join(stasis_image::CUT_NAME);
            if !p.exists() {
                stasis_image::write_atomic_file(&p, c)?;
            }
        }
        let manifest = crate::s3image::read_file(&dir.join(stasis_image::MANIFEST_NAME))?;
        // Same key as the record it replaces, into the chunks it used.
        let (new, _) = image.upload_data_replacing(&r, &dir, (k, None), manifest)?;
        image.replace_record(new)?;
        report.merged.extend(merged.merged);
    }
    for &n in old.iter().rev() {
        image.delete(n)?;
        report.deleted.push(n);
    }
    report.deleted.sort_unstable();
    // The touch sets of the deleted checkpoints.
    image.sweep_touch()?;
    Ok((report, roots))
}
