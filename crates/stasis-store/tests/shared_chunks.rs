//! Chunks shared by the stores under one prefix (a cluster agent's trees,
//! `ROOT/HOST/jobs/JOB/PID/`, all in `ROOT/chunks/`), against a real S3
//! server (versitygw): a second tree holding the same bytes stores only
//! its manifest; gc of one tree keeps every chunk another tree names; a
//! tree written before chunks were shared (its own `chunks/`) still reads,
//! also once its next checkpoint is in the shared chunks; a gc of the
//! whole prefix collects every tree and sweeps each chunk root once.

mod common;

use std::io::Read;
use std::path::Path;

use common::Server;
use stasis_store::seal::SealOptions;
use stasis_store::S3Image;

fn zstd() -> SealOptions {
    SealOptions {
        zstd: Some(1),
        key: None,
        ..Default::default()
    }
}

/// A checkpoint directory of `mib` MiB of random bytes and a small file.
fn random_dir(mib: usize) -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let d = tempfile::tempdir().unwrap();
    let mut rnd = vec![0u8; mib << 20];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut rnd)
        .unwrap();
    let files = vec![
        ("pages-1.pack".to_string(), rnd),
        ("small".to_string(), b"small file".to_vec()),
    ];
    for (n, b) in &files {
        std::fs::write(d.path().join(n), b).unwrap();
    }
    (d, files)
}

/// Downloads checkpoint `n` of `img` and its chain, and requires its
/// files (and manifest) to be `files` byte for byte.
fn assert_restorable(img: &S3Image, n: u32, manifest: &[u8], files: &[(String, Vec<u8>)]) {
    let dest = tempfile::tempdir().unwrap();
    img.download_chain(Some(n), &dest.path().join("img"))
        .unwrap_or_else(|e| panic!("{}: checkpoint {n}: {e}", img.url));
    let d = dest.path().join(format!("img/checkpoints/{n:08}"));
    assert_eq!(std::fs::read(d.join("manifest.bin")).unwrap(), manifest);
    for (name, bytes) in files {
        assert_eq!(&std::fs::read(d.join(name)).unwrap(), bytes, "{n}/{name}");
    }
}

fn record(srv: &Server, store: &str, n: u32) -> serde_json::Value {
    let p = srv.object(store, &format!("commits/{n:08}"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|rd| rd.count()).unwrap_or(0)
}

#[test]
fn trees_share_one_chunk_root_and_gc_keeps_what_any_tree_needs() {
    let srv = Server::start();
    let (ta, tb, tl) = ("ag/h0/jobs/j/1", "ag/h1/jobs/j/2", "ag/h0/jobs/j/3");
    let a = srv.image(ta, zstd()).share_chunks(4).unwrap();
    let b = srv.image(tb, zstd()).share_chunks(4).unwrap();
    assert!(srv.image("ag/x", zstd()).share_chunks(3).is_err());
    let (shared, files) = random_dir(3);
    let up_a = a
        .upload(shared.path(), (1, None), b"a1".to_vec(), &[])
        .unwrap();
    assert_eq!(up_a.objects, 5, "{up_a:?}");
    // The same bytes in another tree (another host): only its manifest.
    let up_b = b
        .upload(shared.path(), (1, None), b"b1".to_vec(), &[])
        .unwrap();
    assert_eq!((up_b.objects, up_b.reused), (1, 4), "{up_b:?}");
    assert_eq!(count(&srv.object("ag", "chunks")), 6);
    assert!(!srv.object(ta, "chunks").exists());
    assert!(!srv.object(tb, "chunks").exists());
    let r = record(&srv, ta, 1);
    assert_eq!(
        (r["format"].as_u64(), r["chunks_up"].as_u64()),
        (Some(3), Some(4))
    );

    // A tree written before chunks were shared: its own chunks/; its next
    // checkpoint (an agent that shares them now) goes to the shared root.
    let old = srv.image(tl, zstd());
    let (own, own_files) = random_dir(2);
    old.upload(own.path(), (1, None), b"l1".to_vec(), &[])
        .unwrap();
    assert_eq!(record(&srv, tl, 1)["format"], 1);
    assert!(record(&srv, tl, 1).get("chunks_up").is_none());
    assert_eq!(count(&srv.object(tl, "chunks")), 4);
    let l = srv.image(tl, zstd()).share_chunks(4).unwrap();
    l.upload(shared.path(), (2, None), b"l2".to_vec(), &[])
        .unwrap();
    assert_restorable(&l, 1, b"l1", &own_files);
    assert_restorable(&l, 2, b"l2", &files);

    // Tree a moves on to other bytes; gc of tree a alone keeps only its
    // newest: its checkpoint 1 goes, and of the chunks it named only its
    // manifest (the rest is tree b's and l's too).
    let (other, other_files) = random_dir(1);
    a.upload(other.path(), (2, None), b"a2".to_vec(), &[])
        .unwrap();
    let (report, swept) = stasis_store::gc(&a, 1, 0).unwrap();
    assert_eq!((report.kept, report.deleted), (vec![2], vec![1]));
    assert_eq!(swept.chunks, 1, "{swept:?}");
    assert_restorable(&a, 2, b"a2", &other_files);
    assert_restorable(&b, 1, b"b1", &files);
    assert_restorable(&l, 1, b"l1", &own_files);
    assert_restorable(&l, 2, b"l2", &files);
    // Nothing unnamed is older than an hour: the default age spares it.
    let young = srv.image(tb, zstd()).share_chunks(4).unwrap();
    young
        .upload_data(other.path(), (9, None), b"x".to_vec(), &[])
        .unwrap();
    assert_eq!(stasis_store::gc(&a, 1, 3600).unwrap().1.chunks, 0);

    // gc of every tree under the prefix: l keeps its checkpoint 2, so its
    // own chunks/ (checkpoint 1's) is swept; the shared root loses the
    // unnamed manifest just uploaded. Each kept checkpoint still reads.
    let (stores, swept) = stasis_store::gc_under(&srv.image("ag", zstd()), 1, 0).unwrap();
    let urls: Vec<&str> = stores.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        urls,
        [
            "s3://bkt/ag/h0/jobs/j/1",
            "s3://bkt/ag/h0/jobs/j/3",
            "s3://bkt/ag/h1/jobs/j/2"
        ]
    );
    assert_eq!(stores[1].1.deleted, vec![1]);
    assert_eq!(swept.chunks, 4 + 1, "{swept:?}");
    assert_eq!(count(&srv.object(tl, "chunks")), 0);
    assert_restorable(&a, 2, b"a2", &other_files);
    assert_restorable(&b, 1, b"b1", &files);
    assert_restorable(&l, 2, b"l2", &files);
}

/// A download whose first chunk is damaged, or missing, fails with that
/// chunk's error (the threads that open chunks stop taking new work, the
/// GETs stop), also when many chunks follow it.
#[test]
fn a_damaged_or_missing_chunk_fails_the_download() {
    let srv = Server::start();
    let img = srv.image("dmg", zstd());
    let (src, files) = random_dir(24);
    img.upload(src.path(), (1, None), b"m".to_vec(), &[])
        .unwrap();
    assert_restorable(&img, 1, b"m", &files);
    let r = record(&srv, "dmg", 1);
    let pack = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "pages-1.pack")
        .unwrap();
    let ids: Vec<&str> = pack["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 24);
    let first = srv.object("dmg", &format!("chunks/{}", ids[0]));
    let mut bytes = std::fs::read(&first).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&first, &bytes).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let e = img
        .download_chain(Some(1), &dest.path().join("a"))
        .unwrap_err();
    assert!(
        e.to_string().contains("damaged") && e.to_string().contains(ids[0]),
        "{e}"
    );
    std::fs::remove_file(&first).unwrap();
    let e = img
        .download_chain(Some(1), &dest.path().join("b"))
        .unwrap_err();
    assert!(
        matches!(e, stasis_store::StoreError::Missing { .. }),
        "{e:?}"
    );
}
