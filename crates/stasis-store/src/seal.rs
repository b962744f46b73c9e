//! One stored object: a 16-byte header, then the body, compressed with
//! zstd unless that does not pay, and sealed with XChaCha20-Poly1305 when
//! the store is encrypted (format in docs/storage.md).
//!
//! ```text
//! magic "STSOBJ01" | flags u8 (bit 0 zstd, bit 1 sealed) | 7 zero bytes
//! | sealed: nonce (24 random bytes) | body (sealed: ciphertext + 16-byte tag)
//! ```
//! The AEAD's associated data is the header and the object's name
//! relative to the store prefix, so an object moved or renamed does not
//! open.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::Key;

const MAGIC: &[u8; 8] = b"STSOBJ01";
const HEADER: usize = 16;
const NONCE: usize = 24;
const FLAG_ZSTD: u8 = 1;
const FLAG_SEALED: u8 = 2;
/// zstd level used by default (measured in docs/storage.md).
pub const DEFAULT_LEVEL: i32 = 1;
/// A part is stored compressed only if that saves at least 1/64 of it.
const MIN_SAVING_DIV: usize = 64;

/// How objects are written.
#[derive(Debug, Clone, Default)]
pub struct SealOptions {
    /// zstd level, or `None` for no compression.
    pub zstd: Option<i32>,
    pub key: Option<Key>,
}

/// Why an object did not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("not a stored object (bad header)")]
    Header,
    #[error("it is encrypted and no key was given")]
    NeedKey,
    #[error("authentication failed (wrong key, or the object was changed)")]
    Auth,
    #[error("zstd: {0}")]
    Zstd(String),
    #[error("{0} bytes after decompression, more than the {1} expected")]
    TooLarge(usize, usize),
}

/// Encodes `plain` as the object `name`.
pub fn seal(plain: &[u8], name: &str, opts: &SealOptions) -> Vec<u8> {
    let mut flags = 0u8;
    let mut body: Vec<u8> = match opts.zstd {
        Some(level) => match zstd::bulk::compress(plain, level) {
            Ok(c) if c.len() + plain.len() / MIN_SAVING_DIV < plain.len() => {
                flags |= FLAG_ZSTD;
                c
            }
            _ => plain.to_vec(),
        },
        None => plain.to_vec(),
    };
    let mut out = Vec::with_capacity(HEADER + NONCE + body.len() + 16);
    out.extend_from_slice(MAGIC);
    if let Some(key) = &opts.key {
        flags |= FLAG_SEALED;
        out.push(flags);
        out.extend_from_slice(&[0; 7]);
        let mut nonce = [0u8; NONCE];
        fill_random(&mut nonce);
        let aad = aad(&out[..HEADER], name);
        let cipher = XChaCha20Poly1305::new(key.bytes().into());
        body = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &body,
                    aad: &aad,
                },
            )
            .unwrap_or_default();
        out.extend_from_slice(&nonce);
    } else {
        out.push(flags);
        out.extend_from_slice(&[0; 7]);
    }
    out.extend_from_slice(&body);
    out
}

/// Decodes the object `name`; `max` bounds the decompressed size.
pub fn open(
    stored: &[u8],
    name: &str,
    key: Option<&Key>,
    max: usize,
) -> Result<Vec<u8>, OpenError> {
    if stored.len() < HEADER || &stored[..8] != MAGIC || stored[9..HEADER] != [0; 7] {
        return Err(OpenError::Header);
    }
    let flags = stored[8];
    if flags & !(FLAG_ZSTD | FLAG_SEALED) != 0 {
        return Err(OpenError::Header);
    }
    let opened;
    let body: &[u8] = if flags & FLAG_SEALED != 0 {
        let key = key.ok_or(OpenError::NeedKey)?;
        if stored.len() < HEADER + NONCE + 16 {
            return Err(OpenError::Auth);
        }
        let aad = aad(&stored[..HEADER], name);
        let cipher = XChaCha20Poly1305::new(key.bytes().into());
        opened = cipher
            .decrypt(
                XNonce::from_slice(&stored[HEADER..HEADER + NONCE]),
                Payload {
                    msg: &stored[HEADER + NONCE..],
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::Auth)?;
        &opened
    } else {
        &stored[HEADER..]
    };
    if flags & FLAG_ZSTD != 0 {
        let out = zstd::bulk::decompress(body, max).map_err(|e| OpenError::Zstd(e.to_string()))?;
        Ok(out)
    } else if body.len() > max {
        Err(OpenError::TooLarge(body.len(), max))
    } else {
        Ok(body.to_vec())
    }
}

/// Whether a stored object is encrypted (its header says so).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.len() >= HEADER && stored[8] & FLAG_SEALED != 0
}

fn aad(header: &[u8], name: &str) -> Vec<u8> {
    let mut a = header.to_vec();
    a.extend_from_slice(name.as_bytes());
    a
}

fn fill_random(buf: &mut [u8]) {
    // A nonce must never repeat: without randomness, refuse to go on.
    if let Err(e) = getrandom::fill(buf) {
        panic!("no random numbers for an encryption nonce: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key::from_bytes([b; 32])
    }

    #[test]
    fn round_trips_every_mode() {
        let text = b"hello hello hello hello hello hello hello hello".repeat(100);
        let random: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 24).to_le_bytes()[0])
            .collect();
        for plain in [&text[..], &random[..], &[][..]] {
            for zstd in [None, Some(1)] {
                for k in [None, Some(key(3))] {
                    let o = SealOptions {
                        zstd,
                        key: k.clone(),
                    };
                    let s = seal(plain, "a/b", &o);
                    assert_eq!(open(&s, "a/b", k.as_ref(), plain.len()).unwrap(), plain);
                }
            }
        }
        let s = seal(
            &text,
            "n",
            &SealOptions {
                zstd: Some(1),
                key: None,
            },
        );
        assert!(s.len() < text.len() / 10, "text compresses: {}", s.len());
    }

    #[test]
    fn incompressible_data_is_stored_raw() {
        let mut random = vec![0u8; 65536];
        fill_random(&mut random);
        let s = seal(
            &random,
            "n",
            &SealOptions {
                zstd: Some(1),
                key: None,
            },
        );
        assert_eq!(s[8] & FLAG_ZSTD, 0);
        assert_eq!(s.len(), random.len() + HEADER);
    }

    #[test]
    fn sealed_objects_refuse_wrong_keys_names_and_changes() {
        let o = SealOptions {
            zstd: Some(1),
            key: Some(key(1)),
        };
        let s = seal(b"secret page", "x/1", &o);
        assert!(is_sealed(&s));
        assert_eq!(open(&s, "x/1", None, 100), Err(OpenError::NeedKey));
        assert_eq!(open(&s, "x/1", Some(&key(2)), 100), Err(OpenError::Auth));
        assert_eq!(open(&s, "x/2", Some(&key(1)), 100), Err(OpenError::Auth));
        for i in 0..s.len() {
            let mut t = s.clone();
            t[i] ^= 0x40;
            assert!(open(&t, "x/1", Some(&key(1)), 100).is_err(), "flip at {i}");
        }
        // Two seals of the same bytes differ (random nonces).
        assert_ne!(seal(b"secret page", "x/1", &o), s);
    }
}
