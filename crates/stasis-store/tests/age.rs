//! age recipients against a real S3 server (versitygw): each checkpoint
//! sealed under a data key of its own, wrapped to the recipients in its
//! commit record; a chain opens with an identity only, refuses a missing
//! or other identity and a changed wrapped key or record; the writer
//! cannot read back what it wrote once done; touch sets follow the
//! checkpoint's key; and what not sharing chunks between checkpoints
//! costs against a key file.

mod common;

use std::path::{Path, PathBuf};

use common::Server;
use stasis_store::seal::SealOptions;
use stasis_store::{generate_identity, Identities, Key, Recipients, S3Image, StoreError};

const MIB: usize = 1 << 20;

fn writer(s: &Server, prefix: &str, recipients: &[String]) -> S3Image {
    s.image(
        prefix,
        SealOptions {
            zstd: Some(1),
            recipients: Some(Recipients::from_args(recipients, &[]).unwrap().unwrap()),
            ..Default::default()
        },
    )
}

fn reader(s: &Server, prefix: &str, identity: Option<&Path>) -> S3Image {
    s.image(
        prefix,
        SealOptions {
            zstd: Some(1),
            identities: identity
                .map(|p| Identities::from_files(&[p.to_path_buf()]).unwrap().unwrap()),
            ..Default::default()
        },
    )
}

fn identity_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("# created by a test\n{secret}\n")).unwrap();
    p
}

/// 4 MiB of pseudo-random bytes (incompressible) of `version`: each
/// version changes the MiB `version - 1` only, and carries a marker.
fn content(version: u8) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v: Vec<u8> = (0..4 * MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    for b in &mut v[usize::from(version - 1) * MIB..usize::from(version) * MIB] {
        *b = b.wrapping_add(version);
    }
    let marker = format!("MARKER-AGE-v{version:03}");
    v[..marker.len()].copy_from_slice(marker.as_bytes());
    v
}

/// Uploads checkpoints 1, 2 over 1 and 3 over 2 (one file, `data`, of
/// [`content`]); returns the stored bytes.
fn chain_of_three(img: &S3Image) -> u64 {
    let mut stored = 0;
    for v in 1..=3u8 {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("data"), content(v)).unwrap();
        let parent = (v > 1).then(|| u32::from(v) - 1);
        stored += img
            .upload(src.path(), (u32::from(v), parent), vec![v; 100], &[])
            .unwrap()
            .stored_bytes;
    }
    stored
}

fn holds_marker(s: &Server, prefix: &str) -> bool {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&s.root.path().join("bkt").join(prefix), &mut files);
    assert!(!files.is_empty());
    files.iter().any(|f| {
        std::fs::read(f)
            .unwrap()
            .windows(11)
            .any(|w| w == b"MARKER-AGE-")
    })
}

#[test]
fn a_chain_under_recipients_opens_with_an_identity_only() {
    let s = Server::start();
    let keys = tempfile::tempdir().unwrap();
    let (secret, recipient) = generate_identity();
    let (other_secret, other_recipient) = generate_identity();
    let (stranger, _) = generate_identity();
    let id = identity_file(keys.path(), "id", &secret);
    let other = identity_file(keys.path(), "other", &other_secret);
    let wrong = identity_file(keys.path(), "wrong", &stranger);

    // The control: plainly stored, the marker is in the server's files.
    let plain = s.image("plain", SealOptions::default());
    chain_of_three(&plain);
    assert!(holds_marker(&s, "plain"), "the marker check cannot work");

    let w = writer(&s, "age", &[recipient.clone(), other_recipient]);
    let age_bytes = chain_of_three(&w);
    assert!(!holds_marker(&s, "age"), "plaintext in the age store");

    // Each checkpoint: a data key of its own, wrapped in its record.
    let r = reader(&s, "age", Some(&id));
    let records: Vec<_> = (1..=3).map(|n| r.record(n).unwrap()).collect();
    for rec in &records {
        let wk = rec.wrapped_key.as_deref().unwrap();
        assert!(wk.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"), "{wk}");
        assert!(rec.key_id.is_some() && !rec.mac.is_empty());
    }
    assert_ne!(records[0].key_id, records[1].key_id);
    assert_ne!(records[1].key_id, records[2].key_id);
    // No chunk is shared between the checkpoints (ids keyed by each key),
    // though MiB 3 is the same in all three.
    let ids = |i: usize| -> std::collections::HashSet<String> {
        records[i].chunk_ids().map(str::to_string).collect()
    };
    assert!(ids(0).is_disjoint(&ids(1)) && ids(1).is_disjoint(&ids(2)));

    // Against a key file: the same chain shares its unchanged chunks.
    let keyed = s.image(
        "keyed",
        SealOptions {
            zstd: Some(1),
            key: Some(Key::from_bytes([3; 32])),
            ..Default::default()
        },
    );
    let key_bytes = chain_of_three(&keyed);
    eprintln!(
        "chain of 3 checkpoints of 4 MiB (1 MiB changed each): key file {key_bytes} bytes stored, age recipients {age_bytes}"
    );
    assert!(key_bytes < 9 * MIB as u64, "{key_bytes}");
    assert!(age_bytes >= 12 * MIB as u64, "{age_bytes}");

    // The chain opens with either recipient's identity, byte for byte.
    for idf in [&id, &other] {
        let d = tempfile::tempdir().unwrap();
        let got = reader(&s, "age", Some(idf))
            .download_chain(Some(3), &d.path().join("image"))
            .unwrap();
        assert_eq!(got.chain, vec![3, 2, 1]);
        for v in 1..=3u8 {
            let cp = d.path().join(format!("image/checkpoints/{v:08}"));
            assert!(std::fs::read(cp.join("data")).unwrap() == content(v), "{v}");
            assert_eq!(
                std::fs::read(cp.join("manifest.bin")).unwrap(),
                vec![v; 100]
            );
        }
    }

    // Refused: no identity, another identity; and the writer itself once
    // its process is gone (a new image holds only the public key).
    let d = tempfile::tempdir().unwrap();
    let dest = d.path().join("image");
    let e = reader(&s, "age", None)
        .download_chain(Some(3), &dest)
        .unwrap_err();
    assert!(
        matches!(e, StoreError::NeedIdentity { checkpoint: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("--decrypt-identity"), "{e}");
    let e = reader(&s, "age", Some(&wrong)).record(2).unwrap_err();
    assert!(
        matches!(e, StoreError::WrongIdentity { checkpoint: 2, .. }),
        "{e}"
    );
    let e = writer(&s, "age", std::slice::from_ref(&recipient))
        .record(1)
        .unwrap_err();
    assert!(matches!(e, StoreError::NeedIdentity { .. }), "{e}");

    // A wrapped key changed in the store, or swapped for another
    // checkpoint's, or a record whose file list is changed: refused.
    let path = s.object("age", "commits/00000002");
    let original = std::fs::read(&path).unwrap();
    let mut rec: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let wk = rec["wrapped_key"].as_str().unwrap().to_string();
    let line = wk.lines().nth(2).unwrap().to_string();
    let mut flipped = line.clone().into_bytes();
    flipped[10] = if flipped[10] == b'A' { b'B' } else { b'A' };
    rec["wrapped_key"] = wk
        .replacen(&line, std::str::from_utf8(&flipped).unwrap(), 1)
        .into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let e = reader(&s, "age", Some(&id)).record(2).unwrap_err();
    // (A change in a recipient's stanza reads as another recipient's.)
    assert!(
        matches!(
            e,
            StoreError::Damaged { .. } | StoreError::WrongIdentity { .. }
        ),
        "{e}"
    );
    rec["wrapped_key"] = "-----BEGIN AGE ENCRYPTED FILE-----\nnot age\n".into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let e = reader(&s, "age", Some(&id)).record(2).unwrap_err();
    assert!(e.to_string().contains("wrapped key does not open"), "{e}");
    rec["wrapped_key"] = records[0].wrapped_key.clone().unwrap().into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let e = reader(&s, "age", Some(&id)).record(2).unwrap_err();
    assert!(e.to_string().contains("not the key it names"), "{e}");
    let mut rec: serde_json::Value = serde_json::from_slice(&original).unwrap();
    rec["files"][0]["size"] = 101.into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let e = reader(&s, "age", Some(&id)).record(2).unwrap_err();
    assert!(
        e.to_string().contains("authentication code does not match")
            || e.to_string().contains("chunks"),
        "{e}"
    );
    std::fs::write(&path, &original).unwrap();
    reader(&s, "age", Some(&id)).record(2).unwrap();
}

#[test]
fn touch_sets_follow_the_checkpoint_key() {
    let s = Server::start();
    let keys = tempfile::tempdir().unwrap();
    let (secret, recipient) = generate_identity();
    let id = identity_file(keys.path(), "id", &secret);
    let w = writer(&s, "t", std::slice::from_ref(&recipient));
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("data"), b"x".repeat(5000)).unwrap();
    w.upload(src.path(), (1, None), b"m".to_vec(), &[]).unwrap();
    // The dumping host stores the touch set of its own checkpoint (it
    // made the data key) without an identity...
    let set = b"MARKER-AGE-touch set bytes".repeat(10);
    w.put_touch(1, "touch-window", &set).unwrap();
    // ...but a new process of it cannot (it holds the public key only).
    let e = writer(&s, "t", &[recipient])
        .put_touch(1, "touch-faults", b"f")
        .unwrap_err();
    assert!(matches!(e, StoreError::NeedIdentity { .. }), "{e}");
    // A reader with the identity stores one and reads both.
    let r = reader(&s, "t", Some(&id));
    r.put_touch(1, "touch-faults", b"MARKER-AGE-faults")
        .unwrap();
    assert!(!holds_marker(&s, "t"), "plaintext touch set in the store");
    let d = tempfile::tempdir().unwrap();
    r.download_chain(Some(1), &d.path().join("image")).unwrap();
    let cp = d.path().join("image/checkpoints/00000001");
    assert_eq!(std::fs::read(cp.join("touch-window")).unwrap(), set);
    assert_eq!(
        std::fs::read(cp.join("touch-faults")).unwrap(),
        b"MARKER-AGE-faults"
    );
}
