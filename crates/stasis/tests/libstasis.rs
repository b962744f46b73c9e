//! A program that checkpoints itself with libstasis (`crates/stasis-app`)
//! is also checkpointed from the outside, as any program: its
//! write-protected regions, its SIGSEGV handler and its own checkpoint
//! directory come back with it. `iterate.c` (the library's kill/restart
//! program: five protected regions, a library checkpoint every K
//! iterations) runs in `page` and `acck` monitoring; mid-run it is dumped
//! and killed by `stasis dump`, restored by `stasis restore`, and must end
//! with the very bytes of an uninterrupted run, without having restarted
//! from its own checkpoints (the restored process simply goes on). A
//! concurrent `--leave-running` dump mid-run must not disturb it either.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const ITERS: &str = "6000";
const K: &str = "50";

/// `target/<profile>`: where cargo put this test's `stasis` and libstasis.
fn profile_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_stasis"))
        .parent()
        .expect("target/<profile>")
        .to_path_buf()
}

/// `iterate.c` built against the libstasis of this build.
fn build_iterate(out: &Path) -> PathBuf {
    let p = profile_dir();
    let lib = [p.join("deps/libstasis.so"), p.join("libstasis.so")]
        .into_iter()
        .find(|c| c.exists())
        .expect("libstasis.so built (stasis-app is a dev-dependency)");
    let libdir = lib.parent().unwrap();
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stasis-app");
    let exe = out.join("iterate");
    let st = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Werror",
            "-std=c11",
            "-D_DEFAULT_SOURCE",
            "-I",
        ])
        .arg(app.join("../../include"))
        .arg(app.join("tests/c/iterate.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libdir.display()))
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lstasis")
        .status()
        .expect("running cc");
    assert!(st.success(), "building iterate.c failed");
    exe
}

/// `iterate DIR ITERS K OUT` in monitoring `mode`, in a session of its
/// own, its output in files (nothing shared with this test).
fn iterate(exe: &Path, dir: &Path, mode: &str) -> Command {
    let mut c = Command::new(exe);
    c.arg(dir.join("ckpt"))
        .arg(ITERS)
        .arg(K)
        .arg(dir.join("out"))
        .env("STASIS_MONITOR", mode)
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .process_group(0);
    close_inherited_fds(&mut c);
    c
}

/// Versions of the library's checkpoint "run" in `dir`.
fn versions(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("ckpt"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("run.") && n.ends_with(".ckpt")
                })
                .count()
        })
        .unwrap_or(0)
}

fn run_to_end(exe: &Path, dir: &Path, mode: &str) -> Vec<u8> {
    std::fs::create_dir_all(dir).unwrap();
    let st = iterate(exe, dir, mode).status().unwrap();
    assert!(
        st.success(),
        "{mode}: {}",
        std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
    );
    std::fs::read(dir.join("out")).unwrap()
}

/// Starts `iterate` and waits until the library has committed a version.
fn start_running(exe: &Path, dir: &Path, mode: &str) -> (std::process::Child, i32) {
    std::fs::create_dir_all(dir).unwrap();
    let child = iterate(exe, dir, mode).spawn().unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    wait_until(
        Duration::from_secs(60),
        "a first library checkpoint",
        || versions(dir) > 0,
    );
    (child, pid)
}

fn check_mode(mode: &str) {
    workloads(); // subreaper: the restored program is our orphan
    let tmp = tempfile::Builder::new()
        .prefix("stasis-libstasis-")
        .tempdir()
        .unwrap();
    let exe = build_iterate(tmp.path());
    let reference = run_to_end(&exe, &tmp.path().join("ref"), "full");

    // Dumped and killed mid-run, restored, runs to its end.
    let dir = tmp.path().join("killed");
    let (mut child, pid) = start_running(&exe, &dir, mode);
    let img = tmp.path().join("img");
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, &format!("{mode}: dump of iterate"));
    let st = child.wait().unwrap();
    assert!(
        !st.success(),
        "{mode}: iterate finished before the dump killed it"
    );
    let done_before = versions(&dir);
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, &format!("{mode}: restore of iterate"));
    assert_eq!(
        waitpid_timeout(pid, Duration::from_secs(300)),
        (Some(0), None),
        "{mode}: the restored program failed: {}",
        std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
    );
    let stdout = std::fs::read_to_string(dir.join("stdout")).unwrap();
    assert!(
        !stdout.contains("restarted"),
        "{mode}: it restarted from its own checkpoint: {stdout}"
    );
    assert!(versions(&dir) >= done_before, "{mode}");
    let got = std::fs::read(dir.join("out")).unwrap();
    assert!(
        got == reference,
        "{mode}: {} bytes after dump and restore differ from the uninterrupted run",
        got.len()
    );

    // A concurrent dump that leaves it running does not disturb it.
    let dir = tmp.path().join("concurrent");
    let (mut child, pid) = start_running(&exe, &dir, mode);
    let o = stasis()
        .args([
            "dump",
            "--leave-running",
            "--concurrent",
            "-t",
            &pid.to_string(),
            "-D",
        ])
        .arg(tmp.path().join("img2"))
        .output()
        .unwrap();
    assert_ok(&o, &format!("{mode}: concurrent dump of iterate"));
    assert!(
        child.wait().unwrap().success(),
        "{mode}: iterate failed after a concurrent dump"
    );
    assert!(
        std::fs::read(dir.join("out")).unwrap() == reference,
        "{mode}: output after a concurrent dump differs from the uninterrupted run"
    );
    eprintln!(
        "{mode}: {} bytes equal after dump+restore and after a concurrent dump; {stdout}",
        reference.len()
    );
}

#[test]
fn a_libstasis_program_in_page_mode_is_dumped_and_restored() {
    check_mode("page");
}

#[test]
fn a_libstasis_program_in_acck_mode_is_dumped_and_restored() {
    check_mode("acck");
}
