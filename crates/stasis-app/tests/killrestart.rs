//! A C program protects five regions, checkpoints every K iterations, is
//! SIGKILLed at seeded random moments and restarted from the newest
//! version until it finishes: its final memory must equal an uninterrupted
//! run's, byte for byte, in every monitoring mode.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const ITERS: &str = "300";
const K: &str = "5";
const KILLS: usize = 6;
const LIMIT: Duration = Duration::from_secs(120);

/// `mode` is a monitoring mode, optionally `+pmem` for that target.
fn cmd(exe: &Path, dir: &Path, out: &Path, mode: &str) -> Command {
    let mut c = Command::new(exe);
    let (monitor, target) = mode.split_once('+').unwrap_or((mode, "dir"));
    c.arg(dir)
        .arg(ITERS)
        .arg(K)
        .arg(out)
        .env("STASIS_MONITOR", monitor)
        .env("STASIS_TARGET", target)
        .env_remove("LD_LIBRARY_PATH");
    c
}

fn setup(tag: &str) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("stasis-app-{tag}"))
        .tempdir()
        .expect("tempdir");
    let exe = build_c("iterate.c", tmp.path());
    let (dir, out) = (tmp.path().join("ref"), tmp.path().join("ref.out"));
    run_ok(&mut cmd(&exe, &dir, &out, "full"));
    let reference = std::fs::read(&out).expect("reference output");
    (tmp, exe, reference)
}

/// Kills the program `KILLS` times, each a seeded random delay after it
/// committed a new version, then lets it finish (fewer times if a
/// restarted run reaches its end during a delay). Returns its output and
/// the last run's stdout.
fn killed_run(exe: &Path, root: &Path, mode: &str, seed: u64) -> (Vec<u8>, String) {
    let (dir, out) = (
        root.join(format!("{mode}-dir")),
        root.join(format!("{mode}.out")),
    );
    let mut rng = Rng(seed);
    let mut kills = 0;
    loop {
        let before = progress(&dir);
        let mut child = spawn(&mut cmd(exe, &dir, &out, mode));
        if kills < KILLS {
            let mut exited = false;
            wait_for("a new checkpoint", LIMIT, || {
                exited = matches!(child.0.try_wait(), Ok(Some(_)));
                exited || progress(&dir) != before
            });
            if !exited {
                std::thread::sleep(Duration::from_micros(rng.below(30_000)));
                child.0.kill().expect("kill");
            }
            let o = std::mem::replace(&mut child.0, Command::new("true").spawn().expect("true"))
                .wait_with_output()
                .expect("wait");
            if o.status.success() {
                // It finished before the kill: during the delay (the sleep
                // overshoots on a busy machine), or before committing a
                // new version (restarted from the one its last run had
                // committed after its final iteration). A restarted run
                // that ran to its end, so the last one.
                assert!(
                    kills > 0,
                    "{mode}: the program finished before the first kill"
                );
                eprintln!("{mode}: finished on its own before kill {}", kills + 1);
                let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
                return (std::fs::read(&out).expect("output"), stdout);
            }
            assert!(
                !exited,
                "{mode}: run {} failed on its own: {}{}",
                kills + 1,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            kills += 1;
            continue;
        }
        let mut c = KillOnDrop(std::mem::replace(
            &mut child.0,
            Command::new("true").spawn().expect("true"),
        ));
        let o = std::mem::replace(&mut c.0, Command::new("true").spawn().expect("true"))
            .wait_with_output()
            .expect("wait");
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{mode}: final run failed: {stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        return (std::fs::read(&out).expect("output"), stdout);
    }
}

fn check_mode(mode: &str, seed: u64) {
    let (tmp, exe, reference) = setup(mode);
    // Uninterrupted, in this mode.
    let (dir, out) = (tmp.path().join("plain"), tmp.path().join("plain.out"));
    let o = run_ok(&mut cmd(&exe, &dir, &out, mode));
    assert_eq!(
        std::fs::read(&out).expect("out"),
        reference,
        "{mode}: uninterrupted run differs"
    );
    let plain = String::from_utf8_lossy(&o.stdout).into_owned();
    // Killed and restarted.
    let (got, stdout) = killed_run(&exe, tmp.path(), mode, seed);
    assert!(
        stdout.contains("restarted "),
        "{mode}: the last run did not restart: {stdout}"
    );
    assert_eq!(got.len(), reference.len());
    assert!(
        got == reference,
        "{mode}: output after {KILLS} kills differs from the uninterrupted run"
    );
    eprintln!(
        "{mode}: {} bytes equal after {KILLS} kills; {}",
        got.len(),
        plain.trim()
    );
}

#[test]
fn full_mode_survives_kills() {
    check_mode("full", 1);
}

#[test]
fn page_mode_survives_kills() {
    check_mode("page", 2);
}

#[test]
fn acck_mode_survives_kills() {
    check_mode("acck", 3);
}

#[test]
fn uffd_mode_survives_kills() {
    check_mode("uffd", 4);
}

#[test]
fn pmem_full_mode_survives_kills() {
    check_mode("full+pmem", 5);
}

#[test]
fn pmem_page_mode_survives_kills() {
    check_mode("page+pmem", 6);
}

#[test]
fn pmem_acck_mode_survives_kills() {
    check_mode("acck+pmem", 7);
}

#[test]
fn pmem_uffd_mode_survives_kills() {
    check_mode("uffd+pmem", 8);
}

#[test]
fn pmem_a_kill_during_a_checkpoint_leaves_the_previous_version() {
    let (tmp, exe, reference) = setup("pmemhold");
    let (dir, out, marker) = (
        tmp.path().join("d"),
        tmp.path().join("o"),
        tmp.path().join("held"),
    );
    let mut c = cmd(&exe, &dir, &out, "acck+pmem");
    c.env(
        "STASIS_APP_TEST_HOLD_COMMIT",
        format!("{}:3", marker.display()),
    );
    let mut child = spawn(&mut c);
    wait_for("the third commit to be held", LIMIT, || marker.exists());
    child.0.kill().expect("kill");
    let _ = child.0.wait();
    // Slot of version 5 was invalidated and rewritten with 15, not published.
    let o = run_ok(&mut cmd(&exe, &dir, &out, "acck+pmem"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("restarted 10"), "{stdout}");
    assert!(std::fs::read(&out).expect("out") == reference);
}

#[test]
fn a_kill_during_a_checkpoint_leaves_the_previous_version() {
    let (tmp, exe, reference) = setup("hold");
    let (dir, out, marker) = (
        tmp.path().join("d"),
        tmp.path().join("o"),
        tmp.path().join("held"),
    );
    let mut c = cmd(&exe, &dir, &out, "acck");
    c.env(
        "STASIS_APP_TEST_HOLD_COMMIT",
        format!("{}:3", marker.display()),
    );
    let mut child = spawn(&mut c);
    wait_for("the third commit to be held", LIMIT, || marker.exists());
    child.0.kill().expect("kill");
    let _ = child.0.wait();
    // Version 15 was written and fsynced but never renamed into place.
    assert_eq!(versions(&dir, "run"), vec![5, 10]);
    let tmps: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".run.15.ckpt.tmp."))
        .collect();
    assert_eq!(
        tmps.len(),
        1,
        "the half-made checkpoint is left as a temporary file"
    );
    let o = run_ok(&mut cmd(&exe, &dir, &out, "acck"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("restarted 10"), "{stdout}");
    assert!(std::fs::read(&out).expect("out") == reference);
    assert!(
        !std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".tmp.")),
        "init removed the dead writer's temporary file"
    );
}

#[test]
fn a_damaged_newest_version_falls_back_to_the_previous_one() {
    let (tmp, exe, reference) = setup("damaged");
    let (dir, out) = (tmp.path().join("d"), tmp.path().join("o"));
    run_ok(&mut cmd(&exe, &dir, &out, "page"));
    // The newest two, and the parents their deltas need (a chain is at most 8 deep).
    let v = versions(&dir, "run");
    assert_eq!(v[v.len() - 2..], [295, 300]);
    assert!(v.len() <= 2 + 8, "{v:?}");
    let newest = dir.join("run.300.ckpt");
    let mut b = std::fs::read(&newest).expect("read");
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(&newest, &b).expect("write");
    let o = run_ok(&mut cmd(&exe, &dir, &out, "page"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("restarted 295"), "{stdout}");
    assert!(
        std::fs::read(&out).expect("out") == reference,
        "redone from 295, the result is exact"
    );
}
