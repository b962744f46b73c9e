//! The bytes of the files a dump saves whole (deleted files and memfds,
//! System V segments, POSIX shared memory objects): found while the tree
//! is frozen (their data ranges, `SEEK_DATA`/`SEEK_HOLE`, and an open
//! file to read them from), then copied into the checkpoint's content
//! pack a buffer at a time ([`PendingContent::write`], see
//! `stasis_image::ContentWriter`); at restore, read back the same way
//! ([`put_back`]). Neither holds a whole file in memory, so their size is
//! bounded by nothing but the kernel.

use std::fs::File;
use std::path::PathBuf;

use stasis_image::manifest::Extent;
use stasis_image::{ContentSource, ContentWriter, ImageError};

/// The data of a saved file, to be written into the content pack.
#[derive(Debug)]
pub struct PendingContent {
    /// The file, open for reading.
    pub file: File,
    /// Its path, for errors.
    pub path: PathBuf,
    /// Its data ranges `[start, end)`, in order.
    pub ranges: Vec<(u64, u64)>,
}

impl PendingContent {
    /// Copies every data range into the pack; returns the extents that
    /// say where they went.
    pub fn write(&self, w: &mut ContentWriter) -> Result<Vec<Extent>, ImageError> {
        self.ranges
            .iter()
            .map(|&(a, b)| w.copy_extent(&self.file, &self.path, a, b.saturating_sub(a)))
            .collect()
    }
}

/// Calls `put(offset, bytes)` for every byte of `extents`, from `src`
/// (`None`: only inline bytes, as images written before content packs
/// have).
pub fn put_back<E: From<ImageError>>(
    src: Option<&ContentSource>,
    extents: &[Extent],
    mut put: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let inline = ContentSource::inline_only();
    let src = src.unwrap_or(&inline);
    for e in extents {
        src.read_extent(e, &mut put)?;
    }
    Ok(())
}
