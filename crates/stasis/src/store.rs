//! `-D s3://BUCKET/PREFIX`: the glue between the commands and
//! `stasis-store` (a dump uploads from a staging directory before its
//! commit; restore, inspect and gc work on downloaded copies).

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use stasis_store::{Location, S3Image, Staging};

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
    staging: Staging,
    result: Mutex<Option<Result<stasis_store::Uploaded, String>>>,
}

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
            .upload_prepared(&self.image, checkpoint)
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
        (Ok(code), Some(Ok(u))) => {
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
            if let Err(e) = up.staging.trim() {
                eprintln!("stasis: warning: tidying the staging directory: {e}");
            }
            Ok(code)
        }
        (Ok(_), _) => anyhow::bail!("the dump did not reach its upload to {url}"),
    }
}

/// A private copy of what `inspect` shows: checkpoint `n` and its chain,
/// or every checkpoint.
pub fn fetch_for_inspect(image: &S3Image, n: Option<u32>) -> Result<stasis_store::TempImage> {
    let r = match n {
        Some(_) => stasis_store::fetch_to_temp(image, n),
        None => stasis_store::fetch_all_to_temp(image),
    };
    r.with_context(|| format!("fetching the checkpoints of {}", image.url))
}
