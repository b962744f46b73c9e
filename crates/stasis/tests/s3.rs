//! Checkpoints in an S3-compatible object store (`-D s3://BUCKET/PREFIX`),
//! against a real server (versitygw, `common::s3`): every workload dumped
//! and restored through it, incremental chains and gc, a server killed
//! mid-upload, clear errors, and encryption at rest.

mod common;
use common::s3::*;
use common::*;

use std::time::{Duration, Instant};

/// Committed checkpoints listed by `inspect --json` (which also verifies
/// every checksum of what it fetched).
fn listed(srv: &S3Server, url: &str, extra: &[&str]) -> Vec<u64> {
    inspect_json(srv, url, extra)
        .iter()
        .map(|c| c["number"].as_u64().unwrap())
        .collect()
}

/// Dump (killing it) and restore twice through the store; both
/// checkpoints are listed; the workload then checks itself.
fn twice(name: &str, args: &[&str]) {
    let srv = S3Server::start();
    let url = srv.url(name);
    let mut w = Workload::start(name, args);
    std::thread::sleep(Duration::from_millis(300));
    for round in 1..=2 {
        let tree = descendants(w.pid);
        ok(&srv.dump(&w, &url, &[]), &format!("dump {round} of {name}"));
        assert_eq!(w.reap(), (None, Some(libc::SIGKILL)), "{name}");
        for p in tree {
            reap_if_ours(p);
        }
        ok(
            &srv.restore(&url, &[]),
            &format!("restore {round} of {name}"),
        );
        assert!(alive(w.pid), "{name}: not restored");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(listed(&srv, &url, &[]), vec![1, 2]);
    w.finish_pass();
}

macro_rules! matrix {
    ($($name:ident: $bin:literal $(, $arg:literal)*;)*) => {
        mod twice { use super::*; $( #[test] fn $name() { twice($bin, &[$($arg),*]); } )* }
    };
}

matrix! {
    heap: "heap", "64";
    stack_globals: "stack_globals";
    mappings: "mappings";
    fpu: "fpu";
    signals: "signals";
    files: "files";
    counter: "counter";
    restart_syscalls: "restart_syscalls";
    threads: "threads";
    tree: "tree";
    pipes: "pipes";
    anonfds: "anonfds";
    sockets: "sockets";
    notify_locks_timers: "notify_locks_timers";
    udp_queue: "udp_queue";
    sparse_shm: "sparse_shm";
    shm: "shm";
    big_content: "big_content";
}

/// A deleted file, a memfd and a System V segment with 80 MiB of data
/// each (`big_content`; issue 17) through an encrypted store, restored
/// lazily: a lazy restore fetches page packs as skeletons, but the content
/// pack whole (chunked, compressed, sealed like any file), and the
/// workload finds its content byte for byte.
#[test]
fn big_content_through_an_encrypted_store_restores_lazily() {
    let srv = S3Server::start();
    let url = srv.url("big-content");
    let mut w = Workload::start("big_content", &[]);
    let key = key_file(w.dir.path(), "key", 7);
    let k = key.to_str().unwrap();
    let tree = descendants(w.pid);
    ok(
        &srv.dump(&w, &url, &["--encrypt-key-file", k]),
        "dump of big_content",
    );
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    for p in tree {
        reap_if_ours(p);
    }
    let stats = w.dir.path().join("lazy-stats.json");
    let o = srv.restore(
        &url,
        &[
            "--lazy",
            "--lazy-stats",
            stats.to_str().unwrap(),
            "--encrypt-key-file",
            k,
        ],
    );
    ok(&o, "restore --lazy of big_content");
    assert!(alive(w.pid), "big_content: not restored");
    let st = wait_json_file(&stats, Duration::from_secs(120));
    assert!(st.get("error").is_none(), "{st}");
    assert_eq!(listed(&srv, &url, &["--encrypt-key-file", k]), vec![1]);
    w.finish_pass();
}

/// `--leave-running --concurrent` into the store: the process runs on and
/// passes, and then its image (restored from the store) passes too.
#[test]
fn concurrent_dump_restores_from_the_store() {
    let srv = S3Server::start();
    let url = srv.url("conc");
    let mut w = Workload::start("heap", &["64"]);
    std::thread::sleep(Duration::from_millis(300));
    ok(
        &srv.dump(&w, &url, &["--leave-running", "--concurrent"]),
        "dump",
    );
    assert!(alive(w.pid));
    w.finish_pass();
    ok(&srv.restore(&url, &[]), "restore");
    w.finish_pass();
}

/// A chain of five incremental checkpoints of the self-verifying writer
/// in the store, each restored; then gc keeps two (merging the older ones
/// into the oldest kept), deletes the others' records, sweeps the chunks
/// no longer needed (the store shrinks), and both still restore.
#[test]
fn incremental_chain_and_gc() {
    let srv = S3Server::start();
    let url = srv.url("chain/a");
    let mut w = Workload::start("chain_writer", &["32"]);
    for k in 1..=5u64 {
        std::thread::sleep(Duration::from_millis(120));
        let o = srv.dump(&w, &url, &["--leave-running", "--track", "uffd", "--json"]);
        assert_ok(&o, "dump");
        let text = String::from_utf8_lossy(&o.stdout);
        let r: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON: {text}"));
        assert_eq!(r["checkpoint"], k, "{r}");
        if k > 1 {
            assert_eq!(r["parent"], k - 1, "dump {k} must be incremental: {r}");
        }
        assert!(
            text.contains(&format!("stored as checkpoint {k} of {url}")),
            "{text}"
        );
    }
    kill_and_reap(&mut w);
    for k in 1..=5u32 {
        ok(
            &srv.restore(&url, &["--checkpoint", &k.to_string()]),
            "restore",
        );
        w.finish_pass();
    }
    let bytes = |srv: &S3Server| -> usize { srv.stored_files().iter().map(|(_, b)| b.len()).sum() };
    let before = bytes(&srv);
    // No dump runs: the unneeded chunks may go at once.
    let o = srv
        .stasis()
        .env("STASIS_S3_SWEEP_AGE", "0")
        .args(["gc", "-D", &url, "--keep", "2", "--json"])
        .output()
        .unwrap();
    let r = json(&o);
    assert_eq!(r["deleted"], serde_json::json!([1, 2, 3]), "{r}");
    assert_eq!(r["merged"][0]["checkpoint"], 4, "{r}");
    assert!(r["swept"]["chunks"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(listed(&srv, &url, &[]), vec![4, 5]);
    let names: Vec<String> = srv
        .stored_files()
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    for gone in ["commits/00000001", "commits/00000002", "commits/00000003"] {
        assert!(
            !names.iter().any(|n| n.ends_with(gone)),
            "{gone} left: {names:?}"
        );
    }
    let after = bytes(&srv);
    assert!(
        after < before,
        "{before} bytes stored before gc, {after} after"
    );
    for k in [4, 5] {
        ok(
            &srv.restore(&url, &["--checkpoint", &k.to_string()]),
            "restore after gc",
        );
        w.finish_pass();
    }
}

/// The server is killed while a dump (one that kills its process) uploads:
/// the dump fails, the process runs on, no checkpoint appears; once the
/// server is back the next dump succeeds, and both checkpoints restore.
#[test]
fn server_killed_mid_upload() {
    let mut srv = S3Server::start();
    let url = srv.url("killed");
    let mut w = Workload::start("heap", &["96"]);
    std::thread::sleep(Duration::from_millis(200));
    ok(&srv.dump(&w, &url, &["--leave-running"]), "dump 1");
    // The next dumps are encrypted: their chunks (keyed ids) are all new,
    // so the upload is long. Through a relay at 16 MB/s it takes seconds.
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), "key", 3);
    let k = key.to_str().unwrap();
    let chunks = srv.bucket_dir().join("killed/chunks");
    let count = || std::fs::read_dir(&chunks).map(|d| d.count()).unwrap_or(0);
    let first = count();
    let relay = SlowUpload::start(srv.port, 16 << 20);
    let mut cmd = srv.stasis();
    cmd.env("AWS_ENDPOINT_URL", &relay.endpoint)
        .args([
            "dump",
            "-t",
            &w.pid.to_string(),
            "-D",
            &url,
            "--encrypt-key-file",
            k,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let dumper = cmd.spawn().unwrap();
    let _dumper_guard = KillOnDrop(dumper.id() as i32);
    // Kill the server once the new upload has stored a few chunks.
    let t0 = Instant::now();
    while count() < first + 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the upload never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    srv.kill();
    let out = dumper.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the dump succeeded without its server"
    );
    assert!(
        err.contains("cannot reach the object store") || err.contains("storing the checkpoint"),
        "{err}"
    );
    assert!(
        alive(w.pid),
        "a dump that failed to store its checkpoint killed the process"
    );
    assert!(
        !srv.bucket_dir().join("killed/commits/00000002").exists(),
        "a checkpoint was committed"
    );
    drop(relay);
    srv.restart();
    assert_eq!(listed(&srv, &url, &[]), vec![1]);
    // The next dump (killing the process) succeeds.
    ok(
        &srv.dump(&w, &url, &["--encrypt-key-file", k]),
        "dump after the restart",
    );
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    assert_eq!(listed(&srv, &url, &["--encrypt-key-file", k]), vec![1, 2]);
    for n in ["1", "2"] {
        ok(
            &srv.restore(&url, &["--checkpoint", n, "--encrypt-key-file", k]),
            "restore",
        );
        w.finish_pass();
    }
}

/// SIGTERM to a dump while it uploads (through a slow relay): the dump
/// dies of it once its clean-up is done (its store client's threads do not
/// take the signal), so no temporary checkpoint stays in its staging
/// directory; nothing is committed and the process runs on.
#[test]
fn a_dump_stopped_by_sigterm_mid_upload_cleans_up() {
    use std::os::unix::process::ExitStatusExt;
    let srv = S3Server::start();
    let url = srv.url("term");
    let w = Workload::start("heap", &["96"]);
    let chunks = srv.bucket_dir().join("term/chunks");
    let count = || std::fs::read_dir(&chunks).map(|d| d.count()).unwrap_or(0);
    let relay = SlowUpload::start(srv.port, 16 << 20);
    let mut cmd = srv.stasis();
    cmd.env("AWS_ENDPOINT_URL", &relay.endpoint)
        .args([
            "dump",
            "-t",
            &w.pid.to_string(),
            "-D",
            &url,
            "--leave-running",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let dumper = cmd.spawn().unwrap();
    let _dumper_guard = KillOnDrop(dumper.id() as i32);
    wait_until(Duration::from_secs(120), "the upload to start", || {
        count() >= 3
    });
    // SAFETY: signalling the dump this test started.
    unsafe { libc::kill(dumper.id() as i32, libc::SIGTERM) };
    let out = dumper.wait_with_output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(alive(w.pid), "the dumped process died with its dump");
    assert!(!srv.bucket_dir().join("term/commits").exists());
    fn temps(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                out.push(e.path());
            } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(temps(&e.path()));
            }
        }
        out
    }
    assert_eq!(temps(srv.staging.path()), Vec::<std::path::PathBuf>::new());
}

/// Wrong credentials, a missing bucket, a server that is down: each fails
/// at once with a message that says what to check, and a dump that cannot
/// store its checkpoint leaves its process running.
#[test]
fn clear_errors() {
    let mut srv = S3Server::start();
    let url = srv.url("errs");
    let w = Workload::start("counter", &[]);
    let o = srv
        .stasis()
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .args(["dump", "-t", &w.pid.to_string(), "-D", &url])
        .output()
        .unwrap();
    assert_fails_with(&o, "refused the credentials");
    assert_fails_with(&o, "AWS_SECRET_ACCESS_KEY");
    assert!(alive(w.pid));
    let o = srv.dump(&w, "s3://no-such-bucket/x", &[]);
    assert_fails_with(&o, "bucket no-such-bucket does not exist");
    let o = srv.restore(&url, &[]);
    assert_fails_with(&o, "has no committed checkpoint");
    srv.kill();
    let t0 = Instant::now();
    let o = srv.dump(&w, &url, &[]);
    assert_fails_with(
        &o,
        &format!("cannot reach the object store at {}", srv.endpoint),
    );
    assert_fails_with(&o, "is the server running");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert!(alive(w.pid));
    let o = srv.restore(&url, &[]);
    assert_fails_with(&o, "cannot reach the object store");
    // A key for a local image directory is refused, not ignored: that
    // image would be written in the clear.
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), "key", 1);
    let o = stasis()
        .args(["dump", "-t", &w.pid.to_string(), "-D"])
        .arg(keys.path().join("img"))
        .arg("--encrypt-key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert_fails_with(&o, "--encrypt-key-file applies to s3:// stores");
    assert!(alive(w.pid) && !keys.path().join("img").exists());
}

/// A 32-byte key as 64 hex digits in a file.
fn key_file(dir: &std::path::Path, name: &str, byte: u8) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{}\n", hex_of(&[byte; 32]))).unwrap();
    p
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Encryption at rest: 32-byte samples of the workload's memory (the
/// start of 64 of its heap pages). Stored plainly (no compression), they
/// are in the server's files (so the check can fail); stored encrypted,
/// none is. Restores without the key, with a wrong key, or of a tampered
/// object fail with a clear message and start nothing; with the key the
/// process comes back and passes.
#[test]
fn encryption_at_rest() {
    let srv = S3Server::start();
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), "key", 7);
    let wrong = key_file(keys.path(), "wrong", 8);
    let mut w = Workload::start("heap", &["16"]);
    std::thread::sleep(Duration::from_millis(200));
    let samples = memory_samples(w.pid);
    // The control: stored plainly, the pages are there to find.
    ok(
        &srv.dump(
            &w,
            &srv.url("plain"),
            &["--leave-running", "--compress-level", "0"],
        ),
        "plain dump",
    );
    assert!(
        holds_any(&srv, "plain", &samples),
        "no memory sample in the plain store: the check cannot work"
    );
    // Encrypted (and compressed, as by default).
    let url = srv.url("sealed");
    let k = key.to_str().unwrap();
    ok(
        &srv.dump(&w, &url, &["--encrypt-key-file", k]),
        "encrypted dump",
    );
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    assert!(
        !holds_any(&srv, "sealed", &samples),
        "process memory in the encrypted store"
    );
    // Nor on local disk: the staging directories hold the plain store's
    // chain (the control), and nothing of the encrypted one's.
    // (Each store's staging directory says its store in remote.json.)
    let staged = |suffix: &str| staged_holds(&srv, suffix, &samples);
    assert!(
        staged("/plain"),
        "no memory sample staged for the plain store: the check cannot work"
    );
    assert!(
        !staged("/sealed"),
        "process memory left in the staging directory of the encrypted store"
    );
    let o = srv.restore(&url, &[]);
    assert_fails_with(&o, "is encrypted: give the key with --encrypt-key-file");
    assert!(!alive(w.pid));
    let o = srv.restore(&url, &["--encrypt-key-file", wrong.to_str().unwrap()]);
    assert_fails_with(&o, "is not the key checkpoint 1");
    assert!(!alive(w.pid));
    // Tamper with one byte of the largest stored object (a chunk of the pack).
    let (path, mut bytes) = srv
        .stored_files()
        .into_iter()
        .filter(|(p, _)| p.starts_with(format!("{BUCKET}/sealed/chunks")))
        .max_by_key(|(_, b)| b.len())
        .unwrap();
    let full = srv.root.path().join(&path);
    let original = bytes.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&full, &bytes).unwrap();
    let o = srv.restore(&url, &["--encrypt-key-file", k]);
    assert_fails_with(&o, "is damaged or was tampered with");
    assert!(!alive(w.pid));
    std::fs::write(&full, &original).unwrap();
    ok(
        &srv.restore(&url, &["--encrypt-key-file", k]),
        "restore with the key",
    );
    w.finish_pass();
}

/// Shared chunks: a second full dump of a process whose 512 MiB heap is
/// unchanged (it rewrites only a 4 MiB region) adds less than 2% to the
/// store, and restores.
#[test]
fn a_second_full_dump_of_an_unchanged_process_adds_little() {
    let srv = S3Server::start();
    let url = srv.url("dedup");
    let mut w = Workload::start("heap", &["512"]);
    std::thread::sleep(Duration::from_millis(200));
    let stored = || -> u64 {
        srv.stored_files()
            .iter()
            .filter(|(p, _)| p.starts_with(format!("{BUCKET}/dedup")))
            .map(|(_, b)| b.len() as u64)
            .sum()
    };
    ok(&srv.dump(&w, &url, &["--leave-running"]), "dump 1");
    let one = stored();
    let text = ok(&srv.dump(&w, &url, &["--leave-running"]), "dump 2");
    let two = stored();
    eprintln!(
        "first dump: {one} bytes stored; the second added {}",
        two - one
    );
    assert!(one > 512 << 20, "{one}");
    assert!(
        (two - one) * 50 < one,
        "the second dump added {} bytes to {one}: {text}",
        two - one
    );
    kill_and_reap(&mut w);
    ok(&srv.restore(&url, &["--checkpoint", "2"]), "restore");
    w.finish_pass();
}

/// Replicas: a dump commits once the primary and the replica (a second
/// server, named in its URL) hold the checkpoint. With the replica's
/// server down it fails (the process runs on, the primary gets nothing),
/// or commits with `--min-replicas 0`; the next dump brings the replica
/// the ancestor it missed. With the primary's server down, restore reads
/// the replica, says so, and the process passes.
#[test]
fn replicas() {
    let mut a = S3Server::start();
    let mut b = S3Server::start();
    let url = a.url("prim");
    let rurl = format!("s3+http://127.0.0.1:{}/{BUCKET}/repl", b.port);
    let mut w = Workload::start("chain_writer", &["16"]);
    let dump = |w: &Workload, extra: &[&str]| {
        a.stasis()
            .args([
                "dump",
                "-t",
                &w.pid.to_string(),
                "-D",
                &url,
                "--replica",
                &rurl,
            ])
            .args(["--leave-running", "--track", "uffd"])
            .args(extra)
            .output()
            .unwrap()
    };
    let text = ok(&dump(&w, &[]), "dump 1");
    assert!(
        text.contains(&format!("replica {rurl}: holds checkpoint 1")),
        "{text}"
    );
    b.kill();
    let o = dump(&w, &[]);
    assert_fails_with(&o, "0 replica(s) hold it, 1 needed");
    assert!(alive(w.pid));
    assert!(!a.bucket_dir().join("prim/commits/00000002").exists());
    let text = ok(
        &dump(&w, &["--min-replicas", "0"]),
        "dump 2 without the replica",
    );
    assert!(
        text.contains("replica") && text.contains("failed"),
        "{text}"
    );
    b.restart();
    // Checkpoint 3 is incremental over 2, which the replica lacks: it gets both.
    let o = dump(&w, &["--json"]);
    let text = ok(&o, "dump 3");
    assert!(text.contains("\"parent\":2"), "{text}");
    assert!(
        text.contains(&format!("replica {rurl}: holds checkpoint 3")),
        "{text}"
    );
    for n in ["00000001", "00000002", "00000003"] {
        assert!(b.bucket_dir().join("repl/commits").join(n).exists(), "{n}");
    }
    kill_and_reap(&mut w);
    a.kill();
    let o = a
        .stasis()
        .args(["restore", "--detach", "-D", &url, "--replica", &rurl])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    ok(&o, "restore from the replica");
    assert!(err.contains(&format!("read from replica {rurl}")), "{err}");
    w.finish_pass();
}

/// gc of replicas: three checkpoints of a chain in a primary and a
/// replica; `gc --keep 1 --replica URL` keeps the newest (merged into a
/// full checkpoint) in both, both stores shrink, and the replica alone then
/// restores it.
#[test]
fn gc_collects_the_replicas_too() {
    let mut a = S3Server::start();
    let b = S3Server::start();
    let url = a.url("prim");
    let rurl = format!("s3+http://127.0.0.1:{}/{BUCKET}/repl", b.port);
    let mut w = Workload::start("chain_writer", &["16"]);
    for k in 1..=3 {
        std::thread::sleep(Duration::from_millis(100));
        let o = a
            .stasis()
            .args(["dump", "-t", &w.pid.to_string(), "-D", &url])
            .args(["--replica", &rurl, "--leave-running", "--track", "uffd"])
            .output()
            .unwrap();
        ok(&o, &format!("dump {k}"));
    }
    let size = |srv: &S3Server, prefix: &str| -> u64 {
        srv.stored_files()
            .iter()
            .filter(|(p, _)| p.starts_with(format!("{BUCKET}/{prefix}")))
            .map(|(_, b)| b.len() as u64)
            .sum()
    };
    let before = (size(&a, "prim"), size(&b, "repl"));
    let o = a
        .stasis()
        .args([
            "gc",
            "-D",
            &url,
            "--keep",
            "1",
            "--replica",
            &rurl,
            "--json",
        ])
        .env("STASIS_S3_SWEEP_AGE", "0")
        .output()
        .unwrap();
    let text = ok(&o, "gc");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["kept"], serde_json::json!([3]), "{v}");
    assert_eq!(v["replicas"][0]["url"], rurl, "{v}");
    assert_eq!(
        v["replicas"][0]["report"]["kept"],
        serde_json::json!([3]),
        "{v}"
    );
    assert_eq!(
        v["replicas"][0]["report"]["deleted"],
        serde_json::json!([1, 2]),
        "{v}"
    );
    for (srv, prefix) in [(&a, "prim"), (&b, "repl")] {
        let commits: Vec<_> = std::fs::read_dir(srv.bucket_dir().join(prefix).join("commits"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(commits, vec!["00000003".to_string()], "{prefix}");
    }
    let after = (size(&a, "prim"), size(&b, "repl"));
    eprintln!("stored before gc {before:?}, after {after:?}");
    assert!(
        after.0 < before.0 && after.1 < before.1,
        "{before:?} -> {after:?}"
    );
    kill_and_reap(&mut w);
    a.kill();
    let o = a
        .stasis()
        .args(["restore", "--detach", "-D", &url, "--replica", &rurl])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    ok(&o, "restore from the replica after gc");
    assert!(err.contains(&format!("read from replica {rurl}")), "{err}");
    w.finish_pass();
}

/// The buffer of a `shared_tree` (its address and size are in its
/// `out.log`), read from its memory.
fn buffer_of(pid: i32, dir: &std::path::Path) -> (u64, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let log = std::fs::read_to_string(dir.join("out.log")).unwrap();
    let line = log.lines().find(|l| l.starts_with("buf ")).unwrap();
    let mut f = line.split_whitespace().skip(1);
    let start = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
    let len: usize = f.next().unwrap().parse().unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, start).unwrap();
    (start, buf)
}

/// Lazy restore from the store (`restore --lazy -D s3://...`), plain and
/// encrypted: the process (a `shared_tree` without children: a 48 MiB
/// buffer, never written after the fill) runs before its memory has
/// arrived, the filler fetches the rest from the store by chunk (ranged
/// reads), and once it is done the buffer holds exactly the bytes it held
/// at the dump; the process then checks itself.
#[test]
fn lazy_restore_from_the_store() {
    let srv = S3Server::start();
    let keys = tempfile::tempdir().unwrap();
    let bin = build_shared_tree(keys.path());
    let key = key_file(keys.path(), "key", 9);
    let k = key.to_str().unwrap();
    for (name, extra) in [
        ("lazy-plain", &[][..]),
        ("lazy-sealed", &["--encrypt-key-file", k][..]),
    ] {
        let url = srv.url(name);
        let dir = keys.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let (mut child, pid, _guard) = start_shared_tree(&bin, &dir, 48, 0);
        let (start, before) = buffer_of(pid, &dir);
        assert!(before.len() >= 48 << 20, "{}", before.len());
        let o = srv
            .stasis()
            .args(["dump", "-t", &pid.to_string(), "-D", &url])
            .args(extra)
            .output()
            .unwrap();
        ok(&o, "dump");
        let _ = child.wait();
        let stats = keys.path().join(format!("{name}.json"));
        let mut args = vec!["--lazy", "--json", "--lazy-stats", stats.to_str().unwrap()];
        args.extend(extra);
        let text = ok(&srv.restore(&url, &args), "restore --lazy");
        let r: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON: {text}"));
        assert_eq!(r["pid"], pid, "{r}");
        assert!(r["lazy_bytes"].as_u64().unwrap() >= 48 << 20, "{r}");
        let st = wait_json_file(&stats, Duration::from_secs(120));
        assert!(st.get("error").is_none(), "{name}: {st}");
        assert!(st["pages_streamed"].as_u64().unwrap() > 0, "{name}: {st}");
        let (start2, after) = buffer_of(pid, &dir);
        assert_eq!(start2, start);
        let differ: Vec<usize> = (0..before.len() / 4096)
            .filter(|&i| before[i * 4096..(i + 1) * 4096] != after[i * 4096..(i + 1) * 4096])
            .collect();
        assert!(
            differ.is_empty() && after.len() == before.len(),
            "{name}: {} of {} pages differ after the lazy restore (first: {:?}; {} vs {} bytes)",
            differ.len(),
            before.len() / 4096,
            differ.iter().take(8).collect::<Vec<_>>(),
            before.len(),
            after.len()
        );
        finish_shared_tree(pid, &dir);
    }
}

/// `shared_tree PIDFILE MIB KIDS`: a root fills MIB MiB (incompressible,
/// in one mapping of its own) and forks KIDS children (at most 15), so
/// every process holds the same pages (copy-on-write); each waits for
/// SIGTERM, then checks its buffer and its PID; the root reaps the others
/// and prints PASS only if all passed.
const SHARED_TREE_C: &str = r#"
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t word(uint64_t i) {
	uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x5348415245445452ull;
	x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
	return x;
}

static int check(const uint64_t *b, size_t n) {
	for (size_t i = 0; i < n; i++)
		if (b[i] != word(i))
			return 1;
	return 0;
}

int main(int argc, char **argv) {
	size_t n = (size_t)atoi(argv[2]) << 17; /* MiB -> words */
	int nkids = atoi(argv[3]), ready[2], i;
	uint64_t *buf = malloc(n * 8);
	pid_t kids[15];
	if (nkids < 0 || nkids > 15 || !buf)
		return 2;
	sigset_t set;
	for (size_t k = 0; k < n; k++)
		buf[k] = word(k);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if (pipe(ready))
		return 2;
	for (i = 0; i < nkids; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			pid_t me = getpid();
			int sig;
			close(ready[0]);
			close(ready[1]);
			sigwait(&set, &sig);
			_exit(check(buf, n) | (getpid() != me) << 1);
		}
	}
	close(ready[1]);
	printf("buf %lx %zu\n", (unsigned long)buf, n * 8);
	fflush(stdout);
	FILE *f = fopen(argv[1], "w");
	fprintf(f, "%d\n", getpid());
	fclose(f);
	int sig, bad = check(buf, n);
	sigwait(&set, &sig);
	for (i = 0; i < nkids; i++) {
		int st;
		kill(kids[i], SIGTERM);
		if (waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) || WEXITSTATUS(st))
			bad = 1;
	}
	bad |= check(buf, n);
	printf("%s\n", bad ? "FAIL" : "PASS");
	return bad;
}
"#;

/// Builds `shared_tree` into `dir`.
fn build_shared_tree(dir: &std::path::Path) -> std::path::PathBuf {
    // (Makes this process the subreaper that restored trees are reaped by.)
    workloads();
    let src = dir.join("shared_tree.c");
    std::fs::write(&src, SHARED_TREE_C).unwrap();
    let bin = dir.join("shared_tree");
    let o = std::process::Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert_ok(&o, "cc shared_tree.c");
    bin
}

/// Starts `shared_tree` (output in `dir/out.log`); returns it, its PID
/// and a guard killing the tree, once its KIDS children are there.
fn start_shared_tree(
    bin: &std::path::Path,
    dir: &std::path::Path,
    mib: u32,
    kids: usize,
) -> (std::process::Child, i32, TreeGuard) {
    let pidfile = dir.join("pid");
    let out = std::fs::File::create(dir.join("out.log")).unwrap();
    let mut c = std::process::Command::new(bin);
    c.arg(&pidfile)
        .arg(mib.to_string())
        .arg(kids.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    close_inherited_fds(&mut c);
    let child = c.spawn().unwrap();
    let root = wait_pidfile(&pidfile, Duration::from_secs(30));
    let guard = TreeGuard(root);
    wait_until(Duration::from_secs(10), "the children", || {
        descendants(root).len() == kids
    });
    (child, root, guard)
}

/// Ends a restored `shared_tree` (SIGTERM) and requires its PASS.
fn finish_shared_tree(root: i32, dir: &std::path::Path) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(root),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (code, sig) = waitpid_timeout(root, Duration::from_secs(30));
    let log = std::fs::read_to_string(dir.join("out.log")).unwrap();
    assert_eq!((code, sig), (Some(0), None), "{log}");
    assert!(log.contains("PASS"), "{log}");
}

/// Kills a tree (root and every descendant) when dropped.
struct TreeGuard(i32);

impl Drop for TreeGuard {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        for p in descendants(self.0).into_iter().chain([self.0]) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            reap_if_ours(p);
        }
    }
}

/// Shared chunks across the processes of a tree: an 8-process tree forked
/// from a root that filled 64 MiB (incompressible) before forking is
/// dumped to the store: its packs hold the buffer 8 times, the store (the
/// server's backing directory) grows by about one copy. Restored, all 8
/// processes check their buffer and the root says PASS.
#[test]
fn an_8_process_tree_stores_its_shared_pages_once() {
    let srv = S3Server::start();
    let url = srv.url("tree8");
    let tmp = tempfile::tempdir().unwrap();
    let bin = build_shared_tree(tmp.path());
    let (mut child, root, _guard) = start_shared_tree(&bin, tmp.path(), 64, 7);
    let stored = || -> u64 {
        srv.stored_files()
            .iter()
            .filter(|(p, _)| p.starts_with(format!("{BUCKET}/tree8")))
            .map(|(_, b)| b.len() as u64)
            .sum()
    };
    let tree = descendants(root);
    let text = ok(
        &srv.stasis()
            .args(["dump", "-t", &root.to_string(), "-D", &url])
            .output()
            .unwrap(),
        "dump of the tree",
    );
    let _ = child.wait();
    for p in tree {
        reap_if_ours(p);
    }
    let grown = stored();
    eprintln!("{text}the store grew by {grown} bytes for 8 x 64 MiB of shared pages");
    // The packs held the buffer 8 times ("... in all before compression").
    let plain: f64 = text
        .split(" in all before compression")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no plain size: {text}"));
    assert!(
        text.contains("MiB in all") || text.contains("GiB in all"),
        "{text}"
    );
    let plain_mib = if text.contains("GiB in all") {
        plain * 1024.0
    } else {
        plain
    };
    assert!(
        plain_mib >= 8.0 * 64.0,
        "{plain_mib} MiB in the packs: {text}"
    );
    assert!(grown > 64 << 20, "{grown}");
    assert!(
        grown < (64 << 20) * 5 / 4,
        "the store grew by {grown} bytes: the shared pages were not stored once"
    );
    ok(&srv.restore(&url, &[]), "restore of the tree");
    assert!(alive(root));
    wait_until(Duration::from_secs(10), "7 restored children", || {
        descendants(root).len() == 7
    });
    finish_shared_tree(root, tmp.path());
}
