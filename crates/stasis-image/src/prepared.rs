//! The two-phase commit of a checkpoint that is one part of a cut across
//! hosts (`CheckpointBuilder::prepare` / `commit_prepared`, in
//! `store.rs`), and what an agent that died between the phases finds
//! again: the prepared checkpoints left under temporary names, their
//! commit, and the cut mark of each checkpoint (`cut.json`). See
//! `docs/image-format.md`, "Commit protocol".

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tracing::debug;

use crate::fsutil::{self, is_plain_name, Kind};
use crate::manifest::Manifest;
use crate::pack::PackReader;
use crate::store::{checkpoint_dir_name, temp_owner, CHECKPOINTS_DIR, LATEST_NAME, MANIFEST_NAME};
use crate::{ImageDir, ImageError};

/// Name of the copy of a checkpoint's cut mark (`Manifest::cut`) kept
/// beside its manifest, so that the rounds of a job are listed without
/// decoding every manifest.
pub const CUT_NAME: &str = "cut.json";

/// Checks every pack `manifest` references in `dir` (plain names; header,
/// index and trailer against its `PackRef`), before a commit.
pub(crate) fn check_packs(dir: &Path, manifest: &Manifest, number: u32) -> Result<(), ImageError> {
    check_pack_names(manifest, number)?;
    for r in crate::pack_refs(manifest) {
        PackReader::open_inner(&dir.join(&r.name), Some(r), Some(number))?;
    }
    Ok(())
}

/// Every pack `manifest` names is a plain file name (never a path out of
/// its checkpoint directory).
pub(crate) fn check_pack_names(manifest: &Manifest, number: u32) -> Result<(), ImageError> {
    for r in crate::pack_refs(manifest) {
        if !is_plain_name(&r.name) {
            return Err(ImageError::UnsafeName {
                checkpoint: Some(number),
                name: r.name.clone(),
            });
        }
    }
    Ok(())
}

/// Renames the complete checkpoint `number` at `temp_dir` into place in
/// `image` (`placed` is called once the rename is done), syncs, and points
/// `latest` at it.
pub(crate) fn place(
    image: &Path,
    number: u32,
    temp_dir: &Path,
    placed: impl FnOnce(),
) -> Result<(), ImageError> {
    let cps = image.join(CHECKPOINTS_DIR);
    let final_dir = cps.join(checkpoint_dir_name(number));
    if !matches!(fsutil::kind(&final_dir)?, Kind::Missing) {
        return Err(ImageError::Io {
            action: "commit checkpoint to",
            path: final_dir,
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    fs::rename(temp_dir, &final_dir).map_err(ImageError::io(
        "rename checkpoint into place at",
        &final_dir,
    ))?;
    placed();
    fsutil::sync_dir(&cps)?;
    fsutil::write_atomic(image, LATEST_NAME, format!("{number}\n").as_bytes())?;
    debug!(dir = %final_dir.display(), number, "committed checkpoint");
    Ok(())
}

/// A checkpoint prepared ([`CheckpointBuilder::prepare`]) and not
/// committed, under its temporary name.
#[derive(Debug)]
pub struct PreparedTemp {
    pub number: u32,
    /// The process that made it.
    pub owner: u32,
    pub path: PathBuf,
    pub manifest: Manifest,
}

impl ImageDir {
    /// The prepared checkpoints under temporary names (a complete, valid
    /// manifest), oldest first, with the process that made each: the
    /// caller tells those of dead processes from those being made.
    pub fn prepared_temps(&self) -> Result<Vec<PreparedTemp>, ImageError> {
        let cps = self.checkpoints_path();
        let Ok(rd) = fs::read_dir(&cps) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in rd.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(owner) = temp_owner(&name) else {
                continue;
            };
            let path = e.path();
            if !matches!(fsutil::kind(&path)?, Kind::Dir) {
                continue;
            }
            let Ok(bytes) = fs::read(path.join(MANIFEST_NAME)) else {
                continue;
            };
            let Ok(manifest) = crate::manifest_io::decode_manifest(&bytes, 0, &path) else {
                continue;
            };
            out.push(PreparedTemp {
                number: manifest.checkpoint,
                owner,
                path,
                manifest,
            });
        }
        out.sort_by_key(|t| t.number);
        Ok(out)
    }

    /// The cut mark of checkpoint `n` from its `cut.json` (a few bytes),
    /// without decoding its manifest: `None` if it has none (not part of a
    /// cut) or it cannot be read.
    pub fn cut_mark(&self, n: u32) -> Option<crate::manifest::CutMark> {
        let path = self
            .checkpoints_path()
            .join(checkpoint_dir_name(n))
            .join(CUT_NAME);
        if !matches!(fsutil::kind(&path).ok()?, Kind::File) {
            return None;
        }
        let text = fs::read(&path).ok().filter(|t| t.len() <= 4096)?;
        serde_json::from_slice(&text).ok()
    }

    /// Commits a prepared checkpoint a dead process left (the decision to
    /// commit it having been recorded by its caller), under the lock.
    pub fn commit_left_prepared(&self, t: &PreparedTemp) -> Result<u32, ImageError> {
        let _lock = self.lock()?;
        check_packs(&t.path, &t.manifest, t.number)?;
        place(self.path(), t.number, &t.path, || {})?;
        Ok(t.number)
    }
}
