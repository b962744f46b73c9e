//! Touch sets in an object store: the files a checkpoint gains after its
//! commit (`stasis_image::touch`: `touch-window`, recorded by
//! `dump --touch-window` and `run --touch-window` once the checkpoint is
//! committed; `touch-faults`, the fault order of a lazy restore).
//!
//! ```text
//! PREFIX/touch/NNNNNNNN/NAME   the file NAME of checkpoint N, stored as a
//!                              chunk is (zstd, and with a key sealed with
//!                              `touch/NNNNNNNN/NAME` as its name)
//! ```
//! The commit record is never rewritten for them (a concurrent gc may be
//! replacing it): they are objects of their own, written only for a
//! committed checkpoint, read with its chain (a download puts them in the
//! checkpoint's directory, where a lazy restore's filler finds its page
//! order), and optional: one that is missing, damaged, or not sealed in
//! an encrypted store is ignored with a warning. gc deletes those whose
//! checkpoint is no longer committed.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;

use stasis_image::checkpoint_dir_name;

use crate::{seal, S3Image, StoreError};

/// The files a checkpoint may gain after its commit.
pub const TOUCH_FILES: [&str; 2] = ["touch-window", "touch-faults"];

/// Largest touch-set object read (as `stasis_image::touch` reads at most).
const MAX_TOUCH_BYTES: usize = 64 << 20;

/// The key, relative to the prefix, of file `name` of checkpoint `n`.
fn touch_rel(n: u32, name: &str) -> String {
    format!("touch/{}/{name}", checkpoint_dir_name(n))
}

impl S3Image {
    /// Stores `bytes` as the file `name` (one of [`TOUCH_FILES`]) of the
    /// committed checkpoint `n`, replacing what it had.
    pub fn put_touch(&self, n: u32, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if !TOUCH_FILES.contains(&name) {
            return Err(StoreError::BadUrl {
                url: self.url.clone(),
                reason: format!("{name} is not a touch-set file"),
            });
        }
        // Committed, and (with a key) under this key; sealed with the
        // checkpoint's own key (its data key, with age recipients).
        let r = self.record(n)?;
        let key = self.record_key(&r)?;
        let rel = touch_rel(n, name);
        let stored = seal::seal(bytes, &rel, &self.seal.with_key(key));
        self.bucket.put(&self.object_key(&rel), stored)
    }

    /// The touch-set files in the store: (checkpoint, name).
    pub fn touch_files(&self) -> Result<HashSet<(u32, String)>, StoreError> {
        let dir = self.object_key("touch/");
        Ok(self
            .bucket
            .list(&dir)?
            .into_iter()
            .filter_map(|o| {
                let rest = o.key.strip_prefix(&dir)?;
                let (cp, name) = rest.split_once('/')?;
                let n: u32 = cp.parse().ok()?;
                (checkpoint_dir_name(n) == cp && TOUCH_FILES.contains(&name))
                    .then(|| (n, name.to_string()))
            })
            .collect())
    }

    /// Reads touch-set file `name` of checkpoint `n` into the checkpoint
    /// directory `dir`; `sealed`: the checkpoint is encrypted (under
    /// `key`), so the object must be sealed too.
    pub(crate) fn fetch_touch(
        &self,
        n: u32,
        name: &str,
        dir: &Path,
        (sealed, seal_key): (bool, Option<&crate::Key>),
    ) -> Result<(), StoreError> {
        let rel = touch_rel(n, name);
        let key = self.object_key(&rel);
        let stored = self.bucket.get(&key)?;
        let damaged = |reason: String| StoreError::Damaged {
            url: self.url.clone(),
            key: key.clone(),
            reason,
        };
        if sealed && !seal::is_sealed(&stored) {
            return Err(damaged(
                "it is not sealed, but its checkpoint is encrypted".into(),
            ));
        }
        let plain = seal::open(&stored, &rel, seal_key, MAX_TOUCH_BYTES)
            .map_err(|e| damaged(e.to_string()))?;
        let path = dir.join(name);
        let f = crate::s3image::create_private(&path)?;
        f.write_all_at(&plain, 0)
            .map_err(StoreError::local("write", &path))?;
        Ok(())
    }

    /// Reads the touch-set files of checkpoint `n` listed in `listed` into
    /// its directory `dir`; one that cannot be read is skipped with a
    /// warning (a checkpoint restores without them).
    pub(crate) fn fetch_touch_files(
        &self,
        n: u32,
        listed: &HashSet<(u32, String)>,
        dir: &Path,
        sealed: (bool, Option<&crate::Key>),
    ) {
        for name in TOUCH_FILES {
            if !listed.contains(&(n, name.to_string())) {
                continue;
            }
            if let Err(e) = self.fetch_touch(n, name, dir, sealed) {
                tracing::warn!("ignoring {name} of checkpoint {n}: {e}");
                let _ = std::fs::remove_file(dir.join(name));
            }
        }
    }

    /// Deletes the touch-set files of checkpoints that are not committed
    /// (deleted by gc); returns how many. The files are listed before the
    /// commit records, and one is written only after its checkpoint's
    /// commit: a checkpoint committed meanwhile keeps its own.
    pub fn sweep_touch(&self) -> Result<u64, StoreError> {
        let files = self.touch_files()?;
        if files.is_empty() {
            return Ok(0);
        }
        let committed: HashSet<u32> = self.committed()?.into_iter().collect();
        let mut n = 0;
        for (cp, name) in files {
            if !committed.contains(&cp) {
                self.bucket
                    .delete(&self.object_key(&touch_rel(cp, &name)))?;
                n += 1;
            }
        }
        Ok(n)
    }
}
