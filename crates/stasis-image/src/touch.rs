//! Touch sets: the pages a restored process will want first.
//!
//! Two files may sit in a committed checkpoint directory, each written
//! after the commit (atomically: temporary name, fsync, rename, mode 0600)
//! and each optional, since a checkpoint restores without them:
//! - `touch-window`: the pages each process wrote during a tracking window
//!   after the checkpoint (`dump --touch-window`, `run --touch-window`);
//! - `touch-faults`: the order in which pages faulted during the last lazy
//!   restore of the checkpoint.
//!
//! ```text
//! magic b"STASISTS" | format u32 | source u32 (1 window, 2 faults)
//! | window_ms u64 | process count u32
//! | per process: pid i32 | range count u32 | ranges: start u64, pages u32, 0u32 (must be 0)
//! | xxh3-64 of everything before, u64
//! ```
//! Ranges are in priority order (not sorted) and page aligned.

use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::{fsutil, FormatError, ImageError, PAGE_SIZE};

pub const TOUCH_MAGIC: [u8; 8] = *b"STASISTS";
pub const TOUCH_FORMAT: u32 = 1;
/// Largest touch-set file read (64 MiB: millions of ranges).
const MAX_TOUCH_FILE: u64 = 64 << 20;
/// Most pages a touch set may name in all (256 GiB of memory): the filler
/// expands it page by page.
const MAX_TOUCH_PAGES: u64 = 1 << 26;
/// No user address reaches this (x86-64, 5-level paging).
const ADDRESS_LIMIT: u64 = 1 << 57;

/// Where a touch set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TouchSource {
    /// Pages written during a window after the checkpoint.
    Window,
    /// Fault order of a lazy restore.
    Faults,
}

impl TouchSource {
    /// The file this kind of touch set is kept in.
    pub fn file_name(self) -> &'static str {
        match self {
            TouchSource::Window => "touch-window",
            TouchSource::Faults => "touch-faults",
        }
    }
}

/// One touch set: per process, page ranges `(start, pages)` in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TouchSet {
    pub source: TouchSource,
    pub window_ms: u64,
    pub procs: Vec<(i32, Vec<(u64, u32)>)>,
}

impl TouchSet {
    /// Pages in the set.
    pub fn pages(&self) -> u64 {
        self.procs
            .iter()
            .flat_map(|(_, r)| r.iter())
            .map(|&(_, n)| u64::from(n))
            .sum()
    }

    /// Page addresses of process `pid`, in order.
    pub fn page_order(&self, pid: i32) -> Vec<u64> {
        self.procs
            .iter()
            .filter(|(p, _)| *p == pid)
            .flat_map(|(_, r)| r.iter())
            .flat_map(|&(s, n)| (0..u64::from(n)).map(move |i| s + i * PAGE_SIZE))
            .collect()
    }

    /// Ranges from page addresses in order (consecutive pages merged).
    pub fn ranges_of(pages: &[u64]) -> Vec<(u64, u32)> {
        let mut out: Vec<(u64, u32)> = Vec::new();
        for &p in pages {
            match out.last_mut() {
                Some((s, n)) if *s + u64::from(*n) * PAGE_SIZE == p && *n < u32::MAX => *n += 1,
                _ => out.push((p & !(PAGE_SIZE - 1), 1)),
            }
        }
        out
    }

    /// The contents of a touch-set file.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&TOUCH_MAGIC);
        b.extend_from_slice(&TOUCH_FORMAT.to_le_bytes());
        let src: u32 = match self.source {
            TouchSource::Window => 1,
            TouchSource::Faults => 2,
        };
        b.extend_from_slice(&src.to_le_bytes());
        b.extend_from_slice(&self.window_ms.to_le_bytes());
        b.extend_from_slice(
            &u32::try_from(self.procs.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for (pid, ranges) in &self.procs {
            b.extend_from_slice(&pid.to_le_bytes());
            b.extend_from_slice(
                &u32::try_from(ranges.len())
                    .unwrap_or(u32::MAX)
                    .to_le_bytes(),
            );
            for &(s, n) in ranges {
                b.extend_from_slice(&s.to_le_bytes());
                b.extend_from_slice(&n.to_le_bytes());
                b.extend_from_slice(&0u32.to_le_bytes());
            }
        }
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes the contents of a touch-set file; the reason if damaged.
    pub fn decode(b: &[u8]) -> Result<TouchSet, FormatError> {
        if b.len() < 36 {
            return Err(FormatError::TooShort(b.len()));
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if xxh3_64(body) != u64::from_le_bytes(sum.try_into().map_err(|_| FormatError::Checksum)?) {
            return Err(FormatError::Checksum);
        }
        let mut r = Reader { b: body, at: 0 };
        if r.take(8)? != TOUCH_MAGIC {
            return Err(FormatError::Magic);
        }
        let format = r.u32()?;
        if format != TOUCH_FORMAT {
            return Err(FormatError::Version {
                found: format,
                supported: TOUCH_FORMAT,
            });
        }
        let source = match r.u32()? {
            1 => TouchSource::Window,
            2 => TouchSource::Faults,
            s => return Err(FormatError::UnknownSource(s)),
        };
        let window_ms = r.u64()?;
        let n = r.u32()?;
        let mut procs = Vec::new();
        let mut pages_total = 0u64;
        for _ in 0..n {
            let pid = r.u32()? as i32;
            let count = r.u32()? as usize;
            if count > (body.len() - r.at) / 16 {
                return Err(FormatError::CountBeyondEnd);
            }
            let mut ranges = Vec::with_capacity(count);
            for _ in 0..count {
                let s = r.u64()?;
                let pages = r.u32()?;
                if r.u32()? != 0 {
                    return Err(FormatError::ReservedWord);
                }
                let end = u64::from(pages)
                    .checked_mul(PAGE_SIZE)
                    .and_then(|l| s.checked_add(l));
                if s % PAGE_SIZE != 0 || pages == 0 || !matches!(end, Some(e) if e <= ADDRESS_LIMIT)
                {
                    return Err(FormatError::BadRange { start: s, pages });
                }
                pages_total += u64::from(pages);
                if pages_total > MAX_TOUCH_PAGES {
                    return Err(FormatError::TooManyPages(MAX_TOUCH_PAGES));
                }
                ranges.push((s, pages));
            }
            procs.push((pid, ranges));
        }
        if r.at != body.len() {
            return Err(FormatError::Trailing);
        }
        Ok(TouchSet {
            source,
            window_ms,
            procs,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], FormatError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(FormatError::Truncated)?;
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Writes (replaces) a touch set in checkpoint directory `cp_dir`.
pub fn write_touch_set(cp_dir: &Path, ts: &TouchSet) -> Result<(), ImageError> {
    fsutil::write_atomic(cp_dir, ts.source.file_name(), &ts.encode())
}

/// Reads the touch set of kind `source` from `cp_dir` (`Ok(None)` if there
/// is none). A damaged file is an error, which callers may treat as "none".
pub fn read_touch_set(cp_dir: &Path, source: TouchSource) -> Result<Option<TouchSet>, ImageError> {
    let path = cp_dir.join(source.file_name());
    let Some(bytes) = fsutil::read_small(&path, MAX_TOUCH_FILE)? else {
        return Ok(None);
    };
    TouchSet::decode(&bytes)
        .map(Some)
        .map_err(|reason| ImageError::CorruptTouchSet { path, reason })
}

/// The pages each process should get first: the fault order of the last
/// lazy restore, then the window's pages not in it. Damaged files are
/// skipped with a warning.
pub fn priority_order(cp_dir: &Path) -> std::collections::HashMap<i32, Vec<u64>> {
    let mut out: std::collections::HashMap<i32, Vec<u64>> = Default::default();
    for src in [TouchSource::Faults, TouchSource::Window] {
        match read_touch_set(cp_dir, src) {
            Ok(Some(ts)) => {
                for (pid, _) in &ts.procs {
                    let v = out.entry(*pid).or_default();
                    let seen: std::collections::HashSet<u64> = v.iter().copied().collect();
                    v.extend(
                        ts.page_order(*pid)
                            .into_iter()
                            .filter(|p| !seen.contains(p)),
                    );
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("ignoring the touch set: {e}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let pages = [0x1000u64, 0x2000, 0x3000, 0x9000, 0x5000];
        let ts = TouchSet {
            source: TouchSource::Faults,
            window_ms: 0,
            procs: vec![(42, TouchSet::ranges_of(&pages))],
        };
        assert_eq!(ts.procs[0].1, vec![(0x1000, 3), (0x9000, 1), (0x5000, 1)]);
        write_touch_set(dir.path(), &ts).unwrap();
        let back = read_touch_set(dir.path(), TouchSource::Faults)
            .unwrap()
            .unwrap();
        assert_eq!(back, ts);
        assert_eq!(back.page_order(42), pages.to_vec());
        assert_eq!(back.pages(), 5);
        assert!(read_touch_set(dir.path(), TouchSource::Window)
            .unwrap()
            .is_none());
        let w = TouchSet {
            source: TouchSource::Window,
            window_ms: 1500,
            procs: vec![(42, vec![(0x5000, 2)])],
        };
        write_touch_set(dir.path(), &w).unwrap();
        assert_eq!(
            priority_order(dir.path())[&42],
            vec![0x1000, 0x2000, 0x3000, 0x9000, 0x5000, 0x6000]
        );
        // One flipped bit, and a truncation: refused.
        let path = dir.path().join("touch-faults");
        let mut b = std::fs::read(&path).unwrap();
        b[20] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(read_touch_set(dir.path(), TouchSource::Faults).is_err());
        std::fs::write(&path, &b[..30]).unwrap();
        assert!(read_touch_set(dir.path(), TouchSource::Faults).is_err());
        // A range beyond any address, or too many pages, is refused.
        for bad in [(0xffff_ffff_ffff_f000u64, 2u32), (0x1000, u32::MAX)] {
            let t = TouchSet {
                source: TouchSource::Faults,
                window_ms: 0,
                procs: vec![(1, vec![bad])],
            };
            write_touch_set(dir.path(), &t).unwrap();
            assert!(
                read_touch_set(dir.path(), TouchSource::Faults).is_err(),
                "{bad:?}"
            );
        }
        // The damaged file is skipped; the window still counts.
        assert_eq!(priority_order(dir.path())[&42], vec![0x5000, 0x6000]);
    }

    /// Found by the `touch` fuzz target: the reserved word after each range
    /// was ignored, so two different files decoded to the same set.
    #[test]
    fn touch_set_with_a_nonzero_reserved_word_is_refused() {
        let ts = TouchSet {
            source: TouchSource::Faults,
            window_ms: 0,
            procs: vec![(7, vec![(0x2000, 1)])],
        };
        let good = ts.encode();
        assert_eq!(TouchSet::decode(&good), Ok(ts));
        // The range (start u64, pages u32, reserved u32) starts at byte 36.
        let mut bad = good[..good.len() - 8].to_vec();
        bad[48] = 1;
        let sum = xxh3_64(&bad);
        bad.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(TouchSet::decode(&bad), Err(FormatError::ReservedWord));
    }
}
