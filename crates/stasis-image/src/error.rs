//! The error type of the crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while reading or writing an image.
///
/// Messages are lowercase, name what failed (path, checkpoint number, address)
/// and end with what the user can do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// An I/O operation on a file or directory of the image failed.
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        /// What was being done ("read", "create", "fsync", ...).
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The image directory given to `open` does not exist.
    #[error("image directory {} does not exist: check the path given to stasis", .path.display())]
    NoSuchDir { path: PathBuf },

    /// A path that must be a directory is something else.
    #[error("{} is not a directory: pass the image directory given to `stasis dump`", .path.display())]
    NotADirectory { path: PathBuf },

    /// A directory without a valid `STASIS-IMAGE` marker was given to `open`.
    #[error("{} is not a stasis image directory ({reason}): pass the directory given to `stasis dump`", .path.display())]
    NotImageDir { path: PathBuf, reason: String },

    /// `create_or_open` was given a non-empty directory that is not an image.
    #[error("{} already contains files that are not a stasis image: refusing to write an image into it; pass an empty or new directory", .path.display())]
    ForeignDir { path: PathBuf },

    /// A path inside the image (or the image directory itself) is a symbolic
    /// link. Stasis never follows links, because images hold secrets.
    #[error("{} is a symbolic link: stasis does not follow links in an image; pass the real path or remove the link", .path.display())]
    Symlink { path: PathBuf },

    /// A file inside the image is not a regular file (FIFO, device, ...).
    #[error("{} is not a regular file: the image cannot be trusted; remove it or restore an earlier checkpoint with --checkpoint N", .path.display())]
    NotAFile { path: PathBuf },

    /// The image (marker, manifest or pack) was written by a newer stasis.
    #[error("image format version {found} is newer than this stasis supports ({supported}): upgrade stasis to read {}", .path.display())]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// `manifest.bin` failed validation (framing, checksum, decoding).
    #[error("manifest {} of checkpoint {checkpoint} is corrupt ({reason}): the image cannot be trusted; restore an earlier checkpoint with --checkpoint N", .path.display())]
    CorruptManifest {
        checkpoint: u32,
        path: PathBuf,
        reason: String,
    },

    /// A touch-set file failed validation.
    #[error("touch set {} is damaged ({reason}); it is ignored (the restore is unaffected, only its page order)", .path.display())]
    CorruptTouchSet { path: PathBuf, reason: FormatError },

    /// A manifest names a file that is not a plain file name (e.g. `../x`).
    #[error("checkpoint {} names the file {name:?}, which is not a plain file name: the image cannot be trusted (possible path traversal); restore an earlier checkpoint with --checkpoint N", cp_or_unknown(.checkpoint))]
    UnsafeName {
        checkpoint: Option<u32>,
        name: String,
    },

    /// The manifest could not be encoded (writer side).
    #[error(
        "cannot encode the manifest of checkpoint {checkpoint}: {reason}; this is a bug in stasis"
    )]
    Encode { checkpoint: u32, reason: String },

    /// The encoded manifest exceeds [`crate::MAX_MANIFEST_BYTES`].
    #[error("manifest of checkpoint {checkpoint} would be {len} bytes, more than the limit of {max}: the process tree is too large to dump")]
    ManifestTooLarge { checkpoint: u32, len: u64, max: u64 },

    /// A page pack failed structural validation (header, trailer, index).
    #[error("page pack {}{} is corrupt ({reason}): the image cannot be trusted; restore an earlier checkpoint with --checkpoint N", .path.display(), of_cp(.checkpoint))]
    CorruptPack {
        checkpoint: Option<u32>,
        path: PathBuf,
        reason: String,
    },

    /// A run of the content pack (the saved bytes of deleted files, memfds,
    /// shared memory) does not match its checksum.
    #[error("saved file content (bytes {at:#x}..{:#x} of {}{}) fails its checksum: the image is corrupt; restore an earlier checkpoint with --checkpoint N", .at.saturating_add(u64::from(*.npages).saturating_mul(crate::PAGE_SIZE)), .path.display(), of_cp(.checkpoint))]
    ContentChecksum {
        checkpoint: Option<u32>,
        path: PathBuf,
        at: u64,
        npages: u32,
    },

    /// The data of one run does not match its checksum.
    #[error("pages {vaddr:#x}..{:#x} in page pack {}{} fail their checksum: the memory image is corrupt; restore an earlier checkpoint with --checkpoint N", .vaddr.saturating_add(u64::from(*.npages).saturating_mul(crate::PAGE_SIZE)), .path.display(), of_cp(.checkpoint))]
    PageChecksum {
        checkpoint: Option<u32>,
        path: PathBuf,
        vaddr: u64,
        npages: u32,
    },

    /// `load(Some(n))` for a checkpoint that does not exist.
    #[error("checkpoint {number} does not exist in {} (it has {})", .dir.display(), list_numbers(.available))]
    NoSuchCheckpoint {
        dir: PathBuf,
        number: u32,
        available: Vec<u32>,
    },

    /// An incremental checkpoint whose ancestors cannot provide its pages.
    #[error("checkpoint {checkpoint} (parent {parent}) cannot be restored: {reason}; restore a full checkpoint with --checkpoint N (see `stasis inspect`)")]
    BrokenChain {
        checkpoint: u32,
        parent: u32,
        reason: String,
    },

    /// `load(None)` on an image without any committed checkpoint.
    #[error("image directory {} has no committed checkpoint: run `stasis dump` into it first", .dir.display())]
    NoCheckpoints { dir: PathBuf },

    /// The `latest` pointer names a checkpoint but none exists.
    #[error("the latest pointer of {} names checkpoint {pointer}, but the image has no checkpoint: its checkpoints were deleted or damaged; dump again", .dir.display())]
    LatestMissing { dir: PathBuf, pointer: u32 },

    /// The `latest` pointer is unreadable and no checkpoint exists.
    #[error("the latest pointer of {} is corrupt ({reason}) and the image has no checkpoint: dump again", .dir.display())]
    CorruptLatest { dir: PathBuf, reason: String },

    /// Another process holds the image directory's lock.
    #[error("another stasis process is writing to image directory {}: wait for it to finish, or use another directory", .dir.display())]
    Locked { dir: PathBuf },

    /// No checkpoint number is left.
    #[error("image directory {} has reached the largest checkpoint number: dump into a new directory", .dir.display())]
    TooManyCheckpoints { dir: PathBuf },

    /// `commit` was given a manifest for another checkpoint number.
    #[error("the manifest is for checkpoint {found} but this builder writes checkpoint {expected}: this is a bug in the dumper")]
    CheckpointMismatch { expected: u32, found: u32 },

    /// `write_run` was called with unaligned or out-of-order pages.
    #[error("cannot add {len:#x} bytes at {vaddr:#x} to page pack {}: {reason}; this is a bug in the dumper", .path.display())]
    BadRun {
        path: PathBuf,
        vaddr: u64,
        len: u64,
        reason: String,
    },

    /// A previous write to the pack failed; the pack is unusable.
    #[error("page pack {} is unusable after an earlier write error: abandon this checkpoint", .path.display())]
    WriterFailed { path: PathBuf },

    /// `read_run` was given a buffer of the wrong size.
    #[error("a buffer of {got} bytes was given to read a run of {expected} bytes: this is a bug in the caller")]
    BufferSize { expected: u64, got: u64 },

    /// `read_run` was given an entry that is not in this pack's index.
    #[error("the run at {vaddr:#x} is not in page pack {}: this is a bug in the caller", .path.display())]
    RunNotInPack { path: PathBuf, vaddr: u64 },

    /// `gc` was asked to keep no checkpoint.
    #[error("gc of {} must keep at least one checkpoint: pass --keep 1 or more (to drop every checkpoint, delete the image directory)", .dir.display())]
    KeepZero { dir: PathBuf },

    /// `gc` would leave a kept checkpoint that cannot be restored (its
    /// chain needs pages that the merge does not provide). Nothing was
    /// changed.
    #[error("gc would leave checkpoint {checkpoint} unrestorable ({reason}): nothing was deleted; keep more checkpoints with a larger --keep")]
    GcWouldBreak { checkpoint: u32, reason: String },

    /// The file system cannot exchange two directories atomically
    /// (`renameat2(RENAME_EXCHANGE)`), which merging needs to be crash-safe.
    #[error("the file system of {} cannot exchange directories atomically (renameat2 RENAME_EXCHANGE): gc cannot merge checkpoints safely here; nothing was deleted; keep the image on ext4, xfs, btrfs or tmpfs, or use a --keep that keeps a full checkpoint", .path.display())]
    NoAtomicExchange { path: PathBuf },

    /// The test hook of `gc_with_hook` stopped gc after `step`, as if it
    /// had been killed there.
    #[error(
        "gc stopped after step {step:?}: every kept checkpoint is intact; run gc again to finish"
    )]
    GcInterrupted { step: String },
}

/// Why the bytes of a touch set or of a page-pack index entry do not
/// decode: the `reason` of [`ImageError::CorruptTouchSet`] and
/// [`ImageError::CorruptPack`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("truncated: {0} bytes")]
    TooShort(usize),
    #[error("truncated")]
    Truncated,
    #[error("checksum mismatch")]
    Checksum,
    #[error("bad magic")]
    Magic,
    #[error("format {found}, this stasis reads {supported}")]
    Version { found: u32, supported: u32 },
    #[error("unknown source {0}")]
    UnknownSource(u32),
    #[error("range count beyond the end of the file")]
    CountBeyondEnd,
    #[error("reserved word of a range is not zero")]
    ReservedWord,
    #[error("reserved bytes are not zero")]
    ReservedBytes,
    #[error("bad range {start:#x}+{pages}")]
    BadRange { start: u64, pages: u32 },
    #[error("more than {0} pages")]
    TooManyPages(u64),
    #[error("trailing bytes")]
    Trailing,
    #[error("unknown flags {0:#x}")]
    UnknownFlags(u32),
    #[error("{npages} pages (must be 1..={max})")]
    RunPages { npages: u32, max: u32 },
    #[error("address {0:#x} is not page aligned")]
    Unaligned(u64),
    #[error("run at {0:#x} wraps around")]
    Wraps(u64),
    #[error("bad file offset {0:#x}")]
    FileOffset(u64),
    #[error("data at {off:#x} (+{len:#x}) extends past the end of page data")]
    PastEnd { off: u64, len: u64 },
    #[error("address {addr:#x} overlaps or precedes the previous run ending at {prev_end:#x}")]
    Overlap { addr: u64, prev_end: u64 },
    #[error("file offset {0:#x} overlaps the previous run's data")]
    DataOverlap(u64),
}

impl ImageError {
    /// Shorthand for an [`ImageError::Io`] mapper: `.map_err(io_err("read", path))`.
    pub(crate) fn io(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| ImageError::Io {
            action,
            path,
            source,
        }
    }
}

fn of_cp(cp: &Option<u32>) -> String {
    match cp {
        Some(n) => format!(" of checkpoint {n}"),
        None => String::new(),
    }
}

fn cp_or_unknown(cp: &Option<u32>) -> String {
    match cp {
        Some(n) => n.to_string(),
        None => "(unknown)".to_string(),
    }
}

fn list_numbers(v: &[u32]) -> String {
    if v.is_empty() {
        "no checkpoints".to_string()
    } else {
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// An error and its causes on one line, `: `-separated (a cause whose text
/// the line already holds is not repeated): for what leaves the process as
/// text, a protocol reply or a log line.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message is lowercase, has no trailing period and (except pure
    /// I/O errors) tells the user what to do after a colon.
    #[test]
    fn message_style() {
        let p = || PathBuf::from("/img");
        let io = || io::Error::from(io::ErrorKind::PermissionDenied);
        let all = vec![
            ImageError::Io {
                action: "read",
                path: p(),
                source: io(),
            },
            ImageError::NoSuchDir { path: p() },
            ImageError::NotADirectory { path: p() },
            ImageError::NotImageDir {
                path: p(),
                reason: "no marker".into(),
            },
            ImageError::ForeignDir { path: p() },
            ImageError::Symlink { path: p() },
            ImageError::NotAFile { path: p() },
            ImageError::NewerFormat {
                path: p(),
                found: 7,
                supported: 1,
            },
            ImageError::CorruptManifest {
                checkpoint: 3,
                path: p(),
                reason: "checksum mismatch".into(),
            },
            ImageError::UnsafeName {
                checkpoint: Some(3),
                name: "../x".into(),
            },
            ImageError::UnsafeName {
                checkpoint: None,
                name: "../x".into(),
            },
            ImageError::Encode {
                checkpoint: 3,
                reason: "x".into(),
            },
            ImageError::ManifestTooLarge {
                checkpoint: 3,
                len: 1,
                max: 0,
            },
            ImageError::CorruptPack {
                checkpoint: Some(3),
                path: p(),
                reason: "x".into(),
            },
            ImageError::PageChecksum {
                checkpoint: None,
                path: p(),
                vaddr: 0x1000,
                npages: 2,
            },
            ImageError::NoSuchCheckpoint {
                dir: p(),
                number: 5,
                available: vec![],
            },
            ImageError::NoCheckpoints { dir: p() },
            ImageError::LatestMissing {
                dir: p(),
                pointer: 3,
            },
            ImageError::CorruptLatest {
                dir: p(),
                reason: "x".into(),
            },
            ImageError::Locked { dir: p() },
            ImageError::TooManyCheckpoints { dir: p() },
            ImageError::CheckpointMismatch {
                expected: 1,
                found: 2,
            },
            ImageError::BadRun {
                path: p(),
                vaddr: 1,
                len: 1,
                reason: "x".into(),
            },
            ImageError::WriterFailed { path: p() },
            ImageError::BufferSize {
                expected: 1,
                got: 2,
            },
            ImageError::RunNotInPack {
                path: p(),
                vaddr: 1,
            },
            ImageError::KeepZero { dir: p() },
            ImageError::GcWouldBreak {
                checkpoint: 4,
                reason: "x".into(),
            },
            ImageError::NoAtomicExchange { path: p() },
            ImageError::GcInterrupted {
                step: "built 4".into(),
            },
        ];
        for e in all {
            let m = e.to_string();
            assert!(m.starts_with(|c: char| !c.is_uppercase()), "{m}");
            assert!(!m.ends_with('.'), "{m}");
            // The missing-checkpoint message lists the choices instead.
            if !matches!(e, ImageError::NoSuchCheckpoint { .. }) {
                assert!(m.contains(": "), "{m}");
            }
        }
        let e = ImageError::PageChecksum {
            checkpoint: Some(2),
            path: p(),
            vaddr: 0x1000,
            npages: 2,
        };
        assert_eq!(
            e.to_string(),
            "pages 0x1000..0x3000 in page pack /img of checkpoint 2 fail their checksum: the memory \
             image is corrupt; restore an earlier checkpoint with --checkpoint N"
        );
        let e = ImageError::NoSuchCheckpoint {
            dir: p(),
            number: 5,
            available: vec![1, 2, 3],
        };
        assert_eq!(
            e.to_string(),
            "checkpoint 5 does not exist in /img (it has 1, 2, 3)"
        );
    }
}
