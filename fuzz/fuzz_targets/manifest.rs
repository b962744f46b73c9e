//! `manifest.bin`: header checks (magic, version, lengths, size limit),
//! checksum, CBOR payload. A decoded manifest must keep the invariants its
//! types document and survive encode/decode unchanged.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stasis_image::{
    decode_manifest, encode_manifest, Manifest, FORMAT_VERSION, MANIFEST_HEADER_LEN,
    MANIFEST_MAGIC, PAGE_SIZE,
};
use xxhash_rust::xxh3::xxh3_64;

fn check(bytes: &[u8]) {
    let path = Path::new("manifest.bin");
    let Ok(m) = decode_manifest(bytes, 1, path) else {
        return;
    };
    invariants(&m);
    let enc = encode_manifest(&m).expect("a decoded manifest encodes");
    let again = decode_manifest(&enc, 1, path).expect("an encoded manifest decodes");
    assert_eq!(again, m, "decode(encode(m)) != m");
    assert_eq!(
        encode_manifest(&again).expect("encodes"),
        enc,
        "encoding is not deterministic"
    );
}

/// What `ProcessImage::data_ranges` promises its readers (the chain code
/// relies on it): page-aligned, non-empty, sorted, disjoint.
fn invariants(m: &Manifest) {
    for p in &m.processes {
        let Some(ranges) = &p.data_ranges else {
            continue;
        };
        let mut prev_end = 0u64;
        for &(s, e) in ranges {
            assert!(
                s < e && s % PAGE_SIZE == 0 && e % PAGE_SIZE == 0 && s >= prev_end,
                "data_ranges of pid {} accepted out of order or unaligned: {ranges:x?}",
                p.pid
            );
            prev_end = e;
        }
    }
}

/// `payload` behind a valid header, so that mutations reach the CBOR decoder
/// instead of stopping at the checksum.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 32);
    out.extend_from_slice(&MANIFEST_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&MANIFEST_HEADER_LEN.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Seeds are whole files: mutate their payload behind a repaired header;
    // other inputs are taken as a payload.
    match data.strip_prefix(&MANIFEST_MAGIC[..]) {
        Some(_) if data.len() >= 32 => check(&framed(&data[32..])),
        _ => check(&framed(data)),
    }
});
