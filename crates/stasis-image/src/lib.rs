//! The Stasis image format: manifest, page packs and the checkpoint store.
//!
//! An image directory holds numbered checkpoints. Each checkpoint is a
//! directory with a `manifest.bin` (everything but page contents, CBOR with a
//! checksummed header) and one page pack per process (page-aligned page data
//! plus a checksummed index). Checkpoints are committed atomically; readers
//! only ever see complete checkpoints. The format is specified in
//! `docs/image-format.md`.
//!
//! Old checkpoints are deleted with [`ImageDir::gc`], which first merges a
//! kept incremental checkpoint with the ancestors it needs.
//!
//! This crate only does file I/O: it never touches another process. Every
//! file it creates is mode 0600, every directory 0700, and it never follows
//! a symbolic link inside an image.
//!
//! ```no_run
//! # fn main() -> Result<(), stasis_image::ImageError> {
//! # let manifest: stasis_image::Manifest = todo!();
//! use stasis_image::ImageDir;
//! let image = ImageDir::create_or_open("/var/lib/stasis/job".as_ref())?;
//! let mut cp = image.begin_checkpoint()?;
//! let mut pack = cp.create_pack(1234)?;
//! pack.write_run(0x7f00_0000_0000, &[0u8; 8192])?;
//! let pack_ref = pack.finish()?;
//! // ... put pack_ref into the manifest's ProcessImage ...
//! cp.commit(&manifest)?;
//! # Ok(()) }
//! ```

pub mod areas;
pub mod chain;
mod content;
mod error;
mod fsutil;
mod gc;
pub mod manifest;
mod manifest_io;
mod pack;
mod pack_index;
mod prepared;
pub mod ranges;
mod store;
mod summary;
pub mod touch;

pub use chain::{load_chain, page_sources, PageSource};
pub use content::{pack_refs, ContentSource, ContentWriter, CONTENT_PACK_NAME};
pub use error::{one_line, FormatError, ImageError};
pub use fsutil::{is_plain_name, write_atomic_file};
pub use gc::{GcReport, MergeReport};
pub use manifest::*;
pub use manifest_io::{
    decode_manifest, encode_manifest, MANIFEST_HEADER_LEN, MANIFEST_MAGIC, MAX_MANIFEST_BYTES,
};
pub use pack::{
    encode_tail, pack_header, PackIndex, PackReader, PackWriter, ReadAt, RunEntry, MAX_PACK_RUNS,
    PACK_ENTRY_LEN, PACK_HEADER_LEN, PACK_MAGIC, PACK_TRAILER_LEN, PACK_TRAILER_MAGIC,
    RUN_FLAG_ZERO,
};
pub use prepared::{PreparedTemp, CUT_NAME};
pub use store::{
    checkpoint_dir_name, pack_file_name, parse_latest, parse_marker, remove_temps_of, temp_owner,
    Checkpoint, CheckpointBuilder, ImageDir, MarkerProblem, CHECKPOINTS_DIR, LATEST_NAME,
    LOCK_NAME, MANIFEST_NAME, MARKER_NAME, TEMP_PREFIX,
};
pub use summary::{summarize, verify_checkpoint, CheckpointSummary, ProcessSummary};

/// Version of the image format written by this crate, and the newest it reads.
pub const FORMAT_VERSION: u32 = 2;
/// Page size of the images: the kernel's base page ([`stasis_sys::PAGE_SIZE`]).
pub const PAGE_SIZE: u64 = stasis_sys::PAGE_SIZE;
/// Largest run (index entry) in a page pack: 256 pages = 1 MiB.
pub const MAX_RUN_PAGES: u32 = 256;
