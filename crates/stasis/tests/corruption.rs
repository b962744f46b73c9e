//! Whole-image corruption campaign: every file of a checkpoint is damaged
//! at random (a flipped bit, a truncation, a zeroed range), and `stasis
//! restore` must refuse it naming the damaged file, within 10 s, leaving
//! nothing running and the other files of the image unchanged. Seeded and
//! reproducible: `STASIS_CORRUPT_SEED` (default 12) and
//! `STASIS_CORRUPT_TRIALS` (default 200); `scripts/corrupt-campaign.sh N`
//! runs a longer one.
//!
//! Files a reader is documented to tolerate (`latest`, which only points
//! at the newest checkpoint, the touch sets, which only order a lazy
//! restore, and `track/`, the dumper's dirty-tracking state, which a
//! restore does not read) must instead give a correct restore: the restored workload
//! passes its own check. A lazy restore returns before its private memory
//! has been read; damage there must make the filler kill the tree (with a
//! message naming the file) instead.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// Longest a refusal may take.
const REFUSE_LIMIT: Duration = Duration::from_secs(10);
/// After this long a restore counts as hung and is killed.
const HANG_LIMIT: Duration = Duration::from_secs(20);

/// A dumped workload: its (dead) process's directory and the pristine
/// bytes of every file of its image.
struct Image {
    label: String,
    w: Workload,
    comm: String,
    /// Every PID and TID of the dumped tree.
    tids: Vec<i32>,
    /// Relative path -> bytes, every non-empty file of the image.
    pristine: BTreeMap<PathBuf, Vec<u8>>,
    out_log: Vec<u8>,
}

/// Dumps `name args` (killing it) and keeps its image.
fn dumped(label: &str, name: &str, args: &[&str], chain: bool) -> Image {
    let mut w = Workload::start(name, args);
    let comm = comm_of(w.pid);
    let tids = tree_tids(w.pid);
    if chain {
        // A full checkpoint, then an incremental one over it with a touch
        // window: packs of two checkpoints, a parent link, touch sets.
        assert_ok(&w.dump(&["--track", "--leave-running"]), "first dump");
        assert_ok(
            &w.dump(&["--leave-running", "--touch-window", "1"]),
            "incremental dump",
        );
        kill_and_reap(&mut w);
    } else {
        w.dump_and_reap();
    }
    let images = w.images();
    if chain {
        // A recorded fault order too (what a lazy restore writes).
        let store = stasis_image::ImageDir::open(&images).unwrap();
        let cp = store.load(None).unwrap();
        let p = &cp.manifest.processes[0];
        let v = p
            .vmas
            .iter()
            .find(|v| v.end - v.start >= 4 * 4096)
            .expect("an area");
        let ts = stasis_image::touch::TouchSet {
            source: stasis_image::touch::TouchSource::Faults,
            window_ms: 0,
            procs: vec![(p.pid, vec![(v.start, 4)])],
        };
        stasis_image::touch::write_touch_set(cp.dir(), &ts).unwrap();
    }
    let pristine: BTreeMap<_, _> = files_under(&images)
        .into_iter()
        .filter(|(_, b)| !b.is_empty())
        .collect();
    let out_log = std::fs::read(w.dir.path().join("out.log")).unwrap_or_default();
    Image {
        label: label.into(),
        w,
        comm,
        tids,
        pristine,
        out_log,
    }
}

/// What a file of an image is, for the figures and the rules.
fn kind_of(rel: &Path) -> &'static str {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name {
        "manifest.bin" => "manifest",
        "STASIS-IMAGE" => "marker",
        "latest" => "latest",
        "touch-window" | "touch-faults" => "touch set",
        _ if rel.starts_with("track") => "tracking state",
        n if n.starts_with("pages-") => "page pack",
        _ => "other",
    }
}

/// Files whose damage a reader tolerates by design (see the module doc).
fn tolerated(rel: &Path) -> bool {
    matches!(kind_of(rel), "latest" | "touch set" | "tracking state")
}

/// Damage that changes no meaning: the marker's closing newline (the
/// reader takes its two lines with or without it; it holds no data).
fn harmless(rel: &Path, d: Damage, len: usize) -> bool {
    kind_of(rel) == "marker" && matches!(d, Damage::Truncate { len: l } if l + 1 == len as u64)
}

fn ix(v: u64) -> usize {
    usize::try_from(v).unwrap()
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip { off: u64, bit: u8 },
    Truncate { len: u64 },
    Zero { off: u64, len: u64 },
}

fn damage(bytes: &[u8], d: Damage) -> Vec<u8> {
    let mut b = bytes.to_vec();
    match d {
        Damage::Flip { off, bit } => b[ix(off)] ^= 1 << bit,
        Damage::Truncate { len } => b.truncate(ix(len)),
        Damage::Zero { off, len } => b[ix(off)..ix(off + len)].fill(0),
    }
    b
}

/// Picks a damage that changes `bytes`; offsets favour the header and the
/// tail (index, trailer) as much as the (large) data in between.
fn pick_damage(rng: &mut Rng, bytes: &[u8]) -> Damage {
    let n = bytes.len() as u64;
    loop {
        let off = match rng.below(3) {
            0 => rng.below(n.min(4096)),
            1 => n - 1 - rng.below(n.min(65536)),
            _ => rng.below(n),
        };
        let d = match rng.below(3) {
            0 => Damage::Flip {
                off,
                bit: u8::try_from(rng.below(8)).unwrap(),
            },
            1 => Damage::Truncate { len: off },
            _ => Damage::Zero {
                off,
                len: 1 + rng.below((n - off).min(65536)),
            },
        };
        if damage(bytes, d) != bytes {
            return d;
        }
    }
}

/// Saved PIDs of `img` still held by a process of the workload.
fn leftovers(img: &Image) -> Vec<i32> {
    img.tids
        .iter()
        .copied()
        .filter(|&t| Path::new(&format!("/proc/{t}")).exists() && comm_of(t) == img.comm)
        .collect()
}

#[derive(Default)]
struct Figures {
    trials: u64,
    refused: u64,
    lazy_killed: u64,
    tolerated_ok: u64,
    hangs: u64,
    panics: u64,
    wrong: u64,
    retried_new_pidns: u64,
    max_refuse: Duration,
    by_kind: BTreeMap<&'static str, u64>,
    failures: Vec<String>,
}

/// SIGTERMs the restored root and says whether the workload passed its
/// own check.
fn finish_restored(img: &Image, root: i32) -> bool {
    // SAFETY: signalling the restored workload.
    unsafe { libc::kill(root, libc::SIGTERM) };
    let (code, sig) = waitpid_timeout(root, Duration::from_secs(60));
    let out = img.w.out();
    (code, sig) == (Some(0), None) && out.lines().last() == Some("PASS")
}

fn one_trial(img: &Image, rel: &Path, d: Damage, lazy: bool, new_pidns: bool, f: &mut Figures) {
    let images = img.w.images();
    let path = images.join(rel);
    let orig = &img.pristine[rel];
    std::fs::write(img.w.dir.path().join("out.log"), &img.out_log).unwrap();
    std::fs::write(&path, damage(orig, d)).unwrap();
    let log = img.w.dir.path().join("lazy.log");
    let _ = std::fs::remove_file(&log);
    let what = format!(
        "{} {} {d:?}{}{}",
        img.label,
        rel.display(),
        if lazy { " --lazy" } else { "" },
        if new_pidns { " --new-pidns" } else { "" }
    );

    let mut c = stasis();
    c.args(["restore", "--detach", "--pid-wait", "2", "-D"])
        .arg(&images);
    if lazy {
        c.arg("--lazy").arg("--lazy-log").arg(&log);
    }
    if new_pidns {
        c.arg("--new-pidns");
    }
    let (code, err, elapsed, hung) = run_bounded(c, HANG_LIMIT);
    // The checkpoint directory and file name, as the message must give them.
    let named = {
        let tail: PathBuf = rel
            .iter()
            .rev()
            .take(2)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let tail = tail.to_string_lossy().into_owned();
        move |text: &str| text.contains(&tail)
    };
    let mut outcome = String::new();
    if hung {
        f.hangs += 1;
        f.failures.push(format!("{what}: HUNG (> {HANG_LIMIT:?})"));
    } else if err.contains("panicked") {
        f.panics += 1;
        f.failures.push(format!("{what}: PANIC: {err}"));
    } else if code != Some(0) {
        if err.contains("is in use by a running process") && !new_pidns {
            // An unrelated process took a saved PID meanwhile: do it again
            // in a new PID namespace.
            std::fs::write(&path, orig).unwrap();
            for p in reap_children(Duration::from_secs(5)) {
                f.failures.push(format!("{what}: left child {p:?}"));
            }
            f.retried_new_pidns += 1;
            return one_trial(img, rel, d, lazy, true, f);
        }
        f.refused += 1;
        f.max_refuse = f.max_refuse.max(elapsed);
        outcome = "refused".into();
        if elapsed > REFUSE_LIMIT {
            f.failures
                .push(format!("{what}: refused after {elapsed:?}"));
        }
        if !named(&err) && !tolerated(rel) {
            f.failures
                .push(format!("{what}: the message does not name the file: {err}"));
        }
    } else {
        // The restore went through: the tree runs (the restorer is gone,
        // so its root is our child now: this test is a subreaper).
        let root = my_children().into_iter().find(|&c| comm_of(c) == img.comm);
        if tolerated(rel) || harmless(rel, d, orig.len()) {
            match root {
                Some(r) if finish_restored(img, r) => {
                    f.tolerated_ok += 1;
                    outcome = "tolerated, restored correctly".into();
                }
                _ => {
                    f.wrong += 1;
                    f.failures.push(format!(
                        "{what}: restored despite damage, and wrongly: {}",
                        img.w.out()
                    ));
                }
            }
        } else if lazy {
            // The filler must find the damage and kill the tree.
            let t0 = Instant::now();
            while t0.elapsed() < REFUSE_LIMIT && root.is_some_and(alive) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // The filler says why once it has killed the tree: wait for it
            // (and its guard) to end.
            let helpers_left = reap_children(Duration::from_secs(5));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if !helpers_left.is_empty() {
                f.failures.push(format!(
                    "{what}: filler or guard still there after the tree was killed: {helpers_left:?}"
                ));
            }
            if root.is_some_and(alive) {
                f.wrong += 1;
                let ok = root.is_some_and(|r| finish_restored(img, r));
                f.failures.push(format!(
                    "{what}: lazy restore of a damaged image still runs after {REFUSE_LIMIT:?} (self-check {})",
                    if ok { "PASS" } else { "FAIL" }
                ));
            } else {
                f.lazy_killed += 1;
                f.max_refuse = f.max_refuse.max(t0.elapsed() + elapsed);
                outcome = "lazy tree killed by the filler".into();
                if !named(&text) {
                    f.failures.push(format!(
                        "{what}: the filler's message does not name the file: {text}"
                    ));
                }
            }
        } else {
            f.wrong += 1;
            let ok = root.is_some_and(|r| finish_restored(img, r));
            f.failures.push(format!(
                "{what}: WRONG RESTORE: a damaged image was restored (self-check {})",
                if ok { "PASS" } else { "FAIL" }
            ));
        }
    }
    // Nothing left: no process of the tree, no filler or guard, no zombie.
    for p in reap_children(Duration::from_secs(5)) {
        f.failures
            .push(format!("{what}: left a process behind: {p:?}"));
        // SAFETY: killing a stray child of this test.
        unsafe { libc::kill(p.0, libc::SIGKILL) };
        reap_if_ours(p.0);
    }
    let left = leftovers(img);
    if !left.is_empty() {
        f.failures.push(format!(
            "{what}: saved PIDs {left:?} still held by the workload"
        ));
        for p in left {
            // SAFETY: cleaning up after a failed trial.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    // The image: every other file unchanged (a lazy restore that ran to
    // the end may record the fault order), then put back.
    let now = files_under(&images);
    for (r, bytes) in &img.pristine {
        if r == rel {
            continue;
        }
        if now.get(r) != Some(bytes) && !(code == Some(0) && lazy && r.ends_with("touch-faults")) {
            f.failures
                .push(format!("{what}: the restore changed {}", r.display()));
        }
    }
    for (r, _) in now
        .iter()
        .filter(|(r, b)| !b.is_empty() && !img.pristine.contains_key(*r))
    {
        if !(code == Some(0) && lazy && r.ends_with("touch-faults")) {
            f.failures
                .push(format!("{what}: the restore created {}", r.display()));
        }
        let _ = std::fs::remove_file(images.join(r));
    }
    for (r, bytes) in &img.pristine {
        if now.get(r) != Some(bytes) {
            std::fs::write(images.join(r), bytes).unwrap();
        }
    }
    f.trials += 1;
    *f.by_kind.entry(kind_of(rel)).or_default() += 1;
    if std::env::var_os("STASIS_CORRUPT_VERBOSE").is_some() {
        eprintln!("{what}: {outcome} in {elapsed:?}");
    }
}

/// `stasis inspect` must report damage to any file a restore refuses.
fn inspect_reports(img: &Image, rel: &Path, d: Damage, f: &mut Figures) {
    let images = img.w.images();
    let path = images.join(rel);
    std::fs::write(&path, damage(&img.pristine[rel], d)).unwrap();
    let mut c = stasis();
    c.args(["inspect", "-D"]).arg(&images);
    let (code, err, _, hung) = run_bounded(c, HANG_LIMIT);
    std::fs::write(&path, &img.pristine[rel]).unwrap();
    let tail: PathBuf = rel
        .iter()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if hung
        || err.contains("panicked")
        || code == Some(0)
        || !err.contains(&*tail.to_string_lossy())
    {
        f.failures.push(format!(
            "inspect of {} {} {d:?}: exit {code:?}, hung {hung}: {err}",
            img.label,
            rel.display()
        ));
    }
}

fn campaign(seed: u64, trials: u64) {
    workloads();
    let images = [
        dumped("heap", "heap", &["4"], false),
        dumped("threads", "threads", &[], false),
        dumped("tree", "tree", &[], false),
        dumped("chain", "chain_writer", &["4"], true),
    ];
    end_track_keepers();
    let mut rng = Rng(seed);
    let mut f = Figures::default();
    // Every file of every image once first, then at random.
    let all: Vec<(usize, PathBuf)> = images
        .iter()
        .enumerate()
        .flat_map(|(i, img)| img.pristine.keys().map(move |r| (i, r.clone())))
        .collect();
    for t in 0..trials.max(all.len() as u64) {
        let (i, rel) = if ix(t) < all.len() {
            all[ix(t)].clone()
        } else {
            let i = ix(rng.below(images.len() as u64));
            let keys: Vec<_> = images[i].pristine.keys().cloned().collect();
            (i, keys[ix(rng.below(keys.len() as u64))].clone())
        };
        let img = &images[i];
        let d = pick_damage(&mut rng, &img.pristine[&rel]);
        let lazy = t % 4 == 3;
        one_trial(img, &rel, d, lazy, false, &mut f);
        if t % 8 == 0 && !tolerated(&rel) && !harmless(&rel, d, img.pristine[&rel].len()) {
            inspect_reports(img, &rel, d, &mut f);
        }
    }
    eprintln!(
        "corruption campaign (seed {seed}): {} trials ({:?}); {} refused, {} lazy trees killed by the filler, {} tolerated and restored correctly; {} hangs, {} panics, {} wrong restores; {} retried in a new PID namespace; slowest refusal {:?}; {} problems",
        f.trials,
        f.by_kind,
        f.refused,
        f.lazy_killed,
        f.tolerated_ok,
        f.hangs,
        f.panics,
        f.wrong,
        f.retried_new_pidns,
        f.max_refuse,
        f.failures.len()
    );
    assert!(
        f.failures.is_empty(),
        "{} problems:\n{}",
        f.failures.len(),
        f.failures.join("\n")
    );
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The tests of this file count this process's children: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The hang of issue 12: a bit flipped in the page data of a
/// multi-threaded process made the restorer kill the half-built tree and
/// then wait for its root forever, while the root's other threads, traced
/// by the restorer, stayed zombies that only the restorer could reap.
#[test]
fn damaged_page_of_a_multithreaded_process_is_refused_and_every_thread_reaped() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    workloads();
    let img = dumped("threads", "threads", &[], false);
    let rel = img
        .pristine
        .keys()
        .find(|r| kind_of(r) == "page pack")
        .expect("a pack")
        .clone();
    // In the page data, well past the header.
    let off = (img.pristine[&rel].len() as u64 / 2) & !4095;
    let mut f = Figures::default();
    one_trial(
        &img,
        &rel,
        Damage::Flip {
            off: off + 100,
            bit: 3,
        },
        false,
        false,
        &mut f,
    );
    assert_eq!((f.refused, f.hangs), (1, 0), "{:#?}", f.failures);
    assert!(f.failures.is_empty(), "{:#?}", f.failures);
    assert!(f.max_refuse < REFUSE_LIMIT);
}

/// The second hang: in a lazy restore the filler found a damaged run and
/// killed the tree while the restorer was still building it; the
/// restorer, waiting for the main thread's next stop, waited forever (the
/// other threads, traced, were zombies nobody reaped). One in three
/// restores hung before the watchdog.
#[test]
fn lazy_restore_whose_filler_kills_the_tree_mid_build_fails_promptly() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    workloads();
    let img = dumped("threads", "threads", &[], false);
    let rel = img
        .pristine
        .keys()
        .find(|r| kind_of(r) == "page pack")
        .expect("a pack")
        .clone();
    let mut f = Figures::default();
    for _ in 0..10 {
        let d = Damage::Zero {
            off: 4096,
            len: (img.pristine[&rel].len() as u64 / 2) & !4095,
        };
        one_trial(&img, &rel, d, true, false, &mut f);
    }
    assert_eq!(f.hangs, 0, "{:#?}", f.failures);
    assert!(f.failures.is_empty(), "{:#?}", f.failures);
    assert_eq!(f.refused + f.lazy_killed, 10);
    assert!(f.max_refuse < REFUSE_LIMIT);
}

/// A wrong restore the campaign found (not caused by the damage): a lazy
/// restore of `chain_writer` sometimes left a page the restored process had
/// dropped (`MADV_DONTNEED`) holding image data again. The filler copied a
/// run it had claimed before the process dropped part of it: the kernel
/// lets copies through as soon as the event is read, before the filler had
/// applied it. (Before the fix it went wrong once in a 600-trial campaign
/// and in 2 of 6 lazy restores of one debugging run, on a busy machine;
/// this test did not make it happen again on demand with the old filler:
/// it checks that such restores stay exact.)
/// Damaging only `latest` leaves the image exact.
#[test]
fn lazy_restore_never_refills_a_page_the_process_dropped_meanwhile() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    workloads();
    let mut f = Figures::default();
    for _ in 0..3 {
        let img = dumped("chain", "chain_writer", &["4"], true);
        end_track_keepers();
        for _ in 0..3 {
            let d = Damage::Zero { off: 0, len: 1 };
            one_trial(&img, Path::new("latest"), d, true, false, &mut f);
        }
    }
    assert!(f.failures.is_empty(), "{:#?}", f.failures);
    assert_eq!(f.tolerated_ok, 9);
}

/// Ends the dirty-tracking keepers the incremental dumps left (not what
/// is tested here).
fn end_track_keepers() {
    for (pid, cmd) in reap_children(Duration::from_millis(100)) {
        assert!(cmd.contains("__track-keeper"), "stray child {pid}: {cmd}");
        // SAFETY: ending a helper of our own dumps.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        reap_if_ours(pid);
    }
}

#[test]
fn damaged_images_are_refused_naming_the_file_in_bounded_time_leaving_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    campaign(
        env_u64("STASIS_CORRUPT_SEED", 12),
        env_u64("STASIS_CORRUPT_TRIALS", 200),
    );
}
