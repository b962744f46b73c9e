//! Concurrent dumps (`dump --leave-running --concurrent`): the tree runs on
//! while its memory is copied from copy-on-write snapshots, and every image
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

/// The self-verifying writer (memory a function of its counter; it maps,
/// unmaps, moves and madvises areas all the time) is dumped concurrently
/// 20 times in a row while it writes as fast as it can; each image
/// restores to exactly the state of its freeze. The snapshots are gone
/// afterwards (no process or zombie left).
#[test]
fn writer_dumped_concurrently_20_times_restores_exactly() {
    let mut w = Workload::start("chain_writer", &["256"]);
    let before = descendants(w.pid);
    for k in 1..=20u64 {
        std::thread::sleep(Duration::from_millis(80));
        let o = w.dump(&["--leave-running", "--concurrent", "--json"]);
        assert_ok(&o, "dump --concurrent");
        let r = json(&o);
        assert_eq!(r["checkpoint"], k);
        let c = &r["concurrent"];
        assert!(c["pages_after_release"].as_u64().unwrap() > 60_000, "{r}");
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

/// A tight copy-on-write cap stops the writer until the copy is done; the
/// image is still exact.
#[test]
fn cow_cap_pauses_the_writer_and_the_image_is_exact() {
    let mut w = Workload::start("chain_writer", &["128"]);
    std::thread::sleep(Duration::from_millis(100));
    let o = w.dump(&[
        "--leave-running",
        "--concurrent",
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

/// The dumper SIGKILLed in the middle of the copy: the process runs on
/// unharmed, its snapshot dies with the dumper, and no checkpoint is
/// committed.
#[test]
fn dumper_killed_mid_copy_leaves_the_process_running() {
    let mut w = Workload::start("chain_writer", &["512"]);
    std::thread::sleep(Duration::from_millis(200));
    let before = descendants(w.pid);
    let mut dumper = stasis()
        .args([
            "dump",
            "--leave-running",
            "--concurrent",
            "-t",
            &w.pid.to_string(),
            "-D",
        ])
        .arg(w.images())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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

/// `stasis run --concurrent`: periodic concurrent checkpoints (incremental
/// after the first), the job unharmed, the last image exact.
#[test]
fn run_concurrent_checkpoints_periodically() {
    let dir = workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let bin = dir.join("chain_writer");
    let child = stasis()
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
    let pid = wait_pidfile(&pidfile, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1300));
    // SAFETY: stopping the job under test.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
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
