//! `stasis run`, `stasis page-server` and `dump --touch-window` with an
//! object store (`-D s3://BUCKET/PREFIX`), against a real server
//! (versitygw, `common::s3`).

mod common;
use common::s3::*;
use common::*;

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

const TOKEN: &str = "a-long-shared-token-for-s3-tests-4242";

/// A 32-byte key as 64 hex digits in a file.
fn key_file(dir: &std::path::Path, byte: u8) -> std::path::PathBuf {
    let p = dir.join("key");
    let hex: String = [byte; 32].iter().map(|x| format!("{x:02x}")).collect();
    std::fs::write(&p, format!("{hex}\n")).unwrap();
    p
}

/// An age identity file of a new identity, and its recipient.
fn age_identity(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let (secret, recipient) = stasis_store::generate_identity();
    let p = dir.join("age-identity");
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    (p, recipient)
}

fn numbers(cps: &[serde_json::Value]) -> Vec<u64> {
    cps.iter().map(|c| c["number"].as_u64().unwrap()).collect()
}

/// `stasis run -D s3://...` of `chain_writer` (a writer whose memory is a
/// function of its iteration count, checked byte for byte when it stops),
/// with `extra` flags: returns the events once the job has been SIGKILLed
/// after three checkpoints, restarted from the store, checkpointed twice
/// more and stopped; the job must have passed its check.
fn run_crash_restart(srv: &S3Server, url: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("pid");
    let log = d.path().join("job.log");
    let bin = workloads().join("chain_writer");
    let mut c = srv.stasis();
    c.args([
        "run",
        "-D",
        url,
        "--every",
        "0.3",
        "--restart-on-failure",
        "--json",
    ])
    .arg("--log")
    .arg(&log)
    .args(extra)
    .arg("--")
    .arg(&bin)
    .arg(&pidfile)
    .arg("32")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("stasis run");
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    let job = KillOnDrop(pid);
    for _ in 0..3 {
        lines.wait_event(Duration::from_secs(120), "checkpoint");
    }
    // SAFETY: crashing the job under test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    lines.wait_event(Duration::from_secs(120), "restored");
    assert!(alive(pid), "the job was not restored");
    for _ in 0..2 {
        lines.wait_event(Duration::from_secs(120), "checkpoint");
    }
    // SAFETY: stopping the restored job.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = lines.rest(Duration::from_secs(120));
    let o = child.wait_with_output().unwrap();
    std::mem::forget(job);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().last(), Some("PASS"), "{text}\n{out}\n{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Checks the events of [`run_crash_restart`] against the store: every
/// checkpoint reported was committed there (numbered as there, the later
/// ones incremental over the one before), the restart restored the latest
/// committed before the crash, and `inspect -D URL` lists them all.
fn check_run_events(srv: &S3Server, url: &str, events: &[serde_json::Value], extra: &[&str]) {
    let all = events
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let cps: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "checkpoint")
        .collect();
    assert!(cps.len() >= 5, "{all}");
    for c in &cps {
        assert_eq!(c["stored"]["url"], url, "{c}");
        assert_eq!(c["stored"]["checkpoint"], c["checkpoint"], "{c}");
    }
    let ns: Vec<u64> = cps
        .iter()
        .map(|c| c["checkpoint"].as_u64().unwrap())
        .collect();
    assert!(ns.windows(2).all(|w| w[1] == w[0] + 1), "{ns:?}\n{all}");
    let restored = events.iter().find(|e| e["event"] == "restored").unwrap();
    let before: Vec<u64> = events
        .iter()
        .take_while(|e| e["event"] != "restored")
        .filter(|e| e["event"] == "checkpoint")
        .map(|c| c["checkpoint"].as_u64().unwrap())
        .collect();
    assert_eq!(
        restored["checkpoint"].as_u64(),
        before.last().copied(),
        "{all}"
    );
    let listed = inspect_json(srv, url, extra);
    assert_eq!(numbers(&listed), ns, "{all}");
}

/// The job of `stasis run -D s3://...` crashes (SIGKILL) after three
/// checkpoints, each committed in the store (a full one, then
/// incremental ones); the restart restores the store's latest, the job goes
/// on, is checkpointed twice more (a full one after the restart, then an
/// incremental), and passes its byte-for-byte check; `inspect -D URL`
/// lists the five, verified.
#[test]
fn run_commits_in_the_store_and_restarts_from_it() {
    let srv = S3Server::start();
    let url = srv.url("run");
    let events = run_crash_restart(&srv, &url, &[]);
    check_run_events(&srv, &url, &events, &[]);
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "checkpoint")
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "full", "{kinds:?}");
    assert!(kinds[1..3].contains(&"incremental"), "{kinds:?}");
    assert!(
        kinds[3..].contains(&"incremental"),
        "tracking resumes after the restart: {kinds:?}"
    );
}

/// The same, encrypted and restarted lazily (the filler reads the pages
/// from the store), with the touch window recorded after each checkpoint
/// stored with it in the store.
#[test]
fn run_encrypted_restarts_lazily_from_the_store() {
    let srv = S3Server::start();
    let url = srv.url("run-sealed");
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), 5);
    let k = key.to_str().unwrap();
    let read = ["--encrypt-key-file", k];
    run_sealed_restarts_lazily(
        (&srv, &url),
        &read,
        &read,
        "give the key with --encrypt-key-file",
    );
}

/// The same with age recipients: `run` writes each checkpoint to a
/// recipient (and its touch sets, under keys it made) and restarts with
/// the identity, lazily; without the identity nothing is readable.
#[test]
fn run_to_a_recipient_restarts_lazily_with_the_identity() {
    let srv = S3Server::start();
    let url = srv.url("run-age");
    let keys = tempfile::tempdir().unwrap();
    let (id, recipient) = age_identity(keys.path());
    let id = id.to_str().unwrap();
    let read = ["--decrypt-identity", id];
    run_sealed_restarts_lazily(
        (&srv, &url),
        &["--encrypt-recipient", &recipient, "--decrypt-identity", id],
        &read,
        "give an identity file with --decrypt-identity",
    );
}

/// `run` with the sealing flags `seal`, crashed and restarted lazily with
/// touch sets: its events check out against the store read with `read`,
/// each touch set reported is the one `inspect` shows, and without `read`
/// nothing is readable (the error says `refusal`).
fn run_sealed_restarts_lazily(
    (srv, url): (&S3Server, &str),
    seal: &[&str],
    read: &[&str],
    refusal: &str,
) {
    let mut args = seal.to_vec();
    args.extend(["--lazy-restart", "--touch-window", "0.1"]);
    let events = run_crash_restart(srv, url, &args);
    check_run_events(srv, url, &events, read);
    let restored = events.iter().find(|e| e["event"] == "restored").unwrap();
    assert!(restored["lazy_bytes"].as_u64().unwrap() > 0, "{restored}");
    let touch: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "touch_set")
        .collect();
    assert!(!touch.is_empty(), "no touch set recorded");
    let listed = inspect_json(srv, url, read);
    for t in touch {
        let n = t["checkpoint"].as_u64().unwrap();
        let c = listed.iter().find(|c| c["number"] == n).unwrap();
        assert_eq!(c["touch_window"]["pages"], t["pages"], "{t}: {c}");
    }
    let o = srv.stasis().args(["inspect", "-D", url]).output().unwrap();
    assert_fails_with(&o, refusal);
}

/// Wrong credentials, a missing bucket, a server that is down: `run` and
/// `page-server` refuse at once, saying what to check, and start nothing.
#[test]
fn run_and_page_server_clear_errors() {
    let mut srv = S3Server::start();
    let url = srv.url("errs");
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("started");
    let token = d.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let run = |srv: &S3Server, url: &str, secret: &str| {
        srv.stasis()
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .args(["run", "-D", url, "--every", "1", "--"])
            .arg("/bin/touch")
            .arg(&marker)
            .output()
            .unwrap()
    };
    let serve = |srv: &S3Server, url: &str, secret: &str| {
        srv.stasis()
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .args(["page-server", "--listen", "127.0.0.1:0", "-D", url])
            .arg("--token-file")
            .arg(&token)
            .output()
            .unwrap()
    };
    let o = run(&srv, &url, "not-the-secret");
    assert_fails_with(&o, "refused the credentials");
    assert_fails_with(&o, "AWS_SECRET_ACCESS_KEY");
    let o = serve(&srv, &url, "not-the-secret");
    assert_fails_with(&o, "refused the credentials");
    let o = run(&srv, "s3://no-such-bucket/x", SECRET_KEY);
    assert_fails_with(&o, "bucket no-such-bucket does not exist");
    let o = serve(&srv, "s3://no-such-bucket/x", SECRET_KEY);
    assert_fails_with(&o, "bucket no-such-bucket does not exist");
    let o = serve(&srv, &url, SECRET_KEY);
    assert_fails_with(&o, "has no committed checkpoint");
    srv.kill();
    let o = run(&srv, &url, SECRET_KEY);
    assert_fails_with(&o, "cannot reach the object store");
    let o = serve(&srv, &url, SECRET_KEY);
    assert_fails_with(&o, "cannot reach the object store");
    assert!(!marker.exists(), "the job ran");
}

/// `stasis page-server -D s3://...` with the environment of `srv`.
struct S3PageServer {
    child: std::process::Child,
    addr: String,
}

impl S3PageServer {
    fn start(
        srv: &S3Server,
        url: &str,
        token: &std::path::Path,
        tmp: &std::path::Path,
        extra: &[&str],
    ) -> S3PageServer {
        let mut child = srv
            .stasis()
            .args([
                "page-server",
                "--json",
                "--listen",
                "127.0.0.1:0",
                "-D",
                url,
            ])
            .arg("--token-file")
            .arg(token)
            .args(extra)
            .env("TMPDIR", tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("page server said {line:?}: {e}"));
        S3PageServer {
            child,
            addr: v["listening"].as_str().unwrap().to_string(),
        }
    }
}

impl Drop for S3PageServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Entries of a directory.
fn entries(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// `page-server -D s3://...` serves a checkpoint held in the store (a
/// private copy of its chain, plain and encrypted): `restore --lazy --from`
/// restores the process, which passes its check; the copy is gone once
/// the server is stopped (SIGTERM).
#[test]
fn page_server_serves_a_checkpoint_of_the_store() {
    let srv = S3Server::start();
    let d = tempfile::tempdir().unwrap();
    let token = d.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = key_file(d.path(), 3);
    let k = key.to_str().unwrap();
    let (id, recipient) = age_identity(d.path());
    let id = id.to_str().unwrap();
    for (name, extra) in [
        ("ps-plain", &[][..]),
        ("ps-sealed", &["--encrypt-key-file", k][..]),
        // Dumped to a recipient; the page server reads with the identity.
        (
            "ps-age",
            &["--encrypt-recipient", &recipient, "--decrypt-identity", id][..],
        ),
    ] {
        let url = srv.url(name);
        let mut w = Workload::start("heap", &["64"]);
        // An incremental chain of two: the server needs both.
        let o = srv.dump(
            &w,
            &url,
            &[&["--leave-running", "--track"][..], extra].concat(),
        );
        ok(&o, "dump 1");
        std::thread::sleep(Duration::from_millis(200));
        let tree = descendants(w.pid);
        ok(&srv.dump(&w, &url, extra), "dump 2");
        assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
        for p in tree {
            reap_if_ours(p);
        }
        let tmp = d.path().join(format!("{name}-tmp"));
        std::fs::create_dir(&tmp).unwrap();
        let mut ps = S3PageServer::start(&srv, &url, &token, &tmp, extra);
        assert_eq!(entries(&tmp).len(), 1, "the private copy");
        let stats = d.path().join(format!("{name}-stats.json"));
        let o = stasis()
            .args([
                "restore", "--detach", "--json", "--lazy", "--from", &ps.addr,
            ])
            .arg("--token-file")
            .arg(&token)
            .arg("--lazy-stats")
            .arg(&stats)
            .output()
            .unwrap();
        let text = ok(&o, "restore --lazy --from");
        let r: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON: {text}"));
        assert_eq!(r["pid"], w.pid, "{r}");
        assert_eq!(r["checkpoint"], 2, "{r}");
        assert!(r["lazy_bytes"].as_u64().unwrap() > 0, "{r}");
        let st = wait_json_file(&stats, Duration::from_secs(120));
        assert!(st.get("error").is_none(), "{name}: {st}");
        w.finish_pass();
        // SAFETY: stopping the page server under test.
        unsafe { libc::kill(ps.child.id() as i32, libc::SIGTERM) };
        let status = ps.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        assert!(entries(&tmp).is_empty(), "{:?}", entries(&tmp));
    }
}

/// `dump --touch-window -D s3://...`: the touch set recorded after the
/// dump is stored with its checkpoint in the store: `inspect` shows it, a
/// lazy restore from the store gives it to the filler (its pages first)
/// and restores exactly; gc deletes it with its checkpoint.
#[test]
fn touch_window_is_stored_with_its_checkpoint() {
    let srv = S3Server::start();
    let url = srv.url("touch");
    let mut w = Workload::start("heap", &["32"]);
    let o = srv.dump(
        &w,
        &url,
        &["--leave-running", "--touch-window", "0.5", "--json"],
    );
    let text = ok(&o, "dump --touch-window");
    let touch: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("touch_pages").is_some())
        .unwrap_or_else(|| panic!("no touch set: {text}"));
    let pages = touch["touch_pages"].as_u64().unwrap();
    assert!(pages > 0, "{touch}");
    assert_eq!(touch["touch_window_ms"], 500, "{touch}");
    assert!(
        touch["touch_stored"]
            .as_str()
            .unwrap()
            .contains(&format!("checkpoint 1 of {url}")),
        "{touch}"
    );
    let object = srv.bucket_dir().join("touch/touch/00000001/touch-window");
    assert!(object.exists(), "{}", object.display());
    let listed = inspect_json(&srv, &url, &[]);
    assert_eq!(listed[0]["touch_window"]["pages"], pages, "{listed:?}");
    let tree = descendants(w.pid);
    ok(&srv.dump(&w, &url, &[]), "dump 2");
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    for p in tree {
        reap_if_ours(p);
    }
    // Checkpoint 1, whose touch set it is, restored lazily.
    let stats = w.dir.path().join("lazy-stats.json");
    let o = srv.restore(
        &url,
        &[
            "--lazy",
            "--checkpoint",
            "1",
            // Slowed, so that the process faults before its pages have
            // all arrived (and there is an order to record).
            "--lazy-bandwidth",
            "16M",
            "--lazy-stats",
            stats.to_str().unwrap(),
        ],
    );
    ok(&o, "restore --lazy");
    let st = wait_json_file(&stats, Duration::from_secs(120));
    assert!(st.get("error").is_none(), "{st}");
    assert_eq!(st["touch_pages"], pages, "{st}");
    assert!(st["faults"].as_u64().unwrap() >= 1, "{st}");
    // The fault order is stored with the checkpoint, and comes first
    // next time.
    let faults = object.with_file_name("touch-faults");
    assert!(faults.exists(), "{}", faults.display());
    let listed = inspect_json(&srv, &url, &["--checkpoint", "1"]);
    let fault_pages = listed[0]["touch_faults"]["pages"].as_u64().unwrap();
    assert!(fault_pages >= 1, "{listed:?}");
    w.finish_pass();
    // Checkpoint 2 has none; gc drops checkpoint 1 and its touch set.
    let o = srv
        .stasis()
        .args(["gc", "--keep", "1", "-D", &url])
        .output()
        .unwrap();
    ok(&o, "gc");
    assert!(!object.exists(), "{}", object.display());
    assert!(!faults.exists(), "{}", faults.display());
    let listed = inspect_json(&srv, &url, &[]);
    assert_eq!(numbers(&listed), vec![2]);
    assert!(listed[0]["touch_window"].is_null(), "{listed:?}");
}

/// The server dies while `run -D s3://...` checkpoints its job: those
/// checkpoints fail (a warning naming the store), the job runs on
/// untouched, nothing is committed; once the server is back, checkpoints
/// go on under the next number, and the job passes its check.
#[test]
fn run_rides_out_a_server_that_is_down() {
    let mut srv = S3Server::start();
    let url = srv.url("run-down");
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("pid");
    let log = d.path().join("job.log");
    let bin = workloads().join("chain_writer");
    let mut c = srv.stasis();
    c.args(["run", "-D", &url, "--every", "0.3", "--json"])
        .arg("--log")
        .arg(&log)
        .arg("--")
        .arg(&bin)
        .arg(&pidfile)
        .arg("16")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("stasis run");
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let mut errs = Lines::new(child.stderr.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    let job = KillOnDrop(pid);
    let first = lines.wait_event(Duration::from_secs(120), "checkpoint");
    assert_eq!(first["checkpoint"], 1, "{first}");
    srv.kill();
    for _ in 0..2 {
        let e = errs.wait_for(Duration::from_secs(120), |l| {
            l.contains("checkpoint failed")
        });
        assert!(
            e.contains(&format!("storing the checkpoint in {url} failed"))
                || e.contains("cannot reach the object store"),
            "{e}"
        );
    }
    assert!(alive(pid));
    srv.restart();
    // (A checkpoint that was under way when the server came back may
    // still fail: the next ones succeed.)
    let next = lines.wait_event(Duration::from_secs(120), "checkpoint");
    // The failed ones took no number (one may have been committed just
    // before the server went).
    let taken = lines
        .seen
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "checkpoint")
        .count();
    assert_eq!(next["checkpoint"], taken, "{next}");
    // SAFETY: stopping the job under test.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = lines.rest(Duration::from_secs(120));
    let o = child.wait_with_output().unwrap();
    std::mem::forget(job);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().last(), Some("PASS"), "{text}");
    let cps = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "checkpoint")
        .count();
    let listed = numbers(&inspect_json(&srv, &url, &[]));
    assert_eq!(listed, (1..=cps as u64).collect::<Vec<_>>(), "{out}");
}

/// In an encrypted store the touch set is sealed (its bytes are not in
/// the server's file), `inspect` with the key shows it, and a damaged one
/// is ignored with a warning: the checkpoint itself still verifies.
#[test]
fn encrypted_touch_set_is_sealed_and_a_damaged_one_ignored() {
    let srv = S3Server::start();
    let url = srv.url("touch-sealed");
    let mut w = Workload::start("heap", &["16"]);
    let key = key_file(w.dir.path(), 4);
    let k = key.to_str().unwrap();
    let o = srv.dump(
        &w,
        &url,
        &[
            "--leave-running",
            "--touch-window",
            "0.3",
            "--json",
            "--encrypt-key-file",
            k,
        ],
    );
    let text = ok(&o, "dump --touch-window");
    let pages = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["touch_pages"].as_u64())
        .unwrap_or_else(|| panic!("no touch set: {text}"));
    let object = srv
        .bucket_dir()
        .join("touch-sealed/touch/00000001/touch-window");
    let stored = std::fs::read(&object).unwrap();
    assert!(
        !stored.windows(8).any(|b| b == b"STASISTS"),
        "the touch set is stored in the clear"
    );
    let listed = inspect_json(&srv, &url, &["--encrypt-key-file", k]);
    assert_eq!(listed[0]["touch_window"]["pages"], pages, "{listed:?}");
    let mut damaged = stored.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    std::fs::write(&object, &damaged).unwrap();
    let o = srv
        .stasis()
        .args(["inspect", "--json", "-D", &url, "--encrypt-key-file", k])
        .output()
        .unwrap();
    let text = ok(&o, "inspect");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("ignoring touch-window of checkpoint 1"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v[0]["verified"], true, "{v}");
    assert!(v[0]["touch_window"].is_null(), "{v}");
    w.finish_pass();
}

/// `run --replica`: each checkpoint is committed in the replica too
/// (under the same number), and the replica alone lists them all.
#[test]
fn run_commits_in_the_replica_too() {
    let srv = S3Server::start();
    let url = srv.url("run-primary");
    let rurl = srv.url("run-replica");
    let events = run_crash_restart(&srv, &url, &["--replica", &rurl]);
    check_run_events(&srv, &url, &events, &[]);
    let cps: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "checkpoint")
        .collect();
    for c in &cps {
        let lines = c["stored"]["replicas"].to_string();
        assert!(
            lines.contains(&format!(
                "replica {rurl}: holds checkpoint {}",
                c["checkpoint"]
            )),
            "{c}"
        );
    }
    assert_eq!(
        numbers(&inspect_json(&srv, &rurl, &[])),
        numbers(&inspect_json(&srv, &url, &[]))
    );
}

/// With `--replica`, a touch set goes to the replica that holds its
/// checkpoint too: `dump --touch-window --replica` stores it in both, and
/// `inspect` of the replica shows it; with the primary's server stopped,
/// `restore --lazy --replica` reads the replica, whose touch set its
/// filler is given (`touch_pages`) and where it stores its fault order
/// (the primary being down makes a warning only); the process passes.
#[test]
fn touch_sets_go_to_the_replicas() {
    let mut a = S3Server::start();
    let b = S3Server::start();
    let url = a.url("tprim");
    let rurl = format!("s3+http://127.0.0.1:{}/{BUCKET}/trepl", b.port);
    let mut w = Workload::start("heap", &["32"]);
    let o = a.dump(
        &w,
        &url,
        &[
            "--leave-running",
            "--touch-window",
            "0.5",
            "--json",
            "--replica",
            &rurl,
        ],
    );
    let text = ok(&o, "dump --touch-window --replica");
    let touch: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("touch_pages").is_some())
        .unwrap_or_else(|| panic!("no touch set: {text}"));
    let pages = touch["touch_pages"].as_u64().unwrap();
    assert!(pages > 0, "{touch}");
    assert!(
        touch["touch_stored"]
            .as_str()
            .unwrap()
            .contains(&format!("and of replica {rurl}")),
        "{touch}"
    );
    let replica_set = b.bucket_dir().join("trepl/touch/00000001/touch-window");
    assert!(replica_set.exists(), "{}", replica_set.display());
    let listed = inspect_json(&a, &rurl, &[]);
    assert_eq!(listed[0]["touch_window"]["pages"], pages, "{listed:?}");
    let tree = descendants(w.pid);
    ok(&a.dump(&w, &url, &["--replica", &rurl]), "dump 2");
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    for p in tree {
        reap_if_ours(p);
    }
    a.kill();
    let stats = w.dir.path().join("lazy-stats.json");
    let o = a.restore(
        &url,
        &[
            "--lazy",
            "--checkpoint",
            "1",
            "--replica",
            &rurl,
            "--lazy-bandwidth",
            "16M",
            "--lazy-stats",
            stats.to_str().unwrap(),
        ],
    );
    ok(&o, "restore --lazy from the replica");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("read from replica {rurl}")), "{err}");
    let st = wait_json_file(&stats, Duration::from_secs(120));
    assert!(st.get("error").is_none(), "{st}");
    assert_eq!(st["touch_pages"], pages, "{st}");
    assert!(st["faults"].as_u64().unwrap() >= 1, "{st}");
    let faults = replica_set.with_file_name("touch-faults");
    assert!(faults.exists(), "{}", faults.display());
    w.finish_pass();
}
