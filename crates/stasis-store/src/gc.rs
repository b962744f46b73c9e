//! `stasis gc -D s3://...`: keep the newest N checkpoints of a store.
//!
//! 1. A kept checkpoint whose parent is not kept is merged, as a local gc
//!    does: its chain is downloaded into a private temporary directory,
//!    merged there into a full checkpoint (`ImageDir::gc`), the result is
//!    uploaded under a new data directory, and its commit record is
//!    replaced (one atomic overwrite: the name holds the old chain or the
//!    equivalent full checkpoint, never neither). Its old data goes.
//! 2. Older checkpoints are deleted newest first, each commit record
//!    before its data, so every checkpoint still listed keeps its chain.
//! 3. Upload directories no record names and older than an hour (dumps
//!    that died; a running upload is younger) are removed.
//!
//! A crash at any step leaves every listed checkpoint restorable, and a
//! second gc finishes the job.

pub use stasis_image::GcReport;
use stasis_image::ImageDir;

use crate::s3image::S3Image;
use crate::StoreError;

/// Upload directories younger than this may belong to a running dump.
const ORPHAN_AGE_S: i64 = 3600;

/// Keeps the newest `keep` checkpoints (`keep >= 1`).
pub fn gc(image: &S3Image, keep: usize) -> Result<GcReport, StoreError> {
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
    for &k in kept {
        let r = image.record(k)?;
        match r.parent {
            Some(p) if !kept.contains(&p) => {}
            _ => continue,
        }
        let tmp = crate::fetch_to_temp(image, Some(k))?;
        let local = ImageDir::open(&tmp.image())?;
        let merged = local.gc(1)?;
        let dir = local.load(Some(k))?.dir().to_path_buf();
        let manifest = crate::s3image::read_file(&dir.join(stasis_image::MANIFEST_NAME))?;
        let (new, _) = image.upload_data(&dir, (k, None), manifest, &[stasis_image::CUT_NAME])?;
        image.replace_record(new)?;
        image.delete_data(&r.data)?;
        report.merged.extend(merged.merged);
    }
    for &n in old.iter().rev() {
        image.delete(n)?;
        report.deleted.push(n);
    }
    report.deleted.sort_unstable();
    for (dir, _) in image.orphans(ORPHAN_AGE_S)? {
        image.delete_data(&dir)?;
        report.stale_temps_removed += 1;
    }
    Ok(report)
}
