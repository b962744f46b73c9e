//! Checkpoints encrypted to age recipients (`--encrypt-recipient`,
//! `--encrypt-recipients-file`; read with `--decrypt-identity`) in an
//! S3-compatible object store, against a real server (versitygw,
//! `common::s3`): nothing of the process's memory in the store or the
//! staging directory; restores without an identity, with another one, or
//! of a changed wrapped key refused, nothing started; with the identity
//! the process comes back whole, also lazily, with its touch set.

mod common;
use common::s3::*;
use common::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// An age identity file of a new identity; returns it and its recipient.
fn identity(dir: &Path, name: &str) -> (PathBuf, String) {
    let (secret, recipient) = stasis_store::generate_identity();
    let p = dir.join(name);
    std::fs::write(&p, format!("# public key: {recipient}\n{secret}\n")).unwrap();
    (p, recipient)
}

/// Dumped to recipients (a recipients file, then a recipient given on the
/// command line: two checkpoints, each under a data key of its own), the
/// process's memory is neither in the store nor left in the staging
/// directory (the same dump stored plainly has it: the check can fail);
/// restores without an identity, with another identity, with a key file,
/// or of a checkpoint whose wrapped key was changed are refused and start
/// nothing; with the identity, inspect verifies both and the process
/// comes back and passes its own check. Conflicting flags are refused.
#[test]
fn recipients_at_rest() {
    let srv = S3Server::start();
    let keys = tempfile::tempdir().unwrap();
    let (id, recipient) = identity(keys.path(), "id");
    let (wrong, _) = identity(keys.path(), "wrong");
    let recipients = keys.path().join("recipients");
    std::fs::write(&recipients, format!("# the restore host\n\n{recipient}\n")).unwrap();
    let idf = id.to_str().unwrap();
    let mut w = Workload::start("heap", &["16"]);
    std::thread::sleep(Duration::from_millis(200));
    let samples = memory_samples(w.pid);
    ok(
        &srv.dump(
            &w,
            &srv.url("plain"),
            &["--leave-running", "--compress-level", "0"],
        ),
        "plain dump",
    );
    assert!(
        holds_any(&srv, "plain", &samples) && staged_holds(&srv, "/plain", &samples),
        "no memory sample in the plain store or its staging: the check cannot work"
    );

    // Refused: a key file and recipients at once; recipients for a local
    // directory; an identity alone for a command that writes.
    let url = srv.url("age");
    let key = keys.path().join("key");
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    let o = srv.dump(
        &w,
        &url,
        &[
            "--encrypt-recipient",
            &recipient,
            "--encrypt-key-file",
            key.to_str().unwrap(),
        ],
    );
    assert_fails_with(&o, "exclude each other");
    let o = w.dump(&["--leave-running", "--encrypt-recipient", &recipient]);
    assert_fails_with(&o, "apply to s3:// stores");
    let o = srv.dump(&w, &url, &["--decrypt-identity", idf]);
    assert_fails_with(&o, "does not encrypt them");
    let o = srv.dump(&w, &url, &["--encrypt-recipient", "age1notakey"]);
    assert_fails_with(&o, "is not an age recipient");
    assert!(alive(w.pid));

    let text = ok(
        &srv.dump(
            &w,
            &url,
            &[
                "--leave-running",
                "--encrypt-recipients-file",
                recipients.to_str().unwrap(),
            ],
        ),
        "dump 1 to recipients",
    );
    assert!(text.contains("encrypted"), "{text}");
    ok(
        &srv.dump(&w, &url, &["--encrypt-recipient", &recipient]),
        "dump 2 to a recipient",
    );
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    assert!(
        !holds_any(&srv, "age", &samples),
        "process memory in the store"
    );
    assert!(
        !staged_holds(&srv, "/age", &samples),
        "process memory left in the staging directory"
    );
    let record = |n: u32| -> serde_json::Value {
        let p = srv.bucket_dir().join(format!("age/commits/{n:08}"));
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let (r1, r2) = (record(1), record(2));
    assert!(
        r1["wrapped_key"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN AGE ENCRYPTED FILE-----"),
        "{r1}"
    );
    assert_ne!(r1["key_id"], r2["key_id"], "one data key per checkpoint");

    let o = srv.restore(&url, &[]);
    assert_fails_with(&o, "give an identity file with --decrypt-identity");
    assert!(!alive(w.pid));
    let o = srv.restore(&url, &["--decrypt-identity", wrong.to_str().unwrap()]);
    assert_fails_with(&o, "is a recipient of checkpoint 2");
    assert!(!alive(w.pid));
    let o = srv.restore(&url, &["--encrypt-key-file", key.to_str().unwrap()]);
    assert_fails_with(&o, "is encrypted to age recipients");
    assert!(!alive(w.pid));
    // Checkpoint 2's wrapped key swapped for checkpoint 1's.
    let path = srv.bucket_dir().join("age/commits/00000002");
    let original = std::fs::read(&path).unwrap();
    let mut changed = r2.clone();
    changed["wrapped_key"] = r1["wrapped_key"].clone();
    std::fs::write(&path, serde_json::to_vec(&changed).unwrap()).unwrap();
    let o = srv.restore(&url, &["--decrypt-identity", idf]);
    assert_fails_with(&o, "is damaged or was tampered with");
    assert!(!alive(w.pid));
    std::fs::write(&path, &original).unwrap();

    let listed = inspect_json(&srv, &url, &["--decrypt-identity", idf]);
    let numbers: Vec<u64> = listed
        .iter()
        .map(|c| c["number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, vec![1, 2]);
    ok(
        &srv.restore(&url, &["--decrypt-identity", idf]),
        "restore with the identity",
    );
    w.finish_pass();

    // gc reads the records it keeps: it needs the identity too.
    let gc = |extra: &[&str]| {
        srv.stasis()
            .args(["gc", "--keep", "1", "-D", &url])
            .args(extra)
            .env("STASIS_S3_SWEEP_AGE", "0")
            .output()
            .unwrap()
    };
    assert_fails_with(&gc(&[]), "--decrypt-identity");
    ok(&gc(&["--decrypt-identity", idf]), "gc with the identity");
    let listed = inspect_json(&srv, &url, &["--decrypt-identity", idf]);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["number"], 2);
}

/// A lazy restore from a store written to a recipient: the touch set the
/// dump recorded (stored by the dumping host, which holds no identity) is
/// given to the filler, which reads the pages with the identity by ranged
/// reads and stores its fault order sealed; the process passes its check.
#[test]
fn lazy_restore_with_an_identity() {
    let srv = S3Server::start();
    let keys = tempfile::tempdir().unwrap();
    let (id, recipient) = identity(keys.path(), "id");
    let idf = id.to_str().unwrap();
    let url = srv.url("age-lazy");
    let mut w = Workload::start("heap", &["32"]);
    std::thread::sleep(Duration::from_millis(200));
    let samples = memory_samples(w.pid);
    let o = srv.dump(
        &w,
        &url,
        &[
            "--leave-running",
            "--touch-window",
            "0.5",
            "--json",
            "--encrypt-recipient",
            &recipient,
        ],
    );
    let text = ok(&o, "dump --touch-window to a recipient");
    let pages = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["touch_pages"].as_u64())
        .unwrap_or_else(|| panic!("no touch set: {text}"));
    assert!(pages > 0);
    let tree = descendants(w.pid);
    ok(
        &srv.dump(&w, &url, &["--encrypt-recipient", &recipient]),
        "dump 2",
    );
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    for p in tree {
        reap_if_ours(p);
    }
    assert!(
        !holds_any(&srv, "age-lazy", &samples),
        "memory in the store"
    );
    let stats = keys.path().join("stats.json");
    let o = srv.restore(
        &url,
        &[
            "--lazy",
            "--checkpoint",
            "1",
            "--lazy-bandwidth",
            "16M",
            "--lazy-stats",
            stats.to_str().unwrap(),
            "--decrypt-identity",
            idf,
        ],
    );
    ok(&o, "restore --lazy with the identity");
    let st = wait_json_file(&stats, Duration::from_secs(120));
    assert!(st.get("error").is_none(), "{st}");
    assert_eq!(st["touch_pages"], pages, "{st}");
    assert!(st["pages_streamed"].as_u64().unwrap() > 0, "{st}");
    let faults = srv
        .bucket_dir()
        .join("age-lazy/touch/00000001/touch-faults");
    assert!(faults.exists(), "{}", faults.display());
    let listed = inspect_json(
        &srv,
        &url,
        &["--checkpoint", "1", "--decrypt-identity", idf],
    );
    assert!(
        listed[0]["touch_faults"]["pages"].as_u64().unwrap() >= 1,
        "{listed:?}"
    );
    w.finish_pass();
}

/// gc's merge of a chain written to recipients keeps the kept
/// checkpoint's data key and wrapped key, so it needs only the identity.
/// (Dumps into an encrypted store are full, so the chain is made here: a
/// local incremental chain of two checkpoints uploaded with recipients.)
/// The merged checkpoint restores and the process passes its check.
#[test]
fn gc_merges_a_chain_under_recipients_with_the_identity_only() {
    let srv = S3Server::start();
    let keys = tempfile::tempdir().unwrap();
    let (id, recipient) = identity(keys.path(), "id");
    let idf = id.to_str().unwrap();
    let mut w = Workload::start("heap", &["16"]);
    std::thread::sleep(Duration::from_millis(200));
    ok(
        &w.dump(&["--leave-running", "--track", "uffd"]),
        "local dump 1",
    );
    std::thread::sleep(Duration::from_millis(200));
    let tree = descendants(w.pid);
    ok(&w.dump(&["--track", "uffd"]), "local dump 2");
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    for p in tree {
        reap_if_ours(p);
    }
    let cfg = stasis_store::remote::S3Config {
        endpoint: Some(srv.endpoint.clone()),
        access_key: Some(ACCESS_KEY.into()),
        secret_key: Some(SECRET_KEY.into()),
        region: Some("us-east-1".into()),
        allow_http: Some(true),
    };
    let url = srv.url("age-gc");
    let loc = stasis_store::Location::parse(&url).unwrap();
    let seal = stasis_store::seal::SealOptions {
        zstd: Some(1),
        recipients: stasis_store::Recipients::from_args(&[recipient], &[]).unwrap(),
        ..Default::default()
    };
    let store = stasis_store::S3Image::open_with(&loc, seal, &cfg).unwrap();
    for (n, parent) in [(1, None), (2, Some(1))] {
        let dir = w.images().join(format!("checkpoints/{n:08}"));
        let manifest = std::fs::read(dir.join("manifest.bin")).unwrap();
        store.upload(&dir, (n, parent), manifest, &[]).unwrap();
    }
    let record = || -> serde_json::Value {
        let p = srv.bucket_dir().join("age-gc/commits/00000002");
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let before = record();
    assert_eq!(before["parent"], 1, "{before}");
    let o = srv
        .stasis()
        .args(["gc", "--keep", "1", "--json", "-D", &url])
        .args(["--decrypt-identity", idf])
        .env("STASIS_S3_SWEEP_AGE", "0")
        .output()
        .unwrap();
    let text = ok(&o, "gc with the identity only");
    let r: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert!(!r["merged"].as_array().unwrap().is_empty(), "{r}");
    let after = record();
    assert!(after["parent"].is_null(), "{after}");
    assert_eq!(after["wrapped_key"], before["wrapped_key"]);
    assert_eq!(after["key_id"], before["key_id"]);
    assert!(!srv.bucket_dir().join("age-gc/commits/00000001").exists());
    ok(
        &srv.restore(&url, &["--decrypt-identity", idf]),
        "restore of the merged checkpoint",
    );
    w.finish_pass();
}
