//! Lazy restore (`restore --lazy`): the process runs before its memory has
//! arrived, and still finds every byte where it left it, through forks,
//! remaps, dropped and unmapped memory while pages stream in; touch sets
//! are recorded and shown. (The page-server side is in `page_server.rs`.)

mod common;
use common::*;

use std::path::PathBuf;
use std::time::Duration;

/// Dumps `w` (killing it) and restores it lazily; returns the path the
/// filler writes its statistics to when done.
fn dump_and_lazy_restore(w: &mut Workload, extra: &[&str]) -> PathBuf {
    w.dump_and_reap();
    let stats = w.dir.path().join("lazy-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut args = vec!["--lazy", "--lazy-stats", stats.to_str().unwrap()];
    args.extend_from_slice(extra);
    w.restore(&args);
    stats
}

/// A fork, an mremap, MADV_DONTNEED and munmap right after the restore,
/// while most pages are still owed: the child gets the parent's missing
/// pages, moved pages come to their new address, dropped pages read zero.
#[test]
fn layout_changes_while_pages_stream_in() {
    let mut w = Workload::start("lazy_events", &["256"]);
    // 256 MiB at 64 MiB/s: four seconds of streaming to change things in.
    let stats = dump_and_lazy_restore(&mut w, &["--lazy-bandwidth", "64M"]);
    std::fs::write(w.dir.path().join("work/go"), b"").unwrap();
    let s = wait_json_file(&stats, Duration::from_secs(120));
    w.finish_pass();
    assert!(s.get("error").is_none(), "{s}");
    assert!(
        s["forks"].as_u64().unwrap() >= 1,
        "the fork came after every page had arrived, so the fork path was not exercised: {s}"
    );
    assert!(s["pages_streamed"].as_u64().unwrap() > 0, "{s}");
}

/// The self-verifying writer resumes writing at once over 256 MiB of which
/// almost nothing has arrived, and checks itself byte for byte.
#[test]
fn writer_writes_at_once_and_matches_exactly() {
    let mut w = Workload::start("chain_writer", &["256"]);
    std::thread::sleep(Duration::from_millis(200));
    // Streaming capped (256 MiB at 64 MiB/s: four seconds), so that the
    // writer meets missing pages even when it gets the CPU late.
    let stats = dump_and_lazy_restore(&mut w, &["--lazy-bandwidth", "64M"]);
    let s = wait_json_file(&stats, Duration::from_secs(120));
    assert!(s.get("error").is_none(), "{s}");
    assert!(
        s["faults"].as_u64().unwrap() > 0,
        "the writer never waited for a page: {s}"
    );
    assert!(s["fault_p99_us"].as_u64().unwrap() > 0, "{s}");
    w.finish_pass();
}

/// `dump --touch-window` records what the process writes after the
/// checkpoint; a lazy restore records the order pages fault in; `inspect`
/// shows both, and the next lazy restore still restores exactly.
#[test]
fn touch_window_and_fault_order_are_recorded_and_shown() {
    let mut w = Workload::start("heap", &["32"]);
    let o = w.dump(&["--leave-running", "--touch-window", "0.5", "--json"]);
    assert_ok(&o, "dump --touch-window");
    let touch = json(&o);
    assert!(touch["touch_pages"].as_u64().unwrap() > 0, "{touch}");
    assert_eq!(touch["touch_window_ms"], 500, "{touch}");
    kill_and_reap(&mut w);
    let images = w.images();
    let inspect = || {
        let o = stasis()
            .args(["inspect", "--json", "-D"])
            .arg(&images)
            .output()
            .unwrap();
        assert_ok(&o, "inspect");
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()[0].clone()
    };
    let i = inspect();
    assert_eq!(i["touch_window"]["pages"], touch["touch_pages"], "{i}");
    assert!(i["touch_faults"].is_null(), "{i}");
    let stats = w.dir.path().join("lazy-stats.json");
    // Streaming slowed down, so that the process faults before its pages
    // have all arrived (and there is an order to record).
    w.restore(&[
        "--lazy",
        "--lazy-bandwidth",
        "16M",
        "--lazy-stats",
        stats.to_str().unwrap(),
    ]);
    let s = wait_json_file(&stats, Duration::from_secs(120));
    assert!(s.get("error").is_none(), "{s}");
    assert!(s["faults"].as_u64().unwrap() >= 1, "{s}");
    let i = inspect();
    assert!(
        i["touch_faults"]["pages"].as_u64().unwrap() >= 1,
        "the fault order was not recorded: {i} (filler: {s})"
    );
    let text = stasis()
        .args(["inspect", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("touch set:") && text.contains("fault order:"),
        "{text}"
    );
    w.finish_pass();
}

/// A damaged touch set is ignored with a warning: the restore is exact.
#[test]
fn damaged_touch_set_is_ignored() {
    let mut w = Workload::start("heap", &["16"]);
    let o = w.dump(&["--leave-running", "--touch-window", "0.2"]);
    assert_ok(&o, "dump --touch-window");
    kill_and_reap(&mut w);
    let f = w.images().join("checkpoints/00000001/touch-window");
    let mut b = std::fs::read(&f).unwrap();
    let n = b.len();
    b[n / 2] ^= 0xff;
    std::fs::write(&f, &b).unwrap();
    let stats = w.dir.path().join("lazy-stats.json");
    w.restore(&["--lazy", "--lazy-stats", stats.to_str().unwrap()]);
    let s = wait_json_file(&stats, Duration::from_secs(120));
    assert!(s.get("error").is_none(), "{s}");
    w.finish_pass();
}

/// A second dump while the first lazy restore is still filling waits for
/// it (the pages still owed would otherwise be missing from the image).
#[test]
fn dump_waits_for_the_lazy_fill() {
    let mut w = Workload::start("heap", &["256"]);
    let stats = dump_and_lazy_restore(&mut w, &["--lazy-bandwidth", "128M"]);
    // At once, while the filler streams.
    w.dump_and_reap();
    let s = wait_json_file(&stats, Duration::from_secs(120));
    assert!(s.get("error").is_none(), "{s}");
    w.restore(&[]);
    std::thread::sleep(Duration::from_millis(200));
    w.finish_pass();
}

/// `stasis run --touch-window` records a touch set after each checkpoint.
#[test]
fn run_records_a_touch_set_after_each_checkpoint() {
    let dir = workloads();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let pidfile = d.path().join("pid");
    let bin = dir.join("chain_writer");
    let mut c = stasis();
    c.arg("run")
        .arg("-D")
        .arg(&img)
        .args(["--every", "0.5", "--touch-window", "0.2", "--json", "--"])
        .arg(&bin)
        .arg(&pidfile)
        .arg("16")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut lines = Lines::new(child.stdout.take().unwrap());
    let pid = wait_pidfile(&pidfile, Duration::from_secs(60));
    lines.wait_event(Duration::from_secs(120), "touch_set");
    // SAFETY: stopping the job under test.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = lines.rest(Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    assert_ok(&o, "stasis run");
    let touch: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "touch_set")
        .collect();
    assert!(!touch.is_empty(), "no touch set recorded: {out}");
    assert!(touch[0]["pages"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(touch[0]["window_ms"], 200, "{out}");
    let n = touch[0]["checkpoint"].as_u64().unwrap();
    let i = stasis()
        .args(["inspect", "--json", "-D"])
        .arg(&img)
        .args(["--checkpoint", &n.to_string()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&i.stdout).unwrap();
    assert_eq!(v[0]["touch_window"]["pages"], touch[0]["pages"], "{v}");
}

/// The filler is SIGKILLed while pages are still owed: its guard kills the
/// tree (which would otherwise read zeros once the last userfaultfd went).
#[test]
fn filler_killed_mid_fill_kills_the_tree() {
    let mut w = Workload::start("heap", &["256"]);
    w.dump_and_reap();
    let log = w.dir.path().join("filler.log");
    let o = stasis()
        .args([
            "restore",
            "--detach",
            "--json",
            "--lazy",
            "--lazy-bandwidth",
            "32M",
            "-D",
        ])
        .arg(w.images())
        .arg("--lazy-log")
        .arg(&log)
        .output()
        .unwrap();
    assert_ok(&o, "restore --lazy");
    let filler = i32::try_from(json(&o)["filler_pid"].as_i64().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(w.pid));
    // SAFETY: killing the filler under test.
    unsafe { libc::kill(filler, libc::SIGKILL) };
    let t0 = std::time::Instant::now();
    while alive(w.pid) && t0.elapsed() < Duration::from_secs(30) {
        reap_if_ours(w.pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(w.pid), "the tree outlived its filler");
    reap_if_ours(filler);
    let t0 = std::time::Instant::now();
    let mut text = String::new();
    while !text.contains("reading zeros") && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    assert!(text.contains("filler of a lazy restore died"), "{text}");
}
