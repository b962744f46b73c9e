//! A dump killed at any instant never harms the process it dumps (issue 12).
//!
//! Kill campaigns: `stasis dump` (every mode) and `stasis run` are SIGKILLed
//! (their whole process group, as a timeout or an OOM kill would; for
//! dumps, every other trial a SIGTERM or SIGINT instead) at seeded random
//! instants; after each kill every process of the tree must be
//! running, untraced, with the signal mask, mappings and fds it had, and no
//! committed half-checkpoint may exist. At the end of each campaign the
//! workload passes its own byte-for-byte check and the checkpoint taken
//! before the campaign still restores (beside it, in a new PID namespace)
//! and passes its check too.
//!
//! Deterministic deaths: `STASIS_FAULT=die-in-remote-syscall:N` kills the
//! dumper at the Nth step of its remote syscalls (registers set, signals
//! blocked, entry stop, exit stop; for a batch: registers set, signals
//! blocked, the thread running its table, its stop), for every N; and
//! `STASIS_FAULT=remote-syscall:N` / `image-write:N` make the Nth remote
//! syscall or image write fail: the dump must fail cleanly, the process
//! unharmed.
//!
//! `STASIS_KILL_SEED` and `STASIS_KILL_TRIALS` (default 30 per mode) replay
//! or lengthen a campaign (`scripts/kill-campaign.sh` runs >= 500 kills).

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The seeded, reproducible source of kill instants of one campaign
/// (`STASIS_KILL_SEED`, mixed with the campaign's `salt`).
fn campaign_rng(salt: u64) -> Rng {
    let seed = std::env::var("STASIS_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026_u64);
    eprintln!("kill campaign seed {seed} (STASIS_KILL_SEED), salt {salt}");
    Rng(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn trials() -> usize {
    std::env::var("STASIS_KILL_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// What a process of the tree must still look like after a dumper died.
#[derive(Debug, PartialEq, Eq, Clone)]
struct ProcView {
    /// Per thread: the blocked-signal mask (`SigBlk`).
    sigblk: BTreeMap<i32, String>,
    /// Mappings: range, permissions, name.
    maps: Vec<String>,
    /// fd number -> link target.
    fds: BTreeMap<String, String>,
}

fn view(pid: i32) -> ProcView {
    let mut sigblk = BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            if let Some(l) = status.lines().find(|l| l.starts_with("SigBlk:")) {
                sigblk.insert(tid, l.to_string());
            }
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{} {} {}", f[0], f[1], f.get(5).unwrap_or(&""))
        })
        .collect();
    let mut fds = BTreeMap::new();
    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in d.flatten() {
            let link = std::fs::read_link(e.path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            fds.insert(e.file_name().to_string_lossy().into_owned(), link);
        }
    }
    ProcView { sigblk, maps, fds }
}

fn tracer_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The state letter of `pid` (`R`, `S`, `T`...) from its stat line.
fn state_of(pid: i32) -> Option<char> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    st[st.rfind(')')? + 2..].chars().next()
}

/// The tree of `root` as it is: pid -> view.
fn tree_view(root: i32) -> BTreeMap<i32, ProcView> {
    std::iter::once(root)
        .chain(descendants(root))
        .map(|p| (p, view(p)))
        .collect()
}

/// The tree of `root` as it is while no dump holds it: a view read in the
/// middle of a checkpoint (the supervisor's, say) shows the signal mask of
/// a thread parked for remote syscalls, not its own.
fn untraced_view(root: i32) -> BTreeMap<i32, ProcView> {
    let untraced = || {
        std::iter::once(root)
            .chain(descendants(root))
            .all(|p| tracer_of(p) == Some(0))
    };
    let t0 = Instant::now();
    loop {
        if untraced() {
            let v = tree_view(root);
            if untraced() {
                return v;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{root} stays traced"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Why the tree of `root` is not as `before` describes it, if it is not.
fn harm(root: i32, before: &BTreeMap<i32, ProcView>) -> Option<String> {
    let pids: std::collections::BTreeSet<i32> =
        std::iter::once(root).chain(descendants(root)).collect();
    if pids != before.keys().copied().collect() {
        return Some(format!(
            "the tree changed: {pids:?} (a snapshot or helper left behind?)"
        ));
    }
    for (&pid, was) in before {
        if !alive(pid) {
            return Some(format!("process {pid} is dead"));
        }
        if tracer_of(pid) != Some(0) {
            return Some(format!("process {pid} is still traced"));
        }
        if state_of(pid) == Some('T') {
            return Some(format!("process {pid} is left stopped"));
        }
        let now = view(pid);
        if now.sigblk != was.sigblk {
            return Some(format!(
                "process {pid}: signal masks {:?}, were {:?}",
                now.sigblk, was.sigblk
            ));
        }
        if now.maps != was.maps {
            return Some(format!(
                "process {pid}: mappings {:?}, were {:?}",
                now.maps, was.maps
            ));
        }
        if now.fds != was.fds {
            return Some(format!(
                "process {pid}: fds {:?}, were {:?}",
                now.fds, was.fds
            ));
        }
    }
    None
}

/// Every process of `before` runs, untraced, as it was. A thread let go
/// by a dying dumper puts itself back as soon as it is scheduled: wait for
/// that (a loaded machine may take a while), never for a fixed time.
fn assert_unharmed(root: i32, before: &BTreeMap<i32, ProcView>, ctx: &str) {
    let t0 = Instant::now();
    loop {
        match harm(root, before) {
            None => return,
            Some(why) if t0.elapsed() > Duration::from_secs(30) => panic!("{ctx}: {why}"),
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Committed checkpoint numbers of an image directory.
fn checkpoints(img: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(img.join("checkpoints"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Every committed checkpoint verifies (`stasis inspect`).
fn assert_committed_whole(img: &Path, ctx: &str) {
    for n in checkpoints(img) {
        let o = stasis()
            .args(["inspect", "--json", "-D"])
            .arg(img)
            .args(["--checkpoint", &n.to_string()])
            .output()
            .unwrap();
        assert_ok(&o, &format!("{ctx}: inspect of checkpoint {n}"));
    }
}

/// Restores checkpoint `n` of `img` beside the running original, in a new
/// PID namespace, and requires its own check to pass.
fn restored_copy_passes(img: &Path, n: u32, ctx: &str) {
    let pidfile = img.with_extension("copy.pid");
    let _ = std::fs::remove_file(&pidfile);
    let o = stasis()
        .args(["restore", "--detach", "--new-pidns", "--json", "--pidfile"])
        .arg(&pidfile)
        .args(["--checkpoint", &n.to_string(), "-D"])
        .arg(img)
        .output()
        .unwrap();
    assert_ok(&o, &format!("{ctx}: restore --new-pidns of checkpoint {n}"));
    let init = i32::try_from(json(&o)["init_pid"].as_i64().unwrap()).unwrap();
    let outer = wait_pidfile(&pidfile, Duration::from_secs(30));
    // SAFETY: signalling the restored copy.
    unsafe { libc::kill(outer, libc::SIGTERM) };
    assert_eq!(
        waitpid_timeout(init, Duration::from_secs(120)),
        (Some(0), None),
        "{ctx}: checkpoint {n} restored beside the original failed its check"
    );
}

/// `stasis ARGS` in its own process group (so it can be killed whole).
fn spawn_group(args: &[&str], img: &Path, env: Option<(&str, String)>) -> std::process::Child {
    let mut c = stasis();
    c.args(args)
        .arg("-D")
        .arg(img)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    c.spawn().expect("spawning stasis")
}

/// Temporary checkpoint directories of dumper `pid` left in `img`.
fn own_temps(img: &Path, pid: u32) -> Vec<String> {
    let mark = format!("-{pid}-");
    std::fs::read_dir(img.join("checkpoints"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".tmp-") && n.contains(&mark))
                .collect()
        })
        .unwrap_or_default()
}

/// Sends `sig` to the whole process group led by `child` and reaps `child`.
fn kill_group(child: &mut std::process::Child, sig: i32) {
    let pg = i32::try_from(child.id()).unwrap();
    // SAFETY: signalling the process group of a stasis command we started.
    unsafe { libc::kill(-pg, sig) };
    let _ = child.wait();
}

/// Starts a workload and waits until its tree is settled: `chain_writer`
/// forks at its first iteration, and a tree compared before and after a
/// dump must not grow meanwhile (a loaded machine delays that fork).
fn start_settled(name: &str, args: &[&str]) -> Workload {
    let w = Workload::start(name, args);
    if name == "chain_writer" {
        let t0 = Instant::now();
        while descendants(w.pid).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "chain_writer did not fork"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    w
}

/// One kill campaign of `stasis dump MODE_ARGS` on a 2-process
/// `chain_writer` tree (the parent forks at iteration 1).
fn dump_campaign(salt: u64, mode: &[&str]) {
    let mut rng = campaign_rng(salt);
    let mut w = start_settled("chain_writer", &["32", "1", "0"]);
    let img = w.images();
    // The checkpoint that must survive the campaign, and the time a whole
    // dump takes here (it only scales the kill instants).
    let t0 = Instant::now();
    let o = w.dump(&["--leave-running"]);
    assert_ok(&o, "first checkpoint");
    let full = t0.elapsed();
    let first = *checkpoints(&img).last().unwrap();
    let span = u64::try_from((full * 3 / 2).as_micros())
        .unwrap()
        .max(2_000);
    let stop_mode = !mode.contains(&"--leave-running");
    let n = trials();
    let mut after_commit = 0;
    for k in 0..n {
        let before = tree_view(w.pid);
        let cps = checkpoints(&img);
        let mut args = vec!["dump", "-t"];
        let pid = w.pid.to_string();
        args.push(&pid);
        args.extend_from_slice(mode);
        let delay = Duration::from_micros(rng.below(span));
        // Mostly SIGKILL (a timeout, the OOM killer); every fourth trial a
        // SIGTERM, or a SIGINT (^C), which must abort as harmlessly.
        let sig = [libc::SIGKILL, libc::SIGTERM, libc::SIGKILL, libc::SIGINT][k % 4];
        let ctx = format!("{mode:?} trial {k} (signal {sig} after {delay:?} of ~{full:?})");
        let mut d = spawn_group(&args, &img, None);
        std::thread::sleep(delay);
        kill_group(&mut d, sig);
        if sig != libc::SIGKILL {
            // A clean abort leaves no temporary checkpoint behind.
            let left = own_temps(&img, d.id());
            assert!(left.is_empty(), "{ctx}: left behind {left:?}");
        }
        assert_committed_whole(&img, &ctx);
        let now = checkpoints(&img);
        if stop_mode && !alive(w.pid) {
            // The kill came after the commit: the dump was complete and
            // killed the tree, as a dump without --leave-running does. It
            // must have committed, and the tree comes back from it.
            assert_eq!(
                now.len(),
                cps.len() + 1,
                "{ctx}: tree killed, nothing committed"
            );
            after_commit += 1;
            let tree: Vec<i32> = descendants(w.pid);
            let _ = w.reap();
            for p in tree.into_iter().chain(before.keys().copied()) {
                reap_if_ours(p);
            }
            w.restore(&[]);
            continue;
        }
        assert!(
            now.len() <= cps.len() + 1,
            "{ctx}: more than one checkpoint appeared"
        );
        after_commit += usize::from(now.len() > cps.len());
        assert_unharmed(w.pid, &before, &ctx);
    }
    eprintln!("{mode:?}: {n} kills, {after_commit} after the commit");
    // The tree passes its own check, and the first checkpoint still restores.
    restored_copy_passes(&img, first, &format!("{mode:?}"));
    w.finish_pass();
}

#[test]
fn killed_stop_the_world_dumps_never_harm_the_tree() {
    dump_campaign(1, &[]);
}

#[test]
fn killed_leave_running_dumps_never_harm_the_tree() {
    dump_campaign(2, &["--leave-running"]);
}

#[test]
fn killed_write_protected_concurrent_dumps_never_harm_the_tree() {
    dump_campaign(
        3,
        &["--leave-running", "--concurrent", "--cow-method", "uffd"],
    );
}

#[test]
fn killed_fork_snapshot_concurrent_dumps_never_harm_the_tree() {
    dump_campaign(
        4,
        &["--leave-running", "--concurrent", "--cow-method", "fork"],
    );
}

#[test]
fn killed_tracked_dumps_never_harm_the_tree() {
    dump_campaign(5, &["--leave-running", "--track"]);
}

#[test]
fn killed_touch_window_dumps_never_harm_the_tree() {
    dump_campaign(6, &["--leave-running", "--touch-window", "0.3"]);
}

/// `stasis run` (the supervisor, with its periodic incremental checkpoints)
/// killed at random instants: the job runs on unharmed, and every
/// committed checkpoint verifies.
#[test]
fn killed_run_supervisors_never_harm_the_job() {
    let mut rng = campaign_rng(7);
    let n = trials();
    let dir = tempfile::tempdir().unwrap();
    let bin = workloads().join("chain_writer");
    for k in 0..n {
        let img = dir.path().join(format!("img{k}"));
        let pidfile = dir.path().join(format!("pid{k}"));
        let mut sup = Command::new(env!("CARGO_BIN_EXE_stasis"));
        close_inherited_fds(&mut sup);
        sup.args(["run", "--every", "0.2", "--json", "-D"])
            .arg(&img)
            .arg("--")
            .arg(&bin)
            .arg(&pidfile)
            .args(["16", "0", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let mut sup = sup.spawn().unwrap();
        let pid = wait_pidfile(&pidfile, Duration::from_secs(30));
        let job = KillOnDrop(pid);
        let before = untraced_view(pid);
        let delay = Duration::from_micros(rng.below(1_500_000));
        std::thread::sleep(delay);
        kill_group(&mut sup, libc::SIGKILL);
        let ctx = format!("run trial {k} (kill after {delay:?})");
        assert_committed_whole(&img, &ctx);
        assert_unharmed(pid, &before, &ctx);
        // The orphaned job was re-parented to us (the test is a subreaper):
        // it must pass its check.
        // SAFETY: signalling the job under test.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            waitpid_timeout(pid, Duration::from_secs(60)),
            (Some(0), None),
            "{ctx}: the job failed its check"
        );
        // Reaped: its PID may be anyone's now.
        std::mem::forget(job);
        let log = std::fs::read_to_string(img.join("job.log")).unwrap_or_default();
        assert_eq!(log.lines().last(), Some("PASS"), "{ctx}: {log}");
    }
}

/// A dump killed while the connections of the tree are in repair mode
/// must not let the program run with them so, even for the instant before
/// the socket guard puts them back: its `recv` would fail (EPERM), its
/// `send` fail (EINVAL) or go to its own receive queue (ENOBUFS, or
/// silently corrupt the stream). Two `mesh` nodes (hosts: network
/// namespaces) stream self-checking records to each other as fast as they
/// can; `stasis dump --leave-running` of node 0 is SIGKILLed (its process
/// group) at random instants of a dump, over and over. After each kill
/// node 0 runs untraced and unstopped, with its fds, mappings and signal
/// mask; at the end both nodes, SIGTERMed, pass their own checks of every
/// byte each link carried, and agree on the counts.
#[test]
fn killed_dumps_of_a_tcp_node_never_break_its_connections() {
    use common::net::*;
    let mut rng = campaign_rng(11);
    let hosts = Hosts::create(2, "dk");
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (0..2)
        .map(|i| Node::start(i, 2, &hosts.hosts[i], &dir.path().join(format!("n{i}"))))
        .collect();
    for n in &nodes {
        let pid = wait_pidfile(&n.dir.join("pid"), Duration::from_secs(60));
        assert_eq!(pid, n.pid, "pidfile of {}:\n{}", n.dir.display(), n.out());
    }
    let flowing = |nodes: &[Node], more: u64| {
        let b0 = loop {
            if let Some(b) = rx_bytes(nodes) {
                break b;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let t0 = Instant::now();
        while !rx_bytes(nodes).is_some_and(|b| b.iter().zip(&b0).all(|(a, b)| a - b >= more)) {
            if t0.elapsed() > Duration::from_secs(60) {
                // Which link stalled, and its sockets as the kernel shows
                // them on each host (queues, window, state), for the
                // next occurrence (session 21's CI saw one).
                let ss = |ns: &str| {
                    Command::new("ip")
                        .args(["netns", "exec", ns, "ss", "-tnie"])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default()
                };
                // And what each node's threads are doing.
                let tasks = |pid: i32| {
                    let mut out = String::new();
                    for tid in tasks_of(pid) {
                        let f = |name: &str| {
                            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{name}"))
                                .unwrap_or_default()
                        };
                        let status: Vec<String> = f("status")
                            .lines()
                            .filter(|l| {
                                ["State", "TracerPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn"]
                                    .iter()
                                    .any(|k| l.starts_with(&format!("{k}:")))
                            })
                            .map(str::to_string)
                            .collect();
                        out += &format!(
                            "  task {tid}: {} | syscall {} | wchan {}\n  stack:\n{}\n",
                            status.join(" "),
                            f("syscall").trim(),
                            f("wchan"),
                            f("stack")
                        );
                    }
                    // Its fds' fdinfo (an epoll's registrations, flags).
                    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) {
                        for e in d.flatten() {
                            let info = std::fs::read_to_string(e.path()).unwrap_or_default();
                            let link = std::fs::read_link(format!(
                                "/proc/{pid}/fd/{}",
                                e.file_name().to_string_lossy()
                            ))
                            .unwrap_or_default();
                            out += &format!(
                                "  fd {} -> {}: {}\n",
                                e.file_name().to_string_lossy(),
                                link.display(),
                                info.replace('\n', " | ")
                            );
                        }
                    }
                    out
                };
                let (rx, ss0, ss1) = (rx_bytes(nodes), ss(&hosts.hosts[0]), ss(&hosts.hosts[1]));
                let (t0s, t1s) = (tasks(nodes[0].pid), tasks(nodes[1].pid));
                // A node tells what it saw (a link it declared dead, and
                // why) when it ends: SIGTERM both, for their logs.
                for n in nodes {
                    // SAFETY: signalling our own node.
                    unsafe { libc::kill(n.pid, libc::SIGTERM) };
                }
                let t1 = Instant::now();
                while t1.elapsed() < Duration::from_secs(20)
                    && !nodes
                        .iter()
                        .all(|n| !alive(n.pid) || state_of(n.pid) == Some('Z'))
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                panic!(
                    "both links carry traffic: not after 60s; received per link at the start {b0:?}, now {rx:?}\nnode 0's host:\n{ss0}\nnode 1's host:\n{ss1}\nnode 0 ({}):\n{t0s}node 1 ({}):\n{t1s}node 0 logged:\n{}\nnode 1 logged:\n{}",
                    nodes[0].pid,
                    nodes[1].pid,
                    nodes[0].out(),
                    nodes[1].out()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    flowing(&nodes, 1 << 20);
    let img = dir.path().join("img");
    let (ns, pid) = (hosts.hosts[0].clone(), nodes[0].pid.to_string());
    let dump = |img: &Path| {
        let mut c = stasis_in(Some(&ns));
        c.args(["dump", "-t", &pid, "--leave-running", "-D"])
            .arg(img)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        c
    };
    // How long a whole dump takes here (it scales the kill instants).
    let t0 = Instant::now();
    let o = dump(&img).output().unwrap();
    assert_ok(&o, "a dump of node 0");
    let full = t0.elapsed();
    let span = u64::try_from((full * 3 / 2).as_micros())
        .unwrap()
        .max(2_000);
    let n = std::env::var("STASIS_KILL_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    for k in 0..n {
        let before = untraced_view(nodes[0].pid);
        let delay = Duration::from_micros(rng.below(span));
        let ctx = format!("trial {k} (SIGKILL after {delay:?} of ~{full:?})");
        let mut d = dump(&img).spawn().unwrap();
        std::thread::sleep(delay);
        kill_group(&mut d, libc::SIGKILL);
        assert_unharmed(nodes[0].pid, &before, &ctx);
        for (i, nd) in nodes.iter_mut().enumerate() {
            assert!(
                nd.child.try_wait().unwrap().is_none(),
                "{ctx}: node {i} ended:\n{}",
                nd.out()
            );
        }
    }
    // The links still carry traffic, and every byte was right.
    flowing(&nodes, 1 << 20);
    let sums = finish_nodes(&mut nodes);
    eprintln!("{n} kills of dumps of a TCP node: {sums:?}");
}

/// Runs a dump of `w` with `STASIS_FAULT=fault`; returns whether it
/// succeeded (the fault was past the dump's end).
fn dump_with_fault(w: &Workload, mode: &[&str], fault: String) -> (bool, String) {
    let o = stasis()
        .args(["dump", "-t", &w.pid.to_string(), "-D"])
        .arg(w.images())
        .args(mode)
        .env("STASIS_FAULT", &fault)
        .output()
        .expect("stasis dump");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The dumper dies (SIGKILL) at every step of every remote syscall of a
/// dump of `name`, in turn; the process is unharmed each time and passes
/// its own check at the end. Returns the number of steps.
fn die_at_every_step(name: &str, args: &[&str], mode: &[&str], stride: usize) -> usize {
    let mut w = start_settled(name, args);
    let mut step = 1;
    loop {
        let before = tree_view(w.pid);
        let cps = checkpoints(&w.images());
        let (ok, err) = dump_with_fault(&w, mode, format!("die-in-remote-syscall:{step}"));
        let ctx = format!("{name} {mode:?}: dumper killed at remote-syscall step {step}");
        if ok {
            // Past the last step: the dump completed.
            assert!(step > 1, "{ctx}: no remote syscall at all?");
            assert_unharmed(w.pid, &before, "after the complete dump");
            break;
        }
        assert!(!err.contains("panicked"), "{ctx}: {err}");
        assert_eq!(
            checkpoints(&w.images()),
            cps,
            "{ctx}: something was committed"
        );
        assert_unharmed(w.pid, &before, &ctx);
        step += stride;
    }
    w.finish_pass();
    step
}

#[test]
fn dumper_dying_at_every_step_of_its_remote_syscalls_harms_nothing() {
    // fpu checks its SSE/AVX registers byte for byte; threads has many
    // threads (each parked on the hatch in turn) and a signal-heavy life.
    let steps = die_at_every_step("fpu", &[], &["--leave-running"], 1);
    // (Most of what a dump asks a process runs in batches: a few steps
    // each, one of them with the thread running its table; the main
    // thread's reads are one batch. 13 steps for fpu.)
    assert!(steps > 10, "only {steps} steps");
    die_at_every_step("threads", &[], &["--leave-running"], 3);
    die_at_every_step(
        "chain_writer",
        &["16", "1", "0"],
        &["--leave-running", "--concurrent"],
        2,
    );
}

/// Each remote syscall, then each image write, fails in turn: every dump
/// fails with a message and commits nothing; the process is unharmed.
#[test]
fn each_remote_syscall_and_image_write_failing_in_turn_harms_nothing() {
    // Every remote syscall; the first 12 image writes, then ever sparser
    // ones (a pack is written in thousands of pieces).
    for (point, sparse_after) in [("remote-syscall", usize::MAX), ("image-write", 12)] {
        let mut w = start_settled("chain_writer", &["16", "1", "0"]);
        // A failure the dump recovers from (the scratch page's unmap is
        // tried twice) lets it succeed: go on until three dumps in a row
        // succeed, i.e. past the last point.
        let (mut n, mut tried, mut ok_in_a_row) = (1, 0, 0);
        while ok_in_a_row < 3 {
            let before = tree_view(w.pid);
            let cps = checkpoints(&w.images());
            let (ok, err) = dump_with_fault(&w, &["--leave-running"], format!("{point}:{n}"));
            let ctx = format!("{point} #{n} failing");
            if ok {
                assert!(n > 1, "{ctx}: the point was never reached");
                assert_unharmed(w.pid, &before, &ctx);
                ok_in_a_row += 1;
            } else {
                ok_in_a_row = 0;
                tried += 1;
                assert!(
                    err.contains("injected fault") && !err.contains("panicked"),
                    "{ctx}: the error does not say what failed: {err}"
                );
                assert_eq!(
                    checkpoints(&w.images()),
                    cps,
                    "{ctx}: something was committed"
                );
                assert_unharmed(w.pid, &before, &ctx);
            }
            n = if n < sparse_after { n + 1 } else { n * 3 / 2 };
        }
        eprintln!("{point}: {tried} dumps failed at an injected fault, up to point {n}");
        w.finish_pass();
    }
}
