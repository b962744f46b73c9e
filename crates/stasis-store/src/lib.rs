//! Where checkpoints live: a local image directory (the `stasis-image`
//! crate) or an S3-compatible object store, `s3://BUCKET/PREFIX`.
//!
//! The object store holds each checkpoint as the files of its image
//! directory, split into parts, each compressed with zstd (unless that
//! does not pay) and, with a key, sealed with AES-256-GCM (with age
//! recipients, under a data key of each checkpoint's own, wrapped to them
//! in its commit record: `recipients.rs`); a
//! checkpoint is committed by the conditional creation of its commit
//! record. Commands work on local image directories: a dump writes into a
//! staging directory and uploads ([`Staging`]), a restore or inspect
//! downloads the chain it needs into a private temporary directory
//! ([`fetch_to_temp`]). The formats are in docs/storage.md.

mod chunking;
mod error;
mod gc;
mod key;
mod location;
mod recipients;
pub mod record;
pub mod remote;
mod s3image;
pub mod seal;
mod sparse;
mod staging;
mod touch;

pub use error::StoreError;
pub use gc::{gc, gc_under, GcReport, Swept, SWEEP_AGE_S};
pub use key::{parse_key, Key};
pub use location::Location;
pub use recipients::{generate_identity, DataKeys, Identities, Recipients};
pub use s3image::{Downloaded, S3Image, Uploaded};
pub use sparse::LazyChain;
pub use staging::{client_dir, Staging};
pub use touch::TOUCH_FILES;

use std::path::PathBuf;

/// A private temporary copy of checkpoints from a store (0700, removed
/// when dropped).
pub struct TempImage {
    dir: tempfile::TempDir,
    pub fetched: Downloaded,
}

impl TempImage {
    /// The local image directory.
    pub fn image(&self) -> PathBuf {
        self.dir.path().join("image")
    }
}

/// A new private (0700) temporary directory for downloaded checkpoints.
fn private_temp() -> Result<tempfile::TempDir, StoreError> {
    tempfile::Builder::new()
        .prefix("stasis-s3-")
        .tempdir()
        .map_err(StoreError::local(
            "create a temporary directory in",
            std::env::temp_dir(),
        ))
}

/// Downloads checkpoint `n` (default: the latest) and its chain into a new
/// private temporary directory.
pub fn fetch_to_temp(image: &S3Image, n: Option<u32>) -> Result<TempImage, StoreError> {
    let dir = private_temp()?;
    let fetched = image.download_chain(n, &dir.path().join("image"))?;
    Ok(TempImage { dir, fetched })
}

/// Downloads checkpoint `n` (default: the latest) and its chain into a new
/// private temporary directory, with sparse page packs (for a lazy
/// restore: [`LazyChain`] reads the rest).
pub fn fetch_sparse_to_temp(image: &S3Image, n: Option<u32>) -> Result<TempImage, StoreError> {
    let dir = private_temp()?;
    let fetched = image.download_chain_sparse(n, &dir.path().join("image"))?;
    Ok(TempImage { dir, fetched })
}

/// Downloads every committed checkpoint into a new private temporary
/// directory (for `inspect`).
pub fn fetch_all_to_temp(image: &S3Image) -> Result<TempImage, StoreError> {
    let committed = image.committed()?;
    if committed.is_empty() {
        return Err(StoreError::Empty {
            url: image.url.clone(),
        });
    }
    let dir = private_temp()?;
    let mut fetched = Downloaded::default();
    for n in committed.iter().rev() {
        let d = image.download_chain(Some(*n), &dir.path().join("image"))?;
        fetched.stored_bytes += d.stored_bytes;
        fetched.chain.push(*n);
    }
    Ok(TempImage { dir, fetched })
}

/// Downloads checkpoint `n` (default: the latest) and its chain from the
/// first of `images` that has it whole; returns the copy, the index of
/// the store it came from, and why the ones before it failed.
pub fn fetch_first(
    images: &[S3Image],
    n: Option<u32>,
) -> Result<(TempImage, usize, Vec<String>), StoreError> {
    let mut failed = Vec::new();
    let mut last = None;
    for (i, image) in images.iter().enumerate() {
        match fetch_to_temp(image, n) {
            Ok(t) => return Ok((t, i, failed)),
            Err(e) => {
                failed.push(format!("{}: {e}", image.url));
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or(StoreError::BadUrl {
        url: String::new(),
        reason: "no store given".into(),
    }))
}
