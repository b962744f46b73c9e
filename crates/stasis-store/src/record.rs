//! The commit record of a checkpoint in an object store: the object whose
//! conditional creation commits it (format in docs/storage.md).

use serde::{Deserialize, Serialize};

use crate::Key;

/// Version of the record format.
pub const RECORD_FORMAT: u32 = 1;
/// Largest commit record read.
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// Plain bytes per stored part of a file.
pub const PART_BYTES: u64 = 8 << 20;

/// `commits/NNNNNNNN`: JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub checkpoint: u32,
    pub parent: Option<u32>,
    /// Key of the upload's data directory, relative to the prefix
    /// (`data/NNNNNNNN-RANDOM/`).
    pub data: String,
    pub created_unix: u64,
    /// `Key::id` of the key the objects are sealed with; `None`: not encrypted.
    pub key_id: Option<String>,
    pub files: Vec<FileRecord>,
    /// With a key: BLAKE3 keyed hash of this record with `mac` empty (hex).
    #[serde(default)]
    pub mac: String,
}

/// One file of the checkpoint directory, stored as parts of
/// [`PART_BYTES`] plain bytes (`NAME.00000`, `NAME.00001`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub name: String,
    /// Plain size of the whole file.
    pub size: u64,
    pub parts: Vec<PartRecord>,
}

/// One stored part: its stored size and BLAKE3 hash (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    pub stored: u64,
    pub blake3: String,
}

impl FileRecord {
    /// Object key of part `i`, relative to the prefix.
    pub fn part_key(&self, data: &str, i: usize) -> String {
        format!("{data}{}.{i:05}", self.name)
    }
}

impl Record {
    /// Stored bytes of every part.
    pub fn stored_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| &f.parts)
            .map(|p| p.stored)
            .sum()
    }

    fn mac_of(&self, key: &Key) -> String {
        let mut r = self.clone();
        r.mac = String::new();
        let bytes = serde_json::to_vec(&r).unwrap_or_default();
        hex::encode(blake3::keyed_hash(key.bytes(), &bytes).as_bytes())
    }

    /// Sets the MAC (with a key) and encodes.
    pub fn encode(&mut self, key: Option<&Key>) -> Vec<u8> {
        self.mac = key.map(|k| self.mac_of(k)).unwrap_or_default();
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Decodes; `Err` says why.
    pub fn decode(bytes: &[u8], checkpoint: u32) -> Result<Record, String> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(format!("{} bytes, more than the limit", bytes.len()));
        }
        let r: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if r.format == 0 || r.format > RECORD_FORMAT {
            return Err(format!(
                "format {} (this stasis reads up to {RECORD_FORMAT}: upgrade it)",
                r.format
            ));
        }
        if r.checkpoint != checkpoint {
            return Err(format!("it describes checkpoint {}", r.checkpoint));
        }
        if r.parent.is_some_and(|p| p >= checkpoint) {
            return Err("its parent is not older than it".into());
        }
        let plain_data = r.data.starts_with("data/")
            && r.data.ends_with('/')
            && !r.data.contains("..")
            && r.data.matches('/').count() == 2;
        if !plain_data {
            return Err(format!("bad data directory {:?}", r.data));
        }
        for f in &r.files {
            if !stasis_image::is_plain_name(&f.name) {
                return Err(format!("bad file name {:?}", f.name));
            }
            if f.parts.len() as u64 != f.size.div_ceil(PART_BYTES) {
                return Err(format!(
                    "{} has {} parts for {} bytes",
                    f.name,
                    f.parts.len(),
                    f.size
                ));
            }
        }
        Ok(r)
    }

    /// Checks the MAC with `key`.
    pub fn verify(&self, key: &Key) -> bool {
        !self.mac.is_empty() && self.mac_of(key) == self.mac
    }
}
