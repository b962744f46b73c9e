//! `stasis_checkpoint_begin` copies on write: a program overwriting its
//! 64 MiB region right after it returns still gets, at restart, the bytes
//! of the instant the checkpoint began (all 67,108,864 compared), in every
//! mode; in `page` and `acck` some pages are copied by the program's own
//! first write, ahead of the background copier.

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_background_checkpoint_holds_the_bytes_of_its_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = build_c("cow.c", tmp.path());
    for mode in ["page", "acck", "uffd", "full"] {
        let o = run_ok(
            Command::new(&exe)
                .arg(tmp.path().join(mode))
                .env("STASIS_MONITOR", mode)
                // The copier waits 10 ms before each of its 64 megabytes:
                // the program's writes, from the region's end, meet pages
                // it has not copied yet even on a loaded machine.
                .env("STASIS_TEST_DELAY", "app-copy:10")
                .env_remove("LD_LIBRARY_PATH"),
        );
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(s.contains("PASS"), "{mode}: {s}");
        let copies: u64 = s
            .split_whitespace()
            .find_map(|f| f.strip_prefix("cow_copies="))
            .and_then(|v| v.parse().ok())
            .expect("cow_copies");
        if mode == "page" || mode == "acck" {
            assert!(copies > 0, "{mode}: no page was copied by a write: {s}");
        }
        eprintln!("{mode}: {}", s.trim());
    }
}
