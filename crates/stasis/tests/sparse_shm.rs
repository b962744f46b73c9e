//! A dump reads only the pages of shared memory that exist and never
//! faults in new ones; holes stay holes in the image and after a restore
//! (issue 12: PostgreSQL's 143 MiB segment with 11 MiB in use became fully
//! resident after `dump --leave-running`, and its image held all of it).
//!
//! The `sparse_shm` workload maps three 128 MiB shared objects (a System V
//! segment, a MAP_SHARED|MAP_ANONYMOUS area, a memfd), each with 3 MiB
//! written. Their allocated size (`st_blocks` of the object, through
//! `/proc/PID/map_files`) and the process's `RssShmem` are measured before
//! and after each dump, and after the restore.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

const MIB: u64 = 1 << 20;
/// What the workload writes into each object.
const WRITTEN: u64 = 3 * MIB;
/// Allowed growth of an object (a few pages of slack).
const MARGIN: u64 = 64 << 10;

/// Allocated bytes of each shared object of `pid`: "sysv", "anon", "memfd".
fn objects(pid: i32) -> BTreeMap<&'static str, u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let mut out = BTreeMap::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"rw-s") {
            continue;
        }
        let name = f[5..].join(" ");
        let kind = if name.starts_with("/SYSV") {
            "sysv"
        } else if name.starts_with("/dev/zero") {
            "anon"
        } else if name.starts_with("/memfd:sparse") {
            "memfd"
        } else {
            continue;
        };
        let m = std::fs::metadata(format!("/proc/{pid}/map_files/{}", f[0]))
            .unwrap_or_else(|e| panic!("stat map_files/{}: {e}", f[0]));
        assert_eq!(m.size(), 128 * MIB, "{kind}: size of the object");
        out.insert(kind, m.blocks() * 512);
    }
    assert_eq!(out.len(), 3, "the three shared objects of {pid}: {maps}");
    out
}

/// `RssShmem` of `pid`, in bytes.
fn rss_shmem(pid: i32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    st.lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("RssShmem")
        * 1024
}

/// Bytes of every file under `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let m = e.metadata().expect("metadata");
        n += if m.is_dir() {
            tree_bytes(&e.path())
        } else {
            m.len()
        };
    }
    n
}

fn assert_not_grown(what: &str, before: &BTreeMap<&str, u64>, after: &BTreeMap<&str, u64>) {
    for (k, b) in before {
        let a = after[k];
        assert!(
            a <= b + MARGIN,
            "{what}: the {k} object grew from {b} to {a} bytes (holes faulted in)"
        );
    }
}

#[test]
fn shared_memory_holes_are_neither_faulted_in_nor_saved() {
    let mut w = Workload::start("sparse_shm", &[]);
    let before = objects(w.pid);
    for (k, b) in &before {
        assert!(
            (WRITTEN..WRITTEN + MARGIN).contains(b),
            "{k}: {b} bytes allocated before any dump"
        );
    }
    let rss = rss_shmem(w.pid);
    let mut images = 0;
    for flags in [
        &["--leave-running"][..],
        &["--leave-running", "--concurrent"],
    ] {
        let o = w.dump(flags);
        assert_ok(&o, &format!("dump {flags:?}"));
        let after = objects(w.pid);
        assert_not_grown(&format!("after dump {flags:?}"), &before, &after);
        let r = rss_shmem(w.pid);
        assert!(
            r <= rss + 3 * MARGIN,
            "after dump {flags:?}: RssShmem grew from {rss} to {r}"
        );
        // Each checkpoint holds about the 9 MiB written (the manifest
        // encodes the System V and memfd bytes as CBOR integers, up to two
        // bytes each), not the 384 MiB of the objects.
        let total = tree_bytes(&w.images());
        let this = total - images;
        images = total;
        eprintln!("dump {flags:?}: checkpoint of {this} bytes; objects {after:?}, RssShmem {r}");
        assert!(
            this < 32 * MIB,
            "dump {flags:?}: the checkpoint takes {this} bytes"
        );
    }
    // SAFETY: killing our workload.
    unsafe { libc::kill(w.pid, libc::SIGKILL) };
    assert_eq!(w.reap(), (None, Some(libc::SIGKILL)));
    w.restore(&[]);
    let restored = objects(w.pid);
    eprintln!(
        "restored objects: {restored:?}, RssShmem {}",
        rss_shmem(w.pid)
    );
    assert_not_grown("after the restore", &before, &restored);
    for (k, b) in &before {
        assert!(
            restored[k] + MARGIN >= *b,
            "after the restore: the {k} object has {} bytes, {b} before",
            restored[k]
        );
    }
    // Every written byte is back, and every hole reads as zero.
    w.finish_pass();
}
