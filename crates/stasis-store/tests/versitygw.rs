//! The object-store layer against a real S3 server (versitygw, installed
//! by scripts/setup.sh): parts round-trip byte for byte, a commit is
//! conditional, an uncommitted upload is invisible (and an orphan for gc),
//! records and objects are authenticated under a key.

mod common;

use std::io::Read;

use common::Server;
use stasis_store::record::CHUNK_BYTES;
use stasis_store::seal::SealOptions;
use stasis_store::{Key, StoreError};

/// A checkpoint directory: an empty file, a one-byte file, a compressible
/// one of 17 chunks (16 of them equal), an incompressible one of 3 chunks
/// and 2 MiB + 1 of zeros.
fn sample_dir() -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let d = tempfile::tempdir().unwrap();
    let mut rnd = vec![0u8; 3 << 20];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut rnd)
        .unwrap();
    let text: Vec<u8> = (0..(16 * CHUNK_BYTES + 12345))
        .map(|i| b"abcdefgh"[usize::try_from(i % 8).unwrap()] ^ u8::from(i % 4096 == 0))
        .collect();
    let files = vec![
        ("empty".to_string(), Vec::new()),
        ("one".to_string(), vec![42u8]),
        ("pages-1.pack".to_string(), text),
        ("pages-2.pack".to_string(), rnd),
        ("zeros".to_string(), vec![0u8; 2 << 20 | 1]),
    ];
    for (n, b) in &files {
        std::fs::write(d.path().join(n), b).unwrap();
    }
    (d, files)
}

fn zstd() -> SealOptions {
    SealOptions {
        zstd: Some(1),
        key: None,
        ..Default::default()
    }
}

#[test]
fn files_round_trip_through_parts() {
    let srv = Server::start();
    let img = srv.image("rt", zstd());
    let (src, files) = sample_dir();
    let up = img
        .upload(src.path(), (1, None), b"manifest!".to_vec(), &[])
        .unwrap();
    // Stored: the manifest, "one", 2 distinct chunks of the text, 3 random.
    assert_eq!((up.objects, up.reused, up.zero), (7, 15, 3), "{up:?}");
    assert!(up.stored_bytes < (3 << 20) + (1 << 20), "{up:?}");
    // The same files again: only the new manifest is stored.
    let up2 = img
        .upload(src.path(), (2, Some(1)), b"second".to_vec(), &[])
        .unwrap();
    assert_eq!((up2.objects, up2.reused), (1, 21), "{up2:?}");
    assert_eq!(img.committed().unwrap(), vec![1, 2]);
    let dest = tempfile::tempdir().unwrap();
    let got = img.download_chain(None, &dest.path().join("img")).unwrap();
    assert_eq!(got.chain, vec![2, 1]);
    for n in ["00000001", "00000002"] {
        let d = dest.path().join("img/checkpoints").join(n);
        for (name, bytes) in &files {
            assert_eq!(&std::fs::read(d.join(name)).unwrap(), bytes, "{n}/{name}");
        }
    }
    let m = std::fs::read(dest.path().join("img/checkpoints/00000002/manifest.bin")).unwrap();
    assert_eq!(m, b"second");
    assert_eq!(
        std::fs::read_to_string(dest.path().join("img/latest")).unwrap(),
        "2\n"
    );
}

#[test]
fn a_commit_is_conditional_and_uncommitted_data_is_invisible() {
    let srv = Server::start();
    let img = srv.image("race", zstd());
    let (src, _) = sample_dir();
    // An upload that never committed: nothing to list or fetch.
    let (_, _) = img
        .upload_data(src.path(), (1, None), b"m".to_vec(), &[])
        .unwrap();
    assert!(img.committed().unwrap().is_empty());
    let dest = tempfile::tempdir().unwrap();
    assert!(matches!(
        img.download_chain(None, &dest.path().join("x")),
        Err(StoreError::Empty { .. })
    ));
    img.upload(src.path(), (1, None), b"first".to_vec(), &[])
        .unwrap();
    let r = img.upload(src.path(), (1, None), b"second".to_vec(), &[]);
    assert!(
        matches!(r, Err(StoreError::CommitRace { checkpoint: 1, .. })),
        "{r:?}"
    );
    // The winner's record stands; the losers' manifests are unnamed chunks,
    // swept only once old enough.
    let named = img.named_chunks().unwrap();
    let all = img.chunks().unwrap();
    assert_eq!(all.len(), named.len() + 2, "{all:?}");
    assert_eq!(img.sweep(3600).unwrap().0, 0, "young chunks are spared");
    assert_eq!(img.sweep(0).unwrap().0, 2);
    let d2 = tempfile::tempdir().unwrap();
    img.download_chain(Some(1), &d2.path().join("x")).unwrap();
    assert_eq!(
        std::fs::read(d2.path().join("x/checkpoints/00000001/manifest.bin")).unwrap(),
        b"first"
    );
    // A deleted checkpoint's chunks go at the next sweep.
    img.delete(1).unwrap();
    assert!(img.committed().unwrap().is_empty());
    assert_eq!(img.sweep(0).unwrap().0, u64::try_from(named.len()).unwrap());
    assert!(img.chunks().unwrap().is_empty());
}

#[test]
fn keys_guard_records_and_objects() {
    let srv = Server::start();
    let key = Key::from_bytes([5; 32]);
    let sealed = SealOptions {
        zstd: Some(1),
        key: Some(key.clone()),
        ..Default::default()
    };
    let img = srv.image("enc", sealed.clone());
    let (src, _) = sample_dir();
    img.upload(src.path(), (1, None), b"m".to_vec(), &[])
        .unwrap();
    img.record(1).unwrap();
    let no_key = srv.image("enc", zstd());
    assert!(matches!(no_key.record(1), Err(StoreError::NeedKey { .. })));
    let wrong = srv.image(
        "enc",
        SealOptions {
            zstd: Some(1),
            key: Some(Key::from_bytes([6; 32])),
            ..Default::default()
        },
    );
    assert!(matches!(wrong.record(1), Err(StoreError::WrongKey { .. })));
    // A record changed in the store no longer authenticates.
    let rec_path = srv.root.path().join("bkt/enc/commits/00000001");
    let text = std::fs::read_to_string(&rec_path).unwrap();
    let changed = text.replacen("\"created_unix\": ", "\"created_unix\": 1", 1);
    assert_ne!(text, changed);
    std::fs::write(&rec_path, changed).unwrap();
    let e = img.record(1).unwrap_err();
    assert!(e.to_string().contains("authentication code"), "{e}");
}

#[test]
fn a_consuming_upload_frees_each_file_as_it_reads_it() {
    use std::os::unix::fs::MetadataExt;
    let srv = Server::start();
    let img = srv.image(
        "consume",
        SealOptions {
            zstd: Some(1),
            key: Some(Key::from_bytes([9; 32])),
            ..Default::default()
        },
    );
    let (src, files) = sample_dir();
    let blocks = |name: &str| std::fs::metadata(src.path().join(name)).unwrap().blocks();
    assert!(blocks("pages-2.pack") > 0);
    img.upload_consuming(src.path(), (1, None), b"m".to_vec(), &[])
        .unwrap();
    // Every file is now zeros of its old size, holes but for the partial
    // file-system blocks at its ends (zeroed, not freed).
    for (name, bytes) in &files {
        let path = src.path().join(name);
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.len(), bytes.len() as u64, "{name}");
        assert!(
            m.blocks() * 512 <= 2 * m.blksize(),
            "{name} still holds {} blocks",
            m.blocks()
        );
        assert!(
            std::fs::read(&path).unwrap().iter().all(|b| *b == 0),
            "{name}"
        );
    }
    // What was uploaded is the files as they were.
    let dest = tempfile::tempdir().unwrap();
    img.download_chain(None, &dest.path().join("img")).unwrap();
    let d = dest.path().join("img/checkpoints/00000001");
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(d.join(name)).unwrap(), bytes, "{name}");
    }
}
