//! Incremental checkpoints, end to end: chains restored link by link, the
//! dirty sets each backend finds, lost tracking, `stasis run`, and `stasis
//! gc` killed at many points.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// `dump --json` with `extra`; returns the report.
fn dump_json(w: &Workload, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let o = w.dump(&args);
    assert_ok(&o, "dump");
    json(&o)
}

/// A chain of 10 checkpoints of the self-verifying writer (memory a pure
/// function of its counter; areas mapped, unmapped, moved and madvised
/// while it runs), each restored in turn: every one matches exactly.
fn chain_of_ten(backend: &str, args: &[&str]) {
    let mut w = Workload::start("chain_writer", args);
    let mut thp_seen = 0;
    for k in 1..=10u64 {
        std::thread::sleep(Duration::from_millis(120));
        if k == 1 {
            thp_seen = anon_huge_kib(w.pid);
        }
        let r = dump_json(&w, &["--leave-running", "--track", backend]);
        assert_eq!(r["checkpoint"], k, "{r}");
        if k == 1 {
            assert!(r["parent"].is_null(), "first dump must be full: {r}");
        } else {
            assert_eq!(r["parent"], k - 1, "dump {k} must be incremental: {r}");
            assert_eq!(r["track"], backend, "{r}");
        }
        assert_eq!(r["armed"], backend, "{r}");
        assert!(alive(w.pid));
    }
    // The writer asks for transparent huge pages on its main area: the
    // chain started with some (unless THP is off on this machine). With
    // uffd the kernel splits a protected huge page at its first write.
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if args[0].parse::<u32>().unwrap_or(0) >= 32 && !thp.contains("[never]") {
        assert!(thp_seen > 0, "no huge page in the writer");
    }
    kill_and_reap(&mut w);
    for k in 1..=10u32 {
        w.restore(&["--checkpoint", &k.to_string()]);
        // Stop at once: the check then sees the memory of checkpoint k
        // (plus at most one more iteration, which it replays too).
        w.finish_pass();
    }
}

/// `AnonHugePages` of a process, in KiB.
fn anon_huge_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn chain_of_ten_uffd() {
    chain_of_ten("uffd", &["64"]);
}

#[test]
fn chain_of_ten_hash() {
    chain_of_ten("hash", &["64"]);
}

/// The writer forks a child after a few checkpoints: the child is new in
/// the chain (saved whole), the parent stays incremental.
#[test]
fn chain_of_ten_with_a_fork_midway() {
    chain_of_ten("uffd", &["32", "400"]);
}

// ---------------------------------------------------------------------
// Dirty sets.

fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const NPAGES: u64 = 32 << 20 >> 12;

/// What round `r` of `dirty_set` leaves changed and present (see
/// tests/workloads/dirty_set.c): written pages, minus the 16 dropped.
fn expected_round(r: u64) -> BTreeSet<u64> {
    let dropped = (16 * r) % NPAGES;
    (0..NPAGES)
        .filter(|p| mix64(r * 100_003 + p).is_multiple_of(8))
        .filter(|p| !(dropped..dropped + 16).contains(p))
        .collect()
}

fn wait_file(path: &Path, want: &str) {
    let t0 = Instant::now();
    while std::fs::read_to_string(path).unwrap_or_default().trim() != want {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{} never said {want}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs three rounds of known writes between dumps with `backend`; returns
/// the pages of the region each incremental checkpoint saved.
fn dirty_sets(backend: &str) -> Vec<BTreeSet<u64>> {
    let mut w = Workload::start("dirty_set", &[]);
    let region = std::fs::read_to_string(w.dir.path().join("pid.region")).unwrap();
    let base = u64::from_str_radix(region.split_whitespace().next().unwrap(), 16).unwrap();
    let r = dump_json(&w, &["--leave-running", "--track", backend]);
    assert!(r["parent"].is_null());
    let mut sets = Vec::new();
    for round in 1..=3u32 {
        // SAFETY: signalling our workload.
        unsafe { libc::kill(w.pid, libc::SIGUSR1) };
        wait_file(&w.dir.path().join("pid.ack"), &round.to_string());
        // No --track: the dump follows the tracking armed by the last one.
        let r = dump_json(&w, &["--leave-running"]);
        assert_eq!(r["parent"], round, "{r}");
        sets.push(pages_in_pack(&w.images(), round + 1, base, NPAGES));
    }
    // The last link restores with the dropped pages reading as zero.
    kill_and_reap(&mut w);
    w.restore(&[]);
    w.finish_pass();
    sets
}

/// Both backends save exactly the pages written (and still present)
/// between two checkpoints: nothing more inside the region, nothing less.
/// (They differ only where the documented rules say: uffd reports a page
/// rewritten with identical bytes, hash does not; this workload always
/// changes what it writes.)
#[test]
fn uffd_and_hash_find_the_same_dirty_sets() {
    let uffd = dirty_sets("uffd");
    let hash = dirty_sets("hash");
    for r in 0..3 {
        let want = expected_round(r as u64 + 1);
        assert!(want.len() > 500, "the workload writes a real set");
        assert_eq!(uffd[r], want, "uffd, round {}", r + 1);
        assert_eq!(hash[r], want, "hash, round {}", r + 1);
    }
}

// ---------------------------------------------------------------------
// Tracking state.

/// If the userfaultfd holder dies, the kernel unregisters the areas: the
/// next dump notices, saves everything and says why.
#[test]
fn lost_tracking_gives_a_full_dump_with_a_note() {
    let w = Workload::start("heap", &["16"]);
    let r = dump_json(&w, &["--leave-running", "--track", "uffd"]);
    assert_eq!(r["armed"], "uffd");
    let name = stasis_track::keeper::socket_name(&w.images());
    let keeper = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&name))
                .unwrap_or(false)
        })
        .expect("a keeper process holds the userfaultfd");
    // SAFETY: killing the keeper this test started.
    unsafe { libc::kill(keeper, libc::SIGKILL) };
    wait_until(Duration::from_secs(60), "the keeper's death", || {
        !alive(keeper)
    });
    let full = r["pages"].as_u64().unwrap();
    let r = dump_json(&w, &["--leave-running"]);
    let note = r["note"].as_str().unwrap_or("");
    assert!(note.contains("no longer armed"), "{r}");
    assert!(
        r["pages"].as_u64().unwrap() * 10 >= full * 9,
        "everything saved again: {r}"
    );
    // Tracking is armed anew by that dump: the one after is incremental.
    let r = dump_json(&w, &["--leave-running"]);
    assert_eq!(r["parent"], 2, "{r}");
    let mut w = w;
    w.finish_pass();
}

/// soft-dirty: on a kernel without it (this CI machine), asking for it is
/// refused by name and nothing is dumped; where it exists, it works.
#[test]
fn soft_dirty_is_used_or_refused_clearly() {
    let mut w = Workload::start("heap", &["8"]);
    let o = w.dump(&["--leave-running", "--track", "soft-dirty"]);
    if o.status.success() {
        let r = dump_json(&w, &["--leave-running"]);
        assert_eq!(r["track"], "soft-dirty", "{r}");
    } else {
        assert_fails_with(&o, "soft-dirty is not available here");
        assert_fails_with(&o, "--track auto");
        assert!(alive(w.pid));
        assert!(!w.images().join("checkpoints/00000001").exists());
    }
    w.finish_pass();
}

// ---------------------------------------------------------------------
// stasis run.

fn run_cmd(dir: &Path, args: &[&str], job: &[&str]) -> std::process::Child {
    let mut c = stasis();
    c.arg("run")
        .arg("-D")
        .arg(dir)
        .args(args)
        .arg("--")
        .args(job);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().expect("stasis run")
}

#[test]
fn run_checkpoints_periodically_and_exits_with_the_job_status() {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    // The job runs until the test has seen an incremental checkpoint.
    let stop = d.path().join("stop");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.1; done; exit 3",
        stop.display()
    );
    let mut child = run_cmd(&img, &["--every", "0.3"], &["/bin/sh", "-c", &script]);
    let mut lines = Lines::new(child.stdout.take().unwrap());
    lines.wait_for(Duration::from_secs(120), |l| l.contains(": incremental,"));
    std::fs::write(&stop, b"").unwrap();
    lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    let out = format!(
        "{}\n{}",
        lines.seen.join("\n"),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(out.contains("checkpoint 1: full"), "{out}");
    // (A dump that races with the exit of one of the shell's `sleep`
    // children fails harmlessly; the one after it is full again.)
    assert!(out.contains(": incremental,"), "{out}");
    assert!(out.contains("exited with status 3"), "{out}");
    assert!(
        !out.contains(" 0 pages"),
        "a dump of nothing was committed: {out}"
    );
}

#[test]
fn run_restarts_a_crashed_job_from_its_latest_checkpoint() {
    run_restarts(false);
}

/// The same, restarting lazily (`--lazy-restart`): the checkpoints after
/// the restart wait for the fill, and the job still checks out.
#[test]
fn run_restarts_a_crashed_job_lazily() {
    run_restarts(true);
}

fn run_restarts(lazy: bool) {
    let dir = workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let bin = dir.join("chain_writer");
    let mut args = vec!["--every", "0.25", "--restart-on-failure", "--json"];
    if lazy {
        args.push("--lazy-restart");
    }
    let mut child = run_cmd(
        &img,
        &args,
        &[bin.to_str().unwrap(), pidfile.to_str().unwrap(), "32"],
    );
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    // A few checkpoints, then crash the job.
    for _ in 0..3 {
        lines.wait_event(Duration::from_secs(60), "checkpoint");
    }
    // SAFETY: killing the job under test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // The job comes back at its pid; two checkpoints of it, then stop it.
    lines.wait_event(Duration::from_secs(60), "restored");
    assert!(alive(pid), "the job was not restored");
    for _ in 0..2 {
        lines.wait_event(Duration::from_secs(60), "checkpoint");
    }
    // SAFETY: stopping the restored job.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let restored = events
        .iter()
        .find(|e| e["event"] == "restored")
        .expect(&out);
    assert_eq!(restored["pid"], pid);
    assert_eq!(
        restored["lazy_bytes"].as_u64().unwrap() > 0,
        lazy,
        "{restored}"
    );
    let after: Vec<_> = events
        .iter()
        .skip_while(|e| e["event"] != "restored")
        .filter(|e| e["event"] == "checkpoint")
        .collect();
    assert!(
        after.len() >= 2,
        "checkpoints go on after the restart: {out}"
    );
    assert_eq!(o.status.code(), Some(0), "{out}");
    let log = std::fs::read_to_string(img.join("job.log")).unwrap();
    assert_eq!(log.lines().last(), Some("PASS"), "{log}");
}

// `--shm-file`: an object in /dev/shm that the job names but neither maps
// nor holds (as PostgreSQL's dynamic shared memory segments) is saved
// with each checkpoint; the job frees it and crashes, and the restart puts
// it back, byte for byte, before the job runs again.
#[test]
fn run_puts_back_a_shm_object_the_job_freed() {
    let content: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    run_puts_back_shm("small", |f| f.write_all_at(&content, 0).unwrap());
}

// The same with an object of 200 MiB holding 80 MiB of data in two runs
// (issue 17: more than 64 MiB was refused, the content went into the
// manifest): back byte for byte, its holes still holes.
#[test]
fn run_puts_back_a_shm_object_of_80_mib_the_job_freed() {
    let back = run_puts_back_shm("big", |f| {
        let mut piece = vec![0u8; 1 << 20];
        for (r, at) in [(0u64, 4u64 << 20), (1, (150 << 20) + 12345)] {
            for i in 0..40u64 {
                for (j, b) in piece.iter_mut().enumerate() {
                    *b = (j as u64 ^ (r << 7) ^ (i * 13)).to_le_bytes()[0];
                }
                f.write_all_at(&piece, at + (i << 20)).unwrap();
            }
        }
        f.set_len(200 << 20).unwrap();
    });
    assert!(
        back.blocks() * 512 < 82 << 20,
        "{} bytes allocated: the holes were filled",
        back.blocks() * 512
    );
}

/// `run --shm-file` of a job that names an object in /dev/shm, made by
/// `fill`; the job frees it and crashes; the restart must put it back
/// byte for byte. Returns the metadata of the object put back.
fn run_puts_back_shm(tag: &str, fill: impl Fn(&std::fs::File)) -> std::fs::Metadata {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let name = format!("stasis-test-run-{tag}-{}", std::process::id());
    let shm = Path::new("/dev/shm").join(&name);
    fill(&std::fs::File::create_new(&shm).unwrap());
    let content = std::fs::read(&shm).unwrap();
    let stop = d.path().join("stop");
    let script = format!(
        "import os,time\nopen('{}','w').write(str(os.getpid()))\n\
         while not os.path.exists('{}'): time.sleep(0.05)",
        pidfile.display(),
        stop.display()
    );
    let pattern = format!("stasis-test-run-{tag}-*");
    let mut child = run_cmd(
        &img,
        &[
            "--every",
            "0.3",
            "--restart-on-failure",
            "--json",
            "--shm-file",
            &pattern,
        ],
        &["python3", "-c", &script],
    );
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    lines.wait_event(Duration::from_secs(60), "checkpoint");
    std::fs::remove_file(&shm).unwrap();
    // SAFETY: killing the job under test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    lines.wait_event(Duration::from_secs(60), "restored");
    let back = std::fs::read(&shm);
    let meta = std::fs::metadata(&shm);
    std::fs::write(&stop, b"").unwrap();
    let out = lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&shm);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let back = back.expect("the object the job freed is back");
    assert!(
        back == content,
        "{} bytes back, not the {} saved ones",
        back.len(),
        content.len()
    );
    meta.unwrap()
}

#[test]
fn run_every_auto_uses_youngs_formula() {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    // The shell waits for its `sleep` child, which the test ends once the
    // first checkpoint has said what interval it picked.
    let mut child = run_cmd(
        &img,
        &["--every", "auto", "--mtbf", "20s"],
        &["/bin/sh", "-c", "sleep 1000; exit 0"],
    );
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let started = lines.wait_for(Duration::from_secs(60), |l| l.starts_with("job "));
    let pid: i32 = started.split_whitespace().nth(1).unwrap().parse().unwrap();
    lines.wait_for(Duration::from_secs(120), |l| l.contains("(Young: sqrt(2 x"));
    for k in descendants(pid) {
        // SAFETY: ending the job's own `sleep`.
        unsafe { libc::kill(k, libc::SIGTERM) };
    }
    let out = lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{out}");
    let job = ["/bin/sh", "-c", "sleep 2.5"];
    let bad = run_cmd(&img, &["--every", "auto"], &job)
        .wait_with_output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--mtbf"));
}

// ---------------------------------------------------------------------
// gc.

fn copy_dir(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

fn inspect_ok(images: &Path) -> serde_json::Value {
    let o = stasis()
        .args(["inspect", "--json", "-D"])
        .arg(images)
        .output()
        .unwrap();
    assert_ok(&o, "inspect");
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `stasis gc --keep 3` on a chain of 6, SIGKILLed at many points: every
/// kept checkpoint still verifies and restores, and a second gc finishes
/// the job.
#[test]
fn gc_killed_at_any_point_keeps_every_kept_checkpoint_restorable() {
    let mut w = Workload::start("chain_writer", &["32"]);
    for _ in 1..=6 {
        std::thread::sleep(Duration::from_millis(100));
        dump_json(&w, &["--leave-running", "--track", "uffd"]);
    }
    kill_and_reap(&mut w);
    let template = w.dir.path().join("template");
    copy_dir(&w.images(), &template);
    // How long an uninterrupted gc takes.
    let t0 = Instant::now();
    let o = stasis()
        .args(["gc", "--keep", "3", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_ok(&o, "gc");
    let full = t0.elapsed();
    std::fs::remove_dir_all(w.images()).unwrap();
    let points = 6;
    for i in 0..points {
        copy_dir(&template, &w.images());
        let mut gc = stasis()
            .args(["gc", "--keep", "3", "-D"])
            .arg(w.images())
            .spawn()
            .unwrap();
        std::thread::sleep(full * i / (points - 1));
        let _ = gc.kill();
        let _ = gc.wait();
        let v = inspect_ok(&w.images());
        let listed: Vec<u64> = v
            .as_array()
            .expect("a list of checkpoints")
            .iter()
            .map(|c| {
                assert_eq!(c["verified"], true, "kill point {i}: {c}");
                c["number"].as_u64().unwrap()
            })
            .collect();
        for k in 4..=6u32 {
            assert!(listed.contains(&u64::from(k)), "kill point {i}: {listed:?}");
            w.restore(&["--checkpoint", &k.to_string()]);
            w.finish_pass();
        }
        // A second gc completes it: only 4, 5, 6 remain, 4 is full.
        let o = stasis()
            .args(["gc", "--keep", "3", "-D"])
            .arg(w.images())
            .output()
            .unwrap();
        assert_ok(&o, "gc after a kill");
        let store = stasis_image::ImageDir::open(&w.images()).unwrap();
        assert_eq!(store.checkpoints().unwrap(), vec![4, 5, 6]);
        assert_eq!(store.load(Some(4)).unwrap().manifest.parent, None);
        w.restore(&["--checkpoint", "6"]);
        w.finish_pass();
        std::fs::remove_dir_all(w.images()).unwrap();
    }
}

/// `exec` between two checkpoints: the new program's areas are not tracked
/// (a new address space), so the dump saves it whole and says why; the
/// dump after that is incremental again, and the chain restores.
#[test]
fn exec_between_checkpoints_saves_the_new_program_whole() {
    let heap = workloads().join("heap");
    let d = tempfile::tempdir().unwrap();
    let (pidfile, go, img) = (
        d.path().join("pid"),
        d.path().join("go"),
        d.path().join("img"),
    );
    let log = std::fs::File::create(d.path().join("out.log")).unwrap();
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; exec {} {} 8",
        go.display(),
        heap.display(),
        pidfile.display()
    );
    let mut c = std::process::Command::new("/bin/sh");
    c.args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    close_inherited_fds(&mut c);
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let _cleanup = KillOnDrop(pid);
    // The shell runs (the child has left the test binary for /bin/sh).
    let me = std::fs::read_link("/proc/self/exe").unwrap();
    wait_until(Duration::from_secs(60), "the shell to start", || {
        std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e != me)
    });
    let dump = |extra: &[&str]| {
        let o = stasis()
            .args(["dump", "--json", "-t", &pid.to_string(), "-D"])
            .arg(&img)
            .args(extra)
            .output()
            .unwrap();
        assert_ok(&o, "dump");
        json(&o)
    };
    let first = dump(&["--leave-running", "--track", "uffd"]);
    assert!(first["parent"].is_null());
    std::fs::write(&go, b"").unwrap();
    assert_eq!(wait_pidfile(&pidfile, Duration::from_secs(10)), pid);
    let second = dump(&["--leave-running"]);
    assert!(second["parent"].is_null(), "{second}");
    assert!(
        second["note"].as_str().unwrap_or("").contains("exec"),
        "{second}"
    );
    // heap's 8 MiB are in the second checkpoint.
    assert!(second["pages"].as_u64().unwrap() > 2048, "{second}");
    std::thread::sleep(Duration::from_millis(100));
    let third = dump(&["--leave-running"]);
    assert_eq!(third["parent"], 2, "{third}");
    assert!(third["pages"].as_u64().unwrap() < 1024, "{third}");
    child.kill().unwrap();
    child.wait().unwrap();
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "restore");
    // SAFETY: stopping the restored workload.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let (code, _) = waitpid_timeout(pid, Duration::from_secs(30));
    let out = std::fs::read_to_string(d.path().join("out.log")).unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.lines().last(), Some("PASS"), "{out}");
}
