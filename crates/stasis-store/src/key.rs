//! The encryption key: `--encrypt-key-file F`, 32 bytes as raw bytes, 64
//! hex digits or base64 text (surrounding whitespace ignored).

use std::path::{Path, PathBuf};

use base64::Engine;

use crate::StoreError;

/// A 32-byte key and the file it came from (for messages).
#[derive(Clone)]
pub struct Key {
    bytes: [u8; 32],
    pub file: PathBuf,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.file.display())
    }
}

impl Key {
    /// Reads a key file.
    pub fn from_file(path: &Path) -> Result<Key, StoreError> {
        let bad = |reason: String| StoreError::BadKey {
            path: path.to_path_buf(),
            reason,
        };
        let data = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let bytes = parse_key(&data).map_err(bad)?;
        Ok(Key {
            bytes,
            file: path.to_path_buf(),
        })
    }

    /// A key from bytes (tests, benchmarks).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key {
            bytes,
            file: PathBuf::from("<memory>"),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// A public identifier of the key (a keyed hash of a constant): tells
    /// a wrong key from a tampered object without revealing the key.
    pub fn id(&self) -> String {
        hex::encode(&blake3::keyed_hash(&self.bytes, b"stasis key id v1").as_bytes()[..16])
    }
}

/// Parses the content of a key file.
pub fn parse_key(data: &[u8]) -> Result<[u8; 32], String> {
    if data.len() == 32 && std::str::from_utf8(data).map_or(true, |s| s.trim().len() != 32) {
        // Raw bytes (a 32-character text line is taken as text below).
        return Ok(data.try_into().unwrap_or([0; 32]));
    }
    let text = std::str::from_utf8(data)
        .map_err(|_| format!("{} bytes that are neither a raw key nor text", data.len()))?
        .trim();
    if text.len() == 64 {
        if let Ok(v) = hex::decode(text) {
            return v.try_into().map_err(|_| "bad hex length".to_string());
        }
    }
    let v = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| {
            format!(
                "{} characters that are neither 64 hex digits nor base64",
                text.len()
            )
        })?;
    let n = v.len();
    v.try_into()
        .map_err(|_| format!("base64 text of {n} bytes, not 32"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_hex_and_base64_keys() {
        let k: [u8; 32] = std::array::from_fn(|i| u8::try_from(i * 7 + 1).unwrap());
        assert_eq!(parse_key(&k).unwrap(), k);
        assert_eq!(
            parse_key(format!("{}\n", hex::encode(k)).as_bytes()).unwrap(),
            k
        );
        let b = base64::engine::general_purpose::STANDARD.encode(k);
        assert_eq!(parse_key(format!(" {b}\n").as_bytes()).unwrap(), k);
        assert!(parse_key(b"short").is_err());
        assert!(parse_key(&[0u8; 31]).is_err());
        assert!(parse_key(hex::encode([1u8; 16]).as_bytes()).is_err());
    }
}
