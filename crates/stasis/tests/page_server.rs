//! Restores from `stasis page-server`: whole and lazy, with a wrong token,
//! with the server killed or a page cut short mid-restore (the restored
//! tree is killed, never left to read zeros), and across two network
//! namespaces joined by a veth pair.

mod common;
use common::*;

use std::time::{Duration, Instant};

const TOKEN: &str = "a-long-shared-token-for-tests-4242";

fn restore_from(addr: &str, token_file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    stasis()
        .args(["restore", "--detach", "--from", addr, "--token-file"])
        .arg(token_file)
        .args(extra)
        .output()
        .unwrap()
}

/// Waits until `pid` is gone (reaping it if it is ours).
fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        reap_if_ours(pid);
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn whole_restore_from_a_page_server() {
    let mut w = Workload::start("heap", &["64"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let o = restore_from(&s.addr, &s.token_file, &["--json"]);
    assert_ok(&o, "restore --from");
    let r = json(&o);
    assert_eq!(r["pid"], w.pid, "{r}");
    assert_eq!(r["lazy_bytes"], 0, "{r}");
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

#[test]
fn wrong_or_missing_token_is_refused_and_nothing_runs() {
    let mut w = Workload::start("heap", &["16"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    let bad = w.dir.path().join("bad-token");
    std::fs::write(&bad, "not-the-token-at-all-000000").unwrap();
    for lazy in [false, true] {
        let extra: &[&str] = if lazy { &["--lazy"] } else { &[] };
        let o = restore_from(&s.addr, &bad, extra);
        assert_fails_with(&o, "refused the token");
        assert!(!alive(w.pid), "a process runs after a refused restore");
    }
    let o = stasis()
        .args(["restore", "--detach", "--from", &s.addr])
        .output()
        .unwrap();
    assert_fails_with(&o, "--token-file");
    // The right token still works.
    let o = restore_from(&s.addr, &s.token_file, &["--lazy"]);
    assert_ok(&o, "restore --lazy --from");
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

/// The server goes away while pages stream in: the filler cannot deliver
/// the pages still owed, so it kills the tree and says why.
#[test]
fn server_killed_mid_restore_kills_the_tree() {
    let mut w = Workload::start("heap", &["256"]);
    w.dump_and_reap();
    let mut s = PageServer::start(&w.images(), TOKEN);
    // 256 MiB at 16 MiB/s per connection: the fill takes seconds.
    let p = Proxy::start(&s.addr, Some(16 << 20), None);
    let stats = w.dir.path().join("stats.json");
    let log = w.dir.path().join("filler.log");
    let o = restore_from(
        &p.addr,
        &s.token_file,
        &[
            "--lazy",
            "--lazy-stats",
            stats.to_str().unwrap(),
            "--lazy-log",
            log.to_str().unwrap(),
        ],
    );
    assert_ok(&o, "restore --lazy --from");
    assert!(alive(w.pid));
    std::thread::sleep(Duration::from_millis(300));
    s.kill();
    drop(p);
    assert!(
        wait_gone(w.pid, Duration::from_secs(60)),
        "the tree outlived its page server"
    );
    let st = wait_json_file(&stats, Duration::from_secs(60));
    let err = st["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {st}"));
    assert!(
        err.contains("was killed") && err.contains(&w.pid.to_string()),
        "{err}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("reading zeros"), "{text}");
}

/// A reply cut in the middle of a page: the client sees it short, the tree
/// is killed.
#[test]
fn truncated_page_kills_the_tree() {
    let mut w = Workload::start("heap", &["128"]);
    w.dump_and_reap();
    let s = PageServer::start(&w.images(), TOKEN);
    // Every connection is cut 1000 bytes into its fourth MiB: the small
    // fetches before the tree runs get through, the filler's do not.
    let p = Proxy::start(&s.addr, None, Some((3 << 20) + 1000));
    let stats = w.dir.path().join("stats.json");
    let o = restore_from(
        &p.addr,
        &s.token_file,
        &["--lazy", "--lazy-stats", stats.to_str().unwrap()],
    );
    // The background stream starts with the first process handed to the
    // filler, and its connection is cut after 3 MiB: usually after the
    // restore has returned, but on a busy machine before it could say the
    // tree runs; then the restore fails, with the filler's reason.
    if !o.status.success() {
        assert_fails_with(
            &o,
            "was killed, since running on would have meant reading zeros",
        );
    }
    assert!(
        wait_gone(w.pid, Duration::from_secs(60)),
        "the tree survived a truncated page"
    );
    let st = wait_json_file(&stats, Duration::from_secs(60));
    assert!(
        st["error"]
            .as_str()
            .is_some_and(|e| e.contains("was killed")),
        "{st}"
    );
    assert!(p.cuts.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

fn ip(args: &[&str]) {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&o, &format!("ip {}", args.join(" ")));
}

/// Deletes the namespaces when dropped.
struct Netns(&'static [&'static str]);
impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.0 {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .output();
        }
    }
}

/// Two hosts: the page server in one network namespace, the restore in
/// another, joined by a veth pair.
#[test]
fn lazy_restore_across_network_namespaces() {
    let (a, b) = ("stasis-test-srv", "stasis-test-cli");
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", a])
        .output();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", b])
        .output();
    let _ns = Netns(&["stasis-test-srv", "stasis-test-cli"]);
    ip(&["netns", "add", a]);
    ip(&["netns", "add", b]);
    ip(&[
        "link", "add", "stv-a", "netns", a, "type", "veth", "peer", "name", "stv-b", "netns", b,
    ]);
    ip(&["-n", a, "addr", "add", "10.77.0.1/24", "dev", "stv-a"]);
    ip(&["-n", b, "addr", "add", "10.77.0.2/24", "dev", "stv-b"]);
    for (ns, dev) in [(a, "stv-a"), (b, "stv-b")] {
        ip(&["-n", ns, "link", "set", dev, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let mut w = Workload::start("heap", &["64"]);
    w.dump_and_reap();
    let s = PageServer::start_on(&w.images(), TOKEN, "10.77.0.1:0", Some(a));
    assert!(s.addr.starts_with("10.77.0.1:"), "{}", s.addr);
    let stats = w.dir.path().join("stats.json");
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", b])
        .arg(env!("CARGO_BIN_EXE_stasis"))
        .args([
            "restore",
            "--detach",
            "--lazy",
            "--from",
            &s.addr,
            "--lazy-stats",
        ])
        .arg(&stats)
        .arg("--token-file")
        .arg(&s.token_file)
        .output()
        .unwrap();
    assert_ok(&o, "restore --lazy --from another namespace");
    // The restored process lives in namespace b, pages came from a.
    let ns_of = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let st = wait_json_file(&stats, Duration::from_secs(60));
    assert!(st.get("error").is_none(), "{st}");
    assert!(
        st["pages_streamed"].as_u64().unwrap() + st["pages_by_fault"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_ne!(ns_of(w.pid), ns_of(std::process::id() as i32));
    w.finish_pass();
}
