//! Framing of `manifest.bin`: a 32-byte header followed by the CBOR payload.
//!
//! ```text
//! 0   magic          b"STASISMF"
//! 8   format_version u32 LE
//! 12  header_len     u32 LE (32)
//! 16  payload_len    u64 LE
//! 24  payload_xxh3   u64 LE (xxh3-64 of the payload)
//! 32  payload        CBOR of `Manifest`
//! ```

use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::chain::is_ranges;
use crate::fsutil;
use crate::manifest::Manifest;
use crate::{ImageError, FORMAT_VERSION};

/// Magic bytes at the start of `manifest.bin`.
pub const MANIFEST_MAGIC: [u8; 8] = *b"STASISMF";
/// Length of the `manifest.bin` header.
pub const MANIFEST_HEADER_LEN: u32 = 32;
/// Largest accepted manifest payload (256 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// Why a manifest could not be decoded (mapped to an `ImageError` by callers).
enum Problem {
    Newer(u32),
    Corrupt(String),
}

impl Problem {
    fn into_error(self, checkpoint: u32, path: &Path) -> ImageError {
        match self {
            Problem::Newer(found) => ImageError::NewerFormat {
                path: path.to_path_buf(),
                found,
                supported: FORMAT_VERSION,
            },
            Problem::Corrupt(reason) => ImageError::CorruptManifest {
                checkpoint,
                path: path.to_path_buf(),
                reason,
            },
        }
    }
}

fn le_u32(b: &[u8; 32], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8; 32], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Validates the header against the total file length; returns
/// `(payload_len, (payload_checksum, format_version))`.
fn parse_header(h: &[u8; 32], file_len: u64) -> Result<(u64, (u64, u32)), Problem> {
    if h[0..8] != MANIFEST_MAGIC {
        return Err(Problem::Corrupt("bad magic: not a stasis manifest".into()));
    }
    let version = le_u32(h, 8);
    if version == 0 {
        return Err(Problem::Corrupt("format version 0".into()));
    }
    if version > FORMAT_VERSION.max(crate::manifest::NAMESPACE_OBJECTS_MANIFEST_VERSION) {
        return Err(Problem::Newer(version));
    }
    let header_len = le_u32(h, 12);
    if header_len != MANIFEST_HEADER_LEN {
        return Err(Problem::Corrupt(format!(
            "header length {header_len}, expected {MANIFEST_HEADER_LEN}"
        )));
    }
    let payload_len = le_u64(h, 16);
    if payload_len > MAX_MANIFEST_BYTES {
        return Err(Problem::Corrupt(format!(
            "payload length {payload_len} exceeds the limit of {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let have = file_len - u64::from(MANIFEST_HEADER_LEN);
    if payload_len > have {
        return Err(Problem::Corrupt(format!(
            "truncated: header announces {payload_len} payload bytes, file has {have}"
        )));
    }
    if payload_len < have {
        return Err(Problem::Corrupt(format!(
            "{} trailing bytes after the payload",
            have - payload_len
        )));
    }
    Ok((payload_len, (le_u64(h, 24), version)))
}

fn decode_payload(payload: &[u8], (checksum, version): (u64, u32)) -> Result<Manifest, Problem> {
    if xxh3_64(payload) != checksum {
        return Err(Problem::Corrupt("checksum mismatch".into()));
    }
    let mut rest = payload;
    let m: Manifest = ciborium::from_reader(&mut rest)
        .map_err(|e| Problem::Corrupt(format!("cannot decode CBOR: {e}")))?;
    if !rest.is_empty() {
        return Err(Problem::Corrupt(format!(
            "{} trailing bytes inside the payload",
            rest.len()
        )));
    }
    // The version is outside the checksum: it must be the one the content
    // calls for (namespaces raise it).
    let want = m.content_version(FORMAT_VERSION);
    if version != want && !(version < FORMAT_VERSION && m.namespaces.is_none()) {
        return Err(Problem::Corrupt(format!(
            "format version {version} where the content is of version {want}"
        )));
    }
    // The chain code relies on what `data_ranges` promises.
    for p in &m.processes {
        if let Some(r) = &p.data_ranges {
            if !is_ranges(r) {
                return Err(Problem::Corrupt(format!(
                    "the data ranges of process {} are not sorted, disjoint, page-aligned ranges",
                    p.pid
                )));
            }
        }
    }
    Ok(m)
}

fn too_short(len: u64) -> Problem {
    Problem::Corrupt(format!(
        "truncated: file is {len} bytes, shorter than the {MANIFEST_HEADER_LEN}-byte header"
    ))
}

/// Encodes a manifest into the complete contents of `manifest.bin`.
///
/// Encoding is deterministic: decoding and re-encoding gives the same bytes.
pub fn encode_manifest(m: &Manifest) -> Result<Vec<u8>, ImageError> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(&[0u8; 32]);
    ciborium::into_writer(m, &mut out).map_err(|e| ImageError::Encode {
        checkpoint: m.checkpoint,
        reason: e.to_string(),
    })?;
    let payload_len = (out.len() - 32) as u64;
    if payload_len > MAX_MANIFEST_BYTES {
        return Err(ImageError::ManifestTooLarge {
            checkpoint: m.checkpoint,
            len: payload_len,
            max: MAX_MANIFEST_BYTES,
        });
    }
    let sum = xxh3_64(&out[32..]);
    out[0..8].copy_from_slice(&MANIFEST_MAGIC);
    let version = m.content_version(FORMAT_VERSION);
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out[12..16].copy_from_slice(&MANIFEST_HEADER_LEN.to_le_bytes());
    out[16..24].copy_from_slice(&payload_len.to_le_bytes());
    out[24..32].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Decodes the complete contents of a `manifest.bin`. `checkpoint` and `path`
/// only give context to errors.
pub fn decode_manifest(bytes: &[u8], checkpoint: u32, path: &Path) -> Result<Manifest, ImageError> {
    let len = bytes.len() as u64;
    let Some((header, payload)) = bytes.split_first_chunk::<32>() else {
        return Err(too_short(len).into_error(checkpoint, path));
    };
    let (_, sum) = parse_header(header, len).map_err(|p| p.into_error(checkpoint, path))?;
    decode_payload(payload, sum).map_err(|p| p.into_error(checkpoint, path))
}

/// Reads and decodes `path`. All size checks happen before the payload is
/// allocated.
pub(crate) fn read_manifest_file(path: &Path, checkpoint: u32) -> Result<Manifest, ImageError> {
    let mut file = match fsutil::open_read_opt(path)? {
        Some(f) => f,
        None => {
            return Err(ImageError::CorruptManifest {
                checkpoint,
                path: path.to_path_buf(),
                reason: "manifest.bin is missing".into(),
            })
        }
    };
    let len = file.metadata().map_err(ImageError::io("stat", path))?.len();
    let fail = |p: Problem| p.into_error(checkpoint, path);
    if len < u64::from(MANIFEST_HEADER_LEN) {
        return Err(fail(too_short(len)));
    }
    let mut header = [0u8; 32];
    read_exact_or_truncated(&mut file, &mut header, path, checkpoint)?;
    let (payload_len, sum) = parse_header(&header, len).map_err(fail)?;
    // Bounded by MAX_MANIFEST_BYTES, checked above.
    let payload_len = usize::try_from(payload_len).map_err(|_| {
        fail(Problem::Corrupt(
            "payload length does not fit in memory".into(),
        ))
    })?;
    let mut payload = vec![0u8; payload_len];
    read_exact_or_truncated(&mut file, &mut payload, path, checkpoint)?;
    decode_payload(&payload, sum).map_err(fail)
}

fn read_exact_or_truncated(
    file: &mut std::fs::File,
    buf: &mut [u8],
    path: &Path,
    checkpoint: u32,
) -> Result<(), ImageError> {
    file.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ImageError::CorruptManifest {
                checkpoint,
                path: path.to_path_buf(),
                reason: "truncated while reading".into(),
            }
        } else {
            ImageError::Io {
                action: "read",
                path: path.to_path_buf(),
                source: e,
            }
        }
    })
}
