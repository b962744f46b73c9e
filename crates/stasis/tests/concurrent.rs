//! Concurrent dumps (`dump --leave-running --concurrent`): the tree runs on
//! while its memory is copied (write-protected with a userfaultfd and its
//! faults handled, or from copy-on-write fork snapshots), and every image
//! holds exactly the memory of its freeze instant.

mod common;
use common::*;

use std::time::{Duration, Instant};

/// Live processes (not zombies) among `pids`.
fn running(pids: &[i32]) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .map(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Userfaultfd descriptors in the process's own fd table (there must be
/// none: the dumper creates them inside it, takes them out and closes
/// them there).
fn uffds_in(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains("userfaultfd"))
                .count()
        })
        .unwrap_or(0)
}

/// `stasis dump --leave-running --concurrent --cow-method METHOD` of `w`,
/// in the background.
fn spawn_dumper(w: &Workload, method: &str) -> std::process::Child {
    stasis()
        .args([
            "dump",
            "--leave-running",
            "--concurrent",
            "--cow-method",
            method,
            "-t",
        ])
        .arg(w.pid.to_string())
        .arg("-D")
        .arg(w.images())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// After a killed dumper: no checkpoint was committed, and the workload
/// passes its own check.
fn assert_nothing_committed_and_pass(w: &mut Workload) {
    let store = stasis_image::ImageDir::open(&w.images());
    assert!(
        store
            .map(|s| s.checkpoints().unwrap_or_default())
            .unwrap_or_default()
            .is_empty(),
        "a checkpoint was committed"
    );
    w.finish_pass();
}

/// The test: the self-verifying writer over 1 GiB (memory a pure
/// function of its counter, no layout changes), writing as fast as it can,
/// is dumped concurrently (write-protection) 20 times in a row; each image
/// is restored at once into a new PID namespace (the original runs on) and
/// must pass the writer's byte-for-byte check of the state at its freeze.
#[test]
fn writer_1gib_write_protected_20_times_each_image_exact() {
    let mut w = Workload::start("chain_writer", &["1024", "0", "0"]);
    std::thread::sleep(Duration::from_millis(300));
    let pidfile = w.dir.path().join("ns.pid");
    for k in 1..=20 {
        let o = w.dump(&[
            "--leave-running",
            "--concurrent",
            "--cow-method",
            "uffd",
            "--json",
        ]);
        assert_ok(&o, "dump --concurrent --cow-method uffd");
        let r = json(&o);
        let c = &r["concurrent"];
        assert_eq!(c["method"], "uffd", "{r}");
        assert!(c["fallback"].is_null(), "{r}");
        // 1 GiB of pages, written after the release.
        assert!(c["pages_after_release"].as_u64().unwrap() >= 262_144, "{r}");
        // The writer ran during the copy and its writes were handled.
        assert!(c["write_faults"].as_u64().unwrap() > 0, "{r}");
        let (p50, p99) = (
            c["fault_p50_us"].as_f64().unwrap(),
            c["fault_p99_us"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
        assert!(r["frozen_us"].as_u64() < r["total_us"].as_u64(), "{r}");
        assert!(alive(w.pid));
        assert_eq!(uffds_in(w.pid), 0, "a userfaultfd was left in the process");
        // This image, restored beside the original, passes its check.
        let _ = std::fs::remove_file(&pidfile);
        let o = stasis()
            .args(["restore", "--detach", "--new-pidns", "--json", "--pidfile"])
            .arg(&pidfile)
            .arg("-D")
            .arg(w.images())
            .output()
            .unwrap();
        assert_ok(&o, "restore --new-pidns");
        let rr = json(&o);
        let outer = wait_pidfile(&pidfile, Duration::from_secs(10));
        let init = i32::try_from(rr["init_pid"].as_i64().unwrap()).unwrap();
        // SAFETY: signalling the restored copy.
        unsafe { libc::kill(outer, libc::SIGTERM) };
        assert_eq!(
            waitpid_timeout(init, Duration::from_secs(60)),
            (Some(0), None),
            "image {k} did not restore to the state of its freeze: {}",
            w.out()
        );
        // Keep the disk use to one image.
        drop_checkpoints(&w);
    }
    w.finish_pass();
}

/// The self-verifying writer that also maps, unmaps, moves and madvises
/// areas all the time is dumped concurrently (`--cow-method auto`) 20 times
/// in a row while it writes as fast as it can; each image restores to
/// exactly the state of its freeze. A write-protected copy that the
/// process defeats (it gave back memory not yet saved) is redone from a
/// fork snapshot, and says so. No snapshot or userfaultfd is left behind.
#[test]
fn writer_dumped_concurrently_20_times_restores_exactly() {
    let mut w = Workload::start("chain_writer", &["128"]);
    let before = descendants(w.pid);
    for k in 1..=20u64 {
        std::thread::sleep(Duration::from_millis(80));
        let o = w.dump(&["--leave-running", "--concurrent", "--json"]);
        assert_ok(&o, "dump --concurrent");
        let r = json(&o);
        assert_eq!(r["checkpoint"], k);
        let c = &r["concurrent"];
        match c["method"].as_str() {
            Some("uffd") => assert!(c["fallback"].is_null(), "{r}"),
            Some("fork") => assert!(c["fallback"].is_string(), "{r}"),
            _ => panic!("{r}"),
        }
        assert_eq!(uffds_in(w.pid), 0, "a userfaultfd was left in the process");
        assert!(c["pages_after_release"].as_u64().unwrap() > 30_000, "{r}");
        // The writer ran during the copy (it faulted on pages it wrote).
        assert!(c["write_faults"].as_u64().unwrap() > 0, "{r}");
        assert!(r["frozen_us"].as_u64() < r["total_us"].as_u64(), "{r}");
        assert!(alive(w.pid));
        assert_eq!(descendants(w.pid), before, "a snapshot is left behind");
    }
    kill_and_reap(&mut w);
    for k in 1..=20u32 {
        w.restore(&["--checkpoint", &k.to_string()]);
        w.finish_pass();
    }
}

/// Concurrent and incremental together: tracking is collected and re-armed
/// in the freeze, the dirty set is copied from the snapshot.
#[test]
fn concurrent_incremental_chain_restores_exactly() {
    let mut w = Workload::start("chain_writer", &["64"]);
    for k in 1..=5u64 {
        std::thread::sleep(Duration::from_millis(80));
        let o = w.dump(&[
            "--leave-running",
            "--concurrent",
            "--track",
            "uffd",
            "--json",
        ]);
        assert_ok(&o, "dump --concurrent --track");
        let r = json(&o);
        if k > 1 {
            assert_eq!(r["parent"], k - 1, "{r}");
        }
        assert!(r["concurrent"].is_object(), "{r}");
    }
    kill_and_reap(&mut w);
    for k in 1..=5u32 {
        w.restore(&["--checkpoint", &k.to_string()]);
        w.finish_pass();
    }
}

/// Shared memory across a tree (the snapshot shares it with the process,
/// so it is read during the freeze) comes back shared and exact.
#[test]
fn shared_memory_tree_concurrent() {
    let mut w = Workload::start("shm", &[]);
    std::thread::sleep(Duration::from_millis(200));
    let o = w.dump(&["--leave-running", "--concurrent"]);
    assert_ok(&o, "dump --concurrent");
    // SIGKILL, not SIGTERM: the original must not delete its /dev/shm file.
    kill_and_reap(&mut w);
    w.restore(&[]);
    w.finish_pass();
}

/// Fork snapshots: a tight copy-on-write cap stops the writer until the
/// copy is done; the image is still exact.
#[test]
fn cow_cap_pauses_the_writer_and_the_image_is_exact() {
    let mut w = Workload::start("chain_writer", &["128"]);
    std::thread::sleep(Duration::from_millis(100));
    let o = w.dump(&[
        "--leave-running",
        "--concurrent",
        "--cow-method",
        "fork",
        "--cow-buffer",
        "1M",
        "--json",
    ]);
    assert_ok(&o, "dump --concurrent --cow-buffer 1M");
    let r = json(&o);
    assert!(r["concurrent"]["paused"].as_u64().unwrap() >= 1, "{r}");
    kill_and_reap(&mut w);
    w.restore(&[]);
    w.finish_pass();
}

/// Write-protection: with a side buffer of one grain, writers wait for the
/// copier instead of the buffer growing; the image is still exact.
#[test]
fn side_buffer_cap_makes_writers_wait_and_the_image_is_exact() {
    let mut w = Workload::start("chain_writer", &["256", "0", "0"]);
    std::thread::sleep(Duration::from_millis(100));
    let o = w.dump(&[
        "--leave-running",
        "--concurrent",
        "--cow-method",
        "uffd",
        "--cow-buffer",
        "64K",
        "--json",
    ]);
    assert_ok(&o, "dump --concurrent --cow-buffer 64K");
    let r = json(&o);
    let c = &r["concurrent"];
    assert_eq!(c["method"], "uffd", "{r}");
    assert!(c["writer_waits"].as_u64().unwrap() >= 1, "{r}");
    assert!(c["writer_wait_us"].as_u64().unwrap() > 0, "{r}");
    assert!(c["cow_peak_bytes"].as_u64().unwrap() <= 64 << 10, "{r}");
    kill_and_reap(&mut w);
    w.restore(&[]);
    w.finish_pass();
}

/// Write-protection: the dumper SIGKILLed in the middle of the copy. The
/// kernel drops the protection with the dumper's userfaultfds, so the
/// process runs on (it is checked afterwards), no checkpoint is committed
/// and no userfaultfd is left in it.
#[test]
fn dumper_killed_mid_write_protected_copy_leaves_the_process_running() {
    let mut w = Workload::start("chain_writer", &["512", "0", "0"]);
    std::thread::sleep(Duration::from_millis(200));
    let mut dumper = spawn_dumper(&w, "uffd");
    // The copy is under way once a checkpoint is being written and the
    // dumper has its fault handler thread.
    let handler = format!("cow-{}", w.pid);
    let t0 = Instant::now();
    loop {
        let has_handler = std::fs::read_dir(format!("/proc/{}/task", dumper.id()))
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                    .any(|c| c.trim() == handler)
            })
            .unwrap_or(false);
        let writing = std::fs::read_dir(w.images().join("checkpoints"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            })
            .unwrap_or(false);
        if has_handler && writing {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the copy never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    dumper.kill().unwrap();
    dumper.wait().unwrap();
    assert!(alive(w.pid));
    assert_eq!(uffds_in(w.pid), 0, "a userfaultfd was left in the process");
    std::thread::sleep(Duration::from_millis(300));
    assert_nothing_committed_and_pass(&mut w);
}

/// Removes every checkpoint of `w`'s image directory (each dump of the
/// loops below is full: the disk holds one at a time).
fn drop_checkpoints(w: &Workload) {
    for e in std::fs::read_dir(w.images().join("checkpoints")).unwrap() {
        let _ = std::fs::remove_dir_all(e.unwrap().path());
    }
}

/// `--cow-method uffd` on a process that gives memory back during the copy
/// fails (the tree runs on, nothing is committed) rather than save a
/// wrong image; `--cow-method auto` redoes such a dump from a fork
/// snapshot, and its image is exact.
#[test]
fn memory_given_back_during_the_copy() {
    let mut w = Workload::start("chain_writer", &["256"]);
    std::thread::sleep(Duration::from_millis(100));
    // Until the writer gives back a page not yet saved during a copy (it
    // does every 32 iterations): attempts until a deadline, not a count,
    // as a loaded machine runs the writer less during each copy.
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut refused = false;
    while std::time::Instant::now() < deadline {
        let o = w.dump(&[
            "--leave-running",
            "--concurrent",
            "--cow-method",
            "uffd",
            "--json",
        ]);
        if !o.status.success() {
            assert_fails_with(&o, "the dump was abandoned");
            refused = true;
            break;
        }
        drop_checkpoints(&w);
    }
    assert!(refused, "the writer never gave back memory during a copy");
    assert!(alive(w.pid));
    assert_eq!(uffds_in(w.pid), 0, "a userfaultfd was left in the process");
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut fell_back = None;
    while std::time::Instant::now() < deadline {
        let o = w.dump(&["--leave-running", "--concurrent", "--json"]);
        assert_ok(&o, "dump --concurrent");
        let r = json(&o);
        if r["concurrent"]["method"] == "fork" {
            assert!(r["concurrent"]["fallback"].is_string(), "{r}");
            fell_back = Some(r["checkpoint"].as_u64().unwrap());
            break;
        }
        drop_checkpoints(&w);
    }
    let k = fell_back.expect("no dump fell back to a fork snapshot");
    kill_and_reap(&mut w);
    w.restore(&["--checkpoint", &k.to_string()]);
    w.finish_pass();
}

/// `--cow-method uffd` cannot share the areas with dirty tracking's own
/// userfaultfd: refused with a message, the process untouched.
#[test]
fn uffd_method_with_tracking_is_refused() {
    let mut w = Workload::start("counter", &[]);
    let o = w.dump(&[
        "--leave-running",
        "--concurrent",
        "--cow-method",
        "uffd",
        "--track",
        "uffd",
    ]);
    assert_fails_with(&o, "cannot be used with dirty tracking");
    assert!(alive(w.pid));
    w.finish_pass();
}

/// Fork snapshots: the dumper SIGKILLed in the middle of the copy: the
/// process runs on unharmed, its snapshot dies with the dumper, and no
/// checkpoint is committed.
#[test]
fn dumper_killed_mid_copy_leaves_the_process_running() {
    let mut w = Workload::start("chain_writer", &["512"]);
    std::thread::sleep(Duration::from_millis(200));
    let before = descendants(w.pid);
    let mut dumper = spawn_dumper(&w, "fork");
    // Wait until the snapshot exists (the copy has started), then kill.
    let t0 = Instant::now();
    while descendants(w.pid).len() == before.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no snapshot appeared"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(30));
    dumper.kill().unwrap();
    dumper.wait().unwrap();
    let t0 = Instant::now();
    while running(&descendants(w.pid)).len() > before.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the snapshot outlived the dumper"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(alive(w.pid));
    std::thread::sleep(Duration::from_millis(200));
    assert_nothing_committed_and_pass(&mut w);
}

/// `stasis run --concurrent`: periodic concurrent checkpoints (incremental
/// after the first), the job unharmed, the last image exact.
#[test]
fn run_concurrent_checkpoints_periodically() {
    let dir = workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let bin = dir.join("chain_writer");
    let mut child = stasis()
        .arg("run")
        .arg("-D")
        .arg(&img)
        .args(["--every", "0.2", "--concurrent", "--json", "--"])
        .arg(&bin)
        .arg(&pidfile)
        .arg("64")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    // Three checkpoints, however long they take on a busy machine.
    for _ in 0..3 {
        lines.wait_event(Duration::from_secs(60), "checkpoint");
    }
    // SAFETY: stopping the job under test.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let cps: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "checkpoint")
        .collect();
    assert!(cps.len() >= 3, "{out}");
    assert!(cps.iter().all(|c| c["concurrent"].is_object()), "{out}");
    assert!(
        cps.iter().skip(1).any(|c| c["kind"] == "incremental"),
        "{out}"
    );
    let log = std::fs::read_to_string(img.join("job.log")).unwrap();
    assert_eq!(log.lines().last(), Some("PASS"), "{log}");
    // The last checkpoint restores exactly.
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    if !o.status.success() {
        let ps = std::process::Command::new("ps")
            .args(["-eo", "pid,ppid,stat,comm"])
            .output()
            .unwrap();
        eprintln!(
            "job {pid}; me {}\n{}\n{out}",
            std::process::id(),
            String::from_utf8_lossy(&ps.stdout)
        );
    }
    assert_ok(&o, "restore");
    // SAFETY: stopping the restored job.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let (code, _) = waitpid_timeout(pid, Duration::from_secs(30));
    let log = std::fs::read_to_string(img.join("job.log")).unwrap();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(log.lines().last(), Some("PASS"), "{log}");
}

/// `zdtm_mix64` of tests/workloads/zdtm.h (splitmix64's finalizer).
fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `stasis run --concurrent --cow-method uffd`: the write-protection of each
/// concurrent copy is kept as the tracking (TIC-CKPT-CI). `dirty_set`
/// rewrites a known eighth of its 32 MiB region on SIGUSR1, once, then not
/// at all: the checkpoints after it save every page written (a lone write
/// its page, neighbouring writes their 64 KiB grain), nothing else of the
/// region and less than the region, and a
/// later one saves none of the region; the latest checkpoint restores
/// exactly. (On a busy machine the round may fall in the checkpoint after
/// the expected one, or straddle a freeze: the pages saved are counted
/// over every checkpoint since the round was asked for.)
#[test]
fn run_concurrent_protection_tracks_only_the_written_pages() {
    use std::collections::BTreeSet;
    const NPAGES: u64 = 32 << 8;
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let mut child = stasis()
        .arg("run")
        .arg("-D")
        .arg(&img)
        .args([
            "--every",
            "1",
            "--concurrent",
            "--cow-method",
            "uffd",
            "--json",
            "--",
        ])
        .arg(workloads().join("dirty_set"))
        .arg(&pidfile)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _run = KillOnDrop(child.id() as i32);
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    // A failed check must not leave the job (or its restored self) running.
    let _job = KillOnDrop(pid);
    let region = std::fs::read_to_string(d.path().join("pid.region")).unwrap();
    let base = u64::from_str_radix(region.split_whitespace().next().unwrap(), 16).unwrap();
    let mut next_checkpoint = || lines.wait_event(Duration::from_secs(60), "checkpoint");
    let region_pages =
        |n: u64| -> BTreeSet<u64> { pages_in_pack(&img, u32::try_from(n).unwrap(), base, NPAGES) };
    // The first checkpoint after the job is ready: the whole region.
    let mut e = next_checkpoint();
    while (region_pages(e["checkpoint"].as_u64().unwrap()).len() as u64) < NPAGES {
        e = next_checkpoint();
    }
    assert_eq!(e["concurrent"]["method"], "uffd", "{e}");
    // Round 1 after this checkpoint.
    // SAFETY: signalling the job under test.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    let ack = d.path().join("pid.ack");
    wait_until(Duration::from_secs(60), "the ack of round 1", || {
        std::fs::read_to_string(&ack).unwrap_or_default().trim() == "1"
    });
    let dropped = 16..32u64;
    let written: BTreeSet<u64> = (0..NPAGES)
        .filter(|p| mix64(100_003 + p).is_multiple_of(8) && !dropped.contains(p))
        .collect();
    // Saved: what the round wrote, the dropped pages (a freeze may have
    // seen them written), and the whole 64 KiB grain (16 pages) where the
    // round wrote two neighbouring pages (a write next to a page already
    // written lifts its grain; a lone write lifts its page), nothing else.
    let pair_grains: BTreeSet<u64> = written
        .iter()
        .filter(|&&p| p % 16 != 15 && written.contains(&(p + 1)))
        .map(|p| p / 16)
        .collect();
    let allowed =
        |p: &u64| written.contains(p) || dropped.contains(p) || pair_grains.contains(&(p / 16));
    let lone = written
        .iter()
        .filter(|p| !pair_grains.contains(&(*p / 16)))
        .count();
    assert!(lone > 100, "the round should write lone pages too ({lone})");
    // The checkpoints after `e` until every written page is saved, then
    // one more: nothing written in the region since, nothing of it saved.
    let mut saved = BTreeSet::new();
    let mut complete = false;
    let mut later = 0;
    while later == 0 {
        let e1 = next_checkpoint();
        let n1 = e1["checkpoint"].as_u64().unwrap();
        assert_eq!(e1["kind"], "incremental", "{e1}");
        assert_eq!(e1["track"], "uffd-wp", "{e1}");
        assert_eq!(e1["concurrent"]["method"], "uffd", "{e1}");
        let pages = region_pages(n1);
        let extra: Vec<_> = pages.iter().filter(|p| !allowed(p)).collect();
        assert!(extra.is_empty(), "saved but not written: {extra:?}\n{e1}");
        if complete {
            assert!(pages.is_empty(), "{e1}");
            later = n1;
        }
        saved.extend(pages);
        complete = saved.is_superset(&written);
        assert!(
            n1 <= e["checkpoint"].as_u64().unwrap() + 10,
            "a written page was not saved by checkpoint {n1}"
        );
    }
    assert!((saved.len() as u64) < NPAGES, "{saved:?}");
    // SAFETY: stopping the job under test.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The latest checkpoint restores exactly (round 1 applied).
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "restore");
    // SAFETY: stopping the restored job.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let (code, _) = waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(code, Some(0), "the restored job failed its check");
}

/// A process whose stdin is the read end of a pipe nobody writes any more
/// (the other end closed): a fork snapshot of a concurrent dump holds that
/// end too, and must not count as a process outside the tree holding the
/// pipe (an MPI rank's stdin, say, in every `cluster run` round).
#[test]
fn a_fork_snapshot_is_no_outside_holder_of_a_pipe() {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let mut c = std::process::Command::new("sleep");
    c.arg("600")
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().unwrap();
    // Neither end stays here: the command holds the read end until dropped.
    drop(c);
    drop(tx);
    let pid = i32::try_from(child.id()).unwrap();
    let _kill = KillOnDrop(pid);
    for n in 1..=2 {
        let o = stasis()
            .args([
                "dump",
                "--leave-running",
                "--concurrent",
                "--cow-method",
                "fork",
                "-t",
            ])
            .arg(pid.to_string())
            .arg("-D")
            .arg(d.path())
            .output()
            .unwrap();
        assert_ok(
            &o,
            &format!("concurrent fork dump {n} of a process reading a pipe"),
        );
    }
    assert!(child.try_wait().unwrap().is_none(), "the process died");
}
