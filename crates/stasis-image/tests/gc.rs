//! Chains of incremental checkpoints and their garbage collection: page
//! resolution through ancestors, merging, deletion, and crash safety.
// Test code runs on 64-bit Linux only; offsets and lengths fit usize.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use stasis_image::chain::normalize;
use stasis_image::*;

const P: u64 = 4096;

/// The memory of one process: page address -> page bytes.
type Mem = BTreeMap<u64, Vec<u8>>;
/// The memory of every live process of a checkpoint, by (pid, start time).
type Image = BTreeMap<(i32, u64), Mem>;

/// One process as written into a checkpoint.
struct Proc {
    pid: i32,
    start_time: u64,
    mem: Mem,
    /// Pages stored in this checkpoint's pack (the others come from the
    /// parent).
    stored: BTreeSet<u64>,
    /// Write `data_ranges` (incremental process) or not (full process).
    ranges: bool,
    zombie: bool,
}

impl Proc {
    /// A process whose pages are all stored here.
    fn full(pid: i32, start_time: u64, mem: &Mem, ranges: bool) -> Proc {
        Proc {
            pid,
            start_time,
            mem: mem.clone(),
            stored: mem.keys().copied().collect(),
            ranges,
            zombie: false,
        }
    }

    /// A process of an incremental checkpoint storing only `stored`.
    fn dirty(pid: i32, start_time: u64, mem: &Mem, stored: &BTreeSet<u64>) -> Proc {
        Proc {
            pid,
            start_time,
            mem: mem.clone(),
            stored: stored.clone(),
            ranges: true,
            zombie: false,
        }
    }

    fn zombie(pid: i32) -> Proc {
        Proc {
            pid,
            start_time: 1,
            mem: Mem::new(),
            stored: BTreeSet::new(),
            ranges: false,
            zombie: true,
        }
    }
}

/// Writes a checkpoint; returns its number and the memory it should restore.
fn write_cp(image: &ImageDir, parent: Option<u32>, procs: &[Proc]) -> (u32, Image) {
    write_cp_with(image, parent, procs, None)
}

/// [`write_cp`], with a deleted file holding `content` (in the content
/// pack) when given.
fn write_cp_with(
    image: &ImageDir,
    parent: Option<u32>,
    procs: &[Proc],
    content: Option<&[u8]>,
) -> (u32, Image) {
    let mut b = image.begin_checkpoint().expect("begin");
    let mut images = Vec::new();
    let mut expected = Image::new();
    for pr in procs {
        let mut p = process(pr.pid, None);
        p.start_time = pr.start_time;
        if pr.zombie {
            p.zombie = Some(0);
            p.threads.clear();
            p.vmas.clear();
            p.fds.clear();
            images.push(p);
            continue;
        }
        if !pr.stored.is_empty() {
            let mut w = b.create_pack(pr.pid).expect("create pack");
            for a in &pr.stored {
                w.write_run(*a, &pr.mem[a]).expect("write_run");
            }
            p.pack = Some(w.finish().expect("finish"));
        }
        if pr.ranges {
            p.data_ranges = Some(normalize(pr.mem.keys().map(|&a| (a, a + P)).collect()));
        }
        expected.insert((pr.pid, pr.start_time), pr.mem.clone());
        images.push(p);
    }
    let mut m = manifest(b.number(), images);
    m.parent = parent;
    if parent.is_some() {
        m.stats.track = "hash".into();
    }
    if let Some(bytes) = content {
        let src = tempfile::NamedTempFile::new().unwrap();
        fs::write(src.path(), bytes).unwrap();
        let mut w = b.content_writer();
        let f = fs::File::open(src.path()).unwrap();
        let e = w
            .copy_extent(&f, src.path(), 0, bytes.len() as u64)
            .unwrap();
        m.ghosts[0].data.clear();
        m.ghosts[0].size = bytes.len() as u64;
        m.ghosts[0].extents = vec![e];
        m.content = w.finish().unwrap();
    }
    let n = b.commit(&m).expect("commit");
    (n, expected)
}

/// Distinct page contents.
struct Pages(u64);

impl Pages {
    fn next(&mut self) -> Vec<u8> {
        self.0 += 1;
        pages(self.0, 1)
    }

    /// `n` fresh pages from `start`.
    fn region(&mut self, mem: &mut Mem, start: u64, n: u64) -> BTreeSet<u64> {
        (0..n)
            .map(|i| {
                let a = start + i * P;
                mem.insert(a, self.next());
                a
            })
            .collect()
    }

    /// Gives new content to the pages `idx` of the region at `start`.
    fn dirty(&mut self, mem: &mut Mem, start: u64, idx: &[u64]) -> BTreeSet<u64> {
        idx.iter()
            .map(|i| {
                let a = start + i * P;
                assert!(mem.contains_key(&a), "dirtying an unmapped page");
                mem.insert(a, self.next());
                a
            })
            .collect()
    }
}

const A: u64 = 0x10_0000; // pid 100, 300 pages: runs split at 256
const B: u64 = 0x7f00_0000_0000; // pid 100, 8 pages
const C: u64 = 0x50_0000; // pid 100 from checkpoint 3
const R200: u64 = 0x30_0000;
const R300: u64 = 0x20_0000;
const R500: u64 = 0x60_0000;

/// Six checkpoints: 1 full, then 2..=6 each incremental over the previous.
/// Along the chain: pages dirtied across the 256-page run boundary, a page
/// dropped in 2 (and mapped again, with new content, in 5), a process with
/// nothing dirty (no pack at all), a process appearing in 3 (incremental
/// form) and one in 5 (full form), a process exiting after 2 and its pid
/// reused by a new process in 4, and a zombie in 4. Returns the expected
/// memory of each checkpoint.
fn six_checkpoints(image: &ImageDir) -> BTreeMap<u32, Image> {
    let mut pg = Pages(0);
    let mut out = BTreeMap::new();
    let (mut m100, mut m200, mut m300, mut m300b, mut m500) =
        (Mem::new(), Mem::new(), Mem::new(), Mem::new(), Mem::new());

    // 1: full.
    pg.region(&mut m100, A, 300);
    pg.region(&mut m100, B, 8);
    pg.region(&mut m300, R300, 5);
    let (n, e) = write_cp(
        image,
        None,
        &[
            Proc::full(100, 1000, &m100, false),
            Proc::full(300, 3000, &m300, false),
        ],
    );
    out.insert(n, e);

    // 2: pid 100 dirties pages around the run boundary and drops B+3;
    // pid 300 has nothing dirty.
    let d100 = pg.dirty(&mut m100, A, &[3, 100, 255, 256, 299]);
    m100.remove(&(B + 3 * P));
    let (n, e) = write_cp(
        image,
        Some(1),
        &[
            Proc::dirty(100, 1000, &m100, &d100),
            Proc::dirty(300, 3000, &m300, &BTreeSet::new()),
        ],
    );
    out.insert(n, e);

    // 3: pid 300 has exited; pid 200 appears; pid 100 dirties A[0..10] and
    // maps C.
    let mut d100 = pg.dirty(&mut m100, A, &(0..10).collect::<Vec<_>>());
    d100.extend(pg.region(&mut m100, C, 4));
    let s200 = pg.region(&mut m200, R200, 20);
    let (n, e) = write_cp(
        image,
        Some(2),
        &[
            Proc::dirty(100, 1000, &m100, &d100),
            Proc::dirty(200, 2000, &m200, &s200),
        ],
    );
    out.insert(n, e);

    // 4: pid 100 clean; pid 200 dirties 2 pages; a new process reuses pid
    // 300; a zombie.
    let d200 = pg.dirty(&mut m200, R200, &[0, 19]);
    let s300 = pg.region(&mut m300b, R300, 3);
    let (n, e) = write_cp(
        image,
        Some(3),
        &[
            Proc::dirty(100, 1000, &m100, &BTreeSet::new()),
            Proc::dirty(200, 2000, &m200, &d200),
            Proc::dirty(300, 3500, &m300b, &s300),
            Proc::zombie(400),
        ],
    );
    out.insert(n, e);

    // 5: pid 100 maps B+3 again (new content), dirties A[150], unmaps
    // C+1..C+3; pid 500 appears as a full process.
    let mut d100 = pg.dirty(&mut m100, A, &[150]);
    d100.extend(pg.region(&mut m100, B + 3 * P, 1));
    m100.remove(&(C + P));
    m100.remove(&(C + 2 * P));
    let d200 = pg.dirty(&mut m200, R200, &[7]);
    pg.region(&mut m500, R500, 6);
    let (n, e) = write_cp(
        image,
        Some(4),
        &[
            Proc::dirty(100, 1000, &m100, &d100),
            Proc::dirty(200, 2000, &m200, &d200),
            Proc::dirty(300, 3500, &m300b, &BTreeSet::new()),
            Proc::full(500, 5000, &m500, false),
        ],
    );
    out.insert(n, e);

    // 6.
    let d100 = pg.dirty(&mut m100, A, &[299]);
    let mut d100b = pg.dirty(&mut m100, B, &[0]);
    d100b.extend(d100);
    let d300 = pg.dirty(&mut m300b, R300, &[1]);
    let d500 = pg.dirty(&mut m500, R500, &[5]);
    let (n, e) = write_cp(
        image,
        Some(5),
        &[
            Proc::dirty(100, 1000, &m100, &d100b),
            Proc::dirty(200, 2000, &m200, &BTreeSet::new()),
            Proc::dirty(300, 3500, &m300b, &d300),
            Proc::dirty(500, 5000, &m500, &d500),
        ],
    );
    out.insert(n, e);
    assert_eq!(
        out.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    out
}

/// The memory checkpoint `n` restores, read through `load_chain` and
/// `page_sources` (every page read from a whole, checksummed run).
fn resolve(image: &ImageDir, n: u32) -> Image {
    let chain = load_chain(image, Some(n)).unwrap_or_else(|e| panic!("chain of {n}: {e}"));
    let mut out = Image::new();
    for p in chain[0]
        .manifest
        .processes
        .iter()
        .filter(|p| p.zombie.is_none())
    {
        let mut mem = Mem::new();
        let sources =
            page_sources(&chain, p).unwrap_or_else(|e| panic!("pages of {} in {n}: {e}", p.pid));
        for s in &sources {
            for r in &s.runs {
                let whole = *s
                    .pack
                    .run_containing(r.vaddr)
                    .expect("clipped run in its pack");
                let mut buf = vec![0u8; whole.len() as usize];
                s.pack.read_run(&whole, &mut buf).expect("read_run");
                for k in 0..u64::from(r.npages) {
                    let a = r.vaddr + k * P;
                    let off = (a - whole.vaddr) as usize;
                    let old = mem.insert(a, buf[off..off + P as usize].to_vec());
                    assert!(old.is_none(), "page {a:#x} of {} from two sources", p.pid);
                }
            }
        }
        out.insert((p.pid, p.start_time), mem);
    }
    out
}

fn assert_resolves(image: &ImageDir, n: u32, expected: &Image, when: &str) {
    let got = resolve(image, n);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{when}: processes of checkpoint {n}"
    );
    for (k, mem) in expected {
        let g = &got[k];
        assert_eq!(
            g.keys().collect::<Vec<_>>(),
            mem.keys().collect::<Vec<_>>(),
            "{when}: pages of {k:?} in checkpoint {n}"
        );
        for (a, bytes) in mem {
            assert!(
                g[a] == *bytes,
                "{when}: content of page {a:#x} of {k:?} in checkpoint {n}"
            );
        }
    }
}

fn temps(image: &ImageDir) -> Vec<String> {
    fs::read_dir(image.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

fn new_image(dir: &Path) -> ImageDir {
    ImageDir::create_or_open(&dir.join("img")).unwrap()
}

#[test]
fn every_checkpoint_of_a_chain_resolves_to_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    for (n, e) in &expected {
        assert_resolves(&image, *n, e, "before gc");
        verify_checkpoint(&image.load(Some(*n)).unwrap()).unwrap();
    }
    // The test data exercises what it claims to.
    let cp4 = image.load(Some(4)).unwrap();
    let p100 = &cp4.manifest.processes[0];
    assert!(p100.pack.is_none() && p100.data_ranges.is_some());
    assert!(!expected[&4][&(100, 1000)].contains_key(&(B + 3 * P)));
    assert!(expected[&6][&(100, 1000)].contains_key(&(B + 3 * P)));
    assert!(expected[&1].contains_key(&(300, 3000)) && expected[&4].contains_key(&(300, 3500)));
    let chain = load_chain(&image, Some(6)).unwrap();
    let sources = page_sources(&chain, &chain[0].manifest.processes[0]).unwrap();
    let from: Vec<u32> = sources.iter().map(|s| s.checkpoint).collect();
    assert_eq!(
        from,
        vec![6, 5, 3, 2, 1],
        "pid 100 of 6 reads from every pack holding its pages"
    );
}

#[test]
fn gc_merges_the_oldest_kept_and_deletes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    let r = image.gc(3).unwrap();
    assert_eq!(r.kept, vec![4, 5, 6]);
    assert_eq!(r.deleted, vec![1, 2, 3]);
    let pages4: u64 = expected[&4].values().map(|m| m.len() as u64).sum();
    assert_eq!(
        r.merged,
        vec![MergeReport {
            checkpoint: 4,
            ancestors: vec![1, 2, 3],
            pages: pages4,
            bytes: r.merged[0].bytes,
        }]
    );
    assert_eq!(image.checkpoints().unwrap(), vec![4, 5, 6]);
    assert_eq!(image.latest().unwrap(), Some(6));
    assert!(temps(&image).is_empty(), "{:?}", temps(&image));
    let cp4 = image.load(Some(4)).unwrap();
    assert_eq!(cp4.manifest.parent, None);
    assert!(cp4
        .manifest
        .processes
        .iter()
        .all(|p| p.data_ranges.is_none()));
    let zombie = cp4
        .manifest
        .processes
        .iter()
        .find(|p| p.pid == 400)
        .unwrap();
    assert!(zombie.zombie.is_some() && zombie.pack.is_none());
    let packs: u64 = cp4
        .manifest
        .processes
        .iter()
        .filter_map(|p| p.pack.as_ref())
        .map(|r| r.size)
        .sum();
    assert_eq!(r.merged[0].bytes, packs);
    for n in [4, 5, 6] {
        assert_resolves(&image, n, &expected[&n], "after gc");
        verify_checkpoint(&image.load(Some(n)).unwrap()).unwrap();
    }
    // Private files, and the same manifest apart from the chain fields.
    assert_eq!(mode(cp4.dir()), 0o700);
    for e in fs::read_dir(cp4.dir()).unwrap() {
        assert_eq!(mode(&e.unwrap().path()), 0o600);
    }
    let mut m = cp4.manifest.clone();
    let dir2 = tempfile::tempdir().unwrap();
    let image2 = new_image(dir2.path());
    six_checkpoints(&image2);
    let mut orig = image2.load(Some(4)).unwrap().manifest;
    orig.parent = None;
    for (a, b) in orig.processes.iter_mut().zip(m.processes.iter_mut()) {
        a.data_ranges = None;
        a.pack = None;
        b.pack = None;
    }
    assert_eq!(orig, m);

    // A second gc has nothing left to do.
    let r = image.gc(3).unwrap();
    assert_eq!(
        (r.kept, r.deleted, r.merged.len()),
        (vec![4, 5, 6], vec![], 0)
    );
}

/// A merged checkpoint keeps its own content pack (saved file content is
/// never shared along a chain): gc copies it into the rebuilt checkpoint,
/// which then verifies and reads the same bytes.
#[test]
fn gc_merging_a_checkpoint_keeps_its_content_pack() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let mut pg = Pages(0);
    let mut mem = Mem::new();
    pg.region(&mut mem, A, 4);
    let (n1, _) = write_cp(&image, None, &[Proc::full(100, 1, &mem, false)]);
    let dirty = pg.dirty(&mut mem, A, &[1]);
    let bytes: Vec<u8> = (0..(3u32 << 20) + 5).map(|i| (i % 253) as u8).collect();
    let (n2, expected) = write_cp_with(
        &image,
        Some(n1),
        &[Proc::dirty(100, 1, &mem, &dirty)],
        Some(&bytes),
    );
    let r = image.gc(1).unwrap();
    assert_eq!((r.kept, r.deleted), (vec![n2], vec![n1]));
    assert_resolves(&image, n2, &expected, "after gc");
    let cp = image.load(Some(n2)).unwrap();
    assert_eq!(cp.manifest.parent, None);
    verify_checkpoint(&cp).unwrap();
    let src = cp.open_content().unwrap();
    let mut back = vec![0u8; bytes.len()];
    let e = &cp.manifest.ghosts[0].extents[0];
    src.read_extent::<ImageError>(e, |off, b| {
        back[off as usize..off as usize + b.len()].copy_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert!(back == bytes, "content differs after gc");
}

#[test]
fn gc_with_a_full_oldest_kept_only_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let mut pg = Pages(0);
    let mut mem = Mem::new();
    let mut expected = BTreeMap::new();
    pg.region(&mut mem, A, 10);
    expected.insert(
        1,
        write_cp(&image, None, &[Proc::full(100, 1, &mem, false)]).1,
    );
    let d = pg.dirty(&mut mem, A, &[2]);
    expected.insert(
        2,
        write_cp(&image, Some(1), &[Proc::dirty(100, 1, &mem, &d)]).1,
    );
    expected.insert(
        3,
        write_cp(&image, None, &[Proc::full(100, 1, &mem, false)]).1,
    );
    let d = pg.dirty(&mut mem, A, &[5]);
    expected.insert(
        4,
        write_cp(&image, Some(3), &[Proc::dirty(100, 1, &mem, &d)]).1,
    );
    let d = pg.dirty(&mut mem, A, &[6]);
    expected.insert(
        5,
        write_cp(&image, Some(4), &[Proc::dirty(100, 1, &mem, &d)]).1,
    );
    let cp3 = image.load(Some(3)).unwrap();
    let before = fs::symlink_metadata(cp3.dir().join("manifest.bin")).unwrap();
    let pack_before = fs::read(cp3.dir().join("pages-100.pack")).unwrap();

    let r = image.gc(3).unwrap();
    assert_eq!(r.kept, vec![3, 4, 5]);
    assert_eq!(r.deleted, vec![1, 2]);
    assert!(r.merged.is_empty());
    assert_eq!(image.checkpoints().unwrap(), vec![3, 4, 5]);
    // Checkpoint 3 is untouched: same inode, same pack bytes.
    let after = fs::symlink_metadata(cp3.dir().join("manifest.bin")).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    assert_eq!(
        fs::read(cp3.dir().join("pages-100.pack")).unwrap(),
        pack_before
    );
    for n in [3, 4, 5] {
        assert_resolves(&image, n, &expected[&n], "after a pure delete");
    }
}

#[test]
fn gc_keep_zero_is_refused_and_large_keep_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    let e = image.gc(0).unwrap_err();
    assert!(matches!(e, ImageError::KeepZero { .. }), "{e}");
    assert!(e.to_string().contains("--keep 1 or more"), "{e}");
    assert_style(&e);
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    for keep in [6, 7, 100] {
        let r = image.gc(keep).unwrap();
        assert_eq!(r.kept, vec![1, 2, 3, 4, 5, 6]);
        assert!(r.deleted.is_empty() && r.merged.is_empty());
    }
    for (n, e) in &expected {
        assert_resolves(&image, *n, e, "after gc that keeps all");
    }
    // keep = 1: the latest becomes a full checkpoint on its own.
    let r = image.gc(1).unwrap();
    assert_eq!(r.kept, vec![6]);
    assert_eq!(r.deleted, vec![1, 2, 3, 4, 5]);
    assert_eq!(r.merged[0].ancestors, vec![1, 2, 3, 4, 5]);
    assert_resolves(&image, 6, &expected[&6], "after gc --keep 1");
}

/// A kept checkpoint other than the oldest kept one may depend on a deleted
/// one (here 4's parent is 2 while 3 is full): it is merged too.
#[test]
fn gc_merges_every_kept_checkpoint_whose_parent_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let mut pg = Pages(0);
    let mut mem = Mem::new();
    let mut expected = BTreeMap::new();
    pg.region(&mut mem, A, 10);
    expected.insert(
        1,
        write_cp(&image, None, &[Proc::full(100, 1, &mem, false)]).1,
    );
    let d = pg.dirty(&mut mem, A, &[1, 2]);
    expected.insert(
        2,
        write_cp(&image, Some(1), &[Proc::dirty(100, 1, &mem, &d)]).1,
    );
    let mut other = mem.clone();
    pg.dirty(&mut other, A, &[3]);
    expected.insert(
        3,
        write_cp(&image, None, &[Proc::full(100, 1, &other, false)]).1,
    );
    let d = pg.dirty(&mut mem, A, &[4]);
    expected.insert(
        4,
        write_cp(&image, Some(2), &[Proc::dirty(100, 1, &mem, &d)]).1,
    );

    let r = image.gc(2).unwrap();
    assert_eq!(
        (r.kept.clone(), r.deleted.clone()),
        (vec![3, 4], vec![1, 2])
    );
    assert_eq!(r.merged.len(), 1);
    assert_eq!(
        (r.merged[0].checkpoint, r.merged[0].ancestors.clone()),
        (4, vec![1, 2])
    );
    assert_eq!(r.merged[0].pages, 10);
    for n in [3, 4] {
        assert_resolves(&image, n, &expected[&n], "after gc");
    }
}

/// A child that takes a page from beyond its parent (a page its parent does
/// not have) cannot survive a merge of its parent: gc refuses and changes
/// nothing.
#[test]
fn gc_refuses_to_break_a_child_that_skips_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let mut pg = Pages(0);
    let mut mem = Mem::new();
    pg.region(&mut mem, A, 4);
    write_cp(&image, None, &[Proc::full(100, 1, &mem, false)]);
    let mut without = mem.clone();
    without.remove(&(A + 2 * P));
    let d = pg.dirty(&mut without, A, &[0]);
    write_cp(&image, Some(1), &[Proc::dirty(100, 1, &without, &d)]);
    // 3 lists A+2 again without storing it: it resolves from 1, past 2.
    let mut again = without.clone();
    again.insert(A + 2 * P, mem[&(A + 2 * P)].clone());
    write_cp(
        &image,
        Some(2),
        &[Proc::dirty(100, 1, &again, &BTreeSet::new())],
    );
    resolve(&image, 3);

    let e = image.gc(2).unwrap_err();
    assert!(
        matches!(e, ImageError::GcWouldBreak { checkpoint: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("nothing was deleted"), "{e}");
    assert_style(&e);
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2, 3]);
    assert!(temps(&image).is_empty(), "{:?}", temps(&image));
    assert!(image.load(Some(2)).unwrap().manifest.parent == Some(1));
    resolve(&image, 3);
}

#[test]
fn gc_stops_on_a_corrupt_ancestor_page_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    // Checkpoint 4 takes A+100 from checkpoint 2's pack.
    let cp2 = image.load(Some(2)).unwrap();
    let pack = cp2
        .open_process_pack(&cp2.manifest.processes[0])
        .unwrap()
        .unwrap();
    let run = *pack.run_containing(A + 100 * P).unwrap();
    let path = pack.path().to_path_buf();
    drop(pack);
    let good = fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad[(run.file_off + (A + 100 * P - run.vaddr)) as usize + 7] ^= 0x40;
    fs::write(&path, &bad).unwrap();

    let e = image.gc(3).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::PageChecksum {
                checkpoint: Some(2),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    assert!(temps(&image).is_empty(), "{:?}", temps(&image));
    assert_eq!(image.load(Some(4)).unwrap().manifest.parent, Some(3));

    fs::write(&path, &good).unwrap();
    image.gc(3).unwrap();
    assert_resolves(&image, 4, &expected[&4], "after repair and gc");
}

#[test]
fn gc_is_refused_while_a_dump_holds_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    six_checkpoints(&image);
    let builder = image.begin_checkpoint().unwrap();
    let e = image.gc(3).unwrap_err();
    assert!(matches!(e, ImageError::Locked { .. }), "{e}");
    drop(builder);
    assert_eq!(image.checkpoints().unwrap(), vec![1, 2, 3, 4, 5, 6]);
}

/// Stops gc after each of its steps, as a kill would, and checks that every
/// checkpoint still listed restores exactly its memory, that the latest is
/// still 6, and that running gc again finishes the job.
#[test]
fn gc_interrupted_at_any_step_leaves_every_checkpoint_restorable() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    let mut steps = Vec::new();
    image
        .gc_with_hook(3, &mut |s| {
            steps.push(s.to_string());
            true
        })
        .unwrap();
    for want in [
        "cleaned",
        "packed 4 pid 100",
        "built 4",
        "verified",
        "exchanged 4",
        "removed old 4",
        "hid 3",
        "removed 1",
    ] {
        assert!(steps.iter().any(|s| s == want), "no step {want}: {steps:?}");
    }
    assert!(steps.len() >= 14, "{steps:?}");

    for (i, step) in steps.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let image = new_image(dir.path());
        six_checkpoints(&image);
        let mut k = 0;
        let e = image
            .gc_with_hook(3, &mut |_| {
                k += 1;
                k <= i
            })
            .unwrap_err();
        match &e {
            ImageError::GcInterrupted { step: s } => assert_eq!(s, step),
            other => panic!("stop after {step}: {other}"),
        }
        let when = format!("stopped after {step}");
        let listed = image.checkpoints().unwrap();
        for n in [4, 5, 6] {
            assert!(listed.contains(&n), "{when}: {n} missing from {listed:?}");
        }
        for n in &listed {
            assert_resolves(&image, *n, &expected[n], &when);
            verify_checkpoint(&image.load(Some(*n)).unwrap()).unwrap();
        }
        assert_eq!(image.latest().unwrap(), Some(6), "{when}");

        let r = image
            .gc(3)
            .unwrap_or_else(|e| panic!("{when}: gc again: {e}"));
        assert_eq!(r.kept, vec![4, 5, 6], "{when}");
        let merged_before = steps[..=i].iter().any(|s| s == "exchanged 4");
        assert_eq!(r.merged.is_empty(), merged_before, "{when}: {r:?}");
        assert_eq!(image.checkpoints().unwrap(), vec![4, 5, 6], "{when}");
        assert!(temps(&image).is_empty(), "{when}: {:?}", temps(&image));
        assert_eq!(image.load(Some(4)).unwrap().manifest.parent, None, "{when}");
        for n in [4, 5, 6] {
            assert_resolves(&image, n, &expected[&n], &format!("{when}, then gc"));
        }
    }
}

#[test]
fn a_reused_pid_does_not_inherit_pages() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let mut pg = Pages(0);
    let mut mem = Mem::new();
    pg.region(&mut mem, A, 2);
    write_cp(&image, None, &[Proc::full(300, 3000, &mem, false)]);
    // Another process with pid 300 lists the same pages but stores none.
    write_cp(
        &image,
        Some(1),
        &[Proc::dirty(300, 3500, &mem, &BTreeSet::new())],
    );
    // The same process (same start time) may take them from checkpoint 1.
    let (_, e3) = write_cp(
        &image,
        Some(1),
        &[Proc::dirty(300, 3000, &mem, &BTreeSet::new())],
    );
    assert_resolves(&image, 3, &e3, "same start time");

    let chain = load_chain(&image, Some(2)).unwrap();
    let e = page_sources(&chain, &chain[0].manifest.processes[0]).unwrap_err();
    assert!(
        matches!(e, ImageError::BrokenChain { checkpoint: 2, .. }),
        "{e}"
    );
    let cp2 = image.load(Some(2)).unwrap();
    assert!(verify_checkpoint(&cp2).is_err());
}

#[test]
fn summary_and_verify_describe_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let image = new_image(dir.path());
    let expected = six_checkpoints(&image);
    let s1 = summarize(&image.load(Some(1)).unwrap());
    assert!(!s1.incremental && s1.parent.is_none() && s1.track.is_empty());
    assert_eq!(s1.memory_pages, s1.total_pages);
    assert_eq!(s1.total_pages, 300 + 8 + 5);

    let s6 = summarize(&image.load(Some(6)).unwrap());
    assert!(s6.incremental);
    assert_eq!((s6.parent, s6.track.as_str()), (Some(5), "hash"));
    assert_eq!(s6.total_pages, 2 + 1 + 1);
    let memory: u64 = expected[&6].values().map(|m| m.len() as u64).sum();
    assert_eq!(s6.memory_pages, memory);
    let p100 = s6.processes.iter().find(|p| p.pid == 100).unwrap();
    assert_eq!(p100.pack_pages, 2);
    assert_eq!(p100.memory_pages, expected[&6][&(100, 1000)].len() as u64);
    let p200 = s6.processes.iter().find(|p| p.pid == 200).unwrap();
    assert_eq!((p200.pack.as_deref(), p200.pack_pages), (None, 0));
    assert_eq!(p200.memory_pages, 20);

    // Verification of an incremental checkpoint checks its chain.
    let cp6 = image.load(Some(6)).unwrap();
    verify_checkpoint(&cp6).unwrap();
    let cps = image.path().join("checkpoints");
    fs::rename(cps.join("00000002"), cps.join("moved-away")).unwrap();
    let e = verify_checkpoint(&cp6).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::BrokenChain {
                checkpoint: 3,
                parent: 2,
                ..
            }
        ),
        "{e}"
    );
    verify_checkpoint(&image.load(Some(1)).unwrap()).unwrap();
}
