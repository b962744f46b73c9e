//! Cluster checkpoints kept in an object store: two hosts (network
//! namespaces on a bridge), each with a `stasis agent -D s3://...`, and a
//! versitygw in the bridge's namespace (the hosts' loopbacks are their
//! own: it listens on an address of the bridge). The `mesh` workload (TCP
//! links between the hosts with data in flight) is checkpointed with
//! `stasis cluster dump` into the store, killed, and restored from it with
//! `stasis cluster restore`, after the agents lost their local disks; a
//! round aborted after the upload commits nothing in the store; a round
//! whose agent died after the decision is committed in the store when the
//! agent starts again.

mod common;
use common::cluster::*;
use common::net::*;
use common::s3::*;
use common::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

const HOSTS: usize = 2;
const AGENT_PORT: u16 = 7700;
/// The server's address, on the hosts' bridge.
const S3_ADDR: &str = "10.214.0.254";
const S3_PORT: u16 = 7070;
/// The replica's server (`Job::start_replicated`), beside the store's.
const REPLICA_PORT: u16 = 7071;
const PREFIX: &str = "cl";

struct Job {
    agents: Vec<Agent>,
    nodes: Vec<Node>,
    server: S3Server,
    /// A second server holding the agents' replica (`--replica`).
    replica: Option<S3Server>,
    /// Global flags of every agent (`--encrypt-key-file`...).
    flags: Vec<String>,
    tf: PathBuf,
    d: tempfile::TempDir,
    hosts: Hosts,
}

impl Job {
    /// Two hosts, the server on their bridge, an agent (with `flags`, and
    /// the environment `env[i]` for agent `i`) and a mesh node on each,
    /// traffic flowing.
    fn start(tag: &str, flags: &[&str], env: &[&[(&str, &str)]]) -> Job {
        Job::start_with(tag, flags, env, false)
    }

    /// [`Job::start`], every agent with a replica store on a second
    /// server (`--replica s3+http://...`).
    fn start_replicated(tag: &str) -> Job {
        Job::start_with(tag, &[], &[], true)
    }

    fn start_with(tag: &str, flags: &[&str], env: &[&[(&str, &str)]], replicated: bool) -> Job {
        let mut job = Job::start_agents_with(tag, flags, env, replicated);
        for i in 0..HOSTS {
            let n = Node::start(
                i,
                HOSTS,
                &job.hosts.hosts[i],
                &job.d.path().join(format!("n{i}")),
            );
            job.nodes.push(n);
        }
        for n in &job.nodes {
            let pid = wait_pidfile(&n.dir.join("pid"), Duration::from_secs(60));
            assert_eq!(pid, n.pid, "{}", n.out());
        }
        job.wait_traffic(1 << 20);
        job
    }

    /// Two hosts, the server on their bridge, an agent on each; no node.
    fn start_agents(tag: &str, flags: &[&str], env: &[&[(&str, &str)]]) -> Job {
        Job::start_agents_with(tag, flags, env, false)
    }

    /// [`Job::start_agents`], with a replica's server too if `replicated`.
    fn start_agents_with(
        tag: &str,
        flags: &[&str],
        env: &[&[(&str, &str)]],
        replicated: bool,
    ) -> Job {
        workloads(); // subreaper: restored nodes outlive their agents' restores
        let hosts = Hosts::create(HOSTS, tag);
        ip(&[
            "-n",
            &hosts.bridge,
            "addr",
            "add",
            &format!("{S3_ADDR}/24"),
            "dev",
            "br0",
        ]);
        // (Its own address is reached over its loopback.)
        ip(&["-n", &hosts.bridge, "link", "set", "lo", "up"]);
        let server = S3Server::start_in(&hosts.bridge, S3_ADDR, S3_PORT);
        let replica = replicated.then(|| S3Server::start_in(&hosts.bridge, S3_ADDR, REPLICA_PORT));
        let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        if let Some(r) = &replica {
            flags.push("--replica".into());
            flags.push(format!("s3+{}/{BUCKET}/{PREFIX}", r.endpoint));
        }
        let d = tempfile::Builder::new()
            .prefix("stasis-s3-cluster-")
            .tempdir()
            .unwrap();
        let tf = token_file(d.path(), TOKEN);
        let mut job = Job {
            agents: Vec::new(),
            nodes: Vec::new(),
            server,
            replica,
            flags,
            tf,
            d,
            hosts,
        };
        for i in 0..HOSTS {
            let a = job.start_agent(i, env.get(i).copied().unwrap_or(&[]));
            job.agents.push(a);
        }
        job
    }

    /// The local disk of host `i`'s agent (its staging directories and
    /// records).
    fn local(&self, i: usize) -> PathBuf {
        self.d.path().join(format!("local{i}"))
    }

    /// Starts agent `i` on `s3://BUCKET/PREFIX`, named `h<i>`.
    fn start_agent(&self, i: usize, env: &[(&str, &str)]) -> Agent {
        let mut e = self.server.env(&self.local(i));
        e.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let name = format!("h{i}");
        let mut args: Vec<&str> = vec!["--name", &name];
        args.extend(self.flags.iter().map(String::as_str));
        Agent::start_args(
            Path::new(&self.server.url(PREFIX)),
            &self.tf,
            &format!("{}:{AGENT_PORT}", Hosts::addr(i)),
            Some(&self.hosts.hosts[i]),
            &e,
            &args,
        )
    }

    /// Waits until every link has received `more` bytes beyond now.
    fn wait_traffic(&self, more: u64) {
        let mut base: Option<Vec<u64>> = None;
        wait_until(Duration::from_secs(120), "traffic on every link", || {
            let Some(now) = rx_bytes(&self.nodes) else {
                return false;
            };
            let b = base.get_or_insert_with(|| now.clone());
            // Fewer bytes than the base: a killed node's last record.
            if now.iter().zip(b.iter()).any(|(n, b)| n < b) {
                *b = now.clone();
            }
            now.iter().zip(b.iter()).all(|(n, b)| n - b >= more)
        });
    }

    fn targets(&self) -> Vec<String> {
        let pids: Vec<i32> = self.nodes.iter().map(|n| n.pid).collect();
        target_args(&self.agents, &pids)
    }

    fn agent_targets(&self) -> Vec<String> {
        agent_target_args(&self.agents)
    }

    /// `cluster ARGS... TARGETS` from host 0.
    fn cluster(&self, args: &[&str], targets: &[String]) -> std::process::Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(targets.iter().map(String::as_str));
        cluster_in(Some(&self.hosts.hosts[0]), &self.tf, &a)
    }

    fn dump(&self, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["dump", "--job", "mesh"];
        args.extend_from_slice(extra);
        let o = self.cluster(&args, &self.targets());
        assert_ok(&o, &format!("cluster dump {extra:?}"));
        json(&o)
    }

    fn restore(&self, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["restore", "--job", "mesh"];
        args.extend_from_slice(extra);
        let o = self.cluster(&args, &self.agent_targets());
        assert_ok(&o, "cluster restore");
        let r = json(&o);
        for n in &self.nodes {
            assert!(alive(n.pid), "node {} not restored: {r}", n.pid);
        }
        r
    }

    /// Restores the job (`cluster restore EXTRA`) from round `round`, then
    /// lets 4 MiB more cross every link and [`finish`](Self::finish)es.
    fn restore_and_finish(&mut self, extra: &[&str], round: u64) {
        let r = self.restore(extra);
        assert_eq!(r["round"], round, "{r}");
        self.wait_traffic(4 << 20);
        self.finish();
    }

    /// The complete rounds (held by every tree).
    fn complete(&self) -> serde_json::Value {
        self.complete_of("mesh")
    }

    /// The complete rounds of job `name`.
    fn complete_of(&self, name: &str) -> serde_json::Value {
        let o = self.cluster(&["inspect", "--job", name], &self.agent_targets());
        assert_ok(&o, "cluster inspect");
        json(&o)["complete"].clone()
    }

    /// The store of node `i`'s tree in the server's backing directory.
    fn tree_store(&self, i: usize) -> PathBuf {
        tree_store_in(&self.server, self.nodes[i].pid, i)
    }

    /// The checkpoints committed in the store (commit records) of node
    /// `i`'s tree.
    fn records(&self, i: usize) -> Vec<String> {
        records_in(&self.tree_store(i))
    }

    /// [`records`](Self::records) in the replica.
    fn replica_records(&self, i: usize) -> Vec<String> {
        let r = self.replica.as_ref().expect("a replicated job");
        records_in(&tree_store_in(r, self.nodes[i].pid, i))
    }

    /// Every chunk stored for the job (all trees share `PREFIX/chunks/`).
    fn chunks(&self) -> usize {
        std::fs::read_dir(self.shared_chunks())
            .map(|rd| rd.count())
            .unwrap_or(0)
    }

    /// The chunks of every tree of the store, in the server's backing
    /// directory.
    fn shared_chunks(&self) -> PathBuf {
        self.server.bucket_dir().join(PREFIX).join("chunks")
    }

    /// Whether the agents hold a round in progress: a tentative
    /// checkpoint, or an upload not yet committed, in their local disks.
    fn round_in_progress(&self) -> bool {
        fn any_under(dir: &Path) -> bool {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return false;
            };
            rd.filter_map(Result::ok).any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name == "staged.json"
                    || name.starts_with(".tmp-")
                    || (e.file_type().is_ok_and(|t| t.is_dir()) && any_under(&e.path()))
            })
        }
        (0..HOSTS).any(|i| any_under(&self.local(i)))
    }

    /// SIGKILLs every node and waits until each PID is free.
    fn kill_all(&mut self) {
        for n in &self.nodes {
            // SAFETY: killing a node this test started (or restored).
            unsafe { libc::kill(n.pid, libc::SIGKILL) };
        }
        for n in &mut self.nodes {
            wait_until(
                Duration::from_secs(30),
                "a killed node to be reaped",
                || {
                    let _ = n.child.try_wait();
                    reap_if_ours(n.pid);
                    !Path::new(&format!("/proc/{}", n.pid)).exists()
                },
            );
        }
    }

    /// SIGTERM to every node: each must end with PASS, and both ends of
    /// each link must agree on what crossed it.
    fn finish(&mut self) {
        let sums = finish_restored_nodes(&mut self.nodes);
        assert_eq!(sums.len(), HOSTS);
        for a in &mut self.agents {
            a.stop();
        }
    }
}

/// The store of the tree rooted at `pid` of host `i` in `server`'s backing
/// directory.
fn tree_store_in(server: &S3Server, pid: i32, i: usize) -> PathBuf {
    server
        .bucket_dir()
        .join(format!("{PREFIX}/h{i}/jobs/mesh/{pid}"))
}

/// The checkpoints committed (commit records) in the tree store `store`.
fn records_in(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join("commits"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The local checkpoints (`checkpoints/NNNNNNNN`) under `dir`.
fn checkpoints_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let in_checkpoints = dir.file_name().is_some_and(|n| n == "checkpoints");
        if in_checkpoints && name.bytes().all(|b| b.is_ascii_digit()) {
            out.push(p);
        } else {
            out.extend(checkpoints_under(&p));
        }
    }
    out
}

/// The store's report of each tree in a round's result: its checkpoint
/// number in the store, one per host.
fn stored(r: &serde_json::Value) -> Vec<u64> {
    r["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["reports"].as_array().unwrap().iter())
        .map(|t| {
            t["stored"]["checkpoint"]
                .as_u64()
                .unwrap_or_else(|| panic!("no checkpoint stored in {t}"))
        })
        .collect()
}

/// A round left running and a round that kills, both into the store; the
/// hosts then lose their local disks (agents stopped, their directories
/// deleted, started again): the job is restored from the store, and every
/// byte in flight at the cut arrives exactly once.
#[test]
fn mesh_over_two_hosts_checkpointed_into_an_object_store_and_restored_from_it() {
    let mut job = Job::start("s3k", &[], &[]);
    let r = job.dump(&["--leave-running"]);
    assert_eq!(r["round"], 1, "{r}");
    assert_eq!(stored(&r), vec![1; HOSTS], "{r}");
    // A plain store's staging directories keep the latest checkpoint (the
    // parent of an incremental round).
    for i in 0..HOSTS {
        assert_eq!(checkpoints_under(&job.local(i)).len(), 1, "host {i}");
    }
    job.wait_traffic(1 << 20);
    let r = job.dump(&[]);
    assert_eq!(r["round"], 2, "{r}");
    assert_eq!(stored(&r), vec![2; HOSTS], "{r}");
    for n in &mut job.nodes {
        assert_eq!(n.wait(Duration::from_secs(30)), (None, Some(libc::SIGKILL)));
    }
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001", "00000002"], "host {i}");
    }
    assert_eq!(job.complete(), serde_json::json!([1, 2]));
    // Every host loses its disk: only the store holds the job.
    for i in 0..HOSTS {
        job.agents[i].stop();
        std::fs::remove_dir_all(job.local(i)).unwrap();
        job.agents[i] = job.start_agent(i, &[]);
    }
    let r = job.restore(&[]);
    assert_eq!(r["round"], 2, "{r}");
    job.wait_traffic(8 << 20);
    job.finish();
}

/// Agents writing to an age recipient (`--encrypt-recipient`) and given
/// the identity for restores: each tree's record wraps its data key, no
/// host keeps the plaintext of a committed round, and `cluster restore
/// --lazy` reads it back (the page fillers get the identity); every byte
/// in flight is delivered once.
#[test]
fn agents_writing_to_an_age_recipient_restore_lazily_with_the_identity() {
    let d = tempfile::tempdir().unwrap();
    let (secret, recipient) = stasis_store::generate_identity();
    let id = d.path().join("identity");
    std::fs::write(&id, format!("{secret}\n")).unwrap();
    let id = id.display().to_string();
    let mut job = Job::start(
        "s3g",
        &["--encrypt-recipient", &recipient, "--decrypt-identity", &id],
        &[],
    );
    let r = job.dump(&["--leave-running"]);
    assert_eq!(stored(&r), vec![1; HOSTS], "{r}");
    for i in 0..HOSTS {
        let record = std::fs::read_to_string(job.tree_store(i).join("commits/00000001")).unwrap();
        let record: serde_json::Value = serde_json::from_str(&record).unwrap();
        assert!(
            record["wrapped_key"]
                .as_str()
                .is_some_and(|w| w.starts_with("-----BEGIN AGE ENCRYPTED FILE-----")),
            "host {i}: {record}"
        );
        assert_eq!(
            checkpoints_under(&job.local(i)),
            Vec::<PathBuf>::new(),
            "host {i}"
        );
    }
    job.wait_traffic(1 << 20);
    job.kill_all();
    job.restore_and_finish(&["--lazy"], 1);
}

/// Agents given a recipient only (the hosts hold no identity): rounds
/// commit, each numbered from the rounds the agent reads back (its
/// `cut.json`s, under the data keys it made); an agent started again
/// holds none of those keys, so the next `cluster dump` fails saying to
/// give it the identity, and the job runs on.
#[test]
fn agents_with_a_recipient_only_need_the_identity_once_restarted() {
    let (_secret, recipient) = stasis_store::generate_identity();
    let mut job = Job::start("s3i", &["--encrypt-recipient", &recipient], &[]);
    let r = job.dump(&["--leave-running"]);
    assert_eq!(stored(&r), vec![1; HOSTS], "{r}");
    job.wait_traffic(1 << 20);
    let r = job.dump(&["--leave-running"]);
    assert_eq!(r["round"], 2, "{r}");
    assert_eq!(stored(&r), vec![2; HOSTS], "{r}");
    job.agents[0].stop();
    job.agents[0] = job.start_agent(0, &[]);
    let o = job.cluster(
        &["dump", "--job", "mesh", "--leave-running"],
        &job.targets(),
    );
    assert_fails_with(&o, "--decrypt-identity");
    for n in &job.nodes {
        assert!(alive(n.pid), "node {} died", n.pid);
    }
    job.kill_all();
}

/// Encrypted store. The coordinator dies once every host is released
/// (`die-in-cluster-round:3`): each agent has written and uploaded its
/// checkpoint, and voted, but no decision comes. The round aborts: its
/// chunks are in the store, no commit record names them, and the job,
/// killed, is restored (lazily) from the previous round.
#[test]
fn a_round_aborted_after_the_upload_commits_nothing_in_the_store() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let key = key.display().to_string();
    let mut job = Job::start("s3a", &["--encrypt-key-file", &key], &[]);
    let r = job.dump(&["--leave-running"]);
    assert_eq!(stored(&r), vec![1; HOSTS], "{r}");
    let record = std::fs::read_to_string(job.tree_store(0).join("commits/00000001")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert!(record["key_id"].is_string(), "not encrypted: {record}");
    // Nor does a host keep the plaintext of a committed round.
    for i in 0..HOSTS {
        assert_eq!(
            checkpoints_under(&job.local(i)),
            Vec::<PathBuf>::new(),
            "host {i}"
        );
    }
    let before = job.chunks();
    job.wait_traffic(1 << 20);
    let mut args = vec!["dump", "--job", "mesh", "--leave-running"];
    let t = job.targets();
    args.extend(t.iter().map(String::as_str));
    let o = stasis_in(Some(&job.hosts.hosts[0]))
        .arg("cluster")
        .args(&args)
        .arg("--token-file")
        .arg(&job.tf)
        .env("STASIS_FAULT", "die-in-cluster-round:3")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    wait_until(
        Duration::from_secs(120),
        "the agents to abort the round",
        || !job.round_in_progress(),
    );
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001"], "host {i}");
    }
    let after = job.chunks();
    assert!(
        after > before,
        "the aborted round uploaded nothing before its vote: {before} -> {after} chunks"
    );
    assert_eq!(job.complete(), serde_json::json!([1]));
    for n in &job.nodes {
        assert!(alive(n.pid), "node {} died with the round", n.pid);
    }
    job.kill_all();
    job.restore_and_finish(&["--lazy"], 1);
}

/// Host 0's agent dies right after recording the decision of the first
/// round (`die-after-decision:1`), before creating its commit record: the
/// store then holds host 1's checkpoint of the round, not host 0's (the
/// round is not complete). Started again, the agent creates it from what
/// it had uploaded before its vote, and the job restores from the round.
#[test]
fn an_agent_that_died_after_the_decision_commits_in_the_store_when_started_again() {
    let die: &[(&str, &str)] = &[("STASIS_FAULT", "die-after-decision:1")];
    let mut job = Job::start("s3d", &[], &[die]);
    let o = job.cluster(
        &["dump", "--job", "mesh", "--leave-running"],
        &job.targets(),
    );
    assert_fails_with(&o, "closed the connection");
    job.agents[0].kill();
    assert_eq!(job.records(0), Vec::<String>::new());
    wait_until(Duration::from_secs(60), "host 1's commit", || {
        job.records(1) == ["00000001"]
    });
    job.agents[0] = job.start_agent(0, &[]);
    assert_eq!(job.records(0), ["00000001"]);
    assert_eq!(job.complete(), serde_json::json!([1]));
    job.kill_all();
    job.restore_and_finish(&[], 1);
}

/// `stasis cluster run --every 1` into the store: a round a second, the
/// second and third incremental on every tree (the agents' staging
/// directories keep the chain, the store holds it), each committed in the
/// store; once the nodes are killed the command ends; host 0's tree store
/// is collected by `gc --keep 1` (its newest checkpoint merged into a full
/// one, still of its round); the job is restored from the newest round
/// (on host 1 an incremental one, read back through its chain).
#[test]
fn periodic_incremental_rounds_into_the_store() {
    let mut job = Job::start("s3p", &[], &[]);
    let mut c = stasis_in(Some(&job.hosts.hosts[0]));
    c.args(["cluster", "run", "--job", "mesh", "--every", "1", "--json"])
        .args(job.targets())
        .arg("--token-file")
        .arg(&job.tf)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(job.d.path().join("run.err")).unwrap());
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
    for round in 1..=3u64 {
        let e = next("checkpoint");
        assert_eq!(e["event"], "checkpoint", "{e}");
        assert_eq!(e["round"], round, "{e}");
        assert_eq!(e["incremental"], round > 1, "{e}");
        let stored: Vec<u64> = e["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|h| h["reports"].as_array().unwrap().iter())
            .map(|t| t["stored"]["checkpoint"].as_u64().unwrap_or(0))
            .collect();
        assert_eq!(stored, vec![round; HOSTS], "{e}");
    }
    job.kill_all();
    let done = loop {
        let e = next("end");
        if e["event"] == "done" {
            break e;
        }
    };
    assert_eq!(run.wait().unwrap().code(), Some(0), "{done}");
    let last = done["committed"].as_u64().unwrap();
    for i in 0..HOSTS {
        assert_eq!(job.records(i).len() as u64, last, "host {i}");
    }
    // gc of host 0's tree keeps its newest checkpoint, merged into a full
    // one, still the newest round's (its `cut.json` kept).
    let url = format!(
        "{}/h0/jobs/mesh/{}",
        job.server.url(PREFIX),
        job.nodes[0].pid
    );
    let staging = job.d.path().join("gc-staging");
    let o = stasis_in(Some(&job.hosts.hosts[0]))
        .envs(job.server.env(&staging))
        .args(["gc", "-D", &url, "--keep", "1", "--json"])
        .output()
        .unwrap();
    assert_ok(&o, "gc of a tree's store");
    assert_eq!(job.records(0), [format!("{last:08}")]);
    assert_eq!(job.complete(), serde_json::json!([last]));
    let r = job.restore(&[]);
    assert_eq!(r["round"], last, "{r}");
    job.wait_traffic(2 << 20);
    job.finish();
}

/// The store's server down: a round fails, naming the store, and commits
/// nothing; the job runs on. The server back, the uploads fail (the
/// trees' shared `chunks/` made a file in the server's directory): the
/// agents vote no, the round aborts, and neither host commits anything.
/// Both fixed, the next round commits, and the job restores from it.
#[test]
fn a_round_with_the_store_down_or_an_upload_failing_commits_nothing() {
    let mut job = Job::start("s3x", &[], &[]);
    job.dump(&["--leave-running"]);
    job.server.kill();
    let o = job.cluster(
        &["dump", "--job", "mesh", "--leave-running"],
        &job.targets(),
    );
    assert_fails_with(&o, "cannot reach the object store");
    for n in &job.nodes {
        assert!(alive(n.pid), "node {} died with the round", n.pid);
    }
    job.server.restart();
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001"], "host {i}");
    }
    // (The agents read the rounds of the checkpoints they hold now: once.)
    assert_eq!(job.complete(), serde_json::json!([1]));
    let chunks = job.shared_chunks();
    let saved = chunks.with_extension("saved");
    std::fs::rename(&chunks, &saved).unwrap();
    std::fs::write(&chunks, "not a directory").unwrap();
    job.wait_traffic(1 << 20);
    let o = job.cluster(
        &["dump", "--job", "mesh", "--leave-running"],
        &job.targets(),
    );
    assert_fails_with(&o, "storing the checkpoint");
    for n in &job.nodes {
        assert!(alive(n.pid), "node {} died with the round", n.pid);
    }
    wait_until(
        Duration::from_secs(120),
        "the agents to abort the round",
        || !job.round_in_progress(),
    );
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001"], "host {i}");
    }
    std::fs::remove_file(&chunks).unwrap();
    std::fs::rename(&saved, &chunks).unwrap();
    job.wait_traffic(1 << 20);
    let r = job.dump(&[]);
    assert_eq!(r["round"], 2, "{r}");
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001", "00000002"], "host {i}");
    }
    for n in &mut job.nodes {
        assert_eq!(n.wait(Duration::from_secs(30)), (None, Some(libc::SIGKILL)));
    }
    let r = job.restore(&[]);
    assert_eq!(r["round"], 2, "{r}");
    job.wait_traffic(2 << 20);
    job.finish();
}

/// Every agent with a replica store on a second server: each round's
/// checkpoints are committed in both (each tree's report says so); with
/// the replica's server down a round fails (the agents vote no: "1
/// needed"), the job runs on and neither store gets a checkpoint; the
/// replica back, the next round commits in both. With `--min-replicas 0`
/// a round commits without the replica (down), which gets that checkpoint
/// with the next round's (incremental), as its parent; the job is killed. Then the store's
/// server is down and the hosts lose their local disks: the agents start
/// (warning), read the rounds from the replica, and the job is restored
/// from it, every byte in flight at the cut arriving once.
#[test]
fn agents_with_a_replica_commit_in_both_and_restore_from_the_replica() {
    let mut job = Job::start_replicated("s3m");
    let r = job.dump(&["--leave-running"]);
    assert_eq!(stored(&r), vec![1; HOSTS], "{r}");
    let lines: Vec<&serde_json::Value> = r["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["reports"].as_array().unwrap().iter())
        .map(|t| &t["stored"]["replicas"])
        .collect();
    assert_eq!(lines.len(), HOSTS, "{r}");
    for l in lines {
        let l = l[0].as_str().unwrap_or_default();
        assert!(l.ends_with("holds checkpoint 1"), "{r}");
    }
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001"], "host {i}");
        assert_eq!(job.replica_records(i), ["00000001"], "host {i}");
    }
    job.replica.as_mut().unwrap().kill();
    job.wait_traffic(1 << 20);
    let o = job.cluster(
        &["dump", "--job", "mesh", "--leave-running"],
        &job.targets(),
    );
    assert_fails_with(&o, "1 needed");
    for n in &job.nodes {
        assert!(alive(n.pid), "node {} died with the round", n.pid);
    }
    wait_until(
        Duration::from_secs(120),
        "the agents to abort the round",
        || !job.round_in_progress(),
    );
    job.replica.as_mut().unwrap().restart();
    for i in 0..HOSTS {
        assert_eq!(job.records(i), ["00000001"], "host {i}");
        assert_eq!(job.replica_records(i), ["00000001"], "host {i}");
    }
    job.wait_traffic(1 << 20);
    job.dump(&["--leave-running"]);
    // With --min-replicas 0, a round commits without the replica, which
    // gets that checkpoint with the next round's (its ancestor).
    job.flags
        .extend(["--min-replicas".to_string(), "0".to_string()]);
    for i in 0..HOSTS {
        job.agents[i].stop();
        job.agents[i] = job.start_agent(i, &[]);
    }
    job.replica.as_mut().unwrap().kill();
    job.wait_traffic(1 << 20);
    let r = job.dump(&["--leave-running", "--track"]);
    assert_eq!(r["round"], 3, "{r}");
    assert!(r.to_string().contains("failed"), "{r}");
    job.replica.as_mut().unwrap().restart();
    for i in 0..HOSTS {
        assert_eq!(job.records(i).len(), 3, "host {i}");
        assert_eq!(job.replica_records(i).len(), 2, "host {i}");
    }
    job.wait_traffic(1 << 20);
    let r = job.dump(&["--leave-running", "--track"]);
    assert_eq!(r["round"], 4, "{r}");
    let parents: Vec<&serde_json::Value> = r["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["reports"].as_array().unwrap().iter())
        .map(|t| &t["parent"])
        .collect();
    assert!(parents.iter().all(|p| **p == 3), "incremental: {r}");
    job.kill_all();
    let all: Vec<String> = (1..=4).map(|n| format!("{n:08}")).collect();
    for i in 0..HOSTS {
        assert_eq!(job.records(i), all, "host {i}");
        assert_eq!(job.replica_records(i), all, "host {i}");
    }
    job.server.kill();
    for i in 0..HOSTS {
        job.agents[i].stop();
        std::fs::remove_dir_all(job.local(i)).unwrap();
        job.agents[i] = job.start_agent(i, &[]);
    }
    assert_eq!(job.complete(), serde_json::json!([1, 2, 3, 4]));
    job.restore_and_finish(&[], 4);
}

/// What an agent would not use is refused, not ignored: a key or a
/// replica with a local directory (its checkpoints would not be encrypted,
/// or not replicated), more replicas required than given.
#[test]
fn an_agent_refuses_a_key_for_a_directory_and_replicas() {
    let d = tempfile::tempdir().unwrap();
    let tf = token_file(d.path(), TOKEN);
    let key = d.path().join("key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let agent = |pre: &[&str], dir: &str| {
        stasis()
            .args(pre)
            .args(["agent", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(&tf)
            .args(["-D", dir])
            .output()
            .unwrap()
    };
    let dir = d.path().join("agent").display().to_string();
    let o = agent(&["--encrypt-key-file", &key.display().to_string()], &dir);
    assert_fails_with(&o, "--encrypt-key-file applies to s3:// stores");
    let o = agent(&["--replica", "s3://ckpts/r"], &dir);
    assert_fails_with(&o, "--replica applies to s3:// stores");
    let o = agent(
        &["--replica", "s3://ckpts/r", "--min-replicas", "2"],
        "s3://ckpts/p",
    );
    assert_fails_with(&o, "--min-replicas 2 with 1 replica(s)");
}

/// SIGKILL the coordinator or an agent (in turn) at a random instant of a
/// round, eight times (`STASIS_TEST_RUNS=N` for more), the store holding
/// every checkpoint: the job runs on, a killed agent started again serves
/// the next round, and the complete rounds grow by at most one each time
/// (a round is committed in the store by every host or, as far as a
/// restore can see, by none). At the end the job is killed and restored
/// from the newest complete round, and passes its checks.
#[test]
fn rounds_killed_at_random_leave_the_store_restorable() {
    let mut job = Job::start("s3r", &[], &[]);
    job.dump(&["--leave-running"]); // a first cut to fall back on
    let runs: u64 = std::env::var("STASIS_TEST_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8);
    let mut rng = Rng(0x5eed_5300 ^ u64::from(std::process::id()));
    for run in 0..runs {
        let host = usize::try_from(rng.below(HOSTS as u64)).unwrap();
        let delay = Duration::from_millis(rng.below(1500));
        let before = job.complete().as_array().unwrap().len();
        let extra: &[&str] = if run % 2 == 0 {
            &["--leave-running", "--concurrent"]
        } else {
            &["--leave-running"]
        };
        let mut c = stasis_in(Some(&job.hosts.hosts[0]));
        c.args(["cluster", "dump", "--job", "mesh"])
            .args(extra)
            .args(job.targets())
            .arg("--token-file")
            .arg(&job.tf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut coord = c.spawn().expect("stasis cluster dump");
        std::thread::sleep(delay); // a random instant, not a wait for a condition
        let what = if run % 2 == 0 {
            let _ = coord.kill();
            "the coordinator".to_string()
        } else {
            job.agents[host].kill();
            format!("agent {host}")
        };
        let st = coord.wait().unwrap();
        if run % 2 == 1 {
            job.agents[host] = job.start_agent(host, &[]);
        }
        let complete: Vec<u64> = serde_json::from_value(job.complete()).unwrap();
        eprintln!("run {run}: killed {what} after {delay:?}; coordinator {st}; complete rounds {complete:?}");
        assert!(
            complete.len() >= before && complete.len() <= before + 1,
            "complete rounds went from {before} to {complete:?}"
        );
        job.wait_traffic(1 << 20);
    }
    let complete: Vec<u64> = serde_json::from_value(job.complete()).unwrap();
    let newest = *complete.last().unwrap();
    job.kill_all();
    job.restore_and_finish(&[], newest);
}

/// `ballast PIDFILE MIB`: MIB MiB of a fixed pseudo-random pattern
/// (incompressible, the same in every run) at a 1 MiB-aligned address,
/// so that two processes hold it in the same chunks; on SIGTERM it checks
/// every byte and prints PASS (exit 0) or FAIL (exit 1).
const BALLAST_C: &str = r#"
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t word(uint64_t i) {
	uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x42414c4c41535421ull;
	x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
	return x;
}

int main(int argc, char **argv) {
	size_t mib = 1 << 20, n = ((size_t)atoi(argv[2]) << 20) / 8, bad = 0;
	char tmp[4096];
	char *raw = mmap(NULL, n * 8 + mib, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return 2;
	uint64_t *buf = (uint64_t *)(((uintptr_t)raw + mib - 1) & ~(uintptr_t)(mib - 1));
	for (size_t k = 0; k < n; k++)
		buf[k] = word(k);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
	FILE *f = fopen(tmp, "w");
	fprintf(f, "%d\n", getpid());
	fclose(f);
	rename(tmp, argv[1]);
	int sig;
	sigwait(&set, &sig);
	for (size_t k = 0; k < n; k++)
		bad += buf[k] != word(k);
	printf("%s: %zu of %zu words differ\n", bad ? "FAIL" : "PASS", bad, n);
	return bad != 0;
}
"#;

/// Bytes of the files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// The chunks shared by the trees of a job (one per host, each holding
/// the same 40 MiB): the first round stores them once (the server's
/// directory grows by one copy; the trees' stores hold records only).
/// Three rounds later, gc of host 0's tree (`--keep 1`, sweep age 0)
/// deletes its older checkpoints and the chunks only they named, and
/// host 1's whole chain still reads; gc of the job's prefix then collects
/// both trees. Killed, the job is restored from the newest round, and
/// each process finds its 40 MiB intact.
#[test]
fn the_trees_of_a_job_share_their_chunks_and_gc_of_one_keeps_the_others() {
    const MIB: u64 = 40;
    let mut job = Job::start_agents("s3c", &[], &[]);
    let src = job.d.path().join("ballast.c");
    std::fs::write(&src, BALLAST_C).unwrap();
    let bin = job.d.path().join("ballast");
    let o = std::process::Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert_ok(&o, "cc ballast.c");
    let mut procs = Vec::new();
    for i in 0..HOSTS {
        let dir = job.d.path().join(format!("b{i}"));
        std::fs::create_dir(&dir).unwrap();
        let out = std::fs::File::create(dir.join("out.log")).unwrap();
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &job.hosts.hosts[i]])
            .arg(&bin)
            .arg(dir.join("pid"))
            .arg(MIB.to_string())
            .current_dir(&dir)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        close_inherited_fds(&mut c);
        let child = c.spawn().unwrap();
        let pid = wait_pidfile(&dir.join("pid"), Duration::from_secs(60));
        assert_eq!(pid, child.id() as i32);
        procs.push((pid, dir, child, KillOnDrop(pid)));
    }
    let pids: Vec<i32> = procs.iter().map(|p| p.0).collect();
    let targets = target_args(&job.agents, &pids);
    let store = job.server.bucket_dir().join(PREFIX);
    let round = |job: &Job| {
        let o = job.cluster(&["dump", "--job", "ballast", "--leave-running"], &targets);
        assert_ok(&o, "cluster dump of the ballast");
        json(&o)
    };
    let before = bytes_under(&store);
    let r = round(&job);
    let grown = bytes_under(&store) - before;
    let plain: u64 = r["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["reports"].as_array().unwrap().iter())
        .map(|t| t["stored"]["plain_bytes"].as_u64().unwrap())
        .sum();
    eprintln!("the store grew by {grown} bytes for {plain} plain bytes in two trees");
    assert!(plain >= 2 * (MIB << 20), "{r}");
    assert!(grown > MIB << 20, "{grown}");
    assert!(
        grown < (MIB << 20) * 5 / 4,
        "the store grew by {grown} bytes: the trees' shared pages were not stored once"
    );
    let tree = |i: usize| store.join(format!("h{i}/jobs/ballast/{}", pids[i]));
    for i in 0..HOSTS {
        assert!(!tree(i).join("chunks").exists(), "host {i}");
    }
    round(&job);
    round(&job);
    let records = |i: usize| {
        let mut v: Vec<String> = std::fs::read_dir(tree(i).join("commits"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    for i in 0..HOSTS {
        assert_eq!(records(i), ["00000001", "00000002", "00000003"], "host {i}");
    }
    let gc = |url: &str| {
        let staging = job.d.path().join("gc-staging");
        let o = stasis_in(Some(&job.hosts.hosts[0]))
            .envs(job.server.env(&staging))
            .env("STASIS_S3_SWEEP_AGE", "0")
            .args(["gc", "-D", url, "--keep", "1", "--json"])
            .output()
            .unwrap();
        assert_ok(&o, &format!("gc of {url}"));
        json(&o)
    };
    let url = |i: usize| format!("{}/h{i}/jobs/ballast/{}", job.server.url(PREFIX), pids[i]);
    let g = gc(&url(0));
    assert!(g["swept"]["chunks"].as_u64().unwrap() > 0, "{g}");
    assert_eq!(records(0), ["00000003"]);
    assert_eq!(records(1), ["00000001", "00000002", "00000003"]);
    // Host 1's chain, every chunk of it read and checked.
    let staging = job.d.path().join("inspect-staging");
    let o = stasis_in(Some(&job.hosts.hosts[1]))
        .envs(job.server.env(&staging))
        .args(["inspect", "-D", &url(1)])
        .output()
        .unwrap();
    assert_ok(&o, "inspect of host 1's tree after gc of host 0's");
    // The job's prefix: every tree, each keeping its newest.
    let g = gc(&format!("{}/h1/jobs/ballast", job.server.url(PREFIX)));
    assert_eq!(g["stores"].as_array().unwrap().len(), 1, "{g}");
    assert_eq!(records(1), ["00000003"]);
    let g = gc(&job.server.url(PREFIX));
    assert_eq!(g["stores"].as_array().unwrap().len(), HOSTS, "{g}");
    assert_eq!(job.complete_of("ballast"), serde_json::json!([3]));
    for (pid, _, child, _) in &mut procs {
        // SAFETY: killing a process this test started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
        let _ = child.wait();
    }
    let o = job.cluster(&["restore", "--job", "ballast"], &job.agent_targets());
    assert_ok(&o, "cluster restore of the ballast");
    assert_eq!(json(&o)["round"], 3);
    for (pid, dir, _, _) in &procs {
        // SAFETY: signalling a process this test restored.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
        // (Restored by an agent: reaped here only if this test, the
        // subreaper, inherited it.)
        wait_until(Duration::from_secs(60), "a restored process to end", || {
            reap_if_ours(*pid);
            !alive(*pid)
        });
        let log = std::fs::read_to_string(dir.join("out.log")).unwrap();
        assert!(log.starts_with("PASS: 0 of"), "{log}");
    }
    for a in &mut job.agents {
        a.stop();
    }
}
