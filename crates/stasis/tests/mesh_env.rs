//! The environment of distributed checkpoints, without a checkpoint: three
//! "hosts" (network namespaces) joined by a bridge (in a fourth namespace),
//! one `mesh` workload node on each. The nodes form a full mesh of TCP
//! connections and stream self-checking messages to each other as fast as
//! they can; the test waits until every link carries traffic and the
//! socket queues hold megabytes, SIGTERMs every node and requires PASS from
//! each, with every link's counts agreeing at both of its ends.

mod common;
use common::net::*;
use common::*;

use std::process::Command;
use std::time::{Duration, Instant};

const NODES: usize = 3;

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

#[test]
fn mesh_streams_across_three_network_namespaces() {
    let t0 = Instant::now();
    let hosts = Hosts::create(NODES, "m");
    let dir = tempfile::Builder::new()
        .prefix("stasis-mesh-")
        .tempdir()
        .unwrap();
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start(i, NODES, &hosts.hosts[i], &dir.path().join(format!("n{i}"))))
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
    // Each node PASSes and each link's two ends agree ...
    let sums = finish_nodes(&mut nodes);
    // ... and carried at least what the stats saw.
    for (i, s) in sums.iter().enumerate() {
        for (k, &(j, _, _, _, rx_b)) in s.iter().enumerate() {
            assert!(rx_b >= last[i * (NODES - 1) + k], "{j} -> {i}");
        }
    }
    eprintln!("mesh: {sums:?}; test took {:?}", t0.elapsed());
}
