//! Page packs: round trip, run splitting/merging, validation, verification.
// Test code runs on 64-bit Linux only; offsets and lengths fit usize.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use stasis_image::*;

const P: u64 = PAGE_SIZE;

/// Writes a pack with `runs` into a builder's temp dir; returns the builder
/// (keep it alive) and the pack ref.
fn write_pack(image: &ImageDir, runs: &[(u64, usize, u64)]) -> (CheckpointBuilder, PackRef) {
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(7).unwrap();
    for &(vaddr, n, seed) in runs {
        w.write_run(vaddr, &pages(seed, n)).unwrap();
    }
    let r = w.finish().unwrap();
    (b, r)
}

fn pack_path(b: &CheckpointBuilder, r: &PackRef) -> PathBuf {
    b.temp_dir().join(&r.name)
}

/// Expected content of the virtual address space written by `runs`.
fn expected_byte_map(runs: &[(u64, usize, u64)]) -> Vec<(u64, Vec<u8>)> {
    runs.iter()
        .map(|&(v, n, seed)| (v, pages(seed, n)))
        .collect()
}

fn read_back(reader: &PackReader, vaddr: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    let mut filled = 0u64;
    for e in reader.runs_in(vaddr, vaddr + len) {
        let mut buf = vec![0u8; e.len() as usize];
        reader.read_run(e, &mut buf).unwrap();
        let off = (e.vaddr - vaddr) as usize;
        out[off..off + buf.len()].copy_from_slice(&buf);
        filled += e.len();
    }
    assert_eq!(filled, len, "runs do not cover {vaddr:#x}+{len:#x}");
    out
}

#[test]
fn round_trip_with_splitting_and_merging() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let runs = [
        (0x1000u64, 1usize, 1u64),
        (0x10_0000, 600, 2), // split into 256 + 256 + 88
        (0x40_0000, 3, 3),
        (0x7fff_0000_0000, 256, 4), // exactly one full run
    ];
    let (b, r) = write_pack(&image, &runs);
    assert_eq!(r.name, "pages-7.pack");
    assert_eq!(r.pages, 1 + 600 + 3 + 256);
    let path = pack_path(&b, &r);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), r.size);

    let reader = PackReader::open(&path, Some(&r)).unwrap();
    assert_eq!(reader.pages(), r.pages);
    assert_eq!(reader.pid(), 7);
    let shape: Vec<(u64, u32)> = reader.runs().iter().map(|e| (e.vaddr, e.npages)).collect();
    assert_eq!(
        shape,
        vec![
            (0x1000, 1),
            (0x10_0000, 256),
            (0x10_0000 + 256 * P, 256),
            (0x10_0000 + 512 * P, 88),
            (0x40_0000, 3),
            (0x7fff_0000_0000, 256),
        ]
    );
    // Data stored back to back, page aligned, right after the header.
    let mut off = PACK_HEADER_LEN;
    for e in reader.runs() {
        assert_eq!(e.file_off, off);
        assert_eq!(e.flags, 0);
        off += e.len();
    }
    assert_eq!(reader.data_end(), off);
    assert_eq!(r.size, off + reader.runs().len() as u64 * 40 + 48);

    for (vaddr, data) in expected_byte_map(&runs) {
        assert_eq!(read_back(&reader, vaddr, data.len() as u64), data);
    }
    reader.verify().unwrap();

    // Lookups.
    assert_eq!(reader.runs_in(0x10_0000, 0x10_0000 + 600 * P).len(), 3);
    assert_eq!(reader.runs_in(0, 0x1000).len(), 0);
    assert_eq!(reader.runs_in(0x2000, 0x1000).len(), 0);
    assert_eq!(reader.runs_in(0, u64::MAX).len(), 6);
    assert_eq!(
        reader
            .run_containing(0x10_0000 + 300 * P + 5)
            .unwrap()
            .vaddr,
        0x10_0000 + 256 * P
    );
    assert!(reader.run_containing(0x2000).is_none());
    assert_eq!(reader.run_containing(0x1fff).unwrap().vaddr, 0x1000);
}

#[test]
fn adjacent_calls_merge_until_max_run_pages() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let base = 0x5555_0000_0000u64;
    // 100 + 100 + 100 contiguous pages, one page at a time for the last 60.
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(1).unwrap();
    let all = pages(9, 360);
    w.write_run(base, &all[..100 * 4096]).unwrap();
    w.write_run(base + 100 * P, &all[100 * 4096..200 * 4096])
        .unwrap();
    w.write_run(base + 200 * P, &all[200 * 4096..300 * 4096])
        .unwrap();
    for i in 300..360u64 {
        w.write_run(
            base + i * P,
            &all[i as usize * 4096..(i as usize + 1) * 4096],
        )
        .unwrap();
    }
    // Empty write is a no-op.
    w.write_run(base + 360 * P, &[]).unwrap();
    // A gap starts a new entry even though the previous one has room.
    w.write_run(base + 400 * P, &pages(10, 2)).unwrap();
    assert_eq!(w.pages(), 362);
    assert_eq!(w.bytes(), 362 * P);
    let r = w.finish().unwrap();
    let reader = PackReader::open(&pack_path(&b, &r), Some(&r)).unwrap();
    let shape: Vec<(u64, u32)> = reader.runs().iter().map(|e| (e.vaddr, e.npages)).collect();
    assert_eq!(
        shape,
        vec![(base, 256), (base + 256 * P, 104), (base + 400 * P, 2)]
    );
    assert_eq!(read_back(&reader, base, 360 * P), all);
    reader.verify().unwrap();
    drop(b);
}

#[test]
fn one_huge_slice_is_split() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let data = pages(5, 256 * 9 + 1);
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(2).unwrap();
    w.write_run(0, &data).unwrap();
    let r = w.finish().unwrap();
    let reader = PackReader::open(&pack_path(&b, &r), Some(&r)).unwrap();
    assert_eq!(reader.runs().len(), 10);
    assert!(reader.runs().iter().all(|e| e.npages <= MAX_RUN_PAGES));
    assert_eq!(read_back(&reader, 0, data.len() as u64), data);
    drop(b);
}

#[test]
fn empty_pack_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[]);
    assert_eq!(r.size, PACK_HEADER_LEN + PACK_TRAILER_LEN);
    // xxh3-64 of the empty index (documented in docs/image-format.md).
    assert_eq!(r.index_checksum, 0x2d06_8005_38d3_94c2);
    let reader = PackReader::open(&pack_path(&b, &r), Some(&r)).unwrap();
    assert!(reader.runs().is_empty());
    reader.verify().unwrap();
}

#[test]
fn writer_rejects_bad_runs() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(3).unwrap();
    let page = pages(1, 1);
    let e = w.write_run(0x1001, &page).unwrap_err();
    assert!(e.to_string().contains("not page aligned"), "{e}");
    let e = w.write_run(0x1000, &page[..100]).unwrap_err();
    assert!(e.to_string().contains("whole number of pages"), "{e}");
    let e = w.write_run(u64::MAX - 0xfff, &pages(1, 2)).unwrap_err();
    assert!(e.to_string().contains("wraps"), "{e}");
    w.write_run(0x10000, &pages(1, 4)).unwrap();
    // Overlapping, equal and decreasing addresses.
    for vaddr in [0x10000, 0x12000, 0x13000, 0x1000] {
        let e = w.write_run(vaddr, &page).unwrap_err();
        assert!(matches!(e, ImageError::BadRun { .. }), "{e}");
        assert!(e.to_string().contains("previous run"), "{e}");
        assert_style(&e);
    }
    // Rejected calls do not poison the writer.
    w.write_run(0x14000, &page).unwrap();
    let r = w.finish().unwrap();
    assert_eq!(r.pages, 5);
    drop(b);
}

fn corrupt_at(path: &Path, off: u64, mask: u8) {
    let mut b = std::fs::read(path).unwrap();
    b[off as usize] ^= mask;
    std::fs::write(path, &b).unwrap();
}

#[test]
fn flipped_data_byte_is_caught_by_verify_and_read_run() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let runs = [(0x1000u64, 2usize, 1u64), (0x7f12_3456_0000, 300, 2)];
    let (b, r) = write_pack(&image, &runs);
    let path = pack_path(&b, &r);
    let reader = PackReader::open(&path, Some(&r)).unwrap();
    let target = reader.runs()[2]; // second entry of the 300-page run
    drop(reader);
    corrupt_at(&path, target.file_off + 1234, 0x04);

    // Opening only checks structure: still fine.
    let reader = PackReader::open(&path, Some(&r)).unwrap();
    let e = reader.verify().unwrap_err();
    match &e {
        ImageError::PageChecksum {
            vaddr,
            npages,
            path: p,
            ..
        } => {
            assert_eq!(*vaddr, target.vaddr);
            assert_eq!(*npages, target.npages);
            assert_eq!(p, &path);
        }
        other => panic!("unexpected error {other}"),
    }
    let msg = e.to_string();
    assert!(msg.contains(&format!("{:#x}", target.vaddr)), "{msg}");
    assert!(msg.contains("pages-7.pack"), "{msg}");
    assert_style(&e);

    let mut buf = vec![0u8; target.len() as usize];
    assert!(matches!(
        reader.read_run(&target, &mut buf),
        Err(ImageError::PageChecksum { .. })
    ));
    // Other runs still read fine.
    let first = reader.runs()[0];
    let mut buf = vec![0u8; first.len() as usize];
    reader.read_run(&first, &mut buf).unwrap();
    assert_eq!(buf, pages(1, 2));
}

#[test]
fn read_run_rejects_foreign_entries_and_wrong_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 2, 1)]);
    let reader = PackReader::open(&pack_path(&b, &r), Some(&r)).unwrap();
    let e = reader.runs()[0];
    let mut small = vec![0u8; 4096];
    assert!(matches!(
        reader.read_run(&e, &mut small),
        Err(ImageError::BufferSize { .. })
    ));
    let forged = RunEntry { file_off: 0, ..e };
    let mut buf = vec![0u8; e.len() as usize];
    assert!(matches!(
        reader.read_run(&forged, &mut buf),
        Err(ImageError::RunNotInPack { .. })
    ));
}

#[test]
fn every_truncation_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 3, 1), (0x9000, 2, 2)]);
    let path = pack_path(&b, &r);
    let good = std::fs::read(&path).unwrap();
    let trunc = path.with_file_name("trunc.pack");
    let mut lens: Vec<usize> = (0..good.len()).step_by(97).collect();
    lens.extend(good.len() - 200..good.len());
    lens.extend([4096, 4096 + 48, 8192, 8192 + 48]);
    for len in lens {
        let _ = std::fs::remove_file(&trunc);
        std::fs::write(&trunc, &good[..len]).unwrap();
        let e = PackReader::open(&trunc, Some(&r)).unwrap_err();
        assert!(
            matches!(e, ImageError::CorruptPack { .. }),
            "len {len}: {e}"
        );
        // Without the manifest's expectations the structure alone must fail.
        let e = PackReader::open(&trunc, None).unwrap_err();
        assert!(
            matches!(e, ImageError::CorruptPack { .. }),
            "len {len}: {e}"
        );
    }
}

#[test]
fn every_flipped_metadata_byte_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 3, 1), (0x9000, 2, 2), (0x20000, 1, 3)]);
    let path = pack_path(&b, &r);
    let good = std::fs::read(&path).unwrap();
    let data_end = 4096 + 6 * 4096;
    // Same standard name in another directory, so the pid check applies.
    let other = tempfile::tempdir().unwrap();
    let bad = other.path().join(&r.name);
    let offsets = (0..4096usize).chain(data_end..good.len());
    for off in offsets {
        let mut v = good.clone();
        v[off] ^= 0x10;
        let _ = std::fs::remove_file(&bad);
        std::fs::write(&bad, &v).unwrap();
        // With and without the manifest's expectations.
        assert!(
            PackReader::open(&bad, Some(&r)).is_err(),
            "flip at {off} accepted"
        );
        assert!(
            PackReader::open(&bad, None).is_err(),
            "flip at {off} accepted without ref"
        );
    }
}

#[test]
fn hostile_trailers_are_rejected_without_huge_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.pack");
    let mut rng = Rng(7);
    for i in 0..2000 {
        let mut v = vec![0u8; 4096];
        v[..8].copy_from_slice(b"STASISPK");
        v[8..12].copy_from_slice(&1u32.to_le_bytes());
        v[12..16].copy_from_slice(&4096u32.to_le_bytes());
        let extra = (rng.below(4) * 4096 + rng.below(200)) as usize;
        let mut body = vec![0u8; extra];
        rng.fill(&mut body);
        v.extend_from_slice(&body);
        let mut t = Vec::new();
        t.extend_from_slice(b"STASISIX");
        let pick = |rng: &mut Rng| match rng.below(4) {
            0 => rng.next(),
            1 => 4096 * rng.below(6),
            2 => u64::MAX - rng.below(3),
            _ => rng.below(100),
        };
        let index_off = pick(&mut rng);
        t.extend_from_slice(&index_off.to_le_bytes());
        t.extend_from_slice(&pick(&mut rng).to_le_bytes());
        t.extend_from_slice(&rng.next().to_le_bytes());
        let data_end = if i % 2 == 0 {
            index_off
        } else {
            pick(&mut rng)
        };
        t.extend_from_slice(&data_end.to_le_bytes());
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&t);
        std::fs::write(&path, &v).unwrap();
        // Must not panic or abort; index checksums are random, so error.
        assert!(PackReader::open(&path, None).is_err());
    }
}

#[test]
fn forged_index_with_valid_checksum_is_validated() {
    // An index whose checksum is correct but whose entries are inconsistent.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forged.pack");
    let build = |entries: &[(u64, u32, u32, u64)]| {
        let mut v = vec![0u8; 4096];
        v[..8].copy_from_slice(b"STASISPK");
        v[8..12].copy_from_slice(&1u32.to_le_bytes());
        v[12..16].copy_from_slice(&4096u32.to_le_bytes());
        v.extend_from_slice(&vec![0u8; 4 * 4096]);
        let index_off = v.len() as u64;
        let mut idx = Vec::new();
        for &(vaddr, npages, flags, file_off) in entries {
            idx.extend_from_slice(&vaddr.to_le_bytes());
            idx.extend_from_slice(&npages.to_le_bytes());
            idx.extend_from_slice(&flags.to_le_bytes());
            idx.extend_from_slice(&file_off.to_le_bytes());
            idx.extend_from_slice(&0u64.to_le_bytes());
            idx.extend_from_slice(&0u64.to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&idx);
        v.extend_from_slice(&idx);
        v.extend_from_slice(b"STASISIX");
        v.extend_from_slice(&index_off.to_le_bytes());
        v.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        v.extend_from_slice(&sum.to_le_bytes());
        v.extend_from_slice(&index_off.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v
    };
    let ok = build(&[(0x1000, 2, 0, 4096), (0x5000, 2, 0, 3 * 4096)]);
    std::fs::write(&path, &ok).unwrap();
    PackReader::open(&path, None).unwrap();
    let bad_cases: &[&[(u64, u32, u32, u64)]] = &[
        &[(0x1000, 0, 0, 4096)],                        // zero pages
        &[(0x1000, 257, 0, 4096)],                      // > MAX_RUN_PAGES
        &[(0x1001, 1, 0, 4096)],                        // unaligned vaddr
        &[(0x1000, 1, 0, 4097)],                        // unaligned offset
        &[(0x1000, 1, 0, 0)],                           // offset in header
        &[(0x1000, 1, 0, 4 * 4096 + 4096)],             // past data end
        &[(0x1000, 1, 1, 4096)],                        // zero-run flag
        &[(0x5000, 1, 0, 4096), (0x1000, 1, 0, 8192)],  // vaddr decreasing
        &[(0x1000, 2, 0, 4096), (0x2000, 1, 0, 12288)], // vaddr overlap
        &[(0x1000, 2, 0, 4096), (0x9000, 1, 0, 8192)],  // data overlap
        &[(u64::MAX - 0xfff, 2, 0, 4096)],              // wraps
    ];
    for case in bad_cases {
        std::fs::write(&path, build(case)).unwrap();
        let e = PackReader::open(&path, None).unwrap_err();
        assert!(matches!(e, ImageError::CorruptPack { .. }), "{case:?}: {e}");
    }
}

#[test]
fn pack_ref_mismatches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 3, 1)]);
    let path = pack_path(&b, &r);
    for bad in [
        PackRef {
            size: r.size + 1,
            ..r.clone()
        },
        PackRef {
            pages: r.pages + 1,
            ..r.clone()
        },
        PackRef {
            index_checksum: r.index_checksum ^ 1,
            ..r.clone()
        },
    ] {
        let e = PackReader::open(&path, Some(&bad)).unwrap_err();
        assert!(matches!(e, ImageError::CorruptPack { .. }), "{e}");
    }
}

#[test]
fn newer_pack_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 1, 1)]);
    let path = pack_path(&b, &r);
    let mut v = std::fs::read(&path).unwrap();
    v[8..12].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&path, &v).unwrap();
    let e = PackReader::open(&path, Some(&r)).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "image format version 7 is newer than this stasis supports (2): upgrade stasis"
        ),
        "{e}"
    );
}

#[test]
fn symlinked_pack_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let (b, r) = write_pack(&image, &[(0x1000, 1, 1)]);
    let path = pack_path(&b, &r);
    let link = path.with_file_name("link.pack");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let e = PackReader::open(&link, Some(&r)).unwrap_err();
    assert!(matches!(e, ImageError::Symlink { .. }), "{e}");
}

#[test]
fn fifo_pack_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.pack");
    let st = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !matches!(st, Ok(s) if s.success()) {
        return; // no mkfifo available
    }
    let e = PackReader::open(&fifo, None).unwrap_err();
    assert!(matches!(e, ImageError::NotAFile { .. }), "{e}");
}

/// The worked example of docs/image-format.md ("Test vector").
#[test]
fn documented_test_vector() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    let mut b = image.begin_checkpoint().unwrap();
    let mut w = b.create_pack(4242).unwrap();
    w.write_run(0x7f00_0000_0000, &[0xAAu8; 2 * 4096]).unwrap();
    w.write_run(0x7f00_0001_0000, &[0u8; 4096]).unwrap();
    let r = w.finish().unwrap();
    assert_eq!(r.name, "pages-4242.pack");
    assert_eq!(r.size, 16512);
    assert_eq!(r.pages, 3);
    assert_eq!(r.index_checksum, 0xba15_8afd_b097_6399);
    let v = fs_read(&b.temp_dir().join(&r.name));
    let hex = |s: &str| -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    assert_eq!(
        v[..24],
        hex("535441534953504b 0200000000100000 9210000000000000")[..]
    );
    let tail = hex(
        "00000000007f0000 0200000000000000 0010000000000000 74edb791513dd1da 0000000000000000
         00000100007f0000 0100000000000000 0030000000000000 ba89c648e16fd793 0000000000000000
         5354415349534958 0040000000000000 0200000000000000 996397b0fd8a15ba 0040000000000000
         0200000000000000",
    );
    assert_eq!(v[16384..], tail[..]);
    drop(b);
}

fn fs_read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}
