//! The small records of an image directory: the `latest` pointer and the
//! `stasis-image` marker. What parses must be what a writer writes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_image::{parse_latest, parse_marker, MarkerProblem, FORMAT_VERSION};

fuzz_target!(|data: &[u8]| {
    if let Some(n) = parse_latest(data) {
        assert!(n >= 1);
        // Leading zeros are allowed (at most 10 digits); the value is exact.
        let text = std::str::from_utf8(data).expect("text");
        assert_eq!(text.trim_end_matches('\n').parse::<u32>().ok(), Some(n));
        assert_eq!(parse_latest(format!("{n}\n").as_bytes()), Some(n));
    }
    match parse_marker(data) {
        Ok(v) => assert!(v >= 1 && v <= FORMAT_VERSION),
        Err(MarkerProblem::Newer(v)) => assert!(v > FORMAT_VERSION),
        Err(MarkerProblem::Bad(_)) => {}
    }
});
