//! The restorer <-> filler control stream: length-prefixed JSON frames.
//! Every message that decodes must re-encode to a frame that decodes to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_lazy::control::{decode_body, decode_frame, encode_frame};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((msg, used))) = decode_frame(rest) {
        assert!(used >= 4 && used <= rest.len());
        let frame = encode_frame(&msg).expect("a decoded message encodes");
        assert_eq!(
            decode_frame(&frame).ok().flatten(),
            Some((msg, frame.len()))
        );
        rest = &rest[used..];
    }
    // The body alone, as JSON.
    if let Ok(msg) = decode_body(data) {
        let frame = encode_frame(&msg).expect("encodes");
        assert_eq!(decode_body(&frame[4..]).ok(), Some(msg));
    }
});
