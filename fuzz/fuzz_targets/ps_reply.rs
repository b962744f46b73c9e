//! The client's side of the protocol: replies from a (possibly hostile)
//! page server. The first byte picks the reply decoder; the rest is the
//! payload, or for 6 a stream of frames read under the reply limit. What
//! decodes must re-encode to the same payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stasis_pageserver::protocol::{
    decode_chain_reply, decode_error, decode_files_reply, decode_latest_reply, decode_server_hello,
    decode_skeleton_reply, encode_error, is_servable_name, read_header, read_payload, Enc,
    ErrorCode, MAX_MESSAGE_BYTES, MAX_REPLY_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, p)) = data.split_first() else {
        return;
    };
    match sel % 7 {
        0 => {
            if let Ok((nonce, proof)) = decode_server_hello(p) {
                assert_eq!([&nonce[..], &proof[..]].concat(), p);
            }
        }
        1 => {
            if let Ok(n) = decode_latest_reply(p) {
                assert_eq!(&n.to_le_bytes()[..], p);
            }
        }
        2 => {
            // The requested checkpoint comes first, then the payload.
            let Some((n, p)) = p.split_first_chunk::<4>() else {
                return;
            };
            let n = u32::from_le_bytes(*n);
            if let Ok(chain) = decode_chain_reply(n, p) {
                assert_eq!(chain.first(), Some(&n));
                assert!(chain.windows(2).all(|w| w[1] < w[0]));
                let mut e = Enc::default();
                e.u32(chain.len() as u32);
                chain.iter().for_each(|&c| e.u32(c));
                assert_eq!(e.0, p);
            }
        }
        3 => {
            if let Ok(files) = decode_files_reply(p) {
                let mut e = Enc::default();
                e.u32(files.len() as u32);
                for f in &files {
                    assert!(is_servable_name(&f.name));
                    e.str(&f.name);
                    e.u64(f.size);
                }
                assert_eq!(e.0, p);
            }
        }
        4 => {
            if let Ok(s) = decode_skeleton_reply(p) {
                assert_eq!(s.header.len(), 4096);
                assert_eq!(s.tail_off.checked_add(s.tail.len() as u64), Some(s.size));
                let mut e = Enc::default();
                e.u64(s.size);
                e.u64(s.tail_off);
                e.bytes(&s.header);
                e.bytes(&s.tail);
                assert_eq!(e.0, p);
            }
        }
        5 => {
            if let Ok((code, msg)) = decode_error(p) {
                assert_eq!(ErrorCode::from_u32(code.to_u32()), code);
                if msg.len() <= MAX_MESSAGE_BYTES {
                    assert_eq!(encode_error(code, &msg), p);
                }
            }
        }
        _ => {
            let mut r = p;
            while let Ok(Some((_k, len))) = read_header(&mut r) {
                match read_payload(&mut r, len, MAX_REPLY_BYTES) {
                    Ok(payload) => assert_eq!(payload.len(), len as usize),
                    Err(_) => return,
                }
            }
        }
    }
});
