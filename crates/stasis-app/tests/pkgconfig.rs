//! `install.sh` lays out the library, header and `stasis.pc`, and a C
//! program builds against them with `pkg-config --cflags --libs stasis`,
//! both shared and static, and runs (a checkpoint and a restart).

mod common;

use std::process::Command;

use common::*;

const PROG: &str = r#"
#include <stdio.h>
#include <string.h>
#include "stasis.h"
int main(int argc, char **argv) {
    static char a[10000];
    memset(a, 5, sizeof a);
    if (stasis_init(argv[1], NULL) || stasis_protect(1, a, sizeof a) || stasis_checkpoint("p", 1)) return 1;
    memset(a, 0, sizeof a);
    if (stasis_restart("p", stasis_restart_test("p")) || a[9999] != 5) return 2;
    stasis_finalize();
    puts("PASS");
    return 0;
}
"#;

#[test]
fn pkg_config_file_builds_and_links_a_program() {
    if Command::new("pkg-config")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: pkg-config is not installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = tmp.path().join("prefix");
    let lib = shared_lib();
    let st = Command::new(repo().join("crates/stasis-app/install.sh"))
        .arg(&prefix)
        .arg(lib.parent().expect("dir"))
        .status()
        .expect("install.sh");
    assert!(st.success());
    let src = tmp.path().join("p.c");
    std::fs::write(&src, PROG).expect("write");
    let pc = |args: &[&str]| -> Vec<String> {
        let o = Command::new("pkg-config")
            .args(args)
            .arg("stasis")
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .output()
            .expect("pkg-config");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    for (tag, flags) in [
        ("shared", pc(&["--cflags", "--libs"])),
        ("static", pc(&["--static", "--cflags", "--libs"])),
    ] {
        let exe = tmp.path().join(tag);
        let mut cc = Command::new("cc");
        cc.arg(&src).arg("-o").arg(&exe);
        if tag == "static" {
            // The archive, not the shared object beside it (`-l:` is GNU ld's).
            cc.args(flags.iter().map(|f| {
                if f == "-lstasis" {
                    "-l:libstasis.a"
                } else {
                    f.as_str()
                }
            }));
        } else {
            cc.args(&flags)
                .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()));
        }
        assert!(cc.status().expect("cc").success(), "{tag}: cc failed");
        let o = run_ok(
            Command::new(&exe)
                .arg(tmp.path().join(tag).with_extension("d"))
                .env_remove("LD_LIBRARY_PATH"),
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains("PASS"), "{tag}");
    }
}
