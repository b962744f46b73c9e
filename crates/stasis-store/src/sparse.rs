//! Lazy restore from an object store: a checkpoint chain fetched sparsely
//! (every file whole but the page packs, of which only the chunks holding
//! the header, the index and the trailer; the page data stays holes), and
//! ranged reads of the rest as the restored process faults it in.
//!
//! A range of a file is read as the chunks that cover it: a chunk is the
//! unit the store addresses (compressed and sealed whole), so a run of at
//! most 256 pages (1 MiB) costs one or two GETs of at most 1 MiB. Each
//! chunk is checked against its id before use, as in a whole download;
//! the last few chunks read are kept in memory, so the neighbouring runs of
//! one chunk cost one GET.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use stasis_image::{PACK_TRAILER_LEN, PACK_TRAILER_MAGIC};

use crate::record::{FileRecord, Record};
use crate::{Downloaded, S3Image, StoreError};

/// Chunks kept in memory by a [`LazyChain`].
const CACHED_CHUNKS: usize = 16;

/// Whether a checkpoint file is a page pack (`pages-<pid>.pack`).
pub(crate) fn is_pack(name: &str) -> bool {
    name.starts_with("pages-") && name.ends_with(".pack")
}

/// The chunks of pack `f` (of record `r`) that hold its header, index and
/// trailer. The last chunk (which holds the trailer, and so where the index
/// starts) is read here and written into `file`; the others are returned.
/// A pack whose trailer cannot be read this way is fetched whole (and then
/// refused by the pack reader, with the image format's own message).
pub(crate) fn skeleton_chunks(
    image: &S3Image,
    r: &Record,
    f: &FileRecord,
    file: &File,
    stored: &mut u64,
) -> Result<Vec<usize>, StoreError> {
    let all: Vec<usize> = (0..f.chunks.len()).collect();
    let Some(last) = f.chunks.len().checked_sub(1) else {
        return Ok(all);
    };
    let tail = image.read_chunk(r, f, last)?;
    let trailer_len = usize::try_from(PACK_TRAILER_LEN).unwrap_or(usize::MAX);
    let Some(t) = tail.len().checked_sub(trailer_len).map(|at| &tail[at..]) else {
        return Ok(all);
    };
    if t[..8] != PACK_TRAILER_MAGIC {
        return Ok(all);
    }
    let index_off = u64::from_le_bytes(t[8..16].try_into().unwrap_or_default());
    let spans = f.spans();
    file.write_all_at(&tail, spans[last].0)
        .map_err(StoreError::local("write", Path::new(&f.name)))?;
    *stored += tail.len() as u64; // (plain bytes: close enough for a report)
    if last == 0 {
        return Ok(Vec::new());
    }
    let first_tail = chunk_at(&spans, index_off.min(f.size)).unwrap_or(last);
    let mut wanted = vec![0];
    wanted.extend(first_tail.max(1)..last);
    Ok(wanted)
}

/// The chunk holding byte `off`, among `spans` (in order, contiguous).
fn chunk_at(spans: &[(u64, u64)], off: u64) -> Option<usize> {
    let i = spans.partition_point(|s| s.0 + s.1 <= off);
    spans.get(i).filter(|s| s.0 <= off).map(|_| i)
}

impl S3Image {
    /// [`download_chain`](Self::download_chain) for a lazy restore: the
    /// page packs hold only their header, index and trailer (enough for a
    /// pack reader to open them); [`LazyChain`] reads the rest.
    pub fn download_chain_sparse(
        &self,
        n: Option<u32>,
        dest: &Path,
    ) -> Result<Downloaded, StoreError> {
        self.download_chain_with(n, dest, true)
    }
}

/// Where a chunk is: checkpoint, file, chunk index.
type ChunkAt = (u32, String, usize);

/// The records of a checkpoint chain in a store, to read its files by
/// ranges (the page source of a lazy restore).
pub struct LazyChain {
    image: S3Image,
    records: HashMap<u32, Record>,
    /// Recently read chunks, oldest first.
    cache: Mutex<VecDeque<(ChunkAt, Arc<Vec<u8>>)>>,
}

impl LazyChain {
    /// Reads the records of checkpoint `n` and its ancestors.
    pub fn open(image: S3Image, n: u32) -> Result<LazyChain, StoreError> {
        let mut records = HashMap::new();
        let mut next = Some(n);
        while let Some(c) = next {
            let r = image.record(c)?;
            next = r.parent;
            records.insert(c, r);
            if next.is_some_and(|p| records.contains_key(&p)) {
                break;
            }
        }
        Ok(LazyChain {
            image,
            records,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.image.url
    }

    fn file(&self, cp: u32, name: &str) -> Result<(&Record, &FileRecord), StoreError> {
        let r = self
            .records
            .get(&cp)
            .ok_or_else(|| StoreError::NoSuchCheckpoint {
                url: self.image.url.clone(),
                checkpoint: cp,
                available: self.records.keys().copied().collect(),
            })?;
        let f = r
            .files
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| StoreError::Damaged {
                url: self.image.url.clone(),
                key: format!("commits/{cp}"),
                reason: format!("the record names no file {name}"),
            })?;
        Ok((r, f))
    }

    fn chunk(&self, r: &Record, f: &FileRecord, i: usize) -> Result<Arc<Vec<u8>>, StoreError> {
        let key = (r.checkpoint, f.name.clone(), i);
        if let Ok(c) = self.cache.lock() {
            if let Some((_, data)) = c.iter().find(|(k, _)| *k == key) {
                return Ok(Arc::clone(data));
            }
        }
        let data = Arc::new(self.image.read_chunk(r, f, i)?);
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHED_CHUNKS {
                c.pop_front();
            }
            c.push_back((key, Arc::clone(&data)));
        }
        Ok(data)
    }

    /// Reads `buf.len()` bytes at `off` of file `name` of checkpoint `cp`:
    /// only the chunks covering the range are fetched (and checked).
    pub fn read(&self, cp: u32, name: &str, off: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let (r, f) = self.file(cp, name)?;
        let end = off.saturating_add(buf.len() as u64);
        if end > f.size {
            return Err(StoreError::Damaged {
                url: self.image.url.clone(),
                key: format!("commits/{cp}"),
                reason: format!("{name} has {} bytes, not {end}", f.size),
            });
        }
        let spans = f.spans();
        let mut pos = off;
        while pos < end {
            let i = chunk_at(&spans, pos).unwrap_or(usize::MAX);
            let chunk = self.chunk(r, f, i)?;
            let from = usize::try_from(pos - spans.get(i).map_or(pos, |s| s.0)).unwrap_or(0);
            let n = (chunk.len().saturating_sub(from)).min(usize::try_from(end - pos).unwrap_or(0));
            if n == 0 {
                return Err(StoreError::Damaged {
                    url: self.image.url.clone(),
                    key: format!("commits/{cp}"),
                    reason: format!("chunk {i} of {name} is short"),
                });
            }
            let at = usize::try_from(pos - off).unwrap_or(0);
            buf[at..at + n].copy_from_slice(&chunk[from..from + n]);
            pos += n as u64;
        }
        Ok(())
    }

    /// Reads run `e` of pack `name` of checkpoint `cp` into `buf` (exactly
    /// `e.len()` bytes) and checks it against the run's checksum.
    pub fn read_run(
        &self,
        cp: u32,
        name: &str,
        e: &stasis_image::RunEntry,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        if buf.len() as u64 != e.len() {
            return Err(StoreError::Image(stasis_image::ImageError::BufferSize {
                expected: e.len(),
                got: buf.len() as u64,
            }));
        }
        self.read(cp, name, e.file_off, buf)?;
        if xxhash_rust::xxh3::xxh3_64(buf) != e.checksum {
            return Err(StoreError::Image(stasis_image::ImageError::PageChecksum {
                checkpoint: Some(cp),
                path: format!("{}: {name}", self.image.url).into(),
                vaddr: e.vaddr,
                npages: e.npages,
            }));
        }
        Ok(())
    }

    /// Fetches into `file` (the sparse local copy of file `name` of
    /// checkpoint `cp`) the chunks covering the byte ranges `ranges`
    /// (offset, length); returns the stored bytes read.
    pub fn fill(
        &self,
        cp: u32,
        name: &str,
        file: &File,
        ranges: &[(u64, u64)],
    ) -> Result<u64, StoreError> {
        let (r, f) = self.file(cp, name)?;
        let spans = f.spans();
        let mut wanted: Vec<usize> = ranges
            .iter()
            .filter(|(_, len)| *len > 0)
            .filter_map(|&(off, len)| {
                Some(chunk_at(&spans, off)?..=chunk_at(&spans, off + len - 1)?)
            })
            .flatten()
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        self.image.fetch_chunks(r, f, file, &wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_names() {
        assert!(is_pack("pages-123.pack"));
        assert!(!is_pack("manifest.bin"));
        assert!(!is_pack("touch-set"));
    }
}
