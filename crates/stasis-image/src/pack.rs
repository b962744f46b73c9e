//! Page packs: the memory pages of one process, stored page-aligned so that a
//! restorer can `preadv` a run straight into the target's address space.
//!
//! ```text
//! [0, 4096)          header: magic b"STASISPK" | format_version u32 | page_size u32
//!                    | pid i32 | flags u32 | zero up to 4096
//! [4096, data_end)   page data, runs back to back
//! [index_off, ..)    index: count entries of 40 bytes
//! [len - 48, len)    trailer
//! ```
//!
//! See `docs/image-format.md` for the full specification.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::fsutil;
use crate::manifest::PackRef;
use crate::{ImageError, FORMAT_VERSION, MAX_RUN_PAGES, PAGE_SIZE};

/// Magic bytes at the start of a page pack.
pub const PACK_MAGIC: [u8; 8] = *b"STASISPK";
/// Magic bytes at the start of a page pack's trailer.
pub const PACK_TRAILER_MAGIC: [u8; 8] = *b"STASISIX";
/// Size of the pack header (one page).
pub const PACK_HEADER_LEN: u64 = 4096;
/// Size of one index entry.
pub const PACK_ENTRY_LEN: u64 = 40;
/// Size of the trailer.
pub const PACK_TRAILER_LEN: u64 = 48;
/// Largest number of index entries a reader accepts (2^26: 64 Mi runs).
pub const MAX_PACK_RUNS: u64 = 1 << 26;
/// Entry flag reserved for a future "zero run" (no data stored). Writers of
/// formats 1 and 2 never set it and their readers refuse it.
pub const RUN_FLAG_ZERO: u32 = 1;

/// Size of the write buffer and of the verification buffer.
pub(crate) const IO_BUF: usize = 1 << 20;

/// One index entry: `npages` contiguous virtual pages starting at `vaddr`,
/// stored contiguously at `file_off` in the pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunEntry {
    pub vaddr: u64,
    pub npages: u32,
    pub flags: u32,
    pub file_off: u64,
    /// xxh3-64 of the run's bytes.
    pub checksum: u64,
}

impl RunEntry {
    /// Length of the run in bytes.
    pub fn len(&self) -> u64 {
        u64::from(self.npages) * PAGE_SIZE
    }

    /// True for a run without pages (never found in a valid pack).
    pub fn is_empty(&self) -> bool {
        self.npages == 0
    }

    /// First virtual address after the run.
    pub fn end(&self) -> u64 {
        self.vaddr.saturating_add(self.len())
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.vaddr.to_le_bytes());
        out.extend_from_slice(&self.npages.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.file_off.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
    }

    pub(crate) fn decode(b: &[u8; 40]) -> RunEntry {
        let mut f = Fields(b);
        let vaddr = f.u64(0);
        let npages = f.u32(8);
        let flags = f.u32(12);
        let file_off = f.u64(16);
        let checksum = f.u64(24);
        RunEntry {
            vaddr,
            npages,
            flags,
            file_off,
            checksum,
        }
    }
}

/// Little-endian field access in a fixed-size buffer.
pub(crate) struct Fields<'a, const N: usize>(pub(crate) &'a [u8; N]);

impl<const N: usize> Fields<'_, N> {
    pub(crate) fn u32(&mut self, off: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.0[off..off + 4]);
        u32::from_le_bytes(a)
    }
    pub(crate) fn u64(&mut self, off: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.0[off..off + 8]);
        u64::from_le_bytes(a)
    }
}

/// The 4096-byte header a writer puts at the start of the pack of `pid`.
pub fn pack_header(pid: i32) -> Vec<u8> {
    let mut h = Vec::with_capacity(4096);
    h.extend_from_slice(&PACK_MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&(4096u32).to_le_bytes());
    h.extend_from_slice(&pid.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.resize(4096, 0);
    h
}

/// The index and trailer a writer puts after page data ending at
/// `index_off`, for `entries`; and the index checksum.
pub fn encode_tail(entries: &[RunEntry], index_off: u64) -> (Vec<u8>, u64) {
    let mut tail = Vec::with_capacity(entries.len() * 40 + 48);
    for e in entries {
        e.encode(&mut tail);
    }
    let index_checksum = xxh3_64(&tail);
    tail.extend_from_slice(&PACK_TRAILER_MAGIC);
    tail.extend_from_slice(&index_off.to_le_bytes());
    tail.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    tail.extend_from_slice(&index_checksum.to_le_bytes());
    tail.extend_from_slice(&index_off.to_le_bytes()); // data_end
    tail.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    tail.extend_from_slice(&0u32.to_le_bytes());
    (tail, index_checksum)
}

/// The run currently being extended by `write_run`.
struct OpenRun {
    entry: RunEntry,
    hasher: Xxh3Default,
}

/// Writes one page pack. Create it with
/// [`CheckpointBuilder::create_pack`](crate::CheckpointBuilder::create_pack).
pub struct PackWriter {
    out: BufWriter<File>,
    path: PathBuf,
    name: String,
    entries: Vec<RunEntry>,
    cur: Option<OpenRun>,
    /// File offset of the next data byte.
    next_off: u64,
    /// End address of the last run written (`None` before the first).
    last_end: Option<u64>,
    pages: u64,
    failed: bool,
}

impl std::fmt::Debug for PackWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackWriter")
            .field("path", &self.path)
            .field("pages", &self.pages)
            .field("runs", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl PackWriter {
    /// Creates `dir/name` (0600, must not exist) and writes the header.
    pub(crate) fn create(dir: &Path, name: String, pid: i32) -> Result<PackWriter, ImageError> {
        let path = dir.join(&name);
        let file = fsutil::create_file(&path)?;
        let mut out = BufWriter::with_capacity(IO_BUF, file);
        fsutil::write_fault(&path)?;
        out.write_all(&pack_header(pid))
            .map_err(ImageError::io("write", &path))?;
        Ok(PackWriter {
            out,
            path,
            name,
            entries: Vec::new(),
            cur: None,
            next_off: PACK_HEADER_LEN,
            last_end: None,
            pages: 0,
            failed: false,
        })
    }

    /// Full path of the pack being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the pages `data` (a whole number of pages) mapped at `vaddr`
    /// (page aligned). Addresses must increase strictly across calls and runs
    /// must not overlap. A call that continues the previous run extends its
    /// index entry; entries are split at [`MAX_RUN_PAGES`] pages.
    pub fn write_run(&mut self, vaddr: u64, data: &[u8]) -> Result<(), ImageError> {
        if self.failed {
            return Err(ImageError::WriterFailed {
                path: self.path.clone(),
            });
        }
        let len = data.len() as u64;
        let bad = |reason: String| ImageError::BadRun {
            path: self.path.clone(),
            vaddr,
            len,
            reason,
        };
        if vaddr % PAGE_SIZE != 0 {
            return Err(bad("the address is not page aligned".into()));
        }
        if len % PAGE_SIZE != 0 {
            return Err(bad("the length is not a whole number of pages".into()));
        }
        if vaddr.checked_add(len).is_none() {
            return Err(bad("the run wraps around the address space".into()));
        }
        if let Some(prev_end) = self.last_end {
            if vaddr < prev_end {
                return Err(bad(format!(
                    "it overlaps or precedes the previous run, which ends at {prev_end:#x}"
                )));
            }
        }
        if data.is_empty() {
            return Ok(());
        }
        let r = self.append(vaddr, data);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn append(&mut self, mut vaddr: u64, mut rest: &[u8]) -> Result<(), ImageError> {
        while !rest.is_empty() {
            let continues = self
                .cur
                .as_ref()
                .is_some_and(|c| c.entry.end() == vaddr && c.entry.npages < MAX_RUN_PAGES);
            if !continues {
                self.close_run();
                if self.entries.len() as u64 >= MAX_PACK_RUNS {
                    return Err(ImageError::BadRun {
                        path: self.path.clone(),
                        vaddr,
                        len: rest.len() as u64,
                        reason: format!("the pack already holds {MAX_PACK_RUNS} runs, the most a reader accepts"),
                    });
                }
            }
            let next_off = self.next_off;
            let cur = self.cur.get_or_insert_with(|| OpenRun {
                entry: RunEntry {
                    vaddr,
                    npages: 0,
                    flags: 0,
                    file_off: next_off,
                    checksum: 0,
                },
                hasher: Xxh3Default::new(),
            });
            let room = u64::from(MAX_RUN_PAGES - cur.entry.npages) * PAGE_SIZE;
            let take = rest.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let (chunk, tail) = rest.split_at(take);
            cur.hasher.update(chunk);
            // `take` is at most MAX_RUN_PAGES pages, so the count fits in u32.
            let npages = u32::try_from(take as u64 / PAGE_SIZE).unwrap_or(MAX_RUN_PAGES);
            cur.entry.npages += npages;
            fsutil::write_fault(&self.path)?;
            self.out
                .write_all(chunk)
                .map_err(ImageError::io("write", &self.path))?;
            self.next_off += take as u64;
            self.pages += u64::from(npages);
            vaddr += take as u64;
            rest = tail;
        }
        self.last_end = Some(vaddr);
        Ok(())
    }

    fn close_run(&mut self) {
        if let Some(mut c) = self.cur.take() {
            c.entry.checksum = c.hasher.digest();
            self.entries.push(c.entry);
        }
    }

    /// Pages written so far.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Bytes of page data written so far (`pages() * PAGE_SIZE`).
    pub fn bytes(&self) -> u64 {
        self.pages * PAGE_SIZE
    }

    /// Writes the index and trailer, fsyncs the file and returns the
    /// reference to put in the manifest.
    pub fn finish(mut self) -> Result<PackRef, ImageError> {
        if self.failed {
            return Err(ImageError::WriterFailed {
                path: self.path.clone(),
            });
        }
        self.close_run();
        let path = self.path.clone();
        let index_off = self.next_off;
        let (tail, index_checksum) = encode_tail(&self.entries, index_off);
        fsutil::write_fault(&path)?;
        self.out
            .write_all(&tail)
            .map_err(ImageError::io("write", &path))?;
        let file = self.out.into_inner().map_err(|e| ImageError::Io {
            action: "write",
            path: path.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(ImageError::io("fsync", &path))?;
        let size = index_off + tail.len() as u64;
        Ok(PackRef {
            name: self.name,
            size,
            pages: self.pages,
            index_checksum,
        })
    }
}

/// Random-access reads of a pack's bytes: a file, or bytes in memory.
pub trait ReadAt {
    /// Fills `buf` from offset `off`; `UnexpectedEof` if the source ends first.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, off)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let src = usize::try_from(off)
            .ok()
            .and_then(|o| self.get(o..o.checked_add(buf.len())?))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// What a pack's header, trailer and index say, validated (everything but
/// the page data, whose checksums [`PackReader::verify`] checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackIndex {
    /// PID recorded in the header.
    pub pid: i32,
    /// Index entries, sorted by address, disjoint, inside the page data.
    pub runs: Vec<RunEntry>,
    /// Pages in all runs.
    pub pages: u64,
    /// End of page data (= offset of the index).
    pub data_end: u64,
    /// Size of the pack in bytes.
    pub size: u64,
    /// Checksum of the index.
    pub index_checksum: u64,
}

impl PackIndex {
    /// Validates a whole pack held in memory exactly as [`PackReader::open`]
    /// validates a file. `path` names the pack in errors (a standard name
    /// `pages-<pid>.pack` must match the header's pid).
    pub fn decode(
        bytes: &[u8],
        path: &Path,
        expected: Option<&PackRef>,
    ) -> Result<PackIndex, ImageError> {
        crate::pack_index::parse(bytes, bytes.len() as u64, path, expected, None)
    }
}

/// A validated, open page pack.
#[derive(Debug)]
pub struct PackReader {
    file: File,
    path: PathBuf,
    checkpoint: Option<u32>,
    pid: i32,
    runs: Vec<RunEntry>,
    pages: u64,
    data_end: u64,
    size: u64,
    index_checksum: u64,
}

impl PackReader {
    /// Opens and validates the pack at `path` (header, trailer, index and its
    /// checksum; not the page data: see [`PackReader::verify`]). When
    /// `expected` is given, the file size, page count and index checksum must
    /// match it.
    pub fn open(path: &Path, expected: Option<&PackRef>) -> Result<PackReader, ImageError> {
        Self::open_inner(path, expected, None)
    }

    pub(crate) fn open_inner(
        path: &Path,
        expected: Option<&PackRef>,
        checkpoint: Option<u32>,
    ) -> Result<PackReader, ImageError> {
        let file = fsutil::open_read(path)?;
        let size = file.metadata().map_err(ImageError::io("stat", path))?.len();
        let ix = crate::pack_index::parse(&file, size, path, expected, checkpoint)?;
        Ok(PackReader {
            file,
            path: path.to_path_buf(),
            checkpoint,
            pid: ix.pid,
            runs: ix.runs,
            pages: ix.pages,
            data_end: ix.data_end,
            size: ix.size,
            index_checksum: ix.index_checksum,
        })
    }

    /// Full path of the pack file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pack's file name within its checkpoint (`pages-<pid>.pack`).
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The open pack file (for `preadv` by a restorer).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// PID recorded in the pack header.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Index entries, sorted by `vaddr`.
    pub fn runs(&self) -> &[RunEntry] {
        &self.runs
    }

    /// Total number of pages stored.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// End of page data (= offset of the index).
    pub fn data_end(&self) -> u64 {
        self.data_end
    }

    /// File size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checksum of the index (as stored in the trailer and the manifest).
    pub fn index_checksum(&self) -> u64 {
        self.index_checksum
    }

    /// Entries whose `vaddr` is within `[start, end)`.
    pub fn runs_in(&self, start: u64, end: u64) -> &[RunEntry] {
        if start >= end {
            return &[];
        }
        let lo = self.runs.partition_point(|e| e.vaddr < start);
        let hi = self.runs.partition_point(|e| e.vaddr < end);
        &self.runs[lo..hi]
    }

    /// The entry containing address `addr`, if any.
    pub fn run_containing(&self, addr: u64) -> Option<&RunEntry> {
        let i = self.runs.partition_point(|e| e.end() <= addr);
        self.runs.get(i).filter(|e| e.vaddr <= addr)
    }

    /// Reads run `e` (one of [`runs`](Self::runs)) into `buf`, which must be
    /// exactly `e.len()` bytes, and verifies its checksum.
    pub fn read_run(&self, e: &RunEntry, buf: &mut [u8]) -> Result<(), ImageError> {
        let i = self.runs.partition_point(|r| r.vaddr < e.vaddr);
        if self.runs.get(i) != Some(e) {
            return Err(ImageError::RunNotInPack {
                path: self.path.clone(),
                vaddr: e.vaddr,
            });
        }
        if buf.len() as u64 != e.len() {
            return Err(ImageError::BufferSize {
                expected: e.len(),
                got: buf.len() as u64,
            });
        }
        self.read_checked(e, buf)
    }

    fn read_checked(&self, e: &RunEntry, buf: &mut [u8]) -> Result<(), ImageError> {
        FileExt::read_exact_at(&self.file, buf, e.file_off).map_err(|err| {
            if err.kind() == io::ErrorKind::UnexpectedEof {
                ImageError::CorruptPack {
                    checkpoint: self.checkpoint,
                    path: self.path.clone(),
                    reason: "truncated while reading page data".into(),
                }
            } else {
                ImageError::Io {
                    action: "read",
                    path: self.path.clone(),
                    source: err,
                }
            }
        })?;
        if xxh3_64(buf) != e.checksum {
            return Err(ImageError::PageChecksum {
                checkpoint: self.checkpoint,
                path: self.path.clone(),
                vaddr: e.vaddr,
                npages: e.npages,
            });
        }
        Ok(())
    }

    /// Reads every run (with one reusable 1 MiB buffer) and checks its
    /// checksum. The error names the first bad run's address and the pack.
    pub fn verify(&self) -> Result<(), ImageError> {
        let mut buf = vec![0u8; IO_BUF];
        for e in &self.runs {
            // Validated at open: npages <= MAX_RUN_PAGES, so len <= IO_BUF.
            let len = usize::try_from(e.len()).unwrap_or(usize::MAX).min(IO_BUF);
            self.read_checked(e, &mut buf[..len])?;
        }
        Ok(())
    }
}
