//! Huge pages for released runs (acck with `STASIS_HUGE=1`): collapsed
//! while unmonitored, monitored at 4 KiB again after the checkpoint, data
//! exact after a restart.

mod common;

use std::process::Command;

use common::*;

#[test]
fn released_runs_become_huge_pages_and_split_again_after_the_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = build_c("huge.c", tmp.path());
    let o = run_ok(
        Command::new(&exe)
            .arg(tmp.path().join("d"))
            .env("STASIS_MONITOR", "acck")
            .env("STASIS_HUGE", "1")
            .env_remove("LD_LIBRARY_PATH"),
    );
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(s.contains("PASS"), "{s}");
    let num = |k: &str| -> u64 {
        s.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing: {s}"))
    };
    // The kernel here allows MADV_COLLAPSE (THP in madvise mode): at least
    // one 2 MiB range was collapsed; a kernel that refuses reports why.
    assert!(num("collapsed") > 0 || s.contains("huge pages:"), "{s}");
    // One byte written after the checkpoint: one 4 KiB page copied, not 2 MiB.
    assert_eq!(num("one_byte_copied"), 4096, "{s}");
    eprintln!("{}", s.trim());
}
