//! Touch-set files (`touch-window`, `touch-faults`): what decodes must
//! re-encode to the same bytes and stay within the decoder's limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_image::touch::TouchSet;
use stasis_image::PAGE_SIZE;
use xxhash_rust::xxh3::xxh3_64;

fn check(bytes: &[u8]) {
    let Ok(ts) = TouchSet::decode(bytes) else {
        return;
    };
    assert_eq!(ts.encode(), bytes, "encode(decode(b)) != b");
    for (_, ranges) in &ts.procs {
        for &(s, n) in ranges {
            assert!(s % PAGE_SIZE == 0 && n >= 1);
        }
    }
    assert!(ts.pages() <= 1 << 26);
    // Expanding to page order is what the filler does; keep it cheap here.
    if ts.pages() <= 1 << 16 {
        for (pid, _) in &ts.procs {
            let order = ts.page_order(*pid);
            let ranges = TouchSet::ranges_of(&order);
            assert_eq!(
                ranges.iter().map(|&(_, n)| u64::from(n)).sum::<u64>(),
                order.len() as u64
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // The same body with a valid checksum, so mutations reach the parser.
    if data.len() >= 8 {
        let body = &data[..data.len() - 8];
        let mut fixed = body.to_vec();
        fixed.extend_from_slice(&xxh3_64(body).to_le_bytes());
        check(&fixed);
    }
});
