//! A tree in PID, mount, UTS, IPC and network namespaces of its own (as
//! `unshare --pid --fork --mount-proc --mount --uts --ipc --net` starts
//! it) comes back in new ones of the same shape: the `namespaces` workload
//! checks itself (PID 1, its children's PIDs, the host name, lo up, a
//! System V segment, message queue (messages with their types) and
//! semaphore set of its IPC namespace, its POSIX message queues (messages
//! byte for byte in priority order, attributes, owners, the fds on them,
//! in its own mqueue mount, left as they were by a `--leave-running`
//! dump), /proc listing only its
//! processes, a TCP listener and a loopback connection between two of its
//! processes with bytes queued, a unix socket pair, a tmpfs on /mnt with a
//! directory, a file and a link, the file and directory open, a unix
//! listener bound there). A tree in a time namespace of its own comes back
//! in a new one whose clocks go on from the dump. And the shapes stasis
//! cannot restore are refused before anything is stopped: the tree runs on
//! untouched.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const UNSHARE: [&str; 7] = [
    "--pid",
    "--fork",
    "--mount-proc",
    "--mount",
    "--uts",
    "--ipc",
    "--net",
];

/// The workload, PID 1 of its namespaces; `pid` is its PID as seen here.
struct NsTree {
    dir: tempfile::TempDir,
    /// `unshare`, the parent of the first instance (later ones are
    /// restored, reparented to this subreaper test process).
    unshare: Option<Child>,
    pid: i32,
}

impl NsTree {
    fn start() -> NsTree {
        Self::start_in(None)
    }

    /// Started in the cgroup (v2) directory `cgroup`, if given.
    fn start_in(cgroup: Option<&std::path::Path>) -> NsTree {
        Self::start_with(cgroup, &[])
    }

    /// [`NsTree::start_in`] with more `unshare` flags.
    fn start_with(cgroup: Option<&std::path::Path>, more: &[&str]) -> NsTree {
        let bin = workloads().join("namespaces");
        let dir = tempfile::Builder::new()
            .prefix("stasis-namespaces-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        let pidfile = dir.path().join("pid");
        // The workload's output goes to out.log, unshare's (it complains
        // when its child is killed) elsewhere.
        let mut c = match cgroup {
            Some(cg) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg("echo $$ >\"$0/cgroup.procs\" && exec unshare \"$@\"")
                    .arg(cg);
                c
            }
            None => Command::new("unshare"),
        };
        c.args(UNSHARE)
            .args(more)
            .args(["sh", "-c", "exec \"$0\" \"$1\" >\"$2\" 2>&1"])
            .arg(&bin)
            .arg(&pidfile)
            .arg(dir.path().join("out.log"))
            .current_dir(dir.path().join("work"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        close_inherited_fds(&mut c);
        let child = c.spawn().expect("starting unshare");
        let inside = wait_pidfile(&pidfile, Duration::from_secs(30));
        assert_eq!(inside, 1, "the workload's PID in its namespace");
        let up = child.id() as i32;
        let mut pid = 0;
        // (`sh` exec'd unshare: same process.)
        wait_until(Duration::from_secs(10), "unshare's child", || {
            pid = my_children_of(up).first().copied().unwrap_or(0);
            pid > 0
        });
        NsTree {
            dir,
            unshare: Some(child),
            pid,
        }
    }

    fn images(&self) -> PathBuf {
        self.dir.path().join("images")
    }

    fn out(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out.log")).unwrap_or_default()
    }

    fn dump(&self, extra: &[&str]) -> std::process::Output {
        stasis()
            .args(["dump", "-t", &self.pid.to_string(), "-D"])
            .arg(self.images())
            .args(extra)
            .output()
            .expect("running stasis dump")
    }

    /// Waits for the root: (exit code, signal). The first one's status
    /// comes through unshare (which exits with it, or 128+signal).
    fn reap(&mut self) -> (Option<i32>, Option<i32>) {
        if let Some(mut c) = self.unshare.take() {
            let st = c.wait().expect("wait unshare");
            return match st.code() {
                Some(c) if c > 128 => (None, Some(c - 128)),
                c => (c, None),
            };
        }
        waitpid_timeout(self.pid, Duration::from_secs(60))
    }

    /// `restore --detach`: the new root, PID 1 of new namespaces.
    fn restore(&mut self, extra: &[&str]) {
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(self.images())
            .args(extra)
            .output()
            .expect("running stasis restore");
        assert_ok(&o, "restore of the namespaces workload");
        let j = json(&o);
        assert_eq!(j["pid_in_namespace"], 1, "{j}");
        assert_eq!(j["init_pid"], serde_json::Value::Null, "{j}");
        self.pid = i32::try_from(j["pid"].as_i64().expect("pid")).expect("pid");
        assert!(alive(self.pid), "restored root {} is not running", self.pid);
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
        assert!(nspid.ends_with("\t1"), "{nspid}");
        // In namespaces other than ours.
        for k in ["pid", "mnt", "uts", "ipc", "net"] {
            let theirs = std::fs::read_link(format!("/proc/{}/ns/{k}", self.pid)).unwrap();
            let ours = std::fs::read_link(format!("/proc/self/ns/{k}")).unwrap();
            assert_ne!(theirs, ours, "the restored tree is in our {k} namespace");
        }
    }

    fn finish_pass(&mut self) {
        // SAFETY: signalling our workload.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let (code, sig) = self.reap();
        let out = self.out();
        assert_eq!((code, sig), (Some(0), None), "output:\n{out}");
        assert_eq!(out.lines().last(), Some("PASS"), "output:\n{out}");
    }
}

impl Drop for NsTree {
    fn drop(&mut self) {
        if alive(self.pid) {
            // SAFETY: killing our own workload after a failed test (PID 1
            // of its namespace: the others die with it).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.reap();
        }
    }
}

/// The children of `pid` (one of ours).
fn my_children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Dump (kill) and restore twice, `extra` given to each restore.
fn twice(extra: &[&str]) {
    let mut t = NsTree::start();
    for round in 1..=2 {
        let o = t.dump(&[]);
        assert_ok(&o, &format!("dump round {round}"));
        let first = t.unshare.is_some();
        let st = t.reap();
        // unshare says 1 when its child is killed.
        if !first {
            assert_eq!(st, (None, Some(libc::SIGKILL)), "round {round}");
        }
        assert!(!alive(t.pid), "round {round}: the dumped root lives on");
        t.restore(extra);
    }
    t.finish_pass();
}

/// Where the cgroup2 file system is mounted here, if it is.
fn cgroup2_mount() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (a, b) = l.split_once(" - ")?;
        (b.split_whitespace().next() == Some("cgroup2"))
            .then(|| a.split_whitespace().nth(4).map(str::to_string))
            .flatten()
    })
}

/// Dumps the tree of `pid` (killed: a dump is the default) and restores it
/// detached, `rounds` times, calling `check(pid, round)` on each restored
/// tree; returns the last one's PID.
fn dump_and_restore_detached(mut pid: i32, rounds: u32, check: impl Fn(i32, u32)) -> i32 {
    let img = tempfile::tempdir().unwrap();
    for round in 1..=rounds {
        let o = stasis()
            .args(["dump", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        if round > 1 {
            waitpid_timeout(pid, Duration::from_secs(30));
        }
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
        check(pid, round);
    }
    pid
}

#[test]
fn twice_plain() {
    twice(&[]);
}

/// The cgroup (v2) path of `pid`.
fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

/// A tree in a cgroup of its own comes back in it (not in the
/// restorer's), every process of it.
/// A tree in a cgroup namespace of its own (rooted at its cgroup, as a
/// container runtime makes it): restored in its cgroup, in a new cgroup
/// namespace rooted there (it sees itself at `/`), twice.
#[test]
fn twice_keeps_a_cgroup_namespace() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 file system mounted");
        return;
    };
    let name = format!("stasis-cgns-test-{}", std::process::id());
    let dir = std::path::Path::new(&mount).join(&name);
    std::fs::create_dir(&dir).expect("making a test cgroup");
    let want = format!("/{name}");
    let ns_of = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/cgroup")).unwrap();
    // Its cgroup (v2) as seen from inside its cgroup namespace.
    let inside = cgroup_inside;
    {
        let mut t = NsTree::start_with(Some(&dir), &["--cgroup"]);
        assert_eq!(cgroup_of(t.pid), want);
        assert_eq!(inside(t.pid), "0::/");
        let mine = ns_of(std::process::id() as i32);
        for round in 1..=2 {
            assert_ok(&t.dump(&[]), &format!("dump round {round}"));
            t.reap();
            t.restore(&[]);
            for p in std::iter::once(t.pid).chain(descendants(t.pid)) {
                assert_eq!(cgroup_of(p), want, "round {round}: process {p}");
                assert_ne!(
                    ns_of(p),
                    mine,
                    "round {round}: process {p} in our cgroup namespace"
                );
                assert_eq!(inside(p), "0::/", "round {round}: process {p}");
            }
        }
        t.finish_pass();
    }
    let _ = std::fs::remove_dir(&dir);
}

/// Cgroups (v2) made by a test under a unique one of its own, removed
/// (children first) when it ends, also when it fails midway.
struct TestCgroups {
    top: PathBuf,
    /// Relative to `top`, parents first.
    made: Vec<String>,
}

/// Process `p`'s cgroup (v2) line as seen from inside its cgroup
/// namespace.
fn cgroup_inside(p: i32) -> String {
    let o = Command::new("nsenter")
        .args(["-t", &p.to_string(), "--cgroup", "cat"])
        .arg(format!("/proc/{p}/cgroup"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with("0::"))
        .unwrap_or_default()
        .to_string()
}

impl TestCgroups {
    /// A test cgroup `stasis-TAG-test-PID` under the cgroup2 mount here;
    /// `None` (the test is skipped, and says so) without one.
    fn here(tag: &str) -> Option<TestCgroups> {
        let Some(mount) = cgroup2_mount() else {
            eprintln!("skipped: no cgroup2 file system mounted");
            return None;
        };
        let name = format!("stasis-{tag}-test-{}", std::process::id());
        Some(TestCgroups::new(&mount, &name))
    }

    /// Its name (under the cgroup2 root).
    fn name(&self) -> String {
        self.top
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn new(mount: &str, name: &str) -> TestCgroups {
        let top = std::path::Path::new(mount).join(name);
        std::fs::create_dir(&top).expect("making a test cgroup");
        TestCgroups {
            top,
            made: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.top.clone()
        } else {
            self.top.join(rel)
        }
    }

    fn make(&mut self, rel: &str) {
        std::fs::create_dir(self.path(rel)).expect("making a test cgroup");
        self.made.push(rel.into());
    }

    fn read(&self, rel: &str, file: &str) -> String {
        std::fs::read_to_string(self.path(rel).join(file))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    fn write(&self, rel: &str, file: &str, value: &str) {
        std::fs::write(self.path(rel).join(file), value)
            .unwrap_or_else(|e| panic!("writing {value} to {rel}/{file}: {e}"));
    }

    fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Removes the cgroups below the top one (children first).
    fn remove_below(&self) {
        for rel in self.made.iter().rev() {
            let p = self.path(rel);
            if p.exists() {
                std::fs::remove_dir(&p).unwrap_or_else(|e| panic!("removing {rel}: {e}"));
            }
        }
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for rel in self.made.iter().rev() {
            let _ = std::fs::remove_dir(self.path(rel));
        }
        let _ = std::fs::remove_dir(&self.top);
    }
}

/// A limit the cgroup2 here can set on a child cgroup: a controller of
/// its root and one of its files (pids where it is, else hugetlb, as on a
/// host whose other controllers are cgroup v1's).
fn a_cgroup_limit(mount: &str) -> Option<(&'static str, &'static str, &'static str)> {
    let root = std::fs::read_to_string(std::path::Path::new(mount).join("cgroup.controllers"))
        .unwrap_or_default();
    let has = |c: &str| root.split_whitespace().any(|x| x == c);
    if has("pids") {
        Some(("pids", "pids.max", "7"))
    } else if has("hugetlb") {
        Some(("hugetlb", "hugetlb.2MB.max", "4194304"))
    } else {
        None
    }
}

/// Controller `ctrl` enabled at the root of the cgroup2 at `mount` while
/// it lives, disabled again if it was not.
struct RootController(Option<(PathBuf, String)>);

impl RootController {
    fn enable(mount: &str, ctrl: &str) -> RootController {
        let file = std::path::Path::new(mount).join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&file).unwrap_or_default();
        if on.split_whitespace().any(|c| c == ctrl) {
            return RootController(None);
        }
        std::fs::write(&file, format!("+{ctrl}"))
            .unwrap_or_else(|e| panic!("enabling {ctrl} at the cgroup2 root: {e}"));
        RootController(Some((file, ctrl.to_string())))
    }
}

impl Drop for RootController {
    fn drop(&mut self) {
        if let Some((file, ctrl)) = &self.0 {
            let _ = std::fs::write(file, format!("-{ctrl}"));
        }
    }
}

/// A tree (the `tree` workload: a root, its children A and B, A's child
/// C, a zombie) whose processes are in three cgroups of a test cgroup T:
/// the root in T/r, A and C in T/r/a (a child cgroup of the root's), B in
/// T/b with a limit (`pids.max`, or `hugetlb.2MB.max` where pids is not a
/// cgroup2 controller). Dumped (killed), its cgroups removed, restored:
/// every process in its cgroup again, the cgroups made again with the
/// controller enabled in T and the limit; dumped and restored again with
/// the cgroups still there, B's limit changed meanwhile: kept as it is. A
/// restore that fails (the root's cgroup has a controller enabled for
/// its children: no process may join it) removes the cgroups it made.
/// The workload checks itself at the end.
#[test]
fn processes_in_several_cgroups_come_back_in_theirs() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 file system mounted");
        return;
    };
    let Some((ctrl, limit, value)) = a_cgroup_limit(&mount) else {
        eprintln!("skipped: no pids nor hugetlb controller in the cgroup2 here");
        return;
    };
    let _root_ctrl = RootController::enable(&mount, ctrl);
    let name = format!("stasis-cgroups-test-{}", std::process::id());
    let mut cg = TestCgroups::new(&mount, &name);
    cg.write("", "cgroup.subtree_control", &format!("+{ctrl}"));
    for rel in ["r", "r/a", "b"] {
        cg.make(rel);
    }
    cg.write("b", limit, value);
    let mut w = Workload::start("tree", &[]);
    let root = w.pid;
    let kids = my_children_of(root);
    let state = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.to_string()))
            .unwrap_or_default()
    };
    let live: Vec<i32> = kids
        .into_iter()
        .filter(|&p| !state(p).starts_with('Z'))
        .collect();
    // A leads its own group; B joined it.
    let pgid = |p: i32| state(p).split_whitespace().nth(2).unwrap_or("").to_string();
    let a = *live.iter().find(|&&p| pgid(p) == p.to_string()).expect("A");
    let b = *live.iter().find(|&&p| p != a).expect("B");
    let c = *my_children_of(a).first().expect("C");
    let rel = |p: i32| {
        if p == root {
            "r"
        } else if p == b {
            "b"
        } else {
            "r/a"
        }
    };
    let want = |p: i32| format!("/{name}/{}", rel(p));
    for p in [root, a, c, b] {
        cg.write(rel(p), "cgroup.procs", &p.to_string());
    }
    let check = |round: &str| {
        for p in [root, a, c, b] {
            assert_eq!(cgroup_of(p), want(p), "{round}: process {p}");
        }
    };
    check("before the dump");

    // 1: the cgroups are gone (T's controller too): made again.
    w.dump_and_reap();
    cg.remove_below();
    cg.write("", "cgroup.subtree_control", &format!("-{ctrl}"));
    w.restore(&[]);
    check("restored into removed cgroups");
    assert_eq!(cg.read("b", limit), value, "the made cgroup's {limit}");
    let on = cg.read("", "cgroup.subtree_control");
    assert!(on.split_whitespace().any(|c| c == ctrl), "T enables {on:?}");

    // 2: they exist, B's limit changed: kept.
    w.dump_and_reap();
    let other = if ctrl == "pids" { "9" } else { "6291456" };
    cg.write("b", limit, other);
    w.restore(&[]);
    check("restored into existing cgroups");
    assert_eq!(cg.read("b", limit), other, "an existing cgroup's {limit}");

    // 3: a restore that fails removes what it made (T/r/a, T/b), not
    // what was there (T/r).
    w.dump_and_reap();
    for rel in ["r/a", "b"] {
        std::fs::remove_dir(cg.path(rel)).unwrap();
    }
    cg.write("r", "cgroup.subtree_control", &format!("+{ctrl}"));
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_fails_with(&o, "cgroup");
    assert!(!alive(root), "the failed restore left the root running");
    assert!(
        !cg.exists("r/a") && !cg.exists("b"),
        "cgroups left by the failed restore"
    );
    assert!(cg.exists("r"));
    cg.write("r", "cgroup.subtree_control", &format!("-{ctrl}"));
    w.restore(&[]);
    check("restored after a failed restore");
    w.finish_pass();
}

/// A container-like tree (PID, mount, UTS, IPC, network and cgroup
/// namespaces of its own, rooted at its cgroup D) with one of its
/// processes in a child cgroup D/sub: restored twice, each process in its
/// cgroup, D/sub made again when it was removed, and the tree sees the
/// same from inside (`/` and `/sub`).
#[test]
fn a_cgroup_namespace_with_a_child_cgroup() {
    let Some(mut cg) = TestCgroups::here("cgns-sub") else {
        return;
    };
    let name = cg.name();
    let inside = cgroup_inside;
    let mut t = NsTree::start_with(Some(&cg.path("")), &["--cgroup"]);
    // Its PID in the namespace (the same after a restore).
    let nspid = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last().map(str::to_string))
            .unwrap_or_default()
    };
    let child = *descendants(t.pid)
        .last()
        .expect("a child of the namespaces workload");
    let moved = nspid(child);
    assert_ne!(moved, "1");
    cg.make("sub");
    cg.write("sub", "cgroup.procs", &child.to_string());
    let check = |root: i32, round: u32| {
        let all: Vec<i32> = std::iter::once(root).chain(descendants(root)).collect();
        assert!(
            all.iter().any(|&p| nspid(p) == moved),
            "round {round}: {moved} is gone"
        );
        for p in all {
            let (out, ins) = if nspid(p) == moved {
                (format!("/{name}/sub"), "0::/sub")
            } else {
                (format!("/{name}"), "0::/")
            };
            assert_eq!(cgroup_of(p), out, "round {round}: process {p}");
            assert_eq!(inside(p), ins, "round {round}: process {p} from inside");
        }
    };
    check(t.pid, 0);
    for round in 1..=2 {
        assert_ok(&t.dump(&[]), &format!("dump round {round}"));
        t.reap();
        if round == 1 {
            std::fs::remove_dir(cg.path("sub")).unwrap();
        }
        t.restore(&[]);
        check(t.pid, round);
    }
    t.finish_pass();
}

/// A container's cgroup2: a tree in a cgroup namespace of its own (rooted
/// at its cgroup D) with cgroup2 mounted read-only on /sys/fs/cgroup from
/// inside it (and its mount namespace), as Docker makes it: restored twice (D removed before the
/// first restore), the mount made again rooted at D with its flags, and
/// the tree reads the same there (its own PIDs in `cgroup.procs`).
#[test]
fn a_container_cgroup2_mount_comes_back() {
    let Some(cg) = TestCgroups::here("cg2mount") else {
        return;
    };
    let name = cg.name();
    let mut t = NsTree::start_with(Some(&cg.path("")), &["--cgroup"]);
    // (From outside its PID namespace: the workload counts its PIDs.)
    let o = Command::new("nsenter")
        .args(["-t", &t.pid.to_string(), "--mount", "--cgroup"])
        .args(["mount", "-t", "cgroup2", "-o", "ro,nosuid,nodev"])
        .args(["none", "/sys/fs/cgroup"])
        .output()
        .unwrap();
    assert_ok(&o, "mounting a cgroup2 in the tree's namespaces");
    // The mount as we see it (its root, flags, type) and what the tree
    // reads there.
    let seen = |p: i32| {
        let info = std::fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap();
        let line = info
            .lines()
            .rfind(|l| l.split_whitespace().nth(4) == Some("/sys/fs/cgroup"))
            .map(str::to_string);
        let o = Command::new("nsenter")
            .args(["-t", &p.to_string(), "--mount", "--cgroup", "--pid", "cat"])
            .args(["/sys/fs/cgroup/cgroup.procs", "/proc/self/cgroup"])
            .output()
            .unwrap();
        (line, String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let check = |p: i32, round: u32| {
        let (line, read) = seen(p);
        let line = line.unwrap_or_else(|| panic!("round {round}: no mount on /sys/fs/cgroup"));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[3], format!("/{name}"), "round {round}: {line}");
        for flag in ["ro", "nosuid", "nodev"] {
            assert!(
                f[5].split(',').any(|o| o == flag),
                "round {round}: {flag} lost: {line}"
            );
        }
        // Mounted anew (source `none`), not bound from the restorer's.
        assert!(line.contains(" - cgroup2 none "), "round {round}: {line}");
        // Its processes (in-namespace PIDs: the workload and its
        // children; 0 for the first one's unshare, outside its PID
        // namespace), then nsenter's cat's cgroup, outside its cgroup
        // namespace.
        let mut lines: Vec<&str> = read.lines().collect();
        let me = lines.pop().unwrap_or_default().to_string();
        assert!(me.starts_with("0::/.."), "round {round}: {read}");
        let mut pids: Vec<i32> = lines
            .iter()
            .filter_map(|l| l.parse().ok())
            .filter(|&p| p > 0)
            .collect();
        pids.sort_unstable();
        assert!(pids.contains(&1), "round {round}: {read}");
        assert_eq!(
            pids.len(),
            1 + descendants(p).len(),
            "round {round}: {read}"
        );
        pids
    };
    let before = check(t.pid, 0);
    for round in 1..=2 {
        assert_ok(&t.dump(&[]), &format!("dump round {round}"));
        t.reap();
        if round == 1 {
            std::fs::remove_dir(cg.path("")).unwrap();
        }
        t.restore(&[]);
        assert_eq!(
            check(t.pid, round),
            before,
            "round {round}: cgroup.procs inside"
        );
    }
    t.finish_pass();
}

/// A tree whose only namespace of its own is a cgroup namespace (rooted
/// at its cgroup): restored in it, in a new cgroup namespace rooted there,
/// twice (it was restored in the restorer's cgroup and namespace).
#[test]
fn twice_keeps_a_lone_cgroup_namespace() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 file system mounted");
        return;
    };
    // The restored sleep comes back to us.
    become_subreaper();
    let name = format!("stasis-lone-cgns-test-{}", std::process::id());
    let cg = TestCgroups::new(&mount, &name);
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ >\"$0/cgroup.procs\" && exec unshare --cgroup sleep 1000")
        .arg(cg.path(""))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = Some(c.spawn().expect("starting unshare"));
    let pid = child.as_ref().map_or(0, |c| c.id() as i32);
    let _kill = KillOnDrop(pid);
    wait_until(
        Duration::from_secs(10),
        "sleep in its cgroup namespace",
        || cmdline_of(pid).trim() == "sleep 1000",
    );
    let mine = std::fs::read_link("/proc/self/ns/cgroup").unwrap();
    let check = |round: u32| {
        assert_eq!(cgroup_of(pid), format!("/{name}"), "round {round}");
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/cgroup")).unwrap();
        assert_ne!(theirs, mine, "round {round}: in our cgroup namespace");
        let o = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "--cgroup", "cat"])
            .arg(format!("/proc/{pid}/cgroup"))
            .output()
            .unwrap();
        let inside = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            inside.lines().any(|l| l == "0::/"),
            "round {round}: {inside}"
        );
    };
    check(0);
    let img = tempfile::tempdir().unwrap();
    for round in 1..=2 {
        let o = stasis()
            .args(["dump", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        // The first is our child, the next one a restored orphan.
        match child.take() {
            Some(mut c) => drop(c.wait()),
            None => drop(waitpid_timeout(pid, Duration::from_secs(30))),
        }
        let o = stasis()
            .args(["restore", "--detach", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        check(round);
    }
}

#[test]
fn twice_keeps_the_cgroup() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 file system mounted");
        return;
    };
    let name = format!("stasis-ns-test-{}", std::process::id());
    let dir = std::path::Path::new(&mount).join(&name);
    std::fs::create_dir(&dir).expect("making a test cgroup");
    let want = format!("/{name}");
    assert_ne!(cgroup_of(std::process::id() as i32), want);
    {
        let mut t = NsTree::start_in(Some(&dir));
        assert_eq!(cgroup_of(t.pid), want);
        for round in 1..=2 {
            assert_ok(&t.dump(&[]), &format!("dump round {round}"));
            t.reap();
            t.restore(&[]);
            for p in std::iter::once(t.pid).chain(descendants(t.pid)) {
                assert_eq!(cgroup_of(p), want, "round {round}: process {p}");
            }
        }
        t.finish_pass();
    }
    let _ = std::fs::remove_dir(&dir);
}

#[test]
fn twice_lazy() {
    let stats = tempfile::NamedTempFile::new().unwrap();
    let path = stats.path().to_str().unwrap().to_string();
    twice(&["--lazy", "--lazy-stats", &path]);
    let s = wait_json_file(stats.path(), Duration::from_secs(60));
    assert!(s.get("error").is_none(), "filler failed: {s}");
}

/// `--leave-running` (with `flags`): the tree carries on and passes; the
/// image restores into new namespaces and passes too.
fn leave_running(flags: &[&str]) {
    let mut t = NsTree::start();
    let mut args = vec!["--leave-running"];
    args.extend_from_slice(flags);
    assert_ok(&t.dump(&args), "dump --leave-running");
    assert!(alive(t.pid), "--leave-running killed the tree");
    t.finish_pass();
    // The workload printed nothing before the dump: its output file is
    // put back as it was then.
    std::fs::write(t.dir.path().join("out.log"), b"").unwrap();
    t.restore(&[]);
    t.finish_pass();
}

#[test]
fn leave_running_plain() {
    leave_running(&[]);
}

#[test]
fn leave_running_concurrent() {
    leave_running(&["--concurrent"]);
}

// ---- refusals: the tree runs on untouched ----

/// A tree started by `cmd`; its root is `unshare`'s child (`fork`), or
/// `unshare` itself, or found by `pick` among the descendants.
struct Refused {
    unshare: Child,
}

impl Refused {
    /// Spawns `c` (an `unshare` command with its arguments) with no stdio
    /// and no inherited fds.
    fn spawn(c: &mut Command) -> Refused {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        close_inherited_fds(c);
        Refused {
            unshare: c.spawn().expect("starting unshare"),
        }
    }

    /// The tree's `sleep 1000` (its set-up done), waited for up to `secs`.
    fn sleeper(&self, secs: u64) -> i32 {
        let up = self.unshare.id() as i32;
        let mut pid = 0;
        wait_until(Duration::from_secs(secs), "the tree to be set up", || {
            pid = child_running(up, "sleep 1000").unwrap_or(0);
            pid > 0
        });
        pid
    }
}

impl Drop for Refused {
    fn drop(&mut self) {
        let pid = self.unshare.id() as i32;
        for p in descendants(pid) {
            // SAFETY: killing the processes this test started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// Starts `unshare ARGS`, waits until `ready` names the process to dump,
/// and checks that the dump fails with `needle` and leaves every process
/// of the tree running, untraced and unstopped.
fn refused(args: &[&str], ready: impl Fn(i32) -> Option<i32>, needle: &str) {
    let r = Refused::spawn(Command::new("unshare").args(args));
    let up = r.unshare.id() as i32;
    let mut target = 0;
    wait_until(Duration::from_secs(20), "the tree to be set up", || {
        target = ready(up).unwrap_or(0);
        target > 0
    });
    let before = descendants(up);
    let img = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["dump", "-t", &target.to_string(), "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_fails_with(&o, needle);
    for p in std::iter::once(up).chain(before) {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        assert!(alive(p), "process {p} died after a refused dump");
        assert_eq!(field("TracerPid:"), "0", "process {p} left traced");
        assert!(
            !field("State:").starts_with('T') && !field("State:").starts_with('t'),
            "process {p} left stopped: {}",
            field("State:")
        );
    }
}

/// The first child of `pid` whose command line is `cmd` (its arguments
/// joined by spaces).
fn child_running(pid: i32, cmd: &str) -> Option<i32> {
    descendants(pid)
        .into_iter()
        .find(|&p| cmdline_of(p).trim() == cmd)
}

/// A tree in a user namespace of its own (ids 0-65535 mapped to
/// 100000-165535, setgroups denied) owning its PID, mount and UTS
/// namespaces, running as uid and gid 1000 there, with a tmpfs file
/// owned by 5:6 there: restored in a new user namespace with the same maps,
/// the same credentials and owners, twice (checked from outside).
#[test]
fn twice_keeps_a_user_namespace() {
    use std::os::unix::fs::MetadataExt;
    workloads();
    // PID 1 of the new namespaces (root there) mounts its proc and a
    // tmpfs, then runs as 1000.
    let inner = "mount --make-rprivate / && mount -t proc proc /proc && \
        hostname stasis-userns && mount -t tmpfs -o mode=755 u /mnt && \
        echo hi >/mnt/f && chown 5:6 /mnt/f && \
        exec setpriv --reuid=1000 --regid=1000 --keep-groups sleep 1000";
    // unshare(1) would exec before the maps are written (and so lose
    // every capability there): a process that waits for them first.
    let creator = "import ctypes, os, sys, time\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        if libc.unshare(0x10000000 | 0x20000000 | 0x00020000 | 0x04000000):\n    \
            sys.exit('unshare: ' + os.strerror(ctypes.get_errno()))\n\
        while '100000' not in open('/proc/self/uid_map').read():\n    time.sleep(0.02)\n\
        os.setresgid(0, 0, 0)\nos.setresuid(0, 0, 0)\n\
        pid = os.fork()\n\
        if pid == 0:\n    os.execvp('sh', ['sh', '-c', sys.argv[1]])\n\
        os.waitpid(pid, 0)\n";
    let mut c = Command::new("python3");
    c.args(["-c", creator, inner])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let _r = Refused {
        unshare: c.spawn().expect("starting python3"),
    };
    let up = _r.unshare.id() as i32;
    wait_until(
        Duration::from_secs(10),
        "the creator's user namespace",
        || {
            std::fs::read_link(format!("/proc/{up}/ns/user")).ok()
                != std::fs::read_link("/proc/self/ns/user").ok()
        },
    );
    std::fs::write(format!("/proc/{up}/setgroups"), "deny").unwrap();
    std::fs::write(format!("/proc/{up}/uid_map"), "0 100000 65536").unwrap();
    std::fs::write(format!("/proc/{up}/gid_map"), "0 100000 65536").unwrap();
    let mut pid = 0;
    wait_until(Duration::from_secs(10), "the tree to be set up", || {
        pid = child_running(up, "sleep 1000").unwrap_or(0);
        pid > 0
    });
    let words = |f: String| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let check = |pid: i32, round: &str| {
        assert_eq!(
            words(format!("/proc/{pid}/uid_map")),
            "0 100000 65536",
            "{round}"
        );
        assert_eq!(
            words(format!("/proc/{pid}/gid_map")),
            "0 100000 65536",
            "{round}"
        );
        assert_eq!(words(format!("/proc/{pid}/setgroups")), "deny", "{round}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        for f in ["Uid:", "Gid:"] {
            let line = status.lines().find(|l| l.starts_with(f)).unwrap();
            assert_eq!(
                line.split_whitespace().skip(1).collect::<Vec<_>>(),
                ["101000"; 4],
                "{round}: {line}"
            );
        }
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap(),
            std::fs::read_link("/proc/self/ns/user").unwrap(),
            "{round}"
        );
        let f = std::fs::metadata(format!("/proc/{pid}/root/mnt/f")).unwrap();
        assert_eq!((f.uid(), f.gid()), (100005, 100006), "{round}");
        assert_eq!(
            std::fs::read(format!("/proc/{pid}/root/mnt/f")).unwrap(),
            b"hi\n"
        );
    };
    check(pid, "before");
    let pid = dump_and_restore_detached(pid, 2, |pid, round| {
        check(pid, &format!("round {round}"));
    });
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// A process in a user namespace without id maps (`unshare --user`, its
/// maps never written): restored twice in a new one without maps, its
/// ids the overflow ids inside it (its status read from a process that
/// entered it), its capabilities and its ids seen from here unchanged.
#[test]
fn twice_keeps_a_user_namespace_without_maps() {
    workloads();
    let r = Refused::spawn(Command::new("unshare").args(["--user", "sleep", "1000"]));
    let pid = r.unshare.id() as i32;
    wait_until(Duration::from_secs(10), "unshare to exec sleep", || {
        cmdline_of(pid).trim() == "sleep 1000"
    });
    let status = |p: i32, inside: bool| {
        let text = if inside {
            let o = Command::new("nsenter")
                .args([
                    "--preserve-credentials",
                    "--user",
                    "-t",
                    &p.to_string(),
                    "cat",
                ])
                .arg(format!("/proc/{p}/status"))
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
            String::from_utf8(o.stdout).unwrap()
        } else {
            std::fs::read_to_string(format!("/proc/{p}/status")).unwrap()
        };
        text.lines()
            .filter(|l| {
                [
                    "Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
    };
    let before = status(pid, false);
    let check = |p: i32, round: &str| {
        for f in ["uid_map", "gid_map"] {
            let map = std::fs::read_to_string(format!("/proc/{p}/{f}")).unwrap();
            assert_eq!(map, "", "{round}: {f}");
        }
        assert_ne!(
            std::fs::read_link(format!("/proc/{p}/ns/user")).unwrap(),
            std::fs::read_link("/proc/self/ns/user").unwrap(),
            "{round}"
        );
        let inside = status(p, true);
        assert_eq!(
            inside[0], "Uid: 65534 65534 65534 65534",
            "{round}: {inside:?}"
        );
        assert_eq!(
            inside[1], "Gid: 65534 65534 65534 65534",
            "{round}: {inside:?}"
        );
        assert_eq!(status(p, false), before, "{round}");
    };
    check(pid, "before");
    let mut r = r;
    let img = tempfile::tempdir().unwrap();
    let mut pid = pid;
    let mut restored = KillOnDrop(0);
    for round in 1..=2 {
        let o = stasis()
            .args(["dump", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        // (unshare exec'd sleep: the first one is our child, the
        // restored ones are ours as a subreaper.)
        if round == 1 {
            let _ = r.unshare.wait();
        } else {
            waitpid_timeout(pid, Duration::from_secs(30));
        }
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
        restored.0 = pid;
        check(pid, &format!("round {round}"));
    }
    // SAFETY: killing the restored process (the test's).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

#[test]
fn refuses_a_child_in_another_network_namespace() {
    refused(
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            "unshare --net sleep 1001 & exec sleep 1000",
        ],
        |up| {
            let root = child_running(up, "sleep 1000")?;
            child_running(root, "sleep 1001").map(|_| root)
        },
        "is in a net namespace other than the root's",
    );
}

/// The program of [`a_job_under_the_namespace_init_comes_back_under_a_stand_in`]:
/// argv[1] is its directory (`ready`, `go`, `result`). It holds a child
/// and 1 MiB of random bytes, and checks after the restores that its PID
/// and its child's are those it had in its namespace, its parent is PID
/// 1 there, its namespace's /proc shows it at its PID, and its memory
/// and child are intact.
const STAND_IN_PROGRAM: &str = r#"
import hashlib, os, select, sys
d = sys.argv[1]
me = os.getpid()
r, w = os.pipe()
kid = os.fork()
if kid == 0:
    os.close(w)
    os._exit(0 if os.read(r, 1) == b"" else 3)
os.close(r)
data = bytearray(os.urandom(1 << 20))
digest = hashlib.sha256(data).hexdigest()
def field(pid, key):
    for l in open("/proc/%s/status" % pid):
        if l.startswith(key):
            return l.split()[1:]
with open(d + "/ready.tmp", "w") as f:
    f.write("%d %d %d\n" % (me, kid, os.getppid()))
os.rename(d + "/ready.tmp", d + "/ready")
while not os.path.exists(d + "/go"):
    select.select([], [], [], 0.02)
bad = []
if os.getpid() != me:
    bad.append("pid %d, was %d" % (os.getpid(), me))
if os.getppid() != 1:
    bad.append("parent %d, not 1" % os.getppid())
if field("self", "NSpid:")[-1] != str(me):
    bad.append("NSpid %r" % field("self", "NSpid:"))
if field(kid, "PPid:") != [str(me)]:
    bad.append("child %d has parent %r" % (kid, field(kid, "PPid:")))
if hashlib.sha256(data).hexdigest() != digest:
    bad.append("memory changed")
os.close(w)
_, st = os.waitpid(kid, 0)
if st != 0:
    bad.append("child status %d" % st)
with open(d + "/result.tmp", "w") as f:
    f.write("FAIL: " + "; ".join(bad) if bad else "PASS")
os.rename(d + "/result.tmp", d + "/result")
"#;

/// A job under a container's shell: a process (with a child) that is not
/// its PID namespace's init (`sh`, not dumped) comes back, twice, in a new
/// PID namespace at its PID there, its child at its, under a stand-in
/// init (stasis, PID 1 there, which exits with the root's status); the
/// program checks itself.
#[test]
fn a_job_under_the_namespace_init_comes_back_under_a_stand_in() {
    job_under_a_stand_in(&["--pid", "--fork", "--mount-proc"], false);
}

/// The same in user (root mapped), PID, mount, UTS, IPC and network
/// namespaces of its own, with an incremental dump (`--leave-running
/// --track auto`, which picks soft-dirty there: userfaultfd is refused to
/// a process in a user namespace of its own, then a dump that kills).
#[test]
fn a_job_under_the_init_of_a_container_comes_back_under_a_stand_in() {
    job_under_a_stand_in(
        &[
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
        ],
        true,
    );
}

/// Dumps and restores the program of [`STAND_IN_PROGRAM`] under `unshare
/// UNSHARE sh -c 'python3 ... & wait'` twice (with `incremental`, a
/// `--leave-running --track` dump first: the dump that follows is
/// incremental; a restored tree is not tracked), checking its PIDs and the stand-in after each restore.
fn job_under_a_stand_in(unshare: &[&str], incremental: bool) {
    workloads();
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let r = Refused::spawn(Command::new("unshare").args(unshare).args([
        "sh",
        "-c",
        "python3 -c \"$0\" \"$1\" & wait",
        STAND_IN_PROGRAM,
        &d,
    ]));
    let up = r.unshare.id() as i32;
    let ready = dir.path().join("ready");
    wait_until(Duration::from_secs(20), "the program to be ready", || {
        ready.exists()
    });
    let said = std::fs::read_to_string(&ready).unwrap();
    let ids: Vec<i32> = said
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    let (me, kid) = (ids[0], ids[1]);
    assert!(me > 1 && ids[2] == 1, "ready: {said}");
    let init = my_children_of(up)
        .first()
        .copied()
        .expect("the namespace's sh");
    let mut pid = my_children_of(init).first().copied().expect("the program");
    let img = tempfile::tempdir().unwrap();
    let mut stand_in = 0;
    let nspid = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("NSpid:")
                    .map(|v| v.split_whitespace().last().unwrap_or("").to_string())
            })
            .unwrap_or_default()
    };
    let track: &[&str] = if incremental {
        &["--track", "auto"]
    } else {
        &[]
    };
    if incremental {
        let o = stasis()
            .args([
                "dump",
                "--leave-running",
                "--json",
                "-t",
                &pid.to_string(),
                "-D",
            ])
            .arg(img.path())
            .args(track)
            .output()
            .unwrap();
        assert_ok(&o, "dump --leave-running");
        assert!(alive(pid), "--leave-running killed the program");
        assert!(json(&o)["armed"].is_string(), "{}", json(&o));
    }
    for round in 1..=2 {
        let o = stasis()
            .args(["dump", "--json", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .args(track)
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        let parent = &json(&o)["parent"];
        assert_eq!(
            parent.is_u64(),
            incremental && round == 1,
            "round {round}: {}",
            json(&o)
        );
        if round > 1 {
            // The stand-in exits with the root's status (128 + SIGKILL).
            assert_eq!(
                waitpid_timeout(stand_in, Duration::from_secs(30)),
                (Some(128 + libc::SIGKILL), None),
                "round {round}: the stand-in's status"
            );
        }
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        let j = json(&o);
        assert_eq!(j["pid_in_namespace"], me, "{j}");
        pid = i32::try_from(j["pid"].as_i64().unwrap()).unwrap();
        stand_in = i32::try_from(j["init_pid"].as_i64().expect("an init")).unwrap();
        assert_eq!(nspid(pid), me.to_string(), "round {round}");
        assert_eq!(nspid(stand_in), "1", "round {round}");
        assert_eq!(my_children_of(stand_in), [pid], "round {round}");
        assert!(cmdline_of(stand_in).contains("pidns-init"), "round {round}");
        let kids = my_children_of(pid);
        assert_eq!(kids.len(), 1, "round {round}");
        assert_eq!(nspid(kids[0]), kid.to_string(), "round {round}");
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap(),
            std::fs::read_link("/proc/self/ns/pid").unwrap(),
            "round {round}"
        );
    }
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let result = dir.path().join("result");
    wait_until(Duration::from_secs(20), "the program's result", || {
        result.exists()
    });
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "PASS");
    assert_eq!(
        waitpid_timeout(stand_in, Duration::from_secs(30)),
        (Some(0), None),
        "the stand-in exits with the root's status"
    );
}

/// The program of [`fds_on_namespaces_come_back_on_theirs`]: argv[1] is
/// its directory, argv[2] a network namespace bound to a path, argv[3] a
/// process in that namespace (not of the tree). It opens the network
/// namespace it starts in (the test's), unshares a new one, opens that,
/// the bound one by its path and the same through the process's
/// `/proc/PID/ns/net`, and at `go` writes the inode of each fd's
/// namespace, then its own namespace's, to `result`.
const NS_FD_PROGRAM: &str = r#"
import ctypes, os, select, sys
d, bound, other = sys.argv[1], sys.argv[2], sys.argv[3]
host = os.open("/proc/self/ns/net", os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000):
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
own = os.open("/proc/self/ns/net", os.O_RDONLY)
by_path = os.open(bound, os.O_RDONLY | os.O_CLOEXEC)
by_proc = os.open("/proc/%s/ns/net" % other, os.O_RDONLY)
def now():
    return " ".join(str(os.fstat(f).st_ino) for f in (host, own, by_path, by_proc)) \
        + " " + str(os.stat("/proc/self/ns/net").st_ino)
with open(d + "/ready.tmp", "w") as f:
    f.write(now())
os.rename(d + "/ready.tmp", d + "/ready")
while not os.path.exists(d + "/go"):
    select.select([], [], [], 0.02)
with open(d + "/result.tmp", "w") as f:
    f.write(now())
os.rename(d + "/result.tmp", d + "/result")
"#;

/// A process in a network namespace of its own holding fds on the
/// namespace it came from (the dumper's), on its own, and on one bound
/// at /run/netns (`ip netns add`) opened by that path and through a
/// process outside the tree: twice, each fd comes back on the
/// restorer's, on the restored process's new one and on the bound one.
#[test]
fn fds_on_namespaces_come_back_on_theirs() {
    use std::os::unix::fs::MetadataExt;
    become_subreaper();
    let bound = NetNs::create("nsfd");
    let mut other = bound.command("sleep");
    let other = ChildGuard(other.arg("1000").stdin(Stdio::null()).spawn().unwrap());
    let path = format!("/run/netns/{}", bound.name);
    let ino = |p: &str| std::fs::metadata(p).unwrap().ino();
    wait_until(Duration::from_secs(10), "sleep in the namespace", || {
        std::fs::metadata(format!("/proc/{}/ns/net", other.0.id()))
            .is_ok_and(|m| m.ino() == ino(&path))
    });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // (Under a shell that reaps it once the dump has killed it.)
    let r = Refused::spawn(Command::new("sh").args([
        "-c",
        "python3 -c \"$0\" \"$1\" \"$2\" \"$3\" & wait",
        NS_FD_PROGRAM,
        &d,
        &path,
        &other.0.id().to_string(),
    ]));
    let ready = dir.path().join("ready");
    wait_until(Duration::from_secs(20), "the program to be ready", || {
        ready.exists()
    });
    let (ours, pinned) = (ino("/proc/self/ns/net"), ino(&path));
    let words = |f: &std::path::Path| -> Vec<u64> {
        std::fs::read_to_string(f)
            .unwrap()
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect()
    };
    let before = words(&ready);
    assert_eq!([before[0], before[2], before[3]], [ours, pinned, pinned]);
    assert_eq!(before[1], before[4], "its own");
    assert_ne!(before[1], ours);
    let program = my_children_of(r.unshare.id() as i32)[0];
    let pid = dump_and_restore_detached(program, 2, |pid, round| {
        let own = ino(&format!("/proc/{pid}/ns/net"));
        assert_ne!(
            own, ours,
            "round {round}: restored in our network namespace"
        );
        // (Not necessarily another inode than the dumped one's: that
        // namespace went with the dumped process, and the kernel reuses
        // namespace inode numbers.)
        let fds: Vec<u64> = [3, 4, 5, 6]
            .iter()
            .map(|fd| ino(&format!("/proc/{pid}/fd/{fd}")))
            .collect();
        assert_eq!(fds, [ours, own, pinned, pinned], "round {round}");
    });
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let result = dir.path().join("result");
    wait_until(Duration::from_secs(20), "the program's result", || {
        result.exists()
    });
    let after = words(&result);
    waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!([after[0], after[2], after[3]], [ours, pinned, pinned]);
    assert_eq!(after[1], after[4], "its own, after");
}

/// Kills and reaps a child when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tree in a user namespace of its own: a lazy restore is refused
/// before anything is made (the kernel refuses the userfaultfd it needs
/// there) unless `vm.unprivileged_userfaultfd` is 1, with what to do; the
/// plain restore of the same image works.
#[test]
fn a_lazy_restore_of_a_user_namespace_says_what_it_needs() {
    become_subreaper();
    let r = Refused::spawn(Command::new("unshare").args([
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "sleep",
        "1000",
    ]));
    let pid = r.sleeper(20);
    let img = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "dump");
    let allowed = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .is_ok_and(|v| v.trim() == "1");
    let lazy = stasis()
        .args(["restore", "--lazy", "--detach", "--json", "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    let o = if allowed {
        lazy
    } else {
        assert_fails_with(&lazy, "vm.unprivileged_userfaultfd=1");
        stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap()
    };
    assert_ok(&o, "restore");
    let pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
    assert_eq!(cmdline_of(pid).trim(), "sleep 1000");
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// A process of a tree in namespaces of its own whose threads are in a
/// threaded subtree (its main thread in threaded cgroup T/m, its other
/// two in T/t and T/t/u; T, where the process is, reads `domain
/// threaded`): restored twice, the cgroups removed before the first
/// restore (made again, threaded) and there for the second, every thread
/// back in its cgroup.
#[test]
fn threads_in_a_threaded_cgroup_come_back_in_theirs() {
    let Some(mut cg) = TestCgroups::here("threaded") else {
        return;
    };
    become_subreaper();
    for rel in ["m", "t", "t/u"] {
        cg.make(rel);
    }
    let script = "import threading, time\n\
        for _ in range(2):\n    threading.Thread(target=time.sleep, args=(1000,)).start()\n\
        time.sleep(1000)\n";
    let r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "python3",
        "-c",
        script,
    ]));
    let up = r.unshare.id() as i32;
    let mut pid = 0;
    wait_until(Duration::from_secs(20), "python's threads", || {
        pid = descendants(up).first().copied().unwrap_or(0);
        pid > 0 && tasks_of(pid).len() == 3
    });
    cg.write("", "cgroup.procs", &pid.to_string());
    for rel in ["m", "t", "t/u"] {
        cg.write(rel, "cgroup.type", "threaded");
    }
    let mut tids = tasks_of(pid);
    tids.sort_unstable();
    assert_eq!(tids[0], pid);
    for (tid, rel) in tids.iter().zip(["m", "t", "t/u"]) {
        cg.write(rel, "cgroup.threads", &tid.to_string());
    }
    // Each thread's TID in the PID namespace and its cgroup.
    let threads = |p: i32| {
        let mut v: Vec<(String, String)> = tasks_of(p)
            .into_iter()
            .map(|t| {
                let status = std::fs::read_to_string(format!("/proc/{p}/task/{t}/status")).unwrap();
                let nstid = status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last())
                    .unwrap()
                    .to_string();
                let cgroup = std::fs::read_to_string(format!("/proc/{p}/task/{t}/cgroup"))
                    .unwrap()
                    .trim()
                    .to_string();
                (nstid, cgroup)
            })
            .collect();
        v.sort();
        v
    };
    let name = cg.name();
    let before = threads(pid);
    let want: Vec<String> = ["m", "t", "t/u"]
        .iter()
        .map(|rel| format!("0::/{name}/{rel}"))
        .collect();
    let mut got: Vec<String> = before
        .iter()
        .filter_map(|(_, c)| c.lines().find(|l| l.starts_with("0::")))
        .map(str::to_string)
        .collect();
    got.sort();
    assert_eq!(got, want, "before the dump: {before:?}");
    let types = |round: &str| {
        assert_eq!(cg.read("", "cgroup.type"), "domain threaded", "{round}");
        for rel in ["m", "t", "t/u"] {
            assert_eq!(cg.read(rel, "cgroup.type"), "threaded", "{round}: {rel}");
        }
    };
    types("before the dump");
    let img = tempfile::tempdir().unwrap();
    let mut restored = KillOnDrop(0);
    let mut r = r;
    for round in 1..=2 {
        let o = stasis()
            .args(["dump", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        if round == 1 {
            let _ = r.unshare.wait();
            wait_until(
                Duration::from_secs(10),
                "the killed tree to leave T",
                || {
                    ["", "m", "t", "t/u"]
                        .iter()
                        .all(|rel| cg.read(rel, "cgroup.threads").is_empty())
                },
            );
            cg.remove_below();
        } else {
            waitpid_timeout(pid, Duration::from_secs(30));
        }
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
        restored.0 = pid;
        assert_eq!(threads(pid), before, "round {round}");
        types(&format!("round {round}"));
    }
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
    wait_until(
        Duration::from_secs(10),
        "the tree to leave its cgroups",
        || {
            ["", "m", "t", "t/u"]
                .iter()
                .all(|rel| cg.read(rel, "cgroup.threads").is_empty())
        },
    );
}

/// A file system the dumper has no mount of that only a disk holds (an
/// ext4 on a loop device, mounted in the tree's namespace only): refused
/// by name, with its block device.
#[test]
fn refuses_a_disk_file_system_the_dumper_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(8 << 20).unwrap();
    drop(f);
    let o = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&img)
        .output()
        .expect("mkfs.ext4");
    assert_ok(&o, "mkfs.ext4");
    let script = format!("mount -o loop {} /mnt && exec sleep 1000", img.display());
    refused(
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "sh",
            "-c",
            &script,
        ],
        |up| child_running(up, "sleep 1000"),
        "has a ext4 file system of the block device /dev/loop",
    );
}

/// Whether this kernel has hugetlbfs with 2 MiB pages, with a pool of at
/// least 64 of them (as scripts/test.sh keeps it; made so if smaller).
fn hugetlbfs_ready() -> bool {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("hugetlbfs"))
        || !std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists()
    {
        eprintln!("skipped: this kernel has no hugetlbfs with 2 MiB pages");
        return false;
    }
    let pool = "/proc/sys/vm/nr_hugepages";
    let n: u64 = std::fs::read_to_string(pool)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    if n < 64 {
        std::fs::write(pool, "64").expect("growing the huge page pool to 64");
    }
    true
}

/// What [`files_of`] sees of one entry.
#[derive(PartialEq)]
struct FileFacts {
    path: String,
    mode: u32,
    owner: (u32, u32),
    size: u64,
    /// Bytes of allocated pages (`st_blocks`).
    allocated: u64,
    data: Vec<u8>,
}

impl std::fmt::Debug for FileFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} mode {:o} owner {:?} size {} allocated {} ({} bytes read)",
            self.path,
            self.mode,
            self.owner,
            self.size,
            self.allocated,
            self.data.len()
        )
    }
}

/// Every entry under `dir` (a walk from outside, through
/// /proc/PID/root): path, mode, owner, size, allocated bytes and a
/// file's bytes.
fn files_of(dir: &std::path::Path) -> Vec<FileFacts> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let data = if md.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                queue.push(p.clone());
                Vec::new()
            };
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            out.push(FileFacts {
                path: rel,
                mode: md.mode(),
                owner: (md.uid(), md.gid()),
                size: md.size(),
                allocated: md.blocks() * 512,
                data,
            });
        }
    }
    out
}

/// Issue 17: a hugetlbfs of the tree's own mount namespace holding files
/// (mounted with a page size, size, min_size and nr_inodes limits, a
/// mode and an owner), filled through mappings by the `hugetlbfs_files`
/// workload, which keeps one mapped shared and open: dumped and restored
/// twice, the mount has its options again (mountinfo), and its files
/// their bytes, sizes, modes, owners and allocated pages (a hole stays
/// one; a size that is not whole pages is kept); then the workload checks
/// that its mapping and fd still share the file (a write through the
/// mapping is what the file reads).
#[test]
fn twice_keeps_a_hugetlbfs_holding_files() {
    if !hugetlbfs_ready() {
        return;
    }
    let bin = workloads().join("hugetlbfs_files");
    let dir = tempfile::Builder::new()
        .prefix("stasis-hugefs-")
        .tempdir()
        .unwrap();
    let script = "mount -t hugetlbfs -o pagesize=2M,size=16M,min_size=4M,nr_inodes=20,mode=1770,uid=5,gid=6 stasis-hugefs /mnt && \
        exec \"$0\" \"$1\" /mnt >\"$2\" 2>&1";
    let r = Refused::spawn(
        Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount-proc",
                "--mount",
                "sh",
                "-c",
                script,
            ])
            .arg(&bin)
            .arg(dir.path().join("pid"))
            .arg(dir.path().join("out")),
    );
    let out = || std::fs::read_to_string(dir.path().join("out")).unwrap_or_default();
    let inside = wait_pidfile(&dir.path().join("pid"), Duration::from_secs(30));
    assert_eq!(inside, 1, "{}", out());
    let pid = my_children_of(r.unshare.id() as i32)[0];
    let shape = mountinfo_shape(pid);
    let want = "/ /mnt rw,relatime - hugetlbfs stasis-hugefs rw,uid=5,gid=6,mode=1770,nr_inodes=20,pagesize=2M,size=16777216,min_size=4194304";
    assert!(shape.iter().any(|l| l == want), "{want} in {shape:#?}");
    let at = |p: i32| std::path::PathBuf::from(format!("/proc/{p}/root/mnt"));
    let files = files_of(&at(pid));
    let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["d", "empty", "flat", "odd", "d/data"], "{files:?}");
    // d/data: 3 pages, 2 of them there; odd: a page and 100 bytes, both
    // pages allocated.
    let hp = 2u64 << 20;
    assert_eq!((files[4].size, files[4].allocated), (3 * hp, 2 * hp));
    assert_eq!((files[3].size, files[3].allocated), (hp + 100, 2 * hp));
    let restored = twice_guarded(pid, |p, round| {
        assert_eq!(mountinfo_shape(p), shape, "round {round}");
        let again = files_of(&at(p));
        for (a, b) in files.iter().zip(&again) {
            assert!(
                a == b,
                "round {round}: {b:?}, was {a:?} (or its bytes differ)"
            );
        }
        assert_eq!(again.len(), files.len(), "round {round}");
    });
    let last = restored.0.get();
    // SAFETY: signalling the workload this test restored.
    unsafe { libc::kill(last, libc::SIGTERM) };
    let st = waitpid_timeout(last, Duration::from_secs(60));
    assert_eq!(st, (Some(0), None), "output:\n{}", out());
    assert_eq!(out().lines().last(), Some("PASS"), "output:\n{}", out());
}

/// Issue 17: overlays of the tree's own mount namespace on directories
/// the dumper sees (a host temporary directory): one with two lower
/// layers, an upper and a work directory on a directory of a tmpfs of
/// its own, and one of lower layers only (read-only). The tree writes a
/// file to the first and holds another open for writing before the dump;
/// dumped and restored twice, both overlays are mounted again with their
/// options (mountinfo) and the merged view shows the lower and upper
/// files; then the tree writes another file, through its held fd and
/// removes a lower file: all land in the upper directory (a whiteout for
/// the removed one), as the overlay it runs on is the one on those
/// directories.
#[test]
fn twice_keeps_an_overlay_on_directories_the_dumper_sees() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    let dir = tempfile::Builder::new()
        .prefix("stasis-ovl-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    for sub in ["l1", "l2", "u", "w"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("l1/l1file"), b"lower one").unwrap();
    std::fs::write(d.join("l2/l2file"), b"lower two").unwrap();
    let script = "mount -t tmpfs stasis-ovl-t /mnt && mkdir /mnt/a /mnt/b && \
        mount -t overlay stasis-ovl -o lowerdir=$0/l1:$0/l2,upperdir=$0/u,workdir=$0/w /mnt/a && \
        mount -t overlay -o ro stasis-ovl-ro -o lowerdir=$0/l1:$0/l2 /mnt/b && \
        echo before >/mnt/a/before && exec 3>/mnt/a/held && echo held-before >&3 && \
        while [ ! -e /mnt/a/go ]; do sleep 0.1; done; \
        echo after >/mnt/a/after && echo held-after >&3 && rm /mnt/a/l1file && exec sleep 1000";
    let r = Refused::spawn(
        Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount-proc",
                "--mount",
                "sh",
                "-c",
                script,
            ])
            .arg(d),
    );
    wait_until(Duration::from_secs(20), "the tree to be set up", || {
        std::fs::read(d.join("u/held")).is_ok_and(|b| b == b"held-before\n")
    });
    let pid = my_children_of(r.unshare.id() as i32)[0];
    let shape = mountinfo_shape(pid);
    let base = d.display();
    for want in [
        format!("/ /mnt/a rw,relatime - overlay stasis-ovl rw,lowerdir={base}/l1:{base}/l2,upperdir={base}/u,workdir={base}/w"),
        format!("/ /mnt/b ro,relatime - overlay stasis-ovl-ro ro,lowerdir={base}/l1:{base}/l2"),
    ] {
        assert!(shape.iter().any(|l| l.starts_with(&want)), "{want} in {shape:#?}");
    }
    let names = |p: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let restored = twice_guarded(pid, |p, round| {
        assert_eq!(mountinfo_shape(p), shape, "round {round}");
        let a = std::path::PathBuf::from(format!("/proc/{p}/root/mnt/a"));
        assert_eq!(
            names(&a),
            ["before", "held", "l1file", "l2file"],
            "round {round}"
        );
        assert_eq!(std::fs::read(a.join("l2file")).unwrap(), b"lower two");
        assert_eq!(std::fs::read(a.join("before")).unwrap(), b"before\n");
        let b = std::path::PathBuf::from(format!("/proc/{p}/root/mnt/b"));
        assert_eq!(names(&b), ["l1file", "l2file"], "round {round}");
    });
    let p = restored.0.get();
    std::fs::write(format!("/proc/{p}/root/mnt/a/go"), b"").unwrap();
    wait_until(Duration::from_secs(20), "the tree to write after", || {
        cmdline_of(p).trim() == "sleep 1000"
    });
    assert_eq!(std::fs::read(d.join("u/after")).unwrap(), b"after\n");
    assert_eq!(
        std::fs::read(d.join("u/held")).unwrap(),
        b"held-before\nheld-after\n"
    );
    // The removed lower file: a whiteout in the upper directory, still
    // in its lower one, gone from the merged view.
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let wh = std::fs::symlink_metadata(d.join("u/l1file")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    assert!(d.join("l1/l1file").exists());
    assert_eq!(
        names(std::path::Path::new(&format!("/proc/{p}/root/mnt/a"))),
        ["after", "before", "go", "held", "l2file"]
    );
}

/// An overlay whose upper directory is on a tmpfs of the tree's own (the
/// dumper does not see it: the overlay's content would not be saved):
/// refused by name, with the directory.
#[test]
fn refuses_an_overlay_on_a_directory_the_dumper_cannot_see() {
    refused(
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs stasis-ovl-t /mnt && mkdir /mnt/u /mnt/w /mnt/m && \
             mount -t overlay stasis-ovl -o lowerdir=/etc,upperdir=/mnt/u,workdir=/mnt/w /mnt/m && \
             exec sleep 1000",
        ],
        |up| child_running(up, "sleep 1000"),
        "its overlay on /mnt/m has the upper directory /mnt/u on a tmpfs mount that the dumper's mount namespace does not see",
    );
}

/// A FUSE file system of the tree's own (mounted on an fd of /dev/fuse,
/// no daemon answering): refused by name, with the kernel-side reason.
#[test]
fn refuses_a_fuse_file_system() {
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    refused(
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "sh",
            "-c",
            "exec 5<>/dev/fuse && \
             mount -i -t fuse -o fd=5,rootmode=40000,user_id=0,group_id=0 stasis-fuse /mnt && \
             exec sleep 1000",
        ],
        |up| child_running(up, "sleep 1000"),
        "its mount namespace has a FUSE file system (fuse, of stasis-fuse) on /mnt that no mount of the dumper's holds; stasis cannot make it again: the connection's state and the daemon's pending requests live in its /dev/fuse",
    );
}

/// The (device, root, mount point) of each line of `info` (a mountinfo).
fn mount_keys(info: &str) -> std::collections::HashSet<(String, String, String)> {
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((
                f.get(2)?.to_string(),
                f.get(3)?.to_string(),
                f.get(4)?.to_string(),
            ))
        })
        .collect()
}

/// The mounts of its own of `pid` (those this process has not: copies of
/// ours come and go with the other tests) as its `/proc/PID/mountinfo`
/// lists them, in order, less what the kernel assigns: mount ids, device
/// numbers and peer group numbers (`shared:N` is `shared`).
fn mountinfo_shape(pid: i32) -> Vec<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let ours = mount_keys(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    info.lines()
        .filter(|l| mount_keys(l).is_disjoint(&ours))
        .map(|l| {
            l.split(' ')
                .skip(3)
                .map(|f| match f.split_once(':') {
                    Some((k @ ("shared" | "master" | "propagate_from"), _)) => k,
                    _ => f,
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Every file under `dir` (a walk from outside, through /proc/PID/root):
/// path, mode, and a file's bytes or a link's target.
fn tree_of(dir: &std::path::Path) -> Vec<(String, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let data = if md.is_file() {
                std::fs::read(&p).unwrap()
            } else if md.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                queue.push(p.clone());
                Vec::new()
            };
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            out.push((rel, md.mode(), data));
        }
    }
    out
}

/// File systems of the tree's own mount namespace made again from nothing
/// (issue 17): its proc on /proc remounted with `hidepid=`, a second proc
/// with `hidepid=`/`subset=pid`, a read-only
/// sysfs elsewhere, a shared ramfs with files (their bytes saved, as a
/// tmpfs's) with a directory of it bound elsewhere as its slave, a
/// hugetlbfs with its page size and size, a second devpts
/// instance with its modes and group, a tracefs (read-only), a
/// securityfs and a binfmt_misc. Dumped and restored twice, its
/// mountinfo is the dumped one (but ids and device numbers), and the
/// ramfs's files come back byte for byte.
#[test]
fn twice_keeps_fresh_file_systems() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    let script = "mount -o remount,hidepid=invisible /proc && \
        mount -t tmpfs -o mode=755 stasis-fresh /mnt && \
        mkdir /mnt/proc2 /mnt/sys2 /mnt/ram /mnt/huge /mnt/pts2 /mnt/trace /mnt/sec /mnt/binfmt && \
        mount -t proc -o hidepid=invisible,subset=pid proc2 /mnt/proc2 && \
        mount -t sysfs -o ro,nosuid sys2 /mnt/sys2 && \
        mount -t ramfs -o mode=750 ram1 /mnt/ram && mkdir /mnt/ram/d && \
        printf ramfs-data >/mnt/ram/d/f && ln -s d/f /mnt/ram/l && \
        head -c 100000 /dev/urandom >/mnt/ram/big && chmod 0604 /mnt/ram/big && \
        mount --make-shared /mnt/ram && mkdir /mnt/ramd && \
        mount --bind /mnt/ram/d /mnt/ramd && mount --make-slave /mnt/ramd && \
        mount -t hugetlbfs -o pagesize=2M,size=4M huge1 /mnt/huge && \
        mount -t devpts -o newinstance,ptmxmode=0600,mode=0600,gid=5 pts2 /mnt/pts2 && \
        mount -t tracefs trace1 /mnt/trace && mount -o remount,bind,ro /mnt/trace && \
        mount -t securityfs sec1 /mnt/sec && mount -t binfmt_misc bin1 /mnt/binfmt && \
        exec sleep 1000";
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        script,
    ]));
    let pid = _r.sleeper(10);
    let shape = mountinfo_shape(pid);
    for want in [
        "/ /proc rw,nosuid,nodev,noexec,relatime - proc proc rw,hidepid=invisible",
        "/ /mnt/proc2 rw,relatime - proc proc2 rw,hidepid=invisible,subset=pid",
        "/ /mnt/ram rw,relatime shared - ramfs ram1 rw,mode=750",
        "/ /mnt/trace ro,relatime - tracefs trace1 rw",
        "/d /mnt/ramd rw,relatime master - ramfs ram1 rw,mode=750",
    ] {
        assert!(shape.iter().any(|l| l == want), "{want} in {shape:#?}");
    }
    let ram = tree_of(std::path::Path::new(&format!("/proc/{pid}/root/mnt/ram")));
    assert_eq!(ram.len(), 4, "{ram:?}");
    let restored = Restored(std::cell::Cell::new(0));
    dump_and_restore_detached(pid, 2, |p, round| {
        restored.0.set(p);
        assert_eq!(mountinfo_shape(p), shape, "round {round}");
        let again = tree_of(std::path::Path::new(&format!("/proc/{p}/root/mnt/ram")));
        assert!(again == ram, "round {round}: the ramfs's files differ");
        // The bind of the ramfs's directory is of the same file system,
        // a slave of the ramfs's peer group.
        let ino = |f: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/{p}/root{f}"))
                .unwrap()
                .ino()
        };
        assert_eq!(ino("/mnt/ramd/f"), ino("/mnt/ram/d/f"), "round {round}");
        let peer = |at: &str, tag: &str| {
            let info = std::fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap();
            info.lines()
                .find(|l| l.split(' ').nth(4) == Some(at))
                .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix(tag)))
                .map(str::to_string)
        };
        assert!(peer("/mnt/ram", "shared:").is_some(), "round {round}");
        assert_eq!(
            peer("/mnt/ram", "shared:"),
            peer("/mnt/ramd", "master:"),
            "round {round}"
        );
        // The second proc is the tree's PID namespace's: its root is 1.
        let one = std::fs::read_to_string(format!("/proc/{p}/root/mnt/proc2/1/comm")).unwrap();
        assert_eq!(one.trim(), "sleep", "round {round}");
    });
}

/// The last tree a test restored (detached: a child of the test process,
/// not of unshare), killed when the test ends, failed or not.
struct Restored(std::cell::Cell<i32>);

impl Drop for Restored {
    fn drop(&mut self) {
        let pid = self.0.get();
        if pid > 0 && alive(pid) {
            // SAFETY: killing the tree this test restored (PID 1 of its
            // namespace: the others die with it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            waitpid_timeout(pid, Duration::from_secs(30));
        }
    }
}

/// [`dump_and_restore_detached`] twice, `check` after each restore; the
/// restored tree is killed when the guard returned drops (so also when a
/// check fails).
fn twice_guarded(pid: i32, check: impl Fn(i32, u32)) -> Restored {
    let restored = Restored(std::cell::Cell::new(0));
    dump_and_restore_detached(pid, 2, |p, round| {
        restored.0.set(p);
        check(p, round);
    });
    restored
}

/// What a FIFO at `path` holds (read without waiting for a writer).
fn fifo_bytes(path: impl AsRef<std::path::Path>) -> Vec<u8> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut got = Vec::new();
    let _ = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
        .read_to_end(&mut got);
    got
}

/// Files of a tmpfs of its own that are not plain linked files, open: a
/// deleted file (made again on the new tmpfs, and unlinked), a FIFO with
/// bytes queued and a device node (reopened there by path), twice.
#[test]
fn twice_keeps_a_deleted_file_a_fifo_and_a_device_of_its_tmpfs_open() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let script = "mount -t tmpfs stasis-test /mnt && printf hello-ghost >/mnt/f && \
        exec 3</mnt/f && rm /mnt/f && mkfifo /mnt/fifo && exec 4<>/mnt/fifo && \
        printf queued >&4 && mknod /mnt/null c 1 3 && exec 5>/mnt/null && exec sleep 1000";
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        script,
    ]));
    let pid = _r.sleeper(10);
    let check = |pid: i32, round: u32| {
        let fd = |n: u32| format!("/proc/{pid}/fd/{n}");
        let link = |n: u32| std::fs::read_link(fd(n)).unwrap().display().to_string();
        let tmpfs = std::fs::metadata(format!("/proc/{pid}/root/mnt"))
            .unwrap()
            .dev();
        assert_eq!(link(3), "/mnt/f (deleted)", "round {round}");
        assert_eq!(
            std::fs::read(fd(3)).unwrap(),
            b"hello-ghost",
            "round {round}"
        );
        let f = std::fs::metadata(fd(3)).unwrap();
        assert_eq!(
            f.dev(),
            tmpfs,
            "round {round}: the deleted file is not on the tree's tmpfs"
        );
        assert_eq!(f.nlink(), 0, "round {round}");
        assert_eq!(link(4), "/mnt/fifo", "round {round}");
        let fifo = std::fs::metadata(fd(4)).unwrap();
        let node = std::fs::metadata(format!("/proc/{pid}/root/mnt/fifo")).unwrap();
        assert!(fifo.file_type().is_fifo(), "round {round}");
        assert_eq!(
            (fifo.dev(), fifo.ino()),
            (node.dev(), node.ino()),
            "round {round}"
        );
        let null = std::fs::metadata(fd(5)).unwrap();
        assert!(null.file_type().is_char_device(), "round {round}");
        assert_eq!(
            (null.rdev(), null.dev()),
            (libc::makedev(1, 3), tmpfs),
            "round {round}"
        );
        if round == 2 {
            assert_eq!(fifo_bytes(fd(4)), b"queued", "the FIFO's bytes");
        }
    };
    check(pid, 0);
    let _restored = twice_guarded(pid, check);
}

/// Deleted nodes of its own mounts, still open (issue 17): a directory,
/// a FIFO with bytes queued and a character device of a tmpfs of its
/// own, a block device node there, and a FIFO of a bind mount of its
/// own. Each comes back made again on the same mount of the tree's
/// namespace (not the restorer's), opened and removed: its fd reads
/// "PATH (deleted)", on that mount's device, with its type, device
/// number and the FIFO's bytes. Twice.
#[test]
fn twice_keeps_deleted_nodes_of_its_own_mounts_open() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let host = tempfile::tempdir().unwrap();
    let script = format!(
        "mount -t tmpfs stasis-test /mnt && mkdir /mnt/d /mnt/b && exec 3</mnt/d && rmdir /mnt/d && \
         mkfifo /mnt/p && exec 4<>/mnt/p && printf queued >&4 && rm /mnt/p && \
         mknod /mnt/z c 1 5 && exec 5</mnt/z && rm /mnt/z && \
         mknod /mnt/blk b 7 0 && exec 6</mnt/blk && rm /mnt/blk && \
         mount --bind {} /mnt/b && mkfifo /mnt/b/q && exec 7<>/mnt/b/q && rm /mnt/b/q && \
         exec sleep 1000",
        host.path().display()
    );
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        &script,
    ]));
    let pid = _r.sleeper(10);
    let check = |pid: i32, round: u32| {
        let fd = |n: u32| format!("/proc/{pid}/fd/{n}");
        let link = |n: u32| std::fs::read_link(fd(n)).unwrap().display().to_string();
        let dev_of = |p: &str| {
            std::fs::metadata(format!("/proc/{pid}/root{p}"))
                .unwrap()
                .dev()
        };
        let (tmpfs, bound) = (dev_of("/mnt"), dev_of("/mnt/b"));
        let want: [(u32, &str, u32, u64, u64); 5] = [
            (3, "/mnt/d", libc::S_IFDIR, 0, tmpfs),
            (4, "/mnt/p", libc::S_IFIFO, 0, tmpfs),
            (5, "/mnt/z", libc::S_IFCHR, libc::makedev(1, 5), tmpfs),
            (6, "/mnt/blk", libc::S_IFBLK, libc::makedev(7, 0), tmpfs),
            (7, "/mnt/b/q", libc::S_IFIFO, 0, bound),
        ];
        for (n, path, kind, rdev, dev) in want {
            assert_eq!(link(n), format!("{path} (deleted)"), "round {round}");
            let m = std::fs::metadata(fd(n)).unwrap();
            assert_eq!(
                (m.mode() & libc::S_IFMT, m.rdev(), m.dev(), m.nlink() > 1),
                (kind, rdev, dev, false),
                "round {round}: fd {n} on {path}"
            );
        }
        assert!(std::fs::metadata(fd(4)).unwrap().file_type().is_fifo());
        if round == 2 {
            assert_eq!(fifo_bytes(fd(4)), b"queued", "the FIFO's bytes");
        }
    };
    check(pid, 0);
    let _restored = twice_guarded(pid, check);
}

/// A tree whose mount namespace's copies of ours are slaves of them
/// (`unshare --propagation slave`, as container runtimes make a rootfs
/// `rslave`): restored, its copies are slaves of the same peer groups
/// again (not private), and its own mount is there. Twice.
#[test]
fn twice_keeps_slave_copies_of_the_dumpers_mounts() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "--propagation",
        "slave",
        "sh",
        "-c",
        "mount -t tmpfs stasis-slave /mnt && exec sleep 1000",
    ]));
    let pid = _r.sleeper(10);
    // The masters of its copies of our shared mounts, by mount point.
    let masters = |p: i32| -> std::collections::BTreeMap<String, String> {
        let info = std::fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap();
        let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let shared: std::collections::HashMap<String, String> = ours
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let id = f.iter().find_map(|o| o.strip_prefix("shared:"))?;
                Some((f.get(4)?.to_string(), id.to_string()))
            })
            .collect();
        info.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let at = f.get(4)?.to_string();
                shared.get(&at)?;
                let m = f
                    .iter()
                    .find_map(|o| o.strip_prefix("master:"))
                    .unwrap_or("none");
                Some((at, m.to_string()))
            })
            .collect()
    };
    let before = masters(pid);
    assert!(
        !before.is_empty() && before.values().all(|m| m != "none"),
        "{before:?}"
    );
    let shape = mountinfo_shape(pid);
    let restored = Restored(std::cell::Cell::new(0));
    dump_and_restore_detached(pid, 2, |p, round| {
        restored.0.set(p);
        assert_eq!(mountinfo_shape(p), shape, "round {round}");
        let now = masters(p);
        // (Mounts of ours made or gone meanwhile aside.)
        for (at, m) in &now {
            if let Some(b) = before.get(at) {
                assert_eq!(m, b, "round {round}: the master of {at}");
            }
        }
        assert!(now.keys().any(|k| before.contains_key(k)), "round {round}");
    });
}

/// A loop device attached to a file, detached when the test ends.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Fds on block devices (issue 17): a node of a tmpfs of its own and the
/// host's `/dev/loopN`, both a loop device over a file, one read 4 KiB
/// in. Each comes back on its path, the same device, at its offset, and
/// reads the file's bytes. Twice.
#[test]
fn twice_keeps_block_device_fds() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk");
    let data: Vec<u8> = (0..256u32 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let o = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&file)
        .output()
        .expect("losetup");
    assert_ok(&o, "losetup");
    let dev = Loop(String::from_utf8_lossy(&o.stdout).trim().to_string());
    let rdev = std::fs::metadata(&dev.0).unwrap().rdev();
    let script = format!(
        "mount -t tmpfs stasis-test /mnt && mknod /mnt/blk b {} {} && exec 3</mnt/blk && \
         exec 4<{} && dd bs=4096 count=1 <&4 >/dev/null 2>&1 && exec sleep 1000",
        libc::major(rdev),
        libc::minor(rdev),
        dev.0
    );
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        &script,
    ]));
    let pid = _r.sleeper(10);
    let check = |pid: i32, round: u32| {
        let fd = |n: u32| format!("/proc/{pid}/fd/{n}");
        let link = |n: u32| std::fs::read_link(fd(n)).unwrap().display().to_string();
        let pos = |n: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{n}"))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("pos:").map(|v| v.trim().to_string()))
                .unwrap()
        };
        assert_eq!(
            (link(3), link(4)),
            ("/mnt/blk".to_string(), dev.0.clone()),
            "round {round}"
        );
        let tmpfs = std::fs::metadata(format!("/proc/{pid}/root/mnt"))
            .unwrap()
            .dev();
        for n in [3, 4] {
            let m = std::fs::metadata(fd(n)).unwrap();
            assert_eq!(m.rdev(), rdev, "round {round}: fd {n}");
            assert_eq!(std::fs::read(fd(n)).unwrap(), data, "round {round}: fd {n}");
        }
        let node = std::fs::symlink_metadata(format!("/proc/{pid}/root/mnt/blk")).unwrap();
        assert_eq!(node.dev(), tmpfs, "round {round}");
        assert_eq!(
            (pos(3), pos(4)),
            ("0".into(), "4096".into()),
            "round {round}"
        );
    };
    check(pid, 0);
    let _restored = twice_guarded(pid, check);
}

/// A macvlan of the tree's network namespace whose lower device is in
/// the dumper's (moved in, as a container runtime may give one): refused
/// by name, the tree left running.
#[test]
fn refuses_a_macvlan_on_a_device_of_another_namespace() {
    let _net = ContainerNet {
        names: vec!["stasis-mvl0"],
        pids: Vec::new(),
    };
    let _ = Command::new("ip")
        .args(["link", "del", "stasis-mvl0"])
        .stderr(Stdio::null())
        .status();
    ip(None, "link add stasis-mvl0 type veth peer name stasis-mvl1");
    let moved = std::cell::Cell::new(false);
    refused(
        &["--net", "--fork", "sh", "-c", "exec sleep 1000"],
        |up| {
            let p = child_running(up, "sleep 1000")?;
            if !moved.get() {
                ip(None, "link add stasis-mv0 link stasis-mvl0 type macvlan");
                ip(None, &format!("link set stasis-mv0 netns {p}"));
                moved.set(true);
            }
            Some(p)
        },
        "its macvlan interface stasis-mv0 has its link in another network namespace",
    );
}

/// A multi-queue tun with two fds, one queue detached (`TUNSETQUEUE`):
/// after a dump and restore both are attached to it again, the second
/// still detached (it can be attached again), and the device goes with
/// them.
#[test]
fn a_multi_queue_tun_keeps_its_detached_queue() {
    let prog = "import fcntl, os, socket, struct, sys, time\n\
        d = sys.argv[1]\n\
        def fail(why):\n    open(d + '/result', 'w').write('FAIL ' + why)\n    sys.exit(1)\n\
        ifr = lambda flags: struct.pack('16sH22x', b'stasis-mq0', flags)\n\
        a = os.open('/dev/net/tun', os.O_RDWR)\n\
        b = os.open('/dev/net/tun', os.O_RDWR)\n\
        fcntl.ioctl(a, 0x400454ca, ifr(0x1101))\n\
        fcntl.ioctl(b, 0x400454ca, ifr(0x1101))\n\
        fcntl.ioctl(b, 0x400454d9, ifr(0x0400))\n\
        open(d + '/ready', 'w').close()\n\
        while not os.path.exists(d + '/go'):\n    time.sleep(0.02)\n\
        for fd, want in ((a, 0x0101), (b, 0x0501)):\n    \
            name, flags = struct.unpack('16sH22x', fcntl.ioctl(fd, 0x800454d2, bytes(40)))\n    \
            if name.rstrip(b'\\0') != b'stasis-mq0' or flags & 0x0f0f != want:\n        \
                fail('TUNGETIFF says %r %#x, not %#x' % (name, flags, want))\n\
        fcntl.ioctl(b, 0x400454d9, ifr(0x0200))\n\
        os.close(a)\n\
        os.close(b)\n\
        try:\n    socket.if_nametoindex('stasis-mq0')\n    fail('stasis-mq0 outlived its fds')\n\
        except OSError:\n    pass\n\
        open(d + '/result', 'w').write('PASS')\n";
    let (pid, dir) = start_in_netns(&["python3", "-c", prog]);
    let mut net = ContainerNet {
        names: Vec::new(),
        pids: vec![pid],
    };
    let last = dump_and_restore_detached(pid, 1, |pid, _| {
        let link = ip(Some(pid), "-d -o link show stasis-mq0");
        assert!(
            link.contains("tun type tun pi off vnet_hdr off multi_queue numqueues 1 numdisabled 1 persist off"),
            "{link}"
        );
    });
    net.pids.push(last);
    finish_program(dir.path(), last);
}

/// An fd attached to a tun device of the dumper's network namespace (the
/// tree has none of its own): refused, not reopened unattached.
#[test]
fn refuses_a_tun_of_the_dumpers_namespace() {
    let prog = "import fcntl, os, struct, time\n\
        fd = os.open('/dev/net/tun', os.O_RDWR)\n\
        fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH22x', b'stasis-tunh', 0x1001))\n\
        time.sleep(1000)\n";
    refused(
        &["python3", "-c", prog],
        |up| {
            std::path::Path::new("/sys/class/net/stasis-tunh")
                .exists()
                .then_some(up)
        },
        "is attached to the tun device stasis-tunh of the dumper's network namespace",
    );
}

/// Starts `unshare --net` with `args` in a directory of its own, waits
/// for the file `ready` there; returns the tree's PID (`unshare` execs
/// its command: reaped by a thread of its own once the dump kills it, so
/// that its PID is free for the restore) and the directory.
fn start_in_netns(args: &[&str]) -> (i32, tempfile::TempDir) {
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new("unshare");
    c.arg("--net")
        .args(args)
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().expect("starting unshare");
    let pid = child.id() as i32;
    std::thread::spawn(move || child.wait());
    wait_until(Duration::from_secs(20), "the tree to be set up", || {
        dir.path().join("ready").exists()
    });
    (pid, dir)
}

/// Tells a restored test program (`last`) to go on (`DIR/go`) and checks
/// that it wrote PASS in `DIR/result` and exited with 0.
fn finish_program(dir: &std::path::Path, last: i32) {
    std::fs::write(dir.join("go"), b"").unwrap();
    let st = waitpid_timeout(last, Duration::from_secs(60));
    let result = std::fs::read_to_string(dir.join("result")).unwrap_or_default();
    assert_eq!(result, "PASS");
    assert_eq!(st, (Some(0), None), "the restored program's exit");
}

/// In the network namespace of process `pid` (round `round` of a test):
/// link `dev` shows each of `wants` (`ip -d link`), has the address
/// `addr` (`inet A/N`), and the namespace has the route `route`.
fn assert_link(pid: i32, round: u32, dev: &str, wants: &[&str], addr: &str, route: &str) {
    let link = ip(Some(pid), &format!("-d -o link show {dev}"));
    for want in wants {
        assert!(link.contains(want), "round {round}: {want} in {link}");
    }
    let addrs = ip(Some(pid), &format!("-o addr show dev {dev}"));
    assert!(addrs.contains(addr), "round {round}: {addrs}");
    let routes = ip(Some(pid), "route show");
    assert!(routes.contains(route), "round {round}: {routes}");
}

/// Issue 17: a persistent tap of the tree's network namespace (as `ip
/// tuntap add` makes it: no fd attached) with a vnet header, an owner, a
/// hardware address, an MTU, an address and up, is made again with all of
/// them, twice.
#[test]
fn twice_keeps_a_persistent_tap() {
    let sh = "ip tuntap add stasis-tap0 mode tap vnet_hdr user 1234 \
        && ip link set stasis-tap0 address 02:55:00:00:00:07 mtu 1300 up \
        && ip addr add 10.55.0.1/24 dev stasis-tap0 \
        && touch \"$0/ready\" && exec sleep 1000";
    let (pid, _dir) = start_in_netns(&["sh", "-c", sh]);
    let mut net = ContainerNet {
        names: Vec::new(),
        pids: vec![pid],
    };
    let check = |pid: i32, round: u32| {
        assert_link(
            pid,
            round,
            "stasis-tap0",
            &[
                "link/ether 02:55:00:00:00:07",
                "mtu 1300",
                "<NO-CARRIER,",
                ",UP>",
                "tun type tap pi off vnet_hdr on persist on user 1234",
            ],
            "inet 10.55.0.1/24",
            "10.55.0.0/24 dev stasis-tap0",
        );
    };
    check(pid, 0);
    let last = dump_and_restore_detached(pid, 2, check);
    net.pids.push(last);
}

/// Issue 17: a program (as a VPN is) that opened /dev/net/tun and attached
/// a tun device (not persistent, no packet information) brought up with
/// an address and a route: after two dumps and restores, its fd is
/// attached to the device again (`TUNGETIFF`), a datagram sent through
/// the route is read from it, an echo request written into it is answered
/// through it, and the device goes with the fd (not left persistent).
#[test]
fn a_tun_held_by_a_program_carries_packets_after_restore() {
    let prog = "import fcntl, os, select, socket, struct, subprocess, sys, time\n\
        d = sys.argv[1]\n\
        def fail(why):\n    open(d + '/result', 'w').write('FAIL ' + why)\n    sys.exit(1)\n\
        fd = os.open('/dev/net/tun', os.O_RDWR)\n\
        fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH22x', b'stasis-tun0', 0x1001))\n\
        for a in ['addr add 10.56.0.1/24 dev stasis-tun0', 'link set stasis-tun0 mtu 1280 up',\n          \
            'route add 10.57.0.0/24 dev stasis-tun0']:\n    \
            subprocess.run(['ip'] + a.split(), check=True)\n\
        open(d + '/ready', 'w').close()\n\
        while not os.path.exists(d + '/go'):\n    time.sleep(0.02)\n\
        name, flags = struct.unpack('16sH22x', fcntl.ioctl(fd, 0x800454d2, bytes(40)))\n\
        if name.rstrip(b'\\0') != b'stasis-tun0' or flags & 0x0803 != 0x0001:\n    \
            fail('TUNGETIFF says %r %#x' % (name, flags))\n\
        def packet(want):\n    \
            end = time.time() + 20\n    \
            while time.time() < end:\n        \
                if select.select([fd], [], [], 1)[0]:\n            \
                    p = os.read(fd, 65536)\n            \
                    if len(p) > 20 and p[0] >> 4 == 4 and want(p):\n                return\n    \
            fail('no packet')\n\
        def csum(b):\n    \
            s = sum(struct.unpack('!%dH' % (len(b) // 2), b))\n    \
            while s >> 16:\n        s = (s & 0xffff) + (s >> 16)\n    \
            return ~s & 0xffff\n\
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        u.sendto(b'stasis-out', ('10.57.0.5', 9))\n\
        packet(lambda p: p[9] == 17 and p[16:20] == bytes([10, 57, 0, 5]) and p.endswith(b'stasis-out'))\n\
        icmp = struct.pack('!BBHHH', 8, 0, 0, 0x5354, 1) + b'stasis-in!'\n\
        icmp = icmp[:2] + struct.pack('!H', csum(icmp)) + icmp[4:]\n\
        h = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(icmp), 1, 0, 64, 1, 0,\n                \
            bytes([10, 57, 0, 5]), bytes([10, 56, 0, 1]))\n\
        h = h[:10] + struct.pack('!H', csum(h)) + h[12:]\n\
        os.write(fd, h + icmp)\n\
        packet(lambda p: p[9] == 1 and p[12:16] == bytes([10, 56, 0, 1]) and p[20] == 0 and p.endswith(b'stasis-in!'))\n\
        os.close(fd)\n\
        try:\n    socket.if_nametoindex('stasis-tun0')\n    fail('stasis-tun0 outlived its fd')\n\
        except OSError:\n    pass\n\
        open(d + '/result', 'w').write('PASS')\n";
    let (pid, dir) = start_in_netns(&["python3", "-c", prog]);
    let mut net = ContainerNet {
        names: Vec::new(),
        pids: vec![pid],
    };
    let check = |pid: i32, round: u32| {
        assert_link(
            pid,
            round,
            "stasis-tun0",
            &[
                "mtu 1280",
                ",UP,",
                "tun type tun pi off vnet_hdr off persist off",
            ],
            "inet 10.56.0.1/24",
            "10.57.0.0/24 dev stasis-tun0",
        );
    };
    check(pid, 0);
    let last = dump_and_restore_detached(pid, 2, check);
    net.pids.push(last);
    finish_program(dir.path(), last);
}

/// Issue 17: a macvlan in source mode with its list of source addresses
/// (three, one added and removed again) comes back with that list, its
/// mode and its lower device (the end of a veth pair of the namespace),
/// twice: `ip -d link` (which lists the addresses) and the routing state
/// as they were.
#[test]
fn twice_keeps_a_macvlan_in_source_mode_with_its_addresses() {
    let sh = "ip link add stasis-l0 type veth peer name stasis-l1 \
        && ip link add stasis-ms link stasis-l0 type macvlan mode source \
        && for m in 02:00:00:00:00:05 02:00:00:00:00:06 02:00:00:00:00:07 02:00:00:00:00:08; do \
           ip link set stasis-ms type macvlan macaddr add $m || exit 1; done \
        && ip link set stasis-ms type macvlan macaddr del 02:00:00:00:00:06 \
        && ip link set stasis-l0 up && ip link set stasis-ms address 02:55:00:00:00:09 up \
        && ip addr add 10.56.0.1/24 dev stasis-ms \
        && touch \"$0/ready\" && exec sleep 1000";
    let (pid, _dir) = start_in_netns(&["sh", "-c", sh]);
    let mut net = ContainerNet {
        names: Vec::new(),
        pids: vec![pid],
    };
    let before = (links_state(pid), routing_state(pid));
    let text = format!("{:?}", before.0);
    for want in [
        "\"source\"",
        "02:00:00:00:00:05",
        "02:00:00:00:00:07",
        "02:00:00:00:00:08",
        "\"macaddr_count\": Number(3)",
    ] {
        assert!(text.contains(want), "{want} set up: {text}");
    }
    let check = |pid: i32, round: u32| {
        let what = format!("round {round}");
        assert_routing_state(&what, pid, &before.1);
        assert_same(
            &format!("{what}: ip -d link show"),
            &before.0,
            &links_state(pid),
        );
    };
    let last = dump_and_restore_detached(pid, 2, check);
    net.pids.push(last);
}

/// Loads a BPF program of type `BPF_PROG_TYPE_LWT_XMIT` (`r0 = 0;
/// exit`: `BPF_OK`) and pins it at the path its first argument names
/// (`bpf(2)` by ctypes; nothing to compile).
const BPF_LWT_LOADER: &str = "import ctypes, struct, sys\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
insns = ctypes.create_string_buffer(struct.pack('<BBhi', 0xb7, 0, 0, 0) + struct.pack('<BBhi', 0x95, 0, 0, 0))\n\
lic = ctypes.create_string_buffer(b'GPL')\n\
attr = ctypes.create_string_buffer(struct.pack('<IIQQIIQII16s', 12, 2, ctypes.addressof(insns), ctypes.addressof(lic), 0, 0, 0, 0, 0, b'stasis_lwt'), 128)\n\
fd = libc.syscall(321, 5, attr, 128)\n\
if fd < 0:\n    sys.exit('BPF_PROG_LOAD: errno %d' % ctypes.get_errno())\n\
path = ctypes.create_string_buffer(sys.argv[1].encode())\n\
pin = ctypes.create_string_buffer(struct.pack('<QII', ctypes.addressof(path), fd, 0), 128)\n\
if libc.syscall(321, 6, pin, 128) != 0:\n    sys.exit('BPF_OBJ_PIN: errno %d' % ctypes.get_errno())\n";

/// A route whose encapsulation is a BPF program (`encap bpf xmit`, the
/// program's pin removed once the route holds it): refused by name (the
/// kernel gives the program back by id and name, not as something to
/// load again).
#[test]
fn refuses_a_route_with_a_bpf_encapsulation() {
    let dir = tempfile::tempdir().unwrap();
    let loader = dir.path().join("load.py");
    std::fs::write(&loader, BPF_LWT_LOADER).unwrap();
    let sh = format!(
        "mount -t bpf bpf /sys/fs/bpf && python3 {} /sys/fs/bpf/stasis-lwt \
         && ip link add stasis-l0 type veth peer name stasis-l1 && ip link set stasis-l0 up \
         && ip route add 10.57.0.0/24 encap bpf xmit pinned /sys/fs/bpf/stasis-lwt dev stasis-l0 \
         && rm /sys/fs/bpf/stasis-lwt && umount /sys/fs/bpf && exec sleep 1000",
        loader.display()
    );
    refused(
        &["--net", "--mount", "--fork", "sh", "-c", &sh],
        |up| child_running(up, "sleep 1000"),
        "the route to 10.57.0.0/24 in table 254 (an encapsulation bpf",
    );
}

/// A veth of the tree's network namespace whose peer is in a third one
/// (neither the tree's nor the dumper's): refused by name.
#[test]
fn refuses_a_veth_whose_peer_is_in_a_third_namespace() {
    let third = format!("stasis-third-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "add", &third]).status();
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(third.clone());
    refused(
        &[
            "--net",
            "--fork",
            "sh",
            "-c",
            &format!(
                "ip link add stasis-v1 type veth peer name stasis-v2 netns {third} && exec sleep 1000"
            ),
        ],
        |up| child_running(up, "sleep 1000"),
        "its network namespace has the veth stasis-v1 whose peer is in a third network namespace",
    );
}

/// The interfaces a container test makes in this namespace, removed
/// whatever happens (with the processes it started).
struct ContainerNet {
    names: Vec<&'static str>,
    pids: Vec<i32>,
}

impl Drop for ContainerNet {
    fn drop(&mut self) {
        for &p in &self.pids {
            if alive(p) {
                // SAFETY: killing a process this test started or restored.
                unsafe { libc::kill(p, libc::SIGKILL) };
                let _ = waitpid_timeout(p, Duration::from_secs(10));
            }
        }
        for n in &self.names {
            let _ = Command::new("ip")
                .args(["link", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Runs `ip ARGS` (in the network namespace of `pid`, if given) and
/// returns its output; fails the test if it fails.
fn ip(pid: Option<i32>, args: &str) -> String {
    let mut c = match pid {
        Some(p) => {
            let mut c = Command::new("nsenter");
            c.args(["-t", &p.to_string(), "-n", "ip"]);
            c
        }
        None => Command::new("ip"),
    };
    let o = c
        .args(args.split_whitespace())
        .output()
        .expect("running ip");
    assert!(
        o.status.success(),
        "ip {args} (in the namespace of {pid:?}): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The receive queue of the TCP socket bound to `local` (`ADDR:PORT` as
/// /proc/net/tcp writes it) in the network namespace of `pid`.
fn rx_queue(pid: i32, local: &str) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    t.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // An established connection (01) from that address.
        (f.get(1) == Some(&local) && f.get(3) == Some(&"01"))
            .then(|| f.get(4)?.split(':').nth(1))
            .flatten()
            .and_then(|q| u64::from_str_radix(q, 16).ok())
    })
}

/// A tree started the container way (issue 17): its network namespace has
/// a veth `eth0` (its hardware address, an MTU of 1400, IPv4 and IPv6
/// addresses, a default route and another through the gateway) whose peer
/// is in this namespace, a port of the bridge `stasisbr0` with the
/// gateway's address. Inside, a TCP server on eth0's address with a
/// connection from this process (this namespace) and bytes queued. Dumped
/// (killed) and restored: the interfaces, addresses and routes are back
/// on both sides, and the connection carries bytes both ways.
#[test]
fn a_container_veth_on_a_bridge_comes_back_with_its_connection() {
    use std::io::{Read, Write};
    workloads();
    let mut net = ContainerNet {
        names: vec!["stasisv0h", "stasisbr0"],
        pids: Vec::new(),
    };
    // Left by an earlier run killed half-way.
    for n in &net.names {
        let _ = Command::new("ip")
            .args(["link", "del", n])
            .stderr(Stdio::null())
            .status();
    }
    ip(None, "link add stasisbr0 type bridge");
    ip(None, "addr add 10.77.0.1/24 dev stasisbr0");
    ip(None, "link set stasisbr0 up");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Listens once eth0 has its address; after the connection, says
    // hello, then reads (once told to go) until "after\n" and echoes it
    // all, then waits for the end.
    let server = "import os, socket, sys, time\n\
        d = sys.argv[1]\n\
        while True:\n    \
            s = socket.socket()\n    \
            try:\n        s.bind(('10.77.0.2', 7777))\n        break\n    \
            except OSError:\n        s.close()\n        time.sleep(0.02)\n\
        s.listen(1)\n\
        open(d + '/listening', 'w').close()\n\
        c, _ = s.accept()\n\
        c.sendall(b'hello\\n')\n\
        while not os.path.exists(d + '/go'):\n    time.sleep(0.02)\n\
        buf = b''\n\
        while not buf.endswith(b'after\\n'):\n    \
            b = c.recv(4096)\n    \
            if not b:\n        sys.exit('eof before after')\n    \
            buf += b\n\
        c.sendall(b'echo ' + buf)\n\
        while c.recv(4096):\n    pass\n";
    let mut c = Command::new("unshare");
    c.args(["--net", "python3", "-c", server])
        .arg(d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().expect("starting unshare");
    let pid = child.id() as i32;
    net.pids.push(pid);
    wait_until(
        Duration::from_secs(10),
        "the tree's network namespace",
        || {
            std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
                != std::fs::read_link("/proc/self/ns/net").ok()
        },
    );
    ip(
        None,
        &format!("link add stasisv0h type veth peer name eth0 netns {pid}"),
    );
    ip(None, "link set stasisv0h master stasisbr0 up");
    ip(Some(pid), "link set lo up");
    ip(
        Some(pid),
        "link set eth0 address 02:77:00:00:00:02 mtu 1400 up",
    );
    ip(Some(pid), "addr add 10.77.0.2/24 dev eth0");
    ip(Some(pid), "-6 addr add fd77::2/64 dev eth0 nodad");
    ip(Some(pid), "route add default via 10.77.0.1");
    ip(Some(pid), "route add 10.78.0.0/24 via 10.77.0.1 metric 50");
    let host_mac = ip(None, "-o link show stasisv0h");
    let host_mac = host_mac
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("the host end's address")
        .to_string();
    wait_until(Duration::from_secs(20), "the server to listen", || {
        d.join("listening").exists()
    });
    let mut client = std::net::TcpStream::connect(("10.77.0.2", 7777)).expect("connecting");
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut hello = [0u8; 6];
    client.read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"hello\n");
    client.write_all(b"before\n").unwrap();
    // 10.77.0.2:7777, as /proc/net/tcp writes it.
    let local = "02004D0A:1E61";
    wait_until(
        Duration::from_secs(10),
        "the bytes queued in the server",
        || rx_queue(pid, local) == Some(7),
    );
    let img = d.join("images");
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "dump of the container tree");
    let _ = child.wait();
    // The pair went with the tree.
    let gone = Command::new("ip")
        .args(["link", "show", "stasisv0h"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!gone.success(), "the host end outlived the dump");
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&o, "restore of the container tree");
    let pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
    net.pids.push(pid);
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap(),
        "the restored tree is in our network namespace"
    );
    let link = ip(Some(pid), "-o link show eth0");
    for want in ["link/ether 02:77:00:00:00:02", "mtu 1400", ",UP"] {
        assert!(link.contains(want), "{want} in {link}");
    }
    let addrs = ip(Some(pid), "-o addr show dev eth0");
    for want in ["inet 10.77.0.2/24", "inet6 fd77::2/64"] {
        assert!(addrs.contains(want), "{want} in {addrs}");
    }
    let routes = ip(Some(pid), "route show");
    for want in [
        "default via 10.77.0.1 dev eth0",
        "10.78.0.0/24 via 10.77.0.1 dev eth0 metric 50",
        "10.77.0.0/24 dev eth0",
    ] {
        assert!(routes.contains(want), "{want} in {routes}");
    }
    let host = ip(None, "-o link show stasisv0h");
    for want in [
        "master stasisbr0".to_string(),
        format!("link/ether {host_mac}"),
        ",UP".to_string(),
    ] {
        assert!(host.contains(&want), "{want} in {host}");
    }
    // The connection, both ways: the bytes queued at the dump, then more.
    std::fs::write(d.join("go"), b"").unwrap();
    client.write_all(b"after\n").unwrap();
    let mut reply = [0u8; 18];
    client
        .read_exact(&mut reply)
        .unwrap_or_else(|e| panic!("no answer over the restored connection: {e}"));
    assert_eq!(&reply, b"echo before\nafter\n");
    drop(client);
    let st = waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(st, (Some(0), None), "the restored server's exit");
}

/// A bind mount of a host directory in the tree's mount namespace is made
/// again in the new one, and a file open there is reopened in it (a plain
/// `sleep` tree: what it sees is checked from outside, through its root
/// and its fd).
#[test]
fn twice_keeps_a_bind_mount() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("marker"), b"bound here").unwrap();
    let _r = Refused::spawn(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--mount", "sh", "-c"])
            .arg("mount --bind \"$0\" /srv && exec sleep 1000 3</srv/marker")
            .arg(dir.path()),
    );
    let pid = _r.sleeper(10);
    let seen = |pid: i32| std::fs::read(format!("/proc/{pid}/root/srv/marker")).unwrap_or_default();
    assert_eq!(seen(pid), b"bound here");
    let pid = dump_and_restore_detached(pid, 2, |pid, round| {
        assert_eq!(seen(pid), b"bound here", "round {round}");
        // Its fd 3 is on the file under the bind mount (reopened in the
        // restored mount namespace: /srv/marker is not the restorer's).
        let link = std::fs::read_link(format!("/proc/{pid}/fd/3")).unwrap_or_default();
        assert_eq!(link, PathBuf::from("/srv/marker"), "round {round}");
        let through_fd = std::fs::read(format!("/proc/{pid}/fd/3")).unwrap_or_default();
        assert_eq!(through_fd, b"bound here", "round {round}");
        let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        assert!(
            info.lines()
                .any(|l| l.split_whitespace().nth(4) == Some("/srv")),
            "round {round}: no mount on /srv:\n{info}"
        );
    });
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// A file of 200 MiB with 80 MiB of data in the tree's tmpfs (issue 17:
/// more than 64 MiB of tmpfs content was refused, it went into the
/// manifest; it is in the content pack now) comes back byte for byte,
/// its holes still holes.
#[test]
fn a_tmpfs_file_of_80_mib_comes_back() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    {
        let f = std::fs::File::create_new(&src).unwrap();
        let mut piece = vec![0u8; 1 << 20];
        for (r, at) in [(0u64, 3u64 << 20), (1, (130 << 20) + 777)] {
            for i in 0..40u64 {
                for (j, b) in piece.iter_mut().enumerate() {
                    *b = (j as u64 ^ (r << 6) ^ (i * 7)).to_le_bytes()[0];
                }
                f.write_all_at(&piece, at + (i << 20)).unwrap();
            }
        }
        f.set_len(200 << 20).unwrap();
    }
    let want = std::fs::read(&src).unwrap();
    let _r = Refused::spawn(Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "--mount", "sh", "-c"])
        .arg("mount -t tmpfs -o size=300m stasis-test /mnt && cp --sparse=always \"$0\" /mnt/big && exec sleep 1000")
        .arg(&src));
    let mut pid = _r.sleeper(20);
    let img = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "dump");
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "restore");
    pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
    let path = format!("/proc/{pid}/root/mnt/big");
    let back = std::fs::read(&path).unwrap();
    let blocks = std::fs::metadata(&path).unwrap().blocks() * 512;
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
    assert!(
        back == want,
        "{} bytes back, not the {} saved",
        back.len(),
        want.len()
    );
    assert!(blocks < 82 << 20, "{blocks} bytes allocated: holes filled");
}

/// The mounts a container runtime makes, in the tree's mount namespace:
/// a tmpfs (as /dev) holding a device node, a FIFO, a link, a private
/// directory and a file a device is bound on; nested in it a devpts
/// instance, an mqueue and a read-only tmpfs with a file; a sysfs of the
/// tree's network namespace, read-only. Made again in the new namespace,
/// in order, twice (checked from outside, through the tree's root).
#[test]
fn twice_keeps_container_mounts() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let script = "mount -t tmpfs -o mode=755,size=1m stasis-dev /mnt && \
        mkdir /mnt/pts /mnt/mqueue /mnt/shm /mnt/priv && chmod 0700 /mnt/priv && \
        chown 1:2 /mnt/priv && mknod -m 0666 /mnt/null c 1 3 && \
        mkfifo -m 0640 /mnt/fifo && ln -s /proc/self/fd /mnt/fd && touch /mnt/bound && \
        mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /mnt/pts && \
        mount -t mqueue mqueue /mnt/mqueue && \
        mount -t tmpfs -o size=64k shm /mnt/shm && echo hi >/mnt/shm/x && \
        mount -o remount,bind,ro /mnt/shm && mount --bind /dev/null /mnt/bound && \
        mount -t sysfs -o ro,nosuid sysfs /sys && exec sleep 1000";
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "--ipc",
        "--net",
        "sh",
        "-c",
        script,
    ]));
    let pid = _r.sleeper(10);
    let check = |pid: i32, round: &str| {
        let root = format!("/proc/{pid}/root");
        let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        // (type, per-mount options) of the last mount on `at`.
        let mount = |at: &str| {
            info.lines()
                .rfind(|l| l.split_whitespace().nth(4) == Some(at))
                .map(|l| {
                    let (a, b) = l.split_once(" - ").unwrap();
                    let kind = b.split_whitespace().next().unwrap().to_string();
                    (kind, a.split_whitespace().nth(5).unwrap().to_string())
                })
                .unwrap_or_default()
        };
        assert_eq!(mount("/mnt").0, "tmpfs", "{round}: {info}");
        assert_eq!(mount("/mnt/pts").0, "devpts", "{round}: {info}");
        assert_eq!(mount("/mnt/mqueue").0, "mqueue", "{round}: {info}");
        let shm = mount("/mnt/shm");
        assert_eq!(shm.0, "tmpfs", "{round}: {info}");
        assert!(shm.1.split(',').any(|o| o == "ro"), "{round}: {info}");
        let sys = mount("/sys");
        assert_eq!(sys.0, "sysfs", "{round}: {info}");
        assert!(sys.1.split(',').any(|o| o == "ro"), "{round}: {info}");
        assert!(sys.1.split(',').any(|o| o == "nosuid"), "{round}: {info}");
        assert_eq!(mount("/mnt/bound").0, "devtmpfs", "{round}: {info}");
        let md = |p: &str| std::fs::symlink_metadata(format!("{root}{p}")).unwrap();
        let null = md("/mnt/null");
        assert!(null.file_type().is_char_device(), "{round}");
        assert_eq!(
            (null.rdev(), null.mode() & 0o7777),
            (libc::makedev(1, 3), 0o666),
            "{round}"
        );
        let fifo = md("/mnt/fifo");
        assert!(fifo.file_type().is_fifo(), "{round}");
        assert_eq!(fifo.mode() & 0o7777, 0o640, "{round}");
        let privd = md("/mnt/priv");
        assert_eq!(
            (privd.mode() & 0o7777, privd.uid(), privd.gid()),
            (0o700, 1, 2),
            "{round}"
        );
        assert_eq!(
            std::fs::read_link(format!("{root}/mnt/fd")).unwrap(),
            PathBuf::from("/proc/self/fd"),
            "{round}"
        );
        assert_eq!(
            std::fs::read(format!("{root}/mnt/shm/x")).unwrap(),
            b"hi\n",
            "{round}"
        );
        assert!(md("/mnt/pts/ptmx").file_type().is_char_device(), "{round}");
        // The sysfs is of the tree's network namespace: only lo.
        let nets: Vec<String> = std::fs::read_dir(format!("{root}/sys/class/net"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(nets, vec!["lo".to_string()], "{round}");
    };
    check(pid, "before");
    let pid = dump_and_restore_detached(pid, 2, |pid, round| {
        check(pid, &format!("round {round}"));
    });
    // SAFETY: killing the restored tree (PID 1 of its namespace).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// A root of its own that the dumper cannot see (a tmpfs mounted in the
/// tree's namespace only, pivoted into): refused by name.
#[test]
fn refuses_a_root_the_dumper_cannot_see() {
    refused(
        &[
            "--mount",
            "sh",
            "-c",
            // A fresh tmpfs as the new root (the old one put on its /old).
            // (/lib64 and the like: links into /usr, or /usr/lib64 itself.)
            "mount --make-rprivate / && mount -t tmpfs tmpfs /mnt && \
             mkdir /mnt/usr /mnt/old && mount --bind /usr /mnt/usr && \
             for d in bin lib lib64; do ln -s usr/$d /mnt/$d; done && cd /mnt && \
             pivot_root . old && exec /usr/bin/sleep 1000",
        ],
        |up| (cmdline_of(up).trim() == "/usr/bin/sleep 1000").then_some(up),
        "that no mount of the dumper's mount namespace holds",
    );
}

/// The program of [`twice_keeps_a_root_of_its_own`], run in its new root:
/// its cwd in /data/sub, fd 3 on /data/file; says so in /data/ready,
/// waits for /data/go, then checks its cwd, its root (argv[1], a file
/// only the host's root has, is not seen), fd 3's content and a file under
/// /tmp (its tmpfs); /data/result says PASS or FAIL and why.
const OWN_ROOT_PROGRAM: &str = r#"
import os, sys, time
os.chdir("/data/sub")
fd = os.open("/data/file", os.O_RDONLY)
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
with open("/tmp/note", "w") as f:
    f.write("in its tmpfs")
open("/data/ready", "w").close()
while not os.path.exists("/data/go"):
    time.sleep(0.05)
bad = []
if os.getcwd() != "/data/sub":
    bad.append("cwd " + os.getcwd())
if os.path.exists(sys.argv[1]):
    bad.append("the host's root is seen: " + sys.argv[1])
if os.pread(3, 100, 0) != b"of its rootfs":
    bad.append("fd 3 reads %r" % os.pread(3, 100, 0))
if open("/tmp/note").read() != "in its tmpfs":
    bad.append("/tmp/note")
with open("/data/result.tmp", "w") as f:
    f.write("FAIL " + "; ".join(bad) if bad else "PASS")
os.rename("/data/result.tmp", "/data/result")
"#;

/// The mounts of `pid` as (root, mount point, type, rw/ro), sorted.
fn mount_list(pid: i32) -> Vec<(String, String, String, String)> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let mut v: Vec<_> = info
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split_whitespace().collect();
            let rw = f.get(5)?.split(',').next()?.to_string();
            Some((
                f.get(3)?.to_string(),
                f.get(4)?.to_string(),
                b.split_whitespace().next()?.to_string(),
                rw,
            ))
        })
        .collect();
    v.sort();
    v
}

/// A container-like tree (issue 17): a mount and PID namespace of its own
/// whose root is a directory of the host (bound on itself, with /usr bound
/// read-only, a tmpfs on /tmp and its proc on /proc) it pivoted into
/// (`pivot_root . .`, the old root detached, as runc does). Dumped and
/// restored twice, it has the same directory as its root, the same cwd,
/// fd paths and mounts, and reads its files.
#[test]
fn twice_keeps_a_root_of_its_own() {
    use std::os::unix::fs::MetadataExt;
    // Restored trees (detached) are reparented to this process.
    workloads();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    for d in ["usr", "tmp", "proc", "data/sub"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    // /bin, /lib... as the host has them: directories bound, or links.
    let mut binds = String::new();
    for d in ["bin", "lib", "lib64", "sbin"] {
        let host = std::path::Path::new("/").join(d);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                std::os::unix::fs::symlink(std::fs::read_link(&host).unwrap(), rootfs.join(d))
                    .unwrap();
            }
            Ok(m) if m.is_dir() => {
                std::fs::create_dir(rootfs.join(d)).unwrap();
                binds.push_str(&format!(
                    "mount --bind -o ro /{d} \"$r/{d}\" && mount -o remount,bind,ro \"$r/{d}\" && "
                ));
            }
            _ => {}
        }
    }
    std::fs::write(rootfs.join("data/file"), b"of its rootfs").unwrap();
    std::fs::write(rootfs.join("data/in"), b"").unwrap();
    // A file only the host's root has.
    let host_marker = dir.path().join("host-only");
    std::fs::write(&host_marker, b"").unwrap();
    let script = format!(
        "r=\"$0\" && mount --make-rprivate / && mount --bind \"$r\" \"$r\" && \
         mount --bind /usr \"$r/usr\" && mount -o remount,bind,ro \"$r/usr\" && {binds}\
         mount -t tmpfs -o size=1m tmpfs \"$r/tmp\" && mount -t proc proc \"$r/proc\" && \
         cd \"$r\" && pivot_root . . && umount -l . && cd / && \
         exec python3 -c \"$1\" \"$2\" </data/in >/data/out.log 2>&1"
    );
    let _r = Refused::spawn(
        Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "sh", "-c"])
            .arg(&script)
            .arg(&rootfs)
            .arg(OWN_ROOT_PROGRAM)
            .arg(&host_marker),
    );
    let up = _r.unshare.id() as i32;
    let ready = rootfs.join("data/ready");
    wait_until(Duration::from_secs(20), "the tree in its new root", || {
        ready.exists()
    });
    let pid = descendants(up).first().copied().expect("the tree's root");
    let want_root = std::fs::metadata(&rootfs).unwrap();
    let check = |pid: i32, round: &str| {
        let root = std::fs::metadata(format!("/proc/{pid}/root/.")).unwrap();
        assert_eq!(
            (root.dev(), root.ino()),
            (want_root.dev(), want_root.ino()),
            "{round}: its root is not the rootfs directory"
        );
        assert_eq!(
            std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
            PathBuf::from("/data/sub"),
            "{round}"
        );
        for (fd, path) in [(0, "/data/in"), (1, "/data/out.log"), (3, "/data/file")] {
            assert_eq!(
                std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap(),
                PathBuf::from(path),
                "{round}: fd {fd}"
            );
        }
        assert_eq!(
            std::fs::read(format!("/proc/{pid}/fd/3")).unwrap(),
            b"of its rootfs",
            "{round}"
        );
        assert_eq!(
            std::fs::read(format!("/proc/{pid}/root/tmp/note")).unwrap(),
            b"in its tmpfs",
            "{round}"
        );
    };
    check(pid, "before");
    let mounts = mount_list(pid);
    assert!(
        mounts.iter().any(|m| m.1 == "/tmp" && m.2 == "tmpfs")
            && mounts.iter().any(|m| m.1 == "/proc" && m.2 == "proc")
            && mounts.iter().any(|m| m.1 == "/usr" && m.3 == "ro"),
        "{mounts:?}"
    );
    let pid = dump_and_restore_detached(pid, 2, |pid, round| {
        let round = format!("round {round}");
        check(pid, &round);
        assert_eq!(mount_list(pid), mounts, "{round}");
    });
    std::fs::write(rootfs.join("data/go"), b"").unwrap();
    let result = rootfs.join("data/result");
    wait_until(Duration::from_secs(20), "the program's result", || {
        result.exists()
    });
    let out = std::fs::read_to_string(rootfs.join("data/out.log")).unwrap_or_default();
    assert_eq!(
        std::fs::read_to_string(&result).unwrap(),
        "PASS",
        "output:\n{out}"
    );
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// The program of [`twice_keeps_a_terminal_of_its_own_devpts`]: in a
/// devpts instance of its own on /dev/pts, it opens two pty pairs through
/// /dev/ptmx (that instance's: indexes 0 and 1), closes the first, gives
/// the second's slave its own termios (no echo, VINTR ^G) and queues a
/// line to it, says its slave's name and index in DIR/ready, waits for
/// DIR/go, then checks the slave's name, the master's index (TIOCGPTN),
/// that /dev/pts/0 is gone, the termios, the queued line, and bytes both
/// ways; DIR/result says PASS or FAIL and why.
const PTY_PROGRAM: &str = r#"
import os, sys, termios, fcntl, struct
d = sys.argv[1]
m0, s0 = os.openpty()
m1, s1 = os.openpty()
os.close(m0); os.close(s0)
def index(m):
    return struct.unpack("I", fcntl.ioctl(m, 0x80045430, b"\0" * 4))[0]  # TIOCGPTN
a = termios.tcgetattr(s1)
a[3] &= ~termios.ECHO
a[6][termios.VINTR] = b"\x07"
termios.tcsetattr(s1, termios.TCSANOW, a)
a = termios.tcgetattr(s1)
os.write(m1, b"queued\n")
name, idx = os.ttyname(s1), index(m1)
with open(d + "/ready.tmp", "w") as f:
    f.write("%s %d\n" % (name, idx))
os.rename(d + "/ready.tmp", d + "/ready")
import select
while not os.path.exists(d + "/go"):
    select.select([], [], [], 0.02)
bad = []
if os.ttyname(s1) != name or index(m1) != idx:
    bad.append("slave %s index %d, were %s %d" % (os.ttyname(s1), index(m1), name, idx))
if os.path.exists("/dev/pts/0"):
    bad.append("/dev/pts/0 exists")
if termios.tcgetattr(s1) != a:
    bad.append("termios %r, was %r" % (termios.tcgetattr(s1), a))
os.set_blocking(s1, False); os.set_blocking(m1, False)
try:
    got = os.read(s1, 100)
except BlockingIOError:
    got = b""
if got != b"queued\n":
    bad.append("the slave read %r" % got)
os.write(s1, b"up\n")
got = b""
while len(got) < 4 and select.select([m1], [], [], 5)[0]:
    got += os.read(m1, 100)
if got != b"up\r\n":
    bad.append("the master read %r" % got)
os.write(m1, b"down\n")
select.select([s1], [], [], 5)
got = os.read(s1, 100)
if got != b"down\n":
    bad.append("the slave then read %r" % got)
with open(d + "/result.tmp", "w") as f:
    f.write("FAIL: " + "; ".join(bad) if bad else "PASS")
os.rename(d + "/result.tmp", d + "/result")
"#;

/// A pty pair of a devpts instance of its own (a container's /dev/pts,
/// opened through /dev/ptmx), with termios and a queued line, at index 1
/// (index 0 free): made again from the new instance's ptmx at index 1
/// (and /dev/pts/0 left free), twice; the program checks the rest
/// itself.
#[test]
fn twice_keeps_a_terminal_of_its_own_devpts() {
    // Restored trees (detached) are reparented to this process.
    workloads();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let _r = Refused::spawn(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts && exec python3 -c \"$0\" \"$1\"",
        PTY_PROGRAM,
        &d,
    ]));
    let up = _r.unshare.id() as i32;
    let ready = dir.path().join("ready");
    wait_until(
        Duration::from_secs(20),
        "the pty program to be ready",
        || ready.exists(),
    );
    assert_eq!(
        std::fs::read_to_string(&ready).unwrap().trim(),
        "/dev/pts/1 1"
    );
    let pid = my_children_of(up)
        .first()
        .copied()
        .expect("unshare's child");
    // Regression: pty 1 of the dumper's devpts held here too (outside the
    // tree) was taken for the tree's pty 1, shared with this process.
    let mut host = Vec::new();
    for _ in 0..8 {
        use std::os::fd::AsRawFd;
        let m = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/ptmx")
            .unwrap();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", m.as_raw_fd())).unwrap();
        let index: u32 = info
            .lines()
            .find_map(|l| l.strip_prefix("tty-index:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        host.push(m);
        if index >= 1 {
            break;
        }
    }
    let restored = Restored(std::cell::Cell::new(0));
    let pid = dump_and_restore_detached(pid, 2, |pid, round| {
        restored.0.set(pid);
        let pts = |n: u32| std::path::Path::new(&format!("/proc/{pid}/root/dev/pts/{n}")).exists();
        assert!(
            pts(1) && !pts(0),
            "round {round}: /dev/pts/1 and no /dev/pts/0"
        );
    });
    drop(host);
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let result = dir.path().join("result");
    wait_until(Duration::from_secs(20), "the pty program's result", || {
        result.exists()
    });
    let r = std::fs::read_to_string(&result).unwrap();
    waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(r, "PASS");
}

/// The program of [`twice_keeps_an_unlinked_queue_of_its_own_ipc_namespace`]:
/// argv[1] is its directory (`ready`, `go`, `result`).
const UNLINKED_QUEUE_PROGRAM: &str = r#"
import ctypes, os, sys, time
lib = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]
def make(maxmsg, msgsize, flags):
    a = Attr(0, maxmsg, msgsize, 0)
    q = lib.mq_open(b"/q", os.O_CREAT | os.O_EXCL | flags, 0o600, ctypes.byref(a))
    assert q >= 0, ctypes.get_errno()
    return q
def send(q, data, prio):
    assert lib.mq_send(q, data, len(data), prio) == 0, ctypes.get_errno()
def recv(q, size):
    b = ctypes.create_string_buffer(size)
    p = ctypes.c_uint(0)
    n = lib.mq_receive(q, b, size, ctypes.byref(p))
    return (b.raw[:n], p.value) if n >= 0 else None
def attr(q):
    a = Attr()
    assert lib.mq_getattr(q, ctypes.byref(a)) == 0
    return (a.flags, a.maxmsg, a.msgsize, a.curmsgs)
old = make(3, 16, os.O_RDWR | os.O_NONBLOCK)
send(old, b"old-low", 1); send(old, b"old-high", 6)
assert lib.mq_unlink(b"/q") == 0
new = make(5, 32, os.O_RDWR | os.O_NONBLOCK)
send(new, b"new", 2)
open(d + "/ready", "w").close()
while not os.path.exists(d + "/go"):
    time.sleep(0.05)
bad = []
if attr(old) != (os.O_NONBLOCK, 3, 16, 2):
    bad.append("the unlinked queue's attributes are %r" % (attr(old),))
if attr(new) != (os.O_NONBLOCK, 5, 32, 1):
    bad.append("the named queue's attributes are %r" % (attr(new),))
got = [recv(old, 16), recv(old, 16), recv(old, 16)]
if got != [(b"old-high", 6), (b"old-low", 1), None]:
    bad.append("the unlinked queue gave %r" % got)
byname = lib.mq_open(b"/q", os.O_RDONLY | os.O_NONBLOCK)
got = [recv(byname, 32), recv(new, 32)] if byname >= 0 else ["no /q"]
if got != [(b"new", 2), None]:
    bad.append("/q gave %r" % got)
with open(d + "/result.tmp", "w") as f:
    f.write("FAIL: " + "; ".join(bad) if bad else "PASS")
os.rename(d + "/result.tmp", d + "/result")
"#;

/// A queue of its own IPC namespace unlinked since it was opened, whose
/// name another queue took since: both come back (the unlinked one made
/// under a name of its own, then unlinked; the other, saved with the
/// namespace, by name), each with its attributes and messages, twice;
/// the program checks them itself.
#[test]
fn twice_keeps_an_unlinked_queue_of_its_own_ipc_namespace() {
    workloads(); // Restored trees (detached) are reparented to this process.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let r = Refused::spawn(Command::new("unshare").args([
        "--ipc",
        "--pid",
        "--fork",
        "--mount-proc",
        "python3",
        "-c",
        UNLINKED_QUEUE_PROGRAM,
        &d,
    ]));
    let up = r.unshare.id() as i32;
    wait_until(Duration::from_secs(20), "the queue program", || {
        dir.path().join("ready").exists()
    });
    let pid = my_children_of(up)
        .first()
        .copied()
        .expect("unshare's child");
    let restored = Restored(std::cell::Cell::new(0));
    let pid = dump_and_restore_detached(pid, 2, |pid, _| restored.0.set(pid));
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let result = dir.path().join("result");
    wait_until(
        Duration::from_secs(20),
        "the queue program's result",
        || result.exists(),
    );
    waitpid_timeout(pid, Duration::from_secs(30));
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "PASS");
}

/// A POSIX message queue of its own IPC namespace with a notification
/// registered (`mq_notify`: refilling the queue at the dump would send
/// it, and a restore cannot register it again), refused before anything
/// is stopped.
#[test]
fn refuses_a_queue_with_a_notification_registered() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let program = "import ctypes, os, signal, struct, sys\n\
        lib = ctypes.CDLL(None, use_errno=True)\n\
        q = lib.mq_open(b'/stasis-notified', os.O_CREAT | os.O_RDWR, 0o600, None)\n\
        ev = ctypes.create_string_buffer(struct.pack('QiI', 0, signal.SIGUSR1, 0), 64)\n\
        assert q >= 0 and lib.mq_notify(q, ev) == 0, ctypes.get_errno()\n\
        open(sys.argv[1], 'w').close()\n\
        signal.pause()\n";
    let path = ready.to_str().unwrap();
    refused(
        &[
            "--ipc",
            "--pid",
            "--fork",
            "--mount-proc",
            "python3",
            "-c",
            program,
            path,
        ],
        |up| {
            ready
                .exists()
                .then(|| my_children_of(up).first().copied())
                .flatten()
        },
        "its POSIX message queue /stasis-notified has a notification registered",
    );
}

/// An mqueue of its own mount namespace showing queues of the dumper's
/// IPC namespace (the tree has none of its own): the queue the tree holds
/// an fd on is saved with it and made again at the restore, over what
/// holds its name then; one no fd names is not saved (found as it is at
/// the restore: here, removed).
#[test]
fn a_queue_of_the_dumpers_ipc_namespace_held_by_an_fd_comes_back() {
    workloads(); // Restored trees (detached) are reparented to this process.
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let (held, loose) = (
        format!("stasis-test-qh{}", std::process::id()),
        format!("stasis-test-ql{}", std::process::id()),
    );
    // Opened through the mount, one message queued on it.
    let program = "import ctypes, os, signal, sys\n\
        lib = ctypes.CDLL(None, use_errno=True)\n\
        q = os.open('/mnt/' + sys.argv[2], os.O_RDWR | os.O_NONBLOCK)\n\
        assert lib.mq_send(q, b'kept', 4, 3) == 0, ctypes.get_errno()\n\
        open(sys.argv[1], 'w').close()\n\
        signal.pause()\n";
    let r = Refused::spawn(Command::new("unshare").args([
        "--mount",
        "sh",
        "-c",
        &format!(
            "mount -t mqueue mqueue /mnt && touch /mnt/{held} /mnt/{loose} && exec python3 -c \"$0\" \"$1\" {held}"
        ),
        program,
        ready.to_str().unwrap(),
    ]));
    let pid = r.unshare.id() as i32;
    wait_until(Duration::from_secs(20), "the queue program", || {
        ready.exists()
    });
    let img = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "dump");
    drop(r);
    // Both removed, and the held one's name taken by another, empty queue.
    let sh = |script: String| {
        let o = Command::new("unshare")
            .args(["--mount", "sh", "-c"])
            .arg(format!("mount -t mqueue mqueue /mnt && {script}"))
            .output()
            .unwrap();
        assert_ok(&o, &script);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    sh(format!("rm /mnt/{held} /mnt/{loose} && touch /mnt/{held}"));
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "restore");
    let back = Restored(std::cell::Cell::new(
        i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap(),
    ));
    let pid = back.0.get();
    // The restored fd is on the queue of that name, which holds the message.
    let fd_ino = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.to_string_lossy().ends_with(&format!("/{held}")))
        })
        .map(|e| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(e.path()).unwrap()))
        .expect("the restored process's fd on the queue");
    let listing = sh(format!(
        "stat -c %i /mnt/{held} && cat /mnt/{held} && ls /mnt"
    ));
    let mut lines = listing.lines();
    assert_eq!(lines.next(), Some(fd_ino.to_string().as_str()), "{listing}");
    assert!(
        lines.next().is_some_and(|l| l.starts_with("QSIZE:4 ")),
        "{listing}"
    );
    assert!(!listing.contains(&loose), "{listing}");
    sh(format!("rm /mnt/{held}"));
}

/// Tracked dumps of the tree are incremental (the parent's processes are
/// found by their PIDs in the namespace), and the chain restores.
#[test]
fn incremental_chain() {
    let mut t = NsTree::start();
    let o = t.dump(&["--leave-running", "--track", "--json"]);
    assert_ok(&o, "dump 1");
    let o = t.dump(&["--leave-running", "--track", "--json"]);
    assert_ok(&o, "dump 2");
    let j = json(&o);
    assert_eq!(
        j["parent"], 1,
        "the second tracked dump is not incremental: {j}"
    );
    assert_ok(&t.dump(&[]), "dump 3");
    t.reap();
    t.restore(&[]);
    t.finish_pass();
}

// ---- time namespaces ----

/// The `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` of the time namespace of a
/// process, as seen inside it (ours plus its offsets: this test process
/// is in the host's), and the real time, all in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Clocks {
    mono: i64,
    boot: i64,
    real: i64,
}

fn clocks_inside(pid: i32) -> Clocks {
    const NSEC: i64 = 1_000_000_000;
    let read = |id: libc::clockid_t| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        assert_eq!(unsafe { libc::clock_gettime(id, &mut ts) }, 0);
        ts.tv_sec * NSEC + ts.tv_nsec
    };
    // Offsets of `timens_offsets` (of the namespace the process makes its
    // children in: the one it is in, here), in nanoseconds.
    let offsets = |of: &str| {
        let text = std::fs::read_to_string(format!("/proc/{of}/timens_offsets")).unwrap();
        let offset = |name: &str| {
            let f: Vec<i64> = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .unwrap_or_else(|| panic!("no {name} in {text:?}"))
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse().unwrap())
                .collect();
            f[0] * NSEC + f[1]
        };
        (offset("monotonic"), offset("boottime"))
    };
    // The host's clocks: ours less our own offsets.
    let (my_mono, my_boot) = offsets("self");
    let (mono, boot) = offsets(&pid.to_string());
    Clocks {
        mono: read(libc::CLOCK_MONOTONIC) - my_mono + mono,
        boot: read(libc::CLOCK_BOOTTIME) - my_boot + boot,
        real: read(libc::CLOCK_REALTIME),
    }
}

/// The restored tree of `root` is in one time namespace, not ours (each
/// of its processes makes its children there), whose clocks went on
/// from `before` (read before the dump): not backwards, not ahead of the
/// real time that passed less `unseen` (real time between the end of the
/// dump and the start of the restore: they stood still while the tree was
/// dumped), and still `days` ahead of the host's monotonic clock at least.
fn time_went_on(root: i32, before: Clocks, unseen: i64, days: i64, round: u32) {
    let ns = |p: i32, f: &str| std::fs::read_link(format!("/proc/{p}/ns/{f}")).unwrap();
    let theirs = ns(root, "time");
    assert_ne!(
        theirs,
        ns(std::process::id() as i32, "time"),
        "round {round}"
    );
    let tree: Vec<i32> = std::iter::once(root).chain(descendants(root)).collect();
    assert!(tree.len() >= 2, "round {round}: the tree is {tree:?}");
    for &p in &tree {
        assert_eq!(ns(p, "time"), theirs, "round {round}: process {p}");
        assert_eq!(
            ns(p, "time_for_children"),
            theirs,
            "round {round}: process {p}"
        );
    }
    let now = clocks_inside(root);
    let real = now.real - before.real;
    for (what, a, b) in [
        ("monotonic", before.mono, now.mono),
        ("boottime", before.boot, now.boot),
    ] {
        assert!(
            b >= a && b - a <= real - unseen + 1_000_000_000,
            "round {round}: the {what} clock inside went from {a} to {b} ns in {real} ns of real time, {unseen} ns of it between the dump and the restore"
        );
    }
    assert!(
        now.mono >= days * 86_400 * 1_000_000_000,
        "round {round}: {now:?}"
    );
    // The boot-time clock less the monotonic one is what it was (only a
    // suspend of the host changes it).
    assert!(
        ((now.boot - now.mono) - (before.boot - before.mono)).abs() < 1_000_000_000,
        "round {round}: {before:?} then {now:?}"
    );
}

/// A shell and its child in a time namespace of their own (made by
/// `unshare --time --fork`: its monotonic clock 1000 days ahead of the
/// host's, its boot-time clock 100 s), dumped and restored twice: each
/// time in a new time namespace whose clocks go on from the dump (read
/// from outside: the host's clocks plus the namespace's offsets).
#[test]
fn twice_keeps_a_time_namespace() {
    time_namespace_twice(&[]);
}

/// The same in a user namespace of its own (which owns the time one: the
/// root stub, in the new user namespace, writes the offsets) and a PID
/// namespace whose init is the shell.
#[test]
fn twice_keeps_a_time_namespace_in_a_user_namespace() {
    time_namespace_twice(&["--user", "--map-root-user", "--pid", "--mount-proc"]);
}

/// [`twice_keeps_a_time_namespace`] with more `unshare` flags (`--pid`:
/// the shell is the init of a PID namespace, which reaps its child as it
/// dies).
fn time_namespace_twice(more: &[&str]) {
    workloads();
    let pidns = more.contains(&"--pid");
    let r = Refused::spawn(
        Command::new("unshare")
            .args(more)
            .args([
                "--time",
                "--fork",
                "--monotonic",
                "86400000",
                "--boottime",
                "100",
            ])
            .args(["sh", "-c", "sleep 1000 & wait"]),
    );
    let up = r.unshare.id() as i32;
    let mut root = 0;
    wait_until(Duration::from_secs(10), "the shell and its child", || {
        root = child_running(up, "sh -c sleep 1000 & wait").unwrap_or(0);
        root > 0 && child_running(root, "sleep 1000").is_some()
    });
    let text = std::fs::read_to_string(format!("/proc/{root}/timens_offsets")).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        words,
        ["monotonic", "86400000", "0", "boottime", "100", "0"],
        "{text}"
    );
    let user = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/user")).unwrap();
    let own_user = user(root) != user(std::process::id() as i32);
    assert_eq!(own_user, more.contains(&"--user"));
    let img = tempfile::tempdir().unwrap();
    let mut pid = root;
    let mut restored = KillOnDrop(0);
    for round in 1..=2 {
        let before = clocks_inside(pid);
        let kids = descendants(pid);
        let o = stasis()
            .args(["dump", "-t", &pid.to_string(), "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("dump round {round}"));
        // The killed tree is ours to reap (its first root is unshare's),
        // its child once it is reparented to us (a subreaper), unless the
        // root is the init of a PID namespace.
        if round > 1 {
            waitpid_timeout(pid, Duration::from_secs(30));
        }
        if !pidns {
            reap_orphans(&kids);
        }
        // Time passes while the tree is dumped: its clocks must not see it.
        let dumped = clocks_inside(std::process::id() as i32).real;
        let mut unseen = 0;
        wait_until(Duration::from_secs(10), "two seconds to pass", || {
            unseen = clocks_inside(std::process::id() as i32).real - dumped;
            unseen > 2_000_000_000
        });
        let o = stasis()
            .args(["restore", "--detach", "--json", "-D"])
            .arg(img.path())
            .output()
            .unwrap();
        assert_ok(&o, &format!("restore round {round}"));
        pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
        restored.0 = pid;
        if !pidns {
            assert_eq!(pid, root);
        }
        assert_eq!(
            user(pid) != user(std::process::id() as i32),
            own_user,
            "round {round}"
        );
        time_went_on(pid, before, unseen, 1000, round);
    }
    let kids = descendants(pid);
    for p in std::iter::once(pid).chain(kids.iter().copied()) {
        // SAFETY: killing the restored tree.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    waitpid_timeout(pid, Duration::from_secs(30));
    if !pidns {
        reap_orphans(&kids);
    }
}

/// A restored tree (its root's PID), killed if a test fails before it
/// does.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0 > 0 && alive(self.0) {
            for p in std::iter::once(self.0).chain(descendants(self.0)) {
                // SAFETY: killing the tree this test restored.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }
}

/// Reaps `pids`, killed descendants of a killed process, once they are
/// reparented to this test process (a subreaper).
fn reap_orphans(pids: &[i32]) {
    let me = std::process::id().to_string();
    for &k in pids {
        wait_until(
            Duration::from_secs(10),
            "a killed orphan to be ours",
            || {
                std::fs::read_to_string(format!("/proc/{k}/status"))
                    .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().eq(["PPid:", &me])))
            },
        );
        waitpid_timeout(k, Duration::from_secs(30));
    }
}

/// The namespaces workload in a time namespace of its own too: restored
/// twice in new namespaces of every kind, the time one's clocks going on.
#[test]
fn twice_keeps_a_time_namespace_with_the_others() {
    let mut t = NsTree::start_with(
        None,
        &["--time", "--monotonic", "86400000", "--boottime", "100"],
    );
    for round in 1..=2 {
        let before = clocks_inside(t.pid);
        assert_ok(&t.dump(&[]), &format!("dump round {round}"));
        let dumped = clocks_inside(std::process::id() as i32).real;
        t.reap();
        let unseen = clocks_inside(std::process::id() as i32).real - dumped;
        t.restore(&[]);
        time_went_on(t.pid, before, unseen, 1000, round);
    }
    t.finish_pass();
}

/// The `timens` workload (a root and its child in a time namespace the
/// root made, its monotonic clock 1000 days ahead): tracked dumps of it
/// are incremental, each saves the namespace's clocks (manifest format
/// version 7), and the chain restores into a new one, where the workload
/// finds its clocks went on (it checks every 10 ms that they neither went
/// backwards nor jumped).
#[test]
fn incremental_chain_in_a_time_namespace() {
    let mut w = Workload::start("timens", &[]);
    assert_ok(&w.dump(&["--leave-running", "--track"]), "dump 1");
    let o = w.dump(&["--leave-running", "--track", "--json"]);
    assert_ok(&o, "dump 2");
    assert_eq!(json(&o)["parent"], 1, "dump 2 is not incremental");
    w.dump_and_reap();
    for n in 1..=3 {
        let m = std::fs::read(w.images().join(format!("checkpoints/{n:08}/manifest.bin"))).unwrap();
        assert_eq!(
            u32::from_le_bytes(m[8..12].try_into().unwrap()),
            7,
            "checkpoint {n}"
        );
    }
    w.restore(&[]);
    w.finish_pass();
}

/// A process that unshared a time namespace and made no child in it yet
/// (it runs on in the host's, its children would be made in the new one,
/// whose offsets it wrote), with a thread made before (which makes its
/// children in the host's): dumped and restored twice, it is in the
/// host's time namespace still and makes its children in a new one with
/// the same offsets; a child it forks then reads its clocks with them.
#[test]
fn twice_keeps_a_pending_time_namespace() {
    pending_time_namespace_twice("before");
}

/// The same with a thread made after the unshare, which shares the new
/// namespace (its children would be made there too).
#[test]
fn twice_keeps_a_pending_time_namespace_its_thread_shares() {
    pending_time_namespace_twice("after");
}

/// [`twice_keeps_a_pending_time_namespace`], its thread made `when`
/// (`before` or `after`) the unshare.
fn pending_time_namespace_twice(when: &str) {
    const NSEC: i64 = 1_000_000_000;
    become_subreaper();
    // The offsets it writes (monotonic 1000 days, boot time 100.000000005
    // s); `go`: fork a child that reads its clocks, between two reads of
    // its own, and write all of them with the child's `timens_offsets`.
    let script = "import ctypes, os, sys, threading, time\n\
        sleeper = lambda: threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n\
        if sys.argv[2] == 'before':\n    sleeper()\n\
        if ctypes.CDLL(None, use_errno=True).unshare(0x80):\n    \
            sys.exit('unshare: ' + os.strerror(ctypes.get_errno()))\n\
        open('/proc/self/timens_offsets', 'w').write('monotonic 86400000 0\\nboottime 100 5\\n')\n\
        if sys.argv[2] == 'after':\n    sleeper()\n\
        d = sys.argv[1]\n\
        open(d + '/ready', 'w').close()\n\
        while not os.path.exists(d + '/go'):\n    time.sleep(0.02)\n\
        now = lambda: [time.clock_gettime_ns(c) for c in (time.CLOCK_MONOTONIC, time.CLOCK_BOOTTIME)]\n\
        r, w = os.pipe()\n\
        before = now()\n\
        pid = os.fork()\n\
        if pid == 0:\n    \
            os.write(w, (' '.join(map(str, now())) + ' ' + ' '.join(open('/proc/self/timens_offsets').read().split())).encode())\n    \
            os._exit(0)\n\
        os.close(w)\n\
        os.waitpid(pid, 0)\n\
        after = now()\n\
        child = os.read(r, 4096).decode()\n\
        open(d + '/out.tmp', 'w').write(' '.join(map(str, before + after)) + ' ' + child)\n\
        os.rename(d + '/out.tmp', d + '/out')\n\
        time.sleep(1000)\n";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // (Under a shell, which reaps it when the first dump kills it.)
    let r = Refused::spawn(Command::new("sh").args([
        "-c",
        "python3 -c \"$0\" \"$1\" \"$2\" & wait",
        script,
        &d,
        when,
    ]));
    let up = r.unshare.id() as i32;
    let mut pid = 0;
    wait_until(
        Duration::from_secs(20),
        "the pending time namespace",
        || {
            pid = descendants(up).first().copied().unwrap_or(0);
            pid > 0 && dir.path().join("ready").exists()
        },
    );
    let ns = |p: i32, f: &str| std::fs::read_link(format!("/proc/{p}/ns/{f}")).unwrap();
    let me = std::process::id() as i32;
    let offsets = ["monotonic", "86400000", "0", "boottime", "100", "5"];
    let check = |p: i32, round: &str| {
        assert_eq!(ns(p, "time"), ns(me, "time"), "{round}");
        assert_ne!(ns(p, "time_for_children"), ns(p, "time"), "{round}");
        // Its thread makes its children in the new one, or in its own.
        let tids = tasks_of(p);
        assert_eq!(tids.len(), 2, "{round}: {tids:?}");
        for t in tids.into_iter().filter(|&t| t != p) {
            let theirs = ns(t, "time_for_children");
            if when == "after" {
                assert_eq!(theirs, ns(p, "time_for_children"), "{round}: thread {t}");
            } else {
                assert_eq!(theirs, ns(p, "time"), "{round}: thread {t}");
            }
        }
        let text = std::fs::read_to_string(format!("/proc/{p}/timens_offsets")).unwrap();
        assert_eq!(
            text.split_whitespace().collect::<Vec<_>>(),
            offsets,
            "{round}"
        );
    };
    check(pid, "before");
    let pid = dump_and_restore_detached(pid, 2, |p, round| {
        check(p, &format!("round {round}"));
    });
    let _restored = KillOnDrop(pid);
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_until(Duration::from_secs(20), "the child's clocks", || {
        dir.path().join("out").exists()
    });
    let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 12, "{out}");
    let n: Vec<i64> = words[..6].iter().map(|w| w.parse().unwrap()).collect();
    assert_eq!(&words[6..], offsets, "the child's timens_offsets: {out}");
    let (mono, boot) = (86_400_000 * NSEC, 100 * NSEC + 5);
    // Its parent's clocks (the host's) read before the fork and after
    // its exit, with the offsets, bound the child's.
    assert!(
        n[0] + mono <= n[4] && n[4] <= n[2] + mono,
        "the child's monotonic clock: {out}"
    );
    assert!(
        n[1] + boot <= n[5] && n[5] <= n[3] + boot,
        "the child's boot-time clock: {out}"
    );
    // SAFETY: killing the restored process (the test's).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    waitpid_timeout(pid, Duration::from_secs(30));
}

/// `python3 -c` program for [`a_pending_time_namespace_beside_its_own`]:
/// with argv[1] `child`, it forks a sleeping child first (made in its own
/// time namespace), then unshares another time namespace, writes its
/// offsets (monotonic 5000 s, boot time 7 s) and says it is ready in
/// argv[2].
const PENDING_BESIDE_OWN: &str = "import ctypes, os, sys, time\n\
    if sys.argv[1] == 'child' and os.fork() == 0:\n    time.sleep(1000)\n    os._exit(0)\n\
    if ctypes.CDLL(None, use_errno=True).unshare(0x80):\n    \
        sys.exit('unshare: ' + os.strerror(ctypes.get_errno()))\n\
    open('/proc/self/timens_offsets', 'w').write('monotonic 5000 0\\nboottime 7 0\\n')\n\
    open(sys.argv[2] + '/ready', 'w').close()\n\
    time.sleep(1000)\n";

/// A root in a time namespace of its own (1000 days ahead) that forked a
/// child there, then unshared another one and wrote its offsets:
/// restored, the root and its child are in a new time namespace whose
/// clocks went on, and the root makes its children in another with the
/// offsets it wrote (the first one's offsets were read from the child's
/// `timens_offsets`: the root's shows the second's).
#[test]
fn a_pending_time_namespace_beside_its_own() {
    workloads();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let r = Refused::spawn(Command::new("unshare").args([
        "--time",
        "--fork",
        "--monotonic",
        "86400000",
        "python3",
        "-c",
        PENDING_BESIDE_OWN,
        "child",
        &d,
    ]));
    let up = r.unshare.id() as i32;
    let mut root = 0;
    wait_until(
        Duration::from_secs(20),
        "the pending time namespace",
        || {
            root = my_children_of(up).first().copied().unwrap_or(0);
            root > 0 && dir.path().join("ready").exists()
        },
    );
    let kids = my_children_of(root);
    assert_eq!(kids.len(), 1, "{kids:?}");
    let ns = |p: i32, f: &str| std::fs::read_link(format!("/proc/{p}/ns/{f}")).unwrap();
    let offsets = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/timens_offsets"))
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let pending = ["monotonic", "5000", "0", "boottime", "7", "0"];
    assert_eq!(offsets(root), pending);
    let before = clocks_inside(kids[0]);
    let img = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["dump", "-t", &root.to_string(), "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "dump");
    reap_orphans(&kids);
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(img.path())
        .output()
        .unwrap();
    assert_ok(&o, "restore");
    let pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
    let _restored = KillOnDrop(pid);
    assert_eq!(pid, root);
    let kid = my_children_of(pid);
    assert_eq!(kid, kids);
    let me = std::process::id() as i32;
    assert_ne!(ns(pid, "time"), ns(me, "time"));
    assert_eq!(ns(kid[0], "time"), ns(pid, "time"));
    assert_eq!(ns(kid[0], "time_for_children"), ns(pid, "time"));
    assert_ne!(ns(pid, "time_for_children"), ns(pid, "time"));
    assert_eq!(offsets(pid), pending);
    // The first namespace's clocks went on, 1000 days ahead still.
    let now = clocks_inside(kid[0]);
    assert!(
        now.mono >= before.mono && now.mono >= 86_400_000 * 1_000_000_000,
        "{before:?} then {now:?}"
    );
    for p in [kid[0], pid] {
        // SAFETY: killing the restored tree.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    waitpid_timeout(pid, Duration::from_secs(30));
    reap_orphans(&kid);
}

/// The same without the child: nothing shows the offsets of the root's
/// own time namespace (its `timens_offsets` shows the second's), so the
/// dump is refused by name.
#[test]
fn refuses_a_pending_time_namespace_beside_its_own_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    refused(
        &[
            "--time",
            "--fork",
            "--monotonic",
            "86400000",
            "python3",
            "-c",
            PENDING_BESIDE_OWN,
            "alone",
            &d,
        ],
        |up| {
            let p = my_children_of(up).first().copied()?;
            dir.path().join("ready").exists().then_some(p)
        },
        "no process of the tree makes its children in the first",
    );
}

/// `ip -j ARGS` in the network namespace of `pid`, without what the
/// kernel makes differently each time: IPv6 link-local addresses (a tun
/// device's are random) and the local routes to them, counters, bridge
/// timers, a vxlan's TSO limit, and the index of a veth's peer.
fn ip_json(pid: i32, args: &str) -> serde_json::Value {
    let text = ip(Some(pid), &format!("-d -j {args}"));
    let mut v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("ip -j {args} is not JSON ({e}): {text}"));
    // The timers of bridges and their ports run.
    fn no_timers(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                o.retain(|k, _| !k.ends_with("_timer"));
                o.values_mut().for_each(no_timers);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(no_timers),
            _ => {}
        }
    }
    no_timers(&mut v);
    let link_local = |s: &str| s.starts_with("fe80:") && s != "fe80::/64";
    if let Some(items) = v.as_array_mut() {
        items.retain(|i| !i["dst"].as_str().is_some_and(link_local));
        // The kernel's IPv6 routes of each interface (link-local prefix,
        // multicast) are listed in the order the interfaces came up:
        // taken here by interface name, in their places.
        let per_dev = |i: &serde_json::Value| {
            i["protocol"] == "kernel" && (i["dst"] == "fe80::/64" || i["dst"] == "ff00::/8")
        };
        for dst in ["fe80::/64", "ff00::/8"] {
            let at: Vec<usize> = (0..items.len())
                .filter(|&k| per_dev(&items[k]) && items[k]["dst"] == dst)
                .collect();
            let mut these: Vec<serde_json::Value> = at.iter().map(|&k| items[k].clone()).collect();
            these.sort_by_key(|i| i["dev"].as_str().unwrap_or_default().to_string());
            for (k, i) in at.into_iter().zip(these) {
                items[k] = i;
            }
        }
        for i in items.iter_mut() {
            if let Some(o) = i.as_object_mut() {
                o.remove("stats64");
                o.remove("stats");
                // A veth's peer in the restorer's namespace is made anew.
                o.remove("link_index");
            }
            // A vxlan's TSO limit is its lower device's when it was
            // made (a bridge's grows with its ports, attached later at
            // restore): a capability, not a setting.
            if i["linkinfo"]["info_kind"] == "vxlan" {
                if let Some(o) = i.as_object_mut() {
                    o.remove("tso_max_size");
                }
            }
            if let Some(a) = i["addr_info"].as_array_mut() {
                a.retain(|x| !x["local"].as_str().is_some_and(link_local));
            }
        }
    }
    v
}

/// Asserts that the routing state of the namespace of `pid` becomes `was`
/// (the kernel makes the route to an IPv6 address's peer once its
/// address is through duplicate address detection, just after the
/// restore), naming the first entry that differs.
fn assert_routing_state(what: &str, pid: i32, was: &[(String, serde_json::Value)]) {
    assert_routing_state_by(what, pid, was, |s| s);
}

/// [`assert_routing_state`] of the state as `norm` gives it.
fn assert_routing_state_by(
    what: &str,
    pid: i32,
    was: &[(String, serde_json::Value)],
    norm: impl Fn(Vec<(String, serde_json::Value)>) -> Vec<(String, serde_json::Value)>,
) {
    let t0 = std::time::Instant::now();
    let mut now = norm(routing_state(pid));
    while now != was && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        now = norm(routing_state(pid));
    }
    for ((ip_args, was), (_, now)) in was.iter().zip(&now) {
        assert_same(&format!("{what}: ip {ip_args}"), was, now);
    }
}

/// Asserts that `was` and `now` (`ip -j` lists) are equal, naming the
/// first entry that differs.
fn assert_same(what: &str, was: &serde_json::Value, now: &serde_json::Value) {
    let (a, b) = (was.as_array(), now.as_array());
    if let (Some(a), Some(b)) = (a, b) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x, y, "{what}: an entry differs after the restore");
        }
        assert_eq!(a.len(), b.len(), "{what}: {was} became {now}");
    }
    assert_eq!(was, now, "{what} differs after the restore");
}

/// The routing state of the network namespace of `pid`, exactly: its
/// addresses, the routes of every table and the rules, IPv4 and IPv6, and
/// its next-hop objects.
fn routing_state(pid: i32) -> Vec<(String, serde_json::Value)> {
    [
        "addr show",
        "-4 route show table all",
        "-6 route show table all",
        "-4 rule show",
        "-6 rule show",
        "nexthop show",
    ]
    .iter()
    .map(|a| (a.to_string(), ip_json(pid, a)))
    .collect()
}

/// Starts `unshare --net` with `args` and the directory `d` as last
/// argument; once its namespace exists, gives it a veth `eth0` (up, `lo`
/// up) whose peer `host` is in this namespace, runs `ip ARGS` for each
/// of `host_ip` here and `tree_ip` in the tree's namespace, then creates
/// `d/set`. Returns the unshare child (reaped when dumped) and its PID.
fn start_container(
    args: &[&str],
    d: &std::path::Path,
    host: &str,
    host_ip: &[&str],
    tree_ip: &[&str],
) -> (Child, i32) {
    let _ = Command::new("ip")
        .args(["link", "del", host])
        .stderr(Stdio::null())
        .status();
    let mut c = Command::new("unshare");
    c.arg("--net")
        .args(args)
        .arg(d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    close_inherited_fds(&mut c);
    become_subreaper();
    let child = c.spawn().expect("starting unshare");
    let pid = child.id() as i32;
    wait_until(
        Duration::from_secs(10),
        "the tree's network namespace",
        || {
            std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
                != std::fs::read_link("/proc/self/ns/net").ok()
        },
    );
    ip(
        None,
        &format!("link add {host} type veth peer name eth0 netns {pid}"),
    );
    for a in host_ip {
        ip(None, a);
    }
    ip(None, &format!("link set {host} up"));
    ip(Some(pid), "link set lo up");
    ip(Some(pid), "link set eth0 up");
    for a in tree_ip {
        ip(Some(pid), a);
    }
    std::fs::write(d.join("set"), b"").unwrap();
    wait_until(Duration::from_secs(20), "the tree to be ready", || {
        d.join("ready").exists()
    });
    (child, pid)
}

/// Issue 17: the routing state of a tree's own network namespace comes
/// back exactly, twice: addresses with a point-to-point peer (IPv4 and
/// IPv6, and so the kernel's routes to the peers), routes of other tables
/// (a gateway, a blackhole, a source and scope, an MTU metric, an IPv6
/// preference), a route of the local table, multipath routes with
/// weights (IPv4 and IPv6), an `onlink` gateway, and policy routing rules
/// (a source, a fwmark with its mask and an input interface, an IPv6
/// destination, a prohibit), one of the kernel's rules removed.
#[test]
fn twice_keeps_peers_tables_multipath_routes_and_rules() {
    let dir = tempfile::tempdir().unwrap();
    let sh = "while [ ! -e \"$0/set\" ]; do sleep 0.02; done; touch \"$0/ready\"; exec sleep 1000";
    let (mut child, pid) = start_container(
        &["sh", "-c", sh],
        dir.path(),
        "stasisv2h",
        &[],
        &[
            "addr add 10.60.0.1 peer 10.60.0.2/32 dev eth0",
            "-6 addr add fd60::1 peer fd60::2/128 dev eth0 nodad",
            "addr add 10.61.0.1/24 dev eth0",
            "-6 addr add fd61::1/64 dev eth0 nodad",
            "route add 10.70.0.0/16 via 10.60.0.2 table 100 metric 5 proto static",
            "route add blackhole 10.71.0.0/16 table 1000",
            "route add 10.72.0.0/16 dev eth0 table 100 src 10.61.0.1 scope link",
            "route add 10.73.0.0/16 nexthop via 10.61.0.5 dev eth0 weight 3 nexthop via 10.61.0.6 dev eth0",
            "route add 10.74.0.0/16 dev eth0 mtu 1300 table 200",
            "route add 10.75.0.0/16 via 10.99.0.1 dev eth0 onlink",
            "route add local 10.76.0.0/16 dev lo table local",
            "-6 route add fd70::/64 via fd61::5 dev eth0 table 100 pref high",
            "-6 route add fd71::/64 nexthop via fd61::7 dev eth0 nexthop via fd61::8 dev eth0 weight 2",
            "rule add from 10.61.0.0/24 lookup 100 pref 100",
            "rule add fwmark 0x5/0xff iif lo lookup 200 pref 150",
            "rule add to 10.71.0.0/16 prohibit pref 160",
            "-6 rule add to fd70::/64 lookup 100 pref 100",
            "rule del pref 32767",
        ],
    );
    let mut net = ContainerNet {
        names: vec!["stasisv2h"],
        pids: vec![pid],
    };
    std::thread::spawn(move || child.wait());
    let before = routing_state(pid);
    // What the restore must make again, there to compare.
    let text = format!("{before:?}");
    for want in [
        "10.60.0.2",
        "fd60::2",
        "\"table\": String(\"100\")",
        "\"table\": String(\"1000\")",
        "nexthops",
        "onlink",
        "\"fwmask\": String(\"0xff\")",
        "prohibit",
        "\"pref\": String(\"high\")",
        "10.76.0.0",
    ] {
        assert!(text.contains(want), "{want} set up: {text}");
    }
    let check = |pid: i32, round: u32| {
        for ((what, was), (_, now)) in before.iter().zip(routing_state(pid)) {
            assert_eq!(
                *was, now,
                "round {round}: ip {what} differs after the restore"
            );
        }
    };
    let last = dump_and_restore_detached(pid, 2, check);
    net.pids.push(last);
}

/// A Python program for a tree's own network namespace (run by
/// [`start_container`] with its directory): once told to go, it connects
/// over TCP to `to`:`port`, sends a ping, and checks that the answer names
/// `mine`, the address it connected from; it writes PASS or FAIL to
/// `result` ([`finish_program`]).
fn ping_program(to: &str, port: u16, mine: &str) -> String {
    format!(
        "import os, socket, sys, time\n\
        d = sys.argv[1]\n\
        def fail(why):\n    open(d + '/result', 'w').write('FAIL ' + why)\n    sys.exit(1)\n\
        while not os.path.exists(d + '/set'):\n    time.sleep(0.02)\n\
        open(d + '/ready', 'w').close()\n\
        while not os.path.exists(d + '/go'):\n    time.sleep(0.02)\n\
        try:\n    \
            s = socket.create_connection(('{to}', {port}), timeout=20)\n    \
            s.sendall(b'ping\\n')\n    \
            got = b''\n    \
            while not got.endswith(b'\\n'):\n        \
                b = s.recv(100)\n        \
                if not b:\n            break\n        \
                got += b\n\
        except OSError as e:\n    fail(str(e))\n\
        if got != b'pong {mine}\\n':\n    fail('got %r' % got)\n\
        open(d + '/result', 'w').write('PASS')\n"
    )
}

/// Listens on `at`:`port` and answers one [`ping_program`]'s ping with
/// the address it came from (the thread panics if the exchange fails).
fn pong_server(at: &str, port: u16) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind((at, port))
        .unwrap_or_else(|e| panic!("listening on {at}:{port}: {e}"));
    std::thread::spawn(move || {
        let (mut s, from) = listener
            .accept()
            .expect("the restored program's connection");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut ping = [0u8; 5];
        s.read_exact(&mut ping).expect("its ping");
        assert_eq!(&ping, b"ping\n");
        s.write_all(format!("pong {}\n", from.ip()).as_bytes())
            .unwrap();
    })
}

/// Dumps the container tree `pid` into `img` (killing it), reaps `child`
/// (the `unshare` that started it) and restores the tree detached; the
/// restored root's PID.
fn dump_kill_restore(pid: i32, child: &mut std::process::Child, img: &std::path::Path) -> i32 {
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(img)
        .output()
        .unwrap();
    assert_ok(&o, "dump of the container tree");
    let _ = child.wait();
    let o = stasis()
        .args(["restore", "--detach", "--json", "-D"])
        .arg(img)
        .output()
        .unwrap();
    assert_ok(&o, "restore of the container tree");
    i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap()
}

/// Issue 17: a container's veth whose two ends have point-to-point
/// addresses (the tree's end 10.62.0.2 peer 10.62.0.1), and a route of
/// table 100 through that peer chosen by a rule for 10.63.0.0/24 (the
/// main table has no route there): after a dump and restore, a program
/// of the tree connects over TCP to 10.63.0.1 (an address of the host
/// end) and exchanges bytes with this process.
#[test]
fn a_route_of_another_table_through_a_peer_carries_tcp_after_restore() {
    let mut net = ContainerNet {
        names: vec!["stasisv1h"],
        pids: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prog = ping_program("10.63.0.1", 7790, "10.62.0.2");
    let (mut child, pid) = start_container(
        &["python3", "-c", &prog],
        d,
        "stasisv1h",
        &[
            "addr add 10.62.0.1 peer 10.62.0.2/32 dev stasisv1h",
            "addr add 10.63.0.1/32 dev stasisv1h",
        ],
        &[
            "addr add 10.62.0.2 peer 10.62.0.1/32 dev eth0",
            "route add 10.63.0.0/24 via 10.62.0.1 table 100",
            "rule add to 10.63.0.0/24 lookup 100 pref 1000",
        ],
    );
    net.pids.push(pid);
    let before = routing_state(pid);
    let host = ip_json(std::process::id() as i32, "addr show dev stasisv1h");
    let pid = dump_kill_restore(pid, &mut child, &d.join("images"));
    net.pids.push(pid);
    assert_routing_state("after the restore", pid, &before);
    let host_now = ip_json(std::process::id() as i32, "addr show dev stasisv1h");
    // The host end is a new interface: its index and its peer's differ.
    let strip = |mut v: serde_json::Value| {
        for i in v.as_array_mut().into_iter().flatten() {
            if let Some(o) = i.as_object_mut() {
                o.remove("ifindex");
                o.remove("link_netnsid");
            }
        }
        v
    };
    assert_eq!(strip(host), strip(host_now), "the host end's addresses");
    let server = pong_server("10.63.0.1", 7790);
    finish_program(d, pid);
    server.join().expect("the exchange over the restored route");
}

/// `ip -d -j link show` in the network namespace of `pid` (as
/// [`ip_json`] gives it).
fn links_state(pid: i32) -> serde_json::Value {
    ip_json(pid, "link show")
}

/// Issue 17: interfaces made inside a tree's network namespace come back
/// exactly (`ip -d link`, addresses, routes): a bridge (its MTU, hardware
/// address, forward delay, STP off, an address) with two ports, the
/// container's veth `eth0` (peer in this namespace) and one end of a veth
/// pair whose both ends are in the tree's namespace; a macvlan on the
/// pair's other end; a vxlan on the bridge (id, port, local and remote
/// addresses); an ifb with its queue length. After the restore, a program
/// of the tree connects over TCP from the bridge's address to this
/// process, through the bridge and `eth0`.
#[test]
fn own_bridge_veth_pair_macvlan_vxlan_and_ifb_come_back_and_carry_tcp() {
    let mut net = ContainerNet {
        names: vec!["stasisv3h"],
        pids: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prog = ping_program("10.90.0.2", 7791, "10.90.0.1");
    let (mut child, pid) = start_container(
        &["python3", "-c", &prog],
        d,
        "stasisv3h",
        &["addr add 10.90.0.2/24 dev stasisv3h"],
        &[
            "link add br0 type bridge stp_state 0 forward_delay 400",
            "link set br0 mtu 1400 address 02:90:00:00:00:01",
            "link add va type veth peer name vb",
            "link set vb master br0 up",
            "link set va txqueuelen 700 up",
            "link set eth0 master br0",
            "link add mv0 link va type macvlan mode bridge",
            "link add vx0 type vxlan id 42 dstport 4789 local 10.90.0.1 remote 10.90.0.9 dev br0",
            "link add ifb0 txqueuelen 64 type ifb",
            "link set br0 up",
            "link set mv0 up",
            "addr add 10.90.0.1/24 dev br0",
            "addr add 10.91.0.1/24 dev mv0",
        ],
    );
    net.pids.push(pid);
    let before = (links_state(pid), routing_state(pid));
    let text = format!("{:?}", before.0);
    for want in [
        "\"bridge\"",
        "\"macvlan\"",
        "\"vxlan\"",
        "\"ifb\"",
        "\"vb\"",
    ] {
        assert!(text.contains(want), "{want} set up: {text}");
    }
    let pid = dump_kill_restore(pid, &mut child, &d.join("images"));
    net.pids.push(pid);
    assert_routing_state("after the restore", pid, &before.1);
    assert_same("ip -d link show", &before.0, &links_state(pid));
    let server = pong_server("10.90.0.2", 7791);
    finish_program(d, pid);
    server
        .join()
        .expect("the exchange through the restored bridge");
}

/// Issue 17: next-hop objects (a gateway with its protocol, an IPv6
/// gateway, a blackhole, an encapsulation, a weighted group, a resilient
/// group with its buckets and idle timer, an fdb next hop and its group)
/// and routes through them (IPv4 and IPv6, of another table), a gateway of
/// another family (`via inet6`, of a route and of one next hop of a
/// multipath route), an IPv6 source prefix (`from`), encapsulations (`ip`,
/// `ip6`, `seg6`, `seg6local` actions End, End.DT6, and End.X and End.DX2
/// with an output interface whose index changes at the restore, of a
/// route and of one next hop of a multipath route) come back exactly
/// (`ip -d route` of every table, both families, `ip -d nexthop`, `ip -d
/// addr` but the interfaces' indexes, which do not all come back); a
/// program of the tree
/// then connects over TCP through the restored route `nhid 1` to this
/// process.
#[test]
fn next_hop_objects_encapsulations_via_and_from_come_back_and_carry_tcp() {
    let mut net = ContainerNet {
        names: vec!["stasisv4h"],
        pids: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prog = ping_program("10.93.0.1", 7792, "10.92.0.2");
    let (mut child, pid) = start_container(
        &["python3", "-c", &prog],
        d,
        "stasisv4h",
        &[
            "addr add 10.92.0.1/24 dev stasisv4h",
            "addr add 10.93.0.1/32 dev stasisv4h",
        ],
        &[
            "addr add 10.92.0.2/24 dev eth0",
            "-6 addr add fd92::2/64 dev eth0 nodad",
            "nexthop add id 1 via 10.92.0.1 dev eth0 proto static",
            "nexthop add id 2 via 10.92.0.5 dev eth0",
            "nexthop add id 3 group 1/2,3",
            "nexthop add id 4 blackhole",
            "nexthop add id 5 group 1/2 type resilient buckets 8 idle_timer 60",
            "nexthop add id 6 via fd92::1 dev eth0",
            "nexthop add id 7 encap ip id 9 dst 10.92.0.9 via 10.92.0.1 dev eth0",
            "nexthop add id 8 via 10.92.0.9 fdb",
            "nexthop add id 9 group 8 fdb",
            "nexthop add id 20 via 10.92.0.6 dev eth0",
            "nexthop del id 20",
            "route add 10.93.0.0/24 nhid 1",
            "route add 10.94.0.0/24 nhid 3 table 100",
            "route add 10.95.0.0/24 nhid 4",
            "route add 10.91.0.0/24 nhid 7",
            "-6 route add fd95::/64 nhid 6",
            "route add 10.96.0.0/24 via inet6 fe80::1 dev eth0",
            "-6 route add fd96::/64 from fd97::/48 via fd92::1 dev eth0",
            "route add 10.97.0.0/24 encap ip id 5 dst 10.92.0.9 ttl 3 dev eth0",
            "-6 route add fd98::/64 encap ip6 id 5 dst fd92::9 dev eth0",
            "-6 route add fd99::/64 encap seg6 mode encap segs fd92::5,fd92::6 dev eth0",
            "-6 route add fd9a::/64 encap seg6local action End dev eth0",
            "-6 route add fd9b::/64 encap seg6local action End.DT6 table 100 dev eth0",
            // An interface whose index changes (those of a removed pair
            // are not given again): seg6local names it by index.
            "link add x1 type veth peer name x2",
            "link del x1",
            "link add va type veth peer name vb",
            "link set va up",
            "link set vb up",
            "-6 route add fd9d::/64 encap seg6local action End.X nh6 fd92::1 oif va dev eth0",
            "-6 route add fd9e::/64 encap seg6local action End.DX2 oif va dev eth0",
            "-6 nexthop add id 10 encap seg6local action End.DX2 oif va dev eth0",
            "route add 10.98.0.0/24 nexthop encap ip id 7 dst 10.92.0.8 via 10.92.0.1 dev eth0 nexthop via 10.92.0.5 dev eth0",
            "route add 10.99.0.0/24 nexthop via inet6 fe80::1 dev eth0 nexthop via 10.92.0.5 dev eth0 weight 2",
            "-6 route add fd9c::/64 nexthop encap seg6 mode inline segs fd92::7 via fd92::1 dev eth0 nexthop via fd92::3 dev eth0",
        ],
    );
    net.pids.push(pid);
    // The interfaces' indexes (`ip addr`) but for that: a removed
    // interface's index is not given again, and stasis makes the
    // interfaces again one after the other.
    let without_indexes = |mut state: Vec<(String, serde_json::Value)>| {
        for (_, v) in &mut state {
            for i in v.as_array_mut().into_iter().flatten() {
                if let Some(o) = i.as_object_mut() {
                    o.remove("ifindex");
                }
            }
        }
        state
    };
    let before = without_indexes(routing_state(pid));
    let text = format!("{before:?}");
    for want in [
        "\"nhid\": Number(3)",
        "\"resilient\"",
        "\"fdb\"",
        "\"blackhole\"",
        "fd97::/48",
        "\"family\": String(\"inet6\")",
        "\"seg6local\"",
        "End.DT6",
        "\"oif\": String(\"va\")",
        "\"seg6\"",
        "\"ip6\"",
        "10.92.0.8",
    ] {
        assert!(text.contains(want), "{want} set up: {text}");
    }
    let pid = dump_kill_restore(pid, &mut child, &d.join("images"));
    net.pids.push(pid);
    assert_routing_state_by("after the restore", pid, &before, without_indexes);
    let server = pong_server("10.93.0.1", 7792);
    finish_program(d, pid);
    server
        .join()
        .expect("the exchange through the restored route nhid 1");
}
