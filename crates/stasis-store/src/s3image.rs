//! A repository of checkpoints in an S3 bucket under a prefix:
//!
//! ```text
//! PREFIX/commits/NNNNNNNN              commit record (JSON), created with If-None-Match: *
//! PREFIX/data/NNNNNNNN-RANDOM/FILE.PPPPP   the parts of each file of one upload
//! ```
//! A checkpoint exists once its commit record does; data with no record
//! naming it (an upload that died) is never read, and gc removes it.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use stasis_image::{checkpoint_dir_name, CHECKPOINTS_DIR, LATEST_NAME, MARKER_NAME};

use crate::record::{FileRecord, PartRecord, Record, PART_BYTES, RECORD_FORMAT};
use crate::remote::Bucket;
use crate::seal::{self, OpenError, SealOptions};
use crate::{Key, Location, StoreError};

/// A checkpoint repository in a bucket.
pub struct S3Image {
    pub bucket: Bucket,
    prefix: String,
    pub url: String,
    pub seal: SealOptions,
}

/// What an upload stored.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Uploaded {
    pub checkpoint: u32,
    pub plain_bytes: u64,
    pub stored_bytes: u64,
    pub objects: u64,
}

/// What a download fetched.
#[derive(Debug, Clone, Default)]
pub struct Downloaded {
    /// The checkpoint asked for (or the latest), then its ancestors.
    pub chain: Vec<u32>,
    pub stored_bytes: u64,
}

impl S3Image {
    /// Opens `s3://BUCKET/PREFIX` (nothing is read yet), configured by
    /// the environment.
    pub fn open(loc: &Location, seal: SealOptions) -> Result<S3Image, StoreError> {
        S3Image::open_with(loc, seal, &crate::remote::S3Config::default())
    }

    /// [`open`](Self::open) with settings overriding the environment's.
    pub fn open_with(
        loc: &Location,
        seal: SealOptions,
        cfg: &crate::remote::S3Config,
    ) -> Result<S3Image, StoreError> {
        let Location::S3 { bucket, prefix } = loc else {
            return Err(StoreError::BadUrl {
                url: loc.display(),
                reason: "not an s3:// URL".into(),
            });
        };
        Ok(S3Image {
            bucket: Bucket::with_config(bucket, cfg)?,
            prefix: prefix.clone(),
            url: loc.display(),
            seal,
        })
    }

    fn commit_key(&self, n: u32) -> String {
        format!("{}commits/{}", self.prefix, checkpoint_dir_name(n))
    }

    /// Committed checkpoints, ascending.
    pub fn committed(&self) -> Result<Vec<u32>, StoreError> {
        let dir = format!("{}commits/", self.prefix);
        let mut v: Vec<u32> = self
            .bucket
            .list(&dir)?
            .iter()
            .filter_map(|o| o.key.strip_prefix(&dir))
            .filter(|n| n.len() >= 8 && n.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|n| n.parse().ok())
            .filter(|n| *n >= 1 && checkpoint_dir_name(*n).len() == 8.max(n.to_string().len()))
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// The commit record of checkpoint `n`, checked (and its MAC, with a key).
    pub fn record(&self, n: u32) -> Result<Record, StoreError> {
        let key = self.commit_key(n);
        let bytes = match self.bucket.get(&key) {
            Err(StoreError::Missing { .. }) => {
                return Err(StoreError::NoSuchCheckpoint {
                    url: self.url.clone(),
                    checkpoint: n,
                    available: self.committed().unwrap_or_default(),
                })
            }
            r => r?,
        };
        let r = Record::decode(&bytes, n).map_err(|reason| StoreError::BadRecord {
            url: self.url.clone(),
            key: key.clone(),
            reason,
        })?;
        match (&r.key_id, &self.seal.key) {
            (None, _) => Ok(r),
            (Some(_), None) => Err(StoreError::NeedKey {
                url: self.url.clone(),
                checkpoint: n,
            }),
            (Some(id), Some(k)) if *id != k.id() => Err(StoreError::WrongKey {
                url: self.url.clone(),
                key_file: k.file.clone(),
                checkpoint: n,
            }),
            (Some(_), Some(k)) if !r.verify(k) => Err(StoreError::Damaged {
                url: self.url.clone(),
                key,
                reason: "its authentication code does not match".into(),
            }),
            _ => Ok(r),
        }
    }

    /// Uploads the files of the checkpoint directory `src` as checkpoint
    /// `n` over `parent`, then commits it. `manifest` replaces the
    /// directory's `manifest.bin`; `skip` names files left out. Fails with
    /// [`StoreError::CommitRace`] if `n` was committed meanwhile.
    pub fn upload(
        &self,
        src: &Path,
        (n, parent): (u32, Option<u32>),
        manifest: Vec<u8>,
        skip: &[&str],
    ) -> Result<Uploaded, StoreError> {
        let (mut record, up) = self.upload_data(src, (n, parent), manifest, skip)?;
        let bytes = record.encode(self.seal.key.as_ref());
        if !self.bucket.put_new(&self.commit_key(n), bytes)? {
            return Err(StoreError::CommitRace {
                url: self.url.clone(),
                checkpoint: n,
            });
        }
        Ok(up)
    }

    /// The objects of [`upload`](Self::upload), and the record that would
    /// commit them (not written).
    pub fn upload_data(
        &self,
        src: &Path,
        (n, parent): (u32, Option<u32>),
        manifest: Vec<u8>,
        skip: &[&str],
    ) -> Result<(Record, Uploaded), StoreError> {
        let mut names: Vec<String> = fs::read_dir(src)
            .map_err(StoreError::local("list", src))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n != stasis_image::MANIFEST_NAME && !skip.contains(&n.as_str()))
            .collect();
        names.sort();
        let data = format!("data/{}-{}/", checkpoint_dir_name(n), random_hex());
        let mut files = Vec::new();
        let mut up = Uploaded {
            checkpoint: n,
            ..Default::default()
        };
        // The manifest first, from memory; then each file part by part.
        let mut sources: Vec<(String, Source)> = vec![(
            stasis_image::MANIFEST_NAME.to_string(),
            Source::Bytes(manifest),
        )];
        for name in names {
            let path = src.join(&name);
            sources.push((name, Source::File(path)));
        }
        for (name, source) in sources {
            let f = self.upload_file(&data, &name, source, &mut up)?;
            files.push(f);
        }
        let record = Record {
            format: RECORD_FORMAT,
            checkpoint: n,
            parent,
            data,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            key_id: self.seal.key.as_ref().map(Key::id),
            files,
            mac: String::new(),
        };
        Ok((record, up))
    }

    fn upload_file(
        &self,
        data: &str,
        name: &str,
        source: Source,
        up: &mut Uploaded,
    ) -> Result<FileRecord, StoreError> {
        let (size, mut reader): (u64, ReadPart) = match source {
            Source::Bytes(b) => (
                b.len() as u64,
                Box::new(move |off, buf: &mut Vec<u8>| {
                    let s = usize::try_from(off).unwrap_or(usize::MAX).min(b.len());
                    let e = s.saturating_add(buf.len()).min(b.len());
                    buf.truncate(e - s);
                    buf.copy_from_slice(&b[s..e]);
                    Ok(())
                }),
            ),
            Source::File(path) => {
                let f = File::open(&path).map_err(StoreError::local("open", &path))?;
                let len = f
                    .metadata()
                    .map_err(StoreError::local("stat", &path))?
                    .len();
                (
                    len,
                    Box::new(move |off, buf: &mut Vec<u8>| {
                        f.read_exact_at(buf, off)
                            .map_err(StoreError::local("read", &path))
                    }),
                )
            }
        };
        let mut f = FileRecord {
            name: name.to_string(),
            size,
            parts: Vec::new(),
        };
        let count = size.div_ceil(PART_BYTES);
        let mut i = 0u64;
        let mut parts = Vec::new();
        self.bucket.put_many(|| {
            if i >= count {
                return Ok(None);
            }
            let off = i * PART_BYTES;
            let len = usize::try_from(PART_BYTES.min(size - off)).unwrap_or(0);
            let mut buf = vec![0u8; len];
            reader(off, &mut buf)?;
            let key = f.part_key(data, usize::try_from(i).unwrap_or(0));
            let stored = seal::seal(&buf, &key, &self.seal);
            parts.push(PartRecord {
                stored: stored.len() as u64,
                blake3: blake3::hash(&stored).to_hex().to_string(),
            });
            up.plain_bytes += len as u64;
            up.stored_bytes += stored.len() as u64;
            up.objects += 1;
            i += 1;
            Ok(Some((format!("{}{key}", self.prefix), stored)))
        })?;
        f.parts = parts;
        Ok(f)
    }

    /// Downloads checkpoint `n` (default: the latest) and its ancestors
    /// into the local image directory `dest` (created if missing;
    /// checkpoints already in it are not fetched again).
    pub fn download_chain(&self, n: Option<u32>, dest: &Path) -> Result<Downloaded, StoreError> {
        let committed = self.committed()?;
        let first = match n {
            Some(n) => n,
            None => *committed.last().ok_or_else(|| StoreError::Empty {
                url: self.url.clone(),
            })?,
        };
        for d in [dest.to_path_buf(), dest.join(CHECKPOINTS_DIR)] {
            if !d.exists() {
                make_dir(&d)?;
            }
        }
        let mut out = Downloaded::default();
        let mut next = Some(first);
        while let Some(c) = next {
            let cdir = dest.join(CHECKPOINTS_DIR).join(checkpoint_dir_name(c));
            if cdir.exists() {
                // Fetched with a newer checkpoint's chain: so are its ancestors.
                out.chain.push(c);
                break;
            }
            let r = match self.record(c) {
                Err(StoreError::NoSuchCheckpoint { .. }) if c != first => {
                    return Err(StoreError::BrokenChain {
                        url: self.url.clone(),
                        checkpoint: out.chain.last().copied().unwrap_or(first),
                        parent: c,
                    })
                }
                r => r?,
            };
            out.stored_bytes += self.fetch(&r, &cdir)?;
            out.chain.push(c);
            next = r.parent;
        }
        if !dest.join(MARKER_NAME).exists() {
            write_new(
                &dest.join(MARKER_NAME),
                format!(
                    "stasis image directory\nformat {}\n",
                    stasis_image::FORMAT_VERSION
                )
                .as_bytes(),
            )?;
            write_new(&dest.join(LATEST_NAME), format!("{first}\n").as_bytes())?;
        }
        Ok(out)
    }

    /// Fetches the files of one record into the new directory `dir`.
    fn fetch(&self, r: &Record, dir: &Path) -> Result<u64, StoreError> {
        make_dir(dir)?;
        let mut stored = 0;
        for f in &r.files {
            let path = dir.join(&f.name);
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(StoreError::local("create", &path))?;
            let keys: Vec<String> = (0..f.parts.len()).map(|i| f.part_key(&r.data, i)).collect();
            let full: Vec<String> = keys.iter().map(|k| format!("{}{k}", self.prefix)).collect();
            self.bucket.get_many(full, |i, bytes| {
                let p = &f.parts[i];
                let damaged = |reason: String| StoreError::Damaged {
                    url: self.url.clone(),
                    key: format!("{}{}", self.prefix, keys[i]),
                    reason,
                };
                if bytes.len() as u64 != p.stored
                    || blake3::hash(&bytes).to_hex().as_str() != p.blake3
                {
                    return Err(damaged(format!(
                        "{} bytes that do not match its commit record (checkpoint {})",
                        bytes.len(),
                        r.checkpoint
                    )));
                }
                let off = i as u64 * PART_BYTES;
                let want = usize::try_from(PART_BYTES.min(f.size - off)).unwrap_or(0);
                let plain = seal::open(&bytes, &keys[i], self.seal.key.as_ref(), want).map_err(
                    |e| match e {
                        OpenError::NeedKey => StoreError::NeedKey {
                            url: self.url.clone(),
                            checkpoint: r.checkpoint,
                        },
                        e => damaged(e.to_string()),
                    },
                )?;
                if plain.len() != want {
                    return Err(damaged(format!("{} bytes, {want} expected", plain.len())));
                }
                stored += bytes.len() as u64;
                file.write_all_at(&plain, off)
                    .map_err(StoreError::local("write", &path))
            })?;
            file.sync_all().map_err(StoreError::local("sync", &path))?;
        }
        Ok(stored)
    }

    /// Deletes checkpoint `n`: its commit record first (it no longer
    /// exists from then on), then its data.
    pub fn delete(&self, n: u32) -> Result<(), StoreError> {
        let r = match self.record(n) {
            Ok(r) => Some(r),
            Err(StoreError::NoSuchCheckpoint { .. }) => None,
            Err(e) => return Err(e),
        };
        self.bucket.delete(&self.commit_key(n))?;
        if let Some(r) = r {
            self.delete_data(&r.data)?;
        }
        Ok(())
    }

    /// Deletes every object of an upload's data directory.
    pub fn delete_data(&self, data: &str) -> Result<(), StoreError> {
        for o in self.bucket.list(&format!("{}{data}", self.prefix))? {
            self.bucket.delete(&o.key)?;
        }
        Ok(())
    }

    /// Data directories that no commit record names and older than
    /// `min_age_s` (an upload still running is younger): (dir, bytes).
    pub fn orphans(&self, min_age_s: i64) -> Result<Vec<(String, u64)>, StoreError> {
        let named: Vec<String> = self
            .committed()?
            .into_iter()
            .map(|n| self.record(n).map(|r| r.data))
            .collect::<Result<_, _>>()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut dirs: BTreeMap<String, (u64, i64)> = BTreeMap::new();
        for o in self.bucket.list(&format!("{}data/", self.prefix))? {
            let rel = o.key.strip_prefix(&self.prefix).unwrap_or(&o.key);
            let Some(dir) = rel.split('/').nth(1) else {
                continue;
            };
            let e = dirs.entry(format!("data/{dir}/")).or_insert((0, 0));
            e.0 += o.size;
            e.1 = e.1.max(o.modified_unix);
        }
        Ok(dirs
            .into_iter()
            .filter(|(d, (_, t))| !named.contains(d) && now - t >= min_age_s)
            .map(|(d, (b, _))| (d, b))
            .collect())
    }

    /// Replaces the record of checkpoint `n` (gc's merge): an atomic
    /// overwrite of one object.
    pub fn replace_record(&self, mut r: Record) -> Result<(), StoreError> {
        let bytes = r.encode(self.seal.key.as_ref());
        self.bucket.put(&self.commit_key(r.checkpoint), bytes)
    }
}

enum Source {
    Bytes(Vec<u8>),
    File(PathBuf),
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        b = ((u64::from(t) << 32) | u64::from(std::process::id())).to_le_bytes();
    }
    hex::encode(b)
}

/// Reads `buf.len()` bytes at an offset of one file's content.
type ReadPart = Box<dyn FnMut(u64, &mut Vec<u8>) -> Result<(), StoreError>>;

fn make_dir(p: &Path) -> Result<(), StoreError> {
    DirBuilder::new()
        .mode(0o700)
        .create(p)
        .map_err(StoreError::local("create directory", p))
}

fn write_new(p: &Path, data: &[u8]) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .map_err(StoreError::local("create", p))?;
    f.write_all_at(data, 0)
        .map_err(StoreError::local("write", p))
}

/// Reads a whole small local file.
pub(crate) fn read_file(p: &Path) -> Result<Vec<u8>, StoreError> {
    let mut v = Vec::new();
    File::open(p)
        .and_then(|mut f| f.read_to_end(&mut v))
        .map_err(StoreError::local("read", p))?;
    Ok(v)
}
