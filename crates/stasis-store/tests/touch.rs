//! Touch sets in an object store (`touch/NNNNNNNN/NAME`) against a real
//! S3 server (versitygw): written only for a committed checkpoint, read
//! with its chain, sealed under a key and bound to their name, ignored
//! when they do not open, deleted once their checkpoint is gone.

mod common;

use std::path::PathBuf;

use common::Server;
use stasis_store::seal::SealOptions;
use stasis_store::{Key, S3Image, StoreError};

/// The store at `s3://bkt/PREFIX`, zstd, sealed with `key` if given.
fn image(s: &Server, prefix: &str, key: Option<Key>) -> S3Image {
    s.image(
        prefix,
        SealOptions {
            zstd: Some(1),
            key,
            ..Default::default()
        },
    )
}

/// Commits checkpoints 1 and 2 (2 over 1), each a directory of one file.
fn two_checkpoints(img: &S3Image) {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("one"), b"some bytes").unwrap();
    img.upload(src.path(), (1, None), b"m1".to_vec(), &[])
        .unwrap();
    img.upload(src.path(), (2, Some(1)), b"m2".to_vec(), &[])
        .unwrap();
}

/// Checkpoint `n` and its chain, downloaded: its directory.
fn fetched(img: &S3Image, n: u32) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    img.download_chain(Some(n), &d.path().join("image"))
        .unwrap();
    let cp = d.path().join("image/checkpoints").join(format!("{n:08}"));
    (d, cp)
}

#[test]
fn touch_sets_go_with_committed_checkpoints_only() {
    let s = Server::start();
    let img = image(&s, "plain", None);
    two_checkpoints(&img);
    let window = b"the bytes of a touch-window file".to_vec();
    img.put_touch(1, "touch-window", &window).unwrap();
    img.put_touch(2, "touch-faults", b"faults of 2").unwrap();
    // Not for a checkpoint that is not committed, nor under another name.
    assert!(matches!(
        img.put_touch(3, "touch-window", b"x"),
        Err(StoreError::NoSuchCheckpoint { checkpoint: 3, .. })
    ));
    assert!(img.put_touch(1, "manifest.bin", b"x").is_err());
    // Read with the chain, each into its checkpoint's directory.
    let (_d, cp2) = fetched(&img, 2);
    assert_eq!(
        std::fs::read(cp2.join("touch-faults")).unwrap(),
        b"faults of 2"
    );
    assert!(!cp2.join("touch-window").exists());
    assert_eq!(
        std::fs::read(cp2.with_file_name("00000001").join("touch-window")).unwrap(),
        window
    );
    let listed = img.touch_files().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    // Checkpoint 1 gone: its touch set goes, 2's stays.
    img.delete(1).unwrap();
    assert_eq!(img.sweep_touch().unwrap(), 1);
    assert!(!s.object("plain", "touch/00000001/touch-window").exists());
    assert!(s.object("plain", "touch/00000002/touch-faults").exists());
    assert_eq!(img.sweep_touch().unwrap(), 0);
}

#[test]
fn sealed_touch_sets_open_only_under_their_own_name() {
    let s = Server::start();
    let img = image(&s, "sealed", Some(Key::from_bytes([7; 32])));
    two_checkpoints(&img);
    let plain = b"STASISTS and the pages a process wrote".to_vec();
    img.put_touch(1, "touch-window", &plain).unwrap();
    img.put_touch(2, "touch-window", b"window of 2").unwrap();
    let one = s.object("sealed", "touch/00000001/touch-window");
    let two = s.object("sealed", "touch/00000002/touch-window");
    let stored = std::fs::read(&one).unwrap();
    assert!(
        !stored.windows(8).any(|w| w == b"STASISTS"),
        "stored in the clear"
    );
    let (_d, cp) = fetched(&img, 1);
    assert_eq!(std::fs::read(cp.join("touch-window")).unwrap(), plain);
    // 1's object copied over 2's: it does not open as 2's, and 2 is read
    // without a touch set (the checkpoint itself is whole).
    std::fs::copy(&one, &two).unwrap();
    let (_d, cp) = fetched(&img, 2);
    assert!(cp.join("one").exists());
    assert!(!cp.join("touch-window").exists());
    // An unsealed object in an encrypted store is not taken either.
    let mut unsealed = b"STSOBJ01".to_vec();
    unsealed.extend_from_slice(&[0; 8]);
    unsealed.extend_from_slice(b"planted");
    std::fs::write(&two, &unsealed).unwrap();
    let (_d, cp) = fetched(&img, 2);
    assert!(!cp.join("touch-window").exists());
    // Under another key, the checkpoint is refused (not only its touch set).
    let other = image(&s, "sealed", Some(Key::from_bytes([8; 32])));
    assert!(matches!(
        other.put_touch(1, "touch-window", b"x"),
        Err(StoreError::WrongKey { .. })
    ));
}
