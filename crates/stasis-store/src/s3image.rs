//! A repository of checkpoints in an S3 bucket under a prefix:
//!
//! ```text
//! PREFIX/commits/NNNNNNNN   commit record (JSON), created with If-None-Match: *
//! ROOT/chunks/ID            a chunk of up to 1 MiB of some file, named by the
//!                           (keyed) BLAKE3 of its plain bytes: shared by every
//!                           checkpoint, process and job of the stores under ROOT
//!                           that hold the same bytes; chunks of zeros are stored
//!                           as nothing
//! ```
//! ROOT is PREFIX itself, or (a record's `chunks_up`, format 3) the prefix
//! that many levels above it: a cluster agent's trees
//! (`ROOT/HOST/jobs/JOB/PID/`) share `ROOT/chunks/`. Each record says where
//! its chunks are, so a store written before chunks were shared (its own
//! `chunks/`) still reads.
//!
//! A checkpoint exists once its commit record does. A chunk no record
//! names (an upload that died, a deleted checkpoint's) is never read, and
//! gc removes it once it is old enough and no record of any store under
//! its root names it (see `gc.rs`).

use std::collections::{HashMap, HashSet};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use stasis_image::{checkpoint_dir_name, CHECKPOINTS_DIR, LATEST_NAME, MARKER_NAME};

use crate::record::{FileRecord, Record, CHUNK_BYTES, RECORD_FORMAT, ZERO_CHUNK};
use crate::remote::Bucket;
use crate::seal::{self, OpenError, SealOptions};
use crate::{Key, Location, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Threads that open and write the chunks of a download.
const OPENERS: usize = 2;

/// A checkpoint repository in a bucket.
pub struct S3Image {
    pub bucket: Arc<Bucket>,
    prefix: String,
    /// Where this store's uploads put their chunks: `chunks/` of the
    /// prefix this many levels above `prefix` (0: its own).
    chunks_up: u32,
    pub url: String,
    pub seal: SealOptions,
}

/// What an upload stored.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Uploaded {
    pub checkpoint: u32,
    /// Plain bytes of the checkpoint's files.
    pub plain_bytes: u64,
    /// Bytes of the chunks written (new ones, and old ones refreshed).
    pub stored_bytes: u64,
    /// Chunks written.
    pub objects: u64,
    /// Chunks already in the store, not written again.
    pub reused: u64,
    /// Chunks of zeros (nothing stored).
    pub zero: u64,
}

/// A chunk already in the store younger than this is trusted to stay
/// until the commit (gc removes unnamed chunks only after `gc::SWEEP_AGE_S`);
/// an older one is written again, which renews its age.
pub const REFRESH_AGE_S: i64 = 1800;

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
        let Location::S3 {
            bucket,
            prefix,
            endpoint,
        } = loc
        else {
            return Err(StoreError::BadUrl {
                url: loc.display(),
                reason: "not an s3:// URL".into(),
            });
        };
        Ok(S3Image {
            bucket: Arc::new(Bucket::with_config(
                bucket,
                &with_endpoint(cfg, endpoint.as_deref()),
            )?),
            prefix: prefix.clone(),
            chunks_up: 0,
            url: loc.display(),
            seal,
        })
    }

    /// This store's uploads put their chunks in `chunks/` of the prefix
    /// `up` levels above its own (shared with every store below that
    /// prefix); its records say so (format 3). `up` 0: its own `chunks/`.
    pub fn share_chunks(mut self, up: u32) -> Result<S3Image, StoreError> {
        if up > crate::record::MAX_CHUNKS_UP || ancestor(&self.prefix, up).is_none() {
            return Err(StoreError::BadUrl {
                url: self.url.clone(),
                reason: format!("its prefix has fewer than {up} levels for shared chunks"),
            });
        }
        self.chunks_up = up;
        Ok(self)
    }

    /// The store at `prefix` (empty, or ending in `/`) of the same bucket,
    /// client and key, with its own chunks.
    pub fn sibling(&self, prefix: &str) -> S3Image {
        let base = self
            .url
            .strip_suffix(self.prefix.trim_end_matches('/'))
            .unwrap_or(&self.url)
            .trim_end_matches('/');
        S3Image {
            bucket: Arc::clone(&self.bucket),
            prefix: prefix.to_string(),
            chunks_up: 0,
            url: format!("{base}/{}", prefix.trim_end_matches('/')),
            seal: self.seal.clone(),
        }
    }

    /// How many levels above its prefix this store's uploads put chunks.
    pub fn chunks_up(&self) -> u32 {
        self.chunks_up
    }

    /// The prefix whose `chunks/` holds the chunks of record `r` of this
    /// store (its own prefix, or the ancestor the record names).
    pub fn chunk_root(&self, r: &Record) -> Result<String, StoreError> {
        ancestor(&self.prefix, r.chunks_up.unwrap_or(0)).ok_or_else(|| StoreError::BadRecord {
            url: self.url.clone(),
            key: self.commit_key(r.checkpoint),
            reason: format!(
                "its chunks are {} levels above a store {} deep",
                r.chunks_up.unwrap_or(0),
                self.prefix.split('/').filter(|c| !c.is_empty()).count()
            ),
        })
    }

    /// The object key of chunk `id` of record `r`.
    fn chunk_key(&self, r: &Record, id: &str) -> String {
        let root =
            ancestor(&self.prefix, r.chunks_up.unwrap_or(0)).unwrap_or_else(|| self.prefix.clone());
        format!("{root}chunks/{id}")
    }

    /// The full key of `rel` (a key relative to the prefix).
    pub(crate) fn object_key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    pub(crate) fn commit_key(&self, n: u32) -> String {
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
            .filter(|n| n.len() >= 8 && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|name| {
                // Only the canonical name of a checkpoint number counts.
                let n: u32 = name.parse().ok()?;
                (n >= 1 && checkpoint_dir_name(n) == name).then_some(n)
            })
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
        self.chunk_root(&r)?;
        if r.wrapped_key.is_some() {
            return self.check_wrapped(r);
        }
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
        let data = self.upload_data(src, (n, parent), manifest, skip)?;
        self.commit(data)
    }

    /// [`upload`](Self::upload), freeing each part of `src`'s files (a
    /// hole punched) as soon as it is read: for a staging checkpoint that
    /// is deleted once uploaded (an encrypted store's plaintext), so the
    /// freeing of its pages overlaps the upload instead of following it.
    /// `src` is unusable afterwards, whatever the outcome.
    pub fn upload_consuming(
        &self,
        src: &Path,
        checkpoint: (u32, Option<u32>),
        manifest: Vec<u8>,
        skip: &[&str],
    ) -> Result<Uploaded, StoreError> {
        let ck = self.new_checkpoint_key()?;
        let data =
            self.upload_data_with(src, checkpoint, manifest, skip, (true, ck, self.chunks_up))?;
        self.commit(data)
    }

    /// Creates the commit record of objects uploaded by
    /// [`upload_data`](Self::upload_data): the commit point (for a caller
    /// that commits later than it uploads, as an agent does once its round
    /// is decided). Fails with [`StoreError::CommitRace`] if the record's
    /// number was committed meanwhile.
    pub fn commit_uploaded(&self, data: (Record, Uploaded)) -> Result<Uploaded, StoreError> {
        self.commit(data)
    }

    /// The prefix `s3://BUCKET/PREFIX` names (empty, or ending in `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The plain content of file `name` of checkpoint `n`, if the
    /// checkpoint has that file and it is at most `max` bytes.
    pub fn small_file(&self, n: u32, name: &str, max: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let r = self.record(n)?;
        let Some(f) = r.files.iter().find(|f| f.name == name) else {
            return Ok(None);
        };
        if f.size > max {
            return Ok(None);
        }
        let mut out = Vec::new();
        for i in 0..f.chunks.len() {
            out.extend(self.read_chunk(&r, f, i)?);
        }
        Ok(Some(out))
    }

    /// Creates the commit record of uploaded objects: the commit point.
    fn commit(&self, (mut record, up): (Record, Uploaded)) -> Result<Uploaded, StoreError> {
        let n = record.checkpoint;
        // A record with a wrapped key has its MAC already.
        let bytes = record.encode(self.record_mac_key(&record));
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
        let ck = self.new_checkpoint_key()?;
        self.upload_data_with(
            src,
            (n, parent),
            manifest,
            skip,
            (false, ck, self.chunks_up),
        )
    }

    pub(crate) fn upload_data_with(
        &self,
        src: &Path,
        (n, parent): (u32, Option<u32>),
        manifest: Vec<u8>,
        skip: &[&str],
        (consume, (key, wrapped_key), up): (bool, (Option<Key>, Option<String>), u32),
    ) -> Result<(Record, Uploaded), StoreError> {
        let seal = self.seal.with_key(key);
        let root = ancestor(&self.prefix, up).ok_or_else(|| StoreError::BadUrl {
            url: self.url.clone(),
            reason: format!("its prefix has fewer than {up} levels for shared chunks"),
        })?;
        let mut names: Vec<String> = fs::read_dir(src)
            .map_err(StoreError::local("list", src))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n != stasis_image::MANIFEST_NAME && !skip.contains(&n.as_str()))
            .collect();
        names.sort();
        let mut known = self.chunks_at(&root)?;
        let mut files = Vec::new();
        let mut uploaded = Uploaded {
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
            sources.push((name, Source::File(path, consume)));
        }
        for (name, source) in sources {
            let f = self.upload_file(&name, source, &seal, (&root, &mut known), &mut uploaded)?;
            files.push(f);
        }
        let mut record = Record {
            format: RECORD_FORMAT,
            checkpoint: n,
            parent,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            key_id: seal.key.as_ref().map(Key::id),
            wrapped_key,
            files,
            chunks_up: (up > 0).then_some(up),
            mac: String::new(),
        };
        if record.wrapped_key.is_some() {
            // MACed now, under the data key: whoever creates the record
            // later (an agent after its round's decision, gc) may hold no
            // identity to unwrap it.
            record.encode(seal.key.as_ref());
        }
        Ok((record, uploaded))
    }

    fn upload_file(
        &self,
        name: &str,
        source: Source,
        seal: &SealOptions,
        (root, known): (&str, &mut HashMap<String, i64>),
        up: &mut Uploaded,
    ) -> Result<FileRecord, StoreError> {
        let path = match &source {
            Source::File(p, _) => Some(p.clone()),
            Source::Bytes(_) => None,
        };
        let (size, mut reader) = source.open()?;
        let spans = crate::chunking::plan(name, path.as_deref(), size);
        let now = now_unix();
        let mut next = spans.iter();
        let mut chunks = Vec::new();
        self.bucket.put_many(|| loop {
            let Some(&(off, len)) = next.next() else {
                return Ok(None);
            };
            let len = usize::try_from(len).unwrap_or(0);
            let mut buf = vec![0u8; len];
            reader(off, &mut buf)?;
            up.plain_bytes += len as u64;
            if buf.iter().all(|b| *b == 0) {
                chunks.push(ZERO_CHUNK.to_string());
                up.zero += 1;
                continue;
            }
            let id = chunk_id(seal.key.as_ref(), &buf);
            chunks.push(id.clone());
            if known.get(&id).is_some_and(|t| now - t < REFRESH_AGE_S) {
                up.reused += 1;
                continue;
            }
            known.insert(id.clone(), now);
            let key = format!("chunks/{id}");
            let stored = seal::seal(&buf, &key, seal);
            up.stored_bytes += stored.len() as u64;
            up.objects += 1;
            return Ok(Some((format!("{root}{key}"), stored)));
        })?;
        let lens = if crate::chunking::is_fixed(&spans, size) {
            Vec::new()
        } else {
            spans.iter().map(|s| s.1).collect()
        };
        Ok(FileRecord {
            name: name.to_string(),
            size,
            chunks,
            lens,
        })
    }

    /// The chunks where this store's uploads put them: id -> last
    /// modified (Unix seconds).
    pub fn chunks(&self) -> Result<HashMap<String, i64>, StoreError> {
        let root = ancestor(&self.prefix, self.chunks_up).unwrap_or_else(|| self.prefix.clone());
        self.chunks_at(&root)
    }

    /// The chunks in `ROOT/chunks/`: id -> last modified (Unix seconds).
    fn chunks_at(&self, root: &str) -> Result<HashMap<String, i64>, StoreError> {
        let dir = format!("{root}chunks/");
        Ok(self
            .bucket
            .list(&dir)?
            .into_iter()
            .filter_map(|o| Some((o.key.strip_prefix(&dir)?.to_string(), o.modified_unix)))
            .filter(|(id, _)| crate::record::valid_chunk_id(id))
            .collect())
    }

    /// Downloads checkpoint `n` (default: the latest) and its ancestors
    /// into the local image directory `dest` (created if missing;
    /// checkpoints already in it are not fetched again).
    pub fn download_chain(&self, n: Option<u32>, dest: &Path) -> Result<Downloaded, StoreError> {
        self.download_chain_with(n, dest, false)
    }

    /// [`download_chain`](Self::download_chain), with page packs sparse
    /// when `sparse` (their header, index and trailer only).
    pub(crate) fn download_chain_with(
        &self,
        n: Option<u32>,
        dest: &Path,
        sparse: bool,
    ) -> Result<Downloaded, StoreError> {
        // (Listing the records is only needed to find the latest.)
        let first = match n {
            Some(n) => n,
            None => *self.committed()?.last().ok_or_else(|| StoreError::Empty {
                url: self.url.clone(),
            })?,
        };
        for d in [dest.to_path_buf(), dest.join(CHECKPOINTS_DIR)] {
            if !d.exists() {
                make_dir(&d)?;
            }
        }
        // The touch sets stored with checkpoints (one listing): a lazy
        // restore takes its page order from them.
        let touch = self.touch_files().unwrap_or_else(|e| {
            tracing::warn!("not reading the touch sets of {}: {e}", self.url);
            Default::default()
        });
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
            out.stored_bytes += self.fetch(&r, &cdir, sparse)?;
            let key = self.record_key(&r)?;
            self.fetch_touch_files(c, &touch, &cdir, (r.key_id.is_some(), key.as_ref()));
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

    /// Fetches the files of one record into the new directory `dir`; with
    /// `sparse`, of a page pack only what holds its header, index and
    /// trailer (see [`crate::sparse`]).
    fn fetch(&self, r: &Record, dir: &Path, sparse: bool) -> Result<u64, StoreError> {
        make_dir(dir)?;
        let mut stored = 0;
        for f in &r.files {
            let path = dir.join(&f.name);
            let file = create_private(&path)?;
            // Chunks of zeros stay holes.
            file.set_len(f.size)
                .map_err(StoreError::local("size", &path))?;
            let all: Vec<usize> = (0..f.chunks.len()).collect();
            let wanted = if sparse && crate::sparse::is_pack(&f.name) {
                crate::sparse::skeleton_chunks(self, r, f, &file, &mut stored)?
            } else {
                all
            };
            stored += self.fetch_chunks(r, f, &file, &wanted)?;
            file.sync_all().map_err(StoreError::local("sync", &path))?;
        }
        Ok(stored)
    }

    /// Fetches chunks `wanted` (indexes) of file `f` of record `r` into
    /// `file` at their offsets (chunks of zeros are skipped: they are
    /// holes); returns the stored bytes read.
    pub(crate) fn fetch_chunks(
        &self,
        r: &Record,
        f: &FileRecord,
        file: &File,
        wanted: &[usize],
    ) -> Result<u64, StoreError> {
        let wanted: Vec<usize> = wanted
            .iter()
            .copied()
            .filter(|&i| f.chunks.get(i).is_some_and(|c| c.as_str() != ZERO_CHUNK))
            .collect();
        let keys: Vec<String> = wanted
            .iter()
            .map(|&i| self.chunk_key(r, &f.chunks[i]))
            .collect();
        let spans = f.spans();
        let mut stored = 0;
        // Chunks are opened (decompressed, unsealed, hashed) and written by
        // OPENERS threads while the next ones download.
        let failed = AtomicBool::new(false);
        let error: Mutex<Option<StoreError>> = Mutex::new(None);
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, bytes::Bytes)>(OPENERS);
        let rx = Mutex::new(rx);
        let got = std::thread::scope(|s| {
            for _ in 0..OPENERS {
                s.spawn(|| loop {
                    let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((k, bytes)) = next else { return };
                    if failed.load(Ordering::Relaxed) {
                        continue;
                    }
                    let i = wanted[k];
                    let done = self.open_chunk(r, f, i, &bytes).and_then(|plain| {
                        file.write_all_at(&plain, spans[i].0)
                            .map_err(StoreError::local("write", Path::new(&f.name)))
                    });
                    if let Err(e) = done {
                        let mut slot = error.lock().unwrap_or_else(|e| e.into_inner());
                        slot.get_or_insert(e);
                        failed.store(true, Ordering::Relaxed);
                    }
                });
            }
            let tx = tx;
            self.bucket.get_many(keys, |k, bytes| {
                if failed.load(Ordering::Relaxed) {
                    // Replaced by the opener's error below.
                    return Err(StoreError::DownloadStopped {
                        url: self.url.clone(),
                        why: "a chunk could not be opened or written",
                    });
                }
                stored += bytes.len() as u64;
                tx.send((k, bytes))
                    .map_err(|_| StoreError::DownloadStopped {
                        url: self.url.clone(),
                        why: "the threads that open the chunks ended early",
                    })
            })
            // (tx dropped: the openers finish the chunks sent, then end.)
        });
        if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        got?;
        Ok(stored)
    }

    /// Chunk `i` of file `f` of record `r` (zeros for a zero chunk), read
    /// from the store and checked against its id.
    pub(crate) fn read_chunk(
        &self,
        r: &Record,
        f: &FileRecord,
        i: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let id = f.chunks.get(i).ok_or_else(|| StoreError::Damaged {
            url: self.url.clone(),
            key: self.commit_key(r.checkpoint),
            reason: format!("{} has no chunk {i}", f.name),
        })?;
        if id.as_str() == ZERO_CHUNK {
            return Ok(vec![0; chunk_len(f, i)]);
        }
        let bytes = self.bucket.get(&self.chunk_key(r, id))?;
        self.open_chunk(r, f, i, &bytes)
    }

    /// The plain bytes of chunk `i` of file `f` of record `r`, stored as
    /// `bytes`: opened (with the key) and checked against its id.
    fn open_chunk(
        &self,
        r: &Record,
        f: &FileRecord,
        i: usize,
        bytes: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let id = &f.chunks[i];
        let want = chunk_len(f, i);
        let damaged = |reason: String| StoreError::Damaged {
            url: self.url.clone(),
            key: self.chunk_key(r, id),
            reason,
        };
        let key = self.record_key(r)?;
        let plain = seal::open(bytes, &format!("chunks/{id}"), key.as_ref(), want).map_err(
            |e| match e {
                OpenError::NeedKey => StoreError::NeedKey {
                    url: self.url.clone(),
                    checkpoint: r.checkpoint,
                },
                e => damaged(e.to_string()),
            },
        )?;
        if plain.len() != want
            || chunk_id(key.as_ref().filter(|_| r.key_id.is_some()), &plain) != *id
        {
            return Err(damaged(format!(
                "its {} bytes do not hash to its name (checkpoint {}, {})",
                plain.len(),
                r.checkpoint,
                f.name
            )));
        }
        Ok(plain)
    }

    /// Deletes checkpoint `n`'s commit record (its chunks go when gc
    /// finds them unnamed).
    pub fn delete(&self, n: u32) -> Result<(), StoreError> {
        self.bucket.delete(&self.commit_key(n))
    }

    /// Every chunk id named by a commit record (read without checking
    /// keys: only for keeping chunks).
    pub fn named_chunks(&self) -> Result<HashSet<String>, StoreError> {
        let mut out = HashSet::new();
        for n in self.committed()? {
            if let Some(r) = self.stored_record(self.commit_key(n), n)? {
                out.extend(r.chunk_ids().map(str::to_string));
            }
        }
        Ok(out)
    }

    /// The commit record of checkpoint `n` at `key`, decoded without
    /// checking keys (only for keeping chunks); `None` if it is gone
    /// (deleted since it was listed, by a gc).
    fn stored_record(&self, key: String, n: u32) -> Result<Option<Record>, StoreError> {
        let bytes = match self.bucket.get(&key) {
            Err(StoreError::Missing { .. }) => return Ok(None),
            r => r?,
        };
        Record::decode(&bytes, n)
            .map(Some)
            .map_err(|reason| StoreError::BadRecord {
                url: self.url.clone(),
                key,
                reason,
            })
    }

    /// Deletes the chunks of this store's chunk roots (its own `chunks/`,
    /// and the shared one its uploads write to) that no record of any
    /// store under that root names and that are older than `min_age_s`;
    /// returns (chunks, stored bytes) deleted.
    pub fn sweep(&self, min_age_s: i64) -> Result<(u64, u64), StoreError> {
        let mut roots = vec![self.prefix.clone()];
        if let Some(r) = ancestor(&self.prefix, self.chunks_up).filter(|r| *r != self.prefix) {
            roots.push(r);
        }
        let (mut n, mut bytes) = (0, 0);
        for root in roots {
            let (c, b) = self.sweep_root(&root, min_age_s)?;
            n += c;
            bytes += b;
        }
        Ok((n, bytes))
    }

    /// Deletes the chunks of `ROOT/chunks/` (`root` empty or ending in
    /// `/`, in this store's bucket) that no commit record of any store
    /// under `root` whose chunks are there names, and that are older than
    /// `min_age_s`; returns (chunks, stored bytes) deleted. One listing of
    /// everything under `root` finds both, so a record committed after it
    /// is one whose dump relied only on chunks younger than
    /// `REFRESH_AGE_S` when it listed them (see `gc.rs`). A record that
    /// cannot be decoded fails the sweep: what it needs is unknown.
    pub fn sweep_root(&self, root: &str, min_age_s: i64) -> Result<(u64, u64), StoreError> {
        let listed = self.bucket.list(root)?;
        let mut chunks = Vec::new();
        let mut records = Vec::new();
        for o in listed {
            let Some(rel) = o.key.strip_prefix(root) else {
                continue;
            };
            if let Some(id) = rel.strip_prefix("chunks/") {
                if crate::record::valid_chunk_id(id) && id != ZERO_CHUNK {
                    chunks.push((id.to_string(), o));
                }
                continue;
            }
            if let Some((store, n)) = record_key(rel) {
                records.push((format!("{root}{store}"), n, o.key));
            }
        }
        let mut named = HashSet::new();
        for (store, n, key) in records {
            // (None: deleted since the listing, by a gc of that store.)
            let Some(r) = self.stored_record(key, n)? else {
                continue;
            };
            if ancestor(&store, r.chunks_up.unwrap_or(0)).as_deref() == Some(root) {
                named.extend(r.chunk_ids().map(str::to_string));
            }
        }
        let now = now_unix();
        let (mut n, mut bytes) = (0, 0);
        for (id, o) in chunks {
            if !named.contains(&id) && now - o.modified_unix >= min_age_s {
                self.bucket.delete(&o.key)?;
                n += 1;
                bytes += o.size;
            }
        }
        Ok((n, bytes))
    }

    /// The stores under this store's prefix (itself included): the
    /// prefixes (empty, or ending in `/`) that hold commit records.
    pub fn stores_under(&self) -> Result<Vec<String>, StoreError> {
        let mut out: Vec<String> = self
            .bucket
            .list(&self.prefix)?
            .iter()
            .filter_map(|o| {
                let rel = o.key.strip_prefix(&self.prefix)?;
                let (store, _) = record_key(rel)?;
                Some(format!("{}{store}", self.prefix))
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Replaces the record of checkpoint `n` (gc's merge): an atomic
    /// overwrite of one object.
    pub fn replace_record(&self, mut r: Record) -> Result<(), StoreError> {
        let bytes = r.encode(self.record_mac_key(&r));
        self.bucket.put(&self.commit_key(r.checkpoint), bytes)
    }
}

enum Source {
    Bytes(Vec<u8>),
    /// A file, and whether each part read is freed (see
    /// [`S3Image::upload_consuming`]).
    File(PathBuf, bool),
}

/// Reads `buf.len()` bytes at an offset of one file's content.
type ReadPart = Box<dyn FnMut(u64, &mut Vec<u8>) -> Result<(), StoreError>>;

impl Source {
    /// The size and a reader.
    fn open(self) -> Result<(u64, ReadPart), StoreError> {
        Ok(match self {
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
            Source::File(path, consume) => {
                let mut punch = consume;
                let f = OpenOptions::new()
                    .read(true)
                    .write(consume)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(StoreError::local("open", &path))?;
                let len = f
                    .metadata()
                    .map_err(StoreError::local("stat", &path))?
                    .len();
                (
                    len,
                    Box::new(move |off, buf: &mut Vec<u8>| {
                        f.read_exact_at(buf, off)
                            .map_err(StoreError::local("read", &path))?;
                        if punch {
                            use rustix::fs::{fallocate, FallocateFlags};
                            // Best effort: a filesystem that cannot punch
                            // holes keeps the file until it is deleted
                            // after the upload, as before.
                            if let Err(e) = fallocate(
                                &f,
                                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                                off,
                                buf.len() as u64,
                            ) {
                                tracing::debug!(path = %path.display(), "not freed as uploaded: {e}");
                                punch = false;
                            }
                        }
                        Ok(())
                    }),
                )
            }
        })
    }
}

/// `cfg` with the URL's server, if it names one.
fn with_endpoint(cfg: &crate::remote::S3Config, endpoint: Option<&str>) -> crate::remote::S3Config {
    let mut c = cfg.clone();
    if let Some(e) = endpoint {
        c.endpoint = Some(e.to_string());
        c.allow_http = Some(c.allow_http.unwrap_or(false) || e.starts_with("http://"));
    }
    c
}

/// The id of a chunk: BLAKE3 of its bytes, keyed by a key derived from
/// its checkpoint's key (so equal bytes under different keys, or in a
/// checkpoint without one, give unrelated ids).
pub fn chunk_id(key: Option<&Key>, plain: &[u8]) -> String {
    let material: &[u8] = match key {
        Some(k) => k.bytes(),
        None => b"",
    };
    let key = blake3::derive_key("stasis chunk id v1", material);
    blake3::keyed_hash(&key, plain).to_hex().to_string()
}

/// The prefix `up` levels above `prefix` (empty, or ending in `/`);
/// `None` if it is not that deep.
pub(crate) fn ancestor(prefix: &str, up: u32) -> Option<String> {
    let parts: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
    let keep = parts.len().checked_sub(usize::try_from(up).ok()?)?;
    Some(if keep == 0 {
        String::new()
    } else {
        format!("{}/", parts[..keep].join("/"))
    })
}

/// A commit record's key relative to some prefix, `[STORE/]commits/NNNNNNNN`:
/// the store (empty, or ending in `/`) and the checkpoint.
fn record_key(rel: &str) -> Option<(String, u32)> {
    let (store, name) = match rel.rsplit_once("/commits/") {
        Some((s, name)) => (format!("{s}/"), name),
        None => (String::new(), rel.strip_prefix("commits/")?),
    };
    if !(8..=10).contains(&name.len()) || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = name.parse().ok()?;
    (n >= 1 && checkpoint_dir_name(n) == name).then_some((store, n))
}

/// Plain bytes of chunk `i` of file `f`.
fn chunk_len(f: &FileRecord, i: usize) -> usize {
    let len = match f.lens.get(i) {
        Some(&l) => l,
        None => CHUNK_BYTES.min(f.size.saturating_sub(i as u64 * CHUNK_BYTES)),
    };
    usize::try_from(len).unwrap_or(0)
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .unwrap_or(0)
}

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
/// Creates a new file (it must not exist), mode 0600, never following a
/// symlink, open for writing: where a downloaded part goes.
pub(crate) fn create_private(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(StoreError::local("create", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_and_record_keys() {
        assert_eq!(ancestor("a/b/c/", 0).as_deref(), Some("a/b/c/"));
        assert_eq!(ancestor("a/b/c/", 2).as_deref(), Some("a/"));
        assert_eq!(ancestor("a/b/c/", 3).as_deref(), Some(""));
        assert_eq!(ancestor("a/b/c/", 4), None);
        assert_eq!(ancestor("", 0).as_deref(), Some(""));
        assert_eq!(record_key("commits/00000012"), Some((String::new(), 12)));
        assert_eq!(
            record_key("h0/jobs/j/7/commits/00000001"),
            Some(("h0/jobs/j/7/".to_string(), 1))
        );
        for bad in [
            "commits/12",
            "commits/00000000",
            "commits/000000012",
            "h0/commits/00000001/x",
            "chunks/00000001",
            "h0/touch/00000001/touch-window",
        ] {
            assert_eq!(record_key(bad), None, "{bad}");
        }
    }
}
