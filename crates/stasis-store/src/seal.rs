//! One stored object: a 16-byte header, then the body, compressed with
//! zstd unless that does not pay, and sealed when the store is encrypted
//! (format in docs/storage.md).
//!
//! ```text
//! magic "STSOBJ01" | flags u8 (bit 0 zstd, bit 1 sealed, bit 2 AES) | 7 zero bytes
//! | sealed: nonce (24 random bytes) | body (sealed: ciphertext + 16-byte tag)
//! ```
//! The AEAD's associated data is the header and the object's name
//! relative to the store prefix, so an object moved or renamed does not
//! open.
//!
//! Objects are sealed with AES-256-GCM (bits 1 and 2) under a key of their
//! own, `BLAKE3-derive-key("stasis object seal v2 aes-256-gcm", key ||
//! nonce)` with the all-zero 96-bit GCM nonce: each object's key is used
//! once, so the 24 random bytes play the part of XChaCha's extended nonce
//! (GCM's own 96-bit nonce, random, would allow only 2^32 objects per key).
//! AES-256-GCM from aws-lc (hardware AES and carry-less multiply) seals
//! 1 MiB objects about 15x faster here than XChaCha20-Poly1305 from
//! RustCrypto did. Objects sealed with the latter (bit 1 alone: stores
//! written before) still open.

use std::cell::RefCell;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::Key;

const MAGIC: &[u8; 8] = b"STSOBJ01";
const HEADER: usize = 16;
const NONCE: usize = 24;
const FLAG_ZSTD: u8 = 1;
const FLAG_SEALED: u8 = 2;
/// With `FLAG_SEALED`: AES-256-GCM under a per-object key (else
/// XChaCha20-Poly1305 under the store key).
const FLAG_AES: u8 = 4;
const TAG: usize = 16;
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
    /// With age recipients: each checkpoint written is sealed under a new
    /// data key wrapped to them (see `recipients.rs`); `key` is then unset.
    pub recipients: Option<crate::Recipients>,
    /// The identities that unwrap the data keys of checkpoints written
    /// for recipients.
    pub identities: Option<crate::Identities>,
    /// The data keys made or unwrapped with these options.
    pub data_keys: crate::recipients::DataKeys,
}

impl SealOptions {
    /// Whether what is written is encrypted (a key, or recipients).
    pub fn encrypts(&self) -> bool {
        self.key.is_some() || self.recipients.is_some()
    }

    /// These options with `key` as the key (one checkpoint's).
    pub(crate) fn with_key(&self, key: Option<Key>) -> SealOptions {
        SealOptions {
            zstd: self.zstd,
            key,
            ..Default::default()
        }
    }
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
    let compressed = opts.zstd.and_then(|level| compress(plain, level));
    let mut flags = if compressed.is_some() { FLAG_ZSTD } else { 0 };
    if opts.key.is_some() {
        flags |= FLAG_SEALED | FLAG_AES;
    }
    let body: &[u8] = compressed.as_deref().unwrap_or(plain);
    // The object is built in one buffer: header, nonce, the body (copied
    // once), sealed in place, and its tag.
    let mut out = Vec::with_capacity(HEADER + NONCE + body.len() + TAG);
    out.extend_from_slice(MAGIC);
    out.push(flags);
    out.extend_from_slice(&[0; 7]);
    let Some(key) = &opts.key else {
        out.extend_from_slice(body);
        return out;
    };
    let mut nonce = [0u8; NONCE];
    fill_random(&mut nonce);
    let aad = aad(&out[..HEADER], name);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(body);
    let tag = object_key(key, &nonce)
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key([0; 12]),
            Aad::from(&aad[..]),
            &mut out[HEADER + NONCE..],
        )
        .unwrap_or_else(|e| panic!("AES-256-GCM refused to seal {} bytes: {e}", body.len()));
    out.extend_from_slice(tag.as_ref());
    out
}

/// Pages sampled by [`compress`] before it compresses a whole object.
const PROBE_PAGES: usize = 16;
const PAGE: usize = 4096;

thread_local! {
    /// This thread's zstd context and its level (a context per call costs
    /// more than compressing a page).
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

/// `plain` compressed at `level`, if that saves at least 1/64 of it. An
/// object of more than [`PROBE_PAGES`] pages is first sampled: 16 pages
/// spread evenly over it are compressed together, and if they do not save
/// 1/64, the object is taken as incompressible without compressing it
/// all (memory of random or already compressed bytes, where trying cost
/// as much as sealing).
fn compress(plain: &[u8], level: i32) -> Option<Vec<u8>> {
    let pays = |len: usize, of: usize| len + of / MIN_SAVING_DIV < of;
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, z) = c.as_mut()?;
        let pages = plain.len() / PAGE;
        if pages > PROBE_PAGES {
            let step = pages / PROBE_PAGES;
            let mut sample = Vec::with_capacity(PROBE_PAGES * PAGE);
            for i in 0..PROBE_PAGES {
                sample.extend_from_slice(&plain[i * step * PAGE..(i * step + 1) * PAGE]);
            }
            if !pays(z.compress(&sample).ok()?.len(), sample.len()) {
                return None;
            }
        }
        z.compress(plain)
            .ok()
            .filter(|out| pays(out.len(), plain.len()))
    })
}

/// The AES-256-GCM key of the object whose nonce is `nonce` (used for
/// that object only).
fn object_key(key: &Key, nonce: &[u8; NONCE]) -> LessSafeKey {
    let mut material = [0u8; 32 + NONCE];
    material[..32].copy_from_slice(key.bytes());
    material[32..].copy_from_slice(nonce);
    let k = blake3::derive_key("stasis object seal v2 aes-256-gcm", &material);
    // A 32-byte key is what AES-256 takes: this cannot fail.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("AES-256-GCM takes a 32-byte key"))
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
    if flags & !(FLAG_ZSTD | FLAG_SEALED | FLAG_AES) != 0
        || flags & (FLAG_SEALED | FLAG_AES) == FLAG_AES
    {
        return Err(OpenError::Header);
    }
    // The plain (or compressed) body: opened into a buffer of its own
    // when sealed, else in place.
    let opened: Option<Vec<u8>> = if flags & FLAG_SEALED != 0 {
        let key = key.ok_or(OpenError::NeedKey)?;
        if stored.len() < HEADER + NONCE + TAG {
            return Err(OpenError::Auth);
        }
        let aad = aad(&stored[..HEADER], name);
        let nonce: &[u8; NONCE] = stored[HEADER..HEADER + NONCE]
            .try_into()
            .map_err(|_| OpenError::Auth)?;
        Some(if flags & FLAG_AES != 0 {
            let mut buf = stored[HEADER + NONCE..].to_vec();
            let plain_len = object_key(key, nonce)
                .open_in_place(
                    Nonce::assume_unique_for_key([0; 12]),
                    Aad::from(&aad[..]),
                    &mut buf,
                )
                .map_err(|_| OpenError::Auth)?
                .len();
            buf.truncate(plain_len);
            buf
        } else {
            XChaCha20Poly1305::new(key.bytes().into())
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: &stored[HEADER + NONCE..],
                        aad: &aad,
                    },
                )
                .map_err(|_| OpenError::Auth)?
        })
    } else {
        None
    };
    let body: &[u8] = opened.as_deref().unwrap_or(&stored[HEADER..]);
    if flags & FLAG_ZSTD != 0 {
        zstd::bulk::decompress(body, max).map_err(|e| OpenError::Zstd(e.to_string()))
    } else if body.len() > max {
        Err(OpenError::TooLarge(body.len(), max))
    } else {
        Ok(match opened {
            Some(v) => v,
            None => stored[HEADER..].to_vec(),
        })
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
                        ..Default::default()
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
                ..Default::default()
            },
        );
        assert!(s.len() < text.len() / 10, "text compresses: {}", s.len());
    }

    #[test]
    fn compression_samples_large_objects_first() {
        // Text with random bytes in the pages the probe reads: taken as
        // incompressible, stored raw.
        let mut text = b"checkpoint ".repeat(1 << 17)[..1 << 20].to_vec();
        let step = (text.len() / PAGE) / PROBE_PAGES;
        for i in 0..PROBE_PAGES {
            fill_random(&mut text[i * step * PAGE..(i * step + 1) * PAGE]);
        }
        assert_eq!(compress(&text, 1), None);
        // With one sampled page left as text, the sample pays: compressed.
        let mut one = text.clone();
        one[..PAGE].copy_from_slice(&b"checkpoint ".repeat(400)[..PAGE]);
        let c = compress(&one, 1).expect("compressible");
        assert!(c.len() < one.len() / 2, "{}", c.len());
        assert_eq!(zstd::bulk::decompress(&c, one.len()).unwrap(), one);
        // Small objects are tried whole; a level change takes a new context.
        let small = b"page ".repeat(1000);
        assert!(compress(&small, 3).is_some());
        assert!(compress(&small, 1).is_some());
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
                ..Default::default()
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
            ..Default::default()
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
        assert_eq!(s[8], FLAG_SEALED | FLAG_AES);
    }

    /// An object as stores written before AES-256-GCM sealed it
    /// (XChaCha20-Poly1305 under the store key, bit 1 alone).
    fn seal_xchacha(plain: &[u8], name: &str, key: &Key) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(FLAG_SEALED);
        out.extend_from_slice(&[0; 7]);
        let nonce = [7u8; NONCE];
        let aad = aad(&out[..HEADER], name);
        let body = XChaCha20Poly1305::new(key.bytes().into())
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .unwrap();
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn objects_sealed_with_xchacha20_poly1305_still_open() {
        let s = seal_xchacha(b"an older page", "c/9", &key(4));
        assert_eq!(
            open(&s, "c/9", Some(&key(4)), 100).unwrap(),
            b"an older page"
        );
        assert_eq!(open(&s, "c/9", Some(&key(5)), 100), Err(OpenError::Auth));
        assert_eq!(open(&s, "c/8", Some(&key(4)), 100), Err(OpenError::Auth));
        // Marked AES-256-GCM, it does not open: the flag is authenticated.
        let mut t = s.clone();
        t[8] |= FLAG_AES;
        assert_eq!(open(&t, "c/9", Some(&key(4)), 100), Err(OpenError::Auth));
        // The AES flag without the sealed one is not a valid header.
        let mut u = seal(b"plain", "c/9", &SealOptions::default());
        u[8] |= FLAG_AES;
        assert_eq!(open(&u, "c/9", None, 100), Err(OpenError::Header));
    }

    #[test]
    fn each_object_has_a_key_of_its_own() {
        let k = key(6);
        let (n1, n2) = ([1u8; NONCE], [2u8; NONCE]);
        let seal_with = |n: &[u8; NONCE]| {
            let mut b = b"same bytes".to_vec();
            let tag = object_key(&k, n)
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key([0; 12]),
                    Aad::empty(),
                    &mut b,
                )
                .unwrap();
            (b, tag.as_ref().to_vec())
        };
        assert_ne!(seal_with(&n1), seal_with(&n2));
        assert_eq!(seal_with(&n1), seal_with(&n1));
    }
}
