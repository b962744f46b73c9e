//! The environment of distributed checkpoints, without a checkpoint: three
//! "hosts" (network namespaces) joined by a bridge (in a fourth namespace),
//! one `mesh` workload node on each. The nodes form a full mesh of TCP
//! connections and stream self-checking messages to each other as fast as
//! they can; the test waits until every link carries traffic and the
//! socket queues hold megabytes, SIGTERMs every node and requires PASS from
//! each, with every link's counts agreeing at both of its ends.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const PORT: u16 = 7411;

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert_ok(&o, &format!("ip {}", args.join(" ")));
}

/// Network namespaces `stm-<pid>-h1..hN`, each with `eth0` at 10.214.0.I,
/// plugged into bridge `br0` of namespace `stm-<pid>-br`. Dropping it
/// deletes every namespace (and so the veths and the bridge), also after a
/// failure midway through creating them.
struct Hosts {
    bridge: String,
    hosts: Vec<String>,
}

impl Hosts {
    fn create(n: usize) -> Hosts {
        let pid = std::process::id();
        let mut h = Hosts {
            bridge: format!("stm-{pid}-br"),
            hosts: Vec::new(),
        };
        let br = h.bridge.clone();
        ip(&["netns", "add", &br]);
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ns = format!("stm-{pid}-h{}", i + 1);
            ip(&["netns", "add", &ns]);
            h.hosts.push(ns.clone());
            let v = format!("v{}", i + 1);
            ip(&[
                "-n", &br, "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["-n", &br, "link", "set", &v, "master", "br0"]);
            ip(&["-n", &br, "link", "set", &v, "up"]);
            let addr = format!("{}/24", Hosts::addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        h
    }

    fn addr(i: usize) -> String {
        format!("10.214.0.{}", i + 1)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain(std::iter::once(&self.bridge)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// One `mesh` node, started with `ip netns exec` (which execs, so the
/// child is the node), killed when dropped.
struct Node {
    dir: PathBuf,
    pid: i32,
    child: std::process::Child,
    _kill: KillOnDrop,
}

impl Node {
    fn start(i: usize, ns: &str, dir: &Path) -> Node {
        std::fs::create_dir(dir).unwrap();
        let out = std::fs::File::create(dir.join("out.log")).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(workloads().join("mesh"))
            .arg(dir.join("pid"))
            .args(["--id", &i.to_string(), "--nodes", &NODES.to_string()])
            .arg("--listen")
            .arg(format!("{}:{PORT}", Hosts::addr(i)))
            .arg("--stats")
            .arg(dir.join("stats.json"));
        for j in (0..NODES).filter(|&j| j != i) {
            c.arg("--peer")
                .arg(format!("{j}={}:{PORT}", Hosts::addr(j)));
        }
        c.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        close_inherited_fds(&mut c);
        let child = c.spawn().expect("starting ip netns exec mesh");
        let pid = child.id() as i32;
        Node {
            dir: dir.to_path_buf(),
            pid,
            child,
            _kill: KillOnDrop(pid),
        }
    }

    /// Waits (up to `timeout`) for the node to exit: (exit code, signal).
    fn wait(&mut self, timeout: Duration) -> (Option<i32>, Option<i32>) {
        use std::os::unix::process::ExitStatusExt;
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("waiting for a node") {
                return (st.code(), st.signal());
            }
            assert!(t0.elapsed() < timeout, "node {} still running", self.pid);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn out(&self) -> String {
        std::fs::read_to_string(self.dir.join("out.log")).unwrap_or_default()
    }

    /// (peer, tx_bytes, rx_bytes) per link from the stats file, if any.
    fn links(&self) -> Option<Vec<(u64, u64, u64)>> {
        let text = std::fs::read_to_string(self.dir.join("stats.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["links"]
            .as_array()?
            .iter()
            .map(|l| {
                Some((
                    l["peer"].as_u64()?,
                    l["tx_bytes"].as_u64()?,
                    l["rx_bytes"].as_u64()?,
                ))
            })
            .collect()
    }
}

/// Received bytes of every link of every node (node-major), once every
/// node's stats list all its links.
fn rx_bytes(nodes: &[Node]) -> Option<Vec<u64>> {
    let mut all = Vec::new();
    for n in nodes {
        let links = n.links()?;
        if links.len() != NODES - 1 {
            return None;
        }
        all.extend(links.iter().map(|l| l.2));
    }
    Some(all)
}

/// Established mesh connections in namespace `ns` as (local, peer,
/// Recv-Q, Send-Q), from `ss -tnH`.
fn queues(ns: &str) -> Vec<(String, String, u64, u64)> {
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-tnH"])
        .output()
        .expect("running ss");
    assert_ok(&o, "ss -tnH");
    let port = format!(":{PORT}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5 && f[0] == "ESTAB" && (f[3].ends_with(&port) || f[4].ends_with(&port)))
                .then(|| {
                    (
                        f[3].to_string(),
                        f[4].to_string(),
                        f[1].parse().unwrap_or(0),
                        f[2].parse().unwrap_or(0),
                    )
                })
        })
        .collect()
}

/// "summary: node I; peer J: tx M msgs B B, rx M msgs B B; ..." as
/// (peer, tx msgs, tx bytes, rx msgs, rx bytes).
fn summary(out: &str, i: usize) -> Vec<(usize, u64, u64, u64, u64)> {
    let prefix = format!("summary: node {i}; ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("node {i}: no summary line:\n{out}"));
    line.split("; ")
        .map(|part| {
            let w: Vec<&str> = part
                .split([' ', ':', ','])
                .filter(|w| !w.is_empty())
                .collect();
            // peer J tx M msgs B B rx M msgs B B
            assert_eq!(w.len(), 12, "node {i}: summary part {part:?}");
            let n = |k: usize| w[k].parse::<u64>().expect("a number");
            (w[1].parse().expect("a peer id"), n(3), n(5), n(8), n(10))
        })
        .collect()
}

#[test]
fn mesh_streams_across_three_network_namespaces() {
    let t0 = Instant::now();
    let hosts = Hosts::create(NODES);
    let dir = tempfile::Builder::new()
        .prefix("stasis-mesh-")
        .tempdir()
        .unwrap();
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start(i, &hosts.hosts[i], &dir.path().join(format!("n{i}"))))
        .collect();
    for n in &nodes {
        let pid = wait_pidfile(&n.dir.join("pid"), Duration::from_secs(60));
        assert_eq!(pid, n.pid, "pidfile of {}:\n{}", n.dir.display(), n.out());
    }
    let ns_of = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let mut seen = vec![ns_of(std::process::id() as i32)];
    for n in &nodes {
        let ns = ns_of(n.pid);
        assert!(!seen.contains(&ns), "node {} shares a netns", n.pid);
        seen.push(ns);
    }
    wait_until(
        Duration::from_secs(60),
        "every link carries traffic",
        || rx_bytes(&nodes).is_some_and(|b| b.iter().all(|&x| x >= 1 << 20)),
    );

    // Throughput: until every link has received 32 MiB more.
    let (start, b0) = (Instant::now(), rx_bytes(&nodes).unwrap());
    let mut b1 = b0.clone();
    wait_until(
        Duration::from_secs(120),
        "32 MiB more on every link",
        || {
            b1 = rx_bytes(&nodes).unwrap();
            b1.iter().zip(&b0).all(|(a, b)| a - b >= 32 << 20)
        },
    );
    let secs = start.elapsed().as_secs_f64();
    let rates: Vec<String> = b1
        .iter()
        .zip(&b0)
        .map(|(a, b)| format!("{:.0}", (a - b) as f64 / secs / 1e6))
        .collect();
    eprintln!("mesh: MB/s received per link (node-major): {rates:?}");

    // Every host has its N-1 connections to the others' addresses, and the
    // mesh keeps megabytes queued in its sockets.
    let mut seen_q = Vec::new();
    wait_until(Duration::from_secs(60), "4 MiB queued in sockets", || {
        seen_q = hosts.hosts.iter().map(|ns| queues(ns)).collect();
        for (i, q) in seen_q.iter().enumerate() {
            let peers: Vec<&str> = q.iter().map(|c| c.1.split(':').next().unwrap()).collect();
            for j in (0..NODES).filter(|&j| j != i) {
                assert!(peers.contains(&Hosts::addr(j).as_str()), "host {i}: {q:?}");
            }
            assert!(q.iter().all(|c| c.0.starts_with(&Hosts::addr(i))), "{q:?}");
        }
        let total: u64 = seen_q.iter().flatten().map(|c| c.2 + c.3).sum();
        total >= 4 << 20
    });
    for (ns, q) in hosts.hosts.iter().zip(&seen_q) {
        eprintln!("mesh: {ns} (local, peer, Recv-Q, Send-Q): {q:?}");
    }

    let last = rx_bytes(&nodes).unwrap();
    for n in &nodes {
        // SAFETY: signalling a node this test started.
        unsafe { libc::kill(n.pid, libc::SIGTERM) };
    }
    let mut sums = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        let st = n.wait(Duration::from_secs(120));
        let out = n.out();
        assert_eq!(st, (Some(0), None), "node {i} did not exit 0:\n{out}");
        assert_eq!(out.lines().last(), Some("PASS"), "node {i}:\n{out}");
        sums.push(summary(&out, i));
    }
    // Each link's two ends agree, and carried at least what the stats saw.
    for (i, s) in sums.iter().enumerate() {
        assert_eq!(s.len(), NODES - 1, "node {i}: {s:?}");
        for (k, &(j, tx_m, tx_b, rx_m, rx_b)) in s.iter().enumerate() {
            let back = sums[j].iter().find(|l| l.0 == i).expect("the reverse link");
            assert_eq!((tx_m, tx_b), (back.3, back.4), "{i} -> {j}");
            assert_eq!((rx_m, rx_b), (back.1, back.2), "{j} -> {i}");
            assert!(rx_b >= last[i * (NODES - 1) + k], "{j} -> {i}");
        }
    }
    eprintln!("mesh: {sums:?}; test took {:?}", t0.elapsed());
}
