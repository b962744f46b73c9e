//! `-D s3://BUCKET/PREFIX`: the glue between the commands and
//! `stasis-store` (a dump uploads from a staging directory before its
//! commit; restore, inspect and gc work on downloaded copies).

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use stasis_store::{Location, S3Image, Staging};

/// Refuses `-D URL` for a command that works on a local directory only
/// (`run`, `page-server`, `agent`), rather than making a directory named
/// after the URL.
pub fn local_only(dir: &Path, command: &str) -> Result<()> {
    if let Some(arg) = dir.to_str() {
        if let Location::S3 { .. } = Location::parse(arg)? {
            anyhow::bail!(
                "stasis {command} keeps its images in a local directory: -D {arg} is an object store, which dump, restore, inspect and gc support (give {command} a directory)"
            );
        }
    }
    Ok(())
}

/// Seal options from the global flags.
pub fn seal_options(
    key_file: Option<&Path>,
    level: i32,
) -> Result<stasis_store::seal::SealOptions> {
    let key = key_file.map(stasis_store::Key::from_file).transpose()?;
    Ok(stasis_store::seal::SealOptions {
        zstd: (level != 0).then_some(level),
        key,
    })
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

/// Commits a dump's checkpoint in the store (the capture's `Cut` hook:
/// called once the checkpoint is written and synced locally, before its
/// local commit and before a dumped tree is killed).
struct Upload {
    image: S3Image,
    replicas: Vec<S3Image>,
    min_replicas: usize,
    staging: Staging,
    result: Mutex<Option<UploadResult>>,
}

/// What the upload hook did: the primary's report and a line per replica,
/// or why it failed.
type UploadResult = Result<(stasis_store::Uploaded, Vec<String>), String>;

impl stasis_capture::Cut for Upload {
    fn mark(&self) -> stasis_image::manifest::CutMark {
        stasis_image::manifest::CutMark {
            job: self.image.url.clone(),
            round: 0,
        }
    }

    fn frozen(&self) -> std::result::Result<(), stasis_capture::CutAbort> {
        Ok(())
    }

    fn written(&self, checkpoint: u32) -> std::result::Result<(), stasis_capture::CutAbort> {
        let r = self
            .staging
            .upload_prepared(&self.image, (&self.replicas, self.min_replicas), checkpoint)
            .map_err(|e| e.to_string());
        let out = r.clone().map(|_| ()).map_err(stasis_capture::CutAbort);
        if let Ok(mut g) = self.result.lock() {
            *g = Some(r);
        }
        out
    }
}

/// `dump -D s3://...`: `dump_into` dumps into the staging directory with
/// the upload hook.
pub fn dump(
    image: S3Image,
    (replicas, min_replicas): (Vec<S3Image>, usize),
    dump_into: impl FnOnce(&Path, Arc<dyn stasis_capture::Cut>) -> Result<ExitCode>,
) -> Result<ExitCode> {
    let staging = Staging::for_image(&image)?;
    if staging
        .sync(&image)
        .with_context(|| format!("reading the checkpoints of {}", image.url))?
    {
        // What tracking there was is relative to checkpoints no longer here.
        let _ = stasis_track::state::clear(staging.dir());
    }
    let dir = staging.dir().to_path_buf();
    let url = image.url.clone();
    let up = Arc::new(Upload {
        image,
        replicas,
        min_replicas,
        staging,
        result: Mutex::new(None),
    });
    let r = dump_into(&dir, up.clone());
    let uploaded = up.result.lock().ok().and_then(|mut g| g.take());
    match (r, uploaded) {
        (Err(e), Some(Err(why))) => {
            Err(e.context(format!("storing the checkpoint in {url} failed: {why}")))
        }
        (Err(e), _) => Err(e),
        (Ok(code), Some(Ok((u, lines)))) => {
            println!(
                "stored as checkpoint {} of {url}: {} in {} new chunk(s), {} already stored, {} of zeros ({} in all before compression{})",
                u.checkpoint,
                crate::ui::bytes(u.stored_bytes),
                u.objects,
                u.reused,
                u.zero,
                crate::ui::bytes(u.plain_bytes),
                if up.image.seal.key.is_some() {
                    ", encrypted"
                } else {
                    ""
                }
            );
            for l in lines {
                println!("{l}");
            }
            // An encrypted store's plaintext does not stay on local disk.
            let tidied: Result<()> = if up.image.seal.key.is_some() {
                up.staging
                    .clear()
                    .map_err(anyhow::Error::from)
                    .and_then(|()| Ok(stasis_track::state::clear(up.staging.dir())?))
            } else {
                Ok(up.staging.trim()?)
            };
            if let Err(e) = tidied {
                eprintln!("stasis: warning: tidying the staging directory: {e}");
            }
            Ok(code)
        }
        (Ok(_), _) => anyhow::bail!("the dump did not reach its upload to {url}"),
    }
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
