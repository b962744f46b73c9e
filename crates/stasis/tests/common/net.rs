//! Hosts for multi-host tests: network namespaces joined by a bridge (in a
//! namespace of its own, so traffic stays inside), and the `mesh` workload
//! (a full mesh of TCP connections streaming self-checking messages) with
//! one node per host.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The port every mesh node listens on (each host has its own address).
pub const PORT: u16 = 7411;

pub fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert_ok(&o, &format!("ip {}", args.join(" ")));
}

/// Network namespaces `stm-<pid>-<tag>-h1..hN`, each with `eth0` at
/// 10.214.0.I, plugged into bridge `br0` of namespace `stm-<pid>-<tag>-br`
/// (`tag` keeps the tests of one binary apart). Dropping it
/// deletes every namespace (and so the veths and the bridge), also after a
/// failure midway through creating them.
pub struct Hosts {
    pub bridge: String,
    pub hosts: Vec<String>,
}

impl Hosts {
    pub fn create(n: usize, tag: &str) -> Hosts {
        let pid = std::process::id();
        let mut h = Hosts {
            bridge: format!("stm-{pid}-{tag}-br"),
            hosts: Vec::new(),
        };
        let br = h.bridge.clone();
        ip(&["netns", "add", &br]);
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ns = format!("stm-{pid}-{tag}-h{}", i + 1);
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

    pub fn addr(i: usize) -> String {
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
pub struct Node {
    pub dir: PathBuf,
    pub pid: i32,
    pub child: std::process::Child,
    _kill: KillOnDrop,
}

impl Node {
    /// Node `i` of `nodes`, in namespace `ns`, its files in `dir`.
    pub fn start(i: usize, nodes: usize, ns: &str, dir: &Path) -> Node {
        std::fs::create_dir(dir).unwrap();
        let out = std::fs::File::create(dir.join("out.log")).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(workloads().join("mesh"))
            .arg(dir.join("pid"))
            .args(["--id", &i.to_string(), "--nodes", &nodes.to_string()])
            .arg("--listen")
            .arg(format!("{}:{PORT}", Hosts::addr(i)))
            .arg("--stats")
            .arg(dir.join("stats.json"));
        for j in (0..nodes).filter(|&j| j != i) {
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
    pub fn wait(&mut self, timeout: Duration) -> (Option<i32>, Option<i32>) {
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

    pub fn out(&self) -> String {
        std::fs::read_to_string(self.dir.join("out.log")).unwrap_or_default()
    }

    /// (peer, tx_bytes, rx_bytes) per link from the stats file, if any.
    pub fn links(&self) -> Option<Vec<(u64, u64, u64)>> {
        let text = std::fs::read_to_string(self.dir.join("stats.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        // A record read while it was being rewritten.
        if v["seq"] != v["end"] {
            return None;
        }
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
pub fn rx_bytes(nodes: &[Node]) -> Option<Vec<u64>> {
    let mut all = Vec::new();
    for n in nodes {
        let links = n.links()?;
        if links.len() != nodes.len() - 1 {
            return None;
        }
        all.extend(links.iter().map(|l| l.2));
    }
    Some(all)
}

/// One link of a node's summary: (peer, tx msgs, tx bytes, rx msgs, rx bytes).
pub type Link = (usize, u64, u64, u64, u64);

/// "summary: node I; peer J: tx M msgs B B, rx M msgs B B; ..." as
/// (peer, tx msgs, tx bytes, rx msgs, rx bytes).
pub fn summary(out: &str, i: usize) -> Vec<Link> {
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

/// SIGTERMs every node (children of this test) and waits for each: every
/// one must exit 0 with PASS, and both ends of each link must agree on
/// what crossed it. Returns each node's summary.
pub fn finish_nodes(nodes: &mut [Node]) -> Vec<Vec<Link>> {
    for n in nodes.iter() {
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
    links_agree(&sums);
    sums
}

/// Both ends of each link of the nodes' summaries agree on what crossed
/// it, and each node has a link to every other.
pub fn links_agree(sums: &[Vec<Link>]) {
    for (i, s) in sums.iter().enumerate() {
        assert_eq!(s.len(), sums.len() - 1, "node {i}: {s:?}");
        for &(j, tx_m, tx_b, rx_m, rx_b) in s {
            let back = sums[j].iter().find(|l| l.0 == i).expect("the reverse link");
            assert_eq!((tx_m, tx_b), (back.3, back.4), "{i} -> {j}");
            assert_eq!((rx_m, rx_b), (back.1, back.2), "{j} -> {i}");
        }
    }
}

/// [`finish_nodes`] for nodes that were restored (children of this test
/// as its subreaper, not as spawned): SIGTERMs each, waits for it to end
/// with PASS, and checks that the links agree. Returns the summaries.
pub fn finish_restored_nodes(nodes: &mut [Node]) -> Vec<Vec<Link>> {
    for n in nodes.iter() {
        // SAFETY: signalling a node this test restored.
        unsafe { libc::kill(n.pid, libc::SIGTERM) };
    }
    let mut sums = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        wait_until(Duration::from_secs(300), "a node to end", || {
            let _ = n.child.try_wait();
            if !alive(n.pid) {
                reap_if_ours(n.pid);
                return true;
            }
            false
        });
        let out = n.out();
        assert_eq!(out.lines().last(), Some("PASS"), "node {i}:\n{out}");
        sums.push(summary(&out, i));
    }
    links_agree(&sums);
    sums
}
