//! `-D s3://BUCKET/PREFIX`: the glue between the commands and
//! `stasis-store` (a dump uploads from a staging directory before its
//! commit; restore, inspect and gc work on downloaded copies).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use stasis_store::{Location, S3Image, Staging};

/// Seal options from the global flags: the key file, and the age
/// recipients, recipients files and identity files.
pub fn seal_options(
    key_file: Option<&Path>,
    (recipients, recipient_files, identities): (&[String], &[PathBuf], &[PathBuf]),
    level: i32,
) -> Result<stasis_store::seal::SealOptions> {
    let age = !recipients.is_empty() || !recipient_files.is_empty() || !identities.is_empty();
    if key_file.is_some() && age {
        anyhow::bail!(
            "--encrypt-key-file and age recipients or identities (--encrypt-recipient, --encrypt-recipients-file, --decrypt-identity) exclude each other: a store is encrypted one way"
        );
    }
    let key = key_file.map(stasis_store::Key::from_file).transpose()?;
    Ok(stasis_store::seal::SealOptions {
        zstd: (level != 0).then_some(level),
        key,
        recipients: stasis_store::Recipients::from_args(recipients, recipient_files)?,
        identities: stasis_store::Identities::from_files(identities)?,
        ..Default::default()
    })
}

/// Refuses an identity without recipients for a command that writes: its
/// checkpoints would be stored in the clear.
pub fn refuse_identity_alone(seal: &stasis_store::seal::SealOptions) -> Result<()> {
    if seal.identities.is_some() && seal.recipients.is_none() {
        anyhow::bail!(
            "--decrypt-identity opens checkpoints but does not encrypt them: give --encrypt-recipient (or --encrypt-recipients-file) for the checkpoints this command writes"
        );
    }
    Ok(())
}

/// Refuses the object-store flags for a local image directory (an image
/// the user believes encrypted must not be written in the clear).
pub fn refuse_for_local(
    dir: &Path,
    seal: &stasis_store::seal::SealOptions,
    replicas: &[S3Image],
) -> Result<()> {
    if seal.key.is_some() {
        anyhow::bail!(
            "--encrypt-key-file applies to s3:// stores; {} is a local image directory, which is not encrypted",
            dir.display()
        );
    }
    if seal.recipients.is_some() || seal.identities.is_some() {
        anyhow::bail!(
            "--encrypt-recipient, --encrypt-recipients-file and --decrypt-identity apply to s3:// stores; {} is a local image directory, which is not encrypted",
            dir.display()
        );
    }
    if !replicas.is_empty() {
        anyhow::bail!(
            "--replica applies to s3:// stores; {} is a local image directory",
            dir.display()
        );
    }
    Ok(())
}

/// The replica stores of `--replica`.
pub fn replicas(urls: &[String], seal: &stasis_store::seal::SealOptions) -> Result<Vec<S3Image>> {
    urls.iter()
        .map(|u| match Location::parse(u)? {
            loc @ Location::S3 { .. } => Ok(S3Image::open(&loc, seal.clone())?),
            Location::Dir(_) => anyhow::bail!("--replica {u}: a replica is an s3:// URL"),
        })
        .collect()
}

/// The store named by `-D`, if it is an s3:// URL.
pub fn s3(dir: &Path, seal: stasis_store::seal::SealOptions) -> Result<Option<S3Image>> {
    let Some(arg) = dir.to_str() else {
        return Ok(None);
    };
    match Location::parse(arg)? {
        Location::Dir(_) => Ok(None),
        loc @ Location::S3 { .. } => Ok(Some(S3Image::open(&loc, seal)?)),
    }
}

/// Where the dumps of one command go in an object store: the store, its
/// replicas, and the local staging directory the capture writes into.
pub struct Target {
    /// The primary, then the replicas.
    stores: Vec<S3Image>,
    min_replicas: usize,
    staging: Staging,
}

/// A checkpoint committed in the store: the primary's report and a line
/// per replica.
pub struct Stored {
    pub uploaded: stasis_store::Uploaded,
    pub lines: Vec<String>,
}

impl Target {
    /// The dumps into `image` (with `replicas`, `min_replicas` of which
    /// must hold each checkpoint).
    pub fn open(image: S3Image, (replicas, min_replicas): (Vec<S3Image>, usize)) -> Result<Target> {
        let staging = Staging::for_image(&image)?;
        let mut stores = vec![image];
        stores.extend(replicas);
        Ok(Target {
            stores,
            min_replicas,
            staging,
        })
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.stores[0].url
    }

    /// The URLs of the store and its replicas.
    pub fn urls(&self) -> Vec<String> {
        self.stores.iter().map(|s| s.url.clone()).collect()
    }

    /// The staging image directory.
    pub fn staging_dir(&self) -> &Path {
        self.staging.dir()
    }

    /// Whether the store is encrypted (nothing stays in staging).
    pub fn encrypted(&self) -> bool {
        self.stores[0].seal.encrypts()
    }

    /// Before each dump: empties the staging directory unless its latest
    /// checkpoint is the store's latest (then the dump is full: the
    /// tracking state is dropped). Returns whether it was emptied.
    pub fn prepare(&self) -> Result<bool> {
        let emptied = self
            .staging
            .sync(&self.stores[0])
            .with_context(|| format!("reading the checkpoints of {}", self.url()))?;
        if emptied {
            // What tracking there was is relative to checkpoints no longer here.
            let _ = stasis_track::state::clear(self.staging.dir());
        }
        Ok(emptied)
    }

    /// The capture's `Cut` hook of one dump: it uploads and commits the
    /// checkpoint in the store before its local commit.
    pub fn hook(self: &Arc<Self>) -> Arc<Upload> {
        Arc::new(Upload {
            target: Arc::clone(self),
            result: Mutex::new(None),
        })
    }

    /// After the dump `dumped` through `hook`: what was stored, or why not.
    pub fn finish<T>(&self, hook: &Upload, dumped: Result<T>) -> Result<(T, Stored)> {
        let uploaded = hook.result.lock().ok().and_then(|mut g| g.take());
        let url = self.url();
        match (dumped, uploaded) {
            (Err(e), Some(Err(why))) => {
                Err(e.context(format!("storing the checkpoint in {url} failed: {why}")))
            }
            (Err(e), Some(Ok((u, _)))) => Err(e.context(format!(
                "checkpoint {} was committed in {url} before this failed",
                u.checkpoint
            ))),
            (Err(e), _) => Err(e),
            (Ok(t), Some(Ok((uploaded, lines)))) => Ok((t, Stored { uploaded, lines })),
            (Ok(_), _) => anyhow::bail!("the dump did not reach its upload to {url}"),
        }
    }

    /// After a stored dump: the staging directory keeps only the chain of
    /// its latest checkpoint (nothing, for an encrypted store: its
    /// plaintext does not stay on local disk).
    pub fn tidy(&self) {
        let tidied: Result<()> = if self.encrypted() {
            self.staging
                .clear()
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(stasis_track::state::clear(self.staging.dir())?))
        } else {
            self.staging.trim().map_err(anyhow::Error::from)
        };
        if let Err(e) = tidied {
            eprintln!("stasis: warning: tidying the staging directory: {e}");
        }
    }

    /// The store's number of staging checkpoint `n`, once uploaded.
    pub fn remote_number(&self, n: u32) -> Option<u32> {
        self.staging.remote_number(n)
    }

    /// Stores touch set `ts` with the committed checkpoint `n` of the
    /// store, then of each replica that holds it: best effort there (the
    /// checkpoint is committed already), a failure is a warning. Returns
    /// the replicas that hold it now.
    pub fn put_touch(&self, n: u32, ts: &stasis_image::touch::TouchSet) -> Result<Vec<String>> {
        let bytes = ts.encode();
        let name = ts.source.file_name();
        self.stores[0].put_touch(n, name, &bytes).with_context(|| {
            format!("storing the touch set of checkpoint {n} in {}", self.url())
        })?;
        Ok(self.stores[1..]
            .iter()
            .filter(|r| put_touch_copy(r, n, name, &bytes))
            .map(|r| r.url.clone())
            .collect())
    }

    /// The latest checkpoint committed in the store (else in the first
    /// replica that answers).
    pub fn latest(&self) -> Result<Option<u32>> {
        let mut failed = Vec::new();
        for s in &self.stores {
            match s.committed() {
                Ok(c) => return Ok(c.last().copied()),
                Err(e) => failed.push(format!("{}: {e}", s.url)),
            }
        }
        anyhow::bail!("listing the checkpoints: {}", failed.join("; "))
    }

    /// A private copy of checkpoint `n` and its chain (sparse with `lazy`,
    /// with the URL of the store the filler is to read the rest from).
    pub fn fetch(&self, n: u32, lazy: bool) -> Result<(stasis_store::TempImage, Option<String>)> {
        let mut stores = Vec::new();
        for s in &self.stores {
            let loc = Location::parse(&s.url)?;
            stores.push(S3Image::open(&loc, s.seal.clone())?);
        }
        let primary = stores.remove(0);
        if lazy {
            let (t, url) = fetch_lazy(primary, stores, Some(n))?;
            Ok((t, Some(url)))
        } else {
            Ok((fetch(primary, stores, Some(n))?, None))
        }
    }
}

/// Commits a dump's checkpoint in the store (the capture's `Cut` hook:
/// called once the checkpoint is written and synced locally, before its
/// local commit and before a dumped tree is killed).
pub struct Upload {
    target: Arc<Target>,
    result: Mutex<Option<UploadResult>>,
}

/// What the upload hook did: the primary's report and a line per replica,
/// or why it failed.
type UploadResult = Result<(stasis_store::Uploaded, Vec<String>), String>;

impl Upload {
    /// Why the upload failed, if it did.
    pub fn failure(&self) -> Option<String> {
        match self.result.lock().ok()?.as_ref()? {
            Err(why) => Some(why.clone()),
            Ok(_) => None,
        }
    }

    /// Whether the checkpoint was committed in the store.
    pub fn committed(&self) -> bool {
        self.result
            .lock()
            .ok()
            .is_some_and(|g| matches!(*g, Some(Ok(_))))
    }
}

impl stasis_capture::Cut for Upload {
    fn mark(&self) -> stasis_image::manifest::CutMark {
        stasis_image::manifest::CutMark {
            job: self.target.url().to_string(),
            round: 0,
        }
    }

    fn frozen(&self) -> std::result::Result<(), stasis_capture::CutAbort> {
        Ok(())
    }

    fn written(&self, checkpoint: u32) -> std::result::Result<(), stasis_capture::CutAbort> {
        let t = &self.target;
        let r = t
            .staging
            .upload_prepared(&t.stores[0], (&t.stores[1..], t.min_replicas), checkpoint)
            .map_err(|e| e.to_string());
        let out = r.clone().map(|_| ()).map_err(stasis_capture::CutAbort);
        if let Ok(mut g) = self.result.lock() {
            *g = Some(r);
        }
        out
    }
}

/// Stores a touch set recorded after a dump (the staging checkpoint's
/// number, the set) in the store; says where.
pub type TouchSink<'a> = &'a dyn Fn(u32, &stasis_image::touch::TouchSet) -> Result<String>;

/// One line on what a dump stored.
pub fn stored_line(url: &str, u: &stasis_store::Uploaded, encrypted: bool) -> String {
    format!(
        "stored as checkpoint {} of {url}: {} in {} new chunk(s), {} already stored, {} of zeros ({} in all before compression{})",
        u.checkpoint,
        crate::ui::bytes(u.stored_bytes),
        u.objects,
        u.reused,
        u.zero,
        crate::ui::bytes(u.plain_bytes),
        if encrypted { ", encrypted" } else { "" }
    )
}

/// `dump -D s3://...`: `dump_into` dumps into the staging directory with
/// the upload hook, and stores the touch set it records through the sink.
pub fn dump(
    image: S3Image,
    replicas: (Vec<S3Image>, usize),
    dump_into: impl FnOnce(&Path, Arc<dyn stasis_capture::Cut>, TouchSink) -> Result<ExitCode>,
) -> Result<ExitCode> {
    let target = Arc::new(Target::open(image, replicas)?);
    target.prepare()?;
    let hook = target.hook();
    let sink = |local: u32, ts: &stasis_image::touch::TouchSet| -> Result<String> {
        let n = target
            .remote_number(local)
            .context("the checkpoint of the touch set is not in the store")?;
        let replicas = target.put_touch(n, ts)?;
        let mut line = format!("stored with checkpoint {n} of {}", target.url());
        for r in replicas {
            line.push_str(&format!(" and of replica {r}"));
        }
        Ok(line)
    };
    let r = dump_into(target.staging_dir(), hook.clone(), &sink);
    let committed = hook.committed();
    let r = target.finish(&hook, r);
    if let Ok((_, stored)) = &r {
        println!(
            "{}",
            stored_line(target.url(), &stored.uploaded, target.encrypted())
        );
        for l in &stored.lines {
            println!("{l}");
        }
    }
    if committed {
        target.tidy();
    }
    r.map(|(code, _)| code)
}

/// A private copy of what `inspect` shows: checkpoint `n` and its chain,
/// or every checkpoint (from the primary, or the first replica that has
/// them).
pub fn fetch_for_inspect(
    image: S3Image,
    replicas: Vec<S3Image>,
    n: Option<u32>,
) -> Result<stasis_store::TempImage> {
    if n.is_none() && replicas.is_empty() {
        return stasis_store::fetch_all_to_temp(&image)
            .with_context(|| format!("fetching the checkpoints of {}", image.url));
    }
    fetch(image, replicas, n)
}

/// Checkpoint `n` (default: the latest) and its chain, from the primary
/// or the first replica that has them whole; says which when not the
/// primary.
pub fn fetch(
    image: S3Image,
    replicas: Vec<S3Image>,
    n: Option<u32>,
) -> Result<stasis_store::TempImage> {
    let mut all = vec![image];
    all.extend(replicas);
    let (t, i, failed) = stasis_store::fetch_first(&all, n)
        .with_context(|| format!("fetching the checkpoints of {}", all[0].url))?;
    if i > 0 {
        eprintln!(
            "stasis: read from replica {} ({})",
            all[i].url,
            failed.join("; ")
        );
    }
    Ok(t)
}

/// `restore --lazy -D s3://...`: checkpoint `n` (default: the latest) and
/// its chain with sparse page packs, from the primary or the first replica
/// that has them, with the pages of the areas a lazy restore fills before
/// the tree runs fetched in; and the URL of the store it came from (the
/// filler reads the rest there).
pub fn fetch_lazy(
    image: S3Image,
    replicas: Vec<S3Image>,
    n: Option<u32>,
) -> Result<(stasis_store::TempImage, String)> {
    let mut all = vec![image];
    all.extend(replicas);
    let mut failed = Vec::new();
    for (i, image) in all.into_iter().enumerate() {
        let url = image.url.clone();
        match fetch_lazy_from(image, n) {
            Ok(t) => {
                if i > 0 {
                    eprintln!("stasis: read from replica {url} ({})", failed.join("; "));
                }
                return Ok((t, url));
            }
            Err(e) if i == 0 && failed.is_empty() => failed.push(format!("{url}: {e:#}")),
            Err(e) => failed.push(format!("{url}: {e:#}")),
        }
    }
    anyhow::bail!(
        "fetching the checkpoints for a lazy restore: {}",
        failed.join("; ")
    )
}

fn fetch_lazy_from(image: S3Image, n: Option<u32>) -> Result<stasis_store::TempImage> {
    let t = stasis_store::fetch_sparse_to_temp(&image, n)?;
    let head = *t.fetched.chain.first().context("an empty chain")?;
    let chain = stasis_store::LazyChain::open(image, head)?;
    fill_eager(&chain, &t.image(), head)?;
    Ok(t)
}

/// Fetches into the sparse packs at `dir` the runs of the areas a lazy
/// restore fills before the tree runs (as `stasis_lazy::fill_eager` does
/// from a page server).
fn fill_eager(chain: &stasis_store::LazyChain, dir: &Path, n: u32) -> Result<()> {
    let store = stasis_image::ImageDir::open(dir)?;
    let cps = stasis_image::load_chain(&store, Some(n))?;
    let head = cps.first().context("an empty chain")?;
    for p in head
        .manifest
        .processes
        .iter()
        .filter(|p| p.zombie.is_none())
    {
        for src in stasis_image::page_sources(&cps, p)? {
            let runs = stasis_lazy::eager::eager_runs(src.pack.runs(), &p.vmas);
            if runs.is_empty() {
                continue;
            }
            let ranges: Vec<(u64, u64)> = runs.iter().map(|r| (r.file_off, r.len())).collect();
            let path = src.pack.path();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            chain
                .fill(src.checkpoint, &src.pack.file_name(), &file, &ranges)
                .with_context(|| format!("fetching the eager pages of process {}", p.pid))?;
        }
    }
    Ok(())
}

/// Stores touch set `ts` with checkpoint `n` of the store at `url` (the
/// fault order of a lazy restore from it).
pub fn put_touch(
    url: &str,
    seal: stasis_store::seal::SealOptions,
    n: u32,
    ts: &stasis_image::touch::TouchSet,
) -> Result<()> {
    let image = match Location::parse(url)? {
        loc @ Location::S3 { .. } => S3Image::open(&loc, seal)?,
        Location::Dir(_) => anyhow::bail!("{url} is not an s3:// URL"),
    };
    image
        .put_touch(n, ts.source.file_name(), &ts.encode())
        .with_context(|| {
            format!(
                "storing the {} of checkpoint {n} in {url}",
                ts.source.file_name()
            )
        })
}

/// Stores touch set `ts` with checkpoint `n` of each store of `urls`
/// that holds it (the other copies of the store a lazy restore read
/// from): best effort, a failure is a warning.
pub fn put_touch_copies(
    urls: &[String],
    seal: &stasis_store::seal::SealOptions,
    n: u32,
    ts: &stasis_image::touch::TouchSet,
) {
    let (name, bytes) = (ts.source.file_name(), ts.encode());
    for url in urls {
        let image = match Location::parse(url) {
            Ok(loc @ Location::S3 { .. }) => S3Image::open(&loc, seal.clone()),
            Ok(Location::Dir(_)) => continue,
            Err(e) => Err(e),
        };
        match image {
            Ok(image) => {
                put_touch_copy(&image, n, name, &bytes);
            }
            Err(e) => {
                eprintln!("stasis: warning: the {name} of checkpoint {n} is not in {url}: {e}")
            }
        }
    }
}

/// Stores the touch set `name` (encoded as `bytes`) with checkpoint `n`
/// of another copy of a store: best effort, a failure is a warning; a
/// copy without the checkpoint is skipped. Returns whether it holds it now.
fn put_touch_copy(image: &S3Image, n: u32, name: &str, bytes: &[u8]) -> bool {
    match image.put_touch(n, name, bytes) {
        Ok(()) => true,
        Err(stasis_store::StoreError::NoSuchCheckpoint { .. }) => false,
        Err(e) => {
            eprintln!(
                "stasis: warning: the {name} of checkpoint {n} is not in {}: {e}",
                image.url
            );
            false
        }
    }
}

/// The pages of a lazy restore read from an object store (ranged reads of
/// the packs' chunks), each run checked against its checksum.
pub struct S3Runs(stasis_store::LazyChain);

impl S3Runs {
    /// The chain of checkpoint `n` in the store at `url`.
    pub fn open(url: &str, seal: stasis_store::seal::SealOptions, n: u32) -> Result<S3Runs> {
        let image = match Location::parse(url)? {
            loc @ Location::S3 { .. } => S3Image::open(&loc, seal)?,
            Location::Dir(_) => anyhow::bail!("--store {url} is not an s3:// URL"),
        };
        Ok(S3Runs(stasis_store::LazyChain::open(image, n)?))
    }
}

impl stasis_lazy::RunSource for S3Runs {
    fn read_run(
        &self,
        catalog: &stasis_lazy::Catalog,
        pack: usize,
        e: &stasis_image::RunEntry,
        buf: &mut [u8],
    ) -> Result<(), stasis_lazy::ReadError> {
        let p = catalog.pack(pack)?;
        self.0
            .read_run(p.checkpoint, &p.name, e, buf)
            .map_err(|err| match err {
                stasis_store::StoreError::Image(i) => i,
                err => stasis_image::ImageError::Io {
                    action: "fetch pages from",
                    path: format!("{}: {}", self.0.url(), p.name).into(),
                    source: std::io::Error::other(err),
                },
            })?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("the object store at {}", self.0.url())
    }
}
