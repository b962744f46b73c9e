//! Validation of a page pack's header, trailer and index (everything but
//! the page data): [`PackIndex::decode`] and [`PackReader::open`] come here.
//!
//! [`PackReader::open`]: crate::pack::PackReader::open

use std::io;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3Default;

use crate::manifest::PackRef;
use crate::pack::{
    Fields, PackIndex, ReadAt, RunEntry, IO_BUF, MAX_PACK_RUNS, PACK_ENTRY_LEN, PACK_HEADER_LEN,
    PACK_MAGIC, PACK_TRAILER_LEN, PACK_TRAILER_MAGIC,
};
use crate::{FormatError, ImageError, FORMAT_VERSION, MAX_RUN_PAGES, PAGE_SIZE};

/// A pack being validated.
struct Parser<'a, R: ?Sized> {
    src: &'a R,
    size: u64,
    path: &'a Path,
    checkpoint: Option<u32>,
}

/// What the trailer says.
struct Trailer {
    index_off: u64,
    count: u64,
    index_checksum: u64,
    data_end: u64,
}

/// Validates the pack of `size` bytes in `src` (named `path` in errors),
/// against `expected` (its manifest entry) when given.
pub(crate) fn parse<R: ReadAt + ?Sized>(
    src: &R,
    size: u64,
    path: &Path,
    expected: Option<&PackRef>,
    checkpoint: Option<u32>,
) -> Result<PackIndex, ImageError> {
    let p = Parser {
        src,
        size,
        path,
        checkpoint,
    };
    if let Some(r) = expected {
        if size != r.size {
            return Err(p.corrupt(format!(
                "file is {size} bytes but the manifest says {}",
                r.size
            )));
        }
    }
    if size < PACK_HEADER_LEN + PACK_TRAILER_LEN {
        return Err(p.corrupt(format!("truncated: file is only {size} bytes")));
    }
    let (version, pid) = p.header()?;
    let t = p.trailer(version)?;
    if let Some(r) = expected {
        if r.index_checksum != t.index_checksum {
            return Err(p.corrupt("index checksum differs from the manifest's".into()));
        }
    }
    let (runs, pages) = p.index(&t)?;
    if let Some(r) = expected {
        if r.pages != pages {
            return Err(p.corrupt(format!(
                "index holds {pages} pages but the manifest says {}",
                r.pages
            )));
        }
    }
    Ok(PackIndex {
        pid,
        runs,
        pages,
        data_end: t.data_end,
        size,
        index_checksum: t.index_checksum,
    })
}

impl<R: ReadAt + ?Sized> Parser<'_, R> {
    fn corrupt(&self, reason: String) -> ImageError {
        ImageError::CorruptPack {
            checkpoint: self.checkpoint,
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<(), ImageError> {
        self.src.read_exact_at(buf, off).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.corrupt("truncated while reading".into())
            } else {
                ImageError::Io {
                    action: "read",
                    path: self.path.to_path_buf(),
                    source: e,
                }
            }
        })
    }

    /// Checks the header; returns the format version and the pid.
    fn header(&self) -> Result<(u32, i32), ImageError> {
        let mut h = vec![0u8; 4096];
        self.read_at(&mut h, 0)?;
        let mut fixed = [0u8; 24];
        fixed.copy_from_slice(&h[..24]);
        let mut hf = Fields(&fixed);
        if h[0..8] != PACK_MAGIC {
            return Err(self.corrupt("bad magic: not a stasis page pack".into()));
        }
        let version = hf.u32(8);
        if version == 0 {
            return Err(self.corrupt("format version 0".into()));
        }
        if version > FORMAT_VERSION {
            return Err(ImageError::NewerFormat {
                path: self.path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let page_size = hf.u32(12);
        if u64::from(page_size) != PAGE_SIZE {
            return Err(self.corrupt(format!("page size {page_size}, expected {PAGE_SIZE}")));
        }
        let pid = i32::from_le_bytes([h[16], h[17], h[18], h[19]]);
        let hflags = hf.u32(20);
        if hflags != 0 {
            return Err(self.corrupt(format!("unknown header flags {hflags:#x}")));
        }
        if let Some(name_pid) = self
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(pid_from_pack_name)
        {
            if name_pid != pid {
                return Err(self.corrupt(format!(
                    "header says pid {pid} but the file is named for pid {name_pid}"
                )));
            }
        }
        if h[24..].iter().any(|&b| b != 0) {
            return Err(self.corrupt("reserved header bytes are not zero".into()));
        }
        Ok((version, pid))
    }

    /// Checks the trailer against the header's `version` and the file size.
    fn trailer(&self, version: u32) -> Result<Trailer, ImageError> {
        let size = self.size;
        let mut t = [0u8; 48];
        self.read_at(&mut t, size - PACK_TRAILER_LEN)?;
        let mut tf = Fields(&t);
        if t[0..8] != PACK_TRAILER_MAGIC {
            return Err(self.corrupt("bad trailer magic: the file is truncated or damaged".into()));
        }
        let index_off = tf.u64(8);
        let count = tf.u64(16);
        let index_checksum = tf.u64(24);
        let data_end = tf.u64(32);
        let tversion = tf.u32(40);
        if tf.u32(44) != 0 {
            return Err(self.corrupt("reserved trailer bytes are not zero".into()));
        }
        if tversion != version {
            return Err(self.corrupt(format!(
                "trailer format version {tversion} differs from header version {version}"
            )));
        }
        if index_off < PACK_HEADER_LEN || index_off % PAGE_SIZE != 0 {
            return Err(self.corrupt(format!("bad index offset {index_off:#x}")));
        }
        if data_end != index_off {
            return Err(self.corrupt(format!(
                "data end {data_end:#x} differs from index offset {index_off:#x}"
            )));
        }
        if count > MAX_PACK_RUNS {
            return Err(self.corrupt(format!(
                "index has {count} entries, more than the limit of {MAX_PACK_RUNS}"
            )));
        }
        let index_len = count * PACK_ENTRY_LEN;
        if index_off
            .checked_add(index_len)
            .and_then(|x| x.checked_add(PACK_TRAILER_LEN))
            != Some(size)
        {
            return Err(self.corrupt(format!(
                "index of {count} entries at {index_off:#x} does not end at the trailer (file is {size} bytes)"
            )));
        }
        if count > (data_end - PACK_HEADER_LEN) / PAGE_SIZE {
            return Err(self.corrupt(format!(
                "index has {count} entries but only {} pages of data",
                (data_end - PACK_HEADER_LEN) / PAGE_SIZE
            )));
        }
        Ok(Trailer {
            index_off,
            count,
            index_checksum,
            data_end,
        })
    }

    /// Reads the index: hashes everything, parses and validates entries
    /// until the first problem (so memory stays bounded by the valid part).
    /// Returns the runs and their pages.
    fn index(&self, t: &Trailer) -> Result<(Vec<RunEntry>, u64), ImageError> {
        let mut hasher = Xxh3Default::new();
        let mut runs: Vec<RunEntry> = Vec::new();
        let mut problem: Option<String> = None;
        let chunk_entries: u64 = (IO_BUF as u64) / PACK_ENTRY_LEN;
        let mut buf = vec![0u8; usize::try_from(chunk_entries * PACK_ENTRY_LEN).unwrap_or(IO_BUF)];
        let mut done: u64 = 0;
        let mut pages: u64 = 0;
        while done < t.count {
            let n = (t.count - done).min(chunk_entries);
            let bytes = usize::try_from(n * PACK_ENTRY_LEN).unwrap_or(0);
            let chunk = &mut buf[..bytes];
            self.read_at(chunk, t.index_off + done * PACK_ENTRY_LEN)?;
            hasher.update(chunk);
            if problem.is_none() {
                for (i, raw) in chunk.chunks_exact(40).enumerate() {
                    let mut a = [0u8; 40];
                    a.copy_from_slice(raw);
                    let e = RunEntry::decode(&a);
                    let reserved_ok = a[32..].iter().all(|&b| b == 0);
                    let checked = if reserved_ok {
                        check_entry(&e, runs.last(), t.data_end)
                    } else {
                        Err(FormatError::ReservedBytes)
                    };
                    if let Err(p) = checked {
                        problem = Some(format!("index entry {}: {p}", done + i as u64));
                        break;
                    }
                    pages += u64::from(e.npages);
                    runs.push(e);
                }
            }
            done += n;
        }
        if hasher.digest() != t.index_checksum {
            return Err(self.corrupt("index checksum mismatch".into()));
        }
        if let Some(p) = problem {
            return Err(self.corrupt(p));
        }
        Ok((runs, pages))
    }
}

/// The pid in a standard pack name `pages-<pid>.pack`.
fn pid_from_pack_name(name: &str) -> Option<i32> {
    let pid = name.strip_prefix("pages-")?.strip_suffix(".pack")?;
    let n: i32 = pid.parse().ok()?;
    (n.to_string() == pid).then_some(n)
}

/// Structural checks of one index entry against the previous one.
fn check_entry(e: &RunEntry, prev: Option<&RunEntry>, data_end: u64) -> Result<(), FormatError> {
    if e.flags != 0 {
        return Err(FormatError::UnknownFlags(e.flags));
    }
    if e.npages == 0 || e.npages > MAX_RUN_PAGES {
        return Err(FormatError::RunPages {
            npages: e.npages,
            max: MAX_RUN_PAGES,
        });
    }
    if e.vaddr % PAGE_SIZE != 0 {
        return Err(FormatError::Unaligned(e.vaddr));
    }
    if e.vaddr.checked_add(e.len()).is_none() {
        return Err(FormatError::Wraps(e.vaddr));
    }
    if e.file_off % PAGE_SIZE != 0 || e.file_off < PACK_HEADER_LEN {
        return Err(FormatError::FileOffset(e.file_off));
    }
    if !matches!(e.file_off.checked_add(e.len()), Some(end) if end <= data_end) {
        return Err(FormatError::PastEnd {
            off: e.file_off,
            len: e.len(),
        });
    }
    if let Some(p) = prev {
        if e.vaddr < p.end() {
            return Err(FormatError::Overlap {
                addr: e.vaddr,
                prev_end: p.end(),
            });
        }
        if e.file_off < p.file_off + p.len() {
            return Err(FormatError::DataOverlap(e.file_off));
        }
    }
    Ok(())
}
