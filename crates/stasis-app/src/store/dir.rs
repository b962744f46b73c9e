//! The directory target: one file per version, `NAME.VERSION.ckpt`.
//!
//! Commit: write `.NAME.VERSION.ckpt.tmp.PID` (created exclusively, 0600),
//! fsync it, rename it over the final name, fsync the directory. A process
//! killed before the rename leaves only a temporary file, which no reader
//! looks at and the next `stasis_init` in that directory removes (once its
//! writer is dead). Retention: the newest `max_versions` versions of a
//! name and the parents their deltas need are kept, the rest deleted.
//! Deltas chain at most [`MAX_CHAIN`] deep; the checkpoint after that is
//! full.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{AppError, Result};
use crate::format::{self, Meta, Snapshot};

use super::Target;

/// Longest chain of deltas behind a full checkpoint.
pub(crate) const MAX_CHAIN: u32 = 8;

/// A directory of checkpoint files.
#[derive(Debug)]
pub struct DirTarget {
    dir: PathBuf,
    max_versions: usize,
    commits: u64,
}

impl DirTarget {
    /// Opens (creating it, 0700) a writable directory.
    pub fn open(dir: &Path, max_versions: usize) -> Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode_0700()
            .create(dir)
            .map_err(AppError::io("create directory", dir))?;
        let probe = dir.join(format!(".stasis-probe.{}", std::process::id()));
        File::create(&probe).map_err(AppError::io("write to directory", dir))?;
        let _ = fs::remove_file(&probe);
        let t = Self {
            dir: dir.to_path_buf(),
            max_versions,
            commits: 0,
        };
        super::remove_stale_temporaries(dir);
        Ok(t)
    }

    fn path(&self, name: &str, version: i32) -> PathBuf {
        self.dir.join(format!("{name}.{version}.ckpt"))
    }

    /// The versions of `name` present, newest first.
    fn versions(&self, name: &str) -> Result<Vec<i32>> {
        let mut v = Vec::new();
        let rd = fs::read_dir(&self.dir).map_err(AppError::io("list", &self.dir))?;
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = n.strip_prefix(name).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            if let Some(ver) = rest
                .strip_suffix(".ckpt")
                .and_then(|s| s.parse::<i32>().ok())
            {
                v.push(ver);
            }
        }
        v.sort_unstable_by(|a, b| b.cmp(a));
        Ok(v)
    }

    fn read_meta(&self, name: &str, version: i32) -> Option<Meta> {
        let mut b = [0u8; 40];
        File::open(self.path(name, version))
            .ok()?
            .read_exact(&mut b)
            .ok()?;
        format::decode_meta(&b).ok()
    }

    fn read(&self, name: &str, version: i32) -> Result<(Meta, Snapshot)> {
        let p = self.path(name, version);
        let b = match fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(AppError::NotFound {
                    name: name.to_string(),
                    version,
                })
            }
            Err(e) => return Err(AppError::io("read", &p)(e)),
        };
        let (m, s) = format::decode(&b).map_err(|e| AppError::damaged(&p, e.to_string()))?;
        if m.version != version {
            return Err(AppError::damaged(
                &p,
                format!("holds version {}", m.version),
            ));
        }
        Ok((m, s))
    }

    /// Deletes the versions neither among the newest `max_versions` nor a
    /// parent of one of those.
    fn retain(&self, name: &str) -> Result<()> {
        let all = self.versions(name)?;
        let mut keep: Vec<i32> = all.iter().copied().take(self.max_versions).collect();
        let mut i = 0;
        while i < keep.len() {
            if let Some(m) = self.read_meta(name, keep[i]) {
                if m.depth > 0 && !keep.contains(&m.parent_version) {
                    keep.push(m.parent_version);
                }
            }
            i += 1;
        }
        for v in all.into_iter().filter(|v| !keep.contains(v)) {
            let p = self.path(name, v);
            fs::remove_file(&p).map_err(AppError::io("remove old version", &p))?;
        }
        Ok(())
    }
}

trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Mode0700 for fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

impl Target for DirTarget {
    fn takes_deltas(&self) -> bool {
        true
    }

    fn commit(&mut self, name: &str, meta: &Meta, snap: &Snapshot) -> Result<u64> {
        self.commits += 1;
        let fin = self.path(name, meta.version);
        let tmp = self.dir.join(format!(
            ".{name}.{}.ckpt.tmp.{}",
            meta.version,
            std::process::id()
        ));
        let header = format::encode_header(meta, snap);
        let trailer = format::encode_trailer(&header, &snap.data);
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(AppError::io("create", &tmp))?;
        let w = f
            .write_all(&header)
            .and_then(|()| f.write_all(&snap.data))
            .and_then(|()| f.write_all(&trailer))
            .and_then(|()| f.sync_all());
        if let Err(e) = w {
            let _ = fs::remove_file(&tmp);
            return Err(AppError::io("write", &tmp)(e));
        }
        drop(f);
        super::test_hold(self.commits);
        fs::rename(&tmp, &fin).map_err(AppError::io("rename into place", &fin))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(AppError::io("fsync", &self.dir))?;
        self.retain(name)?;
        Ok((header.len() + snap.data.len() + trailer.len()) as u64)
    }

    fn latest(&self, name: &str) -> Result<Option<i32>> {
        for v in self.versions(name)? {
            if self.load(name, v).is_ok() {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    fn load(&self, name: &str, version: i32) -> Result<(Meta, Vec<Snapshot>)> {
        let (top, s) = self.read(name, version)?;
        let mut chain = vec![s];
        let mut m = top;
        while m.depth > 0 {
            let p = self.path(name, m.parent_version);
            let (pm, ps) = self.read(name, m.parent_version).map_err(|e| match e {
                AppError::NotFound { .. } => {
                    AppError::damaged(&p, "missing: the delta chain is broken")
                }
                e => e,
            })?;
            if pm.id != m.parent_id || pm.depth + 1 != m.depth {
                return Err(AppError::damaged(
                    &p,
                    "rewritten since its child was written: the delta chain is broken",
                ));
            }
            chain.push(ps);
            m = pm;
        }
        chain.reverse();
        Ok((top, chain))
    }
}
