//! The Python package (`python/`, a ctypes binding): a program protecting
//! a NumPy array, a bytearray and an array.array is killed at seeded random
//! moments and restarted until it finishes; its result must equal an
//! uninterrupted run's, byte for byte, in every monitoring mode. Skipped
//! (with a message) only where python3 is absent.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

fn py(dir: &Path, out: &Path, mode: &str) -> Command {
    let mut c = Command::new("python3");
    c.arg(repo().join("python/tests/iterate.py"))
        .arg(dir)
        .args(["200", "5"])
        .arg(out)
        .arg(mode)
        .env("PYTHONPATH", repo().join("python"))
        .env("STASIS_LIB", shared_lib())
        .env_remove("LD_LIBRARY_PATH");
    c
}

#[test]
fn python_program_survives_kills_in_every_mode() {
    if Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        eprintln!("SKIPPED: python3 is not installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let refout = tmp.path().join("ref.out");
    run_ok(&mut py(&tmp.path().join("ref"), &refout, "full"));
    let reference = std::fs::read(&refout).expect("reference");
    let mut rng = Rng(15);
    for mode in ["page", "acck", "uffd"] {
        let (dir, out) = (
            tmp.path().join(mode),
            tmp.path().join(format!("{mode}.out")),
        );
        for kill in 0..3 {
            let before = progress(&dir);
            let mut child = spawn(&mut py(&dir, &out, mode));
            let mut exited = false;
            wait_for("a new checkpoint", LIMIT, || {
                exited = matches!(child.0.try_wait(), Ok(Some(_)));
                exited || progress(&dir) != before
            });
            assert!(!exited, "{mode}: finished before kill {kill}");
            std::thread::sleep(Duration::from_micros(rng.below(40_000)));
            child.0.kill().expect("kill");
            let _ = child.0.wait();
        }
        let o = run_ok(&mut py(&dir, &out, mode));
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(s.contains("restarted"), "{mode}: {s}");
        assert!(
            std::fs::read(&out).expect("out") == reference,
            "{mode}: differs after 3 kills"
        );
        eprintln!(
            "{mode}: {} bytes equal after 3 kills; {}",
            reference.len(),
            s.trim()
        );
    }
}
