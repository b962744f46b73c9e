//! A real Open MPI job (pml ob1, TCP between hosts) over three or four namespace
//! hosts (`scripts/hosts.sh`), launched as on a cluster: an `rshd` on hosts
//! 2 and 3 (`tests/workloads/mpi/rshd.c`, in the host's network namespace
//! and a UTS namespace named after it) and `rsh` as mpirun's launcher, so
//! each host's part of the job is a process tree of its own (host 1:
//! mpirun, its rsh clients and ranks; host i: rshd's child `sh` -> orted ->
//! ranks). A `stasis agent` runs on each host the same way.
//!
//! The job (the seed's `sor` or `nqueens`, 6 ranks over 3 hosts; `sor`
//! also in the seed's shape, 16 ranks over 4 hosts) is checkpointed with `stasis
//! cluster dump` when rank 0 prints `progress 2/10` (a fifth of its main
//! loop done, `mpiw_progress`), every process of it dies, `stasis cluster
//! restore` brings it back on every host, and it must finish with PASS and
//! the very result line (checksum included) of a run never interrupted,
//! which the test makes first. Once with a dump that kills, once with a
//! concurrent dump that leaves the job running, followed by SIGKILL to
//! every process of the job. The hosts (and all that runs in them) are
//! removed at the end, also when the test fails.

mod common;
use common::cluster::{cluster_in, token_file, TOKEN};
use common::*;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How many hosts, and ranks over them.
#[derive(Clone, Copy)]
struct Shape {
    hosts: usize,
    ranks: usize,
}

/// The shape of most tests: 6 ranks over 3 hosts.
const SMALL: Shape = Shape { hosts: 3, ranks: 6 };
/// The seed's: 16 ranks over 4 hosts.
const SEED: Shape = Shape {
    hosts: 4,
    ranks: 16,
};
const SUBNET: &str = "10.216.0";
const AGENT_PORT: u16 = 7700;
const RSH_PORT: u16 = 7222;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn hosts_sh() -> Command {
    let mut c = Command::new(repo().join("scripts/hosts.sh"));
    close_inherited_fds(&mut c);
    c
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

/// The MPI program `prog` and the rsh pair, built into the target directory.
fn build(prog: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi-workloads");
    let st = Command::new("make")
        .args(["-s", "-C"])
        .arg(repo().join("tests/workloads/mpi"))
        .arg(format!("OUT={}", bin.display()))
        .args([prog, "rsh", "rshd"].map(|p| bin.join(p)))
        .status()
        .expect("running make for the MPI workloads");
    assert!(st.success(), "building the MPI workloads failed");
    bin
}

fn addr(i: usize) -> String {
    format!("{SUBNET}.{}", 11 + i)
}

fn ns_inode(path: &str) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .ino()
}

/// (comm, user+system CPU ticks) of a process.
fn comm_and_cpu(pid: i32) -> Option<(String, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (s.find('(')?, s.rfind(')')?);
    let f: Vec<&str> = s[close + 2..].split_whitespace().collect();
    let t = |k: usize| f.get(k).and_then(|v| v.parse::<u64>().ok());
    Some((s[open + 1..close].to_string(), t(11)? + t(12)?))
}

/// Three hosts, an agent on each, an rshd on hosts 2 and 3; all of it
/// (and whatever runs in the hosts) is killed and removed on drop.
struct Cluster {
    shape: Shape,
    prefix: String,
    prog: &'static str,
    args: &'static [&'static str],
    bin: PathBuf,
    dir: tempfile::TempDir,
    tf: PathBuf,
    agents: Vec<(Child, String)>,
    rshds: Vec<(Child, Lines)>,
}

impl Cluster {
    /// `tag` keeps the hosts of the tests of this binary apart.
    fn start(
        tag: &str,
        shape: Shape,
        prog: &'static str,
        args: &'static [&'static str],
    ) -> Cluster {
        let bin = build(prog);
        // Orphans of the killed job come to this process, which reaps them
        // so that their PIDs are free for the restore.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let prefix = format!("stasis-cm{}{tag}-h", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("stasis-cluster-mpi-")
            .tempdir()
            .unwrap();
        let tf = token_file(dir.path(), TOKEN);
        let mut c = Cluster {
            shape,
            prefix,
            prog,
            args,
            bin,
            dir,
            tf,
            agents: Vec::new(),
            rshds: Vec::new(),
        };
        let o = hosts_sh()
            .args(["up", &shape.hosts.to_string(), "--prefix", &c.prefix])
            .arg("--subnet")
            .arg(format!("{SUBNET}.0/24"))
            .output()
            .expect("running scripts/hosts.sh");
        assert_ok(&o, "hosts.sh up");
        for i in 0..shape.hosts {
            let mut a = c.on_host(i, Path::new(env!("CARGO_BIN_EXE_stasis")));
            a.args(["agent", "--json", "--listen"])
                .arg(format!("{}:{AGENT_PORT}", addr(i)))
                .arg("--token-file")
                .arg(&c.tf)
                .arg("-D")
                .arg(c.dir.path().join(format!("agent{}", i + 1)))
                .stdout(Stdio::piped());
            let mut child = a.spawn().expect("starting stasis agent");
            let mut lines = Lines::new(child.stdout.take().unwrap());
            let l = lines.wait_for(Duration::from_secs(30), |l| l.contains("listening"));
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            assert_eq!(v["host"], c.host(i).as_str(), "the agent's hostname: {l}");
            c.agents
                .push((child, v["listening"].as_str().unwrap().to_string()));
        }
        for i in 1..shape.hosts {
            let mut r = c.on_host(i, &c.bin.join("rshd"));
            r.arg(format!("{}:{RSH_PORT}", addr(i)))
                .stdout(Stdio::piped());
            let mut child = r.spawn().expect("starting rshd");
            let mut lines = Lines::new(child.stdout.take().unwrap());
            lines.wait_for(Duration::from_secs(30), |l| {
                l.starts_with("rshd: listening")
            });
            c.rshds.push((child, lines));
        }
        c
    }

    fn host(&self, i: usize) -> String {
        format!("{}{}", self.prefix, i + 1)
    }

    /// `hosts.sh exec HOST PROG`: in the host's network namespace and a UTS
    /// namespace named after it (it execs: the child is PROG).
    fn on_host(&self, i: usize, prog: &Path) -> Command {
        let mut c = hosts_sh();
        c.arg("exec")
            .arg(self.host(i))
            .arg(prog)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        c
    }

    /// Starts the job: mpirun on host 1, its output in `out`.
    fn run(&mut self, name: &str) -> Run {
        let out = self.dir.path().join(format!("{name}.out"));
        let hostfile = self.dir.path().join("hostfile");
        let Shape { hosts, ranks } = self.shape;
        let slots = ranks.div_ceil(hosts);
        let hf: String = (0..hosts)
            .map(|i| format!("{} slots={slots}\n", self.host(i)))
            .collect();
        std::fs::write(&hostfile, hf).unwrap();
        let subnet = format!("{SUBNET}.0/24");
        let rsh = format!("{} -p {RSH_PORT}", self.bin.join("rsh").display());
        let f = std::fs::File::create(&out).unwrap();
        let mut c = self.on_host(0, Path::new("mpirun"));
        c.args(["--allow-run-as-root", "--oversubscribe", "--hostfile"])
            .arg(&hostfile)
            .args(["-np", &ranks.to_string()])
            .args(["--mca", "plm_rsh_agent", &rsh])
            .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
            .args(["--mca", "btl_tcp_if_include", &subnet])
            .args(["--mca", "oob_tcp_if_include", &subnet])
            .arg(self.bin.join(self.prog))
            .args(self.args)
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        // SAFETY: setsid is async-signal-safe; the job gets a session of
        // its own, as a job started by a shell on a cluster would.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = c.spawn().expect("starting mpirun");
        let mpirun = i32::try_from(child.id()).unwrap();
        // The root of each other host's part: the child rshd forked for it.
        let mut roots = vec![mpirun];
        for (_, lines) in &mut self.rshds {
            let l = lines.wait_for(Duration::from_secs(60), |l| l.starts_with("rshd: pid="));
            let pid = l["rshd: pid=".len()..]
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("rshd said {l:?}"));
            roots.push(pid);
        }
        Run {
            ranks,
            prog: self.prog,
            out,
            child: Some(child),
            roots,
            t0: Instant::now(),
        }
    }

    fn targets(&self, roots: Option<&[i32]>) -> Vec<String> {
        self.agents
            .iter()
            .enumerate()
            .flat_map(|(i, (_, a))| {
                let t = match roots {
                    Some(r) => format!("{a}={}", r[i]),
                    None => a.clone(),
                };
                ["--target".to_string(), t]
            })
            .collect()
    }

    fn cluster(&self, args: &[&str], targets: Vec<String>) -> serde_json::Value {
        let o = self.cluster_output(args, targets);
        assert_ok(&o, &format!("stasis cluster {args:?}"));
        json(&o)
    }

    /// `stasis cluster ARGS TARGETS` from host 1, whatever its outcome.
    fn cluster_output(&self, args: &[&str], targets: Vec<String>) -> std::process::Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(targets.iter().map(String::as_str));
        cluster_in(Some(&self.host(0)), &self.tf, &a)
    }

    /// Every restored root runs in its host's namespaces, with PID as saved.
    fn check_restored(&self, run: &Run, r: &serde_json::Value) {
        for (i, root) in run.roots.iter().enumerate() {
            assert!(
                alive(*root),
                "root {root} of host {} not restored: {r}",
                i + 1
            );
            let (agent, _) = &self.agents[i];
            for ns in ["net", "uts"] {
                assert_eq!(
                    ns_inode(&format!("/proc/{root}/ns/{ns}")),
                    ns_inode(&format!("/proc/{}/ns/{ns}", agent.id())),
                    "restored root {root}: {ns} namespace of host {}",
                    i + 1
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (c, _) in self.rshds.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Kills the agents and whatever of the job still runs in the hosts.
        if let Ok(o) = hosts_sh().args(["down", "--prefix", &self.prefix]).output() {
            eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
        }
        for (c, _) in self.agents.iter_mut() {
            let _ = c.wait();
        }
    }
}

/// One run of the job.
struct Run {
    ranks: usize,
    prog: &'static str,
    out: PathBuf,
    child: Option<Child>,
    /// mpirun, then the root of each other host's tree.
    roots: Vec<i32>,
    t0: Instant,
}

impl Run {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Every process of the job (all hosts).
    fn processes(&self) -> Vec<i32> {
        let mut all = self.roots.clone();
        for r in &self.roots {
            all.extend(descendants(*r));
        }
        all
    }

    /// The rank processes and the CPU time (ticks) they used in all.
    fn ranks_cpu(&self) -> (usize, u64) {
        let mut n = 0;
        let mut cpu = 0;
        for p in self.processes() {
            if let Some((comm, t)) = comm_and_cpu(p) {
                if comm == self.prog {
                    n += 1;
                    cpu += t;
                }
            }
        }
        (n, cpu)
    }

    /// Waits until every rank exists and they used `ticks` of CPU in all.
    fn wait_cpu(&self, ticks: u64) {
        wait_until(Duration::from_secs(120), "the job well under way", || {
            let (n, cpu) = self.ranks_cpu();
            n == self.ranks && cpu >= ticks
        });
        assert!(!self.output().contains("PASS"), "{}", self.output());
    }

    /// The highest `<prog>: progress K/10` line printed so far (0: none).
    fn progress(&self) -> u32 {
        let mark = format!("{}: progress ", self.prog);
        self.output()
            .lines()
            .filter_map(|l| l.strip_prefix(&mark)?.strip_suffix("/10")?.parse().ok())
            .max()
            .unwrap_or(0)
    }

    /// Waits until the job printed `progress K/10` (rank 0, as its main
    /// loop passes that tenth), with every rank alive.
    fn wait_progress(&self, k: u32) {
        wait_until(
            Duration::from_secs(300),
            &format!("the job to print progress {k}/10"),
            || self.progress() >= k && self.ranks_cpu().0 == self.ranks,
        );
        assert!(!self.output().contains("PASS"), "{}", self.output());
    }

    /// Waits until each of `pids` is gone (reaped where it is ours).
    fn wait_gone(&mut self, pids: &[i32]) {
        if let Some(c) = self.child.as_mut() {
            wait_until(Duration::from_secs(60), "mpirun to die", || {
                c.try_wait().unwrap().is_some()
            });
        }
        self.child = None;
        for &p in pids {
            reap_if_ours(p);
            wait_until(
                Duration::from_secs(60),
                "a process of the job to die",
                || !Path::new(&format!("/proc/{p}")).exists(),
            );
        }
    }

    /// The output without its `time:` line (which counts the time the job
    /// was stopped or dead), with the hostnames (the test's) as `H`, and
    /// without mpirun's launch-time race warning "plm:rsh: Warning:
    /// setpgid(CHILD,CHILD) failed in parent with errno=Permission denied"
    /// (a race at launch, before any checkpoint: the rsh child had already
    /// called exec, after its own `setpgid(0,0)`).
    fn output_untimed(&self, prefix: &str) -> String {
        self.output()
            .lines()
            .filter(|l| !l.starts_with("time: "))
            .filter(|l| {
                !(l.contains("plm:rsh: Warning: setpgid(") && l.contains("errno=Permission denied"))
            })
            .map(|l| l.replace(prefix, "H"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the (restored) job ends: its result line.
    fn finish(&mut self) -> String {
        let mpirun = self.roots[0];
        wait_until(Duration::from_secs(300), "the job to end", || {
            if let Some(c) = self.child.as_mut() {
                let _ = c.try_wait();
            }
            !alive(mpirun)
                && self
                    .output()
                    .lines()
                    .any(|l| l.starts_with("PASS") || l.starts_with("FAIL"))
        });
        let out = self.output();
        eprintln!("{out}");
        let last = out.lines().last().unwrap_or("").to_string();
        assert!(last.starts_with(&format!("PASS {} ", self.prog)), "{out}");
        last
    }
}

/// Sends SIGKILL to every process of the job.
fn kill_all(run: &mut Run) -> Vec<i32> {
    let all = run.processes();
    for &p in &all {
        // SAFETY: killing a process of the job this test started.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    run.wait_gone(&all);
    all
}

/// Runs `prog args` undisturbed, then checkpointed (kill), then
/// checkpointed (concurrent, left running) and killed: each restored job
/// must end with the undisturbed run's result line.
fn checkpoint_restore(tag: &str, shape: Shape, prog: &'static str, args: &'static [&'static str]) {
    if !mpi_available() {
        eprintln!("SKIPPED cluster_mpi: mpirun/mpicc not found; run scripts/setup.sh as root");
        return;
    }
    let mut c = Cluster::start(tag, shape, prog, args);
    let Shape { hosts, ranks } = shape;
    for i in 0..hosts {
        let host_net = ns_inode(&format!("/run/netns/{}", c.host(i)));
        assert_eq!(
            ns_inode(&format!("/proc/{}/ns/net", c.agents[i].0.id())),
            host_net
        );
    }

    // An undisturbed run: its result line, and how much CPU its ranks use.
    let mut plain = c.run("plain");
    let mut total = 0;
    wait_until(
        Duration::from_secs(300),
        "the undisturbed run to end",
        || {
            total = total.max(plain.ranks_cpu().1);
            plain.child.as_mut().unwrap().try_wait().unwrap().is_some()
        },
    );
    let expected = plain.finish();
    let want_hosts: Vec<String> = (0..hosts)
        .flat_map(|i| vec![c.host(i); ranks / hosts])
        .collect();
    assert!(
        plain.output().contains(&format!(
            "hosts: {hosts} distinct: {}",
            want_hosts.join(" ")
        )),
        "{}",
        plain.output()
    );
    eprintln!(
        "undisturbed: {expected} in {:.1} s, ranks' CPU {total} ticks",
        plain.t0.elapsed().as_secs_f64()
    );
    assert!(total > 0);

    // A dump that kills, a fifth of the way through the main loop.
    let mut run = c.run("kill");
    run.wait_progress(2);
    let all = run.processes();
    assert!(all.len() >= ranks + 5, "{all:?}");
    let at = run.t0.elapsed();
    let o = c.cluster_output(&["dump", "--job", "mpi-kill"], c.targets(Some(&run.roots)));
    if !o.status.success() {
        let states: Vec<String> = run
            .roots
            .iter()
            .map(|p| {
                let st = std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .unwrap_or_else(|e| e.to_string());
                let net = std::fs::read_link(format!("/proc/{p}/ns/net"))
                    .map(|l| l.display().to_string())
                    .unwrap_or_else(|e| e.to_string());
                format!("{p}: {st} net={net}")
            })
            .collect();
        panic!(
            "the kill dump failed: {}\nroots: {states:#?}\njob output:\n{}",
            String::from_utf8_lossy(&o.stderr),
            run.output()
        );
    }
    let r = json(&o);
    assert_eq!(r["round"], 1, "{r}");
    eprintln!(
        "cluster dump (kill): called at {:.2} s, returned at {:.2} s: freeze {} us, total {} us",
        at.as_secs_f64(),
        run.t0.elapsed().as_secs_f64(),
        r["freeze_us"],
        r["total_us"]
    );
    run.wait_gone(&all);
    assert!(!run.output().contains("PASS"), "{}", run.output());
    let r = c.cluster(&["restore", "--job", "mpi-kill"], c.targets(None));
    c.check_restored(&run, &r);
    eprintln!("cluster restore: {r}");
    assert_eq!(run.finish(), expected);
    // Nothing printed twice or lost: the whole output is the undisturbed one's.
    assert_eq!(
        run.output_untimed(&c.prefix),
        plain.output_untimed(&c.prefix)
    );

    // A concurrent dump that leaves the job running; then every process
    // of the job is killed, and the job restored from that cut.
    let mut run = c.run("live");
    run.wait_progress(2);
    let args = [
        "dump",
        "--job",
        "mpi-live",
        "--leave-running",
        "--concurrent",
    ];
    let r = c.cluster(&args, c.targets(Some(&run.roots)));
    assert_eq!(r["round"], 1, "{r}");
    eprintln!(
        "cluster dump (concurrent): freeze {} us, total {} us",
        r["freeze_us"], r["total_us"]
    );
    let (n, cpu) = run.ranks_cpu();
    assert_eq!(n, ranks, "the job runs on after the dump");
    match run.progress() {
        k @ 0..=8 => run.wait_progress(k + 1),
        _ => run.wait_cpu(cpu + total / 10),
    }
    let killed = kill_all(&mut run);
    eprintln!("killed {} processes of the job", killed.len());
    assert!(!run.output().contains("PASS"), "{}", run.output());
    let r = c.cluster(&["restore", "--job", "mpi-live"], c.targets(None));
    c.check_restored(&run, &r);
    assert_eq!(run.finish(), expected);
    assert_eq!(
        run.output_untimed(&c.prefix),
        plain.output_untimed(&c.prefix)
    );

    for (a, _) in c.agents.iter_mut() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(i32::try_from(a.id()).unwrap(), libc::SIGTERM) };
        let st = a.wait().unwrap();
        assert_eq!(st.code(), Some(0), "stasis agent after SIGTERM: {st}");
    }
}

/// Red-black SOR: two halo exchanges with both neighbours per iteration.
#[test]
fn sor_over_three_hosts_is_checkpointed_killed_and_restored() {
    checkpoint_restore("s", SMALL, "sor", &["512", "5000"]);
}

/// N-queens: every phase ends in an `MPI_Iallreduce` of its counts.
#[test]
fn nqueens_over_three_hosts_is_checkpointed_killed_and_restored() {
    checkpoint_restore("q", SMALL, "nqueens", &["15", "10"]);
}

/// The seed's shape: 16 ranks of SOR over 4 hosts (4 ranks, an orted and
/// an rshd child per host; mpirun and its rsh clients on host 1). 4000
/// iterations (about 14 s idle): with 2000, a dump called at progress 2/10
/// on a loaded machine (beside two CPU hogs and another test binary, it
/// returned 5.6 s later, its own rounds taking 0.7 s of that) froze the
/// job only after it had printed PASS.
#[test]
fn sor_16_ranks_over_four_hosts_is_checkpointed_killed_and_restored() {
    checkpoint_restore("x", SEED, "sor", &["512", "4000"]);
}
