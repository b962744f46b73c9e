//! The environment of the distributed-checkpoint tests (no checkpoint
//! yet): 4 namespace hosts (`scripts/hosts.sh`), Open MPI over them
//! (`scripts/mpi-job.sh`, `scripts/mpi-rsh.sh`), and two of the seed's MPI
//! workloads (`tests/workloads/mpi`) with 16 ranks. Each job must PASS its
//! own check, and its rank processes must really run in the hosts' network
//! namespaces (at least 3 different ones, seen in `/proc/PID/ns/net` while
//! the job runs) and UTS namespaces (each rank's `MPI_Get_processor_name`),
//! and its result line (with the checksum) must equal a one-rank run's.
//! The hosts are torn down at the end, also when the test fails.

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn script(name: &str) -> Command {
    let mut c = Command::new(repo().join("scripts").join(name));
    close_inherited_fds(&mut c);
    c
}

/// Namespace hosts with a prefix of their own; `hosts.sh down` on drop
/// (it also kills whatever still runs in them).
struct Hosts {
    prefix: String,
}

impl Hosts {
    fn up(prefix: &str, n: usize) -> (Hosts, serde_json::Value) {
        let hosts = Hosts {
            prefix: prefix.to_string(),
        };
        let out = script("hosts.sh")
            .args(["up", &n.to_string(), "--prefix", prefix, "--json"])
            .output()
            .expect("running scripts/hosts.sh");
        assert_ok(&out, "hosts.sh up");
        (hosts, json(&out))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let out = script("hosts.sh")
            .args(["down", "--prefix", &self.prefix])
            .output();
        if let Ok(o) = out {
            eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
        }
    }
}

/// Inode of a namespace file (`/proc/PID/ns/net`, `/run/netns/NAME`).
fn ns_inode(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

fn mpi_available() -> bool {
    ["mpirun", "mpicc"].iter().all(|p| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// What one job showed: its output and, per network namespace inode, the
/// rank PIDs seen in it.
struct Job {
    output: String,
    status: Option<i32>,
    elapsed: Duration,
    ranks_by_netns: BTreeMap<u64, BTreeSet<i32>>,
}

/// Runs `prog args` with 16 ranks over the 4 hosts of `prefix`; while it
/// runs, samples the network namespaces of its rank processes.
fn run_job(prefix: &str, bin_dir: &Path, prog: &str, args: &[&str]) -> Job {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, pidfile) = (dir.path().join("out.log"), dir.path().join("mpirun.pid"));
    let out_file = std::fs::File::create(&out_path).unwrap();
    let t0 = Instant::now();
    let mut child = script("mpi-job.sh")
        .args([
            "--hosts",
            "4",
            "--ranks",
            "16",
            "--prefix",
            prefix,
            "--pidfile",
        ])
        .arg(&pidfile)
        .arg(bin_dir.join(prog))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out_file.try_clone().unwrap())
        .stderr(out_file)
        .spawn()
        .expect("running scripts/mpi-job.sh");
    let _guard = KillOnDrop(i32::try_from(child.id()).unwrap());
    let mpirun = wait_pidfile(&pidfile, Duration::from_secs(30));
    let mut ranks_by_netns: BTreeMap<u64, BTreeSet<i32>> = BTreeMap::new();
    let status = loop {
        for pid in descendants(mpirun) {
            if comm_of(pid) == prog {
                if let Some(ino) = ns_inode(&format!("/proc/{pid}/ns/net")) {
                    ranks_by_netns.entry(ino).or_default().insert(pid);
                }
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{prog} did not finish within 90 s:\n{}",
            std::fs::read_to_string(&out_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Job {
        output: std::fs::read_to_string(&out_path).unwrap_or_default(),
        status,
        elapsed: t0.elapsed(),
        ranks_by_netns,
    }
}

/// The final line of a one-rank run of `bin args` (no hosts: plain
/// mpirun), to compare with the distributed run's.
fn single_rank_result(bin: &Path, args: &[&str]) -> String {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "-np", "1", "--mca", "btl", "self"])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null());
    close_inherited_fds(&mut c);
    let out = c.output().expect("running mpirun");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{} alone failed:\n{text}",
        bin.display()
    );
    text.lines().last().unwrap_or("").to_string()
}

#[test]
fn mpi_workloads_run_across_namespace_hosts() {
    if !mpi_available() {
        eprintln!(
            "SKIPPED mpi_env: mpirun/mpicc not found; run scripts/setup.sh as root (it installs Open MPI)"
        );
        return;
    }
    let bin_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi-workloads");
    let st = Command::new("make")
        .args(["-s", "-C"])
        .arg(repo().join("tests/workloads/mpi"))
        .arg(format!("OUT={}", bin_dir.display()))
        .status()
        .expect("running make for the MPI workloads");
    assert!(st.success(), "building the MPI workloads failed");

    let prefix = format!("stasis-mt{}-h", std::process::id());
    let (guard, info) = Hosts::up(&prefix, 4);
    let hosts = info["hosts"]
        .as_array()
        .expect("hosts in the JSON of hosts.sh up");
    assert_eq!(hosts.len(), 4, "{info}");
    let mut host_netns = BTreeSet::new();
    for (i, h) in hosts.iter().enumerate() {
        let name = format!("{prefix}{}", i + 1);
        assert_eq!(h["name"], name.as_str(), "{info}");
        assert_eq!(h["addr"], format!("10.213.0.{}", 11 + i).as_str(), "{info}");
        let hosts_file = std::fs::read_to_string(format!("/etc/netns/{name}/hosts")).unwrap();
        assert!(
            hosts_file.contains(&format!("10.213.0.14\t{prefix}4")),
            "{hosts_file}"
        );
        host_netns.insert(ns_inode(&format!("/run/netns/{name}")).expect("host netns"));
    }
    assert_eq!(
        host_netns.len(),
        4,
        "each host has a network namespace of its own"
    );

    // The fastest settings that still run long enough (~1-5 s) for the
    // ranks to be seen in /proc.
    for (prog, args) in [("sor", &["256", "1500"][..]), ("nqueens", &["14", "8"][..])] {
        let job = run_job(&prefix, &bin_dir, prog, args);
        eprintln!(
            "{prog} {}: {:.1} s, ranks seen per netns: {:?}",
            args.join(" "),
            job.elapsed.as_secs_f64(),
            job.ranks_by_netns
                .values()
                .map(BTreeSet::len)
                .collect::<Vec<_>>()
        );
        assert_eq!(job.status, Some(0), "{prog} failed:\n{}", job.output);
        let last = job
            .output
            .lines()
            .rev()
            .find(|l| !l.starts_with("mpi-job:") && !l.starts_with("hosts:"))
            .unwrap_or("");
        assert!(
            last.starts_with(&format!("PASS {prog} ")),
            "{prog}: {last}\n{}",
            job.output
        );
        // Same result and checksum as one rank alone (the checksums do
        // not depend on the rank count).
        assert_eq!(last, single_rank_result(&bin_dir.join(prog), args));
        assert!(
            job.output.contains("mpi-job: mpirun-pid="),
            "{}",
            job.output
        );
        let names = (1..=4)
            .map(|i| format!(" {prefix}{i}").repeat(4))
            .collect::<String>();
        assert!(
            job.output.contains(&format!("hosts: 4 distinct:{names}\n")),
            "ranks 0-3 on host 1, 4-7 on host 2, ...:\n{}",
            job.output
        );
        assert!(
            job.ranks_by_netns.len() >= 3,
            "{prog}: rank processes seen in only {} network namespaces: {:?}",
            job.ranks_by_netns.len(),
            job.ranks_by_netns
        );
        for ino in job.ranks_by_netns.keys() {
            assert!(
                host_netns.contains(ino),
                "{prog}: a rank in a netns that is no host's"
            );
        }
    }
    drop(guard);
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(!left.contains(&prefix), "namespaces left behind:\n{left}");
    assert!(!Path::new(&format!("/etc/netns/{prefix}1")).exists());
}
