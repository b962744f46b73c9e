//! `stasis agent` and `stasis cluster`: consistent checkpoints of a job
//! over several hosts. Here on one host (agents on loopback): the protocol
//! end to end, the two-phase commit, the restore barrier, a wrong token,
//! and a coordinator or an agent killed at each phase of a round. The
//! multi-host tests (network namespaces) are in `cluster_hosts.rs`.

mod common;
use common::cluster::*;
use common::*;

use std::path::PathBuf;
use std::time::Duration;

struct Setup {
    d: tempfile::TempDir,
    tf: PathBuf,
    agent: Agent,
}

fn setup() -> Setup {
    workloads(); // subreaper, builds the workloads
    let d = tempfile::tempdir().unwrap();
    let tf = token_file(d.path(), TOKEN);
    let agent = Agent::start(&d.path().join("agent"), &tf, "127.0.0.1:0", None);
    Setup { d, tf, agent }
}

fn target(s: &Setup, pid: i32) -> String {
    format!("{}={pid}", s.agent.addr)
}

/// A cluster dump that kills, then a cluster restore: the workload (two
/// trees on one agent) carries on and passes its own checks.
#[test]
fn cluster_dump_kill_and_restore_two_trees_on_one_agent() {
    let s = setup();
    let mut a = Workload::start("heap", &["32"]);
    let mut b = Workload::start("counter", &[]);
    let o = cluster(
        &s.tf,
        &[
            "dump",
            "--job",
            "j1",
            "--target",
            &target(&s, a.pid),
            "--target",
            &target(&s, b.pid),
        ],
    );
    assert_ok(&o, "cluster dump");
    let r = json(&o);
    assert_eq!(r["round"], 1, "{r}");
    assert_eq!(
        r["hosts"][0]["checkpoints"].as_array().unwrap().len(),
        2,
        "{r}"
    );
    for w in [&mut a, &mut b] {
        assert_eq!(
            w.reap(),
            (None, Some(libc::SIGKILL)),
            "{} after the dump",
            w.name
        );
    }
    let o = cluster(
        &s.tf,
        &["restore", "--job", "j1", "--target", &s.agent.addr],
    );
    assert_ok(&o, "cluster restore");
    let r = json(&o);
    assert_eq!(r["round"], 1, "{r}");
    for w in [&a, &b] {
        assert!(alive(w.pid), "{} not restored", w.name);
        finish_pass_restored(w);
    }
    drop(s);
}

/// Rounds with `--leave-running --concurrent` while the job runs: each is
/// numbered, recorded and listed; then the job is killed and restored
/// from the newest.
#[test]
fn concurrent_rounds_are_numbered_and_the_newest_is_restored() {
    let mut s = setup();
    // (A workload that writes nothing to its output before the end: the
    // output file is not part of a checkpoint.)
    let mut w = Workload::start("heap", &["16"]);
    for round in 1..=3u64 {
        let o = cluster(
            &s.tf,
            &[
                "dump",
                "--job",
                "c",
                "--target",
                &target(&s, w.pid),
                "--leave-running",
                "--concurrent",
            ],
        );
        assert_ok(&o, "cluster dump --leave-running --concurrent");
        assert_eq!(json(&o)["round"], round);
        assert!(alive(w.pid));
    }
    let o = cluster(&s.tf, &["inspect", "--job", "c", "--target", &s.agent.addr]);
    assert_ok(&o, "cluster inspect");
    assert_eq!(json(&o)["complete"], serde_json::json!([1, 2, 3]));
    kill_and_reap(&mut w);
    let o = cluster(&s.tf, &["restore", "--job", "c", "--target", &s.agent.addr]);
    assert_ok(&o, "cluster restore");
    assert_eq!(json(&o)["round"], 3);
    finish_pass_restored(&w);
    s.agent.stop();
}

#[test]
fn a_wrong_token_is_refused_and_nothing_is_dumped() {
    let s = setup();
    let w = Workload::start("counter", &[]);
    let bad = s.d.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    let bad = token_file(&bad, "another-token-entirely-000000000");
    let o = cluster(
        &bad,
        &["dump", "--job", "t", "--target", &target(&s, w.pid)],
    );
    assert_fails_with(&o, "token");
    assert!(alive(w.pid), "the workload died after a refused dump");
    let o = cluster(&s.tf, &["inspect", "--job", "t", "--target", &s.agent.addr]);
    assert_fails_with(&o, "no agent holds a checkpoint of job t");
}

/// A target that does not exist fails the round on its agent: every
/// other tree is put back and runs on, nothing is committed anywhere.
#[test]
fn a_failing_tree_aborts_the_round_everywhere() {
    let s = setup();
    let mut w = Workload::start("counter", &[]);
    let dead = unused_pid();
    let o = cluster(
        &s.tf,
        &[
            "dump",
            "--job",
            "f",
            "--target",
            &target(&s, w.pid),
            "--target",
            &target(&s, dead),
        ],
    );
    assert_fails_with(&o, &dead.to_string());
    assert!(alive(w.pid), "the healthy tree died with the round");
    let o = cluster(&s.tf, &["inspect", "--job", "f", "--target", &s.agent.addr]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("\"complete\":[1"), "{text}");
    w.finish_pass();
}

/// Starts `sleep` at `pid` (just freed), with `clone3` and `set_tid`:
/// nothing else on the machine is moved (rewinding the kernel's next PID,
/// `ns_last_pid`, would hand the PIDs after it to any process started
/// meanwhile, which then collide with the saved PIDs of other tests'
/// restores). Returns its PID; the caller kills and reaps it.
fn sleeper_at(pid: i32) -> i32 {
    let prog = std::ffi::CString::new("/bin/sleep").unwrap();
    let arg = std::ffi::CString::new("1000").unwrap();
    let argv = [prog.as_ptr(), arg.as_ptr(), std::ptr::null()];
    let tid = [pid];
    // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal,
    // stack, stack_size, tls, set_tid, set_tid_size, cgroup.
    let mut args = [0u64; 11];
    args[4] = libc::SIGCHLD.unsigned_abs().into();
    args[8] = tid.as_ptr() as u64;
    args[9] = 1;
    // SAFETY: a fork-like clone3 (no shared memory); the child only calls
    // execv on strings made before it and _exit, both async-signal-safe.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args.as_ptr(),
            std::mem::size_of_val(&args),
        )
    };
    if r == 0 {
        // SAFETY: as above, in the child.
        unsafe {
            libc::execv(prog.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    assert_eq!(
        r,
        i64::from(pid),
        "clone3 at PID {pid}: {}",
        std::io::Error::last_os_error()
    );
    pid
}

/// A tree that exited between two rounds, whose PID another program took,
/// is not the job's any more: the next round is refused by name, and that
/// program runs on untouched (never stopped, nothing of it committed).
#[test]
fn a_pid_taken_by_another_program_after_the_tree_exited_is_refused() {
    let s = setup();
    let mut w = Workload::start("counter", &[]);
    let pid = w.pid;
    let round = |s: &Setup| {
        cluster(
            &s.tf,
            &[
                "dump",
                "--job",
                "p",
                "--target",
                &target(s, pid),
                "--leave-running",
            ],
        )
    };
    assert_ok(&round(&s), "cluster dump of the job's tree");
    kill_and_reap(&mut w);
    let other = sleeper_at(pid);
    let _kill = KillOnDrop(other);
    // Asleep before the round (it may be between clone3 and exec).
    wait_until(Duration::from_secs(10), "the other program asleep", || {
        cmdline_of(other).starts_with("/bin/sleep")
            && std::fs::read_to_string(format!("/proc/{other}/stat")).is_ok_and(|st| {
                st.rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next())
                    == Some("S")
            })
    });
    let o = round(&s);
    assert_fails_with(&o, "taken by another program");
    // (Still asleep, not a zombie: checked below.)
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = state.rsplit(')').next().unwrap().split_whitespace().next();
    assert_eq!(
        state,
        Some("S"),
        "the other program is not asleep as it was"
    );
    let o = cluster(&s.tf, &["inspect", "--job", "p", "--target", &s.agent.addr]);
    assert_ok(&o, "cluster inspect");
    assert_eq!(json(&o)["complete"], serde_json::json!([1]));
    // (Killed and reaped by `_kill`.)
}

/// The coordinator killed after each step of a round: before the decision
/// the job runs on and the round is nowhere; after it, every host commits.
#[test]
fn a_coordinator_killed_at_each_phase_leaves_the_job_running_or_committed() {
    let s = setup();
    let mut w = Workload::start("heap", &["16"]);
    // Steps: 1 after Dump, 2 after Freeze, 3 after Release, 4 after Commit
    // (the decision).
    for (step, committed) in [(1, false), (2, false), (3, false), (4, true)] {
        let o = stasis()
            .args([
                "cluster",
                "dump",
                "--job",
                "k",
                "--leave-running",
                "--target",
            ])
            .arg(target(&s, w.pid))
            .arg("--token-file")
            .arg(&s.tf)
            .env("STASIS_FAULT", format!("die-in-cluster-round:{step}"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGKILL),
            "step {step}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The agent notices, aborts (or commits), and the job runs on.
        let want = serde_json::json!(if committed { vec![1] } else { vec![] });
        wait_until(Duration::from_secs(30), "the agent to settle", || {
            let o = cluster(&s.tf, &["inspect", "--job", "k", "--target", &s.agent.addr]);
            let v: serde_json::Value =
                serde_json::from_slice(o.stdout.split(|&b| b == b'\n').next().unwrap_or(b"{}"))
                    .unwrap_or_default();
            v["complete"] == want || (!committed && !o.status.success())
        });
        assert!(
            alive(w.pid),
            "the job died with the coordinator at step {step}"
        );
        // Not stopped either: it still answers SIGTERM later with PASS.
        let tracer = std::fs::read_to_string(format!("/proc/{}/status", w.pid)).unwrap();
        wait_until(Duration::from_secs(10), "the tree to be untraced", || {
            std::fs::read_to_string(format!("/proc/{}/status", w.pid))
                .is_ok_and(|t| t.contains("TracerPid:\t0\n"))
        });
        let _ = tracer;
    }
    w.finish_pass();
}

/// An agent killed between recording the decision and committing: the job
/// runs on; started again on the same directory, the agent finishes the
/// commit, and the round restores.
#[test]
fn an_agent_killed_after_the_decision_commits_when_it_starts_again() {
    workloads();
    let d = tempfile::tempdir().unwrap();
    let tf = token_file(d.path(), TOKEN);
    let dir = d.path().join("agent");
    let mut agent = Agent::start_with(
        &dir,
        &tf,
        "127.0.0.1:0",
        None,
        &[("STASIS_FAULT", "die-after-decision:1")],
    );
    let mut w = Workload::start("heap", &["16"]);
    let t = format!("{}={}", agent.addr, w.pid);
    let o = cluster(
        &tf,
        &["dump", "--job", "a", "--leave-running", "--target", &t],
    );
    assert_fails_with(&o, "closed the connection");
    agent.kill();
    assert!(alive(w.pid), "the job died with its agent");
    wait_until(Duration::from_secs(10), "the tree to be untraced", || {
        std::fs::read_to_string(format!("/proc/{}/status", w.pid))
            .is_ok_and(|t| t.contains("TracerPid:\t0\n"))
    });
    // Nothing is committed yet: the checkpoint is prepared, invisible.
    let tree = dir.join("jobs/a").join(w.pid.to_string());
    assert!(!tree.join("latest").exists());
    let agent = Agent::start(&dir, &tf, "127.0.0.1:0", None);
    assert!(
        tree.join("latest").exists(),
        "the agent did not finish the commit"
    );
    let o = cluster(&tf, &["inspect", "--job", "a", "--target", &agent.addr]);
    assert_ok(&o, "cluster inspect");
    assert_eq!(json(&o)["complete"], serde_json::json!([1]));
    kill_and_reap(&mut w);
    let o = cluster(&tf, &["restore", "--job", "a", "--target", &agent.addr]);
    assert_ok(&o, "cluster restore");
    finish_pass_restored(&w);
}
