//! The hash backend: a 64-bit XXH3 hash of every saved page, compared with
//! the previous checkpoint's.
//!
//! Nothing is armed inside the process, so it runs at full speed between
//! checkpoints; the price is paid by the dumper, which reads every page with
//! data at each checkpoint and writes only those whose hash changed. The
//! hashes of the last checkpoint are kept in the tracking directory as
//! `hashes-PID.bin`: a magic, a count, (address, hash) pairs in address
//! order, and an XXH3 checksum of everything before it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::{Area, ArmReport, Backend, Dirty, DirtyTracker, Remote, Result, TrackError};

const MAGIC: &[u8; 8] = b"STHASH1\0";

/// Per-process hashes: the previous checkpoint's (read with a cursor, pages
/// arrive in address order) and the ones being computed.
#[derive(Default)]
struct ProcHashes {
    prev: Vec<(u64, u64)>,
    cursor: usize,
    next: Vec<(u64, u64)>,
}

/// The hash tracker.
pub struct HashTracker {
    dir: PathBuf,
    procs: HashMap<i32, ProcHashes>,
    armed: Vec<i32>,
}

impl HashTracker {
    /// A tracker keeping its hashes in `dir` (created when first saved).
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            procs: HashMap::new(),
            armed: Vec::new(),
        }
    }

    fn file(&self, pid: i32) -> PathBuf {
        self.dir.join(format!("hashes-{pid}.bin"))
    }

    fn load(&self, pid: i32) -> Result<Vec<(u64, u64)>> {
        let path = self.file(pid);
        let bytes = match crate::state::read_nofollow(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TrackError::Io {
                    what: "reading",
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        decode(&bytes).map_err(|e| TrackError::State {
            path: path.display().to_string(),
            what: e.to_string(),
        })
    }

    /// Pages hashed for `pid` in this dump (for tests and reports).
    pub fn hashed(&self, pid: i32) -> usize {
        self.procs.get(&pid).map_or(0, |p| p.next.len())
    }
}

/// Encodes (address, hash) pairs.
pub fn encode(pairs: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + pairs.len() * 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
    for (a, h) in pairs {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&h.to_le_bytes());
    }
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Why a hash table file does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("not a hash table (bad magic or too short)")]
    Magic,
    #[error("count overflows")]
    Count,
    #[error("{bytes} bytes for {entries} entries (truncated?)")]
    Length { bytes: usize, entries: usize },
    #[error("checksum mismatch")]
    Checksum,
    #[error("addresses out of order")]
    Order,
}

/// Decodes what [`encode`] wrote, checking magic, length and checksum.
pub fn decode(b: &[u8]) -> Result<Vec<(u64, u64)>, TableError> {
    let word = |at: usize| -> Option<u64> {
        b.get(at..at + 8)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if b.len() < 24 || &b[..8] != MAGIC {
        return Err(TableError::Magic);
    }
    let n = usize::try_from(word(8).unwrap_or(0)).map_err(|_| TableError::Count)?;
    let want = n
        .checked_mul(16)
        .and_then(|x| x.checked_add(24))
        .ok_or(TableError::Count)?;
    if b.len() != want {
        return Err(TableError::Length {
            bytes: b.len(),
            entries: n,
        });
    }
    if word(want - 8) != Some(xxh3_64(&b[..want - 8])) {
        return Err(TableError::Checksum);
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = 16 + i * 16;
        out.push((word(at).unwrap_or(0), word(at + 8).unwrap_or(0)));
    }
    if out.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(TableError::Order);
    }
    Ok(out)
}

impl DirtyTracker for HashTracker {
    fn backend(&self) -> Backend {
        Backend::Hash
    }

    fn dirty(&mut self, pid: i32, _area: &Area) -> Result<Dirty> {
        if !self.procs.contains_key(&pid) {
            let prev = self.load(pid)?;
            self.procs.insert(
                pid,
                ProcHashes {
                    prev,
                    ..Default::default()
                },
            );
        }
        Ok(Dirty::ByContent)
    }

    fn page_changed(&mut self, pid: i32, addr: u64, page: &[u8]) -> bool {
        let h = xxh3_64(page);
        let p = self.procs.entry(pid).or_default();
        p.next.push((addr, h));
        while p.cursor < p.prev.len() && p.prev[p.cursor].0 < addr {
            p.cursor += 1;
        }
        !matches!(p.prev.get(p.cursor), Some(&(a, old)) if a == addr && old == h)
    }

    fn arm(&mut self, pid: i32, _areas: &[Area], _remote: &mut dyn Remote) -> Result<ArmReport> {
        self.armed.push(pid);
        Ok(ArmReport::default())
    }

    fn finish_arm(&mut self) -> Result<()> {
        crate::state::create_private_dir(&self.dir)?;
        let armed = std::mem::take(&mut self.armed);
        for pid in &armed {
            let pairs = self.procs.remove(pid).map(|p| p.next).unwrap_or_default();
            crate::state::write_atomic(&self.file(*pid), &encode(&pairs))?;
        }
        // Tables of processes no longer in the tree.
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name
                    .strip_prefix("hashes-")
                    .and_then(|s| s.strip_suffix(".bin"))
                    .and_then(|s| s.parse::<i32>().ok());
                if matches!(pid, Some(p) if !armed.contains(&p)) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        self.procs.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_and_reject_damage() {
        let pairs = vec![(0x1000, 5), (0x3000, 9)];
        let b = encode(&pairs);
        assert_eq!(decode(&b).unwrap(), pairs);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(decode(&c).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn finds_changed_pages_across_two_dumps() {
        let dir = tempfile::tempdir().unwrap();
        let area = Area {
            start: 0,
            end: 0x4000,
            private_anon: true,
        };
        let pages = |v: [u8; 4]| v.map(|b| vec![b; 4096]);
        // First dump: everything is new.
        let mut t = HashTracker::new(dir.path());
        assert_eq!(t.dirty(3, &area).unwrap(), Dirty::ByContent);
        let first = pages([1, 2, 3, 4]);
        let changed: Vec<bool> = (0..4usize)
            .map(|i| t.page_changed(3, i as u64 * 0x1000, &first[i]))
            .collect();
        assert_eq!(changed, vec![true; 4]);
        let mut remote = stasis_kernel::remote::Recorder::default();
        t.arm(3, &[area], &mut remote).unwrap();
        assert!(
            remote.calls.is_empty(),
            "no remote syscall: {:?}",
            remote.calls
        );
        t.finish_arm().unwrap();
        // Second dump, by a new tracker (another stasis process): pages 1
        // and 3 changed, page 2 vanished.
        let mut t = HashTracker::new(dir.path());
        t.dirty(3, &area).unwrap();
        let second = pages([1, 9, 3, 7]);
        let changed: Vec<bool> = [0usize, 1, 3]
            .iter()
            .map(|&i| t.page_changed(3, i as u64 * 0x1000, &second[i]))
            .collect();
        assert_eq!(changed, vec![false, true, true]);
    }
}
