//! The commands around dump/restore: check, inspect, JSON output, the demo,
//! and restore without --detach (waits and forwards the exit status).

mod common;
use common::*;

#[test]
fn check_passes_here_and_reports_every_facility() {
    let o = stasis().args(["check", "--json"]).output().unwrap();
    assert_ok(&o, "check");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let names: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for n in [
        "ptrace",
        "remote-syscalls",
        "process_vm_readv/writev",
        "userfaultfd",
        "uffd-wp-async",
        "PAGEMAP_SCAN",
        "soft-dirty",
        "clone3-set_tid",
        "PR_SET_MM_MAP",
        "pidfd_getfd",
        "ARCH_MAP_VDSO",
        "capabilities",
    ] {
        assert!(names.contains(&n), "check lacks {n}: {names:?}");
    }
    assert!(v["uffd_features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "WP_ASYNC"));
    let o = stasis().arg("check").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("dump and restore can work here"));
}

#[test]
fn json_summaries_and_inspect() {
    let mut w = Workload::start("heap", &["16"]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let o = w.dump(&["--json"]);
    assert_ok(&o, "dump --json");
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d["pid"], w.pid);
    assert!(d["pages"].as_u64().unwrap() >= 4096, "16 MiB heap: {d}");
    assert_eq!(w.reap().1, Some(libc::SIGKILL));
    let o = stasis()
        .args(["inspect", "--json", "--checkpoint", "1", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_ok(&o, "inspect --json");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["verified"], true);
    assert_eq!(v[0]["processes"][0]["pid"], w.pid);
    let o = stasis()
        .args(["inspect", "--checkpoint", "1", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("[heap]") && text.contains("[stack]") && text.contains("checksums ok"),
        "{text}"
    );
    let pidfile = w.dir.path().join("restored.pid");
    let o = stasis()
        .args(["restore", "--detach", "--json", "--pidfile"])
        .arg(&pidfile)
        .arg("-D")
        .arg(w.images())
        .output()
        .unwrap();
    assert_ok(&o, "restore --json");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["pid"], w.pid);
    assert_eq!(r["pages"], d["pages"]);
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap().trim(),
        w.pid.to_string()
    );
    w.finish_pass();
}

#[test]
fn restore_without_detach_waits_and_returns_the_exit_status() {
    let mut w = Workload::start("counter", &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    w.dump_and_reap();
    let pidfile = w.dir.path().join("restored.pid");
    let mut c = stasis();
    c.args(["restore", "--pidfile"])
        .arg(&pidfile)
        .arg("-D")
        .arg(w.images())
        .stdout(std::process::Stdio::null());
    let mut restorer = c.spawn().unwrap();
    let pid = wait_pidfile(&pidfile, std::time::Duration::from_secs(30));
    assert_eq!(pid, w.pid);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: signalling the restored workload.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let st = restorer.wait().unwrap();
    assert_eq!(
        st.code(),
        Some(0),
        "restore should exit with the workload's status"
    );
    assert_eq!(w.out().lines().last(), Some("PASS"));
}

#[test]
fn demo_runs_end_to_end() {
    let d = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["demo", "--before", "1", "--after", "1", "--dir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_ok(&o, "demo");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("demo OK"), "{text}");
}

#[test]
fn restore_into_a_new_pid_namespace_while_the_original_runs() {
    new_pidns(false);
}

/// The same, lazily: the filler serves a process it knows by its PID
/// outside the namespace.
#[test]
fn lazy_restore_into_a_new_pid_namespace() {
    new_pidns(true);
}

fn new_pidns(lazy: bool) {
    let mut w = Workload::start("counter", &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_ok(&w.dump(&["--leave-running"]), "dump --leave-running");
    // The saved PID is taken (the original runs on): a plain restore must
    // refuse, --new-pidns must work.
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_fails_with(&o, "in use");
    let pidfile = w.dir.path().join("ns.pid");
    let stats = w.dir.path().join("stats.json");
    let mut c = stasis();
    c.args(["restore", "--detach", "--new-pidns", "--json", "--pidfile"])
        .arg(&pidfile)
        .arg("-D")
        .arg(w.images());
    if lazy {
        c.args(["--lazy", "--lazy-stats"]).arg(&stats);
    }
    let o = c.output().unwrap();
    assert_ok(&o, "restore --new-pidns");
    if lazy {
        let s = wait_json_file(&stats, std::time::Duration::from_secs(60));
        assert!(s.get("error").is_none(), "{s}");
        assert!(s["processes"].as_u64().unwrap() >= 1, "{s}");
    }
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let outer = wait_pidfile(&pidfile, std::time::Duration::from_secs(5));
    assert_eq!(r["pid"], outer);
    assert_eq!(r["pid_in_namespace"], w.pid);
    assert_ne!(outer, w.pid);
    let status = std::fs::read_to_string(format!("/proc/{outer}/status")).unwrap();
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .unwrap()
        .to_string();
    assert!(
        nspid.ends_with(&format!("\t{}", w.pid)),
        "the restored process must have the saved PID inside its namespace: {nspid}"
    );
    // Both run; the restored one passes its own memory check, and its
    // namespace's init reports its exit status.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let init = i32::try_from(r["init_pid"].as_i64().unwrap()).unwrap();
    // SAFETY: signalling the restored workload.
    unsafe { libc::kill(outer, libc::SIGTERM) };
    assert_eq!(
        waitpid_timeout(init, std::time::Duration::from_secs(20)),
        (Some(0), None),
        "the restored workload should exit 0 (PASS)"
    );
    assert!(alive(w.pid), "the original keeps running");
    // (Both write to one log at their own offsets, so the restored one's
    // PASS line may be overwritten: its exit status above is the proof.)
    w.finish_pass();
}
