//! The checkpoint file format (directory target).
//!
//! ```text
//! header   magic "STASAPP\0", format u32 = 1, depth u32 (0: full),
//!          id u64, parent_id u64 (0: none), version i32, parent_version i32,
//!          region_count u32,
//!          per region: id i32, flags u32 (1: whole), len u64, chunk_count u64,
//!                      chunk_count x (offset u64, length u64)
//! data     every chunk's bytes, in table order
//! trailer  xxh3-64 of header and data u64, magic "STASEND\0"
//! ```
//! Little-endian. A delta (depth > 0) holds the bytes written since its
//! parent, the version it names by number *and* id, so a parent rewritten
//! since breaks the chain visibly. Every size is checked against the file
//! length before it is used.

use xxhash_rust::xxh3::Xxh3;

/// File magic.
pub(crate) const MAGIC: &[u8; 8] = b"STASAPP\0";
/// Trailer magic.
pub(crate) const END: &[u8; 8] = b"STASEND\0";
/// Format version, independent of the library's.
pub(crate) const FORMAT: u32 = 1;
const MAX_REGIONS: u32 = 1 << 20;
const TRAILER: usize = 16;

/// What a checkpoint holds of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionData {
    pub id: i32,
    pub len: u64,
    /// The chunks cover the whole region (no parent needed for it).
    pub whole: bool,
    /// (offset, length) in the region, in the order of the data.
    pub chunks: Vec<(u64, u64)>,
}

/// The bytes copied out of the regions at one checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub regions: Vec<RegionData>,
    pub data: Vec<u8>,
}

/// Identity of a checkpoint file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub depth: u32,
    pub id: u64,
    pub parent_id: u64,
    pub version: i32,
    pub parent_version: i32,
}

/// Why bytes are not a checkpoint.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated ({0})")]
    Truncated(&'static str),
    #[error("not a stasis checkpoint (bad magic)")]
    Magic,
    #[error("format {0} is not supported (this library reads {FORMAT})")]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("{0}")]
    Bad(String),
}

/// The header bytes of a checkpoint (everything before the data).
pub fn encode_header(m: &Meta, s: &Snapshot) -> Vec<u8> {
    let mut h = Vec::with_capacity(64 + s.regions.len() * 24);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT.to_le_bytes());
    h.extend_from_slice(&m.depth.to_le_bytes());
    h.extend_from_slice(&m.id.to_le_bytes());
    h.extend_from_slice(&m.parent_id.to_le_bytes());
    h.extend_from_slice(&m.version.to_le_bytes());
    h.extend_from_slice(&m.parent_version.to_le_bytes());
    h.extend_from_slice(
        &u32::try_from(s.regions.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for r in &s.regions {
        h.extend_from_slice(&r.id.to_le_bytes());
        h.extend_from_slice(&u32::from(r.whole).to_le_bytes());
        h.extend_from_slice(&r.len.to_le_bytes());
        h.extend_from_slice(&(r.chunks.len() as u64).to_le_bytes());
        for (o, l) in &r.chunks {
            h.extend_from_slice(&o.to_le_bytes());
            h.extend_from_slice(&l.to_le_bytes());
        }
    }
    h
}

/// The trailer for `header` followed by `data`.
pub fn encode_trailer(header: &[u8], data: &[u8]) -> [u8; TRAILER] {
    let mut x = Xxh3::new();
    x.update(header);
    x.update(data);
    let mut t = [0u8; TRAILER];
    t[..8].copy_from_slice(&x.digest().to_le_bytes());
    t[8..].copy_from_slice(END);
    t
}

struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], FormatError> {
        let e = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(FormatError::Truncated(what))?;
        let s = &self.b[self.at..e];
        self.at = e;
        Ok(s)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().unwrap_or_default(),
        ))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, FormatError> {
        Ok(i32::from_le_bytes(
            self.take(4, what)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().unwrap_or_default(),
        ))
    }
}

/// Only the identity of a checkpoint, from its first bytes (no checksum).
pub fn decode_meta(b: &[u8]) -> Result<Meta, FormatError> {
    let mut r = Rd { b, at: 0 };
    if r.take(8, "magic")? != MAGIC {
        return Err(FormatError::Magic);
    }
    let f = r.u32("format")?;
    if f != FORMAT {
        return Err(FormatError::Version(f));
    }
    Ok(Meta {
        depth: r.u32("depth")?,
        id: r.u64("id")?,
        parent_id: r.u64("parent id")?,
        version: r.i32("version")?,
        parent_version: r.i32("parent version")?,
    })
}

/// Decodes and verifies a whole checkpoint file.
pub fn decode(b: &[u8]) -> Result<(Meta, Snapshot), FormatError> {
    let meta = decode_meta(b)?;
    if b.len() < TRAILER || &b[b.len() - 8..] != END {
        return Err(FormatError::Truncated("trailer"));
    }
    let body = &b[..b.len() - TRAILER];
    let sum = u64::from_le_bytes(
        b[b.len() - TRAILER..b.len() - 8]
            .try_into()
            .unwrap_or_default(),
    );
    if xxhash_rust::xxh3::xxh3_64(body) != sum {
        return Err(FormatError::Checksum);
    }
    let mut r = Rd { b: body, at: 40 };
    let n = r.u32("region count")?;
    if n > MAX_REGIONS {
        return Err(FormatError::Bad(format!("{n} regions")));
    }
    let mut regions = Vec::new();
    let mut total: u64 = 0;
    for _ in 0..n {
        let id = r.i32("region id")?;
        let whole = r.u32("region flags")? & 1 != 0;
        let len = r.u64("region length")?;
        let nc = r.u64("chunk count")?;
        if nc > (body.len() as u64) / 16 {
            return Err(FormatError::Bad(format!("region {id}: {nc} chunks")));
        }
        let mut chunks = Vec::new();
        for _ in 0..nc {
            let (o, l) = (r.u64("chunk offset")?, r.u64("chunk length")?);
            if o.checked_add(l).is_none_or(|e| e > len) {
                return Err(FormatError::Bad(format!(
                    "region {id}: chunk [{o}, +{l}) past its end {len}"
                )));
            }
            total = total.saturating_add(l);
            chunks.push((o, l));
        }
        regions.push(RegionData {
            id,
            len,
            whole,
            chunks,
        });
    }
    let rest = body.len() - r.at;
    if total != rest as u64 {
        return Err(FormatError::Bad(format!(
            "{total} bytes of chunks, {rest} bytes of data"
        )));
    }
    let data = body[r.at..].to_vec();
    Ok((meta, Snapshot { regions, data }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Meta, Snapshot) {
        let m = Meta {
            depth: 1,
            id: 7,
            parent_id: 5,
            version: 30,
            parent_version: 20,
        };
        let s = Snapshot {
            regions: vec![
                RegionData {
                    id: 0,
                    len: 100,
                    whole: false,
                    chunks: vec![(0, 3), (50, 2)],
                },
                RegionData {
                    id: 4,
                    len: 10,
                    whole: true,
                    chunks: vec![(0, 10)],
                },
            ],
            data: (0u8..15).collect(),
        };
        (m, s)
    }

    fn encode(m: &Meta, s: &Snapshot) -> Vec<u8> {
        let mut b = encode_header(m, s);
        let t = encode_trailer(&b, &s.data);
        b.extend_from_slice(&s.data);
        b.extend_from_slice(&t);
        b
    }

    #[test]
    fn round_trip_re_encodes_to_the_same_bytes() {
        let (m, s) = sample();
        let b = encode(&m, &s);
        let (m2, s2) = decode(&b).expect("decode");
        assert_eq!((m2, &s2), (m, &s));
        assert_eq!(encode(&m2, &s2), b);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let (m, s) = sample();
        let b = encode(&m, &s);
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(decode(&c).is_err(), "byte {i} flipped");
        }
    }
}
