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

/// The libstasis.so of this build.
fn shared_lib() -> PathBuf {
    let p = profile_dir();
    [p.join("deps/libstasis.so"), p.join("libstasis.so")]
        .into_iter()
        .find(|c| c.exists())
        .expect("libstasis.so built (stasis-app is a dev-dependency)")
}

/// `iterate.c` built against the libstasis of this build.
fn build_iterate(out: &Path) -> PathBuf {
    build_c("iterate", out)
}

/// `crates/stasis-app/tests/c/NAME.c` built against the libstasis of this
/// build.
fn build_c(name: &str, out: &Path) -> PathBuf {
    let lib = shared_lib();
    let libdir = lib.parent().unwrap();
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stasis-app");
    let exe = out.join(name);
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
        .arg(app.join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libdir.display()))
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lstasis")
        .status()
        .expect("running cc");
    assert!(st.success(), "building {name}.c failed");
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

const REQ_ITERS: &str = "3000";
const REQ1: &str = "1000";
const REQ2: &str = "2000";

/// `request DIR ITERS REQ1 REQ2 OUT MARK` in `dir`, output in files.
fn request_cmd(exe: &Path, dir: &Path, mode: &str) -> Command {
    std::fs::create_dir_all(dir).unwrap();
    let mut c = Command::new(exe);
    c.arg(dir.join("ckpt"))
        .args([REQ_ITERS, REQ1, REQ2])
        .arg(dir.join("out"))
        .arg(dir.join("mark"))
        .env("STASIS_MONITOR", mode)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("STASIS_RUN_REQUEST");
    c
}

/// The pid a file holds, once it holds one; `why` says what went wrong
/// when it never does.
fn pid_in(path: &Path, why: impl Fn() -> String) -> i32 {
    let t0 = std::time::Instant::now();
    loop {
        let pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if pid > 0 {
            return pid;
        }
        let w = why();
        assert!(
            t0.elapsed() < Duration::from_secs(120) && !w.contains(" exited "),
            "no mark: {w}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `request.c` asks `stasis run` for a checkpoint at iteration REQ1: the
/// call returns 0 once checkpoint 1 is committed (`stasis inspect` shows
/// it), the program runs on and is SIGKILLed, `stasis run` restores it
/// from that checkpoint, where the same call returns `STASIS_RESTORED`;
/// its second request (a new connection) takes checkpoint 2, and it ends
/// with the bytes of an uninterrupted run.
fn check_request(mode: &str, concurrent: bool) {
    let tmp = tempfile::Builder::new()
        .prefix("stasis-request-")
        .tempdir()
        .unwrap();
    let exe = build_c("request", tmp.path());
    // Outside `stasis run`: NOT_UNDER_RUN (-13), and it runs straight through.
    let refdir = tmp.path().join("ref");
    let o = request_cmd(&exe, &refdir, mode).output().unwrap();
    assert_ok(&o, &format!("{mode}: request outside stasis run"));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("request 1: -13 not running under `stasis run`")
            && text.contains("request 2: -13"),
        "{text}"
    );
    let reference = std::fs::read(refdir.join("out")).unwrap();

    let dir = tmp.path().join("run");
    let img = tmp.path().join("img");
    let mut run = stasis();
    run.args(["run", "--every", "1h", "--restart-on-failure", "-D"])
        .arg(&img);
    if concurrent {
        run.arg("--concurrent");
    }
    run.arg("--")
        .arg(&exe)
        .args(request_cmd(&exe, &dir, mode).get_args());
    run.env("STASIS_MONITOR", mode)
        .stdout(std::fs::File::create(tmp.path().join("run.out")).unwrap())
        .stderr(std::fs::File::create(tmp.path().join("run.err")).unwrap())
        .process_group(0);
    let mut sup = run.spawn().unwrap();
    let _sup_guard = KillOnDrop(i32::try_from(sup.id()).unwrap());
    let log = || std::fs::read_to_string(img.join("job.log")).unwrap_or_default();
    let files = || {
        ["run.out", "run.err"]
            .map(|f| std::fs::read_to_string(tmp.path().join(f)).unwrap_or_default())
            .join("\n")
    };
    let pid = pid_in(&dir.join("mark"), || format!("{}\n{}", files(), log()));
    let _job_guard = KillOnDrop(pid);
    assert!(log().contains("request 1: 0\n"), "{mode}: {}", log());

    // The requested checkpoint is there, verified.
    let o = stasis()
        .args(["inspect", "--json", "--checkpoint", "1", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "inspect the requested checkpoint");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["verified"], true, "{v}");
    assert_eq!(v[0]["processes"][0]["pid"], pid, "{v}");

    // SIGKILL: `stasis run` restores checkpoint 1, inside the request.
    // SAFETY: killing the job this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let st = sup.wait().unwrap();
    let out = std::fs::read_to_string(tmp.path().join("run.out")).unwrap();
    let err = std::fs::read_to_string(tmp.path().join("run.err")).unwrap();
    assert!(st.success(), "{mode}: stasis run: {out}\n{err}\n{}", log());
    let log = log();
    assert!(
        log.contains("request 1: 0\nrequest 1: 1\nrequest 2: 0\ndone\n"),
        "{mode}: the calls' results: {log}"
    );
    assert!(
        out.contains("restored checkpoint 1") && out.contains("checkpoint 2:"),
        "{mode}: {out}"
    );
    let got = std::fs::read(dir.join("out")).unwrap();
    assert!(
        got == reference,
        "{mode}: {} bytes after a requested checkpoint, kill and restore differ from the uninterrupted run",
        got.len()
    );
    eprintln!("{mode} concurrent={concurrent}: {out}");
}

#[test]
fn a_requested_checkpoint_is_taken_by_stasis_run_and_restored_inside_the_call() {
    workloads(); // subreaper
    check_request("acck", false);
}

#[test]
fn a_requested_concurrent_checkpoint_answers_after_the_thaw() {
    workloads();
    check_request("page", true);
}

/// The Python binding: `stasis.request_checkpoint()` raises with code -13
/// outside `stasis run`, and under it returns False once checkpoint 1 is
/// committed. Skipped (with a message) only where python3 is absent.
#[test]
fn python_requests_a_checkpoint() {
    workloads();
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
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = repo.join("python/tests/request.py");
    let mut py = Command::new("python3");
    py.arg(&script)
        .env("PYTHONPATH", repo.join("python"))
        .env("STASIS_LIB", shared_lib())
        .env_remove("STASIS_RUN_REQUEST");
    let o = py.output().unwrap();
    assert_ok(&o, "request.py outside stasis run");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "error -13\n");

    let img = tmp.path().join("img");
    let o = stasis()
        .args(["run", "--every", "1h", "-D"])
        .arg(&img)
        .arg("--")
        .arg("python3")
        .arg(&script)
        .env("PYTHONPATH", repo.join("python"))
        .env("STASIS_LIB", shared_lib())
        .output()
        .unwrap();
    assert_ok(&o, "request.py under stasis run");
    let out = String::from_utf8_lossy(&o.stdout);
    let log = std::fs::read_to_string(img.join("job.log")).unwrap_or_default();
    assert!(out.contains("checkpoint 1: full"), "{out}");
    assert_eq!(log, "committed\n", "{out}");
}
