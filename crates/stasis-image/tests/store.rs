//! Image directory: atomic commit, numbering, latest pointer, safety checks.
// Test code runs on 64-bit Linux only; offsets and lengths fit usize.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::fs;
use std::path::Path;

use common::*;
use stasis_image::*;

fn temp_entries(dir: &Path) -> Vec<String> {
    match fs::read_dir(dir.join("checkpoints")) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect(),
        Err(_) => vec![],
    }
}

#[test]
fn commit_two_checkpoints_and_load_them() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(&dir.path().join("img")).unwrap();
    assert_eq!(image.checkpoints().unwrap(), Vec::<u32>::new());
    assert_eq!(image.latest().unwrap(), None);

    assert_eq!(write_checkpoint(&image, &[(0x1000, 2, 1)]), 1);
    assert_eq!(
        fs::read_to_string(image.path().join("latest")).unwrap(),
        "1\n"
    );
    assert_eq!(
        fs::read_to_string(image.path().join("STASIS-IMAGE")).unwrap(),
        "stasis image directory\nformat 2\n"
    );
    assert_eq!(write_checkpoint(&image, &[(0x1000, 3, 2)]), 2);
    assert_eq!(
        fs::read_to_string(image.path().join("latest")).unwrap(),
        "2\n"
    );
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2]);
    assert_eq!(image.latest().unwrap(), Some(2));

    // A reader opening the directory afresh.
    let reader = ImageDir::open(image.path()).unwrap();
    let cp = reader.load(None).unwrap();
    assert_eq!(cp.number, 2);
    assert_eq!(cp.manifest.checkpoint, 2);
    assert_eq!(cp.dir(), image.path().join("checkpoints/00000002"));
    let p = &cp.manifest.processes[0];
    let pack = cp.open_process_pack(p).unwrap().unwrap();
    assert_eq!(pack.path(), cp.dir().join("pages-100.pack"));
    let mut buf = vec![0u8; 3 * 4096];
    pack.read_run(&pack.runs()[0], &mut buf).unwrap();
    assert_eq!(buf, pages(2, 3));
    verify_checkpoint(&cp).unwrap();

    let cp1 = reader.load(Some(1)).unwrap();
    assert_eq!(cp1.number, 1);
    assert_eq!(cp1.manifest.processes[0].pack.as_ref().unwrap().pages, 2);

    let e = reader.load(Some(5)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "checkpoint 5 does not exist in {} (it has 1, 2)",
            image.path().display()
        )
    );
    assert!(matches!(
        reader.load(Some(0)),
        Err(ImageError::NoSuchCheckpoint { .. })
    ));
}

#[test]
fn dropped_builder_leaves_nothing_visible() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    {
        let mut b = image.begin_checkpoint().unwrap();
        assert_eq!(b.number(), 2);
        assert!(b.temp_dir().exists());
        assert!(b
            .temp_dir()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".tmp-00000002-"));
        let mut w = b.create_pack(5).unwrap();
        w.write_run(0x1000, &pages(1, 4)).unwrap();
        w.finish().unwrap();
        // While in progress, readers see only checkpoint 1.
        assert_eq!(image.checkpoints().unwrap(), vec![1]);
        assert_eq!(image.load(None).unwrap().number, 1);
    }
    assert_eq!(image.checkpoints().unwrap(), vec![1]);
    assert_eq!(image.latest().unwrap(), Some(1));
    assert!(temp_entries(dir.path()).is_empty());
    assert_eq!(
        fs::read_to_string(dir.path().join("latest")).unwrap(),
        "1\n"
    );
    // The number is reused since nothing was committed.
    assert_eq!(write_checkpoint(&image, &[(0x1000, 1, 1)]), 2);
}

#[test]
fn failed_commit_leaves_nothing_visible() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    // Wrong checkpoint number.
    let b = image.begin_checkpoint().unwrap();
    let e = b.commit(&manifest(9, vec![])).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::CheckpointMismatch {
                expected: 1,
                found: 9
            }
        ),
        "{e}"
    );
    // Manifest references a pack that was never finished.
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(1).unwrap();
    w.write_run(0x1000, &pages(1, 1)).unwrap();
    drop(w);
    let r = PackRef {
        name: "pages-1.pack".into(),
        size: 4096 * 2 + 88,
        pages: 1,
        index_checksum: 0,
    };
    let e = b
        .commit(&manifest(1, vec![process(1, Some(r))]))
        .unwrap_err();
    assert!(matches!(e, ImageError::CorruptPack { .. }), "{e}");
    // Path traversal in the manifest is refused at commit.
    let b = image.begin_checkpoint().unwrap();
    let r = PackRef {
        name: "../x".into(),
        size: 0,
        pages: 0,
        index_checksum: 0,
    };
    let e = b
        .commit(&manifest(1, vec![process(1, Some(r))]))
        .unwrap_err();
    assert!(matches!(e, ImageError::UnsafeName { .. }), "{e}");

    assert!(image.checkpoints().unwrap().is_empty());
    assert!(temp_entries(dir.path()).is_empty());
    assert!(!dir.path().join("latest").exists());
}

#[test]
fn concurrent_builders_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let b = image.begin_checkpoint().unwrap();
    let other = ImageDir::create_or_open(dir.path()).unwrap();
    let e = other.begin_checkpoint().unwrap_err();
    assert!(matches!(e, ImageError::Locked { .. }), "{e}");
    assert!(matches!(
        other.remove_stale_temps(),
        Err(ImageError::Locked { .. })
    ));
    assert_style(&e);
    drop(b);
    let b = other.begin_checkpoint().unwrap();
    assert_eq!(b.number(), 1);
}

#[test]
fn stale_temps_are_ignored_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    // Simulate crashed dumps.
    let cps = dir.path().join("checkpoints");
    let stale = cps.join(".tmp-00000002-999-123");
    fs::create_dir(&stale).unwrap();
    fs::write(stale.join("manifest.bin"), b"partial").unwrap();
    fs::create_dir(cps.join(".tmp-00000003-999-456")).unwrap();
    fs::write(dir.path().join("latest.tmp"), b"3\n").unwrap();
    // Unrelated names are ignored too.
    fs::create_dir(cps.join("notes")).unwrap();
    fs::create_dir(cps.join("1")).unwrap();

    assert_eq!(image.checkpoints().unwrap(), vec![1]);
    assert_eq!(image.load(None).unwrap().number, 1);
    assert_eq!(image.remove_stale_temps().unwrap(), 2);
    assert!(temp_entries(dir.path()).is_empty());
    assert!(!dir.path().join("latest.tmp").exists());
    assert_eq!(image.remove_stale_temps().unwrap(), 0);
    assert_eq!(write_checkpoint(&image, &[(0x1000, 1, 1)]), 2);
}

/// An aborting dump removes its own temporary checkpoints, while it holds
/// the lock, and nobody else's.
#[test]
fn an_aborting_dump_removes_only_its_own_temps() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let me = std::process::id();
    let b = image.begin_checkpoint().unwrap();
    let name = b
        .temp_dir()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(temp_owner(&name), Some(me));
    fs::write(b.temp_dir().join("pages-1.pack"), b"partial").unwrap();
    let cps = dir.path().join("checkpoints");
    fs::create_dir(cps.join(format!(".tmp-00000009-{}-1", me + 1))).unwrap();
    assert_eq!(temp_owner("notes"), None);
    assert_eq!(remove_temps_of(dir.path(), me), 1);
    assert_eq!(
        temp_entries(dir.path()),
        vec![format!(".tmp-00000009-{}-1", me + 1)]
    );
    drop(b);
    assert!(image.checkpoints().unwrap().is_empty());
}

#[test]
fn latest_pointer_edge_cases() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    write_checkpoint(&image, &[(0x1000, 1, 2)]);
    let latest = dir.path().join("latest");

    // Lagging pointer (crash between rename and pointer update).
    fs::write(&latest, "1\n").unwrap();
    assert_eq!(image.latest().unwrap(), Some(2));
    // Pointer naming a deleted checkpoint.
    fs::write(&latest, "7\n").unwrap();
    assert_eq!(image.latest().unwrap(), Some(2));
    // New checkpoints never reuse a number the pointer has seen.
    assert_eq!(write_checkpoint(&image, &[(0x1000, 1, 3)]), 8);
    fs::write(&latest, "garbage").unwrap();
    assert_eq!(image.latest().unwrap(), Some(8));
    fs::remove_file(&latest).unwrap();
    assert_eq!(image.latest().unwrap(), Some(8));

    // Pointer names a checkpoint but none exist.
    let dir2 = tempfile::tempdir().unwrap();
    let image2 = ImageDir::create_or_open(dir2.path()).unwrap();
    write_checkpoint(&image2, &[(0x1000, 1, 1)]);
    fs::remove_dir_all(dir2.path().join("checkpoints/00000001")).unwrap();
    let e = image2.latest().unwrap_err();
    assert!(
        matches!(e, ImageError::LatestMissing { pointer: 1, .. }),
        "{e}"
    );
    assert!(image2.load(None).is_err());
    fs::write(dir2.path().join("latest"), "x\n").unwrap();
    assert!(matches!(
        image2.latest(),
        Err(ImageError::CorruptLatest { .. })
    ));
    fs::remove_file(dir2.path().join("latest")).unwrap();
    assert_eq!(image2.latest().unwrap(), None);
    assert!(matches!(
        image2.load(None),
        Err(ImageError::NoCheckpoints { .. })
    ));
}

#[test]
fn open_errors_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let e = ImageDir::open(&missing).unwrap_err();
    assert!(matches!(e, ImageError::NoSuchDir { .. }), "{e}");
    assert_style(&e);

    // Exists but is not an image directory.
    let plain = dir.path().join("plain");
    fs::create_dir(&plain).unwrap();
    let e = ImageDir::open(&plain).unwrap_err();
    assert!(matches!(e, ImageError::NotImageDir { .. }), "{e}");
    assert_style(&e);

    // A file.
    let file = dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    assert!(matches!(
        ImageDir::open(&file),
        Err(ImageError::NotADirectory { .. })
    ));
    assert!(matches!(
        ImageDir::create_or_open(&file),
        Err(ImageError::NotADirectory { .. })
    ));

    // A directory with someone else's files is not taken over by a dump.
    let foreign = dir.path().join("home");
    fs::create_dir(&foreign).unwrap();
    fs::write(foreign.join("thesis.tex"), b"...").unwrap();
    let e = ImageDir::create_or_open(&foreign).unwrap_err();
    assert!(matches!(e, ImageError::ForeignDir { .. }), "{e}");

    // Bad marker.
    let bad = dir.path().join("bad");
    fs::create_dir(&bad).unwrap();
    fs::write(bad.join("STASIS-IMAGE"), b"hello\n").unwrap();
    assert!(matches!(
        ImageDir::open(&bad),
        Err(ImageError::NotImageDir { .. })
    ));

    // Newer format in the marker.
    let newer = dir.path().join("newer");
    fs::create_dir(&newer).unwrap();
    fs::write(
        newer.join("STASIS-IMAGE"),
        b"stasis image directory\nformat 7\n",
    )
    .unwrap();
    let e = ImageDir::open(&newer).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "image format version 7 is newer than this stasis supports (2): upgrade stasis"
        ),
        "{e}"
    );
    assert!(ImageDir::create_or_open(&newer).is_err());

    // An empty existing directory is fine for dumping.
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let image = ImageDir::create_or_open(&empty).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    ImageDir::open(&empty).unwrap();
}

#[test]
fn symlinks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let image = ImageDir::create_or_open(&real).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    write_checkpoint(&image, &[(0x1000, 1, 2)]);

    // Image directory itself.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(matches!(
        ImageDir::open(&link),
        Err(ImageError::Symlink { .. })
    ));
    assert!(matches!(
        ImageDir::create_or_open(&link),
        Err(ImageError::Symlink { .. })
    ));

    // Checkpoint directory replaced by a symlink to another checkpoint.
    let cp2 = real.join("checkpoints/00000002");
    let moved = dir.path().join("elsewhere");
    fs::rename(&cp2, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &cp2).unwrap();
    let e = image.load(Some(2)).unwrap_err();
    assert!(matches!(e, ImageError::Symlink { .. }), "{e}");
    assert!(
        image.load(None).is_err(),
        "latest is a symlinked checkpoint"
    );
    fs::remove_file(&cp2).unwrap();
    fs::rename(&moved, &cp2).unwrap();
    image.load(Some(2)).unwrap();

    // Pack file replaced by a symlink (to a valid copy).
    let cp = image.load(Some(2)).unwrap();
    let r = cp.manifest.processes[0].pack.clone().unwrap();
    let pack = cp.dir().join(&r.name);
    let copy = dir.path().join("copy.pack");
    fs::copy(&pack, &copy).unwrap();
    fs::remove_file(&pack).unwrap();
    std::os::unix::fs::symlink(&copy, &pack).unwrap();
    let e = cp.open_pack(&r).unwrap_err();
    assert!(matches!(e, ImageError::Symlink { .. }), "{e}");
    assert!(verify_checkpoint(&cp).is_err());

    // Manifest replaced by a symlink.
    let m = real.join("checkpoints/00000001/manifest.bin");
    let mcopy = dir.path().join("m.bin");
    fs::copy(&m, &mcopy).unwrap();
    fs::remove_file(&m).unwrap();
    std::os::unix::fs::symlink(&mcopy, &m).unwrap();
    assert!(matches!(
        image.load(Some(1)),
        Err(ImageError::Symlink { .. })
    ));

    // The `latest` pointer and the lock file.
    fs::remove_file(real.join("latest")).unwrap();
    std::os::unix::fs::symlink(&mcopy, real.join("latest")).unwrap();
    assert!(matches!(image.latest(), Err(ImageError::Symlink { .. })));
    fs::remove_file(real.join("latest")).unwrap();
    fs::remove_file(real.join(".lock")).unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, real.join(".lock")).unwrap();
    assert!(matches!(
        image.begin_checkpoint(),
        Err(ImageError::Symlink { .. })
    ));
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
}

#[test]
fn path_traversal_in_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    let cp = image.load(Some(1)).unwrap();
    for name in [
        "../x",
        "/etc/passwd",
        "..",
        ".",
        "",
        "a/b",
        "a\0b",
        &"x".repeat(256),
    ] {
        let r = PackRef {
            name: name.to_string(),
            size: 0,
            pages: 0,
            index_checksum: 0,
        };
        let e = cp.open_pack(&r).unwrap_err();
        assert!(matches!(e, ImageError::UnsafeName { .. }), "{name:?}: {e}");
        assert_style(&e);
    }
    // A committed manifest naming ../x is refused at load.
    let evil = manifest(
        1,
        vec![process(
            100,
            Some(PackRef {
                name: "../x".into(),
                size: 0,
                pages: 0,
                index_checksum: 0,
            }),
        )],
    );
    let mpath = dir.path().join("checkpoints/00000001/manifest.bin");
    fs::write(&mpath, encode_manifest(&evil).unwrap()).unwrap();
    let e = image.load(Some(1)).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::UnsafeName {
                checkpoint: Some(1),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("\"../x\""), "{e}");
}

#[test]
fn files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a/b/img");
    let image = ImageDir::create_or_open(&img).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    assert_eq!(mode(&img), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700);
    assert_eq!(mode(&img.join("checkpoints")), 0o700);
    assert_eq!(mode(&img.join("checkpoints/00000001")), 0o700);
    for f in [
        "STASIS-IMAGE",
        "latest",
        ".lock",
        "checkpoints/00000001/manifest.bin",
        "checkpoints/00000001/pages-100.pack",
    ] {
        assert_eq!(mode(&img.join(f)), 0o600, "{f}");
    }
    // Temp dirs too.
    let b = image.begin_checkpoint().unwrap();
    assert_eq!(mode(b.temp_dir()), 0o700);
}

#[test]
fn pid_mismatch_between_manifest_and_pack_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(100).unwrap();
    w.write_run(0x1000, &pages(1, 1)).unwrap();
    let r = w.finish().unwrap();
    // The manifest hands pid 100's pack to pid 200.
    b.commit(&manifest(1, vec![process(200, Some(r))])).unwrap();
    let cp = image.load(None).unwrap();
    let e = verify_checkpoint(&cp).unwrap_err();
    assert!(e.to_string().contains("pid 100"), "{e}");
}

#[test]
fn verify_checkpoint_detects_data_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 4, 1), (0x10000, 1, 2)]);
    let cp = image.load(None).unwrap();
    verify_checkpoint(&cp).unwrap();
    let pack = cp.dir().join("pages-100.pack");
    let mut v = fs::read(&pack).unwrap();
    v[4096 + 4 * 4096 + 10] ^= 1; // inside the run at 0x10000
    fs::write(&pack, &v).unwrap();
    let e = verify_checkpoint(&cp).unwrap_err();
    assert!(e.to_string().contains("0x10000"), "{e}");
    assert!(e.to_string().contains("of checkpoint 1"), "{e}");
}

#[test]
fn summary_describes_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 4, 1), (0x10000, 1, 2)]);
    let cp = image.load(None).unwrap();
    let s = summarize(&cp);
    assert_eq!(s.number, 1);
    assert_eq!(s.parent, None);
    assert_eq!(s.created_unix, 1_700_000_000);
    assert_eq!(s.tool_version, "0.1.0-test");
    assert_eq!(s.processes.len(), 1);
    let p = &s.processes[0];
    assert_eq!((p.pid, p.threads, p.vmas, p.fds), (100, 1, 3, 1));
    assert_eq!(p.comm, "proc100");
    assert_eq!(p.exe, "/usr/bin/sleep");
    assert_eq!(p.pack_pages, 5);
    let size = fs::metadata(cp.dir().join("pages-100.pack")).unwrap().len();
    assert_eq!(p.pack_bytes, size);
    assert_eq!(s.total_pages, 5);
    // Serializable (CBOR here; the CLI uses JSON).
    let mut out = Vec::new();
    ciborium::into_writer(&s, &mut out).unwrap();
    assert!(!out.is_empty());
}

/// A two-phase commit: a prepared checkpoint is complete on disk and
/// invisible; committed, it is the latest. One whose maker died is found
/// by `prepared_temps` and can be committed by whoever recorded the
/// decision; a half-written one (no valid manifest) is not offered.
#[test]
fn prepared_checkpoints_are_invisible_until_committed_even_after_their_maker_died() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    assert_eq!(write_checkpoint(&image, &[(0x1000, 1, 1)]), 1);
    let mut b = image.begin_checkpoint().unwrap();
    let m = manifest(2, vec![process(1, None)]);
    b.prepare(&m).unwrap();
    assert_eq!(image.checkpoints().unwrap(), vec![1]);
    assert_eq!(image.latest().unwrap(), Some(1));
    assert_eq!(b.commit_prepared().unwrap(), 2);
    assert_eq!(image.latest().unwrap(), Some(2));
    assert_eq!(image.load(None).unwrap().manifest.cut, m.cut);
    // Its cut mark is readable without the manifest.
    assert!(m.cut.is_some());
    assert_eq!(image.cut_mark(2), m.cut);
    assert_eq!(image.cut_mark(1).map(|c| c.round), Some(7));
    assert_eq!(image.cut_mark(9), None);

    // A maker that dies after preparing: its temporary directory stays.
    let mut b = image.begin_checkpoint().unwrap();
    b.prepare(&manifest(3, vec![process(1, None)])).unwrap();
    let temp = b.temp_dir().to_path_buf();
    let kept = dir
        .path()
        .join("checkpoints")
        .join(".tmp-00000003-999999-1");
    fs::rename(&temp, &kept).unwrap();
    drop(b);
    // And one that died before its manifest was whole.
    let half = dir
        .path()
        .join("checkpoints")
        .join(".tmp-00000004-999999-2");
    fs::create_dir(&half).unwrap();
    fs::write(half.join("manifest.bin"), b"partial").unwrap();
    let left = image.prepared_temps().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((left[0].number, left[0].owner), (3, 999_999));
    assert_eq!(image.latest().unwrap(), Some(2));
    assert_eq!(image.commit_left_prepared(&left[0]).unwrap(), 3);
    assert_eq!(image.latest().unwrap(), Some(3));
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2, 3]);
    assert!(image.prepared_temps().unwrap().is_empty());
}
