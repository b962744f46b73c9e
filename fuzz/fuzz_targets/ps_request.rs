//! The page server's side of the protocol: a client's byte stream (greeting,
//! frame headers, payloads under the request limit, requests). Every
//! request that decodes must re-encode to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_pageserver::protocol::{
    read_greeting, read_header, read_payload, Request, MAX_REQUEST_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    match read_greeting(&mut r) {
        Ok(Some(_version)) => {}
        _ => return,
    }
    // At most as many frames as the input can hold (each takes 8 bytes).
    while let Ok(Some((k, len))) = read_header(&mut r) {
        let Ok(payload) = read_payload(&mut r, len, MAX_REQUEST_BYTES) else {
            return;
        };
        assert!(payload.len() <= MAX_REQUEST_BYTES as usize);
        if let Ok(req) = Request::decode(k, &payload) {
            assert_eq!(req.encode(), (k, payload), "encode(decode(frame)) != frame");
        }
    }
});
