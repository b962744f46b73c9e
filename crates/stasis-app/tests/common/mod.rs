//! Helpers of the C-program tests: build a C program against the library
//! just built, run it, kill it, compare its output.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `target/<profile>` directory of this test binary.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The `libstasis.so` cargo built for this test run (`deps/`, where the
/// cdylib of the crate under test is linked; the copy one level up is only
/// refreshed by `cargo build`).
pub fn shared_lib() -> PathBuf {
    let p = profile_dir();
    [p.join("deps/libstasis.so"), p.join("libstasis.so")]
        .into_iter()
        .find(|c| c.exists())
        .expect("libstasis.so was built (crate-type cdylib)")
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compiles `tests/c/<src>` into `out_dir`, linked with the shared library.
pub fn build_c(src: &str, out_dir: &Path) -> PathBuf {
    let lib = shared_lib();
    let libdir = lib.parent().expect("lib dir");
    let exe = out_dir.join(src.trim_end_matches(".c"));
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-std=c11", "-D_DEFAULT_SOURCE"])
        .arg("-I")
        .arg(repo().join("include"))
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/c")
                .join(src),
        )
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libdir.display()))
        // DT_RPATH (not RUNPATH): it wins over the LD_LIBRARY_PATH that
        // cargo sets for tests, which names target/<profile> (where a stale
        // copy from an older `cargo build` may lie) before deps/.
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lstasis")
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {src} failed");
    exe
}

/// A child killed (SIGKILL) and reaped when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs to completion; panics with its output unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Spawns with piped output.
pub fn spawn(cmd: &mut Command) -> KillOnDrop {
    KillOnDrop(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    )
}

/// Waits up to `limit` for `cond`, polling; panics with `what` on timeout.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Versions of checkpoint `name` committed in `dir` (file names).
pub fn versions(dir: &Path, name: &str) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix(&format!("{name}."))?
                        .strip_suffix(".ckpt")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// A small seeded generator (tests are reproducible).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What changes in `dir` when a checkpoint commits, for either target: the
/// names of the checkpoint files, and the slot descriptors of pmem files.
pub fn progress(dir: &Path) -> Vec<u8> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if n.ends_with(".ckpt") && !n.starts_with('.') {
            out.extend_from_slice(n.as_bytes());
        } else if n.ends_with(".pmem") {
            if let Ok(b) = std::fs::read(&p) {
                out.extend_from_slice(&b[64.min(b.len())..192.min(b.len())]);
            }
        }
    }
    out
}
