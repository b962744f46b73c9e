//! `track/hashes-PID.bin`: the page hashes of the hash backend.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_track::hash::{decode, encode};
use xxhash_rust::xxh3::xxh3_64;

fn check(bytes: &[u8]) {
    if let Ok(pairs) = decode(bytes) {
        assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(encode(&pairs), bytes, "encode(decode(b)) != b");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 8 {
        let body = &data[..data.len() - 8];
        let mut fixed = body.to_vec();
        fixed.extend_from_slice(&xxh3_64(body).to_le_bytes());
        check(&fixed);
    }
});
