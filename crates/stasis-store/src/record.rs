//! The commit record of a checkpoint in an object store: the object whose
//! conditional creation commits it, listing the chunks of its files
//! (format in docs/storage.md).

use serde::{Deserialize, Serialize};

use crate::Key;

/// Version of the record format: 1, chunks of [`CHUNK_BYTES`]; 2, a
/// file may list the lengths of its chunks (`lens`); 3, the chunks are in
/// a store's ancestor (`chunks_up`). A record is written in the oldest
/// format that holds it, so older readers still read what they can.
pub const RECORD_FORMAT: u32 = 3;
/// Most levels a record's chunks may be above its store (`chunks_up`).
pub const MAX_CHUNKS_UP: u32 = 64;
/// Largest commit record read.
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// Plain bytes per chunk of a file (the last one of a file is shorter).
pub const CHUNK_BYTES: u64 = 1 << 20;
/// The id of a chunk of zeros: nothing is stored for it.
pub const ZERO_CHUNK: &str = "0";

/// `commits/NNNNNNNN`: JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub checkpoint: u32,
    pub parent: Option<u32>,
    pub created_unix: u64,
    /// `Key::id` of the key the chunks are sealed with; `None`: not encrypted.
    pub key_id: Option<String>,
    /// With age recipients: the checkpoint's data key (`key_id` names it)
    /// encrypted to them, an armored age file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<String>,
    pub files: Vec<FileRecord>,
    /// Format 3: the chunks are in `chunks/` of the prefix this many
    /// levels above the store's (shared by every store below it: the trees
    /// of a cluster agent's store); absent: in the store's own `chunks/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks_up: Option<u32>,
    /// With a key: BLAKE3 keyed hash of this record with `mac` empty (hex).
    #[serde(default)]
    pub mac: String,
}

/// One file of the checkpoint directory, as the ids of its chunks of
/// [`CHUNK_BYTES`] plain bytes (`chunks/ID` in the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub name: String,
    /// Plain size of the whole file.
    pub size: u64,
    pub chunks: Vec<String>,
    /// Plain length of each chunk (format 2); empty: every chunk is
    /// [`CHUNK_BYTES`] but the last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lens: Vec<u64>,
}

impl FileRecord {
    /// `(offset, length)` of each chunk, in order.
    pub fn spans(&self) -> Vec<(u64, u64)> {
        if self.lens.is_empty() {
            return (0..self.chunks.len() as u64)
                .map(|i| {
                    let off = i * CHUNK_BYTES;
                    (off, CHUNK_BYTES.min(self.size.saturating_sub(off)))
                })
                .collect();
        }
        let mut off = 0;
        self.lens
            .iter()
            .map(|&l| {
                let s = (off, l);
                off += l;
                s
            })
            .collect()
    }

    fn check(&self) -> Result<(), String> {
        if self.lens.is_empty() {
            if self.chunks.len() as u64 != self.size.div_ceil(CHUNK_BYTES) {
                return Err(format!(
                    "{} has {} chunks for {} bytes",
                    self.name,
                    self.chunks.len(),
                    self.size
                ));
            }
            return Ok(());
        }
        let sum = self.lens.iter().try_fold(0u64, |a, &l| {
            (l > 0 && l <= CHUNK_BYTES)
                .then(|| a.checked_add(l))
                .flatten()
        });
        if self.lens.len() != self.chunks.len() || sum != Some(self.size) {
            return Err(format!(
                "{} has {} chunks of {} lengths that do not add up to {} bytes",
                self.name,
                self.chunks.len(),
                self.lens.len(),
                self.size
            ));
        }
        Ok(())
    }
}

/// Whether `id` is a chunk id: [`ZERO_CHUNK`] or 64 lowercase hex digits.
pub fn valid_chunk_id(id: &str) -> bool {
    id == ZERO_CHUNK
        || (id.len() == 64
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

impl Record {
    /// Every chunk id the record refers to (zero chunks excluded).
    pub fn chunk_ids(&self) -> impl Iterator<Item = &str> {
        self.files
            .iter()
            .flat_map(|f| &f.chunks)
            .map(String::as_str)
            .filter(|c| *c != ZERO_CHUNK)
    }

    fn mac_of(&self, key: &Key) -> String {
        let mut r = self.clone();
        r.mac = String::new();
        let bytes = serde_json::to_vec(&r).unwrap_or_default();
        hex::encode(blake3::keyed_hash(key.bytes(), &bytes).as_bytes())
    }

    /// Sets the MAC (with a key) and encodes. A record with a wrapped key
    /// keeps the MAC set when it was made (by whoever held its data key)
    /// when `key` is `None`.
    pub fn encode(&mut self, key: Option<&Key>) -> Vec<u8> {
        if self.chunks_up == Some(0) {
            self.chunks_up = None;
        }
        self.format = if self.chunks_up.is_some() {
            3
        } else if self.files.iter().any(|f| !f.lens.is_empty()) {
            2
        } else {
            1
        };
        match key {
            Some(k) => self.mac = self.mac_of(k),
            None if self.wrapped_key.is_some() => {}
            None => self.mac = String::new(),
        }
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
        if r.wrapped_key.is_some() && r.key_id.is_none() {
            return Err("it has a wrapped key but no key id".into());
        }
        if r.parent.is_some_and(|p| p >= checkpoint) {
            return Err("its parent is not older than it".into());
        }
        if r.chunks_up.is_some_and(|u| u == 0 || u > MAX_CHUNKS_UP) {
            return Err(format!("bad chunks_up {:?}", r.chunks_up));
        }
        for f in &r.files {
            if !stasis_image::is_plain_name(&f.name) {
                return Err(format!("bad file name {:?}", f.name));
            }
            f.check()?;
            if let Some(c) = f.chunks.iter().find(|c| !valid_chunk_id(c)) {
                return Err(format!("bad chunk id {c:?}"));
            }
        }
        Ok(r)
    }

    /// Checks the MAC with `key`.
    pub fn verify(&self, key: &Key) -> bool {
        !self.mac.is_empty() && self.mac_of(key) == self.mac
    }
}
