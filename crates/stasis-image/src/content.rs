//! The content pack: the bytes of the files a checkpoint saves whole
//! (deleted files and memfds, System V segments, POSIX shared memory
//! objects, the files of a namespaced tree's tmpfs mounts), stored outside the manifest so that their size is not
//! bounded by it and neither a dump nor a restore holds them in memory.
//!
//! It is a page pack (`content.pack`, header pid 0) like a process's,
//! referenced by [`Manifest::content`]; every storage path (object store,
//! page server, gc, `inspect --verify`) carries it as it carries any file
//! of a checkpoint. Each data extent of an object records where its bytes
//! are: [`Extent::at`], the pack address of its first byte, and
//! [`Extent::len`]. The writer gives each extent the next free page
//! address, a page after the previous one's last page, so that no run of
//! the pack spans two extents (and reading an extent reads its own runs
//! only); the bytes after `len` in its last page are zeros.
//!
//! See `docs/image-format.md`, "Content pack".

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::manifest::{Extent, Manifest, PackRef};
use crate::pack::{PackReader, PackWriter, IO_BUF};
use crate::store::Checkpoint;
use crate::{ImageError, PAGE_SIZE};

/// File name of the content pack in a checkpoint directory.
pub const CONTENT_PACK_NAME: &str = "content.pack";

/// A damaged run of the content pack is named as such (not as pages).
fn as_content(e: ImageError) -> ImageError {
    match e {
        ImageError::PageChecksum {
            checkpoint,
            path,
            vaddr,
            npages,
        } => ImageError::ContentChecksum {
            checkpoint,
            path,
            at: vaddr,
            npages,
        },
        e => e,
    }
}

/// Rounds `n` up to a whole number of pages (`None` on overflow).
fn page_up(n: u64) -> Option<u64> {
    n.checked_add(PAGE_SIZE - 1)
        .map(|e| e / PAGE_SIZE * PAGE_SIZE)
}

/// Writes the content pack of a checkpoint being made; created by
/// [`CheckpointBuilder::content_writer`](crate::CheckpointBuilder::content_writer).
/// The pack file is made on the first extent with data.
#[derive(Debug)]
pub struct ContentWriter {
    dir: PathBuf,
    pack: Option<PackWriter>,
    /// Pack address of the next extent.
    next: u64,
    buf: Vec<u8>,
}

impl ContentWriter {
    pub(crate) fn new(dir: &Path) -> ContentWriter {
        ContentWriter {
            dir: dir.to_path_buf(),
            pack: None,
            next: 0,
            buf: Vec::new(),
        }
    }

    /// Copies the `len` bytes at `offset` of `src` (named `src_path` in
    /// errors) into the pack, a buffer at a time, and returns the extent
    /// that says where they are.
    pub fn copy_extent(
        &mut self,
        src: &File,
        src_path: &Path,
        offset: u64,
        len: u64,
    ) -> Result<Extent, ImageError> {
        let at = self.next;
        if len == 0 {
            return Ok(Extent {
                offset,
                data: Vec::new(),
                len: 0,
                at,
            });
        }
        let too_big = || ImageError::BadRun {
            path: self.dir.join(CONTENT_PACK_NAME),
            vaddr: at,
            len,
            reason: "the content pack's address space is full".into(),
        };
        let stored = page_up(len).ok_or_else(too_big)?;
        let next = at
            .checked_add(stored)
            .and_then(|e| e.checked_add(PAGE_SIZE))
            .ok_or_else(too_big)?;
        if self.pack.is_none() {
            self.pack = Some(PackWriter::create(
                &self.dir,
                CONTENT_PACK_NAME.to_string(),
                0,
            )?);
        }
        if self.buf.is_empty() {
            self.buf = vec![0u8; IO_BUF];
        }
        let mut done = 0u64;
        while done < len {
            let take = (len - done).min(IO_BUF as u64);
            // `take` <= IO_BUF: fits in usize.
            let n = usize::try_from(take).unwrap_or(IO_BUF);
            let padded = usize::try_from(page_up(take).unwrap_or(take)).unwrap_or(IO_BUF);
            let buf = &mut self.buf[..padded];
            src.read_exact_at(&mut buf[..n], offset + done)
                .map_err(ImageError::io("read", src_path))?;
            buf[n..].fill(0);
            if let Some(pack) = self.pack.as_mut() {
                pack.write_run(at + done, buf)?;
            }
            done += take;
        }
        self.next = next;
        Ok(Extent {
            offset,
            data: Vec::new(),
            len,
            at,
        })
    }

    /// Finishes the pack: its reference for [`Manifest::content`], or
    /// `None` if no extent held data (no file was made).
    pub fn finish(self) -> Result<Option<PackRef>, ImageError> {
        self.pack.map(PackWriter::finish).transpose()
    }
}

/// Where a restore reads saved content from: the checkpoint's content pack
/// (opened and verified whole by [`Checkpoint::open_content`]), and the
/// manifest's inline bytes of images written before it.
#[derive(Debug, Default)]
pub struct ContentSource {
    pack: Option<PackReader>,
}

impl ContentSource {
    /// Opens the content pack at `path` (checked against its reference
    /// `r`) and verifies every run of it.
    pub fn open(path: &Path, r: &PackRef) -> Result<ContentSource, ImageError> {
        let pack = PackReader::open(path, Some(r))?;
        pack.verify().map_err(as_content)?;
        Ok(ContentSource { pack: Some(pack) })
    }

    /// A source without a pack: only inline content can be read.
    pub fn inline_only() -> ContentSource {
        ContentSource::default()
    }

    /// Calls `put(offset, bytes)` for the bytes of extent `e`, in order, at
    /// most 1 MiB at a time, each run checked against its checksum before
    /// any of its bytes is passed on.
    pub fn read_extent<E: From<ImageError>>(
        &self,
        e: &Extent,
        mut put: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if e.len == 0 {
            return if e.data.is_empty() {
                Ok(())
            } else {
                put(e.offset, &e.data)
            };
        }
        let missing = |path: PathBuf, reason: String| ImageError::CorruptPack {
            checkpoint: None,
            path,
            reason,
        };
        let Some(pack) = &self.pack else {
            return Err(missing(
                PathBuf::from(CONTENT_PACK_NAME),
                format!(
                    "the manifest has content in a content pack (extent at {:#x}) but names none",
                    e.at
                ),
            )
            .into());
        };
        let end = e.at.checked_add(e.len).ok_or_else(|| {
            missing(
                pack.path().to_path_buf(),
                format!("extent at {:#x} of {} bytes wraps around", e.at, e.len),
            )
        })?;
        let mut pos = e.at;
        let mut buf = Vec::new();
        while pos < end {
            let Some(run) = pack.run_containing(pos).copied().filter(|r| r.vaddr == pos) else {
                return Err(missing(
                    pack.path().to_path_buf(),
                    format!(
                        "it lacks the bytes at {pos:#x} (extent of {} bytes at {:#x})",
                        e.len, e.at
                    ),
                )
                .into());
            };
            buf.resize(usize::try_from(run.len()).unwrap_or(0), 0);
            pack.read_run(&run, &mut buf).map_err(as_content)?;
            let take = (end - pos).min(run.len());
            let n = usize::try_from(take).unwrap_or(0);
            put(e.offset + (pos - e.at), &buf[..n])?;
            pos += take;
        }
        Ok(())
    }
}

impl Checkpoint {
    /// Opens this checkpoint's content pack, if it has one, and verifies
    /// every run of it: damaged content is refused before a restore makes
    /// anything.
    pub fn open_content(&self) -> Result<ContentSource, ImageError> {
        let Some(r) = &self.manifest.content else {
            return Ok(ContentSource::default());
        };
        let pack = self.open_pack(r)?;
        pack.verify().map_err(as_content)?;
        Ok(ContentSource { pack: Some(pack) })
    }
}

/// Every pack `m` references: its processes' and its content pack.
pub fn pack_refs(m: &Manifest) -> impl Iterator<Item = &PackRef> {
    m.processes
        .iter()
        .filter_map(|p| p.pack.as_ref())
        .chain(m.content.as_ref())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| {
                u8::try_from(i % 251)
                    .unwrap()
                    .wrapping_mul(31)
                    .wrapping_add(seed)
            })
            .collect()
    }

    /// Extents of any length and offset (a 3 MiB one spans several runs;
    /// one ends inside a page) come back byte for byte, each at its
    /// offset; an empty one is stored nowhere.
    #[test]
    fn extents_round_trip_through_the_pack() {
        let d = tempfile::tempdir().unwrap();
        let src_path = d.path().join("src");
        let src = File::create_new(&src_path).unwrap();
        let a = pattern((3 << 20) + 17, 1);
        let b = pattern(5000, 2);
        src.write_all_at(&a, 100).unwrap();
        src.write_all_at(&b, 8 << 20).unwrap();
        let src = File::open(&src_path).unwrap();
        let mut w = ContentWriter::new(d.path());
        let ea = w.copy_extent(&src, &src_path, 100, a.len() as u64).unwrap();
        let e0 = w.copy_extent(&src, &src_path, 7 << 20, 0).unwrap();
        let eb = w.copy_extent(&src, &src_path, 8 << 20, 5000).unwrap();
        assert_eq!((ea.offset, ea.len, ea.at), (100, a.len() as u64, 0));
        assert_eq!(e0.len, 0);
        assert!(eb.at >= page_up(a.len() as u64).unwrap() + PAGE_SIZE);
        assert_eq!(eb.at % PAGE_SIZE, 0);
        let r = w.finish().unwrap().unwrap();
        let cs = ContentSource::open(&d.path().join(&r.name), &r).unwrap();
        for (e, want) in [(&ea, &a), (&eb, &b)] {
            let mut got = vec![0u8; want.len()];
            cs.read_extent::<ImageError>(e, |off, bytes| {
                let at = usize::try_from(off - e.offset).unwrap();
                got[at..at + bytes.len()].copy_from_slice(bytes);
                Ok(())
            })
            .unwrap();
            assert!(&got == want, "extent at {}", e.offset);
        }
        cs.read_extent::<ImageError>(&e0, |_, _| panic!("an empty extent has no bytes"))
            .unwrap();
        // Inline bytes (older images) need no pack.
        let inline = Extent::inline(3, vec![9; 10]);
        let mut seen = Vec::new();
        ContentSource::inline_only()
            .read_extent::<ImageError>(&inline, |off, bytes| {
                seen.push((off, bytes.to_vec()));
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, vec![(3, vec![9; 10])]);
    }

    /// Nothing written: no pack file. A flipped byte of data: refused when
    /// the pack is opened, naming saved content. A pack-stored extent with
    /// no pack, or past the pack's runs: an error, never zeros.
    #[test]
    fn damaged_or_missing_content_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert!(ContentWriter::new(d.path()).finish().unwrap().is_none());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);

        let src_path = d.path().join("src");
        std::fs::write(&src_path, pattern(10000, 3)).unwrap();
        let src = File::open(&src_path).unwrap();
        let mut w = ContentWriter::new(d.path());
        let e = w.copy_extent(&src, &src_path, 0, 10000).unwrap();
        let r = w.finish().unwrap().unwrap();
        let path = d.path().join(&r.name);

        let none = ContentSource::inline_only().read_extent::<ImageError>(&e, |_, _| Ok(()));
        assert!(
            matches!(none, Err(ImageError::CorruptPack { .. })),
            "{none:?}"
        );
        let cs = ContentSource::open(&path, &r).unwrap();
        let past = Extent {
            at: e.at + (1 << 20),
            ..e.clone()
        };
        let err = cs
            .read_extent::<ImageError>(&past, |_, _| Ok(()))
            .unwrap_err();
        assert!(err.to_string().contains("lacks the bytes"), "{err}");

        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut byte = [0u8];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut byte, 4096 + 5000)
            .unwrap();
        f.write_all_at(&[byte[0] ^ 1], 4096 + 5000).unwrap();
        let err = ContentSource::open(&path, &r).unwrap_err();
        assert!(
            matches!(
                err,
                ImageError::ContentChecksum {
                    at: 0,
                    npages: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("saved file content"), "{err}");
    }
}
