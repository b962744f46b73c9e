//! Page packs: header, trailer and index (what `PackReader::open` checks
//! before any page is read). An accepted pack must be exactly what a
//! writer produces for its runs (header, index, trailer byte for byte) and
//! its runs must be sorted, disjoint and inside the page data.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stasis_image::{
    encode_tail, pack_header, PackIndex, PackRef, FORMAT_VERSION, MAX_RUN_PAGES, PACK_ENTRY_LEN,
    PACK_HEADER_LEN, PACK_TRAILER_LEN, PAGE_SIZE,
};
use xxhash_rust::xxh3::xxh3_64;

fn check(bytes: &[u8]) {
    // Not a standard name: the pid check against the name is not in the way.
    let path = Path::new("fuzz.pack");
    let Ok(ix) = PackIndex::decode(bytes, path, None) else {
        return;
    };
    assert_eq!(ix.size, bytes.len() as u64);
    // An older format version is accepted too: compare with the version
    // fields (header, trailer) set to what a writer puts.
    let mut norm = bytes.to_vec();
    let n = norm.len();
    for at in [8, n - 8] {
        let v = u32::from_le_bytes(norm[at..at + 4].try_into().unwrap());
        assert!((1..=FORMAT_VERSION).contains(&v), "version {v} accepted");
        norm[at..at + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    }
    let bytes = &norm[..];
    assert_eq!(&pack_header(ix.pid)[..], &bytes[..4096], "header");
    let data_end = usize::try_from(ix.data_end).expect("data_end in the file");
    let (tail, sum) = encode_tail(&ix.runs, ix.data_end);
    assert_eq!(&tail[..], &bytes[data_end..], "index and trailer");
    assert_eq!(sum, ix.index_checksum);
    let mut pages = 0u64;
    let mut prev: Option<(u64, u64)> = None; // (end address, end offset)
    for r in &ix.runs {
        assert!(r.npages >= 1 && r.npages <= MAX_RUN_PAGES && r.flags == 0);
        assert!(r.vaddr % PAGE_SIZE == 0 && r.file_off % PAGE_SIZE == 0);
        assert!(r.file_off >= PACK_HEADER_LEN && r.file_off + r.len() <= ix.data_end);
        if let Some((end, off)) = prev {
            assert!(r.vaddr >= end && r.file_off >= off, "runs overlap");
        }
        prev = Some((r.end(), r.file_off + r.len()));
        pages += u64::from(r.npages);
    }
    assert_eq!(pages, ix.pages);
    // What a manifest would say about it is accepted too; anything else not.
    let expected = PackRef {
        name: "fuzz.pack".into(),
        size: ix.size,
        pages: ix.pages,
        index_checksum: ix.index_checksum,
    };
    assert_eq!(
        PackIndex::decode(bytes, path, Some(&expected)).ok(),
        Some(ix)
    );
    let wrong = PackRef {
        pages: expected.pages + 1,
        ..expected
    };
    assert!(PackIndex::decode(bytes, path, Some(&wrong)).is_err());
}

/// The input with its trailer's index checksum repaired (when the trailer
/// locates an index inside the input), so that mutations of the index
/// reach the entry checks.
fn repaired(bytes: &[u8]) -> Option<Vec<u8>> {
    let size = bytes.len() as u64;
    if size < PACK_HEADER_LEN + PACK_TRAILER_LEN {
        return None;
    }
    let t = usize::try_from(size - PACK_TRAILER_LEN).ok()?;
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let index_off = word(t + 8);
    let count = word(t + 16);
    let end = count.checked_mul(PACK_ENTRY_LEN)?.checked_add(index_off)?;
    if end > size - PACK_TRAILER_LEN {
        return None;
    }
    let (a, b) = (usize::try_from(index_off).ok()?, usize::try_from(end).ok()?);
    let mut out = bytes.to_vec();
    out[t + 24..t + 32].copy_from_slice(&xxh3_64(&bytes[a..b]).to_le_bytes());
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = repaired(data) {
        check(&fixed);
    }
});
