//! age recipients: a store written with `--encrypt-recipient` (X25519,
//! `age1...`) seals each checkpoint under a fresh random data key of its
//! own, and keeps that key in the commit record wrapped to the recipients
//! as an armored age file (`wrapped_key`). The host that dumps holds only
//! public keys: it cannot read a checkpoint once its dump is over. A
//! reader unwraps each record's data key with an identity
//! (`--decrypt-identity F`, an age identity file of
//! `AGE-SECRET-KEY-1...` lines). The age crate does the X25519 and the
//! file format.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use age::armor::{ArmoredReader, ArmoredWriter, Format};
use age::x25519;

use crate::record::Record;
use crate::s3image::Uploaded;
use crate::{Key, S3Image, StoreError};

/// The recipients each checkpoint's data key is wrapped to.
#[derive(Clone)]
pub struct Recipients {
    list: Vec<x25519::Recipient>,
}

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l: Vec<String> = self.list.iter().map(ToString::to_string).collect();
        write!(f, "Recipients({})", l.join(", "))
    }
}

impl Recipients {
    /// The recipients of `--encrypt-recipient` (each `age1...`) and of
    /// `--encrypt-recipients-file` (one a line, `#` comments, blank lines
    /// ignored); `None` if there are none at all.
    pub fn from_args(
        given: &[String],
        files: &[PathBuf],
    ) -> Result<Option<Recipients>, StoreError> {
        let mut list = Vec::new();
        for r in given {
            list.push(
                parse_recipient(r.trim()).map_err(|reason| StoreError::BadRecipient {
                    origin: "--encrypt-recipient".into(),
                    reason,
                })?,
            );
        }
        for path in files {
            let bad = |reason: String| StoreError::BadRecipient {
                origin: format!("recipients file {}", path.display()),
                reason,
            };
            let text =
                std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
            let before = list.len();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                list.push(parse_recipient(line).map_err(|r| bad(format!("line {}: {r}", i + 1)))?);
            }
            if list.len() == before {
                return Err(bad("it names no recipient".into()));
            }
        }
        Ok((!list.is_empty()).then_some(Recipients { list }))
    }

    /// `key` encrypted to every recipient: an armored age file.
    pub fn wrap(&self, key: &Key) -> Result<String, StoreError> {
        let failed = |reason: String| StoreError::BadRecipient {
            origin: "--encrypt-recipient".into(),
            reason: format!("wrapping a checkpoint's key failed: {reason}"),
        };
        let enc =
            age::Encryptor::with_recipients(self.list.iter().map(|r| r as &dyn age::Recipient))
                .map_err(|e| failed(e.to_string()))?;
        let mut out = Vec::new();
        let armored = ArmoredWriter::wrap_output(&mut out, Format::AsciiArmor)
            .map_err(|e| failed(e.to_string()))?;
        let mut w = enc
            .wrap_output(armored)
            .map_err(|e| failed(e.to_string()))?;
        w.write_all(key.bytes())
            .and_then(|()| w.finish())
            .and_then(|a| a.finish())
            .map_err(|e| failed(e.to_string()))?;
        String::from_utf8(out).map_err(|e| failed(e.to_string()))
    }
}

fn parse_recipient(s: &str) -> Result<x25519::Recipient, String> {
    if s.starts_with("ssh-") {
        return Err(format!(
            "{s:.20}...: ssh recipients are not supported, give an age X25519 recipient (age1...)"
        ));
    }
    x25519::Recipient::from_str(s)
        .map_err(|e| format!("{s:?} is not an age recipient (age1...): {e}"))
}

/// The identities of `--decrypt-identity`.
#[derive(Clone)]
pub struct Identities {
    list: Arc<Vec<Box<dyn age::Identity + Send + Sync>>>,
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identities({:?})", self.files)
    }
}

/// Why a wrapped key did not open.
#[derive(Debug)]
pub enum UnwrapError {
    /// None of the identities is a recipient of it.
    NotARecipient,
    /// It is not an age file of a 32-byte key (changed in the store).
    Damaged(String),
}

impl Identities {
    /// Reads the identity files; `None` if none is given.
    pub fn from_files(files: &[PathBuf]) -> Result<Option<Identities>, StoreError> {
        let mut list = Vec::new();
        for path in files {
            list.extend(read_identity_file(path)?);
        }
        Ok((!files.is_empty()).then(|| Identities {
            list: Arc::new(list),
            files: files.to_vec(),
        }))
    }

    /// The data key wrapped in `wrapped` (an armored age file).
    pub fn unwrap(&self, wrapped: &str) -> Result<Key, UnwrapError> {
        let dec = age::Decryptor::new_buffered(ArmoredReader::new(wrapped.as_bytes()))
            .map_err(|e| UnwrapError::Damaged(e.to_string()))?;
        let mut r = dec
            .decrypt(self.list.iter().map(|i| i.as_ref() as &dyn age::Identity))
            .map_err(|e| match e {
                age::DecryptError::NoMatchingKeys => UnwrapError::NotARecipient,
                e => UnwrapError::Damaged(e.to_string()),
            })?;
        let mut plain = Vec::new();
        r.read_to_end(&mut plain)
            .map_err(|e| UnwrapError::Damaged(e.to_string()))?;
        let bytes: [u8; 32] = plain.try_into().map_err(|v: Vec<u8>| {
            UnwrapError::Damaged(format!("{} bytes, not a 32-byte key", v.len()))
        })?;
        Ok(Key::from_bytes(bytes))
    }
}

fn read_identity_file(
    path: &Path,
) -> Result<Vec<Box<dyn age::Identity + Send + Sync>>, StoreError> {
    let bad = |reason: String| StoreError::BadIdentity {
        path: path.to_path_buf(),
        reason,
    };
    let file = age::IdentityFile::from_file(path.to_string_lossy().into_owned())
        .map_err(|e| bad(e.to_string()))?;
    let list = file.into_identities().map_err(|e| bad(e.to_string()))?;
    if list.is_empty() {
        return Err(bad("it holds no identity".into()));
    }
    Ok(list)
}

/// A new X25519 identity: (the identity file's line `AGE-SECRET-KEY-1...`,
/// its recipient `age1...`), for tests and tools.
pub fn generate_identity() -> (String, String) {
    use age::secrecy::ExposeSecret;
    let id = x25519::Identity::generate();
    (
        id.to_string().expose_secret().to_string(),
        id.to_public().to_string(),
    )
}

/// A new random data key for one checkpoint.
pub(crate) fn new_data_key() -> Key {
    let mut k = [0u8; 32];
    if let Err(e) = getrandom::fill(&mut k) {
        panic!("no random numbers for a checkpoint's data key: {e}");
    }
    Key::from_bytes(k)
}

/// Data keys of checkpoints written for age recipients, by their wrapped
/// form: those made here (so that a dumping host, which holds no
/// identity, can still seal the touch set of its own checkpoint) and
/// those unwrapped (once per record). Shared by the clones of one
/// `SealOptions` (a store, its replicas, the copies a command opens).
#[derive(Clone, Default)]
pub struct DataKeys(Arc<Mutex<HashMap<String, Key>>>);

impl std::fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|m| m.len()).unwrap_or(0);
        write!(f, "DataKeys({n})")
    }
}

impl DataKeys {
    fn get(&self, wrapped: &str) -> Option<Key> {
        self.0.lock().ok()?.get(wrapped).cloned()
    }

    fn insert(&self, wrapped: &str, key: &Key) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(wrapped.to_string(), key.clone());
        }
    }
}

/// Checkpoints under age recipients in a store: the key of each record,
/// new checkpoints' keys, and records with wrapped keys.
impl S3Image {
    /// Checks record `r` (decoded) that has a wrapped key: its data key
    /// unwraps, is the key `key_id` names, and its MAC matches.
    pub(crate) fn check_wrapped(&self, r: Record) -> Result<Record, StoreError> {
        let n = r.checkpoint;
        let w = r.wrapped_key.as_deref().unwrap_or_default();
        let k = self.unwrap_key(n, w)?;
        let damaged = |reason: &str| StoreError::Damaged {
            url: self.url.clone(),
            key: self.commit_key(n),
            reason: reason.into(),
        };
        if r.key_id.as_deref() != Some(k.id().as_str()) {
            return Err(damaged("its wrapped key is not the key it names"));
        }
        if !r.verify(&k) {
            return Err(damaged("its authentication code does not match"));
        }
        Ok(r)
    }

    /// The commit record of checkpoint `n` as stored: decoded, not checked
    /// against a key or identity (for a writer that compares it with a
    /// record of its own).
    pub fn record_as_stored(&self, n: u32) -> Result<Record, StoreError> {
        let key = self.commit_key(n);
        let bytes = self.bucket.get(&key)?;
        Record::decode(&bytes, n).map_err(|reason| StoreError::BadRecord {
            url: self.url.clone(),
            key,
            reason,
        })
    }

    /// The data key wrapped as `wrapped` in the record of checkpoint `n`.
    pub(crate) fn unwrap_key(&self, n: u32, wrapped: &str) -> Result<Key, StoreError> {
        if let Some(k) = self.seal.data_keys.get(wrapped) {
            return Ok(k);
        }
        let Some(ids) = &self.seal.identities else {
            return Err(StoreError::NeedIdentity {
                url: self.url.clone(),
                checkpoint: n,
            });
        };
        let k = ids.unwrap(wrapped).map_err(|e| match e {
            UnwrapError::NotARecipient => StoreError::WrongIdentity {
                url: self.url.clone(),
                files: ids
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                checkpoint: n,
            },
            UnwrapError::Damaged(reason) => StoreError::Damaged {
                url: self.url.clone(),
                key: self.commit_key(n),
                reason: format!("its wrapped key does not open: {reason}"),
            },
        })?;
        self.seal.data_keys.insert(wrapped, &k);
        Ok(k)
    }

    /// The key the chunks of record `r` (as [`record`](Self::record)
    /// returned it) are sealed with: its data key, the store's key, or
    /// none.
    pub(crate) fn record_key(&self, r: &Record) -> Result<Option<Key>, StoreError> {
        match (&r.wrapped_key, &r.key_id) {
            (Some(w), _) => self.unwrap_key(r.checkpoint, w).map(Some),
            (None, Some(_)) => Ok(self.seal.key.clone()),
            (None, None) => Ok(None),
        }
    }

    /// The key of a new checkpoint, and its wrapped form: a new data key
    /// wrapped to the recipients, or the store's key, or none.
    pub(crate) fn new_checkpoint_key(&self) -> Result<(Option<Key>, Option<String>), StoreError> {
        let Some(rs) = &self.seal.recipients else {
            return Ok((self.seal.key.clone(), None));
        };
        let k = new_data_key();
        let w = rs.wrap(&k)?;
        self.seal.data_keys.insert(&w, &k);
        Ok((Some(k), Some(w)))
    }

    /// [`upload_data`](Self::upload_data) of a checkpoint that replaces
    /// `like` (gc's merge): under the same data key as `like` if it has a
    /// wrapped one (so the merge needs an identity only, no recipients),
    /// else as a new checkpoint; into the chunks `like`'s record used
    /// (shared or the store's own).
    pub fn upload_data_replacing(
        &self,
        like: &Record,
        src: &Path,
        checkpoint: (u32, Option<u32>),
        manifest: Vec<u8>,
    ) -> Result<(Record, Uploaded), StoreError> {
        let ck = match &like.wrapped_key {
            Some(w) => (self.record_key(like)?, Some(w.clone())),
            None => self.new_checkpoint_key()?,
        };
        let up = like.chunks_up.unwrap_or(0);
        self.upload_data_with(src, checkpoint, manifest, &[], (false, ck, up))
    }

    /// The key `encode` is to MAC a record with (none for a wrapped one:
    /// it was MACed when made).
    pub(crate) fn record_mac_key(&self, r: &Record) -> Option<&Key> {
        match r.wrapped_key {
            Some(_) => None,
            None => self.seal.key.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identities(lines: &[&str]) -> (tempfile::TempDir, Identities) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("id.txt");
        std::fs::write(&p, format!("# created: now\n{}\n", lines.join("\n"))).unwrap();
        let ids = Identities::from_files(&[p]).unwrap().unwrap();
        (dir, ids)
    }

    #[test]
    fn keys_wrap_to_every_recipient_and_only_them() {
        let (s1, r1) = generate_identity();
        let (s2, r2) = generate_identity();
        let (s3, _) = generate_identity();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("recipients");
        std::fs::write(&file, format!("# team\n\n{r2}\n")).unwrap();
        let rs = Recipients::from_args(&[r1], &[file]).unwrap().unwrap();
        let key = new_data_key();
        let wrapped = rs.wrap(&key).unwrap();
        assert!(wrapped.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"));
        for s in [&s1, &s2] {
            let (_d, ids) = identities(&[s]);
            assert_eq!(ids.unwrap(&wrapped).unwrap().id(), key.id());
        }
        let (_d, other) = identities(&[&s3]);
        assert!(matches!(
            other.unwrap(&wrapped),
            Err(UnwrapError::NotARecipient)
        ));
        // Two identities, one of them a recipient.
        let (_d, both) = identities(&[&s3, &s1]);
        assert_eq!(both.unwrap(&wrapped).unwrap().id(), key.id());
        // A changed wrapped key does not open.
        let body_line = wrapped.lines().nth(3).unwrap().to_string();
        let mut flipped: Vec<u8> = body_line.clone().into_bytes();
        flipped[5] = if flipped[5] == b'A' { b'B' } else { b'A' };
        let tampered = wrapped.replacen(&body_line, std::str::from_utf8(&flipped).unwrap(), 1);
        let (_d, ids) = identities(&[&s1]);
        // (A change in the recipient's stanza reads as another
        // recipient's: age cannot tell them apart.)
        assert!(matches!(
            ids.unwrap(&tampered),
            Err(UnwrapError::Damaged(_) | UnwrapError::NotARecipient)
        ));
        assert!(matches!(
            ids.unwrap("not an age file"),
            Err(UnwrapError::Damaged(_))
        ));
        // Each wrap is new (fresh ephemeral keys).
        assert_ne!(rs.wrap(&key).unwrap(), wrapped);
    }

    #[test]
    fn bad_recipients_and_identities_are_refused() {
        assert!(Recipients::from_args(&[], &[]).unwrap().is_none());
        let e = Recipients::from_args(&["age1nope".into()], &[]).unwrap_err();
        assert!(e.to_string().contains("not an age recipient"), "{e}");
        let e = Recipients::from_args(&["ssh-ed25519 AAAA".into()], &[]).unwrap_err();
        assert!(e.to_string().contains("ssh recipients"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "# nobody\n").unwrap();
        let e = Recipients::from_args(&[], std::slice::from_ref(&empty)).unwrap_err();
        assert!(e.to_string().contains("names no recipient"), "{e}");
        assert!(Identities::from_files(&[empty]).is_err());
        let junk = dir.path().join("junk");
        std::fs::write(&junk, "AGE-SECRET-KEY-1NOTAKEY\n").unwrap();
        assert!(Identities::from_files(&[junk]).is_err());
        assert!(Identities::from_files(&[dir.path().join("missing")]).is_err());
    }
}
