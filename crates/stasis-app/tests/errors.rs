//! Errors are codes with messages in every mode, and the SIGSEGV handler
//! chains to the program's own (or to the default action).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use common::*;

#[test]
fn every_error_is_a_code_and_foreign_faults_reach_the_programs_handler() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = build_c("errors.c", tmp.path());
    for mode in ["page", "acck", "uffd", "full", "auto"] {
        let dir = tmp.path().join(mode);
        let o = run_ok(
            Command::new(&exe)
                .arg(&dir)
                .arg("/etc/hostname/not-a-dir")
                .env("STASIS_MONITOR", mode)
                .env_remove("LD_LIBRARY_PATH")
                .env_remove("STASIS_RUN_REQUEST"),
        );
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(s.contains("PASS") && !s.contains("FAIL"), "{mode}: {s}");
    }
}

#[test]
fn a_foreign_fault_without_a_handler_kills_with_sigsegv() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = build_c("errors.c", tmp.path());
    for mode in ["page", "acck"] {
        let o = Command::new(&exe)
            .arg(tmp.path().join(mode))
            .arg("/nonexistent")
            .arg("crash")
            .env("STASIS_MONITOR", mode)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("STASIS_RUN_REQUEST")
            .output()
            .expect("run");
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGSEGV),
            "{mode}: {:?} {}",
            o.status,
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains("not ours"));
    }
}
