//! The persistent-memory target: one file per checkpoint name,
//! `NAME.pmem`, mapped shared and written like NVM (stores, then
//! cache-line write-back and a fence; `pmem_latency_ns` adds an emulated
//! write latency per 64-byte line, as the ACCK paper emulated PCM).
//!
//! ```text
//! 0      "STASPMEM", slot capacity u64
//! 64     slot descriptor 0 \  magic "STASPMS\0", valid u32, pad u32, seq u64,
//! 128    slot descriptor 1 /  id u64, version i32, table_len u32, data_len u64,
//!                              data_sum u64 (xxh3 of the slot's bytes), desc_sum u64
//! 4096   slot 0: region table (count u32, pad u32, count x (id i32, pad u32, len u64)),
//!                then every region's bytes in table order
//! 4096+cap  slot 1
//! ```
//! Two slots: a checkpoint goes into the slot *not* holding the newest
//! version, whose descriptor is invalidated (and persisted) first and
//! written (and persisted) last, so a checkpoint killed half-way leaves the
//! newest version intact. The slot is brought up to date from the other
//! one: only the ranges the previous checkpoint changed when this process
//! wrote both, else the other slot's regions whole, then the new chunks.
//! A checkpoint that needs more room than a slot has writes a new file
//! under a temporary name and renames it over the old one.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stasis_kernel::selfmon::pmem::CACHE_LINE;
use stasis_kernel::selfmon::PmemMap;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{AppError, Result};
use crate::format::{Meta, RegionData, Snapshot};

use super::Target;

const FILE_MAGIC: &[u8; 8] = b"STASPMEM";
const SLOT_MAGIC: &[u8; 8] = b"STASPMS\0";
const HEADER: usize = 4096;
const DESC: [usize; 2] = [64, 128];

/// A slot descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Desc {
    valid: bool,
    seq: u64,
    id: u64,
    version: i32,
    table_len: u32,
    data_len: u64,
    data_sum: u64,
}

fn rd64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn rd32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

impl Desc {
    fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(SLOT_MAGIC);
        b[8..12].copy_from_slice(&u32::from(self.valid).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..36].copy_from_slice(&self.version.to_le_bytes());
        b[36..40].copy_from_slice(&self.table_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.data_sum.to_le_bytes());
        let s = xxh3_64(&b[..56]);
        b[56..].copy_from_slice(&s.to_le_bytes());
        b
    }

    /// `None` unless the descriptor is intact and valid.
    fn decode(b: &[u8]) -> Option<Self> {
        if &b[..8] != SLOT_MAGIC || xxh3_64(&b[..56]) != rd64(b, 56) || rd32(b, 8) != 1 {
            return None;
        }
        Some(Self {
            valid: true,
            seq: rd64(b, 16),
            id: rd64(b, 24),
            version: i32::from_le_bytes(b[32..36].try_into().ok()?),
            table_len: rd32(b, 36),
            data_len: rd64(b, 40),
            data_sum: rd64(b, 48),
        })
    }
}

/// One region's place in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    id: i32,
    len: usize,
    off: usize,
}

fn encode_table(regions: &[(i32, u64)]) -> Vec<u8> {
    let mut t = Vec::with_capacity(8 + regions.len() * 16);
    t.extend_from_slice(
        &u32::try_from(regions.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    t.extend_from_slice(&[0; 4]);
    for (id, len) in regions {
        t.extend_from_slice(&id.to_le_bytes());
        t.extend_from_slice(&[0; 4]);
        t.extend_from_slice(&len.to_le_bytes());
    }
    t
}

fn layout(table: &[u8]) -> Option<Vec<Place>> {
    let n = usize::try_from(rd32(table, 0)).ok()?;
    if table.len() != 8 + n * 16 {
        return None;
    }
    let mut off = table.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = 8 + i * 16;
        let id = i32::from_le_bytes(table[at..at + 4].try_into().ok()?);
        let len = usize::try_from(rd64(table, at + 8)).ok()?;
        out.push(Place { id, len, off });
        off = off.checked_add(len)?;
    }
    Some(out)
}

/// What this process wrote last into a pool: the id it wrote, the id of
/// the version it was built on, and the ranges it changed (slot offset,
/// length).
type Prev = (u64, u64, Vec<(usize, usize)>);

/// The pool of one checkpoint name.
struct Pool {
    map: PmemMap,
    cap: usize,
    prev: Option<Prev>,
}

/// The persistent-memory target.
pub struct PmemTarget {
    dir: PathBuf,
    latency_ns: u64,
    pools: Vec<(String, Pool)>,
    commits: u64,
}

impl std::fmt::Debug for PmemTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmemTarget")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl PmemTarget {
    /// Opens the target in `dir` (created if missing).
    pub fn open(dir: &Path, latency_ns: u64) -> Result<Self> {
        fs::create_dir_all(dir).map_err(AppError::io("create directory", dir))?;
        super::remove_stale_temporaries(dir);
        Ok(Self {
            dir: dir.to_path_buf(),
            latency_ns,
            pools: Vec::new(),
            commits: 0,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pmem"))
    }

    fn map_file(path: &Path, create_len: Option<usize>) -> Result<Option<Pool>> {
        let mut o = OpenOptions::new();
        o.read(true).write(true).mode(0o600);
        if create_len.is_some() {
            o.create(true).truncate(true);
        }
        let f = match o.open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(AppError::io("open", path)(e)),
        };
        let len = match create_len {
            Some(l) => {
                f.set_len(l as u64).map_err(AppError::io("size", path))?;
                l
            }
            None => usize::try_from(f.metadata().map_err(AppError::io("stat", path))?.len())
                .unwrap_or(0),
        };
        if len < HEADER {
            return Err(AppError::damaged(path, "shorter than its header"));
        }
        let mut map = PmemMap::map(f, len)
            .map_err(|e| AppError::Internal(format!("map {}: {e}", path.display())))?;
        if create_len.is_some() {
            let cap = (len - HEADER) / 2;
            let b = map.bytes_mut();
            b[..8].copy_from_slice(FILE_MAGIC);
            b[8..16].copy_from_slice(&(cap as u64).to_le_bytes());
            map.persist(0, 16);
        }
        let b = map.bytes();
        let cap = usize::try_from(rd64(b, 8)).unwrap_or(usize::MAX);
        if &b[..8] != FILE_MAGIC || HEADER.checked_add(cap.saturating_mul(2)) != Some(len) {
            return Err(AppError::damaged(path, "not a stasis pmem file"));
        }
        Ok(Some(Pool {
            map,
            cap,
            prev: None,
        }))
    }

    fn pool(&mut self, name: &str) -> Result<Option<&mut Pool>> {
        if !self.pools.iter().any(|(n, _)| n == name) {
            match Self::map_file(&self.path(name), None)? {
                Some(p) => self.pools.push((name.to_string(), p)),
                None => return Ok(None),
            }
        }
        Ok(self
            .pools
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p))
    }

    /// Writes back `[off, +len)` and waits out the emulated latency.
    fn persist(latency_ns: u64, map: &PmemMap, off: usize, len: usize) {
        map.persist(off, len);
        if latency_ns > 0 {
            let lines = len.div_ceil(CACHE_LINE) as u64;
            let until = Instant::now() + Duration::from_nanos(latency_ns.saturating_mul(lines));
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    }
}

fn descs(map: &PmemMap) -> [Option<Desc>; 2] {
    let b = map.bytes();
    [
        Desc::decode(&b[DESC[0]..DESC[0] + 64]),
        Desc::decode(&b[DESC[1]..DESC[1] + 64]),
    ]
}

fn slot_ok(map: &PmemMap, cap: usize, i: usize, d: &Desc) -> bool {
    let start = HEADER + i * cap;
    let Ok(len) = usize::try_from(d.data_len) else {
        return false;
    };
    len <= cap && xxh3_64(&map.bytes()[start..start + len]) == d.data_sum
}

mod commit;
