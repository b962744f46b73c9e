//! Consistent checkpoints of a job over three hosts (network namespaces on
//! a bridge), each with its `stasis agent`: the `mesh` workload, a full
//! mesh of TCP connections with megabytes in flight on every link, is
//! checkpointed with `stasis cluster dump`, killed, and restored with
//! `stasis cluster restore`; it must not notice: every receiver sees every
//! sequence number exactly once and every byte as sent (the workload checks
//! that itself), and both ends of each link agree on what crossed it.

mod common;
use common::cluster::*;
use common::net::*;
use common::*;

use std::time::Duration;

const HOSTS: usize = 3;
const AGENT_PORT: u16 = 7700;

struct Job {
    hosts: Hosts,
    agents: Vec<Agent>,
    nodes: Vec<Node>,
    tf: std::path::PathBuf,
    d: tempfile::TempDir,
}

impl Job {
    /// Three hosts, an agent and a mesh node on each, traffic flowing.
    fn start(tag: &str) -> Job {
        Job::start_with(tag, &[])
    }

    /// [`Job::start`], the agent of host `i` with the environment `env[i]`
    /// (none past the end).
    fn start_with(tag: &str, env: &[&[(&str, &str)]]) -> Job {
        workloads(); // subreaper: restored nodes outlive their agents' restores
        let hosts = Hosts::create(HOSTS, tag);
        let d = tempfile::Builder::new()
            .prefix("stasis-cluster-")
            .tempdir()
            .unwrap();
        let tf = token_file(d.path(), TOKEN);
        let agents = (0..HOSTS)
            .map(|i| {
                let listen = format!("{}:{AGENT_PORT}", Hosts::addr(i));
                Agent::start_with(
                    &d.path().join(format!("agent{i}")),
                    &tf,
                    &listen,
                    Some(&hosts.hosts[i]),
                    env.get(i).copied().unwrap_or(&[]),
                )
            })
            .collect();
        let nodes: Vec<Node> = (0..HOSTS)
            .map(|i| Node::start(i, HOSTS, &hosts.hosts[i], &d.path().join(format!("n{i}"))))
            .collect();
        for n in &nodes {
            let pid = wait_pidfile(&n.dir.join("pid"), Duration::from_secs(60));
            assert_eq!(pid, n.pid, "{}", n.out());
        }
        let job = Job {
            hosts,
            agents,
            nodes,
            tf,
            d,
        };
        job.wait_traffic(1 << 20);
        job
    }

    /// Waits until every link has received `more` bytes beyond now.
    fn wait_traffic(&self, more: u64) {
        let t0 = std::time::Instant::now();
        let mut base = None;
        let mut last = None;
        loop {
            if let Some(now) = rx_bytes(&self.nodes) {
                let b = base.get_or_insert_with(|| now.clone());
                // Fewer bytes than the base: the base was the last record
                // of a killed node, read before its restored self (from an
                // older round) wrote its own.
                if now.iter().zip(b.iter()).any(|(n, b)| n < b) {
                    *b = now.clone();
                }
                if now.iter().zip(b.iter()).all(|(n, b)| n - b >= more) {
                    break;
                }
                last = Some(now);
            }
            if t0.elapsed() > Duration::from_secs(120) {
                self.diagnose();
                panic!("no traffic on every link after 120 s: from {base:?} to {last:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("{more} more bytes on every link after {:?}", t0.elapsed());
    }

    fn targets(&self) -> Vec<String> {
        let pids: Vec<i32> = self.nodes.iter().map(|n| n.pid).collect();
        target_args(&self.agents, &pids)
    }

    fn agent_targets(&self) -> Vec<String> {
        agent_target_args(&self.agents)
    }

    /// Prints what a stuck job looks like: each node's state and tracer,
    /// each host's connections.
    fn diagnose(&self) {
        for n in &self.nodes {
            let st = std::fs::read_to_string(format!("/proc/{}/status", n.pid)).unwrap_or_default();
            let pick: Vec<&str> = st
                .lines()
                .filter(|l| l.starts_with("State") || l.starts_with("TracerPid"))
                .collect();
            eprintln!("node {}: {pick:?}", n.pid);
            // Who traces it, and where that thread stands.
            let tracer = st
                .lines()
                .find_map(|l| l.strip_prefix("TracerPid:\t"))
                .and_then(|t| t.trim().parse::<i32>().ok())
                .filter(|&t| t > 0);
            if let Some(t) = tracer {
                let tgid = std::fs::read_to_string(format!("/proc/{t}/status"))
                    .unwrap_or_default()
                    .lines()
                    .find_map(|l| l.strip_prefix("Tgid:\t").map(|x| x.trim().to_string()))
                    .unwrap_or_default();
                let o = std::process::Command::new("gdb")
                    .args(["-batch", "-p", &tgid, "-ex", "thread apply all bt 30"])
                    .output();
                if let Ok(o) = o {
                    eprintln!(
                        "tracer {t} (process {tgid}):\n{}",
                        String::from_utf8_lossy(&o.stdout)
                    );
                }
            }
        }
        for ns in &self.hosts.hosts {
            let o = std::process::Command::new("ip")
                .args(["netns", "exec", ns, "ss", "-tniob"])
                .output()
                .unwrap();
            eprintln!("{ns}:\n{}", String::from_utf8_lossy(&o.stdout));
            // The host's TCP counters that moved (PAWS rejects, segments
            // out of window, acks of unsent data...).
            let o = std::process::Command::new("ip")
                .args(["netns", "exec", ns, "nstat", "-az", "TcpExt*"])
                .output()
                .unwrap();
            let moved: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.split_whitespace().nth(1).is_some_and(|v| v != "0"))
                .map(str::to_string)
                .collect();
            eprintln!("{ns} TcpExt: {moved:?}");
        }
        // Why the kernel drops the segments it drops (2 s of the skb
        // drop tracepoint, counted by place and reason).
        let o = std::process::Command::new("sh")
            .args(["-c", TRACE_DROPS])
            .output()
            .unwrap();
        eprintln!("drops:\n{}", String::from_utf8_lossy(&o.stdout));
    }

    /// Starts agent `i` again (same directory, same address).
    fn restart_agent(&mut self, i: usize) {
        self.agents[i].kill();
        let listen = format!("{}:{AGENT_PORT}", Hosts::addr(i));
        let dir = self.d.path().join(format!("agent{i}"));
        self.agents[i] = Agent::start(&dir, &self.tf, &listen, Some(&self.hosts.hosts[i]));
    }

    /// The complete rounds (held by every tree).
    fn complete(&self) -> Vec<u64> {
        let mut args = vec!["inspect", "--job", "mesh"];
        let t = self.agent_targets();
        args.extend(t.iter().map(String::as_str));
        let o = cluster_in(Some(&self.hosts.hosts[0]), &self.tf, &args);
        assert_ok(&o, "cluster inspect");
        serde_json::from_value(json(&o)["complete"].clone()).unwrap()
    }

    /// Starts `cluster dump` with `extra` (not waiting for it).
    fn spawn_dump(&self, extra: &[&str]) -> std::process::Child {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &self.hosts.hosts[0]])
            .arg(env!("CARGO_BIN_EXE_stasis"))
            .args(["cluster", "dump", "--job", "mesh"])
            .args(extra)
            .args(self.targets())
            .arg("--token-file")
            .arg(&self.tf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c.spawn().expect("stasis cluster dump")
    }

    /// Round `round` of a run of cuts the job survives: with
    /// `--leave-running`, `--concurrent` every other round.
    fn cut(&self, round: u64) -> (&'static [&'static str], serde_json::Value) {
        let extra: &'static [&'static str] = if round.is_multiple_of(2) {
            &["--leave-running", "--concurrent"]
        } else {
            &["--leave-running"]
        };
        let r = self.dump(extra);
        assert_eq!(r["round"], round, "{r}");
        (extra, r)
    }

    fn dump(&self, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["dump", "--job", "mesh"];
        args.extend_from_slice(extra);
        let t = self.targets();
        args.extend(t.iter().map(String::as_str));
        let t0 = std::time::Instant::now();
        let o = cluster_in(Some(&self.hosts.hosts[0]), &self.tf, &args);
        assert_ok(&o, &format!("cluster dump {extra:?}"));
        eprintln!("cluster dump {extra:?}: {:?}", t0.elapsed());
        json(&o)
    }

    /// Checks the cut of `round` on every link between two nodes: the
    /// receiver's image holds no byte the sender's holds as never sent
    /// (nor did the receiver see less than the sender holds as
    /// acknowledged). From each node's manifest (`stasis inspect`).
    fn check_links(&self, round: u64) {
        // (local, peer) address bytes -> (snd_una, snd_nxt, rcv_nxt).
        let mut ends = std::collections::HashMap::new();
        for (a, n) in self.nodes.iter().enumerate() {
            let dir = self.d.path().join(format!("agent{a}/jobs/mesh/{}", n.pid));
            let n = u32::try_from(round).unwrap();
            let cp = stasis_image::ImageDir::open(&dir)
                .and_then(|d| d.load(Some(n)))
                .unwrap_or_else(|e| panic!("checkpoint {round} of {}: {e}", dir.display()));
            for p in &cp.manifest.processes {
                for f in &p.fds {
                    let stasis_image::FdKind::Inet(inet) = &f.kind else {
                        continue;
                    };
                    let stasis_image::InetState::Established(e) = &inet.state else {
                        continue;
                    };
                    let queued = u32::try_from(e.send_queue.len()).unwrap();
                    let snd_nxt = e.snd_seq.wrapping_sub(e.unsent);
                    let snd_una = e.snd_seq.wrapping_sub(queued);
                    ends.insert(
                        (inet.local.clone(), inet.peer.clone()),
                        (snd_una, snd_nxt, e.rcv_seq),
                    );
                }
            }
        }
        let mut links = 0;
        for ((local, peer), (una, nxt, _)) in &ends {
            let Some((_, _, rcv)) = ends.get(&(peer.clone(), local.clone())) else {
                continue;
            };
            links += 1;
            let ahead = |a: u32, b: u32| (a.wrapping_sub(b) as i32) > 0;
            assert!(
                !ahead(*rcv, *nxt),
                "round {round}, link {local:?} -> {peer:?}: the receiver's image has {} bytes the sender's holds as never sent",
                rcv.wrapping_sub(*nxt)
            );
            assert!(
                !ahead(*una, *rcv),
                "round {round}, link {local:?} -> {peer:?}: {} bytes the sender holds as acknowledged are in neither image",
                una.wrapping_sub(*rcv)
            );
        }
        assert_eq!(
            links,
            2 * 3,
            "round {round}: both ends of every link of the mesh"
        );
    }

    fn restore(&self, round: Option<u64>) -> serde_json::Value {
        self.restore_with(round, false)
    }

    /// A restore, lazy or not.
    fn restore_with(&self, round: Option<u64>, lazy: bool) -> serde_json::Value {
        let mut args = vec!["restore".to_string(), "--job".into(), "mesh".into()];
        if let Some(r) = round {
            args.extend(["--checkpoint".into(), r.to_string()]);
        }
        if lazy {
            args.push("--lazy".into());
        }
        args.extend(self.agent_targets());
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = cluster_in(Some(&self.hosts.hosts[0]), &self.tf, &a);
        assert_ok(&o, "cluster restore");
        let r = json(&o);
        for n in &self.nodes {
            assert!(alive(n.pid), "node {} not restored: {r}", n.pid);
        }
        r
    }

    /// SIGKILLs every node (restored ones are their agents' children, which
    /// reap them) and waits until each PID is free.
    fn kill_all(&mut self) {
        for n in &self.nodes {
            // SAFETY: killing a node this test started (or restored).
            unsafe { libc::kill(n.pid, libc::SIGKILL) };
        }
        for n in &mut self.nodes {
            let _ = n.child.try_wait();
            wait_until(
                Duration::from_secs(30),
                "a killed node to be reaped",
                || {
                    let _ = n.child.try_wait();
                    // Restored by an agent since killed: an orphan, ours
                    // (the test is a subreaper).
                    reap_if_ours(n.pid);
                    !std::path::Path::new(&format!("/proc/{}", n.pid)).exists()
                },
            );
        }
    }

    /// SIGTERM to every node: each must end with PASS, and both ends of
    /// each link must agree on what crossed it.
    fn finish(&mut self) {
        let sums = finish_restored_nodes(&mut self.nodes);
        eprintln!("cluster mesh: {sums:?}");
        for a in &mut self.agents {
            a.stop();
        }
    }
}

/// A cluster dump that kills, and a restore: the mesh resumes, with every
/// byte in flight at the cut delivered exactly once.
#[test]
fn mesh_over_three_hosts_dumped_killed_and_restored() {
    let mut job = Job::start("k");
    let r = job.dump(&[]);
    assert_eq!(r["round"], 1, "{r}");
    assert_eq!(r["hosts"].as_array().unwrap().len(), HOSTS, "{r}");
    eprintln!(
        "cluster dump (kill): freeze {} us, total {} us",
        r["freeze_us"], r["total_us"]
    );
    for n in &mut job.nodes {
        assert_eq!(n.wait(Duration::from_secs(30)), (None, Some(libc::SIGKILL)));
    }
    let r = job.restore(None);
    assert_eq!(r["round"], 1, "{r}");
    job.wait_traffic(8 << 20);
    job.finish();
}

/// Twenty rounds taken while the mesh runs (alternately concurrent and
/// stop-the-world, left running), each complete on every host; then the
/// mesh is killed and restored from four of them in turn (a later restore
/// from an older round, too; two of the restores lazy, each tree's memory
/// filled in by a page filler while it runs): each cut is consistent, and
/// the mesh passes its checks after the last.
#[test]
fn twenty_cuts_while_the_mesh_runs_each_restorable() {
    let mut job = Job::start("c");
    let rounds: u64 = std::env::var("STASIS_TEST_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    for round in 1..=rounds {
        let (extra, r) = job.cut(round);
        eprintln!(
            "round {round} {extra:?}: hosts froze within {} us, done in {} us",
            r["freeze_us"], r["total_us"]
        );
        job.check_links(round);
        job.wait_traffic(1 << 20);
    }
    let mut args = vec!["inspect", "--job", "mesh"];
    let t = job.agent_targets();
    args.extend(t.iter().map(String::as_str));
    let o = cluster_in(Some(&job.hosts.hosts[0]), &job.tf, &args);
    assert_ok(&o, "cluster inspect");
    let all: Vec<u64> = (1..=rounds).collect();
    assert_eq!(json(&o)["complete"], serde_json::json!(all));
    for (i, round) in [10, 5, 15, rounds].into_iter().enumerate() {
        job.kill_all();
        let lazy = i % 2 == 1;
        let r = job.restore_with(Some(round), lazy);
        assert_eq!(r["round"], round, "{r}");
        if lazy {
            // Each tree's filler started (and logs beside its image).
            for (a, n) in job.nodes.iter().enumerate() {
                let log = job
                    .d
                    .path()
                    .join(format!("agent{a}/jobs/mesh/lazy-{}.log", n.pid));
                assert!(
                    log.exists(),
                    "no page filler for node {a}: {}",
                    log.display()
                );
            }
        }
        job.wait_traffic(2 << 20);
    }
    job.finish();
}

/// One host late to every cut (its agent sleeps 80 ms before it stops
/// its node, `STASIS_TEST_DELAY=freeze:80`), its node reading on. Meanwhile
/// the other hosts' connections, locked and read, still send: a tail loss
/// probe 10 ms after their last segment, pacing and small-queue timers.
/// Before the
/// dump held their send windows at zero, those bytes reached the late
/// host, whose image then held bytes the sender's held as never sent;
/// after a restore the link stalled for good (the receiver acknowledges
/// bytes the sender never sent, which drops those acks, while the
/// receiver drops the sender's segments as old). Every cut is checked on
/// every link, then the job is restored from the last and must pass.
#[test]
fn a_host_late_to_the_lock_still_gets_a_consistent_cut() {
    let late: &[(&str, &str)] = &[("STASIS_TEST_DELAY", "freeze:80")];
    let mut job = Job::start_with("l", &[&[], late]);
    let rounds = 6;
    for round in 1..=rounds {
        job.cut(round);
        job.check_links(round);
        job.wait_traffic(1 << 20);
    }
    job.kill_all();
    job.restore(Some(rounds));
    job.wait_traffic(2 << 20);
    job.finish();
}

/// Counts the kernel's packet drops for 2 s by place and reason (the
/// `skb:kfree_skb` tracepoint, on a tracefs mounted for it).
const TRACE_DROPS: &str = r#"t=$(mktemp -d) && mount -t tracefs nodev "$t" || exit 0
echo 1 > "$t/events/skb/kfree_skb/enable"; : > "$t/trace"; sleep 2
echo 0 > "$t/events/skb/kfree_skb/enable"
sed -n 's/.*location=\([a-z_0-9]*\).*reason: \([A-Z_0-9]*\).*/\1 \2/p' "$t/trace" | sort | uniq -c | sort -rn | head -20
: > "$t/trace"; umount "$t"; rmdir "$t""#;

/// SIGKILL the coordinator, an agent or a job process (in turn) at a
/// random instant of a round, twenty times: the job runs on (every link
/// carries traffic again), a killed agent started again serves the next
/// round, and the complete rounds grow by at most one each time (a round
/// is complete on every tree or on none, as far as a restore can see); a
/// job that lost a process is killed and restored from its newest
/// complete round. At the end the job is killed and restored from the
/// newest complete round, and passes its own checks (every byte, every
/// sequence number exactly once). `STASIS_TEST_VICTIM=N` kills only the
/// coordinator (0), agents (1) or job processes (2), `agent-node`
/// alternates agents and job processes. (Until the owners of the
/// connections were held while they are in repair mode, about one run in
/// six failed: a killed agent let its tree go an instant before the socket
/// guard took the connections out of repair mode. Until read connections
/// stopped sending new bytes, job processes were left out of the default
/// mix: a restored link could stall for good, see
/// `a_host_late_to_the_lock_still_gets_a_consistent_cut`.)
#[test]
fn rounds_killed_at_random_leave_the_job_running_or_restorable() {
    let mut job = Job::start("r");
    job.dump(&["--leave-running"]); // a first cut to fall back on
    let mut rng = Rng(0x5eed_1234 ^ u64::from(std::process::id()));
    for run in 0..20 {
        let victim: u64 = match std::env::var("STASIS_TEST_VICTIM").ok().as_deref() {
            Some("agent-node") => 1 + run % 2,
            Some(v) => v.parse().unwrap_or(0),
            None => run % 3, // the coordinator, an agent, a job process
        };
        let host = usize::try_from(rng.below(HOSTS as u64)).unwrap();
        let delay = Duration::from_millis(rng.below(1500));
        let before = job.complete();
        let extra: &[&str] = if run % 2 == 0 {
            &["--leave-running", "--concurrent"]
        } else {
            &["--leave-running"]
        };
        let mut coord = job.spawn_dump(extra);
        std::thread::sleep(delay); // a random instant, not a wait for a condition
        let what = match victim {
            0 => {
                let _ = coord.kill();
                "the coordinator".to_string()
            }
            1 => {
                job.agents[host].kill();
                format!("agent {host}")
            }
            _ => {
                // SAFETY: killing a node of the job under test.
                unsafe { libc::kill(job.nodes[host].pid, libc::SIGKILL) };
                format!("node {host}")
            }
        };
        let st = coord.wait().unwrap();
        if victim == 1 {
            job.restart_agent(host);
        }
        let after = job.complete();
        eprintln!("run {run}: killed {what} after {delay:?}; coordinator {st}; complete rounds {before:?} -> {after:?}");
        assert!(
            after.len() >= before.len() && after.len() <= before.len() + 1,
            "complete rounds went from {before:?} to {after:?}"
        );
        if victim == 2 {
            // The job lost a process: back to its newest complete cut.
            job.kill_all();
            let r = job.restore(None);
            assert_eq!(r["round"], *after.last().unwrap(), "{r}");
        }
        job.wait_traffic(1 << 20);
    }
    let last = *job.complete().last().unwrap();
    job.kill_all();
    let r = job.restore(None);
    assert_eq!(r["round"], last, "{r}");
    job.wait_traffic(4 << 20);
    job.finish();
}

/// `stasis cluster run --every 1` while the mesh runs: a round a second,
/// the second and later ones incremental on every tree (and smaller than
/// the first); once every node is killed the command says it is done and
/// exits 0; the mesh restored from the newest round (an incremental one)
/// passes its checks of every byte.
#[test]
fn periodic_incremental_rounds_until_the_job_ends() {
    let mut job = Job::start("p");
    let mut c = std::process::Command::new("ip");
    c.args(["netns", "exec", &job.hosts.hosts[0]])
        .arg(env!("CARGO_BIN_EXE_stasis"))
        .args(["cluster", "run", "--job", "mesh", "--every", "1", "--json"])
        .args(job.targets())
        .arg("--token-file")
        .arg(&job.tf)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(job.d.path().join("run.err")).unwrap());
    close_inherited_fds(&mut c);
    let mut run = c.spawn().expect("stasis cluster run");
    let _kill_run = KillOnDrop(i32::try_from(run.id()).unwrap());
    let rx = json_events(&mut run);
    let err_file = job.d.path().join("run.err");
    let next = |what: &str| {
        rx.recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|_| {
                let err = std::fs::read_to_string(&err_file).unwrap_or_default();
                panic!("no {what} from cluster run:\n{err}")
            })
    };
    let mut rounds = Vec::new();
    while rounds.len() < 3 {
        let e = next("checkpoint");
        assert_eq!(e["event"], "checkpoint", "{e}");
        let reports: Vec<&serde_json::Value> = e["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|h| h["reports"].as_array().unwrap().iter())
            .collect();
        assert_eq!(reports.len(), HOSTS, "{e}");
        let incremental = reports.iter().all(|r| r["parent"].is_u64());
        assert_eq!(e["incremental"], incremental, "{e}");
        eprintln!(
            "round {}: {} bytes, incremental {incremental}, froze within {} us; trees: {}",
            e["round"],
            e["bytes"],
            e["freeze_us"],
            reports
                .iter()
                .map(|r| format!(
                    "frozen {} us, total {} us, note {}, concurrent {}",
                    r["frozen_us"], r["total_us"], r["note"], r["concurrent"]
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        if !rounds.is_empty() {
            assert!(incremental, "round {} is not incremental: {e}", e["round"]);
        }
        rounds.push((e["round"].as_u64().unwrap(), e["bytes"].as_u64().unwrap()));
    }
    assert_eq!(
        rounds.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "{rounds:?}"
    );
    assert!(
        rounds[1].1 < rounds[0].1 && rounds[2].1 < rounds[0].1,
        "incremental rounds no smaller than the first: {rounds:?}"
    );
    job.kill_all();
    let done = loop {
        let e = next("end");
        if e["event"] == "done" {
            break e;
        }
    };
    assert_eq!(run.wait().unwrap().code(), Some(0), "{done}");
    let last = done["committed"].as_u64().unwrap();
    assert!(last >= 3, "{done}");
    let r = job.restore(None);
    assert_eq!(r["round"], last, "{r}");
    job.wait_traffic(2 << 20);
    job.finish();
}
