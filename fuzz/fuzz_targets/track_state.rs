//! `track/state.json`: what the tracker left armed (JSON).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_track::state::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = decode(data) {
        let enc = encode(&s).expect("a decoded state encodes");
        assert_eq!(decode(&enc).expect("an encoded state decodes"), s);
    }
});
